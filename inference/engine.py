"""The inference pass: one walk over a graph's nodes typing every value.

Each node is typed by, in order of preference:

1. ``Constant`` directly; ``If``, ``Loop`` and ``Scan`` by the engine itself, inferring their
   bodies (``inference.subgraphs``);
2. its own rule (``inference.registry``, selected by the model's opset for the node's domain);
3. onnx's per-node inference for the schema ``onnx.defs`` selects (the *fallback*);
4. a model-local function, inlined per call (``inference.functions``);
5. nothing: an op of a domain with none of these leaves its outputs unknown (strict mode raises).

A node missing a required input (``onnx.defs``: a single, non-optional formal parameter, or
fewer values than a variadic one's minimum) is reported (``schema.required-input``) and its
rule is not called.

Constants (``Constant`` nodes, initializers) carry their value, read from the proto only when
a rule asks for it, and a few cheap operators on small integer tensors (``Shape``,
``Gather``, ``Concat``, ...) are folded so that ``Shape -> Gather -> Concat -> Reshape`` stays
known.

Speed: a node's result is a function of its op, opset, attributes, input types and the
constant inputs its rule reads, so the pass memoizes it on exactly that (small constants by
content; a rule that reads a large constant is simply not memoized). Repeated blocks of a
model are typed once. Types are serialized once per distinct value (for onnx's fallback and
for the write-back, which builds ``value_info`` as bytes).

``infer`` runs the pass once; ``infer_shapes`` (a model with ``value_info``), ``infer_values``
(name -> ``TensorInfo``) and ``check_model`` (a list of ``Diagnostic``) are views of it.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable, Mapping

import numpy as np
import onnx
from onnx import defs, helper, numpy_helper

import onnx_quant.inference.rules  # noqa: F401  (registers every rule module)
from onnx_quant.inference import dims, registry
from onnx_quant.inference.context import ShapesContext, TensorInfo
from onnx_quant.inference.diagnostics import MODEL_NODE, Diagnostic, one_line
from onnx_quant.inference.dims import DimLike
from onnx_quant.inference.registry import NodeContext, normalize_domain
from onnx_quant.errors import InferenceError, QuantError
from onnx_quant.inference.model_facts import model_facts
from onnx_quant.inference.structure import check_depth
from onnx_quant.budget import resolve as resolve_budget
from onnx_quant.model_io import (
    EXAMPLE_NAME, ModelSource, check_external_files, check_external_location, load_model,
)

#: Constants up to this many elements are handed to onnx's inference as input data
#: (Reshape's shape, Slice's starts, Resize's scales need it; weights never do).
_DATA_MAX_ELEMENTS = 64
#: Folded constants stay below this size: shape arithmetic, not constant folding.
_FOLD_MAX_ELEMENTS = 1024
#: A constant of at most this many elements that a rule reads is part of the node's memo key
#: by content (zero points, scales, biases, shapes); a node whose rule reads a bigger one (a
#: weight) is not memoized.
_KEY_MAX_ELEMENTS = 1024

# How a value was typed, as ``InferenceResult.typed_by`` and the CLI name it.
SOURCE_INPUT = "input"
SOURCE_INITIALIZER = "initializer"
SOURCE_CONSTANT = "constant"
SOURCE_RULE = "rule"
SOURCE_FALLBACK = "onnx-fallback"
SOURCE_FUNCTION = "function"
SOURCE_UNKNOWN = "unknown"
SOURCE_FAILED = "failed"
SOURCE_DECLARED = "declared"

_GRAPH_ATTRS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
_ATTR_TENSOR = onnx.AttributeProto.TENSOR
_EXTERNAL = onnx.TensorProto.EXTERNAL
_TYPED_SOURCES = frozenset((SOURCE_RULE, SOURCE_FALLBACK, SOURCE_CONSTANT, SOURCE_FUNCTION))


@dataclass(frozen=True)
class NodeRecord:
    """How one node was typed.

    ``source`` is ``"rule"``, ``"onnx-fallback"``, ``"constant"``, ``"function"`` (a
    model-local function, inlined), ``"unknown"`` (no rule, no schema, no function) or
    ``"failed"`` (the rule or onnx rejected the node, or a required input is missing);
    ``version`` is the since_version of the rule's or schema's version that served the model's
    opset.
    """

    index: int
    label: str
    domain: str
    op_type: str
    source: str
    version: int | None = None

    def describe(self) -> str:
        """Short form for tables: ``rule QLinearConv v10``, ``onnx-fallback Relu v14``, ``unknown``."""
        return _describe(self.source, self.domain, self.op_type, self.version)


def _describe(source: str, domain: str, op_type: str, version: int | None) -> str:
    op = f"{domain}::{op_type}" if domain else op_type
    if source == SOURCE_FUNCTION:
        return f"function {op}"
    ver = f" v{version}" if version is not None else ""
    if source in (SOURCE_RULE, SOURCE_FALLBACK, SOURCE_FAILED):
        return f"{source} {op}{ver}"
    return source


@dataclass
class InferenceResult:
    """The outcome of one pass; ``infer_shapes``, ``infer_values`` and ``check_model`` read it.

    ``ctx`` holds every value's ``TensorInfo`` (of the main graph); ``errors`` every violation
    found (lenient mode records them instead of raising) and ``diagnostics`` the same as
    ``Diagnostic``s; ``nodes`` one ``NodeRecord`` per node of the main graph; ``typed_by``
    value name -> what typed it (``input``, ``initializer``, a node's
    ``NodeRecord.describe()``, ``declared``...); ``other_types`` the non-tensor types
    (sequences, optionals, maps) onnx inferred, which a ``TensorInfo`` cannot hold;
    ``subgraphs`` the values of every ``If``/``Loop``/``Scan`` body, by path (see
    :func:`subgraph_values`).
    """

    ctx: ShapesContext
    typed_by: dict[str, str] = field(default_factory=dict)
    other_types: dict[str, onnx.TypeProto] = field(default_factory=dict)
    subgraphs: dict[tuple, "_Graph"] = field(default_factory=dict, repr=False)
    _records: list = field(default_factory=list, repr=False)
    _nodes: list | None = field(default=None, repr=False)

    @property
    def nodes(self) -> list[NodeRecord]:
        if self._nodes is None or len(self._nodes) != len(self._records):
            nodes = self.main.nodes  # type: ignore[attr-defined]
            self._nodes = [NodeRecord(i, _label(node, i), _norm(node.domain), node.op_type, *(
                           (r.source, r.version) if type(r) is _Entry else r))
                           for i, (node, r) in enumerate(zip(nodes, self._records))]
        return self._nodes

    @property
    def errors(self) -> list[InferenceError]:
        return list(self.ctx.diagnostics)

    @property
    def diagnostics(self) -> list[Diagnostic]:
        return [Diagnostic.from_error(e) for e in self.ctx.diagnostics]

    def values(self) -> dict[str, TensorInfo]:
        return dict(self.ctx.items())

    def subgraph_values(self) -> dict[str, dict[str, TensorInfo]]:
        """Values of every subgraph body, keyed by where the body is:
        ``"<node label>/<attribute>"`` (nested bodies join with ``/``; ``Scan``/``Loop``
        bodies are ``.../body``, ``If`` branches ``.../then_branch`` and ``.../else_branch``)."""
        return {g.where: dict(g.scope.local_items()) for g in self.subgraphs.values()}


# ------------------------------------------------------------------ public API
def infer(model: ModelSource, *, strict: bool = False,
          input_shapes: Mapping[str, Iterable[Any]] | None = None,
          input_values: Mapping[str, np.ndarray] | None = None,
          declared_outputs_win: bool = True, runtime: bool = False) -> InferenceResult:
    """Run the pass over ``model`` (a ModelProto, path or bytes; not modified).

    ``input_shapes`` overrides graph input shapes (dims as ints, symbol names or ``None``);
    symbols it binds to ints are substituted in the other graph inputs too. ``input_values``
    gives graph inputs known contents (a Session planning for the values of small integer
    inputs that decide shapes); their shapes must agree with ``input_shapes``. Where a graph
    output's declared type contradicts the inferred one, lenient mode keeps the declared one
    (the model's contract) unless ``declared_outputs_win`` is False (a runtime allocating what
    the model computes, as onnxruntime does after its warning). Lenient mode
    records every violation in the result; ``strict=True`` raises the first
    ``InferenceError``. ``runtime=True`` (a runtime planning what it will compute): where onnx's
    shape inference and the runtimes (onnx.reference, onnxruntime) disagree on what a node
    computes, the runtimes' answer (``ShapesContext.runtime``).
    """
    proto = load_model(model, check_external=False)  # the pass checks external data as it seeds
    return _Pass(proto, strict=strict, label=_source_label(model), declared_outputs_win=declared_outputs_win,
                 runtime=runtime).run(input_shapes, input_values)


def infer_shapes(model: ModelSource, *, strict: bool = False) -> onnx.ModelProto:
    """A copy of ``model`` with ``value_info`` for every typed intermediate and typed outputs.

    A drop-in for ``onnx.shape_inference.infer_shapes``. Declared graph-output dims that are
    known are kept; a declared output type that contradicts the inferred one raises in strict
    mode and is kept (with a diagnostic) in lenient mode. Subgraph bodies get ``value_info``
    too.
    """
    proto = load_model(model, check_external=False)  # the pass checks external data as it seeds
    result = _Pass(proto, strict=strict, label=_source_label(model)).run(None)
    # a model parsed here from a path or bytes is nobody else's: typed in place, its weights
    # are not copied (for a big model the copy, fresh pages, costs more than the pass)
    return write_back(proto, result, copy=isinstance(model, onnx.ModelProto))


def infer_values(model: ModelSource, input_shapes: Mapping[str, Iterable[Any]] | None = None, *,
                 strict: bool = False, input_values: Mapping[str, np.ndarray] | None = None,
                 declared_outputs_win: bool = True, runtime: bool = False) -> dict[str, TensorInfo]:
    """Name -> ``TensorInfo`` for every value: graph inputs, initializers, intermediates, outputs.

    With concrete ``input_shapes`` every shape that follows from them is a tuple of ints;
    ``input_values`` (see ``infer``) lets the values computed from those inputs fold too.
    """
    return infer(model, strict=strict, input_shapes=input_shapes, input_values=input_values,
                 declared_outputs_win=declared_outputs_win, runtime=runtime).values()


def _source_label(model: ModelSource) -> str:
    """How errors about the model as a whole name it (as ``load_model`` does)."""
    if isinstance(model, onnx.ModelProto):
        return "<ModelProto>"
    if isinstance(model, (bytes, bytearray, memoryview)):
        return "<bytes>"
    return str(model)


def check(model: ModelSource, *, base_dir: str | os.PathLike | None = None) -> tuple[list[Diagnostic], InferenceResult]:
    """``check_model``'s diagnostics together with the pass result they came from (None when
    subgraphs nest too deep to walk: the ``graph-depth`` diagnostic says so)."""
    proto = load_model(model)
    found: list[Diagnostic] = []
    # given a path, the checker resolves external data beside the model, not in the cwd
    is_file = isinstance(model, (str, os.PathLike)) and model != EXAMPLE_NAME
    try:
        onnx.checker.check_model(os.fspath(model) if is_file else _checker_view(proto, base_dir, _source_label(model)))
    except QuantError:
        raise
    except Exception as e:  # onnx raises ValidationError, but also C++ errors of other kinds
        found.append(Diagnostic(MODEL_NODE, "onnx.checker", one_line(e)))
    found.extend(model_facts(proto))
    try:
        result = _Pass(proto, strict=False).run(None)
    except InferenceError as e:  # graph-depth: the pass cannot walk the model at all
        found.append(Diagnostic.from_error(e))
        return found, None
    found.extend(result.diagnostics)
    return found, result


def check_model(model: ModelSource, *, base_dir: str | os.PathLike | None = None) -> list[Diagnostic]:
    """Every problem of ``model``: onnx's checker first, then each violation the pass finds.

    Empty when the model is valid. External data of a model given as bytes or a ModelProto is
    looked for in ``base_dir`` only (refused without it: ``ModelLoadError`` naming the tensor).
    """
    return check(model, base_dir=base_dir)[0]


def _checker_view(proto: onnx.ModelProto, base_dir, label: str) -> onnx.ModelProto:
    """What onnx's checker may see of an in-memory model: the checker looks for external data
    in the current directory, so external tensors are checked here against ``base_dir``
    (:func:`check_external_files`) and handed to the checker as graph inputs of their type."""
    if check_external_files(proto, base_dir, label, resolve_budget()) is None:
        return proto
    view = onnx.ModelProto()
    view.CopyFrom(proto)
    graph = view.graph
    keep = [t for t in graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    moved = [t for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    inputs = {i.name for i in graph.input}
    graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                       for t in moved if t.name not in inputs)
    del graph.initializer[:]
    graph.initializer.extend(keep)
    return view


# ------------------------------------------------------------------ write-back
def write_back(model: onnx.ModelProto, result: InferenceResult, *, copy: bool = True) -> onnx.ModelProto:
    """``model`` carrying the result: value_info for intermediates (in subgraph bodies too),
    typed graph outputs. A copy, unless ``copy=False``: then ``model`` itself is updated and
    returned (for a model nothing else holds)."""
    if copy:
        out = onnx.ModelProto()
        out.CopyFrom(model)
    else:
        out = model
    _Writer(result, in_place=not copy).graph(out.graph, model.graph, result.main, top=True)
    return out


class _Writer:
    def __init__(self, result: InferenceResult, *, in_place: bool = False) -> None:
        self.result = result
        self.owner = result.owner
        self.in_place = in_place  # the graphs written are the ones read

    def graph(self, graph: onnx.GraphProto, source: onnx.GraphProto, g: "_Graph", *, top: bool) -> None:
        scope, typebytes = g.scope, self.owner.type_bytes
        local = scope._values
        other = scope.other
        skip = {v.name for v in source.input} | {v.name for v in source.output} | {""}
        skip.update(g.initializer_names if g.initializer_names is not None else [t.name for t in source.initializer])
        skip |= {t.values.name for t in source.sparse_initializer}
        existing = {vi.name: vi for vi in source.value_info} if len(source.value_info) else {}
        if existing and self.in_place:  # in place: keep the old annotations past their deletion
            existing = {name: onnx.ValueInfoProto.FromString(vi.SerializeToString()) for name, vi in existing.items()}
        del graph.value_info[:]
        parts: list[bytes] = []
        seen = skip  # names skipped or written already
        type_parts: dict[int, bytes] = {}
        varint = _varint
        plain = not existing and not other  # the common case: each type's bytes once per TensorInfo
        for name in g.produced:
            if name in seen:
                continue
            seen.add(name)
            info = local.get(name)
            tpart = type_parts.get(id(info)) if plain else None
            if tpart is None:
                old = existing.get(name) if existing else None
                tp = other.get(name) if other else None
                if tp is not None:
                    tb = tp.SerializeToString()
                elif info is not None and info.elem_type:
                    tb = typebytes(info)
                elif old is not None:
                    tb = old.type.SerializeToString()
                else:
                    seen.discard(name)
                    continue
                tpart = b"\x12" + varint(len(tb)) + tb  # ValueInfoProto.type = 2
                if tp is None and old is None:
                    type_parts[id(info)] = tpart
                if old is not None and old.doc_string:
                    db = old.doc_string.encode()
                    tpart += b"\x1a" + varint(len(db)) + db
            nb = name.encode()
            nl = varint(len(nb))
            # GraphProto.value_info = 13, ValueInfoProto.name = 1
            parts += (b"\x6a", varint(1 + len(nl) + len(nb) + len(tpart)), b"\x0a", nl, nb, tpart)
        # annotations of names the pass never produced are kept as they were
        for name, old in existing.items():
            if name not in seen:
                vb = old.SerializeToString()
                parts.append(b"\x6a" + varint(len(vb)) + vb)
        if parts:
            graph.MergeFromString(b"".join(parts))
        texts: dict = {}
        for vo in graph.output:
            info = scope.get(vo.name)
            tp = scope.other_type(vo.name)
            declared_kind = vo.type.WhichOneof("value")
            if tp is not None and declared_kind != "tensor_type":
                vo.type.CopyFrom(tp)
            elif info is not None and info.elem_type and declared_kind in (None, "tensor_type"):
                merged = g.final_outputs.get(vo.name, info)
                vo.type.Clear()
                write_type(vo.type, merged, texts)
        if not top:  # body inputs the model left untyped get what the pass seeded them with
            for vi in graph.input:
                info = local.get(vi.name)
                if info is not None and info.elem_type and not vi.type.tensor_type.elem_type \
                        and vi.type.WhichOneof("value") in (None, "tensor_type"):
                    vi.type.Clear()
                    write_type(vi.type, info, texts)
        # bodies of If / Loop / Scan
        for path_step, sub in g.children.items():
            index, attr_name, gi = path_step
            for a in graph.node[index].attribute:
                if a.name != attr_name:
                    continue
                target = a.g if a.type == onnx.AttributeProto.GRAPH else a.graphs[gi]
                src_attr = next(x for x in source.node[index].attribute if x.name == attr_name)
                src = src_attr.g if src_attr.type == onnx.AttributeProto.GRAPH else src_attr.graphs[gi]
                self.graph(target, src, sub, top=False)


_SMALL_VARINTS = [bytes((i,)) for i in range(0x80)] + [bytes((0x80 | (i & 0x7F), i >> 7)) for i in range(0x80, 0x4000)]


#: TensorShapeProto.dim entries (field 1) of dim_value (field 1) d, for small d
_DIM_VALUE_BYTES = [b"\x0a" + bytes((len(v) + 1,)) + b"\x08" + v for v in _SMALL_VARINTS]


def _varint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int."""
    if n < 0x4000:
        return _SMALL_VARINTS[n]
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def write_type(tp: onnx.TypeProto, info: TensorInfo, texts: dict | None = None) -> None:
    """Fill ``tp`` with ``info`` (as ``TensorInfo.to_type_proto``, without a temporary proto).

    ``texts`` caches the dim_param text of symbolic dims across calls.
    """
    texts = {} if texts is None else texts
    tt = tp.tensor_type
    tt.elem_type = info.elem_type
    if info.shape is None:
        return
    shape = tt.shape
    shape.SetInParent()  # a scalar still needs an (empty) shape
    for d in info.shape:
        dim = shape.dim.add()
        if d is None:
            continue
        if isinstance(d, int):
            dim.dim_value = d
        else:
            text = texts.get(d)
            if text is None:
                text = texts[d] = d.text()
            dim.dim_param = text


# ------------------------------------------------------------------ lazy constants
class _Lazy(TensorInfo):
    """An initializer or ``Constant`` tensor: type and shape from the proto, the value read
    from it only when a rule asks (``numpy_helper.to_array``); external data is never read.

    Equal to (and hashing like) any ``TensorInfo`` of the same type and shape.
    """

    def __init__(self, proto: onnx.TensorProto, owner: "_Owner | None" = None) -> None:
        d = self.__dict__
        d["_proto"] = proto
        d["_owner"] = owner  # its pass's bookkeeping: notes every read (the memo), reports unreadable data

    @property
    def elem_type(self) -> int:  # type: ignore[override]
        d = self.__dict__
        t = d.get("_elem_type")
        if t is None:
            t = d["_elem_type"] = d["_proto"].data_type
        return t

    @property
    def shape(self) -> tuple[int, ...]:  # type: ignore[override]
        d = self.__dict__
        s = d.get("_shape")
        if s is None:
            s = d["_shape"] = tuple(d["_proto"].dims[:])
        return s

    @property
    def value(self) -> np.ndarray | None:  # type: ignore[override]
        d = self.__dict__
        owner = d["_owner"]
        if owner is not None:
            owner.log.append(self)
        if "_value" in d:
            return d["_value"]
        v = None
        proto = d["_proto"]
        if proto.data_location != onnx.TensorProto.EXTERNAL:
            try:
                v = _to_array(proto)
            except Exception as e:  # malformed data (wrong raw_data length, unknown type)
                if owner is not None:
                    owner.raise_or_record(InferenceError(
                        "initializer", MODEL_NODE, f"tensor {proto.name!r}: cannot read its data: {one_line(e)}"))
        d["_value"] = v
        return v

    @property
    def external(self) -> bool:
        """Stored outside the model file (never read by the pass)."""
        return self.__dict__["_proto"].data_location == onnx.TensorProto.EXTERNAL

    @property
    def size(self) -> int:
        numel = 1
        for s in self.shape:
            numel *= s
        return numel

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TensorInfo):
            return self.elem_type == other.elem_type and self.shape == other.shape
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.elem_type, self.shape))

    def __repr__(self) -> str:
        return f"TensorInfo(elem_type={self.elem_type}, shape={self.shape})"


_UNKNOWN = TensorInfo()


class _Owner:
    """A pass's bookkeeping that constants and scopes report to (see ``_Lazy``)."""

    __slots__ = ("strict", "diagnostics", "log")

    def __init__(self, strict: bool, diagnostics: list) -> None:
        self.strict = strict
        self.diagnostics = diagnostics
        self.log: list = []  # constants read since the current node started (the memo)

    def raise_or_record(self, err: InferenceError) -> None:
        if self.strict:
            raise err
        self.diagnostics.append(err)


class _NoLog(list):
    def append(self, item) -> None:
        pass


class _Dep:
    """Memo marker: results for this key depend on the content of these constant inputs."""

    __slots__ = ("indices",)

    def __init__(self, indices: frozenset | None) -> None:
        self.indices = indices


#: Memo marker: the rule read a big constant (a weight): nodes of this key are not memoized.
_NEVER = _Dep(None)


# ------------------------------------------------------------------ scopes and graphs
_TensorProto = onnx.TensorProto


class _Scope(ShapesContext):
    """A graph's values. A body's scope reads through to the enclosing graphs' values
    (outer-scope references); writes stay local.

    The main graph's initializers are stored as their ``TensorProto`` until something reads
    them (a ``_Lazy`` is made then): on the memo's hit path only their key ids are needed."""

    def __init__(self, opsets: dict[str, int], strict: bool, diagnostics: list,
                 parent: "_Scope | None" = None, owner: "_Owner | None" = None) -> None:
        self.opsets = opsets
        self.strict = strict
        self._values: dict[str, TensorInfo] = {}
        self.diagnostics = diagnostics
        self.parent = parent
        self.owner = owner
        self.runtime = parent.runtime if parent is not None else False
        self.other: dict[str, onnx.TypeProto] = {}  # non-tensor types (sequence, optional, map)
        self.kids: dict[str, int] = {"": 0}  # name -> memo key id of its current value (a cache); "": absent

    def _materialize(self, name: str, proto: onnx.TensorProto) -> TensorInfo:
        info = self._values[name] = _Lazy(proto, self.owner)
        return info

    def __contains__(self, name: str) -> bool:
        s = self
        while s is not None:
            if name in s._values:
                return True
            s = s.parent
        return False

    def __getitem__(self, name: str) -> TensorInfo:
        s = self
        while s is not None:
            v = s._values.get(name)
            if v is not None:
                return s._materialize(name, v) if type(v) is _TensorProto else v
            s = s.parent
        return TensorInfo()

    def get(self, name: str) -> TensorInfo | None:
        s = self
        while s is not None:
            v = s._values.get(name)
            if v is not None:
                return s._materialize(name, v) if type(v) is _TensorProto else v
            s = s.parent
        return None

    def raw(self, name: str):
        """What is stored for ``name`` (a ``TensorProto`` for an unread initializer), or None."""
        s = self
        while s is not None:
            v = s._values.get(name)
            if v is not None:
                return v
            s = s.parent
        return None

    def other_type(self, name: str) -> onnx.TypeProto | None:
        s = self
        while s is not None:
            if name in s._values:
                return s.other.get(name)
            s = s.parent
        return None

    def local_items(self):
        values = self._values
        for name, v in list(values.items()):
            if type(v) is _TensorProto:
                self._materialize(name, v)
        return values.items()

    def items(self):
        return iter(self.local_items())

    def names(self) -> list[str]:
        return list(self._values)


class _Graph:
    """One graph being walked: the main graph, a subgraph body, or a function body."""

    def __init__(self, proto, scope: _Scope, dispatch: dict, *, prefix: str = "", where: str = "",
                 nodes: list | None = None, top: bool = False) -> None:
        self.proto = proto
        self.scope = scope
        self.dispatch = dispatch
        self.prefix = prefix  # prepended to node labels in diagnostics
        self.where = where
        self.nodes = list(proto.node) if nodes is None else nodes
        self.top = top
        self.declared: dict[str, tuple[TensorInfo, bool]] = {}
        self.typed_by: dict[str, str] = {}
        self.produced: list[str] = []
        # main graph only, one per node in order: the ``_Entry`` of a memo hit, else (source, version)
        self.records: list | None = [] if top else None
        self.children: dict[tuple, "_Graph"] = {}
        self.final_outputs: dict[str, TensorInfo] = {}
        self.initializer_names: dict | None = None  # the main graph's, as an ordered set
        self.get = scope.get


class _NodeCtx(NodeContext):
    """``NodeContext`` whose label names the enclosing node for nodes inside bodies, and whose
    input and output names are lists read from the proto once (``node_ctx`` sets them):
    rules ask for them many times, and each protobuf read makes a new object."""

    prefix = ""
    inputs: list
    outputs: list

    def input_name(self, i: int) -> str:
        inputs = self.inputs
        return inputs[i] if i < len(inputs) else ""

    def output_name(self, i: int) -> str:
        outputs = self.outputs
        return outputs[i] if i < len(outputs) else ""

    def input(self, i: int) -> TensorInfo | None:  # the rules' most frequent call: no nested calls
        inputs = self.inputs
        if i < len(inputs):
            name = inputs[i]
            if name:
                return self.ctx[name]
        return None

    def has_input(self, i: int) -> bool:
        inputs = self.inputs
        return i < len(inputs) and bool(inputs[i])

    def set_output(self, i: int, info: TensorInfo) -> None:
        outputs = self.outputs
        if i < len(outputs):
            name = outputs[i]
            if name:
                self.ctx._values[name] = info

    @property
    def label(self) -> str:  # type: ignore[override]
        return self.prefix + _label(self.node, self.index)


def _label(node: onnx.NodeProto, index: int) -> str:
    if node.name:
        return f"{node.name!r} ({node.op_type})"
    return f"#{index} ({node.op_type})"


def _norm(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


# dispatch kinds
_K_NO_OPSET, _K_CONSTANT, _K_CONTROL, _K_RULE, _K_FALLBACK, _K_FUNCTION, _K_UNKNOWN = range(7)


class _Entry:
    """How nodes of one (domain, op_type) are typed under one set of opset imports."""

    __slots__ = ("kind", "domain", "op", "opset", "version", "rule", "schema", "required", "variadic",
                 "source", "described", "handler", "folder", "memo", "function")

    def __init__(self, facts: tuple, function) -> None:
        """``facts``: every field but the memo and the function, in ``__slots__`` order, as
        ``_entry_facts`` decides them once per process."""
        (self.kind, self.domain, self.op, self.opset, self.version, self.rule, self.schema, self.required,
         self.variadic, self.source, self.described, self.handler, self.folder) = facts
        self.function = function if self.kind == _K_FUNCTION else None  # a model-local function
        self.memo: dict | None = {} if self.kind in (_K_RULE, _K_FALLBACK) else None  # rules and the fallback only


# ------------------------------------------------------------------ the pass
class _Pass:
    """State of one walk; nothing outlives ``run``."""

    def __init__(self, model: onnx.ModelProto, *, strict: bool, label: str = "<model>",
                 declared_outputs_win: bool = True, runtime: bool = False) -> None:
        self.model = model
        self.strict = strict
        self.label = label
        #: on a conflict, keep a graph output's declared type (the model's contract, for typing)
        #: or what the model computes (what a runtime must allocate, as onnxruntime does)
        self.declared_outputs_win = declared_outputs_win
        opsets: dict[str, int] = {}
        for o in model.opset_import:
            opsets[normalize_domain(o.domain)] = int(o.version)
        if not model.opset_import:  # IR < 3 models imply ai.onnx opset 1
            opsets[""] = 1
        self.opsets = opsets
        self.diagnostics: list = []
        # what constants and scopes report to: no reference back to the pass, so that dropping
        # the result frees everything at once (no cycles left for the garbage collector)
        self.owner = _Owner(strict, self.diagnostics)
        scope = _Scope(opsets, strict, self.diagnostics, owner=self.owner)
        scope.runtime = runtime
        self.ctx = scope
        self.result = InferenceResult(scope)
        self.result.owner = self  # type: ignore[attr-defined]
        self._onnx_opsets = {o.domain: int(o.version) for o in model.opset_import} or {"": 1}
        self._ir_version = int(model.ir_version) or onnx.IR_VERSION
        self._parsed: dict[str, DimLike] = {}
        self._texts: dict[int, tuple] = {}   # id(Dim) -> (Dim, its TensorShapeProto.dim bytes)
        self._interned: dict[int, tuple] = {}  # id(info) -> (info, key id, type bytes)
        self._key_ids: dict[tuple, int] = {}
        self._encoded: dict[tuple, bytes] = {}  # (elem_type, shape) -> TypeProto bytes
        self._content_ids: dict[int, tuple] = {}  # id(TensorProto) -> (proto, content key id)
        self._data_bytes: dict[int, tuple] = {}  # id(info) -> (info, TensorProto bytes or None)
        self._dispatch_tables: dict[tuple, dict] = {}
        from onnx_quant.inference import functions

        self.functions = functions.index(model)
        self._call_stack: list = []
        top = _Graph(model.graph, scope, self.dispatch_table(opsets), top=True)
        top.typed_by = self.result.typed_by
        scope.other = self.result.other_types
        self.main = top
        self.result.main = top  # type: ignore[attr-defined]
        self.result._records = top.records

    # -- driver
    def run(self, input_shapes: Mapping[str, Iterable[Any]] | None,
            input_values: Mapping[str, np.ndarray] | None = None) -> InferenceResult:
        check_depth(self.model.graph, self.model.functions)  # before any recursive walk
        g = self.main
        self._seed(g, input_shapes)
        if input_values:
            self._seed_input_values(g, input_values)
        self.walk(g)
        self._check_outputs_defined(g)
        self.owner.log = _NoLog()  # values read after the pass need no bookkeeping
        result, self.result = self.result, None  # the result refers to the pass, not the other way
        return result

    def walk(self, g: _Graph) -> None:
        """Type every node of ``g`` in order. The loop is the memo's hit path: build the node's
        key, and on a hit set the cached outputs; everything else is ``_slow_node``. Reading
        a node's fields from protobuf is most of a hit's cost, so each is read once, and
        single-output nodes (most of them) skip the general output loop."""
        dispatch = g.dispatch
        scope = g.scope
        kids = scope.kids
        kids_get = kids.get
        kid_of = self._kid_of
        values = scope._values
        contains = values.__contains__ if scope.parent is None else scope.__contains__
        typed_by = g.typed_by
        declared = g.declared
        produced = g.produced
        add_produced = produced.append
        records = g.records
        record = records.append if records is not None else None
        has_functions = bool(self.functions)
        slow = self._slow_node
        typed_constant = self._typed_constant
        content_key = self._content_key
        index = -1
        for node in g.nodes:
            index += 1
            dkey = (node.domain, node.op_type, node.overload) if has_functions else (node.domain, node.op_type)
            entry = dispatch.get(dkey)
            if entry is None:
                entry = self._entry(g, node, dkey)
            memo = entry.memo
            if memo is None:  # constants, control flow, functions, unknown ops: never memoized
                if entry.kind is not _K_CONSTANT or not typed_constant(g, index, node, entry):
                    slow(g, index, node, entry, None)
                continue
            inputs = node.input[:]
            key: list | None = list(map(kids_get, inputs))  # kids[""] is 0: an absent optional input
            if None in key:
                for i, name in enumerate(inputs):
                    if key[i] is None:
                        kid = kid_of(g, name)
                        if kid is None:  # not defined (yet): reported on the slow path
                            key = None
                            break
                        key[i] = kid
                if key is None:
                    slow(g, index, node, entry, None)
                    continue
            attrs = node.attribute
            if attrs:
                for a in attrs:
                    t = a.type
                    if t == 5 or t == 10:  # GRAPH, GRAPHS: bodies read outer-scope values
                        key = None
                        break
                    key.append(a.SerializeToString())
                if key is None:
                    slow(g, index, node, entry, None)
                    continue
            outputs = node.output[:]
            single = len(outputs) == 1 and outputs[0]
            key.append(len(outputs))
            if not single and "" in outputs:
                key.append(tuple(map(bool, outputs)))
            key = tuple(key)
            cached = memo.get(key)
            if cached is not None and type(cached) is _Dep:  # the rule read constants: key them by content
                if cached is _NEVER:  # ... big ones: not memoized at all
                    slow(g, index, node, entry, None)
                    continue
                cached = memo.get(content_key(g, inputs, key, cached.indices))
            if cached is None:
                slow(g, index, node, entry, key, inputs, outputs)
                continue
            if single:
                if contains(single):
                    self._redefined(g, index, node, single)
                out = cached[0]
                values[single], kids[single] = out
                typed_by[single] = entry.described
                if single in declared:
                    self._merge_declared(g, self.node_ctx(g, index, node, entry), single, out[0])
                add_produced(single)
            else:
                described = entry.described
                for name, out in zip(outputs, cached):
                    if name:
                        if contains(name):
                            self._redefined(g, index, node, name)
                        values[name], kids[name] = out
                        typed_by[name] = described
                        if name in declared:
                            self._merge_declared(g, self.node_ctx(g, index, node, entry), name, out[0])
                produced.extend(outputs)
            if record is not None:
                record(entry)  # a hit: the entry says how (see InferenceResult.nodes)

    def _kid_of(self, g: _Graph, name: str) -> int | None:
        """Memo key id of the value ``name`` (None if it is not defined)."""
        info = g.get(name)
        if info is None:
            return None
        rec = self._interned.get(id(info)) or self._intern(info)
        g.scope.kids[name] = rec[1]
        return rec[1]

    def raise_or_record(self, err: InferenceError) -> None:
        if self.strict:
            raise err
        self.diagnostics.append(err)

    def dispatch_table(self, opsets: dict[str, int]) -> dict:
        key = tuple(sorted(opsets.items()))
        table = self._dispatch_tables.get(key)
        if table is None:
            table = self._dispatch_tables[key] = {}
        return table

    # -- seeding
    def _seed(self, g: _Graph, input_shapes: Mapping[str, Iterable[Any]] | None) -> None:
        graph = g.proto
        values = g.scope._values
        typed_by = g.typed_by
        input_names = {v.name for v in graph.input}
        names = self._seed_initializers(g, graph.initializer)
        for name in input_names.intersection(names):  # only a default the caller may override: not a constant
            info = g.scope[name]
            values[name] = TensorInfo(info.elem_type, info.shape)
        g.initializer_names = names
        kids = g.scope.kids
        for name in input_names:
            kids.pop(name, None)
        for st in graph.sparse_initializer:
            for t in (st.values, st.indices):
                if t.data_location == onnx.TensorProto.EXTERNAL:
                    check_external_location(t, self.label)
            name = st.values.name
            values[name] = TensorInfo(int(st.values.data_type), tuple(int(d) for d in st.dims))
            typed_by[name] = SOURCE_INITIALIZER
        for v in graph.input:
            if v.type.WhichOneof("value") not in (None, "tensor_type"):
                g.scope.other[v.name] = v.type
                values[v.name] = TensorInfo()
                typed_by[v.name] = SOURCE_INPUT
                continue
            declared = self.from_type_proto(v.type)
            if v.name in values and typed_by.get(v.name) == SOURCE_INITIALIZER:
                if not declared.is_typed:
                    continue  # keep what the initializer says
            elif declared.shape is not None and None in declared.shape:
                declared = TensorInfo(declared.elem_type, _named_dims(v.name, declared.shape))
            values[v.name] = declared
            typed_by[v.name] = SOURCE_INPUT
        if input_shapes:
            self._override_inputs(g, input_shapes, input_names)
        self.seed_declared(g)

    def _seed_initializers(self, g: _Graph, inits) -> dict[str, str]:
        """Each initializer's memo key id (its type and shape: one read of the proto each, the
        hottest loop of big models); the value stays the proto until something reads it.
        Returns name -> ``"initializer"`` in graph order (also the initializers' ordered set)."""
        values, kids, key_ids = g.scope._values, g.scope.kids, self._key_ids
        names = []
        append = names.append
        label = self.label
        for t in inits:
            name = t.name
            if t.data_location:  # EXTERNAL: never read, but refused if it points outside the model's folder
                check_external_location(t, label)
            dims = t.dims
            k = (t.data_type, tuple(dims[:]) if len(dims) else ())
            kid = key_ids.get(k)
            if kid is None:
                kid = key_ids[k] = len(key_ids) + 1
            kids[name] = kid
            values[name] = t
            append(name)
        typed = dict.fromkeys(names, SOURCE_INITIALIZER)
        g.typed_by.update(typed)
        return typed

    def seed_declared(self, g: _Graph) -> None:
        graph = g.proto
        for vi in graph.value_info:
            if vi.type.HasField("tensor_type"):
                g.declared[vi.name] = (self.from_type_proto(vi.type), False)
        for vo in graph.output:
            if vo.type.HasField("tensor_type"):
                g.declared[vo.name] = (self.from_type_proto(vo.type), True)

    def seed_body(self, g: _Graph, inputs: list[TensorInfo | None]) -> None:
        """Initializers, inputs (``inputs[i]``, already merged with the declaration; ``None``
        keeps the declared type) and declared types of a subgraph body."""
        graph = g.proto
        values = g.scope._values
        for t in graph.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                check_external_location(t, self.label)
            values[t.name] = _Lazy(t, self.owner)
            g.typed_by[t.name] = SOURCE_INITIALIZER
        for st in graph.sparse_initializer:
            values[st.values.name] = TensorInfo(int(st.values.data_type), tuple(int(d) for d in st.dims))
        for i, v in enumerate(graph.input):
            info = inputs[i] if i < len(inputs) else None
            if isinstance(info, onnx.TypeProto):  # a sequence, optional or map value
                g.scope.other[v.name] = info
                info = TensorInfo()
            elif info is None:
                if v.type.WhichOneof("value") not in (None, "tensor_type"):
                    g.scope.other[v.name] = v.type
                    info = TensorInfo()
                else:
                    info = self.from_type_proto(v.type)
            values[v.name] = info
            g.typed_by[v.name] = SOURCE_INPUT
        self.seed_declared(g)

    def _seed_input_values(self, g: _Graph, input_values: Mapping[str, np.ndarray]) -> None:
        values = g.scope._values
        for name, arr in input_values.items():
            info = g.scope.get(name)
            if info is None or g.typed_by.get(name) != SOURCE_INPUT:
                raise InferenceError("input-values", MODEL_NODE, f"{name!r} is not a graph input",
                                     expected="a graph input", found=repr(name))
            a = np.asarray(arr)
            if info.shape is not None and tuple(info.shape) != tuple(a.shape):
                raise InferenceError("input-values", MODEL_NODE, f"input {name!r}: the value's shape differs",
                                     expected=info.shape_text(), found=str(list(a.shape)))
            values[name] = TensorInfo(info.elem_type, tuple(int(d) for d in a.shape), a)

    def _override_inputs(self, g: _Graph, input_shapes: Mapping[str, Iterable[Any]], input_names: set[str]) -> None:
        values = g.scope._values
        bindings: dict[str, int] = {}
        for name, shape in input_shapes.items():
            if name not in input_names:
                raise InferenceError("input-shapes", MODEL_NODE, f"{name!r} is not a graph input",
                                     expected=f"one of {sorted(input_names)}", found=repr(name))
            new = tuple(_dim_arg(d, name) for d in shape)
            declared = g.scope[name]
            if declared.shape is not None:
                if len(declared.shape) != len(new):
                    raise InferenceError("input-shapes", MODEL_NODE, f"input {name!r}: rank differs from the model's",
                                         expected=declared.shape_text(), found=_shape_text(new))
                for old, given in zip(declared.shape, new):
                    if isinstance(old, int) and isinstance(given, int) and old != given:
                        raise InferenceError("input-shapes", MODEL_NODE, f"input {name!r}: a fixed dim differs",
                                             expected=declared.shape_text(), found=_shape_text(new))
                    if isinstance(old, dims.Dim) and isinstance(given, int) and len(old.symbols) == 1 and old == dims.Dim.symbol(next(iter(old.symbols))):
                        sym = next(iter(old.symbols))
                        if bindings.setdefault(sym, given) != given:
                            raise InferenceError("input-shapes", MODEL_NODE, f"symbol {sym!r} bound twice",
                                                 expected=str(bindings[sym]), found=str(given))
            values[name] = TensorInfo(declared.elem_type, new)
            g.typed_by[name] = SOURCE_INPUT
        if not bindings:
            return
        for name in input_names - set(input_shapes):
            info = g.scope.get(name)
            if info is None or info.shape is None or g.typed_by.get(name) != SOURCE_INPUT:
                continue
            bound = tuple(_bind(d, bindings) for d in info.shape)
            values[name] = TensorInfo(info.elem_type, bound, info.value)

    # -- dispatch
    def _entry(self, g: _Graph, node: onnx.NodeProto, key: tuple) -> _Entry:
        domain = _norm(node.domain)
        op = node.op_type
        opset = g.scope.opset(domain)
        function = self.functions.get((domain, op, node.overload)) if self.functions else None
        e = _Entry(_entry_facts(domain, op, opset, function is not None, registry.generation, registry.lookup),
                   function)
        g.dispatch[key] = e
        return e

    def schema(self, domain: str, op_type: str, opset: int):
        return _schema_facts(domain, op_type, opset)[0]

    # -- one node
    def _content_key(self, g: _Graph, inputs, key: tuple, indices: frozenset) -> tuple:
        """``key`` extended by the content of the constant inputs (names) at ``indices``."""
        scope = g.scope
        parts = [key, indices]
        for i in sorted(indices):
            name = inputs[i]
            v = scope.raw(name)
            if type(v) is _TensorProto or type(v) is _Lazy:
                proto = v if type(v) is _TensorProto else v.__dict__["_proto"]
                rec = self._content_ids.get(id(proto))
                parts.append(rec[1] if rec is not None else self._content_id(scope, name, proto))
            else:  # a value a rule computed: its key id has its content already
                parts.append(scope.kids.get(name) or self._kid_of(g, name))
        return tuple(parts)

    def _content_id(self, scope: _Scope, name: str, proto: onnx.TensorProto) -> int:
        """Key id of a constant's type, shape and content (a big one's is its identity), read
        from the proto itself: a node keyed by a constant's content runs once per layer."""
        shape = tuple(proto.dims[:])
        if proto.data_location == onnx.TensorProto.EXTERNAL:
            vk = None
        elif math.prod(shape) > _KEY_MAX_ELEMENTS:
            vk = ("object", id(proto))
        else:
            vk = _proto_content(proto)
            if vk is None:  # complex data: decoded
                v = scope.get(name).value
                vk = None if v is None else _array_key(v)
        k = ("content", proto.data_type, shape, vk)
        kid = self._key_ids.get(k)
        if kid is None:
            kid = self._key_ids[k] = len(self._key_ids) + 1
        self._content_ids[id(proto)] = (proto, kid)
        return kid

    def node_ctx(self, g: _Graph, index: int, node, entry: _Entry, inputs: list | None = None,
                 outputs: list | None = None) -> _NodeCtx:
        n = _NodeCtx(node, index, g.scope, entry.version or 0, entry.opset or 0)
        n.prefix = g.prefix
        n.inputs = node.input[:] if inputs is None else inputs
        n.outputs = node.output[:] if outputs is None else outputs
        return n

    def _redefined(self, g: _Graph, index: int, node, name: str) -> None:
        n = _NodeCtx(node, index, g.scope, 0, 0)
        n.prefix = g.prefix
        self.raise_or_record(n.error(
            "single-assignment", f"output {name!r} is already defined ({g.typed_by.get(name, 'earlier')})"))

    def _typed_constant(self, g: _Graph, index: int, node, entry: _Entry) -> bool:
        """A well-formed ``Constant`` (one value attribute, one new output, no inputs) typed from
        its attribute with no ``NodeContext``: torch writes every shape constant as one, a third
        of an exported model's nodes. False leaves the node to :meth:`_slow_node`, which types
        it the same way and reports whatever is wrong with it."""
        outputs = node.output
        if len(outputs) != 1 or node.input:
            return False
        name = outputs[0]
        scope = g.scope
        if not name or (name in scope._values if scope.parent is None else name in scope):
            return False
        info = self._constant_info(node.attribute)
        if info is None:
            return False
        scope._values[name] = info
        rec = self._interned.get(id(info)) or self._intern(info)
        scope.kids[name] = rec[1]
        g.typed_by[name] = entry.described
        if name in g.declared:
            self._merge_declared(g, self.node_ctx(g, index, node, entry), name, info)
        g.produced.append(name)
        if g.records is not None:
            g.records.append((SOURCE_CONSTANT, entry.version))
        return True

    def _slow_node(self, g: _Graph, index: int, node, entry: _Entry, key: tuple | None,
                   inputs: list | None = None, outputs: list | None = None) -> None:
        """Type one node the memo could not: its rule, onnx's fallback, a body, a function.
        ``key`` (with the ``inputs`` and ``outputs`` the walk read) when the memo may keep the
        result; without one the inputs are checked to be defined first."""
        n = self.node_ctx(g, index, node, entry, inputs, outputs)
        outputs = n.outputs
        scope = g.scope
        if key is None:  # with a key every input was found already
            self._check_inputs_defined(g, n)
        contains = scope._values.__contains__ if scope.parent is None else scope.__contains__
        for name in outputs:
            if name and contains(name):
                self._redefined(g, index, node, name)
        kind = entry.kind
        diag_mark = len(self.diagnostics)
        log = self.owner.log
        log.clear()
        source = SOURCE_UNKNOWN
        if kind is _K_RULE:  # the common case first
            if self._required_present(n, entry):
                source = SOURCE_RULE if self._run_rule(entry.rule, n) else SOURCE_FAILED
            else:
                source = SOURCE_FAILED
        elif kind is _K_NO_OPSET:
            self.raise_or_record(n.error(
                "opset-import", f"domain {entry.domain or 'ai.onnx'!r} is not in the model's opset_import"))
        elif kind is _K_CONSTANT:
            if self._constant(n):
                source = SOURCE_CONSTANT
            else:  # malformed: let the Constant rule or onnx judge it
                found = registry.lookup("", "Constant", entry.opset)
                schema = self.schema("", "Constant", entry.opset)
                if found is not None:
                    n.version = found[1]
                    source = SOURCE_RULE if self._run_rule(found[0], n) else SOURCE_FAILED
                elif schema is not None:
                    source = self._fallback(schema, n)
        elif kind is _K_FUNCTION:
            from onnx_quant.inference import functions

            source = SOURCE_FUNCTION if functions.call(self, g, n, entry.function) else SOURCE_FAILED
        elif kind is _K_UNKNOWN:
            self._unknown_op(n, entry)
        elif not self._required_present(n, entry):
            source = SOURCE_FAILED
        elif kind is _K_FALLBACK:
            source = self._fallback(entry.schema, n)
        else:  # _K_CONTROL
            source = SOURCE_RULE if entry.handler(self, g, n) else SOURCE_FAILED
        ok = source in _TYPED_SOURCES
        if ok and entry.folder is not None:
            self._fold(n, entry.folder)
        values = scope._values
        described = entry.described if source == entry.source else \
            _describe(source, entry.domain, entry.op, entry.version) if source != SOURCE_UNKNOWN else SOURCE_UNKNOWN
        outs = []
        kids = scope.kids
        interned = self._interned
        typed_by = g.typed_by
        for name in outputs:
            if not name:
                outs.append(None)
                continue
            info = values.get(name)
            if info is None or not ok:
                info = values[name] = _UNKNOWN  # a failed node's outputs are unknown, whatever it set
            rec = interned.get(id(info)) or self._intern(info)
            kids[name] = rec[1]
            outs.append((info, rec[1]))
            typed_by[name] = described
        # memoize a clean result (no diagnostics, tensor outputs only) on what the rule read
        if key is not None and ok and len(self.diagnostics) == diag_mark and not n.fresh \
                and not (scope.other and any(name and name in scope.other for name in outputs)):
            self._memoize(g, n.inputs, entry, key, tuple(outs), log)
        log.clear()
        if g.declared:
            for name in outputs:
                if name and name in g.declared:
                    self._merge_declared(g, n, name, values[name])
        g.produced.extend(outputs)
        if g.records is not None:
            g.records.append((source, entry.version if source != SOURCE_UNKNOWN else None))

    def _memoize(self, g: _Graph, inputs: list, entry: _Entry, key: tuple, outs: tuple, reads: list) -> None:
        memo = entry.memo
        if not reads:
            if memo.get(key) is None:
                memo[key] = outs
            return
        for x in reads:
            if x.size > _KEY_MAX_ELEMENTS:  # a weight: keyed by identity it would never hit again
                memo[key] = _NEVER
                return
        read = {id(x) for x in reads}
        get = g.get
        indices = {i for i, name in enumerate(inputs) if name and id(get(name)) in read}
        if len(read) != len({id(get(inputs[i])) for i in indices}):
            return  # the rule read a constant that is not one of its inputs: not memoized
        dep = memo.get(key)
        if type(dep) is _Dep and indices <= dep.indices:
            indices = dep.indices
        else:
            indices = frozenset(indices | (dep.indices if type(dep) is _Dep else set()))
            memo[key] = _Dep(indices)
        memo[self._content_key(g, inputs, key, indices)] = outs

    def _check_inputs_defined(self, g: _Graph, n: NodeContext) -> None:
        scope = g.scope
        for name in n.node.input:
            if name and name not in scope:
                later = self._producer_after(g, name, n.index)
                where = (f"it is produced later by node #{later} ({g.nodes[later].op_type}): "
                         "the graph is not topologically sorted") if later is not None else \
                    "no node, graph input or initializer produces it"
                self.raise_or_record(n.error("graph-order", f"input {name!r} is not defined before this node: {where}"))

    @staticmethod
    def _producer_after(g: _Graph, name: str, index: int) -> int | None:
        for j in range(index + 1, len(g.nodes)):  # only on the error path
            if name in g.nodes[j].output:
                return j
        return None

    def _required_present(self, n: NodeContext, entry: _Entry) -> bool:
        inputs = n.node.input
        count = len(inputs)
        ok = True
        for i in entry.required:
            if i >= count or not inputs[i]:
                p = entry.schema.inputs[i]
                self.raise_or_record(n.error(
                    "schema.required-input",
                    f"input #{i} ({p.name}) of {entry.op}-{entry.version} is required but missing",
                    subject=f"input {p.name}", expected="a value name", found="nothing"))
                ok = False
        if entry.variadic is not None:
            start, least, pname = entry.variadic
            given = sum(1 for x in inputs[start:] if x)
            if given < least:
                self.raise_or_record(n.error(
                    "schema.required-input",
                    f"variadic input {pname} (from #{start}) of {entry.op}-{entry.version} needs at least {least} "
                    f"value{'s' if least != 1 else ''}",
                    subject=f"input {pname}", expected=f"at least {least}", found=given))
                ok = False
        return ok

    def _unknown_op(self, n: NodeContext, entry: _Entry) -> None:
        op, domain, opset = entry.op, entry.domain, entry.opset
        if domain == "":
            first = _first_version(op)
            if first is not None:
                msg = f"{op} is not defined at ai.onnx opset {opset}: it first appears in opset {first}"
            else:
                msg = f"ai.onnx has no operator {op!r}"
            self.raise_or_record(n.error("unknown-op", msg))
        elif self.strict:
            raise n.error("unknown-op", f"no rule, ONNX schema or model-local function for {domain}::{op} (opset {opset})")

    # -- rules and the fallback
    def _run_rule(self, rule, n: NodeContext) -> bool:
        try:
            rule(n.ctx, n)
            return True
        except InferenceError as e:
            if self.strict:
                raise
            self.diagnostics.append(e)
        except Exception as e:  # a bug in a rule must not take the whole pass down
            err = n.error("internal", f"rule for {n.node.op_type} v{n.version} crashed: {type(e).__name__}: {one_line(e)}")
            if self.strict:
                raise err from e
            self.diagnostics.append(err)
        return False

    def _fallback(self, schema, n: NodeContext) -> str:
        """Type the node with onnx's inference; returns the node's source (see NodeRecord)."""
        node = n.node
        scope = n.ctx
        signature = _unary_signature(schema, node, scope)
        if signature is not None and signature in _UNARY_ACCEPTED:
            x = scope.get(node.input[0])  # what onnx answered for this signature before
            scope._values[node.output[0]] = TensorInfo(x.elem_type, x.shape)
            return SOURCE_FALLBACK
        types: dict[str, bytes] = {}
        data: dict[str, bytes] = {}
        all_typed = True
        for name in node.input:
            if not name or name in types:
                continue
            b = self.name_type_bytes(scope, name)
            all_typed &= bool(b)
            types[name] = b
            info = scope.get(name)
            if info is not None:
                d = self.data_bytes(info)
                if d is not None:
                    data[name] = d
        if _has_subgraph(node):
            for name in _subgraph_references(node):
                if name not in types and name in scope:
                    types[name] = self.name_type_bytes(scope, name)
        try:
            out = schema._infer_node_outputs(node.SerializeToString(), types, data, {},
                                             self._onnx_opsets, self._ir_version)
        except Exception as e:
            if not all_typed:  # with an unknown input the failure is a consequence, not a finding
                return SOURCE_UNKNOWN
            self.raise_or_record(n.error(SOURCE_FALLBACK, f"onnx's inference rejects the node: {one_line(e)}"))
            return SOURCE_FAILED
        values = scope._values
        for name in node.output:
            if not name:
                continue
            b = out.get(name)
            if not b:
                values[name] = _UNKNOWN
                continue
            tp = onnx.TypeProto.FromString(b)
            if tp.WhichOneof("value") not in (None, "tensor_type"):
                scope.other[name] = tp
                values[name] = TensorInfo()
                continue
            info = self.from_type_proto(tp)
            values[name] = info
            self._intern(info, b)  # consumers pass onnx's own bytes back to it
        if signature is not None:
            x = scope.get(node.input[0])
            if values.get(node.output[0]) == TensorInfo(x.elem_type, x.shape):
                if len(_UNARY_ACCEPTED) >= _UNARY_ACCEPTED_MAX:
                    _UNARY_ACCEPTED.clear()
                _UNARY_ACCEPTED.add(signature)
        return SOURCE_FALLBACK

    # -- serialized types and memo keys
    def _intern(self, info: TensorInfo, tb: bytes | None = None) -> tuple:
        """(info, key id, type bytes or None, content key id): a value's memo key is its type
        and, for values a rule computed, their content; a constant from the model (initializer,
        ``Constant``) is keyed by its type, and by its content only where a rule read it
        (``_Dep``: the last item, filled in when first needed). The type is keyed as the tuple
        (elem_type, shape), which equals another exactly when their TypeProto bytes do (dims
        are canonical, a symbol's text is its identity): the bytes are encoded only when the
        write-back or onnx's fallback needs them, once per distinct type."""
        if type(info) is _Lazy:  # (type, shape): the key _seed_initializers gives
            k = (info.elem_type, info.shape)
        else:
            et = info.elem_type
            v = info.value
            k = (et, info.shape if et else None, None if v is None else _array_key(v))
        kid = self._key_ids.get(k)
        if kid is None:
            kid = self._key_ids[k] = len(self._key_ids) + 1
        rec = (info, kid, tb, None if type(info) is _Lazy else kid)
        self._interned[id(info)] = rec
        return rec

    def type_bytes(self, info: TensorInfo) -> bytes:
        rec = self._interned.get(id(info))
        if rec is None:
            rec = self._intern(info)
        if rec[2] is None:
            rec = (rec[0], rec[1], self._type_bytes_of(info), rec[3])
            self._interned[id(info)] = rec
        return rec[2]

    def _type_bytes_of(self, info: TensorInfo) -> bytes:
        """TypeProto bytes of ``info``, encoded once per distinct (elem_type, shape) a pass meets."""
        k = (info.elem_type, info.shape)
        tb = self._encoded.get(k)
        if tb is None:
            tb = self._encoded[k] = self._encode_type(info)
        return tb

    def name_type_bytes(self, scope: _Scope, name: str) -> bytes:
        tp = scope.other_type(name)
        if tp is not None:
            return tp.SerializeToString()
        info = scope.get(name)
        if info is None or not info.elem_type:
            return b""
        return self.type_bytes(info)

    def _encode_type(self, info: TensorInfo) -> bytes:
        """TypeProto bytes of ``info`` (tensor_type: elem_type, shape of dim_value/dim_param)."""
        if not info.elem_type:
            return b""
        body = b"\x08" + _varint(info.elem_type)
        shape = info.shape
        if shape is not None:
            dims_b = []
            texts = self._texts
            small = _DIM_VALUE_BYTES
            for d in shape:
                if d is None:
                    dims_b.append(b"\x0a\x00")
                elif type(d) is int:
                    if 0 <= d < 0x4000:
                        dims_b.append(small[d])
                        continue
                    if d < 0:
                        return self._encode_slow(info)
                    v = _varint(d)
                    dims_b.append(b"\x0a" + _varint(len(v) + 1) + b"\x08" + v)
                else:
                    rec = texts.get(id(d))
                    if rec is None:  # the whole dim's bytes, once per Dim
                        t = d.text().encode()
                        inner = b"\x12" + _varint(len(t)) + t
                        rec = texts[id(d)] = (d, b"\x0a" + _varint(len(inner)) + inner)
                    dims_b.append(rec[1])
            sb = b"".join(dims_b)
            body += b"\x12" + _varint(len(sb)) + sb
        return b"\x0a" + _varint(len(body)) + body

    def _encode_slow(self, info: TensorInfo) -> bytes:
        tp = onnx.TypeProto()
        write_type(tp, info)
        return tp.SerializeToString()

    def data_bytes(self, info: TensorInfo) -> bytes | None:
        """A small constant as TensorProto bytes (onnx's inference reads Reshape's shape ...)."""
        rec = self._data_bytes.get(id(info))
        if rec is not None:
            if rec[1] is not None and type(info) is _Lazy:
                self.owner.log.append(info)  # onnx reads it: the node's result depends on it
            return rec[1]
        b = None
        if type(info) is _Lazy:
            if not info.external and info.size <= _DATA_MAX_ELEMENTS:
                b = info.__dict__["_proto"].SerializeToString()
                self.owner.log.append(info)
        else:
            v = info.value
            # object arrays (symbolic entries, a rule's form) have no TensorProto form
            if v is not None and v.dtype != object and v.size <= _DATA_MAX_ELEMENTS:
                try:
                    b = numpy_helper.from_array(np.asarray(v)).SerializeToString()
                except Exception:  # a dtype numpy_helper cannot write: onnx gets no data
                    b = None
        self._data_bytes[id(info)] = (info, b)
        return b

    def from_type_proto(self, tp: onnx.TypeProto) -> TensorInfo:
        """``TensorInfo.from_type_proto`` with dim_param texts parsed once per pass."""
        if not tp.HasField("tensor_type"):
            return TensorInfo()
        tt = tp.tensor_type
        if not tt.HasField("shape"):
            return TensorInfo(tt.elem_type, None)
        shape = []
        parsed = self._parsed
        for d in tt.shape.dim:
            which = d.WhichOneof("value")
            if which == "dim_value":
                value = int(d.dim_value)
                shape.append(value if value >= 0 else None)  # exporters write -1 for "unknown"
            elif which == "dim_param":
                text = d.dim_param
                p = parsed.get(text)
                if p is None and text not in parsed:
                    p = parsed[text] = dims.parse_dim_param(text)
                shape.append(p)
            else:
                shape.append(None)
        return TensorInfo(tt.elem_type, tuple(shape))

    # -- constants
    def _constant(self, n: NodeContext) -> bool:
        """Type (and value) of a Constant node; False to let onnx judge a malformed one."""
        if len(n.node.output) != 1:
            return False
        info = self._constant_info(n.node.attribute)
        if info is None:
            return False
        n.ctx.set(n.node.output[0], info)
        return True

    def _constant_info(self, attrs) -> TensorInfo | None:
        """The value a Constant node's one attribute holds (None: malformed, onnx judges it)."""
        if len(attrs) != 1:
            return None
        a = attrs[0]
        t, name = a.type, a.name
        if t == _ATTR_TENSOR:
            tensor = a.t
            if tensor.data_location == _EXTERNAL:
                check_external_location(tensor, self.label)
            # read only when a rule asks for the value
            return _Lazy(tensor, self.owner) if name == "value" else None
        try:
            if name == "sparse_value" and t == onnx.AttributeProto.SPARSE_TENSOR:
                return TensorInfo(int(a.sparse_tensor.values.data_type), tuple(int(d) for d in a.sparse_tensor.dims))
            if name == "value_float" and t == onnx.AttributeProto.FLOAT:
                return TensorInfo.from_array(np.array(a.f, dtype=np.float32), onnx.TensorProto.FLOAT)
            if name == "value_floats" and t == onnx.AttributeProto.FLOATS:
                return TensorInfo.from_array(np.array(list(a.floats), dtype=np.float32), onnx.TensorProto.FLOAT)
            if name == "value_int" and t == onnx.AttributeProto.INT:
                return TensorInfo.from_array(np.array(a.i, dtype=np.int64), onnx.TensorProto.INT64)
            if name == "value_ints" and t == onnx.AttributeProto.INTS:
                return TensorInfo.from_array(np.array(list(a.ints), dtype=np.int64), onnx.TensorProto.INT64)
            if name == "value_string" and t == onnx.AttributeProto.STRING:
                return TensorInfo(onnx.TensorProto.STRING, ())
            if name == "value_strings" and t == onnx.AttributeProto.STRINGS:
                return TensorInfo(onnx.TensorProto.STRING, (len(a.strings),))
        except Exception:  # unreadable tensor data: onnx's inference reports it
            return None
        return None

    def _fold(self, n: NodeContext, folder) -> None:
        """The output's value by ``folder`` (one of ``_FOLDERS``, the entry's op) where no rule computed it."""
        if len(n.outputs) != 1:
            return
        out_name = n.outputs[0]
        values = n.ctx._values
        out = values.get(out_name)
        if out is None or not out.elem_type or out.value is not None:
            return  # a rule that computed the value knows better (it may keep symbolic entries)
        try:
            value = folder(n, n.ctx)
        except Exception:  # folding is best effort: whatever numpy refuses stays unfolded
            return
        if value is None or value.size > _FOLD_MAX_ELEMENTS:
            return
        try:
            if helper.tensor_dtype_to_np_dtype(out.elem_type) != value.dtype:
                return
        except Exception:
            return
        values[out_name] = TensorInfo(out.elem_type, tuple(int(s) for s in value.shape), value)

    # -- declared types
    def _merge_declared(self, g: _Graph, n: NodeContext, name: str, inferred: TensorInfo) -> None:
        declared, is_output = g.declared[name]
        # only the main graph's output names are the model's contract; a body output's declared
        # symbols are usually another pass's placeholders (onnx's unk__N), the expression wins
        merged, conflict = merge_info(declared, inferred, prefer_declared_symbols=is_output and g.top)
        if conflict:
            kind = "graph output" if is_output else "value_info"
            err = n.error("output-type" if is_output else "value-info",
                          f"{kind} {name!r}: declared type contradicts the inferred one ({conflict})",
                          expected=_info_text(inferred), found=_info_text(declared))
            self.raise_or_record(err)
            # the model's declared output type is its contract; a value_info is only a note
            keep = is_output and self.declared_outputs_win
            merged = TensorInfo(declared.elem_type, declared.shape, inferred.value) if keep else inferred
        if is_output:
            g.final_outputs[name] = merged
        if merged != inferred:
            g.scope._values[name] = merged
            g.scope.kids.pop(name, None)
            if not inferred.elem_type and merged.elem_type:
                g.typed_by[name] = SOURCE_DECLARED

    def _check_outputs_defined(self, g: _Graph) -> None:
        for vo in g.proto.output:
            if vo.name not in g.scope:
                self.raise_or_record(InferenceError(
                    "graph-output", MODEL_NODE, f"graph output {vo.name!r} is not produced by any node, graph input or initializer"))

    # -- bodies (used by inference.subgraphs and inference.functions)
    def infer_body(self, proto: onnx.GraphProto, parent: _Graph, inputs: list[TensorInfo | None], *,
                   label: str, attr: str, step: tuple | None, quiet: bool = False) -> _Graph:
        """Infer a subgraph body that sees ``parent``'s values; ``step`` (node index,
        attribute, graph index) records it for the write-back. A ``quiet`` body (a branch
        that never runs) is typed but its problems are neither raised nor recorded."""
        strict = self.strict and not quiet
        scope = _Scope(parent.scope.opsets, strict, self.diagnostics, parent.scope)
        where = f"{parent.where}/{label}/{attr}" if parent.where else f"{label}/{attr}"
        g = _Graph(proto, scope, parent.dispatch, prefix=f"{parent.prefix}{label}/{attr}/", where=where)
        mark = len(self.diagnostics)
        saved, self.strict = self.strict, strict
        self.owner.strict = strict
        try:
            self.seed_body(g, inputs)
            self.walk(g)
        finally:
            self.strict = self.owner.strict = saved
            if quiet:
                del self.diagnostics[mark:]
        if step is not None:  # a later attempt (Loop state types widened) replaces an earlier one
            parent.children[step] = g
            self.result.subgraphs[(parent.where, step)] = g
        return g

    def body_outputs(self, g: _Graph) -> list[tuple[TensorInfo, onnx.TypeProto | None]]:
        """Each body output's type: what the pass inferred, merged with the declaration."""
        out = []
        for vo in g.proto.output:
            info = g.final_outputs.get(vo.name) or g.scope.get(vo.name) or _UNKNOWN
            other = g.scope.other_type(vo.name)
            out.append((info, other))
        return out


# ------------------------------------------------------------------ helpers
#: ai.onnx operators without an own rule whose output is, by the standard, their one input's
#: element type and shape (unary elementwise). Whether onnx's inference accepts such a node is
#: a function of its signature (schema version, input element type, attribute names and types),
#: not of its shape or data, so a signature onnx once accepted with exactly the input's type as
#: its answer is typed so again without the round trip through onnx (~10x the cost of a rule).
_UNARY_SAME_TYPE = frozenset({
    "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Ceil", "Celu", "Cos", "Cosh", "Elu", "Exp",
    "Floor", "HardSigmoid", "HardSwish", "Log", "Mish", "Neg", "Reciprocal", "Relu", "Round", "Selu",
    "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu",
    "LeakyRelu", "Erf", "Swish", "BitwiseNot",
})
_UNARY_ACCEPTED: set = set()
_UNARY_ACCEPTED_MAX = 4096


def _unary_signature(schema, node: onnx.NodeProto, scope: "_Scope") -> tuple | None:
    """What onnx's verdict on a unary same-type node depends on; None for any other node (or
    an input that is not a typed tensor)."""
    if schema.name not in _UNARY_SAME_TYPE or schema.domain != "" or len(node.input) != 1 \
            or len(node.output) != 1 or not node.output[0]:
        return None
    name = node.input[0]
    x = scope.get(name) if name else None
    if x is None or not x.elem_type or scope.other_type(name) is not None:
        return None
    return (schema.name, schema.since_version, x.elem_type,
            tuple((a.name, a.type, a.ref_attr_name) for a in node.attribute))


@lru_cache(maxsize=None)
def _entry_facts(domain: str, op: str, opset: int | None, has_function: bool, generation: int, lookup) -> tuple:
    """Every field of an ``_Entry`` but its memo and function: what serves ``op`` under
    ``opset`` (and whether the model has a local function of that name), decided once per
    process and registry state."""
    version = rule = schema = handler = variadic = None
    required: tuple = ()
    if opset is None:
        kind = _K_FUNCTION if has_function else _K_NO_OPSET
    elif domain == "" and op == "Constant":
        kind = _K_CONSTANT
        version = registry.schema_version("", "Constant", opset)
    else:
        kind, handler, rule, version, facts = _dispatch_facts(domain, op, opset, generation, lookup)
        if kind == _K_UNKNOWN and has_function:
            kind = _K_FUNCTION
        if facts is not None:
            schema, required, variadic = facts
    source = {_K_RULE: SOURCE_RULE, _K_CONTROL: SOURCE_RULE, _K_FALLBACK: SOURCE_FALLBACK,
              _K_FUNCTION: SOURCE_FUNCTION, _K_CONSTANT: SOURCE_CONSTANT}.get(kind, SOURCE_UNKNOWN)
    folder = _FOLDERS.get(op) if domain == "" else None  # engine folding of its outputs
    return (kind, domain, op, opset, version, rule, schema, required, variadic, source,
            _describe(source, domain, op, version), handler, folder)


@lru_cache(maxsize=None)
def _dispatch_facts(domain: str, op: str, opset: int, generation: int, lookup) -> tuple:
    """(kind, control-flow handler, rule, version, (schema, required, variadic) or None): what
    serves ``op`` under ``opset``, decided once per process and registry state (its
    ``generation`` and ``lookup``, which tests replace) rather than once per pass. A model-local
    function is the caller's to add (it is per model)."""
    from onnx_quant.inference import subgraphs

    schema, required, variadic = _schema_facts(domain, op, opset)
    kind, handler, rule, version = _K_UNKNOWN, None, None, None
    control = subgraphs.HANDLERS.get(op) if domain == "" and schema is not None else None
    if control is not None and subgraphs.handles(op, schema.since_version):
        kind, handler, version = _K_CONTROL, control, schema.since_version
    else:
        found = lookup(domain, op, opset)
        if found is not None:
            kind, (rule, version) = _K_RULE, found
        elif schema is not None:
            kind, version = _K_FALLBACK, schema.since_version
    facts = (schema, required, variadic) if schema is not None and kind != _K_UNKNOWN else None
    return kind, handler, rule, version, facts


@lru_cache(maxsize=None)
def _schema_facts(domain: str, op_type: str, opset: int) -> tuple[Any, tuple, tuple | None]:
    """(the onnx.defs schema serving ``opset``, or None; its required inputs; its variadic
    input): facts of the installed onnx, looked up once per process."""
    try:
        schema = defs.get_schema(op_type, opset, domain)
    except Exception:  # SchemaError: no such op at this version
        return None, (), None
    return (schema, *_required_inputs(schema))


def _required_inputs(schema) -> tuple[tuple, tuple | None]:
    """Indices of single (non-optional) inputs, and (start, min count, name) of a variadic one."""
    single = defs.OpSchema.FormalParameterOption.Single
    variadic = defs.OpSchema.FormalParameterOption.Variadic
    required, var = [], None
    for i, p in enumerate(schema.inputs):
        if p.option == single:
            required.append(i)
        elif p.option == variadic and p.min_arity > 0:
            var = (i, int(p.min_arity), p.name)
    return tuple(required), var


_RAW_DTYPES = {
    t: np.dtype(helper.tensor_dtype_to_np_dtype(t)).newbyteorder("<")
    for t in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.INT8,
              onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16, onnx.TensorProto.INT32,
              onnx.TensorProto.UINT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT64, onnx.TensorProto.BOOL)
}


def _to_array(t: onnx.TensorProto) -> np.ndarray:
    """``numpy_helper.to_array``, with a fast path for raw data of plain numeric types."""
    raw = t.raw_data
    dtype = _RAW_DTYPES.get(t.data_type)
    if raw and dtype is not None and not t.HasField("segment"):
        shape = tuple(t.dims)
        numel = 1
        for d in shape:
            numel *= d
        if len(raw) == numel * dtype.itemsize:
            return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="), copy=True).reshape(shape)
    return numpy_helper.to_array(t)


_TYPED_FIELDS = {
    onnx.TensorProto.FLOAT: "float_data", onnx.TensorProto.DOUBLE: "double_data", onnx.TensorProto.INT64: "int64_data",
    onnx.TensorProto.UINT32: "uint64_data", onnx.TensorProto.UINT64: "uint64_data", onnx.TensorProto.STRING: "string_data",
}


def _proto_content(t: onnx.TensorProto) -> tuple | None:
    """A TensorProto's data as a hashable key without decoding it (None: decode it)."""
    raw = t.raw_data
    if raw:
        return ("raw", raw)
    if t.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128):
        return None
    field_name = _TYPED_FIELDS.get(t.data_type, "int32_data")
    return (field_name, tuple(getattr(t, field_name)[:]))


def _array_key(v: np.ndarray) -> tuple:
    if v.dtype == object:
        return ("O", v.shape, tuple(v.reshape(-1).tolist()))
    return (v.dtype.str, v.shape, v.tobytes())


@lru_cache(maxsize=None)
def _first_version(op_type: str) -> int | None:
    """The first ai.onnx opset defining ``op_type`` (None if ONNX has no such op)."""
    versions = [s.since_version for s in defs.get_all_schemas_with_history() if s.name == op_type and s.domain == ""]
    return min(versions) if versions else None


def merge_info(declared: TensorInfo, inferred: TensorInfo, *,
               prefer_declared_symbols: bool = False) -> tuple[TensorInfo, str | None]:
    """Combine a declared and an inferred type; the second item names a contradiction.

    Known ints win over symbols and unknowns; between two symbols the declared one is kept
    when ``prefer_declared_symbols`` (a graph output's names are the model's contract).
    """
    d_et, i_et = declared.elem_type, inferred.elem_type
    if d_et and i_et and d_et != i_et:
        return inferred, "element type"
    elem_type = i_et or d_et
    if declared.shape is None or inferred.shape is None:
        shape = inferred.shape if inferred.shape is not None else declared.shape
        return TensorInfo(elem_type, shape, inferred.value), None
    if len(declared.shape) != len(inferred.shape):
        return inferred, "rank"
    shape: list[DimLike] = []
    for i, (d, f) in enumerate(zip(declared.shape, inferred.shape)):
        if isinstance(d, int) and isinstance(f, int):
            if d != f:
                return inferred, f"dim {i}"
            shape.append(d)
        elif isinstance(d, int) or isinstance(f, int):
            shape.append(d if isinstance(d, int) else f)
        elif d is not None and (f is None or prefer_declared_symbols):
            shape.append(d)
        else:
            shape.append(f)
    return TensorInfo(elem_type, tuple(shape), inferred.value), None


def _info_text(info: TensorInfo) -> str:
    from onnx_quant.dtypes import type_name

    et = type_name(info.elem_type) if info.elem_type else "?"
    return f"{et}{info.shape_text()}"


def _shape_text(shape: tuple) -> str:
    return "[" + ", ".join(dims.to_text(d) for d in shape) + "]"


def _dim_arg(d: Any, input_name: str) -> DimLike:
    if d is None or isinstance(d, dims.Dim):
        return d
    if isinstance(d, (int, np.integer)) and not isinstance(d, bool):
        if d < 0:
            raise InferenceError("input-shapes", MODEL_NODE, f"input {input_name!r}: negative dim", found=str(d))
        return int(d)
    if isinstance(d, str):
        return dims.parse(d)
    raise InferenceError("input-shapes", MODEL_NODE, f"input {input_name!r}: a dim must be an int, a symbol name or None",
                         found=repr(d))


def _bind(d: DimLike, bindings: dict[str, int]) -> DimLike:
    if isinstance(d, dims.Dim) and d.symbols <= bindings.keys():
        return dims.evaluate(d, bindings)
    return d


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in _GRAPH_ATTRS for a in node.attribute)


def _subgraph_references(node: onnx.NodeProto) -> set[str]:
    names: set[str] = set()
    stack = [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
    stack += [g for a in node.attribute if a.type == onnx.AttributeProto.GRAPHS for g in a.graphs]
    while stack:
        g = stack.pop()
        for inner in g.node:
            names.update(x for x in inner.input if x)
            stack += [a.g for a in inner.attribute if a.type == onnx.AttributeProto.GRAPH]
            stack += [sg for a in inner.attribute if a.type == onnx.AttributeProto.GRAPHS for sg in a.graphs]
        names.update(o.name for o in g.output)
    return names


symbol_for = dims.named_symbol  # subgraphs.py names merged and iteration dims with it


def _named_dims(input_name: str, shape: tuple) -> tuple:
    """A graph input's shape with each anonymous dim (no value, ``?``, ``-1``) a fresh symbol
    ``<input>_dim<axis>``: distinct dims stay distinct, and the name says where each comes from."""
    return tuple(symbol_for(input_name, f"dim{axis}") if d is None else d for axis, d in enumerate(shape))


# ------------------------------------------------------------------ folding
# Each folder returns the output's value or None; inputs must all carry values (except Shape).
def _values(n: NodeContext, ctx: ShapesContext) -> list[np.ndarray | None] | None:
    infos = [ctx[name] if name else None for name in n.node.input]
    # first make sure every input has a (small) value, then read them: a constant is read
    # only when the fold can happen (the memo notes every read)
    for info in infos:
        if info is None:
            continue
        if type(info) is _Lazy:
            if info.size > _FOLD_MAX_ELEMENTS or info.external:
                return None  # folding is for small shape arithmetic: never read a weight
        elif info.value is None:
            return None
    out = []
    for info in infos:
        v = None if info is None else info.value
        if info is not None and (v is None or v.size > _FOLD_MAX_ELEMENTS):
            return None
        out.append(v)
    return out


def _fold_shape(n: NodeContext, ctx: ShapesContext) -> np.ndarray | None:
    shape = ctx[n.node.input[0]].shape
    if shape is None:
        return None
    rank = len(shape)
    start, end = n.attr("start", 0), n.attr("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    part = shape[start:end]
    if not all(isinstance(d, int) for d in part):
        return None
    return np.array(part, dtype=np.int64)


def _fold_size(n: NodeContext, ctx: ShapesContext) -> np.ndarray | None:
    numel = ctx[n.node.input[0]].numel()
    return np.array(numel, dtype=np.int64) if isinstance(numel, int) else None


def _axes(n: NodeContext, ctx: ShapesContext, vals: list) -> list[int] | None:
    if n.has_attr("axes"):
        return list(n.attr("axes"))
    if len(vals) > 1 and vals[1] is not None:
        return [int(a) for a in np.asarray(vals[1]).reshape(-1)]
    return None


def _fold_unsqueeze(n: NodeContext, ctx: ShapesContext) -> np.ndarray | None:
    vals = _values(n, ctx)
    if vals is None:
        return None
    axes = _axes(n, ctx, vals)
    if axes is None:
        return None
    rank = vals[0].ndim + len(axes)
    return np.expand_dims(vals[0], tuple(sorted(a + rank if a < 0 else a for a in axes)))


def _fold_squeeze(n: NodeContext, ctx: ShapesContext) -> np.ndarray | None:
    vals = _values(n, ctx)
    if vals is None:
        return None
    axes = _axes(n, ctx, vals)
    if axes is None:
        return np.squeeze(vals[0])
    return np.squeeze(vals[0], axis=tuple(a + vals[0].ndim if a < 0 else a for a in axes))


def _fold_slice(n: NodeContext, ctx: ShapesContext) -> np.ndarray | None:
    vals = _values(n, ctx)
    if vals is None or n.opset < 10:
        return None
    data, starts, ends = vals[0], vals[1], vals[2]
    axes = vals[3] if len(vals) > 3 and vals[3] is not None else np.arange(len(starts))
    steps = vals[4] if len(vals) > 4 and vals[4] is not None else np.ones(len(starts), dtype=np.int64)
    index = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts.tolist(), ends.tolist(), axes.tolist(), steps.tolist()):
        index[a] = slice(s, e, st)  # python slicing clamps out-of-range starts/ends as ONNX does
    return data[tuple(index)]


def _fold_cast(n: NodeContext, ctx: ShapesContext) -> np.ndarray | None:
    vals = _values(n, ctx)
    if vals is None:
        return None
    target = np.dtype(helper.tensor_dtype_to_np_dtype(n.attr("to")))
    if target.kind not in "iub" or vals[0].dtype.kind not in "iub":  # int shape math only
        return None
    return vals[0].astype(target)


def _binary(fn):
    def fold(n: NodeContext, ctx: ShapesContext) -> np.ndarray | None:
        vals = _values(n, ctx)
        if vals is None or len(vals) != 2 or vals[0].dtype.kind not in "iu" or vals[0].dtype != vals[1].dtype:
            return None
        return fn(vals[0], vals[1]).astype(vals[0].dtype)
    return fold


def _fold_mod(n: NodeContext, ctx: ShapesContext) -> np.ndarray | None:
    """Integer Mod of shape values: fmod 0 takes the divisor's sign (numpy's mod), fmod 1 the
    dividend's (C's %); a zero divisor is left unfolded (its result is the kernel's business)."""
    vals = _values(n, ctx)
    if vals is None or len(vals) != 2 or vals[0].dtype.kind not in "iu" or vals[0].dtype != vals[1].dtype:
        return None
    if np.any(vals[1] == 0):
        return None
    fn = np.fmod if n.attr("fmod", 0) else np.mod
    return fn(vals[0], vals[1]).astype(vals[0].dtype)


def _simple(fn):
    def fold(n: NodeContext, ctx: ShapesContext) -> np.ndarray | None:
        vals = _values(n, ctx)
        return None if vals is None or any(v is None for v in vals) else fn(n, vals)
    return fold


_FOLDERS = {
    "Shape": _fold_shape,
    "Size": _fold_size,
    "Identity": _simple(lambda n, v: v[0]),
    "Gather": _simple(lambda n, v: np.take(v[0], v[1], axis=n.attr("axis", 0))),
    "Concat": _simple(lambda n, v: np.concatenate(v, axis=n.attr("axis"))),
    "Unsqueeze": _fold_unsqueeze,
    "Squeeze": _fold_squeeze,
    "Slice": _fold_slice,
    "Cast": _fold_cast,
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply),
    "Mod": _fold_mod,
    "And": _simple(lambda n, v: np.logical_and(v[0], v[1]) if v[0].dtype == v[1].dtype == np.bool_ else None),
    "Or": _simple(lambda n, v: np.logical_or(v[0], v[1]) if v[0].dtype == v[1].dtype == np.bool_ else None),
    "Where": _simple(lambda n, v: np.where(v[0], v[1], v[2]) if v[0].dtype == np.bool_ and v[1].dtype == v[2].dtype
                     and v[1].dtype.kind in "iub" else None),
}

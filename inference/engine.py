"""The inference pass: one walk over a graph's nodes typing every value.

Each node is typed by, in order of preference:

1. its own rule (``inference.registry``, selected by the model's opset for the node's domain);
2. onnx's per-node inference for the schema ``onnx.defs`` selects (the *fallback*);
3. nothing: an op of a domain with neither leaves its outputs unknown (strict mode raises).

Constants (``Constant`` nodes, initializers) carry their value, and a few cheap operators on
small integer tensors (``Shape``, ``Gather``, ``Concat``, ...) are folded so that shape
computations such as ``Shape -> Gather -> Concat -> Reshape`` stay known.

``infer`` runs the pass once; ``infer_shapes`` (a model with ``value_info``), ``infer_values``
(name -> ``TensorInfo``) and ``check_model`` (a list of ``Diagnostic``) are views of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable, Mapping

import numpy as np
import onnx
from onnx import defs, helper, numpy_helper

import inference.rules  # noqa: F401  (registers every rule module)
from inference import dims, registry
from inference.context import ShapesContext, TensorInfo
from inference.diagnostics import MODEL_NODE, Diagnostic, one_line
from inference.dims import DimLike
from inference.registry import NodeContext, normalize_domain
from onnx_quant.errors import InferenceError
from onnx_quant.model_io import EXAMPLE_NAME, ModelSource, load_model

#: Constants up to this many elements are handed to onnx's inference as input data
#: (Reshape's shape, Slice's starts, Resize's scales need it; weights never do).
_DATA_MAX_ELEMENTS = 64
#: Folded constants stay below this size: shape arithmetic, not constant folding.
_FOLD_MAX_ELEMENTS = 1024

# How a value was typed, as ``InferenceResult.typed_by`` and the CLI name it.
SOURCE_INPUT = "input"
SOURCE_INITIALIZER = "initializer"
SOURCE_CONSTANT = "constant"
SOURCE_FALLBACK = "onnx-fallback"
SOURCE_UNKNOWN = "unknown"
SOURCE_FAILED = "failed"
SOURCE_DECLARED = "declared"


@dataclass(frozen=True)
class NodeRecord:
    """How one node was typed.

    ``source`` is ``"rule"``, ``"onnx-fallback"``, ``"constant"``, ``"unknown"`` (no rule and
    no schema) or ``"failed"`` (the rule or onnx rejected the node); ``version`` is the
    since_version of the rule's or schema's version that served the model's opset.
    """

    index: int
    label: str
    domain: str
    op_type: str
    source: str
    version: int | None = None

    def describe(self) -> str:
        """Short form for tables: ``rule QLinearConv v10``, ``onnx-fallback Relu v14``, ``unknown``."""
        op = f"{self.domain}::{self.op_type}" if self.domain else self.op_type
        ver = f" v{self.version}" if self.version is not None else ""
        if self.source in ("rule", SOURCE_FALLBACK, SOURCE_FAILED):
            return f"{self.source} {op}{ver}"
        return self.source


@dataclass
class InferenceResult:
    """The outcome of one pass; ``infer_shapes``, ``infer_values`` and ``check_model`` read it.

    ``ctx`` holds every value's ``TensorInfo``; ``errors`` every violation found (lenient mode
    records them instead of raising) and ``diagnostics`` the same as ``Diagnostic``s;
    ``nodes`` one ``NodeRecord`` per node; ``typed_by`` value name -> what typed it
    (``input``, ``initializer``, a node's ``NodeRecord.describe()``, ``declared``...);
    ``other_types`` the non-tensor types (sequences, optionals, maps) onnx inferred, which a
    ``TensorInfo`` cannot hold.
    """

    ctx: ShapesContext
    nodes: list[NodeRecord] = field(default_factory=list)
    typed_by: dict[str, str] = field(default_factory=dict)
    other_types: dict[str, onnx.TypeProto] = field(default_factory=dict)

    @property
    def errors(self) -> list[InferenceError]:
        return list(self.ctx.diagnostics)

    @property
    def diagnostics(self) -> list[Diagnostic]:
        return [Diagnostic.from_error(e) for e in self.ctx.diagnostics]

    def values(self) -> dict[str, TensorInfo]:
        return dict(self.ctx.items())


# ------------------------------------------------------------------ public API
def infer(model: ModelSource, *, strict: bool = False,
          input_shapes: Mapping[str, Iterable[Any]] | None = None) -> InferenceResult:
    """Run the pass over ``model`` (a ModelProto, path or bytes; not modified).

    ``input_shapes`` overrides graph input shapes (dims as ints, symbol names or ``None``);
    symbols it binds to ints are substituted in the other graph inputs too. Lenient mode
    records every violation in the result; ``strict=True`` raises the first
    ``InferenceError``.
    """
    proto = load_model(model)
    return _Pass(proto, strict=strict).run(input_shapes)


def infer_shapes(model: ModelSource, *, strict: bool = False) -> onnx.ModelProto:
    """A copy of ``model`` with ``value_info`` for every typed intermediate and typed outputs.

    A drop-in for ``onnx.shape_inference.infer_shapes``. Declared graph-output dims that are
    known are kept; a declared output type that contradicts the inferred one raises in strict
    mode and is kept (with a diagnostic) in lenient mode.
    """
    proto = load_model(model)
    result = _Pass(proto, strict=strict).run(None)
    return write_back(proto, result)


def infer_values(model: ModelSource, input_shapes: Mapping[str, Iterable[Any]] | None = None, *,
                 strict: bool = False) -> dict[str, TensorInfo]:
    """Name -> ``TensorInfo`` for every value: graph inputs, initializers, intermediates, outputs.

    With concrete ``input_shapes`` every shape that follows from them is a tuple of ints.
    """
    return infer(model, strict=strict, input_shapes=input_shapes).values()


def check(model: ModelSource) -> tuple[list[Diagnostic], InferenceResult]:
    """``check_model``'s diagnostics together with the pass result they came from."""
    proto = load_model(model)
    found: list[Diagnostic] = []
    # given a path, the checker resolves external data beside the model, not in the cwd
    is_file = isinstance(model, (str, os.PathLike)) and model != EXAMPLE_NAME
    try:
        onnx.checker.check_model(os.fspath(model) if is_file else proto)
    except Exception as e:  # onnx raises ValidationError, but also C++ errors of other kinds
        found.append(Diagnostic(MODEL_NODE, "onnx.checker", one_line(e)))
    result = _Pass(proto, strict=False).run(None)
    found.extend(result.diagnostics)
    return found, result


def check_model(model: ModelSource) -> list[Diagnostic]:
    """Every problem of ``model``: onnx's checker first, then each violation the pass finds.

    Empty when the model is valid.
    """
    return check(model)[0]


def write_back(model: onnx.ModelProto, result: InferenceResult) -> onnx.ModelProto:
    """A copy of ``model`` carrying the result: value_info for intermediates, typed outputs."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    del graph.value_info[:]
    ctx = result.ctx
    source = model.graph
    skip = {v.name for v in source.input} | {t.name for t in source.initializer} | {v.name for v in source.output}
    skip |= {t.values.name for t in source.sparse_initializer}
    existing = {vi.name: vi for vi in source.value_info}
    texts: dict = {}
    emitted: set[str] = set()
    for node in source.node:
        for name in node.output:
            if not name or name in skip or name in emitted:
                continue
            other, info, old = result.other_types.get(name), ctx.get(name), existing.get(name)
            if other is not None:
                vi = graph.value_info.add(name=name)
                vi.type.CopyFrom(other)
            elif info is not None and info.elem_type:
                vi = graph.value_info.add(name=name)
                write_type(vi.type, info, texts)
            elif old is not None:
                vi = graph.value_info.add()
                vi.CopyFrom(old)
            else:
                continue
            if old is not None and old.doc_string:
                vi.doc_string = old.doc_string
            emitted.add(name)
    # annotations of names the pass never produced (e.g. inside subgraphs) are kept as they were
    for name, old in existing.items():
        if name not in emitted and name not in skip:
            graph.value_info.add().CopyFrom(old)
    for vo in graph.output:
        info = ctx.get(vo.name)
        other = result.other_types.get(vo.name)
        declared_kind = vo.type.WhichOneof("value")
        if other is not None and declared_kind != "tensor_type":
            vo.type.CopyFrom(other)
        elif info is not None and info.elem_type and declared_kind in (None, "tensor_type"):
            vo.type.Clear()
            write_type(vo.type, info, texts)
    return out


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


# ------------------------------------------------------------------ the pass
class _Pass:
    """State of one walk; nothing outlives ``run``."""

    def __init__(self, model: onnx.ModelProto, *, strict: bool) -> None:
        self.model = model
        self.graph = model.graph
        self.strict = strict
        opsets: dict[str, int] = {}
        for o in model.opset_import:
            opsets[normalize_domain(o.domain)] = int(o.version)
        if not model.opset_import:  # IR < 3 models imply ai.onnx opset 1
            opsets[""] = 1
        self.ctx = ShapesContext(opsets, strict=strict)
        self.result = InferenceResult(self.ctx)
        # onnx's C++ inference takes serialized protos; each value's type is serialized once
        self._type_bytes: dict[str, bytes] = {}
        self._data_bytes: dict[str, bytes | None] = {}
        self._onnx_opsets = {o.domain: int(o.version) for o in model.opset_import} or {"": 1}
        self._ir_version = int(model.ir_version) or onnx.IR_VERSION
        self._schemas: dict[tuple[str, str, int], Any] = {}
        self._parsed: dict[str, DimLike] = {}
        self._texts: dict = {}  # Dim -> dim_param text
        self._initializer_protos: dict[str, onnx.TensorProto] = {}
        self._declared: dict[str, tuple[TensorInfo, bool]] = {}  # name -> (declared, is graph output)
        self._local_functions = {(normalize_domain(f.domain), f.name) for f in model.functions}

    # -- driver
    def run(self, input_shapes: Mapping[str, Iterable[Any]] | None) -> InferenceResult:
        self._seed(input_shapes)
        for index, node in enumerate(self.graph.node):
            self._node(index, node)
        self._check_outputs_defined()
        return self.result

    def _raise_or_record(self, err: InferenceError) -> None:
        if self.strict:
            raise err
        self.ctx.diagnostics.append(err)

    def _set(self, name: str, info: TensorInfo, source: str) -> None:
        if not name:
            return
        self.ctx.set(name, info)
        self._type_bytes.pop(name, None)
        self._data_bytes.pop(name, None)
        self.result.typed_by[name] = source

    # -- seeding
    def _seed(self, input_shapes: Mapping[str, Iterable[Any]] | None) -> None:
        graph = self.graph
        input_names = {v.name for v in graph.input}
        for t in graph.initializer:
            self._initializer_protos[t.name] = t
            # an initializer that is also a graph input is only a default: not a constant
            value = None if t.name in input_names else self._initializer_value(t)
            info = TensorInfo(int(t.data_type), tuple(int(d) for d in t.dims), value)
            self._set(t.name, info, SOURCE_INITIALIZER)
        for st in graph.sparse_initializer:
            self._set(st.values.name, TensorInfo(int(st.values.data_type), tuple(int(d) for d in st.dims)), SOURCE_INITIALIZER)
        for v in graph.input:
            if v.type.WhichOneof("value") not in (None, "tensor_type"):
                self.result.other_types[v.name] = v.type
                self._set(v.name, TensorInfo(), SOURCE_INPUT)
                continue
            declared = self._from_type_proto(v.type)
            if v.name in self._initializer_protos and not declared.is_typed:
                continue  # keep what the initializer says
            self._set(v.name, declared, SOURCE_INPUT)
        if input_shapes:
            self._override_inputs(input_shapes, input_names)
        for vi in graph.value_info:
            if vi.type.HasField("tensor_type"):
                self._declared[vi.name] = (self._from_type_proto(vi.type), False)
        for vo in graph.output:
            if vo.type.HasField("tensor_type"):
                self._declared[vo.name] = (self._from_type_proto(vo.type), True)

    def _initializer_value(self, t: onnx.TensorProto) -> np.ndarray | None:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            return None  # not loaded; shape and type are still known from the proto
        try:
            return numpy_helper.to_array(t)
        except Exception as e:  # malformed data (wrong raw_data length, unknown type)
            self._raise_or_record(InferenceError(
                "initializer", MODEL_NODE, f"initializer {t.name!r}: cannot read its data: {one_line(e)}"))
            return None

    def _override_inputs(self, input_shapes: Mapping[str, Iterable[Any]], input_names: set[str]) -> None:
        bindings: dict[str, int] = {}
        for name, shape in input_shapes.items():
            if name not in input_names:
                raise InferenceError("input-shapes", MODEL_NODE, f"{name!r} is not a graph input",
                                     expected=f"one of {sorted(input_names)}", found=repr(name))
            new = tuple(_dim_arg(d, name) for d in shape)
            declared = self.ctx[name]
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
            self._set(name, TensorInfo(declared.elem_type, new), SOURCE_INPUT)
        if not bindings:
            return
        for name in input_names - set(input_shapes):
            info = self.ctx.get(name)
            if info is None or info.shape is None or self.result.typed_by.get(name) != SOURCE_INPUT:
                continue
            bound = tuple(_bind(d, bindings) for d in info.shape)
            self._set(name, TensorInfo(info.elem_type, bound, info.value), SOURCE_INPUT)

    # -- one node
    def _node(self, index: int, node: onnx.NodeProto) -> None:
        domain = normalize_domain(node.domain)
        opset = self.ctx.opset(domain)
        n = NodeContext(node, index, self.ctx, 0, opset or 0)
        self._check_inputs_defined(n)
        self._check_outputs_fresh(n)
        for name in node.output:  # a value defined twice must not keep the first one's caches
            self._type_bytes.pop(name, None)
            self._data_bytes.pop(name, None)
        if opset is None:
            self._raise_or_record(n.error(
                "opset-import", f"domain {domain or 'ai.onnx'!r} is not in the model's opset_import"))
            self._finish(n, domain, SOURCE_UNKNOWN, None)
            return
        if domain == "" and node.op_type == "Constant" and self._constant(n):
            self._finish(n, domain, SOURCE_CONSTANT, registry.schema_version("", "Constant", opset))
            return
        found = registry.lookup(domain, node.op_type, opset)
        if found is not None:
            rule, version = found
            n.version = version
            source = "rule" if self._run_rule(rule, n) else SOURCE_FAILED
            self._finish(n, domain, source, version)
            return
        schema = self._schema(domain, node.op_type, opset)
        if schema is not None:
            self._finish(n, domain, self._fallback(schema, n), schema.since_version)
            return
        self._unknown_op(n, domain, opset)
        self._finish(n, domain, SOURCE_UNKNOWN, None)

    def _finish(self, n: NodeContext, domain: str, source: str, version: int | None) -> None:
        record = NodeRecord(n.index, n.label, domain, n.node.op_type, source, version)
        self.result.nodes.append(record)
        described = record.describe()
        ok = source in ("rule", SOURCE_FALLBACK, SOURCE_CONSTANT)
        # what the rule or onnx gave: folding or a declaration may replace it below
        typed = {name: self.ctx.get(name) for name in n.node.output if name}
        if ok:
            self._fold(n)
        for name, given in typed.items():
            info = self.ctx.get(name)
            if info is None or not ok:
                info = TensorInfo()  # a failed node's outputs are unknown, whatever it set
                self.ctx.set(name, info)
            self.result.typed_by[name] = described
            if name in self._declared:
                self._merge_declared(n, name, info)
            if self.ctx.get(name) is not given:  # onnx's cached bytes no longer describe it
                self._type_bytes.pop(name, None)

    def _check_inputs_defined(self, n: NodeContext) -> None:
        for name in n.node.input:
            if name and name not in self.ctx:
                later = self._producer_after(name, n.index)
                where = (f"it is produced later by node #{later} ({self.graph.node[later].op_type}): "
                         "the graph is not topologically sorted") if later is not None else \
                    "no node, graph input or initializer produces it"
                self._raise_or_record(n.error("graph-order", f"input {name!r} is not defined before this node: {where}"))

    def _producer_after(self, name: str, index: int) -> int | None:
        for j in range(index + 1, len(self.graph.node)):  # only on the error path
            if name in self.graph.node[j].output:
                return j
        return None

    def _check_outputs_fresh(self, n: NodeContext) -> None:
        for name in n.node.output:
            if name and name in self.ctx:
                self._raise_or_record(n.error(
                    "single-assignment", f"output {name!r} is already defined ({self.result.typed_by.get(name, 'earlier')})"))

    def _unknown_op(self, n: NodeContext, domain: str, opset: int) -> None:
        op = n.node.op_type
        if (domain, op) in self._local_functions:
            return  # a model-local function: valid, but its body is not inferred
        if domain == "":
            first = _first_version(op)
            if first is not None:
                msg = f"{op} is not defined at ai.onnx opset {opset}: it first appears in opset {first}"
            else:
                msg = f"ai.onnx has no operator {op!r}"
            self._raise_or_record(n.error("unknown-op", msg))
        elif self.strict:
            raise n.error("unknown-op", f"no rule and no ONNX schema for {domain}::{op} (opset {opset})")

    # -- rules and the fallback
    def _run_rule(self, rule, n: NodeContext) -> bool:
        try:
            rule(self.ctx, n)
            return True
        except InferenceError as e:
            if self.strict:
                raise
            self.ctx.diagnostics.append(e)
        except Exception as e:  # a bug in a rule must not take the whole pass down
            err = n.error("internal", f"rule for {n.node.op_type} v{n.version} crashed: {type(e).__name__}: {one_line(e)}")
            if self.strict:
                raise err from e
            self.ctx.diagnostics.append(err)
        return False

    def _schema(self, domain: str, op_type: str, opset: int):
        key = (domain, op_type, opset)
        if key not in self._schemas:
            try:
                self._schemas[key] = defs.get_schema(op_type, opset, domain)
            except Exception:  # SchemaError: no such op at this version
                self._schemas[key] = None
        return self._schemas[key]

    def _fallback(self, schema, n: NodeContext) -> str:
        """Type the node with onnx's inference; returns the node's source (see NodeRecord)."""
        node = n.node
        types: dict[str, bytes] = {}
        data: dict[str, bytes] = {}
        all_typed = True
        for name in node.input:
            if not name or name in types:
                continue
            b = self._type_of(name)
            all_typed &= bool(b)
            types[name] = b
            d = self._data_of(name)
            if d is not None:
                data[name] = d
        if _has_subgraph(node):
            self._add_outer_scope(node, types)
        try:
            out = schema._infer_node_outputs(node.SerializeToString(), types, data, {},
                                             self._onnx_opsets, self._ir_version)
        except Exception as e:
            if not all_typed:  # with an unknown input the failure is a consequence, not a finding
                return SOURCE_UNKNOWN
            self._raise_or_record(n.error(SOURCE_FALLBACK, f"onnx's inference rejects the node: {one_line(e)}"))
            return SOURCE_FAILED
        for name in node.output:
            if not name:
                continue
            b = out.get(name)
            if not b:
                self.ctx.set(name, TensorInfo())
                continue
            tp = onnx.TypeProto.FromString(b)
            if tp.WhichOneof("value") not in (None, "tensor_type"):
                self.result.other_types[name] = tp
                self.ctx.set(name, TensorInfo())
                self._type_bytes[name] = b
                continue
            self.ctx.set(name, self._from_type_proto(tp))
            self._type_bytes[name] = b  # consumers pass onnx's own bytes back to it
        return SOURCE_FALLBACK

    def _add_outer_scope(self, node: onnx.NodeProto, types: dict[str, bytes]) -> None:
        # subgraphs may read values of this graph by name: give onnx their types too
        for name in _subgraph_references(node):
            if name not in types and name in self.ctx:
                types[name] = self._type_of(name)

    def _type_of(self, name: str) -> bytes:
        b = self._type_bytes.get(name)
        if b is None:
            if name in self.result.other_types:
                b = self.result.other_types[name].SerializeToString()
            else:
                info = self.ctx[name]
                b = b""
                if info.elem_type:
                    tp = onnx.TypeProto()
                    write_type(tp, info, self._texts)
                    b = tp.SerializeToString()
            self._type_bytes[name] = b
        return b

    def _data_of(self, name: str) -> bytes | None:
        if name in self._data_bytes:
            return self._data_bytes[name]
        info = self.ctx[name]
        b = None
        # object arrays (symbolic entries, a rule's form) have no TensorProto form
        if info.value is not None and info.value.dtype != object and info.value.size <= _DATA_MAX_ELEMENTS:
            proto = self._initializer_protos.get(name)
            try:
                if proto is None:
                    proto = numpy_helper.from_array(np.asarray(info.value), name)
                b = proto.SerializeToString()
            except Exception:  # a dtype numpy_helper cannot write: onnx gets no data
                b = None
        self._data_bytes[name] = b
        return b

    def _from_type_proto(self, tp: onnx.TypeProto) -> TensorInfo:
        """``TensorInfo.from_type_proto`` with dim_param texts parsed once per pass."""
        if not tp.HasField("tensor_type"):
            return TensorInfo()
        tt = tp.tensor_type
        if not tt.HasField("shape"):
            return TensorInfo(tt.elem_type, None)
        shape = []
        for d in tt.shape.dim:
            which = d.WhichOneof("value")
            if which == "dim_value":
                shape.append(int(d.dim_value))
            elif which == "dim_param":
                text = d.dim_param
                if text not in self._parsed:
                    self._parsed[text] = dims.parse(text)
                shape.append(self._parsed[text])
            else:
                shape.append(None)
        return TensorInfo(tt.elem_type, tuple(shape))

    # -- constants
    def _constant(self, n: NodeContext) -> bool:
        """Type (and value) of a Constant node; False to let onnx judge a malformed one."""
        attrs = [a for a in n.node.attribute]
        if len(attrs) != 1 or len(n.node.output) != 1:
            return False
        a = attrs[0]
        info: TensorInfo
        try:
            if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                t = a.t
                value = None if t.data_location == onnx.TensorProto.EXTERNAL else numpy_helper.to_array(t)
                info = TensorInfo(int(t.data_type), tuple(int(d) for d in t.dims), value)
            elif a.name == "sparse_value" and a.type == onnx.AttributeProto.SPARSE_TENSOR:
                info = TensorInfo(int(a.sparse_tensor.values.data_type), tuple(int(d) for d in a.sparse_tensor.dims))
            elif a.name == "value_float" and a.type == onnx.AttributeProto.FLOAT:
                info = TensorInfo.from_array(np.array(a.f, dtype=np.float32), onnx.TensorProto.FLOAT)
            elif a.name == "value_floats" and a.type == onnx.AttributeProto.FLOATS:
                info = TensorInfo.from_array(np.array(list(a.floats), dtype=np.float32), onnx.TensorProto.FLOAT)
            elif a.name == "value_int" and a.type == onnx.AttributeProto.INT:
                info = TensorInfo.from_array(np.array(a.i, dtype=np.int64), onnx.TensorProto.INT64)
            elif a.name == "value_ints" and a.type == onnx.AttributeProto.INTS:
                info = TensorInfo.from_array(np.array(list(a.ints), dtype=np.int64), onnx.TensorProto.INT64)
            elif a.name == "value_string" and a.type == onnx.AttributeProto.STRING:
                info = TensorInfo(onnx.TensorProto.STRING, ())
            elif a.name == "value_strings" and a.type == onnx.AttributeProto.STRINGS:
                info = TensorInfo(onnx.TensorProto.STRING, (len(a.strings),))
            else:
                return False
        except Exception:  # unreadable tensor data: onnx's inference reports it
            return False
        self.ctx.set(n.node.output[0], info)
        return True

    def _fold(self, n: NodeContext) -> None:
        node = n.node
        if node.op_type not in _FOLDERS or normalize_domain(node.domain) != "" or len(node.output) != 1:
            return
        out_name = node.output[0]
        out = self.ctx.get(out_name)
        if out is None or not out.elem_type or out.value is not None:
            return  # a rule that computed the value knows better (it may keep symbolic entries)
        try:
            value = _FOLDERS[node.op_type](n, self.ctx)
        except Exception:  # folding is best effort: whatever numpy refuses stays unfolded
            return
        if value is None or value.size > _FOLD_MAX_ELEMENTS:
            return
        try:
            if helper.tensor_dtype_to_np_dtype(out.elem_type) != value.dtype:
                return
        except Exception:
            return
        self.ctx.set(out_name, TensorInfo(out.elem_type, tuple(int(s) for s in value.shape), value))

    # -- declared types
    def _merge_declared(self, n: NodeContext, name: str, inferred: TensorInfo) -> None:
        declared, is_output = self._declared[name]
        merged, conflict = merge_info(declared, inferred, prefer_declared_symbols=is_output)
        if conflict:
            kind = "graph output" if is_output else "value_info"
            err = n.error("output-type" if is_output else "value-info",
                          f"{kind} {name!r}: declared type contradicts the inferred one ({conflict})",
                          expected=_info_text(inferred), found=_info_text(declared))
            self._raise_or_record(err)
            # the model's declared output type is its contract; a value_info is only a note
            merged = TensorInfo(declared.elem_type, declared.shape, inferred.value) if is_output else inferred
        if merged != inferred:
            self.ctx.set(name, merged)
            if not inferred.elem_type and merged.elem_type:
                self.result.typed_by[name] = SOURCE_DECLARED

    def _check_outputs_defined(self) -> None:
        for vo in self.graph.output:
            if vo.name not in self.ctx and vo.name not in self.result.other_types:
                self._raise_or_record(InferenceError(
                    "graph-output", MODEL_NODE, f"graph output {vo.name!r} is not produced by any node, graph input or initializer"))


# ------------------------------------------------------------------ helpers
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
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


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


# ------------------------------------------------------------------ folding
# Each folder returns the output's value or None; inputs must all carry values (except Shape).
def _values(n: NodeContext, ctx: ShapesContext) -> list[np.ndarray | None] | None:
    out = []
    for name in n.node.input:
        if not name:
            out.append(None)
            continue
        v = ctx[name].value
        if v is None or v.size > _FOLD_MAX_ELEMENTS:
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
}

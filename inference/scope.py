"""What one walk holds per graph: lazy constants, scopes, the graph being walked, the rules'
view of a node.

- ``LazyConstant``: an initializer or ``Constant`` tensor, its value read from the proto only
  when a rule asks (``Bookkeeping`` notes every read, for the memo);
- ``Scope``: a graph's values, reading through to the enclosing graphs' (outer-scope
  references); the main graph's initializers stay their ``TensorProto`` until read;
- ``Graph``: one graph being walked (the main graph, a subgraph body, a function body) with
  what the write-back needs of it;
- ``NodeCtx``: the ``NodeContext`` the engine hands rules.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_quant.errors import InferenceError
from onnx_quant.model_io import check_external_location

from .context import SequenceInfo, ShapesContext, TensorInfo
from .diagnostics import MODEL_NODE, one_line
from .registry import NodeContext

_TensorProto = onnx.TensorProto
_EXTERNAL = onnx.TensorProto.EXTERNAL
_ATTR_TENSOR = onnx.AttributeProto.TENSOR

#: the unknown type: every output of a failed node, a value nothing typed
UNKNOWN = TensorInfo()


# ------------------------------------------------------------------ lazy constants
class Bookkeeping:
    """A pass's bookkeeping that constants and scopes report to (see ``LazyConstant``): no
    reference back to the pass, so that dropping a result frees everything at once."""

    __slots__ = ("strict", "diagnostics", "log")

    def __init__(self, strict: bool, diagnostics: list) -> None:
        self.strict = strict
        self.diagnostics = diagnostics
        self.log: list = []  # constants read since the current node started (the memo)

    def raise_or_record(self, err: InferenceError) -> None:
        if self.strict:
            raise err
        self.diagnostics.append(err)


class NoLog(list):
    """A ``Bookkeeping.log`` that keeps nothing (values read after the pass)."""

    def append(self, item) -> None:
        pass


class LazyConstant(TensorInfo):
    """An initializer or ``Constant`` tensor: type and shape from the proto, the value read
    from it only when a rule asks (``numpy_helper.to_array``); external data is never read.

    Equal to (and hashing like) any ``TensorInfo`` of the same type and shape.
    """

    def __init__(self, proto: onnx.TensorProto, owner: Bookkeeping | None = None) -> None:
        d = self.__dict__
        d["proto"] = proto  # the tensor it reads (a plain attribute: the memo's key reads it per node)
        d["_owner"] = owner  # its pass's bookkeeping: notes every read (the memo), reports unreadable data

    @property
    def elem_type(self) -> int:  # type: ignore[override]
        d = self.__dict__
        t = d.get("_elem_type")
        if t is None:
            t = d["_elem_type"] = d["proto"].data_type
        return t

    @property
    def shape(self) -> tuple[int, ...]:  # type: ignore[override]
        d = self.__dict__
        s = d.get("_shape")
        if s is None:
            s = d["_shape"] = tuple(d["proto"].dims[:])
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
        proto = d["proto"]
        if proto.data_location != onnx.TensorProto.EXTERNAL:
            try:
                v = to_array(proto)
            except Exception as e:  # malformed data (wrong raw_data length, unknown type)
                if owner is not None:
                    owner.raise_or_record(InferenceError(
                        "initializer", MODEL_NODE, f"tensor {proto.name!r}: cannot read its data: {one_line(e)}"))
        d["_value"] = v
        return v

    @property
    def external(self) -> bool:
        """Stored outside the model file (never read by the pass)."""
        return self.__dict__["proto"].data_location == onnx.TensorProto.EXTERNAL

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


_RAW_DTYPES = {
    t: np.dtype(helper.tensor_dtype_to_np_dtype(t)).newbyteorder("<")
    for t in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.INT8,
              onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16, onnx.TensorProto.INT32,
              onnx.TensorProto.UINT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT64, onnx.TensorProto.BOOL)
}


def to_array(t: onnx.TensorProto) -> np.ndarray:
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


def constant_info(attrs, owner: Bookkeeping, label: str) -> TensorInfo | None:
    """The value a ``Constant`` node's one attribute holds (None: malformed, onnx judges it);
    a tensor is a ``LazyConstant`` (read only when a rule asks). ``label`` names the model
    when an external tensor points outside its folder."""
    if len(attrs) != 1:
        return None
    a = attrs[0]
    t, name = a.type, a.name
    if t == _ATTR_TENSOR:
        tensor = a.t
        if tensor.data_location == _EXTERNAL:
            check_external_location(tensor, label)
        return LazyConstant(tensor, owner) if name == "value" else None
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


# ------------------------------------------------------------------ scopes
class Scope(ShapesContext):
    """A graph's values. A body's scope reads through to the enclosing graphs' values
    (outer-scope references); writes stay local.

    The main graph's initializers are stored as their ``TensorProto`` until something reads
    them (a ``LazyConstant`` is made then): on the memo's hit path only their key ids are
    needed. ``kids``: name -> memo key id of its current value (a cache, ``""``: absent);
    ``other``: the non-tensor types (sequence, optional, map) of local values."""

    def __init__(self, opsets: dict[str, int], strict: bool, diagnostics: list,
                 parent: "Scope | None" = None, owner: Bookkeeping | None = None) -> None:
        self.opsets = opsets
        self.strict = strict
        self._values: dict[str, TensorInfo] = {}
        self.diagnostics = diagnostics
        self.parent = parent
        self.owner = owner
        self.runtime = parent.runtime if parent is not None else False
        self.other: dict[str, onnx.TypeProto] = {}
        self.kids: dict[str, int] = {"": 0}
        #: ``local(name)``: what this scope itself stores for ``name`` (no enclosing scope, no
        #: read of an initializer: a ``TensorProto`` for an unread one), or None
        self.local: Callable[[str], TensorInfo | onnx.TensorProto | None] = self._values.get

    def define(self, name: str, info: TensorInfo) -> None:
        """``info`` becomes ``name``'s value in this scope (``set`` without its check for an
        empty name: the engine's names are never empty)."""
        self._values[name] = info

    def define_other(self, name: str, type_proto: onnx.TypeProto, items: tuple | None = None) -> None:
        """``name`` is a sequence, optional or map value of ``type_proto`` (its ``other`` entry)
        whose contents the pass knows as ``items`` (``SequenceInfo``; None: unknown)."""
        self.other[name] = type_proto
        self._values[name] = SequenceInfo(type_proto, items)

    def bind(self, name: str, out: tuple[TensorInfo, int]) -> None:
        """Define ``name`` as a memoized output: ``out`` is (its value, its memo key id)."""
        self._values[name], self.kids[name] = out

    def _materialize(self, name: str, proto: onnx.TensorProto) -> TensorInfo:
        info = self._values[name] = LazyConstant(proto, self.owner)
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

    def defined(self) -> Callable[[str], bool]:
        """A test of whether a name is defined here or in an enclosing scope (for the main
        graph the dict's own ``in``: the walk asks it for every output)."""
        return self._values.__contains__ if self.parent is None else self.__contains__

    def add_initializers(self, inits: Iterable[onnx.TensorProto], key_ids: dict, label: str) -> list[str]:
        """Store each initializer as its proto, with its memo key id (its type and shape: one
        read of the proto each, the hottest loop of big models); returns their names in
        order. ``label`` names the model when external data points outside its folder."""
        values, kids = self._values, self.kids
        names = []
        append = names.append
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
        return names

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


class Graph:
    """One graph being walked: the main graph, a subgraph body, or a function body."""

    def __init__(self, proto, scope: Scope, dispatch: dict, *, prefix: str = "", where: str = "",
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
        # main graph only, one per node in order: the dispatch entry of a memo hit, else (source, version)
        self.records: list | None = [] if top else None
        self.children: dict[tuple, "Graph"] = {}
        self.final_outputs: dict[str, TensorInfo] = {}
        self.initializer_names: dict | None = None  # the main graph's, as an ordered set
        self.get = scope.get
        self.defined = scope.defined()  # whether a name is defined (asked for every node's outputs)


def node_label(node: onnx.NodeProto, index: int) -> str:
    """How diagnostics name a node: ``'name' (Op)``, or ``#index (Op)`` when unnamed."""
    if node.name:
        return f"{node.name!r} ({node.op_type})"
    return f"#{index} ({node.op_type})"


class NodeCtx(NodeContext):
    """``NodeContext`` whose label names the enclosing node for nodes inside bodies, and whose
    input and output names are lists read from the proto once (the engine sets them): rules
    ask for them many times, and each protobuf read makes a new object."""

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
                self.ctx.define(name, info)

    @property
    def label(self) -> str:  # type: ignore[override]
        return self.prefix + node_label(self.node, self.index)

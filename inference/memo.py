"""Memo keys and type interning: what a node's result is keyed by, and each distinct type's
bytes, once per pass.

A node's result is a function of its op, opset, attributes, input types and the constant
inputs its rule reads, so the engine memoizes it on exactly that. A value's part of the key
is an int, its *key id* (``Keys.intern``): its type and, for a value a rule computed, its
content; a constant from the model (initializer, ``Constant``) is keyed by its type, and by
its content only where a rule read it: the memo then holds a ``Dep`` for the plain key,
naming the inputs whose content extends it (``Keys.content_key``). A rule that reads a big
constant (a weight) is not memoized (``NEVER``).
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from . import dims
from .context import SequenceInfo, TensorInfo
from .dims import DimLike
from .scope import LazyConstant, Scope
from .writeback import encode_type

#: A constant of at most this many elements that a rule reads is part of the node's memo key
#: by content (zero points, scales, biases, shapes); a node whose rule reads a bigger one (a
#: weight) is not memoized.
KEY_MAX_ELEMENTS = 1024

_TensorProto = onnx.TensorProto


class Dep:
    """Memo marker: results for this key depend on the content of these constant inputs."""

    __slots__ = ("indices",)

    def __init__(self, indices: frozenset | None) -> None:
        self.indices = indices


#: Memo marker: the rule read a big constant (a weight): nodes of this key are not memoized.
NEVER = Dep(None)


class Keys:
    """One pass's key ids and serialized types (nothing outlives the result that holds it).

    ``key_ids``: key -> id (a type ``(elem_type, shape)``, a computed value's type and
    content, a constant's content); ``interned``: id(info) -> (info, key id, type bytes or
    None, content key id)."""

    def __init__(self) -> None:
        self.key_ids: dict[tuple, int] = {}
        self.interned: dict[int, tuple] = {}
        self._parsed: dict[str, DimLike] = {}
        self._texts: dict[int, tuple] = {}   # id(Dim) -> (Dim, its TensorShapeProto.dim bytes)
        self._encoded: dict[tuple, bytes] = {}  # (elem_type, shape) -> TypeProto bytes
        self._content_ids: dict[int, tuple] = {}  # id(TensorProto) -> (proto, content key id)
        self._declared: dict[int, tuple] = {}  # id(GraphProto) -> (proto, its declared types)

    # -- key ids
    def intern(self, info: TensorInfo, tb: bytes | None = None) -> tuple:
        """(info, key id, type bytes or None, content key id) of a value, recorded for it. The
        type is keyed as the tuple (elem_type, shape), which equals another exactly when their
        TypeProto bytes do (dims are canonical, a symbol's text is its identity): the bytes
        are encoded only when the write-back or onnx's fallback needs them, once per distinct
        type; ``tb`` gives them (onnx's own, which consumers pass back to it)."""
        if type(info) is LazyConstant:  # (type, shape): the key Scope.add_initializers gives
            k = (info.elem_type, info.shape)
        elif type(info) is SequenceInfo:  # a key of its own: what it holds is not its type's
            k = ("other", len(self.key_ids))
        else:
            et = info.elem_type
            v = info.value
            k = (et, info.shape if et else None, None if v is None else array_key(v))
        kid = self.key_ids.get(k)
        if kid is None:
            kid = self.key_ids[k] = len(self.key_ids) + 1
        rec = (info, kid, tb, None if type(info) is LazyConstant else kid)
        self.interned[id(info)] = rec
        return rec

    def kid_of(self, scope: Scope, name: str) -> int | None:
        """Memo key id of the value ``name`` (None if it is not defined)."""
        info = scope.get(name)
        if info is None:
            return None
        rec = self.interned.get(id(info)) or self.intern(info)
        scope.kids[name] = rec[1]
        return rec[1]

    def content_key(self, scope: Scope, inputs, key: tuple, indices: frozenset) -> tuple:
        """``key`` extended by the content of the constant inputs (names) at ``indices``."""
        parts = [key, indices]
        for i in sorted(indices):
            name = inputs[i]
            v = scope.raw(name)
            if type(v) is _TensorProto or type(v) is LazyConstant:
                proto = v if type(v) is _TensorProto else v.proto
                rec = self._content_ids.get(id(proto))
                parts.append(rec[1] if rec is not None else self._content_id(scope, name, proto))
            else:  # a value a rule computed: its key id has its content already
                parts.append(scope.kids.get(name) or self.kid_of(scope, name))
        return tuple(parts)

    def _content_id(self, scope: Scope, name: str, proto: onnx.TensorProto) -> int:
        """Key id of a constant's type, shape and content (a big one's is its identity), read
        from the proto itself: a node keyed by a constant's content runs once per layer."""
        shape = tuple(proto.dims[:])
        if proto.data_location == onnx.TensorProto.EXTERNAL:
            vk = None
        elif math.prod(shape) > KEY_MAX_ELEMENTS:
            vk = ("object", id(proto))
        else:
            vk = proto_content(proto)
            if vk is None:  # complex data: decoded
                v = scope.get(name).value
                vk = None if v is None else array_key(v)
        k = ("content", proto.data_type, shape, vk)
        kid = self.key_ids.get(k)
        if kid is None:
            kid = self.key_ids[k] = len(self.key_ids) + 1
        self._content_ids[id(proto)] = (proto, kid)
        return kid

    def memoize(self, scope: Scope, inputs: list, memo: dict, key: tuple, outs: tuple, reads: list) -> None:
        """Keep ``outs`` for ``key`` in ``memo``, keyed also by the content of the constants
        the rule read (``reads``, all of them inputs of the node; else nothing is kept)."""
        if not reads:
            if memo.get(key) is None:
                memo[key] = outs
            return
        for x in reads:
            if x.size > KEY_MAX_ELEMENTS:  # a weight: keyed by identity it would never hit again
                memo[key] = NEVER
                return
        read = {id(x) for x in reads}
        get = scope.get
        indices = {i for i, name in enumerate(inputs) if name and id(get(name)) in read}
        if len(read) != len({id(get(inputs[i])) for i in indices}):
            return  # the rule read a constant that is not one of its inputs: not memoized
        dep = memo.get(key)
        if type(dep) is Dep and indices <= dep.indices:
            indices = dep.indices
        else:
            indices = frozenset(indices | (dep.indices if type(dep) is Dep else set()))
            memo[key] = Dep(indices)
        memo[self.content_key(scope, inputs, key, indices)] = outs

    # -- serialized types
    def type_bytes(self, info: TensorInfo) -> bytes:
        """TypeProto bytes of ``info``: onnx's own where onnx typed it, else encoded once per
        distinct (elem_type, shape) a pass meets."""
        rec = self.interned.get(id(info))
        if rec is None:
            rec = self.intern(info)
        if rec[2] is None:
            k = (info.elem_type, info.shape)
            tb = self._encoded.get(k)
            if tb is None:
                tb = self._encoded[k] = encode_type(info, self._texts)
            rec = (rec[0], rec[1], tb, rec[3])
            self.interned[id(info)] = rec
        return rec[2]

    def declared_types(self, graph: onnx.GraphProto) -> dict[str, tuple[TensorInfo, bool]]:
        """name -> (type, whether a graph output) of the tensor types ``graph``'s value_info and
        outputs declare, read once per pass (a body is walked again per If, Loop attempt and
        case run); the proto is kept with them, so its id names no other graph meanwhile."""
        rec = self._declared.get(id(graph))
        if rec is None:
            found = {}
            for vi in graph.value_info:
                if vi.type.HasField("tensor_type"):
                    found[vi.name] = (self.from_type_proto(vi.type), False)
            for vo in graph.output:
                if vo.type.HasField("tensor_type"):
                    found[vo.name] = (self.from_type_proto(vo.type), True)
            rec = self._declared[id(graph)] = (graph, found)
        return rec[1]

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


_TYPED_FIELDS = {
    onnx.TensorProto.FLOAT: "float_data", onnx.TensorProto.DOUBLE: "double_data", onnx.TensorProto.INT64: "int64_data",
    onnx.TensorProto.UINT32: "uint64_data", onnx.TensorProto.UINT64: "uint64_data", onnx.TensorProto.STRING: "string_data",
}


def proto_content(t: onnx.TensorProto) -> tuple | None:
    """A TensorProto's data as a hashable key without decoding it (None: decode it)."""
    raw = t.raw_data
    if raw:
        return ("raw", raw)
    if t.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128):
        return None
    field_name = _TYPED_FIELDS.get(t.data_type, "int32_data")
    return (field_name, tuple(getattr(t, field_name)[:]))


def array_key(v: np.ndarray) -> tuple:
    """A value's content as a hashable key."""
    if v.dtype == object:
        return ("O", v.shape, tuple(v.reshape(-1).tolist()))
    return (v.dtype.str, v.shape, v.tobytes())

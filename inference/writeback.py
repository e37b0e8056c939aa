"""The write-back: a model carrying a pass's result (``value_info`` for every typed value,
typed graph outputs, in subgraph bodies too), and the protobuf encoding it and the engine
share.

``value_info`` is built as bytes and merged into each graph once (``MergeFromString``): one
``ValueInfoProto`` per value, its type's bytes encoded once per distinct type
(:func:`encode_type`, the pass's ``memo.Keys.type_bytes``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx

from .context import TensorInfo
from .scope import Graph

if TYPE_CHECKING:  # annotations only: api does not import this module
    from .api import InferenceResult


def write_back(model: onnx.ModelProto, result: "InferenceResult", *, copy: bool = True) -> onnx.ModelProto:
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
    def __init__(self, result: "InferenceResult", *, in_place: bool = False) -> None:
        self.result = result
        self.type_bytes = result.types.type_bytes
        self.in_place = in_place  # the graphs written are the ones read

    def graph(self, graph: onnx.GraphProto, source: onnx.GraphProto, g: Graph, *, top: bool) -> None:
        scope, typebytes = g.scope, self.type_bytes
        local = scope.local
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
        plain = not existing and not other  # the common case: each type's bytes once per TensorInfo
        for name in g.produced:
            if name in seen:
                continue
            seen.add(name)
            info = local(name)
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
                info = local(vi.name)
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


# ------------------------------------------------------------------ encoding
_SMALL_VARINTS = [bytes((i,)) for i in range(0x80)] + [bytes((0x80 | (i & 0x7F), i >> 7)) for i in range(0x80, 0x4000)]

#: TensorShapeProto.dim entries (field 1) of dim_value (field 1) d, for small d
_DIM_VALUE_BYTES = [b"\x0a" + bytes((len(v) + 1,)) + b"\x08" + v for v in _SMALL_VARINTS]


def varint(n: int) -> bytes:
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


def encode_type(info: TensorInfo, texts: dict[int, tuple]) -> bytes:
    """TypeProto bytes of ``info`` (tensor_type: elem_type, shape of dim_value/dim_param).

    ``texts`` (id(Dim) -> (Dim, its TensorShapeProto.dim bytes)) caches each symbolic dim's
    bytes across calls."""
    if not info.elem_type:
        return b""
    body = b"\x08" + varint(info.elem_type)
    shape = info.shape
    if shape is not None:
        dims_b = []
        small = _DIM_VALUE_BYTES
        for d in shape:
            if d is None:
                dims_b.append(b"\x0a\x00")
            elif type(d) is int:
                if 0 <= d < 0x4000:
                    dims_b.append(small[d])
                    continue
                if d < 0:
                    tp = onnx.TypeProto()
                    write_type(tp, info)
                    return tp.SerializeToString()
                v = varint(d)
                dims_b.append(b"\x0a" + varint(len(v) + 1) + b"\x08" + v)
            else:
                rec = texts.get(id(d))
                if rec is None:  # the whole dim's bytes, once per Dim
                    t = d.text().encode()
                    inner = b"\x12" + varint(len(t)) + t
                    rec = texts[id(d)] = (d, b"\x0a" + varint(len(inner)) + inner)
                dims_b.append(rec[1])
        sb = b"".join(dims_b)
        body += b"\x12" + varint(len(sb)) + sb
    return b"\x0a" + varint(len(body)) + body

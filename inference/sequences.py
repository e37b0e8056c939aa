"""Sequences and optionals: what the pass knows of their contents.

onnx's inference types a sequence as one element type and one merged shape
(``seq(float[?, 3])`` for a sequence of ``[2, 3]`` and ``[4, 3]``), so what a model reads out of
it (``SequenceAt``, ``ConcatFromSequence``, ``SequenceLength``) loses the shapes a runtime will
compute. The pass keeps, beside onnx's type, the *items* of a sequence or optional value where it
knows them (``context.SequenceInfo.items``): one ``TensorInfo`` per element, in order, from
``SequenceConstruct`` / ``SequenceEmpty`` / ``SequenceInsert`` / ``SequenceErase`` /
``SplitToSequence`` / ``Optional`` and from the elements' shapes a caller gives for a sequence
input (``input_shapes``: an :class:`Elements`). :func:`refine` runs after onnx typed one of those
ops (fallback.py) and narrows its outputs: the items of a sequence output, and the exact type of
a tensor read out of a known sequence (the element at a position whose value the pass knows, the
concatenation of known elements, the count as a value, whether an optional holds a value).
Unknown stays unknown: a position read at run time, a sequence a Loop builds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

from . import dims
from .context import SequenceInfo, TensorInfo

#: the ops whose outputs :func:`refine` narrows (default domain)
REFINED = frozenset({
    "SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceErase", "SequenceAt", "SequenceLength",
    "SplitToSequence", "ConcatFromSequence", "Optional", "OptionalHasElement", "OptionalGetElement",
})


class Elements(tuple):
    """``input_shapes`` of a sequence input: its elements' shapes in order (tuples of ints). For
    an optional input, ``None`` is an empty one and a shape (or an ``Elements``, for an optional
    sequence) the value it holds."""

    def __repr__(self) -> str:
        return f"Elements{tuple(self)!r}"


# ----------------------------------------------------------------------------- inputs


def _merged_shape(shapes: list[tuple | None]) -> tuple | None:
    """The one shape onnx's type holds for these: equal dims kept, others unknown; None when the
    ranks differ (or there is nothing to merge)."""
    if not shapes or any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1:
        return None
    return tuple(s[0] if all(d == s[0] for d in s) else None for s in zip(*shapes))


def _tensor_type(elem_type: int, shape: tuple | None) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(elem_type, None if shape is None else
                                         [d if isinstance(d, int) else None for d in shape])


def with_items(tp: onnx.TypeProto, items: tuple) -> onnx.TypeProto:
    """``tp`` (a sequence or optional type) with its element type's shape merged from ``items``
    (what onnx's inference downstream then reads), the element type kept."""
    out = onnx.TypeProto()
    out.CopyFrom(tp)
    kind = tp.WhichOneof("value")
    if kind == "sequence_type" and out.sequence_type.elem_type.HasField("tensor_type"):
        shape = _merged_shape([i.shape for i in items])
        elem = out.sequence_type.elem_type.tensor_type.elem_type
        out.sequence_type.elem_type.CopyFrom(_tensor_type(elem, shape))
    elif kind == "optional_type" and items:
        inner = items[0]
        if isinstance(inner, SequenceInfo):
            out.optional_type.elem_type.CopyFrom(inner.type_proto)
        elif out.optional_type.elem_type.HasField("tensor_type"):
            elem = out.optional_type.elem_type.tensor_type.elem_type
            out.optional_type.elem_type.CopyFrom(_tensor_type(elem, inner.shape))
    return out


def input_items(tp: onnx.TypeProto, given: Any, name: str) -> SequenceInfo:
    """A sequence or optional graph input's value from its type and what a caller gives of it
    (see :class:`Elements`); ValueError when that does not fit the type."""
    kind = tp.WhichOneof("value")
    if kind == "sequence_type":
        if not isinstance(given, Elements):
            raise ValueError(f"input {name!r} is a sequence: give its elements' shapes (Elements), found {given!r}")
        elem = tp.sequence_type.elem_type
        if not elem.HasField("tensor_type"):
            raise ValueError(f"input {name!r}: a sequence of {elem.WhichOneof('value')} has no element shapes")
        code = elem.tensor_type.elem_type
        items = tuple(TensorInfo(code, tuple(int(d) for d in s)) for s in given)
    elif kind == "optional_type":
        elem = tp.optional_type.elem_type
        if given is None:
            items = ()
        elif elem.HasField("tensor_type") and not isinstance(given, Elements):
            items = (TensorInfo(elem.tensor_type.elem_type, tuple(int(d) for d in given)),)
        elif elem.HasField("sequence_type"):
            items = (input_items(elem, given, name),)
        else:
            raise ValueError(f"input {name!r}: {given!r} does not fit its optional type")
    else:
        raise ValueError(f"input {name!r}: a {kind} input takes no shapes")
    return SequenceInfo(with_items(tp, items), items)


# ----------------------------------------------------------------------------- refine


def _items(scope: Any, name: str) -> tuple | None:
    info = scope.get(name) if name else None
    return info.items if isinstance(info, SequenceInfo) else None


def _position(scope: Any, name: str) -> int | None:
    """A position input's value where the pass knows it (an int; None otherwise)."""
    info = scope.get(name) if name else None
    v = None if info is None else info.value
    if v is None or v.size != 1 or v.dtype.kind not in "iu":
        return None
    return int(v.reshape(-1)[0])


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _set_items(scope: Any, name: str, items: tuple | None) -> None:
    if name and items is not None and name in scope.other:
        scope.define_other(name, with_items(scope.other[name], items), items)


def _set_tensor(scope: Any, name: str, info: TensorInfo | None) -> None:
    """``name`` is ``info`` (a tensor read out of a known sequence), where onnx typed it alike."""
    if not name or info is None or isinstance(info, SequenceInfo) or not info.elem_type:
        return
    onnx_said = scope.get(name)
    if onnx_said is not None and onnx_said.elem_type and onnx_said.elem_type != info.elem_type:
        return
    scope.define(name, info)


def refine(node: onnx.NodeProto, scope: Any) -> None:
    """Narrow the outputs onnx's inference gave a sequence / optional op (see the module doc)."""
    op = node.op_type
    ins = list(node.input)
    out = node.output[0] if node.output else ""
    inp = lambda i: ins[i] if i < len(ins) else ""  # noqa: E731
    if op == "SequenceEmpty":
        _set_items(scope, out, ())
    elif op == "SequenceConstruct":
        infos = [scope.get(n) for n in ins]
        if all(i is not None and not isinstance(i, SequenceInfo) for i in infos):
            _set_items(scope, out, tuple(infos))
    elif op in ("SequenceInsert", "SequenceErase"):
        _set_items(scope, out, _edited(op, scope, _items(scope, inp(0)), inp))
    elif op == "SequenceAt":
        items, p = _items(scope, inp(0)), _position(scope, inp(1))
        if items:
            if p is not None and -len(items) <= p < len(items):
                _set_tensor(scope, out, items[p])
            elif all(i == items[0] for i in items):
                _set_tensor(scope, out, TensorInfo(items[0].elem_type, items[0].shape))
    elif op == "SequenceLength":
        items = _items(scope, inp(0))
        if items is not None:
            scope.define(out, TensorInfo(onnx.TensorProto.INT64, (), np.array(len(items), np.int64)))
    elif op == "SplitToSequence":
        _set_items(scope, out, _split_items(node, scope, inp))
    elif op == "ConcatFromSequence":
        _set_tensor(scope, out, _concat_info(node, _items(scope, inp(0))))
    elif op == "Optional":
        x = scope.get(inp(0)) if inp(0) else None
        _set_items(scope, out, () if not inp(0) else None if x is None else (x,))
    elif op == "OptionalHasElement":
        has = _has_element(scope, inp(0))
        if has is not None:
            scope.define(out, TensorInfo(onnx.TensorProto.BOOL, (), np.array(has)))
    elif op == "OptionalGetElement":
        x = scope.get(inp(0)) if inp(0) else None
        if isinstance(x, SequenceInfo) and x.kind == "optional":
            inner = x.items[0] if x.items else None
            if isinstance(inner, SequenceInfo):
                _set_items(scope, out, inner.items)
            else:
                _set_tensor(scope, out, inner)
        elif isinstance(x, SequenceInfo):
            _set_items(scope, out, x.items)
        else:
            _set_tensor(scope, out, x)


def _edited(op: str, scope: Any, items: tuple | None, inp) -> tuple | None:
    """SequenceInsert's / SequenceErase's items (None where the position is not known or out of
    range: the runtime refuses it)."""
    if items is None:
        return None
    n = len(items)
    at = 2 if op == "SequenceInsert" else 1
    p = _position(scope, inp(at)) if inp(at) else (n if op == "SequenceInsert" else -1)
    if p is None:
        return None
    if op == "SequenceInsert":
        x = scope.get(inp(1))
        if x is None or isinstance(x, SequenceInfo) or not -n <= p <= n:
            return None
        p = p + n if p < 0 else p
        return items[:p] + (x,) + items[p:]
    if not -n <= p < n:
        return None
    p = p + n if p < 0 else p
    return items[:p] + items[p + 1:]


def _split_items(node: onnx.NodeProto, scope: Any, inp) -> tuple | None:
    """SplitToSequence's elements where the input's shape on the axis and the split are known."""
    x = scope.get(inp(0))
    if x is None or x.shape is None or not x.elem_type:
        return None
    rank = len(x.shape)
    axis = int(_attr(node, "axis", 0))
    if not -rank <= axis < rank:
        return None
    axis += rank if axis < 0 else 0
    length = x.shape[axis]
    if not isinstance(length, int):
        return None
    if inp(1):
        split = scope.get(inp(1))
        v = None if split is None else split.value
        sizes = None if v is None or v.dtype.kind not in "iu" else split_sizes(length, v)
        if sizes is None:
            return None
        return tuple(TensorInfo(x.elem_type, x.shape[:axis] + (s,) + x.shape[axis + 1:]) for s in sizes)
    keep = int(_attr(node, "keepdims", 1))
    piece = x.shape[:axis] + ((1,) if keep else ()) + x.shape[axis + 1:]
    return tuple(TensorInfo(x.elem_type, piece) for _ in range(length))


def split_sizes(length: int, split: np.ndarray | None) -> list[int] | None:
    """SplitToSequence's piece lengths along an axis of ``length``: ones without a split, chunks
    of a scalar split (the last one the rest), a 1-D split's entries; None when the split is not
    positive or does not add up to the length."""
    if split is None:
        return [1] * length
    sizes = [int(s) for s in np.asarray(split).reshape(-1)]
    if np.ndim(split) == 0:
        if sizes[0] <= 0:
            return None
        sizes = [sizes[0]] * (length // sizes[0]) + ([length % sizes[0]] if length % sizes[0] else [])
    if sum(sizes) != length or any(s < 0 for s in sizes):
        return None
    return sizes


def _concat_info(node: onnx.NodeProto, items: tuple | None) -> TensorInfo | None:
    """ConcatFromSequence's output for known elements of one rank and type."""
    if not items or any(i.shape is None or not i.elem_type for i in items):
        return None
    if len({len(i.shape) for i in items}) != 1 or len({i.elem_type for i in items}) != 1:
        return None
    rank = len(items[0].shape)
    new_axis = int(_attr(node, "new_axis", 0))
    axis = int(_attr(node, "axis", 0))
    lo, hi = (-rank - 1, rank) if new_axis else (-rank, rank - 1)
    if not lo <= axis <= hi:
        return None
    axis += (rank + 1 if new_axis else rank) if axis < 0 else 0
    if new_axis:
        shape = items[0].shape
        if any(i.shape != shape for i in items):
            return None
        return TensorInfo(items[0].elem_type, shape[:axis] + (len(items),) + shape[axis:])
    others = {i.shape[:axis] + i.shape[axis + 1:] for i in items}
    if len(others) != 1:
        return None
    total: Any = 0
    for i in items:
        total = dims.add(total, i.shape[axis])
    shape = items[0].shape
    return TensorInfo(items[0].elem_type, shape[:axis] + (total,) + shape[axis + 1:])


def _has_element(scope: Any, name: str) -> bool | None:
    """OptionalHasElement: False without an input, True for a tensor or sequence input, whether
    an optional input holds a value where the pass knows it."""
    if not name:
        return False
    x = scope.get(name)
    if isinstance(x, SequenceInfo) and x.kind == "optional":
        return None if x.items is None else bool(x.items)
    if isinstance(x, SequenceInfo) or (x is not None and x.elem_type):
        return True
    return None

"""Engine-level folding: the value of a few cheap operators on small integer tensors
(``Shape``, ``Gather``, ``Concat``, ...) where no rule computed it, so that
``Shape -> Gather -> Concat -> Reshape`` stays known. Shape arithmetic, not constant folding:
a folded value stays below ``FOLD_MAX_ELEMENTS``, and a weight is never read.

Each folder of ``FOLDERS`` (by ai.onnx op type) returns the output's value or None; inputs
must all carry values (except ``Shape``'s and ``Size``'s). :func:`fold` applies one.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from .context import ShapesContext, TensorInfo
from .registry import NodeContext
from .scope import LazyConstant, NodeCtx

#: Folded constants stay below this size: shape arithmetic, not constant folding.
FOLD_MAX_ELEMENTS = 1024


def fold(n: NodeCtx, folder) -> None:
    """The output's value by ``folder`` (one of ``FOLDERS``, the node's op) where no rule computed it."""
    if len(n.outputs) != 1:
        return
    out_name = n.outputs[0]
    scope = n.ctx
    out = scope.local(out_name)
    if out is None or not out.elem_type or out.value is not None:
        return  # a rule that computed the value knows better (it may keep symbolic entries)
    try:
        value = folder(n, scope)
    except Exception:  # folding is best effort: whatever numpy refuses stays unfolded
        return
    if value is None or value.size > FOLD_MAX_ELEMENTS:
        return
    try:
        if helper.tensor_dtype_to_np_dtype(out.elem_type) != value.dtype:
            return
    except Exception:
        return
    scope.define(out_name, TensorInfo(out.elem_type, tuple(int(s) for s in value.shape), value))


# Each folder returns the output's value or None; inputs must all carry values (except Shape).
def _input_values(n: NodeContext, ctx: ShapesContext) -> list[np.ndarray | None] | None:
    infos = [ctx[name] if name else None for name in n.node.input]
    # first make sure every input has a (small) value, then read them: a constant is read
    # only when the fold can happen (the memo notes every read)
    for info in infos:
        if info is None:
            continue
        if type(info) is LazyConstant:
            if info.size > FOLD_MAX_ELEMENTS or info.external:
                return None  # folding is for small shape arithmetic: never read a weight
        elif info.value is None:
            return None
    out = []
    for info in infos:
        v = None if info is None else info.value
        if info is not None and (v is None or v.size > FOLD_MAX_ELEMENTS):
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
    vals = _input_values(n, ctx)
    if vals is None:
        return None
    axes = _axes(n, ctx, vals)
    if axes is None:
        return None
    rank = vals[0].ndim + len(axes)
    return np.expand_dims(vals[0], tuple(sorted(a + rank if a < 0 else a for a in axes)))


def _fold_squeeze(n: NodeContext, ctx: ShapesContext) -> np.ndarray | None:
    vals = _input_values(n, ctx)
    if vals is None:
        return None
    axes = _axes(n, ctx, vals)
    if axes is None:
        return np.squeeze(vals[0])
    return np.squeeze(vals[0], axis=tuple(a + vals[0].ndim if a < 0 else a for a in axes))


def _fold_slice(n: NodeContext, ctx: ShapesContext) -> np.ndarray | None:
    vals = _input_values(n, ctx)
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
    vals = _input_values(n, ctx)
    if vals is None:
        return None
    target = np.dtype(helper.tensor_dtype_to_np_dtype(n.attr("to")))
    if target.kind not in "iub" or vals[0].dtype.kind not in "iub":  # int shape math only
        return None
    return vals[0].astype(target)


def _binary(fn):
    def fold(n: NodeContext, ctx: ShapesContext) -> np.ndarray | None:
        vals = _input_values(n, ctx)
        if vals is None or len(vals) != 2 or vals[0].dtype.kind not in "iu" or vals[0].dtype != vals[1].dtype:
            return None
        return fn(vals[0], vals[1]).astype(vals[0].dtype)
    return fold


def _fold_mod(n: NodeContext, ctx: ShapesContext) -> np.ndarray | None:
    """Integer Mod of shape values: fmod 0 takes the divisor's sign (numpy's mod), fmod 1 the
    dividend's (C's %); a zero divisor is left unfolded (its result is the kernel's business)."""
    vals = _input_values(n, ctx)
    if vals is None or len(vals) != 2 or vals[0].dtype.kind not in "iu" or vals[0].dtype != vals[1].dtype:
        return None
    if np.any(vals[1] == 0):
        return None
    fn = np.fmod if n.attr("fmod", 0) else np.mod
    return fn(vals[0], vals[1]).astype(vals[0].dtype)


def _simple(fn):
    def fold(n: NodeContext, ctx: ShapesContext) -> np.ndarray | None:
        vals = _input_values(n, ctx)
        return None if vals is None or any(v is None for v in vals) else fn(n, vals)
    return fold


FOLDERS = {
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

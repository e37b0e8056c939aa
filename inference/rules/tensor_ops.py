"""Tensor manipulation operators: reshaping, transposing, squeezing, concatenating and
splitting, slicing, gathering, expanding, tiling, padding, resizing (shape-producing ops and
constants: ``constants.py``; reductions, Einsum, TopK: ``reductions.py``).

Rules that need data (Reshape's target, Slice's bounds, Expand's shape ...) read it from the
input's ``TensorInfo.value``; Shape, Size, Constant, ConstantOfShape, Range, Gather, Slice,
Concat, Squeeze/Unsqueeze, Reshape/Flatten, Split and Expand also *produce* small values, so
shapes computed inside the graph resolve, symbolically when the dims are symbolic (see
:mod:`inference.rules._wm_common` for the value convention).
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from .. import dims
from ..context import TensorInfo
from ..dims import DimLike
from ..registry import register
from ._wm_common import (
    BIG, MAX_VALUE_ELEMS, as_object, broadcast_shapes, check_same_type, dim_min, entries, exact_div,
    make_value, max0, merge_dim, need, nonneg, norm_axes, norm_axis, numeric, product, shape_text, tidy, type_text,
    set_info, rank_only, clamp,
)

_LATEST = (21, 23, 24, 25)  # since_versions that only widened the type lists




def _small(info: TensorInfo) -> bool:
    return info.value is not None and info.value.size <= MAX_VALUE_ELEMS


def _reshaped_value(src: TensorInfo, out_shape, elem_type: int):
    if not _small(src) or out_shape is None or not all(isinstance(d, int) for d in out_shape):
        return None
    if src.value.size != product(out_shape):
        return None
    return src.value.reshape(tuple(out_shape))




# ---------------------------------------------------------------- Reshape / Flatten
@register("Reshape", 5, 13, 14, 19, *_LATEST)
def reshape(ctx, n) -> None:
    data, target_info = need(n, "Reshape", "data", "shape")
    t = data.elem_type
    if target_info.shape is not None and len(target_info.shape) != 1:
        n.fail("Reshape", "the shape input must be 1-D", subject="input shape", expected="rank 1",
               found=f"rank {len(target_info.shape)}")
    target = entries(target_info)
    if target is None:
        k = rank_only(target_info)
        set_info(n, 0, t, None if k is None else (None,) * k)
        return
    allowzero = n.version >= 14 and bool(n.attr("allowzero", 0))
    in_shape = data.shape
    out: list[DimLike] = []
    minus_one = None
    for i, d in enumerate(target):
        if isinstance(d, int):
            if d == -1:
                if minus_one is not None:
                    n.fail("Reshape", "at most one -1 in the target shape", subject="input shape",
                           expected="one -1", found=target)
                minus_one = i
                out.append(None)
                continue
            if d < -1:
                n.fail("Reshape", "target dims must be >= -1", subject="input shape", expected=">= -1 each",
                       found=target)
            if d == 0 and not allowzero:
                if in_shape is None:
                    out.append(None)
                    continue
                if i >= len(in_shape):
                    n.fail("Reshape", f"target entry {i} is 0 (copy the input dim) but the input has no dim {i}",
                           subject="input shape", expected=f"input rank > {i}", found=shape_text(in_shape))
                out.append(in_shape[i])
                continue
        out.append(d)
    if allowzero and minus_one is not None and 0 in target:
        n.fail("Reshape", "with allowzero=1 the target cannot hold both 0 and -1", subject="input shape",
               expected="no 0 next to -1", found=target)
    if in_shape is not None:
        known_in = all(isinstance(d, int) for d in in_shape)
        others = [d for j, d in enumerate(out) if j != minus_one]
        known_out = all(isinstance(d, int) for d in others)
        total = product(in_shape) if known_in else None
        if minus_one is not None:
            if known_in and known_out:
                k = product(others)
                if k == 0 or total % k:
                    n.fail("Reshape", f"cannot infer -1: {total} elements do not split into {shape_text(others)}",
                           subject="input shape", expected=f"a divisor of {total}", found=f"product {k}")
                out[minus_one] = total // k
            else:
                out[minus_one] = exact_div(in_shape, others)
        elif known_in and known_out and product(out) != total:
            n.fail("Reshape", "element count changes", subject="input shape",
                   expected=f"{total} elements ({shape_text(in_shape)})",
                   found=f"{product(out)} ({shape_text(out)})")
    set_info(n, 0, t, out, _reshaped_value(data, out, t))


@register("Flatten", 1, 9, 11, 13, *_LATEST)
def flatten(ctx, n) -> None:
    x, = need(n, "Flatten", "input")
    axis = int(n.attr("axis", 1))
    if x.shape is None:
        set_info(n, 0, x.elem_type, (None, None))
        return
    r = len(x.shape)
    lo = -r if n.version >= 11 else 0
    if not lo <= axis <= r:
        n.fail("Flatten", "axis out of range", subject="attribute axis", expected=f"an axis in [{lo}, {r}]",
               found=axis)
    if axis < 0:
        axis += r
    out = (product(x.shape[:axis]), product(x.shape[axis:]))
    set_info(n, 0, x.elem_type, out, _reshaped_value(x, out, x.elem_type))


# ---------------------------------------------------------------- Transpose
@register("Transpose", 1, 13, *_LATEST)
def transpose(ctx, n) -> None:
    x, = need(n, "Transpose", "data")
    perm = n.attr("perm")
    if x.shape is None:
        set_info(n, 0, x.elem_type, None if perm is None else (None,) * len(perm))
        return
    r = len(x.shape)
    perm = list(range(r - 1, -1, -1)) if perm is None else [int(p) for p in perm]
    if sorted(perm) != list(range(r)):
        n.fail("Transpose", "perm must be a permutation of the input axes", subject="attribute perm",
               expected=f"a permutation of 0..{r - 1}", found=perm)
    value = np.transpose(x.value, perm) if _small(x) else None
    set_info(n, 0, x.elem_type, [x.shape[p] for p in perm], value)


# ---------------------------------------------------------------- Squeeze / Unsqueeze
def _axes_arg(n, since_input: int):
    """(axes, known): axes from the attribute (< since_input) or the second input."""
    if n.version < since_input:
        axes = n.attr("axes")
        if axes is not None and n.version < 11 and any(a < 0 for a in axes):
            n.fail(n.node.op_type, "negative axes need opset 11", subject="attribute axes",
                   expected="axes >= 0", found=list(axes))
        return (None if axes is None else [int(a) for a in axes]), True
    if not n.has_input(1):
        return None, True
    e = entries(n.input(1))
    if e is None or not all(isinstance(a, int) for a in e):
        return None, False
    return e, True


@register("Squeeze", 1, 11, 13, *_LATEST)
def squeeze(ctx, n) -> None:
    x, = need(n, "Squeeze", "data")
    axes, known = _axes_arg(n, 13)
    if x.shape is None:
        set_info(n, 0, x.elem_type, None)
        return
    r = len(x.shape)
    if not known:
        k = rank_only(n.input(1))
        set_info(n, 0, x.elem_type, None if k is None else (None,) * (r - k))
        return
    if axes is None:
        if not all(isinstance(d, int) for d in x.shape):
            set_info(n, 0, x.elem_type, None)  # a symbolic dim may or may not be 1
            return
        keep = [d for d in x.shape if d != 1]
    else:
        axes = norm_axes(n, "Squeeze", axes, r, "axes")
        for a in axes:
            d = x.shape[a]
            if isinstance(d, int) and d != 1:
                n.fail("Squeeze", f"axis {a} has size {d}", subject="axes", expected="size 1 on each squeezed axis",
                       found=f"{d} (input {shape_text(x.shape)})")
        keep = [d for i, d in enumerate(x.shape) if i not in axes]
    set_info(n, 0, x.elem_type, keep, _reshaped_value(x, keep, x.elem_type))


@register("Unsqueeze", 1, 11, 13, *_LATEST)
def unsqueeze(ctx, n) -> None:
    x, = need(n, "Unsqueeze", "data")
    axes, known = _axes_arg(n, 13)
    if n.version < 13 and axes is None:
        n.fail("Unsqueeze", "attribute axes is required", subject="attribute axes", expected="a list of axes",
               found="none")
    if n.version >= 13 and not n.has_input(1):
        n.fail("Unsqueeze", "input axes is required", subject="input axes", expected="an axes tensor",
               found="none")
    if x.shape is None:
        set_info(n, 0, x.elem_type, None)
        return
    if not known:
        k = rank_only(n.input(1))
        set_info(n, 0, x.elem_type, None if k is None else (None,) * (len(x.shape) + k))
        return
    out_rank = len(x.shape) + len(axes)
    axes = set(norm_axes(n, "Unsqueeze", axes, out_rank, "axes"))
    it = iter(x.shape)
    out = [1 if i in axes else next(it) for i in range(out_rank)]
    set_info(n, 0, x.elem_type, out, _reshaped_value(x, out, x.elem_type))


# ---------------------------------------------------------------- Concat / Split
def _unknown_entries(shape) -> np.ndarray | None:
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return np.full(tuple(shape), None, dtype=object)


def concat_shape(n, rule: str, shapes, axis: int, names=None) -> tuple | None:
    """Shape of the concatenation of ``shapes`` on ``axis`` (validates ranks and other dims).

    ``names`` name the inputs in messages (default ``#0``, ``#1`` ...).
    """
    known = [s for s in shapes if s is not None]
    if not known:
        return None
    r = len(known[0])
    for i, s in enumerate(shapes):
        if s is not None and len(s) != r:
            name = names[i] if names else f"#{i}"
            n.fail(rule, "inputs must have the same rank", subject=f"input {name}", expected=f"rank {r}",
                   found=f"rank {len(s)} {shape_text(s)}")
    axis = norm_axis(n, rule, int(axis), r)
    out: list[DimLike] = []
    for j in range(r):
        if j == axis:
            if len(known) != len(shapes):
                out.append(None)
                continue
            total: DimLike = 0
            for s in known:
                total = dims.add(total, s[j])
            out.append(total)
            continue
        d: DimLike = None
        for i, s in enumerate(shapes):
            if s is None:
                continue
            if isinstance(d, int) and isinstance(s[j], int) and d != s[j]:
                name = names[i] if names else f"#{i}"
                n.fail(rule, f"dim {j} differs between inputs", subject=f"input {name}",
                       expected=f"{d} on axis {j}", found=f"{s[j]} ({shape_text(s)})")
            d = merge_dim(d, s[j])
        out.append(d)
    return tuple(out)


@register("Concat", 4, 11, 13)
def concat(ctx, n) -> None:
    infos = need(n, "Concat", *[f"#{i}" for i in range(max(1, len(n.node.input)))])
    t = check_same_type(n, "Concat", infos)
    axis = n.attr("axis")
    if axis is None:
        n.fail("Concat", "attribute axis is required", subject="attribute axis", expected="an axis", found="none")
    out = concat_shape(n, "Concat", [i.shape for i in infos], axis)
    value = None
    if out is not None and all(isinstance(d, int) for d in out) and product(out) <= MAX_VALUE_ELEMS \
            and any(_small(i) for i in infos):
        # an input without a value but with a known shape contributes unknown (None) entries
        if len(out) == 1:  # the shape-arithmetic case: joining 1-D values
            flat: list = []
            for i in infos:
                if _small(i):
                    flat.extend(i.value.tolist())
                elif i.shape is not None and isinstance(i.shape[0], int):
                    flat.extend([None] * i.shape[0])
                else:
                    flat = None
                    break
            value = None if flat is None else make_value(flat, out, t)
        else:
            vals = [i.value if _small(i) else _unknown_entries(i.shape) for i in infos]
            if any(v is None for v in vals):
                vals = []
            elif any(v.dtype.kind == "O" for v in vals):
                vals = [as_object(v) for v in vals]
            try:
                value = tidy(np.concatenate(vals, axis=norm_axis(n, "Concat", int(axis), len(out))), t) if vals else None
            except ValueError:
                value = None
    set_info(n, 0, t, out, value)


@register("Split", 2, 11, 13, 18)
def split(ctx, n) -> None:
    x, = need(n, "Split", "input")
    k = len(n.node.output)
    axis = int(n.attr("axis", 0))
    if n.version < 13:
        s = n.attr("split")
        split_sizes, known = (None if s is None else [int(v) for v in s]), True
    elif n.has_input(1):
        split_sizes = entries(n.input(1))
        known = split_sizes is not None
    else:
        split_sizes, known = None, True
    num_outputs = n.attr("num_outputs") if n.version >= 18 else None
    if num_outputs is not None:
        if split_sizes is not None or (n.has_input(1) and not known):
            n.fail("Split", "split and num_outputs cannot both be given", subject="attribute num_outputs",
                   expected="one of them", found="both")
        if int(num_outputs) != k:
            n.fail("Split", "num_outputs must equal the number of outputs", subject="attribute num_outputs",
                   expected=k, found=num_outputs)
    if x.shape is None:
        for i in range(k):
            set_info(n, i, x.elem_type, None)
        return
    r = len(x.shape)
    axis = norm_axis(n, "Split", axis, r)
    d = x.shape[axis]
    if split_sizes is not None:
        if len(split_sizes) != k:
            n.fail("Split", "one split size per output", subject="split", expected=f"{k} sizes",
                   found=split_sizes)
        if all(isinstance(s, int) for s in split_sizes):
            if any(s < 0 for s in split_sizes):
                n.fail("Split", "split sizes must not be negative", subject="split", expected=">= 0 each",
                       found=split_sizes)
            if isinstance(d, int) and sum(split_sizes) != d:
                n.fail("Split", "split sizes must add up to the split dim", subject="split",
                       expected=f"sum {d} (input {shape_text(x.shape)})", found=split_sizes)
        sizes: list[DimLike] = list(split_sizes)
    elif not known:
        sizes = [None] * k
    elif num_outputs is not None:
        if isinstance(d, int) and d < k:
            n.fail("Split", "num_outputs exceeds the split dim", subject="attribute num_outputs",
                   expected=f"<= {d}", found=k)
        chunk = dims.ceildiv(d, k)
        sizes = [chunk] * (k - 1) + [dims.sub(d, dims.mul(chunk, k - 1))]
    else:
        if isinstance(d, int) and d % k:
            n.fail("Split", f"dim {d} does not split evenly into {k} outputs", subject="input input",
                   expected=f"a multiple of {k}", found=f"{d} ({shape_text(x.shape)})")
        sizes = [dims.floordiv(d, k)] * k
    values: list = [None] * k
    if _small(x) and all(isinstance(s, int) for s in sizes):
        cuts = np.cumsum(sizes)[:-1]
        values = np.split(x.value, cuts, axis=axis)
    for i, s in enumerate(sizes):
        shape = list(x.shape)
        shape[axis] = s
        set_info(n, i, x.elem_type, shape, values[i])


# ---------------------------------------------------------------- Slice


def slice_bounds(d: int, start: int, end: int, step: int) -> tuple[int, int]:
    """ONNX's clamped (start, end) for a known dim ``d``."""
    if start < 0:
        start += d
    if end < 0:
        end += d
    if step > 0:
        return clamp(start, 0, d), clamp(end, 0, d)
    return clamp(start, 0, d - 1), clamp(end, -1, d - 1)


def slice_dim(d: DimLike, start: DimLike, end: DimLike, step: int) -> DimLike:
    """Output size of one sliced axis; symbolic where the clamping can be written exactly."""
    if d == 0:
        return 0
    if isinstance(d, int) and isinstance(start, int) and isinstance(end, int):
        s, e = slice_bounds(d, start, end, step)
        if step > 0:
            return max(0, -((s - e) // step))
        return max(0, -((e - s) // -step))
    if d is None or start is None or end is None:
        return None
    if step > 0:
        # start: a nonneg offset "a" from the front, or "d + c" (c < 0) from the back
        if isinstance(start, int) and start >= BIG:
            return 0
        if isinstance(end, int) and end <= -BIG:
            return 0
        end_to_d = (isinstance(end, int) and end >= BIG) or end == d
        if nonneg(start) and not isinstance(start, int) and end_to_d:
            return dims.ceildiv(max0(dims.sub(d, start)), step)
        if isinstance(start, int) and start >= 0:
            if end_to_d:
                return dims.ceildiv(max0(dims.sub(d, start)), step)
            if isinstance(end, int) and end < 0:  # d + end - start
                return dims.ceildiv(max0(dims.sub(dims.add(d, end), start)), step)
            if isinstance(end, int) and end >= 0:  # min(max(d - start, 0), end - start)
                if end <= start:
                    return 0
                return dims.ceildiv(dim_min(max0(dims.sub(d, start)), end - start), step)
            return None
        if isinstance(start, int) and start < 0 and end_to_d:  # min(-start, d)
            return dims.ceildiv(dim_min(-start, d), step)
        return None
    # negative step: only the whole-axis reversal is written symbolically
    if ((isinstance(start, int) and (start >= BIG or start == -1)) and isinstance(end, int) and end <= -BIG):
        return dims.ceildiv(d, -step)
    return None


@register("Slice", 1, 10, 11, 13)
def slice_rule(ctx, n) -> None:
    data, = need(n, "Slice", "data")
    t = data.elem_type
    if n.version < 10:
        starts, ends, axes, steps = n.attr("starts"), n.attr("ends"), n.attr("axes"), None
        starts = None if starts is None else [int(v) for v in starts]
        ends = None if ends is None else [int(v) for v in ends]
        axes_known = True
    else:
        starts, ends = (entries(i) for i in need(n, "Slice", "starts", "ends", at=(1, 2)))
        axes = entries(n.input(3)) if n.has_input(3) else None
        axes_known = axes is not None or not n.has_input(3)
        steps = entries(n.input(4)) if n.has_input(4) else None
        if n.has_input(4) and steps is None:
            starts = None  # unknown steps: only the rank is known
    if data.shape is None:
        set_info(n, 0, t, None)
        return
    r = len(data.shape)
    if starts is None or ends is None or not axes_known:
        out = list(data.shape)
        if axes is not None and axes_known and all(isinstance(a, int) for a in axes):
            for a in norm_axes(n, "Slice", axes, r, "axes"):
                out[a] = None
        else:
            out = [None] * r
        set_info(n, 0, t, out)
        return
    if len(starts) != len(ends):
        n.fail("Slice", "starts and ends must have the same length", subject="ends",
               expected=f"{len(starts)} entries", found=f"{len(ends)}")
    if axes is None:
        axes = list(range(len(starts)))
    if len(axes) != len(starts) or not all(isinstance(a, int) for a in axes):
        n.fail("Slice", "one axis per start", subject="axes", expected=f"{len(starts)} int axes", found=axes)
    axes = norm_axes(n, "Slice", axes, r, "axes")
    if steps is None:
        steps = [1] * len(starts)
    if len(steps) != len(starts):
        n.fail("Slice", "one step per start", subject="steps", expected=f"{len(starts)} entries", found=steps)
    out = list(data.shape)
    concrete = True
    for a, s, e, st in zip(axes, starts, ends, steps):
        if not isinstance(st, int):
            out[a] = None
            concrete = False
            continue
        if st == 0:
            n.fail("Slice", "steps cannot be 0", subject="steps", expected="non-zero steps", found=steps)
        out[a] = slice_dim(data.shape[a], s, e, st)
        concrete = concrete and isinstance(s, int) and isinstance(e, int)
    value = None
    if _small(data) and concrete:
        v = data.value
        for a, s, e, st in zip(axes, starts, ends, steps):
            lo, hi = slice_bounds(v.shape[a], s, e, st)
            v = np.take(v, np.arange(lo, hi, st, dtype=np.int64), axis=a)
        value = tidy(v, t)
    set_info(n, 0, t, out, value)


# ---------------------------------------------------------------- Gather / GatherElements
def _check_indices(n, rule: str, info: TensorInfo, what: str = "input indices") -> None:
    if info.elem_type and info.elem_type not in (TensorProto.INT32, TensorProto.INT64):
        n.report(rule, "indices must be int32 or int64", subject=what, expected="int32 or int64",
                 found=type_text(info.elem_type))


@register("Gather", 1, 11, 13)
def gather(ctx, n) -> None:
    data, idx = need(n, "Gather", "data", "indices")
    _check_indices(n, "Gather", idx)
    t = data.elem_type
    if data.shape is None:
        set_info(n, 0, t, None)
        return
    r = len(data.shape)
    if r < 1:
        n.fail("Gather", "data must have rank >= 1", subject="input data", expected="rank >= 1", found="rank 0")
    axis = norm_axis(n, "Gather", int(n.attr("axis", 0)), r)
    if idx.shape is None:
        set_info(n, 0, t, None)
        return
    out = data.shape[:axis] + idx.shape + data.shape[axis + 1:]
    value = None
    iv = numeric(idx)
    if _small(data) and iv is not None and iv.dtype.kind in "iu" and iv.size <= MAX_VALUE_ELEMS:
        size = data.value.shape[axis]
        picks = iv.reshape(-1).tolist()
        if any(i < -size or i >= size for i in picks):
            n.fail("Gather", "index out of range", subject="input indices", expected=f"indices in [{-size}, {size - 1}]",
                   found=picks)
        if data.value.ndim == 1:  # the shape-arithmetic case: pick entries of a 1-D value
            flat = data.value.tolist()
            value = make_value([flat[i] for i in picks], iv.shape, t)
        else:
            taken = np.take(data.value, np.where(iv < 0, iv + size, iv), axis=axis)
            value = tidy(taken if isinstance(taken, np.ndarray) else np.array(taken, dtype=data.value.dtype), t)
    set_info(n, 0, t, out, value)


@register("GatherElements", 11, 13)
def gather_elements(ctx, n) -> None:
    data, idx = need(n, "GatherElements", "data", "indices")
    _check_indices(n, "GatherElements", idx)
    if data.shape is not None and idx.shape is not None and len(data.shape) != len(idx.shape):
        n.fail("GatherElements", "indices must have the rank of data", subject="input indices",
               expected=f"rank {len(data.shape)}", found=f"rank {len(idx.shape)}")
    if data.shape is not None:
        norm_axis(n, "GatherElements", int(n.attr("axis", 0)), len(data.shape))
    set_info(n, 0, data.elem_type, idx.shape)


# ---------------------------------------------------------------- Expand / Tile / Pad
@register("Expand", 8, 13)
def expand(ctx, n) -> None:
    x, shape_info = need(n, "Expand", "input", "shape")
    target = entries(shape_info)
    if target is None:
        k = rank_only(shape_info)
        if k is None or x.shape is None:
            set_info(n, 0, x.elem_type, None)
            return
        target = [None] * k
    if any(isinstance(d, int) and d < 0 for d in target):
        n.fail("Expand", "shape entries must not be negative", subject="input shape", expected=">= 0 each",
               found=list(target))
    if x.shape is None:
        set_info(n, 0, x.elem_type, None)
        return
    try:
        out = broadcast_shapes([x.shape, target])
    except ValueError:
        n.fail("Expand", "input and shape do not broadcast", subject="input shape",
               expected=f"broadcastable with {shape_text(x.shape)}", found=shape_text(target))
    value = None
    # every dim bounded, not only the product: a 0 beside a huge dim is an empty value numpy cannot make
    if _small(x) and all(isinstance(d, int) and d <= MAX_VALUE_ELEMS for d in out) and product(out) <= MAX_VALUE_ELEMS:
        value = tidy(np.broadcast_to(x.value, out).copy(), x.elem_type)
    set_info(n, 0, x.elem_type, out, value)


@register("Tile", 6, 13)
def tile(ctx, n) -> None:
    x, reps_info = need(n, "Tile", "input", "repeats")
    reps = entries(reps_info)
    if x.shape is None:
        set_info(n, 0, x.elem_type, None)
        return
    r = len(x.shape)
    if reps is None:
        set_info(n, 0, x.elem_type, (None,) * r)
        return
    if len(reps) != r:
        n.fail("Tile", "one repeat per input axis", subject="input repeats", expected=f"{r} entries", found=reps)
    if any(isinstance(k, int) and k < 0 for k in reps):
        n.fail("Tile", "repeats must not be negative", subject="input repeats", expected=">= 0 each", found=reps)
    out = [dims.mul(d, k) for d, k in zip(x.shape, reps)]
    value = None
    if _small(x) and all(isinstance(k, int) for k in reps) and product(out) <= MAX_VALUE_ELEMS:
        value = tidy(np.tile(x.value, reps), x.elem_type)
    set_info(n, 0, x.elem_type, out, value)


@register("Pad", 2, 11, 13, 18, 19, *_LATEST)
def pad(ctx, n) -> None:
    x, = need(n, "Pad", "data")
    t = x.elem_type
    if x.shape is None:
        set_info(n, 0, t, None)
        return
    r = len(x.shape)
    if n.version < 11:
        p = n.attr("pads")
        pads = None if p is None else [int(v) for v in p]
        if pads is None:
            n.fail("Pad", "attribute pads is required", subject="attribute pads", expected="2 * rank ints",
                   found="none")
    else:
        pads = entries(need(n, "Pad", "pads", at=(1,))[0])
    axes: list | None = None
    if n.version >= 18 and n.has_input(3):
        axes = entries(n.input(3))
        if axes is None or not all(isinstance(a, int) for a in axes):
            set_info(n, 0, t, (None,) * r)
            return
    if pads is None:
        set_info(n, 0, t, (None,) * r)
        return
    axes = list(range(r)) if axes is None else norm_axes(n, "Pad", axes, r, "input axes")
    if len(pads) != 2 * len(axes):
        n.fail("Pad", "two pads (begin, end) per padded axis", subject="pads", expected=f"{2 * len(axes)} entries",
               found=f"{len(pads)} {pads}")
    out = list(x.shape)
    k = len(axes)
    for i, a in enumerate(axes):
        d = dims.add(dims.add(out[a], pads[i]), pads[i + k])
        if isinstance(d, int) and d < 0:
            n.fail("Pad", f"axis {a} would have a negative size", subject="pads", expected="sizes >= 0",
                   found=f"{x.shape[a]} + {pads[i]} + {pads[i + k]}")
        out[a] = d
    set_info(n, 0, t, out)


# ---------------------------------------------------------------- Resize
def _present(n, i: int) -> TensorInfo | None:
    """An optional input that is given and not an empty tensor."""
    if not n.has_input(i):
        return None
    info = n.input(i)
    if info.shape is not None and len(info.shape) == 1 and info.shape[0] == 0:
        return None
    return info


def _resize_dim(d: DimLike, scale: float) -> DimLike:
    if isinstance(d, int):
        with np.errstate(all="ignore"):
            v = float(np.float32(d) * np.float32(scale))
        return int(math.floor(v)) if math.isfinite(v) else None
    if d is None:
        return None
    s = float(np.float32(scale))
    if s.is_integer() and s >= 1:
        return dims.mul(d, int(s))
    if s > 0 and (1 / s).is_integer() and float(np.float32(1 / (1 / s))) == s:
        return dims.floordiv(d, int(1 / s))
    return None


@register("Resize", 10, 11, 13, 18, 19)
def resize(ctx, n) -> None:
    x, = need(n, "Resize", "X")
    t = x.elem_type
    if x.shape is None:
        set_info(n, 0, t, None)
        return
    r = len(x.shape)
    if n.version < 11:
        scales_info, sizes_info = need(n, "Resize", "scales", at=(1,))[0], None
    else:
        scales_info, sizes_info = _present(n, 2), _present(n, 3)
    axes = n.attr("axes") if n.version >= 18 else None
    axes = list(range(r)) if axes is None else norm_axes(n, "Resize", [int(a) for a in axes], r, "attribute axes")
    out = list(x.shape)
    if sizes_info is not None:
        if scales_info is not None and n.version >= 11:
            n.fail("Resize", "only one of scales and sizes may be given", subject="inputs",
                   expected="scales or sizes", found="both")
        sizes = entries(sizes_info)
        if sizes is None:
            for a in axes:
                out[a] = None
            set_info(n, 0, t, out)
            return
        if len(sizes) != len(axes):
            n.fail("Resize", "one size per resized axis", subject="input sizes", expected=f"{len(axes)} entries",
                   found=sizes)
        if any(isinstance(v, int) and v < 0 for v in sizes):
            n.fail("Resize", "sizes must not be negative", subject="input sizes", expected=">= 0 each", found=sizes)
        policy = n.attr("keep_aspect_ratio_policy", b"stretch") if n.version >= 18 else b"stretch"
        policy = policy.decode() if isinstance(policy, bytes) else str(policy)
        if policy == "stretch":
            for a, s in zip(axes, sizes):
                out[a] = s
        else:
            ins = [x.shape[a] for a in axes]
            if not all(isinstance(v, int) for v in ins + sizes):
                for a in axes:
                    out[a] = None
            else:
                with np.errstate(all="ignore"):
                    ratios = [np.float32(s) / np.float32(d) for s, d in zip(sizes, ins)]
                    scale = min(ratios) if policy == "not_larger" else max(ratios)
                    for a, d in zip(axes, ins):
                        v = float(np.float32(scale) * np.float32(d))
                        out[a] = int(math.floor(v + 0.5)) if math.isfinite(v) else None
        set_info(n, 0, t, out)
        return
    if scales_info is None:
        n.fail("Resize", "one of scales and sizes is required", subject="inputs", expected="scales or sizes",
               found="neither")
    scales = numeric(scales_info)
    if scales is None:
        for a in axes:
            out[a] = None
        set_info(n, 0, t, out)
        return
    scales = [float(s) for s in scales.reshape(-1)]
    if len(scales) != len(axes):
        n.fail("Resize", "one scale per resized axis", subject="input scales", expected=f"{len(axes)} entries",
               found=scales)
    for a, s in zip(axes, scales):
        if not (0 < s < math.inf):
            n.fail("Resize", "scales must be positive and finite", subject="input scales", expected="> 0",
                   found=scales)
        out[a] = _resize_dim(x.shape[a], s)
    set_info(n, 0, t, out)

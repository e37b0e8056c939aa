"""Index arithmetic the spec expressions' functions of int lists compute at plan time for the
shaders (``divMagic``: snippets/fast_div.wgsl.jinja; ``sliceMap``, ``padMap``, ``tileMap``: the
data-movement maps; ``rowStrides``, ``broadcastStrides``, ``lastNonUnit``, ``convWindows``):
plain integer functions, tested on their own (test_polymorphic_spatial,
test_polymorphic_data_movement, test_polymorphic_indexed). :data:`SPEC_FUNCTIONS` is what
backend_wgpu/expr.py calls them through; each raises ValueError saying what it needs.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from .einsum import einsum_map

U32 = 2 ** 32


def _ints(*lists: Any) -> None:
    if not all(isinstance(s, tuple) and all(type(d) is int for d in s) for s in lists):
        raise ValueError("needs lists of ints")


def last_non_unit(shape: tuple) -> int:
    """``lastNonUnit(shape)``: the innermost dimension of size > 1 (-1: none)."""
    _ints(shape)
    return max((d for d, n in enumerate(shape) if n > 1), default=-1)


def row_strides(shape: tuple) -> tuple:
    """``rowStrides(shape)``: the row-major strides, ``[numel(s, 1), numel(s, 2), ..., 1]``."""
    _ints(shape)
    return tuple(math.prod(shape[d + 1:]) for d in range(len(shape)))


def broadcast_strides(ins: tuple, outs: tuple) -> tuple:
    """``broadcastStrides(in, out)``: ``in``'s row-major strides per axis of the numpy-broadcast
    shape ``out``, 0 where ``in`` has no axis or a 1."""
    _ints(ins, outs)
    if len(ins) > len(outs):
        raise ValueError("needs two lists of ints, the first no longer")
    off = len(outs) - len(ins)
    row = row_strides(ins)
    return tuple(0 if d < off or ins[d - off] == 1 else row[d - off] for d in range(len(outs)))


def div_magic(d: int) -> tuple[int, int]:
    """``divMagic(d)``: ``[m, l]`` with which the shader divides by a runtime ``d`` without a
    division instruction (snippets/fast_div.wgsl.jinja: ``(mulhi(n, m) + n) >> l``), exact for
    every ``n < 2^31`` (Granlund and Montgomery's magic number ``2^32 + m`` for ``l = ceil(log2
    d)``: ``2^(32+l) < (2^32 + m) d <= 2^(32+l) + 2^l``); ``d = 1`` gives ``[1, 0]``, ``d = 0``
    ``[0, 0]`` (a size-0 dimension: no element, nothing divided). ``d`` below 2^31."""
    if d == 0:
        return (0, 0)
    if not 0 < d < 2 ** 31:
        raise ValueError(f"divMagic: {d} is not in [0, 2^31)")
    l = (d - 1).bit_length()
    return ((2 ** 32 * (2 ** l - d)) // d + 1, l)


def slice_map(shape: tuple, starts: tuple, ends: tuple, axes: tuple, steps: tuple) -> tuple:
    """``sliceMap(shape, starts, ends, axes, steps)``: Slice as an affine map from output
    coordinates to the input's flat index, ``[offset, lens, ok, dims, strides]``: per axis the
    clamped start and step as ONNX defines them (negative values count from the end; ``axes``
    ``[]``: the first ones; ``steps`` ``[]``: 1) give ``lens``, the output shape, and
    ``offset`` = sum start * input stride; ``dims`` and ``strides`` are the output's axes with
    every run that the input walks contiguously (an axis' stride is the next one's times its
    length) merged into one (fewer index divisions), strides = step * input stride; offset
    and strides modulo 2^32 (u32 arithmetic that wraps: a negative step is an ordinary value).
    ``ok`` false (and the rest empty) when the parameters are malformed (lengths that differ,
    an axis out of range, a step 0)."""
    _ints(shape, starts, ends, axes, steps)
    r = len(shape)
    bad = (0, (), False, (), ())
    axes = axes if len(axes) else tuple(range(len(starts)))
    if len(ends) != len(starts) or len(axes) != len(starts) or (len(steps) and len(steps) != len(starts)):
        return bad
    begin, step_of, lens = [0] * r, [1] * r, list(shape)
    for i, a in enumerate(axes):
        if not -r <= a < r:
            return bad
        a = a + r if a < 0 else a
        n = shape[a]
        step = steps[i] if len(steps) else 1
        if step == 0:
            return bad
        s0 = starts[i] + n if starts[i] < 0 else starts[i]
        e0 = ends[i] + n if ends[i] < 0 else ends[i]
        if step > 0:
            s1, e1 = min(max(s0, 0), n), min(max(e0, 0), n)
            lens[a] = max((e1 - s1 + step - 1) // step, 0)
        else:
            s1, e1 = min(max(s0, 0), n - 1), min(max(e0, -1), n - 1)
            lens[a] = max((s1 - e1 - step - 1) // (-step), 0)
        begin[a], step_of[a] = s1, step
    ins = [math.prod(shape[d + 1:]) for d in range(r)]
    offset = sum(b * st for b, st in zip(begin, ins)) % 2 ** 32
    dims: list[int] = []
    strides: list[int] = []
    for d in range(r - 1, -1, -1):  # innermost first
        st = step_of[d] * ins[d]
        if dims and st == strides[0] * dims[0]:
            dims[0] *= lens[d]
        else:
            dims.insert(0, lens[d])
            strides.insert(0, st)
    return (offset, tuple(lens), True, tuple(dims), tuple(st % 2 ** 32 for st in strides))


def conv_windows(image: tuple, block: tuple, dilations: tuple, pads: tuple, strides: tuple) -> tuple:
    """The sliding positions of ``block`` over ``image`` per spatial axis (empty ``dilations``,
    ``pads``, ``strides``: 1, 0, 1): Col2Im's block count, a convolution's output size."""
    n = len(image) if isinstance(image, tuple) else -1
    dilations, strides, pads = dilations or (1,) * n, strides or (1,) * n, pads or (0,) * (2 * n)
    lists = (image, block, dilations, pads, strides)
    if not (all(isinstance(s, tuple) and all(type(d) is int for d in s) for s in lists)
            and len(block) == len(dilations) == len(strides) == n and len(pads) == 2 * n
            and min(strides, default=1) >= 1):
        raise ValueError("needs image, block, dilations and strides of one length, pads of twice it, strides >= 1")
    return tuple((image[d] + pads[d] + pads[d + n] - dilations[d] * (block[d] - 1) - 1) // strides[d] + 1
                 for d in range(n))


def same_pad_totals(image: tuple, out: tuple, kernel: tuple, strides: tuple, dilations: tuple) -> tuple:
    """auto_pad SAME_*'s total padding per spatial axis (empty ``strides``, ``dilations``: 1),
    before any clamping: (out - 1) * stride + (kernel - 1) * dilation + 1 - image. A stride beyond
    the window can make it negative, where ONNX leaves the result open and the runtimes part."""
    n = len(image)
    strides, dilations = strides or (1,) * n, dilations or (1,) * n
    if not (len(out) == len(kernel) == len(strides) == len(dilations) == n):
        raise ValueError("needs image, out, kernel, strides and dilations of one length")
    return tuple((out[d] - 1) * strides[d] + (kernel[d] - 1) * dilations[d] + 1 - image[d] for d in range(n))


def pad_map(shape: tuple, pads: tuple, axes: tuple, mode: str) -> tuple:
    """``padMap(shape, pads, axes, mode)``: Pad as a map over the output's axes for the shader,
    ``[ok, lens, dims, ins, begins, strides, padded, wide]``: ``pads`` are ``[begin.., end..]`` over
    ``axes`` (``[]``: every axis; negative axes count from the end), ``lens`` the output shape;
    then per axis of the map (runs of unpadded axes merged into one: fewer index divisions) its
    output length, input length, begin pad modulo 2^32 (a negative pad crops: the shader
    subtracts in wrapping u32 arithmetic), input stride and whether it is padded (plan-time: which
    axes the pads touch); ``wide`` (plan-time) where a reflect / wrap pad reaches beyond one
    period of its axis (the shader then takes the index modulo the period, a division, instead of
    one fold). ``ok`` false (the rest empty) for pads that do not match the axes, an axis out of
    range or repeated, a negative length, or an index at 2^31 or more (the fast division)."""
    _ints(shape, pads, axes)
    r = len(shape)
    axes = axes if len(axes) else tuple(range(r))
    bad = (False, (), (), (), (), (), (), False)
    if len(pads) != 2 * len(axes) or not all(-r <= a < r for a in axes):
        return bad
    norm = [a + r if a < 0 else a for a in axes]
    if len(set(norm)) != len(norm):
        return bad
    begins, ends = [0] * r, [0] * r
    for i, a in enumerate(norm):
        begins[a], ends[a] = pads[i], pads[i + len(norm)]
    lens = [n + b + e for n, b, e in zip(shape, begins, ends)]
    if min(lens, default=0) < 0 or math.prod(lens) >= 2 ** 31 or math.prod(shape) >= 2 ** 31:
        return bad
    padded = [b != 0 or e != 0 for b, e in zip(begins, ends)]
    limit = {"reflect": lambda n: n - 1, "wrap": lambda n: n}.get(mode)
    wide = limit is not None and any(p and max(b, e) > limit(n) for p, b, e, n in zip(padded, begins, ends, shape))
    axes_: list[list[int]] = []  # per axis of the map: output length, input length, begin, stride, padded
    for n, out, begin, st, pad in zip(shape, lens, begins, row_strides(shape), padded):
        if axes_ and not pad and not axes_[-1][4]:  # unpadded after unpadded: one axis (row-major: contiguous)
            axes_[-1][0] *= n
            axes_[-1][1] *= n
            axes_[-1][3] = st
        else:
            axes_.append([out, n, begin % U32, st, pad])
    outs, ins, bs, sts, pad_ = (tuple(ax[k] for ax in axes_) for k in range(5))
    return (True, tuple(lens), outs, ins, bs, sts, tuple(bool(x) for x in pad_), wide)


def tile_map(ins: tuple, outs: tuple) -> tuple:
    """``tileMap(in, out)``: Tile as an affine map over the output's axes, each repeated axis
    split in two, (repeat, input extent): ``[ok, dims, strides, repeats]`` with the repeat's stride 0 (it
    walks nothing), an input extent merged with the next axis' where that one is not repeated (the
    input walks them contiguously: fewer index divisions; which axes repeat is plan-time); ``ok`` false when
    the ranks differ or an output axis is not a multiple of the input's."""
    _ints(ins, outs)
    if len(ins) != len(outs) or any((o % i if i else o) for i, o in zip(ins, outs)):
        return (False, (), (), ())
    dims: list[int] = []
    strides: list[int] = []
    repeats: list[bool] = []
    merge = False  # the previous axis of the map is an input extent (row-major: contiguous with this one)
    for i, o, st in zip(ins, outs, row_strides(ins)):
        rep = o // i if i else 1
        if rep != 1:
            dims.append(rep)
            strides.append(0)
            repeats.append(True)
            merge = False
        if merge:
            dims[-1] *= i
            strides[-1] = st
        else:
            dims.append(i)
            strides.append(st)
            repeats.append(False)
        merge = True
    return (True, tuple(dims), tuple(strides), tuple(repeats))


#: the spec expressions' functions computed here (backend_wgpu/expr.py): name -> function
SPEC_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "lastNonUnit": last_non_unit, "rowStrides": row_strides, "broadcastStrides": broadcast_strides,
    "convWindows": conv_windows, "samePadTotals": same_pad_totals, "sliceMap": slice_map, "padMap": pad_map, "tileMap": tile_map,
    "einsumMap": einsum_map,
}

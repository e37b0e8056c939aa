"""Index arithmetic the spec expressions' ``divMagic`` and ``sliceMap`` functions compute at
plan time for the shaders (snippets/fast_div.wgsl.jinja, the data-movement affine maps): plain
integer functions, tested on their own (test_polymorphic_spatial, test_polymorphic_data_movement).
"""

from __future__ import annotations

import math


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

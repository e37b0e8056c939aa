"""Resize's sampling taps per axis, computed when the node is planned.

Resize (and Upsample) is separable: along each resized axis, output coordinate ``y`` reads a
few input coordinates (the taps) with weights that depend only on ``y``, the axis' sizes, the
scale and the attributes. These per-axis tables (``tap_table``) are plan-time data: the
expression function ``resizeTables`` (:func:`resize_tables`) gives them to the spec, whose
``tables`` intermediate holds them (uploaded once per plan), and the shader
(``resize.wgsl.jinja``) sums ``prod(weights) * x`` over the taps of every resized axis.

The tables are computed here in float64, expression for expression as ``onnx.reference``'s
Resize computes them (``_compute_x_ori``, the coefficient functions and the neighbour window
of ``_interpolate_1d_along_axis``), so that a nearest resize picks exactly the elements the
reference picks, ties and rounding included: float32 arithmetic on the device would move an
``x_ori`` that float64 puts at 1.9999999 onto 2.0 and ``floor`` would pick another pixel.
The reference holds ``cubic_coeff_a`` as a numpy float32, which makes parts of its cubic
coefficient arithmetic float32 (numpy's promotion of a float32 scalar with Python floats):
so does this module, for the same weights.

Resize-10 and Upsample (``legacy``) have no coordinate or nearest mode attributes; there
onnx.reference has no Resize-10 and only integer-scale nearest Upsample, and the behaviour is
onnxruntime's: asymmetric coordinates computed in float32, nearest by truncation when the axis
is upsampled and by ``ceil`` when it is downsampled, clamped to the last pixel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

__all__ = ["AxisTaps", "TapTable", "resize_axes", "resize_tables", "saturated_words", "tap_table"]


@dataclass(frozen=True)
class AxisTaps:
    """The taps of one resized axis: output coordinate ``y`` reads input coordinates
    ``index[y * taps + t]`` with weights ``weight[y * taps + t]`` (nearest: one tap, weight 1,
    or 0 where ``exclude_outside`` removed the chosen pixel); ``outside[y]``: the coordinate
    falls outside the input (tf_crop_and_resize: the output is ``extrapolation_value``)."""

    axis: int
    taps: int
    index: tuple[int, ...]
    weight: tuple[float, ...]
    outside: tuple[bool, ...]


def _nearest(ratio: float, mode: str) -> list[float]:
    if ratio == 1.0:
        return [0.0, 1.0]
    if mode == "round_prefer_floor":
        return [float(ratio <= 0.5), float(ratio > 0.5)]
    if mode == "round_prefer_ceil":
        return [float(ratio < 0.5), float(ratio >= 0.5)]
    if mode == "floor":
        return [1.0, 0.0]
    if mode == "ceil":
        return [0.0, 1.0]
    raise ValueError(f"nearest_mode {mode!r}")


def _cubic(ratio: float, a: float) -> list[float]:
    return [((a * (ratio + 1) - 5 * a) * (ratio + 1) + 8 * a) * (ratio + 1) - 4 * a,
            ((a + 2) * ratio - (a + 3)) * ratio * ratio + 1,
            ((a + 2) * (1 - ratio) - (a + 3)) * (1 - ratio) * (1 - ratio) + 1,
            ((a * ((1 - ratio) + 1) - 5 * a) * ((1 - ratio) + 1) + 8 * a) * ((1 - ratio) + 1) - 4 * a]


def _cubic_antialias(ratio: float, scale: float, a: float) -> list[float]:
    scale = min(scale, 1.0)

    def coeff(x: float) -> float:
        x = abs(x)
        x2 = x * x
        x3 = x * x2
        if x <= 1:
            return (a + 2) * x3 - (a + 3) * x2 + 1
        if x < 2:
            return a * x3 - 5 * a * x2 + 8 * a * x - 4 * a
        return 0.0

    start = int(np.floor(-2 / scale) + 1)
    c = [coeff(scale * (i - ratio)) for i in range(start, 2 - start)]
    return list(np.array(c) / sum(c))  # summed as a list: float32 where `a` made the terms float32


def _linear_antialias(ratio: float, scale: float) -> list[float]:
    scale = min(scale, 1.0)
    start = int(np.floor(-1 / scale) + 1)
    args = (np.arange(start, start + 2 - 2 * start) - ratio) * scale
    c = np.clip(1 - np.abs(args), 0, 1)
    return list(c / sum(c))


def _x_ori(ctm: str, y: np.ndarray, scale: float, in_w: int, out_w: float, out_int: int,
           roi: Sequence[Any] | None) -> tuple[np.ndarray, np.ndarray | None]:
    """onnx.reference's _compute_x_ori, same expressions in the same order."""
    outside = None
    if ctm == "align_corners":
        x = np.zeros(out_int, np.float64) if out_w == 1 else y * (in_w - 1) / (out_w - 1)
    elif ctm == "asymmetric":
        x = y / scale
    elif ctm == "tf_crop_and_resize":
        if out_w == 1:
            x = np.full(out_int, (roi[1] - roi[0]) * (in_w - 1) / 2, np.float64)
        else:
            x = y * (roi[1] - roi[0]) * (in_w - 1) / (out_w - 1)
        x = x + roi[0] * (in_w - 1)
        outside = (x < 0) | (x > in_w - 1)
    elif ctm == "pytorch_half_pixel":
        x = np.full(out_int, -0.5, np.float64) if out_w == 1 else (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel_symmetric":
        adjustment = out_int / out_w
        center = in_w / 2
        offset = center * (1 - adjustment)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(f"coordinate_transformation_mode {ctm!r}")
    return x, outside


def _axis(axis: int, in_w: int, out_int: int, scale: float, roi: Sequence[Any] | None, *, mode: str,
          ctm: str, nearest_mode: str, cubic_a: float, exclude_outside: bool, antialias: bool) -> AxisTaps:
    """onnx.reference's _interpolate_1d_along_axis, as tables."""
    out_w = scale * in_w
    y = np.arange(out_int, dtype=np.float64)
    x, outside = _x_ori(ctm, y, scale, in_w, out_w, out_int, roi)
    x_int = np.floor(x).astype(np.int64)
    ratios = np.where(x == x_int, 1.0, x - x_int)
    if mode == "nearest":
        rows = [_nearest(float(r), nearest_mode) for r in ratios]
    elif mode == "linear":
        rows = [_linear_antialias(float(r), scale) if antialias else [1 - float(r), float(r)] for r in ratios]
    else:
        rows = [_cubic_antialias(float(r), scale, cubic_a) if antialias else _cubic(float(r), cubic_a)
                for r in ratios]
    coeffs = np.array(rows, np.float64).reshape(out_int, -1)
    n = coeffs.shape[1]
    pad = int(np.ceil(n / 2))
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        base = -((n - 1) // 2)
        offset = np.where(frac <= 0.5, base, base + 1)
    idx = (p + offset)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        coeffs = np.where((idx < 0) | (idx >= in_w), 0.0, coeffs)
        total = coeffs.sum(axis=-1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    idx = np.clip(idx, 0, in_w - 1)
    if mode == "nearest":  # the one tap of weight 1 (or the first, of weight 0)
        pick = np.argmax(coeffs, axis=1)
        idx = idx[np.arange(out_int), pick][:, None]
        coeffs = coeffs[np.arange(out_int), pick][:, None]
        n = 1
    out = tuple(bool(o) for o in outside) if outside is not None else (False,) * out_int
    return AxisTaps(axis, n, tuple(int(i) for i in idx.reshape(-1)), tuple(float(w) for w in coeffs.reshape(-1)), out)


def _legacy_axis(axis: int, in_w: int, out_int: int, scale: float, mode: str) -> AxisTaps:
    """onnxruntime's Resize-10 / Upsample: asymmetric coordinates in float32; nearest truncates
    (ceil when the axis shrinks), linear takes the two pixels around the clamped coordinate."""
    s = np.float32(scale)
    x = np.arange(out_int, dtype=np.float32) / s
    if mode == "nearest":
        idx = np.ceil(x) if s < 1 else np.trunc(x)
        idx = np.minimum(idx.astype(np.int64), in_w - 1)
        return AxisTaps(axis, 1, tuple(int(i) for i in idx), (1.0,) * out_int, (False,) * out_int)
    x = np.clip(x, np.float32(0), np.float32(in_w - 1))
    x1 = np.minimum(x.astype(np.int64), in_w - 1)
    x2 = np.minimum(x1 + 1, in_w - 1)
    d1 = np.abs(x - x1.astype(np.float32))
    d2 = np.abs(x - x2.astype(np.float32))
    same = x1 == x2
    w1 = np.where(same, np.float32(0.5), d2)
    w2 = np.where(same, np.float32(0.5), d1)
    idx = np.stack([x1, x2], 1).reshape(-1)
    w = np.stack([w1, w2], 1).reshape(-1)
    return AxisTaps(axis, 2, tuple(int(i) for i in idx), tuple(float(v) for v in w), (False,) * out_int)


def resize_axes(in_shape: Sequence[int], out_shape: Sequence[int], *, mode: str, scales: Sequence[float] = (),
                sizes: Sequence[int] = (), roi: Sequence[float] = (), roi_dtype: str = "float32",
                axes: Sequence[int] = (), coordinate_transformation_mode: str = "half_pixel",
                nearest_mode: str = "round_prefer_floor", cubic_coeff_a: float = -0.75,
                exclude_outside: int = 0, antialias: int = 0, keep_aspect_ratio_policy: str = "stretch",
                legacy: bool = False) -> list[AxisTaps]:
    """The taps of every axis that is not an identity, in axis order (onnx.reference skips an
    axis whose scale is 1 with the same size and a trivial roi: its output equals its input).
    ``scales``/``sizes``/``roi`` are the inputs' contents (``values.<name>``; empty when absent),
    ``out_shape`` the output shape inference gave."""
    r = len(in_shape)
    ax = [a + r if a < 0 else a for a in axes] or list(range(r))
    if legacy:
        return [_legacy_axis(a, in_shape[a], out_shape[a], float(scales[a]), mode)
                for a in range(r) if not (float(scales[a]) == 1.0 and in_shape[a] == out_shape[a])]
    if sizes:
        factors = [1.0] * r
        for i, a in enumerate(ax):
            factors[a] = int(sizes[i]) / in_shape[a]
        if keep_aspect_ratio_policy != "stretch":
            pick = min if keep_aspect_ratio_policy == "not_larger" else max
            s = pick(factors[a] for a in ax)
            factors = [s if a in ax else 1.0 for a in range(r)]
    else:
        factors = [1.0] * r
        for i, a in enumerate(ax):
            factors[a] = float(scales[i])
    rois: list[Any] | None = None
    if len(roi):
        rdt = np.dtype({"float16": np.float16, "float64": np.float64}.get(roi_dtype, np.float32))
        full = [rdt.type(0.0)] * r + [rdt.type(1.0)] * r
        for i, a in enumerate(ax):
            full[a] = rdt.type(roi[i])
            full[r + a] = rdt.type(roi[len(ax) + i])
        rois = full
    out = []
    for a in ax:
        scale = float(factors[a])
        if (math.isclose(scale, 1.0) and out_shape[a] == in_shape[a]
                and (rois is None or (math.isclose(float(rois[a]), 0.0) and math.isclose(float(rois[a + r]), 1.0)))):
            continue
        out.append(_axis(a, in_shape[a], out_shape[a], scale, None if rois is None else [rois[a], rois[a + r]],
                         mode=mode, ctm=coordinate_transformation_mode, nearest_mode=nearest_mode,
                         cubic_a=np.float32(cubic_coeff_a), exclude_outside=bool(exclude_outside),
                         antialias=bool(antialias)))
    return sorted(out, key=lambda t: t.axis)


def saturated_words(value: float, dtype: str) -> list[int]:
    """The lanes of ``value`` as onnx.reference's saturate_cast writes it into ``dtype``
    (integers rounded half to even and clamped), e.g. extrapolation_value."""
    import ml_dtypes  # noqa: PLC0415

    from .packing import device_bits, etype, pack_array  # noqa: PLC0415

    et = etype(dtype)
    v = np.array([value], np.float64)
    if et.kind in ("int", "uint"):
        info = ml_dtypes.iinfo(et.dtype)
        v = np.clip(np.round(v), info.min, info.max)
    words = np.frombuffer(bytes(pack_array(v.astype(et.dtype), et.name)), "<u4")
    bits = device_bits(et)
    return [int(w) for w in words[: bits // 32]] if bits >= 32 else [int(words[0]) & ((1 << bits) - 1)]


@dataclass(frozen=True)
class TapTable:
    """The tables of every resized axis as one row of u32 words (the shader reads them from a
    buffer: a constant array indexed at run time costs a copy per access on some compilers).
    Per axis, offsets of: its input offsets (input coordinate * the axis' stride),
    its weights (float32 bits; absent for nearest unless a weight is 0) and its outside flags
    (absent unless some coordinate is outside)."""

    words: tuple[int, ...]
    index: dict[int, int]
    weight: dict[int, int]
    outside: dict[int, int]


def tap_table(taps: Sequence[AxisTaps], in_shape: Sequence[int], nearest: bool) -> TapTable:
    strides = [math.prod(in_shape[d + 1:]) for d in range(len(in_shape))]
    words: list[int] = []
    index: dict[int, int] = {}
    weight: dict[int, int] = {}
    outside: dict[int, int] = {}
    zero = any(0.0 in t.weight for t in taps)
    for t in taps:
        index[t.axis] = len(words)
        words += [i * strides[t.axis] for i in t.index]
        if not nearest or zero:
            weight[t.axis] = len(words)
            words += np.array(t.weight, np.float32).view(np.uint32).tolist()
        if any(t.outside):
            outside[t.axis] = len(words)
            words += [int(o) for o in t.outside]
    return TapTable(tuple(words), index, weight, outside)



#: the longest resized axis the tables take: 2^24 rows are 128 MiB of float64 coordinates while
#: they are computed, and an output that long is beyond what a kernel binds; longer ones decline
#: (the host runs them, its outputs checked against the memory budget first)
MAX_TABLE_ROWS = 2**24


def resize_tables(in_shape: Sequence[int], out_shape: Sequence[int], mode: str, ctm: str, nearest_mode: str,
                  cubic_a: float, exclude_outside: int, antialias: int, policy: str, axes: Sequence[int],
                  legacy: bool, scales: Sequence[float], sizes: Sequence[int], roi: Sequence[float],
                  roi_dtype: str) -> tuple:
    """The expression function ``resizeTables(...)`` (Resize's and Upsample's derive): the tables of
    every resized axis as plan-time data, and what the main pass's source needs of them, apart:
    ``(axes, offsets, words, word count, ok, taps per output)``, ``axes`` the structure the shader is specialised on (per
    resized axis: (axis, taps, has weights, has outside flags), all ints: constants, in the
    pipeline key), ``offsets`` where its parts start in ``words`` (per resized axis: (index,
    weight, outside), 0 where absent: runtime uniforms), ``words`` the u32 table (the ``data`` of
    the ``tables`` intermediate); ``ok`` is false when the settings give no tables (an unknown
    mode, a size the scales do not give): the spec's when clauses decline those; ``taps per
    output`` the product of the axes' taps, the iterations of one output's tap loops (antialias
    downscales widen the taps with the scale: the spec declines what llvmpipe's loop cap cuts)."""
    if any(int(o) > MAX_TABLE_ROWS for i, o in zip(in_shape, out_shape) if int(o) != int(i)):
        return ((), (), (), 0, False, 0)  # checked before numpy allocates the rows (scales 1e9: 15 GiB)
    try:
        taps = resize_axes(in_shape, out_shape, mode=mode, scales=scales, sizes=sizes, roi=roi, roi_dtype=roi_dtype,
                           axes=axes, coordinate_transformation_mode=ctm, nearest_mode=nearest_mode,
                           cubic_coeff_a=cubic_a, exclude_outside=exclude_outside, antialias=antialias,
                           keep_aspect_ratio_policy=policy, legacy=legacy)
        table = tap_table(taps, in_shape, mode == "nearest")
    except (ValueError, ZeroDivisionError, IndexError, TypeError, OverflowError):
        return ((), (), (), 0, False, 0)
    shape = tuple((t.axis, t.taps, int(t.axis in table.weight), int(t.axis in table.outside)) for t in taps)
    offsets = tuple((table.index[t.axis], table.weight.get(t.axis, 0), table.outside.get(t.axis, 0)) for t in taps)
    return (shape, offsets, tuple(table.words), len(table.words), True, math.prod(t.taps for t in taps))

"""Neural-network operators: MatMul, Gemm, convolutions, pools, normalizations, softmax.

Conv and MatMul shapes come from :mod:`inference.rules.shape_math` (shared with the
quantized QLinearConv/QLinearMatMul rules); ConvTranspose and the ceil-mode pool arithmetic
live here (:func:`pool_output_shape`, :func:`conv_transpose_output_shape`).
"""

from __future__ import annotations

from typing import Sequence

from . import shape_math
from .. import dims
from ..context import TensorInfo
from ..dims import DimLike
from ..registry import register
from ._wm_common import (
    FLOAT, INT64, check_same_type, entries, merge_dim, need, norm_axis, rank_only, shape_problem, shape_text,
)


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _ints(v) -> list[int] | None:
    return None if v is None else [int(x) for x in v]


# ---------------------------------------------------------------- MatMul / Gemm
@register("MatMul", 1, 9, 13)
def matmul(ctx, n) -> None:
    a, b = need(n, "MatMul", "A", "B")
    t = check_same_type(n, "MatMul", (a, b), ("A", "B"))
    try:
        shape = shape_math.matmul_output_shape(a.shape, b.shape)
    except shape_math.ShapeProblem as p:
        shape_problem(n, "MatMul", p)
    n.set_output(0, TensorInfo(t, shape))


def gemm_output_shape(n, rule: str, a_shape, b_shape, trans_a: bool, trans_b: bool) -> tuple | None:
    """(M, N) of a Gemm-like product of rank-2 operands (validates ranks and K)."""
    for name, s in (("A", a_shape), ("B", b_shape)):
        if s is not None and len(s) != 2:
            n.fail(rule, f"input {name} must be a matrix", subject=f"input {name}", expected="rank 2",
                   found=f"rank {len(s)} {shape_text(s)}")
    m = k_a = k_b = nn = None
    if a_shape is not None:
        m, k_a = (a_shape[1], a_shape[0]) if trans_a else (a_shape[0], a_shape[1])
    if b_shape is not None:
        k_b, nn = (b_shape[1], b_shape[0]) if trans_b else (b_shape[0], b_shape[1])
    if shape_math.provably_different(k_a, k_b):
        n.fail(rule, "inner dimensions differ", subject="input B", expected=f"K = {dims.to_text(k_a)}",
               found=f"{dims.to_text(k_b)} (A {shape_text(a_shape)}, B {shape_text(b_shape)}, "
                     f"transA={int(trans_a)}, transB={int(trans_b)})")
    if a_shape is None and b_shape is None:
        return None
    return (m, nn)


@register("Gemm", 1, 6, 7, 9, 11, 13)
def gemm(ctx, n) -> None:
    a, b = need(n, "Gemm", "A", "B")
    c = n.input(2)
    t = check_same_type(n, "Gemm", (a, b, c), ("A", "B", "C"))
    shape = gemm_output_shape(n, "Gemm", a.shape, b.shape, bool(n.attr("transA", 0)), bool(n.attr("transB", 0)))
    if c is not None and c.shape is not None and shape is not None and n.version >= 7:
        if len(c.shape) > 2 or any(
            isinstance(cd, int) and isinstance(od, int) and cd not in (1, od)
            for cd, od in zip(reversed(c.shape), reversed(shape))
        ):
            n.fail("Gemm", "C must broadcast to (M, N)", subject="input C",
                   expected=f"unidirectionally broadcastable to {shape_text(shape)}", found=shape_text(c.shape))
    n.set_output(0, TensorInfo(t, shape))


# ---------------------------------------------------------------- Conv
def conv_attrs(n) -> dict:
    return dict(auto_pad=_text(n.attr("auto_pad", "NOTSET")), pads=n.attr("pads"), strides=n.attr("strides"),
                dilations=n.attr("dilations"), group=int(n.attr("group", 1)), kernel_shape=n.attr("kernel_shape"))


@register("Conv", 1, 11, 22)
def conv(ctx, n) -> None:
    x, w = need(n, "Conv", "X", "W")
    b = n.input(2)
    t = check_same_type(n, "Conv", (x, w, b), ("X", "W", "B"))
    try:
        shape = shape_math.conv_output_shape(x.shape, w.shape, **conv_attrs(n))
    except shape_math.ShapeProblem as p:
        shape_problem(n, "Conv", p)
    if b is not None and b.shape is not None and w.shape is not None and w.shape:
        if len(b.shape) != 1 or shape_math.provably_different(b.shape[0], w.shape[0]):
            n.fail("Conv", "bias must have one entry per output channel", subject="input B",
                   expected=f"[{dims.to_text(w.shape[0])}]", found=shape_text(b.shape))
    n.set_output(0, TensorInfo(t, shape))


def conv_transpose_output_shape(n, rule: str, x_shape, w_shape) -> tuple | None:
    """Output shape of ConvTranspose (output_shape given, or computed from pads/output_padding)."""
    group = int(n.attr("group", 1))
    kernel_shape = _ints(n.attr("kernel_shape"))
    count = None
    for s in (x_shape, w_shape):
        if s is not None:
            if len(s) < 3:
                n.fail(rule, "input must have rank >= 3", subject="input X" if s is x_shape else "input W",
                       expected=">= 3", found=f"rank {len(s)}")
            count = len(s) - 2
    if count is None and kernel_shape is not None:
        count = len(kernel_shape)
    if count is None:
        return None
    if x_shape is not None and w_shape is not None:
        if len(x_shape) != len(w_shape):
            n.fail(rule, "W must have the rank of X", subject="input W", expected=f"rank {len(x_shape)}",
                   found=f"rank {len(w_shape)}")
        if shape_math.provably_different(x_shape[1], w_shape[0]):
            n.fail(rule, "input channels must equal W.shape[0]", subject="input W",
                   expected=dims.to_text(x_shape[1]), found=dims.to_text(w_shape[0]))
    kernel: list[DimLike] = list(kernel_shape) if kernel_shape is not None else \
        (list(w_shape[2:]) if w_shape is not None else [None] * count)
    strides = _ints(n.attr("strides")) or [1] * count
    dilations = _ints(n.attr("dilations")) or [1] * count
    out_pad = _ints(n.attr("output_padding")) or [0] * count
    pads = _ints(n.attr("pads")) or [0] * (2 * count)
    output_shape = _ints(n.attr("output_shape"))
    auto_pad = _text(n.attr("auto_pad", "NOTSET"))
    for name, vals, k in (("strides", strides, count), ("dilations", dilations, count),
                          ("output_padding", out_pad, count), ("pads", pads, 2 * count),
                          ("kernel_shape", kernel, count)):
        if len(vals) != k:
            n.fail(rule, f"{name} needs {k} entries", subject=f"attribute {name}", expected=f"{k} entries",
                   found=vals)
    batch = x_shape[0] if x_shape is not None else None
    c_out = dims.mul(w_shape[1], group) if w_shape is not None else None
    if output_shape is not None:
        spatial = output_shape[-count:] if len(output_shape) >= count else None
        if spatial is None:
            n.fail(rule, "output_shape needs one entry per spatial axis", subject="attribute output_shape",
                   expected=f">= {count} entries", found=output_shape)
        return (batch, c_out, *spatial)
    spatial = []
    for i in range(count):
        d = x_shape[2 + i] if x_shape is not None else None
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            spatial.append(dims.mul(d, strides[i]))
            continue
        pb, pe = (0, 0) if auto_pad == "VALID" else (pads[i], pads[i + count])
        eff = dims.add(dims.mul(dims.sub(kernel[i], 1), dilations[i]), 1)
        out = dims.add(dims.mul(dims.sub(d, 1), strides[i]), dims.add(eff, out_pad[i] - pb - pe))
        spatial.append(out)
    return (batch, c_out, *spatial)


@register("ConvTranspose", 1, 11, 22)
def conv_transpose(ctx, n) -> None:
    x, w = need(n, "ConvTranspose", "X", "W")
    b = n.input(2)
    t = check_same_type(n, "ConvTranspose", (x, w, b), ("X", "W", "B"))
    n.set_output(0, TensorInfo(t, conv_transpose_output_shape(n, "ConvTranspose", x.shape, w.shape)))


# ---------------------------------------------------------------- pools
def pool_dim(in_dim: DimLike, kernel: int, *, auto_pad: str, pad_begin: int, pad_end: int, stride: int,
             dilation: int, ceil_mode: bool, drop_last: bool = True) -> DimLike:
    """Output size of one pooled axis (ONNX's rule, ceil mode included).

    Ceil mode: ``out = ceil((in + pads - eff) / s) + 1``; with ``drop_last`` (MaxPool and
    AveragePool since opset 22) a last window that would start in the end padding is dropped:
    minus one when ``(out - 1) * s >= in + pad_begin``. Before opset 22 onnx's inference does not
    drop it, onnx.reference and onnxruntime do (the rules drop it there for a runtime's pass).
    """
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return dims.ceildiv(in_dim, stride)
    if not ceil_mode:
        return shape_math.conv_spatial_dim(in_dim, kernel, auto_pad=auto_pad, pad_begin=pad_begin,
                                           pad_end=pad_end, stride=stride, dilation=dilation)
    if auto_pad == "VALID":
        pad_begin = pad_end = 0
    eff = (kernel - 1) * dilation + 1
    span = dims.add(in_dim, pad_begin + pad_end - eff)
    if isinstance(in_dim, int):
        out = -(-span // stride) + 1
        if drop_last and (out - 1) * stride >= in_dim + pad_begin:
            out -= 1
        return out
    if in_dim is None:
        return None
    if not drop_last:
        return dims.add(dims.ceildiv(span, stride), 1)
    # (out - 1) * s - span lies in [0, s - 1]: the drop never happens when eff - pad_end > s - 1
    # and always happens when eff - pad_end <= 0; in between it depends on the value.
    if eff - pad_end > stride - 1:
        return dims.add(dims.ceildiv(span, stride), 1)
    if eff - pad_end <= 0:
        return dims.ceildiv(span, stride)
    return None


def pool_output_shape(n, rule: str, x_shape, *, ceil_mode: bool, drop_last: bool = True,
                      use_dilations: bool = True) -> tuple | None:
    kernel = _ints(n.attr("kernel_shape"))
    if kernel is None:
        n.fail(rule, "attribute kernel_shape is required", subject="attribute kernel_shape",
               expected="one size per spatial axis", found="none")
    if x_shape is None:
        return None
    count = len(x_shape) - 2
    if count < 1:
        n.fail(rule, "input must have rank >= 3", subject="input X", expected="rank >= 3 (N, C, spatial...)",
               found=f"rank {len(x_shape)} {shape_text(x_shape)}")
    auto_pad = _text(n.attr("auto_pad", "NOTSET"))
    if auto_pad not in shape_math.AUTO_PADS:
        n.fail(rule, "not a valid padding mode", subject="attribute auto_pad",
               expected="one of " + ", ".join(shape_math.AUTO_PADS), found=auto_pad)
    strides = _ints(n.attr("strides")) or [1] * count
    # as onnx's inference: dilations are read when present from MaxPool-8 / AveragePool-11 on,
    # also where the schema does not define the attribute yet (a valid model has none there)
    dilations = (_ints(n.attr("dilations")) if use_dilations else None) or [1] * count
    pads = _ints(n.attr("pads")) or [0] * (2 * count)
    for name, vals, k in (("kernel_shape", kernel, count), ("strides", strides, count),
                          ("dilations", dilations, count), ("pads", pads, 2 * count)):
        if len(vals) != k:
            n.fail(rule, f"{name} needs {k} entries", subject=f"attribute {name}", expected=f"{k} entries",
                   found=vals)
    for name, vals in (("kernel_shape", kernel), ("strides", strides), ("dilations", dilations)):
        if any(v < 1 for v in vals):
            n.fail(rule, f"{name} must be positive", subject=f"attribute {name}", expected=">= 1 each", found=vals)
    if any(p < 0 for p in pads):
        n.fail(rule, "pads must not be negative", subject="attribute pads", expected=">= 0 each", found=pads)
    spatial = []
    for i in range(count):
        pb, pe = pads[i], pads[i + count]
        eff = (kernel[i] - 1) * dilations[i] + 1
        if pb >= eff or pe >= eff:
            n.fail(rule, "pads must be smaller than the (dilated) kernel", subject="attribute pads",
                   expected=f"< {eff} on axis {i}", found=pads)
        d = x_shape[2 + i]
        if isinstance(d, int) and auto_pad in ("NOTSET", "VALID"):
            padded = d + (pb + pe if auto_pad == "NOTSET" else 0)
            if padded < eff:
                n.fail(rule, "the kernel does not fit in the padded input", subject=f"input X (spatial axis {i})",
                       expected=f"padded size >= {eff}", found=padded)
        spatial.append(pool_dim(d, kernel[i], auto_pad=auto_pad, pad_begin=pb, pad_end=pe, stride=strides[i],
                                dilation=dilations[i], ceil_mode=ceil_mode, drop_last=drop_last))
    return (x_shape[0], x_shape[1], *spatial)


@register("MaxPool", 1, 8, 10, 11, 12, 22)
def max_pool(ctx, n) -> None:
    x, = need(n, "MaxPool", "X")
    if n.attr("storage_order", 0) not in (0, 1):
        n.fail("MaxPool", "storage_order must be 0 or 1", subject="attribute storage_order", expected="0 or 1",
               found=n.attr("storage_order"))
    shape = pool_output_shape(n, "MaxPool", x.shape, ceil_mode=bool(n.attr("ceil_mode", 0)),
                              drop_last=n.version >= 22 or n.ctx.runtime)
    n.set_output(0, TensorInfo(x.elem_type, shape))
    if n.version >= 8 and n.output_name(1):
        n.set_output(1, TensorInfo(INT64, shape))


@register("MaxUnpool", 9, 11, 22)
def max_unpool(ctx, n) -> None:
    """output_shape's values where given (known), else per spatial axis (in - 1) * stride -
    pad_begin - pad_end + kernel (onnx's own inference leaves a given output_shape's dims unknown)."""
    x, _ = need(n, "MaxUnpool", "X", "I")
    if n.has_input(2):
        target = entries(n.input(2))
        k = rank_only(n.input(2)) if target is None else len(target)
        if target is None:
            n.set_output(0, TensorInfo(x.elem_type, None if k is None else tuple(n.fresh_dim(0, a) for a in range(k))))
            return
        if any(isinstance(d, int) and d < 0 for d in target):
            n.fail("MaxUnpool", "output_shape entries must not be negative", subject="input output_shape",
                   expected=">= 0 each", found=list(target))
        n.set_output(0, TensorInfo(x.elem_type, tuple(n.fresh_dim(0, a) if d is None else d for a, d in enumerate(target))))
        return
    kernel = _ints(n.attr("kernel_shape"))
    if kernel is None:
        n.fail("MaxUnpool", "attribute kernel_shape is required", subject="attribute kernel_shape",
               expected="one size per spatial axis", found="none")
    if x.shape is None:
        n.set_output(0, TensorInfo(x.elem_type, None))
        return
    count = len(x.shape) - 2
    strides = _ints(n.attr("strides")) or [1] * count
    pads = _ints(n.attr("pads")) or [0] * (2 * count)
    if count < 1 or len(kernel) != count or len(strides) != count or len(pads) != 2 * count:
        n.fail("MaxUnpool", "kernel_shape, strides and pads need one entry per spatial axis (pads two)",
               subject="attributes", expected=f"rank >= 3 input and {max(count, 1)} spatial axes",
               found=f"X {shape_text(x.shape)}, kernel_shape {kernel}, strides {strides}, pads {pads}")
    spatial = [None if size is None else dims.add(dims.mul(size, strides[d]), kernel[d] - strides[d] - pads[d] - pads[d + count])
               for d, size in enumerate(x.shape[2:])]
    n.set_output(0, TensorInfo(x.elem_type, (x.shape[0], x.shape[1], *spatial)))


@register("AveragePool", 1, 7, 10, 11, 19, 22)
def average_pool(ctx, n) -> None:
    x, = need(n, "AveragePool", "X")
    shape = pool_output_shape(n, "AveragePool", x.shape, ceil_mode=bool(n.attr("ceil_mode", 0)),
                              drop_last=n.version >= 22 or n.ctx.runtime, use_dilations=n.version >= 11)
    n.set_output(0, TensorInfo(x.elem_type, shape))


def global_pool_shape(n, rule: str, x_shape, channels_last: bool = False) -> tuple | None:
    if x_shape is None:
        return None
    if len(x_shape) < 2:
        n.fail(rule, "input must have rank >= 2", subject="input X", expected="rank >= 2 (N, C, ...)",
               found=f"rank {len(x_shape)}")
    if channels_last:
        return (x_shape[0],) + (1,) * (len(x_shape) - 2) + (x_shape[-1],)
    return (x_shape[0], x_shape[1]) + (1,) * (len(x_shape) - 2)


@register("GlobalAveragePool", 1, 22)
def global_average_pool(ctx, n) -> None:
    x, = need(n, "GlobalAveragePool", "X")
    n.set_output(0, TensorInfo(x.elem_type, global_pool_shape(n, "GlobalAveragePool", x.shape)))


@register("GlobalMaxPool", 1, 22)
def global_max_pool(ctx, n) -> None:
    x, = need(n, "GlobalMaxPool", "X")
    n.set_output(0, TensorInfo(x.elem_type, global_pool_shape(n, "GlobalMaxPool", x.shape)))


# ---------------------------------------------------------------- normalizations
def _channels(n, rule: str, x_shape, params: Sequence[tuple[str, TensorInfo]]) -> DimLike:
    c = x_shape[1] if x_shape is not None and len(x_shape) >= 2 else None
    for name, info in params:
        if info is None or info.shape is None:
            continue
        if len(info.shape) != 1:
            # BatchNormalization < 7 with spatial=0 takes per-element params: not checked here
            continue
        if shape_math.provably_different(c, info.shape[0]):
            n.fail(rule, "parameter length must equal the channel count", subject=f"input {name}",
                   expected=f"[{dims.to_text(c)}]", found=shape_text(info.shape))
        c = merge_dim(c, info.shape[0])
    return c


@register("BatchNormalization", 7, 9, 14, 15)
def batch_normalization(ctx, n) -> None:
    names = ("scale", "B", "input_mean", "input_var")
    x, *infos = need(n, "BatchNormalization", "X", *names)
    params = list(zip(names, infos))
    if x.shape is not None and len(x.shape) < 1:
        n.fail("BatchNormalization", "input must have rank >= 1", subject="input X", expected="rank >= 1",
               found="rank 0")
    c = _channels(n, "BatchNormalization", x.shape, params)
    n.set_output(0, TensorInfo(x.elem_type, x.shape))
    if n.version >= 14:
        stat_type = params[2][1].elem_type or (x.elem_type if n.version == 14 else 0)
        for i in (1, 2):
            if n.output_name(i):
                n.set_output(i, TensorInfo(stat_type, (c,)))
    else:
        for i in (1, 2, 3, 4):
            if n.output_name(i):
                n.set_output(i, TensorInfo(x.elem_type, (c,)))


@register("LayerNormalization", 17)
def layer_normalization(ctx, n) -> None:
    x, scale = need(n, "LayerNormalization", "X", "Scale")
    check_same_type(n, "LayerNormalization", (x, scale), ("X", "Scale"))
    stash = int(n.attr("stash_type", FLOAT))
    n.set_output(0, TensorInfo(x.elem_type, x.shape))
    stat_shape = None
    if x.shape is not None:
        r = len(x.shape)
        axis = norm_axis(n, "LayerNormalization", int(n.attr("axis", -1)), r)
        stat_shape = tuple(x.shape[:axis]) + (1,) * (r - axis)
    for i in (1, 2):
        if n.output_name(i):
            n.set_output(i, TensorInfo(stash, stat_shape))


# ---------------------------------------------------------------- softmax
def softmax(ctx, n) -> None:
    x, = need(n, n.node.op_type, "input")
    if x.shape is not None:
        default = -1 if n.version >= 13 else 1
        r = len(x.shape)
        if r:
            norm_axis(n, n.node.op_type, int(n.attr("axis", default)), r)
    n.set_output(0, TensorInfo(x.elem_type, x.shape))


register("Softmax", 1, 11, 13)(softmax)
register("LogSoftmax", 1, 11, 13)(softmax)

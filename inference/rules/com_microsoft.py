"""onnxruntime's quantized contrib operators (domain ``com.microsoft``, since_version 1).

Input orders follow onnxruntime's schemas (``onnxruntime.capi.onnxruntime_pybind11_state
.get_all_operator_schema()``; the QOperator / dynamic / block quantizers in
``onnxruntime.quantization`` build these nodes):

==========================  =================================================================
QuantizeLinear              x, y_scale, y_zero_point?                      -> y (zp type, else uint8)
DequantizeLinear            x, x_scale, x_zero_point?                      -> y (scale type)
QLinearAdd / QLinearMul     A, A_scale, A_zp?, B, B_scale, B_zp?, C_scale, C_zp?  -> C
QLinearConcat               Y_scale, Y_zp, (X_i, X_i_scale, X_i_zp)...     -> Y (Y_zp type)
QLinearGlobalAveragePool    X, x_scale, x_zp, y_scale, y_zp                -> Y
QLinearAveragePool          X, x_scale, x_zp?, y_scale, y_zp?              -> Y
QLinearLeakyRelu/Sigmoid    X, X_scale, X_zp?, Y_scale, Y_zp?              -> Y
QLinearSoftmax              X, X_scale, x_zp?, y_scale, y_zp               -> Y
QLinearReduceMean           data, data_scale, data_zp?, reduced_scale, reduced_zp? -> reduced
QLinearWhere                condition, X, x_scale, x_zp, Y, y_scale, y_zp, z_scale, z_zp -> Z
QGemm                       A, a_scale, a_zp, B, b_scale, b_zp, C?, y_scale?, y_zp? -> Y
DynamicQuantizeMatMul       A, B, b_scale, b_zp?, bias?                    -> Y (A's float type)
MatMulIntegerToFloat        A, B, a_scale, b_scale, a_zp?, b_zp?, bias?    -> Y (scale type)
MatMulNBits                 A, B, scales, zero_points?, g_idx?, bias?      -> Y [..., N] (A's type; scales
                            N * ceil(K / block_size) entries, bias [N])
GatherBlockQuantized        data, indices, scales, zero_points?            -> output (scale type)
Gelu / QuickGelu            X                                              -> Y (X's type and shape)
BiasGelu                    A, B (1-D, A's last dim)                       -> C (A's type and shape)
FastGelu                    X, bias? (1-D, X's last dim)                   -> Y (X's type and shape)
==========================  =================================================================

The Gelu family is not quantized, but onnxruntime's transformer fusions put it between the
quantized MatMuls of the models its tools quantize.

Where a quantized output type has no zero point to come from, the rule uses the first
quantized input's type (onnxruntime's own inference does the same).
"""

from __future__ import annotations

import math

from onnx import TensorProto

from . import shape_math
from .. import dims
from ..context import TensorInfo
from ..registry import register
from ._wm_common import (
    FLOAT, broadcast_shapes, check_same_type, first_type, need, norm_axes, norm_axis, shape_problem, shape_text,
    type_text,
)
from .nn import gemm_output_shape, global_pool_shape, pool_output_shape
from .tensor_ops import concat_shape

MS = "com.microsoft"
UINT8 = TensorProto.UINT8
_QTYPES = frozenset({TensorProto.UINT8, TensorProto.INT8})


def _opt(n, i: int) -> TensorInfo | None:
    return n.input(i) if n.has_input(i) else None


def _check_scale(n, rule: str, info: TensorInfo | None, name: str, expected: int = FLOAT,
                 scalar: bool = True) -> None:
    if info is None:
        return
    if info.elem_type and expected and info.elem_type != expected:
        n.report(rule, f"{name} has the wrong element type", subject=f"input {name}",
                 expected=type_text(expected), found=type_text(info.elem_type))
    if scalar and info.shape is not None and not (len(info.shape) == 0 or info.shape == (1,)):
        n.report(rule, f"{name} must be a scalar (per-tensor quantization)", subject=f"input {name}",
                 expected="a scalar", found=shape_text(info.shape))


def _check_zp(n, rule: str, info: TensorInfo | None, name: str, expected: int, scalar: bool = True) -> None:
    if info is None:
        return
    if info.elem_type and expected and info.elem_type != expected:
        n.report(rule, f"{name} must have the quantized tensor's element type", subject=f"input {name}",
                 expected=type_text(expected), found=type_text(info.elem_type))
    if scalar and info.shape is not None and not (len(info.shape) == 0 or info.shape == (1,)):
        n.report(rule, f"{name} must be a scalar (per-tensor quantization)", subject=f"input {name}",
                 expected="a scalar", found=shape_text(info.shape))


def _check_quantized(n, rule: str, info: TensorInfo, name: str) -> None:
    if info.elem_type and info.elem_type not in _QTYPES:
        n.report(rule, f"{name} must be 8-bit", subject=f"input {name}", expected="uint8 or int8",
                 found=type_text(info.elem_type))


def _check_per_axis(n, rule: str, x: TensorInfo, params, axis) -> None:
    """Scale/zero point: a scalar, or 1-D of x.shape[axis] entries when ``axis`` is given."""
    for name, info in params:
        if info is None or info.shape is None:
            continue
        if len(info.shape) == 0 or info.shape == (1,):
            continue
        if len(info.shape) != 1:
            n.report(rule, f"{name} must be a scalar or 1-D", subject=f"input {name}",
                     expected="rank 0 or 1", found=shape_text(info.shape))
            continue
        if axis is None or x.shape is None:
            continue
        a = norm_axis(n, rule, int(axis), len(x.shape))
        if shape_math.provably_different(info.shape[0], x.shape[a]):
            n.report(rule, f"{name} needs one entry per slice of axis {a}", subject=f"input {name}",
                     expected=f"[{dims.to_text(x.shape[a])}]", found=shape_text(info.shape))


# ---------------------------------------------------------------- Quantize / Dequantize
@register("QuantizeLinear", 1, domain=MS)
def quantize_linear(ctx, n) -> None:
    rule = "QuantizeLinear"
    x, scale = need(n, rule, "x", "y_scale")
    zp = _opt(n, 2)
    if x.elem_type and scale.elem_type and x.elem_type != scale.elem_type:
        n.report(rule, "y_scale must have x's element type", subject="input y_scale", expected=type_text(x.elem_type),
                 found=type_text(scale.elem_type))
    _check_per_axis(n, rule, x, (("y_scale", scale), ("y_zero_point", zp)), n.attr("axis"))
    t = zp.elem_type if zp is not None and zp.elem_type else (0 if zp is not None else UINT8)
    n.set_output(0, TensorInfo(t, x.shape))


@register("DequantizeLinear", 1, domain=MS)
def dequantize_linear(ctx, n) -> None:
    rule = "DequantizeLinear"
    x, scale = need(n, rule, "x", "x_scale")
    zp = _opt(n, 2)
    if zp is not None and zp.elem_type and x.elem_type and zp.elem_type != x.elem_type:
        n.report(rule, "x_zero_point must have x's element type", subject="input x_zero_point",
                 expected=type_text(x.elem_type), found=type_text(zp.elem_type))
    _check_per_axis(n, rule, x, (("x_scale", scale), ("x_zero_point", zp)), n.attr("axis"))
    n.set_output(0, TensorInfo(scale.elem_type, x.shape))


# ---------------------------------------------------------------- binary
def _broadcast(n, rule: str, infos, names) -> tuple | None:
    shapes = [i.shape for i in infos]
    if any(s is None for s in shapes):
        return None
    try:
        return broadcast_shapes(shapes)
    except ValueError:
        n.fail(rule, "inputs do not broadcast", subject=" and ".join(names),
               expected="numpy-broadcastable shapes", found=", ".join(shape_text(s) for s in shapes))
    return None  # pragma: no cover


def qlinear_binary(ctx, n) -> None:
    rule = n.node.op_type
    a, _, b, _, _ = need(n, rule, "A", "A_scale", "B", "B_scale", "C_scale", at=(0, 1, 3, 4, 6))
    c_zp = _opt(n, 7)
    _check_quantized(n, rule, a, "A")
    if a.elem_type and b.elem_type and a.elem_type != b.elem_type:
        n.report(rule, "A and B must have the same element type", subject="input B", expected=type_text(a.elem_type),
                 found=type_text(b.elem_type))
    for i, name in ((1, "A_scale"), (4, "B_scale"), (6, "C_scale")):
        _check_scale(n, rule, _opt(n, i), name)
    for i, name in ((2, "A_zero_point"), (5, "B_zero_point"), (7, "C_zero_point")):
        _check_zp(n, rule, _opt(n, i), name, a.elem_type)
    t = first_type(c_zp, a, b)
    n.set_output(0, TensorInfo(t, _broadcast(n, rule, (a, b), ("A", "B"))))


register("QLinearAdd", 1, domain=MS)(qlinear_binary)
register("QLinearMul", 1, domain=MS)(qlinear_binary)


@register("QLinearWhere", 1, domain=MS)
def qlinear_where(ctx, n) -> None:
    rule = "QLinearWhere"
    cond, x, _, _, y, _, _, _, z_zp = need(n, rule, "condition", "X", "x_scale", "x_zero_point", "Y", "y_scale",
                                           "y_zero_point", "z_scale", "z_zero_point")
    if cond.elem_type and cond.elem_type != TensorProto.BOOL:
        n.report(rule, "condition must be bool", subject="input condition", expected="bool",
                 found=type_text(cond.elem_type))
    _check_quantized(n, rule, x, "X")
    for i, name in ((2, "x_scale"), (5, "y_scale"), (7, "z_scale")):
        _check_scale(n, rule, _opt(n, i), name)
    t = first_type(z_zp, x, y)
    n.set_output(0, TensorInfo(t, _broadcast(n, rule, (cond, x, y), ("condition", "X", "Y"))))


# ---------------------------------------------------------------- Concat
@register("QLinearConcat", 1, domain=MS)
def qlinear_concat(ctx, n) -> None:
    rule = "QLinearConcat"
    count = len(n.node.input)
    if count < 5 or (count - 2) % 3:
        n.fail(rule, "inputs are Y_scale, Y_zero_point, then (tensor, scale, zero point) triples",
               subject="inputs", expected="2 + 3k inputs (k >= 1)", found=f"{count} inputs")
    axis = n.attr("axis")
    if axis is None:
        n.fail(rule, "attribute axis is required", subject="attribute axis", expected="an axis", found="none")
    y_scale, y_zp = need(n, rule, "Y_scale", "Y_zero_point")
    _check_scale(n, rule, y_scale, "Y_scale")
    names = [f"#{i} (X{k})" for k, i in enumerate(range(2, count, 3))]
    tensors = need(n, rule, *names, at=range(2, count, 3))
    t = first_type(y_zp, *tensors)
    for info, name in zip(tensors, names):
        if info.elem_type and t and info.elem_type != t:
            n.report(rule, "every tensor must have the output's quantized type", subject=f"input {name}",
                     expected=type_text(t), found=type_text(info.elem_type))
    n.set_output(0, TensorInfo(t, concat_shape(n, rule, [i.shape for i in tensors], axis, names)))


# ---------------------------------------------------------------- unary / pools / reductions
def qlinear_unary(ctx, n) -> None:
    rule = n.node.op_type
    x, _, _ = need(n, rule, "X", "X_scale", "Y_scale", at=(0, 1, 3))
    _check_quantized(n, rule, x, "X")
    _check_scale(n, rule, _opt(n, 1), "X_scale")
    _check_scale(n, rule, _opt(n, 3), "Y_scale")
    _check_zp(n, rule, _opt(n, 2), "X_zero_point", x.elem_type)
    _check_zp(n, rule, _opt(n, 4), "Y_zero_point", x.elem_type)
    if rule == "QLinearSoftmax" and x.shape:
        norm_axis(n, rule, int(n.attr("axis", -1)), len(x.shape))
    n.set_output(0, TensorInfo(x.elem_type, x.shape))


for _op in ("QLinearLeakyRelu", "QLinearSigmoid", "QLinearSoftmax"):
    register(_op, 1, domain=MS)(qlinear_unary)


@register("QLinearGlobalAveragePool", 1, domain=MS)
def qlinear_global_average_pool(ctx, n) -> None:
    rule = "QLinearGlobalAveragePool"
    x, *_ = need(n, rule, "X", "x_scale", "x_zero_point", "y_scale", "y_zero_point")
    _check_quantized(n, rule, x, "X")
    shape = global_pool_shape(n, rule, x.shape, channels_last=bool(n.attr("channels_last", 0)))
    n.set_output(0, TensorInfo(x.elem_type, shape))


@register("QLinearAveragePool", 1, domain=MS)
def qlinear_average_pool(ctx, n) -> None:
    rule = "QLinearAveragePool"
    x, _, _ = need(n, rule, "X", "x_scale", "y_scale", at=(0, 1, 3))
    _check_quantized(n, rule, x, "X")
    channels_last = bool(n.attr("channels_last", 0))
    shape = x.shape
    if channels_last and shape is not None and len(shape) >= 3:
        shape = (shape[0], shape[-1], *shape[1:-1])
    out = pool_output_shape(n, rule, shape, ceil_mode=bool(n.attr("ceil_mode", 0)))
    if channels_last and out is not None:
        out = (out[0], *out[2:], out[1])
    n.set_output(0, TensorInfo(x.elem_type, out))


@register("QLinearReduceMean", 1, domain=MS)
def qlinear_reduce_mean(ctx, n) -> None:
    rule = "QLinearReduceMean"
    x, _, _ = need(n, rule, "data", "data_scale", "reduced_scale", at=(0, 1, 3))
    _check_quantized(n, rule, x, "data")
    keepdims = bool(n.attr("keepdims", 1))
    axes = n.attr("axes")
    if x.shape is None:
        n.set_output(0, TensorInfo(x.elem_type, None))
        return
    r = len(x.shape)
    reduced = set(range(r)) if not axes else set(norm_axes(n, rule, [int(a) for a in axes], r, "attribute axes"))
    out = [1 if i in reduced else d for i, d in enumerate(x.shape)] if keepdims else \
        [d for i, d in enumerate(x.shape) if i not in reduced]
    n.set_output(0, TensorInfo(x.elem_type, tuple(out)))


# ---------------------------------------------------------------- matrix products
@register("QGemm", 1, domain=MS)
def qgemm(ctx, n) -> None:
    rule = "QGemm"
    a, _, _, b, _, _ = need(n, rule, "A", "a_scale", "a_zero_point", "B", "b_scale", "b_zero_point")
    y_zp = _opt(n, 8)
    _check_quantized(n, rule, a, "A")
    _check_quantized(n, rule, b, "B")
    _check_scale(n, rule, _opt(n, 1), "a_scale")
    _check_scale(n, rule, _opt(n, 4), "b_scale", scalar=False)
    _check_scale(n, rule, _opt(n, 7), "y_scale")
    _check_zp(n, rule, _opt(n, 2), "a_zero_point", a.elem_type)
    _check_zp(n, rule, _opt(n, 5), "b_zero_point", b.elem_type, scalar=False)
    c = _opt(n, 6)
    if c is not None and c.elem_type and c.elem_type != TensorProto.INT32:
        n.report(rule, "C must be int32", subject="input C", expected="int32", found=type_text(c.elem_type))
    if y_zp is not None:
        t = y_zp.elem_type
    else:
        t = FLOAT
    shape = gemm_output_shape(n, rule, a.shape, b.shape, bool(n.attr("transA", 0)), bool(n.attr("transB", 0)))
    n.set_output(0, TensorInfo(t, shape))


def _matmul_shape(n, rule: str, a: TensorInfo, b: TensorInfo):
    try:
        return shape_math.matmul_output_shape(a.shape, b.shape)
    except shape_math.ShapeProblem as p:
        shape_problem(n, rule, p)


@register("DynamicQuantizeMatMul", 1, domain=MS)
def dynamic_quantize_matmul(ctx, n) -> None:
    rule = "DynamicQuantizeMatMul"
    a, b, _ = need(n, rule, "A", "B", "b_scale")
    _check_quantized(n, rule, b, "B")
    _check_scale(n, rule, _opt(n, 2), "b_scale", expected=a.elem_type or FLOAT, scalar=False)
    _check_zp(n, rule, _opt(n, 3), "b_zero_point", b.elem_type, scalar=False)
    n.set_output(0, TensorInfo(a.elem_type or FLOAT, _matmul_shape(n, rule, a, b)))


@register("MatMulIntegerToFloat", 1, domain=MS)
def matmul_integer_to_float(ctx, n) -> None:
    rule = "MatMulIntegerToFloat"
    a, b, a_scale, _ = need(n, rule, "A", "B", "a_scale", "b_scale")
    _check_quantized(n, rule, a, "A")
    _check_quantized(n, rule, b, "B")
    b_scale = _opt(n, 3)
    if b_scale is not None and a_scale.elem_type and b_scale.elem_type and a_scale.elem_type != b_scale.elem_type:
        n.report(rule, "b_scale must have a_scale's element type", subject="input b_scale",
                 expected=type_text(a_scale.elem_type), found=type_text(b_scale.elem_type))
    _check_zp(n, rule, _opt(n, 4), "a_zero_point", a.elem_type, scalar=False)
    _check_zp(n, rule, _opt(n, 5), "b_zero_point", b.elem_type, scalar=False)
    n.set_output(0, TensorInfo(a_scale.elem_type or FLOAT, _matmul_shape(n, rule, a, b)))


@register("MatMulNBits", 1, domain=MS)
def matmul_nbits(ctx, n) -> None:
    rule = "MatMulNBits"
    a, b, _ = need(n, rule, "A", "B", "scales")
    k, nn, block = n.attr("K"), n.attr("N"), n.attr("block_size")
    bits = int(n.attr("bits", 4))
    for name, v in (("K", k), ("N", nn), ("block_size", block)):
        if v is None:
            n.fail(rule, f"attribute {name} is required", subject=f"attribute {name}", expected="an int",
                   found="none")
    k, nn, block = int(k), int(nn), int(block)
    if block < 16 or block & (block - 1):
        n.fail(rule, "block_size must be a power of 2 and >= 16", subject="attribute block_size",
               expected="16, 32, 64, ...", found=block)
    if a.shape is not None:
        if len(a.shape) < 1:
            n.fail(rule, "A must have rank >= 1", subject="input A", expected="rank >= 1", found="rank 0")
        if shape_math.provably_different(a.shape[-1], k):
            n.fail(rule, "A's last dim must equal K", subject="input A", expected=f"[..., {k}]",
                   found=shape_text(a.shape))
    if b.elem_type and b.elem_type != UINT8:
        n.report(rule, "B must be uint8 (packed)", subject="input B", expected="uint8", found=type_text(b.elem_type))
    blocks = -(-k // block)
    blob = block * bits // 8
    if b.shape is not None:
        expected = (nn, blocks, blob)
        if len(b.shape) == 3 and any(shape_math.provably_different(d, e) for d, e in zip(b.shape, expected)):
            n.report(rule, "B must be [N, ceil(K / block_size), block_size * bits / 8]", subject="input B",
                     expected=shape_text(expected), found=shape_text(b.shape))
    scales, bias = _opt(n, 2), _opt(n, 5)
    if scales.shape is not None and all(isinstance(d, int) for d in scales.shape) \
            and math.prod(scales.shape) != nn * blocks:
        n.report(rule, "scales must hold one scale per block of each column", subject="input scales",
                 expected=f"N * ceil(K / block_size) = {nn * blocks} entries ([{nn * blocks}] or [{nn}, {blocks}])",
                 found=shape_text(scales.shape))
    if bias is not None and bias.shape is not None and (
            len(bias.shape) != 1 or shape_math.provably_different(bias.shape[0], nn)):
        n.report(rule, "bias must be 1-D of N entries", subject="input bias", expected=f"[{nn}]",
                 found=shape_text(bias.shape))
    out = None if a.shape is None else (*a.shape[:-1], nn)
    n.set_output(0, TensorInfo(a.elem_type, out))


@register("GatherBlockQuantized", 1, domain=MS)
def gather_block_quantized(ctx, n) -> None:
    rule = "GatherBlockQuantized"
    data, idx, scales = need(n, rule, "data", "indices", "scales")
    bits = int(n.attr("bits", 4))
    block = int(n.attr("block_size", 128))
    if bits not in (4, 8):
        n.fail(rule, "bits must be 4 or 8", subject="attribute bits", expected="4 or 8", found=bits)
    if block < 16 or block & (block - 1):
        n.fail(rule, "block_size must be a power of 2 and >= 16", subject="attribute block_size",
               expected="16, 32, 64, ...", found=block)
    if idx.elem_type and idx.elem_type not in (TensorProto.INT32, TensorProto.INT64):
        n.report(rule, "indices must be int32 or int64", subject="input indices", expected="int32 or int64",
                 found=type_text(idx.elem_type))
    if data.shape is None or idx.shape is None:
        n.set_output(0, TensorInfo(scales.elem_type, None))
        return
    r = len(data.shape)
    gather_axis = norm_axis(n, rule, int(n.attr("gather_axis", 0)), r, "attribute gather_axis")
    quantize_axis = norm_axis(n, rule, int(n.attr("quantize_axis", 1)), r, "attribute quantize_axis")
    unpacked = list(data.shape)
    if data.elem_type == UINT8:
        if quantize_axis != r - 1:
            n.fail(rule, "packed uint8 data must be quantized on its last axis", subject="attribute quantize_axis",
                   expected=r - 1, found=quantize_axis)
        unpacked[-1] = dims.mul(unpacked[-1], 8 // bits)
    if scales.shape is not None:
        expected = list(unpacked)
        expected[quantize_axis] = dims.ceildiv(unpacked[quantize_axis], block)
        if len(scales.shape) != r or any(shape_math.provably_different(s, e) for s, e in zip(scales.shape, expected)):
            n.report(rule, "scales must have data's shape with the quantized axis in blocks", subject="input scales",
                     expected=shape_text(expected), found=shape_text(scales.shape))
    out = (*unpacked[:gather_axis], *idx.shape, *unpacked[gather_axis + 1:])
    n.set_output(0, TensorInfo(scales.elem_type, out))


# ---------------------------------------------------------------- Gelu family
_GELU_TYPES = frozenset({TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.BFLOAT16})


def _gelu_like(n, rule: str, x_name: str, bias_name: str | None = None, bias_required: bool = False) -> None:
    """Y takes X's type and shape; a bias must be 1-D with X's last dim (onnxruntime's kernels)."""
    if bias_required:
        x, bias = need(n, rule, x_name, bias_name)
    else:
        x, = need(n, rule, x_name)
        bias = _opt(n, 1) if bias_name is not None else None
    t = check_same_type(n, rule, [x, bias], [x_name, bias_name or ""])
    if t and t not in _GELU_TYPES:
        n.report(rule, f"{x_name} must be a float type", subject=f"input {x_name}",
                 expected="float16, float, double or bfloat16", found=type_text(t))
    if bias is not None and bias.shape is not None:
        last = x.shape[-1] if x.shape else None
        if len(bias.shape) != 1 or (last is not None and shape_math.provably_different(bias.shape[0], last)):
            n.report(rule, f"{bias_name} must be 1-D with {x_name}'s last dim", subject=f"input {bias_name}",
                     expected=f"[{dims.to_text(last) if last is not None else '?'}]", found=shape_text(bias.shape))
    n.set_output(0, TensorInfo(t, x.shape))


@register("Gelu", 1, domain=MS)
def gelu(ctx, n) -> None:
    _gelu_like(n, "Gelu", "X")


@register("QuickGelu", 1, domain=MS)
def quick_gelu(ctx, n) -> None:
    _gelu_like(n, "QuickGelu", "X")


@register("BiasGelu", 1, domain=MS)
def bias_gelu(ctx, n) -> None:
    _gelu_like(n, "BiasGelu", "A", "B", bias_required=True)


@register("FastGelu", 1, domain=MS)
def fast_gelu(ctx, n) -> None:
    _gelu_like(n, "FastGelu", "X", "bias")

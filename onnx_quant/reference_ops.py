"""An exact host oracle: onnx.reference with every op onnxruntime's quantizer writes.

``reference_evaluator(model)`` is ``onnx.reference.ReferenceEvaluator(model, new_ops=OPS)``:

- ``QuantizeLinear`` / ``DequantizeLinear`` for every opset (onnx 1.23's reference has no
  DequantizeLinear before 19): onnx's newest implementation, whose defaults are the older
  versions' semantics (10: per-tensor; 13: ``axis``; 19: float8, ``saturate``; 21: blocks). An
  integer QuantizeLinear saturates in float before the cast (onnx's casts to int32 first, so
  |x / scale| >= 2^31 wrapped); NaN gives the type's lowest value, as onnxruntime's MLAS does.
- com.microsoft (opset 1): the QLinear element-wise ops, pools, softmax, Concat and Where, QGemm,
  DynamicQuantizeMatMul, MatMulIntegerToFloat, DynamicQuantizeLSTM, FusedMatMul, FusedConv,
  FusedGemm, QuickGelu and Gelu, with onnxruntime 1.32's CPU numerics as docs/kernels.md
  describes them (read from its MLAS sources). Integer products are exact: int64 sums, wrapped
  to int32 as onnxruntime's accumulators wrap; float steps in float32 where onnxruntime computes
  in float32; round half to even; saturation in float before the cast; absent zero points 0.

This oracle is exact where onnxruntime is not: onnxruntime's uint8 x int8 GEMMs saturate pairs
of products at int16 on x86 CPUs with AVX2 and no VNNI; the sums here never saturate.

Agreement with onnxruntime 1.32 (CPU, x86-64 with AVX2, FMA3 and VNNI; ORT_DISABLE_ALL), measured
on one-node models of the generators in tests/onnx_quant/test_reference_ops.py run at larger
counts (the tests assert the same on every case they draw):

- bit for bit, 0 elements differ: QLinearAdd and QLinearMul 0 of 5,242,880 each (80 exhaustive
  256 x 256 operand tables, uint8 and int8, both broadcast orders, tie-prone scales; without
  exact fused multiply-adds 20,531 of QLinearAdd's differ), QLinearSigmoid and QLinearLeakyRelu
  0 of 65,536 each (256 tables of all 256 inputs), QLinearSoftmax 0 of 827,566 (300 cases,
  opsets 11 / 13 / 21, rows up to 3000), QGemm, DynamicQuantizeMatMul and MatMulIntegerToFloat
  0 of 109,081 each, QLinearAveragePool 0 of 364,321, QLinearGlobalAveragePool 0 of 6,278,
  QLinearConcat 0 of 17,404, QLinearWhere 0 of 41,740; Q / DQ of opsets 10-21; whole QOperator
  models from onnxruntime.quantization (with onnx's own QLinearConv). On CPUs without AVX2 / FMA3
  onnxruntime runs other MLAS kernels (the tests allow one step there).
- DynamicQuantizeLSTM as onnxruntime documents it (not a float LSTM over dequantized weights): X
  and every step's [batch, H] state quantized to uint8 by GetQuantizationParameter, exact sums,
  MLAS's scale output processor and onnxruntime's order of gate sums; the sigmoid / tanh are
  numpy's, not MLAS's polynomials: max |diff| 4.8e-7 (tests: 1e-5).
- FusedMatMul, FusedConv, FusedGemm, Gelu, QuickGelu (other summation orders and elementary
  functions): max relative diff 1.8e-7 (tests: 1e-5).

Not supplied: QAttention and QEmbedLayerNormalization (what the quantizer writes for Attention and
EmbedLayerNormalization); onnx.reference names them when a model has them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnx.reference.ops._quant_utils import reshape_input
from onnx.reference.ops.op_conv import _conv_implementation
from onnx.reference.ops.op_dequantize_linear import _CommonDequantizeLinear
from onnx.reference.ops.op_quantize_linear import _QUANT_INTEGER_RANGES, _CommonQuantizeLinear

from onnx_quant.errors import ExecutionError

F32 = np.float32
MS = "com.microsoft"

# ----------------------------------------------------------------------------- numerics

def fma_f32(a, b, c):
    """Exact RN(a * b + c) in float32: the product is exact in float64, the sum is made
    round-to-odd in float64 (TwoSum), which then rounds correctly to float32."""
    a, b, c = (np.asarray(v, F32).astype(np.float64) for v in (a, b, c))
    p = a * b
    s = p + c
    bp = s - c
    e = (p - bp) + (c - (s - bp))
    bits = s.view(np.int64).copy()
    fix = (e != 0) & np.isfinite(s) & ((bits & 1) == 0)
    up = np.sign(e) == np.sign(s)
    bits = np.where(fix & up, bits + 1, np.where(fix & ~up, bits - 1, bits))
    with np.errstate(over="ignore"):
        return bits.view(np.float64).astype(F32)


def _qrange(dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _zp(z) -> int:
    """A zero point's value (absent: 0); a tensor of one element or a scalar."""
    return 0 if z is None else int(np.asarray(z).reshape(-1)[0])


def _f(s) -> F32:
    return F32(np.asarray(s, F32).reshape(-1)[0])


def _i32(acc: np.ndarray) -> np.ndarray:
    """An exact int64 sum wrapped to int32, as onnxruntime's int32 accumulators wrap."""
    return ((acc.astype(np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)


def x86_saturate(v, dtype) -> np.ndarray:
    """cvtps2dq (round half to even; NaN / beyond int32 -> INT_MIN), then saturating packs."""
    lo, hi = _qrange(dtype)
    with np.errstate(invalid="ignore"):
        r = np.rint(np.asarray(v, np.float64))
        r = np.where(np.isfinite(r) & (np.abs(r) < 2**31), r, -2**31)
    return np.clip(r, lo, hi).astype(dtype)


def mlas_quantize(v, scale, zp, dtype) -> np.ndarray:
    """MlasQuantizeLinear: RN(v / scale) clamped in float to [lo - zp, hi - zp] (NaN -> lo - zp),
    round half to even, + zp."""
    lo, hi = _qrange(dtype)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = (np.asarray(v, F32) / F32(scale)).astype(F32)
    q = np.where(np.isnan(q), F32(lo - zp), q)
    q = np.minimum(np.maximum(q, F32(lo - zp)), F32(hi - zp))
    return (np.rint(q).astype(np.int32) + zp).astype(dtype)


def requantize(acc, scale, zp, dtype) -> np.ndarray:
    """MlasRequantizeOutput: RN(f32(acc) * scale) clamped in float, round half to even, + zp."""
    lo, hi = _qrange(dtype)
    v = (np.asarray(acc).astype(F32) * np.asarray(scale, F32)).astype(F32)
    v = np.minimum(np.maximum(v, F32(lo - zp)), F32(hi - zp))
    return (np.rint(v).astype(np.int32) + zp).astype(dtype)


def quantization_parameters(x) -> tuple[F32, int]:
    """onnxruntime's GetQuantizationParameter<uint8> (core/util/qmath.h): the range widened to
    0, scale (max - min) / 255 (1 when max == min), zero point RN(0 - min / scale) clamped to
    [0, 255] and rounded half to even."""
    x = np.asarray(x, F32)
    lo = min(F32(x.min()), F32(0)) if x.size else F32(0)
    hi = max(F32(x.max()), F32(0)) if x.size else F32(0)
    scale = F32(1) if hi == lo else F32(F32(hi - lo) / F32(255))
    zp = F32(F32(0) - F32(lo / scale))
    return scale, int(np.rint(min(max(zp, F32(0)), F32(255))))


# ----------------------------------------------------------------------------- activations

#: name: (default parameters, f(x, *params)), as onnxruntime's fused activations and ONNX's RNN
#: activations define them (alpha then beta; Selu alpha then gamma; Clip min then max)
ACTIVATIONS: dict[str, tuple[tuple[float, ...], Any]] = {
    "relu": ((), lambda x: np.maximum(x, 0)),
    "tanh": ((), np.tanh),
    "sigmoid": ((), lambda x: 1 / (1 + np.exp(-x))),
    "softsign": ((), lambda x: x / (1 + np.abs(x))),
    "softplus": ((), lambda x: np.log1p(np.exp(x))),
    "leakyrelu": ((0.01,), lambda x, a: np.where(x >= 0, x, a * x)),
    "thresholdedrelu": ((1.0,), lambda x, a: np.where(x > a, x, 0)),
    "elu": ((1.0,), lambda x, a: np.where(x >= 0, x, a * (np.exp(x) - 1))),
    "hardsigmoid": ((0.2, 0.5), lambda x, a, b: np.clip(a * x + b, 0, 1)),
    "scaledtanh": ((1.0, 1.0), lambda x, a, b: a * np.tanh(b * x)),
    "affine": ((1.0, 0.0), lambda x, a, b: a * x + b),
    "parametricsoftplus": ((1.0, 1.0), lambda x, a, b: a * np.log1p(np.exp(b * x))),
    "selu": ((1.67326319217681884765625, 1.05070102214813232421875),
             lambda x, a, g: g * np.where(x > 0, x, a * (np.exp(x) - 1))),
    "clip": ((-float("inf"), float("inf")), lambda x, lo, hi: np.clip(x, lo, hi)),
}


def activate(name, x: np.ndarray, params=()) -> np.ndarray:
    """``x`` through the activation ``name`` (case-insensitive; "" / None: identity) with the
    parameters given (None entries and missing ones take the defaults), in x's dtype."""
    if not name:
        return x
    key = (name.decode() if isinstance(name, bytes) else name).lower()
    if key not in ACTIVATIONS:
        raise ExecutionError(f"activation {name!r}: expected one of {sorted(ACTIVATIONS)}")
    defaults, fn = ACTIVATIONS[key]
    params = list(params)[: len(defaults)]
    params = [d if i >= len(params) or params[i] is None else params[i] for i, d in enumerate(defaults)]
    with np.errstate(over="ignore"):
        return np.asarray(fn(x, *(x.dtype.type(p) for p in params)), x.dtype)


# ----------------------------------------------------------------------------- Q / DQ, every opset

def _block(x: np.ndarray, axis: int, block_size: int) -> int:
    """``block_size`` no larger than x's axis: the same blocks (one block covers an axis shorter
    than it), without onnx.reference repeating the scale ``block_size`` times (2^40: TiBs)."""
    if block_size and x.ndim and -x.ndim <= axis < x.ndim:
        return min(int(block_size), max(1, x.shape[axis]))
    return block_size


class QuantizeLinear(OpRun):
    """QuantizeLinear 10-25 (onnx's newest implementation; integer targets saturate in float)."""

    op_domain = ""

    def _run(self, x, y_scale, zero_point=None, axis=1, saturate=1, block_size=0, output_dtype=0, precision=0):
        block_size = _block(x, axis, block_size)
        target = onnx.helper.np_dtype_to_tensor_dtype(zero_point.dtype) if zero_point is not None else (
            output_dtype or onnx.TensorProto.UINT8)
        if target not in _QUANT_INTEGER_RANGES or x.size == 0:
            return _CommonQuantizeLinear._run(self, x, y_scale, zero_point, axis=axis, saturate=saturate,
                                              block_size=block_size, output_dtype=output_dtype or None,
                                              precision=precision or None)
        scale = reshape_input(y_scale, x.shape, axis, block_size)
        if precision:
            dt = onnx.helper.tensor_dtype_to_np_dtype(precision)
            x, scale = x.astype(dt), scale.astype(dt)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            q = np.rint(x / scale).astype(np.float64)
        if zero_point is not None:
            q = q + reshape_input(zero_point, x.shape, axis, block_size).astype(np.float64)
        lo, hi = _QUANT_INTEGER_RANGES[target]
        q = np.clip(np.where(np.isnan(q), lo, q), lo, hi)
        return (q.astype(onnx.helper.tensor_dtype_to_np_dtype(target)),)


class DequantizeLinear(OpRun):
    """DequantizeLinear 10-25 (onnx's newest implementation; onnx 1.23 has none before 19)."""

    op_domain = ""

    def _run(self, x, x_scale, x_zero_point=None, axis=1, block_size=0, output_dtype=0):
        return _CommonDequantizeLinear._run(self, x, x_scale, x_zero_point, axis=axis, block_size=_block(x, axis, block_size),
                                            output_dtype=output_dtype or None)


# ----------------------------------------------------------------------------- com.microsoft

class _MS(OpRun):
    op_domain = MS
    op_schema = None  # no onnx schema: only the node's attributes reach _run (defaults below)


class QLinearAdd(_MS):
    """MlasQLinearAdd (AVX2): C = fma(a, RA, fma(b, RB, ZC - fma(RA, ZA, RN(RB ZB)))) with RA =
    RN(A_scale / C_scale), RB likewise, in the operand order onnxruntime's broadcast loop hands
    MLAS (A and B swapped when A repeats along the innermost output dim of size > 1, or the
    output has one element), then cvtps2dq and saturating packs."""

    def _run(self, a, sa, za=None, b=None, sb=None, zb=None, sc=None, zc=None):
        shape = np.broadcast_shapes(a.shape, b.shape)
        ash = (1,) * (len(shape) - a.ndim) + a.shape
        big = [d for d in range(len(shape)) if shape[d] > 1]
        av, bv = np.broadcast_to(a.reshape(ash), shape), np.broadcast_to(b, shape)
        sa, za, sb, zb = _f(sa), _zp(za), _f(sb), _zp(zb)
        if not big or ash[big[-1]] == 1:
            av, sa, za, bv, sb, zb = bv, sb, zb, av, sa, za
        ra, rb = F32(sa / _f(sc)), F32(sb / _f(sc))
        fixed = F32(F32(_zp(zc)) - fma_f32(ra, F32(za), F32(rb * F32(zb))))
        return (x86_saturate(fma_f32(av.astype(F32), ra, fma_f32(bv.astype(F32), rb, fixed)), a.dtype),)


class QLinearMul(_MS):
    """MlasQLinearMul (SSE2): RN(RN(f32((a - ZA)(b - ZB)) RN(RN(A_scale B_scale) / C_scale)) + ZC)."""

    def _run(self, a, sa, za=None, b=None, sb=None, zb=None, sc=None, zc=None):
        ratio = F32(F32(_f(sa) * _f(sb)) / _f(sc))
        prod = (a.astype(np.int32) - _zp(za)) * (b.astype(np.int32) - _zp(zb))
        return (x86_saturate(((prod.astype(F32) * ratio).astype(F32) + F32(_zp(zc))).astype(F32), a.dtype),)


_LOGISTIC = {k: F32(v) for k, v in dict(
    a9=4.37031012579801e-11, a7=1.15627324459942e-07, a5=6.08574864600143e-05, a3=8.51377133304701e-03,
    a1=2.48287947061529e-01, b10=6.10247389755681e-13, b8=5.76102136993427e-09, b6=6.29106785017040e-06,
    b4=1.70198817374094e-03, b2=1.16817656904453e-01, b0=9.93151921023180e-01).items()}


def mlas_logistic(x) -> np.ndarray:
    """MlasComputeLogisticF32KernelFma3: clamp to +-18, p and q polynomials in x^2 by fused
    multiply-adds, x p, p / q + 0.5, max 0 (all float32)."""
    c = _LOGISTIC
    x = np.minimum(np.maximum(np.asarray(x, F32), F32(-18)), F32(18)).astype(F32)
    x2 = (x * x).astype(F32)
    p = fma_f32(x2, c["a9"], c["a7"])
    for k in ("a5", "a3", "a1"):
        p = fma_f32(x2, p, c[k])
    q = fma_f32(x2, c["b10"], c["b8"])
    for k in ("b6", "b4", "b2", "b0"):
        q = fma_f32(x2, q, c[k])
    return np.maximum(((x * p).astype(F32) / q).astype(F32) + F32(0.5), F32(0)).astype(F32)


class _LookupTable(_MS):
    """onnxruntime's 256-entry table (QlinearBuildLookupTable): v = RN(X_scale (x - X_zp)), the
    subclass's ``function(v, **attributes)``, MlasQuantizeLinear with Y's parameters; the input's
    bytes index it."""

    def _run(self, x, xs, xz=None, ys=None, yz=None, **attrs):
        codes = np.arange(256, dtype=np.uint8).view(x.dtype)
        v = (_f(xs) * (codes.astype(np.int32) - _zp(xz)).astype(F32)).astype(F32)
        table = mlas_quantize(self.function(v, **attrs), _f(ys), _zp(yz), x.dtype)
        return (table[x.view(np.uint8)],)


class QLinearSigmoid(_LookupTable):
    @staticmethod
    def function(v):
        return mlas_logistic(v)


class QLinearLeakyRelu(_LookupTable):
    @staticmethod
    def function(v, alpha=0.01):
        return np.where(v >= 0, v, (F32(alpha) * v).astype(F32)).astype(F32)


class QLinearSoftmax(_MS):
    """onnxruntime's QLinearSoftmax: a 256-entry table exp((d - 255 + bias) X_scale) by d = x -
    row max + 255 (float64, bias from logf(FLT_MAX / D)), the row's float32 sum in row order,
    RN(RN(t RN(1 / sum)) floor(1 / Y_scale)), round half to even, + Y_zp, saturated. Before
    opset 13 the input is coerced to 2-D at ``axis``; ``axis`` defaults to -1 in every opset."""

    def _run(self, x, xs, xz=None, ys=None, yz=None, axis=-1, opset=13):
        ax = axis % x.ndim
        if opset < 13:
            rows = x.reshape(int(np.prod(x.shape[:ax], dtype=np.int64)), -1)
        else:
            rows = np.moveaxis(x, ax, -1).reshape(-1, x.shape[ax])
        d = rows.shape[1]
        if rows.size == 0:
            return (np.empty_like(x),)
        xscale = float(_f(xs))
        limit = float(F32(math.log(float(F32(np.finfo(F32).max / F32(d))))))
        shift = max(0.0, limit - 5.0) / xscale
        with np.errstate(under="ignore"):
            table = np.exp((np.arange(256, dtype=np.float64) - 255 + shift) * xscale).astype(F32)
        v = rows.astype(np.int64)
        t = table[v - v.max(axis=1, keepdims=True) + 255]
        inv = (F32(1) / np.cumsum(t, axis=1, dtype=F32)[:, -1:]).astype(F32)
        q = ((t * inv).astype(F32) * F32(np.floor(F32(1) / _f(ys)))).astype(F32)
        lo, hi = _qrange(x.dtype)
        out = np.clip(np.rint(q.astype(np.float64)) + _zp(yz), lo, hi).astype(x.dtype)
        if opset < 13:
            return (out.reshape(x.shape),)
        return (np.moveaxis(out.reshape(np.moveaxis(x, ax, -1).shape), -1, ax),)


def _requantized(x, s, z, yscale, yzp, dtype) -> np.ndarray:
    """onnxruntime's identity table (MlasQuantizeLinear of RN(X_scale (x - X_zp))); equal
    parameters copy x."""
    if _f(s) == yscale and _zp(z) == yzp:
        return x.astype(dtype)
    return mlas_quantize((_f(s) * (x.astype(np.int32) - _zp(z)).astype(F32)).astype(F32), yscale, yzp, dtype)


class QLinearConcat(_MS):
    """Each input requantized to Y's parameters (_requantized), then concatenated."""

    def _run(self, ys, yz, *inputs, axis=None):
        dtype = np.asarray(yz).dtype
        return (np.concatenate([_requantized(x, s, z, _f(ys), _zp(yz), dtype)
                                for x, s, z in zip(inputs[0::3], inputs[1::3], inputs[2::3])], axis=axis),)


class QLinearWhere(_MS):
    """where(condition, X, Y), each requantized to Z's parameters (_requantized), broadcast."""

    def _run(self, cond, x, xs, xz, y, ys, yz, zs, zz):
        dtype = np.asarray(zz).dtype
        return (np.where(cond, _requantized(x, xs, xz, _f(zs), _zp(zz), dtype),
                         _requantized(y, ys, yz, _f(zs), _zp(zz), dtype)),)


def qlinear_global_average(x, xs, xz, ys, yz, axes) -> np.ndarray:
    """MlasQLinearGlobalAveragePool: the integer sum - X_zp n over ``axes`` (kept), then
    MlasRequantizeOutput with RN(X_scale / RN(Y_scale n))."""
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    acc = x.astype(np.int64).sum(axis=axes, keepdims=True) - _zp(xz) * n
    return requantize(acc, F32(_f(xs) / F32(_f(ys) * F32(n))), _zp(yz), x.dtype)


class QLinearGlobalAveragePool(_MS):
    def _run(self, x, xs, xz=None, ys=None, yz=None, channels_last=0):
        axes = tuple(range(1, x.ndim - 1)) if channels_last else tuple(range(2, x.ndim))
        return (qlinear_global_average(x, xs, xz, ys, yz, axes),)


def pool_geometry(size, k, s, pads, auto_pad, ceil_mode) -> tuple[int, int]:
    """(output length, padding at the start) of one spatial axis, as onnxruntime's pools."""
    begin, end = pads
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = -(-size // s)
        total = max(0, (out - 1) * s + k - size)
        begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        return out, begin
    if auto_pad == "VALID":
        return (size - k) // s + 1, 0
    span = size + begin + end - k
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + begin:
        out -= 1
    return out, begin


class QLinearAveragePool(_MS):
    """onnxruntime's QLinearAveragePool: the dequantized values RN(X_scale (x - X_zp)) summed in
    float32 in window order over the window's positions inside the input, divided by their
    count (count_include_pad: by the kernel volume), static_cast<int32>(nearbyint(y / Y_scale +
    Y_zp)) saturated. A window equal to the whole unpadded image takes the integer global path."""

    def _run(self, x, xs, xz=None, ys=None, yz=None, kernel_shape=None, pads=None, strides=None,
             auto_pad="NOTSET", count_include_pad=0, ceil_mode=0, channels_last=0):
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        if channels_last:
            x = np.moveaxis(x, -1, 1)
        k, nd = list(kernel_shape), len(kernel_shape)
        strides = list(strides or [1] * nd)
        pads = list(pads or [0] * (2 * nd))
        sizes = x.shape[2:]
        geo = [pool_geometry(sizes[i], k[i], strides[i], (pads[i], pads[i + nd]), auto_pad, ceil_mode)
               for i in range(nd)]
        outs = [o for o, _ in geo]
        ends = [max(0, (o - 1) * s + kk - n - b) for (o, b), s, kk, n in zip(geo, strides, k, sizes)]
        if list(sizes) == k and not any(b for _, b in geo) and not any(ends):
            y = qlinear_global_average(x, xs, xz, ys, yz, tuple(range(2, x.ndim)))
        else:
            xd = (_f(xs) * (x.astype(np.int32) - _zp(xz)).astype(F32)).astype(F32)
            padded = np.pad(xd, [(0, 0), (0, 0)] + [(b, e) for (_, b), e in zip(geo, ends)])
            acc = np.zeros(x.shape[:2] + tuple(outs), F32)
            for off in np.ndindex(*k):  # window order: onnxruntime's loops, last axis innermost
                acc = acc + padded[(slice(None), slice(None)) + tuple(
                    slice(o, o + (n - 1) * s + 1, s) for o, n, s in zip(off, outs, strides))]
            if count_include_pad:
                count = np.full(outs, F32(np.prod(k)))
            else:
                count = np.ones(outs, F32)
                for i, ((o, b), s, kk, n) in enumerate(zip(geo, strides, k, sizes)):
                    start = np.arange(o) * s - b
                    c = (np.minimum(start + kk, n) - np.maximum(start, 0)).astype(F32)
                    count = count * c.reshape([-1 if j == i else 1 for j in range(nd)])
            y = ((acc / count).astype(F32) / _f(ys)).astype(F32) + F32(_zp(yz))
            y = x86_saturate(y, x.dtype)
        return (np.moveaxis(y, 1, -1) if channels_last else y,)


def _matmul_i64(a, az, b, bz) -> np.ndarray:
    """Exact sum of (a - az)(b - bz): int64, wrapped to int32. bz: absent, a scalar or per column."""
    bz = np.zeros((), np.int64) if bz is None else np.asarray(bz).astype(np.int64)
    return _i32(np.matmul(a.astype(np.int64) - az, b.astype(np.int64) - bz))


def _scale_bias_output(acc, multiplier, bias) -> np.ndarray:
    """MLAS's scale-bias output processor: RN(RN(f32(acc) multiplier) + bias)."""
    y = (acc.astype(multiplier.dtype) * multiplier).astype(multiplier.dtype)
    return y if bias is None else (y + bias).astype(multiplier.dtype)


class QGemm(_MS):
    """acc = (A' - a_zp)(B' - b_zp) (+ C, int32), multiplier RN(RN(alpha a_scale) b_scale) (/ y_scale);
    no y_scale: RN(f32(acc) multiplier) float32; else MlasRequantizeOutput to y_zp's type."""

    def _run(self, a, sa, za, b, sb, zb, c=None, ys=None, yz=None, alpha=1.0, transA=0, transB=0):
        a, b = (a.T if transA else a), (b.T if transB else b)
        acc = _matmul_i64(a, _zp(za), b, None if zb is None else np.asarray(zb).reshape(-1))
        if c is not None:
            acc = _i32(acc.astype(np.int64) + c.astype(np.int64))
        m = (F32(F32(alpha) * _f(sa)) * np.asarray(sb, F32).reshape(-1)).astype(F32)
        if ys is None:
            return ((acc.astype(F32) * m).astype(F32),)
        m = (m / _f(ys)).astype(F32)
        return (requantize(acc, m, _zp(yz), np.uint8 if yz is None else np.asarray(yz).dtype),)


class MatMulIntegerToFloat(_MS):
    """RN(RN(f32(sum (a - a_zp)(b - b_zp)) RN(a_scale b_scale)) + bias) in the scales' type."""

    def _run(self, a, b, sa, sb, za=None, zb=None, bias=None):
        acc = _matmul_i64(a, _zp(za), b, zb)
        m = (np.asarray(sa).reshape(-1)[0] * np.asarray(sb)).astype(np.asarray(sa).dtype)
        return (_scale_bias_output(acc, m, bias),)


class DynamicQuantizeMatMul(_MS):
    """A quantized to uint8 with GetQuantizationParameter and MlasQuantizeLinear, then as
    MatMulIntegerToFloat with a_scale, a_zp."""

    def _run(self, a, b, sb, zb=None, bias=None):
        scale, zp = quantization_parameters(a)
        acc = _matmul_i64(mlas_quantize(a, scale, zp, np.uint8), zp, b, zb)
        return (_scale_bias_output(acc, (scale * np.asarray(sb, F32)).astype(F32), bias),)


def _rnn_activations(names, alphas, betas, directions: int, defaults=("Sigmoid", "Tanh", "Tanh")):
    """Per direction, the LSTM's (f, g, h) as callables; alpha / beta consumed in order by the
    activations that take them (ONNX's RNN rule)."""
    names = [n.decode() if isinstance(n, bytes) else n for n in (names or list(defaults) * directions)]
    alphas, betas = list(alphas or []), list(betas or [])
    out = []
    for name in names:
        n_params = len(ACTIVATIONS.get(name.lower(), ((),))[0])
        params = [alphas.pop(0) if n_params > 0 and alphas else None,
                  betas.pop(0) if n_params > 1 and betas else None]
        out.append(lambda x, name=name, params=params: activate(name, x, params))
    return [out[3 * d: 3 * d + 3] for d in range(directions)]


class DynamicQuantizeLSTM(_MS):
    """onnxruntime's DynamicQuantizeLSTM (docs/kernels.md), not a float LSTM over dequantized
    weights: X (its first max(sequence_lens) steps, every batch) and, every step, the whole
    [batch, H] state quantized to uint8 by GetQuantizationParameter; exact sums of (q - zp)(w -
    w_zp) with the direction's first weight zero point; a gate's input RN(RN(f32(acc_h)
    RN(h_scale r_scale)) + RN(f32(acc_x) RN(x_scale w_scale))), + RN(P c), + RN(Wb + Rb), clipped;
    gates i, o, f, c. A finished sequence's state row enters the next range as 0 when Y is an
    output, as its last state otherwise; a sequence of length 0 has Y_h = Y_c = 0."""

    def _run(self, X, W, R, B=None, seq_lens=None, h0=None, c0=None, P=None, ws=None, wz=None, rs=None, rz=None,
             hidden_size=None, direction="forward", activations=None, activation_alpha=None, activation_beta=None,
             clip=None, input_forget=0):
        direction = direction.decode() if isinstance(direction, bytes) else direction
        S, N, _ = X.shape
        D, H = W.shape[0], R.shape[1]
        G = 4 * H
        lens = np.full(N, S, np.int64) if seq_lens is None else np.clip(seq_lens.astype(np.int64), 0, S)
        acts = _rnn_activations(activations, activation_alpha, activation_beta, D)
        max_len = int(lens.max(initial=0))
        xs, xzp = quantization_parameters(X[:max_len])
        xq = mlas_quantize(X, xs, xzp, np.uint8).astype(np.int64) - xzp
        y_is_output = len(self.onnx_node.output) > 0 and self.onnx_node.output[0] != ""
        Y = np.zeros((S, D, N, H), F32)
        Yh, Yc = np.zeros((D, N, H), F32), np.zeros((D, N, H), F32)
        rows = np.arange(N)
        for d in range(D):
            f, g, h_act = acts[d]
            reverse = direction == "reverse" or d == 1
            wcol = np.broadcast_to(np.asarray(ws, F32).reshape(D, -1)[d], (G,))
            rcol = np.broadcast_to(np.asarray(rs, F32).reshape(D, -1)[d], (G,))
            Wd = W[d].astype(np.int64) - int(np.asarray(wz).reshape(D, -1)[d, 0])
            Rd = R[d].astype(np.int64) - int(np.asarray(rz).reshape(D, -1)[d, 0])
            bias = np.zeros(G, F32) if B is None else (B[d, :G] + B[d, G:]).astype(F32)
            pi, po, pf = (None,) * 3 if P is None else np.split(P[d].astype(F32), 3)
            h = np.zeros((N, H), F32) if h0 is None else h0[d].astype(F32)
            c = np.zeros((N, H), F32) if c0 is None else c0[d].astype(F32)
            h_prev = h
            mx = (xs * wcol).astype(F32)

            def gate(k, pre, peep=None, cell=None):
                v = pre[:, k * H:(k + 1) * H]
                if peep is not None:
                    v = (v + (peep * cell).astype(F32)).astype(F32)
                v = (v + bias[k * H:(k + 1) * H]).astype(F32)
                return v if clip is None else np.clip(v, F32(-clip), F32(clip))

            for step in range(S):
                hs, hzp = quantization_parameters(h_prev)
                hq = mlas_quantize(h_prev, hs, hzp, np.uint8).astype(np.int64) - hzp
                run = step < lens
                t = np.where(reverse & run, lens - 1 - step, step)
                ax = _i32(xq[t, rows] @ Wd).astype(F32)
                ah = _i32(hq @ Rd).astype(F32)
                pre = ((ah * (hs * rcol).astype(F32)).astype(F32) + (ax * mx).astype(F32)).astype(F32)
                gi = f(gate(0, pre, pi, c))
                gf = (F32(1) - gi).astype(F32) if input_forget else f(gate(2, pre, pf, c))
                cn = (gf * c + gi * g(gate(3, pre))).astype(F32)
                hn = (f(gate(1, pre, po, cn)) * h_act(cn)).astype(F32)
                live = run[:, None]
                h, c = np.where(live, hn, h), np.where(live, cn, c)
                Y[t[run], d, rows[run]] = hn[run]
                h_prev = np.where(live, h, F32(0)) if y_is_output else h
            alive = (lens > 0)[:, None]
            Yh[d], Yc[d] = np.where(alive, h, F32(0)), np.where(alive, c, F32(0))
        return Y, Yh, Yc


def _batch_transposed(x, trans: int, trans_batch: int) -> np.ndarray:
    if trans_batch and x.ndim > 2:
        x = np.moveaxis(x, 0, -2)
    return np.swapaxes(x, -1, -2) if trans and x.ndim >= 2 else x


class FusedMatMul(_MS):
    """alpha op(A) op(B): op transposes the last two axes (transA/B) after moving axis 0 before
    the last one (transBatchA/B)."""

    def _run(self, a, b, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
        y = np.matmul(_batch_transposed(a, transA, transBatchA), _batch_transposed(b, transB, transBatchB))
        return ((y * a.dtype.type(alpha)).astype(a.dtype),)


class FusedConv(_MS):
    """activation(Conv(X, W, B) + Z); activation_params: LeakyRelu [alpha], Clip [min, max],
    HardSigmoid [alpha, beta]."""

    def _run(self, x, w, b=None, z=None, activation=None, activation_params=None, auto_pad="NOTSET",
             dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        y = _conv_implementation(x, w, b, auto_pad, dilations, group, kernel_shape, pads, strides).astype(x.dtype)
        if z is not None:
            y = (y + z).astype(x.dtype)
        return (activate(activation, y, activation_params or ()),)


class FusedGemm(_MS):
    """activation(alpha A' B' + beta C) with activation_alpha / beta / gamma (Selu: alpha, gamma)."""

    def _run(self, a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0, activation=None,
             activation_alpha=None, activation_beta=None, activation_gamma=None):
        y = (a.T if transA else a) @ (b.T if transB else b) * a.dtype.type(alpha)
        if c is not None:
            y = y + a.dtype.type(beta) * c
        name = (activation.decode() if isinstance(activation, bytes) else activation) or ""
        params = (activation_alpha, activation_gamma if name.lower() == "selu" else activation_beta)
        return (activate(name, y.astype(a.dtype), params),)


class QuickGelu(_MS):
    """x sigmoid(alpha x)."""

    def _run(self, x, alpha=1.702):
        with np.errstate(over="ignore"):
            return ((x / (1 + np.exp(-x.dtype.type(alpha) * x))).astype(x.dtype),)


class Gelu(_MS):
    """x (1 + erf(x / sqrt 2)) / 2, in float64."""

    _erf = np.vectorize(math.erf, otypes=[np.float64])

    def _run(self, x):
        v = x.astype(np.float64)
        return ((0.5 * v * (1 + self._erf(v / math.sqrt(2)))).astype(x.dtype),)


OPS: list[type[OpRun]] = [
    QuantizeLinear, DequantizeLinear, QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax,
    QLinearConcat, QLinearWhere, QLinearGlobalAveragePool, QLinearAveragePool, QGemm, DynamicQuantizeMatMul,
    MatMulIntegerToFloat, DynamicQuantizeLSTM, FusedMatMul, FusedConv, FusedGemm, QuickGelu, Gelu,
]


def reference_evaluator(model, **kwargs) -> ReferenceEvaluator:
    """``onnx.reference.ReferenceEvaluator(model, new_ops=OPS, **kwargs)``; a caller's own
    ``new_ops`` come first (the first class registered for an op wins)."""
    new_ops = list(kwargs.pop("new_ops", None) or []) + OPS
    return ReferenceEvaluator(model, new_ops=new_ops, **kwargs)

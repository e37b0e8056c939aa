"""com.microsoft quantized kernels on the GPU, bit for bit with onnxruntime's CPU kernels.

Kernels: QLinearAdd, QLinearMul, QLinearLeakyRelu, QLinearSigmoid, QLinearConcat,
QLinearGlobalAveragePool, QLinearAveragePool (templates/qlinear_*.kernel.json).

Oracles: onnxruntime CPU (1.32) running the same one-node model, and numpy models of the
algorithms onnxruntime's x86-64 kernels run (read from its MLAS sources; see
snippets/qlinear.wgsl.jinja): the GPU must equal the numpy model everywhere, and the numpy
model must equal onnxruntime on CPUs where onnxruntime picks those kernels (x86-64 with AVX2
and FMA3; elsewhere onnxruntime runs other kernels and the comparison with it allows one
quantization step). Inputs are exhaustive where the op has two 8-bit operands (all 256 x 256
pairs) or one (all 256 values), with scales chosen so that many results fall on rounding
ties. Every variant is forced (support.run.run_all_variants).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from support.gpu import skip_unless_ci
from onnx import TensorProto, helper

from onnx_quant.errors import ExecutionError
from onnx_quant.reference_ops import fma_f32
from support.models import node_model
from support.oracles import ORT_FMA3, assert_matches_ort, assert_same_bits, model_qglobal, ort_run, qrange
from support.run import run_all_variants, run_node

F32 = np.float32
MS = "com.microsoft"


def all_bytes(dtype, shape=(256,)):
    return np.arange(256, dtype=np.uint8).view(dtype).reshape(shape)


def tie_prone_scales(r, n=3):
    """Scales whose ratios are simple fractions nudged by a few ULP: many results on ties."""
    base = F32(r.uniform(0.01, 0.1))
    out = [base]
    for _ in range(n - 1):
        f = F32(r.choice([0.25, 0.5, 0.75, 1.5, 2.0, 1.0]))
        out.append(F32(base * f * F32(1 + int(r.integers(-3, 4)) * 2.0 ** -23)))
    r.shuffle(out)
    return out


def x86_saturate(v, dtype):
    """cvtps2dq (round half even; NaN / beyond int32 -> INT_MIN) then saturating packs."""
    lo, hi = qrange(dtype)
    with np.errstate(invalid="ignore"):
        r = np.rint(v.astype(np.float64))
        r = np.where(np.isfinite(r) & (np.abs(r) < 2**31), r, -2**31)
    return np.clip(r, lo, hi).astype(dtype)


def mlas_quantize(v, scale, zp, dtype):
    """MlasQuantizeLinear: RN(v / scale) clamped in float to [lo - zp, hi - zp], round half even, + zp."""
    lo, hi = qrange(dtype)
    q = (v.astype(F32) / F32(scale)).astype(F32)
    q = np.where(np.isnan(q), F32(lo - int(zp)), q)
    q = np.minimum(np.maximum(q, F32(lo - int(zp))), F32(hi - int(zp)))
    return (np.rint(q).astype(np.int32) + int(zp)).astype(dtype)


# ----------------------------------------------------------------------------- numpy models

def model_qlinear_add(a, sa, za, b, sb, zb, sc, zc, dtype):
    """MlasQLinearAdd (AVX2): fma(a, RA, fma(b, RB, ZC - fma(RA, ZA, RB * ZB))) in the order of
    the operands onnxruntime's broadcast loop hands it: swapped when A repeats along the
    innermost output dimension of size > 1, or the output has a single element."""
    out_shape = np.broadcast_shapes(a.shape, b.shape)
    r = len(out_shape)
    ash = (1,) * (r - a.ndim) + a.shape
    big = [d for d in range(r) if out_shape[d] > 1]
    swapped = not big or ash[big[-1]] == 1
    av, bv = np.broadcast_to(a.reshape(ash), out_shape), np.broadcast_to(b.reshape((1,) * (r - b.ndim) + b.shape), out_shape)
    if swapped:
        av, sa, za, bv, sb, zb = bv, sb, zb, av, sa, za
    ra, rb = F32(F32(sa) / F32(sc)), F32(F32(sb) / F32(sc))
    fixed = F32(F32(int(zc)) - fma_f32(ra, F32(int(za)), F32(rb * F32(int(zb)))))
    v = fma_f32(av.astype(F32), ra, fma_f32(bv.astype(F32), rb, fixed))
    return x86_saturate(v, dtype)


def model_qlinear_mul(a, sa, za, b, sb, zb, sc, zc, dtype):
    """MlasQLinearMul (SSE2): RN(RN(f32((a - za)(b - zb)) * RN(RN(sa sb) / sc)) + zc), saturated."""
    ratio = F32(F32(F32(sa) * F32(sb)) / F32(sc))
    prod = (a.astype(np.int32) - int(za)) * (b.astype(np.int32) - int(zb))
    v = ((prod.astype(F32) * ratio).astype(F32) + F32(int(zc))).astype(F32)
    return x86_saturate(v, dtype)


LOGISTIC = {k: F32(v) for k, v in dict(
    a9=4.37031012579801e-11, a7=1.15627324459942e-07, a5=6.08574864600143e-05, a3=8.51377133304701e-03,
    a1=2.48287947061529e-01, b10=6.10247389755681e-13, b8=5.76102136993427e-09, b6=6.29106785017040e-06,
    b4=1.70198817374094e-03, b2=1.16817656904453e-01, b0=9.93151921023180e-01).items()}


def mlas_logistic(x, fused=True):
    """MlasComputeLogisticF32KernelFma3 (x86_64/LogisticKernelFma3.S); fused=False evaluates the
    polynomials with separately rounded products (to measure what fusing changes)."""
    mad = fma_f32 if fused else (lambda a, b, c: (F32(a) * F32(b)).astype(F32) + F32(c))
    c = LOGISTIC
    x = np.minimum(np.maximum(x, F32(-18)), F32(18)).astype(F32)
    x2 = (x * x).astype(F32)
    p = mad(x2, c["a9"], c["a7"])
    for k in ("a5", "a3", "a1"):
        p = mad(x2, p, c[k])
    q = mad(x2, c["b10"], c["b8"])
    for k in ("b6", "b4", "b2", "b0"):
        q = mad(x2, q, c[k])
    p = (x * p).astype(F32)
    return np.maximum(((p / q).astype(F32) + F32(0.5)).astype(F32), F32(0))


def model_lookup(kind, x, xs, xz, ys, yz, dtype, alpha=F32(0.01), fused=True):
    """onnxruntime's 256-entry table (QlinearBuildLookupTable) applied to x."""
    v = (F32(xs) * (x.astype(np.int32) - int(xz)).astype(F32)).astype(F32)
    if kind == "QLinearSigmoid":
        y = mlas_logistic(v, fused)
    else:
        y = np.where(v >= 0, v, (F32(alpha) * v).astype(F32)).astype(F32)
    return mlas_quantize(y, ys, yz, dtype)


# ----------------------------------------------------------------------------- helpers

def ql_binary(op, a, sa, za, b, sb, zb, sc, zc):
    inputs = [("A", a), ("As", np.array(sa, F32)), ("Az", None if za is None else np.array(za, a.dtype)),
              ("B", b), ("Bs", np.array(sb, F32)), ("Bz", None if zb is None else np.array(zb, a.dtype)),
              ("Cs", np.array(sc, F32)), ("Cz", None if zc is None else np.array(zc, a.dtype))]
    model = node_model(op, inputs, ["C"], domain=MS, opset=13)
    return model, {n: v for n, v in inputs if v is not None}


BROADCASTS = [((256, 1), (1, 256)), ((1, 256), (256, 1)), ((16, 16), (16, 16)), ((), (64,)), ((64,), ()),
              ((5, 1), (1, 7)), ((1,), (1,)), ((2, 3, 4), (4,)), ((2, 3, 1), (2, 3, 4)), ((3, 1, 2), (4, 1))]


def operands(sa_, sb_, dtype, r):
    if (sa_, sb_) == ((256, 1), (1, 256)):
        return all_bytes(dtype, (256, 1)), all_bytes(dtype, (1, 256))
    if (sa_, sb_) == ((1, 256), (256, 1)):
        return all_bytes(dtype, (1, 256)), all_bytes(dtype, (256, 1))
    lo, hi = qrange(dtype)
    return (np.asarray(r.integers(lo, hi + 1, sa_)).astype(dtype), np.asarray(r.integers(lo, hi + 1, sb_)).astype(dtype))


# ----------------------------------------------------------------------------- QLinearAdd / QLinearMul

@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["uint8", "int8"])
def test_qlinear_binary_bit_exact(best, op, dtype):
    r = np.random.default_rng(1 if op == "QLinearAdd" else 2)
    lo, hi = qrange(dtype)
    reference = model_qlinear_add if op == "QLinearAdd" else model_qlinear_mul
    for k, (sa_, sb_) in enumerate(BROADCASTS):
        trials = 4 if 256 in sa_ else 2
        for t in range(trials):
            a, b = operands(sa_, sb_, dtype, r)
            sa, sb, sc = tie_prone_scales(r)
            za, zb, zc = (int(v) for v in r.integers(lo, hi + 1, 3))
            model, feeds = ql_binary(op, a, sa, za, b, sb, zb, sc, zc)
            (got,), variants = run_all_variants(best, model, feeds)
            what = f"{op} {np.dtype(dtype).name} {sa_} {sb_} trial {t}"
            assert_same_bits(got, reference(a, sa, za, b, sb, zb, sc, zc, dtype), what + " vs numpy model")
            assert_matches_ort(got, ort_run(model, feeds)[0], what)
        assert set(variants) == {"word_per_invocation", "words_per_invocation"}


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary_absent_zero_points(best, op):
    """Absent zero points are 0. onnxruntime 1.32 refuses models that leave out A's or B's
    (its type inference), so with those absent only the numpy model is the oracle."""
    r = np.random.default_rng(3)
    a, b = all_bytes(np.uint8, (256, 1)), all_bytes(np.uint8, (1, 256))
    reference = model_qlinear_add if op == "QLinearAdd" else model_qlinear_mul
    sa, sb, sc = tie_prone_scales(r)
    model, feeds = ql_binary(op, a, sa, None, b, sb, None, sc, None)
    (got,), _ = run_all_variants(best, model, feeds)
    assert_same_bits(got, reference(a, sa, 0, b, sb, 0, sc, 0, np.uint8), op)
    model, feeds = ql_binary(op, a, sa, 17, b, sb, 200, sc, None)
    del model.graph.node[0].input[7]  # a trailing absent input, which onnxruntime accepts
    (got,), _ = run_all_variants(best, model, feeds)
    assert_same_bits(got, reference(a, sa, 17, b, sb, 200, sc, 0, np.uint8), op)
    assert_matches_ort(got, ort_run(model, feeds)[0], op)


def test_qlinear_add_operand_order_matters():
    """Documents why the kernel follows onnxruntime's broadcast loop: with the operands in
    the fixed order fma(a, RA, fma(b, RB, F)), onnxruntime's results are not reproduced when A
    repeats along the innermost dimension (it swaps them there); with the swap they are."""
    if not ORT_FMA3:
        skip_unless_ci("onnxruntime runs its AVX2/FMA3 QLinearAdd kernel only on such CPUs")
    import onnxruntime as ort
    del ort
    r = np.random.default_rng(5)
    a, b = all_bytes(np.uint8, (256, 1)), all_bytes(np.uint8, (1, 256))
    fixed_order_misses = 0
    for _ in range(40):
        sa, sb, sc = (F32(v) for v in r.uniform(0.001, 0.1, 3))
        za, zb, zc = (int(v) for v in r.integers(0, 256, 3))
        model, feeds = ql_binary("QLinearAdd", a, sa, za, b, sb, zb, sc, zc)
        expected = ort_run(model, feeds)[0]
        assert_same_bits(model_qlinear_add(a, sa, za, b, sb, zb, sc, zc, np.uint8), expected, "swapped model")
        ra, rb = F32(sa / sc), F32(sb / sc)
        av, bv = np.broadcast_arrays(a, b)
        fixed = F32(F32(zc) - fma_f32(ra, F32(za), F32(rb * F32(zb))))
        unswapped = x86_saturate(fma_f32(av.astype(F32), ra, fma_f32(bv.astype(F32), rb, fixed)), np.uint8)
        fixed_order_misses += int(np.count_nonzero(unswapped != expected))
    assert fixed_order_misses > 0


# ----------------------------------------------------------------------------- lookup-table ops

@pytest.mark.parametrize("op", ["QLinearSigmoid", "QLinearLeakyRelu"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["uint8", "int8"])
def test_lookup_table_ops_bit_exact(best, op, dtype):
    r = np.random.default_rng(7)
    lo, hi = qrange(dtype)
    x = all_bytes(dtype, (16, 16))
    for t in range(12):
        xs = F32(r.uniform(0.001, 0.2))
        ys = F32(r.uniform(0.001, 0.01)) if op == "QLinearSigmoid" else F32(xs * F32(r.choice([0.5, 1.0, 2.0])))
        xz, yz = (int(v) for v in r.integers(lo, hi + 1, 2))
        alpha = F32(r.choice([0.01, 0.1, 0.2, 0.3333]))
        absent = t % 4 == 3
        inputs = [("X", x), ("Xs", np.array(xs, F32)), ("Xz", None if absent else np.array(xz, dtype)),
                  ("Ys", np.array(ys, F32)), ("Yz", None if absent else np.array(yz, dtype))]
        attrs = {"alpha": float(alpha)} if op == "QLinearLeakyRelu" and t % 2 else {}
        model = node_model(op, inputs, ["Y"], attrs=attrs, domain=MS, opset=13)
        feeds = {n: v for n, v in inputs if v is not None}
        (got,), variants = run_all_variants(best, model, feeds)
        assert set(variants) == {"direct", "table"}
        expected = model_lookup(op, x, xs, 0 if absent else xz, ys, 0 if absent else yz, dtype,
                                alpha if attrs else F32(0.01))
        what = f"{op} {np.dtype(dtype).name} trial {t}"
        assert_same_bits(got, expected, what + " vs numpy model")
        assert_matches_ort(got, ort_run(model, feeds)[0], what)


def test_fused_multiply_adds_are_needed_to_match_onnxruntime():
    """onnxruntime's AVX2 QLinearAdd and FMA3 logistic round a * b + c once. Evaluated with
    separately rounded products (what a * b + c gives on a device that does not fuse, e.g.
    llvmpipe) QLinearAdd results differ in a few of the 1.3 million sums below, and a quarter
    of the logistic table's float values move by an ULP (the quantized table did not change in
    these 500 tables, but nothing rules it out), so the kernels emulate the fused operations
    exactly (oq_fma_exact). Measured with the numpy models."""
    r = np.random.default_rng(8)
    a, b = (np.ascontiguousarray(v) for v in np.broadcast_arrays(all_bytes(np.uint8, (256, 1)), all_bytes(np.uint8, (1, 256))))
    add_differ = 0
    for _ in range(20):
        sa, sb, sc = (F32(v) for v in r.uniform(0.001, 0.1, 3))
        za, zb, zc = (int(v) for v in r.integers(0, 256, 3))
        fused = model_qlinear_add(a, sa, za, b, sb, zb, sc, zc, np.uint8)
        ra, rb = F32(sa / sc), F32(sb / sc)
        fixed = F32(F32(zc) - F32(F32(rb * F32(zb)) + F32(ra * F32(za))))
        v = ((b.astype(F32) * rb).astype(F32) + fixed).astype(F32)
        v = ((a.astype(F32) * ra).astype(F32) + v).astype(F32)
        unfused = x86_saturate(v, np.uint8)
        add_differ += int(np.count_nonzero(fused != unfused))
        assert np.abs(fused.astype(int) - unfused.astype(int)).max() <= 1
    assert add_differ > 0
    x = all_bytes(np.uint8)
    float_differ = 0
    for _ in range(500):
        xs, ys = F32(r.uniform(0.001, 0.2)), F32(r.uniform(0.001, 0.008))
        xz, yz = (int(v) for v in r.integers(0, 256, 2))
        v = (xs * (x.astype(np.int32) - xz).astype(F32)).astype(F32)
        float_differ += int(np.count_nonzero(mlas_logistic(v) != mlas_logistic(v, fused=False)))
        fused = model_lookup("QLinearSigmoid", x, xs, xz, ys, yz, np.uint8)
        unfused = model_lookup("QLinearSigmoid", x, xs, xz, ys, yz, np.uint8, fused=False)
        assert np.abs(fused.astype(int) - unfused.astype(int)).max() <= 1
    assert float_differ > 500 * 256 // 10


# ----------------------------------------------------------------------------- QLinearConcat

@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["uint8", "int8"])
def test_qlinear_concat_bit_exact(best, dtype):
    r = np.random.default_rng(9)
    lo, hi = qrange(dtype)
    for shapes, axis in [([(2, 3, 5), (2, 1, 5), (2, 4, 5)], 1), ([(3, 1), (3, 2), (3, 3)], -1),
                         ([(1, 300), (2, 300)], 0), ([(2, 2)] * 8, 1), ([(256,)], 0)]:
        xs = [np.asarray(r.integers(lo, hi + 1, s)).astype(dtype) for s in shapes]
        if shapes == [(256,)]:
            xs = [all_bytes(dtype)]
        ys, yz = F32(r.uniform(0.01, 0.1)), int(r.integers(lo, hi + 1))
        inputs = [("Ys", np.array(ys, F32)), ("Yz", np.array(yz, dtype))]
        expected = []
        for i, x in enumerate(xs):
            same = i == 0 and len(xs) > 1  # the first input shares the output's parameters: a copy
            s = ys if same else F32(ys * F32(r.choice([0.5, 1.0, 1.5, 3.0])) * F32(1 + int(r.integers(-2, 3)) * 2.0 ** -23))
            z = yz if same else int(r.integers(lo, hi + 1))
            inputs += [(f"X{i}", x), (f"S{i}", np.array(s, F32)), (f"Z{i}", np.array(z, dtype))]
            v = (F32(s) * (x.astype(np.int32) - z).astype(F32)).astype(F32)
            expected.append(x if same else mlas_quantize(v, ys, yz, dtype))
        model = node_model("QLinearConcat", inputs, ["Y"], attrs={"axis": axis}, domain=MS, opset=13, out_types=[dtype])
        (got,), _ = run_all_variants(best, model, dict(inputs))
        what = f"QLinearConcat {np.dtype(dtype).name} {shapes} axis {axis}"
        assert_same_bits(got, np.concatenate(expected, axis=axis), what + " vs numpy model")
        assert_matches_ort(got, ort_run(model, dict(inputs))[0], what)


# ----------------------------------------------------------------------------- pools

def ql_pool(op, x, xs, xz, ys, yz, attrs):
    inputs = [("X", x), ("Xs", np.array(xs, F32)), ("Xz", np.array(xz, x.dtype)), ("Ys", np.array(ys, F32)),
              ("Yz", np.array(yz, x.dtype))]
    return node_model(op, inputs, ["Y"], attrs=attrs, domain=MS, opset=13), dict(inputs)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["uint8", "int8"])
@pytest.mark.parametrize("shape,cl", [((2, 3, 5, 7), 0), ((1, 9, 4, 4), 0), ((2, 5, 7, 3), 1), ((1, 4, 3, 3, 3), 0),
                                      ((1, 70, 70, 6), 1), ((3, 5, 1), 0)])
def test_qlinear_global_average_pool_bit_exact(best, dtype, shape, cl):
    r = np.random.default_rng(10)
    lo, hi = qrange(dtype)
    for t in range(2):
        x = np.asarray(r.integers(lo, hi + 1, shape)).astype(dtype)
        xs, ys = F32(r.uniform(0.01, 0.1)), F32(r.uniform(0.01, 0.1))
        xz, yz = (int(v) for v in r.integers(lo, hi + 1, 2))
        model, feeds = ql_pool("QLinearGlobalAveragePool", x, xs, xz, ys, yz, {"channels_last": cl})
        (got,), variants = run_all_variants(best, model, feeds)
        assert set(variants) == {"serial", "workgroup"}
        assert_same_bits(got, model_qglobal(x, xs, xz, ys, yz, dtype, bool(cl)), "QLinearGlobalAveragePool vs numpy model")
        assert_matches_ort(got, ort_run(model, feeds)[0], f"QLinearGlobalAveragePool {shape} cl {cl}")


AVG_CASES = [dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, pads=[1, 1, 0, 0]),
             dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
             dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER"),
             dict(kernel_shape=[2, 3], strides=[1, 2], auto_pad="SAME_LOWER"),
             dict(kernel_shape=[6, 7]),           # the whole image: onnxruntime's integer global path
             dict(kernel_shape=[3], strides=[2], pads=[1, 1])]


@pytest.mark.parametrize("attrs", AVG_CASES)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["uint8", "int8"])
def test_qlinear_average_pool_bit_exact(best, attrs, dtype):
    r = np.random.default_rng(11)
    lo, hi = qrange(dtype)
    for cip in (0, 1):
        for cl in (0, 1):
            shape = (2, 3, 6, 7) if len(attrs["kernel_shape"]) == 2 else (2, 4, 9)
            if cl:
                shape = (shape[0],) + shape[2:] + (shape[1],)
            x = np.asarray(r.integers(lo, hi + 1, shape)).astype(dtype)
            xs, ys = F32(r.uniform(0.01, 0.1)), F32(r.uniform(0.01, 0.1))
            xz, yz = (int(v) for v in r.integers(lo, hi + 1, 2))
            model, feeds = ql_pool("QLinearAveragePool", x, xs, xz, ys, yz,
                                   dict(attrs, count_include_pad=cip, channels_last=cl))
            (got,), _ = run_all_variants(best, model, feeds)
            assert_matches_ort(got, ort_run(model, feeds)[0], f"QLinearAveragePool {attrs} cip {cip} cl {cl}")


# ----------------------------------------------------------------------------- errors

def test_scales_must_be_scalars(best):
    a = all_bytes(np.uint8, (4, 64))
    model, feeds = ql_binary("QLinearAdd", a, 0.1, 3, a, 0.2, 4, 0.3, 5)
    feeds["As"] = np.array([0.1, 0.2], F32)
    model.graph.input[1].type.tensor_type.shape.dim.add().dim_value = 2
    with pytest.raises(ExecutionError, match="scalesAreScalars"):
        run_node(best, model, feeds)


# ----------------------------------------------------------------------------- a real quantized model

@pytest.mark.gpu
def test_onnxruntime_qoperator_model_runs_bit_exact(tmp_path):
    """A small CNN quantized by onnxruntime.quantization (QOperator format: QLinearConv,
    QLinearAdd, QLinearLeakyRelu, QLinearSigmoid, QLinearMul, QLinearAveragePool, MaxPool on
    uint8, QLinearConcat, QLinearGlobalAveragePool) runs whole on the device through
    backend_wgpu.Session and gives onnxruntime's outputs bit for bit."""
    if not ORT_FMA3:
        skip_unless_ci("bit-exactness with onnxruntime is established for its AVX2/FMA3 kernels")
    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from onnx_quant.backend_wgpu.session import Session
    from support.gpu import gpu_device

    r = np.random.default_rng(12)
    inits = {"W": (r.standard_normal((8, 3, 3, 3)) * 0.3).astype(F32), "B": r.standard_normal(8).astype(F32),
             "W2": (r.standard_normal((8, 8, 3, 3)) * 0.2).astype(F32), "B2": r.standard_normal(8).astype(F32)}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "W2", "B2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r"], ["a"]),
             helper.make_node("LeakyRelu", ["a"], ["l"], alpha=0.1),
             helper.make_node("Sigmoid", ["l"], ["sg"]),
             helper.make_node("Mul", ["sg", "l"], ["mm"]),
             helper.make_node("Concat", ["l", "mm"], ["cc"], axis=1),
             helper.make_node("AveragePool", ["cc"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("MaxPool", ["ap"], ["mp"], kernel_shape=[2, 2], strides=[1, 1], pads=[0, 0, 1, 1]),
             helper.make_node("GlobalAveragePool", ["mp"], ["y"])]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 1, 1])],
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    float_path, q_path = os.fspath(tmp_path / "f.onnx"), os.fspath(tmp_path / "q.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), float_path)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.data = iter([{"x": r.standard_normal((1, 3, 8, 8)).astype(F32)} for _ in range(8)])

        def get_next(self):
            return next(self.data, None)

    quantize_static(float_path, q_path, Reader(), quant_format=QuantFormat.QOperator,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    q = onnx.load(q_path)
    ops = {n.op_type for n in q.graph.node}
    assert {"QLinearAdd", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearMul", "QLinearAveragePool",
            "QLinearConcat", "QLinearGlobalAveragePool"} <= ops, ops
    sess = Session(q, device=gpu_device("best"))
    for seed in range(3):
        x = np.random.default_rng(100 + seed).standard_normal((1, 3, 8, 8)).astype(F32)
        assert_same_bits(sess.run(None, {"x": x})[0], ort_run(q, {"x": x})[0], f"quantized CNN, input {seed}")


# ----------------------------------------------------------------------------- other adapters

def test_kernels_agree_on_opengl(best):
    """A representative of every template renders, compiles and gives the same bits on the
    OpenGL adapter (no subgroups, another shader compiler path) as on the best adapter,
    every variant forced."""
    from support.gpu import gpu_device
    from support.arrays import data
    from support.oracles import bits

    gl = gpu_device("opengl")
    x = data((2, 3, 5, 5), np.float32, 1)
    h = x.astype(np.float16)
    a, b, w = data((17, 33), np.float32, 2), data((33, 19), np.float32, 3), data((8, 3, 3, 3), np.float32, 4)
    u = [data((2, 3), np.uint8, i) for i in range(3)]
    lab = (np.arange(2 * 5 * 5).reshape(2, 5, 5) % 3).astype(np.int64)
    i8, s19 = data((33, 19), np.int8, 6), (data((19,), np.float32, 7) ** 2 * 0.01).astype(np.float32)
    z19 = data((19,), np.int8, 8) // 8
    cases = [
        (node_model("MaxPool", [("X", x.astype(np.uint8))], ["Y"], attrs=dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                    opset=12), {"X": x.astype(np.uint8)}),
        (node_model("AveragePool", [("X", x)], ["Y"], attrs=dict(kernel_shape=[2, 2], count_include_pad=1,
                                                                   pads=[1, 1, 1, 1])), {"X": x}),
        (node_model("GlobalAveragePool", [("X", x)], ["Y"]), {"X": x}),
        (node_model("Softmax", [("X", x)], ["Y"], attrs={"axis": 1}), {"X": x}),
        (node_model("LogSoftmax", [("X", h)], ["Y"], attrs={"axis": 1}), {"X": h}),
        (node_model("Hardmax", [("X", x)], ["Y"], attrs={"axis": 1}), {"X": x}),
        (node_model("SoftmaxCrossEntropyLoss", [("X", x), ("T", lab), ("W", x[0, :, 0, 0].copy())], ["L", "P"],
                    attrs={"reduction": "mean", "ignore_index": 1}, opset=13), {"X": x, "T": lab, "W": x[0, :, 0, 0].copy()}),
        (node_model("Sigmoid", [("X", x)], ["Y"]), {"X": x}),
        (node_model("MatMul", [("A", a), ("B", b)], ["Y"]), {"A": a, "B": b}),
        (node_model("MatMul", [("A", a[:, :32]), ("B", b[:32, :16])], ["Y"]), {"A": a[:, :32], "B": b[:32, :16]}),
        (node_model("DynamicQuantizeMatMul", [("A", a), ("B", i8), ("S", s19), ("Z", z19)], ["Y"], domain=MS,
                    inits={"B": i8, "S": s19, "Z": z19}), {"A": a}),
        (node_model("Conv", [("X", x), ("W", w)], ["Y"]), {"X": x, "W": w}),
        (node_model("Add", [("A", h), ("B", h)], ["C"]), {"A": h, "B": h}),
        (node_model("Cast", [("X", x)], ["Y"], attrs={"to": TensorProto.INT8}, out_types=[np.int8]), {"X": x}),
        (node_model("Concat", [(f"X{i}", v) for i, v in enumerate(u)], ["Y"], attrs={"axis": 0}),
         {f"X{i}": v for i, v in enumerate(u)}),
        (node_model("Transpose", [("X", h)], ["Y"], attrs={"perm": [3, 1, 2, 0]}), {"X": h}),
        (node_model("Identity", [("X", h)], ["Y"]), {"X": h}),
        ql_binary("QLinearAdd", all_bytes(np.uint8, (256, 1)), 0.05, 3, all_bytes(np.uint8, (1, 256)), 0.04, 200, 0.07, 100),
        ql_binary("QLinearMul", all_bytes(np.int8, (256, 1)), 0.05, 3, all_bytes(np.int8, (1, 256)), 0.04, -20, 0.07, 10),
        ql_pool("QLinearAveragePool", data((1, 3, 6, 7), np.uint8, 5), 0.05, 3, 0.04, 100,
                dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
        ql_pool("QLinearGlobalAveragePool", data((1, 3, 6, 7), np.uint8, 5), 0.05, 3, 0.04, 100, {}),
    ]
    lut_in = [("X", all_bytes(np.uint8, (16, 16))), ("Xs", np.array(0.05, F32)), ("Xz", np.array(7, np.uint8)),
              ("Ys", np.array(0.004, F32)), ("Yz", np.array(3, np.uint8))]
    cases.append((node_model("QLinearSigmoid", lut_in, ["Y"], domain=MS, opset=13), dict(lut_in)))
    q_in = [("Ys", np.array(0.05, F32)), ("Yz", np.array(9, np.uint8))]
    for i, v in enumerate(u):
        q_in += [(f"X{i}", v), (f"S{i}", np.array(0.03 * (i + 1), F32)), (f"Z{i}", np.array(i, np.uint8))]
    cases.append((node_model("QLinearConcat", q_in, ["Y"], attrs={"axis": 1}, domain=MS, opset=13,
                             out_types=[np.uint8]), dict(q_in)))
    for model, feeds in cases:
        on_gl, _ = run_all_variants(gl, model, feeds)
        on_best, _ = run_all_variants(best, model, feeds)
        for g, e in zip(on_gl, on_best):
            assert np.array_equal(bits(g), bits(e)), model.graph.node[0].op_type

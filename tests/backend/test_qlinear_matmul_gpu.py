"""QLinearMatMul and MatMulInteger on the GPU: every variant, forced, bit for bit.

Oracles: the ONNX reference implementation (onnx.reference) wherever it accepts the input
(per-row parameters of a 2-D ``a`` given as ``[M]`` are reshaped to ``[M, 1]`` for it: the
reference broadcasts an ``[M]`` vector along the columns), the same formula in numpy
(``np_qlinear_matmul``: exact int64 products wrapped to int32, the multiplier computed in
the scale type, then the float64 product and sum the reference computes), onnxruntime CPU
where it supports the input and where its float32 requantization cannot differ, and ONNX's
own node test cases. float8 (opset 21) has no CPU implementation in either oracle; it is
checked against its documented definition (``np_float8_qlinear_matmul``).

Devices: the best adapter (lavapipe Vulkan here) and the OpenGL adapter, both with WebGPU
default limits (so no kernel silently depends on big limits).
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from support.gpu import assert_node_cases_every_variant, gpu_device, gpu_examples, skip_unless_ci
from support.models import value_info_of
from support.oracles import assert_bits
from onnx_quant.dtypes import element_type
from onnx_quant.errors import DeviceError, ExecutionError
from onnx_quant.oracles import widen_u8s8

VARIANTS = ("blocked", "tiled", "simple")  # MatMulInteger's
#: QLinearMatMul's: the *_epilogue ones requantize in the GEMM pass
QL_VARIANTS = ("blocked_epilogue", "tiled_epilogue") + VARIANTS
QL_INPUTS = ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point"]
SCALE_TYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
               "bfloat16": np.dtype(ml_dtypes.bfloat16)}
FLOAT8 = ("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz")


# ----------------------------------------------------------------------------- models

def qlinear_matmul_model(feeds, opset=21):
    inputs = [value_info_of(n, feeds[n]) for n in QL_INPUTS]
    out = helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(feeds["y_zero_point"].dtype), None)
    graph = helper.make_graph([helper.make_node("QLinearMatMul", QL_INPUTS, ["y"], name="qmm")], "g", inputs, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def matmul_integer_model(feeds):
    names = ["A", "B", "a_zero_point" if "a_zero_point" in feeds else "", "b_zero_point" if "b_zero_point" in feeds else ""]
    while names[-1] == "":
        names.pop()
    inputs = [value_info_of(n, feeds[n]) for n in names if n]
    out = helper.make_tensor_value_info("Y", TensorProto.INT32, None)
    graph = helper.make_graph([helper.make_node("MatMulInteger", names, ["Y"], name="mmi")], "g", inputs, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])


def run_gpu(dev, model, feeds, variant=None, tunables=None):
    from onnx_quant.backend_wgpu.session import Session

    op = model.graph.node[0].op_type
    with Session(model, device=dev, variants={op: variant} if variant else None,
                 tunables=tunables) as s:
        out = s.run(None, feeds)[0]
        plan = s.plans({k: v.shape for k, v in feeds.items()})[0]
    return out, plan


# ----------------------------------------------------------------------------- oracles

def _wrap32(x: np.ndarray) -> np.ndarray:
    return ((x.astype(np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)


def _row_param(p: np.ndarray, a: np.ndarray) -> np.ndarray:
    """A per-row parameter in the [..., M, 1] form (a 2-D a's [M] vector reshaped)."""
    if a.ndim == 2 and p.ndim == 1 and p.size > 1:
        return p.reshape(-1, 1)
    return p


def np_accumulate(a, azp, b, bzp) -> np.ndarray:
    """numpy matmul of (a - a_zp) and (b - b_zp), exact, wrapped to int32 like numpy's int32 matmul."""
    A = a.astype(np.int64) - _row_param(azp, a).astype(np.int64)
    B = b.astype(np.int64) - bzp.astype(np.int64)
    return _wrap32(np.matmul(A, B))


def np_requantize(acc, m, yzp) -> np.ndarray:
    """clip(rint(float64(acc) * float64(m) + y_zp)) — the reference's float64 arithmetic."""
    info = np.iinfo(yzp.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        d = acc.astype(np.float64) * np.asarray(m).astype(np.float64) + np.float64(yzp.reshape(()))
        r = np.clip(np.rint(d), info.min, info.max)
    return np.where(np.isnan(r), 0, r).astype(yzp.dtype)


def _as_matrix_param(p: np.ndarray, operand: np.ndarray, per_row: bool) -> np.ndarray:
    """A scale in a shape that broadcasts against the [..., M, N] product of 2-D-promoted operands."""
    if operand.ndim == 1 or p.size == 1:
        return p.reshape(1, 1) if p.ndim <= 1 else p
    return _row_param(p, operand) if per_row else p


def np_qlinear_matmul(f) -> np.ndarray:
    a, b = f["a"], f["b"]
    acc = np_accumulate(a, f["a_zero_point"], b, f["b_zero_point"])
    acc2 = acc
    if b.ndim == 1:
        acc2 = acc2[..., None]
    if a.ndim == 1:
        acc2 = acc2[..., None, :]
    with np.errstate(all="ignore"):
        m = (_as_matrix_param(f["a_scale"], a, True) * _as_matrix_param(f["b_scale"], b, False)) / f["y_scale"]
    y = np_requantize(acc2, np.broadcast_to(m, np.broadcast_shapes(m.shape, acc2.shape)), f["y_zero_point"])
    return y.reshape(acc.shape)


def np_float8_qlinear_matmul(f) -> np.ndarray:
    """The documented float8 definition: (a - a_zp)(b - b_zp) in float32 summed in k order,
    RN(acc * multiplier) + y_zp in float32, saturated and rounded into y's float8 type."""
    A = f["a"].astype(np.float32) - _row_param(f["a_zero_point"], f["a"]).astype(np.float32)
    B = f["b"].astype(np.float32) - f["b_zero_point"].astype(np.float32)
    a2 = A if A.ndim > 1 else A[None, :]
    b2 = B if B.ndim > 1 else B[:, None]
    acc = np.zeros(np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]) + (a2.shape[-2], b2.shape[-1]), np.float32)
    with np.errstate(all="ignore"):
        for k in range(a2.shape[-1]):
            acc = acc + a2[..., :, k:k + 1] * b2[..., k:k + 1, :]
        m = ((_as_matrix_param(f["a_scale"], f["a"], True) * _as_matrix_param(f["b_scale"], f["b"], False))
             / f["y_scale"]).astype(np.float32)
        v = (acc * m).astype(np.float32) + f["y_zero_point"].astype(np.float32)
    dt = f["y_zero_point"].dtype
    big = np.float32(ml_dtypes.finfo(dt).max)
    y = np.clip(v, -big, big).astype(dt)
    if A.ndim == 1:
        y = y[..., 0, :]
    if B.ndim == 1:
        y = y[..., 0]
    return y


def reference_outputs(model, feeds):
    from onnx.reference import ReferenceEvaluator

    f = dict(feeds)
    a = f["a"] if "a" in f else f["A"]
    for p in ("a_scale", "a_zero_point"):
        if p in f:
            f[p] = _row_param(f[p], a)
    if "a_scale" in f:
        model = qlinear_matmul_model(f, model.opset_import[0].version)
    else:
        model = matmul_integer_model(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = ReferenceEvaluator(model).run(None, f)[0]
    # the reference broadcasts [1]-shaped parameters into the result: 1-D x 1-D gives [1], not []
    from onnx_quant.inference.rules.shape_math import matmul_output_shape  # noqa: PLC0415

    want = tuple(matmul_output_shape(a.shape, (f["b"] if "b" in f else f["B"]).shape))
    return out.reshape(want) if out.size == int(np.prod(want)) else out


# ----------------------------------------------------------------------------- WGSL harness

def _harness(dev, body: str, n_in: int, scale_type: str = "float32"):
    """Compile a one-pass test shader: in vec4<u32> per element, out u32 per element."""
    from onnx_quant.backend_wgpu.render import render_string

    src = render_string(
        '{% include "snippets/numerics.wgsl.jinja" %}\n{% include "snippets/minifloat.wgsl.jinja" %}\n'
        '{% include "snippets/float_exact.wgsl.jinja" %}\n{% include "snippets/requantize.wgsl.jinja" %}\n'
        "@group(0) @binding(0) var<storage, read> inp: array<vec4<u32>>;\n"
        "@group(0) @binding(1) var<storage, read_write> outp: array<u32>;\n"
        "@compute @workgroup_size(64)\n"
        "fn main(@builtin(global_invocation_id) g: vec3<u32>) {\n"
        "  let i = g.x;\n  if (i >= arrayLength(&outp)) { return; }\n  let v = inp[i];\n" + body + "\n}\n",
        {"features": [], "oq_scale_type": scale_type})
    compiled = dev.compile(src, ((0, "read-only-storage"), (1, "storage")), label="k2-harness")

    def run(words: np.ndarray) -> np.ndarray:
        words = np.ascontiguousarray(words, dtype=np.uint32).reshape(-1, 4)
        n = len(words)
        inp = dev.allocate(words.nbytes)
        dev.upload(inp, words.tobytes())
        out = dev.allocate(4 * n)
        bg = dev.bind(compiled, [(0, inp, inp.size), (1, out, out.size)])
        dev.launch([(compiled, bg, ((n + 63) // 64, 1, 1), "harness")])
        res = np.frombuffer(dev.download(out), np.uint32)[:n].copy()
        inp.destroy()
        out.destroy()
        return res
    return run


def float64_window_cases(count_per: int = 40):
    """(acc, m) whose exact acc * m lies within a few float64 ulps of j + 0.5 (not on it):
    the float64 rounding of the product / sum decides the result there."""
    out = []
    mm = np.arange(2**23 + 1, 2**24, 2, dtype=np.int64)
    for f in (55, 54, 53, 52):
        for j in (0, 1, 2, 3):
            big_h = (2 * j + 1) * 2 ** (f - 1)
            r = (-big_h) % mm
            d = np.where(r > mm // 2, r - mm, r)
            sel = (np.abs(d) <= 600) & (d != 0)
            for m_, d_ in zip(mm[sel][:count_per], d[sel][:count_per]):
                acc = (big_h + int(d_)) // int(m_)
                if acc < 2**31:
                    out.append((acc, np.float32(m_ * 2.0**-f)))
    return out


def requantize_cases():
    """(words for the harness: acc, m, zp, unsigned; acc, m, zp; expected) of random, tie,
    near-tie, float64-window and special operands (both output ranges), the expected value
    clip(rint(float64(acc) * m + zp)) as numpy computes it."""
    rng = np.random.default_rng(7)
    n = 4000
    accs, ms = [], []
    accs.append(rng.integers(-2**31, 2**31, n))
    ms.append((2.0 ** rng.uniform(-40, 5, n)).astype(np.float32))
    accs.append(rng.integers(-5000, 5000, n))
    ms.append(rng.uniform(0, 0.2, n).astype(np.float32))
    m = (2.0 ** rng.uniform(-30, 0, n)).astype(np.float32)  # near ties
    k = rng.integers(-300, 300, n)
    a = np.round((k + 0.5) / m.astype(np.float64)).astype(np.int64) + rng.integers(-2, 3, n)
    ok = np.abs(a) < 2**31
    accs.append(a[ok])
    ms.append(m[ok])
    j = rng.integers(1, 20, n)  # exact ties: m = 2^-j, acc an odd multiple of 2^(j-1)
    a = (2 * rng.integers(-2000, 2000, n) + 1) * (2 ** (j - 1))
    ok = np.abs(a) < 2**31
    accs.append(a[ok])
    ms.append((2.0 ** -j[ok]).astype(np.float32))
    win = float64_window_cases()
    accs.append(np.array([w[0] for w in win] + [-w[0] for w in win]))
    ms.append(np.array([w[1] for w in win] * 2, np.float32))
    special = np.array([0, np.inf, -np.inf, np.nan, -0.0, 1e-45, 3.4e38, -1.0, -0.25, 0.5, 1.5e-40], np.float32)
    accs.append(np.concatenate([rng.integers(-300, 300, special.size * 20), [0, 0, 0, 2**31 - 1, -2**31]]))
    ms.append(np.concatenate([np.tile(special, 20), np.array([np.inf, np.nan, 0, 1e-9, 1e-9], np.float32)]))
    acc = np.concatenate(accs).astype(np.int64)
    mul = np.concatenate(ms).astype(np.float32)
    uns = rng.integers(0, 2, acc.size)
    zp = np.where(uns == 1, rng.integers(0, 256, acc.size), rng.integers(-128, 128, acc.size))
    words = np.stack([acc.astype(np.int32).view(np.uint32), mul.view(np.uint32), zp.astype(np.int32).view(np.uint32),
                      uns.astype(np.uint32)], 1)
    lo, hi = np.where(uns == 1, 0, -128), np.where(uns == 1, 255, 127)
    with np.errstate(all="ignore"):
        r = np.clip(np.rint(acc.astype(np.int32) * mul.astype(np.float64) + zp), lo, hi)
    expected = np.where(np.isnan(r), 0, r).astype(np.int32)
    return words, (acc, mul, zp), expected


REQUANT_ARGS = ("bitcast<i32>(v.x), bitcast<f32>(v.y), bitcast<i32>(v.z), select(-128, 0, v.w == 1u), "
                "select(127, 255, v.w == 1u)")


def test_requantize_function_matches_float64(best):
    """oq_requant_f64 == clip(rint(float64(acc) * m + zp)) on random, tie, near-tie,
    float64-window and special operands (both output ranges)."""
    run = _harness(best, f"  outp[i] = bitcast<u32>(oq_requant_f64({REQUANT_ARGS}));", 4)
    words, (acc, mul, zp), expected = requantize_cases()
    got = run(words).view(np.int32)
    bad = np.nonzero(got != expected)[0]
    assert bad.size == 0, [(int(acc[i]), float(mul[i]), int(zp[i]), int(got[i]), int(expected[i])) for i in bad[:5]]
    # the float64-window cases really are ones where float64 and exact arithmetic disagree
    from fractions import Fraction
    differ = 0
    for a_, m_ in float64_window_cases()[:200]:
        v = Fraction(int(a_)) * Fraction(float(m_)) + 100
        fl = v.numerator // v.denominator
        exact = fl + (1 if (v - fl > Fraction(1, 2) or (v - fl == Fraction(1, 2) and fl % 2)) else 0)
        differ += int(np.rint(np.float64(a_) * np.float64(m_) + 100)) != exact
    assert differ > 0


def test_fast_requantize_decides_only_what_float64_decides(best):
    """oq_requant_fast (the epilogues' float32 path) answers exactly what oq_requant_f64 does
    wherever it answers, and leaves every exact tie short of saturation, NaN, infinity and |acc| > 2^24 to it;
    on random operands it decides all but a few."""
    run = _harness(best, f"  outp[i] = bitcast<u32>(oq_requant_fast({REQUANT_ARGS}));", 4)
    words, (acc, mul, zp), expected = requantize_cases()
    got = run(words).view(np.int32)
    undecided = got == np.iinfo(np.int32).min
    bad = np.nonzero(~undecided & (got != expected))[0]
    assert bad.size == 0, [(int(acc[i]), float(mul[i]), int(zp[i]), int(got[i]), int(expected[i])) for i in bad[:5]]
    lo, hi = np.where(words[:, 3] == 1, 0, -128), np.where(words[:, 3] == 1, 255, 127)
    with np.errstate(all="ignore"):
        v = acc.astype(np.float64) * mul.astype(np.float64) + zp
        tie = np.isfinite(v) & (v - np.floor(v) == 0.5) & (v > lo - 1) & (v < hi + 1)  # not saturated
    must_defer = tie | ~np.isfinite(mul) | (np.abs(acc) > 2**24) | (mul == 0)
    assert undecided[must_defer].all()
    random_sums = slice(4000, 8000)  # requantize_cases' second set: random sums and multipliers
    assert undecided[random_sums].mean() < 0.01, undecided[random_sums].mean()


@pytest.mark.parametrize("scale_type", ["float32", "float16", "bfloat16"])
def test_multiplier_rounds_in_the_scale_type(best, scale_type):
    """oq_qlinear_multiplier(a, b, y) == a * b / y computed by numpy / ml_dtypes in the scale
    type (float16 and bfloat16 round after each operation), special values included."""
    dt = SCALE_TYPES[scale_type]
    run = _harness(best, "  outp[i] = bitcast<u32>(oq_qlinear_multiplier(bitcast<f32>(v.x), bitcast<f32>(v.y), "
                         "bitcast<f32>(v.z)));", 3, scale_type)
    rng = np.random.default_rng(11)
    n = 3000
    lo, hi = (-30, 30) if scale_type == "float32" else (-20, 12)
    vals = [(2.0 ** rng.uniform(lo, hi, (n, 3)) * rng.choice([1, -1], (n, 3))).astype(np.float32).astype(dt)]
    with np.errstate(over="ignore"):  # 3e38 is meant to become inf in float16
        special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, 65504.0, 6e-8, 1e-40, 3e38], np.float32).astype(dt)
    grid = np.array(np.meshgrid(special, special, special)).reshape(3, -1).T
    vals.append(grid)
    x = np.concatenate(vals)
    with np.errstate(all="ignore"):
        expected = ((x[:, 0] * x[:, 1]) / x[:, 2]).astype(np.float32)
    xf = x.astype(np.float32)
    words = np.stack([xf[:, 0].view(np.uint32), xf[:, 1].view(np.uint32), xf[:, 2].view(np.uint32),
                      np.zeros(len(x), np.uint32)], 1)
    got = run(words).view(np.float32)
    same = (got.view(np.uint32) == expected.view(np.uint32)) | (np.isnan(got) & np.isnan(expected))
    bad = np.nonzero(~same)[0]
    assert bad.size == 0, [(x[i].tolist(), float(got[i]), float(expected[i])) for i in bad[:5]]


# ----------------------------------------------------------------------------- data

def _q(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape, dtype=dtype)


@st.composite
def matmul_case(draw, float8=False):
    """Shapes (1-D operands, broadcast batch dims), dtypes, scale type and granularity."""
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    m = draw(st.sampled_from([1, 2, 3, 5, 8, 9]))
    n = draw(st.sampled_from([1, 3, 4, 6, 8, 13]))
    k = draw(st.sampled_from([1, 2, 4, 7, 12, 33]))
    a_vec = draw(st.booleans()) if draw(st.integers(0, 4)) == 0 else False
    b_vec = draw(st.booleans()) if draw(st.integers(0, 4)) == 0 else False
    batch = draw(st.sampled_from([(), (2,), (3,), (2, 3)]))
    a_batch = () if a_vec else tuple(d if draw(st.booleans()) else 1 for d in batch)
    b_batch = () if b_vec else tuple(d if draw(st.booleans()) else 1 for d in batch)
    if draw(st.booleans()):
        a_batch = a_batch[draw(st.integers(0, len(a_batch))):]
    else:
        b_batch = b_batch[draw(st.integers(0, len(b_batch))):]
    a_shape = (k,) if a_vec else a_batch + (m, k)
    b_shape = (k,) if b_vec else b_batch + (k, n)
    scale_type = draw(st.sampled_from(list(SCALE_TYPES)))
    sdt = SCALE_TYPES[scale_type]
    if float8:
        ta, tb, ty = (element_type(draw(st.sampled_from(FLOAT8))).dtype for _ in range(3))
    else:
        ta, tb, ty = (np.dtype(draw(st.sampled_from([np.int8, np.uint8]))) for _ in range(3))
    a_gran = "tensor" if a_vec else draw(st.sampled_from(["tensor", "tensor1", "row", "rowvec"]))
    b_gran = "tensor" if b_vec else draw(st.sampled_from(["tensor", "tensor1", "col", "colvec"]))
    if a_gran == "rowvec" and len(a_shape) != 2:
        a_gran = "row"
    if b_gran == "colvec" and len(b_shape) != 2:
        b_gran = "col"
    a_ps = {"tensor": (), "tensor1": (1,), "row": a_shape[:-1] + (1,), "rowvec": (a_shape[0],)}[a_gran]
    b_ps = {"tensor": (), "tensor1": (1,), "col": b_shape[:-2] + (1, b_shape[-1]), "colvec": (b_shape[-1],)}[b_gran]

    def vals(dt, shape, zero=False):
        if dt.kind in "iu":
            return _q(rng, dt, shape)
        if zero:
            return np.zeros(shape, dt)
        return (rng.standard_normal(shape) * 3).astype(np.float32).astype(dt)

    f = {
        "a": vals(ta, a_shape), "a_scale": (rng.uniform(0.5, 2, a_ps) * 2.0 ** rng.integers(-7, -3)).astype(np.float32).astype(sdt),
        "a_zero_point": vals(ta, a_ps, zero=True),
        "b": vals(tb, b_shape), "b_scale": (rng.uniform(0.5, 2, b_ps) * 2.0 ** rng.integers(-7, -3)).astype(np.float32).astype(sdt),
        "b_zero_point": vals(tb, b_ps, zero=True),
        "y_scale": np.array(rng.uniform(0.5, 2) * 2.0 ** rng.integers(-4, 1), np.float32).astype(sdt).reshape(
            draw(st.sampled_from([(), (1,)]))),
        "y_zero_point": vals(ty, (), zero=True),
    }
    f["y_zero_point"] = f["y_zero_point"].reshape(f["y_scale"].shape)
    if ty.kind in "iu":
        f["y_zero_point"] = _q(rng, ty, f["y_scale"].shape)
    return f


# ----------------------------------------------------------------------------- QLinearMatMul

@settings(max_examples=gpu_examples())
@given(case=matmul_case())
def test_qlinear_matmul_every_variant(best, case):
    """Shapes x broadcasting x dtypes x scale type x granularity: each variant forced equals
    numpy's formula and onnx.reference bit for bit."""
    model = qlinear_matmul_model(case)
    expected = np_qlinear_matmul(case)
    vector_operand = case["a"].ndim == 1 or case["b"].ndim == 1
    try:
        ref = reference_outputs(model, case)
    except ValueError:
        if not vector_operand:
            raise
        ref = None  # the reference cannot broadcast per-row parameters against a 1-D b's product
    if ref is None or (ref.shape != expected.shape and vector_operand):
        pass  # the reference broadcasts per-row/column parameters against a 1-D operand's product wrongly
    else:
        assert_bits(expected, ref, "numpy formula vs onnx.reference")
    for v in QL_VARIANTS:
        got, plan = run_gpu(best, model, case, v)
        assert plan.variant == v
        assert_bits(got, expected, f"variant {v}")


def test_qlinear_matmul_opengl_and_natural_choice(dev):
    """Each adapter (Vulkan and OpenGL, WebGPU default limits) picks 'blocked_epilogue' (one
    pass) for integer types, and every variant agrees on an unaligned batched case with per-row/per-column
    parameters."""
    rng = np.random.default_rng(3)
    f = {"a": _q(rng, np.uint8, (2, 7, 9)), "a_scale": np.full((2, 7, 1), 0.02, np.float32),
         "a_zero_point": _q(rng, np.uint8, (2, 7, 1)), "b": _q(rng, np.int8, (9, 6)),
         "b_scale": rng.uniform(0.01, 0.03, 6).astype(np.float32), "b_zero_point": _q(rng, np.int8, (6,)),
         "y_scale": np.array(0.37, np.float32), "y_zero_point": np.array(100, np.uint8)}
    model = qlinear_matmul_model(f)
    expected = np_qlinear_matmul(f)
    got, plan = run_gpu(dev, model, f)
    assert plan.variant == "blocked_epilogue"
    assert_bits(got, expected, "natural")
    for v in QL_VARIANTS:
        assert_bits(run_gpu(dev, model, f, v)[0], expected, v)


def test_exact_ties_round_half_to_even(best):
    """Multipliers 1/2 and 1/4 make acc * m + y_zp exact half-integers; they round to even
    (numpy's rint), for both signs, every zero point parity, both output types."""
    for m_scale, ydt in ((2.0, np.uint8), (4.0, np.int8)):
        k = 64
        accs = np.arange(-130, 131) if ydt == np.int8 else np.arange(-40, 600)
        rows = len(accs)
        a = np.zeros((rows, k), np.int8)
        for i, acc in enumerate(accs):  # rows of +-1..127 summing to acc against b = ones
            q, r = divmod(abs(int(acc)), 127)
            a[i, :q] = 127
            a[i, q] = r
            a[i] *= 1 if acc >= 0 else -1
        b = np.ones((k, 3), np.int8)
        for yzp in ((0, 1, 7) if ydt == np.uint8 else (-3, 0, 4)):
            f = {"a": a, "a_scale": np.array(1.0, np.float32), "a_zero_point": np.array(0, np.int8),
                 "b": b, "b_scale": np.array(1.0, np.float32), "b_zero_point": np.array(0, np.int8),
                 "y_scale": np.array(m_scale, np.float32), "y_zero_point": np.array(yzp, ydt)}
            model = qlinear_matmul_model(f)
            expected = reference_outputs(model, f)
            assert_bits(np_qlinear_matmul(f), expected, "numpy")
            d = accs / m_scale + yzp
            assert np.sum(d - np.floor(d) == 0.5) > 20  # the case really has ties
            for v in QL_VARIANTS:
                assert_bits(run_gpu(best, model, f, v)[0], expected, f"ties m=1/{m_scale} zp={yzp} {v}")


def _f32_f64_disagreements(count=12, seed=3):
    """(acc, m) where rint(float32(acc * m)) != rint(float64 acc * m): onnxruntime's float32
    requantization and the reference's float64 one give different bytes there."""
    rng = np.random.default_rng(seed)
    acc = np.arange(0, 25500, dtype=np.int64)
    pairs = []
    while len(pairs) < count:
        m = np.float32(rng.uniform(0.004, 0.02))
        f64 = np.rint(acc * np.float64(m))
        f32 = np.rint((acc.astype(np.float32) * m).astype(np.float32))
        d = np.nonzero((f64 != f32) & (f64 < 250))[0]
        if d.size:
            pairs.append((int(acc[d[0]]), m))
    return pairs


def test_float32_vs_float64_requantization_matches_the_reference(best):
    """On accumulators where float32 and float64 requantization round differently, every
    variant gives the reference's (float64) bytes; onnxruntime gives the float32 ones
    (clip(rint(f32(f32(acc) * m)) + y_zp)), the difference summarised in
    docs/benchmarks.md ("QLinearMatMul / QLinearConv")."""
    pairs = _f32_f64_disagreements()
    n, k = len(pairs), 100
    a = np.zeros((n, k), np.uint8)
    for i, (acc, _) in enumerate(pairs):
        q, r = divmod(acc, 255)
        a[i, :q] = 255
        a[i, q] = r
    for yzp in (0, 3):
        f = {"a": a, "a_scale": np.array(1, np.float32), "a_zero_point": np.array(0, np.uint8),
             "b": np.ones((k, n), np.uint8), "b_scale": np.array([m for _, m in pairs], np.float32),
             "b_zero_point": np.zeros(n, np.uint8), "y_scale": np.array(1, np.float32),
             "y_zero_point": np.array(yzp, np.uint8)}
        model = qlinear_matmul_model(f)
        expected = reference_outputs(model, f)
        accs = a.astype(np.int64) @ f["b"].astype(np.int64)
        f32 = np.clip(np.rint((accs.astype(np.float32) * f["b_scale"]).astype(np.float32)) + yzp, 0, 255).astype(np.uint8)
        assert np.sum(np.diag(f32) != np.diag(expected)) >= len(pairs) // 2
        for v in QL_VARIANTS:
            assert_bits(run_gpu(best, model, f, v)[0], expected, f"zp={yzp} {v}")
        import onnxruntime as ort
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        assert_bits(sess.run(None, f)[0], f32, "onnxruntime follows the float32 formula")


def test_onnxruntime_agrees_away_from_ties(best):
    """Where onnxruntime supports the input (per-tensor a; per-tensor or per-column b) and no
    float32/float64 disagreement occurs, it gives the same bytes."""
    import onnxruntime as ort
    rng = np.random.default_rng(5)
    for ta, tb in ((np.uint8, np.uint8), (np.int8, np.int8), (np.uint8, np.int8)):
        f = {"a": _q(rng, ta, (2, 6, 12)), "a_scale": np.array(0.0125, np.float32), "a_zero_point": _q(rng, ta, ()),
             "b": _q(rng, tb, (12, 8)), "b_scale": np.linspace(0.01, 0.02, 8).astype(np.float32),
             "b_zero_point": _q(rng, tb, (8,)), "y_scale": np.array(0.75, np.float32),
             "y_zero_point": _q(rng, ta, ())}
        model = qlinear_matmul_model(f)
        expected = np_qlinear_matmul(f)
        acc = np_accumulate(f["a"], f["a_zero_point"], f["b"], f["b_zero_point"])
        m = f["a_scale"] * f["b_scale"] / f["y_scale"]
        f32 = np.rint((acc.astype(np.float32) * m).astype(np.float32))
        if np.array_equal(f32, np.rint(acc * m.astype(np.float64))):
            # uint8 x int8 widened to uint8 (oracles.py): exact sums on any CPU, the same requantization
            sess = ort.InferenceSession(widen_u8s8(model).model.SerializeToString(), providers=["CPUExecutionProvider"])
            assert_bits(sess.run(None, f)[0], expected, "onnxruntime")
        assert_bits(run_gpu(best, model, f)[0], expected, "gpu")


@settings(max_examples=gpu_examples(5))
@given(case=matmul_case(float8=True))
def test_float8_qlinear_matmul(best, case):
    """Opset-21 float8 a, b, y (every type, zero points 0 as the float8 convention has it):
    the simple variant (the only one for float8) equals the documented float32 definition."""
    model = qlinear_matmul_model(case)
    got, plan = run_gpu(best, model, case)
    assert plan.variant == "simple"
    assert_bits(got, np_float8_qlinear_matmul(case), "float8")


# ----------------------------------------------------------------------------- MatMulInteger

@st.composite
def matmul_integer_case(draw):
    f = draw(matmul_case())
    a, b = f["a"], f["b"]
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    out = {"A": a, "B": b}
    azp = draw(st.sampled_from(["absent", "scalar", "one", "row"]))
    bzp = draw(st.sampled_from(["absent", "scalar", "one", "col"]))
    if a.ndim == 1 and azp == "row":
        azp = "scalar"
    if b.ndim == 1 and bzp == "col":
        bzp = "scalar"
    if azp != "absent":
        shape = {"scalar": (), "one": (1,), "row": (a.shape[0],) if a.ndim == 2 else a.shape[:-1] + (1,)}[azp]
        out["a_zero_point"] = _q(rng, a.dtype, shape)
    if bzp != "absent":
        shape = {"scalar": (), "one": (1,), "col": (b.shape[-1],) if b.ndim == 2 else b.shape[:-2] + (1, b.shape[-1])}[bzp]
        out["b_zero_point"] = _q(rng, b.dtype, shape)
    return out


@settings(max_examples=gpu_examples())
@given(case=matmul_integer_case())
def test_matmul_integer_every_variant(best, case):
    """Optional zero points (absent, scalar, per-row of A, per-column of B) x shapes x dtypes."""
    model = matmul_integer_model(case)
    azp = case.get("a_zero_point", np.zeros((), case["A"].dtype))
    bzp = case.get("b_zero_point", np.zeros((), case["B"].dtype))
    expected = np_accumulate(case["A"], azp, case["B"], bzp)
    assert_bits(expected, reference_outputs(model, case), "numpy vs onnx.reference")
    for v in VARIANTS:
        got, plan = run_gpu(best, model, case, v)
        assert plan.variant == v
        assert_bits(got, expected, f"variant {v}")


def test_matmul_integer_int32_wraps_like_numpy(best):
    """A sum beyond int32 (33100 * 255 * 255 > 2^31) wraps (two's complement), as numpy's
    int32 matmul and the reference do."""
    k = 33100
    f = {"A": np.full((1, k), 255, np.uint8), "B": np.full((k, 4), 255, np.uint8),
         "a_zero_point": np.array(0, np.uint8), "b_zero_point": np.array(0, np.uint8)}
    f["A"][0, :3] = 7
    model = matmul_integer_model(f)
    expected = np_accumulate(f["A"], f["a_zero_point"], f["B"], f["b_zero_point"])
    assert expected[0, 0] < 0  # wrapped
    assert_bits(expected, reference_outputs(model, f), "numpy vs onnx.reference")
    for v in VARIANTS:
        assert_bits(run_gpu(best, model, f, v)[0], expected, v)


# ----------------------------------------------------------------------------- conformance

def test_onnx_node_cases(best):
    """ONNX's own node test cases for QLinearMatMul and MatMulInteger pass with every variant."""
    assert assert_node_cases_every_variant(best, {"QLinearMatMul"}, QL_VARIANTS) >= 8
    assert assert_node_cases_every_variant(best, {"MatMulInteger"}, VARIANTS) >= 1


# ----------------------------------------------------------------------------- edges, limits, errors

@pytest.mark.parametrize("a_shape,b_shape", [((0, 5), (5, 3)), ((4, 0), (0, 3)), ((4, 5), (5, 0)),
                                             ((0, 2, 3), (3, 4)), ((3,), (3,)), ((1, 2, 3), (0, 3, 2))])
def test_empty_and_degenerate_shapes(best, a_shape, b_shape):
    """Empty outputs, K = 0 (every output is the zero point) and 1-D x 1-D (a scalar)."""
    rng = np.random.default_rng(1)
    f = {"a": _q(rng, np.uint8, a_shape), "a_scale": np.array(0.1, np.float32), "a_zero_point": np.array(3, np.uint8),
         "b": _q(rng, np.uint8, b_shape), "b_scale": np.array(0.2, np.float32), "b_zero_point": np.array(4, np.uint8),
         "y_scale": np.array(0.5, np.float32), "y_zero_point": np.array(9, np.uint8)}
    expected = np_qlinear_matmul(f)
    model = qlinear_matmul_model(f)
    for v in (None,) + QL_VARIANTS:
        try:
            got = run_gpu(best, model, f, v)[0]
        except ExecutionError:
            assert v in ("blocked", "tiled", "blocked_epilogue", "tiled_epilogue") and expected.size == 0  # need a non-empty output
            continue
        assert_bits(got, expected, f"{a_shape} x {b_shape} {v}")


@pytest.mark.gpu
def test_grids_split_beyond_the_dispatch_limit():
    """With maxComputeWorkgroupsPerDimension lowered to 16, every pass splits its 1-D sequence
    of workgroups over x and y (spare workgroups return) and results stay exact."""
    from onnx_quant.backend_wgpu.device import get_device

    try:
        small = get_device(None, limits={"maxComputeWorkgroupsPerDimension": 16})
    except DeviceError as e:
        skip_unless_ci(f"cannot lower the limit here: {e}")
    rng = np.random.default_rng(2)
    f = {"a": _q(rng, np.int8, (2, 40, 20)), "a_scale": np.array(0.05, np.float32), "a_zero_point": np.array(1, np.int8),
         "b": _q(rng, np.uint8, (20, 36)), "b_scale": np.array(0.02, np.float32), "b_zero_point": np.array(128, np.uint8),
         "y_scale": np.array(0.3, np.float32), "y_zero_point": np.array(-5, np.int8)}
    model = qlinear_matmul_model(f)
    expected = np_qlinear_matmul(f)
    tun = {"WG_ROWS": 2, "WG_COLS": 2, "ROWS_PER_THREAD": 2, "COL_WORDS_PER_THREAD": 1, "TILE_WG_ROWS": 2,
           "TILE_WG_COLS": 2, "TILE_ROWS_PER_THREAD": 2, "TILE_COL_WORDS_PER_THREAD": 1, "SIMPLE_WORKGROUP_SIZE": 8}
    for v in QL_VARIANTS:
        got, plan = run_gpu(small, model, f, v, tunables=tun)
        assert any(p.dispatch[1] > 1 for p in plan.passes), (v, [p.dispatch for p in plan.passes])
        assert_bits(got, expected, v)


def _plan(feeds, device_limits=None, variant=None, tunables=None, y_shape=(6, 4)):
    from onnx_quant.backend_wgpu.device_info import WEBGPU_DEFAULT_LIMITS, DeviceInfo
    from onnx_quant.backend_wgpu.planner import plan_node
    from onnx_quant.backend_wgpu.spec import load_specs

    spec = load_specs().find("", "QLinearMatMul", 21)
    shapes = {n: v.shape for n, v in feeds.items()}
    shapes["y"] = y_shape
    dtypes = {n: element_type(v.dtype).name for n, v in feeds.items()}
    dtypes["y"] = dtypes["y_zero_point"]
    return plan_node(spec, shapes=shapes, dtypes=dtypes, device=DeviceInfo(limits=dict(WEBGPU_DEFAULT_LIMITS, **(device_limits or {}))),
                     variant=variant, tunables=tunables, node_label="qmm")


def _small_feeds(**over):
    rng = np.random.default_rng(0)
    f = {"a": _q(rng, np.uint8, (6, 8)), "a_scale": np.array(0.1, np.float32), "a_zero_point": np.array(1, np.uint8),
         "b": _q(rng, np.uint8, (8, 4)), "b_scale": np.array(0.1, np.float32), "b_zero_point": np.array(1, np.uint8),
         "y_scale": np.array(0.1, np.float32), "y_zero_point": np.array(1, np.uint8)}
    f.update(over)
    return f


def test_selection_rule_without_a_device():
    """blocked_epilogue (priority 24) > blocked (20) > tiled_epilogue (14) > tiled (10) > simple
    (0): a workgroup limit too small for blocked's 8x8 takes tiled_epilogue (lowered to 4x4),
    workgroup memory too small for the tile takes simple; forcing never bypasses a when clause;
    the two-pass variants stay forcible."""
    f = _small_feeds()
    assert _plan(f).variant == "blocked_epilogue"
    assert [p.id for p in _plan(f).passes] == ["params", "gemm"]
    assert [p.id for p in _plan(f, variant="blocked").passes] == ["params", "gemm", "requant"]
    small_tile = {"TILE_WG_ROWS": 4, "TILE_WG_COLS": 4}
    assert _plan(f, {"maxComputeInvocationsPerWorkgroup": 32}, tunables=small_tile).variant == "tiled_epilogue"
    plan = _plan(f, {"maxComputeInvocationsPerWorkgroup": 32, "maxComputeWorkgroupStorageSize": 512}, tunables=small_tile)
    assert plan.variant == "simple"
    assert plan.selection["tiled"] == "tiledFits" and plan.selection["blocked"] == "blockedFits"
    assert plan.selection["tiled_epilogue"] == "tiledFits" and plan.selection["blocked_epilogue"] == "epilogueFits"
    with pytest.raises(ExecutionError, match="cannot force"):
        _plan(f, {"maxComputeWorkgroupStorageSize": 512}, variant="tiled")
    # PREFER_TILED=1 (for devices where workgroup-memory tiles win) puts tiled first where it fits
    assert _plan(f, tunables={"PREFER_TILED": 1}).variant == "tiled_epilogue"
    assert _plan(f, {"maxComputeWorkgroupStorageSize": 512}, tunables={"PREFER_TILED": 1}).variant == "blocked_epilogue"


@pytest.mark.parametrize("change,clause", [
    ({"a_scale": np.full((3,), 0.1, np.float32), "a_zero_point": np.ones(3, np.uint8)}, "aParamsPerTensorOrPerRow"),
    ({"a_scale": np.full((6, 1), 0.1, np.float32)}, "aParamsPerTensorOrPerRow"),
    ({"b_scale": np.full((8,), 0.1, np.float32), "b_zero_point": np.ones(8, np.uint8)}, "bParamsPerTensorOrPerColumn"),
    ({"y_scale": np.full((2,), 0.1, np.float32), "y_zero_point": np.ones(2, np.uint8)}, "yParamsPerTensor"),
])
def test_bad_parameter_shapes_are_refused(change, clause):
    """A parameter that is neither per-tensor nor per-row/per-column (or whose scale and zero
    point disagree) is an ExecutionError naming the node and the rule, before any GPU work."""
    with pytest.raises(ExecutionError, match=f"qmm.*no variant applies.*{clause}"):
        _plan(_small_feeds(**change))


def test_mixed_integer_and_float8_types_are_refused():
    f = _small_feeds(b=np.zeros((8, 4), ml_dtypes.float8_e4m3fn), b_zero_point=np.zeros((), ml_dtypes.float8_e4m3fn))
    with pytest.raises(ExecutionError, match="typesAreAllIntegerOrAllFloat8"):
        _plan(f)

"""The kernels quantized transformer / CNN / MLP models needed beyond the QLinear family:
QGemm and QLinearSoftmax (com.microsoft), LayerNormalization-17, Gelu-20 (and com.microsoft
Gelu), Erf-13. Every variant of each kernel is forced on small tensors and must give the same
bits as the others.

Oracles and what "agrees" means:

- **QGemm**: onnxruntime CPU, bit for bit, and ``np_qgemm`` (the same algorithm in numpy: int32
  accumulation plus int32 C, multipliers RN(RN(alpha * a_scale) * b_scale[j]) [/ y_scale], then
  MLAS's requantization: RN(f32(acc) * m) clamped in float, rounded half to even, plus the zero
  point; or the float32 product). Integer results are exact, so every variant is exact.
- **QLinearSoftmax**: onnxruntime CPU, bit for bit, and ``np_qlinear_softmax`` (onnxruntime
  1.32's algorithm as measured on its outputs: a 256-entry float32 table
  T[d] = f32(exp(((d - 255) + B / x_scale) * x_scale)) in float64 with B = max(logf(FLT_MAX / D)
  - 5, 0), logf in float32; the row sum of T[x - max + 255] in row order in float32;
  q = RN(RN(T * RN(1 / S)) * floor(RN(1 / y_scale))); y = round half to even(q) + y_zp,
  saturated). Which of the plausible orders onnxruntime uses was decided by running it on
  rows where the candidates disagree (sequential sum: 200 of 201 such rows; the 201st, a
  109-element int8 row exactly at a rounding tie, stayed unexplained by every order tried), and
  on outputs at rounding ties (zero point added after rounding, ``(T * inv) * Ys``, not
  ``T * (inv * Ys)`` nor ``q / y_scale``). The table's exp and logf run on the device in 64-bit
  fixed point (snippets/fixed_point.wgsl.jinja); ``test_fixed_point_*`` compare them with
  math.log / numpy's float64 exp rounded to float32 on every table entry of many (x_scale, D):
  no difference. onnxruntime's float64 exponent B / x_scale + (d - 255), times x_scale, is not
  emulated: it differs from the exact exponent by about 2^-45 relative, so a table entry may
  round the other way with probability about 2^-20 (none seen in 150,000 entries).
- **Gelu / Erf**: float64 references (math.erf, numpy tanh). Tolerance: |y - y64| <= 2^-22 |x|
  (Gelu), 3 ulp (Erf). Why: y = 0.5 x (1 + t) with t = erf or tanh from the project's float32
  polynomials (snippets/special_functions.wgsl.jinja: at most 2.4 / 1.2 ulp of t, i.e. an
  absolute error below 1.5e-7), which moves y by at most 0.5 |x| 1.5e-7, plus the roundings of
  x / sqrt 2, 0.5 x and the product (<= 2 ulp of |x| / 2): below 2^-22 |x|. onnxruntime is
  measured at 1.0e-7 |x| (none) and 1.7e-7 |x| (tanh) from the same reference; the bound is
  relative to |x| because for large negative x, y is the tiny difference 1 + t (onnxruntime
  and this kernel both give 0 where the exact value is 1e-8 |x|).
- **LayerNormalization**: a float64 two-pass reference. Tolerance: |y - y64| <= 2^-24 (16 +
  D / 16) * mag, mag = |scale| (|x| + |mean|) / sd + |bias|: the roundings of the mean and
  variance sums (64 lanes of D / 64 sequential terms, then a 6-level tree), of x - mean (which
  is relative to |x| + |mean|), of the division and of the affine step. Measured: 7.1 units of
  2^-24 * mag here, onnxruntime 4.4.

Devices: the best adapter (lavapipe Vulkan here) and the OpenGL adapter, WebGPU default limits.
"""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_quant.errors import ExecutionError, QuantError
from support.arrays import ints as _ints
from support.models import make_model, qsm_model
from support.oracles import np_qlinear_softmax, np_softmax_table, onnxruntime_run
from support.run import applicable, run_variants

f32 = np.float32
FLT_MAX = np.finfo(np.float32).max


# ----------------------------------------------------------------------------- devices

# ----------------------------------------------------------------------------- helpers

def _model(node, inputs, inits, out_type, opset=21, ms=False, out_shape=None):
    return make_model(node, inputs, [(node.output[0], out_type, out_shape)], inits, opset,
                      extra_opsets=["com.microsoft"] if ms else ())


def ort_run(model, feeds):
    """onnxruntime's output with exact uint8 x int8 sums on any CPU (support.oracles.onnxruntime_run)."""
    return onnxruntime_run(model, feeds)[0]


# ============================================================================= QGemm

def np_qgemm(A, a_scale, a_zp, B, b_scale, b_zp, C, y_scale, y_zp, alpha=1.0, transA=0, transB=0):
    a = (A.T if transA else A).astype(np.int64) - int(np.asarray(a_zp).reshape(-1)[0])
    b = (B.T if transB else B).astype(np.int64)
    n = b.shape[1]
    bz = np.broadcast_to(np.asarray(b_zp).astype(np.int64).reshape(-1), (n,))
    acc = a @ (b - bz[None, :])
    if C is not None:
        acc = acc + np.broadcast_to(C.astype(np.int64), acc.shape)
    acc = ((acc + 2**31) % 2**32 - 2**31).astype(np.int32)
    m = (f32(alpha) * f32(np.asarray(a_scale).reshape(-1)[0])).astype(f32) \
        * np.broadcast_to(np.asarray(b_scale, f32).reshape(-1), (n,))
    m = m.astype(f32)
    if y_scale is None:
        return (acc.astype(f32) * m[None, :]).astype(f32)
    m = (m / f32(np.asarray(y_scale).reshape(-1)[0])).astype(f32)
    v = (acc.astype(f32) * m[None, :]).astype(f32)
    z = int(np.asarray(y_zp).reshape(-1)[0])
    info = np.iinfo(np.asarray(y_zp).dtype)
    v = np.minimum(np.maximum(v, f32(info.min - z)), f32(info.max - z))
    return (np.rint(v).astype(np.int32) + z).astype(np.asarray(y_zp).dtype)


def qgemm_case(rng, types, M, K, N, *, transA=0, transB=0, c_shape=None, per_column=False, quantized=True,
               alpha=1.0, scale_range=(0.001, 0.05)):
    at, bt = types
    A = _ints(rng, at, (K, M) if transA else (M, K))
    B = _ints(rng, bt, (N, K) if transB else (K, N))
    a_scale = np.array(rng.uniform(*scale_range), f32)
    a_zp = _ints(rng, at, ())
    if per_column:
        b_scale, b_zp = rng.uniform(*scale_range, size=(N,)).astype(f32), _ints(rng, bt, (N,))
    else:
        b_scale, b_zp = np.array(rng.uniform(*scale_range), f32), _ints(rng, bt, ())
    C = None if c_shape is None else rng.integers(-40000, 40000, size=c_shape).astype(np.int32)
    y_scale = np.array(rng.uniform(0.02, 0.4), f32) if quantized else None
    y_zp = _ints(rng, at, ()) if quantized else None
    return dict(A=A, a_scale=a_scale, a_zp=a_zp, B=B, b_scale=b_scale, b_zp=b_zp, C=C, y_scale=y_scale, y_zp=y_zp,
                alpha=alpha, transA=transA, transB=transB)


def qgemm_model(case, b_as_input=False):
    names = ["A", "a_scale", "a_zp", "B", "b_scale", "b_zp", "C", "y_scale", "y_zp"]
    used = [n if case[n] is not None else "" for n in names]
    while used and not used[-1]:
        used.pop()
    attrs = {k: case[k] for k in ("alpha", "transA", "transB") if case[k] != (1.0 if k == "alpha" else 0)}
    node = helper.make_node("QGemm", used, ["Y"], domain="com.microsoft", name="qgemm", **attrs)
    graph_inputs = ["A"] + (["B"] if b_as_input else [])
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(case[n].dtype), case[n].shape)
              for n in graph_inputs]
    inits = [numpy_helper.from_array(np.asarray(case[n]), n) for n in names if case[n] is not None and n not in graph_inputs]
    out = TensorProto.FLOAT if case["y_scale"] is None else helper.np_dtype_to_tensor_dtype(case["A"].dtype)
    return _model(node, inputs, inits, out, ms=True), {n: case[n] for n in graph_inputs}


def np_qgemm_case(case):
    return np_qgemm(case["A"], case["a_scale"], case["a_zp"], case["B"], case["b_scale"], case["b_zp"], case["C"],
                    case["y_scale"], case["y_zp"], case["alpha"], case["transA"], case["transB"])


QGEMM_TYPES = [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)]
QGEMM_FORCE_ALL = {"QGemm": {"BLOCKED_MIN_MACS": 0}}

QGEMM_CASES = [
    # (types, M, K, N, transA, transB, C shape, per column, quantized, alpha)
    (0, 5, 8, 12, 0, 0, None, False, True, 1.0),
    (1, 7, 13, 9, 0, 1, (9,), True, True, 1.0),        # the quantizer's layout: B^T, per-channel, bias [N]
    (2, 6, 11, 5, 1, 0, (6, 1), False, True, 0.75),
    (1, 3, 4, 4, 1, 1, (3, 4), True, False, 1.0),      # float output, C [M, N]
    (0, 9, 5, 3, 0, 1, (1, 3), False, False, 2.5),
    (2, 1, 1, 1, 0, 0, (), False, True, 1.0),
    (0, 17, 33, 21, 1, 1, (21,), True, True, 1.0),     # several workgroups of the blocked core
    (2, 2, 7, 18, 0, 0, (1,), True, False, 0.5),
]


@pytest.mark.parametrize("index", range(len(QGEMM_CASES)), ids=[f"c{i}" for i in range(len(QGEMM_CASES))])
def test_qgemm_every_variant_matches_onnxruntime(dev, index):
    ti, M, K, N, ta, tb, cs, pc, q, alpha = QGEMM_CASES[index]
    rng = np.random.default_rng(100 + index)
    c = qgemm_case(rng, QGEMM_TYPES[ti], M, K, N, transA=ta, transB=tb, c_shape=cs, per_column=pc, quantized=q,
                   alpha=alpha)
    model, feeds = qgemm_model(c)
    got = run_variants(dev, model, feeds, QGEMM_FORCE_ALL, expect=("simple", "blocked", "blocked_epilogue"))
    expected = ort_run(model, feeds)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert np.array_equal(got.view(np.uint8), expected.view(np.uint8))
    assert np.array_equal(got.view(np.uint8), np_qgemm_case(c).view(np.uint8))


def test_qgemm_random_shapes_match_onnxruntime(best):
    """Random types, shapes, transposes, C shapes, granularity, output kind and alpha
    (40 cases, every variant each)."""
    rng = np.random.default_rng(2024)
    for _ in range(40):
        M, K, N = (int(v) for v in rng.integers(1, 24, size=3))
        cs = [None, (N,), (1, N), (M, N), (M, 1), (), (1,)][int(rng.integers(0, 7))]
        c = qgemm_case(rng, QGEMM_TYPES[int(rng.integers(0, 3))], M, K, N, transA=int(rng.integers(0, 2)),
                       transB=int(rng.integers(0, 2)), c_shape=cs, per_column=bool(rng.integers(0, 2)),
                       quantized=bool(rng.integers(0, 2)), alpha=float(f32(rng.uniform(0.2, 3))))
        model, feeds = qgemm_model(c)
        got = run_variants(best, model, feeds, QGEMM_FORCE_ALL)
        assert np.array_equal(got.view(np.uint8), ort_run(model, feeds).view(np.uint8))


def test_qgemm_blocked_across_many_workgroups(best):
    """Small blocked tiles (2 x 2 invocations of 2 rows x 4 columns): 5 x 3 workgroups with
    partial tiles at both edges, unaligned K and N, both operands transposed."""
    rng = np.random.default_rng(8)
    c = qgemm_case(rng, (np.uint8, np.int8), 17, 13, 21, transA=1, transB=1, c_shape=(17, 1), per_column=True)
    model, feeds = qgemm_model(c)
    small = {"QGemm": {"BLOCKED_MIN_MACS": 0, "WG_COLS": 2, "WG_ROWS": 2, "ROWS_PER_THREAD": 2,
                       "COL_WORDS_PER_THREAD": 1}}
    got = run_variants(best, model, feeds, small, expect=("simple", "blocked", "blocked_epilogue"))
    assert np.array_equal(got, ort_run(model, feeds))


def test_qgemm_saturates_and_wraps_like_onnxruntime(best):
    """Large scales push every code to the clamps; a huge C wraps the int32 sum as MLAS does."""
    rng = np.random.default_rng(5)
    c = qgemm_case(rng, (np.uint8, np.int8), 6, 40, 8, transB=1, c_shape=(8,), per_column=True,
                   scale_range=(0.5, 2.0))
    c["C"] = np.array([2**31 - 1, -2**31, 7, 0, 2**30, -2**30, 1, -1], np.int32)
    model, feeds = qgemm_model(c)
    got = run_variants(best, model, feeds, QGEMM_FORCE_ALL)
    assert np.array_equal(got, ort_run(model, feeds))
    assert np.array_equal(got, np_qgemm_case(c))
    assert {0, 255} <= set(np.unique(got).tolist())


def test_qgemm_b_fed_at_run_time(best):
    """B as a graph input (not an initializer onnxruntime could pre-pack)."""
    rng = np.random.default_rng(6)
    c = qgemm_case(rng, (np.uint8, np.uint8), 4, 9, 6, transB=1, c_shape=(6,))
    model, feeds = qgemm_model(c, b_as_input=True)
    got = run_variants(best, model, feeds, QGEMM_FORCE_ALL)
    assert np.array_equal(got, ort_run(model, feeds))


QGEMM_SHAPES = {"A": (4, 9), "a_scale": (), "a_zero_point": (), "B": (9, 6), "b_scale": (), "b_zero_point": (),
                "C": (6,), "y_scale": (), "y_zero_point": (), "Y": (4, 6)}
QGEMM_DTYPES = {"A": "uint8", "a_scale": "float32", "a_zero_point": "uint8", "B": "uint8", "b_scale": "float32",
                "b_zero_point": "uint8", "C": "int32", "y_scale": "float32", "y_zero_point": "uint8", "Y": "uint8"}


@pytest.mark.parametrize("change, rule", [
    (dict(y_zero_point=None), "outputKindAgrees"),                    # y_scale without y_zero_point
    (dict(y_scale=None, y_zero_point=None), "outputKindAgrees"),      # float output declared uint8
    (dict(b_scale=(3,), b_zero_point=(3,)), "bParamsPerTensorOrPerColumn"),  # 3 scales, N = 6
    (dict(b_scale=(6,)), "bParamsPerTensorOrPerColumn"),              # per-column scale, scalar zero point
    (dict(C=(5, 6)), "cBroadcasts"),                                  # C rows != M
    (dict(B=(8, 6)), "innerDimsAgree"),
])
def test_qgemm_refuses_bad_nodes_naming_the_rule(best, change, rule):
    """The spec refuses what onnxruntime's QGemm refuses (CheckInputs, GemmHelper), naming the
    node and the failing rule of every variant."""
    from onnx_quant.backend_wgpu.planner import plan_node
    from onnx_quant.backend_wgpu.spec import load_specs

    spec = load_specs().find("com.microsoft", "QGemm", 1)
    shapes, dtypes = dict(QGEMM_SHAPES), dict(QGEMM_DTYPES)
    for k, v in change.items():
        if v is None:
            del shapes[k], dtypes[k]
        else:
            shapes[k] = v
    with pytest.raises(ExecutionError) as e:
        plan_node(spec, shapes=shapes, dtypes=dtypes, device=best.info, node_label="qgemm")
    assert "qgemm" in str(e.value) and "no variant applies" in str(e.value)
    assert str(e.value).count(rule) == 3, str(e.value)  # every variant's first failing clause


# ============================================================================= QLinearSoftmax

QSM_CASES = [
    # dtype, shape, axis, opset, y_scale, y_zp
    (np.uint8, (3, 16), -1, 21, 1 / 256, 0),        # the quantizer's form (fused rows)
    (np.int8, (2, 3, 8), -1, 13, 1 / 256, -128),
    (np.uint8, (4, 5, 6), 1, 13, 0.013, 7),          # a middle axis: strided rows
    (np.int8, (2, 7, 3), 0, 21, 0.02, -100),
    (np.uint8, (3, 4, 5), None, 11, 1 / 255, 3),     # opset < 13, no axis: -1 (onnxruntime's schema default)
    (np.uint8, (3, 4, 5), 1, 11, 1 / 255, 3),        # opset < 13: coerce to 2-D at axis 1
    (np.int8, (2, 3, 4), 2, 12, 1 / 256, -128),
    (np.uint8, (1, 1), -1, 21, 1 / 256, 0),          # one element: Ys * 1
    (np.int8, (5, 33), -1, 21, 0.0041841, -96),      # odd row length
    (np.uint8, (1, 2500), -1, 21, 1 / 256, 0),       # a long row
]


@pytest.mark.parametrize("index", range(len(QSM_CASES)), ids=[f"c{i}" for i in range(len(QSM_CASES))])
def test_qlinear_softmax_every_variant_matches_onnxruntime(dev, index):
    dt, shape, axis, opset, ysc, yzp = QSM_CASES[index]
    rng = np.random.default_rng(200 + index)
    x = _ints(rng, dt, shape)
    xs = f32(rng.uniform(0.01, 0.2))
    model = qsm_model(x, xs, f32(ysc), yzp, axis, opset)
    got = run_variants(dev, model, {"x": x})
    assert np.array_equal(got, ort_run(model, {"x": x}))
    assert np.array_equal(got, np_qlinear_softmax(x, xs, f32(ysc), yzp, axis, opset))


def test_qlinear_softmax_fused_rows_and_segments_agree(best):
    rng = np.random.default_rng(3)
    x = _ints(rng, np.uint8, (6, 24))
    model = qsm_model(x, f32(0.05), f32(1 / 256), 0, -1, 21)
    assert applicable(best, model, {"x": x}) == ["fused", "rows", "segments"]
    assert np.array_equal(run_variants(best, model, {"x": x}), ort_run(model, {"x": x}))


def _tie_sensitive_rows(rng, count):
    """Rows whose outputs lie within 2e-6 of a rounding tie in onnxruntime's arithmetic, where
    the summation order, the operation order and the table bits all decide the result."""
    found = []
    while len(found) < count:
        signed = bool(rng.integers(0, 2))
        dt = np.int8 if signed else np.uint8
        D = int(rng.integers(2, 120))
        x = _ints(rng, dt, (1, D))
        xs = f32(rng.uniform(0.001, 0.05))
        ysc = f32(1 / int(rng.integers(2, 257))) if rng.random() < 0.5 else f32(rng.uniform(0.0039, 0.05))
        T = np_softmax_table(xs, D)
        v = x[0].astype(np.int64)
        t = T[v - v.max() + 255]
        inv = f32(f32(1.0) / np.cumsum(t, dtype=f32)[-1])
        q = ((t * inv).astype(f32) * f32(np.floor(f32(1) / ysc))).astype(np.float64)
        if np.abs(q - np.floor(q) - 0.5).min() <= 2e-6 * max(1.0, q.max()):
            yzp = int(rng.integers(-128, 0)) if signed else int(rng.integers(0, 128))
            found.append((x, xs, ysc, yzp))
    return found


def test_qlinear_softmax_rows_at_rounding_ties_match_onnxruntime(best):
    rng = np.random.default_rng(21)
    for x, xs, ysc, yzp in _tie_sensitive_rows(rng, 8):
        model = qsm_model(x, xs, ysc, yzp, -1, 21)
        got = run_variants(best, model, {"x": x})
        assert np.array_equal(got, ort_run(model, {"x": x})), (x.tolist(), xs, ysc, yzp)


def test_qlinear_softmax_saturation_and_absent_y_zero_point(best):
    """int8 rows whose top probability rounds to 256 - 128 = 128 saturate to 127, as
    onnxruntime's do. Without y_zero_point (onnxruntime's schema requires it, its kernel reads
    0 then) the kernel uses 0: checked against the numpy model."""
    x = np.array([[100, -100, -90, -120], [5, 5, 5, 5]], np.int8)
    model = qsm_model(x, f32(0.3), f32(1 / 256), -128, -1, 21)
    got = run_variants(best, model, {"x": x})
    assert np.array_equal(got, ort_run(model, {"x": x}))
    assert got[0, 0] == 127
    xu = np.array([[3, 200, 7, 9, 200, 0, 0, 200]], np.uint8)
    model = qsm_model(xu, f32(0.1), f32(1 / 256), 0, -1, 21, with_y_zp=False)
    got = run_variants(best, model, {"x": xu})
    assert np.array_equal(got, np_qlinear_softmax(xu, f32(0.1), f32(1 / 256), 0))


def test_qlinear_softmax_empty_input(best):
    from onnx_quant.backend_wgpu.session import Session

    x = np.zeros((0, 8), np.uint8)
    model = qsm_model(x, f32(0.1), f32(1 / 256), 0, -1, 21)
    with Session(model, device=best, allow_host_fallback=False) as s:
        out = s.run(None, {"x": x})[0]
    assert out.shape == (0, 8) and out.dtype == np.uint8


def test_qlinear_softmax_long_rows_take_the_segments_variant(best):
    """A one-pass variant sums a row in one invocation: rows longer than MAX_ROW_LENGTH take
    `segments` (the sum continued over one pass per SEGMENT_LENGTH positions: llvmpipe ends an
    invocation after 65535 loop iterations, silently); rows of more than 8 segments are refused."""
    from onnx_quant.backend_wgpu.planner import plan_node
    from onnx_quant.backend_wgpu.spec import load_specs

    spec = load_specs().find("com.microsoft", "QLinearSoftmax", 1)

    def plan(D, **tunables):
        shapes = {"x": (2, D), "x_scale": (), "y_scale": (), "y_zero_point": (), "y": (2, D)}
        dtypes = {"x": "uint8", "x_scale": "float32", "y_scale": "float32", "y_zero_point": "uint8", "y": "uint8"}
        return plan_node(spec, shapes=shapes, dtypes=dtypes, device=best.info, node_label="qsm",
                         attributes={"opset": 13}, tunables=tunables)

    p = plan(20000)
    assert p.variant == "segments"
    assert [q.id for q in p.passes] == ["table", "chunk_max", "segment0", "map"]
    assert [q.id for q in plan(70000).passes] == ["table", "chunk_max", "segment0", "segment1", "segment2", "map"]
    assert plan(20000, MAX_ROW_LENGTH=20000).variant == "fused"
    with pytest.raises(ExecutionError) as e:
        plan(8 * 32768 + 1)
    assert "segments <= 8" in str(e.value) and str(e.value).count("D <= tunables.MAX_ROW_LENGTH") == 2


def test_qlinear_softmax_needs_the_opset_attribute(best):
    from onnx_quant.backend_wgpu.session import Session

    x = np.zeros((2, 8), np.uint8)
    model = qsm_model(x, f32(0.1), f32(1 / 256), 0, -1, 21)
    del model.graph.node[0].attribute[:]
    with pytest.raises(QuantError, match="opset"):
        with Session(model, device=best, allow_host_fallback=False) as s:
            s.run(None, {"x": x})


# ----------------------------------------------------------------------------- fixed point

_FX_KERNEL = """
{% include "snippets/numerics.wgsl.jinja" %}
{% include "snippets/float_exact.wgsl.jinja" %}
{% include "snippets/fixed_point.wgsl.jinja" %}
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> o: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = g.y * nwg.x * 64u + g.x;
  if (i >= arrayLength(&a) / 2u) { return; }
  let u = bitcast<f32>(a[2u * i]);
  let v = bitcast<f32>(a[2u * i + 1u]);
{{ body }}
}
"""

# exp(v - n u) for n = i % 256, u = x_scale, v = B (the table entry), as the snippet's caller does
_TABLE_BODY = """
  let n = i % 256u;
  var r = 0.0;
  if (v - f32(n) * u >= -110.0) {
    let sx = oq_split_norm(u);
    let e = sx.y + 52;
    var nx = vec2<u32>(n * u32(sx.x), 0u);
    if (e >= 0) { nx = oq_fe_shl64(nx, u32(e)); } else { nx = oq_fe_shr64(nx, u32(-e)); }
    r = oq_fx_exp_f32(oq_fe_sub64(oq_fx_from_f32(v, 52), nx));
  }
  o[i] = bitcast<u32>(r);"""


def run_pairs(dev, body: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    from onnx_quant.backend_wgpu.pipelines import layout_key
    from onnx_quant.backend_wgpu.plan import BindingPlan
    from onnx_quant.backend_wgpu.render import render_string

    binds = (BindingPlan(0, "a", "a", "read", "u32"), BindingPlan(1, "o", "o", "read_write", "u32"))
    words = np.ascontiguousarray(np.stack([u, v], 1), dtype=f32).view(np.uint32).reshape(-1)
    n = words.size // 2
    comp = dev.compile(render_string(_FX_KERNEL, {"body": body}), layout_key(binds), label="fixed point")
    a, o = dev.allocate(4 * words.size), dev.allocate(max(4, 4 * n))
    dev.upload(a, words)
    bg = dev.bind(comp, [(0, a, a.size), (1, o, o.size)])
    staging = dev.allocate_staging(o.size)
    groups = -(-n // 64)
    raw = dev.launch([(comp, bg, (min(groups, 65535), -(-groups // 65535), 1), "fixed point")],
                     copies=[(o, 0, staging, 0, o.size)], read=staging)
    return np.frombuffer(raw, np.uint32)[:n].copy()


def test_fixed_point_logf_is_correctly_rounded(dev):
    rng = np.random.default_rng(0)
    q = np.concatenate([(f32(FLT_MAX) / np.arange(1, 20001, dtype=f32)).astype(f32),
                        np.exp(rng.uniform(-85, 88, 20000)).astype(f32),
                        np.array([1.0, 2.0, 0.5, 1.0000001, 0.99999994, 1.1754944e-38, FLT_MAX], f32)])
    got = run_pairs(dev, "  o[i] = bitcast<u32>(oq_fx_logf_cr(u));", q, q)
    expected = np.array([f32(math.log(float(v))) for v in q]).view(np.uint32)
    assert np.array_equal(got, expected), np.nonzero(got != expected)[0][:10]


def test_fixed_point_softmax_tables_are_exact(dev):
    """Every entry of 200 tables (random x_scale over four decades, D up to 5000) equals numpy's
    float64 exp rounded to float32, subnormal and zero entries included."""
    rng = np.random.default_rng(1)
    us, vs = [], []
    for t in range(200):
        D = int(rng.integers(1, 5000))
        xs = f32(rng.uniform(0.0005, 0.3) if t % 2 else 10 ** rng.uniform(-4, 0.3))
        b = f32(max(0.0, float(f32(math.log(float(f32(f32(FLT_MAX) / f32(D)))))) - 5.0))
        us.append(np.full(256, xs, f32))
        vs.append(np.full(256, b, f32))
    u, v = np.concatenate(us), np.concatenate(vs)
    got = run_pairs(dev, _TABLE_BODY, u, v)
    n = np.tile(np.arange(256), 200)
    with np.errstate(under="ignore"):
        expected = np.exp((-n + v.astype(np.float64) / u.astype(np.float64)) * u.astype(np.float64)).astype(f32)
    assert np.array_equal(got, expected.view(np.uint32)), np.nonzero(got != expected.view(np.uint32))[0][:10]
    assert (expected == 0).any() and ((expected > 0) & (expected < np.finfo(f32).tiny)).any()


# ============================================================================= Gelu / Erf

def np_gelu(x, approximate="none"):
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if approximate == "tanh":
            return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
        return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def unary_model(op, x, domain="", opset=20, **attrs):
    dt = helper.np_dtype_to_tensor_dtype(x.dtype)
    node = helper.make_node(op, ["x"], ["y"], domain=domain, name=op.lower(), **attrs)
    return _model(node, [helper.make_tensor_value_info("x", dt, x.shape)], [], dt, opset=opset,
                  ms=bool(domain), out_shape=list(x.shape))


GELU_X = np.concatenate([np.linspace(-12, 12, 1201), np.random.default_rng(0).normal(0, 3, 600),
                         [1e-30, -1e-30, 1e-3, -1e-3, 2.5e-8]]).astype(f32)
N_ROWS = 37
GELU_SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38], f32)
UNARY_FORCE = {"COARSE_MIN_WORDS": 1}


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_within_bound_of_float64_and_onnxruntime(dev, approximate):
    model = unary_model("Gelu", GELU_X, approximate=approximate)
    got = run_variants(dev, model, {"x": GELU_X}, {"Gelu": UNARY_FORCE},
                       expect=("word_per_invocation", "words_per_invocation"))
    ax = np.abs(GELU_X.astype(np.float64))
    assert np.all(np.abs(got - np_gelu(GELU_X, approximate)) <= 2.0**-22 * ax)
    assert np.all(np.abs(got - ort_run(model, {"x": GELU_X}).astype(np.float64)) <= 2.0**-21 * ax)


def test_gelu_negative_tail_keeps_its_digits(best):
    """Below x = -0.75 sqrt 2, 1 + erf(x / sqrt 2) cancels (an absolute error of 1.2e-7 on values
    of 1e-6 and less, a fuzzer finding): the kernel takes erfc there, within 1e-4 of the value."""
    x = np.linspace(-13, -1.07, 2001).astype(f32)
    got = run_variants(best, unary_model("Gelu", x), {"x": x}).astype(np.float64)
    exact = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x.astype(np.float64)])  # no cancellation
    tiny = np.abs(exact) < 1e-37  # flushed to zero on the device, as float32 arithmetic may
    assert np.all(np.abs(got - exact)[~tiny] <= 1e-4 * np.abs(exact)[~tiny])
    assert np.all(np.abs(got[tiny]) <= 1e-37)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_special_values_as_onnxruntime(best, approximate):
    """0, -0, +-inf (-inf gives NaN: -inf * (1 + t) with t = -1), NaN, +-3e38, bit for bit."""
    model = unary_model("Gelu", GELU_SPECIAL, approximate=approximate)
    got = run_variants(best, model, {"x": GELU_SPECIAL})
    expected = ort_run(model, {"x": GELU_SPECIAL})
    assert np.array_equal(np.isnan(got), np.isnan(expected))
    ok = ~np.isnan(expected)
    assert np.array_equal(got[ok].view(np.uint32), expected[ok].view(np.uint32))


def test_com_microsoft_gelu_matches_onnxruntime(best):
    model = unary_model("Gelu", GELU_X, domain="com.microsoft")
    got = run_variants(best, model, {"x": GELU_X})
    ax = np.abs(GELU_X.astype(np.float64))
    assert np.all(np.abs(got - np_gelu(GELU_X)) <= 2.0**-22 * ax)
    assert np.all(np.abs(got - ort_run(model, {"x": GELU_X}).astype(np.float64)) <= 2.0**-21 * ax)


def test_com_microsoft_gelu_without_declared_shapes_runs_on_the_gpu(dev):
    """The inference rule types com.microsoft Gelu, so a graph that declares nothing after its
    inputs still plans every node on the GPU."""
    from onnx_quant.backend_wgpu.session import Session

    x = np.random.default_rng(3).normal(0, 2, (N_ROWS, 8)).astype(f32)
    nodes = [helper.make_node("Gelu", ["x"], ["g"], domain="com.microsoft", name="gelu"),
             helper.make_node("Add", ["g", "x"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
    with Session(model, device=dev, allow_host_fallback=False) as s:
        (got,) = s.run(None, {"x": x})
        assert s.host_nodes == []
    expected = ort_run(model, {"x": x})
    assert got.shape == expected.shape == x.shape
    ax = np.abs(x.astype(np.float64))
    assert np.all(np.abs(got - expected.astype(np.float64)) <= 2.0**-21 * ax + np.spacing(np.abs(expected)) * 2)


def test_gelu_float16_within_one_ulp(best):
    x = np.concatenate([np.linspace(-8, 8, 801), [0.0, -0.0, 1e-4, -1e-4]]).astype(np.float16)
    model = unary_model("Gelu", x)
    got = run_variants(best, model, {"x": x})
    assert got.dtype == np.float16
    ref = np_gelu(x.astype(f32))
    assert np.all(np.abs(got.astype(np.float64) - ref) <= np.spacing(np.abs(ref).astype(np.float16)).astype(np.float64)
                  + 2.0**-22 * np.abs(x.astype(np.float64)))


def test_erf_within_three_ulp(dev):
    x = np.concatenate([np.linspace(-5, 5, 4001), 10 ** np.linspace(-30, 0.6, 300), [0.0, -0.0, np.inf, -np.inf]]).astype(f32)
    model = unary_model("Erf", x, opset=9 if dev.info.backend == "OpenGL" else 13)
    got = run_variants(dev, model, {"x": x}, {"Erf": UNARY_FORCE})
    ref = np.vectorize(math.erf)(x.astype(np.float64))
    ulp = np.spacing(np.abs(ref).astype(f32)).astype(np.float64)
    assert np.all(np.abs(got - ref) <= 3 * ulp)
    assert got[-4].view(np.uint32) == 0 and got[-3].view(np.uint32) == 0x80000000  # erf(+-0) = +-0
    assert got[-2] == 1.0 and got[-1] == -1.0
    nan = run_variants(dev, unary_model("Erf", np.array([np.nan], f32), opset=13), {"x": np.array([np.nan], f32)})
    assert np.isnan(nan[0])


_SF_KERNEL_BODY = "  o[i] = bitcast<u32>({fn}(u));"


@pytest.mark.parametrize("fn, ulps", [("oq_erf", 2.5), ("oq_tanh", 1.5)])
def test_special_function_accuracy_on_a_dense_grid(best, fn, ulps):
    """The documented bounds of snippets/special_functions.wgsl.jinja, on every interval."""
    from onnx_quant.backend_wgpu.pipelines import layout_key
    from onnx_quant.backend_wgpu.plan import BindingPlan
    from onnx_quant.backend_wgpu.render import render_string

    kernel = _FX_KERNEL.replace('{% include "snippets/fixed_point.wgsl.jinja" %}',
                                '{% include "snippets/special_functions.wgsl.jinja" %}')
    x = np.linspace(0, 10, 200001).astype(f32)
    binds = (BindingPlan(0, "a", "a", "read", "u32"), BindingPlan(1, "o", "o", "read_write", "u32"))
    words = np.ascontiguousarray(np.stack([x, x], 1)).view(np.uint32).reshape(-1)
    comp = best.compile(render_string(kernel, {"body": _SF_KERNEL_BODY.format(fn=fn)}), layout_key(binds), label=fn)
    a, o = best.allocate(4 * words.size), best.allocate(4 * x.size)
    best.upload(a, words)
    bg = best.bind(comp, [(0, a, a.size), (1, o, o.size)])
    staging = best.allocate_staging(o.size)
    groups = -(-x.size // 64)
    raw = best.launch([(comp, bg, (min(groups, 65535), -(-groups // 65535), 1), fn)],
                      copies=[(o, 0, staging, 0, o.size)], read=staging)
    got = np.frombuffer(raw, f32)[:x.size].astype(np.float64)
    ref = np.vectorize(math.erf if fn == "oq_erf" else math.tanh)(x.astype(np.float64))
    err = np.abs(got - ref) / np.spacing(np.abs(ref).astype(f32)).astype(np.float64)
    assert err[1:].max() <= ulps, (fn, err.max(), x[err.argmax()])


# ============================================================================= LayerNormalization

def np_layer_norm(x, scale, bias, axis, eps):
    x64 = x.astype(np.float64)
    red = tuple(range(axis % x.ndim, x.ndim))
    mean = x64.mean(axis=red, keepdims=True)
    sd = np.sqrt(((x64 - mean) ** 2).mean(axis=red, keepdims=True) + float(f32(eps)))
    y = (x64 - mean) / sd * scale.astype(np.float64)
    if bias is not None:
        y = y + bias.astype(np.float64)
    mag = np.abs(scale).astype(np.float64) * (np.abs(x64) + np.abs(mean)) / sd
    if bias is not None:
        mag = mag + np.abs(bias).astype(np.float64)
    return y, mag


def ln_model(x, scale, bias, axis=-1, epsilon=None, extra_outputs=0):
    inputs = ["x", "scale"] + (["bias"] if bias is not None else [])
    attrs = {"axis": axis} | ({} if epsilon is None else {"epsilon": epsilon})
    outs = ["y", "mean", "inv_std"][: 1 + extra_outputs]
    node = helper.make_node("LayerNormalization", inputs, outs, name="ln", **attrs)
    inits = [numpy_helper.from_array(scale, "scale")] + ([numpy_helper.from_array(bias, "bias")] if bias is not None else [])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


LN_CASES = [
    # shape, axis, scale shape (None: the normalised shape), bias, epsilon
    ((4, 16), -1, None, True, None),         # the transformer's form
    ((2, 3, 10), -1, None, False, 1e-3),
    ((3, 4, 5), 1, None, True, None),        # two normalised dims
    ((3, 4, 5), 1, (5,), True, None),        # scale broadcast over the leading normalised dim
    ((2, 300), -1, None, True, None),        # rows longer than the serial bound: workgroup only
    ((6, 7), 0, (1,), True, 1e-2),           # one row, scalar scale / bias
    ((5, 1), -1, None, True, None),          # rows of one element: y = bias
]


@pytest.mark.parametrize("index", range(len(LN_CASES)), ids=[f"c{i}" for i in range(len(LN_CASES))])
def test_layer_normalization_within_bound(dev, index):
    shape, axis, sshape, with_bias, eps = LN_CASES[index]
    rng = np.random.default_rng(300 + index)
    x = (rng.normal(0, 2, size=shape) + rng.normal(0, 3)).astype(f32)
    norm = shape[axis % len(shape):]
    scale = rng.normal(1, 0.5, size=sshape or norm).astype(f32)
    bias = rng.normal(0, 0.5, size=sshape or norm).astype(f32) if with_bias else None
    model = ln_model(x, scale, bias, axis, eps)
    got = run_variants(dev, model, {"x": x})
    ref, mag = np_layer_norm(x, scale, bias, axis, eps if eps is not None else f32(1e-5))
    D = int(np.prod(norm))
    bound = 2.0**-24 * (16 + D / 16) * mag
    assert np.all(np.abs(got - ref) <= bound), float((np.abs(got - ref) / mag).max() * 2**24)
    expected = ort_run(model, {"x": x})
    assert np.all(np.abs(got - expected) <= 2 * bound)


@pytest.mark.parametrize("d", [4, 16, 60, 68, 128, 256])
def test_layer_normalization_serial_vec4_rows_give_the_workgroup_bits(best, d):
    """Rows of D % 4 == 0 take the serial variant's vec4 path (X, Y and a Scale / B of a length
    that is a multiple of 4 read as vec4, the quotients certified by a residual test): the
    workgroup variant's bits for scale / bias over the whole row, over its last 4 or 2 positions
    and scalar, with and without bias, and RMSNormalization's; a row whose quotients are
    subnormal (not certified) is refined by oq_div_rn, and with CERTIFY_QUOTIENTS 0 every row is
    (the redo path, for a device whose `/` is not correctly rounded): the same bits."""
    from onnx_quant.backend_wgpu.session import Session

    rng = np.random.default_rng(d)
    x = (rng.normal(0, 2, size=(9, d)) + rng.normal(0, 3)).astype(f32)
    # row 0: +-1e30 cancel to a mean of 0 and sd ~1e30, so (1e-10 - 0) / sd is subnormal: not certified
    x[0] = np.concatenate([[1e30, -1e30], rng.uniform(1, 2, d - 2) * 1e-10]).astype(f32)
    with np.errstate(under="ignore"):
        q0 = x[0, 2:] / np.sqrt(np.float32((2 * np.float64(1e30) ** 2 / d)))
    assert (np.abs(q0) < np.finfo(f32).tiny).any()
    for width, with_bias in ((d, True), (4, True), (2, False), (1, True), (d, False)):
        xw = x if width in (1, d) else x.reshape(9, d // width, width)  # Scale / B: X's trailing dims
        scale = rng.normal(1, 0.5, size=width).astype(f32)
        bias = rng.normal(0, 0.5, size=width).astype(f32) if with_bias else None
        model = ln_model(xw, scale, bias, axis=1, extra_outputs=2 if with_bias else 0)
        with Session(model, device=best, variants={"LayerNormalization": "serial"}) as s:
            assert s.plans({"x": xw.shape})[0].derived["rowVec4"]
        got = run_variants(best, model, {"x": xw}, expect=["serial", "workgroup"])
        refined = run_variants(best, model, {"x": xw}, {"CERTIFY_QUOTIENTS": 0}, expect=["serial"])
        assert np.array_equal(refined.view(np.uint32), got.view(np.uint32))  # every row through oq_div_rn
        ref, mag = np_layer_norm(xw[1:], scale, bias, 1, f32(1e-5))
        assert np.all(np.abs(got[1:] - ref) <= 2.0**-24 * (16 + d / 16) * mag)
    rms = helper.make_model(helper.make_graph(
        [helper.make_node("RMSNormalization", ["x", "scale"], ["y"], axis=-1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(rng.normal(1, 0.5, size=d).astype(f32), "scale")]),
        opset_imports=[helper.make_opsetid("", 23)])
    run_variants(best, rms, {"x": x}, expect=["serial", "workgroup"])


def test_layer_normalization_variants_both_apply_to_short_rows(best):
    x = np.random.default_rng(9).normal(size=(8, 40)).astype(f32)
    model = ln_model(x, np.ones(40, f32), np.zeros(40, f32))
    assert applicable(best, model, {"x": x}) == ["workgroup", "serial"]


def _ln_stats_model(x, outs):
    """LayerNormalization over the last axis asking for the outputs ``outs`` (names or "")."""
    d = x.shape[-1]
    node = helper.make_node("LayerNormalization", ["x", "scale", "bias"], outs, name="ln")
    inits = [numpy_helper.from_array(np.ones(d, f32), "scale"), numpy_helper.from_array(np.zeros(d, f32), "bias")]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs if o],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("outs", [["y", "mean", "inv_std"], ["y", "mean"], ["y", "", "inv_std"]],
                         ids=["both", "mean", "inv_std"])
@pytest.mark.parametrize("shape", [(3, 8), (2, 300)], ids=["serial+workgroup", "workgroup"])
def test_layer_normalization_mean_and_inv_std_dev_on_the_gpu(dev, outs, shape):
    """Mean and InvStdDev are optional outputs of the kernel: each variant writes the ones the
    node asks for (one per row), within a few roundings of a float64 reference and onnxruntime."""
    from onnx_quant.backend_wgpu.session import Session

    rng = np.random.default_rng(10)
    x = (rng.normal(0, 2, size=shape) + 3).astype(f32)
    model = _ln_stats_model(x, outs)
    wanted = [o for o in outs if o]
    x64 = x.astype(np.float64)
    mean64 = x64.mean(axis=-1, keepdims=True)
    inv64 = 1 / np.sqrt(((x64 - mean64) ** 2).mean(axis=-1, keepdims=True) + float(f32(1e-5)))
    ref = {"y": None, "mean": mean64, "inv_std": inv64}
    expected = dict(zip(wanted, ort.InferenceSession(model.SerializeToString(),
                                                     providers=["CPUExecutionProvider"]).run(None, {"x": x})))
    variants = applicable(dev, model, {"x": x})
    assert variants == (["workgroup", "serial"] if shape[1] <= 64 else ["workgroup"])
    for v in variants:
        with Session(model, device=dev, variants={"ln": v}, allow_host_fallback=False) as s:
            got = dict(zip(wanted, s.run(None, {"x": x})))
            for name in wanted[1:]:
                assert got[name].shape == expected[name].shape == (shape[0], 1) and got[name].dtype == f32
                # the mean: the row sum's roundings (as for y); 1 / sd: sd's and the division's
                tol = 2.0**-24 * (16 + shape[1] / 16) * (np.abs(x64).mean(axis=-1, keepdims=True) if name == "mean"
                                                         else 8 * inv64)
                assert np.all(np.abs(got[name] - ref[name]) <= tol), (v, name)
                assert np.all(np.abs(got[name] - expected[name]) <= 2 * tol), (v, name)


# ============================================================================= ONNX node cases

def _node_cases(op_types):
    from onnx_quant.node_cases import all_node_cases

    return [c for c in all_node_cases() if all(n.op_type in op_types for n in c.model.graph.node)
            and "expanded" not in c.name]


@pytest.mark.parametrize("op, rtol, atol", [("Gelu", 2e-6, 1e-7), ("Erf", 1e-6, 1e-7),
                                            ("LayerNormalization", 1e-5, 1e-6)])
def test_onnx_node_cases(best, op, rtol, atol):
    """ONNX's own node test cases of these ops (float32), every output compared (the
    LayerNormalization cases ask for Mean and InvStdDev too)."""
    from onnx_quant.backend_wgpu.session import Session

    ran = 0
    for case in _node_cases({op}):
        model = case.model
        for inputs, outputs in case.data_sets:
            feeds = {i.name: v for i, v in zip(model.graph.input, inputs)}
            with Session(model, device=best, allow_host_fallback=False) as s:
                got = s.run(None, feeds)
            assert len(got) == len(outputs)
            for g, e in zip(got, outputs):
                np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=case.name)
            ran += 1
    assert ran > 0

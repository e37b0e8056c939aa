"""Shape-polymorphic matmul kernels (issue #11, backend_wgpu/uniforms.py): QLinearMatMul,
MatMulInteger, DynamicQuantizeMatMul and MatMulIntegerToFloat take the sizes that follow the
batch (rows, batch count and dims, output counts, row groups) as runtime uniforms, so each
variant, forced, compiles its pipelines once for two batch sizes, and both outputs are the
oracle's bit for bit (onnx.reference for the integer kernels, onnxruntime's unfused graph for the
dynamic ones)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.models import make_model
from support.oracles import onnxruntime_run, ref_run as _reference

MS = "com.microsoft"


pytestmark = pytest.mark.devices("best")  # dev: the default adapter only (conftest's default adds OpenGL)


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, inits, domains=()):
    return make_model(nodes, inputs, outputs, inits, 21, extra_opsets=domains, ir_version=10)


def _q(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape, dtype=dtype)


def _qlinear_matmul(a_shape, b_shape, b_const, rng):
    """QLinearMatMul of a uint8 `a` (symbolic dims as strings) by an int8 `b` (an initializer
    when b_const; per-column parameters for a 2-D b) with a per-tensor a and y."""
    inits = [numpy_helper.from_array(np.array(v, dt), n) for n, v, dt in
             [("a_scale", 0.03, np.float32), ("a_zero_point", 121, np.uint8),
              ("y_scale", 0.9, np.float32), ("y_zero_point", 110, np.uint8)]]
    n = (b_shape[-1],) if len(b_shape) == 2 else ()  # per-column [N] needs a 2-D b
    inits.append(numpy_helper.from_array(rng.uniform(0.01, 0.03, n).astype(np.float32), "b_scale"))
    inits.append(numpy_helper.from_array(_q(rng, np.int8, n) // 8, "b_zero_point"))
    inputs = [_vi("a", TensorProto.UINT8, a_shape)]
    if b_const:
        inits.append(numpy_helper.from_array(_q(rng, np.int8, b_shape), "b"))
    else:
        inputs.append(_vi("b", TensorProto.INT8, b_shape))
    node = helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point",
                                              "y_scale", "y_zero_point"], ["y"])
    return _model([node], inputs, [_vi("y", TensorProto.UINT8, None)], inits)


def _matmul_integer(rng):
    inits = [numpy_helper.from_array(_q(rng, np.int8, (20, 12)), "B"),
             numpy_helper.from_array(np.array(7, np.uint8), "a_zero_point"),
             numpy_helper.from_array(_q(rng, np.int8, (12,)) // 8, "b_zero_point")]
    node = helper.make_node("MatMulInteger", ["A", "B", "a_zero_point", "b_zero_point"], ["Y"])
    return _model([node], [_vi("A", TensorProto.UINT8, ["N", 20])], [_vi("Y", TensorProto.INT32, None)], inits)


def _dynamic_unit(rng, shared):
    """The unit quantize_dynamic writes (DQL -> MatMulInteger -> Cast -> Mul -> Add) over rows
    ["B", "S"]: fused into DynamicQuantizeMatMul, or (shared: the DQL's output is also a graph
    output) MatMulIntegerToFloat."""
    k, n = 24, 10
    inits = [numpy_helper.from_array(_q(rng, np.int8, (k, n)), "W"),
             numpy_helper.from_array((rng.random(n) * 0.02 + 0.001).astype(np.float32), "w_scale"),
             numpy_helper.from_array(_q(rng, np.int8, (n,)) // 4, "w_zp"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("Mul", ["xs", "w_scale"], ["s"]),
             helper.make_node("MatMulInteger", ["xq", "W", "xz", "w_zp"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "s"], ["scaled"]),
             helper.make_node("Add", ["scaled", "bias"], ["y"])]
    outputs = [_vi("y", TensorProto.FLOAT, None)]
    if shared:
        nodes.append(helper.make_node("Identity", ["xq"], ["xq_out"]))
        outputs.append(_vi("xq_out", TensorProto.UINT8, None))
    return _model(nodes, [_vi("x", TensorProto.FLOAT, ["B", "S", k])], outputs, inits)


def _qgemm(rng, trans_a, c_rows):
    """com.microsoft QGemm of a uint8 A (M = "N" rows; transA: A is [K, N]) by an int8 B^T
    (per-column), C [N'] or, c_rows, a graph input ["N", N'], quantized uint8 output."""
    k, n = 20, 12
    inits = [numpy_helper.from_array(np.array(v, dt), name) for name, v, dt in
             [("a_scale", 0.03, np.float32), ("a_zp", 121, np.uint8), ("y_scale", 0.9, np.float32),
              ("y_zp", 110, np.uint8)]]
    inits += [numpy_helper.from_array(_q(rng, np.int8, (n, k)), "B"),
              numpy_helper.from_array(rng.uniform(0.01, 0.03, n).astype(np.float32), "b_scale"),
              numpy_helper.from_array(_q(rng, np.int8, (n,)) // 8, "b_zp")]
    inputs = [_vi("A", TensorProto.UINT8, [k, "N"] if trans_a else ["N", k])]
    if c_rows:
        inputs.append(_vi("C", TensorProto.INT32, ["N", n]))
    else:
        inits.append(numpy_helper.from_array(rng.integers(-4000, 4000, n).astype(np.int32), "C"))
    node = helper.make_node("QGemm", ["A", "a_scale", "a_zp", "B", "b_scale", "b_zp", "C", "y_scale", "y_zp"],
                            ["Y"], domain=MS, transA=int(trans_a), transB=1)
    return _model([node], inputs, [_vi("Y", TensorProto.UINT8, None)], inits, domains=(MS,))



def _ort_unfused(model, feeds):
    return onnxruntime_run(model, feeds, level="ORT_DISABLE_ALL")


def _check_two_shapes(dev, model, op_type, variant, feeds_list, oracle, tunables=None, exact=True):
    """Runs `model` with `op_type` forced to `variant` at each feeds of feeds_list from a cold
    cache: every run after the first compiles nothing; every output equals the oracle's bits."""
    from onnx_quant.backend_wgpu.session import Session

    sess = Session(model, device=dev, variants={op_type: variant}, allow_host_fallback=False, tunables=tunables)
    dev.pipelines.forget()
    for i, feeds in enumerate(feeds_list):
        got = sess.run(None, feeds)
        plans = [p for p in sess.plans({k: v.shape for k, v in feeds.items()}) if p.kernel == op_type]
        assert plans and all(p.variant == variant for p in plans)
        if i == 0:
            assert sess.last_run_stats["pipelines_compiled"] > 0
        else:
            assert sess.last_run_stats["pipelines_compiled"] == 0, \
                f"{op_type}/{variant}: shape {[v.shape for v in feeds.values()]} compiled a pipeline"
        for g, w in zip(got, oracle(model, feeds)):
            assert g.shape == w.shape and g.dtype == w.dtype
            if exact:
                assert np.array_equal(g.view(np.uint8), w.view(np.uint8)), f"{op_type}/{variant}: values differ"
            else:  # float sums in k order against numpy's matmul (docs/kernels.md's bound, far inside)
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


QL_VARIANTS = ("blocked_epilogue", "tiled_epilogue", "blocked", "tiled", "simple")

#: (case, a's shape, b's shape, b an initializer, the row / batch sizes): rows (MLP), a batch of
#: sequences against a weight (transformer projections), two batched operands (attention)
QL_CASES = [
    ("rows", ["N", 20], [20, 12], True, [(8, 20), (16, 20), (13, 20)]),
    ("batch", ["B", 6, 20], [20, 12], True, [(1, 6, 20), (2, 6, 20), (5, 6, 20)]),
    ("batched_operands", ["B", 2, 6, 8], ["B", 2, 8, 6], False, [(1, 2, 6, 8), (2, 2, 6, 8)]),
    ("broadcast_b", ["B", 2, 6, 8], [1, 2, 8, 6], True, [(2, 2, 6, 8), (3, 2, 6, 8)]),
]


@pytest.mark.parametrize("variant", QL_VARIANTS)
@pytest.mark.parametrize("case", QL_CASES, ids=[c[0] for c in QL_CASES])
def test_qlinear_matmul_two_batch_sizes(dev, case, variant):
    _, a_shape, b_shape, b_const, sizes = case
    rng = np.random.default_rng(len(a_shape))
    model = _qlinear_matmul(a_shape, b_shape, b_const, rng)
    feeds_list = []
    for s in sizes:
        f = {"a": _q(rng, np.uint8, s)}
        if not b_const:
            f["b"] = _q(rng, np.int8, (s[0],) + tuple(b_shape[1:]))
        feeds_list.append(f)
    _check_two_shapes(dev, model, "QLinearMatMul", variant, feeds_list, _reference)


@pytest.mark.parametrize("variant", ("blocked", "tiled", "simple"))
def test_matmul_integer_two_batch_sizes(dev, variant):
    rng = np.random.default_rng(5)
    model = _matmul_integer(rng)
    feeds_list = [{"A": _q(rng, np.uint8, (n, 20))} for n in (8, 16, 11)]
    _check_two_shapes(dev, model, "MatMulInteger", variant, feeds_list, _reference)


@pytest.mark.parametrize("op_type, variant", [("DynamicQuantizeMatMul", "blocked"),
                                              ("DynamicQuantizeMatMul", "fused"),
                                              ("DynamicQuantizeMatMul", "two_pass"),
                                              ("MatMulIntegerToFloat", "blocked"),
                                              ("MatMulIntegerToFloat", "gemm")])
@pytest.mark.parametrize("sizes", [((1, 16), (2, 24), (3, 10)), ((1, 1), (2, 1))], ids=["rows16_48_30", "rows1_2"])
def test_dynamic_matmul_two_batch_sizes(dev, op_type, variant, sizes):
    """Rows B x S = 16, 48, 30 (the transformer's B 1 -> 2 with S 16 -> 24, and more), and 1 -> 2
    (a classifier at batch 1 -> 2: one row tile of 2 serves both). The weights (24 x 10) are under
    DynamicQuantizeMatMul's BLOCKED_MIN_WEIGHTS: 0 makes blocked a candidate."""
    rng = np.random.default_rng(7)
    model = _dynamic_unit(rng, shared=op_type == "MatMulIntegerToFloat")
    feeds_list = [{"x": (rng.standard_normal((b, s, 24)) * 3 + 0.5).astype(np.float32)} for b, s in sizes]
    _check_two_shapes(dev, model, op_type, variant, feeds_list, _ort_unfused,
                      tunables={op_type: {"BLOCKED_MIN_WEIGHTS": 0}} if op_type == "DynamicQuantizeMatMul" else None)


@pytest.mark.parametrize("variant", ("blocked_epilogue", "blocked", "simple"))
@pytest.mark.parametrize("trans_a, c_rows", [(False, False), (True, False), (False, True)])
def test_qgemm_two_batch_sizes(dev, variant, trans_a, c_rows):
    """QGemm's M follows the batch (rows of A, or its columns with transA; C of [M, N] too):
    onnxruntime's bits at M = 8, 16, 11."""
    rng = np.random.default_rng(11)
    model = _qgemm(rng, trans_a, c_rows)
    feeds_list = []
    for m in (8, 16, 11):
        f = {"A": _q(rng, np.uint8, (20, m) if trans_a else (m, 20))}
        if c_rows:
            f["C"] = rng.integers(-4000, 4000, (m, 12)).astype(np.int32)
        feeds_list.append(f)
    _check_two_shapes(dev, model, "QGemm", variant, feeds_list, onnxruntime_run, tunables={"QGemm": {"BLOCKED_MIN_MACS": 0}})


FLOAT_MATMUL_CASES = [
    ("rows", "MatMul", ["N", 20], [20, 12], [(8, 20), (16, 20), (13, 20)]),
    ("batch", "MatMul", ["B", 6, 20], [20, 12], [(1, 6, 20), (2, 6, 20)]),
    ("batched_operands", "MatMul", ["B", 2, 6, 8], ["B", 2, 8, 6], [(1, 2, 6, 8), (3, 2, 6, 8)]),
    ("gemm_transA_c_rows", "Gemm", [20, "N"], [12, 20], [(20, 8), (20, 16)]),
]


@pytest.mark.parametrize("variant", ("blocked", "simple", "tiled"))
@pytest.mark.parametrize("case", FLOAT_MATMUL_CASES, ids=[c[0] for c in FLOAT_MATMUL_CASES])
def test_float_matmul_two_batch_sizes(dev, case, variant):
    """MatMul / Gemm (float32): M, the batch count and dims (and Gemm's C of [M, N]) are uniforms."""
    _, op, a_shape, b_shape, sizes = case
    rng = np.random.default_rng(13)
    f32 = np.float32
    inputs = [_vi("a", TensorProto.FLOAT, a_shape)]
    inits = []
    gemm = op == "Gemm"
    if isinstance(b_shape[0], str):
        inputs.append(_vi("b", TensorProto.FLOAT, b_shape))
    else:
        inits.append(numpy_helper.from_array(rng.standard_normal(b_shape).astype(f32), "b"))
    if gemm:
        inputs.append(_vi("c", TensorProto.FLOAT, ["N", 12]))
        node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=1, transB=1, alpha=0.5, beta=1.5)
    else:
        node = helper.make_node("MatMul", ["a", "b"], ["y"])
    model = _model([node], inputs, [_vi("y", TensorProto.FLOAT, None)], inits)
    feeds_list = []
    for s in sizes:
        f = {"a": rng.standard_normal(s).astype(f32)}
        if isinstance(b_shape[0], str):
            f["b"] = rng.standard_normal((s[0],) + tuple(b_shape[1:])).astype(f32)
        if gemm:
            f["c"] = rng.standard_normal((s[1], 12)).astype(f32)
        feeds_list.append(f)
    _check_two_shapes(dev, model, op, variant, feeds_list, _reference, tunables={op: {"TILED_MIN_MACS": 0}},
                      exact=False)

"""Shape-polymorphic pipelines over the sequence length (issue #11): the sizes that follow a
transformer's sequence length are runtime uniforms in the attention's kernels (QLinearMatMul /
MatMulInteger / QGemm: K and N; MatMul / Gemm: K and N; Softmax serial: the row length; the reduce
family's serial and workgroup_per_word variants: the shape; Gather: its shapes and index map), so
a new sequence length compiles no pipeline, from a cold cache, and every output is the oracle's
(bit for bit for integer outputs; float sums within the bounds of the kernels' own tests).

The values that stay plan-time are buckets, not sizes: K % 4 and whether K and N are multiples of
4 (the integer GEMMs' unaligned reads and masked last quad of k; the float blocked GEMM's vec4
reads of A and B), ranks and axes; the sequence
lengths below stay inside one bucket per case. Variants chosen by size are still chosen per size
(the zoo's dynamic transformer: its attention MatMuls cross MatMul's TILED_MIN_MACS at S 16 -> 24,
B 1 -> 2, and take the blocked variant: one pipeline, below)."""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from support.models import make_model
from support.oracles import assert_agree, onnxruntime_run, ref_run as _reference

F32 = np.float32


pytestmark = pytest.mark.devices("best")  # dev: the default adapter only (conftest's default adds OpenGL)


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, inits=(), opset=21):
    return make_model(nodes, inputs, [_vi("y", TensorProto.UNDEFINED, None)], inits, opset, ir_version=10)


def _q(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape, dtype=dtype)


def _check_sequence_lengths(dev, model, op_type, variant, feeds_list, oracle, *, exact, tunables=None, rtol=1e-5):
    """`model` with `op_type` forced to `variant` (None: the session's choice) at each feeds of
    feeds_list, from a cold cache: every run after the first compiles nothing; every output is the
    oracle's (bits when exact)."""
    from onnx_quant.backend_wgpu.session import Session

    sess = Session(model, device=dev, variants={op_type: variant} if variant else None,
                   allow_host_fallback=False, tunables=tunables)
    dev.pipelines.forget()
    for i, feeds in enumerate(feeds_list):
        got = sess.run(None, feeds)
        plans = [p for p in sess.plans({k: v.shape for k, v in feeds.items()}) if p.kernel == op_type]
        assert plans and (variant is None or all(p.variant == variant for p in plans))
        compiled = sess.last_run_stats["pipelines_compiled"]
        if i == 0:
            assert compiled > 0
        else:
            assert compiled == 0, f"{op_type}/{variant}: shapes {[v.shape for v in feeds.values()]} compiled {compiled}"
        for g, w in zip(got, oracle(model, feeds)):
            assert g.shape == w.shape and g.dtype == w.dtype
            if exact:
                assert np.array_equal(g.view(np.uint8), w.view(np.uint8)), f"{op_type}/{variant}: values differ"
            else:
                np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)


# --------------------------------------------------------------------------- the integer GEMMs

#: sequence lengths per alignment bucket: multiples of 4, and K % 4 == 3 with N unaligned
SEQ_BUCKETS = {"aligned": (16, 24, 12), "unaligned": (7, 11, 15)}


def _qlinear_attention(scores: bool):
    """QLinearMatMul of uint8 [B, 2, S, 8] by int8 [B, 2, 8, S] (scores: Q K^T, N = S) or of
    uint8 [B, 2, S, S] by int8 [B, 2, S, 8] (the weighted values: K = S)."""
    inits = [numpy_helper.from_array(np.array(v, dt), n) for n, v, dt in
             [("a_scale", 0.03, F32), ("a_zero_point", 121, np.uint8), ("b_scale", 0.02, F32),
              ("b_zero_point", -3, np.int8), ("y_scale", 0.9, F32), ("y_zero_point", 110, np.uint8)]]
    a_shape, b_shape = (["B", 2, "S", 8], ["B", 2, 8, "S"]) if scores else (["B", 2, "S", "S"], ["B", 2, "S", 8])
    node = helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point",
                                              "y_scale", "y_zero_point"], ["y"])
    return _model([node], [_vi("a", TensorProto.UINT8, a_shape), _vi("b", TensorProto.INT8, b_shape)], inits)


def _attention_feeds(rng, scores, b, s, a_dtype=np.uint8, b_dtype=np.int8):
    a_shape, b_shape = ((b, 2, s, 8), (b, 2, 8, s)) if scores else ((b, 2, s, s), (b, 2, s, 8))
    return {"a": _q(rng, a_dtype, a_shape), "b": _q(rng, b_dtype, b_shape)}


@pytest.mark.parametrize("bucket", sorted(SEQ_BUCKETS))
@pytest.mark.parametrize("scores", (True, False), ids=("scores", "values"))
@pytest.mark.parametrize("variant", ("blocked_epilogue", "tiled_epilogue", "blocked", "tiled", "simple"))
def test_qlinear_matmul_at_three_sequence_lengths(dev, variant, scores, bucket):
    rng = np.random.default_rng(21)
    model = _qlinear_attention(scores)
    feeds_list = [_attention_feeds(rng, scores, b, s) for b, s in zip((1, 2, 1), SEQ_BUCKETS[bucket])]
    _check_sequence_lengths(dev, model, "QLinearMatMul", variant, feeds_list, _reference, exact=True)


@pytest.mark.parametrize("bucket", sorted(SEQ_BUCKETS))
@pytest.mark.parametrize("variant", ("blocked", "tiled", "simple"))
def test_matmul_integer_at_three_sequence_lengths(dev, variant, bucket):
    """MatMulInteger of uint8 [B, 2, S, S] by int8 [B, 2, S, 8] (K = S), zero points given."""
    rng = np.random.default_rng(22)
    inits = [numpy_helper.from_array(np.array(7, np.uint8), "a_zero_point"),
             numpy_helper.from_array(np.array(-2, np.int8), "b_zero_point")]
    node = helper.make_node("MatMulInteger", ["a", "b", "a_zero_point", "b_zero_point"], ["y"])
    model = _model([node], [_vi("a", TensorProto.UINT8, ["B", 2, "S", "S"]),
                            _vi("b", TensorProto.INT8, ["B", 2, "S", 8])], inits)
    feeds_list = [_attention_feeds(rng, False, b, s) for b, s in zip((1, 2, 1), SEQ_BUCKETS[bucket])]
    _check_sequence_lengths(dev, model, "MatMulInteger", variant, feeds_list, _reference, exact=True)


def _qgemm(trans_b):
    """com.microsoft QGemm of uint8 A [6, K] by int8 B plus int32 C [N], uint8 output: K = S
    (B [S, 12], a weight: per-column zero points and scales) or, trans_b, N = S (B [S, 16] =
    B'^T, an activation: per-tensor; a per-column parameter count is the qp layout's, plan-time)."""
    k_dim, n_dim = (16, "S") if trans_b else ("S", 12)
    inits = [numpy_helper.from_array(np.array(v, dt), name) for name, v, dt in
             [("a_scale", 0.03, F32), ("a_zp", 121, np.uint8), ("y_scale", 0.9, F32), ("y_zp", 110, np.uint8)]]
    if trans_b:
        inits += [numpy_helper.from_array(np.array(0.02, F32), "b_scale"), numpy_helper.from_array(np.array(-5, np.int8), "b_zp")]
    node = helper.make_node("QGemm", ["A", "a_scale", "a_zp", "B", "b_scale", "b_zp", "C", "y_scale", "y_zp"],
                            ["y"], domain="com.microsoft", transB=int(trans_b))
    inputs = [_vi("A", TensorProto.UINT8, [6, k_dim]),
              _vi("B", TensorProto.INT8, [n_dim, k_dim] if trans_b else [k_dim, n_dim]),
              _vi("C", TensorProto.INT32, [n_dim])]
    if not trans_b:
        inputs += [_vi("b_scale", TensorProto.FLOAT, [n_dim]), _vi("b_zp", TensorProto.INT8, [n_dim])]
    graph = helper.make_graph([node], "g", inputs, [_vi("y", TensorProto.UINT8, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


@pytest.mark.parametrize("bucket", sorted(SEQ_BUCKETS))
@pytest.mark.parametrize("trans_b", (False, True), ids=("k_is_s", "n_is_s"))
@pytest.mark.parametrize("variant", ("blocked_epilogue", "blocked", "simple"))
def test_qgemm_at_three_sequence_lengths(dev, variant, trans_b, bucket):
    """QGemm shares the integer GEMM core: K and N are uniforms too; onnxruntime's bits."""
    rng = np.random.default_rng(29)
    model = _qgemm(trans_b)
    feeds_list = []
    for s in SEQ_BUCKETS[bucket]:
        k, n = (16, s) if trans_b else (s, 12)
        f = {"A": _q(rng, np.uint8, (6, k)), "B": _q(rng, np.int8, (n, k) if trans_b else (k, n)),
             "C": rng.integers(-4000, 4000, n).astype(np.int32)}
        if not trans_b:
            f.update(b_scale=rng.uniform(0.01, 0.03, n).astype(F32), b_zp=_q(rng, np.int8, (n,)) // 8)
        feeds_list.append(f)
    _check_sequence_lengths(dev, model, "QGemm", variant, feeds_list, onnxruntime_run, exact=True,
                            tunables={"QGemm": {"BLOCKED_MIN_MACS": 0}})


# --------------------------------------------------------------------------- float MatMul / Gemm


#: the float GEMMs' sequence lengths: the blocked variant reads A and B a vec4 at a time where
#: their rows are whole vec4s (K, N multiples of 4: plan-time buckets, as the integer GEMMs' unaligned
#: reads), so it is checked within each bucket; simple and tiled also across them
FLOAT_SEQS = {**SEQ_BUCKETS, "mixed": (16, 24, 7)}
FLOAT_CASES = [(v, b) for v in ("simple", "blocked", "tiled") for b in sorted(FLOAT_SEQS)
               if not (v == "blocked" and b == "mixed")]


@pytest.mark.parametrize("scores", (True, False), ids=("scores", "values"))
@pytest.mark.parametrize("variant, bucket", FLOAT_CASES)
def test_float_matmul_at_three_sequence_lengths(dev, variant, bucket, scores):
    rng = np.random.default_rng(23)
    a_shape, b_shape = (["B", 2, "S", 8], ["B", 2, 8, "S"]) if scores else (["B", 2, "S", "S"], ["B", 2, "S", 8])
    model = _model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                   [_vi("a", TensorProto.FLOAT, a_shape), _vi("b", TensorProto.FLOAT, b_shape)])
    feeds_list = []
    for b, s in zip((1, 2, 1), FLOAT_SEQS[bucket]):
        f = _attention_feeds(rng, scores, b, s, np.int8, np.int8)
        feeds_list.append({k: (v * 0.05).astype(F32) for k, v in f.items()})
    _check_sequence_lengths(dev, model, "MatMul", variant, feeds_list, _reference, exact=False,
                            tunables={"MatMul": {"TILED_MIN_MACS": 0}})


@pytest.mark.parametrize("variant, bucket", FLOAT_CASES)
def test_gemm_with_k_following_the_sequence_length(dev, variant, bucket):
    """Gemm(transA, transB, alpha, beta, C [M, 12]) of A [S, M]^T by B [12, S]^T: K = S."""
    rng = np.random.default_rng(24)
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=1, transB=1, alpha=0.5, beta=1.5)
    model = _model([node], [_vi("a", TensorProto.FLOAT, ["S", 10]), _vi("b", TensorProto.FLOAT, [12, "S"]),
                            _vi("c", TensorProto.FLOAT, [10, 12])])
    feeds_list = [{"a": rng.standard_normal((s, 10)).astype(F32), "b": rng.standard_normal((12, s)).astype(F32),
                   "c": rng.standard_normal((10, 12)).astype(F32)} for s in FLOAT_SEQS[bucket]]
    _check_sequence_lengths(dev, model, "Gemm", variant, feeds_list, _reference, exact=False,
                            tunables={"Gemm": {"TILED_MIN_MACS": 0}})


# --------------------------------------------------------------------------- Softmax, reductions, Gather


@pytest.mark.parametrize("op", ("Softmax", "LogSoftmax"))
@pytest.mark.parametrize("variant", ("serial", "workgroup"))
def test_softmax_rows_at_four_sequence_lengths(dev, op, variant):
    """Attention's rows [B, 2, S, S] (row length S; 70: past one 64-lane step), both variants the
    same bits (one summation order); against onnx.reference."""
    rng = np.random.default_rng(25)
    model = _model([helper.make_node(op, ["x"], ["y"], axis=-1)], [_vi("x", TensorProto.FLOAT, ["B", 2, "S", "S"])])
    feeds_list = [{"x": (rng.standard_normal((b, 2, s, s)) * 3).astype(F32)} for b, s in ((1, 16), (2, 24), (1, 7), (1, 70))]
    _check_sequence_lengths(dev, model, op, variant, feeds_list, _reference, exact=False, rtol=2e-6)


def test_softmax_serial_and_workgroup_agree_bit_for_bit(dev):
    from onnx_quant.backend_wgpu.session import Session

    rng = np.random.default_rng(26)
    model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [_vi("x", TensorProto.FLOAT, ["S", "S"])])
    for s in (5, 24, 70, 131):
        feeds = {"x": (rng.standard_normal((s, s)) * 4).astype(F32)}
        outs = [Session(model, device=dev, variants={"Softmax": v}, allow_host_fallback=False).run(None, feeds)[0]
                for v in ("serial", "workgroup")]
        assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)), s


#: (op, axes, keepdims, x's symbolic shape, the sizes): the reduced length follows S, or the output count does
REDUCE_CASES = [
    ("ReduceMean", [-1], 1, ["B", "S", 16], [(1, 16, 16), (2, 24, 16), (1, 7, 16)]),
    ("ReduceMean", [1], 0, ["B", "S", 6], [(1, 16, 6), (2, 24, 6), (3, 7, 6)]),
    ("ReduceSum", [0, 2], 1, ["B", "S", "S"], [(1, 16, 16), (2, 24, 24), (2, 7, 7)]),
    ("ReduceMax", [-1], 0, ["B", "S", "S"], [(1, 16, 16), (2, 24, 24), (1, 7, 7)]),
]


@pytest.mark.parametrize("variant", ("serial", "workgroup_per_word"))
@pytest.mark.parametrize("case", REDUCE_CASES, ids=[f"{c[0]}{c[1]}" for c in REDUCE_CASES])
def test_reductions_at_three_sequence_lengths(dev, case, variant):
    op, axes, keepdims, shape, sizes = case
    rng = np.random.default_rng(27)
    axes_init = numpy_helper.from_array(np.array(axes, np.int64), "axes")
    model = _model([helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)],
                   [_vi("x", TensorProto.FLOAT, shape)], [axes_init])
    feeds_list = [{"x": rng.standard_normal(s).astype(F32)} for s in sizes]
    # ReduceMax is exact; the sums differ from numpy's pairwise order by rounding only
    _check_sequence_lengths(dev, model, op, variant, feeds_list, _reference, exact=op == "ReduceMax", rtol=1e-5,
                            tunables={op: {"SERIAL_MAX_ROW": 64}})


@pytest.mark.parametrize("axis", (0, 1))
@pytest.mark.parametrize("index_type", (TensorProto.INT64, TensorProto.INT32))
def test_gather_at_three_sequence_lengths(dev, axis, index_type):
    """Gather of a float table [10, 6] by token ids [B, S] (axis 0: an embedding), or of
    activations [B, S, 6] by positions along axis 1 (negative ones count from the end): bits."""
    rng = np.random.default_rng(28)
    ints = np.int64 if index_type == TensorProto.INT64 else np.int32
    if axis == 0:
        table = numpy_helper.from_array(rng.standard_normal((10, 6)).astype(F32), "data")
        model = _model([helper.make_node("Gather", ["data", "ids"], ["y"], axis=0)],
                       [_vi("ids", index_type, ["B", "S"])], [table])
        feeds_list = [{"ids": rng.integers(-10, 10, (b, s)).astype(ints)} for b, s in ((1, 16), (2, 24), (3, 7))]
    else:
        model = _model([helper.make_node("Gather", ["data", "ids"], ["y"], axis=1)],
                       [_vi("data", TensorProto.FLOAT, ["B", "S", 6]), _vi("ids", index_type, ["Q"])])
        feeds_list = [{"data": rng.standard_normal((b, s, 6)).astype(F32),
                       "ids": rng.integers(-s, s, (q,)).astype(ints)} for b, s, q in ((1, 16, 3), (2, 24, 5), (3, 7, 2))]
    _check_sequence_lengths(dev, model, "Gather", None, feeds_list, _reference, exact=True)


# --------------------------------------------------------------------------- whole models

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

FLOAT_RTOL = 1e-4   # float forms (tests/backend/test_exported_models_gpu.py's bounds)
#: QOperator, QDQ and dynamic forms: a (re)quantization on a rounding boundary moves one code a step
#: (the zoo's dynamic transformer at B 1, S 24: 9.7e-3 of 4.46 from onnxruntime, on main as here:
#: DynamicQuantizeLinear of activations whose float sums differ in the last bit)
STATIC_RTOL = 2e-2


def _agree(got, want, quantized):
    assert_agree(got, want, STATIC_RTOL if quantized else FLOAT_RTOL)


def _run_shapes(dev, model, feeds_list, fmt):
    """Runs `model` at each feeds from a cold cache; returns the pipelines each run after the first
    compiled ('kernel/variant/pass' labels), each run's outputs checked against onnxruntime."""
    from onnx_quant.backend_wgpu.session import Session

    sess = Session(model, device=dev, allow_host_fallback=False)
    cache = dev.pipelines
    cache.forget()
    compiled = []
    for i, feeds in enumerate(feeds_list):
        before = set(cache._pipelines)
        got = sess.run(None, feeds)
        labels = sorted(cache._pipelines[k].label.split("/", 1)[-1] for k in set(cache._pipelines) - before)
        if i:
            compiled.append(labels)
        want = onnxruntime_run(model, feeds, level="ORT_ENABLE_ALL" if fmt == "qdq" else "ORT_DISABLE_ALL")
        _agree(got, want, fmt != "float")
    return compiled


#: what a new sequence length may compile in the zoo transformer: the dynamic form's attention
#: MatMuls change variant (simple -> blocked at S 16 -> 24, B 1 -> 2: TILED_MIN_MACS), one pipeline
ZOO_SEQUENCE_COMPILES = {"qoperator": [], "qdq": [], "dynamic": ["MatMul/blocked/main"]}


@pytest.mark.parametrize("fmt", sorted(ZOO_SEQUENCE_COMPILES))
def test_zoo_transformer_at_a_new_sequence_length(dev, fmt):
    """The zoo transformer at (B, S) = (1, 16), then (1, 24) (a new sequence length alone: 0
    pipelines), (2, 24) (and a second batch size) and (2, 12)."""
    from onnx_quant import model_zoo

    logging.getLogger().setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_zoo.quantized("transformer", fmt, per_channel=True)
    dims = [{"B": 1, "S": 16}, {"B": 1, "S": 24}, {"B": 2, "S": 24}, {"B": 2, "S": 12}]
    compiled = _run_shapes(dev, model, [model_zoo.random_feeds(model, d, seed=i) for i, d in enumerate(dims)], fmt)
    assert compiled[0] == [], compiled  # S 16 -> 24: nothing, in every form
    assert compiled[1] == ZOO_SEQUENCE_COMPILES[fmt], compiled
    assert compiled[2] == [], compiled


@pytest.mark.parametrize("form", ("float", "qoperator", "qdq", "dynamic"))
def test_exported_transformer_at_new_sequence_lengths(dev, form):
    """The torch-style exported transformer (onnx_quant.exported_models) at input_ids (2, 7),
    then (3, 7) (a second batch size), (2, 11) and (2, 15) (sequence lengths of one K % 4 bucket,
    under MatMul's TILED_MIN_MACS for the float logits projection, and a batch above 1: at batch 1
    the position embedding's Add is the identity broadcast, an elementwise pipeline of its own):
    0 pipelines after the first run."""
    from onnx_quant import exported_models as em

    logging.getLogger().setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = em.build("transformer", form)
    shapes = [{"input_ids": s} for s in ((2, 7), (3, 7), (2, 11), (2, 15))]
    compiled = _run_shapes(dev, model, [em.feeds(model, s, seed=i) for i, s in enumerate(shapes)], form)
    assert compiled == [[], [], []], compiled

"""NonZero, TopK, QLinearSigmoid / QLinearLeakyRelu, LSTM, GRU, RNN and DynamicQuantizeLSTM take their sizes
as runtime uniforms (issue #11; backend_wgpu/uniforms.py): each model runs at a first shape, then a
second batch size, then a new spatial size / sequence length, from a cold pipeline cache. The
second and third runs compile none of the kernel's pipelines, and every output agrees with its
oracle: numpy / onnx.reference bit for bit for NonZero and TopK, onnxruntime bit for bit for the
lookup-table ops, onnxruntime (optimizations off) within test_recurrent_gpu.py's tolerances for LSTM, onnxruntime on
one thread within test_dynamic_quantize_lstm_gpu.py's for DynamicQuantizeLSTM."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from support.gpu import runs_from_a_cold_cache
from support.models import make_model as _model  # (node, inputs, outputs, inits, [(domain, version), ...])
from support.oracles import onnxruntime_run

MS = "com.microsoft"
F32 = np.float32


def _vi(name, dtype, rank_or_dims):
    dims = rank_or_dims if isinstance(rank_or_dims, list) else [f"{name}_{i}" for i in range(rank_or_dims)]
    return helper.make_tensor_value_info(name, dtype, dims)


def _run_shapes(dev, model, feeds_list, kernel):
    """Outputs per feeds, and the labels of the pipelines each run compiled."""
    outs, compiled = runs_from_a_cold_cache(dev, model, feeds_list)
    assert any(kernel in lab for lab in compiled[0]), compiled[0]
    for feeds, labels in zip(feeds_list[1:], compiled[1:]):
        shapes = {k: v.shape for k, v in feeds.items()}
        assert not [lab for lab in labels if kernel in lab], f"{shapes} recompiled {kernel}: {labels}"
    return outs


# ----------------------------------------------------------------------------- NonZero, TopK


@pytest.mark.parametrize("dtype", [np.float32, np.uint8], ids=["float32", "uint8"])
def test_non_zero_compiles_once(best, dtype):
    model = _model(helper.make_node("NonZero", ["x"], ["y"]), [_vi("x", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), 3)],
                   [_vi("y", TP.INT64, 2)])
    rng = np.random.default_rng(0)
    shapes = [(2, 3, 50), (5, 3, 50), (2, 7, 300)]  # first; a second batch; a new spatial size (several blocks)
    feeds = [{"x": (rng.random(s) < 0.4).astype(dtype) * rng.integers(1, 5, s).astype(dtype)} for s in shapes]
    outs = _run_shapes(best, model, feeds, "NonZero")
    for f, (got,) in zip(feeds, outs):
        want = np.array(np.nonzero(f["x"]), np.int64)
        assert got.dtype == np.int64 and np.array_equal(got, want)


@pytest.mark.parametrize("largest", [1, 0])
def test_top_k_compiles_once(best, largest):
    k = numpy_helper.from_array(np.array([5], np.int64), "k")
    model = _model(helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=largest),
                   [_vi("x", TP.FLOAT, 3)], [_vi("v", TP.FLOAT, 3), _vi("i", TP.INT64, 3)], [k])
    rng = np.random.default_rng(1)
    shapes = [(1, 40, 3), (3, 40, 3), (1, 72, 5)]  # the row length and inner size change at the third
    feeds = [{"x": rng.integers(-20, 20, s).astype(F32)} for s in shapes]  # ties: index order decides
    outs = _run_shapes(best, model, feeds, "TopK")
    ref = ReferenceEvaluator(model)
    for f, got in zip(feeds, outs):
        for g, w in zip(got, ref.run(None, f)):
            assert g.dtype == w.dtype and np.array_equal(g, w)


# ----------------------------------------------------------------------------- lookup-table ops


@pytest.mark.parametrize("op", ["QLinearSigmoid", "QLinearLeakyRelu"])
def test_lookup_table_ops_compile_once(best, op):
    inits = [numpy_helper.from_array(np.array(0.043, F32), "xs"), numpy_helper.from_array(np.array(121, np.uint8), "xz"),
             numpy_helper.from_array(np.array(0.0041 if op == "QLinearSigmoid" else 0.05, F32), "ys"),
             numpy_helper.from_array(np.array(9, np.uint8), "yz")]
    node = helper.make_node(op, ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS)
    model = _model(node, [_vi("x", TP.UINT8, 4)], [_vi("y", TP.UINT8, 4)], inits, (("", 17), (MS, 1)))
    rng = np.random.default_rng(2)
    shapes = [(1, 4, 16, 16), (3, 4, 16, 16), (1, 4, 24, 20)]  # all above the table variant's 256 elements
    feeds = [{"x": rng.integers(0, 256, s, dtype=np.uint8)} for s in shapes]
    outs = _run_shapes(best, model, feeds, op)
    for f, (got,) in zip(feeds, outs):
        (want,) = onnxruntime_run(model, f)
        assert got.dtype == np.uint8 and np.array_equal(got, want)


# ----------------------------------------------------------------------------- LSTM, DynamicQuantizeLSTM

HIDDEN, INP = 6, 5
SHAPES = [(4, 2), (4, 3), (7, 2)]  # (sequence length, batch): first; a second batch; a new length


def _lstm_feeds(rng, seq, batch, *, seq_lens):
    feeds = {"X": rng.standard_normal([seq, batch, INP]).astype(F32),
             "initial_h": rng.standard_normal([2, batch, HIDDEN]).astype(F32),
             "initial_c": rng.standard_normal([2, batch, HIDDEN]).astype(F32)}
    if seq_lens:
        feeds["sequence_lens"] = rng.integers(1, seq + 1, batch).astype(np.int32)
    return feeds


def _lstm_io(seq_lens):
    names = ["X", "sequence_lens", "initial_h", "initial_c"] if seq_lens else ["X", "initial_h", "initial_c"]
    ins = [helper.make_tensor_value_info(n, TP.INT32 if n == "sequence_lens" else TP.FLOAT,
                                         {"X": ["S", "N", INP], "sequence_lens": ["N"]}.get(n, [2, "N", HIDDEN]))
           for n in names]
    outs = [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in ("Y", "Y_h", "Y_c")]
    return ins, outs


@pytest.mark.parametrize("seq_lens", [False, True], ids=["full", "sequence_lens"])
def test_lstm_compiles_once(best, seq_lens):
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal([2, 4 * HIDDEN, INP]) * 0.5).astype(F32), "W"),
             numpy_helper.from_array((rng.standard_normal([2, 4 * HIDDEN, HIDDEN]) * 0.5).astype(F32), "R"),
             numpy_helper.from_array(rng.standard_normal([2, 8 * HIDDEN]).astype(F32), "B"),
             numpy_helper.from_array(rng.standard_normal([2, 3 * HIDDEN]).astype(F32), "P")]
    node = helper.make_node("LSTM", ["X", "W", "R", "B", "sequence_lens" if seq_lens else "", "initial_h", "initial_c", "P"],
                            ["Y", "Y_h", "Y_c"], hidden_size=HIDDEN, direction="bidirectional")
    ins, outs = _lstm_io(seq_lens)
    model = _model(node, ins, outs, inits, (("", 14),))
    feeds = [_lstm_feeds(rng, s, n, seq_lens=seq_lens) for s, n in SHAPES]
    got_all = _run_shapes(best, model, feeds, "LSTM")
    for f, got in zip(feeds, got_all):
        # test_recurrent_gpu.py's oracle (onnx.reference ignores sequence_lens) and tolerances
        for g, w in zip(got, onnxruntime_run(model, f, level="ORT_DISABLE_ALL")):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("seq_lens", [False, True], ids=["full", "sequence_lens"])
def test_dynamic_quantize_lstm_compiles_once(best, seq_lens):
    rng = np.random.default_rng(4)
    w_scale = (rng.random([2]) * 0.02 + 0.001).astype(F32)
    r_scale = (rng.random([2]) * 0.02 + 0.001).astype(F32)
    inits = [numpy_helper.from_array(rng.integers(-127, 128, [2, INP, 4 * HIDDEN]).astype(np.int8), "W"),
             numpy_helper.from_array(rng.integers(-127, 128, [2, HIDDEN, 4 * HIDDEN]).astype(np.int8), "R"),
             numpy_helper.from_array(rng.standard_normal([2, 8 * HIDDEN]).astype(F32), "B"),
             numpy_helper.from_array(rng.standard_normal([2, 3 * HIDDEN]).astype(F32), "P"),
             numpy_helper.from_array(w_scale, "W_scale"), numpy_helper.from_array(np.zeros([2], np.int8), "W_zero_point"),
             numpy_helper.from_array(r_scale, "R_scale"), numpy_helper.from_array(np.zeros([2], np.int8), "R_zero_point")]
    node = helper.make_node("DynamicQuantizeLSTM",
                            ["X", "W", "R", "B", "sequence_lens" if seq_lens else "", "initial_h", "initial_c", "P",
                             "W_scale", "W_zero_point", "R_scale", "R_zero_point"],
                            ["Y", "Y_h", "Y_c"], domain=MS, hidden_size=HIDDEN, direction="bidirectional")
    ins, outs = _lstm_io(seq_lens)
    model = _model(node, ins, outs, inits, (("", 14), (MS, 1)))
    feeds = [_lstm_feeds(rng, s, n, seq_lens=seq_lens) for s, n in SHAPES]
    got_all = _run_shapes(best, model, feeds, "DynamicQuantizeLSTM")
    for f, got in zip(feeds, got_all):
        want = onnxruntime_run(model, f, threads=1)  # test_dynamic_quantize_lstm_gpu.py's oracle
        for g, w in zip(got, want):
            assert g.shape == w.shape
            assert float(np.abs(g.astype(np.float64) - w).max(initial=0)) <= 1e-5


@pytest.mark.parametrize("op", ["GRU", "RNN"])
def test_gru_rnn_compile_once(best, op):
    """The recurrent template's other members: the same uniforms (sequence length, batch)."""
    rng = np.random.default_rng(5)
    g = 3 if op == "GRU" else 1
    inits = [numpy_helper.from_array((rng.standard_normal([2, g * HIDDEN, INP]) * 0.5).astype(F32), "W"),
             numpy_helper.from_array((rng.standard_normal([2, g * HIDDEN, HIDDEN]) * 0.5).astype(F32), "R"),
             numpy_helper.from_array(rng.standard_normal([2, 2 * g * HIDDEN]).astype(F32), "B")]
    node = helper.make_node(op, ["X", "W", "R", "B", "sequence_lens", "initial_h"], ["Y", "Y_h"],
                            hidden_size=HIDDEN, direction="bidirectional")
    ins, _ = _lstm_io(True)
    ins = ins[:3]  # X, sequence_lens, initial_h
    outs = [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in ("Y", "Y_h")]
    model = _model(node, ins, outs, inits, (("", 14),))
    feeds = []
    for s, n in SHAPES:
        f = _lstm_feeds(rng, s, n, seq_lens=True)
        del f["initial_c"]
        feeds.append(f)
    got_all = _run_shapes(best, model, feeds, op)
    for f, got in zip(feeds, got_all):
        for g_, w in zip(got, onnxruntime_run(model, f, level="ORT_DISABLE_ALL")):
            assert g_.shape == w.shape
            np.testing.assert_allclose(g_, w, rtol=2e-5, atol=2e-6)

"""com.microsoft DynamicQuantizeLSTM on the GPU (the quantized branch of templates/recurrent.wgsl.jinja,
templates/dynamic_quantize_lstm.kernel.json) against onnxruntime's CPU kernel: one-node models built
with onnx.helper (int8 / uint8 weights, per-tensor [D] and per-column [D, 4H] scales, every
direction, initial states, peepholes, sequence_lens, output subsets, clip, input_forget) and LSTMs
quantized by ``onnxruntime.quantization.quantize_dynamic``.

onnxruntime runs on one thread (``intra_op_num_threads = 1``): with more it may quantize each
step's state per slice of the batch (UniDirectionalLstm's batch_parallel_), and the kernel, like
one thread, quantizes the whole [batch, H] state at once.

Tolerance ``ATOL`` = 1e-5 (absolute; outputs here are within a few units): the integer parts
(uint8 activations, int32 sums) are exact and the scaling and bias adds are rounded as onnxruntime
rounds them, so what differs is the sigmoid / tanh (MLAS's polynomials against the kernel's) and
float32 contractions in the cell update: measured max |diff| 8.3e-7 over every case below
(see the printed lines). One quantization step moved anywhere would show as ~1e-3 (an 8-bit
state step, 1/255 of its range, times a weight of order 1): ``test_tolerance_sees_one_state_step``
checks that such a change exceeds ATOL by far.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

from onnx_quant.backend_wgpu.session import Session
from support.oracles import onnxruntime_run

ATOL = 1e-5
MS = "com.microsoft"


def one_node(*, seq=4, batch=2, inp=5, hidden=3, direction="forward", wtype=np.int8, per_channel=False,
             bias=True, seq_lens=None, initial=False, peepholes=False, outputs=("Y", "Y_h", "Y_c"), seed=0,
             **attrs):
    """A DynamicQuantizeLSTM node with random quantized weights (initializers) and float inputs."""
    d = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(seed)
    lo, hi = (-127, 128) if wtype == np.int8 else (0, 256)
    scale_shape = [d, 4 * hidden] if per_channel else [d]
    # int8 weights need zero points 0 (onnxruntime checks); uint8 ones one value per direction
    zp = np.zeros(scale_shape, wtype) if wtype == np.int8 else np.full(scale_shape, rng.integers(100, 150), wtype)
    inits = {"W": rng.integers(lo, hi, [d, inp, 4 * hidden]).astype(wtype),
             "R": rng.integers(lo, hi, [d, hidden, 4 * hidden]).astype(wtype),
             "W_scale": (rng.random(scale_shape) * 0.02 + 0.001).astype(np.float32), "W_zero_point": zp,
             "R_scale": (rng.random(scale_shape) * 0.02 + 0.001).astype(np.float32), "R_zero_point": zp.copy()}
    feeds = {"X": rng.standard_normal([seq, batch, inp]).astype(np.float32)}
    if bias:
        feeds["B"] = rng.standard_normal([d, 8 * hidden]).astype(np.float32)
    if seq_lens is not None:
        feeds["sequence_lens"] = np.asarray(seq_lens, np.int32)
    if initial:
        feeds["initial_h"] = rng.standard_normal([d, batch, hidden]).astype(np.float32)
        feeds["initial_c"] = rng.standard_normal([d, batch, hidden]).astype(np.float32)
    if peepholes:
        feeds["P"] = rng.standard_normal([d, 3 * hidden]).astype(np.float32)
    optional = ["B", "sequence_lens", "initial_h", "initial_c", "P"]
    names = ["X", "W", "R"] + [n if n in feeds else "" for n in optional]
    names += ["W_scale", "W_zero_point", "R_scale", "R_zero_point"]
    outs = [o if o in outputs else "" for o in ("Y", "Y_h", "Y_c")]
    while not outs[-1]:
        outs.pop()
    node = helper.make_node("DynamicQuantizeLSTM", names, outs, domain=MS, hidden_size=hidden,
                            direction=direction, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, TP.INT32 if n == "sequence_lens" else TP.FLOAT, list(v.shape))
         for n, v in feeds.items()],
        [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in outs if o],
        initializer=[numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14), helper.make_opsetid(MS, 1)])
    return model, feeds


def float_lstm(*, seq=6, batch=3, inp=8, hidden=5, direction="forward", seq_lens=None, initial=False, seed=0):
    """A float LSTM with its weights as initializers (what quantize_dynamic quantizes)."""
    d = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(seed)
    inits = {"W": (rng.standard_normal([d, 4 * hidden, inp]) * 0.5).astype(np.float32),
             "R": (rng.standard_normal([d, 4 * hidden, hidden]) * 0.5).astype(np.float32),
             "B": rng.standard_normal([d, 8 * hidden]).astype(np.float32)}
    feeds = {"X": rng.standard_normal([seq, batch, inp]).astype(np.float32)}
    if seq_lens is not None:
        feeds["sequence_lens"] = np.asarray(seq_lens, np.int32)
    if initial:
        feeds["initial_h"] = rng.standard_normal([d, batch, hidden]).astype(np.float32)
        feeds["initial_c"] = rng.standard_normal([d, batch, hidden]).astype(np.float32)
    names = ["X", "W", "R", "B"] + [n if n in feeds else "" for n in ("sequence_lens", "initial_h", "initial_c")]
    while not names[-1]:
        names.pop()
    node = helper.make_node("LSTM", names, ["Y", "Y_h", "Y_c"], hidden_size=hidden, direction=direction)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, TP.INT32 if n == "sequence_lens" else TP.FLOAT, list(v.shape))
         for n, v in feeds.items()],
        [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in ("Y", "Y_h", "Y_c")],
        initializer=[numpy_helper.from_array(v, n) for n, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), feeds


def quantized(model, tmp_path, per_channel):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(model, src)
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=per_channel)
    q = onnx.load(dst)
    assert [(n.domain, n.op_type) for n in q.graph.node] == [(MS, "DynamicQuantizeLSTM")]
    return q


def onnxruntime_one_thread(model, feeds):
    return onnxruntime_run(model, feeds, threads=1)


def assert_matches_onnxruntime(model, feeds, device, label):
    want = onnxruntime_one_thread(model, feeds)
    with Session(model, device=device, allow_host_fallback=False) as s:
        assert not s.host_nodes
        got = s.run(None, feeds)
    diffs = []
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype == np.float32
        diffs.append(float(np.abs(g.astype(np.float64) - w).max(initial=0)))
    print(f"{label}: max |diff| {max(diffs):.2g} (outputs up to {max(float(np.abs(w).max()) for w in want):.2g})")
    assert max(diffs) <= ATOL, (label, diffs)
    return got, want


ONE_NODE = {
    "forward": {},
    "reverse": {"direction": "reverse"},
    "bidirectional": {"direction": "bidirectional"},
    "per-column": {"direction": "bidirectional", "per_channel": True},
    "uint8": {"wtype": np.uint8},
    "uint8 per-column": {"wtype": np.uint8, "per_channel": True, "direction": "bidirectional"},
    "no bias": {"bias": False, "direction": "reverse"},
    "initial states, peepholes": {"initial": True, "peepholes": True, "direction": "bidirectional"},
    "sequence_lens": {"batch": 4, "seq_lens": [4, 1, 3, 2], "direction": "bidirectional", "initial": True},
    "sequence_lens shorter than X": {"batch": 3, "seq_lens": [2, 1, 2], "seq": 5},
    "sequence_lens, Y_h and Y_c only": {"batch": 4, "seq_lens": [2, 4, 1, 3], "outputs": ("Y_h", "Y_c")},
    "an empty sequence": {"batch": 3, "seq_lens": [3, 0, 4], "initial": True},
    "Y only": {"outputs": ("Y",), "direction": "reverse"},
    "clip, input_forget": {"clip": 0.7, "input_forget": 1, "batch": 3},
    "several hidden units per invocation": {"seq": 6, "batch": 3, "inp": 40, "hidden": 90,
                                            "direction": "bidirectional", "initial": True, "seed": 3},
}


@pytest.mark.parametrize("case", ONE_NODE)
def test_one_node_matches_onnxruntime(best, case):
    model, feeds = one_node(**ONE_NODE[case])
    assert_matches_onnxruntime(model, feeds, best, case)


QUANTIZED = {
    "forward": {},
    "reverse": {"direction": "reverse"},
    "bidirectional, initial states": {"direction": "bidirectional", "initial": True},
    "bidirectional, sequence_lens": {"direction": "bidirectional", "seq_lens": [6, 2, 4]},
}


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
@pytest.mark.parametrize("case", QUANTIZED)
def test_quantize_dynamic_lstm_matches_onnxruntime(best, tmp_path, case, per_channel):
    model, feeds = float_lstm(**QUANTIZED[case])
    q = quantized(model, tmp_path, per_channel)
    scale = numpy_helper.to_array(next(i for i in q.graph.initializer if i.name == q.graph.node[0].input[8]))
    assert scale.ndim == (2 if per_channel else 1)
    assert_matches_onnxruntime(q, feeds, best, f"quantize_dynamic {case} {'per-channel' if per_channel else ''}")


def test_tolerance_sees_one_state_step(best):
    """ATOL is far below what one quantization step of the state moves: rescaling R by one part in
    255 (what a state step costs a product) moves the outputs by far more than ATOL."""
    model, feeds = one_node(batch=3, direction="bidirectional", initial=True)
    got, _ = assert_matches_onnxruntime(model, feeds, best, "base")
    r_scale = next(i for i in model.graph.initializer if i.name == "R_scale")
    moved = numpy_helper.to_array(r_scale) * np.float32(1 + 1 / 255)
    r_scale.CopyFrom(numpy_helper.from_array(moved.astype(np.float32), "R_scale"))
    other = onnxruntime_one_thread(model, feeds)
    assert max(float(np.abs(g - o).max()) for g, o in zip(got, other)) > 20 * ATOL


def test_state_range_spans_the_batch(best):
    """Each step's state is quantized over every batch row at once: one batch row's result depends on
    the others (a larger row widens the range), as in onnxruntime on one thread."""
    model, feeds = one_node(batch=2, initial=True, seq=3)
    got, _ = assert_matches_onnxruntime(model, feeds, best, "batch 2")
    feeds2 = dict(feeds, initial_h=feeds["initial_h"].copy())
    feeds2["initial_h"][:, 1] *= 8  # only row 1 changes: row 0's state range widens
    got2, _ = assert_matches_onnxruntime(model, feeds2, best, "batch 2, row 1 scaled")
    assert float(np.abs(got[0][:, :, 0] - got2[0][:, :, 0]).max()) > 20 * ATOL


def test_a_batch_beyond_workgroup_memory_is_refused(best):
    """The kernel holds the whole batch's state and input row in workgroup memory; where that does
    not fit it declines, and no host path exists for the com.microsoft op: a typed refusal."""
    from onnx_quant.errors import ExecutionError

    hidden, inp = 256, 64
    limit = best.info.limits["maxComputeWorkgroupStorageSize"]
    batch = limit // (4 * (2 * hidden + inp)) + 1
    model, feeds = one_node(seq=2, batch=batch, inp=inp, hidden=hidden)
    with pytest.raises(ExecutionError, match="DynamicQuantizeLSTM"):
        with Session(model, device=best, allow_host_fallback=False) as s:
            s.run(None, feeds)
    # the spec's sharedBytes: the state, its quantized copy and the input row, 4 bytes each, and
    # the min/max reduction's two words per invocation (256 of them)
    fitting = (limit - 8 * 256 - 16) // (4 * (2 * hidden + inp))
    fits, fits_feeds = one_node(seq=2, batch=fitting, inp=inp, hidden=hidden)
    assert_matches_onnxruntime(fits, fits_feeds, best, "the largest batch that fits")


@pytest.mark.parametrize("wtype,zero_points,why", [
    (np.int8, lambda shape: np.full(shape, 3, np.int8), "int8 weights with a non-zero zero point"),
    (np.uint8, lambda shape: np.arange(int(np.prod(shape))).reshape(shape).astype(np.uint8) + 100,
     "per-column zero points that differ"),
])
def test_zero_points_the_kernel_cannot_honour_are_declined(best, wtype, zero_points, why):
    """onnxruntime's kernel reads one zero point per direction and refuses non-zero int8 ones; the
    kernel declines any other zero points (a typed refusal naming the clause), never returns a value
    that ignores them."""
    from onnx_quant.errors import ExecutionError

    model, feeds = one_node(wtype=wtype, per_channel=True)
    for init in model.graph.initializer:
        if init.name in ("W_zero_point", "R_zero_point"):
            init.CopyFrom(numpy_helper.from_array(zero_points(tuple(init.dims)), init.name))
    with pytest.raises(ExecutionError, match="zeroPointsOk"):
        with Session(model, device=best, allow_host_fallback=False) as s:
            s.run(None, feeds)

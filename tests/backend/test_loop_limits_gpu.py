"""llvmpipe (lavapipe) silently stops a shader invocation after 65535 loop iterations, every loop of
the invocation counted together, each loop's exit test too (test_device.py documents the limiter).
A kernel whose per-invocation loops grow with the input declines the node before its count can
pass that: a typed KernelRejected naming the clause (`loopsFit`, `lanesFit`, a variant's
`simpleLoopsFit` ...) over its spec's tunable (MAX_LOOP_ITERATIONS / MAX_LANE_ITERATIONS, 60000).
Each case runs a model whose loops stay just below its spec's bound against onnx.reference
(numpy, onnxruntime) and is declined just above it, where the kernel returned a wrong value
before its clause; the tensors are single long rows or windows, as small as the bound allows.
RoiAlign's adaptive grid comes from the rois' values, which no plan sees: the kernel counts it on
the device and the run raises LoopLimitError (the spec's loopChecks). llvmpipe runs 8 lanes in
step, a loop until its last lane leaves, so lanes whose counts differ share the cap too.

On the default adapter only (conftest's ``dev``); the limiter is llvmpipe's, the clauses hold on
any device.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP, helper
from support.models import make_model, node_model
from support.oracles import ref_run

from onnx_quant.errors import ExecutionError

pytestmark = pytest.mark.devices("best")


def gpu(dev, model, feeds):
    from onnx_quant.backend_wgpu.session import Session

    with Session(model, device=dev, allow_host_fallback=False) as s:
        return s.run(None, feeds)


def below_and_above(dev, small, big, clause="loopsFit", rtol=1e-5, atol=1e-5, oracle=None):
    """``small`` (a model and its feeds) runs and its outputs agree with the oracle (onnx.reference
    by default); ``big`` is declined by ``clause``."""
    model, feeds = small
    want = oracle(*small) if oracle else ref_run(model, feeds)
    for g, w in zip(gpu(dev, model, feeds), want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)
    with pytest.raises(ExecutionError, match=clause):
        gpu(dev, *big)


def ramp(n, dtype=np.float32, seed=0):
    """Values in [-1, 1), the largest (1.0) last: a loop cut short misses it."""
    x = np.random.default_rng(seed).uniform(-1, 1, n).astype(dtype)
    x[-1] = 1
    return x


# ----------------------------------------------------------------------------- LinearAttention


def _linear_attention(steps, dk):
    ins = [helper.make_tensor_value_info(n, TP.FLOAT, None) for n in ("q", "k", "v")]
    node = helper.make_node("LinearAttention", ["q", "k", "v"], ["y", "state"], q_num_heads=1, kv_num_heads=1,
                            update_rule="linear")
    model = make_model(node, ins, [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in ("y", "state")], opset=27)
    rng = np.random.default_rng(steps)
    feeds = {n: rng.uniform(-1, 1, (1, steps, dk)).astype(np.float32) / (4 if n == "k" else 1) for n in "qk"}
    feeds["v"] = rng.uniform(-1, 1, (1, steps, 1)).astype(np.float32)
    return model, feeds


def test_linear_attention_steps(dev):
    """A column's invocation runs every step: (d_k + 1) for the state update, d_k + 2 per query
    head of the group, per step (16 x 1600 runs; 16 x 2048 summed the first 1770 steps only)."""
    below_and_above(dev, _linear_attention(1600, 16), _linear_attention(2048, 16), rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- pools


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
def test_a_pool_window(dev, op):
    """One output element loops over its whole window: a 1-D window of 59000 positions runs
    (LpPool's p = 2 counts a multiplication loop per position: 14000), 70000 is declined (the maximum
    at the end was missed, the average and the norm summed 65534 positions)."""
    n = 14000 if op == "LpPool" else 59000
    small = {"x": ramp(n).reshape(1, 1, n)}
    model = node_model(op, [("x", small["x"])], ["y"], attrs={"kernel_shape": [n]}, opset=18)
    np.testing.assert_allclose(gpu(dev, model, small)[0], ref_run(model, small)[0], rtol=1e-4)
    big = {"x": ramp(70000).reshape(1, 1, 70000)}
    big_model = node_model(op, [("x", big["x"])], ["y"], attrs={"kernel_shape": [70000]}, opset=18)
    with pytest.raises(ExecutionError, match="loopsFit"):
        gpu(dev, big_model, big)


def test_a_whole_image_average_pool_of_256_x_256(dev):
    """A realistic window past the cap: 256 x 256 positions (plus the loops' own steps) per output;
    it summed 65025 of them before the clause. 240 x 240 runs."""
    for side, runs in ((240, True), (256, False)):
        x = np.random.default_rng(side).uniform(0, 1, (1, 1, side, side)).astype(np.float32)
        model = node_model("AveragePool", [("x", x)], ["y"], attrs={"kernel_shape": [side, side]}, opset=18)
        if runs:
            np.testing.assert_allclose(gpu(dev, model, {"x": x})[0], ref_run(model, {"x": x})[0], rtol=1e-5)
        else:
            with pytest.raises(ExecutionError, match="loopsFit"):
                gpu(dev, model, {"x": x})


def _qlinear_average_pool(n):
    x = np.random.default_rng(n).integers(0, 256, (1, 4, n)).astype(np.uint8)
    inputs = [("X", x), ("Xs", np.array(0.05, np.float32)), ("Xz", np.array(3, np.uint8)),
              ("Ys", np.array(0.04, np.float32)), ("Yz", np.array(5, np.uint8))]
    return node_model("QLinearAveragePool", inputs, ["Y"], attrs={"kernel_shape": [n]}, domain="com.microsoft",
                      opset=13), dict(inputs)


def test_qlinear_average_pool_window_per_element_of_a_word(dev):
    """An 8-bit output word holds 4 elements, each a window's loop in the same invocation: 4 x 4900
    positions run (onnxruntime within one step); 4 x 20000 left the fourth channel's sum short."""
    from support.oracles import ort_run

    below_and_above(dev, _qlinear_average_pool(4900), _qlinear_average_pool(20000), rtol=0, atol=1,
                    oracle=lambda model, feeds: ort_run(model, feeds))


# ----------------------------------------------------------------------------- scatters


def _codes(n):
    """uint8 updates, 1..255 (the data is 0): four elements to a word, four loops per invocation."""
    return (np.arange(n) % 255 + 1).astype(np.uint8)


def _scatter_elements(n):
    data = np.zeros(n, np.uint8)
    idx = np.arange(n - 1, -1, -1, dtype=np.int64)  # element i gets update n - 1 - i
    upd = _codes(n)
    model = node_model("ScatterElements", [("x", data), ("i", idx), ("u", upd)], ["y"], attrs={"axis": 0}, opset=18)
    return model, {"x": data, "i": idx, "u": upd}


def _scatter_nd(n):
    data = np.zeros(n, np.uint8)
    idx = np.arange(n - 1, -1, -1, dtype=np.int64).reshape(n, 1)
    upd = _codes(n)
    model = node_model("ScatterND", [("x", data), ("i", idx), ("u", upd)], ["y"], opset=18)
    return model, {"x": data, "i": idx, "u": upd}


@pytest.mark.parametrize("make", [_scatter_elements, _scatter_nd], ids=["ScatterElements", "ScatterND"])
def test_a_scatter_walks_every_update_that_can_hit(dev, make):
    """Output element i walks the updates along the axis (ScatterElements) or every index row
    (ScatterND), for each of the 4 uint8 elements of its word: 4 x 14900 run; with 4 x 20000 the
    last element's loop was cut short and kept the data."""
    below_and_above(dev, make(14900), make(20000), rtol=0, atol=0)


# ----------------------------------------------------------------------------- Attention


def _attention(keys):
    q = np.ones((1, 1, 1, 1), np.float32)
    k = ramp(keys).reshape(1, 1, keys, 1)
    k[..., -1, 0] = 10  # the last key takes most of the weight
    v = ramp(keys, seed=1).reshape(1, 1, keys, 1)
    return node_model("Attention", [("q", q), ("k", k), ("v", v)], ["y"], opset=23), {"q": q, "k": k, "v": v}


def test_attention_output_sums_over_every_key(dev):
    """An output element sums its L keys' weighted values in one invocation: 59000 keys run;
    70000 left out the last (heaviest) keys before the clause."""
    below_and_above(dev, _attention(59000), _attention(70000), rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- word-grid kernels


def _col2im(n):
    """One output element whose block of n positions is all padding but the last."""
    x = ramp(n).reshape(1, n, 1)
    image, block = np.array([1], np.int64), np.array([n], np.int64)
    model = node_model("Col2Im", [("x", x), ("image", image), ("block", block)], ["y"], attrs={"pads": [n - 1, 0]},
                       opset=18, inits={"image": image, "block": block})
    return model, {"x": x}


def _causal_conv(k):
    x = np.array([[[0.75]]], np.float32)
    w = ramp(k).reshape(1, 1, k)
    ins = [helper.make_tensor_value_info(n, TP.FLOAT, None) for n in ("x", "w")]
    node = helper.make_node("CausalConvWithState", ["x", "w"], ["y", "state"])
    outs = [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in ("y", "state")]
    return make_model(node, ins, outs, opset=27), {"x": x, "w": w}


def _deform_conv(channels):
    rng = np.random.default_rng(channels)
    x = rng.uniform(-1, 1, (1, channels, 2, 2)).astype(np.float32)
    w = rng.uniform(-1, 1, (1, channels, 1, 1)).astype(np.float32)
    offset = np.zeros((1, 2, 2, 2), np.float32)
    model = node_model("DeformConv", [("x", x), ("w", w), ("offset", offset)], ["y"], opset=19)
    return model, {"x": x, "w": w, "offset": offset}


def _deform_conv_numpy(model, feeds):
    """No offsets and a 1 x 1 kernel: each output the channels' weighted sum at its position."""
    return [np.einsum("c,chw->hw", feeds["w"][0, :, 0, 0].astype(np.float64),
                      feeds["x"][0].astype(np.float64)).astype(np.float32)[None, None]]


def _roi_align(ratio):
    x = np.linspace(0, 1, 64 * 64, dtype=np.float32).reshape(1, 1, 64, 64)
    rois = np.array([[0, 0, 63, 63]], np.float32)
    idx = np.zeros(1, np.int64)
    model = node_model("RoiAlign", [("x", x), ("rois", rois), ("idx", idx)], ["y"], opset=16,
                       attrs={"output_height": 1, "output_width": 1, "sampling_ratio": ratio})
    return model, {"x": x, "rois": rois, "idx": idx}


@pytest.mark.parametrize("make, below, above, oracle", [(_col2im, 59000, 70000, None), (_causal_conv, 59000, 70000, None),
                                                        (_deform_conv, 11900, 70000, _deform_conv_numpy),
                                                        (_roi_align, 240, 260, None)],
                         ids=["Col2Im", "CausalConvWithState", "DeformConv", "RoiAlign"])
def test_a_word_grid_kernel_loop(dev, make, below, above, oracle):
    """One output element's loop over its block (Col2Im), taps (CausalConvWithState), channel
    group times window (DeformConv: counted 5 iterations a channel with a 1 x 1 kernel, whose
    loops the compiler unrolls: 70000 channels failed) or sampling grid
    (RoiAlign's sampling_ratio squared): below the bound it agrees, above it is declined (before
    the clause: Col2Im's one block position inside the image and the conv's last tap were left
    out, DeformConv dropped the last channels, RoiAlign the last samples of its average)."""
    below_and_above(dev, make(below), make(above), rtol=1e-4, atol=1e-5, oracle=oracle)


# ----------------------------------------------------------------------------- RoiAlign's adaptive grid


def _adaptive_roi_align(grids, dtype=np.float32, mode="avg", hw=8):
    """RoiAlign named 'ra', sampling_ratio 0 and a 1 x 1 output over an hw x hw ramp: roi r spans
    hw - h .. hw down and hw - w .. hw across for grids[r] = (h, w), so its sampling grid is h x w
    (ceil(roi size / 1)) and the image is its last samples: a loop cut short misses it."""
    x = np.linspace(0.5, 1, hw * hw, dtype=dtype).reshape(1, 1, hw, hw)
    rois = np.array([[hw - w, hw - h, hw, hw] for h, w in grids], dtype)
    idx = np.zeros(len(grids), np.int64)
    node = helper.make_node("RoiAlign", ["x", "rois", "idx"], ["y"], name="ra", output_height=1, output_width=1,
                            sampling_ratio=0, mode=mode)
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = make_model([node], [helper.make_tensor_value_info("x", t, list(x.shape)),
                                helper.make_tensor_value_info("rois", t, list(rois.shape)),
                                helper.make_tensor_value_info("idx", TP.INT64, [len(grids)])],
                       [helper.make_tensor_value_info("y", t, None)], opset=16)
    return model, {"x": x, "rois": rois, "idx": idx}


@pytest.mark.parametrize("dtype, below, above", [(np.float32, [(240, 240)], [(300, 300)]),
                                                 (np.float16, [(170, 170)] * 2, [(200, 200)] * 2)],
                         ids=["float32", "float16"])
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_adaptive_grid(dev, dtype, below, above, mode):
    """sampling_ratio 0 takes an output's sampling grid from the rois' values, ceil(roi size /
    output size) a side, which no plan sees: the kernel counts a roi's loop steps on the device
    (h w + 1 an output element, as loopsFit counts a fixed grid, per element of the word) and a
    roi past the bound raises LoopLimitError naming the node, the roi, its grid and the bound.
    Below it agrees with onnx.reference (float32 240 x 240; float16, two elements a word, 170 x
    170); above it llvmpipe's cap returned 0 before the check (float32 300 x 300: for 0.00065
    avg, 1.0 max; float16 2 x 200 x 200: the word's second element)."""
    from onnx_quant.errors import LoopLimitError

    model, feeds = _adaptive_roi_align(below, dtype, mode)
    got, want = gpu(dev, model, feeds)[0], ref_run(model, feeds)[0]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 2e-3, atol=1e-6)
    with pytest.raises(LoopLimitError, match="roi 0") as err:
        gpu(dev, *_adaptive_roi_align(above, dtype, mode))
    e = err.value
    assert (e.node, e.input, e.index, e.grid) == ("node 'ra' (RoiAlign)", "'rois' (value 'rois')", 0, above[0])
    assert (e.steps, e.bound) == (above[0][0] * above[0][1] + 1, (60000 - 1) // (4 // np.dtype(dtype).itemsize))


def test_roi_align_adaptive_grid_names_the_roi(dev):
    """The roi past the bound is named (h w + 1 steps: 2 x 29999 and 29999 x 2 are 59999 and run,
    2 x 30000 and 30000 x 2 are 60001, past it); the two rois that run side by side, in lanes
    llvmpipe runs in step, match onnx.reference: the grid is one loop, so the lanes take the most
    of one lane's steps (with a loop per axis their steps added up: 2 x 29990 beside 14999 x 2,
    each under the cap alone, returned 0 for 0.00045); the session's next run matches too (the
    error buffer is zeroed again)."""
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import LoopLimitError

    model, feeds = _adaptive_roi_align([(3, 3), (2, 29999), (29999, 2), (2, 30000)])
    wide = _adaptive_roi_align([(30000, 2)])[1]["rois"]
    with Session(model, device=dev, allow_host_fallback=False) as s:
        with pytest.raises(LoopLimitError, match=r"node 'ra' \(RoiAlign\): input 'rois' .*: roi 3 gives .* 2 x 30000 "
                                                 r"loop grid \(60001 loop steps\), more than the 59999"):
            s.run(None, feeds)
        ok = {**feeds, "rois": feeds["rois"][[0, 1, 2, 0]]}
        np.testing.assert_allclose(s.run(None, ok)[0], ref_run(model, ok)[0], rtol=1e-5, atol=1e-6)
        with pytest.raises(LoopLimitError, match=r"roi 1 gives .* 30000 x 2 loop grid \(60001 loop steps\)"):
            s.run(None, {**feeds, "rois": np.concatenate([feeds["rois"][:1], wide, feeds["rois"][:2]])})


def test_roi_align_grid_check_only_where_the_grid_is_runtime(dev):
    """A fixed sampling_ratio is bounded at plan time (loopsFit): its plan binds no error buffer
    (nothing more to read back); sampling_ratio 0's does, and run alone (run_plan, no Session) it
    raises the same error."""
    from onnx_quant.backend_wgpu import index_check
    from onnx_quant.errors import LoopLimitError
    from support.run import plan_for, run_node

    assert not index_check.checks(plan_for(dev, *_roi_align(2))[1])
    model, feeds = _adaptive_roi_align([(300, 300)])
    assert index_check.checks(plan_for(dev, model, feeds)[1])
    with pytest.raises(LoopLimitError, match="300 x 300"):
        run_node(dev, model, feeds)


def _lrn(channels):
    x = ramp(channels, np.float16).reshape(1, channels, 1, 1)
    attrs = {"size": 2 * channels + 1, "alpha": float(2 * channels + 1), "beta": 0.5}  # x / sqrt(1 + sum of squares)
    return node_model("LRN", [("x", x)], ["y"], attrs=attrs, opset=13), {"x": x}


def _dft(n):
    x = np.zeros((1, n, 1), np.float16)
    x[0, -1, 0] = 1
    return node_model("DFT", [("x", x)], ["y"], attrs={"onesided": 1}, opset=20), {"x": x}


def _lrn_numpy(model, feeds):
    """LRN whose window spans every channel, in float64 (onnx.reference sums float16 squares in float16)."""
    x = feeds["x"].astype(np.float64)
    return [(x / np.sqrt(1 + (x * x).sum())).astype(np.float16)]


@pytest.mark.parametrize("make, below, above, oracle", [(_lrn, 29900, 40000, _lrn_numpy), (_dft, 29900, 40000, None)],
                         ids=["LRN", "DFT"])
def test_a_loop_per_element_of_a_float16_word(dev, make, below, above, oracle):
    """Every output element loops over the channels (LRN with a window wider than them) or the
    signal (DFT), so the elements are as many as the loop is long: float16 puts two elements in a
    word, each a loop, which halves the bound (29997); 40000 summed a part of the last element's
    terms (DFT: its last input, the only nonzero one, left out)."""
    below_and_above(dev, make(below), make(above), rtol=2e-3, atol=1e-5, oracle=oracle)


# ----------------------------------------------------------------------------- reductions over the input


def _conv_transpose(channels):
    x = ramp(channels).reshape(1, channels, 1)
    w = ramp(channels, seed=1).reshape(channels, 1, 1)
    return node_model("ConvTranspose", [("x", x), ("w", w)], ["y"], opset=11), {"x": x, "w": w}


def _mvn(n):
    x = ramp(n).reshape(1, 1, 1, n)
    node = helper.make_node("MeanVarianceNormalization", ["x"], ["y"])  # axes [0, 2, 3]: n positions a group
    shape = [helper.make_tensor_value_info(v, TP.FLOAT, list(x.shape)) for v in ("x", "y")]
    return make_model([node], shape[:1], shape[1:], opset=13), {"x": x}


def _qlinear_global_average_pool(n):
    x = np.random.default_rng(n).integers(0, 256, (1, 4, n)).astype(np.uint8)
    inputs = [("X", x), ("Xs", np.array(0.05, np.float32)), ("Xz", np.array(3, np.uint8)),
              ("Ys", np.array(0.04, np.float32)), ("Yz", np.array(5, np.uint8))]
    return node_model("QLinearGlobalAveragePool", inputs, ["Y"], domain="com.microsoft", opset=13), dict(inputs)


def _ort(model, feeds):
    from support.oracles import ort_run

    return ort_run(model, feeds)


@pytest.mark.parametrize("make, below, above, clause, atol, oracle", [
    (_conv_transpose, 19900, 70000, "loopsFit", 1e-4, None),
    (_mvn, 59000, 70000, "loopsFit", 1e-4, None),
    (_qlinear_global_average_pool, 950000, 1200000, "lanesFit", 1, _ort)],
    ids=["ConvTranspose", "MeanVarianceNormalization", "QLinearGlobalAveragePool"])
def test_a_reduction_over_the_input(dev, make, below, above, clause, atol, oracle):
    """An output's sum over its channel group (ConvTranspose, counted 3 a channel with a kernel of 1),
    a group's over its reduced positions (MeanVarianceNormalization's stats, axes [0, 2, 3] of
    1 x 1 x 1 x n),
    a workgroup lane's over its 1/64 of the image for each element of its word
    (QLinearGlobalAveragePool, uint8: 4): below the bound it agrees, above it is declined (before
    the clause the sums stopped short: 70000 channels, 70000 positions, 4 x 1200000 / 64)."""
    below_and_above(dev, make(below), make(above), clause=clause, rtol=1e-4, atol=atol, oracle=oracle)


def _layer_norm(d):
    x = ramp(d).reshape(1, d)
    scale = np.ones(d, np.float32)
    return node_model("LayerNormalization", [("x", x), ("scale", scale)], ["y"], opset=17), {"x": x, "scale": scale}


def test_a_workgroup_normalization_row(dev):
    """workgroup: each of a row's 64 lanes walks its 1/64 of the row three times (the mean, the
    squares, the outputs, each output a correctly rounded division of up to 4 steps): a row of
    540000 runs; 1500000 left the last outputs unwritten before the clause."""
    below_and_above(dev, _layer_norm(540000), _layer_norm(1500000), clause="MAX_LANE_ITERATIONS", rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- GEMMs along K


def _matmul(k, m=1, n=1):
    a = ramp(m * k).reshape(m, k) / 64
    b = ramp(k * n, seed=1).reshape(k, n)
    return node_model("MatMul", [("a", a), ("b", b)], ["y"], opset=13), {"a": a, "b": b}


def gpu_variant(dev, model, feeds, variant, op="MatMul"):
    from onnx_quant.backend_wgpu.session import Session

    with Session(model, device=dev, allow_host_fallback=False, variants={op: variant}) as s:
        return s.run(None, feeds)


@pytest.mark.parametrize("variant, below, above, shape", [("simple", 239000, 270000, (1, 1)),
                                                          ("blocked", 239000, 530000, (1, 1)),
                                                          ("tiled", 53000, 70000, (16, 16))])
def test_float_matmul_along_k(dev, variant, below, above, shape):
    """An output's sum along K, 4 k a loop step (simple, blocked) or 18 loop steps per 16 k
    (tiled: a tile's loads and its 16 products): each variant, forced, agrees below its bound and
    is declined above (before: simple 270000 and tiled 70000 summed a part of K)."""
    model, feeds = _matmul(below, *shape)
    want = ref_run(model, feeds)[0]
    np.testing.assert_allclose(gpu_variant(dev, model, feeds, variant)[0], want, rtol=1e-3, atol=1e-3)
    model, feeds = _matmul(above, *shape)
    with pytest.raises(ExecutionError, match=variant + "LoopsFit"):
        gpu_variant(dev, model, feeds, variant)


def _matmul_integer(k, m=1, n=1):
    rng = np.random.default_rng(k)
    a = rng.integers(0, 4, (m, k)).astype(np.uint8)
    b = rng.integers(0, 4, (k, n)).astype(np.uint8)
    return node_model("MatMulInteger", [("a", a), ("b", b)], ["y"], opset=10, out_types=[np.int32]), {"a": a, "b": b}


def _conv(channels):
    x = ramp(channels).reshape(1, channels, 1)
    w = ramp(channels, seed=1).reshape(1, channels, 1)
    return node_model("Conv", [("x", x), ("w", w)], ["y"], opset=11), {"x": x, "w": w}


@pytest.mark.parametrize("make, op, variant, below, above, clause", [
    (_matmul_integer, "MatMulInteger", "simple", 59900, 70000, "simpleLoopsFit"),
    (lambda k: _matmul_integer(k, 64, 64), "MatMulInteger", "tiled", 68000, 80000, "tiledLoopsFit"),
    (_conv, "Conv", "direct", 19900, 70000, "directLoopsFit")], ids=["MatMulInteger-simple", "MatMulInteger-tiled",
                                                                     "Conv-direct"])
def test_an_integer_or_conv_gemm_along_k(dev, make, op, variant, below, above, clause):
    """The variants that loop along K (the integer simple one, one k a step; tiled, 28 loop steps
    per 32 k; the float Conv's direct one, its channel group's windows, counted 3 a channel with a
    kernel of 1), forced: below the bound they agree (MatMulInteger bit for bit), above they are
    declined (before: K 70000, 80000 and 70000 channels summed a part)."""
    model, feeds = make(below)
    want = ref_run(model, feeds)[0]
    got = gpu_variant(dev, model, feeds, variant, op)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 if got.dtype == np.float32 else 0)
    model, feeds = make(above)
    with pytest.raises(ExecutionError, match=clause):
        gpu_variant(dev, model, feeds, variant, op)


def _dynamic_quantize_matmul(k):
    rng = np.random.default_rng(k)
    a = rng.uniform(-1, 1, (1, k)).astype(np.float32)
    b = rng.integers(-4, 5, (k, 1)).astype(np.int8)
    s = np.array([0.01], np.float32)
    model = node_model("DynamicQuantizeMatMul", [("A", a), ("B", b), ("S", s)], ["Y"], domain="com.microsoft",
                       opset=13, inits={"B": b, "S": s})
    return model, {"A": a}


def test_dynamic_quantize_matmul_two_pass_along_k(dev):
    """two_pass, forced: each K_TILE (64) k a tile's loads and 64 products (K up to about 50 k:
    50000 agrees with onnxruntime); 60000 stopped short of K before the clause."""
    from support.oracles import ort_run

    model, feeds = _dynamic_quantize_matmul(50000)
    got = gpu_variant(dev, model, feeds, "two_pass", "DynamicQuantizeMatMul")[0]
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-5, atol=1e-4)
    model, feeds = _dynamic_quantize_matmul(60000)
    with pytest.raises(ExecutionError, match="tileLoopsFit"):
        gpu_variant(dev, model, feeds, "two_pass", "DynamicQuantizeMatMul")

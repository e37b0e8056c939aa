"""GridSample, AffineGrid and RoiAlign on the GPU (templates/grid_sample, affine_grid and
roi_align.kernel.json). Oracles: onnx.reference over shapes, modes, padding modes, align_corners,
coordinate transformation modes and types (integer outputs, GridSample's nearest copies, bit for
bit; float ones within the reference's float32 rounding), onnxruntime CPU on a spatial transformer
(AffineGrid -> GridSample) and a torchvision-style RoIAlign head as the exporters write them; a
second shape from a cold cache compiles none of their pipelines."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto as TP, helper, numpy_helper

from support.gpu import assert_node_cases_pass_or_declined, gpu_examples, runs_from_a_cold_cache
from support.models import make_model, node_model
from support.oracles import assert_agree, onnxruntime_run, ref_run

#: GridSample's element types and the data their inputs are drawn from
GRID_TYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "uint8": np.uint8, "int64": np.int64}
#: the tolerance per float type: the reference computes a float16 input's weights in float16
RTOL = {"float32": 1e-5, "float16": 2e-2}


def _run(device, model, feeds):
    from onnx_quant.backend_wgpu.session import Session

    with Session(model, device=device, allow_host_fallback=False) as s:
        return s.run(None, feeds)


def test_onnx_node_cases_pass_on_the_gpu(best):
    assert_node_cases_pass_or_declined(best, ("GridSample",), {}, 18, expanded=False)
    assert_node_cases_pass_or_declined(best, ("RoiAlign",), {}, 3, expanded=False)
    assert_node_cases_pass_or_declined(best, ("AffineGrid",), {}, 4, expanded=False)


@settings(max_examples=gpu_examples(), deadline=None)
@given(dims=st.sampled_from([(3, 4), (1, 5), (2, 3, 4)]), out=st.integers(1, 4), mode=st.sampled_from(["nearest", "linear", "cubic"]),
       padding=st.sampled_from(["zeros", "border", "reflection"]), align=st.sampled_from([0, 1]),
       dtype=st.sampled_from(sorted(GRID_TYPES)), opset=st.sampled_from([16, 20, 22]), seed=st.integers(0, 2**16))
def test_grid_sample_matches_onnx_reference(best, dims, out, mode, padding, align, dtype, opset, seed):
    """2-D and 3-D inputs (3-D from 20), grid points inside, on and beyond the borders (and on the
    half-pixel ties nearest rounds to even); nearest on every type, linear and cubic on the float
    types; opset 16's bilinear / bicubic names."""
    if len(dims) == 3 and (opset == 16 or mode == "cubic"):
        return  # 16 is 2-D only; the reference has no 3-D cubic case to judge by (it is 4^3 taps, slow)
    if padding == "reflection" and align and min(dims) == 1:
        return  # the reference divides by zero (declined: test_grid_sample_declines)
    rng = np.random.default_rng(seed)
    np_type = GRID_TYPES[dtype]
    x = (rng.integers(0, 100, (2, 3, *dims)) if np_type in (np.int32, np.uint8, np.int64)
         else rng.standard_normal((2, 3, *dims))).astype(np_type)
    grid = (rng.integers(-12, 13, (2, out, out + 1, *([2] * (len(dims) == 3)), len(dims))) / 8).astype(np.float32)
    grid.reshape(-1)[::3] = rng.uniform(-1.6, 1.6, grid.size)[::3].astype(np.float32)
    names = {"linear": "bilinear", "cubic": "bicubic"} if opset == 16 else {}
    model = node_model("GridSample", [("X", x), ("Grid", grid)], ["Y"], opset=opset,
                       attrs={"mode": names.get(mode, mode), "padding_mode": padding, "align_corners": align})
    if mode != "nearest" and dtype not in RTOL:
        from onnx_quant.backend_wgpu.session import Session
        from onnx_quant.errors import ExecutionError

        with pytest.raises(ExecutionError, match="GridSample.*typeOk"):
            Session(model, device=best, allow_host_fallback=False).run(None, {"X": x, "Grid": grid})
        return
    got = _run(best, model, {"X": x, "Grid": grid})
    assert_agree(got, ref_run(model, {"X": x, "Grid": grid}), RTOL.get(dtype, 0.0))


def test_grid_sample_declines(best):
    """Where the reference divides by zero (reflection over one element with align_corners) and
    integer inputs with linear weights (the reference's integer arithmetic): declined by name."""
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import ExecutionError

    x, grid = np.ones((1, 1, 1, 4), np.float32), np.zeros((1, 2, 2, 2), np.float32)
    for attrs, arr, words in (({"padding_mode": "reflection", "align_corners": 1}, x, "reflectOk"),
                              ({"mode": "linear"}, x.astype(np.int32), "typeOk")):
        model = node_model("GridSample", [("X", arr), ("Grid", grid)], ["Y"], opset=20, attrs=attrs)
        with pytest.raises(ExecutionError, match=f"GridSample.*{words}"):
            Session(model, device=best, allow_host_fallback=False).run(None, {"X": arr, "Grid": grid})


@settings(max_examples=gpu_examples(), deadline=None)
@given(size=st.sampled_from([(2, 1, 3, 4), (1, 2, 5, 2), (2, 1, 2, 3, 4), (1, 1, 4, 1, 3)]), align=st.sampled_from([0, 1]),
       seed=st.integers(0, 2**16))
def test_affine_grid_matches_onnx_reference(best, size, align, seed):
    if align and min(size[2:]) == 1:
        return  # the reference divides by zero (the kernel declines)
    rank = len(size) - 2
    theta = np.random.default_rng(seed).standard_normal((size[0], rank, rank + 1)).astype(np.float32)
    model = node_model("AffineGrid", [("theta", theta)], ["grid"], opset=20, attrs={"align_corners": align},
                       inits={"size": np.array(size, np.int64)})
    model.graph.node[0].input.append("size")
    assert_agree(_run(best, model, {"theta": theta}), ref_run(model, {"theta": theta}), 1e-6)


def _roi_align_model(opset: int, **attrs):
    node = helper.make_node("RoiAlign", ["X", "rois", "batch_indices"], ["Y"], **attrs)
    return make_model(node, [("X", TP.FLOAT, ["n", "c", "h", "w"]), ("rois", TP.FLOAT, ["r", 4]),
                             ("batch_indices", TP.INT64, ["r"])], [("Y", TP.FLOAT, None)], opset=opset)


def _rois(rng, count: int, h: int, w: int) -> np.ndarray:
    """Rois inside, across and beyond the image, some thinner than a pixel."""
    a = rng.uniform(-2, max(h, w), (count, 2))
    b = a + rng.uniform(0.2, max(h, w) / 2, (count, 2))
    return np.concatenate([a, b], 1)[:, [1, 0, 3, 2]].astype(np.float32)


@settings(max_examples=gpu_examples(), deadline=None)
@given(hw=st.sampled_from([(6, 5), (1, 7), (10, 10)]), count=st.integers(0, 5), pooled=st.sampled_from([(1, 1), (2, 3), (5, 5)]),
       mode=st.sampled_from(["avg", "max"]), ctm=st.sampled_from(["half_pixel", "output_half_pixel"]),
       ratio=st.sampled_from([0, 1, 2]), scale=st.sampled_from([1.0, 0.5, 0.25]), opset=st.sampled_from([10, 16, 22]),
       seed=st.integers(0, 2**16))
def test_roi_align_matches_onnx_reference(best, hw, count, pooled, mode, ctm, ratio, scale, opset, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 3, *hw)).astype(np.float32)
    feeds = {"X": x, "rois": _rois(rng, count, *hw), "batch_indices": rng.integers(0, 2, count).astype(np.int64)}
    attrs = {"mode": mode, "output_height": pooled[0], "output_width": pooled[1], "sampling_ratio": ratio,
             "spatial_scale": scale} | ({"coordinate_transformation_mode": ctm} if opset >= 16 else {})
    model = _roi_align_model(opset, **attrs)
    # RoiAlign-10 is output_half_pixel (the mode 16 names for it); onnx.reference reads 16's default
    # there, onnxruntime the version's
    want = onnxruntime_run(model, feeds) if opset == 10 else ref_run(model, feeds)
    assert_agree(_run(best, model, feeds), want, 1e-5)


def test_second_shapes_compile_nothing(best):
    """The sizes are runtime uniforms: a second batch, image and grid / roi count compile none of
    the three kernels' pipelines."""
    rng = np.random.default_rng(7)
    gs = node_model("GridSample", [("X", np.zeros((1, 2, 4, 5), np.float32)), ("Grid", np.zeros((1, 3, 3, 2), np.float32))],
                    ["Y"], opset=20, attrs={"mode": "cubic", "padding_mode": "border"})
    gs.graph.input[0].type.tensor_type.ClearField("shape")
    gs.graph.input[1].type.tensor_type.ClearField("shape")
    gs_feeds = [{"X": rng.standard_normal(xs).astype(np.float32), "Grid": rng.uniform(-1.2, 1.2, gsz).astype(np.float32)}
                for xs, gsz in (((1, 2, 4, 5), (1, 3, 3, 2)), ((2, 3, 7, 6), (2, 5, 2, 2)))]
    ra = _roi_align_model(16, output_height=3, output_width=2, sampling_ratio=0, spatial_scale=0.5)
    ra_feeds = [{"X": rng.standard_normal((n, 2, h, w)).astype(np.float32), "rois": _rois(rng, r, h, w),
                 "batch_indices": rng.integers(0, n, r).astype(np.int64)} for n, h, w, r in ((1, 6, 6, 2), (2, 9, 7, 5))]
    for model, feeds, kernel in ((gs, gs_feeds, "GridSample"), (ra, ra_feeds, "RoiAlign")):
        outs, compiled = runs_from_a_cold_cache(best, model, feeds)
        assert any(kernel in lab for lab in compiled[0]), compiled[0]
        assert not [lab for lab in compiled[1] if kernel in lab], compiled[1]
        for f, got in zip(feeds, outs):
            assert_agree(got, ref_run(model, f), 1e-5)
    stn = _spatial_transformer()
    feeds = [{"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32), "theta": _theta(rng, 2)} for _ in range(2)]
    outs, compiled = runs_from_a_cold_cache(best, stn, feeds)
    assert not compiled[1], compiled[1]  # new values, same shapes: nothing new


def _spatial_transformer(size=(2, 3, 6, 5)):
    """A spatial transformer as torch.onnx exports F.affine_grid + F.grid_sample (opset 20):
    AffineGrid over theta and a Constant size, then GridSample (bilinear, zeros, align_corners 0)."""
    nodes = [helper.make_node("Constant", [], ["size"], value=numpy_helper.from_array(np.array(size, np.int64), "size")),
             helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=0),
             helper.make_node("GridSample", ["x", "grid"], ["y"], mode="linear", padding_mode="zeros", align_corners=0),
             helper.make_node("Relu", ["y"], ["out"])]
    return make_model(nodes, [("x", TP.FLOAT, [size[0], size[1], 8, 8]), ("theta", TP.FLOAT, [size[0], 2, 3])],
                      [("out", TP.FLOAT, None)], opset=20)


def _theta(rng, n: int) -> np.ndarray:
    return (np.array([[1, 0, 0], [0, 1, 0]], np.float32) + 0.3 * rng.standard_normal((n, 2, 3))).astype(np.float32)


def test_spatial_transformer_runs_on_the_gpu_and_matches_onnxruntime(best):
    from onnx_quant.backend_wgpu.session import Session

    rng = np.random.default_rng(3)
    model = _spatial_transformer()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Session(model, device=best, allow_host_fallback=False) as s:
            for _ in range(2):
                feeds = {"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32), "theta": _theta(rng, 2)}
                assert_agree(s.run(None, feeds), onnxruntime_run(model, feeds), 1e-5)
            assert s.host_nodes == []


def test_roi_align_head_runs_on_the_gpu_and_matches_onnxruntime(best):
    """torchvision.ops.roi_align as its exporter writes it: boxes [K, 5] (batch index, x1, y1, x2, y2)
    sliced into the batch column (Squeeze, Cast to int64) and the corners, then RoiAlign
    (aligned: half_pixel, 7 x 7, sampling_ratio 2, spatial_scale 1/4) and a Flatten."""
    from onnx_quant.backend_wgpu.session import Session

    c = lambda name, arr: helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr), name))  # noqa: E731
    nodes = [c("z", np.array([0], np.int64)), c("one", np.array([1], np.int64)), c("five", np.array([5], np.int64)),
             helper.make_node("Slice", ["boxes", "z", "one", "one"], ["col0"]),
             helper.make_node("Squeeze", ["col0", "one"], ["col0_s"]),
             helper.make_node("Cast", ["col0_s"], ["batch_idx"], to=TP.INT64),
             helper.make_node("Slice", ["boxes", "one", "five", "one"], ["corners"]),
             helper.make_node("RoiAlign", ["feat", "corners", "batch_idx"], ["pooled"], coordinate_transformation_mode="half_pixel",
                              output_height=7, output_width=7, sampling_ratio=2, spatial_scale=0.25),
             helper.make_node("Flatten", ["pooled"], ["flat"], axis=1)]
    model = make_model(nodes, [("feat", TP.FLOAT, [2, 4, 16, 16]), ("boxes", TP.FLOAT, ["k", 5])], [("flat", TP.FLOAT, None)],
                       opset=16)
    rng = np.random.default_rng(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Session(model, device=best, allow_host_fallback=False) as s:
            for k in (6, 3):
                corners = _rois(rng, k, 64, 64)
                boxes = np.concatenate([rng.integers(0, 2, (k, 1)).astype(np.float32), corners], 1)
                feeds = {"feat": rng.standard_normal((2, 4, 16, 16)).astype(np.float32), "boxes": boxes}
                assert_agree(s.run(None, feeds), onnxruntime_run(model, feeds), 1e-5)
            assert s.host_nodes == []

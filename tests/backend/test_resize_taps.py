"""Resize's per-axis tables (backend_wgpu/resize_taps.py) and its planning, on the CPU.

The tables applied in float64 give onnx.reference's float64 result (before its final cast) to
1e-13, bit for bit for nearest, for every mode, coordinate transformation and option on a grid of sizes: the
tables are the reference's own arithmetic. The spec declines what it cannot run, through
plan_node with the constant inputs given as values."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx.reference.ops.op_resize as ref
import pytest

from onnx_quant.backend_wgpu.device_info import DeviceInfo
from onnx_quant.backend_wgpu.planner import plan_node
from onnx_quant.backend_wgpu.render import render
from onnx_quant.backend_wgpu.resize_taps import resize_axes, tap_table
from onnx_quant.backend_wgpu.spec import load_specs
from onnx_quant.errors import KernelRejected

CTMS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"]
GRID = [((4, 6), (7, 3)), ((5, 5), (2, 11)), ((3, 8), (1, 16)), ((1, 4), (3, 4)), ((6, 7), (6, 5)), ((9, 2), (4, 2))]
ROI = np.array([0.2, -0.1, 0.9, 1.3], np.float32)


def apply(x, taps):
    y = x.astype(np.float64)
    for t in taps:
        w = np.array(t.weight).reshape(-1, t.taps)
        i = np.array(t.index).reshape(-1, t.taps)
        moved = np.moveaxis(y, t.axis, -1)
        s = (moved[..., i] * w).sum(-1)
        out = np.array(t.outside)
        s = np.where(out, 1.5, s)  # extrapolation_value
        y = np.moveaxis(s, -1, t.axis)
    return y


def reference(x, mode, scales, sizes, ctm, **kw):
    a = kw.pop("cubic_coeff_a", -0.75)
    nearest_mode = kw.pop("nearest_mode", "round_prefer_floor")
    antialias = kw.pop("antialias", 0)
    if mode == "nearest":
        def fct(r, s):
            return ref._nearest_coeffs(r, mode=nearest_mode)
    elif mode == "linear":
        fct = ref._linear_coeffs_antialias if antialias else ref._linear_coeffs
    else:
        f = ref._cubic_coeffs_antialias if antialias else ref._cubic_coeffs

        def fct(r, s):
            return f(r, s, A=np.float32(a))
    return ref._interpolate_nd(x, fct, scale_factors=scales, output_size=sizes,
                               coordinate_transformation_mode=ctm, extrapolation_value=1.5, **kw)


@pytest.mark.parametrize("ctm", CTMS)
@pytest.mark.parametrize("mode,extra", [("nearest", {"nearest_mode": m}) for m in
                                        ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")]
                         + [("linear", {}), ("linear", {"antialias": 1}), ("cubic", {}),
                            ("cubic", {"exclude_outside": 1, "cubic_coeff_a": -0.5}), ("cubic", {"antialias": 1})])
def test_tables_reproduce_onnx_reference_in_float64(ctm, mode, extra):
    for k, (hw_in, hw_out) in enumerate(GRID):
        x = np.random.default_rng(k).standard_normal((1, 2, *hw_in))
        for by_sizes in (False, True):
            scales = None if by_sizes else np.array([1, 1, *(o / i for o, i in zip(hw_out, hw_in))], np.float32)
            sizes = np.array([1, 2, *hw_out], np.int64) if by_sizes else None
            roi = np.array([0, 0, *ROI[:2], 1, 1, *ROI[2:]], np.float32) if ctm == "tf_crop_and_resize" else None
            expected = reference(x, mode, scales, sizes, ctm, roi=roi, **dict(extra))
            extra_kw = dict(extra)
            taps = resize_axes(x.shape, expected.shape, mode=mode, scales=[] if scales is None else scales.tolist(),
                               sizes=[] if sizes is None else sizes.tolist(),
                               roi=[] if roi is None else roi.tolist(), coordinate_transformation_mode=ctm, **extra_kw)
            got = apply(x, taps)
            assert got.shape == expected.shape
            # same tables: only numpy's order of summing the taps may differ (8+ taps: pairwise)
            assert np.allclose(got, expected, rtol=1e-13, atol=1e-13), (ctm, mode, extra, hw_in, hw_out, by_sizes,
                                                                        np.abs(got - expected).max())
            if mode == "nearest":
                assert np.array_equal(got, expected)


def _plan(values, attrs, dtype="float32", opset=19, x=(1, 1, 4, 4), y=(1, 1, 8, 8)):
    spec = load_specs().find("", "Resize", opset)
    shapes = {"x": x, "y": y, **{k: (len(v),) for k, v in values.items()}}
    dtypes = {"x": dtype, "y": dtype, "roi": "float32", "scales": "float32", "sizes": "int64"}
    return plan_node(spec, shapes=shapes, dtypes={k: dtypes[k] for k in shapes}, device=DeviceInfo(),
                     attributes=attrs, values={k: np.array(v, np.int64 if k == "sizes" else np.float32)
                                               for k, v in values.items()})


def test_plan_reads_scales_and_sizes_and_holds_the_tables_as_data():
    # 4x4 -> 8x8: two resized axes of 8 output coordinates
    p = _plan({"scales": [1, 1, 2, 2]}, {"mode": "linear"})
    (main,) = p.passes
    tables = p.buffers["tables"]
    assert tables.role == "data"
    words = np.frombuffer(tables.data, "<u4")
    assert p.derived["tableWords"] == 2 * (8 * 2 + 8 * 2)  # offsets and weights, 2 taps each
    taps = resize_axes((1, 1, 4, 4), (1, 1, 8, 8), mode="linear", scales=[1, 1, 2, 2])
    assert words[:p.derived["tableWords"]].tolist() == list(tap_table(taps, (1, 1, 4, 4), False).words)
    text = render(main)
    assert "oq_weight(" in text and "load_x(o2)" in text  # the first resized axis innermost
    assert "vec4<u32>(" not in text  # no table in the source
    p = _plan({"sizes": [1, 1, 8, 8]}, {"mode": "nearest"}, dtype="int64")
    assert p.derived["tableWords"] == 2 * 8  # nearest: one offset per coordinate, no weights
    assert "load_x(src, l % 2u)" in render(p.passes[0])  # int64: two lanes per element


@pytest.mark.parametrize("values,attrs,dtype,clause", [
    ({"scales": [1, 1, 2, 2], "sizes": [1, 1, 8, 8]}, {"mode": "linear"}, "float32", "oneOfScalesSizes"),
    ({"scales": [1, 1, 2, 2]}, {"mode": "linear"}, "int8", "typeOk"),
    ({"scales": [1, 1, 2, 2]}, {"mode": "area"}, "float32", "modeKnown"),
    ({"scales": [1, 1, 2, 2]}, {"mode": "nearest", "nearest_mode": "simple"}, "float32", "nearestKnown"),
    ({"scales": [1, 1, 2, 2]}, {"mode": "linear", "coordinate_transformation_mode": "tf_half_pixel_for_nn"},
     "float32", "ctmKnown"),
    ({"scales": [1, 1, 2, 2]}, {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"},
     "float32", "roiGiven"),
    ({"scales": [1, 1, 2, 2]}, {"mode": "nearest", "antialias": 1}, "float32", "antialiasOn"),
])
def test_plan_declines_by_clause(values, attrs, dtype, clause):
    with pytest.raises(KernelRejected, match=clause):
        _plan(values, attrs, dtype)


def test_a_constant_input_without_its_value_declines():
    spec = load_specs().find("", "Resize", 19)
    with pytest.raises(KernelRejected, match="known when the node is planned"):
        plan_node(spec, shapes={"x": (1, 1, 4, 4), "scales": (4,), "y": (1, 1, 8, 8)},
                  dtypes={"x": "float32", "scales": "float32", "y": "float32"}, device=DeviceInfo(),
                  attributes={"mode": "linear"})


def test_tables_beyond_the_data_budget_decline():
    # cubic to 5000 columns: 4 taps * 2 words * 5000 + 8 * 8 table words, beyond TABLE_WORDS_MAX (16384)
    with pytest.raises(KernelRejected, match="tablesFit"):
        _plan({"sizes": [1, 1, 8, 5000]}, {"mode": "cubic"}, y=(1, 1, 8, 5000))
    assert _plan({"sizes": [1, 1, 8, 5000]}, {"mode": "nearest"}, y=(1, 1, 8, 5000)).variant  # 3 * 5000


def test_small_float_graph_inputs_are_keyed_only_as_a_kernel_constant_input():
    from onnx import TensorProto as TP, helper

    from onnx_quant.backend_wgpu import graph_plan as gp
    from onnx_quant.inference import infer_values

    # Resize's scales fed as a graph input (as ONNX's node cases do): its contents decide the
    # output shape and the kernel reads them: keyed. The float data x (4 elements) is not.
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TP.FLOAT, [1, 1, 2, 2]),
                                        helper.make_tensor_value_info("scales", TP.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    spec = load_specs().find("", "Resize", 19)
    infos = [gp.NodeInfo(0, "n0", node, "", 19, spec, "gpu", "", ())]
    values = infer_values(m, {"x": [1, 1, 2, 2], "scales": [4]})
    assert gp.value_keyed_inputs(infos, values, ["x", "scales"]) == ("scales",)
    infos[0] = dataclasses.replace(infos[0], spec=None)  # no kernel reads it: a float input is never keyed
    assert gp.value_keyed_inputs(infos, values, ["x", "scales"]) == ()

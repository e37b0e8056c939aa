"""Resize (10, 11, 13, 18, 19) and Upsample (7, 9) on the GPU (templates/resize.base.json over
resize.wgsl.jinja; per-axis tables from backend_wgpu/resize_taps.py).

- every mode on a grid of sizes, up and down, scales and sizes given: nearest (every
  nearest_mode, every coordinate_transformation_mode, tf_crop_and_resize with extrapolation)
  bit for bit with onnx.reference; linear and cubic (cubic_coeff_a, exclude_outside, antialias)
  within ONNX's rule (rtol 1e-3, atol 1e-7) and below a measured bound;
- nearest moves the bits of any element type; interpolation of other types than float32 and
  float16 is declined (onnx.reference rounds float64 sums there: not reproducible in float32);
- axes and keep_aspect_ratio_policy; the earlier versions; Resize-10 and Upsample as
  onnxruntime computes them (onnx.reference has no Resize-10 and only integer Upsample).

On both lavapipe adapters (conftest's ``dev``: Vulkan, then OpenGL where present).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from support.arrays import TYPES, typed
from support.oracles import assert_same_bits, ort_run, ref_run

CTMS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
#: (input H, W) -> output (H, W): up, down, mixed, to and from 1
GRID = [((4, 6), (7, 3)), ((5, 5), (2, 11)), ((3, 8), (1, 16)), ((1, 4), (3, 4)), ((6, 7), (6, 5))]
ROI = np.array([0, 0, 0.2, -0.1, 1, 1, 0.9, 1.3], np.float32)  # crops and reaches outside: extrapolates
#: the largest error of linear/cubic against onnx.reference (float64), relative to the output's largest magnitude
MEASURED: dict[str, float] = {}


def resize_model(x_dtype, *, opset=19, roi=None, scales=None, sizes=None, op="Resize", **attrs):
    """A Resize node whose roi / scales / sizes are initializers (read when the plan is made)."""
    inits, names = [], ["x"]
    for name, a in (("roi", roi), ("scales", scales), ("sizes", sizes)):
        if a is not None:
            inits.append(numpy_helper.from_array(a, name))
        names.append(name if a is not None else "")
    while names[-1] == "":
        names.pop()
    node = helper.make_node(op, names, ["y"], **attrs)
    t = helper.np_dtype_to_tensor_dtype(np.dtype(x_dtype))
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", t, None)],
                          [helper.make_tensor_value_info("y", t, None)], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def run(dev, model, x):
    from onnx_quant.backend_wgpu.session import Session

    with Session(model, device=dev, allow_host_fallback=False) as s:
        return s.run(None, {"x": x})[0]


def reference(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ref_run(model, {"x": x})[0]


def inputs_for(shape_in, shape_out, by_sizes, ctm):
    n_in = np.array([1, 2, *shape_in], np.int64)
    roi = ROI if ctm == "tf_crop_and_resize" else None
    if by_sizes:
        return dict(roi=roi, sizes=np.array([1, 2, *shape_out], np.int64))
    scales = np.array([1, 1, *(o / i for o, i in zip(shape_out, shape_in))], np.float32)
    return dict(roi=roi, scales=scales)


def data(shape, dtype=np.float32, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape) * 4
    return (x + np.sign(x) * 0.01).astype(dtype)  # no zeros: onnx.reference's 0 * x + -0.0 gives +0.0


def check_close(got, expected, what):
    got64, exp64 = got.astype(np.float64), expected.astype(np.float64)
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    np.testing.assert_allclose(got64, exp64, rtol=1e-3, atol=1e-7, err_msg=what)
    scale = float(np.abs(exp64).max()) if exp64.size else 0.0
    return float(np.abs(got64 - exp64).max()) / scale if scale else 0.0


@pytest.mark.parametrize("ctm", CTMS)
@pytest.mark.parametrize("nearest_mode", NEAREST)
def test_nearest_every_mode_on_a_grid_bit_for_bit(dev, ctm, nearest_mode):
    for k, (hw_in, hw_out) in enumerate(GRID):
        x = data((1, 2, *hw_in), seed=k)
        for by_sizes in (False, True):
            model = resize_model(np.float32, mode="nearest", nearest_mode=nearest_mode,
                                 coordinate_transformation_mode=ctm, extrapolation_value=-7.5,
                                 **inputs_for(hw_in, hw_out, by_sizes, ctm))
            assert_same_bits(run(dev, model, x), reference(model, x), f"{ctm} {nearest_mode} {hw_in}->{hw_out}")


@pytest.mark.parametrize("ctm", CTMS)
@pytest.mark.parametrize("mode,extra", [("linear", {}), ("linear", {"antialias": 1}), ("cubic", {}),
                                        ("cubic", {"exclude_outside": 1, "cubic_coeff_a": -0.5}),
                                        ("cubic", {"antialias": 1})])
def test_linear_and_cubic_on_a_grid_within_onnx_rule(dev, ctm, mode, extra):
    worst = 0.0
    for k, (hw_in, hw_out) in enumerate(GRID):
        x = data((1, 2, *hw_in), seed=10 + k)
        for by_sizes in (False, True):
            model = resize_model(np.float32, mode=mode, coordinate_transformation_mode=ctm, extrapolation_value=3.25,
                                 **extra, **inputs_for(hw_in, hw_out, by_sizes, ctm))
            worst = max(worst, check_close(run(dev, model, x), reference(model, x),
                                           f"{mode} {extra} {ctm} {hw_in}->{hw_out}"))
    key = f"{mode} {extra}"
    MEASURED[key] = max(MEASURED.get(key, 0.0), worst)
    assert worst < 1e-6, (key, ctm, worst)


def test_float16_linear_and_cubic(dev):
    for mode in ("linear", "cubic"):
        x = data((1, 2, 5, 6), np.float16, seed=3)
        model = resize_model(np.float16, mode=mode, sizes=np.array([1, 2, 9, 4], np.int64))
        check_close(run(dev, model, x), reference(model, x), f"float16 {mode}")


@pytest.mark.parametrize("dtype", TYPES, ids=lambda t: np.dtype(t).name)
def test_nearest_moves_the_bits_of_every_type(dev, dtype):
    x = typed((2, 3, 4, 5), dtype, seed=4)
    model = resize_model(dtype, mode="nearest", nearest_mode="round_prefer_ceil",
                         scales=np.array([1, 1, 1.75, 0.6], np.float32))
    got = run(dev, model, x)
    # the reference's picks, by position: resize the element positions as float32 (exact below 2^24)
    pos = np.arange(x.size, dtype=np.float32).reshape(x.shape)
    picks = reference(resize_model(np.float32, mode="nearest", nearest_mode="round_prefer_ceil",
                                   scales=np.array([1, 1, 1.75, 0.6], np.float32)), pos).astype(np.int64)
    assert_same_bits(got, x.reshape(-1)[picks], f"nearest {np.dtype(dtype).name}")


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.float64])
def test_interpolation_of_other_types_is_declined(dev, dtype):
    from onnx_quant.errors import ExecutionError

    model = resize_model(dtype, mode="linear", scales=np.array([1, 1, 2, 2], np.float32))
    with pytest.raises(ExecutionError, match="typeOk"):
        run(dev, model, np.ones((1, 1, 2, 2), dtype))


@pytest.mark.parametrize("mode, n, out", [("linear", 100, 2), ("cubic", 60, 2)])
def test_an_antialiased_downscale_sums_every_tap_or_is_declined(dev, mode, n, out):
    """Antialias widens the taps with the scale: up to MAX_TAP_ITERATIONS per output the sums are
    onnx.reference's; beyond, the node is declined (llvmpipe stops an invocation after 65535 loop
    iterations: a 2048 -> 4 linear downscale summed a fraction of its 1024 x 1024 taps)."""
    from onnx_quant.errors import ExecutionError

    sizes = np.array([1, 1, out, out], np.int64)
    model = resize_model(np.float32, opset=18, sizes=sizes, mode=mode, antialias=1)
    x = data((1, 1, n, n))
    check_close(run(dev, model, x), reference(model, x), f"{mode} {n} -> {out}")
    big = data((1, 1, 8 * n, 8 * n))
    with pytest.raises(ExecutionError, match="tapsFit"):
        run(dev, model, big)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("axes", [[2, 3], [3, 2], [3], [1, 3]])
def test_axes_and_keep_aspect_ratio_policy(dev, policy, axes):
    x = data((1, 3, 4, 6), seed=5)
    sizes = np.array([7, 3][: len(axes)] if len(axes) > 1 else [9], np.int64)
    for mode in ("nearest", "linear"):
        model = resize_model(np.float32, mode=mode, axes=axes, keep_aspect_ratio_policy=policy, sizes=sizes)
        got, expected = run(dev, model, x), reference(model, x)
        if mode == "nearest":
            assert_same_bits(got, expected, f"{axes} {policy}")
        else:
            check_close(got, expected, f"{axes} {policy} linear")
    model = resize_model(np.float32, mode="cubic", axes=axes, scales=np.array([1.5, 0.5][: len(axes)], np.float32))
    check_close(run(dev, model, x), reference(model, x), f"{axes} cubic scales")


def test_negative_axes_count_from_the_end(dev):
    # (onnx.reference cannot take them: it transposes by the negative axis)
    x = data((1, 3, 4, 6), seed=9)
    for mode in ("nearest", "cubic"):
        got = [run(dev, resize_model(np.float32, mode=mode, axes=axes, sizes=np.array([3, 9], np.int64)), x)
               for axes in ([-2, -1], [2, 3])]
        assert_same_bits(got[0], got[1], f"{mode} axes -2, -1")


def test_tf_crop_and_resize_with_axes_roi(dev):
    x = data((1, 1, 5, 5), seed=6)
    for axes in ([2, 3], [3, 2]):
        model = resize_model(np.float32, mode="linear", axes=axes, coordinate_transformation_mode="tf_crop_and_resize",
                             roi=np.array([0.1, -0.2, 0.8, 1.1], np.float32), sizes=np.array([4, 6], np.int64),
                             extrapolation_value=9.0)
        check_close(run(dev, model, x), reference(model, x), f"tf_crop axes {axes}")


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_earlier_versions(dev, opset):
    x = data((1, 2, 4, 5), seed=7)
    roi = np.array([], np.float32)
    for mode in ("nearest", "linear", "cubic"):
        kw = {"roi": roi} if opset == 11 else {}
        model = resize_model(np.float32, opset=opset, mode=mode, coordinate_transformation_mode="pytorch_half_pixel",
                             scales=np.array([1, 1, 2.5, 0.7], np.float32), **kw)
        got, expected = run(dev, model, x), reference(model, x)
        if mode == "nearest":
            assert_same_bits(got, expected, f"Resize-{opset} nearest")
        else:
            check_close(got, expected, f"Resize-{opset} {mode}")


def test_versions_decline_what_they_lack(dev):
    from onnx_quant.errors import ExecutionError

    x = data((1, 1, 2, 2))
    model = resize_model(np.float32, opset=18, mode="linear", coordinate_transformation_mode="half_pixel_symmetric",
                         scales=np.array([1, 1, 2, 2], np.float32))
    with pytest.raises(ExecutionError, match="ctmKnown"):
        run(dev, model, x)
    model = resize_model(np.float32, opset=19, mode="nearest", antialias=1, scales=np.array([1, 1, 2, 2], np.float32))
    with pytest.raises(ExecutionError, match="antialiasOn"):
        run(dev, model, x)


_SCALES = [[1, 1, 2, 3], [1, 1, 0.6, 1.5], [1, 1, 1.7, 0.45], [1, 2, 1, 2]]


# onnxruntime's linear Upsample takes 4-D inputs only with their outer scales 1: no linear case
# scales the channels
@pytest.mark.parametrize("mode, scales", [("nearest", s) for s in _SCALES]
                         + [("linear", s) for s in _SCALES if s[1] == 1])
def test_resize_10_and_upsample_as_onnxruntime(dev, mode, scales):
    x = data((1, 2, 5, 4), seed=8)
    s = np.array(scales, np.float32)
    models = [resize_model(np.float32, opset=10, mode=mode, roi=s)]  # Resize-10's second input is scales
    if min(scales) >= 1:
        models.append(resize_model(np.float32, opset=9, op="Upsample", mode=mode, roi=s))
        u7 = helper.make_node("Upsample", ["x"], ["y"], mode=mode, scales=[float(v) for v in scales])
        g = helper.make_graph([u7], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        models.append(helper.make_model(g, opset_imports=[helper.make_opsetid("", 7)]))
    for model in models:
        got, expected = run(dev, model, x), ort_run(model, {"x": x})[0]
        what = f"{model.graph.node[0].op_type}-{model.opset_import[0].version} {mode} {scales}"
        if mode == "nearest":
            assert_same_bits(got, expected, what)
            if model.opset_import[0].version == 9 and all(float(v).is_integer() for v in scales):
                assert_same_bits(got, reference(model, x), what + " vs onnx.reference")
        else:
            check_close(got, expected, what)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_a_larger_resize(dev, mode):
    x = data((1, 2, 64, 80), seed=12)
    model = resize_model(np.float32, mode=mode, sizes=np.array([1, 2, 200, 150], np.int64))
    got, expected = run(dev, model, x), reference(model, x)
    if mode == "nearest":
        assert_same_bits(got, expected, "nearest 64x80 -> 200x150")
    else:
        assert check_close(got, expected, f"{mode} 64x80 -> 200x150") < 1e-6


#: the rows variant on small shapes: workgroups of 8 and tiles of 3 rows x 3 columns, so that rows
#: and columns end inside a tile; against word_per_invocation (every variant gives the same bits)
_ROWS_SMALL = {"Resize": {"WORKGROUP_SIZE": 8, "ROWS_PER_INVOCATION": 3, "ROW_COLUMNS": 3}}
#: (x shape, output sizes): both trailing axes, only H (vertical repeats: the row values reused),
#: only W, rank 2 and 3, down along one axis
_ROWS_SHAPES = [((1, 2, 5, 9), (1, 2, 11, 20)), ((2, 3, 7), (2, 7, 8)), ((1, 2, 3, 10), (1, 2, 8, 10)),
                ((1, 1, 6, 8), (1, 1, 6, 13)), ((7, 9), (13, 17)), ((1, 2, 9, 19), (1, 2, 4, 9))]


@pytest.mark.parametrize("mode,ctm,extra", [
    ("nearest", "half_pixel", {}), ("nearest", "asymmetric", {"nearest_mode": "ceil"}),
    ("nearest", "align_corners", {"nearest_mode": "round_prefer_ceil"}),
    ("nearest", "half_pixel", {"nearest_mode": "floor", "exclude_outside": 1}),
    ("nearest", "tf_crop_and_resize", {"extrapolation_value": -7.5, "exclude_outside": 1}),
    ("linear", "half_pixel", {}), ("cubic", "tf_crop_and_resize", {"extrapolation_value": 2.5})])
def test_rows_variant_gives_the_bits_of_word_per_invocation(dev, mode, ctm, extra):
    from onnx_quant.backend_wgpu.session import Session

    seen = set()
    for k, (shape_in, shape_out) in enumerate(_ROWS_SHAPES):
        x = data(shape_in, seed=20 + k)
        roi = None
        if ctm == "tf_crop_and_resize":  # crops and reaches outside along both trailing axes
            lo, hi = [0.0] * len(shape_in), [1.0] * len(shape_in)
            lo[-2:], hi[-2:] = [0.2, -0.1], [0.9, 1.3]
            roi = np.array(lo + hi, np.float32)
        model = resize_model(np.float32, mode=mode, coordinate_transformation_mode=ctm, roi=roi,
                             sizes=np.array(shape_out, np.int64), **extra)
        got = {}
        for variant in ("rows", "word_per_invocation"):
            with Session(model, device=dev, allow_host_fallback=False, variants={"Resize": variant},
                         tunables=_ROWS_SMALL) as s:
                (plan,) = s.plans({"x": shape_in})
                assert plan.variant == variant
                got[variant] = s.run(None, {"x": x})[0]
                seen.update((bool(a[2]), bool(a[3])) for a in plan.derived["tapAxes"])
        what = f"{mode} {ctm} {extra} {shape_in}->{shape_out}"
        assert_same_bits(got["rows"], got["word_per_invocation"], what)
        if mode == "nearest":
            assert_same_bits(got["rows"], reference(model, x), what)
    # the cases reach what the nearest tile code specialises on: zero weights (exclude_outside), outside flags
    if mode == "nearest" and extra.get("exclude_outside"):
        assert any(weights for weights, _ in seen), seen
    if mode == "nearest" and ctm == "tf_crop_and_resize":
        assert any(outside for _, outside in seen), seen

"""DeformConv on the GPU (templates/deform_conv.kernel.json, deform-conv.wgsl.jinja): 2-D, float32,
onnx.reference's order (B, then per input channel of the group the window's bilinear samples times
weight times mask).

Oracles: onnx.reference (float32) within the classical bound of a float32 sum of the terms (the
window's samples of each channel, each sample's four taps; the magnitudes from a float64 run on |X|,
|W|, |B|, |mask|: the bilinear weights are not negative); onnxruntime's DeformConv, which rounds the
sample coordinates in another order, within 2^-21 of the largest term per term; ONNX's 4 node cases
(the suite's rtol 1e-3, atol 1e-7: they pass exactly). Measured over 200 random cases: at most 0.12
of the bound against the reference, 0.29 x 2^-23 of the largest term against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper

from support.gpu import (assert_first_run_alone_compiles, assert_node_cases_pass_or_declined, gpu_examples,
                         runs_from_a_cold_cache)
from support.models import make_model, vi
from support.oracles import assert_within_sum_bound, onnxruntime_run, ref_run

F = TensorProto.FLOAT
NAMES = ["x", "w", "offset", "b", "mask"]


def _model(attrs: dict, bias: bool, mask: bool, opset: int = 22, symbolic: bool = False):
    inputs = ["x", "w", "offset", "b" if bias else "", "mask" if mask else ""]
    while not inputs[-1]:
        inputs.pop()
    dims = {"x": ["N", None, "H", "W"], "offset": ["N", None, "OH", "OW"], "mask": ["N", None, "OH", "OW"]}
    node = helper.make_node("DeformConv", inputs, ["y"], **attrs)
    return make_model([node], [vi(n, F, dims.get(n) if symbolic else None) for n in inputs if n], [vi("y", F, None)],
                      opset=opset)


def _run(dev, model, feeds):
    from onnx_quant.backend_wgpu.session import Session

    with Session(model, device=dev, allow_host_fallback=False) as s:
        return s.run(None, feeds)[0]


def _check(got, model, feeds, terms, what):
    """got against onnx.reference (float32, its coordinates rounded as the kernel rounds them) within
    the bound of a float32 sum, twice (both round; the magnitudes from a float64 run on |X|, |W|,
    |B|, |mask|), and against onnxruntime, which rounds the coordinates in another order (the
    window position, then the offset): within 2^-21 of max|X| max|W| max|mask| per term."""
    f64 = {k: v.astype(np.float64) for k, v in feeds.items()}
    mag = ref_run(_model_as(model, TensorProto.DOUBLE), {k: (v if k == "offset" else np.abs(v)) for k, v in f64.items()})[0]
    assert_within_sum_bound(got, np.asarray(ref_run(model, feeds)[0], np.float64), mag, terms,
                            f"{what} vs onnx.reference", slack=2.0)
    scale = terms * np.abs(feeds["x"]).max() * np.abs(feeds["w"]).max() * np.abs(feeds.get("mask", np.ones(1))).max()
    err = np.abs(got.astype(np.float64) - onnxruntime_run(model, feeds)[0])
    assert err.max(initial=0) <= 2.0 ** -21 * scale + 1e-45, f"{what} vs onnxruntime: {err.max()} of {scale}"


def _model_as(model, elem):
    m = type(model)()
    m.CopyFrom(model)
    for v in list(m.graph.input) + list(m.graph.output):
        v.type.tensor_type.elem_type = elem
    return m


def _feeds(rng, n, c, oc, og, k, image, out, bias, mask, spread):
    window = k[0] * k[1]
    feeds = {"x": rng.standard_normal((n, c, *image)).astype(np.float32),
             "w": rng.standard_normal((oc, c // og[1], *k)).astype(np.float32),
             "offset": (rng.uniform(-spread, spread, (n, og[0] * window * 2, *out))).astype(np.float32)}
    if bias:
        feeds["b"] = rng.standard_normal(oc).astype(np.float32)
    if mask:
        feeds["mask"] = rng.uniform(0, 1, (n, og[0] * window, *out)).astype(np.float32)
    return feeds


@st.composite
def deform_convs(draw):
    group = draw(st.integers(1, 2))
    og = draw(st.integers(1, 2))
    c = group * og * draw(st.integers(1, 2))
    oc = group * draw(st.integers(1, 2))
    k = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    strides = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    dil = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    image = [draw(st.integers(2, 6)), draw(st.integers(2, 6))]
    spans = [image[d] + pads[d] + pads[d + 2] - (k[d] - 1) * dil[d] - 1 for d in range(2)]
    if min(spans) < 0:
        pads = [p + 3 for p in pads]
        spans = [image[d] + pads[d] + pads[d + 2] - (k[d] - 1) * dil[d] - 1 for d in range(2)]
    out = [spans[d] // strides[d] + 1 for d in range(2)]
    attrs = dict(kernel_shape=k, strides=strides, dilations=dil, pads=pads, group=group, offset_group=og)
    if draw(st.booleans()):
        del attrs["kernel_shape"]  # from W's shape
    return (attrs, draw(st.integers(1, 2)), c, oc, (og, group), k, image, out, draw(st.booleans()), draw(st.booleans()),
            draw(st.sampled_from([0.0, 0.5, 3.0])), draw(st.sampled_from([19, 22])), draw(st.integers(0, 2**16)))


def test_onnx_node_cases_pass_on_the_gpu(best):
    assert_node_cases_pass_or_declined(best, ("DeformConv",), {}, 4)


@settings(max_examples=gpu_examples(), deadline=None)
@given(case=deform_convs())
def test_within_float_rounding_of_the_reference_and_onnxruntime(best, case):
    """Groups, offset groups, kernels, strides, dilations, pads, bias and mask, offsets from none to
    beyond the image (taps outside read zero), opsets 19 and 22."""
    attrs, n, c, oc, og, k, image, out, bias, mask, spread, opset, seed = case
    feeds = _feeds(np.random.default_rng(seed), n, c, oc, (attrs["offset_group"], attrs["group"]), k, image, out,
                   bias, mask, spread)
    model = _model(attrs, bias, mask, opset)
    got = _run(best, model, feeds)
    _check(got, model, feeds, (c // attrs["group"]) * k[0] * k[1] * 4, f"{attrs} bias {bias} mask {mask}")


def test_a_second_size_compiles_nothing(best):
    """The batch and image sizes are runtime uniforms: a second batch and image size from a cold
    cache compiles no pipeline; both within the bound."""
    attrs = dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], dilations=[1, 2], group=2, offset_group=2)
    model = _model(attrs, True, True, symbolic=True)
    rng = np.random.default_rng(4)
    feeds = []
    for n, image in ((1, [5, 6]), (2, [8, 7])):
        out = [(image[0] + 2 - 3) // 2 + 1, (image[1] + 1 - 3) // 1 + 1]
        feeds.append(_feeds(rng, n, 4, 4, (2, 2), [3, 2], image, out, True, True, 1.5))
    outs, compiled = runs_from_a_cold_cache(best, model, feeds)
    assert_first_run_alone_compiles(compiled, "DeformConv")
    for got, f in zip(outs, feeds):
        _check(got[0], model, f, 2 * 6 * 4, "second size")


def test_nan_offsets_read_zero_as_onnxruntime(best):
    """A NaN coordinate: onnxruntime reads zero there (the reference fails on it)."""
    model = _model(dict(kernel_shape=[2, 2]), False, False)
    feeds = _feeds(np.random.default_rng(5), 1, 1, 1, (1, 1), [2, 2], [3, 3], [2, 2], False, False, 0.5)
    feeds["offset"][0, 0, 0, 0] = np.nan
    got = _run(best, model, feeds)
    np.testing.assert_allclose(got, onnxruntime_run(model, feeds)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("image, dtype, words", [([1, 4], np.float32, "imageOk"), ([3, 3], np.float16, "float16")])
def test_what_the_reference_cannot_compute_exactly_is_declined(best, image, dtype, words):
    """An image axis of one element (the reference divides by size - 1) and float16 (the reference
    computes in float16): declined, never a value."""
    from onnx_quant.errors import ExecutionError

    code = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node("DeformConv", ["x", "w", "offset"], ["y"], kernel_shape=[1, 1])
    model = make_model([node], [vi(n, code, None) for n in ("x", "w", "offset")], [vi("y", code, None)], opset=22)
    feeds = {"x": np.ones([1, 1, *image], dtype), "w": np.ones([1, 1, 1, 1], dtype),
             "offset": np.zeros([1, 2, *image], dtype)}
    with pytest.raises(ExecutionError, match=words):
        _run(best, model, feeds)

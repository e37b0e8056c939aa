"""The convolution and pooling kernels take the image size as runtime uniforms (issue #11;
backend_wgpu/uniforms.py): input and output height / width (and their products, the output
position count) are no longer pipeline constants; kernel window, strides, dilations, pads,
channels and group stay constants. Each kernel (every variant) runs at two spatial sizes from a
cold pipeline cache: the second size compiles none of the kernel's pipelines, and both outputs
agree with the oracle: onnx.reference bit for bit for integer outputs and for MaxPool / GlobalMaxPool,
within float rounding for the float sums (run in another order); onnxruntime with its
optimizations off bit for bit for the dynamic-quantization conv units; numpy's model of
onnxruntime bit for bit for QLinearGlobalAveragePool and onnxruntime itself for QLinearAveragePool.

The exported models at a new image size and a second batch size: tests/backend/test_exported_models_gpu.py."""

from __future__ import annotations


import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from support.gpu import runs_from_a_cold_cache
from support.models import (  # the conv family's models (test_polymorphic_conv's), at symbolic image dims here
    conv_integer_model as _conv_integer_model, dynamic_conv_unit as _dynamic_conv_unit,
    float_conv_model as _float_conv_model, qlinear_conv_model as _qlinear_conv_model)
from support.models import make_model, vi as _vi
from support.oracles import assert_matches_ort, model_qglobal, onnxruntime_run

F32 = np.float32
MS = "com.microsoft"


def _model(nodes, inputs, outputs, inits=(), opset=17):
    return make_model(nodes, inputs, outputs, inits, opset, ir_version=10)


pytestmark = pytest.mark.devices("best")  # dev: the default adapter only (conftest's default adds OpenGL)


def _run_two_sizes(dev, model, feeds_list, kernel, variant=None, **session_kw):
    """Outputs at each input size (cold cache first), and the labels of the pipelines each run compiled."""
    outs, compiled = runs_from_a_cold_cache(dev, model, feeds_list, kernel=kernel, variant=variant, **session_kw)
    assert compiled[0], "the first size compiled nothing: the cache was not cold"
    return outs, compiled


def _assert_second_size_compiles_nothing(compiled, kernel):
    assert not [lab for lab in compiled[1] if kernel in lab], f"the second image size recompiled: {compiled[1]}"


def _assert_exact(outs, model, feeds_list):
    ref = ReferenceEvaluator(model)
    for got, f in zip(outs, feeds_list):
        want = ref.run(None, f)[0]
        assert got[0].shape == want.shape and got[0].dtype == want.dtype
        assert np.array_equal(got[0].view(np.uint8), want.view(np.uint8))


def _assert_close(outs, model, feeds_list, tol=1e-5):
    ref = ReferenceEvaluator(model)
    for got, f in zip(outs, feeds_list):
        want = ref.run(None, f)[0]
        assert got[0].shape == want.shape
        np.testing.assert_allclose(got[0], want, rtol=tol, atol=tol)


def _images(channels, sizes, dtype, seed=0, channels_last=False):
    rng = np.random.default_rng(seed)
    out = []
    for hw in sizes:
        shape = [1, *hw, channels] if channels_last else [1, channels, *hw]
        if dtype == np.float32:
            out.append({"x": rng.standard_normal(shape).astype(F32)})
        else:
            info = np.iinfo(dtype)
            out.append({"x": rng.integers(info.min, info.max + 1, shape).astype(dtype)})
    return out


def _image_input(dtype, channels, rank=2, channels_last=False):
    spatial = ["H", "W", "D"][:rank]
    return _vi("x", dtype, ["N", *spatial, channels] if channels_last else ["N", channels, *spatial])


# ----------------------------------------------------------------------------- QLinearConv, ConvInteger

#: (op, variant, model builder, channels, two image sizes): QLinearConv's 30 output positions,
#: then 48 (a multiple of 4: whole words where the first size shares words between rows)
HW = ("H", "W")
INTEGER_CONVS = ([("QLinearConv", v, lambda: _qlinear_conv_model(HW), 4, [(6, 5), (8, 6)])
                  for v in ("direct", "blocked_epilogue", "blocked", "tiled", "simple")]
                 + [("ConvInteger", v, lambda: _conv_integer_model(HW), 3, [(7, 6), (10, 9)])
                    for v in ("direct", "blocked", "tiled", "simple")])


@pytest.mark.parametrize("op, variant, build, channels, sizes", INTEGER_CONVS)
def test_integer_convs_compile_once_for_two_image_sizes(dev, op, variant, build, channels, sizes):
    model = build()
    feeds = _images(channels, sizes, np.uint8)
    outs, compiled = _run_two_sizes(dev, model, feeds, op, variant)
    assert not compiled[1]  # one-node model: nothing at all compiles again
    _assert_exact(outs, model, feeds)


# ----------------------------------------------------------------------------- DynamicQuantizeConv, ConvIntegerToFloat

@pytest.mark.parametrize("kernel, variant, shared", [
    ("DynamicQuantizeConv", "fused", False),
    ("DynamicQuantizeConv", "two_pass", False),
    ("ConvIntegerToFloat", "gemm", True),
])
def test_dynamic_conv_units_compile_once_for_two_image_sizes(dev, kernel, variant, shared):
    model = _dynamic_conv_unit(shared, HW, strides=(2, 1))
    feeds = _images(3, [(7, 6), (10, 13)], F32, seed=5)
    outs, compiled = _run_two_sizes(dev, model, feeds, kernel, variant)
    _assert_second_size_compiles_nothing(compiled, kernel)
    for got, f in zip(outs, feeds):
        for g, want in zip(got, onnxruntime_run(model, f, level="ORT_DISABLE_ALL")):
            assert g.shape == want.shape and np.array_equal(g.view(np.uint8), want.view(np.uint8))


# ----------------------------------------------------------------------------- float Conv, FusedConv, ConvTranspose

@pytest.mark.parametrize("kernel", ["Conv", "FusedConv"])
@pytest.mark.parametrize("variant", ["direct", "direct_oc4", "implicit_gemm", "im2col_gemm"])
def test_float_conv_compiles_once_for_two_image_sizes(dev, kernel, variant):
    model = _float_conv_model(kernel == "FusedConv", HW, pads=[1, 1, 1, 1], strides=[1, 2], dilations=[2, 1])
    feeds = _images(3, [(6, 7), (9, 12)], F32, seed=6)
    outs, compiled = _run_two_sizes(dev, model, feeds, kernel, variant, tunables={kernel: {"TILED_MIN_MACS": 0}})
    assert not compiled[1]  # Conv + Relu is one FusedConv node
    _assert_close(outs, model, feeds)


def test_float_conv_same_padding_at_two_image_sizes(dev):
    """auto_pad SAME_*: the pads follow the sizes, so they stay constants (a size may compile);
    the values are right at both."""
    model = _float_conv_model(False, HW, auto_pad="SAME_LOWER", strides=[2, 2])
    feeds = _images(3, [(6, 7), (9, 12)], F32, seed=7)
    outs, _ = _run_two_sizes(dev, model, feeds, "Conv")
    _assert_close(outs, model, feeds)


def test_conv_transpose_compiles_once_for_two_image_sizes(dev):
    rng = np.random.default_rng(8)
    inits = [numpy_helper.from_array(rng.standard_normal([4, 3, 3, 3]).astype(F32), "w"),
             numpy_helper.from_array(rng.standard_normal(3).astype(F32), "b")]
    # group 1: onnx.reference's ConvTranspose reshapes w wrongly for groups
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 0, 1, 1],
                            output_padding=[1, 0])
    model = _model([node], [_image_input(TensorProto.FLOAT, 4)], [_vi("y", TensorProto.FLOAT, None)], inits)
    feeds = _images(4, [(5, 4), (7, 9)], F32, seed=9)
    outs, compiled = _run_two_sizes(dev, model, feeds, "ConvTranspose")
    assert not compiled[1]
    _assert_close(outs, model, feeds)


# ----------------------------------------------------------------------------- pools

POOLS = [
    ("MaxPool", TensorProto.FLOAT, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 0]), "word_per_invocation"),
    ("MaxPool", TensorProto.UINT8, dict(kernel_shape=[2, 3], strides=[2, 1], dilations=[1, 2], ceil_mode=1), "word_per_invocation"),
    ("AveragePool", TensorProto.FLOAT, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), "word_per_invocation"),
    ("AveragePool", TensorProto.FLOAT, dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1),
     "word_per_invocation"),
    ("GlobalAveragePool", TensorProto.FLOAT, {}, "serial"),
    ("GlobalAveragePool", TensorProto.FLOAT, {}, "workgroup"),
    ("GlobalMaxPool", TensorProto.FLOAT, {}, "serial"),
    ("GlobalMaxPool", TensorProto.FLOAT, {}, "workgroup"),
]


@pytest.mark.parametrize("op, dtype, attrs, variant", POOLS)
def test_pools_compile_once_for_two_image_sizes(dev, op, dtype, attrs, variant):
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    model = _model([node], [_image_input(dtype, 3)], [_vi("y", dtype, None)], opset=19)
    feeds = _images(3, [(9, 8), (12, 15)], np_dtype, seed=10)
    outs, compiled = _run_two_sizes(dev, model, feeds, op, variant)
    assert not compiled[1]
    if op == "AveragePool" or op == "GlobalAveragePool":
        _assert_close(outs, model, feeds)
    else:
        _assert_exact(outs, model, feeds)


def _ql_pool_model(op, dtype, attrs, channels_last):
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    inits = [numpy_helper.from_array(np.array(0.04, F32), "xs"), numpy_helper.from_array(np.array(9, np_dtype), "xz"),
             numpy_helper.from_array(np.array(0.03, F32), "ys"), numpy_helper.from_array(np.array(3, np_dtype), "yz")]
    node = helper.make_node(op, ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS, channels_last=channels_last, **attrs)
    graph = helper.make_graph([node], "g", [_image_input(dtype, 5, channels_last=bool(channels_last))],
                              [_vi("y", dtype, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(MS, 1)],
                             ir_version=10)


@pytest.mark.parametrize("variant", ["serial", "workgroup"])
@pytest.mark.parametrize("cl", [0, 1])
def test_qlinear_global_average_pool_compiles_once_for_two_image_sizes(dev, variant, cl):
    model = _ql_pool_model("QLinearGlobalAveragePool", TensorProto.UINT8, {}, cl)
    feeds = _images(5, [(6, 7), (9, 4)], np.uint8, seed=11, channels_last=bool(cl))
    outs, compiled = _run_two_sizes(dev, model, feeds, "QLinearGlobalAveragePool", variant)
    assert not compiled[1]
    for got, f in zip(outs, feeds):
        want = model_qglobal(f["x"], F32(0.04), 9, F32(0.03), 3, np.uint8, bool(cl))
        assert got[0].shape == want.shape and np.array_equal(got[0], want)


@pytest.mark.parametrize("cl", [0, 1])
@pytest.mark.parametrize("cip", [0, 1])
def test_qlinear_average_pool_compiles_once_for_two_image_sizes(dev, cl, cip):
    model = _ql_pool_model("QLinearAveragePool", TensorProto.INT8,
                           dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=cip), cl)
    feeds = _images(5, [(6, 7), (9, 12)], np.int8, seed=12, channels_last=bool(cl))
    outs, compiled = _run_two_sizes(dev, model, feeds, "QLinearAveragePool")
    assert not compiled[1]
    for got, f in zip(outs, feeds):
        assert_matches_ort(got[0], onnxruntime_run(model, f)[0], f"QLinearAveragePool cl {cl} cip {cip}")


@pytest.mark.parametrize("channels", [256, 257])
def test_pool_index_division_by_a_runtime_size_is_exact(dev, channels):
    """snippets/fast_div: n / d through d's divMagic pair, (mulhi(n, m) + n) >> l, is exact for every
    n below 2^31 (the specs' divMagicFits: the element count below 2^31; past it the template divides
    plainly). A 1x1 MaxPool over 63 x 65 positions divides every output index (up to 257 * 4095 - 1)
    by 4095, a runtime size that is not a power of two. Every output must be its input."""
    from onnx_quant.backend_wgpu.index_math import div_magic
    from onnx_quant.backend_wgpu.session import Session

    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[1, 1])
    model = _model([node], [_image_input(TensorProto.FLOAT, channels)], [_vi("y", TensorProto.FLOAT, None)], opset=19)
    x = np.random.default_rng(13).standard_normal([1, channels, 63, 65]).astype(F32)
    with Session(model, device=dev, allow_host_fallback=False) as sess:
        (got,) = sess.run(None, {"x": x})
        plan = next(p for p in sess.plans({"x": x.shape}) if p.kernel == "MaxPool")
    assert plan.derived["divMagicFits"] is True
    assert tuple(plan.derived["outVolumeMagic"]) == div_magic(63 * 65)
    assert np.array_equal(got.view(np.uint32), x.view(np.uint32))

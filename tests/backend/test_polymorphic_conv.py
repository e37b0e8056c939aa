"""The conv family takes the batch size as a runtime uniform (issue #11; backend_wgpu/uniforms.py):
QLinearConv and ConvInteger (every variant), DynamicQuantizeConv (fused, two_pass),
ConvIntegerToFloat, float Conv and FusedConv (direct, direct_oc4) run at batch 1 then 3 from a
cold pipeline cache: the second batch compiles none of the kernel's pipelines, and both outputs
agree with the oracle (onnx.reference bit for bit for integer outputs; onnxruntime with its
optimizations off bit for bit for the dynamic-quantization units; onnx.reference within float
rounding for float Conv, whose sums run in another order) and the first image's output is the
same bits at both batch sizes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from support.gpu import runs_from_a_cold_cache
from support.oracles import onnxruntime_run

F32 = np.float32
BATCHES = (1, 3)


@pytest.fixture(scope="module")
def dev(best):
    return best


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _batches(make, seed=0):
    """Feeds at each batch size; the first image is the same in all of them."""
    rng = np.random.default_rng(seed)
    first = make(rng, 1)
    out = [first]
    for n in BATCHES[1:]:
        more = make(rng, n - 1)
        out.append({k: np.concatenate([first[k], more[k]]) for k in first})
    return out


def _run_twice(dev, model, feeds_list, kernel, variant=None, **session_kw):
    """Outputs at each batch size, and the labels of the pipelines each run compiled."""
    return runs_from_a_cold_cache(dev, model, feeds_list, kernel=kernel, variant=variant, **session_kw)


def _assert_compiled_once(compiled, kernel):
    first, second = compiled
    assert any(kernel in lab for lab in first), first
    assert not [lab for lab in second if kernel in lab], f"batch {BATCHES[1]} recompiled: {second}"


def _assert_same_first_image(outs):
    a, b = outs[0][0], outs[1][0]
    assert np.array_equal(a.view(np.uint8), b[:1].view(np.uint8))


# ----------------------------------------------------------------------------- QLinearConv, ConvInteger

QL_VARIANTS = ("direct", "blocked_epilogue", "blocked", "tiled", "simple")
CI_VARIANTS = ("direct", "blocked", "tiled", "simple")


def _qlinear_conv_model(image=(6, 5)):
    """``image``: the input's spatial dims (ints or symbols)."""
    rng = np.random.default_rng(1)
    M, Cg, G = 6, 2, 2
    inits = [
        numpy_helper.from_array(np.array(0.05, F32), "x_scale"),
        numpy_helper.from_array(np.array(7, np.uint8), "x_zero_point"),
        numpy_helper.from_array(rng.integers(-128, 128, [M, Cg, 3, 3]).astype(np.int8), "w"),
        numpy_helper.from_array((rng.random(M) * 0.02 + 0.005).astype(F32), "w_scale"),
        numpy_helper.from_array(rng.integers(-4, 5, M).astype(np.int8), "w_zero_point"),
        numpy_helper.from_array(np.array(0.3, F32), "y_scale"),
        numpy_helper.from_array(np.array(120, np.uint8), "y_zero_point"),
        numpy_helper.from_array(rng.integers(-500, 500, M).astype(np.int32), "B"),
    ]
    names = ["x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "B"]
    node = helper.make_node("QLinearConv", names, ["y"], group=G, pads=[1, 1, 1, 1], strides=[1, 1])
    return _model([node], [_vi("x", TensorProto.UINT8, ["N", Cg * G, *image])], [_vi("y", TensorProto.UINT8, None)],
                  inits, opset=10)


def _conv_integer_model(image=(7, 6)):
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.integers(0, 256, [5, 3, 3, 2]).astype(np.uint8), "w"),
             numpy_helper.from_array(np.array(11, np.uint8), "x_zero_point"),
             numpy_helper.from_array(np.array(130, np.uint8), "w_zero_point")]
    node = helper.make_node("ConvInteger", ["x", "w", "x_zero_point", "w_zero_point"], ["y"],
                            pads=[1, 0, 1, 1], strides=[2, 1])
    return _model([node], [_vi("x", TensorProto.UINT8, ["N", 3, *image])], [_vi("y", TensorProto.INT32, None)],
                  inits, opset=10)


#: (op, variant, model builder, an input image's shape) of the integer convolutions
INTEGER_CONVS = ([("QLinearConv", v, _qlinear_conv_model, [4, 6, 5]) for v in QL_VARIANTS]
                 + [("ConvInteger", v, _conv_integer_model, [3, 7, 6]) for v in CI_VARIANTS])


@pytest.mark.parametrize("op, variant, build, image", INTEGER_CONVS)
def test_integer_convs_compile_once_for_two_batch_sizes(dev, op, variant, build, image):
    model = build()
    feeds = _batches(lambda rng, n: {"x": rng.integers(0, 256, [n, *image]).astype(np.uint8)})
    outs, compiled = _run_twice(dev, model, feeds, op, variant)
    assert not compiled[1] and compiled[0]  # one-node model: nothing at all compiles again
    ref = ReferenceEvaluator(model)
    for got, f in zip(outs, feeds):
        want = ref.run(None, f)[0]
        assert got[0].dtype == want.dtype and np.array_equal(got[0], want)
    _assert_same_first_image(outs)


# ----------------------------------------------------------------------------- DynamicQuantizeConv, ConvIntegerToFloat


def _dynamic_conv_unit(shared, image=(7, 6), strides=(1, 1)):
    """DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul -> Add -> Relu, as quantize_dynamic
    writes it (dynamic_fusion.py fuses it into DynamicQuantizeConv, or ConvIntegerToFloat when
    the quantized x has a second consumer)."""
    rng = np.random.default_rng(3)
    M = 4
    inits = [numpy_helper.from_array(rng.integers(-127, 128, [M, 3, 3, 3]).astype(np.int8), "W"),
             numpy_helper.from_array((rng.random([1, M, 1, 1]) * 0.02 + 0.001).astype(F32), "w_scale"),
             numpy_helper.from_array(np.array(3, np.int8), "w_zp"),
             numpy_helper.from_array(rng.standard_normal([1, M, 1, 1]).astype(F32), "bias")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("Mul", ["xs", "w_scale"], ["s"]),
             helper.make_node("ConvInteger", ["xq", "W", "xz", "w_zp"], ["acc"], pads=[1, 1, 1, 1], strides=list(strides)),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "s"], ["scaled"]),
             helper.make_node("Add", ["scaled", "bias"], ["biased"]),
             helper.make_node("Relu", ["biased"], ["y"])]
    outputs = [_vi("y", TensorProto.FLOAT, None)]
    if shared:
        nodes.append(helper.make_node("Identity", ["xq"], ["xq_out"]))
        outputs.append(_vi("xq_out", TensorProto.UINT8, None))
    return _model(nodes, [_vi("x", TensorProto.FLOAT, ["N", 3, *image])], outputs, inits, opset=21)



@pytest.mark.parametrize("kernel, variant, shared", [
    ("DynamicQuantizeConv", "fused", False),
    ("DynamicQuantizeConv", "two_pass", False),
    ("ConvIntegerToFloat", "gemm", True),
])
def test_dynamic_conv_units_compile_once_for_two_batch_sizes(dev, kernel, variant, shared):
    model = _dynamic_conv_unit(shared)
    feeds = _batches(lambda rng, n: {"x": (rng.standard_normal([n, 3, 7, 6]) * 3 + 0.5).astype(F32)})
    outs, compiled = _run_twice(dev, model, feeds, kernel, variant)
    _assert_compiled_once(compiled, kernel)
    for got, f in zip(outs, feeds):
        for g, want in zip(got, onnxruntime_run(model, f, level="ORT_DISABLE_ALL")):
            assert g.shape == want.shape and np.array_equal(g.view(np.uint8), want.view(np.uint8))
    # the dynamic scale is of the whole batch: the first image's values differ, not its shape
    assert outs[0][0].shape[1:] == outs[1][0].shape[1:]


# ----------------------------------------------------------------------------- float Conv, FusedConv


def _float_conv_model(relu, image=(6, 7), **attrs):
    """Conv [-> Relu]; ``attrs``: the Conv's (default pads 1, strides [1, 2])."""
    attrs = attrs or {"pads": [1, 1, 1, 1], "strides": [1, 2]}
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal([8, 3, 3, 3]).astype(F32), "w"),
             numpy_helper.from_array(rng.standard_normal(8).astype(F32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if relu else "y"], **attrs)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    return _model(nodes, [_vi("x", TensorProto.FLOAT, ["N", 3, *image])], [_vi("y", TensorProto.FLOAT, None)], inits)


@pytest.mark.parametrize("kernel", ["Conv", "FusedConv"])
@pytest.mark.parametrize("variant", ["direct", "direct_oc4"])
def test_float_conv_compiles_once_for_two_batch_sizes(dev, kernel, variant):
    model = _float_conv_model(relu=kernel == "FusedConv")
    feeds = _batches(lambda rng, n: {"x": rng.standard_normal([n, 3, 6, 7]).astype(F32)})
    outs, compiled = _run_twice(dev, model, feeds, kernel, variant)
    assert not compiled[1] and compiled[0]  # Conv + Relu is one FusedConv node
    ref = ReferenceEvaluator(model)
    for got, f in zip(outs, feeds):
        want = ref.run(None, f)[0]
        assert got[0].shape == want.shape
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    _assert_same_first_image(outs)

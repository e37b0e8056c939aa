"""Generated tensors on the GPU (templates/fill.base.json over fill.wgsl.jinja, Range,
OneHot): ConstantOfShape, EyeLike, Trilu, bit for bit with onnx.reference and numpy for every
element type with a device layout (64-bit types as two words, 4-bit and 2-bit packed); ONNX's
node cases pass with no host fallback."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from test_float_kernels_gpu import assert_same_bits, node_model, ref_run, run_node
from test_space_depth_gpu import TYPES, typed

#: TensorProto codes of the ml_dtypes types (helper.np_dtype_to_tensor_dtype knows them too)
NARROW = [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz,
          ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.float4_e2m1fn, ml_dtypes.int2, ml_dtypes.uint2]


def _name(t):
    return np.dtype(t).name


@pytest.mark.parametrize("dtype", TYPES + NARROW, ids=_name)
def test_constant_of_shape_every_type(best, dtype):
    value = typed((1,), dtype, seed=5)
    if np.dtype(dtype).name in ("int2", "uint2", "int4", "uint4", "float4_e2m1fn"):
        value = np.array([1], dtype)
    if np.dtype(dtype).name in ("int4", "int2"):
        value = np.array([-1], dtype)
    shape = np.array([3, 7, 5], np.int64)
    tensor = numpy_helper.from_array(value, "value")
    model = node_model("ConstantOfShape", [("shape", shape)], ["y"], attrs={"value": tensor}, opset=25,
                       out_types=[value.dtype], inits={"shape": shape})
    (got,), _ = run_node(best, model, {})
    expected = np.full(tuple(shape), value[0], dtype)
    assert_same_bits(got, expected, f"ConstantOfShape {np.dtype(dtype).name}")
    assert_same_bits(got, ref_run(model, {})[0], "vs onnx.reference")


def test_constant_of_shape_default_is_float32_zero_and_versions_decline_later_types(best):
    from onnx_quant.errors import KernelRejected

    shape = np.array([4, 9], np.int64)
    model = node_model("ConstantOfShape", [("shape", shape)], ["y"], opset=9, out_types=[np.float32],
                       inits={"shape": shape})
    (got,), _ = run_node(best, model, {})
    assert_same_bits(got, np.zeros((4, 9), np.float32), "default value")
    tensor = numpy_helper.from_array(np.array([1], ml_dtypes.int4), "value")
    model = node_model("ConstantOfShape", [("shape", shape)], ["y"], attrs={"value": tensor}, opset=20,
                       out_types=[ml_dtypes.int4], inits={"shape": shape})
    with pytest.raises(KernelRejected, match="int4"):
        run_node(best, model, {})


@pytest.mark.parametrize("dtype", TYPES, ids=_name)
@pytest.mark.parametrize("k", [0, 2, -1, 7, -9])
def test_eye_like_every_type(best, dtype, k):
    x = np.zeros((5, 7), np.int32)
    code = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = node_model("EyeLike", [("x", x)], ["y"], attrs={"dtype": code, "k": k}, opset=22, out_types=[dtype])
    (got,), _ = run_node(best, model, {"x": x})
    assert_same_bits(got, np.eye(5, 7, k, dtype=dtype), f"EyeLike k={k}")
    assert_same_bits(got, ref_run(model, {"x": x})[0], "vs onnx.reference")


@pytest.mark.parametrize("dtype", TYPES, ids=_name)
@pytest.mark.parametrize("upper", [0, 1])
def test_trilu_every_type(best, dtype, upper):
    x = typed((2, 5, 6), dtype, seed=8)
    for k in (None, 0, 3, -2, 10, -10, 2**40, -(2**40)):
        inputs = [("x", x)] + ([("k", np.array(k, np.int64))] if k is not None else [])
        model = node_model("Trilu", inputs, ["y"], attrs={"upper": upper}, opset=14)
        feeds = dict(inputs)
        (got,), _ = run_node(best, model, feeds)
        kk = 0 if k is None else k
        expected = np.triu(x, kk) if upper else np.tril(x, kk)
        assert_same_bits(got, expected, f"Trilu upper={upper} k={k}")
        assert_same_bits(got, ref_run(model, feeds)[0], "vs onnx.reference")

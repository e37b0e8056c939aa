"""Generated tensors on the GPU (templates/fill.base.json over fill.wgsl.jinja, Range,
OneHot): ConstantOfShape, EyeLike, Trilu, bit for bit with onnx.reference and numpy for every
element type with a device layout (64-bit types as two words, 4-bit and 2-bit packed); ONNX's
node cases pass with no host fallback. On both lavapipe adapters (conftest's ``dev``: Vulkan, then
OpenGL where present)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from support.arrays import TYPES, typed
from support.models import node_model
from support.oracles import assert_same_bits, ref_run
from support.run import run_node, session_run

#: TensorProto codes of the ml_dtypes types (helper.np_dtype_to_tensor_dtype knows them too)
NARROW = [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz,
          ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.float4_e2m1fn, ml_dtypes.int2, ml_dtypes.uint2]


def _name(t):
    return np.dtype(t).name


@pytest.mark.parametrize("dtype", TYPES + NARROW, ids=_name)
def test_constant_of_shape_every_type(dev, dtype):
    value = typed((1,), dtype, seed=5)
    if np.dtype(dtype).name in ("int2", "uint2", "int4", "uint4", "float4_e2m1fn"):
        value = np.array([1], dtype)
    if np.dtype(dtype).name in ("int4", "int2"):
        value = np.array([-1], dtype)
    shape = np.array([3, 7, 5], np.int64)
    tensor = numpy_helper.from_array(value, "value")
    model = node_model("ConstantOfShape", [("shape", shape)], ["y"], attrs={"value": tensor}, opset=25,
                       out_types=[value.dtype], inits={"shape": shape})
    (got,), _ = run_node(dev, model, {})
    expected = np.full(tuple(shape), value[0], dtype)
    assert_same_bits(got, expected, f"ConstantOfShape {np.dtype(dtype).name}")
    assert_same_bits(got, ref_run(model, {})[0], "vs onnx.reference")


def test_constant_of_shape_default_is_float32_zero_and_versions_decline_later_types(dev):
    from onnx_quant.errors import KernelRejected

    shape = np.array([4, 9], np.int64)
    model = node_model("ConstantOfShape", [("shape", shape)], ["y"], opset=9, out_types=[np.float32],
                       inits={"shape": shape})
    (got,), _ = run_node(dev, model, {})
    assert_same_bits(got, np.zeros((4, 9), np.float32), "default value")
    tensor = numpy_helper.from_array(np.array([1], ml_dtypes.int4), "value")
    model = node_model("ConstantOfShape", [("shape", shape)], ["y"], attrs={"value": tensor}, opset=20,
                       out_types=[ml_dtypes.int4], inits={"shape": shape})
    with pytest.raises(KernelRejected, match="int4"):
        run_node(dev, model, {})


@pytest.mark.parametrize("dtype", TYPES, ids=_name)
@pytest.mark.parametrize("k", [0, 2, -1, 7, -9])
def test_eye_like_every_type(dev, dtype, k):
    x = np.zeros((5, 7), np.int32)
    code = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = node_model("EyeLike", [("x", x)], ["y"], attrs={"dtype": code, "k": k}, opset=22, out_types=[dtype])
    (got,), _ = run_node(dev, model, {"x": x})
    assert_same_bits(got, np.eye(5, 7, k, dtype=dtype), f"EyeLike k={k}")
    assert_same_bits(got, ref_run(model, {"x": x})[0], "vs onnx.reference")


@pytest.mark.parametrize("dtype", TYPES, ids=_name)
@pytest.mark.parametrize("upper", [0, 1])
def test_trilu_every_type(dev, dtype, upper):
    x = typed((2, 5, 6), dtype, seed=8)
    for k in (None, 0, 3, -2, 10, -10, 2**40, -(2**40)):
        inputs = [("x", x)] + ([("k", np.array(k, np.int64))] if k is not None else [])
        model = node_model("Trilu", inputs, ["y"], attrs={"upper": upper}, opset=14)
        feeds = dict(inputs)
        (got,), _ = run_node(dev, model, feeds)
        kk = 0 if k is None else k
        expected = np.triu(x, kk) if upper else np.tril(x, kk)
        assert_same_bits(got, expected, f"Trilu upper={upper} k={k}")
        assert_same_bits(got, ref_run(model, feeds)[0], "vs onnx.reference")


def graph_model(op, inputs, out_type, *, opset, attrs=None, n_outputs=1):
    """A one-node model whose inputs are all graph inputs (outputs y0, y1, ...)."""
    return node_model(op, inputs, [f"y{k}" for k in range(n_outputs)], attrs=attrs, opset=opset,
                      out_types=[out_type] * n_outputs)


RANGES = [(0, 10, 1), (3, 9, 3), (10, 4, -2), (-7, 50, 5), (5, 5, 1), (5, 4, 1), (-3, -40, -7)]
FLOAT_RANGES = [(0.0, 1.0, 0.1), (1.5, -2.25, -0.125), (1e3, 1e3 + 7, 0.3), (-0.7, 30.0, 1.7), (0.1, 0.35, 0.05),
                (1e-3, 2e-2, 1.3e-4), (12345.678, 12400.0, 0.9)]


@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.int64], ids=_name)
@pytest.mark.parametrize("opset", [11, 27])
def test_range_integers(dev, dtype, opset):
    ranges = RANGES + ([(2**40 + 5, 2**40 - 2**33, -(2**31) - 7), (-(2**62), -(2**62) + 10**12, 3 * 10**10 + 1)]
                       if dtype == np.int64 else [(30000, 32767, 999)] if dtype == np.int16 else
                       [(2**31 - 100, 2**31 - 1, 7), (-(2**31), 0, 2**28 + 3)])
    for start, limit, delta in ranges:
        feeds = {"start": np.array(start, dtype), "limit": np.array(limit, dtype), "delta": np.array(delta, dtype)}
        model = graph_model("Range", list(feeds.items()), dtype, opset=opset)
        (got,) = session_run(dev, model, feeds)
        expected = ref_run(model, feeds)[0]
        assert_same_bits(got, expected, f"Range {start} {limit} {delta}")
        assert_same_bits(got, np.arange(start, limit, delta).astype(dtype), "vs numpy")


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=_name)
def test_range_floats_bit_for_bit_with_onnx_reference(dev, dtype):
    r = np.random.default_rng(11)
    drawn = [(float(a), float(a + n * d), float(d)) for a, d, n in
             zip(r.standard_normal(25) * 10.0 ** r.integers(-3, 4, 25), r.standard_normal(25) * 10.0 ** r.integers(-4, 2, 25),
                 r.integers(1, 3000, 25))]
    for start, limit, delta in FLOAT_RANGES + drawn + [(float(s), float(l), float(d)) for s, l, d in RANGES]:
        feeds = {"start": np.array(start, dtype), "limit": np.array(limit, dtype), "delta": np.array(delta, dtype)}
        model = graph_model("Range", list(feeds.items()), dtype, opset=27)
        expected = ref_run(model, feeds)[0]
        if expected.size > 5000:
            continue
        (got,) = session_run(dev, model, feeds)
        assert_same_bits(got, expected, f"Range {np.dtype(dtype).name} {start} {limit} {delta}")


def test_range_declines_float64_and_stash_type_double(dev):
    feeds = {"start": np.array(0, np.float64), "limit": np.array(4, np.float64), "delta": np.array(1, np.float64)}
    with pytest.raises(Exception, match="T allows only"):
        session_run(dev, graph_model("Range", list(feeds.items()), np.float64, opset=27), feeds)
    feeds = {k: v.astype(np.float16) for k, v in feeds.items()}
    with pytest.raises(Exception, match="stashOk"):
        session_run(dev, graph_model("Range", list(feeds.items()), np.float16, opset=27,
                                      attrs={"stash_type": TensorProto.DOUBLE}), feeds)


INDEX_TYPES = [np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32]


def one_hot(indices, depth, values, axis):
    """ONNX's definition: on_value where the (wrapped) index names the position, else off_value."""
    idx = np.asarray(indices).astype(np.float64)
    idx = np.where(idx < 0, idx + depth, idx)
    axis = axis + idx.ndim + 1 if axis < 0 else axis
    pos = np.arange(depth).reshape((1,) * axis + (depth,) + (1,) * (idx.ndim - axis))
    hit = np.expand_dims(idx, axis) == pos
    return np.where(hit, values[1], values[0]).astype(values.dtype)


@pytest.mark.parametrize("itype", INDEX_TYPES, ids=_name)
@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
def test_one_hot_every_index_type(dev, itype, axis):
    raw = np.array([[0, 3, -1, 7], [-7, 6, 2, -8], [9, -20, 1, 5]])
    if np.dtype(itype).kind == "u":
        raw = np.abs(raw)
    indices = raw.astype(itype)
    if np.dtype(itype).kind == "f":
        indices.flat[[4, 9]] = np.array([2.5, -0.5], itype)  # not integral: no position
    depth = np.array(7, np.int64)
    values = np.array([2, 5], np.int32)
    feeds = {"indices": indices, "depth": depth, "values": values}
    model = graph_model("OneHot", list(feeds.items()), np.int32, opset=11, attrs={"axis": axis})
    (got,) = session_run(dev, model, feeds)
    assert_same_bits(got, ref_run(model, feeds)[0], f"OneHot {np.dtype(itype).name} axis {axis}")
    assert_same_bits(got, one_hot(indices, 7, values, axis), "vs the definition")


@pytest.mark.parametrize("vtype", TYPES + [np.uint64], ids=_name)
def test_one_hot_every_value_type_writes_the_values_bits(dev, vtype):
    indices = np.array([[1, -1], [0, 4], [2, 3]], np.int64)
    values = typed((2,), vtype, seed=3)
    feeds = {"indices": indices, "depth": np.array(4.0, np.float32), "values": values}
    model = graph_model("OneHot", list(feeds.items()), vtype, opset=28, attrs={"axis": 1})
    (got,) = session_run(dev, model, feeds)
    assert_same_bits(got, one_hot(indices, 4, values, 1), f"OneHot values {np.dtype(vtype).name}")
    if np.dtype(vtype).kind in "iu":  # (onnx.reference cannot subtract bools; floats: on is (on - off) + off there)
        assert_same_bits(got, ref_run(model, feeds)[0], "vs onnx.reference")


def test_one_hot_declines_a_fractional_depth_and_float64_indices(dev):
    feeds = {"indices": np.array([0, 2], np.int64), "depth": np.array(3.5, np.float32), "values": np.array([0, 1], np.int64)}
    with pytest.raises(Exception, match="depthExact"):
        session_run(dev, graph_model("OneHot", list(feeds.items()), np.int64, opset=11), feeds)
    feeds = {"indices": np.array([0, 2], np.float64), "depth": np.array(3, np.int64), "values": np.array([0, 1], np.int64)}
    with pytest.raises(Exception, match="T1 allows only"):
        session_run(dev, graph_model("OneHot", list(feeds.items()), np.int64, opset=11), feeds)


def test_one_hot_float_values_are_written_as_given_like_onnxruntime(dev):
    from support.oracles import ort_run

    feeds = {"indices": np.array([[0, 2], [-1, 5]], np.int64), "depth": np.array(3, np.int64),
             "values": np.array([0.3, 0.1], np.float32)}
    model = graph_model("OneHot", list(feeds.items()), np.float32, opset=11)
    (got,) = session_run(dev, model, feeds)
    assert_same_bits(got, ort_run(model, feeds)[0], "vs onnxruntime")
    assert_same_bits(got, one_hot(feeds["indices"], 3, feeds["values"], -1), "vs the definition")


#: ONNX's node cases of these ops that stay off the GPU, and the words of the reason: the float16 /
#: bfloat16 Range expansions, whose Loop's output shape inference does not know
DECLINED = {f"test_range_{t}_type_positive_delta_expanded": "is not known" for t in ("float16", "bfloat16")}
OPS = ("DepthToSpace", "SpaceToDepth", "Trilu", "Range", "ConstantOfShape", "EyeLike", "OneHot", "Resize", "Upsample")


def test_onnx_node_cases_pass_on_the_gpu_or_are_declined_by_name(dev):
    from support.gpu import assert_node_cases_pass_or_declined

    assert_node_cases_pass_or_declined(dev, OPS, DECLINED, at_least=88)

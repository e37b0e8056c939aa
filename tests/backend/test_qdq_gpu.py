"""QuantizeLinear and DequantizeLinear on the GPU against onnx.reference (and onnxruntime where it
runs the case): every opset version, element type and granularity, every variant.

Integer and narrow-float outputs are compared bit for bit. Float outputs too (the kernels
reproduce the reference's float32 arithmetic and casts exactly), except that NaN payloads
are not compared. One documented deviation (docs/backend.md, "QuantizeLinear /
DequantizeLinear"): for integer y the reference converts rint(x / scale) to int32 before
saturating, so quotients beyond the int32 range and infinities wrap to INT32_MIN and come
out as the type's minimum; the kernels saturate them as ONNX specifies and onnxruntime does
(+ -> maximum, - -> minimum). `expected_outputs` applies exactly that rule to the
reference's result, and a test measures it against onnxruntime.
"""

from __future__ import annotations

import math
import warnings
from functools import lru_cache

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper

from onnx_quant.dtypes import BY_NAME
from onnx_quant.errors import DeviceError, ExecutionError

Q_VARIANTS = ("per_tensor", "general", "simple")
INT_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535),
              "int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}
F8 = ("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz")
SMALL = ("float4e2m1", "float6e2m3", "float6e3m2")
# what each opset version allows (onnx.defs)
Q_Y = {10: ("uint8", "int8"), 13: ("uint8", "int8"), 19: ("uint8", "int8") + F8,
       21: ("uint8", "int8", "int16", "uint16", "int4", "uint4") + F8,
       23: ("uint8", "int8", "int16", "uint16", "int4", "uint4", "float4e2m1") + F8}
Q_Y[24] = Q_Y[23]
Q_Y[25] = Q_Y[23] + ("int2", "uint2")
Q_Y[28] = Q_Y[25] + ("float6e2m3", "float6e3m2")
Q_X = {10: ("float32", "int32"), 13: ("float32", "int32")}
for _v in (19, 21, 23, 24, 25, 28):
    Q_X[_v] = ("float32", "float16", "bfloat16", "int32")
DQ_X = {10: ("uint8", "int8", "int32"), 13: ("uint8", "int8", "int32"), 19: ("uint8", "int8", "int32") + F8,
        21: ("uint8", "int8", "int16", "uint16", "int32", "int4", "uint4") + F8}
DQ_X[23] = DQ_X[21] + ("float4e2m1",)
DQ_X[24] = DQ_X[23]
DQ_X[25] = DQ_X[23] + ("int2", "uint2")
DQ_X[28] = DQ_X[25] + ("float6e2m3", "float6e3m2")
OPSETS = (10, 13, 19, 21, 23, 24, 25, 28)


# ----------------------------------------------------------------------------- devices


def _device(kind: str):
    from conftest import no_gpu

    from backend_wgpu.device import get_device, list_adapters

    try:
        adapters = list_adapters()
        if not adapters:
            no_gpu("wgpu lists no adapter")
        if kind == "best":
            return get_device(None, limits="default")
        if kind == "no-features":
            return get_device(None, limits="default", features=())
        if kind == "opengl":
            if not any(a.backend == "OpenGL" for a in adapters):
                pytest.skip("no OpenGL adapter here")
            return get_device("opengl", limits="default")
    except DeviceError as e:
        no_gpu(str(e))
    raise AssertionError(kind)


@pytest.fixture(scope="module")
def best():
    return _device("best")


@pytest.fixture(scope="module", params=["best", "no-features", "opengl"])
def dev(request):
    return _device(request.param)


# ----------------------------------------------------------------------------- models


def code(name: str) -> int:
    return BY_NAME[name].code


def qdq_model(op: str, opset: int, x_type: str, scale_type: str, y_type: str, x_shape, scale_shape,
              zp: bool, attrs: dict) -> onnx.ModelProto:
    zp_type = y_type if op == "QuantizeLinear" else x_type
    ins = ["x", "s"] + (["z"] if zp else [])
    node = helper.make_node(op, ins, ["y"], name="n0", **attrs)
    inputs = [helper.make_tensor_value_info("x", code(x_type), list(x_shape)),
              helper.make_tensor_value_info("s", code(scale_type), list(scale_shape))]
    if zp:
        inputs.append(helper.make_tensor_value_info("z", code(zp_type), list(scale_shape)))
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", code(y_type), list(x_shape))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=11)


SPEC_FILES = {"QuantizeLinear": "quantize_linear.kernel.json", "DequantizeLinear": "dequantize_linear.kernel.json"}
IO_NAMES = {"QuantizeLinear": ("x", "y_scale", "y_zero_point"), "DequantizeLinear": ("x", "x_scale", "x_zero_point")}


@lru_cache(maxsize=None)
def spec_of(op: str):
    from backend_wgpu.spec import load_spec, templates_dir

    return load_spec(templates_dir() / SPEC_FILES[op])


def node_attributes(model) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in model.graph.node[0].attribute}


def plan_for(dev, model, feeds, variant=None, tunables=None):
    """The node's plan from this kernel's own spec (isolated from other specs in templates/)."""
    from backend_wgpu.planner import plan_node

    op = model.graph.node[0].op_type
    names = IO_NAMES[op]
    shapes, dtypes = {}, {}
    for name, feed in zip(names, ("x", "s", "z")):
        if feed in feeds:
            shapes[name] = tuple(feeds[feed].shape)
            dtypes[name] = BY_NAME[_type_name(feeds[feed].dtype)].name
    shapes["y"] = tuple(feeds["x"].shape)
    dtypes["y"] = BY_NAME[_type_name(model.graph.output[0].type.tensor_type.elem_type)].name
    return plan_node(spec_of(op), shapes=shapes, dtypes=dtypes, device=dev.info, attributes=node_attributes(model),
                     variant=variant, tunables=tunables, node_label="n0")


def _type_name(key) -> str:
    from onnx_quant.dtypes import element_type

    return element_type(key).name


def run_gpu(dev, model, feeds, variant=None, tunables=None):
    """y on the GPU: plan from the spec, run with the executor."""
    from backend_wgpu.executor import release_plan, run_plan

    plan = plan_for(dev, model, feeds, variant, tunables)
    names = IO_NAMES[model.graph.node[0].op_type]
    inputs = {name: feeds[f] for name, f in zip(names, ("x", "s", "z")) if f in feeds}
    try:
        return run_plan(dev, plan, inputs, node="n0")["y"]
    finally:
        release_plan(dev, plan)


def run_session(dev, model, feeds, variant=None):
    from backend_wgpu.session import Session

    variants = {"n0": variant} if variant else None
    return Session(model, device=dev, variants=variants).run(None, feeds)[0]


def run_reference(model, feeds):
    """onnx.reference's outputs. It implements DequantizeLinear from version 19 on only; 10 and
    13 have the same semantics for their types (int8/uint8/int32 x, float32 scale), so those
    models run at opset 19."""
    from onnx.reference import ReferenceEvaluator

    if model.graph.node[0].op_type == "DequantizeLinear" and model.opset_import[0].version < 19:
        model = onnx.ModelProto.FromString(model.SerializeToString())
        model.opset_import[0].version = 19

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(None, feeds)[0]


def _promoted_quotient(x, s, precision):
    """x / s as the reference computes it (numpy promotion, or the precision attribute)."""
    with np.errstate(all="ignore"):
        if precision:
            dt = helper.tensor_dtype_to_np_dtype(precision)
            return x.astype(dt) / s.astype(dt)
        return x / s


def expected_outputs(model, feeds, y_type: str, attrs: dict):
    """The reference's y, with the one documented deviation applied. Integer y: the reference
    takes rint(x / scale).astype(int32) + zero_point, so a quotient whose rint does not fit
    int32, an infinity or a NaN becomes INT32_MIN + zero_point (the minimum, or the maximum
    when a negative zero point wraps it around); the kernels saturate (+ -> maximum,
    - -> minimum) and give NaN the minimum, as onnxruntime does."""
    ref = run_reference(model, feeds)
    if y_type not in INT_RANGES or model.graph.node[0].op_type != "QuantizeLinear":
        return ref
    from onnx.reference.ops._quant_utils import reshape_input

    x, s = feeds["x"], feeds["s"]
    axis = attrs.get("axis", 1)
    block = attrs.get("block_size", 0) or None
    s_full = reshape_input(s, x.shape, axis, block)
    q = np.asarray(_promoted_quotient(x, s_full, attrs.get("precision")), dtype=np.float64)
    with np.errstate(all="ignore"):
        wraps = np.isnan(q) | (np.abs(np.rint(q)) >= 2.0 ** 31)
    lo, hi = INT_RANGES[y_type]
    fixed = np.where(q > 0, hi, lo)  # NaN -> lo
    out = np.array(ref, copy=True)
    if wraps.any():
        out[wraps] = np.broadcast_to(fixed, out.shape)[wraps].astype(out.dtype)
    return out


def bits_of(a: np.ndarray) -> np.ndarray:
    """Comparable bits: narrow types by code (NaN codes included), float16/bfloat16/float32 by
    bit pattern with every NaN mapped to one value (payloads are not compared)."""
    a = np.ascontiguousarray(a)
    if a.dtype.itemsize == 1:
        return a.view(np.uint8)
    if a.dtype in (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
        b = a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint16).astype(np.uint32)
        return np.where(np.isnan(a.astype(np.float32)), np.uint32(0xFFFFFFFF), b)
    return a


def assert_same(got, expected, what=""):
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype, (what, got.dtype, expected.dtype)
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    g, e = bits_of(got).reshape(-1), bits_of(expected).reshape(-1)
    bad = np.nonzero(g != e)[0]
    if bad.size:
        raise AssertionError(f"{what}: {bad.size} of {g.size} differ, first at {bad[:6].tolist()}: "
                             f"got {got.reshape(-1)[bad[:6]]}, expected {expected.reshape(-1)[bad[:6]]}")


# ----------------------------------------------------------------------------- data


def random_values(name: str, shape, rng, *, scale=1.0, ties=None) -> np.ndarray:
    """Values of an element type: every code point for narrow types, NaN/inf/ties for floats."""
    et = BY_NAME[name]
    n = math.prod(shape)
    if et.is_integer:
        lo, hi = et.int_range
        if et.bits == 32:
            v = rng.integers(-300, 300, n) * rng.choice([1, 1, 1000, 2**20], n)
            v[: n // 8] = rng.integers(lo, hi, n // 8, endpoint=True)
            return v.astype(et.dtype).reshape(shape)
        return rng.integers(lo, hi, n, endpoint=True).astype(et.dtype).reshape(shape)
    if et.bits <= 8:
        return rng.integers(0, 1 << et.bits, n).astype(np.uint8).view(et.dtype).reshape(shape)
    v = rng.standard_normal(n) * scale * rng.choice([1, 1, 1, 10, 1000], n)
    if ties is not None:  # exact half-integer quotients for the given scale
        k = rng.integers(-300, 300, n) + 0.5
        pick = rng.random(n) < 0.4
        v = np.where(pick, k * ties, v)
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 1e-30]
    for i, sp in enumerate(specials):
        if i * 7 < n and rng.random() < 0.5:
            v[i * 7] = sp
    with np.errstate(all="ignore"):
        return v.astype(et.dtype).reshape(shape)


def random_scale(name: str, shape, rng) -> np.ndarray:
    n = math.prod(shape)
    et = BY_NAME[name]
    if name == "float8e8m0":
        return rng.integers(110, 140, n).astype(np.uint8).view(et.dtype).reshape(shape)
    if name == "int32":
        return rng.integers(1, 1000, n).astype(np.int32).reshape(shape)
    v = rng.choice([0.5, 0.25, 1.0, 3.0, 0.1, 0.037, 7.5, 0.01], n) * rng.choice([1, 1, 1, -1], n)
    return v.astype(et.dtype).reshape(shape)


def granularity_shapes(kind: str, x_shape, axis: int, block: int):
    """Scale shape for a granularity (None when the shape does not allow it)."""
    r = len(x_shape)
    if kind == "tensor":
        return ()
    if r == 0:
        return None
    a = axis % r
    if kind == "axis":
        return (x_shape[a],)
    if block <= 0:
        return None
    s = list(x_shape)
    s[a] = -(-x_shape[a] // block)
    return tuple(s)


# ----------------------------------------------------------------------------- one case


def check_case(dev, op, opset, x_type, scale_type, y_type, x_shape, gran, *, axis=1, block=0, zp=True,
               saturate=None, precision=None, seed=0, variants=(None,), output_dtype=False):
    rng = np.random.default_rng(seed)
    attrs = {}
    if opset >= 13 and gran != "tensor":
        attrs["axis"] = axis
    if gran == "block":
        attrs["block_size"] = block
    if saturate is not None:
        attrs["saturate"] = saturate
    if precision:
        attrs["precision"] = precision
    if output_dtype:
        attrs["output_dtype"] = code(y_type)
    s_shape = granularity_shapes(gran, x_shape, axis, block)
    assert s_shape is not None
    s = random_scale(scale_type, s_shape, rng)
    if op == "QuantizeLinear":
        ties = float(np.abs(s.astype(np.float32)).reshape(-1)[0]) if s.size and scale_type != "int32" else None
        x = random_values(x_type, x_shape, rng, scale=30.0, ties=ties)
        zp_type = y_type
    else:
        x = random_values(x_type, x_shape, rng)
        zp_type = x_type
    feeds = {"x": x, "s": s}
    if zp:
        if zp_type in F8 or zp_type == "float4e2m1":
            z = np.zeros(s_shape, BY_NAME[zp_type].dtype)
        else:
            z = random_values(zp_type, s_shape, rng)
            if zp_type in SMALL:
                z = np.abs(z.astype(np.float32)).astype(BY_NAME[zp_type].dtype)
        feeds["z"] = z
    model = qdq_model(op, opset, x_type, scale_type, y_type, x_shape, s_shape, zp, attrs)
    expected = expected_outputs(model, feeds, y_type, attrs)
    what = f"{op}-{opset} x={x_type}{list(x_shape)} s={scale_type}{list(s_shape)} y={y_type} {attrs} zp={zp}"
    for v in variants:
        got = run_gpu(dev, model, feeds, variant=v)
        assert_same(got, expected, f"{what} variant={v}")
    return model, feeds, expected

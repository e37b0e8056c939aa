"""QuantizeLinear and DequantizeLinear on the GPU against onnx.reference (and onnxruntime where it
runs the case): every opset version, element type and granularity, every variant.

Integer and narrow-float outputs are compared bit for bit. Float outputs too (the kernels
reproduce the reference's float32 arithmetic and casts exactly), except that NaN payloads
are not compared. One documented deviation (docs/qdq.md, "Integer y: out-of-range
quotients and NaN"): for integer y the reference converts rint(x / scale) to int32 before
adding the zero point and saturating, so quotients beyond the int32 range, infinities and NaN
wrap; the kernels saturate them as ONNX specifies and onnxruntime does (+ -> maximum,
- and NaN -> minimum). `expected_outputs` applies exactly that rule to the reference's
result, and a test checks it against onnxruntime.
"""

from __future__ import annotations

import math
import warnings
from functools import lru_cache

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper

from onnx_quant.dtypes import BY_NAME
from onnx_quant.errors import ExecutionError

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


#: dev: also the default adapter without its optional features (no shader-f16, no subgroups)
pytestmark = pytest.mark.devices("best", "best-no-subgroup", "opengl")


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
    from onnx_quant.backend_wgpu.spec import load_spec, templates_dir

    return load_spec(templates_dir() / SPEC_FILES[op])


def node_attributes(model) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in model.graph.node[0].attribute}


def plan_for(dev, model, feeds, variant=None, tunables=None):
    """The node's plan from this kernel's own spec (isolated from other specs in templates/)."""
    from onnx_quant.backend_wgpu.planner import plan_node

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
    from onnx_quant.backend_wgpu.executor import release_plan, run_plan

    plan = plan_for(dev, model, feeds, variant, tunables)
    names = IO_NAMES[model.graph.node[0].op_type]
    inputs = {name: feeds[f] for name, f in zip(names, ("x", "s", "z")) if f in feeds}
    try:
        return run_plan(dev, plan, inputs, node="n0")["y"]
    finally:
        release_plan(dev, plan)


def run_session(dev, model, feeds, variant=None):
    from onnx_quant.backend_wgpu.session import Session

    variants = {model.graph.node[0].op_type: variant} if variant else None
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


def run_onnxruntime(model, feeds):
    """onnxruntime CPU's y, or None where it does not run the case. The inputs become
    initializers (its Python API takes no ml_dtypes arrays as feeds); graph optimizations are
    off, so its CPU kernel computes y."""
    try:
        import onnxruntime as ort
    except ImportError:  # pragma: no cover
        return None
    from onnx import numpy_helper

    m = onnx.ModelProto.FromString(model.SerializeToString())
    names = {i.name for i in m.graph.input}
    for name in names:
        m.graph.initializer.append(numpy_helper.from_array(np.asarray(feeds[name]), name))
    del m.graph.input[:]
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4
    try:
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        y = np.asarray(sess.run(None, {})[0])
    except Exception:  # NOT_IMPLEMENTED, unsupported type: onnxruntime does not run this case
        return None
    want = BY_NAME[_type_name(model.graph.output[0].type.tensor_type.elem_type)].dtype
    if y.dtype != want and y.dtype.itemsize == want.itemsize:  # float8 comes back as raw uint8
        y = y.view(want)
    return y


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
    if feeds["x"].size == 0:  # (the reference fails on some empty inputs, e.g. an empty float8 zero point)
        return np.zeros(feeds["x"].shape, BY_NAME[y_type].dtype)
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


# ----------------------------------------------------------------------------- every version, type, granularity


def _granularities(opset: int):
    return ("tensor",) + (("axis",) if opset >= 13 else ()) + (("block",) if opset >= 21 else ())


def _q_cases():
    """Every (version, x type, y type); scale types and granularities rotate. A kernel does not
    depend on the opset version, so a (x, scale, y, granularity) already run at an earlier
    version is not repeated."""
    out, seen = [], set()
    for opset in OPSETS:
        grans = _granularities(opset)
        for i, xt in enumerate(Q_X[opset]):
            scales = ("float32",) if opset < 19 else ((xt,) if opset < 23 else ("float32", "float16", "bfloat16")
                                                     + (("float8e8m0",) if opset >= 24 else ()))
            for j, yt in enumerate(Q_Y[opset]):
                st_ = scales[(i + j) % len(scales)]
                gran = grans[(i + j + opset) % len(grans)]
                if (xt, st_, yt, gran) in seen:
                    continue
                seen.add((xt, st_, yt, gran))
                out.append(pytest.param(opset, xt, st_, yt, gran, id=f"Q{opset}-{xt}-{st_}-{yt}-{gran}"))
    return out


def _dq_cases():
    out, seen = [], set()
    for opset in OPSETS:
        grans = _granularities(opset)
        scales = ("float32",) if opset < 19 else ("float32", "float16", "bfloat16") + (("float8e8m0",) if opset >= 24 else ())
        for i, xt in enumerate(DQ_X[opset]):
            for k in range(2):
                st_ = scales[(i + k) % len(scales)]
                yt = st_ if st_ != "float8e8m0" else "float32"
                if opset >= 23 and k == 1:
                    yt = ("float16", "bfloat16", "float32")[i % 3]
                gran = grans[(i + k + opset) % len(grans)]
                if (xt, st_, yt, gran) in seen:
                    continue
                seen.add((xt, st_, yt, gran))
                out.append(pytest.param(opset, xt, st_, yt, gran, id=f"DQ{opset}-{xt}-{st_}-{yt}-{gran}"))
    return out


@pytest.mark.parametrize("opset, x_type, scale_type, y_type, gran", _q_cases())
def test_quantize_every_version_type_granularity(best, opset, x_type, scale_type, y_type, gran):
    zp = opset < 21 or len(x_type + y_type) % 2 == 0  # without a zero point y's type is output_dtype
    check_case(best, "QuantizeLinear", opset, x_type, scale_type, y_type, (3, 8), gran, block=3,
               zp=zp, seed=opset, output_dtype=not zp)


@pytest.mark.parametrize("opset, x_type, scale_type, y_type, gran", _dq_cases())
def test_dequantize_every_version_type_granularity(best, opset, x_type, scale_type, y_type, gran):
    check_case(best, "DequantizeLinear", opset, x_type, scale_type, y_type, (3, 8), gran, block=3,
               zp=len(x_type) % 2 == 0 or gran == "block", seed=opset, output_dtype=opset >= 23 and y_type != scale_type)


# ----------------------------------------------------------------------------- ONNX's node cases


NODE_CASES = (
    "test_quantizelinear", "test_quantizelinear_axis", "test_quantizelinear_blocked_asymmetric",
    "test_quantizelinear_blocked_symmetric", "test_quantizelinear_e4m3fn", "test_quantizelinear_e5m2",
    "test_quantizelinear_float4e2m1", "test_quantizelinear_int16", "test_quantizelinear_int2",
    "test_quantizelinear_int4", "test_quantizelinear_uint16", "test_quantizelinear_uint2", "test_quantizelinear_uint4",
    "test_dequantizelinear", "test_dequantizelinear_axis", "test_dequantizelinear_blocked",
    "test_dequantizelinear_e4m3fn", "test_dequantizelinear_e4m3fn_float16", "test_dequantizelinear_e4m3fn_zero_point",
    "test_dequantizelinear_e5m2", "test_dequantizelinear_float4e2m1", "test_dequantizelinear_int16",
    "test_dequantizelinear_int2", "test_dequantizelinear_int4", "test_dequantizelinear_uint16",
    "test_dequantizelinear_uint2", "test_dequantizelinear_uint4",
)


@lru_cache(maxsize=1)
def _node_cases() -> dict:
    """ONNX's node cases whose nodes are all QuantizeLinear / DequantizeLinear, by name
    (collect_testcases builds every case of every op: called once, when first needed)."""
    from onnx_quant.node_cases import all_node_cases

    return {c.name: c for c in all_node_cases()
            if c.model.graph.node and all(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in c.model.graph.node)}


def _as_array(v):
    from onnx import numpy_helper

    return numpy_helper.to_array(v) if hasattr(v, "HasField") else np.asarray(v)


def test_node_cases_are_all_here():
    """13 QuantizeLinear and 14 DequantizeLinear cases in onnx 1.23, all at opset 28."""
    cases = _node_cases()
    assert sorted(cases) == sorted(NODE_CASES)
    assert {c.model.opset_import[0].version for c in cases.values()} == {28}


@pytest.mark.parametrize("name", NODE_CASES)
def test_onnx_node_case_through_session(best, name):
    """ONNX's own QuantizeLinear / DequantizeLinear node cases (opset 28) through Session,
    with the variant the planner picks and with every variant forced."""
    case = _node_cases()[name]
    model = case.model
    for inputs, outputs in case.data_sets:
        feeds = {i.name: _as_array(v) for i, v in zip(model.graph.input, inputs)}
        expected = _as_array(outputs[0])
        assert_same(run_session(best, model, feeds), expected, name)
        for v in Q_VARIANTS:
            try:
                got = run_session(best, model, feeds, variant=v)
            except ExecutionError as e:
                assert "cannot force" in str(e) and v == "per_tensor"
                continue
            assert_same(got, expected, f"{name} variant={v}")


# ----------------------------------------------------------------------------- variants agree


_AGREE_CASES = [
    ("QuantizeLinear", "float32", "uint8"), ("QuantizeLinear", "float16", "int4"),
    ("QuantizeLinear", "bfloat16", "float8e4m3fn"), ("QuantizeLinear", "float32", "int2"),
    ("QuantizeLinear", "int32", "int16"), ("QuantizeLinear", "float32", "float6e3m2"),
    ("DequantizeLinear", "int4", "float32"), ("DequantizeLinear", "uint2", "float16"),
    ("DequantizeLinear", "float8e5m2", "bfloat16"), ("DequantizeLinear", "int32", "float32"),
]


def _agree_params():
    """Every case x granularity on the default device; a fixed third of them on the
    secondary ones (Vulkan without features, OpenGL): each combination compiles its own
    pipelines, and the secondary devices only need to show the same bits on a spread."""
    out = []
    for kind in ("best", "best-no-subgroup", "opengl"):
        for op, x_type, y_type in _AGREE_CASES:
            for gran in ("tensor", "axis", "block"):
                if kind != "best" and (len(x_type) + len(y_type) + len(gran)) % 3:
                    continue
                out.append(pytest.param(kind, op, x_type, y_type, gran,
                                        id=f"{kind}-{op}-{x_type}-{y_type}-{gran}"))
    return out


@pytest.mark.parametrize("kind, op, x_type, y_type, gran", _agree_params())
@pytest.mark.gpu
def test_every_variant_on_every_device_agrees(kind, op, x_type, y_type, gran):
    """per_tensor (where it applies), general and simple, forced, on Vulkan (subgroups, f16),
    Vulkan without features and OpenGL, with WebGPU default limits; 1000+ elements so that
    several workgroups run and the last word of y is partial."""
    from support.gpu import gpu_device

    dev = gpu_device(kind)
    x_shape = (5, 7, 29)
    scale = {"QuantizeLinear": "float32", "DequantizeLinear": "float16" if y_type == "float16" else "float32"}[op]
    if y_type == "bfloat16":
        scale = "bfloat16"
    variants = (("per_tensor",) if gran == "tensor" else ()) + ("general", "simple")
    check_case(dev, op, 28, x_type, scale, y_type, x_shape, gran, axis=-2 if gran == "axis" else 2, block=4,
               variants=variants, seed=7)


def test_two_dimensional_grid_and_small_workgroups(best):
    """A device allowing 8 workgroups per dimension forces the 2-D grid (rows of 8 groups; the
    spare groups of the last row write nothing)."""
    from onnx_quant.backend_wgpu.device import get_device

    small = get_device(None, limits={"maxComputeWorkgroupsPerDimension": 8})
    model, feeds, expected = check_case(best, "QuantizeLinear", 28, "float32", "float32", "uint8", (3001,), "tensor")
    for variant in Q_VARIANTS:
        tun = None if variant == "simple" else {"WORKGROUP_SIZE": 16}
        plan = plan_for(small, model, feeds, variant=variant, tunables=tun)
        assert plan.passes[0].dispatch[1] > 1
        assert_same(run_gpu(small, model, feeds, variant=variant, tunables=tun), expected, variant)
    model, feeds, expected = check_case(best, "DequantizeLinear", 28, "int4", "float32", "float32", (6, 37), "block",
                                        block=5)
    for wg, words in ((4, 1), (16, 3), (32, 4), (8, 7)):
        tun = {"WORKGROUP_SIZE": wg, "WORDS_PER_THREAD": words}
        assert_same(run_gpu(small, model, feeds, variant="general", tunables=tun), expected, f"{tun}")


def test_shader_f16_and_manual_f16_decoding_agree(best):
    if "shader-f16" not in best.info.features:
        pytest.skip("device without shader-f16")
    model, feeds, expected = check_case(best, "QuantizeLinear", 21, "float16", "float16", "int16", (4, 33), "axis")
    plan_f16 = plan_for(best, model, feeds)
    assert plan_f16.passes[0].context["xF16"] is True
    assert "enable f16;" in __import__("onnx_quant.backend_wgpu.render", fromlist=["render"]).render(plan_f16.passes[0])
    plan_u32 = plan_for(best, model, feeds, tunables={"USE_SHADER_F16": 0})
    assert plan_u32.passes[0].context["xF16"] is False
    assert_same(run_gpu(best, model, feeds, tunables={"USE_SHADER_F16": 0}), expected, "manual f16 decode")
    assert_same(run_gpu(best, model, feeds), expected, "shader-f16")


# ----------------------------------------------------------------------------- hypothesis


@st.composite
def qdq_cases(draw):
    op = draw(st.sampled_from(["QuantizeLinear", "DequantizeLinear"]))
    opset = draw(st.sampled_from(OPSETS))
    rank = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=rank, max_size=rank)))
    grans = [g for g in _granularities(opset) if g == "tensor" or rank >= 1]
    gran = draw(st.sampled_from(grans))
    axis = draw(st.integers(-rank, rank - 1)) if rank else 1
    block = draw(st.integers(1, 4))
    if op == "QuantizeLinear":
        x_type = draw(st.sampled_from(Q_X[opset]))
        y_type = draw(st.sampled_from(Q_Y[opset]))
        scales = ("float32",) if opset < 19 else ((x_type,) if opset < 23 else
                                                  ("float32", "float16", "bfloat16", "int32")
                                                  + (("float8e8m0",) if opset >= 24 else ()))
        scale_type = draw(st.sampled_from(scales))
        zp = draw(st.booleans()) or (opset < 21 and y_type != "uint8")
        output_dtype = not zp and opset >= 21
        if not zp and opset < 21:
            y_type = "uint8"
    else:
        x_type = draw(st.sampled_from(DQ_X[opset]))
        scale_type = draw(st.sampled_from(("float32",) if opset < 19 else ("float32", "float16", "bfloat16")
                                          + (("float8e8m0",) if opset >= 24 else ())))
        y_type = scale_type if opset < 23 or scale_type != "float8e8m0" else "float32"
        if opset >= 23 and draw(st.booleans()):
            y_type = draw(st.sampled_from(("float32", "float16", "bfloat16")))
        zp = draw(st.booleans())
        output_dtype = opset >= 23 and y_type != scale_type
    saturate = draw(st.sampled_from([None, 0, 1])) if op == "QuantizeLinear" and y_type in F8 else None
    variant = draw(st.sampled_from([None, "general", "simple"] + (["per_tensor"] if gran == "tensor" else [])))
    return dict(op=op, opset=opset, x_type=x_type, scale_type=scale_type, y_type=y_type, x_shape=shape, gran=gran,
                axis=axis, block=block, zp=zp, saturate=saturate, output_dtype=output_dtype, variant=variant,
                seed=draw(st.integers(0, 2**16)))


@given(case=qdq_cases())
def test_hypothesis_opset_dtype_granularity_shape(best, case):
    """Random version x types x granularity x shape (rank 0 and empty included) x variant."""
    c = dict(case)
    variant = c.pop("variant")
    check_case(best, c.pop("op"), c.pop("opset"), c.pop("x_type"), c.pop("scale_type"), c.pop("y_type"),
               c.pop("x_shape"), c.pop("gran"), variants=(variant,), **c)


# ----------------------------------------------------------------------------- numerics edges


def _run_both(dev, model, feeds, y_type, attrs, variants=(None, "general", "simple")):
    expected = expected_outputs(model, feeds, y_type, attrs)
    for v in variants:
        assert_same(run_gpu(dev, model, feeds, variant=v), expected, f"variant {v}")
    return expected


@pytest.mark.parametrize("x_type", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("y_type", ["uint8", "int8", "int16", "int4", "uint2"])
def test_quantize_ties_and_their_neighbours(best, x_type, y_type):
    """x / scale == k + 0.5 exactly, and one ULP of x either side, for inexact scales (one per
    row, per-axis): the quotient must round as the CPU's (f32, or float16 / bfloat16 when x and
    scale are)."""
    xdt = BY_NAME[x_type].dtype
    scales = np.array([0.1, 0.3, 1 / 3, 0.7, 2.5e-3, 7.0]).astype(xdt)
    k = np.arange(-260, 260) + 0.5
    rows = []
    for sv in scales:
        t = (k * np.float64(np.float32(sv))).astype(xdt)
        up = np.nextafter(t.astype(np.float32), np.float32(np.inf)).astype(xdt)
        down = np.nextafter(t.astype(np.float32), np.float32(-np.inf)).astype(xdt)
        rows.append(np.concatenate([t, up, down]))
    x = np.stack(rows)
    model = qdq_model("QuantizeLinear", 21, x_type, x_type, y_type, x.shape, scales.shape, True, {"axis": 0})
    z = np.array([1, 0, 1, 0, 1, 0]) if y_type != "int8" else np.array([-3, 0, 2, -1, 0, 5])
    feeds = {"x": x, "s": scales, "z": z.astype(BY_NAME[y_type].dtype)}
    _run_both(best, model, feeds, y_type, {"axis": 0}, variants=(None,))


@pytest.mark.parametrize("x_type", ["int8", "uint8", "uint4", "int2", "float8e4m3fn", "float4e2m1", "float6e2m3"])
@pytest.mark.parametrize("count", [4 * 111, 4 * 111 + 1, 4 * 111 + 3])
def test_dequantize_per_tensor_float32_four_elements_a_step(best, x_type, count):
    """per_tensor with float32 y and an x of at most 8 bits writes 4 elements of y per step from
    one x word: at several words per invocation and workgroup sizes (the last invocation partly
    past the end, the last step partial), the bits of the general variant and of the reference."""
    model, feeds, expected = check_case(best, "DequantizeLinear", 25, x_type, "float32", "float32", (count,), "tensor",
                                        zp=x_type not in F8 and x_type != "float4e2m1", seed=5)
    plan = plan_for(best, model, feeds, variant="per_tensor")
    assert plan.derived["quadSteps"], "the case is not the 4-element path"
    for wg, words in ((256, 4), (8, 1), (16, 3), (32, 7)):
        tun = {"WORKGROUP_SIZE": wg, "WORDS_PER_THREAD": words}
        assert_same(run_gpu(best, model, feeds, variant="per_tensor", tunables=tun), expected, f"{x_type} {tun}")
    assert_same(run_gpu(best, model, feeds, variant="general"), expected, f"{x_type} general")


@pytest.mark.parametrize("y_type", ["uint8", "int16", "int4", "uint2"])
@pytest.mark.parametrize("count", [4 * 331, 4 * 331 + 3])
def test_per_tensor_redoes_ties_in_every_word_of_an_invocation(best, y_type, count):
    """The per-tensor fast path marks the elements whose quotient lies near a half-integer in one
    mask per invocation and redoes them after the invocation's words (a partial last word too):
    ties in every position of every word, with several words per invocation (capped at 32
    elements), all variants against the reference."""
    rng = np.random.default_rng(11)
    scale = np.float32(0.3)
    k = rng.integers(-9, 9, count) + 0.5
    x = (k * np.float64(scale)).astype(np.float32)
    x[::3] = rng.standard_normal(x[::3].size).astype(np.float32) * 4  # between them, ordinary values
    x[-1] = np.float32(2.5 * np.float64(scale))  # the last element (in the partial word: count % 4 == 3)
    model = qdq_model("QuantizeLinear", 21, "float32", "float32", y_type, x.shape, (), True, {})
    feeds = {"x": x, "s": np.array(scale, np.float32), "z": np.array(1, BY_NAME[y_type].dtype)}
    expected = expected_outputs(model, feeds, y_type, {})
    for words in (1, 3, 8, 32):
        for variant in Q_VARIANTS:
            tun = None if variant == "simple" else {"WORKGROUP_SIZE": 32, "WORDS_PER_THREAD": words}
            assert_same(run_gpu(best, model, feeds, variant=variant, tunables=tun), expected, f"{variant} {tun}")


@pytest.mark.parametrize("y_type", ["int8", "uint16", "float8e4m3fn", "float8e5m2fnuz", "float4e2m1", "float6e3m2"])
@pytest.mark.parametrize("scale_type", ["float32", "bfloat16"])
def test_int32_input_exact_division(best, y_type, scale_type):
    """int32 x: numpy divides in float64; the kernel's long division must round every tie and
    near-tie the same way, for integer and float outputs, with and without a zero point. One
    scale per row (per-axis)."""
    base = np.concatenate([np.arange(-700, 700), np.arange(-700, 700) * 1001 + 1,
                           [2**31 - 1, -2**31, 2**24 + 1, -(2**24) - 3, 123456789, 0]])
    scales = np.array([2.0, 3.0, 0.75, 1000.0, 7.0, 2.0**-3]).astype(BY_NAME[scale_type].dtype)
    x = np.stack([base] * len(scales)).astype(np.int32)
    for zp in (False, True):
        attrs = {"axis": 0} if zp else {"axis": 0, "output_dtype": code(y_type)}
        model = qdq_model("QuantizeLinear", 28, "int32", scale_type, y_type, x.shape, scales.shape, zp, attrs)
        feeds = {"x": x, "s": scales}
        if zp:
            z = {"float4e2m1": [1.5, -2, 0.5, 0, 6, -0.5], "float6e3m2": [-0.25, 3, 0, 28, -1.5, 0.0625]}.get(
                y_type, [0] * 6 if y_type.startswith("float8") else [3, 0, 1, 5, 2, 7])
            feeds["z"] = np.asarray(z).astype(BY_NAME[y_type].dtype)
        _run_both(best, model, feeds, y_type, attrs, variants=(None,))


def test_int32_input_float4_output_with_zero_point_cancellation(best):
    """q + zero point computed exactly (the reference adds in float64) when they nearly cancel."""
    base = np.arange(-4000, 4000, 7)
    scales = np.array([1000.0, 999.0, 1234.5, 1000.0], np.float32)
    x = np.stack([base] * 4).astype(np.int32)
    model = qdq_model("QuantizeLinear", 28, "int32", "float32", "float4e2m1", x.shape, scales.shape, True, {"axis": 0})
    feeds = {"x": x, "s": scales, "z": np.array([-3.0, 0.5, 6.0, -0.0]).astype(ml_dtypes.float4_e2m1fn)}
    _run_both(best, model, feeds, "float4e2m1", {"axis": 0}, variants=(None,))


@pytest.mark.parametrize("precision", [TP.FLOAT, TP.FLOAT16, TP.BFLOAT16, TP.DOUBLE])
@pytest.mark.parametrize("x_type", ["float32", "int32", "float16"])
def test_precision_attribute(best, precision, x_type):
    check_case(best, "QuantizeLinear", 23, x_type, "float32", "int16", (4, 40), "axis", precision=precision,
               variants=(None, "simple"))
    check_case(best, "QuantizeLinear", 25, x_type, "bfloat16", "float8e4m3fn", (4, 40), "tensor", precision=precision)


@pytest.mark.parametrize("y_type", F8)
@pytest.mark.parametrize("saturate", [0, 1])
def test_float8_saturate_overflow_nan_inf(best, y_type, saturate):
    top = float(ml_dtypes.finfo(BY_NAME[y_type].dtype).max)
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, top, -top, top * 1.01, top * 1.2, -top * 2, 1e38, 0.0, -0.0,
                  1e-30, -1e-30, 3.0, -3.0], np.float32)
    model = qdq_model("QuantizeLinear", 21, "float32", "float32", y_type, x.shape, (), False,
                      {"saturate": saturate, "output_dtype": code(y_type)})
    _run_both(best, model, {"x": x, "s": np.asarray(1.0, np.float32)}, y_type, {})


@pytest.mark.parametrize("y_type", ["uint8", "int8", "int16", "uint16"])
def test_nan_inf_and_huge_quotients_saturate_like_onnxruntime(best, y_type):
    """The documented deviation from onnx.reference: +inf / beyond-int32 quotients give the
    maximum, -inf the minimum, NaN the minimum (also with a negative zero point) — what
    onnxruntime computes — where the reference wraps through int32."""
    x = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 1e30, -1e30, 2.5, -2.5, 1e6, -1e6], np.float32)
    zero = -5 if y_type.startswith("int") else 7
    model = qdq_model("QuantizeLinear", 21, "float32", "float32", y_type, x.shape, (), True, {})
    feeds = {"x": x, "s": np.asarray(1.0, np.float32), "z": np.asarray(zero, BY_NAME[y_type].dtype)}
    got = run_gpu(best, model, feeds)
    lo, hi = INT_RANGES[y_type]
    assert got[:7].tolist() == [lo, hi, lo, hi, lo, hi, lo]
    ort_y = run_onnxruntime(model, feeds)
    assert ort_y is not None
    assert_same(got, ort_y, "onnxruntime")
    ref = run_reference(model, feeds)
    # the reference: NaN, +-inf and beyond-int32 quotients all become INT32_MIN, + zp wraps past
    # INT32_MAX for a negative zp (then saturates to hi), stays below lo otherwise
    assert ref[:7].tolist() == [hi if zero < 0 else lo] * 7
    assert_same(got, expected_outputs(model, feeds, y_type, {}), "reference with the documented rule")


def test_dequantize_int32_with_zero_point_is_float64_like_the_reference(best):
    """The reference promotes x.astype(float32) - zero_point to float64; the kernel reproduces
    RN64((RN32(x) - zp) * scale) -> float32 exactly, incl. a difference of 2^32."""
    x = np.array([2**31 - 1, -2**31, 2**31 - 1, 123456789, -987654321, 16777217, 5, 0, 1 - 2**31], np.int32)
    for zp in (0, -2**31, 2**31 - 1, 17, -3):
        for s, st_, yt in ((0.1, "float32", "float32"), (3.0e-7, "float32", "float16"), (0.7, "bfloat16", "bfloat16"),
                           (1e-38, "float32", "float32")):
            model = qdq_model("DequantizeLinear", 23, "int32", st_, yt, x.shape, (), True, {"output_dtype": code(yt)})
            feeds = {"x": x, "s": np.asarray(s, BY_NAME[st_].dtype), "z": np.asarray(zp, np.int32)}
            _run_both(best, model, feeds, yt, {})


def test_rank0_empty_and_negative_axis(best):
    for op, xt, yt, st_ in (("QuantizeLinear", "float32", "int4", "float32"), ("DequantizeLinear", "uint2", "float16", "float16")):
        check_case(best, op, 28, xt, st_, yt, (), "tensor", variants=Q_VARIANTS)
        check_case(best, op, 28, xt, st_, yt, (0, 3), "tensor", variants=Q_VARIANTS)
        check_case(best, op, 28, xt, st_, yt, (2, 0, 3), "axis", axis=-1, variants=("general", "simple"))
        check_case(best, op, 28, xt, st_, yt, (2, 5, 3), "block", axis=-2, block=2, variants=("general", "simple"))
        check_case(best, op, 28, xt, st_, yt, (2, 5, 3), "axis", axis=-3, variants=("general", "simple"))


# ----------------------------------------------------------------------------- onnxruntime


def test_onnxruntime_agrees_where_it_runs(best):
    """Every case below that onnxruntime runs agrees with the kernels bit for bit, except the
    two measured disagreements between onnxruntime and onnx.reference (next test)."""
    ran = 0
    for op, opset, xt, st_, yt, gran in (
            ("QuantizeLinear", 10, "float32", "float32", "uint8", "tensor"),
            ("QuantizeLinear", 13, "float32", "float32", "int8", "axis"),
            ("QuantizeLinear", 19, "float16", "float16", "uint8", "axis"),
            ("QuantizeLinear", 21, "float32", "float32", "int16", "block"),
            ("QuantizeLinear", 21, "float32", "float32", "uint16", "axis"),
            ("QuantizeLinear", 19, "float32", "float32", "float8e4m3fn", "tensor"),
            ("QuantizeLinear", 23, "float32", "float32", "float6e2m3", "tensor"),
            ("DequantizeLinear", 21, "int4", "float32", "float32", "block"),
            ("DequantizeLinear", 21, "uint4", "float32", "float32", "axis"),
            ("DequantizeLinear", 19, "float8e4m3fn", "float16", "float16", "tensor"),
            ("DequantizeLinear", 21, "int16", "float32", "float32", "axis"),
            ("DequantizeLinear", 13, "uint8", "float32", "float32", "axis")):
        model, feeds, expected = check_case(best, op, opset, xt, st_, yt, (4, 24), gran, block=4, seed=3)
        o = run_onnxruntime(model, feeds)
        if o is None:
            continue
        ran += 1
        assert_same(np.asarray(o), expected, f"onnxruntime {op}-{opset} {xt}->{yt} {gran}")
    assert ran >= 8


def test_measured_onnxruntime_reference_disagreements(best):
    """Pinned measurements (docs/qdq.md): (1) float16 x and scale: the reference divides in
    float16, onnxruntime in float32, which differs for int16/uint16 y; (2) int32 x with a zero
    point: the reference subtracts in float64, onnxruntime in (wrapping) int32. The kernels
    follow the reference in both."""
    x = np.array([8824.0, 835.5, -7.715, 604.5], np.float16)
    model = qdq_model("QuantizeLinear", 21, "float16", "float16", "int16", x.shape, (), True, {})
    feeds = {"x": x, "s": np.asarray(0.37, np.float16), "z": np.asarray(0, np.int16)}
    ours = run_gpu(best, model, feeds)
    assert_same(ours, run_reference(model, feeds), "reference")
    o = run_onnxruntime(model, feeds)
    if o is not None:
        q32 = np.rint(x.astype(np.float32) / np.float32(np.float16(0.37)))
        assert np.array_equal(o, q32.astype(np.int16)), "onnxruntime divides in float32"
        assert not np.array_equal(o, ours)
    x = np.array([2**31 - 1, 606999864, -5], np.int32)
    model = qdq_model("DequantizeLinear", 21, "int32", "float32", "float32", x.shape, (), True, {})
    feeds = {"x": x, "s": np.asarray(1.0, np.float32), "z": np.asarray(-2**30, np.int32)}
    ours = run_gpu(best, model, feeds)
    assert_same(ours, run_reference(model, feeds), "reference")
    o = run_onnxruntime(model, feeds)
    if o is not None:
        assert o[0] < 0 < ours[0], "onnxruntime's int32 subtraction wraps"


# ----------------------------------------------------------------------------- errors


def test_bad_scale_shape_is_a_clear_error(best):
    x = np.zeros((3, 4), np.float32)
    model = qdq_model("QuantizeLinear", 21, "float32", "float32", "uint8", x.shape, (5,), True, {"axis": 1})
    feeds = {"x": x, "s": np.ones(5, np.float32), "z": np.zeros(5, np.uint8)}
    with pytest.raises(ExecutionError, match="node 'n0'.*QuantizeLinear.*'valid' is false"):
        run_gpu(best, model, feeds)
    plan_model = qdq_model("QuantizeLinear", 21, "float32", "float32", "uint8", x.shape, (2, 4), True,
                           {"axis": 0, "block_size": 2})
    feeds = {"x": x, "s": np.ones((2, 4), np.float32), "z": np.zeros((2, 4), np.uint8)}
    assert_same(run_gpu(best, plan_model, feeds), run_reference(plan_model, feeds), "blocked axis 0")
    feeds = {"x": x, "s": np.ones((2, 3), np.float32), "z": np.zeros((2, 3), np.uint8)}
    bad = qdq_model("QuantizeLinear", 21, "float32", "float32", "uint8", x.shape, (2, 3), True,
                    {"axis": 0, "block_size": 2})
    with pytest.raises(ExecutionError, match="no variant applies"):
        run_gpu(best, bad, feeds)


def test_unknown_attribute_and_precision_are_rejected(best):
    x = np.zeros((3,), np.float32)
    model = qdq_model("QuantizeLinear", 23, "float32", "float32", "uint8", x.shape, (), True, {"precision": TP.INT8})
    feeds = {"x": x, "s": np.asarray(1, np.float32), "z": np.asarray(0, np.uint8)}
    with pytest.raises(ExecutionError, match="no variant applies"):
        run_gpu(best, model, feeds)
    model = qdq_model("QuantizeLinear", 23, "float32", "float32", "uint8", x.shape, (), True, {"bogus": 1})
    with pytest.raises(ExecutionError, match="node 'n0'.*QuantizeLinear.*'bogus'"):
        run_gpu(best, model, feeds)

"""QLinearConv and ConvInteger on the GPU: every variant, forced, bit for bit.

Oracles: a numpy convolution (``np_conv_integer``: exact int64 sums over the zero-padded
input, wrapped to int32, with the padding the reference derives from auto_pad) and, for
QLinearConv, the reference's float64 requantization; onnx.reference itself wherever it
accepts the input (its per-channel handling assumes 2-D convolutions: it expands w_scale /
w_zero_point to 4-D), onnxruntime CPU where it supports the input (ConvInteger: per-tensor
zero points only) and its float32 requantization cannot differ; ONNX's node test cases.
1-D, 2-D and 3-D, groups and depthwise, pads, strides, dilations, every auto_pad.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from support.conv_cases import conv_geometries
from support.gpu import assert_node_cases_every_variant, gpu_device, gpu_examples, skip_unless_ci
from support.models import value_info_of
from support.oracles import assert_bits
from onnx_quant.dtypes import element_type
from onnx_quant.errors import DeviceError, ExecutionError
from onnx_quant.oracles import widen_u8s8

#: ConvInteger's: direct reads x and w in place (no im2col pass)
VARIANTS = ("direct", "blocked", "tiled", "simple")
#: QLinearConv's: direct also requantizes in its one pass; blocked_epilogue requantizes in the
#: GEMM pass after im2col
QL_VARIANTS = VARIANTS + ("blocked_epilogue",)
QL_INPUTS = ["x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "B"]


# ----------------------------------------------------------------------------- models

def conv_model(op, feeds, attrs):
    if op == "QLinearConv":
        names = [n if n in feeds else "" for n in QL_INPUTS]
        out_type = helper.np_dtype_to_tensor_dtype(feeds["y_zero_point"].dtype)
    else:
        names = [n if n in feeds else "" for n in ("x", "w", "x_zero_point", "w_zero_point")]
        out_type = TensorProto.INT32
    while names[-1] == "":
        names.pop()
    inputs = [value_info_of(n, feeds[n]) for n in names if n]
    out = helper.make_tensor_value_info("y", out_type, None)
    node = helper.make_node(op, names, ["y"], name="conv", **attrs)
    graph = helper.make_graph([node], "g", inputs, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])


def run_gpu(dev, model, feeds, variant=None, tunables=None):
    from onnx_quant.backend_wgpu.session import Session

    op = model.graph.node[0].op_type
    with Session(model, device=dev, variants={op: variant} if variant else None, tunables=tunables) as s:
        out = s.run(None, feeds)[0]
        plan = s.plans({k: v.shape for k, v in feeds.items()})[0]
    return out, plan


# ----------------------------------------------------------------------------- oracles

def _wrap32(x):
    return ((x.astype(np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)


def conv_geometry(x_shape, w_shape, attrs):
    """(pads_begin, pads_end, strides, dilations) as onnx.reference resolves auto_pad."""
    n = len(x_shape) - 2
    strides = list(attrs.get("strides") or [1] * n)
    dil = list(attrs.get("dilations") or [1] * n)
    pads = list(attrs.get("pads") or [0] * (2 * n))
    auto = attrs.get("auto_pad", "NOTSET")
    ek = [(w_shape[2 + i] - 1) * dil[i] + 1 for i in range(n)]
    if auto == "VALID":
        pads = [0] * (2 * n)
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        head, tail = [], []
        for i in range(n):
            d = x_shape[2 + i]
            target = (d + strides[i] - 1) // strides[i]
            need = max(0, (target - 1) * strides[i] + ek[i] - d)
            h = (need + 1) // 2 if auto == "SAME_LOWER" else need // 2
            head.append(h)
            tail.append(need - h)
        pads = head + tail
    return pads[:n], pads[n:], strides, dil


def np_conv_integer(x, w, xzp, wzp, attrs):
    """Exact integer convolution of (x - x_zp) and (w - w_zp[m]) wrapped to int32."""
    n = x.ndim - 2
    group = attrs.get("group", 1)
    pb, pe, strides, dil = conv_geometry(x.shape, w.shape, attrs)
    X = x.astype(np.int64) - np.asarray(xzp).astype(np.int64).reshape(())
    wz = np.asarray(wzp).astype(np.int64)
    W = w.astype(np.int64) - (wz.reshape((-1,) + (1,) * (w.ndim - 1)) if wz.size > 1 else wz.reshape(()))
    Xp = np.pad(X, [(0, 0), (0, 0)] + list(zip(pb, pe)))
    out = [(Xp.shape[2 + i] - ((w.shape[2 + i] - 1) * dil[i] + 1)) // strides[i] + 1 for i in range(n)]
    N, M, Cg = x.shape[0], w.shape[0], w.shape[1]
    Mg = M // group
    Y = np.zeros((N, M, *out), np.int64)
    for kk in itertools.product(*[range(k) for k in w.shape[2:]]):
        sl = tuple(slice(kk[i] * dil[i], kk[i] * dil[i] + (out[i] - 1) * strides[i] + 1, strides[i]) for i in range(n))
        Xs = Xp[(slice(None), slice(None)) + sl]
        for g in range(group):
            Wg = W[(slice(g * Mg, (g + 1) * Mg), slice(None)) + tuple(kk)]
            Y[:, g * Mg:(g + 1) * Mg] += np.einsum("nc...,mc->nm...", Xs[:, g * Cg:(g + 1) * Cg], Wg)
    return _wrap32(Y)


def np_qlinear_conv(f, attrs, float32_requant=False):
    acc = np_conv_integer(f["x"], f["w"], f["x_zero_point"], f["w_zero_point"], attrs)
    shape_c = (1, -1) + (1,) * (acc.ndim - 2)
    if "B" in f:
        acc = _wrap32(acc.astype(np.int64) + f["B"].astype(np.int64).reshape(shape_c))
    m = (f["x_scale"] * f["w_scale"] / f["y_scale"]).astype(np.float32)
    m = m.reshape(shape_c) if m.size > 1 else m.reshape(())
    yzp = f["y_zero_point"]
    info = np.iinfo(yzp.dtype)
    with np.errstate(all="ignore"):
        if float32_requant:  # onnxruntime: clip(rint(f32(f32(acc) * m)) + y_zp)
            r = np.rint((acc.astype(np.float32) * m).astype(np.float32)).astype(np.float64) + np.float64(yzp.reshape(()))
        else:  # onnx.reference: clip(rint(float64(acc) * m + y_zp))
            r = np.rint(acc.astype(np.float64) * m.astype(np.float64) + np.float64(yzp.reshape(())))
    return np.clip(r, info.min, info.max).astype(yzp.dtype)


def reference_outputs(model, feeds):
    from onnx.reference import ReferenceEvaluator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(None, feeds)[0]


def reference_accepts(f, nsp):
    """onnx.reference expands per-channel w parameters to 4-D: right only for 2-D convolutions."""
    per_channel = any(np.asarray(f.get(n, 0)).size > 1 for n in ("w_scale", "w_zero_point"))
    return nsp == 2 or not per_channel


# ----------------------------------------------------------------------------- data

def _q(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape, dtype=dtype)


@st.composite
def conv_case(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    geo = draw(conv_geometries())
    m, attrs, nsp = geo.m, geo.attrs, geo.nsp
    tx, tw, ty = (np.dtype(draw(st.sampled_from([np.int8, np.uint8]))) for _ in range(3))
    per_channel = draw(st.booleans())
    ps = (m,) if per_channel else draw(st.sampled_from([(), (1,)]))
    x = _q(rng, tx, geo.x_shape)
    w = _q(rng, tw, geo.w_shape)
    f = {"x": x, "x_scale": np.array(rng.uniform(0.01, 0.05), np.float32), "x_zero_point": _q(rng, tx, ()),
         "w": w, "w_scale": rng.uniform(0.002, 0.02, ps).astype(np.float32), "w_zero_point": _q(rng, tw, ps),
         "y_scale": np.array(rng.uniform(0.05, 0.5), np.float32), "y_zero_point": _q(rng, ty, ())}
    if draw(st.booleans()):
        f["B"] = rng.integers(-5000, 5000, m).astype(np.int32)
    return f, attrs, nsp


# ----------------------------------------------------------------------------- QLinearConv

@settings(max_examples=gpu_examples())
@given(case=conv_case())
def test_qlinear_conv_every_variant(best, case):
    """1-D/2-D/3-D x groups/depthwise x pads/strides/dilations/auto_pad x per-channel x bias x
    dtypes: every variant forced equals the numpy oracle (and onnx.reference where it applies)."""
    f, attrs, nsp = case
    model = conv_model("QLinearConv", f, attrs)
    expected = np_qlinear_conv(f, attrs)
    if reference_accepts(f, nsp):
        assert_bits(expected, reference_outputs(model, f), "numpy oracle vs onnx.reference")
    for v in QL_VARIANTS:
        got, plan = run_gpu(best, model, f, v)
        assert plan.variant == v
        assert_bits(got, expected, f"{attrs} variant {v}")


@settings(max_examples=gpu_examples())
@given(case=conv_case(), x_zp=st.booleans(), w_zp=st.booleans())
def test_conv_integer_every_variant(best, case, x_zp, w_zp):
    """ConvInteger with and without each optional zero point (w per-tensor or per-channel)."""
    f, attrs, nsp = case
    feeds = {"x": f["x"], "w": f["w"]}
    if x_zp:
        feeds["x_zero_point"] = f["x_zero_point"]
    if w_zp:
        feeds["w_zero_point"] = f["w_zero_point"]
    model = conv_model("ConvInteger", feeds, attrs)
    expected = np_conv_integer(feeds["x"], feeds["w"], feeds.get("x_zero_point", 0), feeds.get("w_zero_point", 0), attrs)
    if reference_accepts(feeds, nsp) and nsp == 2:
        assert_bits(expected, reference_outputs(model, feeds), "numpy oracle vs onnx.reference")
    for v in VARIANTS:
        got, plan = run_gpu(best, model, feeds, v)
        assert plan.variant == v
        assert_bits(got, expected, f"{attrs} variant {v}")


def test_conv_adapters_and_natural_choice(dev):
    """Vulkan and OpenGL (WebGPU default limits): 'direct' (one pass) is chosen; every variant agrees on
    a grouped, strided, padded 2-D case with per-channel weights and a bias."""
    rng = np.random.default_rng(4)
    f = {"x": _q(rng, np.uint8, (2, 4, 9, 8)), "x_scale": np.array(0.02, np.float32), "x_zero_point": np.array(120, np.uint8),
         "w": _q(rng, np.int8, (6, 2, 3, 3)), "w_scale": rng.uniform(0.002, 0.01, 6).astype(np.float32),
         "w_zero_point": _q(rng, np.int8, (6,)), "y_scale": np.array(0.25, np.float32), "y_zero_point": np.array(-3, np.int8),
         "B": rng.integers(-3000, 3000, 6).astype(np.int32)}
    attrs = {"group": 2, "pads": [1, 0, 2, 1], "strides": [2, 1]}
    model = conv_model("QLinearConv", f, attrs)
    expected = np_qlinear_conv(f, attrs)
    assert_bits(expected, reference_outputs(model, f), "oracle vs reference")
    got, plan = run_gpu(dev, model, f)
    assert plan.variant == "direct"
    assert_bits(got, expected, "natural")
    for v in QL_VARIANTS:
        assert_bits(run_gpu(dev, model, f, v)[0], expected, v)


def test_qlinear_conv_exact_ties(best):
    """x_scale * w_scale / y_scale = 1/2: every odd sum is an exact tie; half to even, as the
    reference's np.round does; with and without bias, uint8 and int8 outputs."""
    rng = np.random.default_rng(9)
    x = _q(rng, np.int8, (1, 3, 6, 6))
    w = _q(rng, np.int8, (4, 3, 2, 2))
    for ydt, yzp in ((np.uint8, 128), (np.uint8, 3), (np.int8, 0), (np.int8, -7)):
        f = {"x": x, "x_scale": np.array(0.5, np.float32), "x_zero_point": np.array(0, np.int8),
             "w": w, "w_scale": np.array(0.25, np.float32), "w_zero_point": np.array(0, np.int8),
             "y_scale": np.array(0.0625, np.float32) * np.float32(4), "y_zero_point": np.array(yzp, ydt),
             "B": np.array([1, -2, 3, 0], np.int32)}
        attrs = {"pads": [1, 1, 0, 0]}
        model = conv_model("QLinearConv", f, attrs)
        expected = reference_outputs(model, f)
        acc = np_conv_integer(x, w, 0, 0, attrs) + f["B"].reshape(1, -1, 1, 1)
        assert np.sum(acc % 2 != 0) > 20  # ties present
        assert_bits(np_qlinear_conv(f, attrs), expected, "oracle")
        for v in QL_VARIANTS:
            assert_bits(run_gpu(best, model, f, v)[0], expected, f"{ydt.__name__} zp={yzp} {v}")


def test_onnxruntime_agrees_where_float32_does(best):
    """onnxruntime (per-channel QLinearConv in 1-D, 2-D and 3-D) computes the requantization in
    float32: where that equals the float64 result it matches us bit for bit, and where it
    does not, it matches the float32 formula (docs/benchmarks.md, "QLinearMatMul / QLinearConv")."""
    import onnxruntime as ort
    rng = np.random.default_rng(12)
    for xs, ws, attrs in (((1, 3, 11), (4, 3, 3), {"pads": [1, 1]}),
                          ((1, 4, 7, 6), (6, 2, 3, 3), {"group": 2, "strides": [2, 1], "pads": [1, 1, 1, 1]}),
                          ((1, 2, 4, 5, 3), (3, 2, 2, 2, 2), {"auto_pad": "SAME_UPPER"})):
        f = {"x": _q(rng, np.uint8, xs), "x_scale": np.array(0.0173, np.float32), "x_zero_point": np.array(77, np.uint8),
             "w": _q(rng, np.int8, ws), "w_scale": rng.uniform(0.002, 0.02, ws[0]).astype(np.float32),
             "w_zero_point": np.zeros(ws[0], np.int8), "y_scale": np.array(0.113, np.float32),
             "y_zero_point": np.array(128, np.uint8), "B": rng.integers(-2000, 2000, ws[0]).astype(np.int32)}
        model = conv_model("QLinearConv", f, attrs)
        expected = np_qlinear_conv(f, attrs)
        assert_bits(run_gpu(best, model, f)[0], expected, f"gpu {xs}")
        # its weights widened to uint8 (oracles.py): exact sums on any CPU, the same requantization
        sess = ort.InferenceSession(widen_u8s8(model).model.SerializeToString(), providers=["CPUExecutionProvider"])
        got = sess.run(None, f)[0]
        assert_bits(got, np_qlinear_conv(f, attrs, float32_requant=True), f"onnxruntime {xs}")


# ----------------------------------------------------------------------------- conformance

def test_onnx_node_cases(best):
    """ONNX's node test cases for QLinearConv and ConvInteger pass with every variant."""
    assert assert_node_cases_every_variant(best, {"QLinearConv"}, QL_VARIANTS) >= 1
    assert assert_node_cases_every_variant(best, {"ConvInteger"}, VARIANTS) >= 1


# ----------------------------------------------------------------------------- limits and errors

@pytest.mark.gpu
def test_large_kernel_loops_and_split_grids():
    """A 5x5x2 kernel (more than 32 taps: the blocked variant loops instead of unrolling) on a
    device whose maxComputeWorkgroupsPerDimension is 16, so grids split over x and y."""
    from onnx_quant.backend_wgpu.device import get_device

    try:
        small = get_device(None, limits={"maxComputeWorkgroupsPerDimension": 16})
    except DeviceError as e:
        skip_unless_ci(f"cannot lower the limit here: {e}")
    rng = np.random.default_rng(6)
    f = {"x": _q(rng, np.int8, (2, 2, 7, 8, 3)), "x_scale": np.array(0.03, np.float32), "x_zero_point": np.array(-4, np.int8),
         "w": _q(rng, np.uint8, (5, 2, 5, 5, 2)), "w_scale": np.array(0.004, np.float32), "w_zero_point": np.array(130, np.uint8),
         "y_scale": np.array(0.8, np.float32), "y_zero_point": np.array(10, np.uint8)}
    attrs = {"pads": [2, 2, 0, 2, 2, 1]}
    model = conv_model("QLinearConv", f, attrs)
    expected = np_qlinear_conv(f, attrs)
    tun = {"WG_ROWS": 2, "WG_COLS": 2, "CHANNELS_PER_THREAD": 2, "POSITION_QUADS_PER_THREAD": 1,
           "TILE_WG_ROWS": 2, "TILE_WG_COLS": 4, "TILE_CHANNELS_PER_THREAD": 2, "TILE_POSITION_QUADS_PER_THREAD": 1,
           "SIMPLE_WORKGROUP_SIZE": 16}
    for v in QL_VARIANTS:
        got, plan = run_gpu(small, model, f, v, tunables=tun)
        assert any(p.dispatch[1] > 1 for p in plan.passes), (v, [p.dispatch for p in plan.passes])
        assert_bits(got, expected, v)


def _plan(feeds, attrs, op="QLinearConv", y_shape=None, **kw):
    from onnx_quant.backend_wgpu.device_info import DeviceInfo
    from onnx_quant.backend_wgpu.planner import plan_node
    from onnx_quant.backend_wgpu.spec import load_specs

    spec = load_specs().find("", op, 10)
    shapes = {n: v.shape for n, v in feeds.items()}
    shapes["y"] = y_shape
    dtypes = {n: element_type(v.dtype).name for n, v in feeds.items()}
    dtypes["y"] = dtypes.get("y_zero_point", "int32")
    return plan_node(spec, shapes=shapes, dtypes=dtypes, device=DeviceInfo(), attributes=attrs, node_label="conv", **kw)


def _feeds():
    rng = np.random.default_rng(0)
    return {"x": _q(rng, np.uint8, (1, 4, 6, 6)), "x_scale": np.array(0.1, np.float32), "x_zero_point": np.array(1, np.uint8),
            "w": _q(rng, np.uint8, (4, 2, 3, 3)), "w_scale": np.array(0.1, np.float32), "w_zero_point": np.array(1, np.uint8),
            "y_scale": np.array(0.1, np.float32), "y_zero_point": np.array(1, np.uint8)}


def test_geometry_is_derived_from_attributes():
    """pads resolved from auto_pad in the spec's derive (as onnx.reference does), defaults for
    absent attributes, and the selection: direct by default, tiled first with PREFER_TILED."""
    plan = _plan(_feeds(), {"group": 2, "auto_pad": "SAME_LOWER", "strides": [2, 1]}, y_shape=(1, 4, 3, 6))
    d = plan.derived
    assert plan.variant == "direct"
    pb, pe, _, _ = conv_geometry((1, 4, 6, 6), (4, 2, 3, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 1]})
    assert [d["pb0"], d["pb1"], d["pe0"], d["pe1"]] == pb + pe
    assert (d["Kc"], d["P"], d["Mg"]) == (18, 18, 2)
    assert _plan(_feeds(), {"group": 2}, y_shape=(1, 4, 4, 4), tunables={"PREFER_TILED": 1}).variant == "tiled"
    assert [p.id for p in plan.passes] == ["params", "main"]
    # beyond DIRECT_MAX_MACS multiply-adds the im2col form, requantizing in its GEMM pass
    big = _plan(_feeds(), {"group": 2}, y_shape=(1, 4, 4, 4), tunables={"DIRECT_MAX_MACS": 4 * 16 * 18 - 1})
    assert big.variant == "blocked_epilogue" and big.selection["direct"].endswith("DIRECT_MAX_MACS")
    assert [p.id for p in big.passes] == ["params", "im2col", "gemm"]
    assert _plan(_feeds(), {"group": 2}, y_shape=(1, 4, 4, 4), tunables={"DIRECT_MAX_MACS": 4 * 16 * 18}).variant == "direct"


@pytest.mark.parametrize("attrs,y_shape,clause", [
    ({"group": 3}, (1, 4, 4, 4), "convShapesAgree"),
    ({"group": 2, "pads": [1, 1, 1]}, (1, 4, 4, 4), "attributesValid"),
    ({"group": 2, "dilations": [1]}, (1, 4, 4, 4), "attributesValid"),
    ({"group": 2, "strides": [1, 1, 1]}, (1, 4, 4, 4), "attributesValid"),
    ({"group": 2, "strides": [0, 1]}, (1, 4, 4, 4), "attributesValid"),
    ({"group": 2, "auto_pad": "SAME"}, (1, 4, 4, 4), "attributesValid"),
    ({"group": 2, "kernel_shape": [3, 2]}, (1, 4, 4, 4), "attributesValid"),
    ({"group": 2}, (1, 4, 5, 4), "outputShapeIsConvOf"),
])
def test_bad_attributes_and_shapes_are_refused(attrs, y_shape, clause):
    """Invalid attributes or shapes are a QuantError naming the node (no GPU work, no crash)."""
    from onnx_quant.errors import QuantError

    with pytest.raises(QuantError, match="conv") as info:
        _plan(_feeds(), attrs, y_shape=y_shape)
    if clause:
        assert isinstance(info.value, ExecutionError) and clause in str(info.value)


def test_unknown_attribute_is_refused():
    with pytest.raises(ExecutionError, match="conv.*'foo'"):
        _plan(_feeds(), {"group": 2, "foo": 1}, y_shape=(1, 4, 4, 4))

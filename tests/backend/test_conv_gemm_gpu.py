"""Float Conv / FusedConv's GEMM variants (templates/conv.base.json, conv-gemm.wgsl.jinja):
implicit_gemm and im2col_gemm forced through a Session over hypothesis geometries (1-D/2-D/3-D,
groups and depthwise, strides, dilations, pads and auto_pad, with and without bias, with a fused
activation or a folded BatchNormalization) agree bit for bit with the direct kernel and lie within
the float32 sum bound of onnx.reference's float64 convolution; the variant is chosen by size
(direct below TILED_MIN_MACS, implicit up to DIRECT_MAX_MACS, im2col above), and a spatial rank
the geometry does not cover (4-D) declines both GEMM variants, so direct runs; a second batch
size compiles nothing new (test_polymorphic_conv / _spatial run the variants at two shapes)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from onnx_quant.errors import ExecutionError
from support.conv_cases import conv_geometries
from support.gpu import gpu_examples
from support.models import conv_bn_model, make_model, node_model, vi
from support.oracles import assert_same_bits, ref_run
from support.run import plan_for, session_run

F32 = np.float32
EPS = 2.0 ** -24
GEMM_VARIANTS = ("implicit_gemm", "im2col_gemm")
#: the fused activations: (ONNX nodes after the Conv's output "c", numpy of the exact value)
ACTIVATIONS = {
    "none": ([], lambda v: v),
    "Relu": ([helper.make_node("Relu", ["c"], ["y"])], lambda v: np.maximum(v, 0)),
    "LeakyRelu": ([helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.1)], lambda v: np.where(v < 0, 0.1 * v, v)),
    "SiLU": ([helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])],
             lambda v: v / (1 + np.exp(-v))),
}

pytestmark = pytest.mark.devices("best")


def conv_with(activation: str, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict):
    """Conv (w and b initializers) [-> activation], input x; the graph compiler fuses the
    activation into one FusedConv node."""
    post, _ = ACTIVATIONS[activation]
    inputs = ["x", "w"] + (["b"] if b is not None else [])
    conv = helper.make_node("Conv", inputs, ["c" if post else "y"], **attrs)
    inits = {"w": w, **({"b": b} if b is not None else {})}
    return make_model([conv, *post], [vi("x", TensorProto.FLOAT, list(x.shape))], [vi("y", TensorProto.FLOAT, None)],
                      inits)


def oracle(x, w, b, attrs, activation):
    """onnx.reference's Conv in float64, activation applied; and the magnitude sum |x| |w| + |b|."""
    def conv64(xv, wv, bv):
        ins = [("X", xv), ("W", wv)] + ([("B", bv)] if bv is not None else [])
        return ref_run(node_model("Conv", ins, ["Y"], attrs=attrs), dict(ins))[0]

    f64 = lambda a: None if a is None else a.astype(np.float64)  # noqa: E731
    exact = conv64(f64(x), f64(w), f64(b))
    mag = conv64(np.abs(f64(x)), np.abs(f64(w)), None if b is None else np.abs(f64(b)))
    return ACTIVATIONS[activation][1](exact), mag


def assert_within_sum_bound(got, exact, mag, n_terms, what):
    """|got - exact| <= (n + 2) 2^-24 sum |terms| (the sum in any order), 1.2 x for the
    activations' slopes, plus a few ulp of the result for their exp."""
    bound = 1.2 * (n_terms + 2) * EPS * mag + 8 * EPS * np.abs(exact) + 1e-30
    assert got.shape == exact.shape, (what, got.shape, exact.shape)
    err = np.abs(got.astype(np.float64) - exact)
    assert np.all(err <= bound), f"{what}: worst error / bound {(err / bound).max()}"


def forced(model, feeds, kernel, variant, dev):
    return session_run(dev, model, feeds, variants={kernel: variant}, tunables={kernel: {"TILED_MIN_MACS": 0}})[0]


@settings(max_examples=gpu_examples())
@given(geo=conv_geometries(), bias=st.booleans(), activation=st.sampled_from(sorted(ACTIVATIONS)),
       seed=st.integers(0, 2**31))
def test_gemm_variants_match_direct_and_the_reference(best, geo, bias, activation, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(geo.x_shape).astype(F32)
    w = rng.standard_normal(geo.w_shape).astype(F32)
    b = rng.standard_normal(geo.m).astype(F32) if bias else None
    model = conv_with(activation, x, w, b, geo.attrs)
    kernel = "Conv" if activation == "none" else "FusedConv"
    direct = forced(model, {"x": x}, kernel, "direct", best)
    exact, mag = oracle(x, w, b, geo.attrs, activation)
    assert_within_sum_bound(direct, exact, mag, geo.cg * int(np.prod(geo.k)), f"direct {geo}")
    for v in GEMM_VARIANTS:
        assert_same_bits(forced(model, {"x": x}, kernel, v, best), direct, f"{v} vs direct, {geo} {activation}")


@pytest.mark.parametrize("variant", GEMM_VARIANTS)
def test_folded_batch_norm_and_relu_through_the_gemm(best, variant):
    """Conv -> BatchNormalization -> Relu: BN folds into the Conv's w and bias, Relu fuses: one
    FusedConv node, forced to the GEMM variant, within float rounding of onnx.reference."""
    model = conv_bn_model(relu=True)
    x = np.random.default_rng(3).standard_normal((1, 3, 6, 6)).astype(F32)
    got = forced(model, {"x": x}, "FusedConv", variant, best)
    np.testing.assert_allclose(got, ref_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert_same_bits(got, forced(model, {"x": x}, "FusedConv", "direct", best), f"{variant} vs direct")


def _plan(dev, xs, ws, attrs=None, **kw):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs).astype(F32), rng.standard_normal(ws).astype(F32)
    model = node_model("Conv", [("x", x), ("w", w)], ["y"], attrs=attrs or {})
    return plan_for(dev, model, {"x": x, "w": w}, **kw)[1]


@pytest.mark.parametrize("xs, ws, attrs, variant", [
    ((1, 3, 8, 8), (8, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "direct_oc4"),     # 13,824 multiply-adds
    ((1, 3, 8, 8), (6, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "direct"),         # 6 channels: no oc4
    ((1, 8, 160, 160), (16, 8, 1, 1), {}, "implicit_gemm"),                 # the YOLO head's 1x1, 3.3 M
    ((1, 32, 56, 56), (64, 32, 3, 3), {"pads": [1, 1, 1, 1]}, "im2col_gemm"),  # 57.8 M
    ((1, 16, 512), (16, 16, 3), {}, "implicit_gemm"),                       # 1-D, 0.39 M
    ((1, 4, 9, 9, 9), (8, 4, 3, 3, 3), {}, "implicit_gemm"),                # 3-D, 0.37 M
])
def test_the_variant_is_chosen_by_size(best, xs, ws, attrs, variant):
    assert _plan(best, xs, ws, attrs).variant == variant


def test_a_4d_convolution_declines_the_gemm_variants(best):
    """The geometry has three spatial axes: a 4-D convolution runs direct; forcing a GEMM
    variant on it is refused (no silently wrong value)."""
    xs, ws = (1, 2, 3, 3, 3, 4), (4, 2, 2, 2, 2, 2)
    assert _plan(best, xs, ws, tunables={"TILED_MIN_MACS": 0}).variant in ("direct", "direct_oc4")
    for v in GEMM_VARIANTS:
        with pytest.raises(ExecutionError, match="cannot force this variant"):
            _plan(best, xs, ws, variant=v, tunables={"TILED_MIN_MACS": 0})

"""RMSNormalization-23, InstanceNormalization, GroupNormalization-21 (LayerNormalization's
template and snippet), BatchNormalization's inference form, LpNormalization and
MeanVarianceNormalization on the GPU.

- ONNX's node cases of these ops pass with no host fallback under every variant, or are named in
  DECLINED with the clause that declines them;
- random nodes against a float64 reference within the bound LayerNormalization's tests use for
  one fixed-order two-pass row reduction, 2^-24 (16 + D / 16) |scale| (|x| + |mean|) / sd
  (tests/backend/test_model_kernels_gpu.py), and within ONNX's rule of onnx.reference /
  onnxruntime; the serial and workgroup variants give the same bits.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from support.gpu import assert_node_cases_pass_or_declined, run_every_variant
from support.models import value_info_of

f32 = np.float32
OPS = ("RMSNormalization", "InstanceNormalization", "GroupNormalization", "BatchNormalization", "LpNormalization",
       "MeanVarianceNormalization")
DECLINED = {"test_batchnorm_example_training_mode": "'inferenceOnly' is false",
            "test_batchnorm_epsilon_training_mode": "'inferenceOnly' is false"}


def test_onnx_node_cases_pass_under_every_variant_or_are_declined_by_name(best):
    from onnx_quant.backend_wgpu.conformance import compare_outputs

    def every_variant(case, feeds, expected, names):
        got, _ = run_every_variant(best, case.model, feeds, case.model.graph.node[0].op_type)
        cmp = compare_outputs(got, expected, names)
        assert cmp.passed, (case.name, cmp.detail)

    assert_node_cases_pass_or_declined(best, OPS, DECLINED, 32, expanded=False, check=every_variant)


def _model(op, opset, x, params, attrs, outputs=("Y",)):
    node = helper.make_node(op, ["X", *params], list(outputs), name=op, **attrs)
    graph = helper.make_graph([node], "g", [value_info_of("X", x)],
                              [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
                               for o in outputs],
                              initializer=[numpy_helper.from_array(v, k) for k, v in params.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _row_bound(x64, scale, rows_axes, mean64, sd64):
    """The LayerNormalization bound: 2^-24 (16 + D / 16) |scale| (|x| + |mean|) / sd."""
    D = int(np.prod([x64.shape[a] for a in rows_axes]))
    return 2.0**-24 * (16 + D / 16) * np.abs(scale) * (np.abs(x64) + np.abs(mean64)) / sd64


# ----------------------------------------------------------------------------- RMSNormalization

@pytest.mark.parametrize("shape, axis, wshape, eps", [
    ((4, 16), -1, None, None),
    ((2, 3, 10), 1, None, 1e-3),
    ((3, 4, 5), 1, (5,), None),       # scale over the trailing normalised dim only
    ((2, 300), -1, None, None),       # beyond the serial bound: workgroup only
    ((6, 7), 0, (1,), 1e-2),          # one row, one scale
])
def test_rms_normalization_within_bound(best, shape, axis, wshape, eps):
    rng = np.random.default_rng(len(shape) * 100 + shape[-1])
    x = (rng.normal(0, 2, shape) + rng.normal(0, 3)).astype(f32)
    norm = shape[axis % len(shape):]
    w = rng.normal(1, 0.5, wshape or norm).astype(f32)
    attrs = {"axis": axis} | ({} if eps is None else {"epsilon": eps})
    model = _model("RMSNormalization", 23, x, {"W": w}, attrs)
    (got,), ids = run_every_variant(best, model, {"X": x}, "RMSNormalization")
    assert ids == (["workgroup"] if int(np.prod(norm)) > 256 else ["workgroup", "serial"])
    axes = tuple(range(axis % len(shape), len(shape)))
    x64 = x.astype(np.float64)
    sd = np.sqrt((x64**2).mean(axis=axes, keepdims=True) + float(f32(eps if eps is not None else 1e-5)))
    ref = x64 / sd * w
    assert np.all(np.abs(got - ref) <= _row_bound(x64, w, axes, 0.0, sd))
    expected = ReferenceEvaluator(model).run(None, {"X": x})[0]
    assert np.allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_rms_normalization_declines_other_stash_types(best):
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import QuantError

    x = np.ones((2, 4), f32)
    model = _model("RMSNormalization", 23, x, {"W": np.ones(4, f32)}, {"stash_type": 0})
    with pytest.raises(QuantError, match="stash_type"):
        with Session(model, device=best, allow_host_fallback=False) as s:
            s.run(None, {"X": x})


# ----------------------------------------------------------------------------- Instance, Group

@pytest.mark.parametrize("op, opset, shape, groups", [
    ("InstanceNormalization", 6, (2, 3, 4, 5), None),
    ("InstanceNormalization", 22, (1, 4, 300), None),   # workgroup only
    ("InstanceNormalization", 22, (3, 2), None),        # no spatial dims: y = B
    ("GroupNormalization", 21, (2, 6, 3, 3), 3),
    ("GroupNormalization", 21, (2, 4, 5), 1),           # one group: LayerNormalization over C x spatial
    ("GroupNormalization", 18, (2, 6, 3, 3), 3),        # scale and bias per group
])
def test_channel_normalizations_within_bound(best, op, opset, shape, groups):
    rng = np.random.default_rng(shape[1] * 7 + len(shape))
    x = (rng.normal(0, 2, shape) + 1.5).astype(f32)
    C = shape[1]
    n_affine = groups if op == "GroupNormalization" and opset < 21 else C
    scale, bias = rng.normal(1, 0.5, n_affine).astype(f32), rng.normal(0, 0.5, n_affine).astype(f32)
    attrs = {} if groups is None else {"num_groups": groups}
    model = _model(op, opset, x, {"scale": scale, "B": bias}, attrs)
    (got,), _ = run_every_variant(best, model, {"X": x}, op)
    G = C if groups is None else groups
    x64 = x.astype(np.float64).reshape(shape[0], G, -1)
    mean = x64.mean(axis=2, keepdims=True)
    sd = np.sqrt(((x64 - mean) ** 2).mean(axis=2, keepdims=True) + float(f32(1e-5)))
    chan = (C,) + (1,) * (len(shape) - 2)
    s64, b64 = (np.repeat(v.astype(np.float64), C // n_affine).reshape(chan) for v in (scale, bias))
    ref = ((x64 - mean) / sd).reshape(shape) * s64 + b64
    mag = (np.abs(s64) * ((np.abs(x64) + np.abs(mean)) / sd).reshape(shape)) + np.abs(b64)
    assert np.all(np.abs(got - ref) <= 2.0**-24 * (16 + x64.shape[2] / 16) * mag)
    expected = ReferenceEvaluator(model).run(None, {"X": x})[0]
    assert np.allclose(got, expected, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- BatchNormalization

def _bn_params(rng, C, dt):
    return {"scale": rng.uniform(0.5, 2, C).astype(dt), "B": rng.normal(0, 1, C).astype(dt),
            "mean": rng.normal(0, 1, C).astype(dt), "var": rng.uniform(0.5, 3, C).astype(dt)}


@pytest.mark.parametrize("opset, attrs", [(6, {"is_test": 1}), (7, {}), (9, {"momentum": 0.5}), (14, {}),
                                          (15, {"epsilon": 1e-3})])
def test_batch_normalization_inference_matches_onnxruntime(best, opset, attrs):
    rng = np.random.default_rng(opset)
    x = (rng.normal(0, 2, (2, 3, 4, 5)) + 1).astype(f32)
    params = _bn_params(rng, 3, f32)
    model = _model("BatchNormalization", opset, x, params, attrs)
    model.ir_version = 7
    (got,), _ = run_every_variant(best, model, {"X": x}, "BatchNormalization")
    p = {k: v.astype(np.float64)[None, :, None, None] for k, v in params.items()}
    eps = float(f32(attrs.get("epsilon", 1e-5)))
    ref = p["scale"] * (x - p["mean"]) / np.sqrt(p["var"] + eps) + p["B"]
    assert np.allclose(got, ref, rtol=2.0**-21, atol=2.0**-21 * np.abs(ref).max())
    if opset >= 7:  # onnxruntime has no BatchNormalization-6 kernel
        expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"X": x})[0]
        assert np.allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_batch_normalization_float16_meets_onnx_rule_against_onnx_reference(best):
    rng = np.random.default_rng(16)
    x = rng.normal(0, 2, (2, 4, 3, 3)).astype(np.float16)
    model = _model("BatchNormalization", 15, x, _bn_params(rng, 4, np.float16), {})
    (got,), _ = run_every_variant(best, model, {"X": x}, "BatchNormalization")
    expected = ReferenceEvaluator(model).run(None, {"X": x})[0]
    assert got.dtype == np.float16 and np.allclose(got, expected, rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize("opset, attrs, outputs", [(15, {"training_mode": 1}, ("Y", "rm", "rv")),
                                                   (9, {}, ("Y", "running_mean", "running_var")), (7, {"spatial": 0}, ("Y",))])
def test_batch_normalization_training_forms_are_declined(best, opset, attrs, outputs):
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import QuantError

    x = np.ones((2, 3, 2), f32)
    model = _model("BatchNormalization", opset, x, _bn_params(np.random.default_rng(0), 3, f32), attrs, outputs)
    model.ir_version = 7
    with pytest.raises(QuantError, match="inferenceOnly"):
        with Session(model, device=best, allow_host_fallback=False) as s:
            s.run(None, {"X": x})


# ----------------------------------------------------------------------------- LpNormalization

@pytest.mark.parametrize("dt", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("p, axis, shape", [(2, -1, (3, 7)), (1, 0, (5, 4)), (2, 1, (2, 6, 3)), (1, -1, (4, 300))])
def test_lp_normalization(best, dt, p, axis, shape):
    """Against the definition in float64 (the L1 norm sums |x|) and, on inputs where its p = 1 sum
    of x is that norm (x >= 0), onnx.reference within ONNX's rule; zero rows give 0."""
    rng = np.random.default_rng(p * 10 + len(shape))
    x = rng.normal(0, 2, shape).astype(dt)
    x[0] = 0
    model = _model("LpNormalization", 22, x, {}, {"p": p, "axis": axis})
    (got,), _ = run_every_variant(best, model, {"X": x}, "LpNormalization")
    x64 = x.astype(np.float64)
    norm = (np.abs(x64) ** p).sum(axis=axis, keepdims=True) ** (1 / p)
    ref = np.divide(x64, norm, out=np.zeros_like(x64), where=norm != 0)
    # float32: n roundings of the sum, the root and the division; float16: the reference's steps
    # (2^-11 each) and float16's subnormal spacing (2^-24) near 0
    D = shape[axis]
    rtol, atol = (2.0**-24 * (D + 4), 1e-30) if dt == np.float32 else (2.0**-11 * 4, 2.0**-24)
    assert np.all(np.abs(got - ref) <= rtol * np.abs(ref) + atol) and np.all(got[0] == 0)
    xp = np.abs(x)
    (got_pos,), _ = run_every_variant(best, model, {"X": xp}, "LpNormalization")
    expected = ReferenceEvaluator(model).run(None, {"X": xp})[0]
    assert np.allclose(got_pos, expected, rtol=1e-3, atol=1e-7)


# ----------------------------------------------------------------------------- MeanVarianceNormalization

@pytest.mark.parametrize("opset, axes, shape", [(13, None, (2, 3, 4, 5)), (9, [1], (3, 5, 2)), (13, [0, 1], (4, 6)),
                                                (13, [-1, 0], (3, 2, 7))])
def test_mean_variance_normalization_meets_onnx_rule_against_onnx_reference(best, opset, axes, shape):
    """As the function body computes it (E[x^2] - E[x]^2, + 1e-9). Inputs of a moderate mean: the
    body's variance cancels as |mean| / sd grows."""
    rng = np.random.default_rng(len(shape) + opset)
    x = (rng.normal(0, 2, shape) + 0.5).astype(f32)
    model = _model("MeanVarianceNormalization", opset, x, {}, {} if axes is None else {"axes": axes})
    (got,), _ = run_every_variant(best, model, {"X": x}, "MeanVarianceNormalization")
    expected = ReferenceEvaluator(model).run(None, {"X": x})[0]
    assert got.dtype == expected.dtype and np.allclose(got, expected, rtol=1e-3, atol=1e-7)

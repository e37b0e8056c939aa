"""The conv family takes the batch size as a runtime uniform (issue #11; backend_wgpu/uniforms.py):
QLinearConv and ConvInteger (every variant), DynamicQuantizeConv (fused, two_pass),
ConvIntegerToFloat, float Conv and FusedConv (direct, direct_oc4, implicit_gemm, im2col_gemm) run at batch 1 then 3 from a
cold pipeline cache: the second batch compiles none of the kernel's pipelines, and both outputs
agree with the oracle (onnx.reference bit for bit for integer outputs; onnxruntime with its
optimizations off bit for bit for the dynamic-quantization units; onnx.reference within float
rounding for float Conv, whose sums run in another order) and the first image's output is the
same bits at both batch sizes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator
from support.gpu import runs_from_a_cold_cache
from support.models import (  # the conv family's models (test_polymorphic_spatial runs them too)
    conv_integer_model, dynamic_conv_unit as _dynamic_conv_unit, float_conv_model as _float_conv_model,
    qlinear_conv_model)
from support.oracles import onnxruntime_run

F32 = np.float32
BATCHES = (1, 3)


pytestmark = pytest.mark.devices("best")  # dev: the default adapter only (conftest's default adds OpenGL)


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


def _qlinear_conv_model():  # named as before: the test ids below carry the builder's name
    return qlinear_conv_model()


def _conv_integer_model():
    return conv_integer_model()


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


@pytest.mark.parametrize("kernel", ["Conv", "FusedConv"])
@pytest.mark.parametrize("variant", ["direct", "direct_oc4", "implicit_gemm", "im2col_gemm"])
def test_float_conv_compiles_once_for_two_batch_sizes(dev, kernel, variant):
    model = _float_conv_model(relu=kernel == "FusedConv")
    feeds = _batches(lambda rng, n: {"x": rng.standard_normal([n, 3, 6, 7]).astype(F32)})
    # the GEMM variants are chosen from TILED_MIN_MACS multiply-adds: this conv is smaller
    outs, compiled = _run_twice(dev, model, feeds, kernel, variant, tunables={kernel: {"TILED_MIN_MACS": 0}})
    assert not compiled[1] and compiled[0]  # Conv + Relu is one FusedConv node
    ref = ReferenceEvaluator(model)
    for got, f in zip(outs, feeds):
        want = ref.run(None, f)[0]
        assert got[0].shape == want.shape
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    _assert_same_first_image(outs)

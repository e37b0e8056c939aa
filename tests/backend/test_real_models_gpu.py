"""Real quantized models on the GPU against onnxruntime CPU, with no host fallback.

Float models come from ``onnx_quant.model_zoo`` (built with onnx.helper: a residual CNN with
symbolic N/H/W, an MLP with a symbolic batch, one pre-norm transformer block with symbolic
B/S), kept tiny; ``onnxruntime.quantization`` quantizes them in QOperator, QDQ and dynamic
format, with per-tensor and per-channel weights (18 models). Each runs through
``backend_wgpu.Session`` and through onnxruntime's CPU provider on the same inputs, at
shapes other than the calibration shapes.

Tolerances (what "agrees" means, and why). onnxruntime runs each model twice: with its
default graph optimizations, and with none (``ORT_DISABLE_ALL``: every node as its ONNX
definition says; for QDQ models DequantizeLinear -> float op -> QuantizeLinear literally,
which is what this backend runs, instead of the fused integer kernels onnxruntime substitutes).

- **Integer outputs**: within one quantization step of both (a requantization that lands on
  a rounding boundary may round either way between two correct implementations), and at most
  ``MAX_ONE_STEP_SHARE`` of the elements one step off unoptimized onnxruntime (measured: none);
  the same share bound holds for the per-tensor float outputs below.
- **Float outputs of a per-tensor DequantizeLinear** (QOperator and QDQ models end in one),
  measured in steps of its scale: within one step of unoptimized onnxruntime, and, element
  by element, within one step more than optimized onnxruntime differs from unoptimized
  onnxruntime. Reason: onnxruntime's QDQ fusion changes results by itself (measured here: 1
  step on the QDQ MLP, 2 steps on 5-6 % of the QDQ transformer's outputs), so "one step of
  optimized onnxruntime" would fail a backend that computes exactly what the graph says.
  (Measured when written: 0 steps from unoptimized onnxruntime on every model that runs.)
- **Other float outputs** (dynamic quantization: int32 accumulators rescaled in float,
  activations requantized at run time by DynamicQuantizeLinear): ``max|diff| <=
  DYNAMIC_RTOL * max|expected|`` with ``DYNAMIC_RTOL`` = 1e-4. Reason: the integer parts
  (DynamicQuantizeLinear, MatMulInteger, ConvInteger) are exact, the float rescaling and
  the float ops after it may round differently by a few ulps (onnxruntime fuses the rescale
  into MatMulIntegerToFloat); measured when written: at most 7.2e-7 on outputs of magnitude
  about 3 (2.4e-7 relative). A DynamicQuantizeLinear rounding the other way would move an
  activation by range/255, 40x this bound: such a difference is worth a look, not a pass.

QDQ models run here as written (``Session(fuse_qdq=False)``), the graph these tolerances hold
against unoptimized onnxruntime; with QDQ node-unit fusion (the default) they compute what
optimized onnxruntime computes, held bit for bit in tests/backend/test_qdq_fusion_gpu.py.

Every model must run without a single node on the host: a test fails naming the op types
that still fell back (or that have no kernel).
"""

from __future__ import annotations

import functools
import logging
import re
import warnings

import numpy as np
import pytest

from onnx_quant import model_zoo

DYNAMIC_RTOL = 1e-4
#: the share of an output's elements that may be one step off unoptimized onnxruntime (rounded
#: down: none on these small outputs). Measured: 0 on every model that is compared in steps.
#: Without it a one-step slack on every element would hide a systematic rounding bug (a tie
#: rounded up instead of to even moves many elements by exactly one step).
MAX_ONE_STEP_SHARE = 0.02

#: tiny models: (builder kwargs, run dims); the calibration dims are model_zoo.CALIBRATION_DIMS
MODELS = {
    "cnn": (dict(blocks=1, channels=4), {"N": 2, "H": 8, "W": 8}),
    "mlp": (dict(layers=2, features=16, hidden=16), {"N": 3}),
    "transformer": (dict(blocks=1, d_model=16, heads=2, ffn=32), {"B": 2, "S": 4}),
}
CASES = [(fam, fmt, pc) for fam in MODELS for fmt in model_zoo.FORMATS for pc in (False, True)]


def _ids(case):
    fam, fmt, pc = case
    return f"{fam}-{fmt}-{'per_channel' if pc else 'per_tensor'}"


@functools.lru_cache(maxsize=None)
def quantized_model(family: str, fmt: str, per_channel: bool):
    logging.getLogger().setLevel(logging.ERROR)  # the quantizer's "consider pre-processing" warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model_zoo.quantized(family, fmt, per_channel=per_channel, **MODELS[family][0])


def ort_run(model, feeds, *, optimize: bool = True):
    """onnxruntime's outputs with exact uint8 x int8 sums on any CPU (support.oracles.onnxruntime_run)."""
    from support.oracles import onnxruntime_run

    return onnxruntime_run(model, feeds, level="ORT_ENABLE_ALL" if optimize else "ORT_DISABLE_ALL")


def compare(model, name: str, got: np.ndarray, exp: np.ndarray, exp_noopt: np.ndarray) -> str:
    """Raise AssertionError beyond the module's tolerances; return a one-line summary.
    ``exp``: onnxruntime with its default optimizations, ``exp_noopt``: with none."""
    from onnx_quant.backend_wgpu.reporting import output_step

    for ref in (exp, exp_noopt):
        assert got.dtype == ref.dtype and got.shape == ref.shape, \
            f"{name}: {got.dtype}{list(got.shape)} vs onnxruntime {ref.dtype}{list(ref.shape)}"
    g, e, e0 = (a.astype(np.float64) for a in (got, exp, exp_noopt))
    diff, diff0, ort_self = np.abs(g - e), np.abs(g - e0), np.abs(e - e0)
    assert np.all(np.isfinite(diff)) and np.all(np.isfinite(diff0)), f"{name}: non-finite values or differences"
    if got.dtype.kind in "iu":
        worst = max(diff.max(initial=0), diff0.max(initial=0))
        assert worst <= 1, f"{name}: {worst:g} quantization steps off"
        _assert_few_one_step(name, diff0 > 0)
        return f"{name}: max {worst:g} steps"
    step = output_step(model, name)
    if step is not None:
        s, s0, s_self = diff / step, diff0 / step, ort_self / step
        eps = 1e-3  # the steps are float quotients
        assert s0.max(initial=0) <= 1 + eps, \
            f"{name}: {s0.max():.3g} steps of {step:.4g} from unoptimized onnxruntime"
        _assert_few_one_step(name, s0 > eps)
        beyond = s > s_self + 1 + eps
        assert not beyond.any(), \
            (f"{name}: {int(beyond.sum())} values more than one step (of {step:.4g}) further from optimized "
             f"onnxruntime than onnxruntime is from itself (max {s.max():.3g} steps vs {s_self.max():.3g})")
        return (f"{name}: {s0.max(initial=0):.3g} steps from unoptimized onnxruntime, {s.max(initial=0):.3g} "
                f"from optimized (which is {s_self.max(initial=0):.3g} from unoptimized); step {step:.4g}")
    ref = float(np.max(np.abs(e), initial=0.0))
    worst = max(diff.max(initial=0), diff0.max(initial=0))
    assert worst <= DYNAMIC_RTOL * ref + 1e-7, f"{name}: max |diff| {worst:.3g}, max |expected| {ref:.3g}"
    return f"{name}: max |diff| {worst:.3g} ({worst / max(ref, 1e-30):.2g} of max |expected| {ref:.3g})"


def _assert_few_one_step(name: str, off: np.ndarray) -> None:
    allowed = int(MAX_ONE_STEP_SHARE * off.size)
    assert int(off.sum()) <= allowed, \
        (f"{name}: {int(off.sum())} of {off.size} elements one step off unoptimized onnxruntime "
         f"(at most {allowed}: {MAX_ONE_STEP_SHARE:.0%})")


def run_on_gpu(model, device, feeds_list):
    """Outputs per feeds (one Session, so the same plans serve repeated shapes) and the
    op types of nodes that ran on the host (host fallback allowed only to report them)."""
    from onnx_quant.backend_wgpu.reporting import host_nodes, make_session
    from onnx_quant.errors import ExecutionError

    try:
        session = make_session(model, device=device, host_fallback=True, fuse_qdq=False)
    except ExecutionError as e:  # a Session without host fallback refuses ops with no kernel
        pytest.fail(f"cannot run on the GPU: {re.sub(r' [(]kernels: .*', '', str(e))}")
    try:
        outs = [session.run(None, feeds) for feeds in feeds_list]
        return outs, host_nodes(session), session.output_names
    finally:
        session.close()


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_quantized_model_matches_onnxruntime(case, best):
    family, fmt, per_channel = case
    model = quantized_model(family, fmt, per_channel)
    dims = MODELS[family][1]
    feeds_list = [model_zoo.random_feeds(model, dims, seed=11)]
    if family == "cnn":  # the symbolic batch and spatial dims: a second binding on the same session
        feeds_list.append(model_zoo.random_feeds(model, {**dims, "N": 1, "H": 12, "W": 10}, seed=12))
    outs, host, names = run_on_gpu(model, best, feeds_list)
    lines = []
    for feeds, got in zip(feeds_list, outs):
        expected, expected_noopt = ort_run(model, feeds), ort_run(model, feeds, optimize=False)
        for name, g, e, e0 in zip(names, got, expected, expected_noopt):
            lines.append(compare(model, name, np.asarray(g), np.asarray(e), np.asarray(e0)))
    print("; ".join(lines))
    assert not host, f"nodes ran on the host (no GPU kernel): {', '.join(host)}"

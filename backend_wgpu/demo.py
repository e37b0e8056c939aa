"""``onnx-quant demo``: build a small quantized CNN, infer it, run it on the GPU, compare.

1. **Build**: the model zoo's ResNet-like float CNN (``onnx_quant.model_zoo.cnn``: conv stem,
   max pool, one residual block, global average pool, flatten, gemm; symbolic ``N, H, W``)
   quantized by ``onnxruntime.quantization.quantize_static`` in QOperator format with
   per-channel int8 weights, uint8 activations and a two-sample calibration reader. The
   classifier's Gemm is left in float (quantizing it would give ``com.microsoft::QGemm``), so
   the graph is QuantizeLinear, QLinearConv (Relu fused), MaxPool on uint8, QLinearAdd,
   QLinearGlobalAveragePool, DequantizeLinear, Flatten, Gemm. Without onnxruntime the
   built-in example (``onnx_quant.examples.cnn_model``) is used instead.
2. **Infer**: the inference pass types every value of the symbolic model.
3. **Run** on the GPU (one warm-up run, then a timed run) and on the CPU reference
   (onnxruntime's CPU provider, or onnx's reference evaluator without onnxruntime). The
   oracle is chosen by ``onnx_quant.oracles.choose_oracle`` and named in the output: where
   this CPU's onnxruntime saturates uint8 x int8 sums (AVX2 without VNNI), onnxruntime runs
   the model with its int8 weights widened to uint8, which is exact.
4. **Compare**: the uint8 features before the last DequantizeLinear (added as an extra graph
   output on both sides) in quantization steps, and the float logits. onnxruntime's QLinear
   kernels requantize with their own fixed-point arithmetic, so a one-step difference on a
   rounding boundary is expected; the run agrees when the features are within one step and
   the logits within what one step of the features can move them (``step x max_j sum_i
   |W[j, i]|``, the Gemm's largest row sum), plus float slack.
"""

from __future__ import annotations

import collections
import os
import sys
import tempfile
import time
import warnings
from typing import Any, Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_quant.oracles import choose_oracle, run_oracle

#: the calibration / run shapes of the demo
CALIBRATION_DIMS = {"N": 1, "H": 16, "W": 16}
RUN_DIMS = {"N": 2, "H": 16, "W": 16}


def _quiet_quantizer() -> None:
    import logging  # noqa: PLC0415

    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime's "consider pre-processing" warnings


def build_quantized_cnn(*, seed: int = 0) -> tuple[onnx.ModelProto, onnx.ModelProto, str]:
    """(float model, quantized model, how it was made)."""
    from onnx_quant import model_zoo  # noqa: PLC0415

    float_model = model_zoo.cnn(blocks=1, channels=8, classes=10, seed=seed)
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,  # noqa: PLC0415
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter([model_zoo.random_feeds(float_model, CALIBRATION_DIMS, seed=seed + i) for i in range(2)])

        def get_next(self):
            return next(self._it, None)

    _quiet_quantizer()
    with tempfile.TemporaryDirectory(prefix="onnx-quant-demo-") as tmp:
        src, dst = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "quant.onnx")
        onnx.save(model_zoo.fix_dims(float_model, CALIBRATION_DIMS), src)
        quantize_static(src, dst, Reader(), quant_format=QuantFormat.QOperator, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        op_types_to_quantize=["Conv", "Add", "GlobalAveragePool", "MaxPool", "Relu"],
                        calibration_providers=["CPUExecutionProvider"])
        quantized = onnx.load(dst)
    quantized = model_zoo.restore_interface(quantized, float_model)
    how = ("model zoo ResNet-like CNN (1 residual block, 8 channels), quantize_static QOperator, "
           "per-channel int8 weights, uint8 activations, 2 calibration samples, Gemm kept float")
    return float_model, quantized, how


def _op_counts(model: onnx.ModelProto) -> str:
    c = collections.Counter((n.domain + "::" if n.domain not in ("", "ai.onnx") else "") + n.op_type
                            for n in model.graph.node)
    return ", ".join(f"{op} x{k}" if k > 1 else op for op, k in c.items())


def _with_probe(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """The model with the quantized input of its last DequantizeLinear as an extra output."""
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    if not dq:
        return model, None
    probe = dq[-1].input[0]
    if any(o.name == probe for o in model.graph.output):
        return model, probe
    init = {t.name: t for t in model.graph.initializer}
    zp = init.get(dq[-1].input[2]) if len(dq[-1].input) > 2 and dq[-1].input[2] else None
    elem = zp.data_type if zp is not None else onnx.TensorProto.UINT8
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.output.append(helper.make_tensor_value_info(probe, elem, None))
    return out, probe


def _probe_step(model: onnx.ModelProto, probe: str) -> float | None:
    dq = next((n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == probe), None)
    init = {t.name: t for t in model.graph.initializer}
    if dq is None or dq.input[1] not in init:
        return None
    s = numpy_helper.to_array(init[dq.input[1]]).astype(np.float64).reshape(-1)
    return float(np.max(np.abs(s))) if s.size else None


def _gemm_row_sum(model: onnx.ModelProto) -> float | None:
    """Largest sum of |W| over one output of the last Gemm (how far one step of its input
    can move one logit)."""
    gemm = [n for n in model.graph.node if n.op_type == "Gemm"]
    init = {t.name: t for t in model.graph.initializer}
    if not gemm or gemm[-1].input[1] not in init:
        return None
    w = numpy_helper.to_array(init[gemm[-1].input[1]]).astype(np.float64)
    trans_b = next((a.i for a in gemm[-1].attribute if a.name == "transB"), 0)
    w = w if trans_b else w.T  # rows: outputs
    return float(np.max(np.sum(np.abs(w), axis=1)))


def run_demo(*, adapter: Any = None, log: Callable[[str], None] = print, seed: int = 0) -> int:
    from .reporting import host_nodes, open_session, summary, timed_runs  # noqa: PLC0415 - loads wgpu
    from ..inference.commands import summarize, table, value_order  # noqa: PLC0415
    from ..inference.engine import infer  # noqa: PLC0415
    from onnx_quant import model_zoo  # noqa: PLC0415

    t_start = time.perf_counter()
    try:
        import onnxruntime  # noqa: F401, PLC0415
        have_ort = True
    except ImportError:
        have_ort = False

    # 1. build
    if have_ort:
        float_model, model, how = build_quantized_cnn(seed=seed)
        log(f"built: {how}")
        log(f"  float model: {len(float_model.graph.node)} nodes ({_op_counts(float_model)})")
    else:
        from onnx_quant.examples import cnn_model  # noqa: PLC0415

        model = cnn_model()
        log("built: the built-in example CNN (onnxruntime is not installed, so no quantizer; "
            "the CPU reference is onnx's reference evaluator)")
    log(f"  quantized:   {len(model.graph.node)} nodes ({_op_counts(model)})")

    # 2. infer
    result = infer(model)
    rows = table(model, result)
    keep = set(value_order(model)) - {t.name for t in model.graph.initializer}
    log("inferred (graph inputs and node outputs; symbolic dims kept):")
    log("  " + rows[0])
    for line in rows[1:]:
        if line.split(" ", 1)[0] in keep:
            log("  " + line)
    log(f"  {summarize(result)}")
    for d in result.diagnostics:
        log(f"  warning: {d}")

    # 3. run on the GPU and on the CPU reference
    probed, probe = _with_probe(model)
    feeds = model_zoo.random_feeds(model, RUN_DIMS, seed=seed + 100)
    session = open_session(probed, adapter=adapter)
    names = session.output_names
    outputs, first, steady, submits = timed_runs(session, feeds, repeat=3, budget_s=5.0)
    host = host_nodes(session)
    log(f"GPU: {session.device.info.name}")
    for name, value in zip(names, outputs):
        log(f"  {name}: {value.dtype} {list(value.shape)} {summary(value)}")
    log(f"  first run {first * 1e3:.1f} ms (plans, compiles, allocates), steady state {steady * 1e3:.2f} ms, "
        f"{submits} submit{'s' if submits != 1 else ''} per run")
    log(f"  host fallback: {', '.join(host) if host else 'none: every node ran on the GPU'}")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if have_ort:
            choice = choose_oracle(probed)
            t0 = time.perf_counter()
            expected = run_oracle(choice, probed, feeds, names)
            t_ref = time.perf_counter() - t0
            ref_name = "onnxruntime CPU" + (" (uint8 x int8 weights widened to uint8)" if choice.name != "onnxruntime" else "")
            log(f"oracle: {choice.reason}")
        else:
            from onnx.reference import ReferenceEvaluator  # noqa: PLC0415

            t0 = time.perf_counter()
            expected = ReferenceEvaluator(probed).run(names, feeds)
            t_ref = time.perf_counter() - t0
            ref_name = "onnx reference"
            log("oracle: onnx.reference (onnxruntime is not installed)")

    # 4. compare
    ok = True
    step = _probe_step(model, probe) if probe else None
    row_sum = _gemm_row_sum(model)
    log(f"compare with {ref_name} ({t_ref * 1e3:.2f} ms):")
    pairs = [(n, np.asarray(g), np.asarray(e)) for n, g, e in zip(names, outputs, expected)]
    steps_off = 0
    for _, got, exp in pairs:
        if got.dtype.kind in "iu" and got.shape == exp.shape and got.size:
            steps_off = max(steps_off, int(np.max(np.abs(got.astype(np.int64) - exp.astype(np.int64)))))
    for name, got, exp in sorted(pairs, key=lambda p: p[1].dtype.kind not in "iu"):
        if got.shape != exp.shape or got.dtype != exp.dtype:
            log(f"  {name}: {got.dtype}{list(got.shape)} vs {exp.dtype}{list(exp.shape)}: MISMATCH")
            ok = False
            continue
        diff = np.abs(got.astype(np.float64) - exp.astype(np.float64))
        m = float(np.max(diff)) if diff.size else 0.0
        if got.dtype.kind in "iu":
            n_off = int(np.count_nonzero(diff))
            good = m <= 1
            log(f"  {name}: max {m:g} quantization step{'s' if m != 1 else ''} "
                f"({n_off} of {got.size} values differ){'' if good else ': MORE THAN ONE STEP'}")
        else:
            scale = float(np.max(np.abs(exp))) if exp.size else 0.0
            bound = 1e-5 * max(1.0, scale)
            why = "float slack"
            if step is not None and row_sum is not None and steps_off:
                bound += steps_off * step * row_sum
                why = f"{steps_off} step of {step:.4g} x Gemm row sum {row_sum:.3g} + float slack"
            good = bool(np.all(np.isfinite(diff))) and m <= bound
            log(f"  {name}: max |diff| {m:.3g} (bound {bound:.3g}: {why}){'' if good else ': BEYOND THE BOUND'}")
        ok &= good
    took = time.perf_counter() - t_start
    if ok:
        log(f"agreement: the GPU matches {ref_name}{' (with host fallback)' if host else ''} ({took:.1f} s in all)")
        return 0
    log(f"DISAGREEMENT with {ref_name} ({took:.1f} s in all)")
    return 1


def main() -> int:  # pragma: no cover - python -m backend_wgpu.demo
    return run_demo(log=lambda s: print(s, flush=True))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

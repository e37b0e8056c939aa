"""The real-architecture models of onnx_quant.exported_models (YOLO head, paddle2onnx MobileNetV3 and
DBNet (Resize and ConvTranspose), torch transformer block, CRNN with a bidirectional LSTM, the If/Loop voice-activity model) in float,
QOperator, QDQ and dynamic form, on the GPU against onnxruntime CPU on the same inputs.

Each variant runs with ``allow_host_fallback=False`` unless :data:`HOST` names the op types it still
needs the host for (then with fallback, those exactly); every variant runs (the dynamic CRNN's
com.microsoft DynamicQuantizeLSTM has a GPU kernel). Agreement: ``max|diff| <= rtol * max|expected|`` with ``FLOAT_RTOL`` for float and dynamic forms
(float32 sums in another order; the dynamic forms' integer parts are exact) and ``STATIC_RTOL`` for
QOperator and QDQ (a requantization that lands on a rounding boundary may move one element a
quantization step; QDQ runs fused, as optimized onnxruntime does, and is compared with it). Each variant then runs in
the same session at a second batch size and at a new image size / sequence length / audio length
(``exported_models.SHAPE_CHANGES``): the outputs agree with onnxruntime there too, and a shape change
asks for no pipeline the first run did not (issue #11), but for :data:`STILL_COMPILES`.
"""

from __future__ import annotations

import logging
import re
import sys
import warnings
from pathlib import Path

import pytest

from onnx_quant import exported_models as em
from support.oracles import assert_agree, onnxruntime_run

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

FLOAT_RTOL = 1e-4
STATIC_RTOL = 2e-2
CASES = [f"{name}-{form}" for name in em.MODELS for form in em.FORMS]

#: op types a variant still runs on the host, and why
HOST: dict[str, set[str]] = {
    # empty: NonZero (the YOLO head's data-dependent dim) runs on the GPU with one sync
    # (data_dependent.py); the int64 Concat of the grid shapes, Resize and ConstantOfShape (the
    # CRNN LSTM's zero initial states) left the host with their kernels
}


def _model(case):
    name, form = case.rsplit("-", 1)
    logging.getLogger().setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = em.build(name, form)
    return model, em.feeds(model, em.MODELS[name][1], seed=1)


def _onnxruntime(model, feeds, optimized):
    # with more threads onnxruntime quantizes each step's LSTM state per slice of the batch
    # (crnn-dynamic, batch 2: 1.2e-3 apart from its own one-thread run); the kernel quantizes the
    # whole batch, as one thread does (measured: 4.8e-7 from it)
    one_thread = any(n.op_type == "DynamicQuantizeLSTM" for n in model.graph.node)
    return onnxruntime_run(model, feeds, level="ORT_ENABLE_ALL" if optimized else "ORT_DISABLE_ALL",
                           threads=1 if one_thread else None)


#: pipelines a variant still compiles at a shape change (exported_models.SHAPE_CHANGES), per change,
#: by kernel: only tile choices made per bucket of sizes. mobilenet_v3-dynamic's classifier
#: (DynamicQuantizeMatMul) goes from 2 to 3 rows at batch 3, past its 2-row tile (a 4-row tile at
#: one row was 1.2-1.75x slower on llvmpipe, docs/kernels.md)
#: yolo_anchors' box decoding broadcasts the anchors [1, 2, A] against the batch's [N, 2, A]: from
#: batch 1 to 2 the broadcasting Add / Sub (QLinearAdd in the quantized forms) get their
#: broadcast variant, and at a new image size the float Range of its anchor grids compiles again
STILL_COMPILES: dict[str, dict[str, set[str]]] = {
    "mobilenet_v3-dynamic": {"batch": {"DynamicQuantizeMatMul"}},
    "yolo_anchors-float": {"batch": {"Add", "Sub"}, "size": {"Range"}},
    "yolo_anchors-dynamic": {"batch": {"Add", "Sub"}, "size": {"Range"}},
    "yolo_anchors-qoperator": {"batch": {"QLinearAdd", "Sub"}, "size": {"Range"}},
    "yolo_anchors-qdq": {"batch": {"QLinearAdd", "Sub"}, "size": {"Range"}},
}


def _check(case, got, want):
    assert_agree(got, want, STATIC_RTOL if case.endswith(("-qoperator", "-qdq")) else FLOAT_RTOL)


@pytest.mark.parametrize("case", CASES)
def test_exported_model_on_the_gpu_matches_onnxruntime(best, case):
    """At the model's run shapes, then at a second batch size and at a new image size / sequence
    length (SHAPE_CHANGES), in one session: every output agrees with onnxruntime, and a shape change
    asks for no pipeline the first shape's run did not (issue #11: shape-polymorphic pipelines)."""
    from onnx_quant.backend_wgpu.session import Session
    from bench_models import pipeline_requests

    model, feeds = _model(case)
    name = case.rsplit("-", 1)[0]
    host = HOST.get(case, set())
    optimized = case.endswith("-qdq")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Session(model, device=best, allow_host_fallback=bool(host)) as s:
            with pipeline_requests(best) as first:
                got = s.run(None, feeds)
            ran_on_host = {re.sub(r".*\((.*)\)$", r"\1", h) for h in s.host_nodes}
            assert ran_on_host == host, ran_on_host
            _check(case, got, _onnxruntime(model, feeds, optimized))
            labels = {id(p): p.label.split("/", 1)[-1] for p in best.pipelines._pipelines.values()}
            for change, shapes in em.SHAPE_CHANGES[name].items():
                changed = em.feeds(model, shapes, seed=2)
                with pipeline_requests(best) as used:
                    got = s.run(None, changed)
                _check(case, got, _onnxruntime(model, changed, optimized))
                labels.update({id(p): p.label.split("/", 1)[-1] for p in best.pipelines._pipelines.values()})
                compiled = {labels.get(k, "?").split("/")[0] for k in used - first}
                allowed = STILL_COMPILES.get(case, {}).get(change, set())
                assert compiled <= allowed, f"a new {change} compiles {sorted(compiled - allowed)}"

"""QDQ models on the GPU with QDQ node-unit fusion (backend_wgpu/qdq_fusion.py) against
onnxruntime with all optimizations on (ORT_ENABLE_ALL: its own QDQ fusion onto the same QLinear
kernels): bit for bit on every output, the dispatches per run fewer than without fusion.

Models: the zoo's QDQ CNN, MLP and transformer (per-tensor and per-channel weights, the sizes
test_real_models_gpu.py uses) and the exported QDQ forms (onnx_quant/exported_models.py) whose
fused path is exact. crnn is compared with fusion off instead: its float LSTM runs on the host
(onnx.reference) and differs from onnxruntime by 2.4e-7 with or without fusion, so fusion must
change nothing there.
"""

from __future__ import annotations

import functools
import logging
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from onnx_quant import exported_models, model_zoo
from support.models import ZOO
from support.oracles import onnxruntime_run

CASES = [f"{f}-{pc}" for f in ZOO for pc in ("per_tensor", "per_channel")] + \
        ["exported-yolo_head", "exported-mobilenet_v3", "exported-transformer", "exported-crnn"]
#: cases whose fused result is not compared with onnxruntime bit for bit (see the module doc)
NOT_EXACT = {"exported-crnn"}


@functools.lru_cache(maxsize=None)
def case_model(case: str):
    logging.getLogger().setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kind, _, rest = case.partition("-")
        if kind == "exported":
            model = exported_models.build(rest, "qdq")
            return model, exported_models.feeds(model, exported_models.MODELS[rest][1], seed=7)
        kw, dims = ZOO[kind]
        model = model_zoo.quantized(kind, "qdq", per_channel=rest == "per_channel", **kw)
        return model, model_zoo.random_feeds(model, dims, seed=7)


def ort_run(model, feeds, optimize: bool):
    return onnxruntime_run(model, feeds, level="ORT_ENABLE_ALL" if optimize else "ORT_DISABLE_ALL")


def gpu_run(model, feeds, device, fuse: bool):
    from onnx_quant.backend_wgpu.session import Session

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # host nodes of the exported models are listed by their own tests
        with Session(model, device=device, fuse_qdq=fuse) as s:
            s.run(None, feeds)
            got = s.run(None, feeds)  # the second run: constants already prepared
            return got, s.last_run_stats["dispatches"], s


@pytest.mark.parametrize("case", CASES)
def test_fused_qdq_model_matches_optimized_onnxruntime(case, best):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_models import ort_optimized_nodes

    model, feeds = case_model(case)
    fused, d_fused, s = gpu_run(model, feeds, best, True)
    plain, d_plain, _ = gpu_run(model, feeds, best, False)
    assert s.fusion.units, "nothing fused"
    want = ort_run(model, feeds, optimize=True)
    for g, p, w in zip(fused, plain, want):
        g, p, w = np.asarray(g), np.asarray(p), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        if case in NOT_EXACT:
            assert np.array_equal(g, p), "fusion changed an output whose fused units are all exact"
        else:
            assert np.array_equal(g, w), f"max |diff| {np.abs(g.astype(np.float64) - w).max()} from ORT_ENABLE_ALL"
    assert d_fused < d_plain
    print(f"{case}: dispatches per run {d_plain} -> {d_fused} with fusion; onnxruntime runs "
          f"{ort_optimized_nodes(model)} nodes after its optimizations; {len(s.fusion.units)} units fused")


def test_explain_names_each_fused_unit(best):
    model, feeds = case_model("cnn-per_tensor")
    _, _, s = gpu_run(model, feeds, best, True)
    with s:
        entries = s.explain({k: v.shape for k, v in feeds.items()})
    fused = [e for e in entries if e["fused"]]
    assert len(fused) == len(s.fusion.units)
    conv = next(e for e in fused if e["op_type"] == "QLinearConv")
    assert conv["fused"]["rule"] == "conv" and conv["placement"] == "gpu" and conv["kernel"] == "QLinearConv"
    unit = next(u for u in s.fusion.units if u.node.op_type == "QLinearConv" and u.target == conv["node"])
    assert conv["fused"]["nodes"] == unit.labels()
    assert [n.op_type for n in unit.nodes][-2:] == ["Conv", "QuantizeLinear"]
    assert all(e["fused"] is None for e in entries if e["op_type"] in ("QuantizeLinear", "DequantizeLinear"))


def test_a_fused_node_a_kernel_declines_runs_its_unit_on_the_host(best, monkeypatch):
    """The host runs the unit as written (onnx.reference), the graph's literal meaning."""
    from onnx_quant.backend_wgpu import graph_plan
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import HostFallbackWarning

    real = graph_plan.plan_kernel

    def decline_qlinear_conv(info, values, device, options):
        if info.node.op_type == "QLinearConv":
            return None, "declined by this test"
        return real(info, values, device, options)

    monkeypatch.setattr(graph_plan, "plan_kernel", decline_qlinear_conv)
    model, feeds = case_model("cnn-per_tensor")
    with pytest.warns(HostFallbackWarning, match="declined by this test"):
        with Session(model, device=best) as s:
            got = s.run(None, feeds)
            hosts = [e for e in s.explain({k: v.shape for k, v in feeds.items()}) if e["placement"] == "host"]
    assert hosts and all(e["op_type"] == "QLinearConv" and e["fused"]["rule"] == "conv" for e in hosts)
    for g, w in zip(got, ort_run(model, feeds, optimize=False)):
        assert np.array_equal(np.asarray(g), w)


def test_inference_session_fuses_from_the_extended_level(best):
    import onnxruntime as ort

    from onnx_quant.backend_wgpu.inference_session import GraphOptimizationLevel, InferenceSession, SessionOptions

    model, feeds = case_model("mlp-per_tensor")
    for level, fused in [(None, True), (GraphOptimizationLevel.ORT_DISABLE_ALL, False),
                         (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, False),
                         (ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, True)]:
        so = SessionOptions()
        if level is not None:
            so.graph_optimization_level = level
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sess = InferenceSession(model, so, providers=["webgpu"])
        assert bool(sess.session.fusion.units) == fused, level
        got = sess.run(None, feeds)
        for g, w in zip(got, ort_run(model, feeds, optimize=fused)):
            assert np.array_equal(g, w), level

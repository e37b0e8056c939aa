"""Dispatches per run of the zoo's quantized models (QOperator and QDQ, per-channel weights) are
at most the nodes onnxruntime runs after all its optimizations (its saved optimized model):
the QLinear kernels requantize in their GEMM pass (QLinearMatMul's *_epilogue variants,
QLinearConv's direct variant), their constant params passes run once per plan, and QLinearSoftmax
takes its one-pass variant for rows of any length. Small sizes of the models the benchmark runs
(benchmarks/bench_models.py, whose full-size figures are in docs/benchmarks.md)."""

from __future__ import annotations

import functools
import logging
import sys
import warnings
from pathlib import Path

import pytest

from onnx_quant import model_zoo
from support.models import ZOO

FORMATS = ("qoperator", "qdq")
#: the one-pass variant each QLinear GEMM kernel must take in these models
ONE_PASS = {"QLinearMatMul": "blocked_epilogue", "QLinearConv": "direct"}


@functools.lru_cache(maxsize=None)
def zoo_model(family: str, fmt: str):
    logging.getLogger().setLevel(logging.ERROR)
    kw, dims = ZOO[family]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_zoo.quantized(family, fmt, per_channel=True, **kw)
    return model, model_zoo.random_feeds(model, dims, seed=5)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", sorted(ZOO))
def test_dispatches_per_run_at_most_onnxruntime_nodes(best, family, fmt):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_models import ort_optimized_nodes

    from onnx_quant.backend_wgpu.session import Session

    model, feeds = zoo_model(family, fmt)
    with Session(model, device=best, allow_host_fallback=False) as s:
        s.run(None, feeds)
        s.run(None, feeds)  # steady state: the constant passes ran with the first
        dispatches = s.last_run_stats["dispatches"]
        plans = s.plans({k: v.shape for k, v in feeds.items()})
    ort_nodes = ort_optimized_nodes(model)
    chosen = {(p.kernel, p.variant) for p in plans}
    for kernel, variant in ONE_PASS.items():
        assert all(v == variant for k, v in chosen if k == kernel), chosen
    assert any(k in ONE_PASS for k, _ in chosen), chosen
    print(f"{family} {fmt}: {dispatches} dispatches per run, onnxruntime {ort_nodes} nodes")
    assert dispatches <= ort_nodes, (dispatches, ort_nodes, sorted(chosen))

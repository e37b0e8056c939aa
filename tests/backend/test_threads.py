"""Thread safety and leaks: one Session shared by threads, several sessions on one device
(backend_wgpu/locking.py), and sessions created and dropped without growth."""

from __future__ import annotations

import gc
import os
import threading
import warnings
import weakref

import numpy as np
import pytest

from onnx_quant.backend_wgpu.commands import dql_model
from onnx_quant.examples import example_models
from onnx_quant.model_zoo import random_feeds

THREADS = 4
RUNS_PER_THREAD = 6


def _models():
    models = example_models()  # cnn (QLinearConv), qlinear_matmul, qdq
    models["dql"] = dql_model(1)
    return models


def _feeds(name, model, seed):
    if name == "dql":
        return {"x": np.random.default_rng(seed).standard_normal(257 + seed).astype(np.float32)}
    # the batch dim varies with the seed: runs of one session use two plans
    return random_feeds(model, {"N": 1 + seed % 2, "H": 8, "W": 8, "B": 1 + seed % 2, "S": 4}, seed=seed)


def _session(model, device):
    from onnx_quant.backend_wgpu.session import Session

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Session(model, device=device)


def _same_bits(got, expected):
    return all(g.dtype == e.dtype and g.shape == e.shape and g.tobytes() == e.tobytes()
               for g, e in zip(got, expected)) and len(got) == len(expected)


def test_threads_sharing_sessions_get_the_single_threaded_outputs_bit_for_bit(best):
    models = _models()
    sessions = {name: _session(m, best) for name, m in models.items()}
    seeds = range(THREADS * RUNS_PER_THREAD)
    # the single-threaded truth, one per (model, seed): a run that read another run's buffers
    # (the dql inputs differ in length per seed, the others in values) differs from it
    expected = {(name, s): sessions[name].run(None, _feeds(name, models[name], s)) for name in models for s in seeds}
    failures: list[str] = []
    start = threading.Barrier(THREADS)

    def worker(t: int) -> None:
        start.wait()
        try:
            for i in range(RUNS_PER_THREAD):
                s = t * RUNS_PER_THREAD + i
                for name in models:  # every thread runs every session, so sessions on one device overlap too
                    got = sessions[name].run(None, _feeds(name, models[name], s))
                    if not _same_bits(got, expected[(name, s)]):
                        failures.append(f"thread {t} run {i}: model {name} seed {s} differs")
        except Exception as e:  # noqa: BLE001 - reported below, the test fails on it
            failures.append(f"thread {t}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not any(th.is_alive() for th in threads), "a thread hung"
    assert failures == []
    runs = {name: s.stats.runs for name, s in sessions.items()}
    assert runs == {name: 2 * len(seeds) for name in models}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_sessions_created_and_dropped_do_not_grow_memory_or_device_caches(best):
    model = example_models()["cnn"]
    feeds = _feeds("cnn", model, 0)
    expected = _session(model, best).run(None, feeds)

    def cycle() -> weakref.ref:
        s = _session(model, best)
        for _ in range(3):
            assert _same_bits(s.run(None, feeds), expected)
        s.close()
        return weakref.ref(s)

    for _ in range(3):  # warm-up: pipelines compiled, allocator pools and imports settled
        cycle()
    gc.collect()
    pipelines = best.pipelines.counters()
    prepared = len(best.prepared)
    rss = _rss_bytes()
    refs = [cycle() for _ in range(25)]
    gc.collect()
    assert all(r() is None for r in refs), "a dropped Session is still referenced"
    after = best.pipelines.counters()
    assert after["compilations"] == pipelines["compilations"]
    assert after["pipelines"] == pipelines["pipelines"]
    assert after["layouts_created"] == pipelines["layouts_created"]
    assert len(best.prepared) == prepared
    growth = _rss_bytes() - rss
    # 25 sessions hold a few MB of buffers each while alive: kept, they would add far more
    assert growth < 24 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over 25 sessions"


def test_repeated_runs_of_one_session_leave_its_counters_flat(best):
    model = example_models()["qdq"]
    feeds = _feeds("qdq", model, 1)
    s = _session(model, best)
    s.run(None, feeds)
    before = s.stats.snapshot()
    rss = _rss_bytes()
    for _ in range(40):
        s.run(None, feeds)
    after = s.stats.snapshot()
    for key in ("plans", "pipelines_compiled", "buffers_allocated", "bytes_allocated", "bind_groups_created"):
        assert after[key] == before[key], key
    assert after["runs"] == before["runs"] + 40
    assert _rss_bytes() - rss < 16 * 2**20

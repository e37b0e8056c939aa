"""Variants and tunables chosen by measurement (backend_wgpu/tuning.py), on a small dynamically
quantized MLP whose two MatMuls fuse into DynamicQuantizeMatMul nodes (variants ``fused`` and
``two_pass``, tunables with ``tune`` lists). The choosing logic runs on made-up times (a fake
timer): no assertion here depends on how fast anything is."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_quant import cache_dir, model_zoo
from onnx_quant.backend_wgpu import Session, tuning
from onnx_quant.backend_wgpu.tuning_cache import TuningTable, candidate_label
from onnx_quant.cli import main
from support.oracles import onnxruntime_run

pytestmark = pytest.mark.gpu
KERNEL = "DynamicQuantizeMatMul"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """A cache folder per test: no table written here is read by another test of the suite."""
    monkeypatch.setenv(cache_dir.ENV, str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def mlp():
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(2):
        inits += [numpy_helper.from_array((rng.standard_normal((16, 16)) / 4).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(rng.uniform(-0.1, 0.1, 16).astype(np.float32), f"b{i}")]
        out = "y" if i else "h"
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"matmul{i}"),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [out], name=f"add{i}")]
        x = out
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 16])], inits)
    return model_zoo.quantize(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "dynamic")


@pytest.fixture
def feeds():
    return {"x": np.random.default_rng(1).standard_normal((2, 3, 16)).astype(np.float32)}


def _plans(session, feeds):
    return [p for p in session.plans({k: v.shape for k, v in feeds.items()}) if p.kernel == KERNEL]


def fake_timer(fastest: str):
    """Times made up from what each node runs: the candidate labelled ``fastest`` 1 µs, the
    others more the further down the label list they sort."""
    def timer(session, feeds, repeats):
        out = {}
        for p in session.plans({k: v.shape for k, v in feeds.items()}):
            spec = next(s for s in session.kernel_specs if s.name == p.kernel)
            changed = {n: v for n, v in p.tunables.items() if v != spec.tunables[n].default}
            label = candidate_label(p.variant, changed)
            out[p.node] = 1.0 if label == fastest else 10.0 + len(label)
        return out
    return timer


def _tune(mlp, feeds, best, table, **kw):
    return tuning.tune(lambda **k: Session(mlp, device=best, **k), feeds, table, repeats=1, passes=1, **kw)


@pytest.mark.parametrize("fastest", ["two_pass[K_TILE=128]", "fused[ROW_TILE=4]"])
def test_tune_keeps_the_candidate_timed_fastest_and_later_sessions_plan_with_it(mlp, feeds, best, fastest):
    table = TuningTable.load(best.info)
    table.entries.clear()
    reports = _tune(mlp, feeds, best, table, timer=fake_timer(fastest), force=True)
    rep = next(r for r in reports if r.kernel == KERNEL)
    assert len(rep.nodes) == 2 and rep.static == "fused"  # both MatMuls share one key
    static = _plans(Session(mlp, device=best, use_tuning_cache=False), feeds)[0]
    allowed = {v for v, why in static.selection.items() if why is None}
    assert {label.split("[")[0] for label in rep.timed_us} == allowed == {"fused", "two_pass"}
    assert rep.chosen == fastest and min(rep.timed_us, key=rep.timed_us.get) == fastest
    assert not rep.dropped
    # the table on disk is what a later session plans with; without it, the static rule
    variant, tun = fastest.split("[")[0], dict(kv.split("=") for kv in fastest[:-1].split("[")[1].split(","))
    plans = _plans(Session(mlp, device=best), feeds)
    assert {p.variant for p in plans} == {variant}
    assert all(p.tunables[n] == int(v) for p in plans for n, v in tun.items())
    assert {p.variant for p in _plans(Session(mlp, device=best, use_tuning_cache=False), feeds)} == {"fused"}


def test_outputs_after_tuning_equal_the_oracle(mlp, feeds, best):
    table = TuningTable.load(best.info)
    _tune(mlp, feeds, best, table, timer=fake_timer("two_pass[WORKGROUP_SIZE=32]"), force=True)
    with Session(mlp, device=best) as s:
        assert {p.variant for p in _plans(s, feeds)} == {"two_pass"}
        got = s.run(None, feeds)[0]
    want = onnxruntime_run(mlp, feeds, level="ORT_DISABLE_ALL")[0]
    np.testing.assert_array_equal(got, want)  # the fused kernels equal the unfused graph bit for bit


def test_a_candidate_whose_outputs_differ_is_dropped_however_fast(mlp, feeds, best):
    """A session forcing ``two_pass`` whose outputs are made to differ: never chosen, reported."""
    def make(**kw):
        s = Session(mlp, device=best, **kw)
        if "two_pass" in (kw.get("variants") or {}).values():
            run = s.run
            s.run = lambda names, f: [o + np.float32(1) for o in run(names, f)]
        return s

    table = TuningTable.load(best.info)
    reports = tuning.tune(make, feeds, table, timer=fake_timer("two_pass"), repeats=1, passes=1, force=True)
    rep = next(r for r in reports if r.kernel == KERNEL)
    assert "not exact" in rep.dropped["two_pass"] and "two_pass" not in rep.timed_us
    assert rep.chosen.split("[")[0] == "fused"


def test_a_corrupt_cache_entry_is_ignored(mlp, feeds, best):
    table = TuningTable.load(best.info)
    key = tuning.plan_key(_plans(Session(mlp, device=best, use_tuning_cache=False), feeds)[0])
    doc = {"format": 1, "entries": {key: {"variant": "no_such_variant", "tunables": {}, "timed_us": {}}}}
    table.path.write_text(json.dumps(doc))
    assert {p.variant for p in _plans(Session(mlp, device=best), feeds)} == {"fused"}  # the static rule
    doc["entries"][key] = {"variant": "two_pass", "tunables": {"K_TILE": "big"}}
    table.path.write_text(json.dumps(doc))
    assert TuningTable.load(best.info).ignored == 1
    assert {p.variant for p in _plans(Session(mlp, device=best), feeds)} == {"fused"}
    table.path.write_text("{ truncated")
    with Session(mlp, device=best) as s:
        assert {p.variant for p in _plans(s, feeds)} == {"fused"}
        np.testing.assert_array_equal(s.run(None, feeds)[0], onnxruntime_run(mlp, feeds, level="ORT_DISABLE_ALL")[0])


def test_session_tune_measures_on_first_run_and_writes_the_table(mlp, feeds, best, monkeypatch):
    monkeypatch.setattr(tuning, "REPEATS", 1)
    monkeypatch.setattr(tuning, "PASSES", 1)
    table = TuningTable.load(best.info)
    table.path.unlink(missing_ok=True)
    with Session(mlp, device=best, tune=True) as s:
        got = s.run(None, feeds)[0]
        chosen = {(p.variant, tuple(sorted(p.tunables.items()))) for p in _plans(s, feeds)}
    entry = TuningTable.load(best.info).lookup(tuning.plan_key(_plans(Session(mlp, device=best), feeds)[0]))
    assert entry is not None and entry.variant in {"fused", "two_pass"}
    assert candidate_label(entry.variant, dict(entry.tunables)) in entry.timed_us
    assert min(entry.timed_us.values()) == entry.timed_us[candidate_label(entry.variant, dict(entry.tunables))]
    assert len(chosen) == 1 and next(iter(chosen))[0] == entry.variant
    np.testing.assert_array_equal(got, onnxruntime_run(mlp, feeds, level="ORT_DISABLE_ALL")[0])


def test_cli_tune_lists_every_candidate_then_reads_the_cache(mlp, capsys, tmp_path, best):
    path = tmp_path / "mlp.onnx"
    path.write_bytes(mlp.SerializeToString())
    assert main(["tune", "--clear"]) == 0
    capsys.readouterr()
    assert main(["tune", str(path), "--repeats", "1", "--passes", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rep = next(k for k in doc["keys"] if k["kernel"] == KERNEL)
    assert rep["chosen"] in rep["timed_us"] and len(rep["timed_us"]) >= 2 and not rep["cached"]
    assert main(["tune", str(path), "--json"]) == 0
    assert next(k for k in json.loads(capsys.readouterr().out)["keys"] if k["kernel"] == KERNEL)["cached"]
    assert main(["tune"]) == 2 and "a model is needed" in capsys.readouterr().err
    assert main(["tune", str(path), "--passes", "0"]) == 2

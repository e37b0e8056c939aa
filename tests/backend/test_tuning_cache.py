"""The tuning table on disk (backend_wgpu/tuning_cache.py) and the tuner's pure parts
(backend_wgpu/tuning.py: candidates, output agreement). CPU only."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from onnx_quant import cache_dir
from onnx_quant.backend_wgpu import tuning, tuning_cache
from onnx_quant.backend_wgpu.device_info import DeviceInfo
from onnx_quant.backend_wgpu.spec import load_specs
from onnx_quant.backend_wgpu.tuning_cache import Choice, TuningTable, adapter_key, entry_key

INFO = DeviceInfo(name="Some GPU (driver 1.2)", backend="Vulkan")
SHAPES = {"A": (3, 9, 256), "B": (256, 256), "Y": (3, 9, 256)}
TYPES = {"A": "float32", "B": "int8", "Y": "float32"}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """A cache folder per test: no table written here is read by another test of the suite."""
    monkeypatch.setenv(cache_dir.ENV, str(tmp_path / "cache"))


def test_entry_key_buckets_shapes_by_powers_of_two_and_keeps_dtypes_apart():
    key = entry_key("K", SHAPES, TYPES, {"A", "B"})
    assert key == entry_key("K", {**SHAPES, "A": (4, 16, 256)}, TYPES, ["B", "A"])  # same bucket, any order
    assert key != entry_key("K", {**SHAPES, "A": (3, 17, 256)}, TYPES, {"A", "B"})
    assert key != entry_key("K", SHAPES, {**TYPES, "B": "uint8"}, {"A", "B"})
    assert key != entry_key("L", SHAPES, TYPES, {"A", "B"})
    assert [tuning_cache.bucket_dim(d) for d in (0, 1, 2, 3, 5, 64, 65)] == [0, 1, 2, 4, 8, 64, 128]


def test_adapter_key_follows_limits_and_is_a_file_name():
    key = adapter_key(INFO)
    assert "/" not in key and " " not in key and key.startswith("Some-GPU")
    fewer = DeviceInfo(name=INFO.name, backend=INFO.backend, limits={**INFO.limits, "maxComputeWorkgroupSizeX": 64})
    assert adapter_key(fewer) != key


def test_table_round_trips_through_the_cache_folder():
    table = TuningTable.load(INFO)
    assert len(table) == 0 and table.path.parent == cache_dir.folder("tuning")
    table.entries["k1"] = Choice("two_pass", {"K_TILE": 256}, {"fused": 9.0, "two_pass[K_TILE=256]": 4.5})
    table.save()
    again = TuningTable.load(INFO)
    assert again.lookup("k1") == table.lookup("k1") and again.ignored == 0
    assert again.digest() == table.digest() != TuningTable(table.adapter).digest()
    assert tuning_cache.clear() and len(TuningTable.load(INFO)) == 0


def test_corrupt_entries_and_files_are_ignored(tmp_path):
    path = tmp_path / f"{adapter_key(INFO)}.json"
    good = Choice("fused", {}, {"fused": 1.0}).as_json()
    bad = [{"variant": 3}, {"variant": "v", "tunables": {"X": "big"}}, {"variant": "v", "timed_us": {"a": True}},
           "fused", None]
    path.write_text(json.dumps({"format": tuning_cache.FORMAT, "entries": {
        "good": good, **{f"bad{i}": b for i, b in enumerate(bad)}}}))
    table = TuningTable.load(INFO, tmp_path)
    assert list(table.entries) == ["good"] and table.ignored == len(bad)
    for text in ("{not json", json.dumps([1, 2]), json.dumps({"format": 999, "entries": {"good": good}})):
        path.write_text(text)
        table = TuningTable.load(INFO, tmp_path)
        assert len(table) == 0 and table.ignored == 1


def test_candidates_are_the_allowed_variants_then_each_tune_value():
    spec = next(s for s in load_specs() if s.name == "DynamicQuantizeMatMul")
    assert spec.tunables["K_TILE"].tune  # what the candidates below are made of
    plan = SimpleNamespace(variant="fused", selection={"fused": None, "two_pass": None, "never": "x > 1"},
                           tunables={n: t.default for n, t in spec.tunables.items()})
    cands = tuning.node_candidates(plan, spec)
    assert cands[0] == ("fused", {}) and cands[1] == ("two_pass", {})
    assert {v for v, _ in cands} == {"fused", "two_pass"}  # a variant whose clause fails is never timed
    tuned = [(n, v) for _, t in cands for n, v in t.items()]
    assert tuned and all(v in spec.tunables[n].tune and v != spec.tunables[n].default for n, v in tuned)
    assert len(cands) == 2 * (1 + sum(len(t.tune) for t in spec.tunables.values()))


def test_outputs_agree_is_exact_for_integers_and_relative_for_floats():
    i = np.arange(6, dtype=np.int8)
    assert tuning.outputs_agree([i], [i.copy()]) is None
    assert "1 of 6" in tuning.outputs_agree([i + np.int8(1) * (i == 2)], [i])
    f = np.linspace(-2, 2, 5, dtype=np.float32)
    assert tuning.outputs_agree([f + np.float32(1e-6)], [f]) is None
    assert "max |diff|" in tuning.outputs_agree([f + np.float32(1e-3)], [f])
    assert "NaN" in tuning.outputs_agree([np.where(f > 1, np.nan, f)], [f])
    assert "float32" in tuning.outputs_agree([f], [f.astype(np.float64)])

"""benchmarks/device_check.sh --smoke: the one-shot device benchmark made for a lent GPU, run
here on the adapter at hand (lavapipe in CI) on its few small models, so the script cannot rot.
One run (~30 s); what it asserts is what the report must hold, never a speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("device_check")
    env = {**os.environ, "DEVICE_CHECK_PYTHON": sys.executable, "TMPDIR": str(out)}
    done = subprocess.run([str(ROOT / "benchmarks" / "device_check.sh"), "--smoke", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return done, out


def test_smoke_runs_every_case_through_the_project_and_each_agrees_with_its_oracle(smoke):
    done, out = smoke
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    report = json.loads((out / "device_check.json").read_text())
    assert report["smoke"] and any(line.startswith("picked: ") for line in report["adapter"])
    cases = {c["case"] for c in report["cases"]}
    assert {c["batch"] for c in report["cases"]} == {1, 2} and {c["tier"] for c in report["cases"]} == {"zoo", "exported"}
    ours = {r["case"]: r for r in report["rows"] if r["runner"] == "onnx-quant"}
    assert set(ours) == cases and all(r["status"] == "agrees" for r in ours.values()), ours
    assert all(r["steady_s"] > 0 and r["first_s"] > 0 and r["throughput"] > 0 for r in ours.values())
    cpu = {r["case"] for r in report["rows"] if r["runner"] == "onnxruntime-cpu"}
    assert cpu == cases  # the anchor, in the same run


def test_smoke_report_names_what_it_skipped_and_writes_the_tables(smoke):
    done, out = smoke
    report = json.loads((out / "device_check.json").read_text())
    for part in ("onnxruntime-webgpu", "tinygrad", "torch", "roofline"):
        p = report["parts"][part]
        assert "skipped" in p or "rc" in p, part  # a peer that is not here says why
    roofline_here = (ROOT / "benchmarks" / "roofline.py").is_file()
    assert ("skipped" in report["parts"]["roofline"]) != roofline_here
    md = (out / "device_check.md").read_text()
    assert "## batch 1" in md and "## batch 2" in md and "onnxruntime-cpu" in md
    assert md.count("(agrees") >= 2 * len(report["cases"])
    assert not list(out.glob("device-check-[0-9]*")), "the work folder is removed"

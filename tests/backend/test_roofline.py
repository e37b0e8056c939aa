"""benchmarks/roofline.py's short mode on the test adapter: it runs, every figure is positive
and the rows are consistent with the roofline they are measured against (no timing asserted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import roofline  # noqa: E402

pytestmark = pytest.mark.devices("best")

#: one kernel of each kind: float GEMM-shaped, int8 GEMM-shaped, memory-bound
ONLY = ["Conv yolo_head", "QLinearMatMul", "Add", "Softmax"]


def test_short_mode_runs_and_its_figures_are_consistent(best):
    result = roofline.run(short=True, only=ONLY, with_ort=False, device=best)
    roof = result["roofline"]
    assert roof["copy_bytes_per_s"] > 0 and roof["f32_flops_per_s"] > 0 and roof["int8_ops_per_s"] > 0
    assert roof["dispatch_floor_s"] > 0 and roof["copy_bytes_per_s"] == max(roof["copy_by_size"].values())
    assert roof["int8_form"] in roofline.DOT_FORMS
    assert roof["int8_forms"]["emulated"]["int_ops_per_s"] > 0  # the emulated form always compiles
    assert roof["int8_ops_per_s"] == max(d["int_ops_per_s"] for d in roof["int8_forms"].values() if "int_ops_per_s" in d)
    rows = result["kernels"]
    assert {r["kernel"] for r in rows} == {"Conv", "QLinearMatMul", "Add", "Softmax"}
    for r in rows:
        assert r["ms"] > 0 and r["work"] > 0 and r["variant"], r
        assert r["rate"] == pytest.approx(r["work"] / (r["ms"] / 1e3))
        peak = {"Conv": roof["f32_flops_per_s"], "QLinearMatMul": roof["int8_ops_per_s"]}.get(
            r["kernel"], roof["copy_bytes_per_s"])
        assert r["fraction"] == pytest.approx(r["rate"] / peak)
        assert r["bound"] == (roofline.GEMM if r["kernel"] in ("Conv", "QLinearMatMul") else roofline.MEMORY)
        assert 0 < r["attainable"] <= peak * (1 + 1e-9)  # the model never allows more than the roofline
        assert r["fraction_of_attainable"] == pytest.approx(r["rate"] / r["attainable"])
    text = roofline.markdown(result)
    assert all(r["case"] in text for r in rows) and "copy bandwidth" in text
    json.dumps(result)  # --json writes it

"""Every graph the fuzzer found a fault with (tests/fuzz/regressions/*.onnx, each shrunk to a
minimal graph, its finding in its doc string) replays: the GPU agrees with the oracle, the
inference engine with the runtime, or the graph is refused with a documented error."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from .check import check_model

CASES = sorted((Path(__file__).resolve().parent / "regressions").glob("*.onnx"))


def test_the_regression_folder_has_cases():
    assert CASES


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_saved_finding_replays_clean(best, path):
    outcome = check_model(onnx.load(path), best)
    assert outcome.kind in ("pass", "refused"), f"{path.name}: {outcome.kind}: {outcome.detail}"

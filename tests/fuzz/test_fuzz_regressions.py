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


TRIAGED = sorted((Path(__file__).resolve().parent / "triaged").glob("*.onnx"))


@pytest.mark.parametrize("path", TRIAGED, ids=[p.stem for p in TRIAGED])
def test_triaged_case_is_no_finding(best, path):
    """Graphs the campaign flagged that are not the project's fault (named by what they are: the
    engine's runtime answer where onnx's inference differs, float16 drift through a cancellation,
    onnx.reference's LogSoftmax next to 0): the verdict says so, and it is no refusal either."""
    outcome = check_model(onnx.load(path), best)
    assert outcome.kind in ("pass", "drift", "oracle-split"), f"{path.name}: {outcome.kind}: {outcome.detail}"
    expected = {"inference": "pass", "drift": "drift", "oracle": "oracle-split"}[path.stem.split("-")[0]]
    assert outcome.kind == expected, (path.name, outcome.kind, outcome.detail)

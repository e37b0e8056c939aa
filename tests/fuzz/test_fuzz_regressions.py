"""Every graph the fuzzer found a fault with (tests/fuzz/regressions/*.onnx, each shrunk to a
minimal graph, its finding in its doc string) replays: the GPU agrees with the oracle, the
inference engine with the runtime, or the graph is refused with a documented error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
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


def test_a_cancellation_is_judged_against_its_terms_and_a_wrong_tap_is_not():
    """The drift rule for interpolating ops (check.WEIGHTED_SUM_OPS) forgives float32's rounding of
    the terms where the sum cancels, and nothing the size of a wrong weight or tap."""
    from onnx import TensorProto, helper

    from .check import SUM_ROUNDINGS, _within_its_cancellation, reference_values

    x = np.array([[[[3.75], [-1.5], [2.0], [0.25]]]], np.float32)
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear",
                            coordinate_transformation_mode="align_corners")
    sizes = np.array([1, 1, 8, 1], np.int64)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(sizes, "sizes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    y = reference_values(model, {"x": x})["y"].astype(np.float32)
    values = {"x": x, "sizes": sizes}
    near = y.copy()
    near.flat[3] += np.float32(8 * 2.0**-24 * 3.75)  # a few float32 roundings of the largest term
    assert _within_its_cancellation(model, node, {**values, "y": near}, ["y"])
    off = y.copy()
    off.flat[3] += np.float32(0.01 * 3.75)  # a weight 1 % off: far beyond
    assert SUM_ROUNDINGS * 3.75 < 1e-3 * 0.01 * 3.75
    assert not _within_its_cancellation(model, node, {**values, "y": off}, ["y"])
    relu = helper.make_node("Relu", ["x"], ["y"])  # not an interpolating op: never forgiven
    assert not _within_its_cancellation(model, relu, {**values, "y": near}, ["y"])

"""NonMaxSuppression on the GPU (templates/non_max_suppression.kernel.json) in the padded form of
data_dependent.py (as NonZero: the host reads back the count, the nodes reading the selection run
as a body session planned for it). Oracles: onnx.reference bit for bit over shapes, both box
layouts, the optional inputs (onnxruntime where the reference needs iou_threshold), ties and degenerate boxes; onnxruntime CPU on a detector head as
ultralytics / torchvision exports write it (NonMaxSuppression -> Gather of the selected boxes)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto as TP, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from support.gpu import assert_node_cases_pass_or_declined, gpu_examples, kept_session, runs_from_a_cold_cache
from support.oracles import onnxruntime_run

OPTIONAL = ("max_output_boxes_per_class", "iou_threshold", "score_threshold")


def _nms_model(center: int, given_inputs: int, opset: int = 11) -> onnx.ModelProto:
    """NonMaxSuppression over graph inputs: boxes, scores and the first ``given_inputs`` optional ones."""
    names = ["boxes", "scores", *OPTIONAL[:given_inputs]]
    types = [TP.FLOAT, TP.FLOAT, TP.INT64, TP.FLOAT, TP.FLOAT]
    node = helper.make_node("NonMaxSuppression", names, ["selected"], center_point_box=center)
    g = helper.make_graph([node], "nms", [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, types)],
                          [helper.make_tensor_value_info("selected", TP.INT64, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _session(device, center: int, given_inputs: int, workgroup: int):
    return kept_session(device, ("NonMaxSuppression", center, given_inputs, workgroup),
                        lambda: _nms_model(center, given_inputs), {"NonMaxSuppression": {"WORKGROUP_SIZE": workgroup}})


def _boxes(rng, batches: int, count: int, center: int) -> np.ndarray:
    """Boxes on a coarse grid (exact overlaps, equal IoUs at the threshold), some flipped (corners
    in either order), some of zero width."""
    a = rng.integers(0, 12, (batches, count, 2)) / 4
    size = rng.integers(0, 8, (batches, count, 2)) / 4
    if center:
        return np.concatenate([a, size], -1).astype(np.float32)
    b = a + size * rng.choice([-1, 1], (batches, count, 2))
    return np.concatenate([a, b], -1)[..., [1, 0, 3, 2]].astype(np.float32)


def test_onnx_node_cases_pass_on_the_gpu(best):
    assert_node_cases_pass_or_declined(best, ("NonMaxSuppression",), {}, 10)


@settings(max_examples=gpu_examples(), deadline=None)
@given(batches=st.integers(1, 3), classes=st.integers(1, 3), count=st.integers(0, 40), center=st.sampled_from([0, 1]),
       given_inputs=st.integers(0, 3), max_out=st.integers(-1, 45), iou=st.sampled_from([0.0, 0.25, 0.5, 0.7, 1.0]),
       score=st.sampled_from([-1.0, 0.0, 0.3, 0.5]), workgroup=st.sampled_from([4, 5, 256]), seed=st.integers(0, 2**16))
def test_matches_onnx_reference(best, batches, classes, count, center, given_inputs, max_out, iou, score, workgroup,
                                seed):
    """Any batch / class / box count (none too), center or corner boxes, each prefix of the optional
    inputs, max_output_boxes_per_class below, at and above the box count (and negative), scores with
    ties (the lower index first); a 4- or 5-invocation workgroup strides the boxes and the offsets
    over several chunks."""
    rng = np.random.default_rng(seed)
    feeds = {"boxes": _boxes(rng, batches, count, center),
             "scores": (rng.integers(0, 8, (batches, classes, count)) / 8).astype(np.float32),
             "max_output_boxes_per_class": np.array([max_out], np.int64),
             "iou_threshold": np.array([iou], np.float32), "score_threshold": np.array([score], np.float32)}
    feeds = {k: v for k, v in feeds.items() if k not in OPTIONAL[given_inputs:]}
    model = _nms_model(center, given_inputs)
    (got,) = _session(best, center, given_inputs, workgroup).run(None, feeds)
    if given_inputs < 2:  # the reference fails without iou_threshold: onnxruntime (the same walk) judges
        (want,) = onnxruntime_run(model, feeds)
    elif count == 0 and max_out < 0:  # the reference raises a TypeError on no boxes with a negative count
        (want,) = onnxruntime_run(model, feeds)
    else:
        (want,) = ReferenceEvaluator(model).run(None, feeds)
    assert got.dtype == np.int64 and got.shape == want.shape and np.array_equal(got, want)


def test_a_second_shape_compiles_nothing(best):
    """The box and class counts and max_output_boxes_per_class are runtime uniforms: from a cold
    cache, the second and third shapes compile none of NonMaxSuppression's pipelines."""
    model = _nms_model(0, 2)
    rng = np.random.default_rng(4)
    feeds = [{"boxes": _boxes(rng, b, n, 0), "scores": rng.random((b, c, n)).astype(np.float32),
              "max_output_boxes_per_class": np.array([k], np.int64), "iou_threshold": np.array([0.5], np.float32)}
             for b, c, n, k in ((1, 2, 30, 5), (2, 3, 70, 9), (1, 1, 300, 50))]
    outs, compiled = runs_from_a_cold_cache(best, model, feeds)
    assert any("NonMaxSuppression" in lab for lab in compiled[0]), compiled[0]
    assert not [lab for labels in compiled[1:] for lab in labels if "NonMaxSuppression" in lab], compiled
    for f, (got,) in zip(feeds, outs):
        assert np.array_equal(got, ReferenceEvaluator(model).run(None, f)[0])


def test_too_many_selection_rounds_are_declined(best):
    """An invocation walking its boxes once per kept box beyond llvmpipe's loop budget: declined."""
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import ExecutionError

    model = _nms_model(0, 1)
    feeds = {"boxes": _boxes(np.random.default_rng(1), 1, 64, 0), "scores": np.ones((1, 1, 64), np.float32),
             "max_output_boxes_per_class": np.array([64], np.int64)}
    with Session(model, device=best, allow_host_fallback=False,
                 tunables={"NonMaxSuppression": {"MAX_LANE_ITERATIONS": 100, "WORKGROUP_SIZE": 4}}) as s:
        with pytest.raises(ExecutionError, match="NonMaxSuppression.*lanesFit"):
            s.run(None, feeds)


def _detector(num_classes: int = 3) -> onnx.ModelProto:
    """A YOLO head as ultralytics exports it with NMS in the graph: predictions [1, 4 + C, N] ->
    Transpose -> Slice into xywh boxes and class scores -> NonMaxSuppression (center boxes,
    Constant thresholds) -> Gather of the box and class columns -> Gather of the kept boxes,
    GatherND of their scores (torchvision's batched_nms export reads the selection the same way)."""
    c = lambda name, arr: helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr), name))  # noqa: E731
    nodes = [
        c("k", np.array([20], np.int64)), c("iou", np.array([0.45], np.float32)), c("conf", np.array([0.25], np.float32)),
        c("s0", np.array([0], np.int64)), c("s4", np.array([4], np.int64)), c("s_end", np.array([4 + num_classes], np.int64)),
        c("ax2", np.array([2], np.int64)), c("col_box", np.array(2, np.int64)), c("col_cls", np.array(1, np.int64)),
        c("ax0", np.array([0], np.int64)),
        helper.make_node("Transpose", ["pred"], ["pred_t"], perm=[0, 2, 1]),
        helper.make_node("Slice", ["pred_t", "s0", "s4", "ax2"], ["xywh"]),
        helper.make_node("Slice", ["pred_t", "s4", "s_end", "ax2"], ["cls_scores"]),
        helper.make_node("Transpose", ["cls_scores"], ["scores"], perm=[0, 2, 1]),
        helper.make_node("NonMaxSuppression", ["xywh", "scores", "k", "iou", "conf"], ["selected"], center_point_box=1),
        helper.make_node("Gather", ["selected", "col_box"], ["box_index"], axis=1),
        helper.make_node("Gather", ["selected", "col_cls"], ["class_index"], axis=1),
        helper.make_node("Squeeze", ["xywh", "ax0"], ["all_boxes"]),
        helper.make_node("Gather", ["all_boxes", "box_index"], ["kept_boxes"], axis=0),
        helper.make_node("GatherND", ["scores", "selected"], ["kept_scores"]),
    ]
    outs = [helper.make_tensor_value_info("kept_boxes", TP.FLOAT, ["k", 4]),
            helper.make_tensor_value_info("class_index", TP.INT64, ["k"]),
            helper.make_tensor_value_info("kept_scores", TP.FLOAT, ["k"])]
    g = helper.make_graph(nodes, "detector", [helper.make_tensor_value_info("pred", TP.FLOAT, [1, 4 + num_classes, "n"])],
                          outs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _predictions(rng, count: int, num_classes: int = 3) -> np.ndarray:
    xy = rng.random((1, 2, count)) * 64
    wh = 4 + rng.random((1, 2, count)) * 16
    return np.concatenate([xy, wh, rng.random((1, num_classes, count))], 1).astype(np.float32)


def test_detector_with_nms_runs_on_the_gpu_and_matches_onnxruntime(best):
    from onnx_quant.backend_wgpu.session import Session

    model = _detector()
    rng = np.random.default_rng(8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no host fallback warning
        with Session(model, device=best, allow_host_fallback=False) as s:
            for count in (50, 200, 50):
                pred = _predictions(rng, count)
                got = s.run(None, {"pred": pred})
                for g, w in zip(got, onnxruntime_run(model, {"pred": pred})):
                    assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w)
                assert 0 < got[0].shape[0] <= 60
            assert s.host_nodes == []
            placement = {e["node"]: e["placement"] for e in s.explain({"pred": [1, 7, 50]})}
    assert placement["data_dependent_region"] == "sync"
    assert [v for k, v in placement.items() if k.startswith("NonMaxSuppression")] == ["gpu"]


def test_a_declined_plan_runs_the_padded_form_on_the_host(best):
    """A plan the kernel declines (a loop budget of 1) runs the padded form on the host (onnx.reference
    written as the kernel writes it): the region still gets the [count, 3] selection."""
    from onnx_quant.backend_wgpu.session import Session

    model = _detector()
    pred = _predictions(np.random.default_rng(2), 40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Session(model, device=best, tunables={"NonMaxSuppression": {"MAX_LANE_ITERATIONS": 1}}) as s:
            got = s.run(None, {"pred": pred})
            assert [h.split(" ")[0] for h in s.host_nodes] == ["NonMaxSuppression_14"]
    for g, w in zip(got, onnxruntime_run(model, {"pred": pred})):
        assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w)

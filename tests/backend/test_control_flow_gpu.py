"""If, Loop and Scan (backend_wgpu/control_flow.py): the host decides, the bodies run on the GPU as
sessions of their own; no host fallback, outputs as numpy / onnx.reference compute them."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

from onnx_quant.backend_wgpu.conformance import run_case
from onnx_quant.backend_wgpu.session import Session
from onnx_quant.errors import ExecutionError
from onnx_quant.node_cases import all_node_cases
from support.models import NO_KERNEL_OPSET, make_model as _model, no_kernel_node


def _vi(name, t=TP.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, t, shape)


def _session(model, device):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no host fallback warning from the graph or a body
        return Session(model, device=device, allow_host_fallback=False)


@pytest.mark.parametrize("name", ["test_if", "test_scan9_sum", "test_scan9_multi_state", "test_scan9_scalar"])
def test_onnx_node_cases_run_their_bodies_on_the_gpu(best, name):
    case = next(c for c in all_node_cases() if c.name == name)
    row = run_case(case, device=best, host_fallback=False)
    assert row.passed, row.error


def test_a_data_dependent_if_reads_its_condition_and_runs_one_branch(best):
    # cond = max(x) > 0, computed on the GPU; then: Relu(x) * w (w an outer initializer), else: -x
    w = np.float32([2.0, -3.0, 0.5, 4.0])
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "w"], ["t"])],
                               "then", [], [_vi("t")])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e")])
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
             helper.make_node("Greater", ["m", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    model = _model(nodes, [_vi("x", shape=[4])], [_vi("y", shape=[4])],
                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.float32(0), "zero")])
    with _session(model, best) as s:
        for x in (np.float32([-1, 2, -3, 4]), np.float32([-1, -2, -3, -4]), np.float32([-1, 2, -3, 4])):
            (y,) = s.run(None, {"x": x})
            expected = np.maximum(x, 0) * w if x.max() > 0 else -x
            assert y.tobytes() == expected.astype(np.float32).tobytes()
            assert s.last_run_stats["dispatches"] >= 3  # the graph's and the branch's kernels
        assert s.host_nodes == []
        (entry,) = [e for e in s.explain({"x": (4,)}) if e["op_type"] == "If"]
        assert entry["placement"] == "control"
        runner = next(iter(s._control.values()))
        bodies = {attr: sess for attr, (sess, _) in runner._sessions.items()}
        assert set(bodies) == {"then_branch", "else_branch"}
        # the outer weight is the branch's initializer (uploaded once), not a per-run feed
        assert [t.name for t in bodies["then_branch"].model.graph.initializer] == ["w"]


def test_loop_carries_state_and_stacks_scan_outputs(best):
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
         helper.make_node("Identity", ["acc_out"], ["scan"])],
        "body", [_vi("i", TP.INT64, []), _vi("cond_in", TP.BOOL, []), _vi("acc_in", shape=[3])],
        [_vi("cond_out", TP.BOOL, []), _vi("acc_out", shape=[3]), _vi("scan", shape=[3])])
    nodes = [helper.make_node("Loop", ["trips", "", "acc0"], ["acc", "scans"], body=body)]
    model = _model(nodes, [_vi("trips", TP.INT64, []), _vi("acc0", shape=[3]), _vi("x", shape=[3])],
                   [_vi("acc"), _vi("scans")])
    x, acc0 = np.float32([1, 2, 3]), np.float32([10, 20, 30])
    with _session(model, best) as s:
        for n in (3, 5):
            acc, scans = s.run(None, {"trips": np.array(n, np.int64), "acc0": acc0, "x": x})
            np.testing.assert_array_equal(acc, acc0 + n * x)
            np.testing.assert_array_equal(scans, np.stack([acc0 + (k + 1) * x for k in range(n)]))
        body_session = next(iter(s._control.values())).body_sessions()[0]
        assert body_session.stats.plans == 1  # every iteration reuses the body's plan


def test_a_loop_that_could_never_stop_is_refused(best):
    body = helper.make_graph([helper.make_node("Identity", ["v_in"], ["v_out"])], "body",
                             [_vi("i", TP.INT64, []), _vi("c", TP.BOOL, []), _vi("v_in", shape=[1])],
                             [_vi("c_out", TP.BOOL, []), _vi("v_out", shape=[1])])
    body.node.append(helper.make_node("Identity", ["c"], ["c_out"]))
    model = _model([helper.make_node("Loop", ["", "", "v"], ["w"], body=body)], [_vi("v", shape=[1])], [_vi("w")])
    with _session(model, best) as s:
        with pytest.raises(ExecutionError, match="neither a trip count nor a condition"):
            s.run(None, {"v": np.float32([1])})


def test_a_body_node_without_a_kernel_is_refused_without_host_fallback(best):
    then_g = helper.make_graph([no_kernel_node("x", "d")], "then", [], [_vi("d")])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["d2"])], "else", [], [_vi("d2")])
    model = _model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                   [_vi("c", TP.BOOL, []), _vi("x", shape=[2, 2])], [_vi("y")], extra_opsets=[NO_KERNEL_OPSET])
    with _session(model, best) as s:
        with pytest.raises(ExecutionError, match=f"If_0.*then_branch.*{then_g.node[0].op_type}"):
            s.run(None, {"c": np.array(True), "x": np.eye(2, dtype=np.float32)})

"""The graph compiler's phases (backend_wgpu/graph_plan.py, backend_wgpu/placement.py), each on the
CPU: no adapter, no device — node records, values from the inference pass, stand-in kernel plans.
Each phase returns frozen data (plan.py) and changes nothing it is given."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

from onnx_quant.backend_wgpu import graph_plan as gp
from onnx_quant.backend_wgpu import placement as pl
from onnx_quant.backend_wgpu.plan import GpuStep, HostStep, Segment
from onnx_quant.errors import ExecutionError
from onnx_quant.inference import infer_values

KIND_OF = {"Constant": "const", "Reshape": "view", "Shape": "host", "Hardmax": "host"}


def build(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    infos = []
    for i, n in enumerate(model.graph.node):
        kind = KIND_OF.get(n.op_type, "gpu")
        spec = SimpleNamespace(inputs={f"in{k}": None for k in range(len(n.input))},
                               outputs={f"out{k}": None for k in range(len(n.output))}) if kind == "gpu" else None
        infos.append(pl.NodeInfo(i, n.name or f"n{i}", n, "", 17, spec, kind,
                                 "" if kind == "gpu" else "no GPU kernel", ()))
    return model, infos, infer_values(model, None)


def stand_in_plan(info, nbytes=64, scratch=False):
    buffers = {b: SimpleNamespace(role="input", byte_size=nbytes, data=None) for b in info.spec.inputs}
    buffers.update({b: SimpleNamespace(role="output", byte_size=nbytes, data=None) for b in info.spec.outputs})
    buffers["params"] = SimpleNamespace(role="uniform", byte_size=8, data=b"\1" * 8)
    if scratch:
        buffers["tmp"] = SimpleNamespace(role="intermediate", byte_size=32, data=None)
    return SimpleNamespace(buffers=buffers, passes=[])


def vi(name, t=TP.FLOAT, shape=(4,)):
    return helper.make_tensor_value_info(name, t, list(shape))


def w(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def test_place_folds_views_and_keeps_construction_kinds():
    nodes = [helper.make_node("Constant", [], ["c"], value=w("cv", np.float32([1, 2, 3, 4])), name="const"),
             helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Reshape", ["x", "s"], ["r"], name="view"),
             helper.make_node("Add", ["r", "c"], ["y"], name="add"),
             helper.make_node("Hardmax", ["y"], ["z"], name="hard", axis=0)]
    _, infos, values = build(nodes, [vi("x")], [vi("z")])
    placed = pl.place(infos, values)
    assert [placed.kinds[i] for i in range(5)] == ["const", "fold", "view", "gpu", "host"]
    assert placed.folded_by_node[1]["s"].tolist() == [4] and placed.folded_by_node[1]["s"].dtype == np.int64
    assert placed.reasons[4] == "no GPU kernel"


def test_a_view_that_changes_the_element_count_is_not_a_view():
    info = pl.NodeInfo(0, "v", helper.make_node("Reshape", ["a", "s"], ["b"]), "", 17, None, "view", "none", ())
    values = {"a": SimpleNamespace(elem_type=TP.FLOAT, shape=(2, 3)), "b": SimpleNamespace(elem_type=TP.FLOAT, shape=(4,))}
    assert pl.view_rejects(info, values) == "[2, 3] and [4] hold different numbers of elements"
    placed = pl.place([info], values)
    assert placed.kinds[0] == "host" and placed.reasons[0].startswith("not a view: [2, 3] and [4]")


def test_live_nodes_follow_the_outputs_back():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("Relu", ["x"], ["dead"], name="dead"),
             helper.make_node("Shape", ["a"], ["s"], name="shape"),
             helper.make_node("Reshape", ["a", "s"], ["y"], name="view")]
    _, infos, values = build(nodes, [vi("x")], [vi("y")])
    placed = pl.place(infos, values)
    # a view reads only its data: the Shape that fed its target shape is not needed at run time
    assert pl.live_nodes(infos, placed.kinds, ["y"]) == {0, 3}
    report = pl.placement_report(infos, placed.kinds, {0, 3}, placed.reasons)
    assert report[1] == report[2] == ("unused", "no graph output depends on it") and report[0] == ("gpu", "")


def test_value_roots_alias_views_and_refuse_an_unproduced_output():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("Reshape", ["a", "shape"], ["y"], name="view")]
    _, infos, values = build(nodes, [vi("x", shape=(2, 2))], [vi("y", shape=(4,))],
                             [w("shape", np.int64([4]))])
    placed = pl.place(infos, values)
    live = pl.live_nodes(infos, placed.kinds, ["y"])
    roots, alias = gp.value_roots(infos, placed.kinds, live, values, ["x"], ["shape"], ["y"])
    assert {n: r.origin for n, r in roots.items()} == {"x": "feed", "shape": "init", "a": "gpu"}
    assert alias["y"] == ("a", (4,)) and roots["a"].nbytes == 16
    with pytest.raises(ExecutionError, match="graph output 'nowhere' is produced by no node"):
        gp.value_roots(infos, placed.kinds, live, values, ["x"], ["shape"], ["y", "nowhere"])


def _weights_model():
    nodes = [helper.make_node("DequantizeLinear", ["wq", "ws"], ["wd"], name="dq_w"),
             helper.make_node("Relu", ["wd"], ["wr"], name="relu_w"),
             helper.make_node("Add", ["x", "wr"], ["y"], name="add"),
             helper.make_node("Relu", ["wd"], ["w_out"], name="relu_out")]
    return build(nodes, [vi("x")], [vi("y"), vi("w_out")],
                 [w("wq", np.int8([1, 2, 3, 4])), w("ws", np.float32(0.5))])


def _weights_phases():
    """Phases 1-5 over the weights model: (infos, placement, live, roots, alias, once)."""
    _, infos, values = _weights_model()
    placed = pl.place(infos, values)
    live = pl.live_nodes(infos, placed.kinds, ["y", "w_out"])
    roots, alias = gp.value_roots(infos, placed.kinds, live, values, ["x"], ["wq", "ws"], ["y", "w_out"])
    once, with_once = gp.constant_nodes(infos, placed.kinds, live, roots, alias, ["y", "w_out"])
    assert all(r.origin != "once" for r in roots.values())   # what it was given stays as it was
    return infos, placed, live, with_once, alias, once, values


def test_constant_nodes_are_chains_of_constants_not_read_back():
    infos, placed, live, roots, alias, once, _ = _weights_phases()
    # the DQ of the weight and the Relu over it; not the Add (it reads a feed), not the Relu whose
    # value the caller reads back
    assert once == {0, 1}
    assert roots["wd"].origin == roots["wr"].origin == "once" and roots["y"].origin == "gpu"


def test_schedule_cuts_segments_only_where_a_host_node_reads_the_open_one():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("Hardmax", ["x"], ["h1"], name="h1", axis=0),   # reads a feed: no cut
             helper.make_node("Relu", ["a"], ["b"], name="b"),
             helper.make_node("Hardmax", ["b"], ["h2"], name="h2", axis=0),   # reads b: cut
             helper.make_node("Add", ["h2", "h1"], ["y"], name="c")]
    _, infos, values = build(nodes, [vi("x")], [vi("y")])
    placed = pl.place(infos, values)
    live = pl.live_nodes(infos, placed.kinds, ["y"])
    plans = {i.index: stand_in_plan(i, scratch=i.label == "b") for i in infos if placed.kinds[i.index] == "gpu"}
    roots, alias = gp.value_roots(infos, placed.kinds, live, values, ["x"], [], ["y"])
    sched = gp.schedule(infos, placed.kinds, live, plans, roots, alias, set(), placed.reasons, values, 256)
    shape = [("seg", [st.label for st in s.steps]) if isinstance(s, Segment) else ("host", s.label) for s in sched.steps]
    assert shape == [("host", "h1"), ("seg", ["a", "b"]), ("host", "h2"), ("seg", ["c"])]
    roots = sched.roots
    assert roots["b"].on_host and roots["x"].on_host and roots["x"].on_device
    # one 256-aligned uniform region per GPU step
    assert [off for off, _ in sched.uniform_regions] == [0, 256, 512] and sched.uniform_size == 512 + 16
    lifetimes, slot_of, slot_sizes = gp.assign_memory(roots, sched, 2**30, {"x": (4,)})
    # host values the GPU reads are uploaded before the first segment that reads them
    assert [s.uploads for s in sched.steps if isinstance(s, Segment)] == [(), ("h1", "h2")]
    assert {lt.key for lt in lifetimes} >= {"x", "a", "b", "y", "h1", "h2", (2, "tmp")}
    assert len(slot_sizes) < len(lifetimes)       # buffers are reused across lifetimes
    assert isinstance(sched.steps[0], HostStep) and sched.steps[0].inputs == (("x", "x", (4,)),)
    assert sched.steps[0].output_types == (TP.FLOAT,)   # the host node's outputs as this binding types them


def test_constant_steps_go_to_the_prologue():
    infos, placed, live, roots, alias, once, values = _weights_phases()
    plans = {i.index: stand_in_plan(i) for i in infos}
    sched = gp.schedule(infos, placed.kinds, live, plans, roots, alias, once, placed.reasons, values, 256)
    assert [st.label for st in sched.prologue] == ["dq_w", "relu_w"]
    assert [[st.label for st in s.steps] for s in sched.steps] == [["add", "relu_out"]]
    lifetimes, _, _ = gp.assign_memory(sched.roots, sched, 2**30, {})
    assert not {"wd", "wr"} & {lt.key for lt in lifetimes}   # once values live in buffers of their own


def test_a_device_value_of_unknown_shape_is_refused():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="r")]
    _, infos, values = build(nodes, [vi("x")], [vi("y")])
    values = dict(values)
    values["x"] = SimpleNamespace(elem_type=TP.FLOAT, shape=("N",), value=None)
    placed = pl.place(infos, values)
    roots, alias = gp.value_roots(infos, placed.kinds, {0}, values, ["x"], [], ["y"])
    sched = gp.schedule(infos, placed.kinds, {0}, {0: stand_in_plan(infos[0])}, roots, alias, set(), {}, values, 256)
    with pytest.raises(ExecutionError, match="value 'x': a GPU node reads it but its type or shape is not known"):
        gp.assign_memory(sched.roots, sched, 2**30, {"x": ("N",)})


def test_session_runs_the_phases_the_same_way(best):
    """The orchestration: Session's plan of the weights model matches the phases run by hand."""
    import warnings

    from onnx_quant.backend_wgpu.session import Session

    model, _, _ = _weights_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = Session(model, device=best)
    x = np.float32([1, -2, 3, -4])
    y, w_out = s.run(None, {"x": x})
    wd = np.float32([1, 2, 3, 4]) * np.float32(0.5)
    assert y.tolist() == (x + np.maximum(wd, 0)).tolist() and w_out.tolist() == np.maximum(wd, 0).tolist()
    gplan = next(iter(s._plans.values()))
    assert [st.label for st in gplan.prologue] == ["dq_w", "relu_w"]
    # the compiler alone, given the session's compiler input and the device's facts, makes the same plan
    again = gp.compile(s._graph, best.info, {"x": (4,)}, options=s._options).plan
    assert again is not gplan and _canon(again) == _canon(gplan)


def _canon(gplan):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from plan_fingerprint import plan_data

    return plan_data(gplan)


def _pass(pid, *bindings):
    return SimpleNamespace(id=pid, bindings=[SimpleNamespace(buffer=b, access=a) for b, a in bindings])


def _hoist_step(passes, roots_origin):
    buffers = {"x": SimpleNamespace(role="input"), "scale": SimpleNamespace(role="input"),
               "y": SimpleNamespace(role="output"), "params": SimpleNamespace(role="intermediate"),
               "tmp": SimpleNamespace(role="intermediate"), "u": SimpleNamespace(role="uniform")}
    where = {"x": ("value", "x"), "scale": ("value", "scale"), "y": ("value", "y"),
             "params": ("scratch", (0, "params")), "tmp": ("scratch", (0, "tmp")), "u": ("uniform", 0, 16)}
    roots = {n: SimpleNamespace(origin=o) for n, o in roots_origin.items()}
    plan = SimpleNamespace(buffers=buffers, passes=passes)
    k, kept = gp.hoist_constant_passes(plan, where, roots)
    assert where["params"] == ("scratch", (0, "params"))   # what it was given stays as it was
    return GpuStep(0, "n", "QLinearConv", 0, plan, kept, ("y",), k), k


def test_leading_passes_over_constants_are_hoisted_and_their_scratch_kept():
    params = _pass("params", ("scale", "read"), ("params", "read_write"), ("u", "uniform"))
    main = _pass("main", ("x", "read"), ("params", "read"), ("tmp", "read_write"), ("y", "read_write"))
    step, k = _hoist_step([params, main], {"x": "feed", "scale": "init", "y": "gpu"})
    assert k == 1 and step.buffers["params"] == ("kept", (0, "params")) and step.buffers["tmp"][0] == "scratch"
    # a scale computed per run, a later pass writing the kept scratch, or a node of constants only: none
    step, k = _hoist_step([params, main], {"x": "feed", "scale": "gpu", "y": "gpu"})
    assert k == 0 and step.buffers["params"][0] == "scratch"
    rewrite = _pass("main", ("x", "read"), ("params", "read_write"), ("y", "read_write"))
    assert _hoist_step([params, rewrite], {"x": "feed", "scale": "init", "y": "gpu"})[1] == 0
    assert _hoist_step([params], {"scale": "init", "y": "gpu"})[1] == 0


def test_a_sync_step_reads_its_counts_on_the_host_and_the_rest_on_the_device():
    """NonZero's region (a ``sync`` step, data_dependent.py): the inputs it names in ``host_reads``
    are read back, the other pooled ones (GPU-made, fed) are passed as views of their buffers,
    whose lifetimes last until the step has run; the segment before it is cut."""
    import dataclasses

    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("Relu", ["x"], ["c"], name="c"),
             helper.make_node("Add", ["a", "c"], ["s"], name="s"),     # stands in for the region node
             helper.make_node("Relu", ["s"], ["e"], name="e")]
    _, infos, values = build(nodes, [vi("x")], [vi("e")])
    infos[2] = dataclasses.replace(infos[2], kind="sync", spec=None, reason=pl.dd.SYNC_WHY, host_reads=("c",))
    infos[2].node.input.append("x")
    placed = pl.place(infos, values)
    live = pl.live_nodes(infos, placed.kinds, ["e"])
    plans = {i.index: stand_in_plan(i) for i in infos if placed.kinds[i.index] == "gpu"}
    roots, alias = gp.value_roots(infos, placed.kinds, live, values, ["x"], [], ["e"])
    once, roots = gp.constant_nodes(infos, placed.kinds, live, roots, alias, ["e"])
    sched = gp.schedule(infos, placed.kinds, live, plans, roots, alias, once, placed.reasons, values, 256)
    shape = [("seg", [st.label for st in s.steps]) if isinstance(s, Segment) else ("sync", s.label) for s in sched.steps]
    assert shape == [("seg", ["a", "c"]), ("sync", "s"), ("seg", ["e"])]
    step = sched.steps[1]
    assert step.device_inputs == ("a", "x") and step.pos == 2
    roots = sched.roots
    assert roots["c"].on_host and not roots["a"].on_host and not roots["x"].on_host
    assert roots["s"].origin == "host"   # the region's outputs come back to the host
    lifetimes, slot_of, _ = gp.assign_memory(roots, sched, 2**30, {"x": (4,)})
    ends = {lt.key: lt.end for lt in lifetimes}
    assert ends["a"] == 2 and ends["x"] == 2       # alive until the step has run ...
    assert slot_of["e"] not in {slot_of["a"], slot_of["x"]}   # ... so e, after it, takes another buffer
    assert pl.placement_report(infos, placed.kinds, live, placed.reasons)[2] == ("sync", pl.dd.SYNC_WHY)

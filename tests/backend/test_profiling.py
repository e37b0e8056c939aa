"""The profiler: per node / per pass times from timestamp queries (or the host wall clock),
the table, the Chrome trace; ``Session(profile=True)``, ``InferenceSession`` with
``enable_profiling`` and ``onnx-quant profile``."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import onnx
import pytest

import onnx_quant
from onnx_quant.backend_wgpu.profiling import NodeEvent, Profiler
from onnx_quant.backend_wgpu.session import Session
from onnx_quant.errors import ExecutionError
from support.models import NO_KERNEL_OPSET, no_kernel_node

RUNS = 3


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory) -> str:
    """The ``onnx-quant demo`` model (QOperator CNN quantized by onnxruntime), saved."""
    from onnx_quant.backend_wgpu import demo

    _, quantized, _ = demo.build_quantized_cnn()
    path = tmp_path_factory.mktemp("profile") / "demo.onnx"
    onnx.save(quantized, str(path))
    return str(path)


def _feeds(session) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {a.name: rng.standard_normal([d if isinstance(d, int) else 2 for d in a.shape]).astype(np.float32)
            for a in session.get_inputs()}


def _gpu_nodes(session, feeds) -> list[str]:
    return [e["node"] for e in session.explain({k: v.shape for k, v in feeds.items()}) if e["placement"] == "gpu"]


@pytest.mark.parametrize("clock", [None, "host-wall"])
@pytest.mark.gpu
def test_session_profile_times_every_gpu_node_every_run(demo_model, clock):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # a multi-pass form of QLinearConv (im2col + gemm; the default `direct` is one pass)
        s = Session(demo_model, profile=True, variants={"QLinearConv": "blocked_epilogue"})
    if clock:
        s.profiler = Profiler(s.device, clock)
    feeds = _feeds(s)
    plain = Session(demo_model).run(None, feeds)
    outs = None
    for _ in range(RUNS):
        outs = s.run(None, feeds)
    # profiling changes how work is submitted, never what it computes
    assert all(a.tobytes() == b.tobytes() for a, b in zip(outs, plain))
    prof = s.profiler
    want = "device" if clock is None else "host-wall"
    assert prof.clock == want
    nodes = _gpu_nodes(s, feeds)
    assert len(prof.runs) == RUNS
    for run in range(RUNS):
        assert sorted(e.node for e in prof.events if e.run == run) == sorted(nodes)
    assert all(e.clock == want and e.dur_us > 0 for e in prof.events)
    table = prof.table()
    assert [r["node"] for r in table] == sorted((r["node"] for r in table), key=lambda n: -sum(
        e.dur_us for e in prof.events if e.node == n))
    assert abs(sum(r["share"] for r in table) - 1.0) < 1e-9
    conv = next(r for r in table if r["op_type"] == "QLinearConv")
    assert conv["kernel"] == "QLinearConv" and conv["variant"]
    if want == "device":
        # every pass of a multi-pass kernel is timed, and the node's time is their sum
        assert set(conv["pass_us"]) >= {"im2col", "gemm"}
        assert abs(sum(conv["pass_us"].values()) - conv["mean_us"]) < 1e-6 * conv["mean_us"] + 1e-9
    text = prof.format_table()
    assert text.splitlines()[0].startswith(f"profile: {RUNS} run(s); clocks: {want} = ")
    assert table[0]["node"] in text.splitlines()[2]


@pytest.mark.gpu
def test_trace_is_chrome_trace_json(demo_model, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = Session(demo_model, profile=True)
    feeds = _feeds(s)
    for _ in range(2):
        s.run(None, feeds)
    path = s.profiler.write_trace(tmp_path / "trace.json")
    events = json.loads(open(path).read())
    assert isinstance(events, list)
    for e in events:
        assert e["ph"] == "X" and {"name", "cat", "ts", "dur", "pid", "tid", "args"} <= set(e)
    runs = [e for e in events if e["cat"] == "Session"]
    node_events = [e for e in events if e["cat"] == "Node"]
    assert len(runs) == 2
    assert len(node_events) == 2 * len(_gpu_nodes(s, feeds))
    for run in runs:  # every node event of a run lies inside that run's span
        inside = [e for e in node_events if e["args"]["run"] == run["args"]["run"]]
        assert inside and all(run["ts"] - 1 <= e["ts"] and e["ts"] + e["dur"] <= run["ts"] + run["dur"] + 1
                              for e in inside)
    passes = [e for e in events if e["cat"] == "Pass"]
    assert {p["args"]["node"] for p in passes} == {e["name"] for e in node_events}


@pytest.mark.gpu
def test_host_fallback_nodes_are_host_timed():
    from onnx import TensorProto as TP, helper

    x = helper.make_tensor_value_info("x", TP.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TP.FLOAT, None)
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                           no_kernel_node("r", "y", name="host_node")], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(*NO_KERNEL_OPSET)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = Session(m, profile=True)
    s.run(None, {"x": np.array([1, -2, 3, 0], np.float32)})
    clocks = {e.node: e.clock for e in s.profiler.events}
    assert clocks["host_node"] == "host" and clocks["relu"] == "device"
    assert [e["tid"] for e in s.profiler.trace() if e["name"] == "host_node"] == [1]


def _deviceless_profiler(clock: str | None = None) -> Profiler:
    """A Profiler (``clock`` as given) over a stand-in device without timestamp queries: its
    table's arithmetic only."""
    class _Info:
        features = frozenset()
        name = "none"

    class _Dev:
        info = _Info()

    return Profiler(_Dev(), clock)


def test_table_aggregates_runs():
    """The table's arithmetic, without a device."""
    prof = _deviceless_profiler()
    assert prof.clock == "host-wall"
    prof.events = [NodeEvent(0, "a", "Conv", "Conv", "v", "device", 0, 30, [("a/p1", 0, 10), ("a/p2", 10, 20)]),
                   NodeEvent(1, "a", "Conv", "Conv", "v", "device", 50, 10, [("a/p1", 50, 4), ("a/p2", 54, 6)]),
                   NodeEvent(0, "b", "Relu", "Relu", "w", "device", 30, 60)]
    rows = prof.table()
    assert [r["node"] for r in rows] == ["b", "a"]
    assert rows[1]["mean_us"] == 20 and rows[1]["calls"] == 2 and rows[1]["pass_us"] == {"p1": 7, "p2": 13}
    assert rows[0]["share"] == 0.6
    with pytest.raises(ExecutionError, match="has no timestamp-query"):
        _deviceless_profiler("device")
    with pytest.raises(ExecutionError, match="expected 'device' or 'host-wall'"):
        _deviceless_profiler("cpu")


@pytest.mark.gpu
def test_inference_session_enable_profiling(demo_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    so = onnx_quant.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = "prof"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sess = onnx_quant.InferenceSession(demo_model, so)
        plain = onnx_quant.InferenceSession(demo_model)
    feeds = _feeds(sess.session)
    sess.run(None, feeds)
    path = sess.end_profiling()
    assert path.startswith("prof_") and path.endswith(".json")
    assert {e["cat"] for e in json.loads((tmp_path / path).read_text())} >= {"Session", "Node"}
    assert plain.end_profiling() == ""


def _table_rows(lines: list[str]) -> list[list[str]]:
    """The node rows of ``profile``'s table (between the header and the "more"/total rows)."""
    head = next(i for i, ln in enumerate(lines) if ln.split()[:3] == ["node", "op", "kernel/variant"])
    return [ln.split() for ln in lines[head + 1:] if not ln.startswith(("trace:", "total ", "... ", "cold start "))]


@pytest.mark.gpu
def test_cli_profile_prints_the_table_and_writes_the_trace(demo_model, tmp_path):
    trace = tmp_path / "trace.json"
    out = subprocess.run([sys.executable, "-m", "onnx_quant", "profile", demo_model, "--runs", str(RUNS),
                          "--trace", str(trace)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("device: ") and lines[1].startswith("dims: N=1")
    assert lines[2].startswith(f"profile: {RUNS} run(s)")
    assert lines[3].split()[:3] == ["node", "op", "kernel/variant"]
    rows = _table_rows(lines)
    assert sum(ln.startswith("cold start ") for ln in lines) == 1  # where the session's cold start went
    times = [float(r[4]) for r in rows]
    assert times == sorted(times, reverse=True) and len(rows) >= 8
    total = next(ln for ln in lines if ln.startswith("total "))
    assert f"{len(rows)} nodes" in total and "100.0%" in total
    assert abs(float(total.split()[3]) - sum(times)) <= 0.1 * len(rows)
    events = json.loads(trace.read_text())
    nodes = [e for e in events if e["cat"] == "Node"]
    assert len(nodes) == RUNS * len(rows)
    assert {e["name"] for e in nodes} == {r[0] for r in rows}
    js = subprocess.run([sys.executable, "-m", "onnx_quant", "profile", "example", "--runs", "1", "--json"],
                        capture_output=True, text=True, timeout=300)
    assert js.returncode == 0, js.stderr
    doc = json.loads(js.stdout)
    assert doc["runs"] == 1 and doc["nodes"] and all("kernel" in n and "mean_us" in n for n in doc["nodes"])
    assert doc["dims"] == {"N": 1, "H": 32, "W": 32} and doc["inputs"] == {"image": [1, 3, 32, 32]}
    bad = subprocess.run([sys.executable, "-m", "onnx_quant", "profile", "example", "--runs", "0"],
                         capture_output=True, text=True, timeout=300)
    # a bad argument: exit 2 (docs/cli.md), one line
    assert bad.returncode == 2 and "--runs 0: expected at least 1" in bad.stderr and "Traceback" not in bad.stderr


def _long_named_chain(n: int = 6) -> onnx.ModelProto:
    """x -> Relu -> Neg -> ... with 90-character node names: one fused elementwise node whose name
    joins them all."""
    from onnx import TensorProto as TP, helper

    names = [f"/model/backbone/stage{i}/block{i}/activation_with_a_long_exported_name_{i}/Op" for i in range(n)]
    nodes, prev = [], "x"
    for i, name in enumerate(names):
        nodes.append(helper.make_node("Relu" if i % 2 == 0 else "Neg", [prev], [f"t{i}"], name=name))
        prev = f"t{i}"
    nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 64])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 64])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_format_table_bounds_its_width_and_counts_what_top_leaves_out():
    """Long (fused) names are cut in the table, --top says what it leaves out, a total row sums
    the nodes; no device needed."""
    from onnx_quant.backend_wgpu.profiling import NAME_WIDTH, clip

    prof = _deviceless_profiler()
    long = "+".join(f"/model/layer{i}/Relu" for i in range(40))
    prof.events = [NodeEvent(0, long, "ai.onnx_quant::FusedElementwise", "FusedElementwise", "inputs_1", "device", 0, 60),
                   NodeEvent(0, "b", "Conv", "Conv", "direct", "device", 60, 30),
                   NodeEvent(0, "c", "Relu", "Relu", "word_per_invocation", "device", 90, 10)]
    prof.runs = [(0, 0, 100)]
    table = prof.format_table()
    assert max(len(ln) for ln in table.splitlines()) < 200
    cut = clip(long, NAME_WIDTH)
    assert len(cut) == NAME_WIDTH and "…" in cut and cut.startswith("/model/layer0") and cut.endswith("layer39/Relu")
    assert table.splitlines()[2].startswith(cut)
    assert table.splitlines()[-1].split()[:4] == ["total", "3", "nodes", "100.0"]
    top = prof.format_table(1).splitlines()
    assert top[-2] == "... 2 more nodes (--top 1): 40.0 µs per run, 40.0%"
    assert top[-1].split()[:4] == ["total", "3", "nodes", "100.0"]
    assert prof.table()[0]["node"] == long  # --json keeps the whole name


@pytest.mark.gpu
def test_cli_profile_cuts_long_names_but_keeps_them_in_json_and_trace(tmp_path, capsys):
    from onnx_quant.cli import main

    path = tmp_path / "chain.onnx"
    onnx.save(_long_named_chain(), str(path))
    trace = tmp_path / "t.json"
    assert main(["profile", str(path), "--runs", "1", "--trace", str(trace), "--top", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert all(len(ln) < 200 for ln in out), max(out, key=len)
    assert out[1] == "dims: N=1 (all defaults: 1 on an input's first axis, 32 elsewhere; set them with --dim SYMBOL=V or --shape)"
    assert any(ln.startswith("total ") for ln in out)
    names = {e["name"] for e in json.loads(trace.read_text()) if e["cat"] == "Node"}
    assert any(len(n) > 400 for n in names)  # the fused node's whole name
    assert main(["profile", str(path), "--runs", "1", "--json", "--dim", "N=2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["inputs"] == {"x": [2, 64]} and max(len(n["node"]) for n in doc["nodes"]) > 400

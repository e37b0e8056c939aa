"""Whole-model benchmark: quantized models on the GPU (``backend_wgpu.Session``) beside
onnxruntime CPU, in the same process on the same inputs; per-node overhead on a chain of
small nodes; where a GPU run's time goes (host work, uploads, the submit, waiting + read-back).

    python benchmarks/bench_models.py [--repeat 10] [--chain 1000] [--adapter vulkan] [--exported [MODELS]]
                                      [--families cnn,mlp,transformer] [--formats qoperator,qdq,dynamic]
                                      [--baseline REV [--interleave ROUNDS]] [--json | --markdown]

``--baseline REV`` also times git revision REV (built once into a cache folder by
``benchmarks/baseline.py``) with this same script on the same models, in a subprocess right after
this tree's runs, and reports its latency and dispatches beside them (``speedup``: REV's GPU time
over this tree's). With ``--interleave ROUNDS`` both are timed once more side by side: REV in a
server subprocess (``--serve``), the two taking turns for ROUNDS rounds of ``--repeat`` runs per
model, so that a shared machine's drift over minutes hits both alike (the ``interleaved`` columns:
medians over every round).

Models: the model zoo's float CNN, MLP and transformer block (``onnx_quant.model_zoo``, the
builders' default sizes), quantized by onnxruntime.quantization in QOperator, QDQ and dynamic
format with per-channel weights. ``--exported`` adds the real-architecture models of
``onnx_quant.exported_models`` (YOLO head, MobileNetV3, DBNet, torch transformer, CRNN, the If/Loop
voice-activity model) in float and the three quantized forms. The compile columns run each model once
more at a second batch size and at a new image size / sequence length (``RESIZED_DIMS``,
``exported_models.SHAPE_CHANGES``) and count the pipelines that run needs which the first did not. Times are medians of ``--repeat`` runs after one warm-up run
(plans, compiles, allocates); a GPU run is end to end (host arrays in, host arrays out).
``ratio`` is GPU time / onnxruntime time (above 1 = the GPU is slower).

The time split of a GPU run comes from wrapping wgpu's ``GPUQueue.write_buffer``,
``GPUQueue.submit``, ``GPUBuffer.map_sync`` and ``GPUBuffer.read_mapped`` for the timed runs:
``upload`` is write_buffer, ``submit`` the submit call, ``wait+read`` mapping the staging buffer
(which waits for the GPU to finish: on lavapipe that is the kernels' execution) and copying
out; ``host`` is the rest (feeds check, packing, recording the commands, unpacking, Python).
Nodes that ran on the host (``host nodes``) are counted from ``session.stats`` when the
Session has host fallback; they make the GPU figure a mixed one.

Figures measured on the development machine are in docs/benchmarks.md ("## Whole models").
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import re
import logging
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np


from onnx import TensorProto, helper, numpy_helper

from onnx_quant import model_zoo
from onnx_quant.oracles import exact_onnxruntime_run, not_an_oracle

#: run shapes per family (the calibration shapes are model_zoo.CALIBRATION_DIMS)
RUN_DIMS = {"cnn": {"N": 1, "H": 32, "W": 32}, "mlp": {"N": 8}, "transformer": {"B": 1, "S": 16}}
#: a second batch size per family: the pipelines a run at it compiles after the first shape's runs
SECOND_DIMS = {"cnn": {"N": 2, "H": 32, "W": 32}, "mlp": {"N": 16}, "transformer": {"B": 2, "S": 16}}
#: a new image size / sequence length at the first batch size (the MLP has none)
RESIZED_DIMS = {"cnn": {"N": 1, "H": 40, "W": 40}, "transformer": {"B": 1, "S": 24}}


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- timing


class PhaseTimer:
    """Wraps wgpu's queue/buffer methods (class level, restored on exit) and sums the
    seconds spent in each phase while ``active``."""

    PHASES = ("upload", "submit", "wait+read")

    def __init__(self) -> None:
        self.totals = dict.fromkeys(self.PHASES, 0.0)
        self.calls = dict.fromkeys(self.PHASES, 0)
        self.active = False
        self._depth = 0
        self._patches: list[tuple[type, str, Any]] = []

    def reset(self) -> None:
        self.totals = dict.fromkeys(self.PHASES, 0.0)
        self.calls = dict.fromkeys(self.PHASES, 0)

    def _wrap(self, cls: type, name: str, phase: str) -> None:
        orig = getattr(cls, name)
        timer = self

        def wrapped(*a, **kw):
            # nested calls (map_sync flushes the queue with an empty submit) count once
            if not timer.active or timer._depth:
                return orig(*a, **kw)
            timer._depth += 1
            t0 = time.perf_counter()
            try:
                return orig(*a, **kw)
            finally:
                timer._depth -= 1
                timer.totals[phase] += time.perf_counter() - t0
                if name != "read_mapped":
                    timer.calls[phase] += 1

        setattr(cls, name, wrapped)
        self._patches.append((cls, name, orig))

    def __enter__(self) -> "PhaseTimer":
        import wgpu  # noqa: PLC0415

        from onnx_quant.backend_wgpu.device import get_device  # noqa: PLC0415, F401

        classes = {}
        for mod_name in ("wgpu.backends.wgpu_native",):
            try:
                mod = __import__(mod_name, fromlist=["GPUQueue"])
                classes["queue"] = mod.GPUQueue
                classes["buffer"] = mod.GPUBuffer
            except (ImportError, AttributeError):
                classes = {"queue": wgpu.GPUQueue, "buffer": wgpu.GPUBuffer}
        self._wrap(classes["queue"], "write_buffer", "upload")
        self._wrap(classes["queue"], "submit", "submit")
        self._wrap(classes["buffer"], "map_sync", "wait+read")
        self._wrap(classes["buffer"], "read_mapped", "wait+read")
        return self

    def __exit__(self, *exc: Any) -> None:
        for cls, name, orig in reversed(self._patches):
            setattr(cls, name, orig)
        self._patches.clear()


def _times(fn: Callable[[], Any], repeat: int, budget_s: float = 20.0) -> list[float]:
    """Seconds of up to ``repeat`` calls (fewer when they take more than ``budget_s``)."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max(1, repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    return times


# ----------------------------------------------------------------------------- models


def chain_model(nodes: int = 1000, width: int = 16):
    """``x [width] -> (Add c, Relu) x nodes/2 -> y``: per-node overhead on a tiny tensor."""
    c = numpy_helper.from_array(np.full(width, -0.001, np.float32), "c")
    graph_nodes = []
    cur = "x"
    for i in range(nodes):
        out = "y" if i == nodes - 1 else f"v{i}"
        if i % 2 == 0:
            graph_nodes.append(helper.make_node("Add", [cur, "c"], [out], name=f"add{i}"))
        else:
            graph_nodes.append(helper.make_node("Relu", [cur], [out], name=f"relu{i}"))
        cur = out
    graph = helper.make_graph(graph_nodes, "chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [width])], [c])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def quantized_models(families, formats) -> list[tuple[str, Any, dict[str, np.ndarray], dict[str, dict]]]:
    """(name, model, feeds, {"batch": feeds at a second batch size, "size": at a new size}) per
    family and format."""
    logging.getLogger().setLevel(logging.ERROR)
    out = []
    for fam in families:
        for fmt in formats:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = model_zoo.quantized(fam, fmt, per_channel=True)
            feeds = model_zoo.random_feeds(model, RUN_DIMS[fam], seed=1)
            changes = {"batch": model_zoo.random_feeds(model, SECOND_DIMS[fam], seed=2)}
            if fam in RESIZED_DIMS:
                changes["size"] = model_zoo.random_feeds(model, RESIZED_DIMS[fam], seed=3)
            out.append((f"{fam} {fmt}", model, feeds, changes))
    return out


def exported_models(names, *, shape_changes: bool = True) -> list[tuple[str, Any, dict[str, np.ndarray], dict[str, dict]]]:
    """The real-architecture models of ``onnx_quant.exported_models`` (float and every quantized form)
    as :func:`quantized_models` gives the zoo's; without ``shape_changes`` (a baseline revision that
    predates ``SHAPE_CHANGES``), no second shapes."""
    from onnx_quant import exported_models as em  # noqa: PLC0415

    logging.getLogger().setLevel(logging.ERROR)
    out = []
    for name in names:
        for form in em.FORMS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = em.build(name, form)
            changes = ({change: em.feeds(model, shapes, seed=2) for change, shapes in em.SHAPE_CHANGES[name].items()}
                       if shape_changes else {})
            # a row's name is its key beside the baseline's: the exported transformer is not the zoo's
            label = f"{name} (exported)" if name in RUN_DIMS else name
            out.append((f"{label} {form}", model, em.feeds(model, em.MODELS[name][1], seed=1), changes))
    return out


# ----------------------------------------------------------------------------- bench


def _ort_session(model):
    import onnxruntime as ort  # noqa: PLC0415

    so = ort.SessionOptions()
    so.log_severity_level = 3
    with not_an_oracle():  # timed as the user would run it; values come from the exact oracle
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def ort_optimized_nodes(model) -> int:
    """Nodes onnxruntime's CPU provider runs after all its graph optimizations (its saved
    optimized model): the count a GPU run's dispatches are held against."""
    import tempfile  # noqa: PLC0415

    import onnx  # noqa: PLC0415
    import onnxruntime as ort  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="onnx-quant-ort-opt-") as tmp:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = f"{tmp}/optimized.onnx"
        with not_an_oracle():  # its graph, not its values
            ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return len(onnx.load(so.optimized_model_filepath).graph.node)


def raw_call_floor_us(session, repeat: int = 9) -> tuple[float, float]:
    """µs per dispatch of the three wgpu-native calls alone (set pipeline, set bind group,
    dispatch) over the session's prebuilt plan, in one compute pass: the floor any Python host
    loop pays on this machine, measured beside the session's own recording cost; and µs per
    dispatch of that pass's end and the encoder's finish (wgpu-native validating and tracking
    each dispatch: the same whoever recorded them)."""
    from onnx_quant.backend_wgpu.device import _raw_pass_functions  # noqa: PLC0415

    gplan = next(iter(session._plans.values()))
    dispatches = session._prepared[gplan.key].dispatches  # the executor's commands per GPU step
    program = [c[5] + c[3] for st in gplan.gpu_steps for c in dispatches[st.index]]
    set_pipeline, set_bind_group, dispatch, null = _raw_pass_functions()
    times, finishes = [], []
    n = max(1, len(program))
    for _ in range(repeat):
        encoder = session.device.device.create_command_encoder()
        cpass = encoder.begin_compute_pass()
        h = cpass._internal
        t0 = time.perf_counter()
        for p, b, x, y, z in program:
            set_pipeline(h, p)
            set_bind_group(h, 0, b, 0, null)
            dispatch(h, x, y, z)
        t1 = time.perf_counter()
        cpass.end()
        finished = encoder.finish()
        finishes.append((time.perf_counter() - t1) / n * 1e6)
        times.append((t1 - t0) / n * 1e6)
        session.device.queue.submit([finished])
    return statistics.median(times), statistics.median(finishes)


def write_plots(result: dict[str, Any], directory: str) -> list[str]:
    """Latency per model (GPU and onnxruntime CPU) and dispatches per model (beside the nodes
    onnxruntime runs after its optimizations), as PNGs in ``directory``."""
    import plots  # noqa: PLC0415 - benchmarks/plots.py, beside this script

    rows = [r for r in result["rows"] if not r["model"].startswith("chain")]
    names = [r["model"] for r in rows]
    where = result["device"].split(" (")[0]
    return [
        plots.grouped_bars(f"{directory}/models_latency.png", f"Steady-state latency per run ({where})", names,
                           {"onnx-quant GPU": [r.get("gpu_ms") for r in rows],
                            "onnxruntime CPU": [r.get("ort_ms") for r in rows]}, "ms per run (log)", log=True),
        plots.grouped_bars(f"{directory}/models_dispatches.png", "GPU dispatches per run", names,
                           {"dispatches per run": [r.get("dispatches_per_run") for r in rows],
                            "model nodes": [r.get("nodes") for r in rows],
                            "onnxruntime nodes after its optimizations": [r.get("ort_nodes_optimized") for r in rows]},
                           "count"),
    ]


@contextlib.contextmanager
def pipeline_requests(device):
    """The set of pipelines (by identity) the device's cache handed out while active, whether it
    compiled them or found them: what a device with an empty pipeline cache would compile."""
    cache = device.pipelines
    used: set = set()

    def recording(name):
        real = getattr(cache, name)

        def method(*args, **kw):
            compiled = real(*args, **kw)
            used.add(id(compiled))
            return compiled
        return method

    names = [n for n in ("get", "for_pass") if hasattr(cache, n)]
    for name in names:
        setattr(cache, name, recording(name))
    try:
        yield used
    finally:
        for name in names:
            delattr(cache, name)


def bench_one(name: str, model, feeds, *, device, repeat: int, timer: PhaseTimer,
              shape_changes: dict[str, dict[str, np.ndarray]] | None = None) -> dict[str, Any]:
    from onnx_quant.backend_wgpu.reporting import host_node_count, host_nodes  # noqa: PLC0415

    row: dict[str, Any] = {"model": name, "nodes": len(model.graph.node),
                           "inputs": {k: list(v.shape) for k, v in feeds.items()}}
    try:
        ort_sess = _ort_session(model)
        row["ort_nodes_optimized"] = ort_optimized_nodes(model)
        ort_sess.run(None, feeds)
        row["ort_ms"] = statistics.median(_times(lambda: ort_sess.run(None, feeds), repeat)) * 1e3
        expected = exact_onnxruntime_run(model, feeds)  # uint8 x int8 sums exact on any CPU
    except Exception as e:  # pragma: no cover - onnxruntime is a test extra
        row["ort_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        expected = None
    session = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            session = _timing_session(model, device)
            if shape_changes and hasattr(device.pipelines, "forget"):
                # a cold pipeline cache: what a new shape compiles (and its first run's time) is
                # this model's own, not hidden by what the models before it compiled
                device.pipelines.forget()
            t0 = time.perf_counter()
            with pipeline_requests(device) as first_keys:
                got = session.run(None, feeds)
            row["first_run_ms"] = (time.perf_counter() - t0) * 1e3
            row["pipelines_first_run"] = len(first_keys)
            submits0 = device.stats.submits
            dispatches0 = session.stats.dispatches
            comp0 = device.pipelines.compilations
            per_run: list[dict[str, Any]] = []

            def one_run():
                session.run(None, feeds)
                per_run.append(dict(session.last_run_stats))

            timer.reset()
            timer.active = True
            times = _times(one_run, repeat)
            timer.active = False
            n = len(times)
            row["gpu_ms"] = statistics.median(times) * 1e3
            row["runs"] = n
            row["submits_per_run"] = (device.stats.submits - submits0) / n
            row["dispatches_per_run"] = (session.stats.dispatches - dispatches0) / n
            # medians over the runs, as the raw floor's: a preempted run does not move them
            for key in ("host_encode_us", "host_record_us"):
                row[f"{key}_per_dispatch"] = statistics.median(r.get(key, 0.0) / max(1, r["dispatches"])
                                                               for r in per_run)
            if model.graph.name == "chain":
                row["raw_floor_us_per_dispatch"], row["raw_end_finish_us_per_dispatch"] = raw_call_floor_us(session)
            row["compilations_after_warmup"] = device.pipelines.compilations - comp0
            # where the time goes, as means over the same runs (host = the rest of a run)
            split = {k: v / n * 1e3 for k, v in timer.totals.items()}
            split["host"] = max(0.0, statistics.fmean(times) * 1e3 - sum(split.values()))
            row["mean_ms"] = statistics.fmean(times) * 1e3
            row["split_ms"] = split
            row["host_nodes"] = host_nodes(session)
            for change, changed_feeds in (shape_changes or {}).items():
                # a new batch size (or image size / sequence length) after the first: what it
                # compiles (issue #11 asks for none), counted against this model's own first shape,
                # not the device's cache (which the models before this one filled)
                t0 = time.perf_counter()
                with pipeline_requests(device) as keys:
                    session.run(None, changed_feeds)
                row[f"first_run_new_{change}_ms"] = (time.perf_counter() - t0) * 1e3
                row[f"shape_{change}"] = {k: list(v.shape) for k, v in changed_feeds.items()}
                row[f"compilations_new_{change}"] = len(keys - first_keys)
            count = host_node_count(session)
            if count is not None:
                row["host_node_runs"] = count
        if expected is not None:
            diffs = [float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(e, np.float64)), initial=0.0))
                     for g, e in zip(got, expected)]
            row["max_abs_diff_vs_ort"] = max(diffs) if diffs else 0.0
        if "ort_ms" in row:
            row["ratio"] = row["gpu_ms"] / row["ort_ms"]
    except Exception as e:
        timer.active = False
        row["gpu_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        if session is not None:
            session.close()
    return row


def bench_items(families, formats, chain: int, exported, shape_changes: bool = True) -> list[tuple]:
    """The benchmark's models in order, as :func:`quantized_models` gives them: the zoo's, the
    exported ones, then the chain; the same list in every process given the same arguments."""
    items = quantized_models(families, formats)
    if not shape_changes:
        items = [(name, model, feeds, {}) for name, model, feeds, _ in items]
    items += exported_models(exported, shape_changes=shape_changes)
    if chain:
        width = 16
        items.append((f"chain of {chain} Add/Relu [{width}]", chain_model(chain, width),
                      {"x": np.random.default_rng(0).standard_normal(width).astype(np.float32)}, {}))
    return items


def _timing_session(model, device):
    """A session for latency runs; the chain measures the cost of a dispatch, so its nodes run
    one kernel each, unfused."""
    from onnx_quant.backend_wgpu.reporting import make_session, session_accepts  # noqa: PLC0415

    unfused = {"fuse_elementwise": False} if model.graph.name == "chain" and session_accepts("fuse_elementwise") else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_session(model, device=device, **unfused)


def serve_timings(items, device) -> None:
    """The baseline side of ``--interleave``: reads ``{"item": i, "repeat": k}`` lines on stdin and
    answers each with ``{"times": [...]}`` (seconds of ``k`` runs of item ``i``, one warmed-up session
    per item) or ``{"error": ...}``."""
    current: tuple[int, Any] | None = None
    for line in sys.stdin:
        req = json.loads(line)
        i = req["item"]
        try:
            if current is None or current[0] != i:
                if current is not None:
                    current[1].close()
                current = (i, _timing_session(items[i][1], device))
                current[1].run(None, items[i][2])
            sess, feeds = current[1], items[i][2]
            print(json.dumps({"times": _times(lambda: sess.run(None, feeds), req["repeat"])}), flush=True)
        except Exception as e:  # noqa: BLE001 - reported to the parent, which names the model
            print(json.dumps({"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}), flush=True)


def interleave(result: dict[str, Any], items, server, *, rounds: int, repeat: int, device,
               log: Callable[[str], None] = _say) -> None:
    """Time this tree and the baseline ``server`` (:func:`serve_timings` in a subprocess) in
    alternating rounds of ``repeat`` runs per model, so that the machine's drift hits both alike;
    each row gets ``interleaved``: both medians over every round and their ratio."""
    def ask(i: int, k: int) -> list[float]:
        server.stdin.write(json.dumps({"item": i, "repeat": k}) + "\n")
        server.stdin.flush()
        answer = json.loads(server.stdout.readline())
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer["times"]

    for i, (row, (name, model, feeds, _)) in enumerate(zip(result["rows"], items)):
        log(f"[{i + 1}/{len(items)}] {name}: interleaved with the baseline ...")
        sess = None
        try:
            sess = _timing_session(model, device)
            sess.run(None, feeds)
            ask(i, 1)  # the baseline's warm-up
            ours, theirs = [], []
            for _ in range(rounds):
                ours += _times(lambda: sess.run(None, feeds), repeat)
                theirs += ask(i, repeat)
            now, then = statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3
            row["interleaved"] = {"gpu_ms": now, "baseline_ms": then, "speedup": then / now, "runs": len(ours)}
        except Exception as e:  # noqa: BLE001 - a model one side cannot run is named in its row
            row["interleaved"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        finally:
            if sess is not None:
                sess.close()


def run(*, families=("cnn", "mlp", "transformer"), formats=model_zoo.FORMATS, chain: int = 1000,
        repeat: int = 10, adapter=None, exported=(), shape_changes: bool = True,
        log: Callable[[str], None] = _say) -> dict[str, Any]:
    from onnx_quant.backend_wgpu.device import get_device  # noqa: PLC0415

    device = get_device(adapter)
    rows = []
    with PhaseTimer() as timer:
        items = bench_items(families, formats, chain, exported, shape_changes)
        for i, (name, model, feeds, changes) in enumerate(items, 1):
            log(f"[{i}/{len(items)}] {name} ({len(model.graph.node)} nodes) ...")
            row = bench_one(name, model, feeds, device=device, repeat=repeat, timer=timer, shape_changes=changes)
            rows.append(row)
            if "gpu_ms" in row:
                log(f"    gpu {row['gpu_ms']:.2f} ms, onnxruntime {row.get('ort_ms', float('nan')):.3f} ms, "
                    f"ratio {row.get('ratio', float('nan')):.1f}, host nodes {len(row['host_nodes'])}")
            else:
                log(f"    gpu: {row.get('gpu_error')}")
    for row in rows:
        if row["model"].startswith("chain") and "gpu_ms" in row:
            row["gpu_us_per_node"] = row["gpu_ms"] * 1e3 / row["nodes"]
            if "ort_ms" in row:
                row["ort_us_per_node"] = row["ort_ms"] * 1e3 / row["nodes"]
    return {"device": device.info.name, "backend": device.info.backend, "repeat": repeat, "rows": rows}


def add_baseline(result: dict[str, Any], base: dict[str, Any]) -> None:
    """Put the baseline revision's figures beside this tree's, row by row (same model names)."""
    result["baseline_rev"] = base["rev"]
    by_model = {r["model"]: r for r in base["rows"]}
    for row in result["rows"]:
        b = by_model.get(row["model"], {})
        if "gpu_ms" in b:
            row["baseline_ms"] = b["gpu_ms"]
            row["baseline_dispatches_per_run"] = b.get("dispatches_per_run")
            if "gpu_ms" in row:
                row["speedup_vs_baseline"] = b["gpu_ms"] / row["gpu_ms"]
        elif "gpu_error" in b:
            row["baseline_error"] = b["gpu_error"]


def _f(v: Any, fmt: str = ".2f") -> str:
    return "" if v is None else format(v, fmt)


def _short_error(text: str) -> str:
    m = re.search(r"no GPU kernel for (\S+)", text)
    if m:
        tail = " nor a host fallback" if "cannot run it on the host" in text else ""
        return f"not run: no GPU kernel for {m.group(1)}{tail}"
    return text if len(text) <= 120 else text[:117] + "..."


def _host_ops(nodes: list[str]) -> str:
    ops = collections.Counter(re.sub(r".*\((.*)\)$", r"\1", n) for n in nodes)
    return ", ".join(f"{op} x{k}" if k > 1 else op for op, k in ops.items()) or "none"


def format_markdown(result: dict[str, Any]) -> str:
    lines = [f"Device: {result['device']}; median of {result['repeat']} runs after a warm-up "
             "(the split of a run: means over the same runs).", "",
             "| model | nodes | ort nodes (optimized) | dispatches per run | host µs per dispatch | GPU ms "
             "| onnxruntime ms | GPU / ort "
             "| submits per run | host % | upload % | submit % "
             "| wait + read-back % | nodes on the host | max \\|diff\\| vs ort | compiles at a 2nd batch size "
             "| compiles at a new size | first run at a new size ms |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in result["rows"]:
        if "gpu_ms" not in r:
            lines.append(f"| {r['model']} | {r['nodes']} | {r.get('ort_nodes_optimized', '')} | | | — "
                         f"| {_f(r.get('ort_ms'), '.3f')} | | | | | | | "
                         f"{_short_error(r.get('gpu_error', ''))} | | | | |")
            continue
        s = r["split_ms"]
        total = sum(s.values()) or 1.0
        pct = {k: 100.0 * v / total for k, v in s.items()}
        lines.append(
            f"| {r['model']} | {r['nodes']} | {r.get('ort_nodes_optimized', '')} | {_f(r.get('dispatches_per_run'), '.0f')} "
            f"| {_f(r.get('host_encode_us_per_dispatch'), '.1f')} "
            f"| {_f(r['gpu_ms'])} | {_f(r.get('ort_ms'), '.3f')} | {_f(r.get('ratio'), '.0f')} "
            f"| {_f(r['submits_per_run'], '.0f')} | {pct['host']:.0f} | {pct['upload']:.0f} | {pct['submit']:.0f} "
            f"| {pct['wait+read']:.0f} | {_host_ops(r['host_nodes'])} | {_f(r.get('max_abs_diff_vs_ort'), '.3g')} "
            f"| {r.get('compilations_new_batch', '')} | {r.get('compilations_new_size', '')} "
            f"| {_f(r.get('first_run_new_size_ms'), '.1f')} |")
    if "baseline_rev" in result:
        lines += ["", f"Beside revision {result['baseline_rev'][:10]} (built from git, timed by the same script "
                      "in a subprocess right after):", "",
                  "| model | dispatches per run (then → now) | GPU ms then | GPU ms now | speedup "
                  "| interleaved: GPU ms then | now | speedup |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in result["rows"]:
            then = _f(r.get("baseline_ms")) or _short_error(r.get("baseline_error", ""))
            il = r.get("interleaved", {})
            lines.append(f"| {r['model']} | {_f(r.get('baseline_dispatches_per_run'), '.0f')} → "
                         f"{_f(r.get('dispatches_per_run'), '.0f')} | {then} | {_f(r.get('gpu_ms'))} "
                         f"| {_f(r.get('speedup_vs_baseline'), '.1f')} "
                         f"| {_f(il.get('baseline_ms')) or _short_error(il.get('error', ''))} | {_f(il.get('gpu_ms'))} "
                         f"| {_f(il.get('speedup'), '.2f')} |")
    for r in result["rows"]:
        if "gpu_us_per_node" in r:
            lines.append("")
            if "raw_floor_us_per_dispatch" in r:
                lines.append(f"Host recording ({r['model']}): {r['host_record_us_per_dispatch']:.2f} µs per dispatch "
                             f"(with wgpu-native's pass end and finish {r['host_encode_us_per_dispatch']:.2f}); "
                             f"the three raw wgpu-native calls alone, same process: "
                             f"{r['raw_floor_us_per_dispatch']:.2f} µs (with their pass end and finish "
                             f"{r['raw_floor_us_per_dispatch'] + r['raw_end_finish_us_per_dispatch']:.2f}).")
            lines.append(f"Per-node overhead ({r['model']}): GPU {r['gpu_us_per_node']:.1f} µs per node "
                         f"(host side {r['split_ms']['host'] * 1e3 / r['nodes']:.1f} µs), onnxruntime "
                         f"{r.get('ort_us_per_node', float('nan')):.2f} µs per node.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--chain", type=int, default=1000, help="nodes in the per-node overhead chain (0: skip)")
    p.add_argument("--families", default="cnn,mlp,transformer")
    p.add_argument("--formats", default=",".join(model_zoo.FORMATS))
    p.add_argument("--adapter")
    p.add_argument("--exported", nargs="?", const="all", default="", metavar="MODELS",
                   help="also the real-architecture models of onnx_quant.exported_models in every form "
                        "(all, or a comma-separated list)")
    p.add_argument("--no-shape-changes", action="store_true",
                   help="skip the runs at a second batch size / new size (the compile columns)")
    p.add_argument("--interleave", type=int, metavar="ROUNDS", default=0,
                   help="with --baseline: also time this tree and the baseline side by side, in ROUNDS "
                        "alternating rounds of --repeat runs per model (a process each)")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the baseline side of --interleave
    g = p.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true")
    g.add_argument("--markdown", action="store_true")
    p.add_argument("--plots", metavar="DIR", help="also write PNG plots there (needs the bench extra)")
    p.add_argument("--baseline", metavar="REV", help="also time this git revision (e.g. the previous main)")
    args = p.parse_args(argv)
    exported = [m for m in args.exported.split(",") if m]
    if exported == ["all"]:
        from onnx_quant import exported_models as em  # noqa: PLC0415

        exported = list(em.MODELS)
    families = [f for f in args.families.split(",") if f]
    formats = [f for f in args.formats.split(",") if f]
    if args.serve:
        from onnx_quant.backend_wgpu.device import get_device  # noqa: PLC0415

        serve_timings(bench_items(families, formats, args.chain, exported, shape_changes=False), get_device(args.adapter))
        return 0
    result = run(families=families, formats=formats, chain=args.chain, repeat=args.repeat, adapter=args.adapter, exported=exported,
                 shape_changes=not args.no_shape_changes)
    if args.baseline:
        from baseline import run_json  # noqa: PLC0415 - benchmarks/baseline.py, beside this script

        _say(f"baseline {args.baseline} ...")
        # the baseline is timed only: a revision may predate the shape changes' tables
        forwarded = ["--json", "--no-shape-changes", "--repeat", str(args.repeat), "--chain", str(args.chain),
                     "--families", args.families, "--formats", args.formats, "--exported", ",".join(exported)] + (
                    ["--adapter", args.adapter] if args.adapter else [])
        add_baseline(result, run_json(args.baseline, "bench_models.py", forwarded))
        if args.interleave:
            from baseline import spawn  # noqa: PLC0415
            from onnx_quant.backend_wgpu.device import get_device  # noqa: PLC0415

            served = ["--serve"] + [a for a in forwarded if a not in ("--json", "--no-shape-changes")]
            server = spawn(args.baseline, "bench_models.py", served)
            try:
                interleave(result, bench_items(families, formats, args.chain, exported, shape_changes=False), server,
                           rounds=args.interleave, repeat=args.repeat, device=get_device(args.adapter))
            finally:
                server.stdin.close()
                server.wait(timeout=120)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(format_markdown(result))
    if args.plots:
        for path in write_plots(result, args.plots):
            _say(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Whole-model shape inference: onnx-quant against onnx's C++ pass and onnxruntime's
symbolic shape inference, on quantized models of about 1k to 8k nodes.

    python benchmarks/bench_inference.py [--sizes 1000,2000,4000,8000] [--repeat 5]
                                         [--models cnn-qdq,mlp-dynamic,...] [--json]
    python benchmarks/bench_inference.py --exported [--order rounds]   # real architectures
    python benchmarks/bench_inference.py --exported --real   # and the real-model tier (onnx_quant.real_models)
    python benchmarks/bench_inference.py --decoders [--sizes 500,5000]  # decoder graphs, KV cache
    python benchmarks/bench_inference.py --scale 32,64,128,256,476     # 100k nodes, time and peak RSS

Models come from ``onnx_quant.model_zoo``: float models with a symbolic batch (and H, W for
the CNN) quantized by ``onnxruntime.quantization`` with three blocks, then stamped out to
the size (``model_zoo.sized``); with ``--exported``, the real-architecture models of
``onnx_quant.exported_models`` (YOLO head, MobileNetV3, transformer, CRNN, If/Loop state model;
float, QOperator, QDQ, dynamic), each at its own size, not repeated blocks. Every tool gets the same ``ModelProto`` (without
``value_info``) and returns a model with the values typed; each is timed in one process,
median of ``--repeat`` runs (onnxruntime's, the slowest, ``--ort-repeat``).
All three are single-threaded, so the default clock is the process's CPU time, which a busy
shared machine disturbs far less than wall time (``--clock wall`` for wall time). Each
tool's runs come back to back (``--order rounds``: one run of each per round), after one
warm-up run of each, and each run starts with every earlier result freed. The "copy" column times ``ModelProto.CopyFrom`` of the
same model the same way: every one of the three tools returns a new model and so pays at
least that (for the big models, mostly page faults on fresh memory, so it varies with what
the allocator kept from the run before). The "reads" column (``python_reads``) times the
protobuf reads any pass written in Python must make; copy + reads is a floor that a Python
pass returning a new model cannot go below, and its ratio to onnxruntime's time is printed.
onnxruntime's pass may fail (it needs every op to be known and every dim resolvable): the
failure is recorded in the table.

With ``--decoders`` the models are ``onnx_quant.decoder_models``' decoders with a KV cache
(``decoder:<style>-<form>``: the torch exporter's graph, onnxruntime's GroupQueryAttention and
MultiHeadAttention forms; float, QDQ, MatMulNBits, DynamicQuantizeMatMul), each stamped to about
each ``--sizes`` node count by its layer count. Two more peers run when installed (they are
optional: the output names those missing): onnxslim's shape inference (``onnxslim.core.shape_infer``:
its copy of onnxruntime's symbolic pass, falling back to onnx's) and onnx-tool (concrete shapes
only: every symbol bound, the decoder's to batch 1, past 8, sequence 4, any other to 16).
onnx's C++ pass runs with ``data_prop=True`` (the strongest it has).

``--scale L1,L2,...`` infers the Llama-3-8B-wide decoder (``--scale-model``, default
exporter-qdq) at each layer count, saved as a file whose weights are references into an external
file that is never written (gigabytes no pass may read), each tool in a fresh process: CPU time
(median of ``--repeat`` runs after a first) and the peak resident memory of the first run above
the process's memory once the model is loaded (Linux VmHWM, reset with /proc/self/clear_refs).

The "typed" columns count node outputs given an element type and a shape of known rank
whose dims are all known or symbolic (onnx and onnxruntime answer unknown dims with fresh
``unk__`` symbols; those count as typed too).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path


import onnx
import onnxruntime

from onnx_quant import decoder_models, exported_models, inference
from onnx_quant import model_zoo
from onnx_quant import real_models

#: name -> (family, format, per_channel, builder arguments): realistic widths, small enough
#: that the 8k-node models stay a few tens of MB
MODELS = {
    "cnn-qdq": ("cnn", "qdq", True, {"channels": 64}),
    "cnn-qoperator": ("cnn", "qoperator", False, {"channels": 64}),
    "mlp-dynamic": ("mlp", "dynamic", False, {"features": 256, "hidden": 256}),
    "transformer-qdq": ("transformer", "qdq", True, {"d_model": 256, "heads": 4, "ffn": 1024}),  # BERT-mini widths
}
#: real-architecture models (``onnx_quant.exported_models``), each at its own size: exported:<model>-<form>
EXPORTED = [f"exported:{name}-{form}" for name in exported_models.MODELS for form in exported_models.FORMS]
#: the real-model tier (``onnx_quant.real_models``: models shipped in pinned wheels, as shipped and
#: quantized), value_info stripped: real:<model>-<form>
REAL = [f"real:{name}-{form}" for name, form in real_models.CASES]
#: decoders with a KV cache (``onnx_quant.decoder_models``), sized by layers: decoder:<style>-<form>
DECODERS = [f"decoder:{style}-{form}" for style in decoder_models.STYLES for form in decoder_models.FORMS]


def decoder_config(style: str, layers: int) -> decoder_models.DecoderConfig:
    return decoder_models.DecoderConfig(layers=layers, kv_heads=4 if style == "mha" else 2)


def build(name: str, nodes: int) -> onnx.ModelProto:
    """A zoo model stamped out to about ``nodes`` nodes, a decoder of about ``nodes`` nodes, or an
    exported model (its own size)."""
    if name in MODELS:
        family, fmt, per_channel, kw = MODELS[name]
        return model_zoo.sized(family, fmt, nodes, per_channel=per_channel, **kw)
    if name.startswith("real:"):
        model = real_models.load(*name.removeprefix("real:").rsplit("-", 1))
        del model.graph.value_info[:]
        return model
    if name in DECODERS:
        style, form = name.removeprefix("decoder:").split("-")
        layers = decoder_models.layers_for(style, form, nodes)
        return decoder_models.strip_types(decoder_models.build(style, form, decoder_config(style, layers)))
    model, form = name.removeprefix("exported:").rsplit("-", 1)
    return exported_models.build(model, form)


def ours(model: onnx.ModelProto) -> onnx.ModelProto:
    return inference.infer_shapes(model)


def onnx_cpp(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


def ort_symbolic(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    # for big models it saves a temporary model with external data in the working directory
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="bench-inference-ort-") as tmp:
        os.chdir(tmp)
        try:
            out = SymbolicShapeInference.infer_shapes(model)
        finally:
            os.chdir(cwd)
    if out is None:
        raise RuntimeError("returned no model")
    return out


def onnxslim_infer(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxslim.core  # noqa: PLC0415 - an optional peer

    return onnxslim.core.shape_infer(model)


#: what onnx-tool, which takes concrete shapes only, binds the decoders' symbols to; any other is 16
ONNX_TOOL_BINDINGS = decoder_models.bindings(1, 8, 4)


def onnx_tool_infer(model: onnx.ModelProto):
    import warnings  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415
    import onnx_tool  # noqa: PLC0415 - an optional peer

    feeds = {}
    inits = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else
                 (inference.dims.evaluate(inference.dims.parse(d.dim_param), ONNX_TOOL_BINDINGS) or 16)
                 if d.dim_param else 16 for d in tt.shape.dim]
        feeds[vi.name] = np.zeros(shape, onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it warns once per op it has no profiler for
        tool = onnx_tool.Model(model)
        tool.graph.shape_infer(feeds)
    return tool


def typed(model, names: set[str]) -> int:
    """Node outputs with an element type and a shape of known rank, every dim a value or a name
    (onnx-tool's result: names its tensor map gives a shape)."""
    if not isinstance(model, onnx.ModelProto):
        tensors = model.graph.tensormap
        return sum(1 for name in names if name in tensors and tensors[name].shape is not None)
    found = set()
    for v in list(model.graph.value_info) + list(model.graph.output):
        if v.name not in names or not v.type.HasField("tensor_type"):
            continue
        tt = v.type.tensor_type
        if tt.elem_type and tt.HasField("shape") and all(d.HasField("dim_value") or d.HasField("dim_param") for d in tt.shape.dim):
            found.add(v.name)
    return len(found)


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """What returning a typed model costs before any inference: a copy of the input (weights
    included), as each of the three tools makes. Timed beside them as the floor."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def python_reads(model: onnx.ModelProto) -> dict:
    """The least a pass written in Python must do besides copying the model: read each
    node's domain, op type, inputs, outputs and attributes and each initializer's name,
    location, type and dims from protobuf once, and keep the names in a dict. No inference."""
    names: dict = {}
    for t in model.graph.initializer:
        t.data_location
        dims = t.dims
        names[t.name] = (t.data_type, tuple(dims[:]) if len(dims) else ())
    for node in model.graph.node:
        node.domain, node.op_type
        names.update(dict.fromkeys(node.input[:]))
        for a in node.attribute:
            a.SerializeToString()
        names.update(dict.fromkeys(node.output[:], 1))
    return names


def timed_once(fn, model):
    """(seconds, result model) or (None, error text); the caller has freed earlier results."""
    gc.collect()
    t = clock()
    try:
        out = fn(model)
    except Exception as e:  # onnxruntime's pass gives up on some models: that is a result
        return None, f"{type(e).__name__}: {' '.join(str(e).split())[:80]}"
    return clock() - t, out


#: optional peers: (tool, module to import, function)
PEERS = (("slim", "onnxslim", onnxslim_infer), ("tool", "onnx_tool", onnx_tool_infer))
#: every tool timed, in order; peers are added by :func:`use_peers` when installed
TOOLS = [("copy", copy_model), ("reads", python_reads), ("ours", ours), ("onnx", onnx_cpp), ("ort", ort_symbolic)]
#: what the tables call each inference tool
LABELS = {"ours": "ours", "onnx": "onnx", "ort": "onnxruntime", "slim": "onnxslim", "tool": "onnx-tool"}


def use_peers() -> list[str]:
    """Adds the installed optional peers to TOOLS; returns the missing ones' package names."""
    import importlib.util  # noqa: PLC0415

    missing = []
    for tool, module, fn in PEERS:
        if importlib.util.find_spec(module) is None:
            missing.append(module)
        elif all(t != tool for t, _ in TOOLS):
            TOOLS.append((tool, fn))
    return missing


#: the tools that get ``--ort-repeat`` runs (onnxslim runs a copy of onnxruntime's pass)
SLOW_TOOLS = ("ort", "slim", "tool")


def inference_tools() -> list[str]:
    return [t for t, _ in TOOLS if t in LABELS]


def measure(name: str, nodes: int, repeat: int, ort_repeat: int, order: str = "series") -> dict:
    model = build(name, nodes)
    outputs = {o for n in model.graph.node for o in n.output if o}
    row = {"model": name, "nodes": len(model.graph.node), "values": len(outputs),
           "bytes": model.ByteSize()}
    for _, fn in TOOLS:  # warm up: imports (onnxruntime's pass imports sympy), schema caches
        try:
            fn(model)
        except Exception:  # recorded by the timed runs
            pass
    # "series": each tool's runs back to back, so each run finds the memory its own previous
    # run freed (warm for all: the conservative order, since the other tools allocate more);
    # "rounds": one run per tool per round, so that a shared machine's drifts fall on all
    # alike and each run finds what another tool freed
    runs = {tool: ort_repeat if tool in SLOW_TOOLS else repeat for tool, _ in TOOLS}
    if order == "series":
        plan = [(tool, fn) for tool, fn in TOOLS for _ in range(runs[tool])]
    else:
        plan = [(tool, fn) for r in range(max(runs.values())) for tool, fn in TOOLS if r < runs[tool]]
    times: dict[str, list[float]] = {tool: [] for tool, _ in TOOLS}
    results, errors = {}, {}
    for tool, fn in plan:
        if tool in errors:
            continue
        results.pop(tool, None)  # no run pays for an earlier result still alive
        t, out = timed_once(fn, model)
        if t is None:
            errors[tool] = out
        else:
            times[tool].append(t)
            results[tool] = out
    for tool, _ in TOOLS:
        row[f"{tool}_s"] = statistics.median(times[tool]) if times[tool] and tool not in errors else None
        if tool in errors:
            row[f"{tool}_error"] = errors[tool]
    for tool in inference_tools():
        row[f"{tool}_typed"] = typed(results[tool], outputs) if tool in results else None
    return row


def fmt_ms(s: float | None) -> str:
    return "fails" if s is None else f"{s * 1e3:.1f}"


def table(rows: list[dict]) -> list[str]:
    tools = [t for t in inference_tools() if any(f"{t}_s" in r for r in rows)]
    head = ("| model | nodes | " + " | ".join(f"{LABELS[t]} ms" for t in tools) + " | ours/onnx | ours/onnxruntime | "
            "copy ms | reads ms | (copy + reads)/onnxruntime | ours µs/node | typed: "
            + " / ".join(LABELS[t] for t in tools) + " (of) |")
    lines = [head, "|---|---:|" + "---:|" * (len(tools) + 7) + "---|"]
    for r in rows:
        def ratio(other: str, digits: int, mine: str = "ours") -> str:
            a, b = r.get(f"{mine}_s"), r.get(f"{other}_s")
            return "—" if a is None or b is None else f"{a / b:.{digits}f}"

        def cell(tool: str) -> str:
            err = r.get(f"{tool}_error")
            return fmt_ms(r.get(f"{tool}_s")) + (f" ({err})" if err else "")

        r["floor_s"] = r["copy_s"] + r["reads_s"]
        per_node = "—" if r["ours_s"] is None else f"{r['ours_s'] / r['nodes'] * 1e6:.1f}"
        typed_counts = " / ".join("—" if r.get(f"{t}_typed") is None else str(r[f"{t}_typed"]) for t in tools)
        lines.append(f"| {r['model']} | {r['nodes']} | " + " | ".join(cell(t) for t in tools) + " | "
                     f"{ratio('onnx', 2)} | {ratio('ort', 3)} | {cell('copy')} | {cell('reads')} | "
                     f"{ratio('ort', 3, 'floor')} | {per_node} | {typed_counts} ({r['values']}) |")
    return lines


def growth(rows: list[dict]) -> list[str]:
    """Per model: time per node at the largest size over time per node at the smallest."""
    out = []
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == name]
        if len(mine) < 2:
            continue
        a, b = mine[0], mine[-1]
        if a["ours_s"] is None or b["ours_s"] is None:
            continue
        per = lambda r: r["ours_s"] / r["nodes"]  # noqa: E731
        out.append(f"{name}: µs/node {per(a) * 1e6:.1f} at {a['nodes']} nodes, {per(b) * 1e6:.1f} at {b['nodes']} "
                   f"(x{per(b) / per(a):.2f} for x{b['nodes'] / a['nodes']:.1f} nodes)")
    return out


def ratio_summary(rows: list[dict]) -> list[str]:
    """ours/onnx over the rows: median and worst (issue 24's goal: median <= 1.5, none above 3)."""
    ratios = sorted((r["ours_s"] / r["onnx_s"], r["model"]) for r in rows if r["ours_s"] and r["onnx_s"])
    if not ratios:
        return []
    return [f"ours/onnx over {len(ratios)} models: median {statistics.median(x for x, _ in ratios):.2f}, "
            f"worst {ratios[-1][0]:.2f} ({ratios[-1][1]}), {sum(x > 3 for x, _ in ratios)} above 3"]


def machine() -> str:
    import importlib.metadata  # noqa: PLC0415

    peers = []
    for _, module, _ in PEERS:
        try:
            peers.append(f"{module} {importlib.metadata.version(module.replace('_', '-'))}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}" + "".join(f", {p}" for p in peers))


# ---------------------------------------------------------------- --scale: a fresh process per tool
def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure_one(tool: str, path: str, repeat: int) -> dict:
    """In this (fresh) process: load the model at ``path`` (external data not loaded), then run
    ``tool`` on it ``repeat`` times; the peak resident memory of the first run above the memory
    held once the model is loaded, and the median CPU time of the later runs (the first alone
    when ``repeat`` is 1)."""
    fn = dict(TOOLS)[tool]
    model = onnx.load(path, load_external_data=False)
    gc.collect()
    base = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    times = []
    for i in range(repeat):
        t = clock()
        out = fn(model)
        times.append(clock() - t)
        if i == 0:
            peak = _status_kb("VmHWM") - base
        del out
        gc.collect()
    return {"s": statistics.median(times[1:] or times), "peak_kb": peak, "base_kb": base}


def scale_rows(layer_counts: list[int], model_name: str, tools: list[str], repeat: int) -> list[dict]:
    """The ``--scale`` decoder at each layer count, each tool in a fresh process."""
    import dataclasses  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    style, form = model_name.split("-")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-inference-scale-") as tmp:
        for layers in layer_counts:
            cfg = dataclasses.replace(decoder_models.LLAMA_8B, layers=layers)
            model = decoder_models.strip_types(decoder_models.build(style, form, cfg, external_data="weights.bin"))
            path = Path(tmp) / f"decoder-{layers}.onnx"
            onnx.save(model, str(path))  # the weights file is never written: no tool may need it
            row = {"layers": layers, "nodes": len(model.graph.node), "model_bytes": path.stat().st_size,
                   "weight_bytes": decoder_models.weight_bytes(model)}
            del model
            for tool in tools:
                cmd = [sys.executable, __file__, "--measure-one", tool, str(path), "--repeat", str(repeat),
                       "--clock", "cpu" if clock is time.process_time else "wall"]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode:
                    row[f"{tool}_error"] = (done.stderr.strip().splitlines() or ["failed"])[-1][:80]
                    continue
                got = json.loads(done.stdout)
                row[f"{tool}_s"], row[f"{tool}_peak_kb"] = got["s"], got["peak_kb"]
            rows.append(row)
            print(f"  measured {model_name} at {layers} layers ({row['nodes']} nodes)", file=sys.stderr)
    return rows


def scale_table(rows: list[dict], tools: list[str]) -> list[str]:
    head = ("| layers | nodes | model MB | external weights GB (never read) | "
            + " | ".join(f"{LABELS[t]} ms" for t in tools) + " | ours/onnx | "
            + " | ".join(f"{LABELS[t]} µs/node" for t in tools) + " | "
            + " | ".join(f"{LABELS[t]} peak MB" for t in tools) + " |")
    lines = [head, "|" + "---:|" * (5 + 3 * len(tools))]
    for r in rows:
        def ms(t):
            return r.get(f"{t}_error") or fmt_ms(r.get(f"{t}_s"))

        def per(t):
            return "—" if r.get(f"{t}_s") is None else f"{r[f'{t}_s'] / r['nodes'] * 1e6:.1f}"

        def peak(t):
            return "—" if r.get(f"{t}_peak_kb") is None else f"{r[f'{t}_peak_kb'] / 1024:.0f}"

        ratio = "—" if r.get("ours_s") is None or r.get("onnx_s") is None else f"{r['ours_s'] / r['onnx_s']:.2f}"
        lines.append(f"| {r['layers']} | {r['nodes']} | {r['model_bytes'] / 1e6:.1f} | {r['weight_bytes'] / 1e9:.0f} | "
                     + " | ".join(ms(t) for t in tools) + f" | {ratio} | " + " | ".join(per(t) for t in tools) + " | "
                     + " | ".join(peak(t) for t in tools) + " |")
    return lines


def linearity(rows: list[dict], tools: list[str]) -> list[str]:
    """Per tool: the exponent b of time ~ nodes^b (least squares on the logs; 1 is linear) and
    the time per node at the smallest and the largest size."""
    import math  # noqa: PLC0415

    out = []
    for t in tools:
        pts = [(math.log(r["nodes"]), math.log(r[f"{t}_s"])) for r in rows if r.get(f"{t}_s")]
        if len(pts) < 2:
            continue
        mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
        b = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
        per = [(r["nodes"], r[f"{t}_s"] / r["nodes"] * 1e6) for r in rows if r.get(f"{t}_s")]
        out.append(f"{LABELS[t]}: time ~ nodes^{b:.2f}; µs/node {per[0][1]:.1f} at {per[0][0]} nodes, "
                   f"{per[-1][1]:.1f} at {per[-1][0]} (x{per[-1][0] / per[0][0]:.1f} nodes)")
    return out


def plot(rows: list[dict], path: str, order: str) -> str:
    """Time per node count, one line per (model, tool)."""
    import plots  # benchmarks/plots.py, beside this script

    series = {}
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == name]
        for tool, label in (("ours", "onnx-quant"), ("onnx", "onnx C++"), ("ort", "onnxruntime symbolic")):
            series[f"{name}: {label}"] = ([r["nodes"] for r in mine],
                                          [None if r[f"{tool}_s"] is None else r[f"{tool}_s"] * 1e3 for r in mine])
    return plots.lines(path, f"Shape inference time per model size ({order} order)", series, "nodes",
                       "ms (log)", logx=True, logy=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000,2000,4000,8000", help="comma-separated node counts")
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated, of {', '.join(MODELS)} and the exported models exported:<model>-<form> "
                        f"({', '.join(exported_models.MODELS)}; {', '.join(exported_models.FORMS)})")
    p.add_argument("--exported", action="store_true", help="every exported model instead of --models (--sizes unused)")
    p.add_argument("--real", action="store_true", help="every model of the real-model tier (with --exported: both)")
    p.add_argument("--decoders", action="store_true", help="every decoder model (decoder:<style>-<form>) at --sizes")
    p.add_argument("--scale", metavar="LAYERS", help="comma-separated layer counts of the Llama-3-8B-wide decoder "
                                                     "with external weights: time and peak memory per tool")
    p.add_argument("--scale-model", default="exporter-qdq", help="<style>-<form> of the --scale decoder")
    p.add_argument("--scale-tools", default="ours,onnx", help="tools of the --scale run (of ours, onnx, ort, slim)")
    p.add_argument("--measure-one", nargs=2, metavar=("TOOL", "PATH"), help=argparse.SUPPRESS)
    p.add_argument("--repeat", type=int, default=5, help="runs of ours and onnx's per model (median)")
    p.add_argument("--ort-repeat", type=int, default=3, help="runs of onnxruntime's per model (median)")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="process CPU time (default) or wall time")
    p.add_argument("--order", choices=("series", "rounds"), default="series",
                   help="each tool's runs back to back (default) or one run of each per round")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="also plot time per node count (needs the bench extra)")
    args = p.parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]
    missing = use_peers()
    if args.measure_one:
        print(json.dumps(measure_one(*args.measure_one, args.repeat)))
        return 0
    logging.getLogger().setLevel(logging.ERROR)  # the quantizer suggests pre-processing, per model
    logging.getLogger("onnxruntime").setLevel(logging.CRITICAL)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        names = EXPORTED if args.exported else DECODERS if args.decoders else [] if args.real else \
            [m.strip() for m in args.models.split(",") if m.strip()]
        names = names + (REAL if args.real else [])
        unknown = [m for m in names if m not in MODELS and m not in EXPORTED and m not in DECODERS and m not in REAL]
        layer_counts = [int(x) for x in args.scale.split(",") if x.strip()] if args.scale else []
        scale_tools = [t.strip() for t in args.scale_tools.split(",") if t.strip()]
        if args.scale and (f"decoder:{args.scale_model}" not in DECODERS or any(n <= 0 for n in layer_counts)
                           or any(t not in dict(TOOLS) or t not in LABELS for t in scale_tools)):
            raise ValueError(f"--scale needs positive layer counts, a --scale-model of "
                             f"{', '.join(d.removeprefix('decoder:') for d in DECODERS)} and --scale-tools of "
                             f"installed tools ({', '.join(inference_tools())})")
        if unknown or not sizes or any(s <= 0 for s in sizes):
            raise ValueError(f"unknown model {unknown[0]!r}" if unknown else "sizes must be positive ints")
    except ValueError as e:
        print(f"bench_inference: error: {e}", file=sys.stderr)
        return 2
    if missing:
        print(f"bench_inference: peers not installed (pip install {' '.join(m.replace('_', '-') for m in missing)}): "
              f"{', '.join(missing)}", file=sys.stderr)
    if args.scale:
        rows = scale_rows(layer_counts, args.scale_model, scale_tools, args.repeat)
        if args.json:
            print(json.dumps({"date": datetime.date.today().isoformat(), "machine": machine(), "clock": args.clock,
                              "model": args.scale_model, "rows": rows}, indent=1))
            return 0
        print(f"date {datetime.date.today().isoformat()}; {machine()}; clock: {args.clock}; decoder "
              f"{args.scale_model}, Llama-3-8B widths; peers missing: {', '.join(missing) or 'none'}")
        for line in scale_table(rows, scale_tools) + [""] + linearity(rows, scale_tools):
            print(line)
        return 0
    rows = []
    for name in names:
        for size in sizes if name not in EXPORTED and name not in REAL else sizes[:1]:  # these have one size
            row = measure(name, size, args.repeat, args.ort_repeat, args.order)
            rows.append(row)
            if not args.json:
                print(f"  measured {name} at {row['nodes']} nodes", file=sys.stderr)
    if args.plot:
        print(f"  wrote {plot(rows, args.plot, args.order)}", file=sys.stderr)
    if args.json:
        print(json.dumps({"date": datetime.date.today().isoformat(), "machine": machine(), "clock": args.clock,
                          "order": args.order,
                          "rows": rows}, indent=1))
        return 0
    print(f"date {datetime.date.today().isoformat()}; {machine()}; clock: {args.clock}; order: {args.order}; "
          f"peers missing: {', '.join(missing) or 'none'}")
    for line in table(rows) + [""] + growth(rows) + ratio_summary(rows):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

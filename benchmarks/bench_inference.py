"""Whole-model shape inference: onnx-quant against onnx's C++ pass and onnxruntime's
symbolic shape inference, on quantized models of about 1k to 8k nodes.

    python benchmarks/bench_inference.py [--sizes 1000,2000,4000,8000] [--repeat 5]
                                         [--models cnn-qdq,mlp-dynamic,...] [--json]
    python benchmarks/bench_inference.py --exported [--order rounds]   # real architectures
    python benchmarks/bench_inference.py --exported --real --data-prop  # and the real-model tier

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

from onnx_quant import exported_models, inference
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


def build(name: str, nodes: int) -> onnx.ModelProto:
    """A zoo model stamped out to about ``nodes`` nodes, or an exported model (its own size)."""
    if name in MODELS:
        family, fmt, per_channel, kw = MODELS[name]
        return model_zoo.sized(family, fmt, nodes, per_channel=per_channel, **kw)
    if name.startswith("real:"):
        model = real_models.load(*name.removeprefix("real:").rsplit("-", 1))
        del model.graph.value_info[:]
        return model
    model, form = name.removeprefix("exported:").rsplit("-", 1)
    return exported_models.build(model, form)


def ours(model: onnx.ModelProto) -> onnx.ModelProto:
    return inference.infer_shapes(model)


#: whether onnx's pass runs with data propagation (``--data-prop``: the anchor of issue 24's figures)
DATA_PROP = False


def onnx_cpp(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model, data_prop=DATA_PROP)


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


def typed(model: onnx.ModelProto, names: set[str]) -> int:
    """Node outputs with an element type and a shape of known rank, every dim a value or a name."""
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


TOOLS = (("copy", copy_model), ("reads", python_reads), ("ours", ours), ("onnx", onnx_cpp), ("ort", ort_symbolic))


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
    runs = {tool: ort_repeat if tool == "ort" else repeat for tool, _ in TOOLS}
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
    for tool in ("ours", "onnx", "ort"):
        row[f"{tool}_typed"] = typed(results[tool], outputs) if tool in results else None
    return row


def fmt_ms(s: float | None) -> str:
    return "fails" if s is None else f"{s * 1e3:.1f}"


def table(rows: list[dict]) -> list[str]:
    head = ("| model | nodes | ours ms | onnx ms | onnxruntime ms | ours/onnx | ours/onnxruntime | copy ms "
            "| reads ms | (copy + reads)/onnxruntime | ours µs/node | typed: ours / onnx / onnxruntime (of) |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        def ratio(other: str, digits: int, mine: str = "ours") -> str:
            a, b = r[f"{mine}_s"], r[f"{other}_s"]
            return "—" if a is None or b is None else f"{a / b:.{digits}f}"

        def cell(tool: str) -> str:
            err = r.get(f"{tool}_error")
            return fmt_ms(r[f"{tool}_s"]) + (f" ({err})" if err else "")

        r["floor_s"] = r["copy_s"] + r["reads_s"]
        per_node = "—" if r["ours_s"] is None else f"{r['ours_s'] / r['nodes'] * 1e6:.1f}"
        typed_counts = " / ".join("—" if r[f"{t}_typed"] is None else str(r[f"{t}_typed"]) for t in ("ours", "onnx", "ort"))
        lines.append(f"| {r['model']} | {r['nodes']} | {cell('ours')} | {cell('onnx')} | {cell('ort')} | "
                     f"{ratio('onnx', 2)} | {ratio('ort', 3)} | {cell('copy')} | {cell('reads')} | {ratio('ort', 3, 'floor')} | "
                     f"{per_node} | {typed_counts} ({r['values']}) |")
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
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}")


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
    p.add_argument("--data-prop", action="store_true", help="onnx's pass with data_prop=True")
    p.add_argument("--repeat", type=int, default=5, help="runs of ours and onnx's per model (median)")
    p.add_argument("--ort-repeat", type=int, default=3, help="runs of onnxruntime's per model (median)")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="process CPU time (default) or wall time")
    p.add_argument("--order", choices=("series", "rounds"), default="series",
                   help="each tool's runs back to back (default) or one run of each per round")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="also plot time per node count (needs the bench extra)")
    args = p.parse_args(argv)
    global clock, DATA_PROP
    clock = CLOCKS[args.clock]
    DATA_PROP = args.data_prop
    logging.getLogger().setLevel(logging.ERROR)  # the quantizer suggests pre-processing, per model
    logging.getLogger("onnxruntime").setLevel(logging.CRITICAL)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        names = EXPORTED if args.exported else [] if args.real else [m.strip() for m in args.models.split(",") if m.strip()]
        names += REAL if args.real else []
        unknown = [m for m in names if m not in MODELS and m not in EXPORTED and m not in REAL]
        if unknown or not sizes or any(s <= 0 for s in sizes):
            raise ValueError(f"unknown model {unknown[0]!r}" if unknown else "sizes must be positive ints")
    except ValueError as e:
        print(f"bench_inference: error: {e}", file=sys.stderr)
        return 2
    rows = []
    for name in names:
        for size in sizes if name in MODELS else sizes[:1]:  # an exported model has one size
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
    print(f"date {datetime.date.today().isoformat()}; {machine()}; clock: {args.clock}; order: {args.order}")
    for line in table(rows) + [""] + growth(rows) + ratio_summary(rows):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

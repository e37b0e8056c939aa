"""The ``infer``, ``check`` and ``example`` subcommands (wired in ``onnx_quant.cli``).

Each handler takes the parsed arguments and returns an exit code; unusable input raises
``ModelLoadError``, which the dispatcher turns into one line and exit 2.
"""

from __future__ import annotations

import argparse
import sys

import onnx

from onnx_quant.cli import EXIT_OK, EXIT_PROBLEMS, EXIT_UNUSABLE
from onnx_quant.dtypes import type_name
from onnx_quant.examples import example_model
from onnx_quant.model_io import load_model

from .context import TensorInfo
from .engine import InferenceResult, check, infer, write_back


def cmd_infer(args: argparse.Namespace) -> int:
    model = load_model(args.model)
    runtime = getattr(args, "runtime", False)
    result = infer(model, strict=args.strict, declared_outputs_win=not runtime, runtime=runtime)
    summary = summarize(result)
    if args.output:
        if not _save(write_back(model, result, copy=False), args.output, "infer"):
            return EXIT_UNUSABLE
        print(f"wrote {args.output}: {summary}")
    else:
        for line in table(model, result):
            print(line)
        print(summary)
    for d in result.diagnostics:
        print(f"warning: {d}", file=sys.stderr)
    if runtime and any(d.rule == "output-type" for d in result.diagnostics):
        print("note: --runtime: contradicted graph outputs are typed as the graph computes them", file=sys.stderr)
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    problems, result = check(args.model)
    if not problems:
        unchecked = sum(1 for r in result.nodes if r.source == "unknown")
        note = f" ({unchecked} node{'s' if unchecked != 1 else ''} of unknown ops not checked)" if unchecked else ""
        print(f"ok: {args.model}: no problems{note}")
        return EXIT_OK
    for p in problems:
        print(p)
    print(f"{args.model}: {len(problems)} problem{'s' if len(problems) != 1 else ''}", file=sys.stderr)
    return EXIT_PROBLEMS


def cmd_example(args: argparse.Namespace) -> int:
    model = example_model()
    if not _save(model, args.output, "example"):
        return EXIT_UNUSABLE
    print(f"wrote {args.output}: {model.graph.name} ({len(model.graph.node)} nodes, opset {model.opset_import[0].version})")
    return EXIT_OK


def table(model: onnx.ModelProto, result: InferenceResult) -> list[str]:
    """One row per value (inputs, initializers, then node outputs in order): name, dtype,
    shape, and what typed it."""
    rows = [("value", "dtype", "shape", "typed by")]
    for name in value_order(model):
        info = result.ctx[name]
        other = result.other_types.get(name)
        dtype = _other_text(other) if other is not None else (type_name(info.elem_type) if info.elem_type else "?")
        shape = "" if other is not None else info.shape_text()
        rows.append((name, dtype, shape, result.typed_by.get(name, "unknown")))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip() for r in rows]


def value_order(model: onnx.ModelProto) -> list[str]:
    """Every value name once: graph inputs, initializers, then node outputs in node order."""
    seen: dict[str, None] = {}
    g = model.graph
    for name in [v.name for v in g.input] + [t.name for t in g.initializer]:
        seen.setdefault(name, None)
    for node in g.node:
        for name in node.output:
            if name:
                seen.setdefault(name, None)
    return list(seen)


def classify(info: TensorInfo) -> str:
    """``known`` (type and every dim an int), ``symbolic`` (type, rank, every dim an int or
    expression) or ``unknown``."""
    if not info.is_typed:
        return "unknown"
    if info.is_fully_known:
        return "known"
    if all(d is not None for d in info.shape):
        return "symbolic"
    return "unknown"


def summarize(result: InferenceResult) -> str:
    counts = {"known": 0, "symbolic": 0, "unknown": 0}
    for _, info in result.ctx.items():
        counts[classify(info)] += 1
    total = sum(counts.values())
    return (f"typed {total} values: {counts['known']} fully known, {counts['symbolic']} symbolic, "
            f"{counts['unknown']} unknown")


def _other_text(tp: onnx.TypeProto) -> str:
    kind = tp.WhichOneof("value") or "?"
    return {"sequence_type": "sequence", "optional_type": "optional", "map_type": "map"}.get(kind, kind)


def _save(model: onnx.ModelProto, path: str, command: str) -> bool:
    try:
        onnx.save(model, path)
    except (OSError, ValueError) as e:
        print(f"onnx-quant {command}: error: cannot write {path}: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
        return False
    return True


"""Where a pass's time goes on the real-architecture models (``onnx_quant.exported_models``).

    python benchmarks/profile_inference.py [--repeat 10] [--models yolo_head-float,...]

Times each phase of ``inference.infer_shapes`` (wall clock, ``time.perf_counter``) by wrapping
the engine's methods for the run: constructing the pass, the nesting-depth check, seeding,
the walk (split into memo hits, ``Constant`` nodes, and slow nodes per op type with the
rule's own share), the write-back. onnx's C++ pass runs in the same process, alternating with
ours, as the anchor (``ours/onnx``). The wrappers cost about 0.3 µs a call, so the phases sum
to a little more than an unwrapped run; compare phases, not totals, with the benchmark.
"""

from __future__ import annotations

import argparse
import collections
import gc
import logging
import time

import onnx

from onnx_quant import exported_models, inference
from onnx_quant.inference import engine
from onnx_quant.inference.scope import UNKNOWN


def _instrument(acc: collections.Counter, cnt: collections.Counter) -> None:
    pc = time.perf_counter

    def wrap(owner, name, label):
        f = getattr(owner, name)

        def timed(*a, **k):
            t = pc()
            try:
                return f(*a, **k)
            finally:
                acc[label] += pc() - t
                cnt[label] += 1
        setattr(owner, name, timed)

    wrap(engine.Pass, "__init__", "construct")
    wrap(engine, "check_depth", "check_depth")
    wrap(engine, "seed_main", "seed")
    wrap(engine.Pass, "_typed_constant", "walk: Constant")
    wrap(engine, "write_back", "write-back")
    slow, run_rule = engine.Pass._slow_node, engine.Pass._run_rule

    def slow_node(self, g, index, node, entry, *a, **k):
        t = pc()
        try:
            return slow(self, g, index, node, entry, *a, **k)
        finally:
            if g.top:  # bodies are inside their If/Loop/Scan node's time
                acc["slow: " + entry.op] += pc() - t
                cnt["slow: " + entry.op] += 1
                cnt["slow nodes"] += 1

    def rule(self, r, n):
        t = pc()
        try:
            return run_rule(self, r, n)
        finally:
            acc["rules (all)"] += pc() - t
            cnt["rules (all)"] += 1
    engine.Pass._slow_node = slow_node
    engine.Pass._run_rule = rule
    wrap(engine.Pass, "walk", "walk")


def split_rules(models: dict, repeat: int) -> None:
    """Warm-loop split of one pass (process time, min of 7 x ``repeat``): the whole
    ``infer_shapes``, the pass alone, the pass with every rule replaced by a dict lookup of
    its final outputs (what is left is the engine), and onnx's pass in the same loop."""
    import timeit

    def t(fn) -> float:
        return min(timeit.Timer(fn, timer=time.process_time).repeat(number=repeat, repeat=7)) / repeat

    print("\nwarm loop (process time, min of 7): the pass with its rules, and with each rule replaced by a dict lookup")
    print("| model | nodes | infer_shapes µs | pass µs | engine µs (rules replaced) | rules µs | write-back µs | "
          "onnx µs | rules µs/rule call | engine µs/node |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    run_rule = engine.Pass._run_rule
    for name, m in models.items():
        final = dict(inference.infer(m).values())
        calls = [0]

        def count(self, rule, n, _calls=calls):
            _calls[0] += 1
            return run_rule(self, rule, n)
        engine.Pass._run_rule = count
        inference.infer(m)
        engine.Pass._run_rule = run_rule
        whole = t(lambda: inference.infer_shapes(m))
        pass_only = t(lambda: engine.Pass(m, strict=False).run(None))

        def lookup(self, rule, n, _final=final):
            for o in n.outputs:
                if o:
                    n.ctx.define(o, _final.get(o, UNKNOWN))
            return True
        engine.Pass._run_rule = lookup
        try:
            no_rules = t(lambda: engine.Pass(m, strict=False).run(None))
        finally:
            engine.Pass._run_rule = run_rule
        theirs = t(lambda: onnx.shape_inference.infer_shapes(m))
        nodes = len(m.graph.node)
        rules = pass_only - no_rules
        print(f"| {name} | {nodes} | {whole * 1e6:.0f} | {pass_only * 1e6:.0f} | {no_rules * 1e6:.0f} | {rules * 1e6:.0f} | "
              f"{(whole - pass_only) * 1e6:.0f} | {theirs * 1e6:.0f} | {rules * 1e6 / max(calls[0], 1):.1f} | "
              f"{no_rules * 1e6 / nodes:.1f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--models", default="", help="comma-separated <model>-<form> (default: every exported model)")
    ap.add_argument("--top", type=int, default=25, help="op types listed")
    ap.add_argument("--split", action="store_true", help="also the warm-loop split into rules and engine")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    names = args.models.split(",") if args.models else \
        [f"{m}-{f}" for m in exported_models.MODELS for f in exported_models.FORMS]
    models = {name: exported_models.build(*name.rsplit("-", 1)) for name in names}
    for m in models.values():  # warm-up: imports, per-process caches
        inference.infer_shapes(m)
        onnx.shape_inference.infer_shapes(m)

    # plain runs first: the same-run anchor against onnx
    pc = time.perf_counter
    rows = []
    for name, m in models.items():
        ours, theirs = [], []
        for _ in range(args.repeat):
            gc.collect()
            t = time.process_time()
            r = inference.infer_shapes(m)
            ours.append(time.process_time() - t)
            del r
            gc.collect()
            t = time.process_time()
            r = onnx.shape_inference.infer_shapes(m)
            theirs.append(time.process_time() - t)
            del r
        rows.append((name, len(m.graph.node), sorted(ours)[len(ours) // 2], sorted(theirs)[len(theirs) // 2]))
    print("| model | nodes | ours ms | onnx ms | ours/onnx | ours µs/node | onnx µs/node |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, nodes, a, b in rows:
        print(f"| {name} | {nodes} | {a * 1e3:.2f} | {b * 1e3:.2f} | {a / b:.2f} | {a * 1e6 / nodes:.1f} | {b * 1e6 / nodes:.1f} |")
    tot_a, tot_b, tot_n = sum(r[2] for r in rows), sum(r[3] for r in rows), sum(r[1] for r in rows)
    print(f"| all ({len(rows)} models) | {tot_n} | {tot_a * 1e3:.2f} | {tot_b * 1e3:.2f} | {tot_a / tot_b:.2f} | "
          f"{tot_a * 1e6 / tot_n:.1f} | {tot_b * 1e6 / tot_n:.1f} |")

    if args.split:  # before the wrappers go in
        split_rules(models, max(args.repeat, 20))

    # then the phases, wrapped
    acc: collections.Counter = collections.Counter()
    cnt: collections.Counter = collections.Counter()
    _instrument(acc, cnt)
    total = 0.0
    for m in models.values():
        for _ in range(args.repeat):
            gc.collect()
            t = pc()
            r = inference.infer_shapes(m)
            total += pc() - t
            del r
    R = args.repeat
    nodes = sum(len(m.graph.node) for m in models.values())
    slow_total = sum(v for k, v in acc.items() if k.startswith("slow: "))
    hits = cnt["walk"] and nodes - cnt["slow nodes"] // R - cnt["walk: Constant"] // R
    walk_rest = acc["walk"] - slow_total - acc["walk: Constant"]
    print(f"\nphases (wall, wrapped), per sweep of {len(models)} models, {nodes} nodes: {total * 1e3 / R:.2f} ms, "
          f"{total * 1e6 / R / nodes:.1f} µs/node")
    print("| phase | ms per sweep | share | calls per sweep | µs per call |")
    print("|---|---:|---:|---:|---:|")

    def line(label, v, c):
        print(f"| {label} | {v * 1e3 / R:.2f} | {100 * v / total:.1f}% | {c // R if c else ''} | "
              f"{(v * 1e6 / c) if c else 0:.1f} |")
    for label in ("construct", "check_depth", "seed"):
        line(label, acc[label], cnt[label])
    line("walk: Constant nodes", acc["walk: Constant"], cnt["walk: Constant"])
    line("walk: slow nodes (top graph, bodies inside their node)", slow_total, cnt["slow nodes"])
    line("  of which rules", acc["rules (all)"], cnt["rules (all)"])
    line(f"walk: memo hits and the loop ({hits} hits)", walk_rest, 0)
    line("write-back (copy + value_info)", acc["write-back"], cnt["write-back"])
    print(f"\nslow nodes by op type (top {args.top})")
    print("| op | ms per sweep | share | nodes per sweep | µs per node |")
    print("|---|---:|---:|---:|---:|")
    for k, v in sorted(((k, v) for k, v in acc.items() if k.startswith("slow: ")), key=lambda kv: -kv[1])[:args.top]:
        line(k[6:], v, cnt[k])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

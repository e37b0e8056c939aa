"""The cost of the device-side index checks (backend_wgpu/index_check.py): the same models run with
the checks (the installed specs) and without them (the same specs with ``indexChecks`` emptied),
alternating run by run in one process (medians per round and overall), beside onnxruntime CPU
as the anchor:

    python benchmarks/bench_index_checks.py [--repeat 15] [--rounds 3] [--chain 200] [--json]

Models: a chain of ``--chain`` Gathers over a 256 x 64 table (indices [256]: each node gathers
every row of the previous one's output), an embedding lookup (a 32000 x 128 float32 table, 4096
int64 token ids), and ``--chain`` alternating Add / Relu nodes with a Gather at each end (the
1000-node chain's shape: the check costs a read-back of 32 bytes, not a per-node cost). Per
model: checked and unchecked medians (ms), their ratio, submits and read-backs per run (the
same: no extra submit), and onnxruntime's median. Figures: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import warnings

import numpy as np
import onnx
from onnx import TensorProto as T, helper as h, numpy_helper

from onnx_quant.backend_wgpu.session import Session
from onnx_quant.backend_wgpu.spec import SpecRegistry, load_specs
from onnx_quant.timing import median_seconds


def gather_chain(n: int) -> tuple[onnx.ModelProto, dict]:
    nodes = [h.make_node("Gather", [f"v{k}", "i"], [f"v{k + 1}"], name=f"g{k}", axis=0) for k in range(n)]
    g = h.make_graph(nodes, "gathers", [h.make_tensor_value_info("v0", T.FLOAT, [256, 64]),
                                        h.make_tensor_value_info("i", T.INT64, [256])],
                     [h.make_tensor_value_info(f"v{n}", T.FLOAT, [256, 64])])
    rng = np.random.default_rng(0)
    feeds = {"v0": rng.standard_normal((256, 64), dtype=np.float32), "i": rng.integers(-256, 256, 256).astype(np.int64)}
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), feeds


def embedding() -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(1)
    table = numpy_helper.from_array(rng.standard_normal((32000, 128), dtype=np.float32), "table")
    g = h.make_graph([h.make_node("Gather", ["table", "ids"], ["emb"], name="lookup", axis=0)], "embedding",
                     [h.make_tensor_value_info("ids", T.INT64, [4096])],
                     [h.make_tensor_value_info("emb", T.FLOAT, [4096, 128])], [table])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), {"ids": rng.integers(0, 32000, 4096).astype(np.int64)}


def mixed_chain(n: int) -> tuple[onnx.ModelProto, dict]:
    c = numpy_helper.from_array(np.full((16,), 0.5, np.float32), "c")
    nodes = [h.make_node("Gather", ["x", "i"], ["t0"], name="first", axis=0)]
    for k in range(n):
        op = h.make_node("Add", [f"t{k}", "c"], [f"t{k + 1}"]) if k % 2 == 0 else h.make_node("Relu", [f"t{k}"], [f"t{k + 1}"])
        nodes.append(op)
    nodes.append(h.make_node("Gather", [f"t{n}", "j"], ["y"], name="last", axis=0))
    g = h.make_graph(nodes, "mixed", [h.make_tensor_value_info("x", T.FLOAT, [16, 16]),
                                      h.make_tensor_value_info("i", T.INT64, [16]),
                                      h.make_tensor_value_info("j", T.INT64, [16])],
                     [h.make_tensor_value_info("y", T.FLOAT, [16, 16])], [c])
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((16, 16), dtype=np.float32), "i": rng.integers(0, 16, 16).astype(np.int64),
             "j": rng.integers(-16, 0, 16).astype(np.int64)}
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), feeds


def unchecked_specs() -> SpecRegistry:
    """The installed specs with no index checks: the kernels as they were before them."""
    return SpecRegistry(dataclasses.replace(s, index_checks=()) for s in load_specs())


def bench(name: str, model: onnx.ModelProto, feeds: dict, repeat: int, rounds: int, plain: SpecRegistry) -> dict:
    import onnxruntime as ort

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sessions = {"checked": Session(model, fuse_elementwise=False), "unchecked": Session(model, specs=plain,
                                                                                            fuse_elementwise=False)}
    outs = {k: s.run(None, feeds)[0] for k, s in sessions.items()}
    assert outs["checked"].tobytes() == outs["unchecked"].tobytes(), name
    per_run = {}
    for k, s in sessions.items():
        before = s.stats.snapshot()
        s.run(None, feeds)
        moved = s.stats.since(before)
        per_run[k] = {"submits": moved["submits"], "readbacks": moved["readbacks"], "bytes_read_back": moved["bytes_read_back"]}
    times: dict[str, list[float]] = {"checked": [], "unchecked": []}
    for _ in range(rounds):  # run by run, alternating, so drift on the shared machine hits both alike
        for _ in range(repeat):
            for k, s in sessions.items():
                times[k].append(median_seconds(lambda s=s: s.run(None, feeds), 1) * 1e3)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ort_ms = median_seconds(lambda: ref.run(None, feeds), repeat, warm_up=True) * 1e3
    checked, unchecked = statistics.median(times["checked"]), statistics.median(times["unchecked"])
    return {"model": name, "nodes": len(model.graph.node), "checked_ms": round(checked, 3),
            "unchecked_ms": round(unchecked, 3), "ratio": round(checked / unchecked, 3),
            "rounds_checked_ms": [round(statistics.median(times["checked"][r * repeat:(r + 1) * repeat]), 3)
                                  for r in range(rounds)],
            "rounds_unchecked_ms": [round(statistics.median(times["unchecked"][r * repeat:(r + 1) * repeat]), 3)
                                    for r in range(rounds)],
            "per_run": per_run, "onnxruntime_ms": round(ort_ms, 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--chain", type=int, default=200)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    plain = unchecked_specs()
    rows = [bench(f"Gather chain of {args.chain} [256 x 64]", *gather_chain(args.chain), args.repeat, args.rounds, plain),
            bench("embedding 32000 x 128, 4096 ids", *embedding(), args.repeat, args.rounds, plain),
            bench(f"Gather + {args.chain} Add/Relu + Gather [16 x 16]", *mixed_chain(args.chain), args.repeat, args.rounds,
                  plain)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("| model | nodes | checked ms | unchecked ms | ratio | submits / read-backs per run (checked, unchecked) "
          "| read-back bytes (checked, unchecked) | onnxruntime ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        c, u = r["per_run"]["checked"], r["per_run"]["unchecked"]
        print(f"| {r['model']} | {r['nodes']} | {r['checked_ms']} | {r['unchecked_ms']} | {r['ratio']} | "
              f"{c['submits']} / {c['readbacks']}, {u['submits']} / {u['readbacks']} | "
              f"{c['bytes_read_back']}, {u['bytes_read_back']} | {r['onnxruntime_ms']} |")
        print(f"<!-- rounds checked {r['rounds_checked_ms']} unchecked {r['rounds_unchecked_ms']} -->", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

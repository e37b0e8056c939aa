"""Variants chosen by measurement (``onnx-quant tune``): per node, every candidate timed and the
one chosen, then the whole model's run untuned, tuned, with ``fuse_dynamic=False`` and on
onnxruntime CPU, in one process.

    python benchmarks/bench_tuning.py [--repeat 7] [--adapter vulkan] [--json]

The model is the issue's 256-wide dynamically quantized MLP at 27 rows: x [3, 9, 256] ->
4 x (MatMul 256x256 -> Add -> Relu), quantized by onnxruntime's ``quantize_dynamic`` (each
MatMul becomes DynamicQuantizeLinear -> MatMulInteger -> Mul, fused here into one
DynamicQuantizeMatMul). The tuning table is written to a temporary cache folder (the user's is
left alone). Every configuration's outputs are checked against the oracle (``run_oracle``).
Figures measured on the development machines are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnx_quant import cache_dir
from onnx_quant.model_zoo import quantize
from onnx_quant.oracles import choose_oracle, run_oracle
from onnx_quant.timing import median_seconds


def dynamic_mlp(width: int = 256, layers: int = 4, seed: int = 0) -> onnx.ModelProto:
    """x [3, 9, width] -> layers x (MatMul width x width, Add, Relu) -> y, dynamically quantized."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        b = rng.uniform(-0.1, 0.1, width).astype(np.float32)
        inits += [onnx.numpy_helper.from_array(w, f"w{i}"), onnx.numpy_helper.from_array(b, f"b{i}")]
        y = "y" if i == layers - 1 else f"h{i}"
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"mm{i}"], name=f"matmul{i}"),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"add{i}"], name=f"add{i}"),
                  helper.make_node("Relu", [f"add{i}"], [y], name=f"relu{i}")]
        x = y
    graph = helper.make_graph(nodes, "dynamic_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 9, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 9, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return quantize(model, "dynamic")


def measure(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *, repeat: int, adapter: str | None) -> dict:
    """Tune (every candidate per key, timed), then the whole run's median in every configuration,
    interleaved, beside onnxruntime CPU."""
    import onnxruntime as ort  # noqa: PLC0415

    from onnx_quant.backend_wgpu import Session, tuning  # noqa: PLC0415
    from onnx_quant.backend_wgpu.device import get_device  # noqa: PLC0415

    expected = run_oracle(choose_oracle(model), model, feeds)
    data = model.SerializeToString()
    device = get_device(adapter)
    table = tuning.TuningTable.load(device.info)
    t0 = time.perf_counter()
    reports = tuning.tune(lambda **kw: Session(data, device=device, **kw), feeds, table, force=True)
    result: dict = {"device": device.info.name, "model": "dynamic MLP 4 x 256x256, x [3, 9, 256]",
                    "tune_s": time.perf_counter() - t0, "keys": [r.as_json() for r in reports], "configs": {}}
    configs = {"static rules (no tuning)": {"use_tuning_cache": False},
               "fuse_dynamic=False": {"use_tuning_cache": False, "fuse_dynamic": False},
               "tuned (the table above)": {}}
    sessions = {name: Session(data, device=device, **kw) for name, kw in configs.items()}
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    ort_session = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    runs = {name: (lambda s=s: s.run(None, feeds)) for name, s in sessions.items()}
    runs["onnxruntime CPU"] = lambda: ort_session.run(None, feeds)
    chosen = {n: r.chosen for r in reports for n in r.nodes}
    for name, s in sessions.items():
        got = s.run(None, feeds)  # plans and compiles
        specs = {sp.name: sp for sp in s.kernel_specs}
        plans = s.plans({k: v.shape for k, v in feeds.items()})
        labels = {p.node: tuning.candidate_label(p.variant, {k: v for k, v in p.tunables.items()
                                                            if v != specs[p.kernel].tunables[k].default})
                  for p in plans}
        result["configs"][name] = {"oracle": tuning.outputs_agree(got, expected, 1e-4) or "agrees", "nodes": labels}
    tuned = result["configs"]["tuned (the table above)"]["nodes"]
    result["every_node_runs_its_fastest"] = all(
        tuned[n] == label and r.timed_us[label] == min(r.timed_us.values())
        for r in reports for n in r.nodes for label in [r.chosen])
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):  # interleaved: a change of the machine's load hits every configuration alike
        for name, fn in runs.items():
            times[name].append(median_seconds(fn, 1) * 1e3)
    for name, s in sessions.items():
        result["configs"][name]["ms"] = statistics.median(times[name])
        s.close()
    result["onnxruntime_cpu_ms"] = statistics.median(times["onnxruntime CPU"])
    return result


def format_result(r: dict) -> str:
    lines = [f"device: {r['device']}", r["model"], "",
             f"tuning ({r['tune_s']:.1f} s): per key, its nodes and every candidate timed (µs, summed over the nodes):"]
    for k in r["keys"]:
        lines.append(f"  {k['kernel']} [{', '.join(k['nodes'])}]: static {k['static']} -> {k['chosen']}")
        for label, us in sorted(k["timed_us"].items(), key=lambda kv: kv[1]):
            lines.append(f"    {us:10.1f}  {label}" + ("  <- chosen" if label == k["chosen"] else ""))
        lines += [f"    dropped  {label}: {why}" for label, why in k["dropped"].items()]
    lines.append(f"every node of the tuned session runs its key's fastest timed candidate: "
                 f"{'yes' if r['every_node_runs_its_fastest'] else 'NO'}")
    lines += ["", f"{'configuration':28} {'ms/run':>9} {'x ort':>7}  oracle   what the nodes run"]
    ort_ms = r["onnxruntime_cpu_ms"]
    for name, c in r["configs"].items():
        kinds = sorted(set(c["nodes"].values()))
        lines.append(f"{name:28} {c['ms']:9.2f} {c['ms'] / ort_ms:7.1f}  {c['oracle']:8} {', '.join(kinds)}")
    lines.append(f"{'onnxruntime CPU':28} {ort_ms:9.3f} {1.0:7.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--adapter")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    model = dynamic_mlp()
    feeds = {"x": np.random.default_rng(1).standard_normal((3, 9, 256)).astype(np.float32)}
    with tempfile.TemporaryDirectory(prefix="onnx-quant-tuning-") as tmp:
        os.environ[cache_dir.ENV] = tmp
        result = measure(model, feeds, repeat=args.repeat, adapter=args.adapter)
    print(json.dumps(result, indent=2) if args.json else format_result(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

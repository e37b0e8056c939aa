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
    """The per-node tuning report and the whole run's median in every configuration."""
    import onnxruntime as ort  # noqa: PLC0415

    from onnx_quant.backend_wgpu import Session, tuning  # noqa: PLC0415

    expected = run_oracle(choose_oracle(model), model, feeds)
    data = model.SerializeToString()
    configs = {"static (fused by rule)": {"use_tuning_cache": False},
               "fuse_dynamic=False": {"use_tuning_cache": False, "fuse_dynamic": False},
               "tuned": {"tune": True}}
    result: dict = {"configs": {}, "model": "dynamic MLP 4 x 256x256, x [3, 9, 256]"}
    sessions = {name: Session(data, adapter=adapter, **kw) for name, kw in configs.items()}
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    ort_session = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    runs = {name: (lambda s=s: s.run(None, feeds)) for name, s in sessions.items()}
    runs["onnxruntime CPU"] = lambda: ort_session.run(None, feeds)
    for name, s in sessions.items():
        got = s.run(None, feeds)  # plans, compiles (and tunes, for "tuned")
        plans = s.plans({k: v.shape for k, v in feeds.items()})
        result["configs"][name] = {"oracle": tuning.outputs_agree(got, expected, 1e-4) or "agrees",
                                   "variants": {p.node: p.variant for p in plans}}
        result["device"] = s.device.info.name
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):  # interleaved: a change of the machine's load hits every configuration alike
        for name, fn in runs.items():
            times[name].append(median_seconds(fn, 1) * 1e3)
    for name in sessions:
        result["configs"][name]["ms"] = statistics.median(times[name])
        sessions[name].close()
    result["onnxruntime_cpu_ms"] = statistics.median(times["onnxruntime CPU"])
    table = tuning.TuningTable.load(Session(data, adapter=adapter).device.info)
    result["timed"] = {key: c.as_json() for key, c in table.entries.items()}
    return result


def format_result(r: dict) -> str:
    lines = [f"device: {r['device']}", r["model"], "", "per tuning key, every candidate timed (µs, summed over its nodes):"]
    for key, c in r["timed"].items():
        lines.append(f"  {key}")
        for label, us in sorted(c["timed_us"].items(), key=lambda kv: kv[1]):
            mark = "  <- chosen" if label == tuning_label(c) else ""
            lines.append(f"    {us:10.1f}  {label}{mark}")
    lines += ["", f"{'configuration':28} {'ms/run':>9} {'x ort':>7}  oracle   variants"]
    ort_ms = r["onnxruntime_cpu_ms"]
    for name, c in r["configs"].items():
        kinds = sorted(set(c["variants"].values()))
        lines.append(f"{name:28} {c['ms']:9.2f} {c['ms'] / ort_ms:7.1f}  {c['oracle']:8} {', '.join(kinds)}")
    lines.append(f"{'onnxruntime CPU':28} {ort_ms:9.3f} {1.0:7.1f}")
    return "\n".join(lines)


def tuning_label(c: dict) -> str:
    from onnx_quant.backend_wgpu.tuning_cache import candidate_label  # noqa: PLC0415

    return candidate_label(c["variant"], c["tunables"])


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

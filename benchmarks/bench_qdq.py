"""QuantizeLinear / DequantizeLinear benchmark: GPU variants beside numpy and onnxruntime CPU.

    python benchmarks/bench_qdq.py [--log2 24] [--repeat 5] [--adapter vulkan] [--only Q-uint8,...] [--json]

Six cases over 2^24 (16M) elements (a 4096 x 4096 matrix): QuantizeLinear float32 -> uint8
per-tensor, -> int8 per-axis (axis 1: 4096 scales), -> int4 blocked (axis 1, block 32:
4096 x 128 scales), and DequantizeLinear back from the same three (-> float32). Each GPU
variant that applies is forced and timed end to end with executor.run_plan (host array in,
upload, one submit, mapped read-back, host array out) after one warm-up run that compiles and
allocates; "kernel ms" is the pass alone (one submit waiting on a 4-byte read-back). numpy
runs the ONNX formula (y = clip(rint(x / s) + zp) for Q, (x - zp) * s for DQ) and
onnxruntime 1.x CPU the same one-node model (opset 21; scale and zero point are initializers,
x is fed, except for int4 x, which onnxruntime's Python API cannot take as a feed: it is an
initializer there, with graph optimizations off so the kernel still runs every time; its int4
output cannot be converted to numpy either, so that row is timed as an OrtValue and not
compared).

GB/s = (bytes of x + bytes of y) / median time (int4: half a byte per element; scales and zero
points not counted). "x numpy" / "x ort" = the other's time / this time (above 1 = faster).
Every GPU output is checked bit for bit against numpy before timing. Figures: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_quant.timing import median_seconds

VARIANTS = ("per_tensor", "general", "simple")


def median_ms(fn, repeat):
    return median_seconds(fn, repeat, warm_up=True) * 1e3


def make_case(name: str, n_log2: int, rng):
    rows = 1 << (n_log2 // 2)
    cols = 1 << (n_log2 - n_log2 // 2)
    x = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    kind, ytype = name.split("-")[1], {"uint8": np.uint8, "int8": np.int8, "int4": ml_dtypes.int4}
    if kind == "uint8":
        s = np.asarray(0.05, np.float32)
        z = np.asarray(128, np.uint8)
        attrs, s_full, z_full = {}, s, z.astype(np.float32)
    elif kind == "int8":
        s = (rng.random(cols) * 0.05 + 0.01).astype(np.float32)
        z = rng.integers(-3, 4, cols).astype(np.int8)
        attrs, s_full, z_full = {"axis": 1}, s[None, :], z.astype(np.float32)[None, :]
    else:
        s = (rng.random((rows, cols // 32)) * 0.5 + 0.2).astype(np.float32)
        z = rng.integers(-1, 2, (rows, cols // 32)).astype(ml_dtypes.int4)
        attrs = {"axis": 1, "block_size": 32}
        s_full = np.repeat(s, 32, axis=1)
        z_full = np.repeat(z.astype(np.float32), 32, axis=1)
    qdt = ytype[kind]
    lo, hi = {"uint8": (0, 255), "int8": (-128, 127), "int4": (-8, 7)}[kind]

    def numpy_q():
        return np.clip(np.rint(x / s_full) + z_full, lo, hi).astype(qdt)

    q = numpy_q()

    def numpy_dq():
        return ((q.astype(np.float32) - z_full) * s_full).astype(np.float32)

    return dict(x=x, s=s, z=z, attrs=attrs, q=q, numpy_q=numpy_q, numpy_dq=numpy_dq, qdt=qdt, kind=kind)


def one_node(op, x, s, z, attrs, y_elem, *, x_initializer=False):
    node = helper.make_node(op, ["x", "s", "z"], ["y"], name="n0", **attrs)
    inits = [numpy_helper.from_array(s, "s"), numpy_helper.from_array(np.asarray(z), "z")]
    inputs = []
    if x_initializer:
        inits.append(numpy_helper.from_array(x, "x"))
    else:
        inputs.append(helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), list(x.shape)))
    out = helper.make_tensor_value_info("y", y_elem, list(x.shape))
    graph = helper.make_graph([node], "g", inputs, [out], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def ort_time(model, feeds, repeat):
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.log_severity_level = 4
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - a case onnxruntime does not run
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
    try:
        out = sess.run(None, feeds)[0]
        return median_ms(lambda: sess.run(None, feeds), repeat), out
    except Exception:  # noqa: BLE001 - e.g. an int4 output numpy cannot hold: time it as an OrtValue
        run = lambda: sess.run_with_ort_values(None, {k: ort.OrtValue.ortvalue_from_numpy(v)  # noqa: E731
                                                      for k, v in feeds.items()})
        return median_ms(run, repeat), None


def gpu_rows(dev, op, spec_inputs, feeds, y_type, attrs, expected, repeat):
    from onnx_quant.backend_wgpu.executor import prepare, release_plan, run_plan
    from onnx_quant.backend_wgpu.planner import plan_node
    from onnx_quant.backend_wgpu.spec import load_spec, templates_dir
    from onnx_quant.dtypes import element_type

    spec = load_spec(templates_dir() / ("quantize_linear.kernel.json" if op == "QuantizeLinear"
                                        else "dequantize_linear.kernel.json"))
    shapes = {k: tuple(v.shape) for k, v in zip(spec_inputs, feeds)}
    dtypes = {k: element_type(v.dtype).name for k, v in zip(spec_inputs, feeds)}
    shapes["y"], dtypes["y"] = tuple(feeds[0].shape), y_type
    inputs = dict(zip(spec_inputs, feeds))
    rows = []
    for v in VARIANTS:
        try:
            plan = plan_node(spec, shapes=shapes, dtypes=dtypes, device=dev.info, attributes=attrs, variant=v,
                             node_label="n0")
        except Exception:  # noqa: BLE001 - the variant does not apply
            continue
        out = run_plan(dev, plan, inputs)["y"]
        same = np.array_equal(np.ascontiguousarray(out).view(np.uint8), np.ascontiguousarray(expected).view(np.uint8))
        compiles = dev.pipelines.compilations
        ms = median_ms(lambda: run_plan(dev, plan, inputs), repeat)
        prep = prepare(dev, plan)
        ybuf = prep.buffers["y"]
        small = dev.allocate_staging(4)
        kms = median_ms(lambda: dev.launch(prep.steps, copies=[(ybuf, 0, small, 0, 4)], read=small), repeat)
        rows.append(dict(variant=v, ms=ms, kernel_ms=kms, bit_identical=bool(same),
                         compiles=dev.pipelines.compilations - compiles))
        release_plan(dev, plan)
    return rows


def run(n_log2=24, repeat=5, adapter=None, only=None, log=None):
    from onnx_quant.backend_wgpu.device import get_device

    dev = get_device(adapter)
    rng = np.random.default_rng(0)
    n = 1 << n_log2
    results = {"elements": n, "device": dev.info.name, "rows": []}
    for kind in ("uint8", "int8", "int4"):
        case = make_case(f"Q-{kind}", n_log2, rng)
        x, s, z, attrs, q = case["x"], case["s"], case["z"], case["attrs"], case["q"]
        qtype = {"uint8": "uint8", "int8": "int8", "int4": "int4"}[kind]
        qbytes = n if kind != "int4" else n // 2
        gran = {"uint8": "per-tensor", "int8": "per-axis", "int4": "blocked 32"}[kind]
        for op in ("QuantizeLinear", "DequantizeLinear"):
            name = f"{'Q' if op == 'QuantizeLinear' else 'DQ'}-{kind}"
            if only and name not in only:
                continue
            if log:
                log(f"{name} ({gran}) ...")
            nbytes = 4 * n + qbytes
            if op == "QuantizeLinear":
                t_np = median_ms(case["numpy_q"], repeat)
                expected = q
                model = one_node(op, x, s, z, attrs, helper.np_dtype_to_tensor_dtype(np.dtype(case["qdt"])))
                t_ort, ort_out = ort_time(model, {"x": x}, repeat)
                gpu = gpu_rows(dev, op, ("x", "y_scale", "y_zero_point"), (x, s, z), qtype, attrs, expected, repeat)
            else:
                t_np = median_ms(case["numpy_dq"], repeat)
                expected = case["numpy_dq"]()
                x_init = kind == "int4"
                model = one_node(op, q, s, z, attrs, onnx.TensorProto.FLOAT, x_initializer=x_init)
                t_ort, ort_out = ort_time(model, {} if x_init else {"x": q}, repeat)
                gpu = gpu_rows(dev, op, ("x", "x_scale", "x_zero_point"), (q, s, z), "float32", attrs, expected, repeat)
            ort_same = None if t_ort is None or ort_out is None else bool(np.array_equal(
                np.ascontiguousarray(ort_out).view(np.uint8), np.ascontiguousarray(expected).view(np.uint8)))
            rows = [dict(impl="numpy", ms=t_np)]
            rows.append(dict(impl="onnxruntime", ms=t_ort, note=None if t_ort is not None else ort_out,
                             bit_identical=ort_same))
            rows += [dict(impl="gpu", **r) for r in gpu]
            for r in rows:
                if r.get("ms"):
                    r["gbps"] = nbytes / (r["ms"] * 1e-3) / 1e9
                    r["x_numpy"] = t_np / r["ms"]
                    r["x_ort"] = (t_ort / r["ms"]) if t_ort else None
                r.update(case=name, op=op, granularity=gran)
            results["rows"].extend(rows)
    return results


def fmt(v, spec=".3g"):
    return "" if v is None else format(v, spec)


def format_table(res) -> str:
    lines = [f"{res['elements']} elements on {res['device']}", "",
             "| case | granularity | impl | variant | ms | GB/s | × numpy | × ort | kernel ms | bit-identical |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in res["rows"]:
        ms = fmt(r.get("ms")) if r.get("ms") is not None else f"— ({r.get('note', '')})"
        ident = "" if r.get("bit_identical") is None else ("yes" if r["bit_identical"] else "NO")
        lines.append(f"| {r['case']} | {r['granularity']} | {r['impl']} | {r.get('variant', '')} | {ms} | "
                     f"{fmt(r.get('gbps'))} | {fmt(r.get('x_numpy'), '.2f')} | {fmt(r.get('x_ort'), '.2f')} | "
                     f"{fmt(r.get('kernel_ms'))} | {ident} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log2", type=int, default=24, help="log2 of the element count (default 24: 16M)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--adapter")
    p.add_argument("--only", help="comma-separated cases: Q-uint8,DQ-uint8,Q-int8,DQ-int8,Q-int4,DQ-int4")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    log = None if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    res = run(args.log2, args.repeat, args.adapter, only, log)
    print(json.dumps(res, indent=1, default=str) if args.json else format_table(res))
    bad = [r for r in res["rows"] if r["impl"] == "gpu" and (not r["bit_identical"] or r["compiles"])]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

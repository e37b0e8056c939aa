"""Float and com.microsoft kernels: each variant beside numpy and onnxruntime CPU, one run.

    python benchmarks/bench_float_kernels.py [--repeat 5] [--adapter vulkan] [--only MatMul,Conv] [--json]
    python benchmarks/bench_float_kernels.py --yolo [--image 320] [--repeat 7]

For each case a one-node model is planned (shapes from inference.infer_values, the spec from
the registry), every variant that applies is forced and timed end to end with
executor.run_plan (upload, one submit, mapped read-back), after one warm-up run that compiles
and allocates; onnxruntime runs the same model and numpy the same math where it has it. Every
variant's output is checked against the first one (bit-identical) before timing. Figures are
in docs/benchmarks.md ("Float and com.microsoft kernels").

``--yolo``: every Conv layer of the exported YOLO head (onnx_quant/exported_models.py) at
1x3xIxI, each float Conv variant forced and the one the static rules choose, beside QLinearConv
of the same geometry (uint8 x, int8 w, the variant its rules choose) and onnxruntime CPU's float
Conv, in one process: kernel times from the GPU's timestamps through a profiled Session (best of
--repeat, benchmarks/roofline.py's node_seconds), and the float / quantized ratio. Figures in
docs/benchmarks.md ("Float Conv through the GEMM").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


import numpy as np
from onnx import helper

from onnx_quant.timing import median_seconds

FORCE = {"COARSE_MIN_WORDS": 0, "TILED_MIN_MACS": 0, "SERIAL_MAX_ELEMENTS": 10**9, "SERIAL_MAX_ROW": 10**9,
         "TABLE_MIN_ELEMENTS": 0}


def node_model(op, inputs, attrs=None, domain="", opset=17):
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)) for n, a in inputs]
    node = helper.make_node(op, [n for n, _ in inputs], ["Y"], domain=domain, **(attrs or {}))
    out = helper.make_tensor_value_info("Y", helper.np_dtype_to_tensor_dtype(inputs[0][1].dtype), None)
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(helper.make_graph([node], "g", vis, [out]), opset_imports=imports)


def plans(dev, model, feeds):
    """(variant id, plan, spec input names) for every variant that applies."""
    from onnx_quant.backend_wgpu.planner import plan_node
    from onnx_quant.backend_wgpu.spec import load_specs
    from onnx_quant.inference import infer_values
    from onnx_quant.dtypes import type_name
    from onnx_quant.errors import ExecutionError

    node = model.graph.node[0]
    opsets = {(i.domain or ""): i.version for i in model.opset_import}
    spec = load_specs().find(node.domain or "", node.op_type, opsets[node.domain or ""])
    values = infer_values(model, {k: list(v.shape) for k, v in feeds.items()})
    shapes, dtypes = {}, {}
    for names, vnames in ((list(spec.inputs), list(node.input)), (list(spec.outputs), list(node.output))):
        for i, s in enumerate(names):
            if i < len(vnames) and vnames[i]:
                shapes[s] = tuple(values[vnames[i]].shape)
                dtypes[s] = type_name(values[vnames[i]].elem_type)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
    tun = {k: v for k, v in FORCE.items() if k in spec.tunables}
    out = []
    for v in spec.variants:
        try:
            p = plan_node(spec, shapes=shapes, dtypes=dtypes, device=dev.info, variant=v.id, tunables=tun,
                          attributes=attrs, node_label=node.op_type)
        except ExecutionError:
            continue
        out.append((v.id, p, {s: feeds[node.input[i]] for i, s in enumerate(spec.inputs) if i < len(node.input)}))
    return out


def median_ms(fn, repeat):
    return median_seconds(fn, repeat, warm_up=True) * 1e3


def cases():
    r = np.random.default_rng(0)
    f = lambda *s: r.standard_normal(s).astype(np.float32)  # noqa: E731
    u8 = lambda *s: r.integers(0, 256, s).astype(np.uint8)  # noqa: E731
    s32 = lambda v: np.array(v, np.float32)  # noqa: E731
    z8 = lambda v: np.array(v, np.uint8)  # noqa: E731
    a, b = f(256, 256), f(256, 256)
    yield "MatMul 256x256x256", node_model("MatMul", [("A", a), ("B", b)]), {"A": a, "B": b}, lambda: a @ b
    a, b = f(8, 128, 64), f(8, 64, 128)
    yield "MatMul 8x128x64x128", node_model("MatMul", [("A", a), ("B", b)]), {"A": a, "B": b}, lambda: a @ b
    x, w, bias = f(1, 32, 56, 56), f(64, 32, 3, 3), f(64)
    yield ("Conv 1x32x56x56, 64x3x3", node_model("Conv", [("X", x), ("W", w), ("B", bias)], {"pads": [1, 1, 1, 1]}),
           {"X": x, "W": w, "B": bias}, None)
    x = f(1, 512, 7, 7)
    yield "GlobalAveragePool 1x512x7x7", node_model("GlobalAveragePool", [("X", x)]), {"X": x}, \
        lambda: x.mean(axis=(2, 3), keepdims=True)
    x = f(1, 64, 112, 112)
    yield "GlobalAveragePool 1x64x112x112", node_model("GlobalAveragePool", [("X", x)]), {"X": x}, \
        lambda: x.mean(axis=(2, 3), keepdims=True)
    x = f(1000, 1000)
    yield "Softmax 1000x1000", node_model("Softmax", [("X", x)], {"axis": 1}), {"X": x}, \
        lambda: np.exp(x - x.max(1, keepdims=True)) / np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True)
    x = f(32, 1000)
    yield "Softmax 32x1000", node_model("Softmax", [("X", x)], {"axis": 1}), {"X": x}, None
    a, b = f(1 << 22), f(1 << 22)
    yield "Add 2^22", node_model("Add", [("A", a), ("B", b)]), {"A": a, "B": b}, lambda: a + b
    xs = [f(1, 64, 56, 56), f(1, 64, 56, 56)]
    yield ("Concat 2 x 1x64x56x56", node_model("Concat", [("X0", xs[0]), ("X1", xs[1])], {"axis": 1}),
           {"X0": xs[0], "X1": xs[1]}, lambda: np.concatenate(xs, axis=1))
    x = u8(1, 64, 128, 128)
    ins = [("X", x), ("Xs", s32(0.05)), ("Xz", z8(128)), ("Ys", s32(1 / 255)), ("Yz", z8(0))]
    yield "QLinearSigmoid 1x64x128x128", node_model("QLinearSigmoid", ins, domain="com.microsoft", opset=13), dict(ins), None
    a, b = u8(1, 64, 56, 56), u8(1, 64, 56, 56)
    ins = [("A", a), ("As", s32(0.05)), ("Az", z8(120)), ("B", b), ("Bs", s32(0.04)), ("Bz", z8(130)),
           ("Cs", s32(0.07)), ("Cz", z8(125))]
    yield "QLinearAdd 1x64x56x56", node_model("QLinearAdd", ins, domain="com.microsoft", opset=13), dict(ins), None
    x = u8(1, 256, 14, 14)
    ins = [("X", x), ("Xs", s32(0.05)), ("Xz", z8(128)), ("Ys", s32(0.02)), ("Yz", z8(100))]
    yield ("QLinearGlobalAveragePool 1x256x14x14", node_model("QLinearGlobalAveragePool", ins, domain="com.microsoft",
                                                               opset=13), dict(ins), None)


FLOAT_CONV_VARIANTS = ("direct", "direct_oc4", "implicit_gemm", "im2col_gemm")


def yolo_layers(dev, image: int, repeat: int) -> list[dict]:
    """The YOLO head's Conv layers: float Conv per variant and as chosen, QLinearConv as chosen."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import roofline

    rng = np.random.default_rng(0)
    rows = []
    for layer in roofline.conv_layers("yolo_head", {"images": (1, 3, image, image)}):
        model, feeds = roofline.float_conv(layer, rng)
        row = {"layer": roofline.conv_label(layer), "macs": layer["macs"], "variants_ms": {}}
        force = {"Conv": {"TILED_MIN_MACS": 0}}
        for v in FLOAT_CONV_VARIANTS:
            if v == "direct_oc4" and (layer["w"][0] // layer["attrs"].get("group", 1)) % 4:
                continue
            t = roofline.node_seconds(dev, model, feeds, "Conv", repeat, variants={"Conv": v}, tunables=force)
            row["variants_ms"][v] = t["s"] * 1e3
        chosen = roofline.node_seconds(dev, model, feeds, "Conv", repeat)
        qmodel, qfeeds = roofline.qlinear_conv(layer, rng)
        quant = roofline.node_seconds(dev, qmodel, qfeeds, "QLinearConv", repeat)
        t_ort = roofline.ort_seconds(model, feeds, repeat)
        row.update(float_variant=chosen["variant"], float_ms=chosen["s"] * 1e3, quant_variant=quant["variant"],
                   quant_ms=quant["s"] * 1e3, ratio=chosen["s"] / quant["s"], ort_ms=t_ort * 1e3)
        rows.append(row)
        print(f"{row['layer']}: float {row['float_variant']} {row['float_ms']:.3f} ms, QLinearConv "
              f"{row['quant_variant']} {row['quant_ms']:.3f} ms", file=sys.stderr, flush=True)
    return rows


def print_yolo(rows: list[dict], device: str) -> None:
    print(f"device: {device}\n")
    print("| layer | MACs | " + " | ".join(f"{v} ms" for v in FLOAT_CONV_VARIANTS)
          + " | float chosen | QLinearConv chosen | float / quantized | onnxruntime CPU ms |")
    print("|---|---:|" + "---:|" * len(FLOAT_CONV_VARIANTS) + "---|---|---:|---:|")
    for r in rows:
        cells = " | ".join(f"{r['variants_ms'][v]:.3f}" if v in r["variants_ms"] else "" for v in FLOAT_CONV_VARIANTS)
        print(f"| {r['layer']} | {r['macs']:,} | {cells} | {r['float_variant']} {r['float_ms']:.3f} | "
              f"{r['quant_variant']} {r['quant_ms']:.3f} | {r['ratio']:.2f} | {r['ort_ms']:.3f} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--adapter")
    ap.add_argument("--only", help="comma-separated case name prefixes")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--yolo", action="store_true", help="the YOLO head's Conv layers, float beside quantized")
    ap.add_argument("--image", type=int, default=320, help="--yolo: the image size")
    args = ap.parse_args(argv)
    if args.yolo:
        from onnx_quant.backend_wgpu.device import get_device

        dev = get_device(args.adapter)
        rows = yolo_layers(dev, args.image, args.repeat)
        if args.json:
            print(json.dumps({"device": dev.info.name, "yolo": rows}, indent=2))
        else:
            print_yolo(rows, dev.info.name)
        return 0
    import onnxruntime as ort

    from onnx_quant.backend_wgpu.device import get_device
    from onnx_quant.backend_wgpu.executor import run_plan

    dev = get_device(args.adapter, limits="max")
    only = [s for s in (args.only or "").split(",") if s]
    rows = []
    for name, model, feeds, np_fn in cases():
        if only and not any(name.startswith(o) for o in only):
            continue
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        t_ort = median_ms(lambda: sess.run(None, feeds), args.repeat)
        t_np = median_ms(np_fn, args.repeat) if np_fn else None
        rows.append({"case": name, "impl": "onnxruntime", "ms": t_ort})
        if t_np is not None:
            rows.append({"case": name, "impl": "numpy", "ms": t_np})
        first = None
        for vid, plan, inputs in plans(dev, model, feeds):
            out = run_plan(dev, plan, inputs)
            if first is None:
                first = out
            elif any(not np.array_equal(np.asarray(out[k]).view(np.uint8), np.asarray(first[k]).view(np.uint8))
                     for k in out):
                raise SystemExit(f"{name}: variant {vid} differs from the first variant")
            before = dev.pipelines.compilations
            t = median_ms(lambda: run_plan(dev, plan, inputs), args.repeat)
            if dev.pipelines.compilations != before:
                raise SystemExit(f"{name}: variant {vid} compiled during timed runs")
            rows.append({"case": name, "impl": "gpu", "variant": vid, "ms": t, "x_ort": t_ort / t,
                         "x_numpy": (t_np / t) if t_np else None})
            print(f"{name}: {vid} {t:.2f} ms (onnxruntime {t_ort:.2f} ms)", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"device": dev.info.name, "rows": rows}, indent=2))
        return 0
    print(f"device: {dev.info.name}\n")
    print("| case | impl | variant | ms | × numpy | × ort |")
    print("|---|---|---|---:|---:|---:|")
    for r in rows:
        xn = f"{r['x_numpy']:.2f}" if r.get("x_numpy") else ""
        xo = f"{r['x_ort']:.2f}" if r.get("x_ort") else ""
        print(f"| {r['case']} | {r['impl']} | {r.get('variant', '')} | {r['ms']:.2f} | {xn} | {xo} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

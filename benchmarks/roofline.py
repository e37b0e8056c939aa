"""The adapter's roofline, and every hot kernel measured against it, in one run.

    python benchmarks/roofline.py [--short] [--repeat 7] [--adapter vulkan] [--only Conv,Softmax] [--json PATH]

1. The roofline, from WGSL microkernels run through the project's device layer
   (backend_wgpu/device.py): copy bandwidth (a vec4<f32> copy kernel: bytes read + written / s),
   f32 FMA throughput (8 independent vec4 fma chains per invocation: 2 flops per lane and fma)
   and packed int8 dot throughput (8 chains of 4-lane int8 dot products, 8 int-ops each, their
   inputs stepped independently of the sums so that no chain waits on a dot's latency: WGSL's
   dot4I8Packed where the shader compiles, and the emulated form, unpack4xI8 + dot, always; the
   int8 roofline is the faster of the two, and the table says which).
2. The hot kernels at the sizes real models use: layer shapes taken from the exported models
   (onnx_quant/exported_models.py: the YOLO head at 1x3x320x320, DBNet at 1x3x160x160, MobileNetV3
   at 1x3x224x224, the transformer built at d_model 256 / ffn 1024 over 128 tokens) and the issue's
   256-wide dynamically quantized MLP (27 rows); each is one node run through a Session.
   GEMM-shaped kernels report flops (2 per multiply-add; int-ops for the integer ones) / s as a
   fraction of the f32 (int8) compute roofline; memory-bound kernels the minimum bytes they must
   move (inputs read once, outputs written once) / s as a fraction of the copy bandwidth. Beside
   it, the fraction of what the roofline model allows the kernel: GEMMs min(compute, arithmetic
   intensity x copy bandwidth); memory-bound kernels their bytes at the copy bandwidth plus the
   measured floor of an empty dispatch per pass (the latency term: small tensors pay it whole).

Times: the GPU's timestamps where the adapter has timestamp-query (each dispatch in its own pass,
as backend_wgpu/profiling.py times nodes; a kernel's time is the sum of its passes), else the wall
clock around a submit and its wait (labelled ``host-wall``); the best of --repeat runs after a
warm-up that compiles (the machine is shared: other processes only ever add time; the JSON keeps
the kernels' medians too). Beside each kernel: onnxruntime CPU on the same one-node model (wall
clock, same machine). ``--short``: tiny sizes and few repeats (the test suite's smoke run).
Figures: docs/benchmarks.md ("Roofline").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = np.float32
GEMM, MEMORY = "compute", "memory"

# ----------------------------------------------------------------------------- microkernels

COPY_WGSL = """
@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.y * nwg.x * 64u + gid.x;
  if (i < arrayLength(&dst)) {
    dst[i] = src[i];
  }
}
"""

FMA_WGSL = """
@group(0) @binding(0) var<storage, read_write> out: array<vec4<f32>>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.y * nwg.x * 64u + gid.x;
  let s = f32(i) * 1e-9;
  var a0 = vec4<f32>(s); var a1 = a0 + 0.1; var a2 = a0 + 0.2; var a3 = a0 + 0.3;
  var a4 = a0 + 0.4; var a5 = a0 + 0.5; var a6 = a0 + 0.6; var a7 = a0 + 0.7;
  let m = vec4<f32>(0.99999);
  let c = vec4<f32>(1e-7);
  for (var k = 0u; k < ITERSu; k = k + 1u) {
    a0 = fma(a0, m, c); a1 = fma(a1, m, c); a2 = fma(a2, m, c); a3 = fma(a3, m, c);
    a4 = fma(a4, m, c); a5 = fma(a5, m, c); a6 = fma(a6, m, c); a7 = fma(a7, m, c);
  }
  out[i] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}
"""

DOT_WGSL = """
@group(0) @binding(0) var<storage, read_write> out: array<i32>;
fn dot8(a: u32, b: u32) -> i32 {
  return DOT;
}
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.y * nwg.x * 64u + gid.x;
  let b = 0x7f01fe03u ^ i;
  var x0 = i; var x1 = i + 1u; var x2 = i + 2u; var x3 = i + 3u;
  var x4 = i + 4u; var x5 = i + 5u; var x6 = i + 6u; var x7 = i + 7u;
  var s0 = 0; var s1 = 0; var s2 = 0; var s3 = 0; var s4 = 0; var s5 = 0; var s6 = 0; var s7 = 0;
  for (var k = 0u; k < ITERSu; k = k + 1u) {
    s0 = s0 + dot8(x0, b); s1 = s1 + dot8(x1, b); s2 = s2 + dot8(x2, b); s3 = s3 + dot8(x3, b);
    s4 = s4 + dot8(x4, b); s5 = s5 + dot8(x5, b); s6 = s6 + dot8(x6, b); s7 = s7 + dot8(x7, b);
    x0 = x0 + 0x01010101u; x1 = x1 + 0x01010101u; x2 = x2 + 0x01010101u; x3 = x3 + 0x01010101u;
    x4 = x4 + 0x01010101u; x5 = x5 + 0x01010101u; x6 = x6 + 0x01010101u; x7 = x7 + 0x01010101u;
  }
  out[i] = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
}
"""
EMPTY_WGSL = """
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32) {
  if (lid == 0u) {
    out[0] = out[0] + 1u;
  }
}
"""

DOT_FORMS = {"dot4I8Packed": "dot4I8Packed(a, b)", "emulated": "dot(unpack4xI8(a), unpack4xI8(b))"}


def _grid(groups: int) -> tuple[int, int, int]:
    return (min(groups, 65535), -(-groups // 65535), 1)


def dispatch_seconds(dev, compiled, bind_group, grid, repeat: int) -> tuple[float, str]:
    """Best seconds of one dispatch over ``repeat`` (after one untimed): GPU timestamps where the
    adapter has them (each dispatch its own pass), else wall time around one submit of them all."""
    from onnx_quant.backend_wgpu.profiling import TimestampQueries

    cmd = ("dispatch", compiled, bind_group, grid, "roofline")
    dev.submit([cmd])
    if "timestamp-query" in dev.info.features:
        q = TimestampQueries(dev)
        try:
            q.reserve(repeat)
            dev.submit([cmd] * repeat, timestamps=q)
            stamps = q.collect(repeat)
        finally:
            q.release()
        return min((e - b) * 1e-9 for b, e in stamps), "device"
    probe = dev.allocate(4, label="roofline probe")
    staging = dev.allocate_staging(4, label="roofline probe read-back")
    t0 = time.perf_counter()
    dev.submit([cmd] * repeat + [("copy", probe, 0, staging, 0, 4)], read=staging, read_size=4)
    return (time.perf_counter() - t0) / repeat, "host-wall"


def _run_microkernel(dev, source: str, buffers: list[tuple[int, str, int]], groups: int, repeat: int):
    key = tuple((i, kind) for i, kind, _ in buffers)
    compiled = dev.compile(source, key, label="roofline microkernel")
    bufs = [dev.allocate(size, label="roofline") for _, _, size in buffers]
    bg = dev.bind(compiled, [(i, b, size) for (i, _, size), b in zip(buffers, bufs)])
    return dispatch_seconds(dev, compiled, bg, _grid(groups), repeat)


def adapter_roofline(dev, *, short: bool, repeat: int) -> dict:
    """copy bytes/s, f32 flops/s, int8 int-ops/s (and which dot form gave it)."""
    from onnx_quant.errors import QuantError

    # the copy at several sizes (caches: the kernels' model-sized tensors are a few MiB), the best
    copies = {}
    for mib in ((0.25,) if short else (1, 4, 16, 64)):
        vec4s = int(mib * (1 << 16))
        t, clock = _run_microkernel(dev, COPY_WGSL, [(0, "read-only-storage", 16 * vec4s), (1, "storage", 16 * vec4s)],
                                    vec4s // 64, repeat)
        copies[f"{mib:g} MiB"] = 2 * 16 * vec4s / t
    out = {"clock": clock, "copy_bytes_per_s": max(copies.values()), "copy_by_size": copies}
    # a dispatch of one workgroup that does nothing: the floor every kernel pays (a latency term)
    out["dispatch_floor_s"], _ = _run_microkernel(dev, EMPTY_WGSL, [(0, "storage", 4)], 1, repeat)
    invocations, iters = (64 * 64, 64) if short else (64 * 1024, 1024)
    t, _ = _run_microkernel(dev, FMA_WGSL.replace("ITERS", str(iters)), [(0, "storage", 16 * invocations)],
                            invocations // 64, repeat)
    out["f32_flops_per_s"] = invocations * iters * 8 * 4 * 2 / t
    dots = {}
    for form, expr in DOT_FORMS.items():
        try:
            t, _ = _run_microkernel(dev, DOT_WGSL.replace("ITERS", str(iters)).replace("DOT", expr),
                                    [(0, "storage", 4 * invocations)], invocations // 64, repeat)
        except QuantError as e:  # the shader compiler has no dot4I8Packed
            dots[form] = {"error": str(e).splitlines()[0][:200]}
            continue
        dots[form] = {"int_ops_per_s": invocations * iters * 8 * 8 / t}
    best = max((f for f in dots if "int_ops_per_s" in dots[f]), key=lambda f: dots[f]["int_ops_per_s"])
    out.update(int8_ops_per_s=dots[best]["int_ops_per_s"], int8_form=best, int8_forms=dots)
    return out


# ----------------------------------------------------------------------------- one-node models

def one_node(op: str, graph_inputs: list[tuple[str, np.ndarray]], inits: list[tuple[str, np.ndarray]],
             attrs: dict | None = None, *, domain: str = "", opset: int = 17, out_type=None) -> onnx.ModelProto:
    """``op`` over graph inputs (fed) and initializers (constants), one output ``y``."""
    names = [n for n, _ in graph_inputs] + [n for n, _ in inits]
    order = attrs.pop("_order", None) if attrs else None
    node = helper.make_node(op, order or names, ["y"], domain=domain, **(attrs or {}))
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)) for n, a in graph_inputs]
    out = helper.make_tensor_value_info("y", out_type or vis[0].type.tensor_type.elem_type, None)
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    graph = helper.make_graph([node], op, vis, [out], [numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(graph, opset_imports=imports, ir_version=9)


def conv_layers(name: str, shapes: dict, **build) -> list[dict]:
    """The Conv nodes of exported model ``name`` (built with ``build``) at input ``shapes``:
    x and w shapes, bias, attributes, multiply-adds; most work first."""
    from onnx_quant import exported_models
    from onnx_quant.inference import infer_values

    model = exported_models.MODELS[name][0](**build)
    values = infer_values(model, {k: list(v) for k, v in shapes.items()})
    layers = []
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        x, w = (tuple(values[i].shape) for i in node.input[:2])
        y = tuple(values[node.output[0]].shape)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        layers.append({"model": name, "x": x, "w": w, "bias": len(node.input) > 2 and bool(node.input[2]),
                       "attrs": attrs, "y": y, "macs": int(np.prod(y)) * int(np.prod(w[1:]))})
    return sorted(layers, key=lambda d: -d["macs"])


def conv_label(layer: dict) -> str:
    a = layer["attrs"]
    k = "x".join(map(str, layer["w"][2:]))
    s = "" if set(a.get("strides", [1])) == {1} else f" s{a['strides'][0]}"
    g = "" if a.get("group", 1) == 1 else f" g{a['group']}"
    return f"{layer['model']} {'x'.join(map(str, layer['x']))} -> {layer['w'][0]}ch {k}{s}{g}"


def float_conv(layer: dict, rng, relu: bool = False) -> tuple[onnx.ModelProto, dict]:
    x = rng.standard_normal(layer["x"]).astype(F32)
    inits = [("w", (rng.standard_normal(layer["w"]) * 0.2).astype(F32))]
    if layer["bias"]:
        inits.append(("b", rng.standard_normal(layer["w"][0]).astype(F32)))
    model = one_node("Conv", [("x", x)], inits, dict(layer["attrs"]))
    if relu:  # Conv -> Relu: the graph compiler fuses them into one FusedConv node
        g = model.graph
        g.node[0].output[0] = "c"
        g.node.append(helper.make_node("Relu", ["c"], ["y"]))
    return model, {"x": x}


def qlinear_conv(layer: dict, rng) -> tuple[onnx.ModelProto, dict]:
    """QLinearConv of the same geometry: uint8 x, int8 w (per tensor), int32 bias, uint8 y."""
    x = rng.integers(0, 256, layer["x"]).astype(np.uint8)
    inits = [("x_scale", np.array(0.02, F32)), ("x_zero_point", np.array(128, np.uint8)),
             ("w", rng.integers(-127, 128, layer["w"]).astype(np.int8)), ("w_scale", np.array(0.01, F32)),
             ("w_zero_point", np.array(0, np.int8)), ("y_scale", np.array(0.05, F32)),
             ("y_zero_point", np.array(128, np.uint8))]
    if layer["bias"]:
        inits.append(("B", rng.integers(-1000, 1000, layer["w"][0]).astype(np.int32)))
    return one_node("QLinearConv", [("x", x)], inits, dict(layer["attrs"]), opset=10), {"x": x}


def conv_integer(layer: dict, rng) -> tuple[onnx.ModelProto, dict]:
    x = rng.integers(0, 256, layer["x"]).astype(np.uint8)
    inits = [("w", rng.integers(-127, 128, layer["w"]).astype(np.int8)),
             ("x_zero_point", np.array(128, np.uint8))]
    return (one_node("ConvInteger", [("x", x)], inits, dict(layer["attrs"]), opset=10, out_type=TensorProto.INT32),
            {"x": x})


@dataclass
class Case:
    """One kernel at one size: its one-node model, feeds, the kernel the Session runs, what it
    must do (``kind`` GEMM: flops or int-ops, ``int8``; MEMORY: bytes moved)."""

    name: str
    kernel: str
    build: Callable[[], tuple[onnx.ModelProto, dict]]
    kind: str
    work: float
    int8: bool = False
    min_bytes: int = 0       # GEMM: the bytes it must move (operands once, output once), for the roofline model
    session_kw: dict | None = None  # e.g. a forced variant


def _bytes(*arrays_or_counts) -> int:
    return int(sum(a.nbytes if isinstance(a, np.ndarray) else a for a in arrays_or_counts))


def cases(short: bool) -> list[Case]:
    rng = np.random.default_rng(0)
    img = (lambda h, w: (64, 64)) if short else (lambda h, w: (h, w))
    yolo = conv_layers("yolo_head", {"images": (1, 3, *img(320, 320))})
    dbnet = conv_layers("dbnet", {"x": (1, 3, *img(160, 160))})
    mobile = conv_layers("mobilenet_v3", {"x": (1, 3, *img(224, 224))})
    convs = [yolo[0], yolo[1], dbnet[0], mobile[0], next(c for c in mobile if c["attrs"].get("group", 1) > 1)]
    out: list[Case] = []

    def conv_bytes(layer: dict, item: int, out_item: int) -> int:  # x, w read once, y written once
        return item * (int(np.prod(layer["x"])) + int(np.prod(layer["w"]))) + out_item * int(np.prod(layer["y"]))

    for layer in convs:
        out.append(Case(f"Conv {conv_label(layer)}", "Conv", lambda l=layer: float_conv(l, rng), GEMM, 2 * layer["macs"],
                        min_bytes=conv_bytes(layer, 4, 4)))
    out.append(Case(f"FusedConv (+Relu) {conv_label(yolo[0])}", "FusedConv",
                    lambda: float_conv(yolo[0], rng, relu=True), GEMM, 2 * yolo[0]["macs"],
                    min_bytes=conv_bytes(yolo[0], 4, 4)))
    for layer in (yolo[0], dbnet[0]):
        out.append(Case(f"QLinearConv {conv_label(layer)}", "QLinearConv", lambda l=layer: qlinear_conv(l, rng), GEMM,
                        2 * layer["macs"], int8=True, min_bytes=conv_bytes(layer, 1, 1)))
        out.append(Case(f"ConvInteger {conv_label(layer)}", "ConvInteger", lambda l=layer: conv_integer(l, rng), GEMM,
                        2 * layer["macs"], int8=True, min_bytes=conv_bytes(layer, 1, 4)))
    # GEMMs: the transformer's FFN (d_model 256, ffn 1024, 128 tokens) and the dynamic MLP
    tokens, d, ffn = (16, 64, 128) if short else (128, 256, 1024)
    for (m, k, n) in ((tokens, d, ffn), (9 * 3, d, d)):
        macs = m * k * n
        f32_bytes, i8_bytes = 4 * (m * k + k * n + m * n), m * k + k * n + m * n
        a = rng.standard_normal((m, k)).astype(F32)
        bw = (rng.standard_normal((k, n)) * 0.1).astype(F32)
        matmul = lambda a=a, bw=bw: (one_node("MatMul", [("a", a)], [("b", bw)]), {"a": a})  # noqa: E731
        out.append(Case(f"MatMul {m}x{k}x{n}", "MatMul", matmul, GEMM, 2 * macs, min_bytes=f32_bytes))
        if (m, k, n) == (tokens, d, ffn):  # the workgroup-memory variant, forced: what barriers cost here
            out.append(Case(f"MatMul {m}x{k}x{n} (tiled forced)", "MatMul", matmul, GEMM, 2 * macs, min_bytes=f32_bytes,
                            session_kw={"variants": {"MatMul": "tiled"}}))
        out.append(Case(f"Gemm {m}x{k}x{n} (+bias)", "Gemm", lambda a=a, bw=bw, n=n: (
            one_node("Gemm", [("a", a)], [("b", bw), ("c", np.zeros(n, F32))]), {"a": a}), GEMM, 2 * macs,
            min_bytes=f32_bytes))
        au = rng.integers(0, 256, (m, k)).astype(np.uint8)
        bs = rng.integers(-127, 128, (k, n)).astype(np.int8)
        qmm = [("a_scale", np.array(0.02, F32)), ("a_zero_point", np.array(128, np.uint8)), ("b", bs),
               ("b_scale", np.array(0.01, F32)), ("b_zero_point", np.array(0, np.int8)),
               ("y_scale", np.array(0.05, F32)), ("y_zero_point", np.array(128, np.uint8))]
        out.append(Case(f"QLinearMatMul {m}x{k}x{n}", "QLinearMatMul", lambda au=au, qmm=qmm: (
            one_node("QLinearMatMul", [("a", au)], qmm, opset=10), {"a": au}), GEMM, 2 * macs, int8=True,
            min_bytes=i8_bytes))
        out.append(Case(f"MatMulInteger {m}x{k}x{n}", "MatMulInteger", lambda au=au, bs=bs: (
            one_node("MatMulInteger", [("a", au)], [("b", bs), ("a_zero_point", np.array(128, np.uint8))],
                     opset=10, out_type=TensorProto.INT32), {"a": au}), GEMM, 2 * macs, int8=True,
            min_bytes=i8_bytes + 3 * m * n))
        out.append(Case(f"DynamicQuantizeMatMul {m}x{k}x{n}", "DynamicQuantizeMatMul", lambda a=a, bs=bs: (
            one_node("DynamicQuantizeMatMul", [("a", a)], [("b", bs), ("b_scale", np.array(0.01, F32)),
                                                           ("b_zero_point", np.array(0, np.int8))],
                     domain="com.microsoft"), {"a": a}), GEMM, 2 * macs, int8=True,
            min_bytes=4 * m * k + k * n + 4 * m * n))
    # memory-bound kernels at the exported models' activation sizes
    feat = (1, 8, *img(160, 160))   # the YOLO head's feature map
    x = rng.standard_normal(feat).astype(F32)
    q = rng.integers(-128, 128, feat).astype(np.int8)
    s, z = np.array(0.05, F32), np.array(3, np.int8)
    out.append(Case(f"QuantizeLinear {'x'.join(map(str, feat))} f32->s8", "QuantizeLinear", lambda: (
        one_node("QuantizeLinear", [("x", x)], [("s", s), ("z", z)], out_type=TensorProto.INT8), {"x": x}),
        MEMORY, _bytes(x, x.size)))
    out.append(Case(f"DequantizeLinear {'x'.join(map(str, feat))} s8->f32", "DequantizeLinear", lambda: (
        one_node("DequantizeLinear", [("q", q)], [("s", s), ("z", z)], out_type=TensorProto.FLOAT), {"q": q}),
        MEMORY, _bytes(q, x)))
    x2 = rng.standard_normal(feat).astype(F32)
    out.append(Case(f"Add {'x'.join(map(str, feat))}", "Add", lambda: (
        one_node("Add", [("a", x), ("b", x2)], []), {"a": x, "b": x2}), MEMORY, _bytes(x, x2, x)))
    out.append(Case(f"Sigmoid {'x'.join(map(str, feat))}", "Sigmoid", lambda: (
        one_node("Sigmoid", [("x", x)], []), {"x": x}), MEMORY, _bytes(x, x)))
    heads = (1, 4, tokens, tokens)
    att = rng.standard_normal(heads).astype(F32)
    out.append(Case(f"Softmax {'x'.join(map(str, heads))}", "Softmax", lambda: (
        one_node("Softmax", [("x", att)], [], {"axis": -1}), {"x": att}), MEMORY, _bytes(att, att)))
    h = rng.standard_normal((1, tokens, d)).astype(F32)
    out.append(Case(f"LayerNormalization 1x{tokens}x{d}", "LayerNormalization", lambda: (
        one_node("LayerNormalization", [("x", h)], [("g", np.ones(d, F32)), ("b", np.zeros(d, F32))], {"axis": -1}),
        {"x": h}), MEMORY, _bytes(h, h)))
    up = np.array([1, 1, 2, 2], F32)
    out.append(Case(f"Resize nearest x2 {'x'.join(map(str, feat))}", "Resize", lambda: (
        one_node("Resize", [("x", x)], [("scales", up)], {"mode": "nearest", "_order": ["x", "", "scales"]}),
        {"x": x}), MEMORY, _bytes(x, 4 * x.nbytes)))
    pool_in = (1, 16, *img(112, 112))
    p = rng.standard_normal(pool_in).astype(F32)
    out.append(Case(f"MaxPool 3x3 s2 {'x'.join(map(str, pool_in))}", "MaxPool", lambda: (
        one_node("MaxPool", [("x", p)], [], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        {"x": p}), MEMORY, _bytes(p, p.nbytes // 4)))
    out.append(Case(f"AveragePool 2x2 s2 {'x'.join(map(str, pool_in))}", "AveragePool", lambda: (
        one_node("AveragePool", [("x", p)], [], {"kernel_shape": [2, 2], "strides": [2, 2]}), {"x": p}),
        MEMORY, _bytes(p, p.nbytes // 4)))
    out.append(Case(f"GlobalAveragePool {'x'.join(map(str, pool_in))}", "GlobalAveragePool", lambda: (
        one_node("GlobalAveragePool", [("x", p)], []), {"x": p}), MEMORY, _bytes(p, 4 * pool_in[1])))
    return out


# ----------------------------------------------------------------------------- timing a node

def node_seconds(dev, model, feeds, kernel: str, repeat: int, **session_kw) -> dict:
    """Best device (or host-wall) time of the model's ``kernel`` node(s) per run, through a
    profiled Session (backend_wgpu/profiling.py), after a warm-up run; its variant and clock."""
    from onnx_quant.backend_wgpu.session import Session

    with Session(model, device=dev, allow_host_fallback=False, profile=True, **session_kw) as s:
        s.run(None, feeds)
        s.profiler.reset()
        for _ in range(repeat):
            s.run(None, feeds)
        per_run: dict[int, float] = {}
        variants = set()
        clock = None
        passes = 0
        for ev in s.profiler.events:
            if ev.kernel == kernel:
                per_run[ev.run] = per_run.get(ev.run, 0.0) + ev.dur_us
                variants.add(ev.variant)
                clock = ev.clock
                if ev.run == 0:
                    passes += max(1, len(ev.passes))
        if not per_run:
            ran = sorted({(e.kernel, e.variant) for e in s.profiler.events})
            raise SystemExit(f"{kernel}: the Session ran no such kernel ({ran})")
        return {"s": min(per_run.values()) * 1e-6, "median_s": statistics.median(per_run.values()) * 1e-6,
                "variant": ",".join(sorted(variants)), "clock": clock, "dispatches": passes}


def ort_seconds(model, feeds, repeat: int) -> float | None:
    from onnx_quant.timing import median_seconds

    try:
        import onnxruntime as ort

        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - an op onnxruntime lacks: no anchor for that row
        return None
    return median_seconds(lambda: sess.run(None, feeds), repeat, warm_up=True)


def measure(dev, case: Case, roof: dict, repeat: int, with_ort: bool = True) -> dict:
    model, feeds = case.build()
    t = node_seconds(dev, model, feeds, case.kernel, repeat, **(case.session_kw or {}))
    rate = case.work / t["s"]
    peak = (roof["int8_ops_per_s"] if case.int8 else roof["f32_flops_per_s"]) if case.kind == GEMM \
        else roof["copy_bytes_per_s"]
    row = {"case": case.name, "kernel": case.kernel, "variant": t["variant"], "clock": t["clock"], "bound": case.kind,
           "work": case.work, "ms": t["s"] * 1e3, "median_ms": t["median_s"] * 1e3, "rate": rate, "fraction": rate / peak}
    if case.kind == MEMORY:
        # the bytes at the copy bandwidth after each pass's dispatch floor (the latency term)
        floor = roof["dispatch_floor_s"] * max(1, t["dispatches"])
        row["attainable"] = case.work / (case.work / roof["copy_bytes_per_s"] + floor)
        row["fraction_of_attainable"] = rate / row["attainable"]
    if case.kind == GEMM and case.min_bytes:
        # the roofline model: a GEMM of low arithmetic intensity cannot pass intensity x bandwidth
        row["attainable"] = min(peak, case.work / case.min_bytes * roof["copy_bytes_per_s"])
        row["fraction_of_attainable"] = rate / row["attainable"]
    if with_ort:
        t_ort = ort_seconds(model, feeds, repeat)
        row["ort_ms"] = None if t_ort is None else t_ort * 1e3
    return row


# ----------------------------------------------------------------------------- report

def markdown(result: dict) -> str:
    r = result["roofline"]
    lines = [f"adapter: {result['adapter']} (clock: {r['clock']})", "",
             "| roofline | measured |", "|---|---:|",
             *(f"| copy bandwidth (read + write), {size} buffers{' (roofline)' if v == r['copy_bytes_per_s'] else ''} | "
               f"{v / 1e9:.2f} GB/s |" for size, v in r["copy_by_size"].items()),
             f"| f32 FMA | {r['f32_flops_per_s'] / 1e9:.2f} GFLOP/s |",
             f"| dispatch floor (one empty workgroup) | {r['dispatch_floor_s'] * 1e6:.1f} µs |"]
    for form, d in r["int8_forms"].items():
        val = f"{d['int_ops_per_s'] / 1e9:.2f} Gop/s" if "int_ops_per_s" in d else f"unavailable: {d['error']}"
        lines.append(f"| int8 dot, {form}{' (roofline)' if form == r['int8_form'] else ''} | {val} |")
    lines += ["", "| kernel | variant | bound | ms | rate | fraction of roofline | of attainable (GEMM: min(compute, "
                  "intensity x copy); memory: bytes / (bytes / copy + passes x floor)) | onnxruntime CPU ms |",
              "|---|---|---|---:|---:|---:|---:|---:|"]
    for row in result["kernels"]:
        unit = ("GB/s", 1e9) if row["bound"] == MEMORY else ("Gop/s" if row["kernel"] in INT8_KERNELS else "GFLOP/s", 1e9)
        ort = "" if row.get("ort_ms") is None else f"{row['ort_ms']:.3f}"
        att = f"{100 * row['fraction_of_attainable']:.1f} %" if "fraction_of_attainable" in row else ""
        lines.append(f"| {row['case']} | {row['variant']} | {row['bound']} | {row['ms']:.3f} | "
                     f"{row['rate'] / unit[1]:.2f} {unit[0]} | {100 * row['fraction']:.1f} % | {att} | {ort} |")
    return "\n".join(lines)


INT8_KERNELS = {"QLinearConv", "ConvInteger", "QLinearMatMul", "MatMulInteger", "DynamicQuantizeMatMul"}


def run(*, short: bool = False, repeat: int | None = None, adapter=None, only=None, with_ort: bool = True,
        device=None) -> dict:
    """The roofline and the kernels' rows (``only``: case name prefixes) on ``device`` (default:
    ``adapter``'s shared device)."""
    from onnx_quant.backend_wgpu.device import get_device

    repeat = repeat or (2 if short else 7)
    dev = device or get_device(adapter)
    roof = adapter_roofline(dev, short=short, repeat=2 * repeat)  # cheap: twice the repeats
    rows = []
    for case in cases(short):
        if only and not any(case.name.startswith(o) for o in only):
            continue
        rows.append(measure(dev, case, roof, repeat, with_ort))
        print(f"{rows[-1]['case']}: {rows[-1]['ms']:.3f} ms, {100 * rows[-1]['fraction']:.1f} %",
              file=sys.stderr, flush=True)
    return {"adapter": dev.info.name, "short": short, "repeat": repeat, "roofline": roof, "kernels": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", action="store_true", help="tiny sizes, 2 repeats (the tests' smoke run)")
    ap.add_argument("--repeat", type=int)
    ap.add_argument("--adapter")
    ap.add_argument("--only", help="comma-separated case name prefixes")
    ap.add_argument("--no-ort", action="store_true", help="skip the onnxruntime CPU anchors")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    only = [s for s in (args.only or "").split(",") if s]
    result = run(short=args.short, repeat=args.repeat, adapter=args.adapter, only=only, with_ort=not args.no_ort)
    print(markdown(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

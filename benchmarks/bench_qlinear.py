"""QLinearMatMul / QLinearConv benchmark: every GPU variant beside onnxruntime CPU and numpy.

    python benchmarks/bench_qlinear.py [--only matmul|conv] [--size 1024] [--repeat 3]
        [--variants blocked,tiled,simple] [--adapter vulkan] [--tune] [--json]

Cases (uint8 activations, int8 weights, uint8 output, per-tensor parameters):
- QLinearMatMul M = N = K = --size (1024): 2 * M * N * K operations;
- QLinearConv x 1x64x56x56, w 64x64x3x3, pads 1: 2 * N * M * P * C * 9 operations.

Every row is timed in the same process on the same inputs: the GPU end to end (host arrays in
-> upload -> one submit of the passes -> read back -> host array out; median of --repeat runs
after a warm-up run that plans, compiles and allocates), the GPU passes alone (``kernel ms``:
one submit waiting on a 4-byte read back), onnxruntime CPU (the same one-node model) and numpy
(the int32 matmul of the zero-point-shifted operands, for the convolution after an im2col;
numpy has no integer BLAS). GOPS = operations / time; ``x numpy`` / ``x ort`` = speed relative
to them (above 1 = faster). Every GPU output is checked bit for bit against the reference
formula (float64 requantization, as onnx.reference computes it); the script exits 1 otherwise.
``--tune`` also times the blocked and tiled GEMM passes for a few tile shapes (tunables).
Figures measured on the development machine are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


from onnx import TensorProto, helper

from onnx_quant.timing import median_seconds

QLMM_INPUTS = ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point"]
QLC_INPUTS = ["x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point"]

#: tile shapes tried by --tune (name -> tunables)
TUNE_MATMUL = {
    "blocked": [
        {"WG_ROWS": 8, "WG_COLS": 8, "ROWS_PER_THREAD": 8, "COL_WORDS_PER_THREAD": 2},
        {"WG_ROWS": 8, "WG_COLS": 8, "ROWS_PER_THREAD": 4, "COL_WORDS_PER_THREAD": 2},
        {"WG_ROWS": 8, "WG_COLS": 8, "ROWS_PER_THREAD": 8, "COL_WORDS_PER_THREAD": 1},
        {"WG_ROWS": 4, "WG_COLS": 16, "ROWS_PER_THREAD": 8, "COL_WORDS_PER_THREAD": 2},
        {"WG_ROWS": 8, "WG_COLS": 8, "ROWS_PER_THREAD": 16, "COL_WORDS_PER_THREAD": 1},
        {"WG_ROWS": 8, "WG_COLS": 8, "ROWS_PER_THREAD": 8, "COL_WORDS_PER_THREAD": 4},
    ],
    "tiled": [
        {"TILE_WG_ROWS": 8, "TILE_WG_COLS": 8, "TILE_ROWS_PER_THREAD": 8, "TILE_COL_WORDS_PER_THREAD": 2, "TILE_K_WORDS": 8},
        {"TILE_WG_ROWS": 8, "TILE_WG_COLS": 8, "TILE_ROWS_PER_THREAD": 8, "TILE_COL_WORDS_PER_THREAD": 2, "TILE_K_WORDS": 4},
        {"TILE_WG_ROWS": 16, "TILE_WG_COLS": 16, "TILE_ROWS_PER_THREAD": 4, "TILE_COL_WORDS_PER_THREAD": 1, "TILE_K_WORDS": 8},
        {"TILE_WG_ROWS": 16, "TILE_WG_COLS": 16, "TILE_ROWS_PER_THREAD": 4, "TILE_COL_WORDS_PER_THREAD": 1, "TILE_K_WORDS": 16},
        {"TILE_WG_ROWS": 8, "TILE_WG_COLS": 16, "TILE_ROWS_PER_THREAD": 8, "TILE_COL_WORDS_PER_THREAD": 1, "TILE_K_WORDS": 8},
    ],
}
TUNE_CONV = {
    "blocked": [
        {"WG_ROWS": 8, "WG_COLS": 8, "CHANNELS_PER_THREAD": 8, "POSITION_QUADS_PER_THREAD": 2},
        {"WG_ROWS": 8, "WG_COLS": 8, "CHANNELS_PER_THREAD": 4, "POSITION_QUADS_PER_THREAD": 2},
        {"WG_ROWS": 8, "WG_COLS": 8, "CHANNELS_PER_THREAD": 8, "POSITION_QUADS_PER_THREAD": 1},
        {"WG_ROWS": 4, "WG_COLS": 16, "CHANNELS_PER_THREAD": 4, "POSITION_QUADS_PER_THREAD": 1},
        {"WG_ROWS": 8, "WG_COLS": 8, "CHANNELS_PER_THREAD": 4, "POSITION_QUADS_PER_THREAD": 1},
    ],
    "tiled": [
        {"TILE_WG_ROWS": 8, "TILE_WG_COLS": 8, "TILE_CHANNELS_PER_THREAD": 8, "TILE_POSITION_QUADS_PER_THREAD": 2, "TILE_K_WORDS": 8},
        {"TILE_WG_ROWS": 8, "TILE_WG_COLS": 16, "TILE_CHANNELS_PER_THREAD": 4, "TILE_POSITION_QUADS_PER_THREAD": 1, "TILE_K_WORDS": 8},
        {"TILE_WG_ROWS": 8, "TILE_WG_COLS": 8, "TILE_CHANNELS_PER_THREAD": 8, "TILE_POSITION_QUADS_PER_THREAD": 2, "TILE_K_WORDS": 4},
        {"TILE_WG_ROWS": 8, "TILE_WG_COLS": 8, "TILE_CHANNELS_PER_THREAD": 4, "TILE_POSITION_QUADS_PER_THREAD": 2, "TILE_K_WORDS": 16},
    ],
}


def _model(op: str, names: list[str], feeds: dict, attrs: dict | None = None):
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(feeds[n].dtype), feeds[n].shape)
              for n in names]
    out = helper.make_tensor_value_info("y", TensorProto.UINT8, None)
    node = helper.make_node(op, names, ["y"], name=op.lower(), **(attrs or {}))
    graph = helper.make_graph([node], "bench", inputs, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21 if op == "QLinearMatMul" else 10)])


def _requantize(acc: np.ndarray, m: np.float32, zp: int) -> np.ndarray:
    """The reference's requantization: clip(rint(float64(acc) * m + zp), 0, 255)."""
    return np.clip(np.rint(acc.astype(np.float64) * np.float64(m) + zp), 0, 255).astype(np.uint8)


def matmul_case(size: int, rng) -> dict[str, Any]:
    m = n = k = size
    f = {"a": rng.integers(0, 256, (m, k), dtype=np.uint8), "a_scale": np.array(0.0123, np.float32),
         "a_zero_point": np.array(131, np.uint8), "b": rng.integers(-128, 128, (k, n), dtype=np.int8),
         "b_scale": np.array(0.00731, np.float32), "b_zero_point": np.array(0, np.int8),
         "y_scale": np.array(1.37, np.float32), "y_zero_point": np.array(118, np.uint8)}
    a32 = f["a"].astype(np.int32) - np.int32(131)
    b32 = f["b"].astype(np.int32)

    def numpy_run():
        return a32 @ b32

    mult = f["a_scale"] * f["b_scale"] / f["y_scale"]
    expected = _requantize(numpy_run(), mult, 118)
    return {"name": f"QLinearMatMul {m}x{k} @ {k}x{n}", "op": "QLinearMatMul", "feeds": f,
            "model": _model("QLinearMatMul", QLMM_INPUTS, f), "ops": 2 * m * n * k,
            "numpy": numpy_run, "numpy_what": "int32 matmul", "expected": expected, "tune": TUNE_MATMUL}


def conv_case(rng) -> dict[str, Any]:
    n, c, h, w_, m, k = 1, 64, 56, 56, 64, 3
    f = {"x": rng.integers(0, 256, (n, c, h, w_), dtype=np.uint8), "x_scale": np.array(0.0213, np.float32),
         "x_zero_point": np.array(124, np.uint8), "w": rng.integers(-128, 128, (m, c, k, k), dtype=np.int8),
         "w_scale": np.array(0.00417, np.float32), "w_zero_point": np.array(0, np.int8),
         "y_scale": np.array(2.9, np.float32), "y_zero_point": np.array(121, np.uint8)}
    attrs = {"pads": [1, 1, 1, 1]}
    x32 = np.pad(f["x"].astype(np.int32) - np.int32(124), [(0, 0), (0, 0), (1, 1), (1, 1)])
    wmat = f["w"].astype(np.int32).reshape(m, c * k * k)

    def numpy_run():  # im2col (a copy) then one int32 matmul
        cols = np.lib.stride_tricks.sliding_window_view(x32[0], (k, k), axis=(1, 2))  # c, h, w, k, k
        cols = np.ascontiguousarray(cols.transpose(0, 3, 4, 1, 2)).reshape(c * k * k, h * w_)
        return (wmat @ cols).reshape(n, m, h, w_)

    mult = f["x_scale"] * f["w_scale"] / f["y_scale"]
    expected = _requantize(numpy_run(), mult, 121)
    return {"name": "QLinearConv 1x64x56x56, 64 3x3 filters, pads 1", "op": "QLinearConv", "feeds": f,
            "model": _model("QLinearConv", QLC_INPUTS, f, attrs), "ops": 2 * n * m * h * w_ * c * k * k,
            "numpy": numpy_run, "numpy_what": "im2col + int32 matmul", "expected": expected, "tune": TUNE_CONV}


def bench_case(case: dict, device, variants: list[str], repeat: int, tune: bool, say) -> list[dict]:
    from onnx_quant.backend_wgpu.executor import prepare  # noqa: PLC0415
    from onnx_quant.backend_wgpu.session import Session  # noqa: PLC0415

    rows: list[dict] = []
    feeds, ops = case["feeds"], case["ops"]
    t_np = median_seconds(case["numpy"], repeat)
    rows.append({"case": case["name"], "impl": "numpy", "variant": case["numpy_what"], "ms": t_np * 1e3})
    say(f"{case['name']}: numpy {t_np * 1e3:.1f} ms")
    try:
        import onnxruntime as ort  # noqa: PLC0415

        sess = ort.InferenceSession(case["model"].SerializeToString(), providers=["CPUExecutionProvider"])
        sess.run(None, feeds)
        t_ort = median_seconds(lambda: sess.run(None, feeds), max(repeat, 5))
        rows.append({"case": case["name"], "impl": "onnxruntime-cpu", "variant": "", "ms": t_ort * 1e3})
        say(f"{case['name']}: onnxruntime {t_ort * 1e3:.1f} ms")
    except ImportError:  # pragma: no cover - onnxruntime is a test extra
        pass

    def run_variant(variant: str, tunables: dict | None, kernel_only: bool) -> dict:
        session = Session(case["model"], device=device, variants={case["op"]: variant}, tunables=tunables)
        try:
            t0 = time.perf_counter()
            got = session.run(None, feeds)[0]
            first = time.perf_counter() - t0
            exact = bool(np.array_equal(got, case["expected"]))
            comp0 = device.pipelines.compilations
            reps = repeat if first < 3.0 else max(1, min(repeat, 2))
            t_gpu = math.nan if kernel_only else median_seconds(lambda: session.run(None, feeds), reps)
            compiles = device.pipelines.compilations - comp0
            plan = session.plans({k: v.shape for k, v in feeds.items()})[0]
            prep = prepare(device, plan)
            small = device.allocate_staging(4, label="bench wait")
            out = prep.buffers["y"]
            t_kernel = median_seconds(lambda: device.launch(prep.steps, copies=[(out, 0, small, 0, 4)], read=small), reps)
            small.destroy()
        finally:
            session.close()
        return {"case": case["name"], "impl": "gpu", "variant": variant, "tunables": tunables or {},
                "ms": t_gpu * 1e3, "kernel_ms": t_kernel * 1e3, "first_run_ms": first * 1e3, "exact": exact,
                "compilations": compiles, "passes": [[p.id, list(p.dispatch)] for p in plan.passes]}

    for variant in variants:
        row = run_variant(variant, None, False)
        rows.append(row)
        say(f"{case['name']}: {variant} {row['ms']:.1f} ms (kernel {row['kernel_ms']:.1f} ms, exact={row['exact']})")
    if tune:
        for variant, options in case["tune"].items():
            for tun in options:
                row = run_variant(variant, tun, True)
                row["impl"] = "gpu-tune"
                rows.append(row)
                say(f"{case['name']}: tune {variant} {tun}: kernel {row['kernel_ms']:.1f} ms ({row['exact']})")
    peers = {r["impl"]: r for r in rows if r["impl"] in ("numpy", "onnxruntime-cpu")}
    for r in rows:
        t = r["ms"] if not math.isnan(r["ms"]) else r.get("kernel_ms", math.nan)
        r["gops"] = ops / (t * 1e-3) / 1e9
        if "numpy" in peers:
            r["x_numpy"] = peers["numpy"]["ms"] / t
        if "onnxruntime-cpu" in peers:
            r["x_ort"] = peers["onnxruntime-cpu"]["ms"] / t
        if "kernel_ms" in r:
            r["kernel_gops"] = ops / (r["kernel_ms"] * 1e-3) / 1e9
    return rows


def format_rows(rows: list[dict]) -> str:
    head = f"| case | impl | variant | ms | GOPS | × numpy | × ort | kernel ms | kernel GOPS | exact |"
    lines = [head, "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r["impl"] == "gpu-tune":
            continue
        lines.append(
            f"| {r['case']} | {r['impl']} | {r['variant']} | {r['ms']:.1f} | {r['gops']:.2f} | "
            f"{r.get('x_numpy', math.nan):.2f} | {r.get('x_ort', math.nan):.2f} | "
            f"{(format(r['kernel_ms'], '.1f') if 'kernel_ms' in r else '')} | "
            f"{(format(r['kernel_gops'], '.2f') if 'kernel_gops' in r else '')} | {r.get('exact', '')} |")
    tune = [r for r in rows if r["impl"] == "gpu-tune"]
    if tune:
        lines += ["", "| case | variant | tunables | kernel ms | kernel GOPS | exact |", "|---|---|---|---:|---:|---|"]
        for r in tune:
            tun = ", ".join(f"{k}={v}" for k, v in r["tunables"].items())
            lines.append(f"| {r['case']} | {r['variant']} | {tun} | {r['kernel_ms']:.1f} | {r['kernel_gops']:.2f} | {r['exact']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=["matmul", "conv"])
    p.add_argument("--size", type=int, default=1024, help="QLinearMatMul M = N = K")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--variants", default="blocked,tiled,simple")
    p.add_argument("--adapter")
    p.add_argument("--tune", action="store_true", help="also time the GEMM for a few tile shapes")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from onnx_quant.backend_wgpu.device import get_device  # noqa: PLC0415

    device = get_device(args.adapter)
    say = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    say(f"device: {device.info.name} ({device.info.backend})")
    rng = np.random.default_rng(0)
    variants = [v for v in args.variants.split(",") if v]
    cases = []
    if args.only in (None, "matmul"):
        cases.append(matmul_case(args.size, rng))
    if args.only in (None, "conv"):
        cases.append(conv_case(rng))
    rows: list[dict] = []
    for case in cases:
        rows += bench_case(case, device, variants, args.repeat, args.tune, say)
    print(json.dumps({"device": device.info.name, "rows": rows}, indent=2, default=str) if args.json
          else format_rows(rows))
    return 0 if all(r.get("exact", True) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

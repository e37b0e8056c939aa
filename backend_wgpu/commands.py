"""The GPU subcommands of ``onnx-quant``: devices, explain, run, bench, conformance, demo.

Each ``cmd_*`` takes the parsed arguments and returns an exit code; errors are raised as
``QuantError`` subclasses and turned into one line by ``onnx_quant.cli``.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from onnx_quant.errors import ArgumentError, ExecutionError, QuantError
from onnx_quant.timing import median_seconds

from . import tuning, tuning_cache
from .profiling import Profiler
from .reporting import describe_difference, feeds_from_args, host_nodes, open_session, same_values, summary, timed_runs

# --------------------------------------------------------------------------- numpy formula


def numpy_dynamic_quantize_linear(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX DynamicQuantizeLinear in numpy with the behaviour this project implements on every
    input: the ONNX reference implementation's (``onnx.reference``), extended to empty input
    (see docs/backend.md): a NaN anywhere gives scale NaN, zero point 255 and y all 0;
    max == min (all zero, empty) gives scale RN(1/255); a NaN zero point is 255 and a NaN
    quotient quantizes to 0."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(all="ignore"):
        if x.size:
            hi = np.maximum(np.float32(0), x.max())  # NaN propagates
            lo = np.minimum(np.float32(0), x.min())
        else:
            lo = hi = np.float32(0)
        scale = (np.float32(1) if hi == lo else np.float32(hi - lo)) / np.float32(255)
        zp_f = np.float32(0) - lo / scale
        zp = np.float32(255) if np.isnan(zp_f) else np.float32(np.rint(np.clip(zp_f, 0, 255)))
        q = np.rint(x / scale) + zp
        y = np.where(np.isnan(q), np.float32(0), np.clip(q, 0, 255)).astype(np.uint8)
    return y, np.array(scale, dtype=np.float32), np.array(zp, dtype=np.uint8)


def numpy_onnx_formula(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ONNX specification's formula, literally, in numpy (what the bench times as "numpy");
    equal to :func:`numpy_dynamic_quantize_linear` on inputs without NaN and not all zero."""
    x = np.asarray(x, dtype=np.float32)
    x_min = np.minimum(np.float32(0), x.min())
    x_max = np.maximum(np.float32(0), x.max())
    scale = np.float32(x_max - x_min) / np.float32(255)
    zp = np.rint(np.clip(np.float32(0) - x_min / scale, 0, 255))
    y = np.clip(np.rint(x / scale) + zp, 0, 255).astype(np.uint8)
    return y, np.array(scale, np.float32), np.array(zp, np.uint8)


def dql_model(rank: int | None = 1, opset: int = 21):
    """A one-node DynamicQuantizeLinear model with symbolic input dims (``rank`` of them)."""
    from onnx import TensorProto, helper  # noqa: PLC0415

    shape = None if rank is None else [f"d{i}" for i in range(rank)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    outs = [helper.make_tensor_value_info("y", TensorProto.UINT8, shape),
            helper.make_tensor_value_info("y_scale", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("y_zero_point", TensorProto.UINT8, [])]
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "y_scale", "y_zero_point"],
                            name="DynamicQuantizeLinear")
    graph = helper.make_graph([node], "dynamic_quantize_linear", [x], outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


# --------------------------------------------------------------------------- devices


_PLANNER_LIMITS = (
    "maxStorageBufferBindingSize", "maxBufferSize", "maxUniformBufferBindingSize",
    "maxStorageBuffersPerShaderStage", "maxUniformBuffersPerShaderStage", "maxBindingsPerBindGroup",
    "maxComputeWorkgroupsPerDimension", "maxComputeInvocationsPerWorkgroup", "maxComputeWorkgroupSizeX",
    "maxComputeWorkgroupStorageSize",
)


def limits_used_by_specs() -> list[str]:
    """Limit names the kernel specs read (``device.limits.X``) and those the planner checks."""
    from .render import templates_dir  # noqa: PLC0415

    names = set(_PLANNER_LIMITS)
    for path in sorted(templates_dir().glob("*.kernel.json")):
        names.update(re.findall(r"device\.limits\.([A-Za-z0-9_]+)", path.read_text(encoding="utf-8")))
    return sorted(names)


def devices_report() -> list[dict[str, Any]]:
    from .device import WANTED_FEATURES, list_adapters, select_adapter  # noqa: PLC0415
    from .device_info import WEBGPU_DEFAULT_LIMITS  # noqa: PLC0415

    adapters = list_adapters()
    default = select_adapter(None).index if adapters else None
    used = limits_used_by_specs()
    out = []
    for a in adapters:
        out.append({
            "index": a.index,
            "default": a.index == default,
            "summary": a.summary,
            "backend": a.backend,
            "adapter_type": a.adapter_type,
            "kernel_features": [f for f in WANTED_FEATURES if f in a.features],
            "features": sorted(a.features),
            "limits": {n: a.limits.get(n) for n in used},
            "webgpu_default_limits": {n: WEBGPU_DEFAULT_LIMITS.get(n) for n in used},
        })
    return out


def cmd_devices(args) -> int:
    report = devices_report()
    if getattr(args, "json", False):
        print(json.dumps(report, indent=2))
        return 0 if report else 1
    if not report:
        print("no wgpu adapter found (on Linux without a GPU: apt-get install mesa-vulkan-drivers)")
        return 1
    for a in report:
        mark = "  (default)" if a["default"] else ""
        print(f"[{a['index']}] {a['summary']}{mark}")
        print(f"    backend {a['backend']}, type {a['adapter_type']}")
        print(f"    kernel features: {', '.join(a['kernel_features']) or 'none'}")
        print(f"    all features: {', '.join(a['features']) or 'none'}")
        print("    limits (the specs' and planner's; WebGPU default in brackets):")
        for n, v in a["limits"].items():
            print(f"      {n:<36} {v if v is not None else '-':>12}  [{a['webgpu_default_limits'].get(n)}]")
    print("choose one with ONNX_QUANT_ADAPTER=<index|name substring> or --adapter; "
          "ONNX_QUANT_LIMITS=default requests WebGPU's default limits")
    return 0


# --------------------------------------------------------------------------- explain


def cmd_explain(args) -> int:
    """Per node of the model as written: its kernel, variant and passes, or what it became (folded,
    fused, a view, a constant, constant-folded, unused, host with why), at the input shapes
    ``--shape``/``--dim``/the defaults bind (onnx_quant/feeds.py); backend_wgpu/explaining.py."""
    from . import explaining  # noqa: PLC0415
    from .session import Session  # noqa: PLC0415
    from onnx_quant.feeds import bind_model_shapes, graph_inputs  # noqa: PLC0415
    from onnx_quant.model_io import load_model  # noqa: PLC0415

    model = load_model(args.model)
    binding = bind_model_shapes(model, shapes=getattr(args, "shape", None), dims=getattr(args, "dim", None))
    session = Session(args.model, adapter=getattr(args, "adapter", None))
    try:
        entries = session.explain(binding.shapes)
    except ExecutionError as e:
        if not binding.defaulted:
            raise
        raise ExecutionError(f"{e} ({', '.join(binding.defaulted)} took defaults: give the real sizes with "
                             f"--shape NAME=D0,D1,... or --dim SYMBOL=V)") from None
    diagnostics = explaining.shape_diagnostics(model, binding.shapes)
    rows, orphans = explaining.build_rows(model, session, entries, diagnostics)
    if getattr(args, "json", False):
        if binding.dims_text():
            print(binding.dims_text(), file=sys.stderr)
        print(json.dumps(explaining.json_entries(rows), indent=2))
        return 0
    print(f"device: {session.device.info.name}")
    expanded = session.function_expansion.expanded if session.function_expansion else ()
    for line in explaining.text_lines(rows, orphans, model, diagnostics, binding, graph_inputs(model), expanded):
        print(line)
    return 0


# --------------------------------------------------------------------------- run


def reference_outputs(model, feeds: dict[str, np.ndarray], names: Sequence[str], engine: str = "auto"):
    """(outputs, oracle choice): ``model``'s outputs ``names`` on ``feeds`` from the oracle
    ``engine`` names ("auto", "onnxruntime", "reference"; onnx_quant.oracles.choose_oracle)."""
    import warnings  # noqa: PLC0415

    from onnx_quant.oracles import choose_oracle, run_oracle  # noqa: PLC0415 - loads onnxruntime

    try:
        choice = choose_oracle(model, engine)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return run_oracle(choice, model, feeds, names), choice
    except ModuleNotFoundError as e:
        if e.name != "onnxruntime":
            raise
        raise ExecutionError(f"--compare {engine}: onnxruntime is not installed (--compare reference needs "
                             f"only onnx)") from None


def cmd_run(args) -> int:
    model, given = feeds_from_args(args, random=getattr(args, "random", False))  # model: as written
    feeds = given.arrays
    session = open_session(args.model, adapter=getattr(args, "adapter", None))
    names = session.output_names
    outputs, first, steady, submits = timed_runs(session, feeds)
    print(f"device: {session.device.info.name}")
    if given.binding.dims_text():
        print(given.binding.dims_text())
    for name, value in feeds.items():
        print(f"input  {name}: {value.dtype} {list(value.shape)}")
    for name, value in zip(names, outputs):
        print(f"output {name}: {value.dtype} {list(value.shape)} {summary(value)}")
    host = host_nodes(session)
    print(f"time: first run {first * 1e3:.2f} ms (plans, compiles, allocates), steady state "
          f"{steady * 1e3:.3f} ms ({submits} submit{'s' if submits != 1 else ''} per run)")
    print(session.cold_start.line())
    print(f"host fallback: {', '.join(host) if host else 'none (every node ran on the GPU)'}")
    out_dir = getattr(args, "output_dir", None)
    if out_dir:
        d = Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        for name, value in list(feeds.items()) + list(zip(names, outputs)):
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
            np.save(d / f"{safe}.npy", value)
        print(f"wrote {len(feeds)} inputs and {len(names)} outputs to {d}/")
    engine = getattr(args, "compare", None)
    if engine:
        return _compare(session.source_model, feeds, names, outputs, engine, getattr(args, "rtol", COMPARE_RTOL))
    return 0


#: float outputs agree with the oracle within this fraction of the largest expected magnitude
COMPARE_RTOL = 1e-3


def _within(got: np.ndarray, exp: np.ndarray, rtol: float) -> tuple[bool, str]:
    """(agree, text) for a float output that is not identical: max |diff| against rtol x the
    largest expected magnitude (+1e-6); NaN must meet NaN."""
    if got.shape != exp.shape or got.dtype != exp.dtype or got.dtype.kind != "f":
        return False, ""
    g, e = got.astype(np.float64), exp.astype(np.float64)
    if not np.array_equal(np.isnan(g), np.isnan(e)):
        return False, ""
    finite = ~np.isnan(e)
    with np.errstate(all="ignore"):
        diff = float(np.max(np.abs(g[finite] - e[finite]), initial=0.0))
        bound = rtol * float(np.max(np.abs(e[finite]), initial=0.0)) + 1e-6
    return diff <= bound, f"within {rtol:g} of the largest magnitude (max |diff| {diff:.3g} <= {bound:.3g})"


def _compare(model, feeds: dict[str, np.ndarray], names: Sequence[str], outputs: Sequence[np.ndarray],
             engine: str, rtol: float = COMPARE_RTOL) -> int:
    """Compare the GPU's ``outputs`` with an oracle's for the user's ``model`` as given (never the
    session's rewritten model, so a rewrite's bug shows): one line naming the oracle and why, one
    per output; exit 0 when integer outputs are identical and float ones within ``rtol``."""
    try:
        expected, choice = reference_outputs(model, feeds, names, engine)
    except QuantError:
        raise
    except Exception as e:
        raise ExecutionError(f"--compare {engine}: it failed to run the model: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None
    print(f"compare: oracle {choice.name}: {choice.reason}")
    ok = True
    for name, got, exp in zip(names, outputs, expected):
        got, exp = np.asarray(got), np.asarray(exp)
        same, text = describe_difference(model, name, got, exp)
        if not same:
            close, why = _within(got, exp, rtol)
            same, text = close, (f"{why}; {text}" if close else text)
        ok &= same
        print(f"compare {choice.name} {name}: {text}")
    return 0 if ok else 1


# --------------------------------------------------------------------------- bench


#: elements the single_invocation shader gets through on llvmpipe (65535 loop iterations per
#: invocation, 16 elements per iteration in each of its two loops)
LLVMPIPE_SERIAL_CAP = 65535 * 8


def _variant_setup(spec, variant: str, n: int) -> tuple[int, dict[str, int]]:
    """(element count, tunables) that make ``variant`` valid near ``n`` elements."""
    tun: dict[str, int] = {}
    count = n
    if variant == "single_invocation":
        tun["SERIAL_MAX_ELEMENTS"] = max(n, spec.tunables["SERIAL_MAX_ELEMENTS"].default)
    if variant.startswith("grid_stride"):
        tun["GRID_STRIDE_MIN_ELEMENTS"] = min(n - 1, spec.tunables["GRID_STRIDE_MIN_ELEMENTS"].default)
    if variant == "grid_stride_reduce" and n % 4 == 0:
        count = n - 1  # its when clause asks for a count that is not a multiple of 4
    return count, tun


def bench_dql(
    sizes_log2: Sequence[int] = (12, 16, 20, 24),
    *,
    repeat: int = 5,
    adapter: int | str | None = None,
    variants: Sequence[str] | None = None,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """DynamicQuantizeLinear: every variant (forced) on the GPU beside numpy and onnxruntime CPU.

    Times are medians of ``repeat`` end-to-end runs (host array in, host arrays out) after one
    warm-up run; GB/s is input bytes / median time. ``compilations``/``buffers`` are the pipeline
    compilations and buffer allocations during the timed runs (zero: the warm-up prepared all).
    ``kernel_ms`` is the passes alone (one submit, waiting on a 4-byte read back).
    """
    from .device import get_device  # noqa: PLC0415
    from .executor import prepare  # noqa: PLC0415
    from .session import Session  # noqa: PLC0415
    from .spec import load_specs  # noqa: PLC0415

    say = log or (lambda s: None)
    device = get_device(adapter)
    spec = load_specs().find("", "DynamicQuantizeLinear", 21)
    if spec is None:
        raise ExecutionError("bench: no DynamicQuantizeLinear kernel spec found")
    all_variants = [v.id for v in spec.variants]
    chosen = list(variants) if variants else all_variants
    unknown = [v for v in chosen if v not in all_variants]
    if unknown:
        raise ExecutionError(f"bench: unknown variants {unknown} (variants: {all_variants})")
    model = dql_model(1)
    try:
        import onnxruntime as ort  # noqa: PLC0415

        ort_session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # pragma: no cover - onnxruntime is a test extra
        ort_session = None
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for k in sizes_log2:
        n = 1 << int(k)
        base = (rng.standard_normal(n) * 3).astype(np.float32)
        ref = numpy_dynamic_quantize_linear(base)
        t_np = median_seconds(lambda: numpy_onnx_formula(base), repeat)
        np_out = numpy_onnx_formula(base)
        row_np = {"log2": int(k), "elements": n, "impl": "numpy", "variant": "-", "ms": t_np * 1e3,
                  "exact": all(same_values(a, b)[0] for a, b in zip(np_out, ref))}
        rows.append(row_np)
        say(f"2^{k}: numpy {t_np * 1e3:.2f} ms")
        t_ort = None
        if ort_session is not None:
            ort_session.run(None, {"x": base})
            t_ort = median_seconds(lambda: ort_session.run(None, {"x": base}), repeat)
            ort_out = ort_session.run(None, {"x": base})
            rows.append({"log2": int(k), "elements": n, "impl": "onnxruntime-cpu", "variant": "-",
                         "ms": t_ort * 1e3,
                         "exact": all(same_values(a, b)[0] for a, b in zip(ort_out, ref))})
            say(f"2^{k}: onnxruntime {t_ort * 1e3:.2f} ms")
        for variant in chosen:
            count, tun = _variant_setup(spec, variant, n)
            if variant == "single_invocation" and "llvmpipe" in device.info.name and count > LLVMPIPE_SERIAL_CAP:
                rows.append({"log2": int(k), "elements": count, "impl": "gpu", "variant": variant, "ms": math.nan,
                             "skipped": f"llvmpipe stops an invocation after 65535 loop iterations: one "
                                        f"invocation handles at most {LLVMPIPE_SERIAL_CAP} elements there"})
                say(f"2^{k}: {variant} skipped (llvmpipe loop limiter)")
                continue
            x = base[:count]
            expected = ref if count == n else numpy_dynamic_quantize_linear(x)
            session = Session(model, device=device, variants={"DynamicQuantizeLinear": variant}, tunables=tun)
            try:
                t0 = time.perf_counter()
                got = session.run(None, {"x": x})  # warm-up: plans, compiles, allocates
                first = time.perf_counter() - t0
                exact = all(same_values(a, b)[0] for a, b in zip(got, expected))
                comp0 = device.pipelines.compilations
                bufs0 = device.stats.buffers_allocated
                reps = repeat if first < 2.0 else max(1, min(repeat, 2))
                t_gpu = median_seconds(lambda: session.run(None, {"x": x}), reps)
                compilations = device.pipelines.compilations - comp0
                buffers = device.stats.buffers_allocated - bufs0
                plan = session.plans({"x": (count,)})[0]
                prep = prepare(device, plan)
                small = device.allocate_staging(4, label="bench wait")
                scale_buf = prep.buffers["y_scale"]
                t_kernel = median_seconds(
                    lambda: device.launch(prep.steps, copies=[(scale_buf, 0, small, 0, 4)], read=small), reps)
                small.destroy()
            finally:
                session.close()
            row = {
                "log2": int(k), "elements": count, "impl": "gpu", "variant": variant, "tunables": tun,
                "ms": t_gpu * 1e3, "kernel_ms": t_kernel * 1e3, "first_run_ms": first * 1e3,
                "compilations": compilations, "buffers": buffers, "exact": exact,
                "passes": [list(p.dispatch) for p in plan.passes],
            }
            rows.append(row)
            say(f"2^{k}: {variant} {t_gpu * 1e3:.2f} ms (kernel {t_kernel * 1e3:.2f} ms, exact={exact}, "
                f"compilations after warm-up {compilations})")
    for r in rows:
        if r.get("skipped"):
            continue
        r["gb_per_s"] = (4 * r["elements"]) / (r["ms"] * 1e-3) / 1e9 if r["ms"] > 0 else math.inf
        peers = {p["impl"]: p for p in rows if p["log2"] == r["log2"] and p["impl"] != "gpu"}
        if "numpy" in peers:
            r["speedup_vs_numpy"] = peers["numpy"]["ms"] / r["ms"] * r["elements"] / peers["numpy"]["elements"]
        if "onnxruntime-cpu" in peers:
            r["speedup_vs_onnxruntime"] = (peers["onnxruntime-cpu"]["ms"] / r["ms"] * r["elements"]
                                           / peers["onnxruntime-cpu"]["elements"])
    return {
        "kernel": "DynamicQuantizeLinear",
        "device": device.info.name,
        "backend": device.info.backend,
        "limits": device.limits_mode,
        "repeat": repeat,
        "rows": rows,
        "pipeline_counters": device.pipelines.counters(),
    }


def format_bench(result: dict[str, Any]) -> str:
    lines = [f"DynamicQuantizeLinear on {result['device']} (limits: {result['limits']}), "
             f"median of {result['repeat']} end-to-end runs after a warm-up",
             f"{'elements':>10} {'impl':<16} {'variant':<30} {'ms':>9} {'GB/s':>6} {'x numpy':>8} {'x ort':>7} "
             f"{'kernel ms':>9} {'compiles':>8} {'exact':>5}"]
    for r in result["rows"]:
        elems = f"2^{r['log2']}" + ("-1" if r["elements"] == (1 << r["log2"]) - 1 else "")
        if r.get("skipped"):
            lines.append(f"{elems:>10} {r['impl']:<16} {r['variant']:<30} skipped: {r['skipped']}")
            continue
        lines.append(
            f"{elems:>10} {r['impl']:<16} {r['variant']:<30} {r['ms']:>9.2f} {r['gb_per_s']:>6.2f} "
            f"{r.get('speedup_vs_numpy', 1.0):>8.2f} {r.get('speedup_vs_onnxruntime', float('nan')):>7.2f} "
            f"{(format(r['kernel_ms'], '.2f') if 'kernel_ms' in r else '-'):>9} "
            f"{(str(r['compilations']) if 'compilations' in r else '-'):>8} {str(r.get('exact', '-')):>5}")
    c = result["pipeline_counters"]
    lines.append(f"pipeline cache: {c['compilations']} compilations, {c['cache_hits']} cache hits; "
                 f"compilations during the timed (second and later) runs: "
                 f"{sum(r.get('compilations', 0) for r in result['rows'])}")
    return "\n".join(lines)


def cmd_bench(args) -> int:
    try:
        sizes = [int(s) for s in str(getattr(args, "sizes", "12,16,20,24")).split(",") if s.strip()]
    except ValueError:
        raise ExecutionError(f"--sizes {args.sizes!r}: expected comma-separated integers (log2 element counts)") from None
    if not sizes or any(s < 2 or s > 28 for s in sizes):
        raise ExecutionError(f"--sizes {args.sizes!r}: each log2 size must be within 2..28")
    as_json = getattr(args, "json", False)
    log = None if as_json else (lambda s: print(s, file=sys.stderr, flush=True))
    result = bench_dql(sizes, repeat=int(getattr(args, "repeat", 5)), adapter=getattr(args, "adapter", None), log=log)
    if as_json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(format_bench(result))
    bad = [r for r in result["rows"] if r["impl"] == "gpu" and not r.get("skipped")
           and (not r["exact"] or r["compilations"] or r["buffers"])]
    return 1 if bad else 0


# --------------------------------------------------------------------------- conformance


def cmd_conformance(args) -> int:
    """ONNX's node cases for the quantization family on the GPU: one row per case, totals;
    exit 1 if any case does not pass (a case with a node run on the host does not)."""
    from .conformance import format_table, run_conformance, status, totals  # noqa: PLC0415
    from .device import get_device  # noqa: PLC0415

    ops = getattr(args, "ops", None)
    ops = [o for o in re.split(r"[,\s]+", ops) if o] if ops else None
    as_json = getattr(args, "json", False)
    device = get_device(getattr(args, "adapter", None))
    if getattr(args, "suite", "family") == "all":
        return _conformance_suite(ops, device, as_json, not getattr(args, "no_onnxruntime", False))

    def progress(i: int, n: int, row) -> None:
        print(f"[{i}/{n}] {row.case}: {status(row)} ({row.seconds:.2f} s)", file=sys.stderr, flush=True)

    rows = run_conformance(ops, device=device, progress=progress)
    if as_json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
    else:
        print(format_table(rows, device.info.name))
    t = totals(rows)
    print(f"oracle: {CONFORMANCE_ORACLE}", file=sys.stderr)
    print(f"conformance: {t['passed']}/{t['cases']} passed on {device.info.name}", file=sys.stderr)
    return 0 if rows and t["passed"] == t["cases"] else 1


#: what the conformance runs judge the GPU's outputs against
CONFORMANCE_ORACLE = ("each case's expected outputs as ONNX ships them (onnx.backend.test), integers bit for bit, "
                      "floats within the case's rtol/atol")


def onnxruntime_column_note() -> str:
    """What the onnxruntime CPU column means on this host: its own kernels, whose uint8 x int8
    sums are exact only with VNNI (onnx_quant.oracles)."""
    from onnx_quant.oracles import host_u8s8_exact  # noqa: PLC0415 - loads onnxruntime

    return ("onnxruntime's own verdict on each case on this CPU, which sums uint8 x int8 products "
            + ("exactly (VNNI)" if host_u8s8_exact() else "with int16 saturation (AVX2 without VNNI)"))


def _conformance_suite(ops, device, as_json: bool, with_ort: bool) -> int:
    """``--suite all``: ONNX's whole node suite on the GPU (no host fallback), a row per op type
    beside onnxruntime CPU; exit 1 if any case gave a wrong value or an internal error (declines
    and missing kernels are reported, not failures)."""
    from .suite import format_summary, outcome, run_suite, summarise  # noqa: PLC0415

    def progress(engine: str, i: int, n: int, row) -> None:
        if i % 100 == 0 or i == n:
            print(f"[{engine} {i}/{n}]", file=sys.stderr, flush=True)

    gpu, ort = run_suite(ops, device=device, onnxruntime=with_ort, progress=progress)
    per_op = summarise(gpu, ort)
    total = per_op[-1]
    if as_json:
        outcome_of = {r.case: outcome(r) for r in gpu}
        ort_pass = {r.case: r.passed for r in ort or ()}
        print(json.dumps({
            "suite": "all", "device": device.info.name, "oracle": CONFORMANCE_ORACLE,
            **({"onnxruntime_column": onnxruntime_column_note()} if ort is not None else {}),
            "ops": [vars(s) for s in per_op],
            "cases": [{**r.as_dict(), "outcome": outcome_of[r.case],
                       **({"onnxruntime_passed": ort_pass[r.case]} if ort is not None else {})} for r in gpu],
        }, indent=1))
    else:
        print(format_summary(per_op))
    ort_text = f", onnxruntime CPU {total.onnxruntime}" if ort is not None else ""
    print(f"oracle: {CONFORMANCE_ORACLE}", file=sys.stderr)
    if ort is not None:
        print(f"onnxruntime column: {onnxruntime_column_note()}", file=sys.stderr)
    print(f"conformance --suite all: {total.passed}/{total.cases} pass on {device.info.name} ({total.wrong} wrong, "
          f"{total.declined} declined, {total.no_kernel} no kernel, {total.host_only} host-only, {total.errors} errors)"
          f"{ort_text}", file=sys.stderr)
    return 0 if gpu and total.wrong == 0 and total.errors == 0 else 1


# --------------------------------------------------------------------------- demo


def cmd_demo(args) -> int:
    """Build a small quantized CNN, infer it, run it on the GPU and compare with the CPU
    reference (``backend_wgpu/demo.py``); exit 0 when they agree."""
    from .demo import run_demo  # noqa: PLC0415

    return run_demo(adapter=getattr(args, "adapter", None), log=lambda s: print(s, flush=True))


# --------------------------------------------------------------------------- profile


def cmd_profile(args) -> int:
    """``onnx-quant profile MODEL [--runs N] [--trace FILE]``: one warm-up run (plans, compiles,
    and lavapipe's first-dispatch shader JIT), then N profiled runs; the table sorted by time.
    Inputs no ``--input`` gives are random at the shapes ``--shape``/``--dim``/the defaults bind
    (onnx_quant/feeds.py), checked before the session is built."""
    if args.runs < 1:
        raise ArgumentError(f"--runs {args.runs}: expected at least 1")
    if args.top is not None and args.top < 1:
        raise ArgumentError(f"--top {args.top}: expected at least 1")
    _, given = feeds_from_args(args, random=True)
    session = open_session(args.model, adapter=args.adapter)
    session.profiler = Profiler(session.device, None if args.clock == "auto" else args.clock)
    feeds = given.arrays
    session.run(None, feeds)
    session.profiler.reset()
    for _ in range(args.runs):
        session.run(None, feeds)
    prof = session.profiler
    if args.json:
        print(json.dumps({"device": session.device.info.name, "clock": prof.clock, "runs": len(prof.runs),
                          "dims": given.binding.values, "defaulted_dims": given.binding.defaulted,
                          "inputs": {k: list(v.shape) for k, v in feeds.items()},
                          "cold_start": session.cold_start.as_dict(), "nodes": prof.table()}, indent=2))
    else:
        print(f"device: {session.device.info.name}")
        if given.binding.dims_text():
            print(given.binding.dims_text())
        print(prof.format_table(args.top))
        print(session.cold_start.line())
    if args.trace:
        path = prof.write_trace(args.trace)
        if not args.json:
            print(f"trace: {path} ({len(prof.events)} node events; open in chrome://tracing or Perfetto)")
    return 0


def cmd_tune(args) -> int:
    """``onnx-quant tune MODEL``: time every variant and tunable value the specs allow for each GPU
    node at the shapes ``--shape``/``--dim``/the defaults bind (random feeds where no ``--input``
    gives one), keep the fastest whose outputs equal the static choice's, and write the choices
    to the adapter's tuning table (tuning_cache.py), which later sessions plan with.
    ``--clear`` removes every table."""
    if args.clear:
        removed = tuning_cache.clear()
        print(f"removed {', '.join(map(str, removed))}" if removed else "no tuning tables to remove")
        return 0
    if not args.model:
        raise ArgumentError("tune: a model is needed (or --clear)")
    for name in ("repeats", "passes"):
        if getattr(args, name) < 1:
            raise ArgumentError(f"--{name} {getattr(args, name)}: expected at least 1")
    from .device import get_device  # noqa: PLC0415

    _, given = feeds_from_args(args, random=True)
    device = get_device(args.adapter)
    table = tuning_cache.TuningTable.load(device.info)
    reports = tuning.tune(lambda **kw: open_session(args.model, device=device, **kw), given.arrays, table,
                          repeats=args.repeats, passes=args.passes, force=args.force)
    if args.json:
        print(json.dumps({"device": device.info.name, "table": str(table.path),
                          "keys": [r.as_json() for r in reports]}, indent=2))
    else:
        print(f"device: {device.info.name}")
        print(tuning.format_reports(reports) or "no GPU node to tune")
        print(f"tuning table: {table.path} ({len(table)} entries)")
    return 0

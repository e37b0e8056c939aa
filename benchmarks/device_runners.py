"""The runners of the one-shot device benchmark (benchmarks/device_check.py): each runs one case
(a model file, its feeds, its oracle's outputs) and returns one row — load time, first run,
steady-state median, and the verdict against the oracle.

A runner is a function ``run_<name>(path, feeds, form, cap_s) -> (outputs, load_s, first_s,
steady_s, note)``; :func:`timed_case` wraps it with the comparison and the error handling, so a
runner that fails (a missing operator, no CUDA) gives a row saying why instead of stopping the
part. Each part (one runner over every case) runs in its own process (device_check.py starts it
with a time limit), so onnxruntime-webgpu, whose module is also called ``onnxruntime``, never
meets onnxruntime CPU in one interpreter.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

#: float outputs agree within this fraction of the largest expected magnitude (run --compare's rule)
FLOAT_RTOL = 1e-3


def verdict(got: Sequence[Any], want: Sequence[np.ndarray], rtol: float = FLOAT_RTOL) -> tuple[str, float]:
    """("agrees" | "differs" | "shape", max |diff| relative to the largest |expected|): integer and
    bool outputs must be identical, float ones within ``rtol``."""
    worst, ok = 0.0, True
    if len(got) != len(want):
        return "shape", float("inf")
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape and g.size == w.size:
            g = g.reshape(w.shape)
        if g.shape != w.shape:
            return "shape", float("inf")
        if w.dtype.kind in "iub":
            bad = int(np.count_nonzero(g.astype(w.dtype) != w))
            ok &= bad == 0
            worst = max(worst, float(bad > 0))
            continue
        wf, gf = w.astype(np.float64), g.astype(np.float64)
        scale = max(float(np.max(np.abs(wf), initial=0.0)), 1e-12)
        with np.errstate(invalid="ignore"):
            diff = np.abs(gf - wf)
        diff = np.where(np.isnan(wf) & np.isnan(gf), 0.0, diff)
        rel = float(np.nanmax(diff, initial=0.0)) / scale if not np.isnan(diff).any() else float("inf")
        ok &= rel <= rtol
        worst = max(worst, rel)
    return ("agrees" if ok else "differs"), worst


def _steady(fn: Callable[[], Any], cap_s: float, max_runs: int) -> float:
    """Median wall time of repeated calls, as many as fit in ``cap_s`` (at least one)."""
    times: list[float] = []
    t_end = time.perf_counter() + cap_s
    while len(times) < max_runs and (not times or time.perf_counter() < t_end):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _timed(make: Callable[[], Callable[[], Sequence[Any]]], cap_s: float, max_runs: int):
    t0 = time.perf_counter()
    run = make()
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    outputs = run()
    first = time.perf_counter() - t0
    return outputs, load, first, _steady(run, cap_s, max_runs)


def run_onnx_quant(path: str, feeds: Mapping[str, np.ndarray], form: str, cap_s: float, max_runs: int):
    import warnings  # noqa: PLC0415

    from onnx_quant.backend_wgpu import Session  # noqa: PLC0415

    def make():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            session = Session(path)
        return lambda: session.run(None, dict(feeds))
    outputs, load, first, steady = _timed(make, cap_s, max_runs)
    return outputs, load, first, steady, ""


def _ort(path: str, feeds, cap_s: float, max_runs: int, providers: list[str]):
    import onnxruntime as ort  # noqa: PLC0415 - in the webgpu part this is onnxruntime-webgpu

    holder: dict[str, Any] = {}

    def make():
        s = ort.InferenceSession(path, providers=providers)
        holder["providers"] = s.get_providers()
        return lambda: s.run(None, dict(feeds))
    outputs, load, first, steady = _timed(make, cap_s, max_runs)
    return outputs, load, first, steady, "providers: " + ",".join(holder["providers"])


def run_onnxruntime_cpu(path, feeds, form, cap_s, max_runs):
    return _ort(path, feeds, cap_s, max_runs, ["CPUExecutionProvider"])


def run_onnxruntime_webgpu(path, feeds, form, cap_s, max_runs):
    import onnxruntime as ort  # noqa: PLC0415

    if "WebGpuExecutionProvider" not in ort.get_available_providers():
        raise RuntimeError(f"onnxruntime {ort.__version__} has no WebGpuExecutionProvider "
                           f"({', '.join(ort.get_available_providers())})")
    out = _ort(path, feeds, cap_s, max_runs, ["WebGpuExecutionProvider", "CPUExecutionProvider"])
    if "WebGpuExecutionProvider" not in out[4]:
        raise RuntimeError(f"the session did not take the WebGPU EP ({out[4]})")
    return out


def run_tinygrad(path, feeds, form, cap_s, max_runs):
    from tinygrad import Device, Tensor  # noqa: PLC0415
    from tinygrad.nn.onnx import OnnxRunner  # noqa: PLC0415

    def make():
        runner = OnnxRunner(path)

        def run():
            outs = runner({k: Tensor(v) for k, v in feeds.items()})
            return [o.numpy() if hasattr(o, "numpy") else np.asarray(o) for o in outs.values()]
        return run
    outputs, load, first, steady = _timed(make, cap_s, max_runs)
    return outputs, load, first, steady, f"device {Device.DEFAULT}"


class NotApplicable(Exception):
    """The runner does not take this kind of case (a row ``n/a``, not an error)."""


def run_torch(path, feeds, form, cap_s, max_runs):
    if form != "float":
        raise NotApplicable("onnx2torch converts float models only")
    import onnx  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from onnx2torch import convert  # noqa: PLC0415

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and os.environ.get("DEVICE_CHECK_REQUIRE_CUDA"):
        raise RuntimeError("torch sees no CUDA device")

    def make():
        module = convert(onnx.load(path)).to(device).eval()
        args = [torch.from_numpy(np.ascontiguousarray(v)).to(device) for v in feeds.values()]

        def run():
            with torch.inference_mode():
                out = module(*args)
            out = out if isinstance(out, (list, tuple)) else [out]
            if device == "cuda":
                torch.cuda.synchronize()
            return [o.detach().cpu().numpy() for o in out]
        return run
    outputs, load, first, steady = _timed(make, cap_s, max_runs)
    return outputs, load, first, steady, f"torch {torch.__version__} on {device}"


RUNNERS: dict[str, Callable] = {
    "onnx-quant": run_onnx_quant,
    "onnxruntime-cpu": run_onnxruntime_cpu,
    "onnxruntime-webgpu": run_onnxruntime_webgpu,
    "tinygrad": run_tinygrad,
    "torch": run_torch,
}
#: the module each runner imports first: a part whose module is missing is skipped with this name
NEEDS = {"onnx-quant": "wgpu", "onnxruntime-cpu": "onnxruntime", "onnxruntime-webgpu": "onnxruntime",
         "tinygrad": "tinygrad", "torch": "onnx2torch"}


def timed_case(runner: str, case: Mapping[str, Any], feeds: Mapping[str, np.ndarray],
               expected: Sequence[Sequence[np.ndarray]], cap_s: float, max_runs: int) -> dict[str, Any]:
    """One row: the case's keys, the runner, times (s), the verdict and max relative diff against
    the closest of the ``expected`` outputs (the oracle, optimized and as written), or the error."""
    row: dict[str, Any] = {"runner": runner, **{k: case[k] for k in ("case", "model", "form", "batch", "tier")}}
    try:
        outputs, load, first, steady, note = RUNNERS[runner](case["path"], feeds, case["form"], cap_s, max_runs)
    except NotApplicable as e:
        row.update(status="n/a", error=str(e))
        return row
    except Exception as e:  # noqa: BLE001 - a runner's failure is a row, not the end of the part
        row.update(status="error", error=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
        return row
    status, worst = min((verdict(outputs, e) for e in expected), key=lambda v: (v[0] != "agrees", v[1]))
    row.update(status=status, max_rel_diff=worst, load_s=load, first_s=first, steady_s=steady,
               throughput=case["batch"] / steady if steady > 0 else None, note=note)
    return row

"""What the GPU commands, the demo, the profiler and the benchmarks report about a session and
its outputs: summaries and differences of arrays, host nodes and stats, sessions made and timed
the way the CLI makes them. Library code, never CLI code: the ``cmd_*`` functions
(``commands.py``) import from here, nothing here imports them.
"""

from __future__ import annotations

import inspect
import statistics
import time
import warnings
from typing import Any, Mapping

import numpy as np
from onnx import numpy_helper

from onnx_quant.errors import HostFallbackWarning
from onnx_quant.feeds import make_feeds
from onnx_quant.model_io import load_model

from .session import Session


def summary(a: np.ndarray) -> str:
    """min/max/mean (NaN ignored, NaN count given), and the values themselves when few."""
    a = np.asarray(a)
    if a.size == 0:
        return "(empty)"
    f = a.astype(np.float64)
    finite = f[~np.isnan(f)]
    parts = []
    if finite.size:
        parts.append(f"min {finite.min():.6g} max {finite.max():.6g} mean {finite.mean():.6g}")
    n_nan = int(f.size - finite.size)
    if n_nan:
        parts.append(f"{n_nan} NaN")
    if a.size <= 8:
        parts.append("values " + np.array2string(a.reshape(-1), separator=", "))
    return ", ".join(parts)


def same_values(a: np.ndarray, b: np.ndarray) -> tuple[bool, str]:
    """(identical, text): NaN equals NaN; otherwise how many elements differ and by how much
    (NaN against a number is counted apart)."""
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False, f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    af, bf = a.astype(np.float64), b.astype(np.float64)
    nan_a, nan_b = np.isnan(af), np.isnan(bf)
    eq = (af == bf) | (nan_a & nan_b)
    bad = int(eq.size - int(np.count_nonzero(eq)))
    if bad == 0:
        return True, "identical"
    nan_bad = int(np.count_nonzero(nan_a != nan_b))
    both = ~nan_a & ~nan_b & ~eq
    with np.errstate(all="ignore"):
        diff = np.abs(af - bf)[both]
    parts = []
    if diff.size:
        parts.append(f"max |diff| {float(np.max(diff)):.6g}")
    if nan_bad:
        parts.append(f"{nan_bad} NaN against a number")
    return False, f"{bad} of {a.size} elements differ ({', '.join(parts)})"


def output_step(model, name: str) -> float | None:
    """The quantization step of a float output produced by a per-tensor DequantizeLinear whose
    scale is an initializer (its scale), or None: used to state a float difference in steps."""
    producer = next((n for n in model.graph.node if name in n.output), None)
    while producer is not None and producer.op_type in ("Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze"):
        src = producer.input[0]
        producer = next((n for n in model.graph.node if src in n.output), None)
    if producer is None or producer.op_type != "DequantizeLinear" or len(producer.input) < 2:
        return None
    init = next((t for t in model.graph.initializer if t.name == producer.input[1]), None)
    if init is None:
        return None
    scale = numpy_helper.to_array(init)
    if scale.size != 1:
        return None
    return float(np.abs(scale.astype(np.float64)).reshape(-1)[0]) or None


def describe_difference(model, name: str, got: np.ndarray, expected: np.ndarray) -> tuple[bool, str]:
    """(identical, text): the count and max |diff| of differing elements, in quantization steps
    for integer outputs (a step is 1) and for float outputs of a per-tensor DequantizeLinear."""
    same, text = same_values(got, expected)
    if same or got.shape != expected.shape or got.dtype != expected.dtype:
        return same, text
    with np.errstate(all="ignore"):
        diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    diff = diff[~np.isnan(diff)]
    if diff.size == 0:
        return False, text
    m = float(np.max(diff))
    if got.dtype.kind in "iu":
        return False, f"{text}, max {m:g} quantization steps"
    step = output_step(model, name)
    if step is not None:
        return False, f"{text}, {m / step:.3g} quantization steps of {step:.6g}"
    return False, text


def open_session(model, *, adapter=None, device=None, host_fallback: bool = True, **kw):
    """A Session that may run nodes without a GPU kernel on the host when the installed
    Session supports it (``allow_host_fallback``)."""
    return make_session(model, adapter=adapter, device=device, host_fallback=host_fallback, **kw)


def timed_runs(session, feeds: dict[str, np.ndarray], *, repeat: int = 3,
               budget_s: float = 2.0) -> tuple[list[np.ndarray], float, float, int]:
    """(outputs, first-run seconds, steady-state median seconds, submits per steady run):
    one warm-up run (plans, compiles, allocates), then up to ``repeat`` timed runs within
    about ``budget_s`` seconds."""
    device = session.device
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        outputs = session.run(None, feeds)
        first = time.perf_counter() - t0
        times = []
        submits0 = device.stats.submits
        while len(times) < max(1, repeat):
            t0 = time.perf_counter()
            outputs = session.run(None, feeds)
            times.append(time.perf_counter() - t0)
            if sum(times) + first > budget_s:
                break
        submits = (device.stats.submits - submits0) // len(times)
    return outputs, first, statistics.median(times), submits


def feeds_from_args(args, *, random: bool):
    """The model as written and :class:`onnx_quant.feeds.Feeds` from ``--input``, ``--shape``,
    ``--dim``, ``--int-range`` (the rest random when ``random``): checked before any session."""
    model = load_model(args.model)
    feeds = make_feeds(model, inputs=getattr(args, "input", None), shapes=getattr(args, "shape", None),
                       dims=getattr(args, "dim", None), random=random, int_range=getattr(args, "int_range", None))
    return model, feeds


def session_accepts(name: str) -> bool:
    """Whether ``Session`` takes a keyword argument (the graph executor adds some)."""
    try:
        return name in inspect.signature(Session.__init__).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False


def make_session(model: Any, *, device: Any = None, adapter: Any = None, host_fallback: bool = True, **kw: Any):
    """A Session; ``host_fallback`` is passed as ``allow_host_fallback`` when the installed
    Session has the option (the HostFallbackWarning is silenced: callers list host nodes)."""
    if session_accepts("allow_host_fallback"):
        kw["allow_host_fallback"] = bool(host_fallback)
    with warnings.catch_warnings():
        # the callers report host nodes themselves (host_nodes), once, in their own words
        warnings.filterwarnings("ignore", message=r".*run on the host.*")
        warnings.filterwarnings("ignore", category=HostFallbackWarning)
        return Session(model, device=device, adapter=adapter, **kw)


def stats_dict(session: Any) -> dict[str, Any]:
    """The session's stats as a plain dict (empty when it keeps none)."""
    stats = getattr(session, "stats", None)
    if stats is None:
        return {}
    if isinstance(stats, Mapping):
        return dict(stats)
    for attr in ("as_dict", "snapshot", "to_dict"):
        fn = getattr(stats, attr, None)
        if callable(fn):
            try:
                d = fn()
                if isinstance(d, Mapping):
                    return dict(d)
            except Exception:  # pragma: no cover - best effort
                pass
    try:
        return dict(vars(stats))
    except TypeError:
        return {}


def host_nodes(session: Any) -> list[str]:
    """Op types (``name (op)``) of the nodes the session ran on the host, from its stats and
    node table; empty when it ran everything on the GPU (or cannot say)."""
    found: list[str] = []
    for attr in ("host_nodes", "host_fallback_nodes", "fallback_nodes"):
        v = getattr(session, attr, None)
        if callable(v):
            try:
                v = v()
            except Exception:  # pragma: no cover
                v = None
        if v:
            found.extend(str(x) for x in v)
            return found
    stats = stats_dict(session)
    for key in ("host_nodes", "host_fallback_nodes", "fallback_nodes", "host_ops"):
        v = stats.get(key)
        if v:
            if isinstance(v, Mapping):
                return [f"{k} x{n}" if isinstance(n, int) and n > 1 else str(k) for k, n in v.items()]
            return [str(x) for x in v]
    return found


def host_node_count(session: Any) -> int | None:
    """Host node runs the session's stats count, or None where they count none."""
    stats = stats_dict(session)
    for key in ("host_nodes_run", "host_node_runs", "host_fallback_runs", "host_runs", "host_fallbacks"):
        v = stats.get(key)
        if isinstance(v, int):
            return v
    return None

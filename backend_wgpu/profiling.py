"""Where a run's time goes: per node (and per pass) device times, a table, a Chrome trace.

``Session(..., profile=True)`` (and ``InferenceSession`` with ``enable_profiling``) hands the
executor a :class:`Profiler`. How it measures depends on the adapter:

* ``device`` clock (the adapter has ``timestamp-query``): every dispatch of a profiled run gets
  its own compute pass with timestamp writes at its beginning and end; the query set is resolved
  in the same encoder and read back after the segment's submit. Times are the GPU's, converted
  to ns with the queue's timestamp period, and placed on the host timeline at the segment's
  submit. One pass per dispatch costs a little more host time than a normal run's single pass.
* ``host-wall`` clock (no ``timestamp-query``): every GPU node is submitted alone and waited for;
  its time is the host's wall clock around that submit and wait, so it includes the submit and
  the wait, and is labelled as such everywhere it is shown.

Host-fallback nodes are always host-timed (``host`` clock). The trace is the JSON array of
complete (``"ph": "X"``) events that onnxruntime's profiler writes and chrome://tracing or
Perfetto load: per run one ``Session`` event, one ``Node`` event per node that ran, one ``Pass``
event per dispatch (device clock only).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from onnx_quant.errors import ExecutionError

from .device import release_quietly

#: query-set capacity granularity (dispatches); the set grows by whole chunks
_QUERY_CHUNK = 256

#: widest the profile table's columns get (characters); longer texts are cut by :func:`clip`
NAME_WIDTH, OP_WIDTH, KERNEL_WIDTH, PASSES_WIDTH = 40, 36, 40, 48


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters with an ellipsis in the middle (fused nodes' names
    share their beginnings, so both ends are kept)."""
    if len(text) <= width:
        return text
    head = width // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


@dataclass
class NodeEvent:
    """One node of one profiled run. Times in µs since the profiler started."""

    run: int
    node: str
    op_type: str
    kernel: str
    variant: str
    clock: str                      # "device" | "host-wall" | "host"
    start_us: float
    dur_us: float
    passes: list[tuple[str, float, float]] = field(default_factory=list)  # (pass, start, dur)


def timestamp_period_ns(device) -> float:
    """ns per timestamp tick (wgpu-native reports raw ticks unless told to normalize)."""
    try:
        from wgpu.backends.wgpu_native._ffi import lib  # noqa: PLC0415

        period = float(lib.wgpuQueueGetTimestampPeriod(device.queue._internal))
        return period if period > 0 else 1.0
    except Exception:  # pragma: no cover - other backends: WebGPU's timestamps are ns
        return 1.0


class TimestampQueries:
    """A timestamp query set with its resolve and read-back buffers, two queries per dispatch;
    ``GpuDevice.submit(..., timestamps=...)`` writes and resolves them."""

    def __init__(self, device) -> None:
        self.device = device
        self.capacity = 0
        self.query_set = self._resolve = self._staging = None
        self.period_ns = timestamp_period_ns(device)

    def reserve(self, dispatches: int) -> None:
        if dispatches <= self.capacity:
            return
        self.release()
        wgpu = self.device.wgpu
        cap = -(-dispatches // _QUERY_CHUNK) * _QUERY_CHUNK
        with self.device.errors(f"creating a timestamp query set of {2 * cap} queries"):
            self.query_set = self.device.device.create_query_set(type="timestamp", count=2 * cap)
        self._resolve = self.device.allocate(16 * cap, label="profiler timestamps",
                                             usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        self._staging = self.device.allocate_staging(16 * cap, label="profiler timestamps read-back")
        self.capacity = cap

    def writes(self, k: int) -> dict[str, Any]:
        """``timestamp_writes`` of the k-th dispatch's pass."""
        return {"query_set": self.query_set, "beginning_of_pass_write_index": 2 * k,
                "end_of_pass_write_index": 2 * k + 1}

    def resolve(self, encoder, n: int) -> None:
        if n:
            encoder.resolve_query_set(self.query_set, 0, 2 * n, self._resolve, 0)
            encoder.copy_buffer_to_buffer(self._resolve, 0, self._staging, 0, 16 * n)

    def collect(self, n: int) -> list[tuple[float, float]]:
        """(begin, end) in ns of the last submit's n dispatches."""
        if not n:
            return []
        raw = memoryview(self.device.read_staging(self._staging, 16 * n)).cast("Q")
        p = self.period_ns
        return [(raw[2 * k] * p, raw[2 * k + 1] * p) for k in range(n)]

    def release(self) -> None:
        release_quietly(self.query_set, self._resolve, self._staging)
        self.query_set = self._resolve = self._staging = None
        self.capacity = 0


class Profiler:
    """Collects :class:`NodeEvent` per profiled run; see the module doc for the clocks."""

    def __init__(self, device, clock: str | None = None) -> None:
        """``clock``: None (``device`` where the adapter has ``timestamp-query``, else
        ``host-wall``), ``"device"`` or ``"host-wall"``."""
        self.device = device
        has_queries = "timestamp-query" in device.info.features
        if clock not in (None, "device", "host-wall"):
            raise ExecutionError(f"profiler clock {clock!r}: expected 'device' or 'host-wall'")
        if clock == "device" and not has_queries:
            raise ExecutionError(f"profiler clock 'device': adapter {device.info.name!r} has no timestamp-query")
        self.clock = clock or ("device" if has_queries else "host-wall")
        self.events: list[NodeEvent] = []
        self.runs: list[tuple[int, float, float]] = []   # (run, start, dur)
        self._origin = time.perf_counter()
        self._run = -1
        self._run_start = 0.0
        self._queries = TimestampQueries(device) if self.clock == "device" else None
        self._probe = None

    def now_us(self) -> float:
        return (time.perf_counter() - self._origin) * 1e6

    # -- what the executor calls -------------------------------------------------------------

    def begin_run(self) -> None:
        self._run += 1
        self._run_start = self.now_us()

    def end_run(self) -> None:
        self.runs.append((self._run, self._run_start, self.now_us() - self._run_start))

    def host_step(self, step, start_us: float, end_us: float) -> None:
        self.events.append(NodeEvent(self._run, step.label, step.op_type, "host", "onnx.reference", "host",
                                     start_us, end_us - start_us))

    def run_segment(self, groups: Sequence[tuple[Any, list[tuple]]], *, read: Any, read_size: int | None,
                    label: str) -> bytes | None:
        """Run one segment's commands (``groups``: (GpuStep, its commands) in order) timing each
        node; returns what ``GpuDevice.submit`` would (the staging bytes when ``read``)."""
        if self._queries is not None:
            return self._timed_submit(groups, read, read_size, label)
        for step, cmds in groups:
            t0 = self.now_us()
            self.device.submit(list(cmds) + [self._probe_copy()], read=self._probe[1], read_size=4,
                               label=f"{label} {step.label}")
            t1 = self.now_us()
            self.events.append(self._event(step, "host-wall", t0, t1 - t0))
        return self.device.read_staging(read, read_size) if read is not None else None

    # -- device clock ----------------------------------------------------------------------------

    def _timed_submit(self, groups, read, read_size, label) -> bytes | None:
        commands = [c for _, cmds in groups for c in cmds]
        n = sum(1 for c in commands if c[0] == "dispatch" and min(c[3]) > 0)
        self._queries.reserve(n)
        t_submit = self.now_us()
        raw = self.device.submit(commands, read=read, read_size=read_size, label=label, timestamps=self._queries)
        stamps = self._queries.collect(n)
        base = stamps[0][0] if stamps else 0.0
        k = 0
        for step, cmds in groups:
            passes = []
            for c in cmds:
                if c[0] != "dispatch" or min(c[3]) <= 0:
                    continue
                b, e = stamps[k]
                k += 1
                passes.append((c[4], t_submit + (b - base) / 1e3, max(0.0, (e - b) / 1e3)))
            if passes:
                start = passes[0][1]
                dur = sum(p[2] for p in passes)
            else:
                start, dur = t_submit, 0.0
            ev = self._event(step, "device", start, dur)
            ev.passes = passes
            self.events.append(ev)
        return raw

    def _event(self, step, clock: str, start: float, dur: float) -> NodeEvent:
        return NodeEvent(self._run, step.label, step.op_type, step.plan.kernel, step.plan.variant, clock, start, dur)

    def _probe_copy(self) -> tuple:
        """A 4-byte copy into a MAP_READ buffer: mapping it waits for the submit."""
        if self._probe is None:
            self._probe = (self.device.allocate(4, label="profiler probe"),
                           self.device.allocate_staging(4, label="profiler probe read-back"))
        return ("copy", self._probe[0], 0, self._probe[1], 0, 4)

    # -- results ---------------------------------------------------------------------------------

    def table(self) -> list[dict[str, Any]]:
        """Per node over every profiled run, sorted by total time (longest first)."""
        rows: dict[str, dict[str, Any]] = {}
        for ev in self.events:
            r = rows.setdefault(ev.node, {"node": ev.node, "op_type": ev.op_type, "kernel": ev.kernel,
                                          "variant": ev.variant, "clock": ev.clock, "calls": 0,
                                          "total_us": 0.0, "pass_us": {}})
            r["calls"] += 1
            r["total_us"] += ev.dur_us
            for name, _, dur in ev.passes:
                pid = name.rsplit("/", 1)[-1]
                r["pass_us"][pid] = r["pass_us"].get(pid, 0.0) + dur
        total = sum(r["total_us"] for r in rows.values()) or 1.0
        out = sorted(rows.values(), key=lambda r: -r["total_us"])
        for r in out:
            r["mean_us"] = r["total_us"] / r["calls"]
            r["share"] = r["total_us"] / total
            r["pass_us"] = {k: v / r["calls"] for k, v in r["pass_us"].items()}
        return out

    def format_table(self, limit: int | None = None) -> str:
        """The table: a row per node (longest first; only the ``limit`` slowest with a line counting
        the others), then a total row. Columns are at most :data:`NAME_WIDTH` (node),
        :data:`OP_WIDTH` and :data:`KERNEL_WIDTH` wide: longer texts (fused nodes' names) are cut
        with an ellipsis; ``--json`` and the trace keep them whole."""
        rows = self.table()
        shown = rows[:limit] if limit is not None else rows
        clocks = sorted({r["clock"] for r in rows})
        cells = [(clip(r["node"], NAME_WIDTH), clip(r["op_type"], OP_WIDTH),
                  clip(f"{r['kernel']}/{r['variant']}", KERNEL_WIDTH)) for r in shown]
        wn = max([5] + [len(c[0]) for c in cells])
        wo = max([2] + [len(c[1]) for c in cells])
        wk = max([14] + [len(c[2]) for c in cells])
        lines = [f"profile: {len(self.runs)} run(s); clocks: " + "; ".join(_CLOCK_TEXT[c] for c in clocks),
                 f"{'node':{wn}} {'op':{wo}} {'kernel/variant':{wk}} {'clock':9} {'mean µs':>10} {'share':>6}  "
                 "passes (mean µs)"]
        for r, (node, op, kv) in zip(shown, cells):
            passes = clip(" ".join(f"{p}={v:.1f}" for p, v in r["pass_us"].items()), PASSES_WIDTH)
            lines.append(f"{node:{wn}} {op:{wo}} {kv:{wk}} {r['clock']:9} {r['mean_us']:10.1f} "
                         f"{100 * r['share']:5.1f}%  {passes}".rstrip())
        rest = rows[len(shown):]
        if rest:
            lines.append(f"... {len(rest)} more node{'s' if len(rest) > 1 else ''} (--top {limit}): "
                         f"{sum(r['mean_us'] for r in rest):.1f} µs per run, "
                         f"{100 * sum(r['share'] for r in rest):.1f}%")
        total = sum(r["mean_us"] for r in rows)
        lines.append(f"{'total':{wn}} {'':{wo}} {f'{len(rows)} nodes':{wk}} {'':9} {total:10.1f} "
                     f"{100.0 if rows else 0.0:5.1f}%  per run, the nodes' times summed")
        return "\n".join(lines)

    def trace(self) -> list[dict[str, Any]]:
        """Chrome-trace complete events (µs), as onnxruntime's profiler writes them."""
        pid = os.getpid()
        out: list[dict[str, Any]] = []
        for run, start, dur in self.runs:
            out.append({"cat": "Session", "pid": pid, "tid": 0, "ph": "X", "ts": start, "dur": dur,
                        "name": "model_run", "args": {"run": run}})
        for ev in self.events:
            tid = 1 if ev.clock == "host" else 0
            out.append({"cat": "Node", "pid": pid, "tid": tid, "ph": "X", "ts": ev.start_us, "dur": ev.dur_us,
                        "name": ev.node, "args": {"op_name": ev.op_type, "kernel": ev.kernel, "variant": ev.variant,
                                                   "clock": ev.clock, "run": ev.run,
                                                   "provider": "host" if ev.clock == "host" else "webgpu"}})
            for name, ps, pd in ev.passes:
                out.append({"cat": "Pass", "pid": pid, "tid": tid, "ph": "X", "ts": ps, "dur": pd,
                            "name": name, "args": {"node": ev.node, "run": ev.run}})
        return out

    def write_trace(self, path: str | os.PathLike) -> str:
        try:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(self.trace(), f)
        except OSError as e:
            raise ExecutionError(f"cannot write the profile trace to {os.fspath(path)!r}: {e.strerror}") from None
        return os.fspath(path)

    def reset(self) -> None:
        self.events.clear()
        self.runs.clear()
        self._run = -1

    def release(self) -> None:
        if self._queries is not None:
            self._queries.release()
        if self._probe is not None:
            release_quietly(*self._probe)
            self._probe = None


_CLOCK_TEXT = {
    "device": "device = GPU timestamps (timestamp-query)",
    "host-wall": "host-wall = host wall clock around each node's own submit and wait",
    "host": "host = host-fallback node, host wall clock",
}

"""The device layer: one small surface over wgpu (adapter, device, buffers, pipelines, launch).

Everything else in the backend talks to the GPU through :class:`GpuDevice`:

- ``allocate`` / ``allocate_staging`` create buffers (counted in ``stats``);
- ``upload`` writes host bytes into a buffer, ``download`` reads a buffer back;
- ``compile`` returns a cached compute pipeline for (WGSL source, entry point, layout);
- ``bind`` creates a bind group; ``launch`` records dispatches and copies into ONE command
  encoder, submits once, and optionally maps a staging buffer to wait for the result.

Adapter choice (``list_adapters`` order, index 0 is the default): discrete GPU, integrated GPU,
virtual GPU, CPU, then by backend Vulkan, Metal, D3D12, OpenGL. ``ONNX_QUANT_ADAPTER`` (or the
``adapter=`` argument) picks one by index in that list or by a case-insensitive substring of
its summary or backend ("vulkan", "opengl", "llvmpipe").

Limits: by default the device gets the adapter's maximum limits; ``ONNX_QUANT_LIMITS=default``
(or ``limits="default"``) requests WebGPU's default limits, so that code cannot silently depend
on big limits; a dict of camelCase limits is requested on top of that base (lower values are
allowed, which tests use). Features: the ones kernels use (``subgroup``, ``shader-f16``,
``timestamp-query``) are requested by their real wgpu names when the adapter has them;
``features=`` restricts that set (e.g. ``()`` to exercise the no-subgroup code paths).
Limits and features are read back from the device into :class:`DeviceInfo`.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

from onnx_quant.errors import DeviceError

from .ctypes_prime import prime_wgpu
from .device_info import WEBGPU_DEFAULT_LIMITS, DeviceInfo
from .locking import holding

#: features kernels may use, requested when the adapter has them (real wgpu names)
WANTED_FEATURES: tuple[str, ...] = ("subgroup", "shader-f16", "timestamp-query")

_TYPE_RANK = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3}
_BACKEND_RANK = {"Vulkan": 0, "Metal": 1, "D3D12": 2, "OpenGL": 3}


def _ensure_runtime_dir() -> None:
    # the GL (EGL) probe complains on stderr without a usable XDG_RUNTIME_DIR
    if not os.environ.get("XDG_RUNTIME_DIR"):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="onnx-quant-xdg-")


def camel_to_kebab(name: str) -> str:
    return re.sub(r"([A-Z0-9]+)", lambda m: "-" + m.group(1).lower(), name).lstrip("-")


def kebab_to_camel(name: str) -> str:
    head, *rest = name.split("-")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _wgpu():
    try:
        import wgpu  # noqa: PLC0415 - keep `import backend_wgpu` cheap
    except Exception as e:  # pragma: no cover - depends on the machine
        raise DeviceError(f"wgpu is not usable here: {type(e).__name__}: {e}") from None
    prime_wgpu()  # the C types wgpu-py is about to parse one by one, at once (ctypes_prime.py)
    return wgpu


@dataclass(frozen=True)
class AdapterEntry:
    """One adapter as listed by ``onnx-quant devices`` (index = position in preference order)."""

    index: int
    summary: str
    backend: str
    adapter_type: str
    features: frozenset[str]
    limits: dict[str, int]
    adapter: Any = field(repr=False, compare=False, default=None)

    @property
    def rank(self) -> tuple[int, int]:
        return (_TYPE_RANK.get(self.adapter_type, 4), _BACKEND_RANK.get(self.backend, 4))


_ADAPTERS: list[AdapterEntry] | None = None
_LOCK = threading.RLock()


def list_adapters(*, refresh: bool = False) -> list[AdapterEntry]:
    """Every adapter wgpu finds, best first (the order ``ONNX_QUANT_ADAPTER`` indices use)."""
    global _ADAPTERS
    with _LOCK:
        if _ADAPTERS is None or refresh:
            _ensure_runtime_dir()
            wgpu = _wgpu()
            try:
                raw = list(wgpu.gpu.enumerate_adapters_sync())
            except Exception as e:
                raise DeviceError(f"no usable adapter: enumerating wgpu adapters failed: {type(e).__name__}: {e}") from None
            entries = []
            for a in raw:
                info = a.info
                entries.append(AdapterEntry(
                    index=-1,
                    summary=a.summary,
                    backend=str(info.get("backend_type", "?")),
                    adapter_type=str(info.get("adapter_type", "?")),
                    features=frozenset(str(f) for f in a.features),
                    limits={kebab_to_camel(k): int(v) for k, v in a.limits.items() if isinstance(v, int)},
                    adapter=a,
                ))
            entries.sort(key=lambda e: e.rank)  # stable: wgpu's order breaks ties
            _ADAPTERS = [AdapterEntry(i, e.summary, e.backend, e.adapter_type, e.features, e.limits, e.adapter)
                         for i, e in enumerate(entries)]
        return list(_ADAPTERS)


def select_adapter(adapter: int | str | None = None) -> AdapterEntry:
    """The adapter named by ``adapter`` (index or substring), else ``ONNX_QUANT_ADAPTER``, else the best."""
    entries = list_adapters()
    if not entries:
        raise DeviceError("no usable adapter: wgpu found no GPU adapter (on Linux without a GPU, install "
                          "mesa-vulkan-drivers for lavapipe)")
    choice: int | str | None = adapter
    source = "adapter argument"
    if choice is None or choice == "":
        env = os.environ.get("ONNX_QUANT_ADAPTER", "").strip()
        if not env:
            return entries[0]
        choice, source = env, "ONNX_QUANT_ADAPTER"
    if isinstance(choice, str) and choice.strip().lstrip("-").isdigit():
        choice = int(choice.strip())
    names = "; ".join(f"[{e.index}] {e.summary}" for e in entries)
    if isinstance(choice, int):
        if 0 <= choice < len(entries):
            return entries[choice]
        raise DeviceError(f"no usable adapter: {source} index {choice} out of range; adapters: {names}")
    needle = str(choice).lower()
    for e in entries:
        if needle in e.summary.lower() or needle == e.backend.lower() or needle in e.backend.lower():
            return e
    raise DeviceError(f"no usable adapter: {source} {choice!r} matches none of: {names}")


def _limits_base(limits: str | Mapping[str, int] | None) -> tuple[str, dict[str, int]]:
    mode = limits if isinstance(limits, str) else os.environ.get("ONNX_QUANT_LIMITS", "max").strip().lower() or "max"
    if mode not in ("max", "default"):
        raise DeviceError(f"limits {mode!r}: expected 'max' or 'default'")
    overrides = dict(limits) if isinstance(limits, Mapping) else {}
    return mode, overrides


@dataclass
class DeviceStats:
    """Counters tests and the bench read: a second run of the same shapes must not move them."""

    buffers_allocated: int = 0
    bytes_allocated: int = 0
    bind_groups_created: int = 0
    submits: int = 0

    def snapshot(self) -> dict[str, int]:
        return dict(self.__dict__)


class GpuDevice:
    """A wgpu device plus what the backend needs around it (info, pipeline cache, counters)."""

    def __init__(
        self,
        adapter: int | str | None = None,
        *,
        limits: str | Mapping[str, int] | None = None,
        features: Iterable[str] | None = None,
    ) -> None:
        from .pipelines import PipelineCache  # noqa: PLC0415

        wgpu = _wgpu()
        #: guards the queue (upload, submit + staging map/unmap) and the caches: backend_wgpu/locking.py
        self.lock = threading.RLock()
        self.adapter_entry = select_adapter(adapter)
        entry = self.adapter_entry
        mode, overrides = _limits_base(limits)
        unknown = sorted(k for k in overrides if k not in entry.limits)
        if unknown:
            raise DeviceError(f"limits {unknown}: not limits of adapter {entry.summary!r}")
        required: dict[str, int] = {}
        if mode == "default":
            required.update({k: v for k, v in WEBGPU_DEFAULT_LIMITS.items() if k in entry.limits})
        required.update({k: int(v) for k, v in overrides.items()})
        wanted = WANTED_FEATURES if features is None else tuple(features)
        missing = [f for f in wanted if f not in entry.features]
        if features is not None and missing:
            raise DeviceError(f"adapter {entry.summary!r} lacks features {missing}")
        req_features = [f for f in wanted if f in entry.features]
        try:
            self.device = entry.adapter.request_device_sync(
                label="onnx-quant",
                required_features=req_features,
                required_limits={camel_to_kebab(k): v for k, v in required.items()} or None,
            )
        except Exception as e:
            raise DeviceError(f"no usable adapter: requesting a device from {entry.summary!r} failed: "
                              f"{type(e).__name__}: {e}") from None
        self.wgpu = wgpu
        self.queue = self.device.queue
        dev_limits = {kebab_to_camel(k): int(v) for k, v in self.device.limits.items() if isinstance(v, int)}
        self.info = DeviceInfo(
            name=entry.summary,
            backend=entry.backend,
            limits=dev_limits,
            features=frozenset(str(f) for f in self.device.features),
        )
        self.limits_mode = mode
        self.stats = DeviceStats()
        self.pipelines = PipelineCache(self)
        #: executor state per plan (buffers, bind groups, staging), see executor.py
        self.prepared: dict[int, Any] = {}

    @property
    def raw_recording(self) -> bool:
        """Whether ``submit`` can record compacted dispatch runs through wgpu-native directly."""
        return _raw_pass_functions() is not None

    def __repr__(self) -> str:
        return f"GpuDevice({self.info.name!r}, backend={self.info.backend}, limits={self.limits_mode})"

    # -- errors ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def errors(self, what: str, *, kernel: str | None = None, variant: str | None = None,
               pass_id: str | None = None) -> Iterator[None]:
        """Turn wgpu's exceptions raised inside the block into DeviceError naming the work."""
        try:
            yield
        except DeviceError:
            raise
        except Exception as e:
            if not _is_wgpu_error(e):
                raise
            where = ", ".join(f"{k} {v}" for k, v in (("kernel", kernel), ("variant", variant), ("pass", pass_id)) if v)
            msg = str(e).strip()
            raise DeviceError(f"{what} failed{' (' + where + ')' if where else ''}: {type(e).__name__}: {msg}") from None

    # -- buffers --------------------------------------------------------------------------

    @holding("lock")
    def allocate(self, size: int, *, label: str = "", usage: int | None = None):
        """A storage buffer of at least ``size`` bytes (rounded up to a multiple of 4, min 4)."""
        wgpu = self.wgpu
        size = max(4, (int(size) + 3) // 4 * 4)
        if usage is None:
            usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        with self.errors(f"allocating {size} bytes for {label or 'a buffer'}"):
            buf = self.device.create_buffer(label=label, size=size, usage=usage)
        self.stats.buffers_allocated += 1
        self.stats.bytes_allocated += size
        return buf

    def allocate_uniform(self, size: int, *, label: str = ""):
        wgpu = self.wgpu
        size = max(16, (int(size) + 15) // 16 * 16)
        return self.allocate(size, label=label, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)

    def allocate_staging(self, size: int, *, label: str = "staging"):
        wgpu = self.wgpu
        return self.allocate(size, label=label, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

    @holding("lock")
    def upload(self, buffer, data, offset: int = 0) -> None:
        """Write bytes (or a contiguous array) into a buffer; the size must be a multiple of 4."""
        mv = memoryview(data).cast("B")
        if len(mv) == 0:
            return
        if len(mv) % 4 or offset % 4:
            raise DeviceError(f"upload to {buffer.label!r}: size {len(mv)} / offset {offset} not a multiple of 4")
        with self.errors(f"uploading {len(mv)} bytes to {buffer.label!r}"):
            self.queue.write_buffer(buffer, offset, mv)

    @holding("lock")
    def download(self, buffer, size: int | None = None) -> bytes:
        """Read a buffer back (a one-off staging buffer; the executor uses a persistent one)."""
        size = buffer.size if size is None else size
        staging = self.allocate_staging(size, label=f"download {buffer.label}")
        self.launch([], copies=[(buffer, 0, staging, 0, (size + 3) // 4 * 4)])
        return bytes(memoryview(self.read_staging(staging, size))[:size])

    @holding("lock")
    def read_staging(self, staging, size: int | None = None) -> bytes:
        """Map a MAP_READ buffer, copy ``size`` bytes (default all) out once, unmap."""
        wgpu = self.wgpu
        size = staging.size if size is None else (size + 3) // 4 * 4
        with self.errors(f"reading back {staging.label!r}"):
            staging.map_sync(wgpu.MapMode.READ, 0, size)
            try:
                data = staging.read_mapped(0, size, copy=True)
            finally:
                staging.unmap()
        return data

    # -- pipelines ------------------------------------------------------------------------

    @holding("lock")
    def compile(self, source: str, layout_key: tuple, *, entry_point: str = "main", label: str = "",
                kernel: str | None = None, variant: str | None = None, pass_id: str | None = None):
        """A cached compute pipeline (see pipelines.py) for the source and bind-group layout."""
        return self.pipelines.get(source, layout_key, entry_point=entry_point, label=label,
                                  kernel=kernel, variant=variant, pass_id=pass_id)

    @holding("lock")
    def compile_pass(self, pass_plan, layout_key: tuple, *, label: str = "", kernel: str | None = None,
                     variant: str | None = None, known: tuple[tuple, str] | None = None):
        """A pass's cached pipeline, looked up by its pipeline key before rendering (pipelines.py);
        ``known``: its (pipeline key, source) from the plan cache."""
        return self.pipelines.for_pass(pass_plan, layout_key, label=label, kernel=kernel, variant=variant,
                                       known=known)

    @holding("lock")
    def bind(self, compiled, buffers: Sequence[tuple], *, label: str = "",
             kernel: str | None = None, variant: str | None = None, pass_id: str | None = None):
        """A bind group for a compiled pipeline: (binding index, buffer, size in bytes) or
        (binding index, buffer, offset, size) entries (offsets: uniform regions of a shared
        buffer, aligned to ``minUniformBufferOffsetAlignment``)."""
        entries = []
        for entry in buffers:
            i, buf, offset, size = entry if len(entry) == 4 else (entry[0], entry[1], 0, entry[2])
            entries.append({"binding": i, "resource": {"buffer": buf, "offset": int(offset), "size": int(size)}})
        with self.errors("creating a bind group", kernel=kernel, variant=variant, pass_id=pass_id):
            bg = self.device.create_bind_group(label=label, layout=compiled.bind_group_layout, entries=entries)
        self.stats.bind_groups_created += 1
        return bg

    # -- launch ---------------------------------------------------------------------------

    @holding("lock")
    def launch(
        self,
        dispatches: Sequence[tuple[Any, Any, tuple[int, int, int], str]],
        *,
        copies: Sequence[tuple[Any, int, Any, int, int]] = (),
        read: Any = None,
        kernel: str | None = None,
        variant: str | None = None,
    ) -> bytes | None:
        """Record every dispatch (compiled, bind group, grid, pass id) — one compute pass each —
        then the buffer copies, into one command encoder; submit once. With ``read`` (a MAP_READ
        staging buffer among the copy targets), map it, return its bytes and unmap."""
        pass_id = None
        with self.errors("recording commands", kernel=kernel, variant=variant):
            encoder = self.device.create_command_encoder(label=f"{kernel or 'launch'}/{variant or ''}")
            for compiled, bind_group, grid, pass_id in dispatches:
                if min(grid) <= 0:
                    continue
                cpass = encoder.begin_compute_pass(label=pass_id)
                cpass.set_pipeline(compiled.pipeline)
                cpass.set_bind_group(0, bind_group)
                cpass.dispatch_workgroups(*grid)
                cpass.end()
            for src, src_off, dst, dst_off, size in copies:
                if size > 0:
                    encoder.copy_buffer_to_buffer(src, src_off, dst, dst_off, size)
        passes = ",".join(d[3] for d in dispatches if min(d[2]) > 0) or None
        with self.errors("finishing and submitting the command buffer", kernel=kernel, variant=variant,
                         pass_id=passes):
            self.queue.submit([encoder.finish()])
        self.stats.submits += 1
        if read is not None:
            return self.read_staging(read)
        return None


    @holding("lock")
    def submit(
        self,
        commands: Sequence[tuple],
        *,
        read: Any = None,
        read_size: int | None = None,
        label: str = "run",
        timestamps: Any = None,
        times: list | None = None,
    ) -> bytes | None:
        """Record an ordered list of commands into ONE command encoder and submit once.

        ``("dispatch", compiled, bind_group, (x, y, z), pass label)`` entries that follow each
        other share one compute pass (WebGPU orders the dispatches of a pass and makes each
        one's writes visible to the next); ``("copy", src, src_offset, dst, dst_offset, size)``
        ends the open pass and records a buffer copy there, so a value can be copied out
        (e.g. into the read-back staging buffer) right after the pass that produced it.
        With ``read`` (a MAP_READ staging buffer), map its first ``read_size`` bytes after
        the submit, return them and unmap. With ``timestamps`` (a profiler's
        ``TimestampQueries``), every dispatch gets its own pass whose beginning and end write
        timestamps, resolved at the end of the encoder. A dispatch with a sixth element, the raw
        (pipeline, bind group) handles, is recorded through wgpu-native's C functions directly
        (wgpu-py's wrappers cost an error-capturing proxy and an ``ffi.new`` per call); errors
        still surface at ``finish()``, caught and named as every other. ``times``: a list that
        gets (seconds recording up to ``finish()``, seconds in ``queue.submit``, seconds recording
        up to the last command: before wgpu-native's pass end and finish, its own validation).
        """
        t0 = time.perf_counter()
        recorded: list[str] = []
        raw = _raw_pass_functions() if timestamps is None else None
        with self.errors("recording commands", pass_id=label):
            encoder = self.device.create_command_encoder(label=label)
            cpass = None
            last_pipeline = None
            for cmd in commands:
                if cmd[0] == "dispatches" and raw is not None:  # executor.compact_program's runs
                    if cpass is None:
                        cpass = encoder.begin_compute_pass(label=label)
                        handle, last_pipeline = cpass._internal, None
                    set_pipeline, set_bind_group, dispatch, null = raw
                    for pipeline, bind_group, x, y, z in cmd[1]:
                        if pipeline != last_pipeline:
                            set_pipeline(handle, pipeline)
                            last_pipeline = pipeline
                        set_bind_group(handle, 0, bind_group, 0, null)
                        dispatch(handle, x, y, z)
                    recorded.extend(cmd[2])
                    continue
                if cmd[0] == "dispatches":  # pragma: no cover - executor compacts only where raw_recording
                    raise ValueError("compacted dispatches need wgpu-native's raw functions and no timestamps")
                if cmd[0] == "dispatch":
                    grid = cmd[3]
                    if min(grid) <= 0:
                        continue
                    if raw is not None and len(cmd) > 5:
                        if cpass is None:
                            cpass = encoder.begin_compute_pass(label=label)
                            handle, last_pipeline = cpass._internal, None
                        pipeline, bind_group = cmd[5]
                        if pipeline != last_pipeline:
                            raw[0](handle, pipeline)
                            last_pipeline = pipeline
                        raw[1](handle, 0, bind_group, 0, raw[3])
                        raw[2](handle, grid[0], grid[1], grid[2])
                        recorded.append(cmd[4])
                        continue
                    _, compiled, bind_group, grid, pass_label = cmd[:5]
                    if timestamps is not None:
                        cpass = encoder.begin_compute_pass(label=pass_label,
                                                           timestamp_writes=timestamps.writes(len(recorded)))
                    elif cpass is None:
                        cpass = encoder.begin_compute_pass(label=label)
                    cpass.set_pipeline(compiled.pipeline)
                    cpass.set_bind_group(0, bind_group)
                    cpass.dispatch_workgroups(*grid)
                    recorded.append(pass_label)
                    if timestamps is not None:
                        cpass.end()
                        cpass = None
                elif cmd[0] == "copy":
                    _, src, src_off, dst, dst_off, size = cmd
                    if cpass is not None:
                        cpass.end()
                        cpass = None
                    if size > 0:
                        encoder.copy_buffer_to_buffer(src, src_off, dst, dst_off, size)
                else:  # pragma: no cover - programming error
                    raise ValueError(f"unknown command {cmd[0]!r}")
            t_recorded = time.perf_counter()
            if cpass is not None:
                cpass.end()
            if timestamps is not None:
                timestamps.resolve(encoder, len(recorded))
        shown = ",".join(recorded[:12]) + (f",... ({len(recorded)} dispatches)" if len(recorded) > 12 else "")
        with self.errors("finishing and submitting the command buffer", pass_id=shown or label):
            finished = encoder.finish()
            t1 = time.perf_counter()
            self.queue.submit([finished])
        if times is not None:
            times.append((t1 - t0, time.perf_counter() - t1, t_recorded - t0))
        self.stats.submits += 1
        if read is not None:
            return self.read_staging(read, read_size)
        return None


def release_quietly(*objects: Any) -> None:
    """Destroy wgpu buffers / query sets, ignoring None and failures (best effort: at exit or
    after a device loss there may be nothing left to destroy)."""
    for obj in objects:
        if obj is not None:
            try:
                obj.destroy()
            except Exception:  # pragma: no cover - best effort
                pass


_RAW: tuple | None = None


def _raw_pass_functions() -> tuple | None:
    """wgpu-native's SetPipeline, SetBindGroup and DispatchWorkgroups for compute passes and a
    NULL offsets pointer, or None where this wgpu build does not expose them."""
    global _RAW
    if _RAW is None:
        try:
            from wgpu.backends.wgpu_native._ffi import ffi, lib  # noqa: PLC0415

            _RAW = (lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup,
                    lib.wgpuComputePassEncoderDispatchWorkgroups, ffi.NULL)
        except (ImportError, AttributeError):  # pragma: no cover - another wgpu backend
            _RAW = ()
    return _RAW or None


def _is_wgpu_error(e: BaseException) -> bool:
    mod = type(e).__module__ or ""
    return mod.startswith("wgpu") or type(e).__name__.startswith("GPU")


_DEVICES: dict[tuple, GpuDevice] = {}


def get_device(
    adapter: int | str | None = None,
    *,
    limits: str | Mapping[str, int] | None = None,
    features: Iterable[str] | None = None,
) -> GpuDevice:
    """A process-wide shared device per (adapter, limits, features): creating devices is slow
    and each holds driver threads, so sessions and commands share them."""
    entry = select_adapter(adapter)
    mode, overrides = _limits_base(limits)
    key = (entry.index, mode, tuple(sorted(overrides.items())),
           None if features is None else tuple(sorted(features)))
    with _LOCK:
        dev = _DEVICES.get(key)
        if dev is None:
            dev = GpuDevice(entry.index, limits=limits, features=features)
            _DEVICES[key] = dev
        return dev

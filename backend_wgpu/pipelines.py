"""Compute pipelines, cached per device.

A pipeline is keyed by (rendered WGSL source, entry point, bind-group layout key); the cache
lives on its :class:`~backend_wgpu.device.GpuDevice`, so the device is part of the key. Bind
group layouts and pipeline layouts are explicit (never ``layout="auto"``), built from the
pass's bindings, and themselves cached by layout key, so bind groups made for one pipeline
fit every pipeline with the same layout.

``compilations`` counts shader-module + pipeline creations and ``cache_hits`` the lookups that
found one; a second run of the same shapes must not move ``compilations``.

:meth:`PipelineCache.for_pass` looks a pass up by its pipeline key (``render.pipeline_key``: the
template and the values it reads, runtime uniforms by name only), computed before rendering: a
hit neither renders nor compiles, so a new batch size whose kernels take their shapes as
uniforms compiles nothing; ``renders`` counts the passes that had to be rendered.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from onnx_quant.errors import DeviceError

if TYPE_CHECKING:  # pragma: no cover
    from .device import GpuDevice
    from .plan import BindingPlan, PassPlan

_BUFFER_TYPES = {"read": "read-only-storage", "read_write": "storage", "uniform": "uniform"}


def layout_key(bindings: Iterable["BindingPlan"]) -> tuple[tuple[int, str], ...]:
    """(binding index, wgpu buffer binding type) per binding, in index order."""
    key = []
    for b in sorted(bindings, key=lambda b: b.index):
        try:
            key.append((b.index, _BUFFER_TYPES[b.access]))
        except KeyError:
            raise DeviceError(f"binding {b.var_name}: unknown access {b.access!r}") from None
    return tuple(key)


@dataclass(frozen=True)
class CompiledPipeline:
    pipeline: Any
    bind_group_layout: Any
    layout_key: tuple
    entry_point: str
    label: str
    source: str = ""


class PipelineCache:
    def __init__(self, device: "GpuDevice") -> None:
        self._device = device
        self._pipelines: dict[tuple, CompiledPipeline] = {}
        self._layouts: dict[tuple, tuple[Any, Any]] = {}
        self.compilations = 0
        self.cache_hits = 0
        self.layouts_created = 0
        self.renders = 0
        #: seconds spent keying and rendering passes, and in the driver's shader + pipeline creation
        self.render_s = 0.0
        self.compile_s = 0.0
        #: the (pipeline key, source) of the pass :meth:`for_pass` returned last
        self.last_shader: tuple[tuple, str] | None = None
        self._by_pass_key: dict[tuple, CompiledPipeline] = {}

    def __len__(self) -> int:
        return len(self._pipelines)

    def counters(self) -> dict[str, int]:
        return {"compilations": self.compilations, "cache_hits": self.cache_hits,
                "layouts_created": self.layouts_created, "pipelines": len(self._pipelines),
                "renders": self.renders, "render_s": self.render_s, "compile_s": self.compile_s}

    def forget(self) -> None:
        """Drop every cached pipeline (the counters stay): a cold cache, for measurements."""
        self._pipelines.clear()
        self._by_pass_key.clear()

    def for_pass(self, pass_plan: "PassPlan", key: tuple, *, label: str = "", kernel: str | None = None,
                 variant: str | None = None, known: tuple[tuple, str] | None = None) -> CompiledPipeline:
        """The pipeline of a planned pass, keyed before rendering; rendered and compiled on a miss
        (a miss whose source another key already compiled reuses that pipeline). ``known``: the
        pass's (pipeline key, WGSL source) from the plan cache (plan_cache.py): neither keyed nor
        rendered again. :attr:`shaders` records every pass's (pipeline key, source) it saw."""
        t0 = time.perf_counter()
        if known is None:  # render.py (and jinja2) load only when a pass has to be keyed or rendered
            from .render import pipeline_key  # noqa: PLC0415

        pkey = known[0] if known is not None else pipeline_key(pass_plan)
        pass_key = (pkey, "main", key)
        hit = self._by_pass_key.get(pass_key)
        if hit is not None:
            self.cache_hits += 1
            self.render_s += time.perf_counter() - t0
            self.last_shader = (pkey, hit.source)
            return hit
        if known is None:
            from .render import render  # noqa: PLC0415

        source = known[1] if known is not None else render(pass_plan)
        self.renders += known is None
        self.render_s += time.perf_counter() - t0
        compiled = self.get(source, key, label=label, kernel=kernel, variant=variant, pass_id=pass_plan.id)
        self._by_pass_key[pass_key] = compiled
        self.last_shader = (pkey, source)
        return compiled

    def layouts(self, key: tuple) -> tuple[Any, Any]:
        """(bind group layout, pipeline layout) for a layout key, cached."""
        hit = self._layouts.get(key)
        if hit is not None:
            return hit
        dev = self._device
        wgpu = dev.wgpu
        entries = [
            {"binding": index, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": btype}}
            for index, btype in key
        ]
        with dev.errors("creating a bind group layout"):
            bgl = dev.device.create_bind_group_layout(entries=entries)
            pl = dev.device.create_pipeline_layout(bind_group_layouts=[bgl])
        self.layouts_created += 1
        self._layouts[key] = (bgl, pl)
        return bgl, pl

    def get(self, source: str, key: tuple, *, entry_point: str = "main", label: str = "",
            kernel: str | None = None, variant: str | None = None, pass_id: str | None = None) -> CompiledPipeline:
        cache_key = (source, entry_point, key)
        hit = self._pipelines.get(cache_key)
        if hit is not None:
            self.cache_hits += 1
            return hit
        dev = self._device
        bgl, pl = self.layouts(key)
        t0 = time.perf_counter()
        with dev.errors("compiling the shader", kernel=kernel, variant=variant, pass_id=pass_id):
            module = dev.device.create_shader_module(label=label, code=source)
        with dev.errors("creating the compute pipeline", kernel=kernel, variant=variant, pass_id=pass_id):
            pipeline = dev.device.create_compute_pipeline(
                label=label, layout=pl, compute={"module": module, "entry_point": entry_point})
        self.compile_s += time.perf_counter() - t0
        self.compilations += 1
        compiled = CompiledPipeline(pipeline, bgl, key, entry_point, label, source)
        self._pipelines[cache_key] = compiled
        return compiled

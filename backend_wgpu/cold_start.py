"""Where a Session's cold start goes, and its use of the on-disk plan cache (plan_cache.py).

:class:`ColdStart` times the phases of a session's construction and first run: ``load`` (reading
and checking the model), ``rewrite`` (the kernel specs, the construction phases, placement,
constants), ``device`` (adapter and device, shared per process: ~0 after the first session),
``plan`` (the graph compiler, or reading its result from the plan cache), ``render`` (pipeline keys
and WGSL rendering), ``compile`` (the driver's shader module and pipeline creation) and
``first run`` (the rest of the first run: buffers, bind groups, uploads, the kernels, the
read-back). ``onnx-quant run`` and ``profile`` print :meth:`ColdStart.line`.

:class:`PlanDisk` is a Session's view of the plan cache: the entry for a plan key, and the entry
written once a plan compiled here has been prepared (its passes rendered).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import plan_cache

#: the phases, in the order they happen
PHASES = ("load", "rewrite", "device", "plan", "render", "compile", "first run")


@dataclass
class ColdStart:
    """Seconds per phase (:data:`PHASES`), and what the plan cache did for this session."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    #: "hit" / "miss" / "off" for the first plan
    plan_cache: str = "off"
    _mark: float = field(default_factory=time.perf_counter, repr=False)

    def phase(self, name: str) -> None:
        """Close phase ``name``: the time since the previous mark is its."""
        now = time.perf_counter()
        self.seconds[name] += now - self._mark
        self._mark = now

    def restart(self) -> None:
        self._mark = time.perf_counter()

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def as_dict(self) -> dict[str, Any]:
        return {**{k: round(v, 6) for k, v in self.seconds.items()}, "total": round(self.total, 6),
                "plan_cache": self.plan_cache}

    def line(self) -> str:
        """``cold start 1234 ms: load 12, rewrite 300, ... (plan cache hit)``."""
        parts = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in self.seconds.items())
        return f"cold start {self.total * 1e3:.0f} ms: {parts} (plan cache {self.plan_cache})"


class PlanDisk:
    """A Session's use of the plan cache: None-safe where the cache is off or the session's
    specs are not the installed ones."""

    def __init__(self, store: "plan_cache.PlanStore | None", model: Any, device_info: Any,
                 options: Mapping[str, Any]) -> None:
        self.store = store
        self._model = model
        self._device = plan_cache.device_facts(device_info) if store is not None else None
        self._options = dict(options)
        self._digest: str | None = None
        #: plan key -> (entry name, compile result) of plans compiled here, written once prepared
        self.pending: dict[tuple, tuple[str, Any]] = {}
        #: plan key -> shaders read from the cache, for the plan's preparation
        self.shaders: dict[tuple, dict] = {}

    def name(self, plan_key: tuple) -> str:
        if self._digest is None:
            self._digest = plan_cache.model_digest(self._model)
        return plan_cache.entry_key(model=self._digest, device=self._device, options=self._options,
                                    plan_key=plan_key)

    def lookup(self, plan_key: tuple) -> Any | None:
        """The cached compile result of this plan key (its shaders kept for :meth:`shaders_for`), or None."""
        if self.store is None:
            return None
        entry = self.store.load(self.name(plan_key))
        if entry is None:
            return None
        self.shaders[entry.compiled.plan.key] = entry.shaders
        return entry.compiled

    def remember(self, plan_key: tuple, compiled: Any) -> None:
        """A plan compiled here for ``plan_key``: written once prepared (not when it is keyed on
        input contents: such a plan holds for those contents only)."""
        if self.store is not None and not compiled.keyed:
            self.pending[compiled.plan.key] = (self.name(plan_key), compiled)

    def shaders_for(self, plan_key: tuple) -> dict | None:
        return self.shaders.pop(plan_key, None)

    def prepared(self, plan_key: tuple, shaders: Mapping) -> None:
        """The plan was prepared: write its entry with the shaders its passes rendered."""
        pending = self.pending.pop(plan_key, None)
        if pending is None or self.store is None:
            return
        name, compiled = pending
        self.store.save(plan_cache.Entry(name, compiled, dict(shaders)))

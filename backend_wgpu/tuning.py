"""Variants and tunables chosen by measurement on the adapter at hand (``onnx-quant tune``,
``Session(..., tune=True)``).

For one binding of input shapes the tuner

1. plans the model with the static rules (no cached choice) and runs it once: these outputs are
   what every candidate must reproduce;
2. groups the GPU nodes by tuning key (``tuning_cache.entry_key``: kernel, dtypes, bucketed
   input shapes) and lists each key's *candidates*: every variant whose ``when`` clauses hold at
   the node's shapes (``NodePlan.selection``), each with the spec's default tunables and with each
   value a tunable's ``tune`` list offers (one tunable changed at a time); the static choice
   comes first;
3. times the candidates in *rounds*: round r gives every key its r-th candidate (the static one
   where it has fewer), builds a session with those choices forced per node, checks its outputs
   against step 1's (integer outputs bit for bit, float outputs within ``float_rtol`` of the
   largest magnitude); a round that fails or differs is rebuilt one key at a time, so a wrong or
   failing candidate is dropped without losing the others. Then ``passes`` times over every
   round in turn (so a change of the machine's load hits all of them alike) each node's device
   time is taken (the profiler's, fastest of ``repeats`` runs, fastest over the passes);
4. keeps, per key, the candidate with the least summed time over the key's nodes (ties go to
   the static choice), and writes it to the adapter's table (tuning_cache.py).

A key already in the table is not measured again unless ``force``. The timer is a parameter
(``timer(session, feeds, repeats) -> {node label: µs}``) so the choosing logic can be tested
with made-up times; the default reads the session's profiler (device timestamps where the
adapter has ``timestamp-query``, else the host's wall clock per node).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from onnx_quant.errors import QuantError
from onnx_quant.feeds import SEED, random_array

from .tuning_cache import Choice, TuningTable, candidate_label, entry_key

#: float outputs agree with the static choice's within this fraction of their largest magnitude
FLOAT_RTOL = 1e-5
#: profiled runs per round and pass, and passes over the rounds (each node's time is its fastest)
REPEATS, PASSES = 4, 3

Candidate = tuple[str, dict[str, int]]            # (variant, tunables changed from the defaults)
Timer = Callable[[Any, Mapping[str, np.ndarray], int], Mapping[str, float]]


def profiled_times(session: Any, feeds: Mapping[str, np.ndarray], repeats: int) -> dict[str, float]:
    """Each GPU node's fastest time (µs) over ``repeats`` profiled runs of a warm session."""
    prof = session.profiler
    prof.reset()
    for _ in range(repeats):
        session.run(None, feeds)
    best: dict[str, float] = {}
    for ev in prof.events:
        if ev.clock != "host":
            best[ev.node] = min(best.get(ev.node, float("inf")), ev.dur_us)
    return best


def feeds_for(inputs: Sequence[Any], shapes: Mapping[str, tuple[int, ...]],
              feeds: Mapping[str, Any] | None) -> dict[str, np.ndarray]:
    """The run's own host feeds where it has them, random ones (onnx_quant/feeds.py) at ``shapes``
    for the others (device feeds, or a plan made before any run)."""
    rng = np.random.default_rng(SEED)
    out = {}
    for vi in inputs:
        given = (feeds or {}).get(vi.name)
        out[vi.name] = given if isinstance(given, np.ndarray) else random_array(
            vi.name, vi.type.tensor_type.elem_type, shapes[vi.name], rng)
    return out


def outputs_agree(got: Sequence[np.ndarray], want: Sequence[np.ndarray], float_rtol: float = FLOAT_RTOL) -> str | None:
    """None when every output agrees (integers and bools bit for bit, floats within ``float_rtol``
    of the largest |expected|, NaN where NaN), else what differs."""
    for k, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {k}: {g.dtype}{list(g.shape)} vs {w.dtype}{list(w.shape)}"
        if g.dtype.kind not in "fc":
            if not np.array_equal(g, w):
                return f"output {k}: {int(np.count_nonzero(g != w))} of {g.size} elements differ"
            continue
        gf, wf = g.astype(np.float64), w.astype(np.float64)
        if not np.array_equal(np.isnan(gf), np.isnan(wf)):
            return f"output {k}: NaN where the static choice has a number (or the reverse)"
        ok = ~np.isnan(wf)
        scale = float(np.max(np.abs(wf[ok]), initial=0.0))
        diff = float(np.max(np.abs(gf[ok] - wf[ok]), initial=0.0))
        if diff > float_rtol * scale:
            return f"output {k}: max |diff| {diff:.3g} beyond {float_rtol:g} x {scale:.3g}"
    return None


@dataclass
class KeyReport:
    """One tuning key: its nodes, the candidates timed (label -> summed µs), the dropped ones
    (label -> why) and the choice."""

    key: str
    kernel: str
    nodes: list[str]
    static: str
    candidates: list[Candidate] = field(default_factory=list)
    timed_us: dict[str, float] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    chosen: str = ""
    cached: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "kernel": self.kernel, "nodes": self.nodes, "static": self.static,
                "timed_us": self.timed_us, "dropped": self.dropped, "chosen": self.chosen, "cached": self.cached}


def plan_key(plan: Any) -> str:
    """The tuning key of a node plan (the one ``graph_plan.plan_kernel`` looks up)."""
    io = {n: b for n, b in plan.buffers.items() if b.role in ("input", "output")}
    return entry_key(plan.kernel, {n: tuple(b.shape) for n, b in io.items()},
                     {n: b.onnx_type for n, b in io.items()},
                     frozenset(n for n, b in io.items() if b.role == "input"))


def node_candidates(plan: Any, spec: Any) -> list[Candidate]:
    """The static choice first, then every other variant whose clauses hold, then each of those
    with each value of a tunable's ``tune`` list (one tunable changed at a time)."""
    allowed = [plan.variant] + [v for v, why in plan.selection.items() if why is None and v != plan.variant]
    out: list[Candidate] = [(v, {}) for v in allowed]
    for v in allowed:
        for name, tunable in (spec.tunables.items() if spec is not None else ()):
            for value in tunable.tune:
                if value != plan.tunables.get(name, tunable.default):
                    out.append((v, {name: value}))
    return out


def _overrides(assign: Mapping[str, Candidate], nodes_of: Mapping[str, list[str]],
               base_tunables: Mapping[str, Any], base_variants: Mapping[str, str]) -> dict[str, Any]:
    """Session keywords forcing ``assign`` (key -> candidate) on every node of each key."""
    variants, tunables = dict(base_variants), dict(base_tunables)
    for key, (variant, tun) in assign.items():
        for label in nodes_of[key]:
            variants[label] = variant
            if tun:
                tunables[label] = {**(tunables.get(label) or {}), **tun}
    return {"variants": variants, "tunables": tunables}


class Tuner:
    """One tuning of one binding of input shapes (module doc)."""

    def __init__(self, make_session: Callable[..., Any], feeds: Mapping[str, np.ndarray], table: TuningTable, *,
                 timer: Timer = profiled_times, repeats: int | None = None, passes: int | None = None,
                 force: bool = False,
                 float_rtol: float = FLOAT_RTOL, tunables: Mapping[str, Any] | None = None,
                 variants: Mapping[str, str] | None = None) -> None:
        self.make_session, self.feeds, self.table = make_session, dict(feeds), table
        self.timer = timer
        self.repeats = max(1, REPEATS if repeats is None else repeats)
        self.passes = max(1, PASSES if passes is None else passes)
        self.force, self.float_rtol = force, float_rtol
        self.specs: dict[str, Any] = {}
        self.base_tunables, self.base_variants = dict(tunables or {}), dict(variants or {})
        self.reports: dict[str, KeyReport] = {}
        self.expected: list[np.ndarray] = []

    def _session(self, assign: Mapping[str, Candidate]) -> Any:
        nodes_of = {k: r.nodes for k, r in self.reports.items()}
        return self.make_session(profile=True, use_tuning_cache=False,
                                 **_overrides(assign, nodes_of, self.base_tunables, self.base_variants))

    def run(self) -> list[KeyReport]:
        shapes = {n: tuple(a.shape) for n, a in self.feeds.items()}
        base = self.make_session(profile=True, use_tuning_cache=False, tunables=self.base_tunables,
                                 variants=self.base_variants)
        timed: list[tuple[dict[str, Candidate], Any]] = []
        try:
            self.specs = {s.name: s for s in base.kernel_specs}
            self.expected = base.run(None, self.feeds)
            self._collect(base.plans(shapes))
            timed.append(({k: r.candidates[0] for k, r in self._open().items()}, base))
            rounds = max((len(r.candidates) for r in self._open().values()), default=0)
            for r in range(1, rounds):
                assign = {k: rep.candidates[r] for k, rep in self._open().items() if len(rep.candidates) > r}
                session = self._checked(assign)
                if session is not None:
                    timed.append((assign, session))
                elif len(assign) > 1:  # find which one fails or differs: one key at a time
                    timed.extend((one, s) for one in ({k: c} for k, c in assign.items())
                                 if (s := self._checked(one)) is not None)
            for _ in range(self.passes if self._open() else 0):  # interleaved, so a change of the machine's load hits every round
                for assign, session in timed:
                    self._record(assign, self.timer(session, self.feeds, self.repeats))
        finally:
            for _, session in timed or [(None, base)]:
                session.close()
        for key, rep in self._open().items():
            self._choose(key, rep)
        if any(not r.cached for r in self.reports.values()):
            self.table.save()
        return list(self.reports.values())

    def _collect(self, plans: Sequence[Any]) -> None:
        """A KeyReport per tuning key of the static plans (the nodes the caller forced nothing on)."""
        for plan in plans:
            if plan.node in self.base_variants or plan.kernel in self.base_variants:
                continue
            key = plan_key(plan)
            rep = self.reports.get(key)
            cands = node_candidates(plan, self.specs.get(plan.kernel))
            if rep is None:
                self.reports[key] = rep = KeyReport(key, plan.kernel, [plan.node], candidate_label(*cands[0]), cands)
            else:  # a key's candidates are those every node of it takes
                rep.nodes.append(plan.node)
                rep.candidates = [c for c in rep.candidates if c in cands]
            cached = None if self.force else self.table.lookup(key)
            if cached is not None:
                rep.cached, rep.chosen = True, candidate_label(cached.variant, dict(cached.tunables))

    def _open(self) -> dict[str, KeyReport]:
        return {k: r for k, r in self.reports.items() if not r.cached}

    def _checked(self, assign: Mapping[str, Candidate]) -> Any:
        """A warm session forcing ``assign`` whose outputs agree with the static choice's, or None
        (and the candidates marked dropped, with why). Any failure drops: a candidate whose pipeline
        fails to compile is no more usable than one planning refuses."""
        labels = {k: candidate_label(*c) for k, c in assign.items()}
        session = None
        try:
            session = self._session(assign)
            why = outputs_agree(session.run(None, self.feeds), self.expected, self.float_rtol)
            why = None if why is None else f"not exact: {why}"
        except Exception as e:  # noqa: BLE001 - see the docstring
            why = f"{type(e).__name__}: {e}"
        if why is None:
            return session
        if session is not None:
            session.close()
        for k, label in labels.items():
            self.reports[k].dropped[label] = why
        return None

    def _record(self, assign: Mapping[str, Candidate], times: Mapping[str, float]) -> None:
        for k, cand in assign.items():
            rep = self.reports[k]
            if all(n in times for n in rep.nodes):
                label = candidate_label(*cand)
                t = float(sum(times[n] for n in rep.nodes))
                rep.timed_us[label] = min(t, rep.timed_us.get(label, t))

    def _choose(self, key: str, rep: KeyReport) -> None:
        """The fastest candidate timed; the static one on a tie (it is timed first)."""
        by_label = {candidate_label(*c): c for c in rep.candidates}
        timed = [(t, label) for label, t in rep.timed_us.items() if label in by_label]
        if not timed:
            return
        best = min(timed, key=lambda tl: tl[0])
        if rep.timed_us.get(rep.static) == best[0]:
            best = (best[0], rep.static)
        variant, tun = by_label[best[1]]
        rep.chosen = best[1]
        self.table.entries[key] = Choice(variant, dict(tun), dict(rep.timed_us))


def tune(make_session: Callable[..., Any], feeds: Mapping[str, np.ndarray], table: TuningTable,
         **options: Any) -> list[KeyReport]:
    """Measure and cache the choices of one binding of input shapes (module doc).
    ``make_session(**keywords)`` builds a Session of the model on the device being tuned."""
    return Tuner(make_session, feeds, table, **options).run()


def format_reports(reports: Sequence[KeyReport]) -> str:
    """A table: per key its nodes, the static choice, each candidate's time and the choice."""
    lines = []
    for rep in reports:
        nodes = ", ".join(rep.nodes[:4]) + (f" (+{len(rep.nodes) - 4})" if len(rep.nodes) > 4 else "")
        head = f"{rep.kernel} [{nodes}]: static {rep.static} -> {rep.chosen or rep.static}"
        lines.append(head + (" (cached)" if rep.cached else ""))
        for label, t in sorted(rep.timed_us.items(), key=lambda kv: kv[1]):
            lines.append(f"    {t:12.1f} µs  {label}")
        for label, why in rep.dropped.items():
            lines.append(f"    {'dropped':>12}     {label}: {why}")
    return "\n".join(lines)

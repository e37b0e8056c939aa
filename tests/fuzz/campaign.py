"""The fuzz loop both profiles share: graphs drawn by hypothesis, each judged (check.py), the
figures kept (graphs/s, outcomes, coverage by op and by kernel variant, refusal reasons) and every
finding shrunk by hypothesis to a minimal graph and saved as a ``.onnx`` regression case.

A finding makes the hypothesis test body raise, so hypothesis shrinks it; the last failing graph
the body saw is the minimal one (hypothesis replays it last), and it is what is saved.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from .check import Outcome, check_model
from .graphs import fuzz_graphs

REGRESSIONS = Path(__file__).resolve().parent / "regressions"


#: how long hypothesis may shrink one finding (each step runs a graph on the device)
SHRINK_SECONDS = 40


class Finding(AssertionError):
    pass


def without_output(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """``model`` without graph output ``name``, and without the nodes, inputs and initializers
    no remaining output needs."""
    m = onnx.ModelProto.FromString(model.SerializeToString())
    g = m.graph
    keep = [o for o in g.output if o.name != name]
    del g.output[:]
    g.output.extend(keep)
    needed = {o.name for o in keep}
    nodes = []
    for n in reversed(list(g.node)):
        if any(o in needed for o in n.output):
            nodes.append(n)
            needed.update(i for i in n.input if i)
    del g.node[:]
    g.node.extend(reversed(nodes))
    for field_name in ("input", "initializer"):
        kept = [x for x in getattr(g, field_name) if x.name in needed]
        del getattr(g, field_name)[:]
        getattr(g, field_name).extend(kept)
    return m


def prune(model: onnx.ModelProto, outcome: Outcome, device) -> tuple[onnx.ModelProto, Outcome]:
    """Greedy reduction after hypothesis's: drop graph outputs (and what only they need) while
    the graph still gives a finding of the same kind."""
    changed = True
    while changed and len(model.graph.output) > 1:
        changed = False
        for o in list(model.graph.output):
            smaller = without_output(model, o.name)
            got = check_model(smaller, device)
            if got.kind == outcome.kind:
                model, outcome, changed = smaller, got, True
                break
    return model, outcome


@dataclass
class Stats:
    graphs: int = 0
    nodes: int = 0
    seconds: float = 0.0
    outcomes: Counter = field(default_factory=Counter)
    ops: Counter = field(default_factory=Counter)
    kernels: Counter = field(default_factory=Counter)
    refusals: Counter = field(default_factory=Counter)
    invalid: Counter = field(default_factory=Counter)
    findings: list[dict] = field(default_factory=list)

    def record(self, model: onnx.ModelProto, outcome: Outcome) -> None:
        self.graphs += 1
        self.nodes += len(model.graph.node)
        self.outcomes[outcome.kind] += 1
        for n in model.graph.node:
            self.ops[f"{n.domain}:{n.op_type}" if n.domain else n.op_type] += 1
        for k, v in outcome.kernels:
            self.kernels[f"{k}/{v}"] += 1
        if outcome.kind == "refused":
            self.refusals[_reason(outcome.detail)] += 1
        if outcome.kind == "invalid":
            self.invalid[outcome.detail[:120]] += 1

    def summary(self) -> dict:
        return {
            "graphs": self.graphs, "nodes": self.nodes, "seconds": round(self.seconds, 1),
            "graphs_per_s": round(self.graphs / self.seconds, 2) if self.seconds else None,
            "outcomes": dict(self.outcomes),
            "findings": self.findings,
            "ops": dict(self.ops.most_common()), "kernel_variants": dict(self.kernels.most_common()),
            "refusals": dict(self.refusals.most_common(25)), "invalid": dict(self.invalid.most_common(10)),
        }


def _reason(detail: str) -> str:
    """A refusal's reason without its node names and shapes (so that like reasons count together)."""
    import re

    detail = re.sub(r"^(\w+: )(the )?input shapes (\{.*?\}|\(.*?\))( do not fit the model)?: ", r"\1\4: ", detail)
    text = re.sub(r"'n\d+'|node n\d+|\bv\d+\b|\bin\d+\b|\bc\d+\b", "_", detail)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\(\d[^)]*\)", "…", text)
    return text[:160]


def save_case(model: onnx.ModelProto, outcome: Outcome, folder: Path = REGRESSIONS) -> Path:
    """The minimized graph as ``<kind>-<hash>.onnx``, the verdict it gave in its doc string."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    model.doc_string = f"fuzz finding ({outcome.kind}): {outcome.detail[:1500]}"
    data = model.SerializeToString()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{outcome.kind}-{hashlib.sha1(data).hexdigest()[:10]}.onnx"
    path.write_bytes(data)
    return path


def fuzz_batch(device, stats: Stats, *, examples: int, seed: int | None, max_nodes: int = 30,
               derandomize: bool = False, save: bool = True, deadline: float | None = None) -> Path | None:
    """Up to ``examples`` graphs (fewer once ``deadline``, a time.monotonic() value, passes); on a
    finding, hypothesis shrinks it and the minimal graph is saved (returned)."""
    last: dict = {}

    @settings(max_examples=examples, deadline=None, derandomize=derandomize, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink],
              report_multiple_bugs=False, print_blob=False)
    @given(case=fuzz_graphs(max_nodes=max_nodes))
    def body(case):
        if deadline is not None and time.monotonic() > deadline and not last:
            return
        if last and time.monotonic() > last["shrink_until"]:
            return  # shrinking's budget is spent: the last failing graph is the smallest so far
        t = time.monotonic()
        outcome = check_model(case.model, device)
        stats.seconds += time.monotonic() - t
        if outcome.finding:
            last.setdefault("shrink_until", time.monotonic() + SHRINK_SECONDS)
            last["model"], last["outcome"] = case.model, outcome
            raise Finding(f"{outcome.kind}: {outcome.detail}")
        if not last:  # shrinking's replays are not new graphs
            stats.record(case.model, outcome)

    if seed is not None:
        body = hypothesis_seed(seed)(body)
    try:
        body()
    except Exception as e:  # noqa: BLE001 - the Finding, or hypothesis's Flaky once shrinking stopped early
        if not last:  # a generator's own fault while drawing a graph: the fuzzer's bug, counted
            stats.outcomes["generator-error"] += 1
            stats.invalid[f"generator: {type(e).__name__}: {e}"[:120]] += 1
            return None
        model, outcome = prune(last["model"], last["outcome"], device)
        stats.record(model, outcome)
        entry = {"kind": outcome.kind, "detail": outcome.detail[:600], "nodes": len(model.graph.node),
                 "ops": [n.op_type for n in model.graph.node]}
        path = save_case(model, outcome) if save else None
        entry["case"] = path.name if path else None
        stats.findings.append(entry)
        return path
    return None


def write_summary(stats: Stats, path: Path, extra: dict) -> None:
    path.write_text(json.dumps({**extra, **stats.summary()}, indent=1))

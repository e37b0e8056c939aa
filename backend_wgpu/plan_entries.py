"""Session.explain's rows: per node of a plan, where it runs, which kernel and variant, why, and
its passes (the data ``onnx-quant explain`` prints; explaining.py lays it out)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .plan import GraphPlan, HostStep, Segment
from .planner import describe


def plan_entries(gplan: GraphPlan, nodes: Sequence[Any], device_name: str,
                 fused_units: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One entry per node of ``nodes`` (the session's NodeInfos, in graph order) under ``gplan``;
    ``fused_units`` maps a fused node's first output to the QDQ node unit it replaced."""
    steps = {st.index: st for st in gplan.gpu_steps}
    seg_of = {st.index: seg.index for seg in gplan.segments for st in seg.steps}
    once = {st.index for st in gplan.prologue}
    host_after = {}
    for i, s in enumerate(gplan.schedule):
        if isinstance(s, HostStep):
            host_after[s.index] = sum(1 for x in gplan.schedule[:i] if isinstance(x, Segment))
    names = {"const": "constant", "fold": "folded"}
    out = []
    for info in nodes:
        kind, why = gplan.placement[info.index]
        node = info.node

        def shape_of(n: str) -> Any:
            if n in gplan.alias:
                s = gplan.alias[n][1]
                return list(s) if s is not None else None
            return None

        shapes_here = {n: shape_of(n) for n in list(node.input) + list(node.output) if n}
        entry: dict[str, Any] = {"node": info.label, "op_type": node.op_type,
                                 "placement": names.get(kind, kind), "reason": why}
        if kind == "gpu":
            st = steps[info.index]
            d = describe(st.plan)
            entry.update({
                "kernel": d["kernel"], "variant": d["variant"], "derived": d["derived"], "when": d["when"],
                "selection": d["selection"], "tunables": d["tunables"],
                "shapes": {n: list(b.shape) for n, b in st.plan.buffers.items()
                           if b.role in ("input", "output") and b.shape is not None},
                "device": device_name, "segment": seg_of.get(info.index),
                "once_per_plan": info.index in once,
                "passes": [{"id": p["id"], "name": p["name"], "dispatch": p["dispatch"],
                            "once_per_plan": info.index in once or k < st.hoisted}
                           for k, p in enumerate(d["passes"])],
            })
        else:
            label = names.get(kind, kind)
            entry.update({"kernel": label, "variant": label, "derived": {}, "when": [], "selection": {},
                          "tunables": {}, "shapes": shapes_here,
                          "device": "host" if kind in ("host", "const", "fold") else
                          (device_name if kind == "view" else ""),
                          "segment": host_after.get(info.index), "passes": []})
        unit = fused_units.get(node.output[0]) if node.output else None
        entry["fused"] = None if unit is None else {"rule": unit.rule, "nodes": unit.labels()}
        out.append(entry)
    return out

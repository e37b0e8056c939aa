"""What ``onnx-quant explain`` prints: every node of the model as written, accounted for.

``Session.explain`` describes the nodes of the model the session runs: the construction phases
(rewrites.py) have folded BatchNormalization into its Conv (bn_folding.py) and fused node units
into one node each (qdq_fusion.py, dynamic_fusion.py, elementwise_fusion.py), and moved the nodes
after a NonZero into a region (data_dependent.py). Here each of those entries is matched with the
user's nodes it stands for (by the values they make), so a listing names every node of the model
as written once: as a kernel, folded or fused into one, a view, a constant, constant-folded,
unused, or on the host with the reason.

A node whose shapes are not known at the input shapes explain plans at is never called ``host``:
inference of the model as written at those shapes says which node they make invalid, and the
listing says which dims took defaults and which option gives the real ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import onnx

from . import data_dependent as dd

#: placement -> how a node that runs no kernel reads in the listing
NO_KERNEL_TEXT = {
    "view": "view: no kernel (reads its input's buffer as another shape)",
    "constant": "constant: no kernel (a Constant, uploaded once per session)",
    "folded": "constant-folded: no kernel (shape inference computes its value at these input shapes)",
    "unused": "unused: no graph output depends on it",
}
#: an unused node whose outputs are read: by nodes that need only what the plan already knows
NOT_RUN_TEXT = "not run: what reads it needs nothing of it at run time (the plan knows its value or shape)"
#: inference rules whose diagnostics at the planned shapes say nothing about a node's validity
IGNORED_RULES = frozenset({"output-type"})
#: diagnostics and node names shown in the "not planned" line before "and N more"
SHOWN_DIAGNOSTICS, SHOWN_NODES = 3, 6


def user_label(node: onnx.NodeProto, index: int) -> str:
    """A node's label as the session names nodes (its name, else ``op_index``)."""
    return node.name or f"{node.op_type}_{index}"


class _Accounts:
    """Which user nodes (by index in the model as written) each rewritten node stands for."""

    def __init__(self, user_model: onnx.ModelProto, session: Any) -> None:
        self.producer = {o: i for i, n in enumerate(user_model.graph.node) for o in n.output if o}
        #: first output -> the fused units whose node makes it (a unit's last node makes it too)
        self.units: dict[str, list[Any]] = {}
        for r in (session.fusion, session.dynamic_fusion, session.elementwise_fusion):
            for u in (r.units if r is not None else ()):
                self.units.setdefault(u.node.output[0], []).append(u)
        self.folded = {f.batch_norm: f.conv for f in session.folded_batch_norms}

    def members(self, node: onnx.NodeProto, depth: int = 0) -> list[int]:
        """The user nodes ``node`` stands for (itself, a fused unit's, a folded pair, a region's)."""
        if depth > 64:
            return []
        out0 = next((o for o in node.output if o), "")
        unit = next((u for u in self.units.get(out0, ()) if u.node == node), None)
        if unit is not None:
            return [m for n in unit.nodes for m in self.members(n, depth + 1)]
        if out0 in self.folded and node.op_type == "Conv":
            return [i for i in (self.producer.get(self.folded[out0]), self.producer.get(out0)) if i is not None]
        if dd.is_region(node.domain or "", node.op_type):
            body = next((a.g for a in node.attribute if a.name == "body"), None)
            return [m for n in (body.node if body is not None else ()) for m in self.members(n, depth + 1)]
        if out0.endswith(dd.ALL_SUFFIX):
            out0 = out0[: -len(dd.ALL_SUFFIX)]
        return [self.producer[out0]] if out0 in self.producer else []


def account(user_model: onnx.ModelProto, session: Any) -> tuple[list[list[int]], list[int]]:
    """(per node of the session's model: the user node indices it stands for, each claimed once;
    the user node indices no node stands for)."""
    acc = _Accounts(user_model, session)
    claimed: set[int] = set()
    per_node = []
    for node in session.model.graph.node:
        mine = sorted(i for i in dict.fromkeys(acc.members(node)) if i not in claimed)
        claimed |= set(mine)
        per_node.append(mine)
    return per_node, [i for i in range(len(user_model.graph.node)) if i not in claimed]


def shape_diagnostics(user_model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> list[Any]:
    """What inference of the model as written finds wrong at these input shapes and not with the
    declared (symbolic) ones: the nodes these shapes make invalid."""
    from onnx_quant.errors import QuantError  # noqa: PLC0415
    from ..inference.engine import infer  # noqa: PLC0415

    try:
        at = infer(user_model, input_shapes=dict(shapes), strict=False).diagnostics
        if not at:
            return []
        declared = {str(d) for d in infer(user_model, strict=False).diagnostics}
    except QuantError:  # a model the pass cannot walk: the session has said so already, or plans anyway
        return []
    # a graph output declared otherwise than computed is no invalid node: a session keeps what is
    # computed (as onnxruntime, which warns)
    return [d for d in at if str(d) not in declared and d.rule not in IGNORED_RULES]


@dataclass
class Row:
    """One listing entry: the session's explain entry and what it stands for."""

    entry: dict[str, Any]
    members: list[tuple[str, str]]            # (label, op type) of the user nodes, graph order
    folded: set[str] = field(default_factory=set)   # of their labels: BatchNormalization folded into a Conv
    status: str = ""                          # gpu, view, constant, constant_folded, unused, not_run, host, not_planned, ...
    text: str = ""                            # what follows "label (op): "

    @property
    def label(self) -> str:
        """The user's node name where the entry stands for one node, else the session's."""
        return self.members[0][0] if len(self.members) == 1 else self.entry["node"]


def _unknown_shape(entry: dict[str, Any]) -> bool:
    return any(v is None for v in entry.get("shapes", {}).values())


def _status(entry: dict[str, Any], invalid: bool, read: bool) -> tuple[str, str]:
    """(status, text) of an entry that runs no kernel of its own (``read``: a node or graph output
    reads one of its outputs)."""
    kind, why = entry["placement"], entry.get("reason") or ""
    if kind == "unused" and read:
        return "not_run", NOT_RUN_TEXT
    if kind in NO_KERNEL_TEXT:
        return ("constant_folded" if kind == "folded" else kind), NO_KERNEL_TEXT[kind]
    if kind == "host" and _unknown_shape(entry):
        if invalid:
            return "not_planned", "not planned: its shapes are not known at these input shapes (see 'not planned' above)"
        return "host", f"host at these input shapes, its shapes are not known before a run (input values decide them): {why}"
    if kind == "host":
        return "host", f"host (onnx.reference): {why}"
    return kind, f"{kind}: {why}" if why else kind


def build_rows(user_model: onnx.ModelProto, session: Any, entries: Sequence[dict[str, Any]],
               diagnostics: Sequence[Any]) -> tuple[list[Row], list[str]]:
    """(a Row per entry, "label (op)" of the user nodes no entry stands for)."""
    per_node, orphans = account(user_model, session)
    nodes = user_model.graph.node
    folded_bns = {f.batch_norm for f in session.folded_batch_norms}
    graph = session.model.graph
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    rows = []
    for entry, mine in zip(entries, per_node):
        row = Row(entry, [(user_label(nodes[i], i), nodes[i].op_type) for i in mine]
                  or [(entry["node"], entry["op_type"])])
        row.folded = {user_label(nodes[i], i) for i in mine if nodes[i].op_type == "BatchNormalization"
                      and any(o in folded_bns for o in nodes[i].output)}
        if entry["placement"] == "gpu":
            row.status, row.text = "gpu", f"kernel {entry['kernel']}, variant {entry['variant']}"
        else:
            outputs = [o for o in graph.node[len(rows)].output if o]
            row.status, row.text = _status(entry, bool(diagnostics), any(o in read for o in outputs))
        rows.append(row)
    return rows, [f"{user_label(nodes[i], i)} ({nodes[i].op_type})" for i in orphans]


# --------------------------------------------------------------------------- text


def _count(items: Sequence[str]) -> str:
    counts: dict[str, int] = {}
    for s in items:
        counts[s] = counts.get(s, 0) + 1
    return ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in counts.items())


def summary_lines(rows: Sequence[Row], orphans: Sequence[str], n_user: int, expanded: Sequence[Any] = ()) -> list[str]:
    """How the user's nodes became the entries below (``expanded``: function_expansion's Expanded
    records), and where the entries run."""
    many = [r for r in rows if len(r.members) > 1]
    folded = sum(len(r.folded) for r in rows)
    fused = [r for r in many if r.entry.get("fused")]
    parts = []
    if folded:
        parts.append(f"{folded} BatchNormalization folded into the Conv before it")
    if fused:
        n = sum(len(r.members) - len(r.folded) for r in fused)
        parts.append(f"{len(fused)} fused node{'s stand' if len(fused) > 1 else ' stands'} for {n}")
    if expanded:
        one = len(expanded) == 1
        parts.append(f"{len(expanded)} expanded into the {sum(e.body_nodes for e in expanded)} nodes of "
                     f"{'its ONNX function body' if one else 'their ONNX function bodies'}: "
                     f"{', '.join(f'{e.node} ({e.op_type})' for e in expanded)}")
    if orphans:
        parts.append(f"removed by the rewrites: {', '.join(orphans)}")
    line = f"nodes: {n_user} as written -> {len(rows)} below"
    return [line + (f" ({'; '.join(parts)})" if parts else ""),
            f"placement: {_count([r.status for r in rows])}"]


def not_planned_line(rows: Sequence[Row], diagnostics: Sequence[Any], binding: Any,
                     inputs: Sequence[Any]) -> str | None:
    """Which nodes cannot be planned at these input shapes, why, and the option that fixes it."""
    stuck = [r.label for r in rows if r.status == "not_planned"]
    if not diagnostics:
        return None
    shown = "; ".join(str(d) for d in diagnostics[:SHOWN_DIAGNOSTICS])
    more = f" and {len(diagnostics) - SHOWN_DIAGNOSTICS} more" if len(diagnostics) > SHOWN_DIAGNOSTICS else ""
    names = ", ".join(stuck[:SHOWN_NODES]) + (f" and {len(stuck) - SHOWN_NODES} more" if len(stuck) > SHOWN_NODES else "")
    head = (f"not planned at these input shapes: {len(stuck)} node(s) ({names}): " if stuck else
            "at these input shapes: ")
    line = f"{head}the shapes make the model as written invalid: {shown}{more}"
    if binding.defaulted:
        templates = [binding.shape_template(gi.name, gi.dims) for gi in inputs
                     if gi.dims is not None and any(
                         (d if isinstance(d, str) else f"{gi.name}[{a}]") in binding.defaulted
                         for a, d in enumerate(gi.dims) if not isinstance(d, int))]
        took = ", ".join(f"{k}={binding.values[k]}" for k in binding.defaulted)
        line += (f"; {took} took defaults: where the model needs other sizes, give them with "
                 f"{' '.join(templates)} (numbers in place of the names) or --dim SYMBOL=V")
    else:
        line += "; these are the shapes given: check them against the model"
    return line


def text_lines(rows: Sequence[Row], orphans: Sequence[str], user_model: onnx.ModelProto,
               diagnostics: Sequence[Any], binding: Any, inputs: Sequence[Any], expanded: Sequence[Any] = ()) -> list[str]:
    """The listing below the device line: the dims and input shapes planned at, the accounting of
    the user's nodes, what cannot be planned at these shapes, then every entry."""
    lines = [binding.dims_text()] + [f"input {k}: {list(v)}" for k, v in binding.shapes.items()]
    lines += summary_lines(rows, orphans, len(user_model.graph.node), expanded)
    lines.append(not_planned_line(rows, diagnostics, binding, inputs))
    for row in rows:
        lines += entry_lines(row)
    return [ln for ln in lines if ln]


def entry_lines(row: Row) -> list[str]:
    """The lines of one entry: the heading, what it stands for, and for a kernel its details."""
    e = row.entry
    lines = [f"{row.label} ({e['op_type']}): {row.text}"]
    if len(row.members) > 1:
        parts = [f"{m} ({op}{', folded' if m in row.folded else ''})" for m, op in row.members]
        how = f"fused ({e['fused']['rule']})" if e.get("fused") else "folded"
        lines.append(f"  {how}: {', '.join(parts)} -> {e['node']}")
    if row.status != "gpu":
        return lines
    lines.append("  shapes: " + ", ".join(f"{k} {v}" for k, v in e["shapes"].items()))
    if e["derived"]:
        lines.append("  decided by: " + ", ".join(f"{k}={v}" for k, v in e["derived"].items()))
    for vid, clause in e["selection"].items():
        state = "chosen" if vid == e["variant"] else ("applies" if clause is None else f"no: {clause}")
        lines.append(f"    {vid:<34} {state}")
    for p in e["passes"]:
        lines.append(f"  pass {p['id']:<10} {p['name']:<36} dispatch {p['dispatch']}")
    return lines


def json_entries(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """The entries for ``--json``: each with ``as_written`` (the user nodes it stands for) and, for
    a node not planned at these shapes, placement/kernel/variant ``not_planned``."""
    out = []
    for r in rows:
        e = dict(r.entry)
        e["as_written"] = [{"node": m, "op_type": op, "folded": m in r.folded} for m, op in r.members]
        if r.status == "not_planned":
            e.update(placement="not_planned", kernel="not_planned", variant="not_planned", reason=r.text)
        out.append(e)
    return out

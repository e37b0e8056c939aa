"""Rewrite passes: requires -> call -> :class:`PassResult` -> ensures, as onnx-ir's passes.

A :class:`RewritePass` turns a model (with its static values: name -> TensorInfo, the inference
pass's) into a new one. Calling it runs :meth:`~RewritePass.requires` (what the model must be for
the pass to apply; raises :class:`PassContractError`), :meth:`~RewritePass.call` (the rewrite: a
new ModelProto, never the given one changed) and :meth:`~RewritePass.ensures` (what the result
must be; raises :class:`PassContractError` naming the pass and the broken promise). Every pass
requires and ensures a well-formed top-level graph (:func:`graph_faults`: each value read is made
before, each value made once, every graph output made); each adds its own promises.

``rewrite_model`` (rewrites.py) runs the passes in sequence, each on the previous one's model and
static values (:meth:`~RewritePass.values_after`). Pure: no device, no Session.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import onnx

from onnx_quant.errors import QuantError

from .graph_index import subgraph_reads
from .model_check import static_values
from .verdict import written_node_rejects


class PassContractError(QuantError):
    """A pass's precondition (requires) or promise (ensures) does not hold: a bug of the pass or
    of the one before it, never of the user's model."""


@dataclass(frozen=True)
class PassResult:
    """What a pass made: the model (the given one when ``modified`` is False) and its report
    (what it did: the folded pairs, the fused units, the NonZeros split, with what it declined)."""

    model: onnx.ModelProto
    modified: bool
    report: Any = None


def graph_faults(model: onnx.ModelProto) -> list[str]:
    """What makes the top-level graph ill-formed (empty when it is not): a value read before any
    node makes it (and that is no graph input or initializer), a value made twice, a graph output
    nothing makes."""
    g = model.graph
    defined = {i.name for i in g.input} | {t.name for t in g.initializer}
    defined |= {s.values.name for s in g.sparse_initializer}
    faults: list[str] = []
    for i, n in enumerate(g.node):
        label = n.name or f"{n.op_type}_{i}"
        for x in list(n.input) + sorted(subgraph_reads(n)):
            if x and x not in defined:
                faults.append(f"node {label!r} reads {x!r} before any node makes it")
        for o in n.output:
            if o and o in defined:
                faults.append(f"node {label!r} makes {o!r}, which is already defined")
            defined.add(o)
    faults += [f"graph output {o.name!r} is made by no node" for o in g.output if o.name not in defined]
    return faults


class RewritePass:
    """One construction phase. Subclasses set ``name`` and implement :meth:`call`; they may add
    promises in :meth:`ensures` (calling this class's) and preconditions in :meth:`requires`."""

    name = "rewrite"

    def requires(self, model: onnx.ModelProto, values: Mapping[str, Any]) -> None:
        """Raise PassContractError unless the pass may run on ``model``: a well-formed graph."""
        self._check(graph_faults(model), "requires")

    def call(self, model: onnx.ModelProto, values: Mapping[str, Any]) -> PassResult:
        """The rewrite: a new model (or the given one, unmodified) and the pass's report."""
        raise NotImplementedError

    def ensures(self, model: onnx.ModelProto, result: PassResult) -> None:
        """Raise PassContractError unless ``result`` keeps the promises every pass makes: an
        unmodified result is the given model; a modified one is a new, well-formed model with the
        same graph inputs and outputs."""
        if not result.modified:
            self._check([] if result.model is model else ["the model is not the given one, though unmodified"],
                        "ensures")
            return
        faults = graph_faults(result.model)
        if result.model is model:
            faults.append("the given model was changed in place")
        if [o.name for o in result.model.graph.output] != [o.name for o in model.graph.output]:
            faults.append("the graph outputs changed")
        if [i.name for i in result.model.graph.input] != [i.name for i in model.graph.input]:
            faults.append("the graph inputs changed")
        self._check(faults, "ensures")

    def values_after(self, values: Mapping[str, Any], result: PassResult) -> dict[str, Any]:
        """The static values of a modified result's model (the inference pass over it)."""
        return static_values(result.model)

    def __call__(self, model: onnx.ModelProto, values: Mapping[str, Any]) -> PassResult:
        self.requires(model, values)
        result = self.call(model, values)
        self.ensures(model, result)
        return result

    def _check(self, faults: list[str], what: str) -> None:
        if faults:
            shown = "; ".join(faults[:3]) + (f"; and {len(faults) - 3} more" if len(faults) > 3 else "")
            raise PassContractError(f"pass {self.name}: {what} does not hold: {shown}")


def elem_lookup(values: Mapping[str, Any]) -> Callable[[str], int]:
    """``elem_of(name)``: a value's static element type (0 when unknown)."""

    def elem_of(name: str) -> int:
        info = values.get(name)
        return info.elem_type if info is not None else 0

    return elem_of


def kernel_check(specs: Any, values: Mapping[str, Any]) -> Callable[[onnx.NodeProto, str, int], str] | None:
    """``supported(node, domain, version)`` for the fusions: why no kernel of ``specs`` takes a node
    they would write, over the model's static types ('' if one does; a view needs none); None
    (every replacement accepted) without a registry."""
    return None if specs is None else written_node_rejects(specs, elem_lookup(values))


def unit_faults(model: onnx.ModelProto, units: Any, keep: Callable[[onnx.NodeProto], bool] = lambda n: False
                ) -> list[str]:
    """The promises of a fusion: every unit's fused node is in the model, and no node of a unit
    (but those ``keep`` allows: a DequantizeLinear other consumers still read) still makes a value
    there, save the fused node itself; the fused node's domain is imported."""
    made = {o: n for n in model.graph.node for o in n.output if o}
    domains = {(o.domain or "") for o in model.opset_import}
    faults = []
    for u in units:
        outs = [o for o in u.node.output if o]
        if not outs or made.get(outs[0]) != u.node:
            faults.append(f"the fused node {u.node.name or u.node.op_type!r} is not in the model")
        if (u.node.domain or "") not in domains and u.node.domain not in ("", "ai.onnx"):
            faults.append(f"domain {u.node.domain!r} of {u.node.op_type} is not imported")
        for m in u.nodes:
            if keep(m):
                continue
            stale = [o for o in m.output if o and o in made and o not in outs]
            if stale:
                faults.append(f"{m.op_type} {m.name or stale[0]!r} of a fused unit still makes {stale[0]!r}")
    return faults

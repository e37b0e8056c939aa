"""NonZero and NonMaxSuppression on the GPU: an output whose size the data decides, as one
documented sync.

A construction phase (:func:`split_model`, after the fusion phases) rewrites the model the Session runs:

* every *frontier* counted op (one that no other GPU counted op's output reaches) becomes the padded
  GPU form ``NonZero(X) -> (Y::nonzero_all, Y::nonzero_count)``: the kernel
  (templates/non_zero.kernel.json) writes the indices of Y row-major into a buffer allocated for
  ``[rank, numel(X)]`` (so a count beyond it cannot happen) and the count into an int64 ``[1]``;
  NonMaxSuppression (templates/non_max_suppression.kernel.json) likewise writes its selected
  ``[count, 3]`` rows into a buffer for ``[batches * classes * boxes, 3]`` (:data:`COUNT_AXIS`);
* the nodes that read Y, directly or through others (the *region*), move into the body of one
  ``onnx_quant.sync::DataDependent`` node that reads the padded outputs, the counts and the other
  values the region needs, and makes the graph outputs the region makes.

At run time the schedule cuts after the segment that ends with the NonZero (the region reads
the count on the host); the executor reads back the count (8 bytes, through the plan's staging
buffer) and :class:`~backend_wgpu.region.DataDependentRegion` (region.py) runs the region as a Session of its own on the same
device, fed Y as a :class:`DeviceValue` over the first ``rank * count`` elements of the padded
buffer and every other GPU-made value it reads as a view of its pooled buffer: nothing else
crosses to the host. The body session keys its plans on its input shapes, so on the count: a
count seen before replans nothing. A NonZero inside the region is the body session's own
frontier (its own sync). Costs: docs/backend.md, "Data-dependent sizes".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import onnx
from onnx import helper

from ..inference.context import TensorInfo
from .graph_index import concrete, free_names, subgraph_reads
from .passes import PassResult, RewritePass, elem_lookup
from .verdict import kernel_verdict

#: what placement says of NonZero's region
SYNC_WHY = ("data-dependent size: the host reads back NonZero's count, then the nodes that read its output "
            "run on the GPU as a session planned for that count")
REGION_DOMAIN = "onnx_quant.sync"
REGION_OP = "DataDependent"
ALL_SUFFIX = "::nonzero_all"
COUNT_SUFFIX = "::nonzero_count"
#: the ops whose output's size the data decides -> the axis of their padded output the count is
#: (NonZero: [rank, count]; NonMaxSuppression: [count, 3])
COUNT_AXIS = {"NonZero": 1, "NonMaxSuppression": 0}
#: the region node's attribute listing COUNT_AXIS of each padded output it reads, in order
COUNT_AXES_ATTR = "count_axes"


def is_region(domain: str, op_type: str) -> bool:
    return domain == REGION_DOMAIN and op_type == REGION_OP


def is_counted(node: onnx.NodeProto) -> bool:
    """A NonZero or NonMaxSuppression as written (its first input and output named)."""
    return (node.op_type in COUNT_AXIS and node.domain in ("", "ai.onnx") and bool(node.input)
            and bool(node.input[0]) and bool(node.output) and bool(node.output[0]))


def is_padded(node: onnx.NodeProto) -> bool:
    """A counted op in its padded form (two outputs: the result at capacity, the count)."""
    return (node.op_type in COUNT_AXIS and node.domain in ("", "ai.onnx") and len(node.output) == 2
            and node.output[1].endswith(COUNT_SUFFIX))


def capacity_shape(op_type: str, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The padded output's shape for these input shapes: a count beyond it cannot happen."""
    if op_type == "NonZero":
        return (len(shapes[0]), math.prod(shapes[0]))
    boxes, scores = shapes[0], shapes[1]  # NonMaxSuppression: [B, N, 4], [B, C, N]
    return (boxes[0] * scores[1] * boxes[1], 3)


@dataclass(frozen=True)
class PaddedNonZero:
    """One rewritten counted op (NonZero unless ``op`` says otherwise): its first input, its
    original output, the padded form's two outputs and the inputs its capacity is read from."""

    x: str
    y: str
    padded: str
    count: str
    op: str = "NonZero"
    inputs: tuple[str, ...] = ()


@dataclass
class SplitResult:
    model: onnx.ModelProto
    nonzeros: list[PaddedNonZero] = field(default_factory=list)
    #: output name of a NonZero left as written -> why the GPU form does not take it
    declined: dict[str, str] = field(default_factory=dict)


def _reads(node: onnx.NodeProto) -> set[str]:
    return {n for n in node.input if n} | subgraph_reads(node)


def split_model(model: onnx.ModelProto, rejects: Callable[[onnx.NodeProto], str]) -> SplitResult:
    """The model with its frontier NonZero nodes in their padded GPU form and the nodes that read
    their outputs moved into one region node (unchanged when there is none). ``rejects(node)``:
    why the GPU kernel does not take this (two-output) NonZero whatever the shapes ('' if it does)."""
    graph = model.graph
    tainted: set[str] = set()
    region: list[onnx.NodeProto] = []
    head: list[onnx.NodeProto] = []
    padded: list[PaddedNonZero] = []
    declined: dict[str, str] = {}
    for node in graph.node:
        if _reads(node) & tainted:
            region.append(node)
            tainted |= {o for o in node.output if o}
            continue
        if is_counted(node):
            y = node.output[0]
            form = onnx.NodeProto()
            form.CopyFrom(node)
            del form.output[:]
            form.output.extend([y + ALL_SUFFIX, y + COUNT_SUFFIX])
            why = rejects(form)
            if not why:
                padded.append(PaddedNonZero(node.input[0], y, form.output[0], form.output[1], node.op_type,
                                            tuple(node.input)))
                head.append(form)
                tainted.add(y)
                continue
            declined[y] = why
        head.append(node)
    if not padded:
        return SplitResult(model, declined=declined)
    ys = [p.y for p in padded]
    outputs = [o for o in graph.output if o.name in tainted]
    # the parent's weights and Constants the region reads go into the body (uploaded once there)
    inits = {t.name: t for t in graph.initializer}
    body_inits: list[onnx.TensorProto] = []
    consts: list[onnx.NodeProto] = []
    needed = set().union(*(_reads(n) for n in region)) if region else set()
    for name in sorted(needed & set(inits)):
        body_inits.append(inits[name])
    for node in head:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and set(node.output) & needed:
            consts.append(node)
    body = helper.make_graph(consts + region, "data_dependent_region", [], [], initializer=body_inits)
    for o in outputs:
        vi = onnx.ValueInfoProto()
        vi.CopyFrom(o)
        if vi.type.HasField("tensor_type"):
            vi.type.tensor_type.ClearField("shape")  # the body's plans decide the shapes
        body.output.append(vi)
    reads = ys + [n for n in free_names(body) if n not in ys]
    body.input.extend(onnx.ValueInfoProto(name=n) for n in reads)  # typed from the values at first run
    region_inputs = [n for p in padded for n in (p.padded, p.count)] + reads[len(ys):]
    sync = helper.make_node(REGION_OP, region_inputs, [o.name for o in outputs], name="data_dependent_region",
                            domain=REGION_DOMAIN, body=body)
    sync.attribute.append(helper.make_attribute(COUNT_AXES_ATTR, [COUNT_AXIS[p.op] for p in padded]))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(head + ([sync] if outputs else []))
    if not any(o.domain == REGION_DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(REGION_DOMAIN, 1))
    return SplitResult(out, padded, declined)


class SplitDataDependent(RewritePass):
    """NonZero's split as a pass, registry ``specs`` deciding which NonZero the GPU form takes
    (:func:`split_model`); its report is the :class:`SplitResult`. Requires: no region node yet
    (the split runs once per model). Ensures: each split NonZero makes its padded outputs and no
    node outside the region reads its output. The values after it: the inference pass over the
    new model, with what the region makes typed as the model as written types it."""

    name = "split_data_dependent"

    def __init__(self, specs: Any) -> None:
        self.specs = specs

    def requires(self, model: onnx.ModelProto, values: Mapping[str, Any]) -> None:
        super().requires(model, values)
        self._check([f"node {n.name!r} is a region already" for n in model.graph.node
                     if is_region(n.domain, n.op_type)], "requires")

    def call(self, model: onnx.ModelProto, values: Mapping[str, Any]) -> PassResult:
        opsets = {(imp.domain or ""): imp.version for imp in model.opset_import}
        version = opsets.get("", opsets.get("ai.onnx", 0))
        elem_of = elem_lookup(values)

        def rejects(node: onnx.NodeProto) -> str:
            info = values.get(node.input[0])
            spec, why = kernel_verdict(self.specs, node, "", version, elem_of)
            if spec is not None and node.op_type == "NonZero" and info is not None and info.shape is not None \
                    and len(info.shape) == 0:
                return "the input's rank is 0 (a scalar's indices: [0, count] for ONNX's inference, [1, count] for numpy)"
            return why

        result = split_model(model, rejects)
        return PassResult(result.model, bool(result.nonzeros), result)

    def ensures(self, model: onnx.ModelProto, result: PassResult) -> None:
        super().ensures(model, result)
        made = {o: n for n in result.model.graph.node for o in n.output if o}
        faults = [f"{p.op} {p.y!r} does not make {p.padded!r} and {p.count!r}" for p in result.report.nonzeros
                  if made.get(p.padded) is None or list(made[p.padded].output) != [p.padded, p.count]]
        ys = {p.y for p in result.report.nonzeros}
        faults += [f"node {n.name or n.op_type!r} reads {x!r} outside the region" for n in result.model.graph.node
                   for x in _reads(n) & ys if not is_region(n.domain, n.op_type)]
        self._check(faults, "ensures")

    def values_after(self, values: Mapping[str, Any], result: PassResult) -> dict[str, Any]:
        after = super().values_after(values, result)
        for name, info in values.items():  # what the region makes: as the model as written types it
            known = after.get(name)
            if known is None or not known.elem_type or known.shape is None:
                after[name] = info
        return after


def capacity_values(nonzeros: list[PaddedNonZero], values: dict[str, Any]) -> None:
    """Inference's values completed for the padded outputs: their :func:`capacity_shape` and
    ``[1]``, int64 (inference sees a two-output op it does not know), where the shapes it is read
    from are known."""
    for p in nonzeros:
        names = (p.inputs or (p.x,))[:1 if p.op == "NonZero" else 2]
        shapes = [concrete(None if values.get(n) is None else values[n].shape) for n in names]
        if any(s is None for s in shapes):
            continue  # the kernel cannot be planned: the node runs on the host (HostPadded)
        values[p.padded] = TensorInfo(onnx.TensorProto.INT64, capacity_shape(p.op, shapes))
        values[p.count] = TensorInfo(onnx.TensorProto.INT64, (1,))

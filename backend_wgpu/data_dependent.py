"""NonZero, NonMaxSuppression and Unique on the GPU: outputs whose size the data decides, as one
documented sync.

A construction phase (:func:`split_model`, after the fusion phases) rewrites the model the Session runs:

* every *frontier* counted op (one that no other GPU counted op's output reaches) becomes the padded
  GPU form ``NonZero(X) -> (Y::nonzero_all, Y::nonzero_count)``: the kernel
  (templates/non_zero.kernel.json) writes the indices of Y row-major into a buffer allocated for
  ``[rank, numel(X)]`` (so a count beyond it cannot happen) and the count into an int64 ``[1]``;
  NonMaxSuppression (templates/non_max_suppression.kernel.json) likewise writes its selected
  ``[count, 3]`` rows into a buffer for ``[batches * classes * boxes, 3]`` (:data:`COUNT_AXIS`);
  Unique (templates/unique.kernel.json) writes Y, indices and counts at capacity (X's rows along
  its axis, or its elements) and one count they share, inverse_indices (fixed: one per row) as
  written: its padded form keeps the four outputs' positions, each counted one renamed, and the
  count after them (:func:`counted_outputs`);
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
#: the single-output ops whose output's size the data decides -> the axis of their padded output
#: the count is (NonZero: [rank, count]; NonMaxSuppression: [count, 3])
COUNT_AXIS = {"NonZero": 1, "NonMaxSuppression": 0}
#: every op with a padded form: COUNT_AXIS's and Unique (three counted outputs: counted_outputs)
COUNTED_OPS = frozenset(COUNT_AXIS) | {"Unique"}
#: Unique's axis attribute absent (its kernel's sentinel: templates/unique.kernel.json)
NO_AXIS = 2147483647
#: the region node's attribute listing the count axis of each padded output it reads, in order
COUNT_AXES_ATTR = "count_axes"


def is_region(domain: str, op_type: str) -> bool:
    return domain == REGION_DOMAIN and op_type == REGION_OP


def is_counted(node: onnx.NodeProto) -> bool:
    """A NonZero, NonMaxSuppression or Unique as written (its first input and output named)."""
    return (node.op_type in COUNTED_OPS and node.domain in ("", "ai.onnx") and bool(node.input)
            and bool(node.input[0]) and bool(node.output) and bool(node.output[0]))


def is_padded(node: onnx.NodeProto) -> bool:
    """A counted op in its padded form (its results, the counted ones at capacity, then the count)."""
    return (node.op_type in COUNTED_OPS and node.domain in ("", "ai.onnx") and len(node.output) >= 2
            and node.output[-1].endswith(COUNT_SUFFIX))


def unique_axis(node: onnx.NodeProto, rank: int | None) -> int | None:
    """Unique's axis as numpy.unique takes it: None for the flattened input (no axis, or a rank-1
    input, numpy's 1-D path); -1 where the rank is unknown and the axis negative or out of range."""
    axis = next((a.i for a in node.attribute if a.name == "axis"), NO_AXIS)
    if axis == NO_AXIS:
        return None
    if rank is None:
        return -1 if axis < 0 else axis
    if not -rank <= axis < rank:
        return -1
    return None if rank == 1 else axis % rank


def counted_outputs(node: onnx.NodeProto, rank: int | None = None) -> list[tuple[int, int]]:
    """(output position, the axis its count is) of each output the data sizes: NonZero's
    ``[rank, count]``, NonMaxSuppression's ``[count, 3]``, Unique's Y (along its axis, or the
    flattened elements), indices and counts (``rank``: X's, where Unique's axis needs it)."""
    if node.op_type != "Unique":
        return [(0, COUNT_AXIS[node.op_type])]
    axis = unique_axis(node, rank)
    return [(0, 0 if axis is None else axis), (1, 0), (3, 0)]


def capacity_shapes(node: onnx.NodeProto, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The padded outputs' shapes for these input shapes (those of :func:`counted_outputs`, in
    order): a count beyond them cannot happen."""
    if node.op_type == "NonZero":
        return [(len(shapes[0]), math.prod(shapes[0]))]
    if node.op_type == "NonMaxSuppression":
        boxes, scores = shapes[0], shapes[1]  # [B, N, 4], [B, C, N]
        return [(boxes[0] * scores[1] * boxes[1], 3)]
    x = shapes[0]
    axis = unique_axis(node, len(x))
    rows = math.prod(x) if axis is None else x[axis]
    return [tuple(x) if axis is not None else (rows,), (rows,), (rows,)]


@dataclass(frozen=True)
class PaddedNonZero:
    """One rewritten counted op (NonZero unless ``op`` says otherwise): its first input, its
    original (first) output, the padded form's first output and count, the inputs its capacity is
    read from, and per counted output (original name, padded name, count axis): ``counted``,
    ``((y, padded, axis),)`` where not given."""

    x: str
    y: str
    padded: str
    count: str
    op: str = "NonZero"
    inputs: tuple[str, ...] = ()
    counted: tuple[tuple[str, str, int], ...] = ()
    #: the padded form as the kernel takes it (its attributes: Unique's axis decides its capacity)
    form: onnx.NodeProto | None = None

    def outputs(self) -> tuple[tuple[str, str, int], ...]:
        return self.counted or ((self.y, self.padded, COUNT_AXIS.get(self.op, 1)),)


@dataclass
class SplitResult:
    model: onnx.ModelProto
    nonzeros: list[PaddedNonZero] = field(default_factory=list)
    #: output name of a NonZero left as written -> why the GPU form does not take it
    declined: dict[str, str] = field(default_factory=dict)


def _reads(node: onnx.NodeProto) -> set[str]:
    return {n for n in node.input if n} | subgraph_reads(node)


def padded_form(node: onnx.NodeProto) -> onnx.NodeProto:
    """The counted op's padded form: its outputs in their positions (Unique's four), each counted one
    renamed ``<name>::nonzero_all``, then the count ``<first output>::nonzero_count``."""
    form = onnx.NodeProto()
    form.CopyFrom(node)
    del form.output[:]
    names = list(node.output) + [""] * ((4 if node.op_type == "Unique" else 1) - len(node.output))
    counted = {k for k, _ in counted_outputs(node, 2)}  # the positions: the axis is not needed here
    form.output.extend([n + ALL_SUFFIX if k in counted and n else n for k, n in enumerate(names)]
                       + [node.output[0] + COUNT_SUFFIX])
    return form


def _order_rejects(node: onnx.NodeProto) -> str:
    """Unique with sorted=0 whose only optional outputs are empty names: onnx.reference orders Y by
    first occurrence when the node has more than one output (it counts the names), the kernel when
    one of indices, inverse_indices, counts is present."""
    ordered = next((a.i for a in node.attribute if a.name == "sorted"), 1)
    if node.op_type == "Unique" and ordered == 0 and len(node.output) > 1 and not any(node.output[1:]):
        return "sorted=0 with only empty optional outputs (onnx.reference's order counts the names)"
    return ""


def split_model(model: onnx.ModelProto, rejects: Callable[[onnx.NodeProto], str],
                rank_of: Callable[[str], int | None] = lambda _: None) -> SplitResult:
    """The model with its frontier counted nodes in their padded GPU form and the nodes that read
    their counted outputs moved into one region node (unchanged when there is none). ``rejects(node)``:
    why the GPU kernel does not take this padded form whatever the shapes ('' if it does);
    ``rank_of(name)``: a value's rank where known (Unique's negative axis needs X's)."""
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
            form = padded_form(node)
            outs = counted_outputs(node, rank_of(node.input[0]))
            why = rejects(form) or ("the axis is out of range, or negative for an input of unknown rank"
                                    if any(axis < 0 for _, axis in outs) else _order_rejects(node))
            if not why:
                counted = tuple((node.output[k], form.output[k], axis) for k, axis in outs
                                if k < len(node.output) and node.output[k])
                padded.append(PaddedNonZero(node.input[0], y, form.output[0], form.output[-1], node.op_type,
                                            tuple(node.input), counted, form))
                head.append(form)
                tainted |= {c[0] for c in counted}
                continue
            declined[y] = why
        head.append(node)
    if not padded:
        return SplitResult(model, declined=declined)
    ys = [c[0] for p in padded for c in p.outputs()]
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
    region_inputs = [n for p in padded for c in p.outputs() for n in (c[1], p.count)] + reads[len(ys):]
    sync = helper.make_node(REGION_OP, region_inputs, [o.name for o in outputs], name="data_dependent_region",
                            domain=REGION_DOMAIN, body=body)
    sync.attribute.append(helper.make_attribute(COUNT_AXES_ATTR, [c[2] for p in padded for c in p.outputs()]))
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

        def rank_of(name: str) -> int | None:
            info = values.get(name)
            return None if info is None or info.shape is None else len(info.shape)

        result = split_model(model, rejects, rank_of)
        return PassResult(result.model, bool(result.nonzeros), result)

    def ensures(self, model: onnx.ModelProto, result: PassResult) -> None:
        super().ensures(model, result)
        made = {o: n for n in result.model.graph.node for o in n.output if o}
        faults = [f"{p.op} {p.y!r} does not make {p.padded!r} and {p.count!r}" for p in result.report.nonzeros
                  if made.get(p.padded) is None or made[p.padded].output[-1] != p.count
                  or any(made.get(c[1]) is not made[p.padded] for c in p.outputs())]
        ys = {c[0] for p in result.report.nonzeros for c in p.outputs()}
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
    """Inference's values completed for the padded outputs: their :func:`capacity_shapes` (int64,
    Unique's Y typed as its X) and the count's ``[1]`` (inference sees an op whose outputs it does
    not know), where the shapes they are read from are known."""
    for p in nonzeros:
        names = (p.inputs or (p.x,))[:2 if p.op == "NonMaxSuppression" else 1]
        shapes = [concrete(None if values.get(n) is None else values[n].shape) for n in names]
        if any(s is None for s in shapes):
            continue  # the kernel cannot be planned: the node runs on the host (HostPadded)
        form = p.form or helper.make_node(p.op, list(p.inputs or (p.x,)), [p.padded, p.count])
        caps = capacity_shapes(form, shapes)
        positions = [k for k, _ in counted_outputs(form, len(shapes[0]))]
        for k, cap in zip(positions, caps):
            name = form.output[k] if k < len(form.output) else ""
            if name:
                elem = values[p.x].elem_type if p.op == "Unique" and k == 0 else onnx.TensorProto.INT64
                values[name] = TensorInfo(elem, cap)
        values[p.count] = TensorInfo(onnx.TensorProto.INT64, (1,))

"""Placement: which node runs where, decided once, in two stages of one rule.

* :func:`classify` (once per model, at construction: the rewritten model's static types and the
  kernel registry's verdict, ``SpecRegistry.verdict`` = verdict.kernel_verdict) gives each node a
  :class:`NodeInfo`: a Constant (``const``), NonZero's region (``sync``: data_dependent.py), an If / Loop / Scan
  (``control``: control_flow.py), a view of its input (``view``: Reshape, Flatten, Squeeze,
  Unsqueeze, Identity, Dropout in inference mode), a kernel spec that takes it (``gpu``), or the host
  (``host``, with the reason);
* :func:`place` (per binding of input shapes: inference's values) completes it: a value inference
  computed (``fold``: shape arithmetic on small integers), a view that holds at these shapes, else
  what construction decided. Kernel planning (graph_plan.py) may still send a ``gpu`` node to the
  host when no variant takes its shapes.

:func:`live_nodes` / :func:`static_live` say which nodes some graph output depends on;
:func:`placement_report` what ran where and why (``explain``); :func:`check_overrides` that the
tunables and variants a caller gives name nodes and kernels of the model. Pure: node protos,
values, spec objects; no device, no Session.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from onnx_quant.dtypes import element_type, type_name
from onnx_quant.errors import ExecutionError

from . import data_dependent as dd
from .control_flow import CONTROL_WHY, is_control
from .graph_index import attributes, concrete, subgraph_reads, with_nested
from .sequences import SEQUENCE_WHY, host_reads, is_sequence_step
from .verdict import DEFAULT_DOMAINS, VIEW_OPS, kernel_verdict, onnx_type, op_text

#: ops whose integer outputs are folded into the plan when shape inference computed them
#: (shape arithmetic: Shape -> Gather -> Concat -> Reshape and the like)
FOLD_OPS = frozenset({
    "Shape", "Size", "Gather", "Concat", "Slice", "Squeeze", "Unsqueeze", "Reshape", "Flatten",
    "Identity", "Cast", "Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Neg", "Abs", "Range", "ConstantOfShape",
    "Expand", "Split", "Transpose", "Tile", "Equal", "Less", "Greater", "Where", "Not", "And", "Or",
    "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin", "SequenceLength", "OptionalHasElement",
})
FOLD_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL})

#: the kinds run as a step of the host schedule (plan.HostStep) rather than a kernel's passes
HOST_KINDS = frozenset({"host", "control", "sync", "sequence"})

#: what placement_report says of a node that runs no kernel
PLACEMENT_WHY = {"view": "a view of its input's buffer", "const": "a Constant, uploaded once per session",
                 "control": CONTROL_WHY, "sync": dd.SYNC_WHY, "sequence": SEQUENCE_WHY,
                 "fold": "computed by shape inference for these input shapes",
                 "unused": "no graph output depends on it"}


@dataclass(frozen=True)
class NodeInfo:
    """A node and what construction decided about it (:func:`classify`): the static part of its
    placement, which :func:`place` completes per binding of input shapes."""

    index: int
    label: str
    node: onnx.NodeProto
    domain: str
    version: int
    spec: Any                 # the KernelSpec that takes the node, or None
    kind: str                 # "gpu" | "host" | "view" | "const" | "control" (If / Loop: control_flow.py)
    #                           | "sync" (NonZero's region: data_dependent.py)
    #                           | "sequence" (a list operation over device values: sequences.py)
    reason: str               # why not "gpu" (empty for gpu nodes)
    implicit: tuple[str, ...]  # outer-scope names its subgraphs read
    #: a "sync" / "sequence" step's inputs read on the host (NonZero's counts, positions); its other
    #: GPU-made inputs stay on the device
    host_reads: tuple[str, ...] = ()



@dataclass(frozen=True)
class Placement:
    """Phase 1's result: per node index its kind and why it is not on the GPU, and the values
    folded per node."""

    kinds: dict[int, str]
    reasons: dict[int, str]
    folded_by_node: dict[int, dict[str, np.ndarray]]


def node_label(node: onnx.NodeProto, index: int) -> str:
    """A node's label: its name, else ``op_index``."""
    return node.name or f"{node.op_type}_{index}"


def op_name(info: NodeInfo) -> str:
    """The node's op as messages name it (``domain::op`` outside the default domain)."""
    return op_text(info.domain, info.node.op_type)


# ----------------------------------------------------------------------------- construction


@dataclass(frozen=True)
class ModelFacts:
    """What :func:`classify` reads besides the nodes: the rewritten model's static values, the
    kernel registry, the fused units (output -> unit as written), NonZeros the split declined
    (output -> why) and the initializers' arrays."""

    static_values: Mapping[str, Any]
    specs: Any
    fused_units: Mapping[str, Any]
    nonzero_declined: Mapping[str, str]
    initializers: Mapping[str, np.ndarray]

    def elem(self, name: str) -> int:
        info = self.static_values.get(name)
        return info.elem_type if info is not None else 0


def classify(model: onnx.ModelProto, facts: ModelFacts) -> list[NodeInfo]:
    """Every node's :class:`NodeInfo`, in graph order. Raises ExecutionError for a node whose
    domain the model imports no opset of, or with an attribute its operator does not have."""
    opsets = {(imp.domain or ""): imp.version for imp in model.opset_import}
    return [classify_node(i, node, opsets, facts) for i, node in enumerate(model.graph.node)]


def classify_node(index: int, node: onnx.NodeProto, opsets: Mapping[str, int], facts: ModelFacts) -> NodeInfo:
    """One node's construction-time placement (see the module's list)."""
    label = node_label(node, index)
    domain = node.domain or ""
    version = opsets.get(domain, opsets.get("ai.onnx" if domain == "" else domain))
    if version is None:
        raise ExecutionError(f"node {label!r} ({node.op_type}): the model imports no opset for domain "
                             f"{domain or 'ai.onnx'!r}")
    check_attribute_names(label, node, domain, version)
    implicit = subgraph_reads(node)
    unit = facts.fused_units.get(node.output[0]) if node.output else None
    if unit is not None:  # what the unit as written reads besides the fused node's inputs (host fallback)
        implicit |= set(unit.reads()) - set(node.input)
    implicit = tuple(sorted(implicit))
    spec, reason = kernel_verdict(facts.specs, node, domain, version, facts.elem)
    if domain in DEFAULT_DOMAINS and node.op_type == "Constant":
        return NodeInfo(index, label, node, domain, version, None, "const", "a constant", implicit)
    if is_sequence_step(domain, node.op_type, node, facts.static_values):
        return NodeInfo(index, label, node, domain, version, None, "sequence", SEQUENCE_WHY, implicit,
                        host_reads(node))
    if dd.is_region(domain, node.op_type):
        return NodeInfo(index, label, node, domain, version, None, "sync", dd.SYNC_WHY, implicit,
                        tuple(dict.fromkeys(n for n in node.input if n.endswith(dd.COUNT_SUFFIX))))
    if is_control(domain, node.op_type, version):
        return NodeInfo(index, label, node, domain, version, None, "control", CONTROL_WHY, implicit)
    if domain in DEFAULT_DOMAINS and node.op_type in VIEW_OPS:
        why = static_view_rejects(node, facts)
        if why is None:
            return NodeInfo(index, label, node, domain, version, None if reason else spec, "view", reason, implicit)
        if reason:
            reason = f"{why}; {reason}"
    if domain in DEFAULT_DOMAINS and node.op_type in dd.COUNTED_OPS and node.output and \
            node.output[0] in facts.nonzero_declined:
        reason = facts.nonzero_declined[node.output[0]]  # not the padded form's missing count output
    if reason:
        return NodeInfo(index, label, node, domain, version, None, "host", reason, implicit)
    return NodeInfo(index, label, node, domain, version, spec, "gpu", "", implicit)


def check_attribute_names(label: str, node: onnx.NodeProto, domain: str, version: int) -> None:
    """An attribute the operator does not have (per onnx.defs) makes the model invalid."""
    try:
        schema = onnx.defs.get_schema(node.op_type, version, domain)
    except Exception:
        return  # an op onnx does not know (custom domain): nothing to check against
    for a in node.attribute:
        if a.name not in schema.attributes:
            raise ExecutionError(f"node {label!r} ({node.op_type}): attribute {a.name!r} is not an attribute of "
                                 f"{node.op_type}-{schema.since_version} (attributes: "
                                 f"{', '.join(sorted(schema.attributes)) or 'none'})")


def static_view_rejects(node: onnx.NodeProto, facts: ModelFacts) -> str | None:
    """Why a view op cannot be a view whatever the shapes (None if it may be one)."""
    if not node.input or not node.input[0] or not node.output or not node.output[0]:
        return "no data input or output"
    if node.op_type == "Dropout":
        if len(node.output) > 1 and node.output[1]:
            return "Dropout's mask output is used"
        if len(node.input) > 2 and node.input[2]:
            mode = facts.initializers.get(node.input[2])
            if mode is None:
                info = facts.static_values.get(node.input[2])
                mode = None if info is None else info.value
            if mode is None or np.asarray(mode).dtype.kind == "O" or bool(np.asarray(mode).reshape(-1)[0]):
                return "Dropout may run in training mode"
        if any(a.name == "is_test" and a.i == 0 for a in node.attribute):
            return "Dropout runs in training mode (is_test=0)"
    return None


def static_live(nodes: Sequence[NodeInfo], outputs: Sequence[str]) -> set[int]:
    """Nodes some graph output may depend on, whatever the shapes (all inputs count)."""
    needed = set(outputs)
    live: set[int] = set()
    for info in reversed(nodes):
        if any(o in needed for o in info.node.output if o):
            live.add(info.index)
            needed |= {i for i in info.node.input if i} | set(info.implicit)
    return live


# ----------------------------------------------------------------------------- per binding


def may_fold(info: NodeInfo, elem_of: Callable[[str], int]) -> bool:
    """Whether plans may compute the node's outputs by shape inference (small integers)."""
    outs = [o for o in info.node.output if o]
    return (info.domain in DEFAULT_DOMAINS and info.node.op_type in FOLD_OPS and bool(outs)
            and all(elem_of(o) in FOLD_TYPES for o in outs))


def folded_outputs(info: NodeInfo, values: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
    """The node's outputs, when shape inference computed them as small integer constants."""
    node = info.node
    if info.domain not in DEFAULT_DOMAINS or node.op_type not in FOLD_OPS:
        return None
    outs = [o for o in node.output if o]
    if not outs:
        return None
    folded = {}
    for o in outs:
        v = values.get(o)
        if v is None or v.elem_type not in FOLD_TYPES or v.value is None:
            if node.op_type in ("Shape", "Size") and v is not None:
                computed = shape_value(node, values)
                if computed is not None:
                    folded[o] = computed
                    continue
            return None
        arr = np.asarray(v.value)
        if arr.dtype.kind == "O" or concrete(v.shape) is None or tuple(arr.shape) != concrete(v.shape):
            return None
        folded[o] = arr.astype(element_type(v.elem_type).dtype)
    return folded


def shape_value(node: onnx.NodeProto, values: Mapping[str, Any]) -> np.ndarray | None:
    """Shape / Size of an input whose shape is concrete for this binding."""
    src = values.get(node.input[0]) if node.input else None
    shape = concrete(None if src is None else src.shape)
    if shape is None:
        return None
    if node.op_type == "Size":
        return np.array(math.prod(shape), dtype=np.int64)
    attrs = attributes(node)
    r = len(shape)
    start, end = int(attrs.get("start", 0)), attrs.get("end")
    end = r if end is None else int(end)
    start, end = (start + r if start < 0 else start), (end + r if end < 0 else end)
    start, end = min(max(start, 0), r), min(max(end, 0), r)
    return np.array(shape[start:end], dtype=np.int64)


def view_rejects(info: NodeInfo, values: Mapping[str, Any]) -> str | None:
    """Why a view op cannot be a view of its input's buffer here (None: it can)."""
    src, dst = values.get(info.node.input[0]), values.get(info.node.output[0])
    if src is None or dst is None or not src.elem_type or src.elem_type != dst.elem_type:
        return "input and output element types differ or are unknown"
    s_in, s_out = concrete(src.shape), concrete(dst.shape)
    if s_in is None or s_out is None:
        return "shapes are not known for these input shapes"
    if math.prod(s_in) != math.prod(s_out):
        return f"{list(s_in)} and {list(s_out)} hold different numbers of elements"
    if onnx_type(src.elem_type) is None:
        return f"element type {type_name(src.elem_type)} has no device layout"
    return None


def place(nodes: Sequence[NodeInfo], values: Mapping[str, Any]) -> Placement:
    """Per node, its placement at this binding (``values``: inference's TensorInfo per value):
    ``const`` stays; ``fold`` where inference computed the node's small integer outputs; a view
    that holds at these shapes (else the node's kernel, or the host saying why not a view); else
    what :func:`classify` decided."""
    kinds: dict[int, str] = {}
    reasons: dict[int, str] = {}
    folded_by_node: dict[int, dict[str, np.ndarray]] = {}
    for info in nodes:
        if info.kind == "const":
            kinds[info.index] = "const"
            continue
        fv = folded_outputs(info, values)
        if fv is not None:
            kinds[info.index] = "fold"
            folded_by_node[info.index] = fv
            continue
        if info.kind == "view":
            why = view_rejects(info, values)
            if why is None:
                kinds[info.index] = "view"
                continue
            kinds[info.index] = "gpu" if info.spec is not None else "host"
            reasons[info.index] = why if info.spec is not None else f"not a view: {why}; {info.reason}"
            continue
        kinds[info.index] = info.kind
        reasons[info.index] = info.reason
    return Placement(kinds, reasons, folded_by_node)


def live_nodes(nodes: Sequence[NodeInfo], kinds: Mapping[int, str], outputs: Sequence[str]) -> set[int]:
    """Nodes some graph output depends on (folded and constant nodes read nothing at run time)."""
    needed = set(outputs)
    live: set[int] = set()
    for info in reversed(nodes):
        if not any(o in needed for o in info.node.output if o):
            continue
        live.add(info.index)
        k = kinds[info.index]
        if k in ("const", "fold"):
            continue
        if k == "view":
            needed.add(info.node.input[0])
            continue
        needed |= {i for i in info.node.input if i} | set(info.implicit)
    return live


def placement_report(nodes: Sequence[NodeInfo], kinds: Mapping[int, str], live: set[int],
                     reasons: Mapping[int, str]) -> dict[int, tuple[str, str]]:
    """Per node index: (kind, why) — kind ``unused`` for nodes no output depends on; why is
    empty for GPU nodes."""
    out: dict[int, tuple[str, str]] = {}
    for info in nodes:
        k = kinds[info.index] if info.index in live else "unused"
        why = PLACEMENT_WHY.get(k, reasons.get(info.index, ""))
        out[info.index] = (k, why if k != "gpu" else "")
    return out


# ----------------------------------------------------------------------------- options


def check_overrides(nodes: Sequence[NodeInfo], specs: Any, opsets: Mapping[str, int],
                    tunables: Mapping[str, Any], variants: Mapping[str, str]) -> None:
    """ExecutionError unless every key of ``variants`` and every per-node key of ``tunables`` names
    a node (or op type) of the model, or of its bodies (whose sessions check it), that has a
    kernel, with tunables its kernel has; and every global tunable is an int some kernel of the
    model (or of its bodies) has."""
    names = {i.label for i in nodes} | {i.node.op_type for i in nodes}
    # the nodes of the bodies (If / Loop / Scan, NonZero's region): their sessions check what names them
    nested = with_nested([n for i in nodes for a in i.node.attribute
                          for n in list(a.g.node) + [m for g in a.graphs for m in g.node]])
    names_nested = {n.name for n in nested} | {n.op_type for n in nested}
    by_key: dict[str, list[NodeInfo]] = {}
    for i in nodes:
        by_key.setdefault(i.label, []).append(i)
        by_key.setdefault(i.node.op_type, []).append(i)
    for key in variants:
        if key in names_nested - names:
            continue
        if key not in names:
            raise ExecutionError(f"variants: {key!r} is neither a node name nor an op type of this model "
                                 f"(nodes/ops: {', '.join(sorted(names))})")
        nokernel = [i.label for i in by_key[key] if i.spec is None]
        if nokernel:
            raise ExecutionError(f"variants: {key!r}: node(s) {nokernel} have no GPU kernel to force a variant of")
    _check_node_tunables(tunables, names, names_nested, by_key)
    global_tun = {k: v for k, v in tunables.items() if not isinstance(v, Mapping)}
    known = {t for i in nodes if i.spec is not None for t in i.spec.tunables}
    known |= {t for n in nested for spec in [specs.find(n.domain or "", n.op_type, opsets.get(n.domain or "", 0))]
              if spec is not None for t in spec.tunables}
    unknown = sorted(set(global_tun) - known)
    if unknown and any(i.spec is not None for i in nodes):
        raise ExecutionError(f"tunables {unknown}: no kernel of this model has them (known: {sorted(known)})")
    for key, v in global_tun.items():
        if not isinstance(v, int) or isinstance(v, bool):
            raise ExecutionError(f"tunables: {key} must be an int, found {type(v).__name__} {v!r}")


def _check_node_tunables(tunables: Mapping[str, Any], names: set[str], names_nested: set[str],
                         by_key: Mapping[str, list[NodeInfo]]) -> None:
    """The per-node tunables (``{node or op: {name: int}}``) name kernels of the model that have them."""
    for key, v in tunables.items():
        if not isinstance(v, Mapping) or key in names_nested - names:
            continue
        if key not in names:
            raise ExecutionError(f"tunables: {key!r} is neither a node name nor an op type of this model")
        for i in by_key[key]:
            if i.spec is None:
                raise ExecutionError(f"tunables: {key!r}: node {i.label!r} has no GPU kernel")
            unknown = sorted(set(v) - set(i.spec.tunables))
            if unknown:
                raise ExecutionError(f"tunables for {key!r}: kernel {i.spec.name} has no tunables {unknown} "
                                     f"(known: {sorted(i.spec.tunables)})")


def node_overrides(info: NodeInfo, tunables: Mapping[str, Any], variants: Mapping[str, str]
                   ) -> tuple[dict[str, int], str | None]:
    """The tunables (global ones the node's kernel has, then its op type's, then its own) and the
    forced variant (its own, else its op type's) of a GPU node."""
    spec = info.spec
    tun = {k: v for k, v in tunables.items() if not isinstance(v, Mapping) and k in spec.tunables}
    for key in (info.node.op_type, info.label):
        v = tunables.get(key)
        if isinstance(v, Mapping):
            tun.update(v)
    variant = variants.get(info.label, variants.get(info.node.op_type))
    return tun, variant

"""The graph compiler: :func:`compile`, a pure function from the rewritten model (with what
construction decided of each node), the device's facts (limits and features as plain data, never a
live device) and the options to a frozen :class:`~onnx_quant.backend_wgpu.plan.GraphPlan` for one
binding of input shapes, plus the host-fallback decisions as data. No Session, no device: every
phase is a function over plain data, tested on the CPU (tests/backend/test_graph_plan.py,
test_compile.py). ``Session`` keeps the plan cache and the warn-or-refuse policy; the executor
(executor.py) prepares and runs the plan; neither this module nor the executor imports the other.

The phases, in the order :func:`compile` runs them:

0. :func:`infer_binding` — inference fixes every value's type and shape for the binding (for a
   run, the user's model inferred strictly where values stay unknown: :func:`check_shapes_fit`);
   :func:`value_keyed_inputs` — the small integer graph inputs whose contents the plan needs (the
   plan is then keyed on their values and inference folds what follows from them);
1. :func:`placement.place` — per node: constant, folded, view, or what construction decided;
2. :func:`placement.live_nodes` — only nodes some graph output depends on run;
3. :func:`plan_kernels` — the planner per live GPU node (a node no variant takes goes to the host,
   a :class:`HostNode` with ``declined``);
4. :func:`value_roots` — every value a buffer holds (its *root*) and the views aliasing them;
5. :func:`constant_nodes` — GPU nodes of constants only, moved to the plan's prologue (run once
   per plan, not per run);
6. :func:`schedule` — segments of GPU steps (one encoder and one submit each), cut only where a
   host node reads what the open segment produces; the uniform regions; the uploads;
7. :func:`assign_memory` — value lifetimes and the pooled buffers that hold them;
8. :func:`placement.placement_report` — per node what ran where and why (``explain``).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from onnx_quant.errors import ExecutionError, InferenceError, KernelRejected, QuantError

from . import data_dependent as dd
from ..inference import infer_values
from ..inference.sequences import Elements
from .device_info import DeviceInfo
from .graph_index import attributes, concrete
from .index_check import node_id_data
from .packing import device_nbytes
from .placement import (
    HOST_KINDS, ModelFacts, NodeInfo, classify, live_nodes, node_overrides, op_name, place, placement_report,
)
from .plan import GpuStep, GraphPlan, HostStep, Lifetime, RootValue, Segment
from .planner import plan_node
from .tuning_cache import entry_key
from .verdict import onnx_type


# ----------------------------------------------------------------------------- the compiler's input


@dataclass(frozen=True)
class ModelGraph:
    """What the compiler reads of one model for every binding (:func:`model_graph`): the
    rewritten model, the model as given (inferred strictly where values stay unknown), every
    node's construction-time placement, the graph inputs (no initializers), initializer names,
    graph outputs, and the NonZeros in their padded form (data_dependent.py)."""

    model: onnx.ModelProto
    source_model: onnx.ModelProto
    nodes: tuple[NodeInfo, ...]
    inputs: tuple[str, ...]
    initializers: tuple[str, ...]
    outputs: tuple[str, ...]
    nonzeros: tuple[Any, ...] = ()


def model_graph(rewritten: Any, source_model: onnx.ModelProto, specs: Any,
                initializers: Mapping[str, np.ndarray]) -> ModelGraph:
    """The compiler's input from the construction phases' result (rewrites.Rewritten), the model
    as given, the kernel registry and the initializers' arrays: every node classified
    (placement.classify)."""
    model = rewritten.model
    facts = ModelFacts(rewritten.static_values, specs, rewritten.fused_units, rewritten.nonzero_declined,
                       initializers)
    return ModelGraph(model, source_model, tuple(classify(model, facts)),
                      tuple(vi.name for vi in model.graph.input if vi.name not in initializers),
                      tuple(initializers), tuple(vi.name for vi in model.graph.output), tuple(rewritten.nonzeros))


@dataclass(frozen=True)
class CompileOptions:
    """``tunables``: ``{name: int}`` for every kernel that has it, or ``{node or op type: {name:
    int}}``; ``variants``: ``{node or op type: variant id}`` forces a variant; ``tuned``: the
    measured choices (tuning_cache.TuningTable, or anything with ``lookup(entry key)``), used for
    the nodes nothing is forced on where the chosen variant applies at the node's shapes."""

    tunables: Mapping[str, Any] = field(default_factory=dict)
    variants: Mapping[str, str] = field(default_factory=dict)
    tuned: Any = None


def device_facts(device: DeviceInfo | Mapping[str, Any]) -> DeviceInfo:
    """Device facts as the planner reads them: a DeviceInfo as is, or a plain dict with
    ``limits`` (WebGPU names), ``features`` and optionally ``name`` / ``backend``."""
    if isinstance(device, DeviceInfo):
        return device
    return DeviceInfo(name=str(device.get("name", "device facts")), backend=str(device.get("backend", "none")),
                      limits=dict(device.get("limits", {})), features=frozenset(device.get("features", ())))


@dataclass(frozen=True)
class HostNode:
    """A live node the plan runs on the host: why, and whether kernel planning ``declined`` it
    for these shapes (construction had placed it on the GPU)."""

    index: int
    reason: str
    declined: bool = False


@dataclass(frozen=True)
class Compiled:
    """:func:`compile`'s result: the plan; the host nodes in graph order (what the Session's
    warn-or-refuse policy reads); inference's values for the binding (name -> TensorInfo: the
    host nodes' output sizes); ``keyed``: the inputs the plan is keyed on the contents of (those
    given and those phase 0 added; empty unless it is)."""

    plan: GraphPlan
    host: tuple[HostNode, ...]
    values: Mapping[str, Any]
    keyed: tuple[str, ...] = ()


def input_shape(shape: Any) -> Any:
    """A graph input's shape as plans take it: a tuple of ints; a sequence input's elements'
    shapes (``Elements``); an optional input's value's, or None when it is empty."""
    if shape is None:
        return None
    if isinstance(shape, Elements):
        return Elements(input_shape(s) for s in shape)
    return tuple(int(d) for d in shape)


def shape_key(shapes: Mapping[str, Any]) -> tuple:
    """The part of a plan's key its input shapes make."""
    return tuple(sorted((k, input_shape(v)) for k, v in shapes.items()))


def value_key(keyed: Sequence[str], given: Mapping[str, np.ndarray]) -> tuple:
    """The part of a plan's key that the contents of its value-keyed inputs make."""
    return tuple((n, given[n].dtype.str, given[n].tobytes()) for n in keyed if n in given)


# ----------------------------------------------------------------------------- compile


def compile(graph: ModelGraph, device: DeviceInfo | Mapping[str, Any], shapes: Mapping[str, Sequence[int]], *,
            options: CompileOptions = CompileOptions(), input_values: Mapping[str, np.ndarray] | None = None,
            feeds: Mapping[str, Any] | None = None, key: tuple | None = None) -> Compiled:
    """The plan for one binding of input ``shapes`` (and of the contents of the inputs in
    ``input_values``; given ``feeds``, phase 0 may key the plan on the contents of small integer
    inputs it needs). ``key``: the plan's key (default: the shapes'); phase 0 extends it with the
    values it keys on. Raises ExecutionError for inputs the model cannot take, a forced variant
    that does not apply, a tensor beyond the device's limits; never warns, never refuses a host
    node (the caller's policy, over :attr:`Compiled.host`)."""
    device = device_facts(device)
    shapes = {k: input_shape(v) for k, v in shapes.items()}
    key = shape_key(shapes) if key is None else key
    input_values = dict(input_values or {})
    values = infer_binding(graph, shapes, input_values)
    if feeds is not None and any((info.elem_type == 0 or info.shape is None) and not hasattr(info, "type_proto")
                                 for info in values.values()):  # (a sequence's type is no tensor's)
        check_shapes_fit(graph.source_model, shapes, input_values)  # a run refuses them; explain lists what they leave
    keyed = tuple(input_values)
    if feeds is not None:
        # a value known may show the next one needed (a position after a position; the contents
        # of a sequence feed that other positions pick from): up to MAX_KEYING_ROUNDS rounds
        for _ in range(MAX_KEYING_ROUNDS):
            wanted = tuple(n for n in value_keyed_inputs(graph.nodes, values, graph.inputs) if n not in input_values)
            given = {n: feeds[n] for n in wanted if isinstance(feeds.get(n), np.ndarray)}
            if not wanted or len(given) != len(wanted):
                break
            keyed, input_values, key = keyed + wanted, {**input_values, **given}, key + value_key(wanted, given)
            values = infer_binding(graph, shapes, input_values)
    placed = place(graph.nodes, values)
    live = live_nodes(graph.nodes, placed.kinds, graph.outputs)
    folded = {k: v for i, fv in placed.folded_by_node.items() if i in live for k, v in fv.items()}
    plans, kinds, reasons, declined = plan_kernels(graph.nodes, live, placed, values, device, options)
    host = tuple(HostNode(i.index, reasons.get(i.index, i.reason), i.index in declined) for i in graph.nodes
                 if i.index in live and kinds[i.index] == "host")
    plan = lay_out(graph, key, shapes, live, kinds, reasons, plans, values, folded, device)
    return Compiled(plan, host, values, keyed)


def lay_out(graph: ModelGraph, key: tuple, shapes: Mapping[str, tuple], live: set[int], kinds: Mapping[int, str],
            reasons: Mapping[int, str], plans: Mapping[int, Any], values: Mapping[str, Any],
            folded: Mapping[str, np.ndarray], device: DeviceInfo) -> GraphPlan:
    """Phases 4-8: roots, constants once, the schedule, memory and the placement report."""
    nodes = graph.nodes
    roots, alias = value_roots(nodes, kinds, live, values, graph.inputs, graph.initializers, graph.outputs)
    once, roots = constant_nodes(nodes, kinds, live, roots, alias, graph.outputs)
    ualign = int(device.limits.get("minUniformBufferOffsetAlignment", 256)) or 256
    sched = schedule(nodes, kinds, live, plans, roots, alias, once, reasons, values, ualign)
    cap = int(device.limits.get("maxBufferSize", 2**62))
    lifetimes, slot_of, slot_sizes = assign_memory(sched.roots, sched, cap, shapes)
    return GraphPlan(key=key, roots=sched.roots, alias=alias, schedule=sched.steps,
                     placement=placement_report(nodes, kinds, live, reasons), lifetimes=tuple(lifetimes),
                     slot_of=slot_of, slot_sizes=tuple(slot_sizes), uniform_regions=sched.uniform_regions,
                     uniform_size=sched.uniform_size, folded=dict(folded), prologue=sched.prologue)


# ----------------------------------------------------------------------------- 0. inference


def infer_binding(graph: ModelGraph, shapes: Mapping[str, tuple], input_values: Mapping[str, np.ndarray]) -> dict:
    """Every value's TensorInfo at these shapes (and input contents): the rewritten model inferred
    as the runtimes compute it (a graph output whose declared shape contradicts what the model
    computes gets the computed one, as onnxruntime does), the padded NonZero outputs completed."""
    try:
        values = infer_values(graph.model, dict(shapes), strict=False,
                              input_values=dict(input_values) or None, declared_outputs_win=False,
                              runtime=True)
    except QuantError as e:
        raise ExecutionError(f"shape inference for input shapes {dict(shapes)} failed: {e}") from None
    dd.capacity_values(list(graph.nonzeros), values)  # the padded NonZero outputs inference does not know
    return values


def check_shapes_fit(source_model: onnx.ModelProto, shapes: Mapping[str, tuple],
                     input_values: Mapping[str, np.ndarray]) -> None:
    """Where values stay unknown at these shapes, the user's model as given is inferred
    strictly at them: a rule they break (an Add whose inputs no longer broadcast at an image
    size the model was not made for) is the error, naming the user's node and the rule rather
    than a fused op downstream whose type is unknown."""
    try:
        infer_values(source_model, dict(shapes), strict=True,
                     input_values=dict(input_values) or None, declared_outputs_win=False, runtime=True)
    except InferenceError as e:
        if e.rule != "output-type":  # a declaration the graph contradicts is not the shapes' fault
            given = ", ".join(f"{k} {list(v)}" for k, v in shapes.items())
            raise ExecutionError(f"the input shapes ({given}) do not fit the model: {e}") from None
    except QuantError:
        pass  # not a shape rule: planning goes on and says what it cannot do


# ----------------------------------------------------------------------------- 0. plan-time values

#: elements a graph input may have for a plan to be keyed on its contents
MAX_VALUE_KEY_ELEMENTS = 64
#: rounds of keying (each infers again with the values found): a chain of positions, each known
#: only once the one before is
MAX_KEYING_ROUNDS = 4
VALUE_KEY_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16,
                             onnx.TensorProto.INT8, onnx.TensorProto.UINT64, onnx.TensorProto.UINT32,
                             onnx.TensorProto.UINT16, onnx.TensorProto.UINT8, onnx.TensorProto.BOOL})
#: float types keyed only where the input is itself a kernel's constant input
VALUE_KEY_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                                   onnx.TensorProto.BFLOAT16})


def value_keyed_inputs(nodes: Sequence[NodeInfo], values: Mapping[str, Any], inputs: Sequence[str]) -> tuple[str, ...]:
    """Graph inputs whose contents a plan for these input shapes needs: small integer inputs
    (and small float inputs that are a kernel's constant input themselves)
    that feed (through any nodes) a node whose inputs all have known shapes but which still
    lacks what planning needs, an output shape (Slice's starts, Expand's shape, Range's limit
    fed as graph inputs) or a constant input of its kernel (``values.<name>``). Planning for
    their values (the plan keyed on them) lets inference fold the shapes, as onnxruntime reads
    such inputs on the CPU. Empty when the shapes alone suffice."""
    producer = {o: info for info in nodes for o in info.node.output if o}
    # float inputs too where they feed a kernel's constant input directly (Resize's scales,
    # Range's start): the kernel reads them at plan time as onnxruntime's WebGPU EP does
    const_fed = {n for info in nodes for n in _constant_input_names(info)}
    candidates = {n for n in inputs if _small_integer(values.get(n))
                  or (n in const_fed and _small_number(values.get(n)))}
    if not candidates:
        return ()
    wanted: set[str] = set()
    seen: set[str] = set()
    stack: list[str] = []
    for info in nodes:
        ins = [i for i in info.node.input if i]
        if info.kind == "const" or not all(_has_shape(values.get(i)) for i in ins):
            continue  # an upstream unknown: the node is not where values are missing
        outs_unknown = any(concrete(getattr(values.get(o), "shape", None)) is None for o in info.node.output if o)
        consts = _constant_input_names(info)
        missing_const = [i for i in consts if getattr(values.get(i), "value", None) is None]
        if outs_unknown:
            stack.extend(i for i in ins if getattr(values.get(i), "value", None) is None)
        else:
            stack.extend(missing_const)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in candidates:
            wanted.add(name)
            continue
        src = producer.get(name)
        if src is not None and src.kind != "const":
            stack.extend(i for i in src.node.input if i and getattr(values.get(i), "value", None) is None)
    return tuple(n for n in inputs if n in wanted)


def _small_integer(info: Any) -> bool:
    shape = concrete(getattr(info, "shape", None))
    return (info is not None and info.elem_type in VALUE_KEY_TYPES and shape is not None
            and math.prod(shape) <= MAX_VALUE_KEY_ELEMENTS)


def _small_number(info: Any) -> bool:
    shape = concrete(getattr(info, "shape", None))
    return (info is not None and info.elem_type in VALUE_KEY_FLOAT_TYPES and shape is not None
            and math.prod(shape) <= MAX_VALUE_KEY_ELEMENTS)


def _has_shape(info: Any) -> bool:
    items = getattr(info, "items", None)  # a sequence or optional whose contents inference knows
    if items is not None:
        return all(_has_shape(i) for i in items)
    return info is not None and concrete(info.shape) is not None


def _constant_input_names(info: NodeInfo) -> list[str]:
    """The node's value names bound to its kernel's ``"constant"`` inputs."""
    if info.spec is None:
        return []
    names = list(info.node.input)
    return [names[d.index] for d in info.spec.inputs.values() if d.constant and d.index < len(names) and names[d.index]]


# ----------------------------------------------------------------------------- 3. kernels


def plan_kernels(nodes: Sequence[NodeInfo], live: set[int], placed: Any, values: Mapping[str, Any],
                 device: DeviceInfo, options: CompileOptions
                 ) -> tuple[dict[int, Any], dict[int, str], dict[int, str], set[int]]:
    """A kernel plan per live GPU node: (plans, kinds and reasons with the nodes no variant takes
    moved to the host, the indices of those declined nodes)."""
    kinds, reasons = dict(placed.kinds), dict(placed.reasons)
    plans: dict[int, Any] = {}
    declined: set[int] = set()
    for info in nodes:
        if info.index not in live or kinds[info.index] != "gpu":
            continue
        plan, why = plan_kernel(info, values, device, options)
        if plan is None:
            kinds[info.index], reasons[info.index] = "host", why
            declined.add(info.index)
        else:
            plans[info.index] = plan
    return plans, kinds, reasons, declined


def plan_kernel(info: NodeInfo, values: Mapping[str, Any], device: DeviceInfo, options: CompileOptions):
    """(NodePlan, '') or (None, why the node runs on the host): the planner over the node's
    inferred types and shapes and its kernel's constant inputs. A forced variant that does not
    apply, and every planning error but a kernel's rejection (a tensor beyond the device's
    limits, a uniform value out of range), are raised, not sent to the host."""
    spec, node = info.spec, info.node
    io_shapes: dict[str, tuple[int, ...]] = {}
    io_types: dict[str, str] = {}
    for spec_names, value_names in ((list(spec.inputs), list(node.input)), (list(spec.outputs), list(node.output))):
        for i, sname in enumerate(spec_names):
            vname = value_names[i] if i < len(value_names) else ""
            if not vname:
                continue  # an absent optional input or output (checked at construction)
            v = values.get(vname)
            shape = concrete(None if v is None else v.shape)
            t = None if v is None else onnx_type(v.elem_type)
            if shape is None or t is None:
                return None, (f"the {'type' if t is None else 'shape'} of {vname!r} is not known for these "
                              f"input shapes ({None if v is None else v.shape})")
            io_shapes[sname] = shape
            io_types[sname] = t
    tun, variant = node_overrides(info, options.tunables, options.variants)
    consts = {}
    for d in spec.inputs.values():
        vname = node.input[d.index] if d.constant and d.index < len(node.input) else ""
        v = values.get(vname) if vname else None
        if v is not None and v.value is not None:
            consts[d.name] = np.asarray(v.value)
    plan_args = {"shapes": io_shapes, "dtypes": io_types, "device": device, "node_label": info.label,
                 "attributes": attributes(node), "values": consts}
    choice = None
    if variant is None and options.tuned is not None:
        choice = options.tuned.lookup(entry_key(spec.name, io_shapes, io_types, spec.inputs))
    if choice is not None:
        try:  # the measured choice, under what the caller gave; where it does not apply, the static rules
            return plan_node(spec, tunables={**choice.tunables, **tun}, variant=choice.variant, **plan_args), ""
        except QuantError:
            pass
    try:
        plan = plan_node(spec, tunables=tun, variant=variant, **plan_args)
    except KernelRejected as e:
        if variant is not None:
            raise
        return None, e.reason
    return plan, ""


# ----------------------------------------------------------------------------- 4. roots


def value_roots(nodes: Sequence[NodeInfo], kinds: Mapping[int, str], live: set[int], values: Mapping[str, Any],
                inputs: Sequence[str], initializers: Sequence[str], outputs: Sequence[str],
                ) -> tuple[dict[str, RootValue], dict[str, tuple[str, tuple[int, ...] | None]]]:
    """Every value a buffer (or host array) holds, and ``alias``: value name -> (root, shape)
    (identity for roots, the view's shape for views)."""
    roots: dict[str, RootValue] = {}

    def add_root(name: str, origin: str) -> None:
        v = values.get(name)
        code = v.elem_type if v is not None else 0
        shape = concrete(None if v is None else v.shape)
        t = onnx_type(code)
        nbytes = device_nbytes(t, math.prod(shape)) if (t is not None and shape is not None) else 0
        roots[name] = RootValue(name, t, shape, origin, nbytes)

    for name in inputs:
        add_root(name, "feed")
    for name in initializers:
        add_root(name, "init")
    alias: dict[str, tuple[str, tuple[int, ...] | None]] = {n: (n, roots[n].shape) for n in roots}
    for info in nodes:
        if info.index not in live:
            continue
        k = kinds[info.index]
        outs = [o for o in info.node.output if o]
        if k == "view":
            src = alias.get(info.node.input[0])
            if src is None:
                raise ExecutionError(f"node {info.label!r}: input {info.node.input[0]!r} has no value")
            alias[outs[0]] = (src[0], concrete(values[outs[0]].shape))
            continue
        for o in outs:
            add_root(o, "host" if k in HOST_KINDS else k)  # a control step's outputs come back to the host
            alias[o] = (o, roots[o].shape)
    for name in outputs:
        if name not in alias:
            raise ExecutionError(f"graph output {name!r} is produced by no node and is not an input")
    return roots, alias



# ----------------------------------------------------------------------------- 5. constants once


def constant_nodes(nodes: Sequence[NodeInfo], kinds: Mapping[int, str], live: set[int],
                   roots: Mapping[str, RootValue], alias: Mapping[str, tuple], outputs: Sequence[str]
                   ) -> tuple[set[int], dict[str, RootValue]]:
    """GPU nodes whose every input is an initializer, a Constant, a folded value or the output
    of another such node (the DequantizeLinear of a weight, a parameter pass over constant
    scales): they run once per plan, when it is prepared, into buffers of their own, and no run
    repeats them. Returns (their indices, the roots with their outputs' origin ``once``). A node
    whose output a host node or the caller reads back stays in the run (its value would otherwise
    have to be read back at preparation)."""
    read_back = {alias[n][0] for n in outputs if n in alias}
    for info in nodes:
        if info.index in live and kinds[info.index] in HOST_KINDS:
            read_back |= {alias[n][0] for n in list(info.node.input) + list(info.implicit) if n in alias}
    roots = dict(roots)
    once: set[int] = set()
    constant = {"init", "const", "fold", "once"}
    for info in nodes:
        if info.index not in live or kinds[info.index] != "gpu" or info.implicit:
            continue
        ins = [n for n in info.node.input if n]
        outs = [o for o in info.node.output if o]
        if not ins or not outs or any(n not in alias for n in ins):
            continue
        if all(roots[alias[n][0]].origin in constant for n in ins) and not read_back & set(outs):
            once.add(info.index)
            for o in outs:
                roots[o] = dataclasses.replace(roots[o], origin="once")
    return once, roots


# ----------------------------------------------------------------------------- 6. schedule


@dataclass(frozen=True)
class Schedule:
    """Phase 6's result: the steps, the prologue, the uniform regions, and the roots with what
    the schedule found (read on the device / on the host, producer position, segment, upload)."""

    steps: tuple[Any, ...]                 # Segment and HostStep in execution order
    prologue: tuple[GpuStep, ...]          # constants-only GPU steps, once per plan
    uniform_regions: tuple[tuple[int, bytes], ...]
    uniform_size: int
    roots: dict[str, RootValue]


class _Uniforms:
    """The plan's uniform buffer as it is laid out: (offset, bytes) regions aligned to ``align``."""

    def __init__(self, align: int) -> None:
        self.align, self.regions, self.size = align, [], 0

    def add(self, byte_size: int, data: bytes | None) -> tuple[int, int]:
        """(offset, size) of a new region for a uniform of ``byte_size`` (16-byte multiple) holding ``data``."""
        size = max(16, -(-byte_size // 16) * 16)
        offset = -(-self.size // self.align) * self.align
        data = bytes(data or b"")
        self.regions.append((offset, data + b"\0" * (size - len(data))))
        self.size = offset + size
        return offset, size


def _step_buffers(info: NodeInfo, plan: Any, root_of: Callable[[str], str], on_device: set[str],
                  uniforms: _Uniforms) -> dict[str, tuple]:
    """Where each of a GPU step's buffers lives (see ``GpuStep.buffers``); the roots it reads are
    added to ``on_device``, its uniform regions to ``uniforms``."""
    node, spec = info.node, info.spec
    where: dict[str, tuple] = {}
    absent = 0
    for bname, bp in plan.buffers.items():
        if bp.role == "input":
            r = root_of(node.input[list(spec.inputs).index(bname)])
            on_device.add(r)
            where[bname] = ("value", r)
        elif bp.role == "output":
            where[bname] = ("value", node.output[list(spec.outputs).index(bname)])
        elif bp.role == "intermediate":
            where[bname] = ("scratch", (info.index, bname))
        elif bp.role == "data":
            where[bname] = ("data", (info.index, bname))
        elif bp.role == "absent":
            where[bname] = ("absent", absent)
            absent += 1
        elif bp.role == "uniform":
            where[bname] = ("uniform", *uniforms.add(bp.byte_size, bp.data))
        elif bp.role == "node_id":  # this node's own index: the error records name it (index_check.py)
            where[bname] = ("uniform", *uniforms.add(bp.byte_size, node_id_data(info.index)))
        elif bp.role == "errors":
            where[bname] = ("errors",)
        else:  # pragma: no cover - planner contract
            raise ExecutionError(f"node {info.label!r}: buffer {bname}: unknown role {bp.role!r}")
    return where


class _Scheduler:
    """The running state of :func:`schedule`: closed steps, the open segment, what it found of
    the roots (read on the device / on the host, producer position, producing segment)."""

    def __init__(self, roots: Mapping[str, RootValue], alias: Mapping[str, tuple], ualign: int) -> None:
        self.roots, self.alias = roots, alias
        self.steps: list[Any] = []           # HostStep, or a closed segment's list of GpuSteps
        self.prologue: list[GpuStep] = []
        self.open: list[GpuStep] = []
        self.open_produced: set[str] = set()
        self.uniforms = _Uniforms(ualign)
        self.pos = 0
        self.on_device: set[str] = set()
        self.on_host: set[str] = set()
        self.producer_pos: dict[str, int] = {}
        self.segment_of: dict[str, int] = {}
        self.segments = 0

    def root_of(self, name: str) -> str:
        if name not in self.alias:
            raise ExecutionError(f"value {name!r} is read before any node produces it")
        return self.alias[name][0]

    def flush(self) -> None:
        """Close the open segment (its outputs' roots learn their segment)."""
        if self.open:
            self.steps.append(self.open)
            for st in self.open:
                for r in st.outputs:
                    self.segment_of[r] = self.segments
            self.segments += 1
        self.open, self.open_produced = [], set()

    def gpu(self, info: NodeInfo, plan: Any, once: bool) -> None:
        """A GPU step: into the prologue (``once``) or the open segment, its constant leading
        passes hoisted."""
        where = _step_buffers(info, plan, self.root_of, self.on_device, self.uniforms)
        outs = tuple(o for o in info.node.output if o)
        for o in outs:
            self.producer_pos[o] = self.pos
        if once:
            self.prologue.append(GpuStep(info.index, info.label, op_name(info), self.pos, plan, where, outs))
        else:
            hoisted, where = hoist_constant_passes(plan, where, self.roots)
            self.open.append(GpuStep(info.index, info.label, op_name(info), self.pos, plan, where, outs, hoisted))
            self.open_produced |= set(outs)
        self.pos += 1

    def host(self, info: NodeInfo, kind: str, reason: str, values: Mapping[str, Any]) -> None:
        """A host step (host, control, sync or sequence): its inputs read back or, for a sync or
        sequence step's pooled ones, passed as device views; the open segment closed first if it
        makes one."""
        node = info.node
        reads = [n for n in dict.fromkeys(list(node.input) + list(info.implicit)) if n]
        step_inputs = []
        device_inputs: list[str] = []  # a sync step's pooled inputs (GPU-made, fed), passed as views of their buffers
        for n in reads:
            r = self.root_of(n)
            origin = self.roots[r].origin
            pooled = origin == "gpu" or (origin == "feed" and r in self.on_device)
            if kind in ("sync", "sequence") and n not in info.host_reads and pooled:
                device_inputs.append(r)
            else:
                self.on_host.add(r)
            step_inputs.append((n, r, self.alias[n][1]))
        # a fed DeviceValue reaches its buffer by a copy at the head of the first segment: a step
        # holding a view of a feed's buffer comes after that segment
        if any(r in self.open_produced for _, r, _ in step_inputs) or \
                self.segments == 0 and any(self.roots[r].origin == "feed" for r in device_inputs):
            self.flush()
        outs = tuple(o for o in node.output if o)
        types = tuple(getattr(values.get(o), "elem_type", 0) or 0 for o in outs)
        self.steps.append(HostStep(info.index, info.label, op_name(info), tuple(step_inputs), outs, reason,
                                   tuple(dict.fromkeys(device_inputs)), self.pos, types, kind == "sequence"))

    def finish(self) -> Schedule:
        """The frozen schedule: segments with the uploads of the host values their steps read
        first, the roots with what the walk found."""
        self.flush()
        upload_at: dict[str, int] = {}
        k = 0
        for s in self.steps:
            if isinstance(s, list):
                for st in s:
                    for bname, where in st.buffers.items():
                        if where[0] == "value" and st.plan.buffers[bname].role == "input":
                            r = self.roots[where[1]]
                            if r.origin == "host" and r.name in self.on_device:
                                upload_at.setdefault(r.name, k)
                k += 1
        uploads: dict[int, list[str]] = {}
        for name in self.roots:  # in root order, as the pool walks them
            if name in upload_at:
                uploads.setdefault(upload_at[name], []).append(name)
        steps, k = [], 0
        for s in self.steps:
            if isinstance(s, list):
                steps.append(Segment(k, tuple(s), tuple(uploads.get(k, ()))))
                k += 1
            else:
                steps.append(s)
        roots = {n: dataclasses.replace(r, on_device=n in self.on_device, on_host=n in self.on_host,
                                        producer_pos=self.producer_pos.get(n, r.producer_pos),
                                        segment=self.segment_of.get(n, r.segment),
                                        upload_segment=upload_at.get(n, r.upload_segment))
                 for n, r in self.roots.items()}
        return Schedule(tuple(steps), tuple(self.prologue), tuple(self.uniforms.regions), self.uniforms.size, roots)


def schedule(nodes: Sequence[NodeInfo], kinds: Mapping[int, str], live: set[int], plans: Mapping[int, Any],
             roots: Mapping[str, RootValue], alias: Mapping[str, tuple], once: set[int], reasons: Mapping[int, str],
             values: Mapping[str, Any], ualign: int) -> Schedule:
    """Segments of GPU steps in graph order, cut only where a host node reads a value the open
    segment produces; host steps between them (each with its outputs' element types from
    ``values``); the prologue of constant steps; uniform regions aligned to ``ualign``; each host
    value a GPU node reads uploaded before the first segment that reads it."""
    run = _Scheduler(roots, alias, ualign)
    for info in nodes:
        if info.index not in live:
            continue
        k = kinds[info.index]
        if k == "gpu":
            run.gpu(info, plans[info.index], info.index in once)
        elif k in HOST_KINDS:
            run.host(info, k, reasons.get(info.index, ""), values)
    return run.finish()


def hoist_constant_passes(plan: Any, buffers: Mapping[str, tuple], roots: Mapping[str, RootValue]
                          ) -> tuple[int, dict[str, tuple]]:
    """How many leading passes of a run step read only constants (initializers, Constants,
    folded values, outputs of once-per-plan nodes) and write only the node's scratch: such
    passes (QLinearConv's and QLinearMatMul's ``params`` over constant scales and zero points)
    run once per plan, in the prologue. Returns (that count, the step's buffers with the scratch
    those passes write kept for the plan's life: ``("kept", key)``, which needs that no later
    pass writes it)."""
    constant = {"init", "const", "fold", "once"}
    passes = plan.passes
    buffers = dict(buffers)
    k = 0
    for p in passes:
        ok = True
        for b in p.bindings:
            where = buffers[b.buffer]
            role = plan.buffers[b.buffer].role
            if role in ("output", "errors") or (role == "input" and roots[where[1]].origin not in constant):
                ok = False
                break
        if not ok:
            break
        k += 1
    if k == 0 or k == len(passes):
        return 0, buffers  # nothing constant, or the whole node (constant_nodes' business)
    written = {b.buffer for p in passes[:k] for b in p.bindings if b.access == "read_write"}
    if any(b.buffer in written and b.access == "read_write" for p in passes[k:] for b in p.bindings):
        return 0, buffers
    for bname in written:
        if buffers[bname][0] == "scratch":
            buffers[bname] = ("kept", buffers[bname][1])
    return k, buffers


# ----------------------------------------------------------------------------- 7. memory

#: the smallest pooled buffer (bytes); tiny values (scales, zero points) share this class
SIZE_CLASS_MIN = 256


def size_class(nbytes: int, cap: int | None = None) -> int:
    """The pooled-buffer size for a value of ``nbytes``: at least SIZE_CLASS_MIN, else the
    next m * 2**k with m in 4..8 (four classes per octave, at most 25 % slack). ``cap`` (the
    device's maxBufferSize) bounds the class, never below ``nbytes`` itself."""
    n = max(4, (int(nbytes) + 3) // 4 * 4)
    if n <= SIZE_CLASS_MIN:
        cls = SIZE_CLASS_MIN
    else:
        k = n.bit_length() - 3
        cls = ((n + (1 << k) - 1) >> k) << k
    if cap is not None and cls > cap:
        cls = max(n, cap)
    return cls


def assign_buffers(lifetimes: Sequence[Lifetime], cap: int | None = None) -> tuple[dict[Any, int], list[int]]:
    """Greedy allocation: walk the values by start position; a buffer whose value's lifetime
    ended before the start returns to the free list of its size class; each value takes a
    free buffer of its class or a new one. Two values share a buffer only when their
    lifetimes do not overlap. Returns (key -> slot index, slot sizes)."""
    free: dict[int, list[int]] = {}
    active: list[tuple[int, int]] = []  # (end, slot)
    slots: list[int] = []
    assign: dict[Any, int] = {}
    for lt in sorted(lifetimes, key=lambda lt: lt.start):  # stable: ties keep plan order
        while active and active[0][0] < lt.start:
            _, slot = heapq.heappop(active)
            free.setdefault(slots[slot], []).append(slot)
        cls = size_class(lt.nbytes, cap)
        pool = free.get(cls)
        if pool:
            slot = pool.pop()
        else:
            slot = len(slots)
            slots.append(cls)
        assign[lt.key] = slot
        heapq.heappush(active, (lt.end, slot))
    return assign, slots


def _last_uses(sched: Schedule) -> dict[str, int]:
    """Per root, the GPU position of the last GPU node that reads it (or of the sync step that
    reads it as a device view: no GPU node after it may reuse its buffer; of the run's end for a
    sequence step's: a list may hold it)."""
    last_use: dict[str, int] = {}
    end = max([st.pos for seg in sched.steps if isinstance(seg, Segment) for st in seg.steps] +
              [s.pos for s in sched.steps if isinstance(s, HostStep)] + [0]) + 1
    for step in sched.steps:
        if isinstance(step, Segment):
            for st in step.steps:
                for bname, where in st.buffers.items():
                    if where[0] == "value" and st.plan.buffers[bname].role == "input":
                        last_use[where[1]] = max(last_use.get(where[1], -1), st.pos)
        else:
            for r in step.device_inputs:
                last_use[r] = max(last_use.get(r, -1), end if step.holds else step.pos)
    return last_use


def assign_memory(roots: Mapping[str, RootValue], sched: Schedule, cap: int, shapes: Mapping[str, Any]
                  ) -> tuple[list[Lifetime], dict[Any, int], list[int]]:
    """Check every device value has a type and shape, and pool the buffers over the values'
    lifetimes (``assign_buffers``): feeds from the start, host values from the segment that
    uploads them, GPU values from their producer, scratch for its step, each to its last use."""
    segments = [s for s in sched.steps if isinstance(s, Segment)]
    last_use = _last_uses(sched)
    for name, r in roots.items():
        if r.on_device and (r.onnx_type is None or r.shape is None):
            raise ExecutionError(f"value {name!r}: a GPU node reads it but its type or shape is not known "
                                 f"for input shapes {dict(shapes)}")
    lifetimes: list[Lifetime] = []
    for name, r in roots.items():
        if r.origin == "feed" and r.on_device:
            lifetimes.append(Lifetime(name, r.nbytes, 0, last_use[name]))
        elif r.origin == "host" and r.on_device:
            start = segments[r.upload_segment].start
            lifetimes.append(Lifetime(name, r.nbytes, start, max(start, last_use[name])))
        elif r.origin == "gpu":
            lifetimes.append(Lifetime(name, r.nbytes, r.producer_pos,
                                      max(r.producer_pos, last_use.get(name, r.producer_pos))))
    for st in list(sched.prologue) + [st for seg in segments for st in seg.steps]:
        for bname, where in st.buffers.items():
            if where[0] == "scratch":
                lifetimes.append(Lifetime(where[1], st.plan.buffers[bname].byte_size, st.pos, st.pos))
    slot_of, slot_sizes = assign_buffers(lifetimes, cap)
    return lifetimes, slot_of, slot_sizes

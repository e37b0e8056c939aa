"""The graph compiler's phases: from the inferred model (every value's TensorInfo for one binding
of input shapes) and the device's facts to a :class:`~onnx_quant.backend_wgpu.executor.GraphPlan`.

Each phase is a function over plain data — node records, inferred values, kernel plans, device
limits as numbers — never a live device, so each is tested on the CPU
(tests/backend/test_graph_plan.py). ``Session._build_plan`` runs them in this order:

0. :func:`value_keyed_inputs` — the small integer graph inputs whose contents the plan needs
   (the plan is then keyed on their values and inference folds what follows from them);

1. :func:`place` — per node: a Constant (``const``), a value inference computed (``fold``: shape
   arithmetic on small integers), a view of its input (``view``), or what construction decided
   (``gpu`` with a kernel spec, ``host``);
2. :func:`live_nodes` — only nodes some graph output depends on run;
3. kernel planning (``Session._plan_gpu``, the planner: a node no variant takes goes to the host);
4. :func:`value_roots` — every value a buffer holds (its *root*) and the views aliasing them;
5. :func:`constant_nodes` — GPU nodes of constants only, moved to the plan's prologue (run once
   per plan, not per run);
6. :func:`schedule` — segments of GPU steps (one encoder and one submit each), cut only where a
   host node reads what the open segment produces; the uniform regions;
7. :func:`assign_memory` — value lifetimes and the pooled buffers that hold them;
8. :func:`placement_report` — per node what ran where and why (``explain``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from onnx_quant.backend_wgpu.executor import (
    GpuStep, HostStep, Lifetime, RootValue, Segment, assign_buffers,
)
from onnx_quant.backend_wgpu.control_flow import CONTROL_WHY
from onnx_quant.backend_wgpu.data_dependent import SYNC_WHY
from onnx_quant.backend_wgpu.graph_index import attributes, concrete, free_names, subgraph_reads, with_nested  # noqa: F401
from onnx_quant.backend_wgpu.packing import device_nbytes
from onnx_quant.backend_wgpu.verdict import DEFAULT_DOMAINS, VIEW_OPS, onnx_type
from onnx_quant.dtypes import element_type, type_name
from onnx_quant.errors import ExecutionError, QuantError


#: ops whose integer outputs are folded into the plan when shape inference computed them
#: (shape arithmetic: Shape -> Gather -> Concat -> Reshape and the like)
FOLD_OPS = frozenset({
    "Shape", "Size", "Gather", "Concat", "Slice", "Squeeze", "Unsqueeze", "Reshape", "Flatten",
    "Identity", "Cast", "Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Neg", "Abs", "Range", "ConstantOfShape",
    "Expand", "Split", "Transpose", "Tile", "Equal", "Less", "Greater", "Where", "Not", "And", "Or",
    "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin",
})
FOLD_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL})

#: what placement_report says of a node that runs no kernel
PLACEMENT_WHY = {"view": "a view of its input's buffer", "const": "a Constant, uploaded once per session",
                 "control": CONTROL_WHY, "sync": SYNC_WHY,
                 "fold": "computed by shape inference for these input shapes",
                 "unused": "no graph output depends on it"}


@dataclass
class NodeInfo:
    """A node and what Session construction decided about it."""

    index: int
    label: str
    node: onnx.NodeProto
    domain: str
    version: int
    spec: Any                 # the KernelSpec that takes the node, or None
    kind: str                 # "gpu" | "host" | "view" | "const" | "control" (If / Loop: control_flow.py)
    #                           | "sync" (NonZero's region: data_dependent.py)
    reason: str               # why not "gpu" (empty for gpu nodes)
    implicit: tuple[str, ...]  # outer-scope names its subgraphs read
    #: a "sync" step's inputs read on the host (NonZero's counts); its other GPU-made inputs stay on the device
    host_reads: tuple[str, ...] = ()


@dataclass
class Placement:
    """Phase 1's result: per node index its kind and why it is not on the GPU, and the values
    folded per node."""

    kinds: dict[int, str]
    reasons: dict[int, str]
    folded_by_node: dict[int, dict[str, np.ndarray]]


# ----------------------------------------------------------------------------- 0. plan-time values

#: elements a graph input may have for a plan to be keyed on its contents
MAX_VALUE_KEY_ELEMENTS = 64
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
    return info is not None and concrete(info.shape) is not None


def _constant_input_names(info: NodeInfo) -> list[str]:
    """The node's value names bound to its kernel's ``"constant"`` inputs."""
    if info.spec is None:
        return []
    names = list(info.node.input)
    return [names[d.index] for d in info.spec.inputs.values() if d.constant and d.index < len(names) and names[d.index]]


# ----------------------------------------------------------------------------- 1. place


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


# ----------------------------------------------------------------------------- 2. liveness


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
            add_root(o, "host" if k in ("control", "sync") else k)  # a control step's outputs come back to the host
            alias[o] = (o, roots[o].shape)
    for name in outputs:
        if name not in alias:
            raise ExecutionError(f"graph output {name!r} is produced by no node and is not an input")
    return roots, alias


# ----------------------------------------------------------------------------- 5. constants once


def constant_nodes(nodes: Sequence[NodeInfo], kinds: Mapping[int, str], live: set[int],
                   roots: dict[str, RootValue], alias: Mapping[str, tuple], outputs: Sequence[str]) -> set[int]:
    """GPU nodes whose every input is an initializer, a Constant, a folded value or the output
    of another such node (the DequantizeLinear of a weight, a parameter pass over constant
    scales): they run once per plan, when it is prepared, into buffers of their own, and no run
    repeats them. Their outputs' roots become ``once``. A node whose output a host node or the
    caller reads back stays in the run (its value would otherwise have to be read back at
    preparation)."""
    read_back = {alias[n][0] for n in outputs if n in alias}
    for info in nodes:
        if info.index in live and kinds[info.index] in ("host", "control", "sync"):
            read_back |= {alias[n][0] for n in list(info.node.input) + list(info.implicit) if n in alias}
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
                roots[o].origin = "once"
    return once


# ----------------------------------------------------------------------------- 6. schedule


@dataclass
class Schedule:
    steps: list[Any]                 # Segment and HostStep in execution order
    prologue: list[GpuStep]          # constants-only GPU steps, once per plan
    uniform_regions: list[tuple[int, bytes]]
    uniform_size: int


def _step_buffers(info: NodeInfo, plan: Any, root_of: Callable[[str], str], roots: dict[str, RootValue],
                  uniforms: list, ualign: int) -> dict[str, tuple]:
    """Where each of a GPU step's buffers lives (see ``GpuStep.buffers``); uniform regions are
    appended to ``uniforms`` ([regions, size]) aligned to ``ualign``."""
    node, spec = info.node, info.spec
    where: dict[str, tuple] = {}
    absent = 0
    for bname, bp in plan.buffers.items():
        if bp.role == "input":
            r = root_of(node.input[list(spec.inputs).index(bname)])
            roots[r].on_device = True
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
            size = max(16, -(-bp.byte_size // 16) * 16)
            offset = -(-uniforms[1] // ualign) * ualign
            data = bytes(bp.data or b"")
            uniforms[0].append((offset, data + b"\0" * (size - len(data))))
            uniforms[1] = offset + size
            where[bname] = ("uniform", offset, size)
        else:  # pragma: no cover - planner contract
            raise ExecutionError(f"node {info.label!r}: buffer {bname}: unknown role {bp.role!r}")
    return where


def schedule(nodes: Sequence[NodeInfo], kinds: Mapping[int, str], live: set[int], plans: Mapping[int, Any],
             roots: dict[str, RootValue], alias: Mapping[str, tuple], once: set[int], reasons: Mapping[int, str],
             op_name: Callable[[NodeInfo], str], ualign: int) -> Schedule:
    """Segments of GPU steps in graph order, cut only where a host node reads a value the open
    segment produces; host steps between them; the prologue of constant steps."""

    def root_of(name: str) -> str:
        if name not in alias:
            raise ExecutionError(f"value {name!r} is read before any node produces it")
        return alias[name][0]

    steps: list[Any] = []
    prologue: list[GpuStep] = []
    open_steps: list[GpuStep] = []
    open_produced: set[str] = set()
    uniforms: list[Any] = [[], 0]
    pos = 0
    segment_count = 0

    def flush() -> None:
        nonlocal open_steps, open_produced, segment_count
        if open_steps:
            steps.append(Segment(segment_count, open_steps, []))
            for st in open_steps:
                for r in st.outputs:
                    roots[r].segment = segment_count
            segment_count += 1
        open_steps, open_produced = [], set()

    for info in nodes:
        if info.index not in live:
            continue
        k, node = kinds[info.index], info.node
        if k == "gpu":
            where = _step_buffers(info, plans[info.index], root_of, roots, uniforms, ualign)
            outs = tuple(o for o in node.output if o)
            for o in outs:
                roots[o].producer_pos = pos
            step = GpuStep(info.index, info.label, op_name(info), pos, plans[info.index], where, outs)
            if info.index in once:
                prologue.append(step)
            else:
                step.hoisted = hoist_constant_passes(step, roots)
                open_steps.append(step)
                open_produced |= set(outs)
            pos += 1
        elif k in ("host", "control", "sync"):
            reads = [n for n in dict.fromkeys(list(node.input) + list(info.implicit)) if n]
            step_inputs = []
            on_device: list[str] = []  # a sync step's pooled inputs (GPU-made, fed), passed as views of their buffers
            for n in reads:
                r = root_of(n)
                pooled = roots[r].origin == "gpu" or (roots[r].origin == "feed" and roots[r].on_device)
                if k == "sync" and n not in info.host_reads and pooled:
                    on_device.append(r)
                else:
                    roots[r].on_host = True
                step_inputs.append((n, r, alias[n][1]))
            if any(r in open_produced for _, r, _ in step_inputs):
                flush()
            steps.append(HostStep(info.index, info.label, op_name(info), step_inputs,
                                  tuple(o for o in node.output if o), reasons.get(info.index, ""),
                                  tuple(dict.fromkeys(on_device)), pos))
    flush()
    return Schedule(steps, prologue, uniforms[0], uniforms[1])


def hoist_constant_passes(step: GpuStep, roots: Mapping[str, RootValue]) -> int:
    """How many leading passes of a run step read only constants (initializers, Constants,
    folded values, outputs of once-per-plan nodes) and write only the node's scratch: such
    passes (QLinearConv's and QLinearMatMul's ``params`` over constant scales and zero points)
    run once per plan, in the prologue. The scratch they write is kept for the plan's life
    (``("kept", key)``), which needs that no later pass writes it."""
    constant = {"init", "const", "fold", "once"}
    passes = step.plan.passes
    k = 0
    for p in passes:
        ok = True
        for b in p.bindings:
            where = step.buffers[b.buffer]
            role = step.plan.buffers[b.buffer].role
            if role == "output" or (role == "input" and roots[where[1]].origin not in constant):
                ok = False
                break
        if not ok:
            break
        k += 1
    if k == 0 or k == len(passes):
        return 0  # nothing constant, or the whole node (constant_nodes' business)
    written = {b.buffer for p in passes[:k] for b in p.bindings if b.access == "read_write"}
    if any(b.buffer in written and b.access == "read_write" for p in passes[k:] for b in p.bindings):
        return 0
    for bname in written:
        if step.buffers[bname][0] == "scratch":
            step.buffers[bname] = ("kept", step.buffers[bname][1])
    return k


# ----------------------------------------------------------------------------- 7. memory


def assign_memory(roots: dict[str, RootValue], sched: Schedule, cap: int, shapes: Mapping[str, Any]
                  ) -> tuple[list[Lifetime], dict[Any, int], list[int]]:
    """Check every device value has a type and shape, schedule the uploads of host values the
    GPU reads, and pool the buffers over the values' lifetimes (``assign_buffers``)."""
    segments = [s for s in sched.steps if isinstance(s, Segment)]
    last_use: dict[str, int] = {}
    first_seg: dict[str, int] = {}
    for seg in segments:
        for st in seg.steps:
            for bname, where in st.buffers.items():
                if where[0] != "value" or st.plan.buffers[bname].role != "input":
                    continue
                r = where[1]
                last_use[r] = max(last_use.get(r, -1), st.pos)
                first_seg.setdefault(r, seg.index)
    for step in sched.steps:  # a sync step's device views: no GPU node after it may reuse their buffers
        if isinstance(step, HostStep):
            for r in step.device_inputs:
                last_use[r] = max(last_use.get(r, -1), step.pos)
    for name, r in roots.items():
        if r.on_device and (r.onnx_type is None or r.shape is None):
            raise ExecutionError(f"value {name!r}: a GPU node reads it but its type or shape is not known "
                                 f"for input shapes {dict(shapes)}")
        if r.origin == "host" and r.on_device:
            r.upload_segment = first_seg[name]
            segments[r.upload_segment].uploads.append(name)
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
    for st in sched.prologue + [st for seg in segments for st in seg.steps]:
        for bname, where in st.buffers.items():
            if where[0] == "scratch":
                lifetimes.append(Lifetime(where[1], st.plan.buffers[bname].byte_size, st.pos, st.pos))
    slot_of, slot_sizes = assign_buffers(lifetimes, cap)
    return lifetimes, slot_of, slot_sizes


# ----------------------------------------------------------------------------- 8. report


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

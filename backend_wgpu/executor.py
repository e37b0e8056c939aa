"""Running one node's :class:`~backend_wgpu.plan.KernelPlan` on a :class:`GpuDevice`.

``run_plan(device, plan, inputs)``:

1. checks the plan against the device's limits (storage/uniform binding sizes, buffer size,
   bindings per stage, workgroups per dimension) and raises ``ExecutionError`` before anything
   is allocated;
2. the first time it sees a plan, *prepares* it: one storage buffer per input/output/
   intermediate/absent ``BufferPlan`` (at least 4 bytes, a multiple of 4; WebGPU zero-fills new
   buffers, which is what an absent optional input's stand-in needs), one uniform buffer per
   uniform ``BufferPlan`` (its bytes are constant for the plan, so they are written once),
   the rendered and compiled pipeline and a bind group per pass, and one persistent
   ``MAP_READ`` staging buffer holding every output; this state is cached on the device,
   so a second run of the same plan allocates and compiles nothing;
3. packs the inputs on the host (``backend_wgpu/packing.py``: sub-32-bit types little-endian
   in u32 words, int4/uint4/int2/uint2/float4e2m1 packed as ONNX packs them, float6 in byte
   containers) and writes them with ``write_buffer``;
4. records every pass (dispatch ``(0, 0, 0)`` skipped) and the output copies into one command
   encoder, submits once, maps the staging buffer, and unpacks the outputs into the dtypes
   ``onnx.numpy_helper.to_array`` uses.
"""

from __future__ import annotations

import time
from collections import ChainMap, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from onnx_quant.errors import ExecutionError

from .device import release_quietly
from . import index_check
from .device_value import DeviceValue
from .packing import etype as _etype, pack_array, packed_nbytes, unpack_array  # noqa: F401 (re-exported)
from .pipelines import layout_key
from .plan import BufferPlan, GpuStep, GraphPlan, HostStep, KernelPlan, Segment

#: how many prepared plans a device keeps (least recently used ones are released)
MAX_PREPARED_PLANS = 64


# -- limits --------------------------------------------------------------------------------

def check_limits(info, plan: KernelPlan, *, node: str = "") -> None:
    """Raise ExecutionError when the plan does not fit the device's limits."""
    lim = info.limits
    where = f"{'node ' + node + ': ' if node else ''}kernel {plan.kernel} variant {plan.variant}"

    def limit(name: str, default: int = 2**62) -> int:
        return int(lim.get(name, default))

    max_binding = limit("maxStorageBufferBindingSize")
    max_buffer = limit("maxBufferSize")
    max_uniform = limit("maxUniformBufferBindingSize")
    for b in plan.buffers.values():
        size = max(4, b.byte_size)
        if b.role == "uniform":
            if size > max_uniform:
                raise ExecutionError(f"{where}: uniform buffer {b.name} needs {size} bytes, beyond the device's "
                                     f"maxUniformBufferBindingSize {max_uniform} ({info.name})")
            continue
        what = f"{b.role} {b.name}" + (f" ({b.onnx_type} {list(b.shape)})" if b.shape is not None else "")
        if size > max_binding:
            raise ExecutionError(f"{where}: {what} needs {size} bytes, beyond the device's "
                                 f"maxStorageBufferBindingSize {max_binding} ({info.name})")
        if size > max_buffer:
            raise ExecutionError(f"{where}: {what} needs {size} bytes, beyond the device's "
                                 f"maxBufferSize {max_buffer} ({info.name})")
    max_dim = limit("maxComputeWorkgroupsPerDimension")
    max_storage = limit("maxStorageBuffersPerShaderStage")
    max_uniforms = limit("maxUniformBuffersPerShaderStage")
    max_inv = limit("maxComputeInvocationsPerWorkgroup")
    for p in plan.passes:
        if any(d > max_dim for d in p.dispatch):
            raise ExecutionError(f"{where} pass {p.id}: dispatch {list(p.dispatch)} exceeds the device's "
                                 f"maxComputeWorkgroupsPerDimension {max_dim} ({info.name})")
        n_storage = sum(1 for b in p.bindings if b.access != "uniform")
        n_uniform = len(p.bindings) - n_storage
        if n_storage > max_storage:
            raise ExecutionError(f"{where} pass {p.id}: {n_storage} storage buffers, beyond the device's "
                                 f"maxStorageBuffersPerShaderStage {max_storage} ({info.name})")
        if n_uniform > max_uniforms:
            raise ExecutionError(f"{where} pass {p.id}: {n_uniform} uniform buffers, beyond the device's "
                                 f"maxUniformBuffersPerShaderStage {max_uniforms} ({info.name})")
        wg = p.context.get("workgroup_size") if isinstance(p.context, Mapping) else None
        if isinstance(wg, int) and wg > max_inv:
            raise ExecutionError(f"{where} pass {p.id}: workgroup size {wg} exceeds the device's "
                                 f"maxComputeInvocationsPerWorkgroup {max_inv} ({info.name})")
        for b in p.bindings:
            if b.buffer not in plan.buffers:
                raise ExecutionError(f"{where} pass {p.id}: binding {b.var_name} names unknown buffer {b.buffer!r}")


# -- preparation and execution ---------------------------------------------------------------

@dataclass
class PreparedPlan:
    plan: KernelPlan
    buffers: dict[str, Any]
    steps: list[tuple[Any, Any, tuple[int, int, int], str]]
    staging: Any
    outputs: list[tuple[BufferPlan, int]]  # (buffer plan, offset in staging)


def _plan_cache(device) -> "OrderedDict[int, tuple[KernelPlan, PreparedPlan]]":
    cache = device.prepared
    if not isinstance(cache, OrderedDict):
        device.prepared = cache = OrderedDict(cache)
    return cache


def prepare(device, plan: KernelPlan, *, node: str = "") -> PreparedPlan:
    """Buffers, pipelines, bind groups and staging for a plan; cached on the device."""
    cache = _plan_cache(device)
    hit = cache.get(id(plan))
    if hit is not None and hit[0] is plan:
        cache.move_to_end(id(plan))
        return hit[1]
    check_limits(device.info, plan, node=node)
    buffers: dict[str, Any] = {}
    for name, b in plan.buffers.items():
        label = f"{plan.kernel}/{plan.variant}/{name}"
        if b.role == "uniform":
            buf = device.allocate_uniform(b.byte_size, label=label)
            if b.data:
                data = bytes(b.data)
                data += b"\0" * ((-len(data)) % 4)
                device.upload(buf, data)
        elif b.role == "node_id":  # a plan run alone is node 0 (the graph compiler numbers its own)
            buf = device.allocate_uniform(b.byte_size, label=label)
            device.upload(buf, bytes(b.data))
        else:
            buf = device.allocate(b.byte_size, label=label)
            if b.role == "data":  # plan-time data (a spec intermediate's `data`): written once
                device.upload(buf, bytes(b.data))
        buffers[name] = buf
    steps = []
    for p in plan.passes:
        if min(p.dispatch) <= 0:
            continue
        key = layout_key(p.bindings)
        compiled = device.compile_pass(p, key, label=f"{plan.kernel}/{plan.variant}/{p.id}",
                                       kernel=plan.kernel, variant=plan.variant)
        entries = [(b.index, buffers[b.buffer], buffers[b.buffer].size) for b in p.bindings]
        bind_group = device.bind(compiled, entries, label=f"{plan.kernel}/{plan.variant}/{p.id}",
                                 kernel=plan.kernel, variant=plan.variant, pass_id=p.id)
        steps.append((compiled, bind_group, tuple(int(d) for d in p.dispatch), p.id))
    outputs = []
    offset = 0
    for b in plan.buffers.values():
        if b.role in ("output", "errors"):  # the index checks' record comes back with the outputs
            outputs.append((b, offset))
            offset += buffers[b.name].size
    staging = device.allocate_staging(offset, label=f"{plan.kernel}/{plan.variant}/staging") if outputs else None
    prepared = PreparedPlan(plan, buffers, steps, staging, outputs)
    cache[id(plan)] = (plan, prepared)
    while len(cache) > MAX_PREPARED_PLANS:
        _, (_, old) = cache.popitem(last=False)
        _release(old)
    return prepared


def release_plan(device, plan: KernelPlan) -> bool:
    """Drop a plan's prepared state (buffers, bind groups, staging); True if there was one."""
    cache = _plan_cache(device)
    hit = cache.get(id(plan))
    if hit is None or hit[0] is not plan:
        return False
    del cache[id(plan)]
    _release(hit[1])
    return True


def _raise_index_fault(device, buffer, raw, describe) -> None:
    """Raise the IndexRangeError (or LoopLimitError) of a read-back error record (index_check.py),
    once the device's buffer is zeroed for the next run; nothing when no kernel flagged one."""
    err = index_check.fault(raw, describe)
    if err is not None:
        device.upload(buffer, index_check.ZEROS)
        raise err


def _release(prepared: PreparedPlan) -> None:
    for buf in list(prepared.buffers.values()) + ([prepared.staging] if prepared.staging is not None else []):
        try:
            buf.destroy()
        except Exception:  # pragma: no cover - best effort
            pass


def run_plan(device, plan: KernelPlan, inputs: Mapping[str, np.ndarray], *, node: str = "") -> dict[str, np.ndarray]:
    """Run every pass of a node in one submit; returns the outputs by BufferPlan name."""
    where = f"{'node ' + node + ': ' if node else ''}kernel {plan.kernel} variant {plan.variant}"
    packed: dict[str, bytes] = {}
    for name, b in plan.buffers.items():
        if b.role != "input":
            continue
        if name not in inputs:
            raise ExecutionError(f"{where}: input {name!r} not given (given: {sorted(inputs)})")
        arr = np.asarray(inputs[name])
        et = _etype(b.onnx_type)
        if arr.dtype != et.dtype:
            raise ExecutionError(f"{where}: input {name!r} must be {et.name} ({et.dtype}), found {arr.dtype}")
        if b.shape is not None and tuple(arr.shape) != tuple(b.shape):
            raise ExecutionError(f"{where}: input {name!r} has shape {list(arr.shape)}, the plan was made "
                                 f"for {list(b.shape)}")
    check_limits(device.info, plan, node=node)  # before packing: tensors may be huge
    for name, b in plan.buffers.items():
        if b.role == "input":
            data = pack_array(np.asarray(inputs[name]), b.onnx_type)
            if len(data) > max(4, b.byte_size):
                raise ExecutionError(f"{where}: input {name!r} packs to {len(data)} bytes, the plan's buffer "
                                     f"holds {b.byte_size}")
            packed[name] = data
    prep = prepare(device, plan, node=node)
    for name, data in packed.items():
        device.upload(prep.buffers[name], data)
    copies = [(prep.buffers[b.name], 0, prep.staging, off, prep.buffers[b.name].size) for b, off in prep.outputs]
    raw = device.launch(prep.steps, copies=copies, read=prep.staging, kernel=plan.kernel, variant=plan.variant)
    results: dict[str, np.ndarray] = {}
    if raw is None:
        return results
    for b, off in prep.outputs:
        if b.role == "errors":
            _raise_index_fault(device, prep.buffers[b.name], memoryview(raw)[off:off + index_check.ERROR_BYTES],
                               lambda _node, k: (f"node {node!r} ({plan.kernel})" if node else f"kernel {plan.kernel}",
                                                 repr(index_check.input_name(plan, k)),
                                                 index_check.check_entry(plan, k)))
    for b, off in prep.outputs:
        if b.role == "errors":
            continue
        shape = tuple(b.shape) if b.shape is not None else (b.byte_size // max(1, _etype(b.onnx_type).dtype.itemsize),)
        results[b.name] = unpack_array(memoryview(raw)[off:off + prep.buffers[b.name].size], b.onnx_type, shape)
    return results


# ============================================================================================
# The graph executor: a whole model's plan for one binding of input shapes
# ============================================================================================
#
# ``graph_plan.compile`` builds a frozen :class:`~backend_wgpu.plan.GraphPlan` (which node runs
# where, which value lives in which buffer, in which order the work is submitted); this section
# allocates its device state once into a :class:`PreparedGraph` (:func:`prepare_graph`), runs it
# (:func:`run_graph`) and frees it (:func:`release_graph`). It never imports the compiler, nor the
# compiler it: both read plan.py. docs/backend.md, "Graph execution", describes the model; the
# short form:
#
# * values are *roots* (a tensor some node or the caller produces) or *aliases* (the output of
#   a view node: a root with another shape, sharing its buffer);
# * the schedule is a list of steps: ``Segment`` (GPU nodes recorded into ONE encoder, ONE
#   submit) and ``HostStep`` (a node run by onnx.reference); a segment ends only where a host
#   node needs a value the open segment produces;
# * pooled values (feeds, GPU-produced values, host values uploaded for GPU nodes, kernel
#   scratch buffers) have buffers the compiler assigned over their lifetimes, by size class.


@dataclass
class SessionStats:
    """What a Session did on the device (and the host), for tests, ``bench`` and ``run``.

    A second ``run`` with the same input shapes moves only ``runs``, ``submits``,
    ``dispatches``, ``readbacks``, ``bytes_uploaded``, ``bytes_read_back`` and
    ``host_nodes_run``: it compiles no pipeline, allocates no buffer and creates no bind group
    (outputs kept on the device are the exception: each gets a buffer of its own).
    """

    runs: int = 0
    plans: int = 0                 # graph plans made (one per binding of input shapes)
    pipelines_compiled: int = 0
    buffers_allocated: int = 0
    bytes_allocated: int = 0
    bind_groups_created: int = 0
    submits: int = 0
    dispatches: int = 0            # compute dispatches recorded (the kernels' passes that ran)
    prologue_dispatches: int = 0   # dispatches of constants-only nodes, once per plan (not per run)
    readbacks: int = 0             # staging buffer maps (waits)
    bytes_uploaded: int = 0
    bytes_read_back: int = 0
    host_nodes_run: int = 0
    #: host time spent building and recording the runs' commands up to each submit's return
    #: (not the wait for the device; not counted in profiled runs)
    host_encode_us: float = 0.0
    #: the same up to the last command recorded: without wgpu-native's pass end and finish
    host_record_us: float = 0.0

    def snapshot(self) -> dict[str, int]:
        return dict(self.__dict__)

    def as_dict(self) -> dict[str, int]:
        return self.snapshot()

    def add(self, moved: Mapping[str, Any]) -> None:
        """Count what another session moved on our behalf (an If / Loop body's run)."""
        for k, v in moved.items():
            if k not in ("runs", "plans") and k in self.__dict__:
                setattr(self, k, getattr(self, k) + v)

    def since(self, before: Mapping[str, Any]) -> dict[str, Any]:
        """What moved since ``before`` (a ``snapshot()``): one run's figures."""
        return {k: v - before.get(k, 0) for k, v in self.__dict__.items()}

    def __getitem__(self, key: str) -> int:
        return self.__dict__[key]


@dataclass
class PreparedGraph:
    """The executor's device state for one :class:`~onnx_quant.backend_wgpu.plan.GraphPlan`
    (:func:`prepare_graph`): the pooled buffers (one per slot), the folded values' and the
    once-per-plan buffers, the uniform buffer, each GPU step's per-run dispatch commands (by node
    index), the read-back staging buffer (grown as needed), and what runs build once and reuse:
    the read-back layouts and the prebuilt programs per set of requested outputs."""

    plan: GraphPlan
    slots: list[Any]
    uniform: Any
    fold_buffers: dict[str, Any]
    once_buffers: dict[Any, Any]
    #: GPU step's node index -> its per-run commands (the hoisted passes ran in the prologue)
    dispatches: dict[int, list[tuple]]
    staging: Any = None
    staging_size: int = 0
    #: the index checks' error record (index_check.py): one buffer for every checking pass of the plan
    errors: Any = None
    #: requested outputs -> per segment index: [(root, offset, nbytes)]
    readback_layouts: dict[tuple, dict[int, list[tuple[str, int, int]]]] = field(default_factory=dict)
    #: (segment, requested roots) -> (flat command list, dispatches): a run's prebuilt program
    programs: dict[tuple, tuple[list, int]] = field(default_factory=dict)
    released: bool = False
    #: (node index, pass index) -> the pass's (pipeline key, WGSL source): what the plan cache stores
    shaders: dict[tuple[int, int], tuple[tuple, str]] = field(default_factory=dict)


class SessionResources:
    """Device buffers a Session keeps across plans: initializers and Constant values (uploaded
    once per session) and the 4-byte zero-filled stand-ins of absent optional inputs."""

    def __init__(self, device, stats: SessionStats) -> None:
        self.device = device
        self.stats = stats
        self.constants: dict[str, Any] = {}
        self.zero: list[Any] = []

    def allocate(self, size: int, *, label: str, kind: str = "storage"):
        dev = self.device
        if kind == "uniform":
            buf = dev.allocate_uniform(size, label=label)
        elif kind == "staging":
            buf = dev.allocate_staging(size, label=label)
        else:
            buf = dev.allocate(size, label=label)
        self.stats.buffers_allocated += 1
        self.stats.bytes_allocated += buf.size
        return buf

    def upload(self, buf, data, offset: int = 0) -> None:
        n = len(memoryview(data).cast("B"))
        self.device.upload(buf, data, offset)
        self.stats.bytes_uploaded += n

    def constant_buffer(self, name: str, array: np.ndarray, onnx_type: str):
        buf = self.constants.get(name)
        if buf is None:
            data = pack_array(np.asarray(array), onnx_type)
            buf = self.allocate(len(memoryview(data).cast("B")), label=f"constant {name}")
            self.upload(buf, data)
            self.constants[name] = buf
        return buf

    def zero_buffer(self, k: int):
        while len(self.zero) <= k:  # WebGPU zero-fills new buffers; nothing ever writes these
            self.zero.append(self.allocate(4, label=f"absent input stand-in {len(self.zero)}"))
        return self.zero[k]

    def release(self) -> None:
        for buf in list(self.constants.values()) + self.zero:
            _destroy(buf)
        self.constants.clear()
        self.zero.clear()


def _destroy(buf) -> None:
    release_quietly(buf)


def prepare_graph(device, gplan: GraphPlan, res: SessionResources, constants: Mapping[str, np.ndarray],
                  shaders: Mapping[tuple[int, int], tuple[tuple, str]] | None = None) -> PreparedGraph:
    """A plan's device state, allocated once: pooled buffers, the folded values' buffers, one
    uniform buffer with a 256-byte-aligned region per pass (written once: its bytes depend
    only on the shapes), every pass's pipeline (compiled through the device's pipeline cache,
    so shared by every plan and session on the device) and bind group; the prologue (constant
    nodes and hoisted passes) submitted once. ``shaders``: per (node index, pass index) the
    pass's (pipeline key, WGSL source) from the plan cache, not keyed or rendered again; the
    result's ``shaders`` has every pass's. On failure nothing it allocated is kept."""
    for step in gplan.gpu_steps:
        check_limits(device.info, step.plan, node=step.label)
    stats = res.stats
    created: list[Any] = []
    try:
        slots = []
        for i, size in enumerate(gplan.slot_sizes):
            slots.append(res.allocate(size, label=f"pool {i}"))
            created.append(slots[-1])
        fold_buffers: dict[str, Any] = {}
        once_buffers: dict[str, Any] = {}
        for name, arr in gplan.folded.items():
            r = gplan.roots[name]
            if not r.on_device:
                continue
            data = pack_array(np.asarray(arr), r.onnx_type)
            buf = res.allocate(len(memoryview(data).cast("B")), label=f"folded {name}")
            created.append(buf)
            res.upload(buf, data)
            fold_buffers[name] = buf
        uniform = None
        if gplan.uniform_size:
            uniform = res.allocate(gplan.uniform_size, label="uniforms", kind="uniform")
            created.append(uniform)
            blob = bytearray(uniform.size)
            for off, data in gplan.uniform_regions:
                blob[off:off + len(data)] = data
            res.upload(uniform, bytes(blob))

        def buffer_of(step: GpuStep, bname: str):
            where = step.buffers[bname]
            kind = where[0]
            if kind == "value":
                root = gplan.roots[where[1]]
                if root.origin in ("init", "const"):
                    return res.constant_buffer(root.name, constants[root.name], root.onnx_type), 0
                if root.origin == "fold":
                    return fold_buffers[root.name], 0
                if root.origin == "once":
                    if root.name not in once_buffers:
                        once_buffers[root.name] = res.allocate(max(4, root.nbytes), label=f"constant {root.name}")
                        created.append(once_buffers[root.name])
                    return once_buffers[root.name], 0
                return slots[gplan.slot_of[root.name]], 0
            if kind == "scratch":
                return slots[gplan.slot_of[where[1]]], 0
            if kind == "kept":
                if where[1] not in once_buffers:
                    once_buffers[where[1]] = res.allocate(max(4, step.plan.buffers[bname].byte_size),
                                                          label=f"kept {step.label}/{bname}")
                    created.append(once_buffers[where[1]])
                return once_buffers[where[1]], 0
            if kind == "data":  # plan-time data: a buffer of its own, written once
                if where[1] not in once_buffers:
                    once_buffers[where[1]] = res.allocate(max(4, step.plan.buffers[bname].byte_size),
                                                          label=f"data {step.label}/{bname}")
                    created.append(once_buffers[where[1]])
                    res.upload(once_buffers[where[1]], bytes(step.plan.buffers[bname].data))
                return once_buffers[where[1]], 0
            if kind == "absent":
                return res.zero_buffer(where[1]), 0
            if kind == "errors":
                if index_check.READBACK_KEY not in once_buffers:
                    once_buffers[index_check.READBACK_KEY] = res.allocate(index_check.ERROR_BYTES, label="index errors")
                    created.append(once_buffers[index_check.READBACK_KEY])
                return once_buffers[index_check.READBACK_KEY], 0
            if kind == "uniform":
                return uniform, where[1]
            raise ExecutionError(f"node {step.label}: buffer {bname}: unknown placement {where!r}")  # pragma: no cover

        hoisted: list[tuple] = []  # the run steps' constant passes, recorded into the prologue
        dispatches: dict[int, list[tuple]] = {}
        seen_shaders: dict[tuple[int, int], tuple[tuple, str]] = {}
        shaders = shaders or {}
        for step in gplan.gpu_steps:
            plan = step.plan
            dispatches[step.index] = mine = []
            for i, p in enumerate(plan.passes):
                if min(p.dispatch) <= 0:
                    continue
                before = device.pipelines.compilations
                compiled = device.compile_pass(p, layout_key(p.bindings),
                                               label=f"{step.label}/{plan.kernel}/{plan.variant}/{p.id}",
                                               kernel=plan.kernel, variant=plan.variant,
                                               known=shaders.get((step.index, i)))
                seen_shaders[(step.index, i)] = device.pipelines.last_shader
                stats.pipelines_compiled += device.pipelines.compilations - before
                entries = []
                for b in p.bindings:
                    buf, offset = buffer_of(step, b.buffer)
                    bp = plan.buffers[b.buffer]
                    size = max(4, bp.byte_size) if bp.role != "uniform" else max(16, -(-bp.byte_size // 16) * 16)
                    if offset + size > buf.size:
                        raise ExecutionError(f"node {step.label}: kernel {plan.kernel} variant {plan.variant} pass "
                                             f"{p.id}: {b.buffer} needs {size} bytes, its buffer holds "
                                             f"{buf.size - offset}")
                    entries.append((b.index, buf, offset, size))
                bg = device.bind(compiled, entries, label=f"{step.label}/{p.id}",
                                 kernel=plan.kernel, variant=plan.variant, pass_id=p.id)
                stats.bind_groups_created += 1
                # the raw handles ride along for GpuDevice.submit's direct path
                cmd = ("dispatch", compiled, bg, tuple(int(d) for d in p.dispatch),
                       f"{step.label}/{p.id}", (compiled.pipeline._internal, bg._internal))
                (hoisted if i < step.hoisted else mine).append(cmd)
        prologue = [c for st in gplan.prologue for c in dispatches[st.index]] + hoisted
        errors = once_buffers.get(index_check.READBACK_KEY)
        if prologue:  # constants computed on the device, once per plan
            checked = errors is not None and any(index_check.checks(st.plan) for st in gplan.prologue)
            staging = res.allocate(index_check.ERROR_BYTES, label="prologue index errors", kind="staging") \
                if checked else None
            created += [staging] if checked else []
            copy = [("copy", errors, 0, staging, 0, index_check.ERROR_BYTES)] if checked else []
            raw = device.submit(prologue + copy, label="plan constants", read=staging,
                                read_size=index_check.ERROR_BYTES if checked else None)
            stats.submits += 1
            stats.prologue_dispatches += len(prologue)
            if raw is not None:
                _raise_index_fault(device, errors, memoryview(raw), _describer(gplan))
    except BaseException:
        for buf in created:
            _destroy(buf)
        raise
    return PreparedGraph(gplan, slots, uniform, fold_buffers, once_buffers, dispatches, shaders=seen_shaders,
                         errors=errors)


def _describer(gplan: GraphPlan):
    """describe(node id, input ordinal) of index_check.fault over a graph plan's GPU steps."""
    def describe(node_id: int, ordinal: int) -> tuple[str, str, dict | None]:
        step = next((st for st in gplan.gpu_steps if st.index == node_id), None)
        if step is None:
            return f"node #{node_id}", f"#{ordinal}", None
        name = index_check.input_name(step.plan, ordinal)
        where = step.buffers.get(name, ())
        value = f" (value {where[1]!r})" if len(where) > 1 and where[0] == "value" else ""
        return f"node {step.label!r} ({step.op_type})", f"{name!r}{value}", index_check.check_entry(step.plan, ordinal)
    return describe


def release_graph(prep: PreparedGraph | None) -> None:
    """Free a prepared plan's buffers (pooled, folded, once-per-plan, uniform, staging) and
    forget its commands; the pipelines stay cached on the device. Releasing twice is harmless."""
    if prep is None or prep.released:
        return
    for buf in (list(prep.slots) + list(prep.fold_buffers.values()) + list(prep.once_buffers.values())
                + [prep.uniform, prep.staging]):
        if buf is not None:
            _destroy(buf)
    prep.slots, prep.fold_buffers, prep.once_buffers = [], {}, {}
    prep.uniform = prep.staging = None
    prep.staging_size = 0
    prep.dispatches, prep.programs, prep.readback_layouts = {}, {}, {}
    prep.released = True


def _readback_layout(prep: PreparedGraph, wanted_roots: frozenset[str]) -> dict[int, list[tuple[str, int, int]]]:
    """Per segment: the GPU-produced roots to copy into the staging buffer (those host nodes
    read and the requested outputs), at which offsets. The staging buffer is reused by every
    segment (each maps and unmaps it before the next records anything)."""
    gplan = prep.plan
    key = tuple(sorted(wanted_roots))
    layout = prep.readback_layouts.get(key)
    if layout is not None:
        return layout
    layout = {}
    for seg in gplan.segments:
        offset = 0
        entries = []
        for step in seg.steps:
            for root in step.outputs:
                r = gplan.roots[root]
                if r.on_host or root in wanted_roots:
                    n = max(4, (r.nbytes + 3) // 4 * 4)
                    entries.append((root, offset, n))
                    offset += n
        if any(index_check.checks(st.plan) for st in seg.steps):  # the error record rides along
            entries.append((index_check.READBACK_KEY, offset, index_check.ERROR_BYTES))
        layout[seg.index] = entries
    prep.readback_layouts[key] = layout
    return layout


def run_graph(
    device,
    prep: PreparedGraph,
    res: SessionResources,
    feeds: Mapping[str, Any],
    host_values: dict[str, Any],
    run_host: Any,
    wanted_roots: frozenset[str],
    *,
    kept_roots: frozenset[str] = frozenset(),
    profiler: Any = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run a prepared plan (``prep``, :func:`prepare_graph`). ``host_values`` starts with the feeds, initializers, constants and
    folded values; host nodes' outputs and the values read back are added to it. ``run_host(step,
    values) -> list of arrays`` runs one host node. Returns (``host_values``, the device buffers
    of ``kept_roots``: GPU-produced roots copied device-to-device into a fresh buffer each, for
    outputs that stay on the device). A feed may be a ``DeviceValue``: it is copied
    device-to-device into the plan's buffer in the first segment's encoder (and read back only
    if a host node reads it). ``profiler``: a ``profiling.Profiler`` that times every node.

    Costs: all host feeds the GPU reads are written (``write_buffer``) before the first encoder;
    each segment is ONE encoder and ONE submit, preceded by the uploads of the host values it
    reads; a segment maps the persistent staging buffer once if anything it produces is read
    (by a later host node, or as a requested output), each such value copied into the staging
    buffer right after the node that produced it.
    """
    stats = res.stats
    gplan = prep.plan
    if prep.released:
        raise ExecutionError("the plan's device state was released")
    layout = _readback_layout(prep, wanted_roots)
    need = max((sum(n for _, _, n in entries) for entries in layout.values()), default=0)
    if need > prep.staging_size:
        if prep.staging is not None:
            _destroy(prep.staging)
        prep.staging = res.allocate(need, label="read-back staging", kind="staging")
        prep.staging_size = prep.staging.size

    def upload_root(name: str, arr: Any) -> None:
        r = gplan.roots[name]
        if isinstance(arr, DeviceValue):  # a tensor a sequence step gives: copied device-to-device
            if arr.dims != tuple(r.shape or ()) or arr.onnx_type != r.onnx_type:
                raise ExecutionError(f"value {name!r}: the plan expects {r.onnx_type} {list(r.shape or ())}, "
                                     f"found {arr.onnx_type} {list(arr.dims)}")
            pending.append(("copy", arr.buffer, 0, prep.slots[gplan.slot_of[name]], 0, max(4, r.nbytes)))
            return
        arr = np.asarray(arr)
        data = pack_array(arr, r.onnx_type)
        n = len(memoryview(data).cast("B"))
        if r.shape is not None and tuple(arr.shape) != tuple(r.shape) or n > max(4, r.nbytes):
            raise ExecutionError(f"value {name!r}: the plan expects {r.onnx_type} {list(r.shape or ())}, "
                                 f"found {arr.dtype} {list(arr.shape)}")
        res.upload(prep.slots[gplan.slot_of[name]], data)

    # every feed a GPU node reads, before the first encoder: host arrays written now, device
    # values copied at the head of the first segment; a device value a host node reads comes back
    pending: list[tuple] = []
    for name, r in gplan.roots.items():
        if r.origin != "feed":
            continue
        value = feeds[name]
        if isinstance(value, DeviceValue):
            if r.on_device:
                pending.append(("copy", value.buffer, 0, prep.slots[gplan.slot_of[name]], 0, max(4, r.nbytes)))
            if r.on_host:
                host_values[name] = value.numpy()
                stats.readbacks += 1
                stats.bytes_read_back += value.nbytes
        elif r.on_device:
            upload_root(name, value)
    kept: dict[str, Any] = {}
    program_key = tuple(sorted(wanted_roots))
    if profiler is not None:
        profiler.begin_run()
    for step in gplan.schedule:
        if isinstance(step, HostStep):
            t0 = profiler.now_us() if profiler is not None else 0.0
            seen = host_values
            if step.device_inputs:  # views of pooled buffers, never kept in host_values (slots are reused)
                seen = ChainMap({r: DeviceValue.borrowed(device, prep.slots[gplan.slot_of[r]], gplan.roots[r].onnx_type,
                                                         gplan.roots[r].shape) for r in step.device_inputs}, host_values)
            outs = run_host(step, seen)
            if profiler is not None:
                profiler.host_step(step, t0, profiler.now_us())
            stats.host_nodes_run += 1
            for name, value in zip(step.outputs, outs):
                if name:
                    host_values[name] = value
            continue
        seg: Segment = step
        for name in seg.uploads:
            upload_root(name, host_values[name])
        t_encode = time.perf_counter()
        entries = layout.get(seg.index, [])
        total = sum(n for _, _, n in entries)
        read, read_size, label = (prep.staging if total else None), (total or None), f"segment {seg.index}"
        cached = prep.programs.get((seg.index, program_key)) if not (pending or profiler) else None
        if cached is None:
            groups = _segment_groups(prep, seg, entries, kept_roots, pending, res, kept)
            pending = []
            flat = [c for _, cmds in groups for c in cmds]
            cached = (compact_program(flat) if device.raw_recording else flat,
                      sum(1 for c in flat if c[0] == "dispatch" and min(c[3]) > 0))
            if not kept_roots.intersection(r for st in seg.steps for r in st.outputs) and profiler is None:
                prep.programs[(seg.index, program_key)] = cached  # the same every run: build it once
        flat, n_dispatches = cached
        stats.dispatches += n_dispatches
        if profiler is not None:
            raw = profiler.run_segment(groups, read=read, read_size=read_size, label=label)
        else:
            # the host's encoding cost: building the command list and recording it, up to finish()
            times: list[tuple[float, float]] = []
            t_record = time.perf_counter()
            raw = device.submit(flat, read=read, read_size=read_size, label=label, times=times)
            stats.host_encode_us += ((t_record - t_encode) + times[0][0]) * 1e6
            stats.host_record_us += ((t_record - t_encode) + times[0][2]) * 1e6
        stats.submits += 1
        if raw is None:
            continue
        stats.readbacks += 1
        stats.bytes_read_back += total
        mv = memoryview(raw)
        if entries and entries[-1][0] == index_check.READBACK_KEY:  # before any value is trusted
            off = entries[-1][1]
            _raise_index_fault(device, prep.errors, mv[off:off + index_check.ERROR_BYTES], _describer(gplan))
        for root, off, n in entries:
            if root == index_check.READBACK_KEY:
                continue
            r = gplan.roots[root]
            host_values[root] = unpack_array(mv[off:off + n], r.onnx_type, tuple(r.shape or ()))
    if profiler is not None:
        profiler.end_run()
    return host_values, kept



def _segment_groups(prep: PreparedGraph, seg: Segment, entries: list, kept_roots: frozenset[str], pending: list,
                    res: SessionResources, kept: dict[str, Any]) -> list[tuple[GpuStep, list[tuple]]]:
    """A segment's commands per GPU step: ``pending`` copies (device feeds) first, each step's
    dispatches, then the copies of what it produced into the read-back staging buffer (``entries``)
    and into fresh buffers for outputs kept on the device (allocated here, put in ``kept``)."""
    offsets = {root: (off, n) for root, off, n in entries}
    groups: list[tuple[GpuStep, list[tuple]]] = []
    for gs in seg.steps:
        cmds = pending + list(prep.dispatches[gs.index])
        pending = []
        for root in gs.outputs:
            src = prep.slots[prep.plan.slot_of[root]] if root in offsets or root in kept_roots else None
            if root in offsets:
                off, n = offsets[root]
                cmds.append(("copy", src, 0, prep.staging, off, n))
            if root in kept_roots:
                n = max(4, prep.plan.roots[root].nbytes)
                kept[root] = res.allocate(n, label=f"kept output {root}")
                cmds.append(("copy", src, 0, kept[root], 0, n))
        groups.append((gs, cmds))
    if index_check.READBACK_KEY in offsets and groups:  # after the segment's last dispatch
        off, n = offsets[index_check.READBACK_KEY]
        groups[-1][1].append(("copy", prep.errors, 0, prep.staging, off, n))
    return groups


def compact_program(commands: list[tuple]) -> list[tuple]:
    """The same commands with every run of consecutive dispatches that carry raw handles folded
    into one ``("dispatches", [(pipeline, bind group, x, y, z), ...], labels)``: what
    ``GpuDevice.submit`` records in one tight loop of wgpu-native calls."""
    out: list[tuple] = []
    for c in commands:
        if c[0] == "dispatch" and len(c) > 5 and min(c[3]) > 0:
            if not out or out[-1][0] != "dispatches":
                out.append(("dispatches", [], []))
            out[-1][1].append(c[5] + tuple(c[3]))
            out[-1][2].append(c[4])
        elif c[0] != "dispatch" or min(c[3]) > 0:
            out.append(c)
    return out

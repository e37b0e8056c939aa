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

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from backend_wgpu.packing import etype as _etype, pack_array, packed_nbytes, unpack_array  # noqa: F401 (re-exported)
from backend_wgpu.pipelines import layout_key
from backend_wgpu.plan import BufferPlan, KernelPlan
from backend_wgpu.render import render
from onnx_quant.errors import ExecutionError

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
    sources: dict[str, str]


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
        else:
            buf = device.allocate(b.byte_size, label=label)
        buffers[name] = buf
    steps = []
    sources = {}
    for p in plan.passes:
        if min(p.dispatch) <= 0:
            continue
        source = render(p)
        sources[p.id] = source
        key = layout_key(p.bindings)
        compiled = device.compile(source, key, label=f"{plan.kernel}/{plan.variant}/{p.id}",
                                  kernel=plan.kernel, variant=plan.variant, pass_id=p.id)
        entries = [(b.index, buffers[b.buffer], buffers[b.buffer].size) for b in p.bindings]
        bind_group = device.bind(compiled, entries, label=f"{plan.kernel}/{plan.variant}/{p.id}",
                                 kernel=plan.kernel, variant=plan.variant, pass_id=p.id)
        steps.append((compiled, bind_group, tuple(int(d) for d in p.dispatch), p.id))
    outputs = []
    offset = 0
    for b in plan.buffers.values():
        if b.role == "output":
            outputs.append((b, offset))
            offset += buffers[b.name].size
    staging = device.allocate_staging(offset, label=f"{plan.kernel}/{plan.variant}/staging") if outputs else None
    prepared = PreparedPlan(plan, buffers, steps, staging, outputs, sources)
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
        shape = tuple(b.shape) if b.shape is not None else (b.byte_size // max(1, _etype(b.onnx_type).dtype.itemsize),)
        results[b.name] = unpack_array(memoryview(raw)[off:off + prep.buffers[b.name].size], b.onnx_type, shape)
    return results

"""The plans: what the planner and the graph compiler produce and the executor consumes.

Contract between the spec side (``spec.py``/``expr.py``/``planner.py``, ``graph_plan.py``) and the
device side (``render.py``/``executor.py``): :class:`KernelPlan` for one node, :class:`GraphPlan` for
a whole model at one binding of input shapes. Pure, frozen data; no wgpu. Neither side imports
the other: both import this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BufferPlan:
    """A device buffer used by a node's passes.

    ``role`` is ``"input"``/``"output"`` (a node tensor, by the spec's input/output name),
    ``"intermediate"`` (allocated per plan), ``"data"`` (an intermediate whose contents, ``data``,
    the planner computed: written once per plan) or ``"uniform"`` (one per pass, contents in
    ``data``, laid out by WGSL uniform rules). ``onnx_type`` and ``shape`` describe the
    tensor a storage buffer holds (sub-32-bit types packed little-endian in u32 words);
    ``byte_size`` is the allocation size, a multiple of 4 and at least 4.
    """

    name: str
    role: str
    byte_size: int
    onnx_type: str | None = None
    shape: tuple[int, ...] | None = None
    data: bytes | None = None


@dataclass(frozen=True)
class BindingPlan:
    """One ``@group(0) @binding(index)`` of a pass."""

    index: int
    var_name: str          # the WGSL variable the shader declares
    buffer: str            # BufferPlan.name
    access: str            # "read" (read-only storage) | "read_write" (storage) | "uniform"
    element_type: str      # WGSL element type, e.g. "f32", "u32", "vec4<f32>", or struct name
    length: int | None = None
    struct: tuple[tuple[str, str], ...] | None = None  # uniform members (name, wgsl type)


@dataclass(frozen=True)
class PassPlan:
    """One compute dispatch: shader template, its render context, bindings, grid."""

    id: str
    name: str
    shader: str                                  # template file name in templates/
    context: dict[str, Any]                      # variables the template is rendered with
    bindings: tuple[BindingPlan, ...]
    dispatch: tuple[int, int, int]
    #: the spec's own folder, searched for ``shader`` (and what it includes) before the installed
    #: templates; None: the installed templates only
    template_dir: str | None = None


@dataclass(frozen=True)
class KernelPlan:
    """Everything needed to run one node: chosen variant, buffers, ordered passes."""

    kernel: str
    variant: str
    derived: dict[str, Any]
    buffers: dict[str, BufferPlan]
    passes: tuple[PassPlan, ...]
    #: why this variant: each candidate's id -> the first ``when`` clause that failed (None if all held)
    selection: dict[str, str | None] = field(default_factory=dict)


# ============================================================================================
# The plan of a whole model for one binding of input shapes: what graph_plan.compile produces
# and the graph executor (executor.py) runs. Frozen: the executor keeps its device state (buffers,
# bind groups, programs) in a PreparedGraph of its own, never here.
# ============================================================================================


@dataclass(frozen=True)
class Lifetime:
    """A pooled value: ``key`` lives in a buffer of ``nbytes`` from GPU position ``start`` to
    ``end`` inclusive (positions number the GPU nodes in schedule order, across segments)."""

    key: Any
    nbytes: int
    start: int
    end: int


@dataclass(frozen=True)
class RootValue:
    """A tensor the run produces or receives. ``origin``: ``feed`` (a graph input, uploaded
    at the start of every run), ``init`` (an initializer) or ``const`` (a Constant node's
    value; both uploaded once per session), ``fold`` (a value shape inference computed for
    this binding, e.g. a Shape; uploaded once per plan), ``gpu`` (a GPU node's output),
    ``once`` (the output of a GPU node whose inputs are all constants: computed once per plan
    into a buffer of its own) or ``host`` (a host node's output)."""

    name: str
    onnx_type: str | None
    shape: tuple[int, ...] | None
    origin: str
    #: device bytes (packed) when the value has a known type and shape
    nbytes: int = 0
    on_device: bool = False      # some GPU node reads it
    on_host: bool = False        # some host node reads it (read back when produced on the GPU)
    #: for ``gpu`` roots: the GPU position of the producer; for ``host`` roots uploaded to
    #: the device: the segment that uploads them
    producer_pos: int = -1
    upload_segment: int = -1
    segment: int = -1            # ``gpu`` roots: the segment that produces them


@dataclass(frozen=True)
class GpuStep:
    """One node run by its kernel: the plan and, per BufferPlan name, where its buffer is:
    ``("value", root)``, ``("scratch", key)`` (pooled), ``("kept", key)`` (scratch a hoisted pass
    writes: a buffer of its own for the plan's life), ``("data", key)`` (plan-time data: a buffer of its own,
    written once), ``("absent", k)`` or ``("uniform", offset, size)``."""

    index: int
    label: str
    op_type: str
    pos: int
    plan: KernelPlan
    buffers: dict[str, tuple]
    outputs: tuple[str, ...]     # roots it produces
    #: leading passes over constants only, run once per plan in the prologue (graph_plan.hoist_constant_passes)
    hoisted: int = 0


@dataclass(frozen=True)
class Segment:
    """GPU steps recorded into ONE encoder and submitted once."""

    index: int
    steps: tuple[GpuStep, ...]
    #: host-produced roots written to the device (write_buffer) before this segment's submit
    uploads: tuple[str, ...] = ()

    @property
    def start(self) -> int:
        return self.steps[0].pos if self.steps else 0

    @property
    def end(self) -> int:
        return self.steps[-1].pos if self.steps else 0


@dataclass(frozen=True)
class HostStep:
    """One node run on the host by onnx.reference (or an If / Loop / Scan, NonZero's region).
    ``inputs``: (name the node reads, root, shape to view it with); the same for the outer-scope
    names its subgraphs read."""

    index: int
    label: str
    op_type: str
    inputs: tuple[tuple[str, str, tuple[int, ...] | None], ...]
    outputs: tuple[str, ...]
    reason: str
    #: pooled roots (GPU-made, fed) the step reads as views of their buffers (a sync step: data_dependent.py)
    device_inputs: tuple[str, ...] = ()
    #: the GPU position of the next GPU node: the step runs before it (device views live until then)
    pos: int = -1
    #: per output, the element type (TensorProto code) inference gives it for this binding (0: unknown)
    output_types: tuple[int, ...] = ()
    #: a sequence step (sequences.py): the values it makes may hold its device inputs (a list's
    #: elements), so their buffers live until the run ends
    holds: bool = False


@dataclass(frozen=True)
class GraphPlan:
    """Everything needed to run a model for one binding of input shapes (``key``)."""

    key: tuple
    roots: dict[str, RootValue]
    #: value name -> (root name, shape): identity for roots, the view's shape for aliases
    alias: dict[str, tuple[str, tuple[int, ...] | None]]
    #: ``Segment`` and ``HostStep`` in execution order
    schedule: tuple[Any, ...]
    #: per node index: "gpu" | "host" | "view" | "const" | "fold" | "unused", and why
    placement: dict[int, tuple[str, str]]
    lifetimes: tuple[Lifetime, ...]
    slot_of: dict[Any, int]
    slot_sizes: tuple[int, ...]
    uniform_regions: tuple[tuple[int, bytes], ...]   # (offset, bytes) in the plan's uniform buffer
    uniform_size: int
    folded: dict[str, Any]                          # name -> np.ndarray computed by inference
    #: GPU nodes of constants only (``once`` roots), run once when the plan is prepared
    prologue: tuple[GpuStep, ...] = ()

    @property
    def gpu_steps(self) -> list[GpuStep]:
        """Every GPU node of the plan: the prologue's, then the segments' in run order."""
        return list(self.prologue) + [s for seg in self.schedule if isinstance(seg, Segment) for s in seg.steps]

    @property
    def segments(self) -> list[Segment]:
        return [s for s in self.schedule if isinstance(s, Segment)]

    def memory(self) -> dict[str, int]:
        """How well buffers are reused: pooled values vs the buffers that hold them."""
        return {
            "pooled_values": len(self.lifetimes),
            "pooled_buffers": len(self.slot_sizes),
            "value_bytes": sum(max(4, lt.nbytes) for lt in self.lifetimes),
            "buffer_bytes": sum(self.slot_sizes),
        }

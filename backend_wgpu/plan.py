"""The plan of one node: what the planner produces and the executor consumes.

Contract between the spec side (``spec.py``/``expr.py``/``planner.py``) and the device
side (``render.py``/``executor.py``). Pure data; no wgpu.
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

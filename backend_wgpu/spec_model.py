"""Kernel spec data: the frozen dataclasses a loaded ``*.kernel.json`` becomes (KernelSpec,
Variant, Pass, bindings, tunables, derives, tensor and attribute declarations) and the WGSL type
layouts their bindings use. Loading and validation: spec_loader.py; lookup: spec.py."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .expr import Expr, Value

DEFAULT_DOMAIN = "ai.onnx"

#: Keys the planner puts into every pass's template context; derived names may not use them.
CONTEXT_KEYS = frozenset({
    "kernel", "variant", "pass_id", "tunables", "bindings", "binding", "features", "workgroup_size",
    "attrs", "dtypes", "present", "values", "index_checks", "loop_checks",
})

#: The ``buffer`` key of a binding -> BindingPlan.access.
ACCESS_BY_BUFFER = {"storage": "read_write", "read-only-storage": "read", "uniform": "uniform"}

# --------------------------------------------------------------------------- WGSL types

_SCALARS = {"f32": (4, 4), "i32": (4, 4), "u32": (4, 4), "f16": (2, 2)}
_VEC_RE = re.compile(r"^vec([234])<(f32|i32|u32|f16)>$")
_VEC_ALIAS_RE = re.compile(r"^vec([234])([fiuh])$")
_ALIAS_SCALAR = {"f": "f32", "i": "i32", "u": "u32", "h": "f16"}
_ATOMIC_RE = re.compile(r"^atomic<(i32|u32)>$")


def wgsl_type_layout(wgsl_type: str, *, storage: bool = False) -> tuple[int, int] | None:
    """(size, alignment) in bytes of a host-shareable WGSL scalar/vector type, or None.

    Scalars ``f32 i32 u32 f16``, vectors ``vecN<T>`` and their aliases (``vec4f``...).
    With ``storage=True`` ``atomic<u32>``/``atomic<i32>`` are accepted too.
    """
    if not isinstance(wgsl_type, str):
        return None
    t = wgsl_type.strip()
    if t in _SCALARS:
        return _SCALARS[t]
    m = _VEC_RE.match(t) or _VEC_ALIAS_RE.match(t)
    if m:
        n = int(m.group(1))
        scalar = m.group(2) if len(m.group(2)) == 3 else _ALIAS_SCALAR[m.group(2)]
        s = _SCALARS[scalar][0]
        return (n * s, (2 if n == 2 else 4) * s)
    if storage and _ATOMIC_RE.match(t):
        return (4, 4)
    return None


def wgsl_scalar_of(wgsl_type: str) -> tuple[str, int]:
    """(scalar type, component count) of a scalar or vector type accepted above."""
    t = wgsl_type.strip()
    if t in _SCALARS:
        return t, 1
    m = _VEC_RE.match(t) or _VEC_ALIAS_RE.match(t)
    if m:
        scalar = m.group(2) if len(m.group(2)) == 3 else _ALIAS_SCALAR[m.group(2)]
        return scalar, int(m.group(1))
    m = _ATOMIC_RE.match(t)
    if m:
        return m.group(1), 1
    raise ValueError(f"not a WGSL scalar or vector type: {wgsl_type!r}")


# --------------------------------------------------------------------------- dataclasses


@dataclass(frozen=True)
class Derive:
    """A ``derive`` block: named values in dependency order (JSON order where free).

    A value is an :class:`Expr` (the JSON string) or a JSON literal (bool/int/float).
    """

    items: tuple[tuple[str, Value], ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.items)

    def as_dict(self) -> dict[str, Value]:
        return dict(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)


@dataclass(frozen=True)
class TensorDecl:
    """An input or output: ``dtype`` is a ``typeConstraints`` name; ``rank``/``shape``
    optionally state what the planner's given shape must be (checked at plan time)."""

    name: str
    dtype: str
    index: int
    rank: Value | None = None
    shape: Expr | tuple[Value, ...] | None = None
    #: an input or output the node may leave out (``"optional": true``); see ``present.<io>``
    optional: bool = False
    #: an input whose contents the kernel reads when the node is planned (``"constant": true``;
    #: ``values.<name>``), as onnxruntime's WebGPU EP reads Slice's starts on the CPU
    constant: bool = False


@dataclass(frozen=True)
class AttributeDecl:
    """A node attribute the kernel understands (top-level ``attributes``).

    ``default`` is the value used when the node does not set it (int, float, str or a
    tuple of ints/floats); ``required`` attributes have no default and must be set. A
    ``fixed`` one is a value the kernel reads that the node may not set: a generated spec's
    attribute its schema version does not have yet (backend_wgpu/spec_versions.py).
    """

    name: str
    default: Any = None
    required: bool = False
    description: str = ""
    fixed: bool = False


@dataclass(frozen=True)
class Tunable:
    """A tunable knob (``tunables.<name>``) with an integer default and the other values
    ``onnx-quant tune`` may time (``tune``; none: the default is never measured against others)."""

    name: str
    default: int
    description: str = ""
    tune: tuple[int, ...] = ()


@dataclass(frozen=True)
class StructMember:
    """A member of a uniform struct: WGSL ``type`` and the ``value`` written at plan time."""

    name: str
    type: str
    value: Value


@dataclass(frozen=True)
class BindingDecl:
    """An entry of the top-level ``bindings`` object, referenced by ``key`` from passes.

    ``name`` is the resource (an input, output or intermediate; for a struct, the WGSL
    variable of the uniform) and the WGSL variable name; it defaults to ``key``.
    ``element_type`` is a WGSL type or ``"$derivedName"``; ``buffer`` is ``"storage"``,
    ``"read-only-storage"``, ``"uniform"`` or None (default by role); ``struct`` makes it
    a uniform struct.
    """

    key: str
    name: str
    element_type: str | None = None
    length: Value | None = None
    buffer: str | None = None
    struct: tuple[StructMember, ...] | None = None


@dataclass(frozen=True)
class PassBinding:
    """One entry of a pass's ``bindings`` list, resolved at load time.

    ``role`` is input/output/intermediate (``resource`` is that tensor) or uniform
    (``resource`` is the variable; the planner's buffer is ``"<pass id>.<var_name>"``).
    ``element_type`` is None when it defaults from the tensor's dtype.
    """

    index: int
    ref: str                    # the top-level key, or "arg:<name>" / "struct:<name>" for inline entries
    resource: str
    var_name: str
    role: str                   # "input" | "output" | "intermediate" | "uniform"
    access: str                 # "read" | "read_write" | "uniform"
    element_type: str | None = None
    length: Value | None = None
    struct: tuple[StructMember, ...] | None = None
    field: str = ""             # where it came from, for error messages


@dataclass(frozen=True)
class Intermediate:
    """A scratch tensor allocated per plan: ``dtype`` (an element type or a
    typeConstraints name) and ``shape`` (an expression or a list of values); with ``data``
    (an expression giving its contents as a list of ints, u32 words) it is plan-time data:
    written once per plan, read by the passes (tables a size decides, kept out of the source)."""

    id: str
    dtype: str
    shape: Expr | tuple[Value, ...]
    data: Expr | None = None


@dataclass(frozen=True)
class Pass:
    """One compute dispatch of a variant."""

    id: str
    name: str
    shader: str
    derive: Derive
    bindings: tuple[PassBinding, ...]
    dispatch: tuple[Value, Value, Value]
    description: str = ""
    #: derived values this pass's template gets as runtime uniforms (besides the kernel's)
    uniforms: tuple[str, ...] = ()


@dataclass(frozen=True)
class Variant:
    """One way of running the kernel. ``priority`` None marks a guard (see the selection
    rule in docs/kernel-spec.md); ``when`` clauses must all hold for it to be a candidate."""

    id: str
    index: int
    priority: int | None
    when: tuple[Expr, ...]
    derive: Derive
    intermediates: tuple[Intermediate, ...]
    passes: tuple[Pass, ...]
    description: str = ""


@dataclass(frozen=True)
class IndexCheck:
    """An ``indexChecks`` entry: every element n of ``input`` must lie in [-b, b) (``from_zero``:
    [0, b)) for b = ``bounds``[n % len(bounds)] (a list of ints over the top-level scope), unless
    it equals ``ignore`` (an int expression; a loss's ignore_index)."""

    input: str
    bounds: Expr
    from_zero: bool = False
    ignore: Expr | None = None


@dataclass(frozen=True)
class LoopCheck:
    """A ``loopChecks`` entry: the loops of the passes that bind ``input`` take their count from
    its values at run time (RoiAlign's adaptive sampling grid from the rois). Where ``when`` (a
    bool over the top-level scope; None: always) holds, those passes bind the error buffer and
    their template flags (``oq_loop_fault``) an element of ``input``, a row named ``item`` in the
    error, whose loops would take more than ``bound`` (an int expression) steps of an output
    element: the run raises LoopLimitError (index_check.py)."""

    input: str
    bound: Expr
    when: Expr | None = None
    item: str = "row"


@dataclass(frozen=True, eq=False)
class KernelSpec:
    """A loaded, validated ``*.kernel.json``. Hashable by identity."""

    domain: str
    name: str
    since_version: int
    inputs: dict[str, TensorDecl]
    outputs: dict[str, TensorDecl]
    type_constraints: dict[str, tuple[str, ...]]
    tunables: dict[str, Tunable]
    derive: Derive
    bindings: dict[str, BindingDecl]
    variants: tuple[Variant, ...]
    path: str
    directory: str
    description: str = ""
    attributes: dict[str, AttributeDecl] = field(default_factory=dict)
    #: the last opset version this spec implements (None: every later one)
    until_version: int | None = None
    #: derived values every pass's template gets as runtime uniforms (backend_wgpu/uniforms.py)
    uniforms: tuple[str, ...] = ()
    #: inputs whose runtime values (indices, labels) a check pass verifies on the device
    #: (index_check.py: the check pass, the error buffer, the node's id, the read-back)
    index_checks: tuple[IndexCheck, ...] = ()
    #: inputs whose runtime values decide a loop's count, checked by the kernel's own passes
    loop_checks: tuple[LoopCheck, ...] = ()

    @property
    def io(self) -> dict[str, TensorDecl]:
        return {**self.inputs, **self.outputs}

    def variant(self, variant_id: str) -> Variant:
        for v in self.variants:
            if v.id == variant_id:
                return v
        raise KeyError(variant_id)

    def shader_path(self, shader: str) -> Path:
        return Path(self.directory) / shader

    def __repr__(self) -> str:
        return f"KernelSpec({self.domain}::{self.name}-{self.since_version}, {self.path})"

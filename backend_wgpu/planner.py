"""Planning: from a loaded spec, a node's shapes/dtypes and a device to a KernelPlan.

``plan_node`` evaluates the spec's ``derive`` blocks, checks dtypes and shapes, selects
a variant (rule in docs/kernel-spec.md, "Selection"), sizes the buffers, lays out the
uniform structs, resolves every pass's bindings and dispatch, and checks the device
limits, raising a clear error instead of letting wgpu crash. Pure Python: no wgpu.

The result is a :class:`NodePlan`, a :class:`~backend_wgpu.plan.KernelPlan` that also
remembers what decided the variant (for :func:`describe` / ``onnx-quant explain``).
"""

from __future__ import annotations

import math
import struct as _struct
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from onnx import numpy_helper

from onnx_quant.dtypes import UnknownElementType, element_type
from onnx_quant.errors import ExecutionError, ExpressionError, KernelRejected, SpecError

from . import index_check
from .device_info import WEBGPU_DEFAULT_LIMITS, DeviceInfo
from .expr import Env, Expr, evaluate_value, type_name
from .packing import device_nbytes
from .plan import BindingPlan, BufferPlan, KernelPlan, PassPlan
from .spec_model import (
    Derive, KernelSpec, Pass, PassBinding, StructMember, Variant, wgsl_scalar_of, wgsl_type_layout,
)
from .uniforms import UNIFORM_VAR, uniform_members
from .verdict import TypeBinding
from .work_bounds import check_invocations

__all__ = [
    "plan_node", "describe", "NodePlan", "UniformField", "UniformLayout", "uniform_layout",
    "pack_uniform", "packed_byte_size", "default_element_type", "uniform_buffer_name",
]


# --------------------------------------------------------------------------- uniform layout


@dataclass(frozen=True)
class UniformField:
    """One member of a uniform struct: byte ``offset``, ``size`` and ``align``."""

    name: str
    type: str
    offset: int
    size: int
    align: int


@dataclass(frozen=True)
class UniformLayout:
    """A uniform struct laid out by WGSL rules.

    Each member sits at the next multiple of its alignment (4 for 32-bit scalars, 2 for
    f16; vec2 twice the scalar; vec3 and vec4 four times); ``struct_size`` is the end of
    the last member rounded up to the struct alignment (WGSL ``SizeOf``); ``size`` (the
    buffer size) is that rounded up to 16 bytes.
    """

    fields: tuple[UniformField, ...]
    struct_size: int
    align: int
    size: int

    def offset_of(self, name: str) -> int:
        for f in self.fields:
            if f.name == name:
                return f.offset
        raise KeyError(name)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def uniform_layout(members: Iterable[StructMember | tuple[str, str]]) -> UniformLayout:
    """Lay out uniform struct ``members`` (StructMember or (name, wgsl type) pairs)."""
    fields: list[UniformField] = []
    offset = 0
    align = 1
    for m in members:
        name, wtype = (m.name, m.type) if isinstance(m, StructMember) else (m[0], m[1])
        info = wgsl_type_layout(wtype)
        if info is None:
            raise ValueError(f"member {name!r}: {wtype!r} is not a uniform member type")
        size, a = info
        offset = _round_up(offset, a)
        fields.append(UniformField(name, wtype, offset, size, a))
        offset += size
        align = max(align, a)
    struct_size = _round_up(offset, align) if fields else 0
    return UniformLayout(tuple(fields), struct_size, align, max(16, _round_up(struct_size, 16)))


_SCALAR_PACK = {"u32": "<I", "i32": "<i", "f32": "<f", "f16": "<e"}
_INT_RANGE = {"u32": (0, 2**32 - 1), "i32": (-(2**31), 2**31 - 1)}


def _pack_scalar(scalar: str, v: Any, what: str) -> bytes:
    if scalar in _INT_RANGE:
        if isinstance(v, bool):
            v = int(v)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int):
            raise ValueError(f"{what}: {scalar} needs an int, found {type_name(v)} {v!r}")
        lo, hi = _INT_RANGE[scalar]
        if not lo <= v <= hi:
            raise ValueError(f"{what}: {v} does not fit in {scalar} [{lo}, {hi}]")
        return _struct.pack(_SCALAR_PACK[scalar], v)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{what}: {scalar} needs a number, found {type_name(v)} {v!r}")
    try:
        return _struct.pack(_SCALAR_PACK[scalar], float(v))
    except (OverflowError, _struct.error):
        raise ValueError(f"{what}: {v!r} is out of range for {scalar}") from None


def pack_uniform(layout: UniformLayout, values: Mapping[str, Any]) -> bytes:
    """The bytes of a uniform buffer (``layout.size`` long, padding zero).

    u32/i32 take ints (bools as 0/1, integral floats); f32/f16 take numbers; vectors a
    list of as many components. Raises ValueError naming the member otherwise.
    """
    buf = bytearray(layout.size)
    for f in layout.fields:
        if f.name not in values:
            raise ValueError(f"member {f.name!r}: no value")
        v = values[f.name]
        scalar, n = wgsl_scalar_of(f.type)
        if n == 1:
            comps = [v]
        else:
            if not isinstance(v, (tuple, list)) or len(v) != n:
                raise ValueError(f"member {f.name!r}: {f.type} needs a list of {n} values, found {v!r}")
            comps = list(v)
        step = _struct.calcsize(_SCALAR_PACK[scalar])
        for i, c in enumerate(comps):
            data = _pack_scalar(scalar, c, f"member {f.name!r}")
            buf[f.offset + i * step: f.offset + (i + 1) * step] = data
    return bytes(buf)


# --------------------------------------------------------------------------- helpers


def packed_byte_size(onnx_type: str, numel: int) -> int:
    """Device bytes of a tensor: ceil(numel * device bits / 32) u32 words, at least one word
    (device bits: the element width, 8 for the float6 types kept in byte containers; see
    ``backend_wgpu/packing.py``)."""
    return device_nbytes(onnx_type, numel)


def default_element_type(onnx_type: str) -> str:
    """The WGSL element type a binding gets when the spec names none.

    float32/int32/uint32 -> f32/i32/u32; narrower types are packed in u32 words -> u32;
    64-bit types -> vec2<u32> (two words per element).
    """
    t = element_type(onnx_type)
    if t.bits == 32:
        return {"float": "f32", "int": "i32", "uint": "u32"}.get(t.kind, "u32")
    if t.bits == 64:
        return "vec2<u32>"
    return "u32"


def uniform_buffer_name(pass_id: str, var_name: str) -> str:
    """The BufferPlan name of a pass's uniform struct, e.g. ``reduce.params``."""
    return f"{pass_id}.{var_name}"


@dataclass(frozen=True)
class NodePlan(KernelPlan):
    """A KernelPlan that also records, for ``describe``, what decided the variant."""

    node: str = ""
    #: the chosen variant's ``when`` clauses
    when: tuple[str, ...] = ()
    #: derived names that decided the selection (those the deciding clauses read, and their inputs)
    decided_by: tuple[str, ...] = ()
    tunables: dict[str, int] = field(default_factory=dict)
    #: the node's attributes with declared defaults filled in
    attrs: dict[str, Any] = field(default_factory=dict)


class _Where:
    """Builds the 'node ...: Kernel variant v pass p' prefix of error messages."""

    def __init__(self, spec: KernelSpec, node_label: str) -> None:
        self.spec = spec
        self.node = node_label

    def __call__(self, variant: str | None = None, pass_id: str | None = None) -> str:
        parts = []
        if self.node:
            parts.append(f"node {self.node!r}")
        k = f"kernel {self.spec.name}"
        if variant:
            k += f" variant {variant}"
        if pass_id:
            k += f" pass {pass_id}"
        parts.append(k)
        return ": ".join(parts)

    def rejection(self, clause: str) -> KernelRejected:
        """The kernel declines the node: a typed error the session sends to the host."""
        return KernelRejected(self.node, self.spec.name, clause, where=self())


def _bind_types(spec: KernelSpec, present: Mapping[str, bool], dtypes: Mapping[str, Any], where: _Where
                ) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """(every io's element type name, constraint -> (type, the io that fixed it)), bound against
    the spec's type constraints (verdict.TypeBinding, the binding the construction phases use); an
    absent input takes the type its constraint is bound to, else the first allowed. Raises ExecutionError (a missing or unknown type) or
    KernelRejected (a type the constraint does not allow, two types for one constraint)."""
    io_types: dict[str, str] = {}
    binding = TypeBinding(spec.type_constraints)
    for n, decl in spec.io.items():
        if not present[n]:
            continue
        if n not in dtypes or dtypes[n] is None:
            raise ExecutionError(f"{where()}: no dtype given for {n!r}")
        try:
            dt = element_type(dtypes[n]).name
        except UnknownElementType as e:
            raise ExecutionError(f"{where()}: {n!r}: {e}") from None
        clash = binding.bind(n, decl.dtype, dt)
        if clash is not None and clash.bound is None:
            raise where.rejection(f"{n!r} has type {dt}, but {decl.dtype} allows only {', '.join(clash.allowed)}")
        if clash is not None:
            raise where.rejection(f"{n!r} has type {dt} but {clash.bound[1]!r} has "
                                  f"{clash.bound[0]}; both are {decl.dtype}")
        io_types[n] = dt
    for n, decl in spec.io.items():
        if not present[n]:
            io_types[n] = binding.type_of(decl.dtype) or spec.type_constraints[decl.dtype][0]
    return {n: io_types[n] for n in spec.io}, binding.bound


def _eval(value: Any, env: Env, where: str, fld: str) -> Any:
    try:
        return evaluate_value(value, env)
    except ExpressionError as e:
        raise ExpressionError(f"{where}: {fld}: {e}") from e


def _derive(block: Derive, env: Env, where: str, fld: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    scope = env
    for name, v in block.items:
        values[name] = _eval(v, scope, where, f"{fld}.{name}")
        scope = env.with_names(values)
    return values


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


# --------------------------------------------------------------------------- plan_node


def plan_node(
    spec: KernelSpec,
    *,
    shapes: Mapping[str, Sequence[int]],
    dtypes: Mapping[str, str],
    device: DeviceInfo,
    tunables: Mapping[str, int] | None = None,
    variant: str | None = None,
    node_label: str = "",
    attributes: Mapping[str, Any] | None = None,
    values: Mapping[str, Any] | None = None,
) -> NodePlan:
    """Plan one node. ``shapes``/``dtypes`` cover every input and output of the spec,
    except absent optional inputs, which are simply left out.

    ``values`` holds the contents (arrays) of the inputs the spec declares ``"constant"``:
    a present one without a value rejects the node (``KernelRejected``: it must be known
    when the node is planned).

    ``attributes`` are the node's attributes (values as ``onnx.helper.get_attribute_value``
    returns them; bytes are decoded to str); an attribute the spec does not declare is an
    ExecutionError, declared ones not given take their default.

    Raises ExecutionError (dtype/shape/tunable problems, no variant applies, a forced
    variant does not apply, a buffer or dispatch beyond the device limits),
    ExpressionError (an expression fails to evaluate) or SpecError (a spec value has the
    wrong type at plan time, e.g. a ``$name`` element type that is not a string).
    """
    where = _Where(spec, node_label)

    # tunables
    tun = {n: t.default for n, t in spec.tunables.items()}
    for n, v in (tunables or {}).items():
        if n not in spec.tunables:
            raise ExecutionError(f"{where()}: unknown tunable {n!r}; known: {', '.join(spec.tunables) or 'none'}")
        if not isinstance(v, int) or isinstance(v, bool):
            raise ExecutionError(f"{where()}: tunable {n} must be an int, found {type(v).__name__} {v!r}")
        tun[n] = v

    attrs = _node_attributes(spec, attributes, where)

    # presence of optional inputs: an optional input without a shape is absent
    present: dict[str, bool] = {}
    for n, decl in spec.io.items():
        present[n] = not (decl.optional and (n not in shapes or shapes[n] is None))

    # shapes
    shp: dict[str, tuple[int, ...]] = {}
    for n in spec.io:
        if not present[n]:
            shp[n] = ()
            continue
        if n not in shapes or shapes[n] is None:
            raise ExecutionError(f"{where()}: no shape given for {n!r}")
        s = tuple(shapes[n])
        for d in s:
            if not isinstance(d, int) or isinstance(d, bool) or d < 0:
                raise ExecutionError(f"{where()}: shape of {n!r} must be concrete non-negative ints, found {s}")
        shp[n] = s

    # dtypes against typeConstraints
    io_types, bound = _bind_types(spec, present, dtypes, where)

    consts = _constant_values(spec, present, shp, values or {}, where)
    limits = {**WEBGPU_DEFAULT_LIMITS, **dict(device.limits)}
    features = frozenset(device.features)
    env = Env(shapes=shp, tunables=tun, limits=limits, features=features,
              attrs=attrs, dtypes=io_types, present=present, values=consts)

    # 1. top-level derive
    top = _derive(spec.derive, env, where(), "derive")
    env_top = env.with_names(top)

    # declared ranks/shapes of inputs and outputs
    for n, decl in spec.io.items():
        if not present[n]:
            continue
        if decl.rank is not None:
            r = _eval(decl.rank, env_top, where(), f"{n}.rank")
            if r != len(shp[n]):
                raise where.rejection(f"{n!r} must have rank {r}, found shape {shp[n]}")
        if decl.shape is not None:
            s = _eval(decl.shape, env_top, where(), f"{n}.shape")
            if tuple(s) != shp[n]:
                raise where.rejection(f"{n!r} must have shape {tuple(s)}, found {shp[n]}")

    # 2. selection
    selection: dict[str, str | None] = {}
    for v in spec.variants:
        selection[v.id] = _first_failing(v, env_top, where)
    ranked = _ranked(spec.variants)
    if variant is not None:
        ids = [v.id for v in spec.variants]
        if variant not in ids:
            raise ExecutionError(f"{where()}: no variant {variant!r}; variants: {', '.join(ids)}")
        if selection[variant] is not None:
            raise ExecutionError(f"{where(variant)}: cannot force this variant: its when clause "
                                 f"{selection[variant]!r} does not hold")
        chosen = spec.variant(variant)
    else:
        candidates = [v for v in ranked if selection[v.id] is None]
        if not candidates:
            why = "; ".join(f"{vid}: {clause!r} is false" for vid, clause in selection.items())
            raise where.rejection(f"no variant applies ({why})")
        chosen = candidates[0]

    # 3. variant derive
    vwhere = where(chosen.id)
    vvals = _derive(chosen.derive, env_top, vwhere, "derive")
    env_v = env_top.with_names(vvals)

    storage_limit = min(limits["maxStorageBufferBindingSize"], limits["maxBufferSize"])
    storage_limit_text = ("min(maxStorageBufferBindingSize, maxBufferSize) = "
                          f"{storage_limit} bytes")

    # 4. buffers: inputs, outputs, intermediates
    buffers: dict[str, BufferPlan] = {}
    tensor_types: dict[str, str] = {}
    for n in spec.io:
        if not present[n]:  # fixed 4-byte zero-filled stand-in: bindings and shaders stay the same
            buffers[n] = BufferPlan(n, "absent", 4, io_types[n], ())
            tensor_types[n] = io_types[n]
            continue
        numel = math.prod(shp[n])
        role = "input" if n in spec.inputs else "output"
        buffers[n] = BufferPlan(n, role, packed_byte_size(io_types[n], numel), io_types[n], shp[n])
        tensor_types[n] = io_types[n]
    for inter in chosen.intermediates:
        dt = bound[inter.dtype][0] if inter.dtype in spec.type_constraints else inter.dtype
        s = _eval(inter.shape, env_v, vwhere, f"intermediates.{inter.id}.shape")
        if not isinstance(s, tuple) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in s):
            raise ExpressionError(f"{vwhere}: intermediates.{inter.id}.shape: must be a list of non-negative "
                                  f"ints, found {s!r}")
        size = packed_byte_size(dt, math.prod(s))
        if inter.data is None:
            buffers[inter.id] = BufferPlan(inter.id, "intermediate", size, dt, s)
        else:
            buffers[inter.id] = BufferPlan(inter.id, "data", size, dt, s,
                                           _plan_data(inter, env_v, vwhere, size))
        tensor_types[inter.id] = dt
    for b in buffers.values():
        if b.byte_size > storage_limit:
            raise ExecutionError(f"{where(chosen.id)}: tensor {b.name!r} ({b.onnx_type}{list(b.shape or ())}) "
                                 f"needs {b.byte_size} bytes, more than this device allows for a storage buffer "
                                 f"({storage_limit_text})")

    # 5. passes (those that bind a loopChecks input bind the error buffer: backend_wgpu/index_check.py)
    passes: list[PassPlan] = []
    loop_checks = index_check.loop_checks(spec, present, lambda e, f: _eval(e, env_v, vwhere, f))
    for p in chosen.passes:
        pp = _plan_pass(spec, chosen, p, env_v, top, vvals, tun, features, limits, buffers, tensor_types, where,
                        attrs, io_types, present, loop_checks)
        if pp is not None:
            passes.append(pp)

    # 6. the check pass of the indexChecks inputs, first (backend_wgpu/index_check.py)
    checked = index_check.index_checks(spec, io_types, present, env_v.shapes, lambda e, f: _eval(e, env_v, vwhere, f))
    check = index_check.check_pass(spec.name, chosen.id, checked, buffers)
    if check is not None:
        passes.insert(0, check)

    return NodePlan(
        kernel=spec.name, variant=chosen.id, derived={**top, **vvals}, buffers=buffers,
        passes=tuple(passes), selection=selection, node=node_label,
        when=tuple(c.text for c in chosen.when),
        decided_by=_decided_by(spec, chosen, ranked, selection), tunables=tun, attrs=attrs,
    )


def _plan_data(inter: Any, env: Env, where: str, size: int) -> bytes:
    """The contents of a plan-time data intermediate: its ``data`` expression's u32 words, zero-padded
    to the buffer's size."""
    fld = f"intermediates.{inter.id}.data"
    words = _eval(inter.data, env, where, fld)
    if not isinstance(words, tuple) or not all(isinstance(w, int) and not isinstance(w, bool) and 0 <= w < 2 ** 32
                                               for w in words):
        raise ExpressionError(f"{where}: {fld}: must be a list of u32 words (ints in [0, 2^32)), found "
                              f"{type(words).__name__}")
    if 4 * len(words) > size:
        raise ExpressionError(f"{where}: {fld}: {len(words)} words do not fit the intermediate's {size} bytes")
    return np.asarray(words, "<u4").tobytes() + b"\0" * (size - 4 * len(words))


#: elements a constant input may have: its contents are read on the host and baked into the
#: plan (shape-deciding inputs are a handful of numbers)
MAX_CONSTANT_ELEMENTS = 4096


def _constant_values(spec: KernelSpec, present: Mapping[str, bool], shapes: Mapping[str, tuple[int, ...]],
                     values: Mapping[str, Any], where: "_Where") -> dict[str, tuple[Any, ...]]:
    """``values.<input>`` for each constant input: a flat tuple of Python numbers (``()`` when
    the input is absent)."""
    out: dict[str, tuple[Any, ...]] = {}
    for n, decl in spec.inputs.items():
        if not decl.constant:
            continue
        if not present[n]:
            out[n] = ()
            continue
        v = values.get(n)
        if v is None:
            raise where.rejection(f"input {n!r} must be known when the node is planned (an initializer, a "
                                  f"Constant, a folded value or a small integer graph input)")
        a = np.asarray(v)
        if tuple(a.shape) != tuple(shapes[n]):
            raise ExecutionError(f"{where()}: the value given for {n!r} has shape {a.shape}, expected {shapes[n]}")
        if a.size > MAX_CONSTANT_ELEMENTS:
            raise where.rejection(f"input {n!r} has {a.size} elements; a kernel reads at most "
                                  f"{MAX_CONSTANT_ELEMENTS} when it is planned")
        out[n] = tuple(a.reshape(-1).tolist())
    return out


def _attribute_value(v: Any) -> Any:
    """A node attribute value in the expression language's terms, or raise TypeError."""
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float, str)):
        return v
    if hasattr(v, "item") and getattr(v, "shape", None) == ():  # numpy scalar
        return _attribute_value(v.item())
    if hasattr(v, "data_type") and hasattr(v, "dims"):  # a TensorProto (ConstantOfShape's value)
        a = numpy_helper.to_array(v)
        if a.dtype.kind not in "biuf" and a.dtype.name not in _ML_TYPES:
            raise TypeError(f"{a.dtype} tensor")
        ints = a.dtype.kind in "biu" or a.dtype.name.startswith(("int", "uint"))
        items = [int(x) if ints else (x.item() if a.dtype.kind == "f" else float(x)) for x in a.reshape(-1)]
        return _attribute_value(items[0] if a.size == 1 and a.ndim <= 1 else items)
    if isinstance(v, (list, tuple)):
        out = tuple(_attribute_value(x) for x in v)
        if all(isinstance(x, (int, float)) for x in out) or all(isinstance(x, str) for x in out):
            return out
    raise TypeError(type(v).__name__)


#: ml_dtypes types (numpy kind 'V'): their values convert to Python floats / ints exactly
_ML_TYPES = frozenset({"bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                       "float8_e8m0fnu", "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn",
                       "int4", "uint4", "int2", "uint2"})


def _node_attributes(spec: KernelSpec, attributes: Mapping[str, Any] | None, where: "_Where") -> dict[str, Any]:
    """Declared defaults overridden by the node's attributes; undeclared (or fixed) ones are errors."""
    given = dict(attributes or {})
    for n in given:
        if n not in spec.attributes or spec.attributes[n].fixed:
            declared = ", ".join(a for a, d in spec.attributes.items() if not d.fixed) or "none"
            raise where.rejection(f"attribute {n!r} is not supported by kernel {spec.name} "
                                  f"(declared attributes: {declared})")
    out: dict[str, Any] = {}
    for n, decl in spec.attributes.items():
        if n in given and given[n] is not None:
            try:
                out[n] = _attribute_value(given[n])
            except TypeError as e:
                raise where.rejection(f"attribute {n!r}: a {e} value is not supported (ints, floats, strings and lists "
                             f"of them are)") from None
        elif decl.required:
            raise ExecutionError(f"{where()}: required attribute {n!r} not given")
        else:
            out[n] = decl.default
    return out


def _first_failing(v: Variant, env: Env, where: _Where) -> str | None:
    for i, clause in enumerate(v.when):
        r = _eval(clause, env, where(v.id), f"when[{i}]")
        if not isinstance(r, bool):
            raise ExpressionError(f"{where(v.id)}: when[{i}]: expression {clause.text!r} must be a bool, "
                                  f"found {type_name(r)} {r!r}")
        if not r:
            return clause.text
    return None


def _ranked(variants: Sequence[Variant]) -> list[Variant]:
    """Selection order: guards (no priority) first in file order, then priority
    descending, ties in file order."""
    return sorted(variants, key=lambda v: (v.priority is not None, -(v.priority or 0), v.index))


def _decided_by(spec: KernelSpec, chosen: Variant, ranked: list[Variant],
                selection: Mapping[str, str | None]) -> tuple[str, ...]:
    """Top-level derived names read by the chosen variant's clauses and by the failing
    clauses of the variants ranked above it, closed over their dependencies."""
    exprs: list[Expr] = list(chosen.when)
    for v in ranked:
        if v is chosen:
            break
        failed = selection.get(v.id)
        exprs.extend(c for c in v.when if c.text == failed)
    top = spec.derive.as_dict()
    need: set[str] = set()
    stack = [n for e in exprs for n in e.free_names]
    while stack:
        n = stack.pop()
        if n in need or n not in top:
            continue
        need.add(n)
        v = top[n]
        if isinstance(v, Expr):
            stack.extend(v.free_names)
    return tuple(n for n in spec.derive.names if n in need)


def _plan_pass(spec: KernelSpec, variant: Variant, p: Pass, env_v: Env, top: Mapping[str, Any],
               vvals: Mapping[str, Any], tun: Mapping[str, int], features: frozenset[str],
               limits: Mapping[str, int], buffers: dict[str, BufferPlan], tensor_types: Mapping[str, str],
               where: _Where, attrs: Mapping[str, Any] | None = None, io_types: Mapping[str, str] | None = None,
               present: Mapping[str, bool] | None = None, loop_checks: Sequence[Mapping[str, Any]] = ()
               ) -> PassPlan | None:
    pw = where(variant.id, p.id)
    pvals = _derive(p.derive, env_v, pw, "derive")
    env_p = env_v.with_names(pvals)

    # dispatch
    dispatch: list[int] = []
    max_groups = limits["maxComputeWorkgroupsPerDimension"]
    for axis, v in zip("xyz", p.dispatch):
        n = _eval(v, env_p, pw, f"dispatch.{axis}")
        if not isinstance(n, int) or isinstance(n, bool):
            raise ExpressionError(f"{pw}: dispatch.{axis} must be an int, found {type_name(n)} {n!r}")
        if n < 0:
            raise ExpressionError(f"{pw}: dispatch.{axis} is negative ({n})")
        if n > max_groups:
            raise ExecutionError(f"{pw}: dispatch.{axis} = {n} workgroups exceeds the device limit "
                                 f"maxComputeWorkgroupsPerDimension = {max_groups}")
        dispatch.append(n)
    if 0 in dispatch:
        return None  # an empty grid: the pass is dropped

    derived_here = {**top, **vvals, **pvals}
    wg = derived_here.get("workgroupSize", 1)
    if isinstance(wg, int) and not isinstance(wg, bool):
        cap = min(limits["maxComputeInvocationsPerWorkgroup"], limits["maxComputeWorkgroupSizeX"])
        if wg > cap:
            raise ExecutionError(f"{pw}: workgroupSize {wg} exceeds the device limit "
                                 f"min(maxComputeInvocationsPerWorkgroup, maxComputeWorkgroupSizeX) = {cap}")
    check_invocations(pw, dispatch, wg if isinstance(wg, int) else 1,
                      (math.prod(b.shape) for b in buffers.values() if b.shape is not None))

    bindings = [_plan_binding(spec, p, b, env_p, buffers, tensor_types, limits, pw) for b in p.bindings]
    checked = [c for c in loop_checks if any(b.buffer == c["input"] for b in bindings)]
    if checked:
        bindings += index_check.error_bindings(p.id, max(b.index for b in bindings) + 1, buffers)
    n_uniform = sum(bp.access == "uniform" for bp in bindings)
    n_storage = len(bindings) - n_uniform
    if n_storage > limits["maxStorageBuffersPerShaderStage"]:
        raise ExecutionError(f"{pw}: binds {n_storage} storage buffers, more than the device limit "
                             f"maxStorageBuffersPerShaderStage = {limits['maxStorageBuffersPerShaderStage']}")
    if n_uniform > limits["maxUniformBuffersPerShaderStage"]:
        raise ExecutionError(f"{pw}: binds {n_uniform} uniform buffers, more than the device limit "
                             f"maxUniformBuffersPerShaderStage = {limits['maxUniformBuffersPerShaderStage']}")
    if len(bindings) > limits["maxBindingsPerBindGroup"]:
        raise ExecutionError(f"{pw}: {len(bindings)} bindings exceed maxBindingsPerBindGroup = "
                             f"{limits['maxBindingsPerBindGroup']}")

    uniform_names = tuple(dict.fromkeys((*spec.uniforms, *p.uniforms)))
    guards: dict[str, Any] = {}
    if uniform_names:
        bp, guards = _plan_uniforms(p, uniform_names, derived_here, bindings, buffers, limits, pw)
        bindings.append(bp)
        if n_uniform + 1 > limits["maxUniformBuffersPerShaderStage"]:
            raise ExecutionError(f"{pw}: binds {n_uniform + 1} uniform buffers (one of them the derived values' "
                                 f"{UNIFORM_VAR}), more than the device limit maxUniformBuffersPerShaderStage = "
                                 f"{limits['maxUniformBuffersPerShaderStage']}")

    binding_dicts = [
        {"index": bp.index, "var_name": bp.var_name, "access": bp.access, "element_type": bp.element_type,
         "length": bp.length, "struct": [list(m) for m in bp.struct] if bp.struct is not None else None}
        for bp in bindings
    ]
    context: dict[str, Any] = {
        "kernel": spec.name,
        "variant": variant.id,
        "pass_id": p.id,
        "tunables": dict(tun),
        **derived_here,
        **guards,
        "bindings": binding_dicts,
        "binding": {d["var_name"]: d for d in binding_dicts},
        "features": sorted(features),
        "workgroup_size": wg,
        "attrs": dict(attrs or {}),
        "dtypes": dict(io_types or {}),
        "present": dict(present or {}),
        "values": {k: list(v) for k, v in env_v.values.items()},
        "loop_checks": checked,
    }
    return PassPlan(p.id, p.name, p.shader, context, tuple(bindings), (dispatch[0], dispatch[1], dispatch[2]),
                    spec.directory or None)


def _plan_uniforms(p: Pass, names: Sequence[str], derived: Mapping[str, Any], bindings: Sequence[BindingPlan],
                   buffers: dict[str, BufferPlan], limits: Mapping[str, int], pw: str
                   ) -> tuple[BindingPlan, dict[str, Any]]:
    """The pass's uniform struct of runtime derived values (backend_wgpu/uniforms.py): its binding
    (after the spec's bindings), its buffer (bytes written once per plan) and the guards the
    template gets in the values' place."""
    members: list[tuple[str, str, Any]] = []
    guards: dict[str, Any] = {}
    for n in names:
        if n not in derived:
            raise ExecutionError(f"{pw}: uniform {n!r} is not a derived value of this pass "
                                 f"(\"uniforms\" names derive entries)")
        try:
            guards[n] = uniform_members(n, derived[n], members)
        except ValueError as e:
            raise ExecutionError(f"{pw}: {e}") from None
    layout = uniform_layout([(m, t) for m, t, _ in members])
    try:
        data = pack_uniform(layout, {m: v for m, _, v in members})
    except ValueError as e:
        raise ExecutionError(f"{pw}: uniform {UNIFORM_VAR!r}: {e}") from None
    if layout.size > limits["maxUniformBufferBindingSize"]:
        raise ExecutionError(f"{pw}: uniform {UNIFORM_VAR!r} of {layout.size} bytes exceeds "
                             f"maxUniformBufferBindingSize = {limits['maxUniformBufferBindingSize']}")
    if any(b.var_name == UNIFORM_VAR for b in bindings):
        raise ExecutionError(f"{pw}: the spec binds a variable named {UNIFORM_VAR!r}, which the derived values' "
                             f"uniform struct takes")
    bname = uniform_buffer_name(p.id, UNIFORM_VAR)
    buffers[bname] = BufferPlan(bname, "uniform", layout.size, None, None, data)
    index = max((b.index for b in bindings), default=-1) + 1
    return (BindingPlan(index, UNIFORM_VAR, bname, "uniform", _struct_type_name(UNIFORM_VAR), None,
                        tuple((m, t) for m, t, _ in members)), guards)


def _struct_type_name(var_name: str) -> str:
    name = var_name[:1].upper() + var_name[1:]
    return name if name != var_name else var_name + "T"


def _plan_binding(spec: KernelSpec, p: Pass, b: PassBinding, env: Env, buffers: dict[str, BufferPlan],
                  tensor_types: Mapping[str, str], limits: Mapping[str, int], pw: str) -> BindingPlan:
    if b.role == "uniform":
        assert b.struct is not None
        layout = uniform_layout(b.struct)
        values = {m.name: _eval(m.value, env, pw, f"bindings[{b.index}].struct.{m.name}") for m in b.struct}
        try:
            data = pack_uniform(layout, values)
        except ValueError as e:
            raise ExecutionError(f"{pw}: uniform {b.var_name!r}: {e}") from None
        if layout.size > limits["maxUniformBufferBindingSize"]:
            raise ExecutionError(f"{pw}: uniform {b.var_name!r} of {layout.size} bytes exceeds "
                                 f"maxUniformBufferBindingSize = {limits['maxUniformBufferBindingSize']}")
        bname = uniform_buffer_name(p.id, b.var_name)
        buffers[bname] = BufferPlan(bname, "uniform", layout.size, None, None, data)
        return BindingPlan(b.index, b.var_name, bname, "uniform", _struct_type_name(b.var_name), None,
                           tuple((m.name, m.type) for m in b.struct))

    buf = buffers[b.resource]
    if b.element_type is None:
        et = default_element_type(tensor_types[b.resource])
    elif b.element_type.startswith("$"):
        dname = b.element_type[1:]
        try:
            et = env.names[dname]
        except KeyError:  # pragma: no cover - checked at load
            raise SpecError(spec.path, b.field, f"{b.element_type!r}: no derived value {dname!r}") from None
        if not isinstance(et, str) or wgsl_type_layout(et, storage=True) is None:
            raise SpecError(spec.path, b.field, f"elementType {b.element_type!r} evaluated to {et!r} "
                                                f"({type_name(et)}), not a WGSL element type such as \"f32\"")
    else:
        et = b.element_type
    size, align = wgsl_type_layout(et, storage=True)  # type: ignore[misc]
    stride = _round_up(size, align)
    length = None
    if b.length is not None:
        length = _eval(b.length, env, pw, f"bindings[{b.index}].length")
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            raise ExpressionError(f"{pw}: bindings[{b.index}].length must be a positive int, found {length!r}")
        if length * stride > buf.byte_size:
            raise ExecutionError(f"{pw}: binding {b.var_name!r} declares {length} x {et} ({length * stride} bytes) "
                                 f"but tensor {b.resource!r} has {buf.byte_size} bytes")
    elif buf.byte_size % stride:
        raise ExecutionError(f"{pw}: binding {b.var_name!r}: tensor {b.resource!r} of {buf.byte_size} bytes is not "
                             f"a whole number of {et} ({stride} bytes); the variant's when clauses should "
                             f"exclude this size")
    return BindingPlan(b.index, b.var_name, b.resource, b.access, et, length, None)


# --------------------------------------------------------------------------- describe


def describe(plan: KernelPlan) -> dict[str, Any]:
    """A JSON-ready summary of a plan for ``onnx-quant explain``.

    Keys: ``kernel``, ``node``, ``variant``, ``when`` (the chosen variant's clauses),
    ``derived`` (the values that decided the selection, see NodePlan.decided_by; all
    derived values for a plain KernelPlan), ``selection`` (variant -> first failing
    clause or None), ``tunables`` and ``passes`` [{id, name, dispatch [x, y, z]}].
    """
    names = getattr(plan, "decided_by", None)
    if names is None:
        names = tuple(plan.derived)
    return {
        "kernel": plan.kernel,
        "node": getattr(plan, "node", ""),
        "variant": plan.variant,
        "when": list(getattr(plan, "when", ())),
        "derived": {n: _jsonable(plan.derived[n]) for n in names if n in plan.derived},
        "selection": dict(plan.selection),
        "tunables": dict(getattr(plan, "tunables", {})),
        "passes": [{"id": p.id, "name": p.name, "dispatch": list(p.dispatch)} for p in plan.passes],
    }

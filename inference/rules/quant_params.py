"""Static validation shared by the quantization-family rules.

Two groups of checks live here, each used by several operators:

* :func:`check_schema` — what the exact schema version a model selects allows: input and
  output counts, attributes that exist in that version, element types per type
  constraint (from :mod:`onnx_quant.opsets`, i.e. ``onnx.defs``), and inputs bound to the
  same type parameter agreeing. A type or attribute that a *later* version allows is a
  version gate (``schema.version-gate``) and the message names the version that adds it.
* :func:`check_quant_params` — the scale / zero-point granularity of QuantizeLinear and
  DequantizeLinear (one piece of code serves both): per-tensor, per-axis or blocked, as
  implied by the scale's shape, with ``axis`` and ``block_size`` checked against ``x``.

Every problem is reported with ``NodeContext.report`` so that ``check_model`` lists all of
them and strict mode raises the first. Rule ids are listed in ``docs/validation.md``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from onnx import AttributeProto, TensorProto

from onnx_quant import opsets
from onnx_quant.dtypes import BY_CODE, type_name
from onnx_quant.opsets import OpFacts

from .. import dims
from ..context import TensorInfo
from ..registry import NodeContext
from .shape_math import provably_different, provably_equal, shape_text

UNKNOWN = TensorInfo()


def info(n: NodeContext, i: int) -> TensorInfo | None:
    """Input ``i`` (``None`` when absent) — never raises."""
    return n.input(i)


def types_text(codes) -> str:
    return "{" + ", ".join(sorted(type_name(c) for c in codes)) + "}"


def _op(n: NodeContext) -> str:
    return f"{n.node.op_type}-{n.version}"


# ---------------------------------------------------------------- schema checks
def facts_for(n: NodeContext) -> OpFacts:
    return opsets.op_facts(n.node.op_type, n.version, n.node.domain)


#: signatures (see :func:`check_schema`) that passed every check: a node with one of them has
#: nothing to report, so its checks are not run again (bounded; cleared when full)
_CLEAN_SIGNATURES: set = set()
_CLEAN_MAX = 4096


def check_schema(n: NodeContext, facts: OpFacts | None = None) -> OpFacts:
    """Counts, attributes, type constraints and type-parameter bindings of ``n``'s version.

    Every check reads only the node's signature: the schema, which inputs are given and their
    element types, the output count, the attributes' names and types. A signature that passed
    once passes again, so it is looked up instead (Q/DQ nodes of a model share a few)."""
    facts = facts or facts_for(n)
    node = n.node
    ctx = n.ctx
    signature = (facts.op_type, facts.domain, facts.since_version, tuple(ctx[name].elem_type if name else -1 for name in node.input),
                 len(node.output), tuple((a.name, a.type) for a in node.attribute))
    if signature in _CLEAN_SIGNATURES:
        return facts
    mark = len(ctx.diagnostics)
    _check_schema(n, facts)
    if len(ctx.diagnostics) == mark:  # nothing reported (strict mode raises instead)
        if len(_CLEAN_SIGNATURES) >= _CLEAN_MAX:
            _CLEAN_SIGNATURES.clear()
        _CLEAN_SIGNATURES.add(signature)
    return facts


def _check_schema(n: NodeContext, facts: OpFacts) -> None:
    op = n.node.op_type
    n_in = len(n.node.input)
    if n_in > facts.max_input:
        n.report("schema.arity", "too many inputs", subject="inputs",
                 expected=f"at most {facts.max_input}", found=n_in)
    for p in facts.inputs:
        if not p.optional and not p.variadic and not n.has_input(p.index):
            n.report("schema.arity", f"required input {p.name} (#{p.index}) is missing",
                     subject=f"input {p.name}", expected="a value name", found="nothing")
    n_out = len(n.node.output)
    if n_out > facts.max_output or n_out < max(facts.min_output, 1):
        n.report("schema.arity", "wrong number of outputs", subject="outputs",
                 expected=f"{facts.min_output}..{facts.max_output}", found=n_out)

    for name in n.attr_names():
        if facts.has_attr(name):
            continue
        later = opsets.first_version_with_attr(op, name, n.version, facts.domain)
        if later is not None:
            n.report("schema.version-gate",
                     f"attribute {name} exists from {op}-{later}; the model's opset {n.opset} selects {_op(n)}",
                     subject=f"attribute {name}", expected=f"since_version >= {later}", found=n.version)
        else:
            n.report("schema.attribute", f"{_op(n)} has no attribute {name}", subject=f"attribute {name}",
                     expected="one of " + (", ".join(sorted(facts.attributes)) or "no attributes"), found=name)

    for a in n.node.attribute:
        spec = facts.attributes.get(a.name)
        if spec is not None and a.type != spec.type:
            n.report("schema.attribute-type", f"attribute {a.name} has the wrong type", subject=f"attribute {a.name}",
                     expected=AttributeProto.AttributeType.Name(spec.type),
                     found=AttributeProto.AttributeType.Name(a.type) if a.type in AttributeProto.AttributeType.values()
                     else a.type)

    bound: dict[str, tuple[str, int]] = {}
    for i, name in enumerate(n.node.input):
        p = facts.input(i)
        if not name or p is None:
            continue
        t = n.ctx[name].elem_type
        if not t:
            continue
        if t not in p.allowed:
            later = opsets.first_version_allowing_input(op, i, t, n.version, facts.domain)
            if later is not None:
                n.report("schema.version-gate",
                         f"{type_name(t)} for {p.name} is allowed from {op}-{later}; the model's opset {n.opset} "
                         f"selects {_op(n)}",
                         subject=f"input {p.name}", expected=types_text(p.allowed), found=type_name(t))
            else:
                n.report("schema.type-constraint",
                         f"{p.name} ({p.type_str}) does not accept {type_name(t)} in {_op(n)}",
                         subject=f"input {p.name}", expected=types_text(p.allowed), found=type_name(t))
            continue
        tp = p.type_param
        if tp is None:
            continue
        if tp in bound and bound[tp][1] != t:
            other, other_t = bound[tp]
            n.report("schema.type-binding",
                     f"{p.name} and {other} share type parameter {tp} and must have the same type",
                     subject=f"input {p.name}", expected=type_name(other_t), found=type_name(t))
        else:
            bound.setdefault(tp, (p.name, t))


def attr(n: NodeContext, facts: OpFacts, name: str, default=None):
    """Attribute value, or ``default`` when absent, not in this version, or of the wrong type
    (each of those is reported by :func:`check_schema`)."""
    spec = facts.attributes.get(name)
    if spec is None:
        return default
    for a in n.node.attribute:
        if a.name == name:
            return n.attr(name, default) if a.type == spec.type else default
    return default


def fixed_output_type(facts: OpFacts, i: int) -> int:
    """The output's element type when the schema allows exactly one (else 0)."""
    allowed = facts.output_types(i)
    return next(iter(allowed)) if len(allowed) == 1 else 0


# ---------------------------------------------------------------- shapes of parameters
def is_per_tensor_shape(shape: Sequence | None) -> bool:
    """A scalar or a 1-D tensor of one element (per-tensor quantization parameters)."""
    return shape is not None and (len(shape) == 0 or (len(shape) == 1 and shape[0] == 1))


def same_param_shape(a: Sequence | None, b: Sequence | None) -> bool | None:
    """Whether two parameter shapes agree (``None`` when it cannot be told).

    A scalar and a one-element 1-D tensor count as the same (both per-tensor), as
    onnxruntime and the ONNX reference implementation treat them.
    """
    if a is None or b is None:
        return None
    if is_per_tensor_shape(a) and is_per_tensor_shape(b):
        return True
    if len(a) != len(b):
        return False
    if any(provably_different(x, y) for x, y in zip(a, b)):
        return False
    return True


def check_same_shape(n: NodeContext, rule: str, scale: TensorInfo, zp: TensorInfo | None,
                     scale_name: str, zp_name: str) -> None:
    if zp is None:
        return
    if same_param_shape(scale.shape, zp.shape) is False:
        n.report(rule, f"{zp_name} must have the shape of {scale_name}", subject=f"input {zp_name}",
                 expected=shape_text(scale.shape), found=shape_text(zp.shape))


def check_per_tensor(n: NodeContext, rule: str, t: TensorInfo | None, name: str, why: str = "") -> None:
    """A parameter that must be a scalar (or a one-element 1-D tensor)."""
    if t is None or t.shape is None:
        return
    s = t.shape
    if is_per_tensor_shape(s):
        return
    if len(s) == 1 and not isinstance(s[0], int):
        if not provably_different(s[0], 1):
            return  # a symbolic length may be 1
    n.report(rule, why or f"{name} must be a scalar (per-tensor)", subject=f"input {name}",
             expected="a scalar or a 1-element 1-D tensor", found=shape_text(s))


# ---------------------------------------------------------------- Q / DQ granularity
def _ceildiv_text(d, b) -> str:
    return dims.to_text(dims.ceildiv(d, b))


def check_quant_params(n: NodeContext, facts: OpFacts, x: TensorInfo, scale: TensorInfo,
                       zp: TensorInfo | None, *, scale_name: str, zp_name: str) -> str | None:
    """Validate scale/zero point against ``x``, ``axis`` and ``block_size``.

    Returns the granularity the shapes imply ("per-tensor", "per-axis", "blocked") or
    ``None`` when it cannot be told (unknown rank).
    """
    check_same_shape(n, "quant.zero-point-shape", scale, zp, scale_name, zp_name)
    op = n.node.op_type
    per_axis_ok = facts.has_attr("axis")
    blocked_ok = facts.has_attr("block_size")
    axis = attr(n, facts, "axis", 1)
    block_size = attr(n, facts, "block_size", 0)
    xs, ss = x.shape, scale.shape
    r = None if xs is None else len(xs)

    if block_size < 0:
        n.report("quant.block-size-range", "block_size must be a positive integer (0 means not blocked)",
                 subject="attribute block_size", expected=">= 1 (or 0)", found=block_size)
        return None
    if ss is None:
        return None
    sr = len(ss)

    if block_size == 0:
        if is_per_tensor_shape(ss):
            return "per-tensor"
        if sr == 1:
            if not per_axis_ok:
                first = opsets.first_version_with_attr(op, "axis", n.version, facts.domain)
                n.report("quant.granularity-version",
                         f"{_op(n)} only allows per-tensor quantization (per-axis from {op}-{first})",
                         subject=f"input {scale_name}", expected="a scalar or a 1-element 1-D tensor",
                         found=shape_text(ss))
                return "per-axis"
            if r is None:
                return "per-axis"
            length = ss[0]
            if not -r <= axis <= r - 1:
                if isinstance(length, int):  # a symbolic/unknown length may be 1 (per-tensor)
                    n.report("quant.axis-range",
                             f"axis must lie in [-r, r-1] for x of rank {r} (per-axis {scale_name} {shape_text(ss)})",
                             subject="attribute axis", expected=f"in [{-r}, {r - 1}]", found=axis)
                return "per-axis"
            d = xs[axis % r]
            if provably_different(length, d):
                n.report("quant.per-axis-scale-length",
                         f"a 1-D {scale_name} must have x.shape[axis={axis}] elements (x shape {shape_text(xs)})",
                         subject=f"input {scale_name}", expected=dims.to_text(d), found=dims.to_text(length))
            return "per-axis"
        # rank >= 2 without block_size
        if not blocked_ok:
            first = opsets.first_version_with_attr(op, "block_size", n.version, facts.domain)
            n.report("quant.granularity-version",
                     f"{_op(n)} allows a scalar or 1-D {scale_name} only (blocked quantization from {op}-{first})",
                     subject=f"input {scale_name}", expected="rank 0 or 1", found=f"rank {sr} {shape_text(ss)}")
        elif r is not None and sr != r:
            n.report("quant.blocked-scale-rank",
                     f"a blocked {scale_name} must have the rank of x {shape_text(xs)} (and block_size must be set)",
                     subject=f"input {scale_name}", expected=f"rank {r}", found=f"rank {sr} {shape_text(ss)}")
        else:
            n.report("quant.block-size-missing",
                     f"{scale_name} of rank {sr} means blocked quantization, which needs block_size > 0",
                     subject="attribute block_size", expected=">= 1", found=0)
        return "blocked"

    # block_size > 0 (only reachable from version 21 on)
    if r is None:
        return "blocked"
    if sr != r or r == 0:
        if sr <= 1:
            kind = "per-tensor (scalar)" if sr == 0 or is_per_tensor_shape(ss) else "per-axis (1-D)"
            n.report("quant.block-size-granularity",
                     f"block_size={block_size} is only used by blocked quantization, but {scale_name} "
                     f"{shape_text(ss)} is {kind} for x {shape_text(xs)}",
                     subject="attribute block_size", expected=f"0, or a {scale_name} of rank {r}",
                     found=block_size)
        else:
            n.report("quant.blocked-scale-rank",
                     f"a blocked {scale_name} must have the rank of x {shape_text(xs)}",
                     subject=f"input {scale_name}", expected=f"rank {r}", found=f"rank {sr} {shape_text(ss)}")
        return "blocked"
    if not -r <= axis <= r - 1:
        n.report("quant.axis-range", f"axis must lie in [-r, r-1] for x of rank {r} (blocked {scale_name})",
                 subject="attribute axis", expected=f"in [{-r}, {r - 1}]", found=axis)
        return "blocked"
    a = axis % r
    for i in range(r):
        if i == a:
            continue
        if provably_different(ss[i], xs[i]):
            n.report("quant.blocked-scale-shape",
                     f"a blocked {scale_name} equals x's shape except on axis {a}: dim {i} differs",
                     subject=f"input {scale_name}", expected=shape_text(xs[:a] + (dims.ceildiv(xs[a], block_size),) + xs[a + 1:]),
                     found=shape_text(ss))
            break
    d, s = xs[a], ss[a]
    want = dims.ceildiv(d, block_size)
    if provably_different(s, want):
        if isinstance(d, int) and isinstance(s, int) and d > 0 and s > 0:
            lo = -(-d // s)
            hi = "inf" if s == 1 else str(-(-d // (s - 1)) - 1)
            rng = f"[{lo}, {hi}]" if s == 1 or lo <= int(hi) else f"empty ([{lo}, {hi}])"
            msg = (f"with x.shape[{a}] = {d} and {scale_name}.shape[{a}] = {s} block_size must lie in "
                   f"[ceil(Di/Si), ceil(Di/(Si-1))-1] = {rng}")
            expected = rng
        else:
            msg = (f"{scale_name}.shape[{a}] must be ceil(x.shape[{a}] / block_size) = "
                   f"ceil({dims.to_text(d)} / {block_size}) = {_ceildiv_text(d, block_size)}, "
                   f"but it is {dims.to_text(s)}")
            expected = f"a block_size with ceil({dims.to_text(d)} / block_size) = {dims.to_text(s)}"
        n.report("quant.block-size-range", msg, subject="attribute block_size", expected=expected, found=block_size)
    return "blocked"


def check_output_dtype(n: NodeContext, facts: OpFacts, output_dtype: int) -> bool:
    """``output_dtype`` must be a type the version allows for the output; True when it is."""
    allowed = facts.output_types(0)
    if output_dtype in allowed:
        return True
    op = n.node.op_type
    later = opsets.first_version_allowing_output(op, 0, output_dtype, n.version, facts.domain)
    extra = f" (allowed from {op}-{later})" if later else ""
    n.report("quant.output-dtype", f"output_dtype is not an output type {_op(n)} allows{extra}",
             subject="attribute output_dtype", expected=types_text(allowed), found=dtype_text(output_dtype))
    return False


def is_data_type(code: int) -> bool:
    """A defined TensorProto element type (not UNDEFINED, not an unknown number)."""
    return code != TensorProto.UNDEFINED and code in TensorProto.DataType.values()


def dtype_text(code: int) -> str:
    if not is_data_type(code):
        return f"{code} (not a TensorProto data type)"
    return f"{type_name(code)} ({code})"


def precision_types(facts: OpFacts) -> frozenset[int]:
    """Float types of at least 16 bits that the version allows for x or the scale."""
    codes = facts.input_types(0) | facts.input_types(1)
    return frozenset(c for c in codes if c in BY_CODE and BY_CODE[c].is_float and BY_CODE[c].bits >= 16)


def check_int32_zero_point(n: NodeContext, x: TensorInfo, zp: TensorInfo | None, zp_name: str) -> None:
    """DequantizeLinear of int32 has no zero point (it is supposed to be 0)."""
    if zp is None or x.elem_type != TensorProto.INT32 or zp.value is None:
        return
    values = np.asarray(zp.value)
    if values.size and np.any(values != 0):
        n.report("quant.int32-zero-point", "dequantizing int32 takes no zero point (it is supposed to be 0)",
                 subject=f"input {zp_name}", expected="absent or all zeros",
                 found=f"non-zero values (e.g. {values.flat[int(np.flatnonzero(values)[0])]})")


__all__ = [
    "check_schema", "check_quant_params", "check_output_dtype", "check_int32_zero_point", "check_same_shape",
    "check_per_tensor", "fixed_output_type", "is_per_tensor_shape", "same_param_shape", "precision_types",
    "facts_for", "provably_equal", "attr", "is_data_type", "types_text", "dtype_text",
]

"""Per-opset operator facts, read from the installed ``onnx.defs`` (never hand-copied).

For one operator schema (op_type, since_version, domain) :func:`op_facts` gives the
element-type codes each input and output accepts (resolved through the schema's type
constraints), the type parameter each one is bound to, the attributes that exist in that
version, and the input/output counts. Everything is cached: a schema is read once.

Rules use these facts to check type constraints of the exact version a model selects
and to explain version gates ("int4 for y_zero_point needs QuantizeLinear-21").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from onnx import AttributeProto, TensorProto, defs, helper

from onnx_quant.errors import QuantError


class UnknownOperator(QuantError):
    """No schema in ``onnx.defs`` for this operator (or not at that version)."""


def _normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


_TENSOR_RE = re.compile(r"^tensor\(([a-z0-9]+)\)$")


@lru_cache(maxsize=None)
def type_str_code(type_str: str) -> int | None:
    """TensorProto code of ``tensor(<name>)`` (``None`` for sequences, maps, optionals...).

    ONNX spells element types in type strings as the lower-case ``DataType`` name
    (``tensor(float)`` is ``FLOAT``, ``tensor(float8e4m3fn)`` is ``FLOAT8E4M3FN``).
    """
    m = _TENSOR_RE.match(type_str.strip())
    if not m:
        return None
    name = m.group(1).upper()
    if name not in TensorProto.DataType.keys():
        return None
    return int(TensorProto.DataType.Value(name))


@dataclass(frozen=True)
class FormalParam:
    """One input or output of a schema."""

    index: int
    name: str
    #: the schema's type string: a type parameter (``"T1"``) or a concrete ``tensor(float)``
    type_str: str
    #: element-type codes this slot accepts (tensor types only)
    allowed: frozenset[int]
    optional: bool
    variadic: bool
    #: the fewest values a variadic slot takes (1 for a single or optional one)
    min_arity: int = 1

    @property
    def type_param(self) -> str | None:
        """The type parameter this slot is bound to, ``None`` for a concrete type string."""
        return None if type_str_code(self.type_str) is not None else self.type_str


@dataclass(frozen=True)
class AttrFacts:
    name: str
    type: int  # AttributeProto.AttributeType
    required: bool
    #: the schema's default as ``onnx.helper.get_attribute_value`` gives it (strings decoded, lists
    #: as tuples; a tensor default stays a TensorProto), ``None`` where the schema gives none
    default: Any = None


@dataclass(frozen=True)
class OpFacts:
    """What one schema version of an operator allows."""

    op_type: str
    domain: str
    since_version: int
    inputs: tuple[FormalParam, ...]
    outputs: tuple[FormalParam, ...]
    #: type parameter -> allowed element-type codes
    type_constraints: dict[str, frozenset[int]]
    attributes: dict[str, AttrFacts]
    min_input: int
    max_input: int
    min_output: int
    max_output: int

    def input(self, i: int) -> FormalParam | None:
        """Formal input ``i`` (the last one when it is variadic), ``None`` past the end."""
        if i < len(self.inputs):
            return self.inputs[i]
        if self.inputs and self.inputs[-1].variadic:
            return self.inputs[-1]
        return None

    def output(self, i: int) -> FormalParam | None:
        if i < len(self.outputs):
            return self.outputs[i]
        if self.outputs and self.outputs[-1].variadic:
            return self.outputs[-1]
        return None

    def input_types(self, i: int) -> frozenset[int]:
        p = self.input(i)
        return p.allowed if p is not None else frozenset()

    def output_types(self, i: int) -> frozenset[int]:
        p = self.output(i)
        return p.allowed if p is not None else frozenset()

    def has_attr(self, name: str) -> bool:
        return name in self.attributes

    def input_index(self, name: str) -> int:
        for p in self.inputs:
            if p.name == name:
                return p.index
        raise KeyError(f"{self.op_type}-{self.since_version} has no input {name!r}")


def _allowed(type_str: str, constraints: dict[str, frozenset[int]]) -> frozenset[int]:
    if type_str in constraints:
        return constraints[type_str]
    code = type_str_code(type_str)
    return frozenset() if code is None else frozenset({code})


def _params(formals, constraints) -> tuple[FormalParam, ...]:
    out = []
    for i, p in enumerate(formals):
        opt = p.option
        out.append(FormalParam(
            index=i,
            name=p.name,
            type_str=p.type_str,
            allowed=_allowed(p.type_str, constraints),
            optional=opt == defs.OpSchema.FormalParameterOption.Optional,
            variadic=opt == defs.OpSchema.FormalParameterOption.Variadic,
            min_arity=int(p.min_arity),
        ))
    return tuple(out)


@lru_cache(maxsize=None)
def since_versions(op_type: str, domain: str = "") -> tuple[int, ...]:
    """Every since_version ``onnx.defs`` defines for the operator, ascending."""
    domain = _normalize_domain(domain)
    return tuple(sorted({
        s.since_version for s in _all_schemas() if s.name == op_type and s.domain == domain
    }))


@lru_cache(maxsize=1)
def _all_schemas():
    return tuple(defs.get_all_schemas_with_history())


@lru_cache(maxsize=None)
def schema(op_type: str, opset: int, domain: str = "") -> defs.OpSchema | None:
    """The ``onnx.defs`` schema a model importing ``opset`` selects (None: ONNX has none)."""
    try:
        return defs.get_schema(op_type, opset, _normalize_domain(domain))
    except Exception:  # onnx raises SchemaError for unknown ops / versions
        return None


@lru_cache(maxsize=None)
def schema_since_version(op_type: str, opset: int, domain: str = "") -> int:
    """since_version of the schema ONNX selects for a model importing ``opset``."""
    try:
        return int(defs.get_schema(op_type, opset, _normalize_domain(domain)).since_version)
    except Exception as exc:  # onnx raises SchemaError
        raise UnknownOperator(f"no schema for {domain or 'ai.onnx'}::{op_type} at opset {opset}") from exc


def _default(attr) -> Any:
    """An attribute schema's default value (``None``: it has none)."""
    proto = attr.default_value
    if proto is None or proto.type == AttributeProto.UNDEFINED:
        return None
    value = helper.get_attribute_value(proto)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list):
        return tuple(v.decode("utf-8") if isinstance(v, bytes) else v for v in value)
    return value


@lru_cache(maxsize=None)
def op_facts(op_type: str, since_version: int, domain: str = "") -> OpFacts:
    """Facts of the schema with exactly this ``since_version`` (or the one in force at it)."""
    domain = _normalize_domain(domain)
    try:
        s = defs.get_schema(op_type, since_version, domain)
    except Exception as exc:
        raise UnknownOperator(f"no schema for {domain or 'ai.onnx'}::{op_type} at version {since_version}") from exc
    constraints = {
        tc.type_param_str: frozenset(
            c for c in (type_str_code(t) for t in tc.allowed_type_strs) if c is not None
        )
        for tc in s.type_constraints
    }
    return OpFacts(
        op_type=op_type,
        domain=domain,
        since_version=int(s.since_version),
        inputs=_params(s.inputs, constraints),
        outputs=_params(s.outputs, constraints),
        type_constraints=constraints,
        attributes={name: AttrFacts(name, int(a.type), bool(a.required), _default(a))
                    for name, a in s.attributes.items()},
        min_input=int(s.min_input),
        max_input=int(s.max_input),
        min_output=int(s.min_output),
        max_output=int(s.max_output),
    )


@lru_cache(maxsize=None)
def first_version_allowing_input(op_type: str, index: int, code: int, after: int = 0, domain: str = "") -> int | None:
    """The first since_version > ``after`` whose input ``index`` accepts ``code``."""
    for v in since_versions(op_type, domain):
        if v > after and code in op_facts(op_type, v, domain).input_types(index):
            return v
    return None


@lru_cache(maxsize=None)
def first_version_allowing_output(op_type: str, index: int, code: int, after: int = 0, domain: str = "") -> int | None:
    """The first since_version > ``after`` whose output ``index`` accepts ``code``."""
    for v in since_versions(op_type, domain):
        if v > after and code in op_facts(op_type, v, domain).output_types(index):
            return v
    return None


@lru_cache(maxsize=None)
def first_version_with_attr(op_type: str, attr: str, after: int = 0, domain: str = "") -> int | None:
    """The first since_version > ``after`` that defines attribute ``attr``."""
    for v in since_versions(op_type, domain):
        if v > after and op_facts(op_type, v, domain).has_attr(attr):
            return v
    return None

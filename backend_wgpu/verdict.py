"""One kernel verdict and one type binding, for every phase that asks whether a kernel takes a node.

* :class:`TypeBinding` binds a spec's type constraints (``typeConstraints``) one input or output at
  a time: a type the constraint does not allow, or a second type for a constraint another value
  already fixed, is a :class:`TypeClash`. The planner (planner.py, concrete types per plan) and
  :func:`spec_rejects` (static types, an unknown one skipped: decided per plan) both bind through it,
  each wording the clash as it always has.
* :func:`spec_rejects` — why a kernel spec cannot take a node whatever the shapes: arity, the
  attributes it understands, the static element types.
* :func:`kernel_verdict` (``SpecRegistry.verdict``) — the spec of a node's op at an opset version
  and why it cannot take the node ('' if it can): what the construction phases (rewrites.py and the
  passes), the placement (placement.py) and NonZero's split ask. They call the function over the
  registry they are given (anything with ``find(domain, op, version)``), so a registry that wraps
  another and overrides ``find`` keeps its own answer.

Pure: node protos, element type codes and spec objects; no device, no Session.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import onnx

from onnx_quant.dtypes import element_type, type_name
from onnx_quant.errors import QuantError

DEFAULT_DOMAINS = ("", "ai.onnx")

#: ops that run as a view of their input's buffer (no kernel, no copy)
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})

_STRINGS = "string tensors have no device form"
#: (domain, op) -> why the op stays on the host by nature: no GPU kernel is meant to cover it, and
#: the verdict names it so (``<op> is host-only: <why>``) instead of "no GPU kernel"
HOST_ONLY_OPS: Mapping[tuple[str, str], str] = {
    ("", "StringNormalizer"): _STRINGS, ("", "StringSplit"): _STRINGS, ("", "StringConcat"): _STRINGS,
    ("", "RegexFullMatch"): _STRINGS, ("", "TfIdfVectorizer"): "n-gram matching over token pools (strings or ids)",
    ("", "ImageDecoder"): "decoding compressed image bytes (JPEG, PNG, ...)",
    ("ai.onnx.ml", "LabelEncoder"): "a lookup table over strings or numbers",
    ("ai.onnx.ml", "TreeEnsemble"): "data-dependent tree walks",
    ("ai.onnx.preview.training", "Adam"): "a training step", ("ai.onnx.preview.training", "Adagrad"): "a training step",
    ("ai.onnx.preview.training", "Momentum"): "a training step",
}

#: the words every host-only verdict carries (what the conformance summary counts by)
HOST_ONLY = "is host-only"


def host_only_reason(domain: str, op_type: str) -> str:
    """``<op> is host-only: <why>`` for an op of :data:`HOST_ONLY_OPS`, else ''."""
    why = HOST_ONLY_OPS.get(("" if domain in DEFAULT_DOMAINS else domain, op_type))
    return f"{op_text(domain, op_type)} {HOST_ONLY}: {why}" if why else ""


def onnx_type(code: int) -> str | None:
    """The element type name of a TensorProto code, or None when the backend has no such type."""
    if not code:
        return None
    try:
        return element_type(code).name
    except QuantError:
        return None


def op_text(domain: str, op_type: str) -> str:
    """An op as messages name it: ``Conv``, ``com.microsoft::QGemm``."""
    return f"{domain}::{op_type}" if domain not in DEFAULT_DOMAINS else op_type


@dataclass(frozen=True)
class TypeClash:
    """Why a value's type does not bind: ``io`` has ``dtype`` (None: no device type), which
    ``constraint`` does not allow (``bound`` None), or which differs from the type ``bound`` =
    (type, io) another value fixed for the same constraint."""

    io: str
    dtype: str | None
    constraint: str
    allowed: tuple[str, ...]
    bound: tuple[str, str] | None = None


class TypeBinding:
    """A spec's type constraints bound value by value (in the order the caller binds them)."""

    def __init__(self, constraints: Mapping[str, Sequence[str]]) -> None:
        self.constraints = constraints
        #: constraint -> (type, the io that fixed it)
        self.bound: dict[str, tuple[str, str]] = {}

    def bind(self, io: str, constraint: str, dtype: str | None) -> TypeClash | None:
        """Bind ``io``'s type ``dtype`` to ``constraint``; the clash, or None when it binds."""
        allowed = tuple(self.constraints[constraint])
        if dtype is None or dtype not in allowed:
            return TypeClash(io, dtype, constraint, allowed)
        held = self.bound.get(constraint)
        if held is not None and held[0] != dtype:
            return TypeClash(io, dtype, constraint, allowed, held)
        self.bound.setdefault(constraint, (dtype, io))
        return None

    def type_of(self, constraint: str) -> str | None:
        """The type ``constraint`` is bound to (None while unbound)."""
        held = self.bound.get(constraint)
        return None if held is None else held[0]


def spec_rejects(spec: Any, node: onnx.NodeProto, elem_of: Callable[[str], int]) -> str:
    """Why kernel ``spec`` cannot take ``node`` whatever the shapes ('' if it can): arity, the
    attributes it understands, and the static element types (``elem_of``: 0 when unknown, which
    is decided per plan) against its type constraints."""
    inputs = list(node.input)
    outputs = list(node.output)
    why = _arity_rejects(spec, node, inputs, outputs)
    if why:
        return why
    binding = TypeBinding(spec.type_constraints)
    for names, decls in ((inputs, spec.inputs), (outputs, spec.outputs)):
        for i, (sname, decl) in enumerate(decls.items()):
            vname = names[i] if i < len(names) else ""
            code = elem_of(vname) if vname else 0
            if not code:
                continue  # absent, or decided per plan
            clash = binding.bind(sname, decl.dtype, onnx_type(code))
            if clash is not None:
                return _static_clash_text(spec, clash, code)
    return ""


def _arity_rejects(spec: Any, node: onnx.NodeProto, inputs: list[str], outputs: list[str]) -> str:
    """Why the node's inputs, outputs or attributes do not fit the spec ('' if they do)."""
    if len(inputs) > len(spec.inputs):
        return f"the node has {len(inputs)} inputs, kernel {spec.name} takes {len(spec.inputs)}"
    if len(outputs) > len(spec.outputs):
        return f"the node has {len(outputs)} outputs, kernel {spec.name} writes {len(spec.outputs)}"
    for i, (sname, decl) in enumerate(spec.inputs.items()):
        vname = inputs[i] if i < len(inputs) else ""
        if not vname and not decl.optional:
            return f"kernel {spec.name} needs input {sname!r}, the node leaves it out"
    for i, (sname, decl) in enumerate(spec.outputs.items()):
        if (i >= len(outputs) or not outputs[i]) and not decl.optional:
            return f"kernel {spec.name} writes output {sname!r}, the node leaves it out"
    for a in node.attribute:
        if a.name not in spec.attributes:
            return f"kernel {spec.name} does not understand attribute {a.name!r}"
    return ""


def _static_clash_text(spec: Any, clash: TypeClash, code: int) -> str:
    """spec_rejects' wording of a clash (``code``: the value's TensorProto element type)."""
    if clash.bound is None:
        return (f"kernel {spec.name}: {clash.io!r} is {type_name(code)}, {clash.constraint} allows only "
                f"{', '.join(clash.allowed)}")
    return (f"kernel {spec.name}: {clash.io!r} is {clash.dtype} but {clash.bound[1]!r} is "
            f"{clash.bound[0]} (both {clash.constraint})")


class Verdict(NamedTuple):
    """The kernel spec of a node's op (None where no spec covers it) and why it cannot take the
    node whatever the shapes ('' if it can)."""

    spec: Any
    reason: str


def kernel_verdict(specs: Any, node: onnx.NodeProto, domain: str, version: int,
                   elem_of: Callable[[str], int]) -> Verdict:
    """The verdict of registry ``specs`` (``find(domain, op, version)``) on ``node``."""
    spec = specs.find(domain, node.op_type, version)
    if spec is None:
        return Verdict(None, host_only_reason(domain, node.op_type)
                       or f"no GPU kernel for {op_text(domain, node.op_type)} at opset {version}")
    return Verdict(spec, spec_rejects(spec, node, elem_of))


def written_node_rejects(specs: Any, elem_of: Callable[[str], int]) -> Callable[[onnx.NodeProto, str, int], str]:
    """``rejects(node, domain, version)`` for a node a construction phase would write: '' for a
    view op (a view of its input), else the registry's reason."""

    def rejects(node: onnx.NodeProto, domain: str, version: int) -> str:
        if domain in DEFAULT_DOMAINS and node.op_type in VIEW_OPS:
            return ""
        return kernel_verdict(specs, node, domain, version, elem_of).reason

    return rejects

"""The rule registry: one rule per (domain, op_type, since_version).

A rule is ``rule(ctx: ShapesContext, n: NodeContext) -> None``: it reads the node's
inputs from ``ctx``, validates what the operator's version requires, and writes every
output it can type with ``ctx.set``. A rule registered at ``since_version=v`` serves the
model's opset ``o`` when ``v`` is the highest registered version with ``v <= s``, where
``s`` is the since_version of the schema ONNX itself selects for ``o`` (``onnx.defs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

import onnx
from onnx import defs, helper

from onnx_quant.errors import InferenceError

from . import dims
from .context import ShapesContext, TensorInfo


def normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


@dataclass
class NodeContext:
    """One node as a rule sees it: the proto, how to name it, the selected version."""

    node: onnx.NodeProto
    index: int
    ctx: ShapesContext
    #: since_version of the schema selected for the model's opset (the version a rule
    #: must follow); the model's own opset for the domain is ``opset``.
    version: int
    opset: int
    #: set by :meth:`fresh_dim`: the outputs carry symbols of this node's own
    fresh: bool = field(default=False, init=False, repr=False)

    @property
    def _attrs(self) -> dict[str, Any]:
        """Attribute name -> AttributeProto, read from the proto when a rule first asks (most
        nodes the pass types never do: their result is the memo's)."""
        attrs = self.__dict__.get("_attr_map")
        if attrs is None:
            attrs = self.__dict__["_attr_map"] = {a.name: a for a in self.node.attribute}
        return attrs

    @property
    def label(self) -> str:
        """How errors name the node: its name, or ``#index (OpType)`` when unnamed."""
        if self.node.name:
            return f"{self.node.name!r} ({self.node.op_type})"
        return f"#{self.index} ({self.node.op_type})"

    # -- attributes
    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    def attr(self, name: str, default: Any = None) -> Any:
        a = self._attrs.get(name)
        return default if a is None else helper.get_attribute_value(a)

    def attr_names(self) -> list[str]:
        return list(self._attrs)

    # -- inputs and outputs
    def input_name(self, i: int) -> str:
        return self.node.input[i] if i < len(self.node.input) else ""

    def has_input(self, i: int) -> bool:
        return bool(self.input_name(i))

    def input(self, i: int) -> TensorInfo | None:
        """Info of input ``i``; ``None`` when the optional input is absent."""
        name = self.input_name(i)
        return self.ctx[name] if name else None

    def output_name(self, i: int) -> str:
        return self.node.output[i] if i < len(self.node.output) else ""

    def fresh_dim(self, i: int, axis: int):
        """A new symbol for a data-dependent dim (NonZero's count, TopK with an unknown K):
        ``<output i>_dim<axis>``. The node's result then names the node, so it is not memoized."""
        self.fresh = True
        return dims.named_symbol(self.output_name(i) or self.node.name or self.node.op_type, f"dim{axis}")

    def set_output(self, i: int, info: TensorInfo) -> None:
        name = self.output_name(i)
        if name:
            self.ctx.set(name, info)

    # -- errors
    def error(self, rule: str, message: str = "", *, subject: str | None = None,
              expected: Any = None, found: Any = None) -> InferenceError:
        return InferenceError(
            rule, self.label, message, subject=subject,
            expected=None if expected is None else str(expected),
            found=None if found is None else str(found),
        )

    def fail(self, rule: str, message: str = "", **kw: Any) -> None:
        """A violation that stops this node's inference (raises)."""
        raise self.error(rule, message, **kw)

    def report(self, rule: str, message: str = "", **kw: Any) -> None:
        """A violation after which inference can go on: raises in strict mode, else recorded."""
        err = self.error(rule, message, **kw)
        if self.ctx.strict:
            raise err
        self.ctx.diagnostics.append(err)


Rule = Callable[[ShapesContext, NodeContext], None]

_RULES: dict[tuple[str, str], dict[int, Rule]] = {}
#: bumped by every registration, so that caches of what serves an op (the engine's) go stale
generation = 0


def register(op_type: str, *since_versions: int, domain: str = "") -> Callable[[Rule], Rule]:
    """Register ``rule`` for op_type at each listed since_version."""

    def deco(fn: Rule) -> Rule:
        global generation
        generation += 1
        table = _RULES.setdefault((normalize_domain(domain), op_type), {})
        for v in since_versions:
            if v in table:
                raise ValueError(f"rule for {domain or 'ai.onnx'}::{op_type} v{v} registered twice")
            table[v] = fn
        return fn

    return deco


@lru_cache(maxsize=None)
def schema_version(domain: str, op_type: str, opset: int) -> int | None:
    """since_version of the schema ONNX selects for ``opset`` (None if ONNX has none)."""
    try:
        return defs.get_schema(op_type, opset, normalize_domain(domain)).since_version
    except Exception:  # onnx raises SchemaError for unknown ops / versions
        return None


def lookup(domain: str, op_type: str, opset: int) -> tuple[Rule, int] | None:
    """The rule that serves ``op_type`` at the model's ``opset``, with its version."""
    table = _RULES.get((normalize_domain(domain), op_type))
    if not table:
        return None
    target = schema_version(domain, op_type, opset) or opset
    candidates = [v for v in table if v <= target]
    if not candidates:
        return None
    v = max(candidates)
    return table[v], target


def registered() -> dict[tuple[str, str], tuple[int, ...]]:
    """Every (domain, op_type) with its registered since_versions (for docs and tests)."""
    return {k: tuple(sorted(v)) for k, v in _RULES.items()}

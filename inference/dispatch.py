"""Dispatch: what types the nodes of one (domain, op_type) under one set of opset imports.

In order of preference: ``Constant`` by the engine; ``If``, ``Loop`` and ``Scan`` by the
engine's body inference (``inference.subgraphs``); the op's own rule (``inference.registry``);
onnx's per-node inference for the schema ``onnx.defs`` selects (the fallback); a model-local
function (``inference.functions``); else nothing. The facts of the installed onnx (schemas,
their required inputs) come through ``onnx_quant.opsets`` and are decided once per process
and registry state; an ``Entry`` adds what is per pass (its memo, the model's function).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable

import onnx

from onnx_quant import opsets

from . import registry, subgraphs
from .api import (
    SOURCE_CONSTANT, SOURCE_FALLBACK, SOURCE_FUNCTION, SOURCE_RULE, SOURCE_UNKNOWN, describe,
)
from .folding import FOLDERS
from .registry import NodeContext

# dispatch kinds
K_NO_OPSET, K_CONSTANT, K_CONTROL, K_RULE, K_FALLBACK, K_FUNCTION, K_UNKNOWN = range(7)


class Entry:
    """How nodes of one (domain, op_type) are typed under one set of opset imports."""

    __slots__ = ("kind", "domain", "op", "opset", "version", "rule", "schema", "required", "variadic",
                 "source", "described", "handler", "folder", "memo", "function")

    def __init__(self, facts: tuple, function: onnx.FunctionProto | None) -> None:
        """``facts``: every field but the memo and the function, in ``__slots__`` order, as
        :func:`entry_facts` decides them once per process."""
        (self.kind, self.domain, self.op, self.opset, self.version, self.rule, self.schema, self.required,
         self.variadic, self.source, self.described, self.handler, self.folder) = facts
        self.function = function if self.kind == K_FUNCTION else None  # a model-local function
        self.memo: dict | None = {} if self.kind in (K_RULE, K_FALLBACK) else None  # rules and the fallback only


def new_entry(domain: str, op: str, opset: int | None, function: onnx.FunctionProto | None) -> Entry:
    """The entry for ``op`` of (normalized) ``domain`` under the model's ``opset`` for it
    (None: not imported); ``function``: the model's local function of that name, if any."""
    return Entry(entry_facts(domain, op, opset, function is not None, registry.generation, registry.lookup),
                 function)


@lru_cache(maxsize=None)
def entry_facts(domain: str, op: str, opset: int | None, has_function: bool, generation: int, lookup) -> tuple:
    """Every field of an ``Entry`` but its memo and function: what serves ``op`` under
    ``opset`` (and whether the model has a local function of that name), decided once per
    process and registry state."""
    version = rule = schema = handler = variadic = None
    required: tuple = ()
    if opset is None:
        kind = K_FUNCTION if has_function else K_NO_OPSET
    elif domain == "" and op == "Constant":
        kind = K_CONSTANT
        version = registry.schema_version("", "Constant", opset)
    else:
        kind, handler, rule, version, facts = dispatch_facts(domain, op, opset, generation, lookup)
        if kind == K_UNKNOWN and has_function:
            kind = K_FUNCTION
        if facts is not None:
            schema, required, variadic = facts
    source = {K_RULE: SOURCE_RULE, K_CONTROL: SOURCE_RULE, K_FALLBACK: SOURCE_FALLBACK,
              K_FUNCTION: SOURCE_FUNCTION, K_CONSTANT: SOURCE_CONSTANT}.get(kind, SOURCE_UNKNOWN)
    folder = FOLDERS.get(op) if domain == "" else None  # engine folding of its outputs
    return (kind, domain, op, opset, version, rule, schema, required, variadic, source,
            describe(source, domain, op, version), handler, folder)


@lru_cache(maxsize=None)
def dispatch_facts(domain: str, op: str, opset: int, generation: int, lookup) -> tuple:
    """(kind, control-flow handler, rule, version, (schema, required, variadic) or None): what
    serves ``op`` under ``opset``, decided once per process and registry state (its
    ``generation`` and ``lookup``, which tests replace) rather than once per pass. A model-local
    function is the caller's to add (it is per model)."""
    schema, required, variadic = schema_facts(domain, op, opset)
    kind, handler, rule, version = K_UNKNOWN, None, None, None
    control = subgraphs.HANDLERS.get(op) if domain == "" and schema is not None else None
    if control is not None and subgraphs.handles(op, schema.since_version):
        kind, handler, version = K_CONTROL, control, schema.since_version
    else:
        found = lookup(domain, op, opset)
        if found is not None:
            kind, (rule, version) = K_RULE, found
        elif schema is not None:
            kind, version = K_FALLBACK, schema.since_version
    facts = (schema, required, variadic) if schema is not None and kind != K_UNKNOWN else None
    return kind, handler, rule, version, facts


@lru_cache(maxsize=None)
def schema_facts(domain: str, op_type: str, opset: int) -> tuple[Any, tuple, tuple | None]:
    """(the onnx.defs schema serving ``opset``, or None; the indices of its single
    (non-optional) inputs; (start, min count, name) of its variadic input, or None)."""
    schema = opsets.schema(op_type, opset, domain)
    if schema is None:
        return None, (), None
    facts = opsets.op_facts(op_type, schema.since_version, domain)
    required, var = [], None
    for p in facts.inputs:
        if not p.optional and not p.variadic:
            required.append(p.index)
        elif p.variadic and p.min_arity > 0:
            var = (p.index, p.min_arity, p.name)
    return schema, tuple(required), var


def schema_for(domain: str, op_type: str, opset: int):
    """The onnx.defs schema serving ``opset`` (None: ONNX has none)."""
    return schema_facts(domain, op_type, opset)[0]


def required_present(n: NodeContext, entry: Entry, report: Callable[[Exception], None]) -> bool:
    """Whether the node gives every input its schema requires; ``report`` each one missing."""
    inputs = n.node.input
    count = len(inputs)
    ok = True
    for i in entry.required:
        if i >= count or not inputs[i]:
            p = entry.schema.inputs[i]
            report(n.error(
                "schema.required-input",
                f"input #{i} ({p.name}) of {entry.op}-{entry.version} is required but missing",
                subject=f"input {p.name}", expected="a value name", found="nothing"))
            ok = False
    if entry.variadic is not None:
        start, least, pname = entry.variadic
        given = sum(1 for x in inputs[start:] if x)
        if given < least:
            report(n.error(
                "schema.required-input",
                f"variadic input {pname} (from #{start}) of {entry.op}-{entry.version} needs at least {least} "
                f"value{'s' if least != 1 else ''}",
                subject=f"input {pname}", expected=f"at least {least}", found=given))
            ok = False
    return ok


def unknown_op(n: NodeContext, entry: Entry, report: Callable[[Exception], None], strict: bool) -> None:
    """Report a node nothing types: an ai.onnx op unknown at the model's opset (always), an
    op of another domain (strict mode only: its outputs stay unknown)."""
    op, domain, opset = entry.op, entry.domain, entry.opset
    if domain == "":
        versions = opsets.since_versions(op)
        if versions:
            msg = f"{op} is not defined at ai.onnx opset {opset}: it first appears in opset {versions[0]}"
        else:
            msg = f"ai.onnx has no operator {op!r}"
        report(n.error("unknown-op", msg))
    elif strict:
        raise n.error("unknown-op", f"no rule, ONNX schema or model-local function for {domain}::{op} (opset {opset})")

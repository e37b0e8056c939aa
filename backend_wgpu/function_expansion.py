"""Ops with no GPU kernel expanded into their ONNX function bodies (a construction phase, first).

ONNX defines many ops as functions of other ops (FlexAttention, the window ops, Range's
expansion, ...): a schema carries a ``FunctionProto``, plain or built for the node's attributes
and input types (a context-dependent function). Where the kernel registry has no kernel for a
node's op at the model's opset but its schema has such a function, the node is replaced by the
function's body, instantiated for it, so that the body's ops run on the GPU instead of the whole
node on the host: what onnx's backend tests call the "expanded" model, made by onnx's own
inliner (``onnx.inliner.inline_selected_functions``: attribute references, renaming, graph
attributes). A body is taken only where the registry has a kernel (or a view) for every op in it:
Bernoulli's RandomUniformLike has none, so Bernoulli stays one host node, not a host node among
GPU ones. Nodes an existing kernel declines (a type, an attribute) are left alone: their body's
ops would decline the same things; so are host-only ops (verdict.HOST_ONLY_OPS) and nodes inside
If / Loop / Scan bodies.

Each expanded node's function gets its own name in a private domain (a context-dependent body
differs per node), which the inliner removes with the call; the model's opset imports gain the
body's where it uses a domain the model does not import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import onnx
import onnx.inliner
from onnx import helper

from .control_flow import is_control
from .passes import PassResult, RewritePass
from .sequences import SEQUENCE_OPS
from .verdict import DEFAULT_DOMAINS, VIEW_OPS, host_only_reason

#: the private domain each expanded node's function is called through until it is inlined
CALL_DOMAIN = "ai.onnx_quant.expansion"
#: body ops that need no kernel: views of a buffer, Constants, and the shape queries the plan
#: folds (placement.FOLD_OPS: the shapes are known per binding)
KERNEL_FREE_OPS = VIEW_OPS | {"Constant", "Shape", "Size"}


@dataclass
class Expanded:
    """One node replaced by its function body: its op, its name, and how many nodes stand for it."""

    op_type: str
    domain: str
    node: str
    body_nodes: int


@dataclass
class ExpansionReport:
    expanded: list[Expanded] = field(default_factory=list)
    #: node label -> why its op's function was not taken (it stays as written)
    failed: dict[str, str] = field(default_factory=dict)


def body_without_kernels(specs: Any, body: onnx.FunctionProto, model_versions: Mapping[str, int]) -> list[str]:
    """The ops of ``body`` that no kernel of ``specs`` covers, at the body's opset imports, else
    the model's (the inlined nodes run at the model's: a body may import only its own domain)."""
    versions = {**model_versions,
                **{("" if o.domain in DEFAULT_DOMAINS else o.domain): o.version for o in body.opset_import}}
    missing = []
    for n in body.node:
        domain = "" if n.domain in DEFAULT_DOMAINS else n.domain
        if domain == "" and n.op_type in KERNEL_FREE_OPS:
            continue
        if specs.find(domain, n.op_type, versions.get(domain, 0)) is None and n.op_type not in missing:
            missing.append(n.op_type)
    return missing


def _type_proto(info: Any) -> onnx.TypeProto:
    """A TypeProto of a static value (element type; the shape where the rank is known; a
    sequence's or optional's own)."""
    if getattr(info, "type_proto", None) is not None:
        return info.type_proto
    if info is None or not info.elem_type:
        return onnx.TypeProto()
    shape = None if info.shape is None else [d if isinstance(d, int) else None for d in info.shape]
    return helper.make_tensor_type_proto(info.elem_type, shape)


def function_of(node: onnx.NodeProto, version: int, values: Mapping[str, Any]) -> onnx.FunctionProto | None:
    """The function body of ``node``'s op at opset ``version`` of its domain, instantiated for
    the node (its attributes and its inputs' static types), or None where the schema has none."""
    domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
    try:
        schema = onnx.defs.get_schema(node.op_type, version, domain)
    except onnx.defs.SchemaError:
        return None
    body = onnx.FunctionProto()
    if schema.has_context_dependent_function:
        types = [_type_proto(values.get(i)).SerializeToString() for i in node.input]
        body.ParseFromString(schema.get_context_dependent_function_with_opset_version(
            version, node.SerializeToString(), types))
    elif schema.has_function:
        body.CopyFrom(schema.get_function_with_opset_version(version))
    else:
        return None
    return body if body.node else None


class ExpandFunctions(RewritePass):
    """Nodes of the top-level graph whose op has no kernel in ``specs`` but a function in its
    schema, replaced by the body (module doc)."""

    name = "expand_functions"

    def __init__(self, specs: Any, enabled: bool = True) -> None:
        self.specs = specs
        self.enabled = enabled

    def _candidates(self, model: onnx.ModelProto, versions: Mapping[str, int]) -> list[tuple[int, onnx.NodeProto, int]]:
        if self.specs is None or not self.enabled:
            return []
        out = []
        for i, node in enumerate(model.graph.node):
            domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
            version = versions.get(domain)
            if version is None or host_only_reason(domain, node.op_type) or \
                    is_control(domain, node.op_type, version) or domain == "" and node.op_type in SEQUENCE_OPS:
                continue  # steps of the schedule of their own (control_flow.py, sequences.py)
            if self.specs.find(domain, node.op_type, version) is None:
                out.append((i, node, version))
        return out

    def call(self, model: onnx.ModelProto, values: Mapping[str, Any]) -> PassResult:
        report = ExpansionReport()
        calls: dict[int, tuple[onnx.NodeProto, onnx.FunctionProto]] = {}
        versions = {("" if o.domain in DEFAULT_DOMAINS else o.domain): o.version for o in model.opset_import}
        for i, node, version in self._candidates(model, versions):
            label = node.name or f"{node.op_type}_{i}"
            try:
                body = function_of(node, version, values)
            except Exception as e:  # noqa: BLE001 - onnx cannot build this node's body: it stays as written
                report.failed[label] = f"{type(e).__name__}: {e}"
                continue
            if body is None:
                continue
            missing = body_without_kernels(self.specs, body, versions)
            if missing:
                report.failed[label] = f"no GPU kernel for {', '.join(missing)} of its function body"
                continue
            body.name, body.domain = f"{node.op_type}_{i}", CALL_DOMAIN
            call = onnx.NodeProto()
            call.CopyFrom(node)
            call.op_type, call.domain = body.name, CALL_DOMAIN
            calls[i] = (call, body)
            report.expanded.append(Expanded(node.op_type, node.domain, label, len(body.node)))
        if not calls:
            return PassResult(model, False, report)
        staged = onnx.ModelProto()
        staged.CopyFrom(model)
        del staged.graph.node[:]
        staged.graph.node.extend(calls[i][0] if i in calls else n for i, n in enumerate(model.graph.node))
        staged.functions.extend(body for _, body in calls.values())
        imported = {("" if o.domain in DEFAULT_DOMAINS else o.domain) for o in staged.opset_import}
        for _, body in calls.values():
            for o in body.opset_import:
                d = "" if o.domain in DEFAULT_DOMAINS else o.domain
                if d not in imported:
                    staged.opset_import.append(helper.make_opsetid(o.domain, o.version))
                    imported.add(d)
        staged.opset_import.append(helper.make_opsetid(CALL_DOMAIN, 1))
        out = onnx.inliner.inline_selected_functions(staged, [(CALL_DOMAIN, b.name) for _, b in calls.values()])
        keep = [o for o in out.opset_import if o.domain != CALL_DOMAIN]
        del out.opset_import[:]
        out.opset_import.extend(keep)
        return PassResult(out, True, report)

    def ensures(self, model: onnx.ModelProto, result: PassResult) -> None:
        super().ensures(model, result)
        left = [n.op_type for n in result.model.graph.node if n.domain == CALL_DOMAIN]
        self._check([f"{op} was not inlined" for op in left], "ensures")

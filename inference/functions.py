"""Model-local functions (``ModelProto.functions``): each call is inferred by inlining.

A node whose ``(domain, op_type, overload)`` names a function of the model (and that no
rule or ONNX schema serves) is typed by walking the function's body in a scope of its own:

- the body sees the call's input types under the function's formal input names (an input
  the call leaves out is an absent optional input inside the body);
- body attributes that reference a function attribute (``ref_attr_name``) take the call's
  attribute, else the function's default (``attribute_proto``), else they are dropped;
- the body's nodes are selected by the function's own ``opset_import`` (domains it does not
  list fall back to the model's);
- the call's outputs get the types of the body's outputs.

Body values are not written back (a function has one body but a type per call). Problems
inside a body are reported with the call's label as prefix (``'call' (MyFn)/'add' (Add)``);
a function that calls itself is reported (``function-recursion``), not expanded forever.
"""

from __future__ import annotations

import onnx

from .context import TensorInfo
from .protocol import InferencePass
from .registry import NodeContext
from .scope import UNKNOWN, Graph, Scope, node_label

#: nested calls deeper than this are refused (a function calling itself through others)
MAX_DEPTH = 64


def index(model: onnx.ModelProto) -> dict[tuple[str, str, str], onnx.FunctionProto]:
    """The model's functions by (domain, name, overload), domain ``""`` for ai.onnx."""
    out = {}
    for f in model.functions:
        domain = "" if f.domain in ("", "ai.onnx") else f.domain
        out[(domain, f.name, f.overload)] = f
    return out


class Functions:
    """A model's local functions, for one pass: which one a node calls (``get``), and the
    calls being expanded (what ``function-recursion`` reports); false when there are none."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.by_name = index(model)
        self.get = self.by_name.get
        self.call_stack: list[tuple[str, str, str]] = []
        self._instances: dict[tuple, tuple] = {}  # (id(fn), call attributes, absent inputs) -> (fn, nodes)
        self._refs: dict[int, tuple] = {}  # id(fn) -> (fn, indices of nodes referencing its attributes)

    def __bool__(self) -> bool:
        return bool(self.by_name)

    def call(self, p: InferencePass, g: Graph, n: NodeContext, fn: onnx.FunctionProto) -> bool:
        """Type the outputs of call ``n`` by inferring ``fn``'s body; False if it cannot be expanded."""
        node = n.node
        ident = (fn.domain, fn.name, fn.overload)
        stack = self.call_stack
        if ident in stack or len(stack) >= MAX_DEPTH:
            p.raise_or_record(n.error(
                "function-recursion", f"function {fn.name!r} calls itself (directly or through others)",
                subject=f"function {fn.domain + '::' if fn.domain else ''}{fn.name}",
                expected="a finite expansion", found=" -> ".join(x[1] for x in stack + [ident])))
            return False
        if len(node.input) > len(fn.input):
            p.raise_or_record(n.error(
                "function-inputs", f"the call passes more inputs than function {fn.name!r} declares",
                subject="inputs", expected=f"at most {len(fn.input)}", found=len(node.input)))
        if len(node.output) > len(fn.output):
            p.raise_or_record(n.error(
                "function-outputs", f"the call asks for more outputs than function {fn.name!r} has",
                subject="outputs", expected=f"at most {len(fn.output)}", found=len(node.output)))
        opsets = dict(p.opsets)
        for o in fn.opset_import:
            opsets["" if o.domain in ("", "ai.onnx") else o.domain] = int(o.version)
        scope = Scope(opsets, p.strict, p.diagnostics, None)
        absent = set()
        for i, formal in enumerate(fn.input):
            actual = node.input[i] if i < len(node.input) else ""
            if not actual:
                absent.add(formal)
                continue
            scope.define(formal, n.ctx.get(actual) or UNKNOWN)
            other = n.ctx.other_type(actual)
            if other is not None:
                scope.other[formal] = other
        label = node_label(node, n.index)
        body = Graph(fn, scope, p.dispatch_table(opsets), prefix=f"{g.prefix}{label}/",
                     where=f"{g.where}/{label}" if g.where else label, nodes=self.instantiate(fn, node, absent))
        stack.append(ident)
        try:
            p.walk(body)
        finally:
            stack.pop()
        for i, actual in enumerate(node.output):
            if not actual or i >= len(fn.output):
                continue
            formal = fn.output[i]
            other = scope.other_type(formal)
            if other is not None:
                inner = scope.get(formal)
                n.ctx.define_other(actual, other, getattr(inner, "items", None))
            else:
                n.ctx.set(actual, scope.get(formal) or UNKNOWN)
        return True

    def instantiate(self, fn: onnx.FunctionProto, call_node: onnx.NodeProto, absent: set[str]) -> list[onnx.NodeProto]:
        """The body's nodes for this call: attribute references resolved, absent inputs emptied.

        Nodes that need neither are the function's own protos; the rest are copies, cached per
        (function, call attributes, absent inputs)."""
        refs = self._node_refs(fn)
        if not refs and not absent:
            return list(fn.node)
        cache = self._instances
        key = (id(fn), tuple(a.SerializeToString() for a in call_node.attribute), frozenset(absent))
        hit = cache.get(key)
        if hit is not None:
            return hit[1]
        given = {a.name: a for a in call_node.attribute}
        defaults = {a.name: a for a in fn.attribute_proto}
        nodes = []
        for i, node in enumerate(fn.node):
            uses_absent = bool(absent) and any(x in absent for x in node.input)
            if i not in refs and not uses_absent:
                nodes.append(node)
                continue
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            if uses_absent:
                for j, x in enumerate(copy.input):
                    if x in absent:
                        copy.input[j] = ""
            if i in refs:
                kept = []
                for a in copy.attribute:
                    if not a.ref_attr_name:
                        kept.append(a)
                        continue
                    src = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                    if src is None:
                        continue  # not given and no default: the attribute is absent
                    resolved = onnx.AttributeProto()
                    resolved.CopyFrom(src)
                    resolved.name = a.name
                    kept.append(resolved)
                resolved_attrs = [onnx.AttributeProto() for _ in kept]
                for dst, src in zip(resolved_attrs, kept):
                    dst.CopyFrom(src)
                del copy.attribute[:]
                copy.attribute.extend(resolved_attrs)
            nodes.append(copy)
        cache[key] = (fn, nodes)
        return nodes

    def _node_refs(self, fn: onnx.FunctionProto) -> set[int]:
        """Indices of body nodes with an attribute referencing a function attribute."""
        cache = self._refs
        hit = cache.get(id(fn))
        if hit is None:
            hit = cache[id(fn)] = (fn, {i for i, node in enumerate(fn.node)
                                        if any(a.ref_attr_name for a in node.attribute)})
        return hit[1]

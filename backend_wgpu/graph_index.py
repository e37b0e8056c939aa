"""The graph index the rewrite passes share, and the small graph facts every phase asks.

:class:`GraphIndex` answers what a pass asks of a model's top-level graph: its nodes, each value's
producer and consumers (``edges``: (node, input slot), slot -1 for a read by a subgraph), its
constant initializers (those no feed overrides) and Constant nodes, its graph outputs and the
default domain's opset. BatchNormalization folding (bn_folding.py), the QDQ, dynamic and
elementwise fusions (qdq_fusion.py, dynamic_fusion.py, elementwise_fusion.py) each index the model
they are given with it. Pure: ModelProto in, plain data out.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .verdict import DEFAULT_DOMAINS


def concrete(shape: Any) -> tuple[int, ...] | None:
    """``shape`` as a tuple of ints, or None when a dim is not a known int (or the shape unknown)."""
    if shape is None or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        return None
    return tuple(int(d) for d in shape)


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as onnx.helper.get_attribute_value gives them, bytes decoded."""
    out: dict[str, Any] = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif isinstance(v, list):
            v = [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in v]
        out[a.name] = v
    return out


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Outer-scope names the node's subgraphs (If/Loop/Scan bodies) read."""
    names: set[str] = set()
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            names.update(free_names(a.g))
        elif a.type == onnx.AttributeProto.GRAPHS:
            for g in a.graphs:
                names.update(free_names(g))
    return names


def with_nested(nodes: Sequence[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The nodes and those of their subgraphs, at any depth."""
    out, todo = [], list(nodes)
    while todo:
        n = todo.pop()
        out.append(n)
        for a in n.attribute:
            todo += list(a.g.node) + [m for g in a.graphs for m in g.node]
    return out


def free_names(graph: onnx.GraphProto) -> list[str]:
    """Outer-scope names a (sub)graph reads, in first-use order: its nodes' inputs, its nested
    bodies' reads, and outputs it passes through from outside."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    defined |= {s.values.name for s in graph.sparse_initializer}
    free: dict[str, None] = {}
    for n in graph.node:
        for x in list(n.input) + sorted(subgraph_reads(n)):
            if x and x not in defined:
                free[x] = None
        defined |= {o for o in n.output if o}
    for o in graph.output:
        if o.name not in defined:
            free[o.name] = None
    return list(free)


def since_version(node: onnx.NodeProto, opset: int) -> int:
    """The since-version of the node's schema at ``opset`` (``opset`` itself for an op onnx lacks)."""
    try:
        return onnx.defs.get_schema(node.op_type, opset, node.domain or "").since_version
    except Exception:
        return opset


class GraphIndex:
    """A model's top-level graph, indexed once: ``nodes`` (graph order), ``producer`` (value ->
    node index), ``edges`` (value -> [(consumer node index, input slot)], slot -1: a subgraph
    reads it), ``initializers`` (name -> TensorProto of the initializers no graph input
    overrides), ``outputs`` (graph output names), ``opset`` (the default domain's version) and
    ``elem_of`` (a value's static TensorProto element type, 0 when unknown)."""

    def __init__(self, model: onnx.ModelProto, elem_of: Callable[[str], int] | None = None) -> None:
        g = model.graph
        self.nodes = list(g.node)
        self.elem_of = elem_of or (lambda name: 0)
        self.outputs = {o.name for o in g.output}
        self.opset = next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), 0)
        self.producer: dict[str, int] = {}
        self.edges: dict[str, list[tuple[int, int]]] = {}
        # an initializer that is also a graph input can be overridden by a feed: not a constant
        # (onnxruntime's GetConstantInitializer skips overridable initializers the same way)
        fed = {i.name for i in g.input}
        self.initializers: dict[str, onnx.TensorProto] = {t.name: t for t in g.initializer if t.name not in fed}
        self._const: dict[str, Any] = dict(self.initializers)
        for i, n in enumerate(self.nodes):
            for s, name in enumerate(n.input):
                if name:
                    self.edges.setdefault(name, []).append((i, s))
            for name in subgraph_reads(n):
                self.edges.setdefault(name, []).append((i, -1))
            for o in n.output:
                if o:
                    self.producer[o] = i
            if n.op_type == "Constant" and n.domain in DEFAULT_DOMAINS and n.output:
                self._const[n.output[0]] = n
        self._arrays: dict[str, np.ndarray | None] = {}

    def label(self, i: int) -> str:
        n = self.nodes[i]
        return n.name or f"{n.op_type}_{i}"

    def readers(self, name: str) -> int:
        """How many node inputs (and subgraphs, once per node) read ``name``."""
        return len(self.edges.get(name, ()))

    def out_edges(self, i: int) -> list[tuple[int, int]]:
        return [e for o in self.nodes[i].output if o for e in self.edges.get(o, [])]

    def makes_graph_output(self, i: int) -> bool:
        return any(o in self.outputs for o in self.nodes[i].output if o)

    def computed_from_constants(self) -> set[str]:
        """Values the graph computes from constants alone: initializers no feed overrides,
        Constants, and the outputs of nodes (without subgraphs) that read only those."""
        constant = set(self._const)
        for n in self.nodes:
            if all(x in constant for x in n.input if x) and not any(
                    a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute):
                constant.update(o for o in n.output if o)
        return constant

    def constant(self, name: str) -> np.ndarray | None:
        """The value of an initializer or a Constant (as onnxruntime's GetConstantInitializer)."""
        if not name:
            return None
        if name not in self._arrays:
            src = self._const.get(name)
            arr = None
            if isinstance(src, onnx.TensorProto):
                arr = numpy_helper.to_array(src)
            elif src is not None:
                a = next((a for a in src.attribute if a.name == "value"), None)
                if a is not None:
                    arr = numpy_helper.to_array(a.t)
            self._arrays[name] = arr
        return self._arrays[name]

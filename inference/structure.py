"""Structural faults: what makes a graph impossible to run whatever its types, shared by
``check`` (reported) and ``Session`` (refused before anything else is done, same rule ids).

The pass reports ``graph-order`` (a cycle, or a value read before it is produced),
``single-assignment`` (a value assigned twice), ``graph-output`` (an output nothing produces)
and ``function-recursion``; ``graph-depth`` is checked here, before any walk, so that nested
``If``/``Loop``/``Scan`` bodies can never exhaust Python's recursion limit (or protobuf's:
it parses at most 100 levels of messages, three per level of subgraph nesting).
"""

from __future__ import annotations

from typing import Iterable

import onnx

from onnx_quant.errors import InferenceError

from .diagnostics import MODEL_NODE

STRUCTURAL_RULES = frozenset({"graph-order", "single-assignment", "graph-output", "function-recursion",
                              "graph-depth"})

#: the deepest subgraph nesting accepted (real models nest a few levels)
MAX_SUBGRAPH_DEPTH = 32
_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS


def check_depth(graph: onnx.GraphProto, functions: Iterable[onnx.FunctionProto] = ()) -> None:
    """``InferenceError`` (rule ``graph-depth``, naming the outermost node of the chain) when
    subgraphs nest deeper than ``MAX_SUBGRAPH_DEPTH``; iterative, so any depth is safe."""
    # only nodes with a graph attribute matter; reading each node's attributes once, without
    # building a list per attribute, keeps this check a small part of a pass over a flat graph
    stack = [(n, 1, n) for nodes in (graph.node, *(f.node for f in functions)) for n in nodes if n.attribute]
    while stack:
        node, depth, top = stack.pop()
        for a in node.attribute:
            t = a.type
            if t == _GRAPH:
                bodies = (a.g,)
            elif t == _GRAPHS:
                bodies = a.graphs
            else:
                continue
            for body in bodies:
                if depth > MAX_SUBGRAPH_DEPTH:
                    raise InferenceError(
                        "graph-depth", f"{top.name or top.op_type!r} ({top.op_type})",
                        "subgraphs nest too deep", expected=f"at most {MAX_SUBGRAPH_DEPTH} levels",
                        found=f"more than {MAX_SUBGRAPH_DEPTH}")
                stack.extend((n, depth + 1, top) for n in body.node if n.attribute)


def first_structural_error(errors: Iterable[InferenceError]) -> InferenceError | None:
    """The first error of a lenient pass that makes the graph unrunnable, else None."""
    return next((e for e in errors if e.rule in STRUCTURAL_RULES), None)


__all__ = ["MAX_SUBGRAPH_DEPTH", "MODEL_NODE", "STRUCTURAL_RULES", "check_depth", "first_structural_error"]

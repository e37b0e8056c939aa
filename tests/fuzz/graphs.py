"""The hypothesis strategy of whole fuzz graphs: chains and DAGs of 1-30 nodes.

An opset is drawn, then a batch size (the symbol ``N`` of the inputs that have it), then ops by
weight (ops_float.FLOAT_OPS, ops_quant.QUANT_OPS) until the graph has its drawn node count; each
op reads values made before it, so the graph is a DAG in topological order. The graph outputs are
the values no node reads, and some intermediates besides.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from hypothesis import strategies as st

from .builder import Builder
from .ops_float import FLOAT_OPS
from .ops_quant import QUANT_OPS

OPSETS = (13, 15, 17, 18, 19, 20, 21)
GENERATORS = {**FLOAT_OPS, **QUANT_OPS}
WEIGHTED = [name for name, (_, weight) in sorted(GENERATORS.items()) for _ in range(weight)]


@dataclass
class FuzzCase:
    model: onnx.ModelProto
    generators: list[str]


@st.composite
def fuzz_graphs(draw, max_nodes: int = 30, generators: tuple[str, ...] | None = None) -> FuzzCase:
    b = Builder(opset=draw(st.sampled_from(OPSETS)), batch=draw(st.integers(1, 3)), symbolic=draw(st.booleans()))
    names = [n for n in WEIGHTED if generators is None or n in generators]
    # mostly short chains (each new kernel configuration compiles a pipeline), some up to max_nodes
    target = draw(st.one_of(st.integers(1, min(8, max_nodes)), st.integers(1, min(8, max_nodes)),
                            st.integers(1, max_nodes)))
    used: list[str] = []
    for _ in range(4 * target):
        if len(b.nodes) >= target:
            break
        name = draw(st.sampled_from(names))
        if GENERATORS[name][0](draw, b):
            used.append(name)
    read = {i for n in b.nodes for i in n.input}
    inputs = {v.name for v in b.inputs}
    made = [v for v in b.values if v.name not in inputs]
    outputs = [v for v in made if v.name not in read or draw(st.integers(0, 4)) == 0]
    if not outputs:
        b.add("Identity", [b.values[-1]], [(b.values[-1].dtype, b.values[-1].shape)])
        outputs = [b.values[-1]]
    return FuzzCase(b.model(draw(st.integers(0, 2**32 - 1)), outputs), used)

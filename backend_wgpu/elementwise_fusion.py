"""Elementwise fusion: chains and small trees of float32 elementwise nodes become one node,
``ai.onnx_quant::FusedElementwise``, run by one generated kernel (fused_elementwise.kernel.json,
fused-elementwise.wgsl.jinja) instead of one dispatch and one intermediate buffer per node; a
group that reads only the output of a float32 Conv, MatMul or Gemm becomes that kernel's
epilogue instead (``ai.onnx_quant::FusedConv`` / ``FusedMatMul`` / ``FusedGemm``: the producer's
inputs and attributes, the steps applied to each output before it is stored).

A node joins its consumer's group when both are elementwise table ops (templates/elementwise.ops.json,
one or two operands, one WGSL expression) computed in float32 and not from constants alone
(those run once per plan), its output feeds that group only (no other node, no subgraph, not a
graph output), and the group then reads at most :data:`MAX_INPUTS` values from outside and has
at most :data:`MAX_STEPS` steps. The fused node's ``steps`` (``activation``) attribute lists the
group's nodes in graph order, each with the table's float32 expression, its numeric attributes
and its operands (``x<i>``: the fused node's inputs, or the producer's output, ``t<j>``: step
j's result); the kernel evaluates the steps per output element, each operand broadcast from the
output's index (numpy broadcasting composes, so this is the value the unfused graph computes).

Numerics: every step rounds to float32 as the unfused kernels do when they store it; the shader
compiler may contract a multiply and an add of two steps into one fused multiply-add, so a fused
chain can differ from the unfused one in the last bit of such a step (the tests bound it).
The group as written (with its producer) stays beside the fused node
(:class:`~qdq_fusion.FusedUnit`): a node the kernel declines runs as written on the host.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import onnx
from onnx import helper

from .graph_index import GraphIndex, attributes, since_version
from .passes import PassResult, RewritePass, elem_lookup, kernel_check, unit_faults
from .qdq_fusion import FusedUnit, FusionResult
from .verdict import DEFAULT_DOMAINS

DOMAIN = "ai.onnx_quant"
OP_TYPE = "FusedElementwise"
#: inputs of one fused node (the output is the ninth storage buffer of the nary base's variants)
MAX_INPUTS = 8
#: steps of one fused node: a bound on the shader's size (a long chain becomes several nodes)
MAX_STEPS = 32
SHADER = "elementwise-expr.wgsl.jinja"
#: producers a group reading only their output joins as an epilogue (fused_conv/matmul/gemm.kernel.json)
EPILOGUE_OPS = {"Conv": "FusedConv", "MatMul": "FusedMatMul", "Gemm": "FusedGemm"}


def _wgsl_constant(name: str, value) -> tuple[str, str, str] | None:
    """(name, WGSL type, literal) of a numeric attribute, as elementwise-expr declares them."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return name, "i32", str(value)
    if value != value or abs(value) > 3.4e38:
        return None
    return name, "f32", f"f32({float(value)!r})"


def _step_expression(spec, node: onnx.NodeProto) -> tuple[str, list] | None:
    """(float32 expression, constants) of a table op node, or None when it is not fusible."""
    if spec is None or any(p.shader != SHADER for v in spec.variants for p in v.passes):
        return None
    derive = spec.derive.as_dict()
    operands = len([x for x in node.input if x])
    if "exprs" not in derive or "final" in derive or operands > 2:
        return None
    if "fold" in derive and operands != 2:
        return None  # an n-ary op (Max, Sum, ...) joins with two inputs: its expression combines two
    if json.loads(getattr(derive.get("enums"), "text", "[]") or "[]"):
        return None  # a string attribute (an enumeration)
    exprs = json.loads(derive["exprs"].text)
    keys = dict(zip(exprs[0::2], exprs[1::2]))
    wanted = [",".join(["f32"] * operands), "f32", "*"]
    expr = next((keys[k] for k in wanted if k in keys), None)
    if expr is None:
        return None
    given = attributes(node)
    consts = []
    for name, decl in spec.attributes.items():
        c = _wgsl_constant(name, given.get(name, decl.default))
        if c is None:
            return None
        consts.append(list(c))
    return expr, consts


def fuse_elementwise(model: onnx.ModelProto, *, elem_of: Callable[[str], int],
                     spec_of: Callable[[onnx.NodeProto, int], object],
                     supported: Callable[[onnx.NodeProto, str, int], str] | None = None) -> FusionResult:
    """The model with its float32 elementwise groups fused (a new ModelProto; ``model`` is not
    changed). ``spec_of(node, version)``: the kernel spec that runs the node, or None;
    ``supported(node, domain, version)``: why no kernel takes the fused node ('' if one does)."""
    G = GraphIndex(model, elem_of)
    result = FusionResult(model)
    f32 = onnx.TensorProto.FLOAT
    step: dict[int, tuple[str, list]] = {}
    constant = G.computed_from_constants()
    for i, n in enumerate(G.nodes):
        if n.domain not in DEFAULT_DOMAINS or len(n.output) != 1:
            continue
        if n.output[0] in constant:
            continue  # computed from constants only: once per plan (the prologue), not in a per-run group
        if not all(x and elem_of(x) == f32 for x in [*n.input, n.output[0]]):
            continue
        s = _step_expression(spec_of(n, since_version(n, G.opset)), n)
        if s is not None:
            step[i] = s
    group_of: dict[int, list[int]] = {}
    for i in sorted(step):
        members = [i]
        grew = True
        while grew:  # a value read twice in the group (x -> Sigmoid -> Mul(x, .)) joins once both readers did
            grew = False
            for x in dict.fromkeys(x for m in members for x in G.nodes[m].input):
                p = G.producer.get(x)
                if p is None or p not in group_of or p in members or x in G.outputs:
                    continue
                if not all(c in members for c, _ in G.edges.get(x, [])):
                    continue  # read outside the group (a slot of -1: by a subgraph)
                merged = sorted(set(members) | set(group_of[p]))
                if len(merged) <= MAX_STEPS and len(_reads(G, merged)) <= MAX_INPUTS:
                    members, grew = merged, True
        for m in members:
            group_of[m] = members
    fused: dict[int, tuple[FusedUnit, list[int]]] = {}  # last member -> (unit, the nodes it replaces)
    for g in sorted({tuple(g) for g in group_of.values()}):
        g = list(g)
        producer = _epilogue_of(G, g, constant, spec_of)
        if producer is not None:
            node, rule, members = _fused_producer(G, producer, g, step), "epilogue", [producer, *g]
        elif len(g) > 1:
            node, rule, members = _fused_node(G, g, step), "elementwise", g
        else:
            continue
        why = supported(node, DOMAIN, 1) if supported is not None else ""
        if why:
            result.declined.append((G.label(g[-1]), node.op_type, why))
            continue
        fused[g[-1]] = (FusedUnit(rule, node, tuple(G.nodes[m] for m in members), G.label(g[-1])), members)
    if not fused:
        return result
    removed = {m for _, members in fused.values() for m in members}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(fused[i][0].node if i in fused else n for i, n in enumerate(G.nodes)
                          if i in fused or i not in removed)
    if not any(o.domain == DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    alive = {x for n in out.graph.node for x in [*n.input, *n.output]}
    infos = [v for v in out.graph.value_info if v.name in alive]
    del out.graph.value_info[:]
    out.graph.value_info.extend(infos)
    result.model = out
    result.units = [fused[i][0] for i in sorted(fused)]
    return result


def _epilogue_of(G: GraphIndex, group: list[int], constant: set[str], spec_of) -> int | None:
    """The float32 Conv / MatMul / Gemm whose output is all ``group`` reads and only ``group``
    reads: the group can run as that kernel's epilogue."""
    reads = _reads(G, group)
    p = G.producer.get(reads[0]) if len(reads) == 1 else None
    if p is None or reads[0] in G.outputs or reads[0] in constant:
        return None
    node = G.nodes[p]
    if node.domain not in DEFAULT_DOMAINS or node.op_type not in EPILOGUE_OPS or len(node.output) != 1:
        return None
    if G.elem_of(reads[0]) != onnx.TensorProto.FLOAT or not all(c in group for c, _ in G.edges.get(reads[0], [])):
        return None
    return p if spec_of(node, since_version(node, G.opset)) is not None else None


def _fused_producer(G: GraphIndex, p: int, group: list[int], step: dict[int, tuple[str, list]]) -> onnx.NodeProto:
    """Fused<Op>: the producer's inputs and attributes, the group's steps as ``activation``."""
    node = G.nodes[p]
    steps = _steps(G, group, step, {node.output[0]: "x0"})
    fused = helper.make_node(EPILOGUE_OPS[node.op_type], list(node.input), [G.nodes[group[-1]].output[0]],
                             name="+".join(G.label(m) for m in [p, *group]), domain=DOMAIN,
                             activation=json.dumps(steps, separators=(",", ":")))
    fused.attribute.extend(a for a in node.attribute if a.name != "activation")
    return fused


def _reads(G: GraphIndex, members: list[int]) -> list[str]:
    made = {G.nodes[m].output[0] for m in members}
    return list(dict.fromkeys(x for m in members for x in G.nodes[m].input if x not in made))


def _steps(G: GraphIndex, members: list[int], step: dict[int, tuple[str, list]], ref: dict[str, str]) -> list[dict]:
    """The members as steps over the references in ``ref`` (inputs) and earlier steps."""
    ref = dict(ref)
    steps = []
    for j, m in enumerate(members):
        n = G.nodes[m]
        expr, consts = step[m]
        steps.append({"op": n.op_type, "args": [ref[x] for x in n.input], "expr": expr, "consts": consts})
        ref[n.output[0]] = f"t{j}"
    return steps


def _fused_node(G: GraphIndex, members: list[int], step: dict[int, tuple[str, list]]) -> onnx.NodeProto:
    inputs = _reads(G, members)
    steps = _steps(G, members, step, {x: f"x{k}" for k, x in enumerate(inputs)})
    name = "+".join(G.label(m) for m in members)
    return helper.make_node(OP_TYPE, inputs, [G.nodes[members[-1]].output[0]], name=name, domain=DOMAIN,
                            steps=json.dumps(steps, separators=(",", ":")))


class ElementwiseFusion(RewritePass):
    """The elementwise fusion as a pass, the kernel specs of ``specs`` deciding which nodes are
    table ops and which fused nodes a kernel takes (``enabled=False``: the model unchanged); its
    report is the :class:`~qdq_fusion.FusionResult`. Ensures: every fused node is in the model, no
    node of its group makes a value there any more, and a group reads at most MAX_INPUTS values
    in at most MAX_STEPS steps."""

    name = "fuse_elementwise"

    def __init__(self, specs: Any, enabled: bool = True) -> None:
        self.specs, self.enabled = specs, enabled

    def call(self, model: onnx.ModelProto, values) -> PassResult:
        if not self.enabled:
            return PassResult(model, False, FusionResult(model))
        result = fuse_elementwise(model, elem_of=elem_lookup(values), supported=kernel_check(self.specs, values),
                                  spec_of=lambda node, version: self.specs.find("", node.op_type, version))
        return PassResult(result.model, bool(result.units), result)

    def ensures(self, model: onnx.ModelProto, result: PassResult) -> None:
        super().ensures(model, result)
        faults = unit_faults(result.model, result.report.units)
        for u in result.report.units:
            steps = json.loads(attributes(u.node).get("steps") or attributes(u.node).get("activation") or "[]")
            if u.rule == "elementwise" and len(u.node.input) > MAX_INPUTS:
                faults.append(f"{u.node.name!r} reads {len(u.node.input)} values, more than {MAX_INPUTS}")
            if len(steps) > MAX_STEPS:
                faults.append(f"{u.node.name!r} has {len(steps)} steps, more than {MAX_STEPS}")
        self._check(faults, "ensures")

"""Dynamic-quantization unit fusion: a graph-compiler phase beside qdq_fusion.py (``Session`` runs
it after the QDQ phase unless ``fuse_dynamic=False``).

``quantize_dynamic`` writes each layer as::

    DynamicQuantizeLinear(x) -> (x_q, x_scale, x_zp)
    MatMulInteger / ConvInteger(x_q, W_q, x_zp, W_zp) -> Cast(to=float) -> Mul(., Mul(x_scale, W_scale))
    [-> Add(., bias)] [-> Relu]

onnxruntime (ORT_ENABLE_EXTENDED) rewrites the MatMulInteger form in two steps
(onnxruntime/core/optimizer/matmul_integer_to_float.cc, dynamic_quantize_matmul_fusion.cc):
MatMulInteger + Cast + the two Muls [+ Add of a constant bias whose dims before the last are 1
and whose last dim is > 1] become com.microsoft MatMulIntegerToFloat(A, B, a_scale, b_scale,
a_zp, b_zp[, bias]) when the Cast, the MatMulInteger and the scale Mul each have one consumer
and none makes a graph output; then a DynamicQuantizeLinear whose three outputs go only to that
node (three edges) is folded in: com.microsoft DynamicQuantizeMatMul(x, B, b_scale, b_zp[, bias])
with B, b_scale, b_zp and bias constant. This phase makes the same replacements, and goes
further where the project has a kernel onnxruntime lacks:

=============================================  ==============================================
unit                                           becomes
=============================================  ==============================================
DQL -> MatMulInteger -> Cast -> Mul [-> Add]   com.microsoft DynamicQuantizeMatMul
MatMulInteger -> Cast -> Mul [-> Add]          com.microsoft MatMulIntegerToFloat (the DQL
(A not from a DQL of its own)                  stays: shared by other consumers)
... -> Relu (either form)                      ai.onnx_quant DynamicQuantizeMatMul /
                                               MatMulIntegerToFloat, ``activation="Relu"``
DQL -> ConvInteger -> Cast -> Mul [-> Add]     ai.onnx_quant DynamicQuantizeConv (Conv's
[-> Relu]                                      attributes, ``activation``); scale and bias
                                               on the channel axis ([1, M, 1, 1], [M, 1, 1])
ConvInteger -> Cast -> Mul [-> Add] [-> Relu]  ai.onnx_quant ConvIntegerToFloat (the DQL
(x not from a DQL of its own)                  stays)
=============================================  ==============================================

Conditions (each decline is recorded with its reason, :attr:`FusionResult.declined`): the
Cast is to float32; every inner value (the integer product, the cast, the scale product, the
scaled product, the biased sum) has one consumer and is no graph output; the scale product is
a Mul of a per-tensor activation scale (the DQL's scale, or a scalar constant) and a constant
weight scale that is per-tensor or has one value per output column (1-D [N]) / channel (on
the channel axis: a 1-D [M] would broadcast over the width); the bias is constant with one
value per column / channel (and more than one column, as onnxruntime); B / w and its zero point are constant in the
DynamicQuantize forms (onnxruntime's check). Arithmetic is the unfused graph's: y = f32(acc) * (a_scale *
b_scale[col]) (+ bias[col]) (then max(., 0)), each operation rounded once, in that order.

The unit's original nodes are kept (:attr:`FusedUnit.nodes`): a fused node a kernel declines
is evaluated on the host as the unit it replaced.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from .elementwise_fusion import DOMAIN as INTERNAL_DOMAIN  # the project's fused ops
from .graph_index import GraphIndex, subgraph_reads
from .passes import PassResult, RewritePass, elem_lookup, kernel_check, unit_faults
from .qdq_fusion import MS_DOMAIN, Decline, FusedUnit, FusionResult
from .verdict import DEFAULT_DOMAINS

TARGETS = ("MatMulInteger", "ConvInteger")


def _op(node: onnx.NodeProto, op: str) -> bool:
    return node.op_type == op and node.domain in DEFAULT_DOMAINS


def _attr(node: onnx.NodeProto, name: str, default=None):
    a = next((a for a in node.attribute if a.name == name), None)
    return default if a is None else helper.get_attribute_value(a)


def _is_dql_scale(G: GraphIndex, name: str) -> bool:
    p = G.producer.get(name)
    return p is not None and _op(G.nodes[p], "DynamicQuantizeLinear") and list(G.nodes[p].output)[1:2] == [name]


def _sole_consumer_or_none(G: GraphIndex, i: int) -> tuple[int, int] | None:
    """The single (consumer, slot) of node i's first output, None when it has others (a subgraph
    read counts) or is a graph output (onnxruntime's CheckOutputEdges(.., 1))."""
    out = G.nodes[i].output[0]
    edges = G.edges.get(out, [])
    if out in G.outputs or len(edges) != 1 or edges[0][1] < 0:
        return None
    return edges[0]


def _only_consumer(G: GraphIndex, i: int, what: str) -> tuple[int, int]:
    edge = _sole_consumer_or_none(G, i)
    if edge is None:
        raise Decline(f"{what} ({G.nodes[i].output[0]!r}) has other consumers or is a graph output")
    return edge


def _constant(G: GraphIndex, name: str) -> np.ndarray | None:
    """An initializer / Constant, or a Reshape of constants (quantize_dynamic reshapes a conv
    bias to [1, M, 1, 1] with a Reshape node)."""
    v = G.constant(name)
    if v is not None or not name:
        return v
    p = G.producer.get(name)
    if p is not None and _op(G.nodes[p], "Reshape") and len(G.nodes[p].input) >= 2:
        data, shape = (G.constant(x) for x in G.nodes[p].input[:2])
        if data is not None and shape is not None and 0 not in shape.tolist():
            try:
                return data.reshape(shape.astype(np.int64).tolist())
            except ValueError:
                return None
    return None


def _per_output(v: np.ndarray, n: int, conv: bool, nsp: int, per_tensor: bool) -> bool:
    """Whether v, broadcast against the unit's output, holds one value per output column (matmul:
    shape [n]) / channel (conv with nsp spatial axes: n on the channel axis, e.g. [1, n, 1, 1] or
    [n, 1, 1]), or (per_tensor) one value, without changing the output's shape."""
    s = list(v.shape)
    if conv:
        if len(s) > nsp + 2:
            return False
        if per_tensor and all(d == 1 for d in s):
            return True
        c = len(s) - nsp - 1
        return c >= 0 and s[c] == n and all(d == 1 for i, d in enumerate(s) if i != c)
    return s == [n] or (per_tensor and s in ([], [1]))


def _select(G: GraphIndex, i: int) -> tuple[onnx.NodeProto, list[int], str]:
    """The fused node for the unit rooted at integer node i, its member node indices (graph
    order) and the rule; Decline with the reason where a condition fails."""
    target = G.nodes[i]
    conv = target.op_type == "ConvInteger"
    if len(target.input) < 2 or not target.input[0] or not target.input[1]:
        raise Decline("A and B are required")
    a_name, b_name = target.input[0], target.input[1]
    a_zp = target.input[2] if len(target.input) > 2 else ""
    b_zp = target.input[3] if len(target.input) > 3 else ""
    members = [i]
    c, _ = _only_consumer(G, i, "the integer product")
    cast = G.nodes[c]
    if not _op(cast, "Cast") or _attr(cast, "to") != TensorProto.FLOAT:
        raise Decline("the integer product does not go to a Cast to float32")
    members.append(c)
    m, slot = _only_consumer(G, c, "the Cast")
    mul = G.nodes[m]
    if not _op(mul, "Mul") or len(mul.input) != 2:
        raise Decline("the Cast does not go to a Mul")
    members.append(m)
    sp = G.producer.get(mul.input[1 - slot])
    if sp is None or not _op(G.nodes[sp], "Mul") or len(G.nodes[sp].input) != 2:
        raise Decline("the Cast's Mul does not multiply by a Mul of two scales")
    _only_consumer(G, sp, "the scale product")
    members.append(sp)
    s0, s1 = G.nodes[sp].input
    # the unit's output channels: B's last dim / w's first
    B = G.constant(b_name)
    n_out = (B.shape[0] if conv else B.shape[-1]) if B is not None and B.ndim >= 1 else None
    nsp = B.ndim - 2 if B is not None else 0
    # the DynamicQuantizeLinear form: A, its scale and zero point all from one DQL used only here
    d = G.producer.get(a_name)
    dql = None
    if d is not None and _op(G.nodes[d], "DynamicQuantizeLinear"):
        outs = list(G.nodes[d].output) + ["", "", ""]
        if a_zp == outs[2] and outs[1] in (s0, s1):
            edges = [e for o in outs[:3] if o for e in G.edges.get(o, [])]
            mine = {(i, 0), (i, 2), (sp, 0 if s0 == outs[1] else 1)}
            if set(edges) == mine and len(edges) == 3 and not any(o in G.outputs for o in outs[:3] if o):
                dql = d
    if dql is not None:
        a_scale, b_scale = (s0, s1) if s0 == G.nodes[dql].output[1] else (s1, s0)
    else:
        pairs = ((s0, s1), (s1, s0))
        pick = next(((a, b) for a, b in pairs if _is_dql_scale(G, a) and G.constant(b) is not None), None)
        if pick is None:  # a constant per-tensor A scale (both constant: the order as written)
            pick = next(((a, b) for a, b in pairs if G.constant(b) is not None
                         and G.constant(a) is not None and G.constant(a).size == 1), None)
        if pick is None:
            raise Decline("the scale product is not a per-tensor A scale times a constant weight scale")
        a_scale, b_scale = pick
    bs = G.constant(b_scale)
    if bs is None:
        raise Decline("the weight scale is not constant")
    if n_out is None:
        if dql is not None or conv:
            raise Decline("the weights are not constant")
        if bs.ndim > 1:
            raise Decline(f"the weight scale's shape {list(bs.shape)} is not 1-D (B's columns unknown)")
    elif not _per_output(bs, n_out, conv, nsp, per_tensor=True):
        raise Decline(f"the weight scale's shape {list(bs.shape)} is neither per-tensor nor per-output ({n_out})")
    if dql is not None and b_zp and G.constant(b_zp) is None:
        raise Decline("the weight zero point is not constant")
    # bias and activation
    last = m
    bias = ""
    nxt = _sole_consumer_or_none(G, m)
    if nxt is not None and _op(G.nodes[nxt[0]], "Add") and len(G.nodes[nxt[0]].input) == 2:
        other = G.nodes[nxt[0]].input[1 - nxt[1]]
        bv = _constant(G, other)
        if bv is not None and n_out is not None and n_out > 1 and _per_output(bv, n_out, conv, nsp, per_tensor=False) \
                and bv.dtype == np.float32:
            bias, last = other, nxt[0]
            members.append(last)
    activation = ""
    nxt = _sole_consumer_or_none(G, last)
    if nxt is not None and _op(G.nodes[nxt[0]], "Relu"):
        activation, last = "Relu", nxt[0]
        members.append(last)
    out = G.nodes[last].output[0]
    name = target.name or out
    if conv:
        if dql is not None:
            op, ins, rule = "DynamicQuantizeConv", [G.nodes[dql].input[0], b_name, b_scale, b_zp, bias], "dynamic_conv"
            members.append(dql)
        else:
            op, ins, rule = "ConvIntegerToFloat", [a_name, b_name, a_scale, b_scale, a_zp, b_zp, bias], "conv_integer_to_float"
        node = helper.make_node(op, _trim(ins), [out], name=name, domain=INTERNAL_DOMAIN)
        node.attribute.extend(a for a in target.attribute)
        node.attribute.append(helper.make_attribute("activation", activation))
        return node, sorted(members), rule
    if dql is not None:
        op, ins, rule = "DynamicQuantizeMatMul", [G.nodes[dql].input[0], b_name, b_scale, b_zp, bias], "dynamic_matmul"
        members.append(dql)
    else:
        op, ins, rule = "MatMulIntegerToFloat", [a_name, b_name, a_scale, b_scale, a_zp, b_zp, bias], "integer_to_float"
    node = helper.make_node(op, _trim(ins), [out], name=name, domain=INTERNAL_DOMAIN if activation else MS_DOMAIN)
    if activation:
        node.attribute.append(helper.make_attribute("activation", activation))
    return node, sorted(members), rule


def _trim(ins: list[str]) -> list[str]:
    while ins and not ins[-1]:
        ins.pop()
    return ins


def fuse_dynamic(model: onnx.ModelProto, *, elem_of: Callable[[str], int] | None = None,
                 supported: Callable[[onnx.NodeProto, str, int], str] | None = None) -> FusionResult:
    """The model with its dynamic-quantization units replaced (a new ModelProto; ``model`` is
    not changed). ``elem_of`` / ``supported`` as in :func:`qdq_fusion.fuse_qdq`."""
    G = GraphIndex(model, elem_of)
    result = FusionResult(model)
    taken: set[int] = set()
    chosen: list[tuple[onnx.NodeProto, list[int], str, int]] = []
    for i, node in enumerate(G.nodes):
        if node.domain not in DEFAULT_DOMAINS or node.op_type not in TARGETS:
            continue
        try:
            fused, members, rule = _select(G, i)
            if taken & set(members):
                raise Decline("a node of the unit belongs to another unit")
            if supported is not None:
                why = supported(fused, fused.domain, 1)
                if why:
                    raise Decline(f"no kernel takes {fused.op_type}: {why}")
        except Decline as e:
            result.declined.append((G.label(i), node.op_type, str(e)))
            continue
        taken |= set(members)
        chosen.append((fused, members, rule, i))
    if not chosen:
        return result
    at = {max(members): fused for fused, members, _, _ in chosen}
    nodes = [at[k] if k in at else n for k, n in enumerate(G.nodes) if k in at or k not in taken]
    for fused, members, rule, i in chosen:
        result.units.append(FusedUnit(rule, fused, tuple(G.nodes[k] for k in members), G.label(i)))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    for domain in {f.domain for f, *_ in chosen}:
        if not any(o.domain == domain for o in out.opset_import):
            out.opset_import.append(helper.make_opsetid(domain, 1))
    alive = {x for n in out.graph.node for x in (*n.input, *n.output, *subgraph_reads(n))}
    alive |= {o.name for o in out.graph.output} | {x for u in result.units for x in u.reads()}
    infos = [v for v in out.graph.value_info if v.name in alive]
    del out.graph.value_info[:]
    out.graph.value_info.extend(infos)
    result.model = out
    return result


class DynamicFusion(RewritePass):
    """The dynamic-quantization fusion as a pass (``enabled=False``: the model unchanged); its
    report is the :class:`~qdq_fusion.FusionResult`. Ensures: every fused node is in the model
    and no node of its unit makes a value there any more."""

    name = "fuse_dynamic"

    def __init__(self, specs: Any = None, enabled: bool = True) -> None:
        self.specs, self.enabled = specs, enabled

    def call(self, model: onnx.ModelProto, values) -> PassResult:
        if not self.enabled:
            return PassResult(model, False, FusionResult(model))
        result = fuse_dynamic(model, elem_of=elem_lookup(values), supported=kernel_check(self.specs, values))
        return PassResult(result.model, bool(result.units), result)

    def ensures(self, model: onnx.ModelProto, result: PassResult) -> None:
        super().ensures(model, result)
        self._check(unit_faults(result.model, result.report.units), "ensures")

"""QDQ node-unit fusion: the graph compiler's first phase, before placement (``Session`` runs it
on the loaded model unless ``fuse_qdq=False``).

A QDQ model (``quantize_static(..., quant_format=QDQ)``) says ``DequantizeLinear -> float op ->
QuantizeLinear``; onnxruntime, from ``ORT_ENABLE_EXTENDED`` on, replaces such *node units* by its
integer kernels (onnxruntime/core/optimizer/qdq_transformer/selectors_actions: the selectors'
checks, the actions' input orders) and its results are those kernels' results. This phase makes
the same replacements onto the project's QLinear kernels, so a fused unit computes what
onnxruntime's fused kernel computes:

========================================  ======================================================
unit                                      becomes
========================================  ======================================================
DQ(x), DQ(w)[, DQ(b int32)] -> Conv -> Q  QLinearConv (ai.onnx_quant: ai.onnx's, requantized as
                                          onnxruntime's kernel does: round, then + zero point)
DQ, DQ -> MatMul -> Q                     QLinearMatMul (ai.onnx_quant, the same)
DQ, DQ -> Add / Mul -> Q                  com.microsoft QLinearAdd / QLinearMul
DQ -> AveragePool / GlobalAveragePool /   com.microsoft QLinear<op> (Softmax gets ``opset``, the
LeakyRelu / Sigmoid / Softmax -> Q        Softmax schema's version)
DQ... -> Concat -> Q                      com.microsoft QLinearConcat
DQ(A), DQ(B)[, DQ(C int32)] -> Gemm [-> Q] com.microsoft QGemm (float output without the Q)
DQ -> MaxPool / Reshape / Transpose / ...  the op on the quantized tensor (the pair dropped: Q and
-> Q with equal scalar params              DQ have equal scale and zero point; positive scale)
========================================  ======================================================

onnxruntime's conditions, checked the same way: every existing input of the target comes from
a DequantizeLinear (one for the unary and drop rules); the target's outputs go only to
QuantizeLinear nodes, one edge each, and no target output is a graph output; a Relu (or a Clip)
between target and Q joins the unit only when the Q makes it redundant (Q's zero point is the
type's minimum; a Clip whose bounds quantize outside the type's range); input and output types
match; no 16-bit (nor 4-bit) types except in the drop rule; Conv/MatMul with int8 activations
only where onnxruntime's selector allows them (``int8_allowed``: False on x86, True on ARM; on
x86 onnxruntime first rewrites int8 activation Q/DQ pairs to uint8 (QDQS8ToU8Transformer) and
fuses those, which is not mirrored here: such a unit runs as written); a bias is int32; Gemm's
beta is 1 with a bias. A DequantizeLinear with other consumers stays for them (onnxruntime
duplicates it per consumer: EnsureUniqueDQForNodeUnit). A missing zero point becomes a zero
initializer of the quantized type, as onnxruntime's SetOptionalZeroPoint does.

Not fused (onnxruntime would, onto kernels this project lacks): DQ, DQ -> MatMul without a Q
(MatMulIntegerToFloat), Where (QLinearWhere), Split, Resize, ArgMax. Each decline is recorded
with its reason (:attr:`FusionResult.declined`).

``supported(node, domain, version)`` lets the caller refuse a replacement no kernel can take
(Session passes its spec registry's static check); a refused unit is declined and runs as
written. The unit's original nodes are kept (:attr:`FusedUnit.nodes`): a fused node a kernel
declines for some shapes is evaluated on the host as the unit it replaced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .graph_index import GraphIndex, since_version, subgraph_reads
from .model_check import static_values
from .passes import PassResult, RewritePass, elem_lookup, kernel_check, unit_faults
from .verdict import DEFAULT_DOMAINS

MS_DOMAIN = "com.microsoft"
#: the project's own domain: the fused Conv and MatMul units are its QLinearConv / QLinearMatMul,
#: ai.onnx's operators requantized as onnxruntime's fused kernels do (round, then + zero point)
QUANT_DOMAIN = "ai.onnx_quant"

#: onnxruntime's "drop" rules: ops that move data without changing it (DQ -> op -> Q with equal
#: params becomes the op on the quantized tensor); MaxPool from 12 (integer MaxPool), no 16-bit
DROP_OPS = frozenset({"Expand", "Flatten", "Gather", "GatherElements", "Reshape", "Slice", "Squeeze", "Tile",
                      "Transpose", "Unsqueeze"})
DROP_NO_16BIT_OPS = {"MaxPool": 12, "ReduceMax": 1, "ReduceMin": 1}
UNARY_OPS = frozenset({"AveragePool", "LeakyRelu", "GlobalAveragePool", "Sigmoid", "Softmax"})
BINARY_OPS = frozenset({"Add", "Mul"})

TYPE_RANGE = {TensorProto.UINT8: (0, 255), TensorProto.INT8: (-128, 127),
              TensorProto.UINT16: (0, 65535), TensorProto.INT16: (-32768, 32767)}
SIXTEEN_BIT = frozenset({TensorProto.UINT16, TensorProto.INT16})
FOUR_BIT = frozenset({TensorProto.UINT4, TensorProto.INT4})


class Decline(Exception):
    """A unit onnxruntime's selectors would not select (the message says which check failed)."""


@dataclass(frozen=True)
class FusedUnit:
    """One fused node unit: the rule, the node that replaces it, and the unit as written
    (DequantizeLinears, target, a redundant Relu/Clip, QuantizeLinears) in graph order."""

    rule: str
    node: onnx.NodeProto
    nodes: tuple[onnx.NodeProto, ...]
    target: str  # the target node's label

    def reads(self) -> list[str]:
        """The values the unit as written reads from outside it (what evaluating it needs)."""
        made = {o for n in self.nodes for o in n.output}
        return list(dict.fromkeys(x for n in self.nodes for x in n.input if x and x not in made))

    def labels(self) -> list[str]:
        return [n.name or f"{n.op_type}({n.output[0]})" for n in self.nodes]


@dataclass
class FusionResult:
    model: onnx.ModelProto
    units: list[FusedUnit] = field(default_factory=list)
    #: (target label, op type, why not fused) for every node with a DequantizeLinear input that a
    #: rule looked at and declined
    declined: list[tuple[str, str, str]] = field(default_factory=list)


# ----------------------------------------------------------------------------- graph facts


class _QdqIndex(GraphIndex):
    """The shared graph index with what the QDQ selectors ask besides: the DequantizeLinear
    feeding a value, and the quantized types Q/DQ nodes make and read."""

    def dq_feeding(self, name: str) -> int | None:
        i = self.producer.get(name)
        if i is None:
            return None
        return i if _is_qdq(self.nodes[i], "DequantizeLinear") else None

    def q_elem(self, q: onnx.NodeProto) -> int:
        """QuantizeLinear's output type: its zero point's, output_dtype, or uint8."""
        code = self.elem_of(q.output[0])
        if not code and len(q.input) > 2 and q.input[2]:
            code = self.elem_of(q.input[2])
        elif not code:
            code = next((a.i for a in q.attribute if a.name == "output_dtype"), 0) or TensorProto.UINT8
        if not code:
            raise Decline(f"the type of {q.output[0]!r} is not known")
        return code

    def dq_elem(self, d: int) -> int:
        """The quantized type a DequantizeLinear reads."""
        code = self.elem_of(self.nodes[d].input[0])
        if not code:
            raise Decline(f"the type of {self.nodes[d].input[0]!r} is not known")
        return code


def _is_qdq(node: onnx.NodeProto, op: str) -> bool:
    """A well-formed QuantizeLinear / DequantizeLinear (x and scale given, one output)."""
    return (node.op_type == op and node.domain in DEFAULT_DOMAINS and len(node.input) >= 2
            and bool(node.input[0]) and bool(node.input[1]) and bool(node.output) and bool(node.output[0]))


# ----------------------------------------------------------------------------- selection


@dataclass
class _Unit:
    target: int
    dqs: dict[int, int]          # target input slot -> DQ node index
    qs: list[int]                # QuantizeLinear node index per target output
    clip: int | None = None


def _select(G: _QdqIndex, i: int, n_dq: int | None, q_optional: bool = False) -> _Unit:
    """onnxruntime's GetQDQSelection + CheckQDQNodes: DQ parents, a redundant Relu/Clip, Q children."""
    node = G.nodes[i]
    dqs = {s: d for s, name in enumerate(node.input) if name and (d := G.dq_feeding(name)) is not None}
    existing = sum(1 for x in node.input if x)
    if len(dqs) != (existing if n_dq is None else n_dq):
        want = "every input" if n_dq is None else f"{n_dq} input(s)"
        raise Decline(f"{want} must come from a DequantizeLinear, {len(dqs)} of {existing} do")
    edges = G.out_edges(i)
    clip = None
    if len(edges) == 1 and edges[0][1] >= 0:
        nxt = G.nodes[edges[0][0]]
        nxt_edges = G.out_edges(edges[0][0])
        if nxt.op_type in ("Relu", "Clip") and nxt.domain in DEFAULT_DOMAINS and len(nxt_edges) == 1 \
                and not G.makes_graph_output(edges[0][0]):
            clip = edges[0][0]
    source = clip if clip is not None else i
    qs = [c for c, s in G.out_edges(source) if s == 0 and _is_qdq(G.nodes[c], "QuantizeLinear")]
    if clip is not None:
        if len(qs) != 1 or not _clip_redundant(G, G.nodes[clip], G.nodes[qs[0]]):
            raise Decline(f"{G.nodes[clip].op_type} {G.label(clip)!r} before the QuantizeLinear is not made "
                          f"redundant by it")
    if not qs:
        if q_optional:
            return _Unit(i, dqs, [], None)
        raise Decline("its output goes to no QuantizeLinear")
    outputs = sum(1 for o in node.output if o)
    if outputs != len(qs) or len(qs) != len(edges):
        raise Decline("its output has consumers other than one QuantizeLinear")
    if G.makes_graph_output(i):
        raise Decline("its output is a graph output")
    return _Unit(i, dqs, qs, clip)


def _q_scalar_params(G: _QdqIndex, q: onnx.NodeProto) -> tuple[float, int, int] | None:
    """(scale, zero point, type) of a Q with constant scalar parameters (GetQScalarScaleZp)."""
    scale = G.constant(q.input[1])
    if scale is None or scale.ndim != 0:
        return None
    if len(q.input) < 3 or not q.input[2]:
        return float(scale), 0, G.q_elem(q)
    zp = G.constant(q.input[2])
    if zp is None or zp.ndim != 0:
        return None
    return float(scale), int(zp), G.q_elem(q)


def _clip_redundant(G: _QdqIndex, clip: onnx.NodeProto, q: onnx.NodeProto) -> bool:
    """onnxruntime's IsClipMadeRedundantByQ."""
    params = _q_scalar_params(G, q)
    if params is None or params[2] not in TYPE_RANGE:
        return False
    scale, zp, code = params
    lo, hi = TYPE_RANGE[code]
    if clip.op_type == "Relu":
        return zp == lo
    f32 = np.finfo(np.float32)
    if G.opset < 11:
        attrs = {a.name: a.f for a in clip.attribute}
        cmin, cmax = attrs.get("min", float(f32.min)), attrs.get("max", float(f32.max))
    else:
        bounds = []
        for k, default in ((1, f32.min), (2, f32.max)):
            if len(clip.input) > k and clip.input[k]:
                v = G.constant(clip.input[k])
                if v is None or v.size != 1:
                    return False
                bounds.append(float(v.reshape(-1)[0]))
            else:
                bounds.append(float(default))
        cmin, cmax = bounds

    def quantized(v: float) -> int:
        with np.errstate(over="ignore"):
            r = np.rint(np.float32(v) / np.float32(scale))
        # a float -> int32 conversion out of range gives INT_MIN on x86 (what onnxruntime gets)
        return (int(r) if np.isfinite(r) and -2**31 <= r < 2**31 else -2**31) + zp

    return quantized(cmin) <= lo and quantized(cmax) >= hi


def _input_elem(G: _QdqIndex, dq_index: int) -> int:
    return G.dq_elem(dq_index)


def _check_bits(*codes: int, sixteen: bool = False) -> None:
    for c in codes:
        if c in FOUR_BIT:
            raise Decline("4-bit types are not fused")
        if c in SIXTEEN_BIT and not sixteen:
            raise Decline("16-bit types are not fused")


def _per_tensor(G: _QdqIndex, name: str, what: str) -> None:
    v = G.constant(name)
    if v is not None and v.size != 1:
        raise Decline(f"{what} is not per-tensor")


# ----------------------------------------------------------------------------- rules


@dataclass
class _Fusion:
    rule: str
    unit: _Unit
    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attributes: list[onnx.AttributeProto]


def _dq_args(G: _QdqIndex, d: int, zero_points: dict[str, int]) -> list[str]:
    """DequantizeLinear's (x, scale, zero point): a missing zero point as a zero initializer."""
    n = G.nodes[d]
    zp = n.input[2] if len(n.input) > 2 and n.input[2] else _zero_point(G.dq_elem(d), zero_points)
    return [n.input[0], n.input[1], zp]


def _q_args(G: _QdqIndex, q: int, zero_points: dict[str, int]) -> list[str]:
    n = G.nodes[q]
    zp = n.input[2] if len(n.input) > 2 and n.input[2] else _zero_point(G.q_elem(n), zero_points)
    return [n.input[1], zp]


def _zero_point(code: int, zero_points: dict[str, int]) -> str:
    name = f"qdq_fusion_zero_point_{onnx.helper.tensor_dtype_to_np_dtype(code).name}"
    zero_points[name] = code
    return name


def _attrs(node: onnx.NodeProto, drop: Sequence[str] = ()) -> list[onnx.AttributeProto]:
    return [a for a in node.attribute if a.name not in drop]


def _types_equal(G: _QdqIndex, u: _Unit, what: str) -> int:
    codes = {_input_elem(G, d) for d in u.dqs.values()} | {G.q_elem(G.nodes[q]) for q in u.qs}
    if len(codes) != 1:
        raise Decline(f"{what}: input and output types differ")
    (code,) = codes
    return code


def _rule_conv(G: _QdqIndex, i: int, zps: dict[str, int], int8_allowed: bool) -> _Fusion:
    u = _select(G, i, None)
    if 0 not in u.dqs or 1 not in u.dqs:
        raise Decline("X and W must come from DequantizeLinear")
    dt_x, dt_w, dt_y = _input_elem(G, u.dqs[0]), _input_elem(G, u.dqs[1]), G.q_elem(G.nodes[u.qs[0]])
    if dt_x != dt_y:
        raise Decline("input and output types differ")
    _check_bits(dt_x, dt_w)
    if dt_x == TensorProto.INT8 and (not int8_allowed or dt_w != dt_x):
        raise Decline("int8 activations (onnxruntime fuses them only where int8 is allowed: ARM)")
    if 2 in u.dqs and _input_elem(G, u.dqs[2]) != TensorProto.INT32:
        raise Decline("the bias is not int32")
    ins = _dq_args(G, u.dqs[0], zps) + _dq_args(G, u.dqs[1], zps) + _q_args(G, u.qs[0], zps)
    if 2 in u.dqs:
        ins.append(G.nodes[u.dqs[2]].input[0])
    return _Fusion("conv", u, "QLinearConv", QUANT_DOMAIN, ins, [G.nodes[u.qs[0]].output[0]], _attrs(G.nodes[i]))


def _rule_matmul(G: _QdqIndex, i: int, zps: dict[str, int], int8_allowed: bool) -> _Fusion:
    u = _select(G, i, 2, q_optional=True)
    dt_a, dt_b = _input_elem(G, u.dqs[0]), _input_elem(G, u.dqs[1])
    if dt_a == TensorProto.INT8 and (not int8_allowed or dt_b != dt_a):
        raise Decline("int8 activations (onnxruntime fuses them only where int8 is allowed: ARM)")
    _check_bits(dt_a, dt_b)
    if not u.qs:
        raise Decline("no QuantizeLinear after it (onnxruntime's MatMulIntegerToFloat: no kernel here)")
    if G.q_elem(G.nodes[u.qs[0]]) != dt_a:
        raise Decline("input and output types differ")
    ins = _dq_args(G, u.dqs[0], zps) + _dq_args(G, u.dqs[1], zps) + _q_args(G, u.qs[0], zps)
    return _Fusion("matmul", u, "QLinearMatMul", QUANT_DOMAIN, ins, [G.nodes[u.qs[0]].output[0]], _attrs(G.nodes[i]))


def _rule_binary(G: _QdqIndex, i: int, zps: dict[str, int], int8_allowed: bool) -> _Fusion:
    u = _select(G, i, None)
    _check_bits(_types_equal(G, u, "binary"))
    ins = _dq_args(G, u.dqs[0], zps) + _dq_args(G, u.dqs[1], zps) + _q_args(G, u.qs[0], zps)
    return _Fusion("binary", u, "QLinear" + G.nodes[i].op_type, MS_DOMAIN, ins, [G.nodes[u.qs[0]].output[0]],
                   _attrs(G.nodes[i]))


def _rule_unary(G: _QdqIndex, i: int, zps: dict[str, int], int8_allowed: bool) -> _Fusion:
    u = _select(G, i, 1)
    if 0 not in u.dqs:
        raise Decline("its data input does not come from a DequantizeLinear")
    _check_bits(_types_equal(G, u, "unary"))
    node = G.nodes[i]
    attrs = _attrs(node)
    if node.op_type == "Softmax":
        attrs.append(helper.make_attribute("opset", since_version(node, G.opset)))
    ins = _dq_args(G, u.dqs[0], zps) + _q_args(G, u.qs[0], zps)
    return _Fusion("unary", u, "QLinear" + node.op_type, MS_DOMAIN, ins, [G.nodes[u.qs[0]].output[0]], attrs)


def _rule_concat(G: _QdqIndex, i: int, zps: dict[str, int], int8_allowed: bool) -> _Fusion:
    u = _select(G, i, None)
    _check_bits(_types_equal(G, u, "Concat"))
    ins = _q_args(G, u.qs[0], zps)
    for s in sorted(u.dqs):
        ins += _dq_args(G, u.dqs[s], zps)
    return _Fusion("variadic", u, "QLinearConcat", MS_DOMAIN, ins, [G.nodes[u.qs[0]].output[0]],
                   _attrs(G.nodes[i]))


def _rule_gemm(G: _QdqIndex, i: int, zps: dict[str, int], int8_allowed: bool) -> _Fusion:
    u = _select(G, i, None, q_optional=True)
    if 0 not in u.dqs or 1 not in u.dqs:
        raise Decline("A and B must come from DequantizeLinear")
    dt_a, dt_b = _input_elem(G, u.dqs[0]), _input_elem(G, u.dqs[1])
    if dt_a == TensorProto.INT8 and dt_b != dt_a:
        raise Decline("int8 A needs an int8 B")
    if u.qs and G.q_elem(G.nodes[u.qs[0]]) != dt_a:
        raise Decline("input and output types differ")
    _check_bits(dt_a, dt_b)
    node = G.nodes[i]
    if 2 in u.dqs:
        beta = next((a.f for a in node.attribute if a.name == "beta"), 1.0)
        if beta != 1.0:
            raise Decline("beta is not 1 with a bias")
        if _input_elem(G, u.dqs[2]) != TensorProto.INT32:
            raise Decline("the bias is not int32")
    ins = _dq_args(G, u.dqs[0], zps) + _dq_args(G, u.dqs[1], zps)
    ins.append(G.nodes[u.dqs[2]].input[0] if 2 in u.dqs else "")
    if u.qs:
        ins += _q_args(G, u.qs[0], zps)
        outs = [G.nodes[u.qs[0]].output[0]]
    else:
        outs = [node.output[0]]
    while ins and not ins[-1]:
        ins.pop()
    return _Fusion("gemm", u, "QGemm", MS_DOMAIN, ins, outs, _attrs(node, drop=("beta",)))


def _rule_drop(G: _QdqIndex, i: int, zps: dict[str, int], int8_allowed: bool) -> _Fusion:
    node = G.nodes[i]
    u = _select(G, i, 1)
    if 0 not in u.dqs:
        raise Decline("its data input does not come from a DequantizeLinear")
    if u.clip is not None:
        raise Decline("a Relu/Clip sits between it and the QuantizeLinear")
    dq, q = G.nodes[u.dqs[0]], G.nodes[u.qs[0]]
    code = _input_elem(G, u.dqs[0])
    if code != G.q_elem(q):
        raise Decline("input and output types differ")
    _check_bits(code, sixteen=node.op_type not in DROP_NO_16BIT_OPS)
    if node.op_type in DROP_NO_16BIT_OPS and G.opset < DROP_NO_16BIT_OPS[node.op_type]:
        raise Decline(f"{node.op_type} before opset {DROP_NO_16BIT_OPS[node.op_type]} has no integer form")
    qp = _q_scalar_params(G, q)
    dq_scale = G.constant(dq.input[1])
    dq_zp = G.constant(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else np.zeros((), np.int64)
    if qp is None or dq_scale is None or dq_scale.ndim != 0 or dq_zp is None or dq_zp.ndim != 0:
        raise Decline("QuantizeLinear and DequantizeLinear parameters are not constant scalars")
    if not qp[0] > 0:
        raise Decline("the scale is not positive")
    if np.float32(qp[0]) != np.float32(dq_scale) or qp[1] != int(dq_zp):
        raise Decline("QuantizeLinear and DequantizeLinear parameters differ")
    ins = list(node.input)
    ins[0] = dq.input[0]
    return _Fusion("drop", u, node.op_type, node.domain, ins, [q.output[0]], _attrs(node))


RULES: dict[str, Callable[..., _Fusion]] = {
    "Conv": _rule_conv, "MatMul": _rule_matmul, "Concat": _rule_concat, "Gemm": _rule_gemm,
    **{op: _rule_binary for op in BINARY_OPS}, **{op: _rule_unary for op in UNARY_OPS},
    **{op: _rule_drop for op in (*DROP_OPS, *DROP_NO_16BIT_OPS)},
}


# ----------------------------------------------------------------------------- the phase


def fuse_qdq(model: onnx.ModelProto, *, elem_of: Callable[[str], int] | None = None,
             supported: Callable[[onnx.NodeProto, str, int], str] | None = None,
             int8_allowed: bool = False) -> FusionResult:
    """The model with its QDQ node units replaced (a new ModelProto; ``model`` is not changed).

    ``elem_of(name)``: a value's TensorProto element type (default: the project's inference
    pass); ``supported(node, domain, version)``: why no kernel takes the replacement ('' if one
    does), None to accept every replacement."""
    if elem_of is None:
        elem_of = elem_lookup(static_values(model))
    G = _QdqIndex(model, elem_of)
    result = FusionResult(model)
    zps: dict[str, int] = {}
    fusions: list[_Fusion] = []
    taken: set[int] = set()
    ms_version = next((o.version for o in model.opset_import if o.domain == MS_DOMAIN), 1)
    for i, node in enumerate(G.nodes):
        rule = RULES.get(node.op_type) if node.domain in DEFAULT_DOMAINS else None
        if rule is None or i in taken:
            continue
        local: dict[str, int] = {}
        try:
            f = rule(G, i, local, int8_allowed)
            if supported is not None:
                version = ms_version if f.domain == MS_DOMAIN else 1 if f.domain == QUANT_DOMAIN else G.opset
                candidate = helper.make_node(f.op_type, f.inputs, f.outputs, domain=f.domain)
                candidate.attribute.extend(f.attributes)
                why = supported(candidate, f.domain, version)
                if why:
                    raise Decline(f"no kernel takes {f.op_type}: {why}")
        except Decline as e:
            if any(G.dq_feeding(x) is not None for x in node.input if x):  # a unit candidate at all
                result.declined.append((G.label(i), node.op_type, str(e)))
            continue
        zps.update(local)
        fusions.append(f)
        taken |= {i, *f.unit.qs} | ({f.unit.clip} if f.unit.clip is not None else set())
    if not fusions:
        return result
    return _rewrite(model, G, fusions, zps, result)


def _rewrite(model: onnx.ModelProto, G: _QdqIndex, fusions: list[_Fusion], zps: Mapping[str, int],
             result: FusionResult) -> FusionResult:
    removed: set[int] = set()
    at: dict[int, onnx.NodeProto] = {}
    fused_edges: set[tuple[int, int]] = set()
    for f in fusions:
        u = f.unit
        target = G.nodes[u.target]
        node = helper.make_node(f.op_type, f.inputs, f.outputs, name=target.name, domain=f.domain)
        node.attribute.extend(f.attributes)
        members = sorted({*u.dqs.values(), u.target, *u.qs, *([u.clip] if u.clip is not None else [])})
        result.units.append(FusedUnit(f.rule, node, tuple(G.nodes[m] for m in members), G.label(u.target)))
        removed |= {u.target, *u.qs} | ({u.clip} if u.clip is not None else set())
        fused_edges |= {(u.target, s) for s in u.dqs}
        at[max(u.qs) if u.qs else u.target] = node
    # a DequantizeLinear stays while a consumer outside the fused units (or the graph) reads it
    for d in {d for f in fusions for d in f.unit.dqs.values()}:
        out = G.nodes[d].output[0]
        if out not in G.outputs and all(e in fused_edges for e in G.edges.get(out, [])):
            removed.add(d)
    nodes = []
    for i, n in enumerate(G.nodes):
        if i in at:
            nodes.append(at[i])
        elif i not in removed:
            nodes.append(n)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    have = {t.name for t in out.graph.initializer}
    for name, code in zps.items():
        if name not in have:
            out.graph.initializer.append(numpy_helper.from_array(
                np.zeros((), dtype=helper.tensor_dtype_to_np_dtype(code)), name))
    for domain in (MS_DOMAIN, QUANT_DOMAIN):
        if any(f.domain == domain for f in fusions) and not any(o.domain == domain for o in out.opset_import):
            out.opset_import.append(helper.make_opsetid(domain, 1))
    used = {x for n in out.graph.node for x in n.input} | {x for n in out.graph.node for x in subgraph_reads(n)}
    used |= {o.name for o in out.graph.output} | {x for u in result.units for x in u.reads()}
    kept = [t for t in out.graph.initializer if t.name in used or t.name in {i.name for i in out.graph.input}]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    alive = used | {o for n in out.graph.node for o in n.output}
    infos = [v for v in out.graph.value_info if v.name in alive]  # those of fused-away values go
    del out.graph.value_info[:]
    out.graph.value_info.extend(infos)
    result.model = out
    return result


class QdqFusion(RewritePass):
    """The QDQ fusion as a pass over the model's static values, asking registry ``specs`` which
    replacements a kernel takes (``enabled=False``: the model unchanged); its report is the
    :class:`FusionResult`. Ensures: every fused node is in the model and no node of its unit but a
    DequantizeLinear other nodes still read makes a value there."""

    name = "fuse_qdq"

    def __init__(self, specs: Any = None, enabled: bool = True) -> None:
        self.specs, self.enabled = specs, enabled

    def call(self, model: onnx.ModelProto, values) -> PassResult:
        if not self.enabled:
            return PassResult(model, False, FusionResult(model))
        result = fuse_qdq(model, elem_of=elem_lookup(values), supported=kernel_check(self.specs, values))
        return PassResult(result.model, bool(result.units), result)

    def ensures(self, model: onnx.ModelProto, result: PassResult) -> None:
        super().ensures(model, result)
        self._check(unit_faults(result.model, result.report.units,
                                keep=lambda n: _is_qdq(n, "DequantizeLinear")), "ensures")

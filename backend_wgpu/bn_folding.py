"""BatchNormalization folded into the Conv before it, as onnxruntime's ConvBNFusion does from
``ORT_ENABLE_BASIC`` on (a graph-compiler phase before placement, on the ModelProto; CPU only).

``Conv(x, W[, B]) -> BatchNormalization(scale, bias, mean, var, epsilon)`` becomes one Conv with

    s  = scale / sqrt(var + epsilon)          (per output channel, float32, as onnxruntime computes it)
    W' = W * s   (each output channel's filter)
    B' = (B - mean) * s + bias   (bias - mean * s without B)

where the Conv's weights and bias and the BatchNormalization's four parameters are constant
initializers of one float type (float32), the Conv's output feeds only that BatchNormalization
(and is not a graph output), and the BatchNormalization is in inference form (one output; no
``training_mode``). The folded node computes what onnxruntime's optimized graph computes: the
same float32 parameters, one convolution instead of a convolution and a normalization.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from .graph_index import GraphIndex, attributes
from .passes import PassResult, RewritePass
from .verdict import DEFAULT_DOMAINS

FOLDABLE_TYPES = frozenset({onnx.TensorProto.FLOAT})


@dataclass
class Folded:
    conv: str       # the Conv's output name: the folded node's output is the BatchNormalization's
    batch_norm: str


@dataclass
class FoldResult:
    model: onnx.ModelProto
    folded: list[Folded] = field(default_factory=list)


def foldable_pairs(G: GraphIndex) -> list[tuple[onnx.NodeProto, onnx.NodeProto]]:
    """The (Conv, BatchNormalization) pairs of the indexed graph that fold (the module's rule):
    the Conv's output read by the BatchNormalization alone (a body's read counts) and no graph
    output, the parameters constant float32 initializers no feed overrides, inference form."""
    pairs: list[tuple[onnx.NodeProto, onnx.NodeProto]] = []
    for bn in G.nodes:
        if bn.op_type != "BatchNormalization" or bn.domain not in DEFAULT_DOMAINS:
            continue
        p = G.producer.get(bn.input[0])
        conv = None if p is None else G.nodes[p]
        if conv is None or conv.op_type != "Conv" or conv.domain not in DEFAULT_DOMAINS:
            continue
        if attributes(bn).get("training_mode", 0) or len([o for o in bn.output if o]) != 1 or len(bn.input) != 5:
            continue
        if G.readers(conv.output[0]) != 1 or conv.output[0] in G.outputs:
            continue
        params = [G.initializers.get(n) for n in list(bn.input[1:]) + list(conv.input[1:])]
        if any(p is None or p.data_type not in FOLDABLE_TYPES for p in params):
            continue
        pairs.append((conv, bn))
    return pairs


def fold_batch_norm(model: onnx.ModelProto) -> FoldResult:
    """A copy of ``model`` with every foldable Conv -> BatchNormalization pair folded (the model
    itself when there is none)."""
    G = GraphIndex(model)
    pairs = foldable_pairs(G)
    if not pairs:
        return FoldResult(model)
    inits = G.initializers
    out = onnx.ModelProto()
    out.CopyFrom(model)
    folded_names = {id(c): (c, b) for c, b in pairs}
    new_nodes, new_inits, drop, folded = [], [], set(), []
    bn_outputs = {b.output[0] for _, b in pairs}
    for n in model.graph.node:
        if id(n) in folded_names:
            conv, bn = folded_names[id(n)]
            scale, bias, mean, var = (numpy_helper.to_array(inits[i]) for i in bn.input[1:])
            eps = np.float32(attributes(bn).get("epsilon", 1e-5))
            s = scale / np.sqrt(var + eps)
            w = numpy_helper.to_array(inits[conv.input[1]])
            w2 = (w * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
            if len(conv.input) > 2 and conv.input[2]:
                b2 = ((numpy_helper.to_array(inits[conv.input[2]]) - mean) * s + bias).astype(w.dtype)
            else:
                b2 = (bias - mean * s).astype(w.dtype)
            wname, bname = f"{conv.output[0]}_bn_folded_w", f"{conv.output[0]}_bn_folded_b"
            new_inits += [numpy_helper.from_array(w2, wname), numpy_helper.from_array(b2, bname)]
            node = onnx.NodeProto()
            node.CopyFrom(conv)
            del node.input[:]
            node.input.extend([conv.input[0], wname, bname])
            node.output[0] = bn.output[0]
            new_nodes.append(node)
            drop |= {i for i in list(bn.input[1:]) + list(conv.input[1:]) if G.readers(i) == 1}
            folded.append(Folded(conv.output[0], bn.output[0]))
        elif n.op_type == "BatchNormalization" and n.output and n.output[0] in bn_outputs:
            continue
        else:
            new_nodes.append(n)
    del out.graph.node[:]
    out.graph.node.extend(new_nodes)
    kept = [t for t in out.graph.initializer if t.name not in drop]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept + new_inits)
    gone = {f.conv for f in folded}
    infos = [v for v in out.graph.value_info if v.name not in gone]
    del out.graph.value_info[:]
    out.graph.value_info.extend(infos)
    return FoldResult(out, folded)


class FoldBatchNorm(RewritePass):
    """The folding as a pass (``enabled=False``: the model unchanged); its report is the
    :class:`FoldResult`. Ensures: each folded BatchNormalization's output is made by a Conv, the
    Conv's own output by no node, and the graph lost one node per pair."""

    name = "fold_batch_norm"

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled

    def call(self, model: onnx.ModelProto, values) -> PassResult:
        result = fold_batch_norm(model) if self.enabled else FoldResult(model)
        return PassResult(result.model, bool(result.folded), result)

    def ensures(self, model: onnx.ModelProto, result: PassResult) -> None:
        super().ensures(model, result)
        if not result.modified:
            return
        made = {o: n for n in result.model.graph.node for o in n.output if o}
        faults = [f"{f.batch_norm!r} is not made by a Conv" for f in result.report.folded
                  if made.get(f.batch_norm) is None or made[f.batch_norm].op_type != "Conv"]
        faults += [f"{f.conv!r} is still made" for f in result.report.folded if f.conv in made]
        if len(result.model.graph.node) != len(model.graph.node) - len(result.report.folded):
            faults.append(f"{len(result.report.folded)} pairs folded, but the graph went from "
                          f"{len(model.graph.node)} to {len(result.model.graph.node)} nodes")
        self._check(faults, "ensures")

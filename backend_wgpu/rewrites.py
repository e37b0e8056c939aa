"""The construction phases: the model as written -> the model a Session places and plans.

Run once per Session, before placement, as passes (passes.py: requires -> call -> ``PassResult`` ->
ensures), in this order, each on the previous one's model and static values:

0. readers of a sequence built in the same graph (ConcatFromSequence of a SequenceConstruct, a
   SequenceAt at a static position) replaced by the kernels they amount to (sequences.SequenceRewrite);
1. nodes whose op has no kernel but an ONNX function body, replaced by the body
   (function_expansion.ExpandFunctions), so that the phases below and the placement see its ops;
2. BatchNormalization folded into the Conv before it (bn_folding.FoldBatchNorm), as onnxruntime
   does from ``ORT_ENABLE_BASIC`` on;
3. QDQ node units onto the QLinear kernels (qdq_fusion.QdqFusion);
4. dynamic-quantization units onto one fused node each (dynamic_fusion.DynamicFusion) -- before
   the elementwise groups, which would otherwise take their float tails;
5. float32 elementwise groups onto one generated kernel each (elementwise_fusion.ElementwiseFusion);
6. NonZero's data-dependent split (data_dependent.SplitDataDependent): the padded GPU form, the
   nodes reading it moved into a region run per count.

A phase asks the kernel registry only whether a kernel spec takes a node it would write
(``SpecRegistry.verdict``, verdict.py), over the static element types of the model at that point; no
device is involved, so the whole pipeline runs on the CPU (tests/backend/test_rewrites.py). Every
fused node keeps its unit beside it (``fused_units``) so that a node whose kernel declines at plan
time runs as written on the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import onnx

from .bn_folding import FoldBatchNorm
from .data_dependent import SplitDataDependent
from .dynamic_fusion import DynamicFusion
from .elementwise_fusion import ElementwiseFusion
from .function_expansion import ExpandFunctions
from .passes import PassResult, RewritePass
from .qdq_fusion import QdqFusion
from .sequences import SequenceRewrite


@dataclass(frozen=True)
class RewriteOptions:
    """Which phases run (the Session's keyword arguments of the same names; function expansion
    always runs in a Session: it only touches nodes that would otherwise run on the host)."""

    expand_functions: bool = True
    fold_batch_norm: bool = True
    fuse_qdq: bool = True
    fuse_dynamic: bool = True
    fuse_elementwise: bool = True


@dataclass
class Rewritten:
    """What the phases made: the model to place, its static values, and what each phase did."""

    model: onnx.ModelProto
    static_values: dict[str, Any]
    #: the sequence readers replaced by kernels (sequences.SequenceReport)
    sequences: Any = None
    #: the nodes replaced by their ONNX function bodies (function_expansion.ExpansionReport)
    expansion: Any = None
    #: the Conv -> BatchNormalization pairs folded into one Conv
    folded_batch_norms: list = field(default_factory=list)
    #: each fusion phase's result (``units``: what it replaced; its ``model`` when it ran)
    fusion: Any = None
    dynamic_fusion: Any = None
    elementwise_fusion: Any = None
    #: fused node's first output -> the unit it replaced (run as written if its kernel declines)
    fused_units: dict[str, Any] = field(default_factory=dict)
    #: the NonZero nodes in their padded GPU form, and why the others are not
    nonzeros: list = field(default_factory=list)
    nonzero_declined: dict[str, str] = field(default_factory=dict)


def rewrite_passes(specs: Any, options: RewriteOptions = RewriteOptions()) -> list[RewritePass]:
    """The construction phases in their order (a phase turned off passes its model through)."""
    return [SequenceRewrite(), ExpandFunctions(specs, options.expand_functions), FoldBatchNorm(options.fold_batch_norm),
            QdqFusion(specs, options.fuse_qdq),
            DynamicFusion(specs, options.fuse_dynamic), ElementwiseFusion(specs, options.fuse_elementwise),
            SplitDataDependent(specs)]


def run_passes(passes: list[RewritePass], model: onnx.ModelProto, values: dict[str, Any]
               ) -> tuple[onnx.ModelProto, dict[str, Any], dict[str, PassResult]]:
    """Each pass on the previous one's model and static values: (the last model, its values, each
    pass's result by name)."""
    results: dict[str, PassResult] = {}
    for p in passes:
        result = p(model, values)
        if result.modified:
            values = p.values_after(values, result)
            model = result.model
        results[p.name] = result
    return model, values, results


def rewrite_model(model: onnx.ModelProto, values: dict[str, Any], specs: Any,
                  options: RewriteOptions = RewriteOptions()) -> Rewritten:
    """Run the construction phases on ``model`` (``values``: its static values, model_check's)
    with kernel registry ``specs``; the model is not modified (each phase writes a new one)."""
    final, final_values, results = run_passes(rewrite_passes(specs, options), model, values)
    out = Rewritten(final, final_values)
    out.sequences = results["rewrite_sequences"].report
    out.expansion = results["expand_functions"].report
    out.folded_batch_norms = results["fold_batch_norm"].report.folded
    out.fusion = results["fuse_qdq"].report
    out.dynamic_fusion = results["fuse_dynamic"].report
    out.elementwise_fusion = results["fuse_elementwise"].report
    for name in ("fuse_qdq", "fuse_dynamic", "fuse_elementwise"):
        if results[name].modified:
            out.fused_units.update({u.node.output[0]: u for u in results[name].report.units})
    split = results["split_data_dependent"].report
    out.nonzeros, out.nonzero_declined = split.nonzeros, split.declined
    return out

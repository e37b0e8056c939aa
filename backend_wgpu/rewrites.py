"""The construction phases: the model as written -> the model a Session places and plans.

Run once per Session, before placement, in this order (each phase sees the previous one's model):

1. BatchNormalization folded into the Conv before it (bn_folding.py), as onnxruntime does from
   ``ORT_ENABLE_BASIC`` on;
2. QDQ node units onto the QLinear kernels (qdq_fusion.py);
3. dynamic-quantization units onto one fused node each (dynamic_fusion.py) -- before the
   elementwise groups, which would otherwise take their float tails;
4. float32 elementwise groups onto one generated kernel each (elementwise_fusion.py);
5. NonZero's data-dependent split (data_dependent.py): the padded GPU form, the nodes reading it
   moved into a region run per count.

A phase asks the kernel registry only whether a kernel spec takes a node it would write
(:func:`kernel_rejects`), over the static element types of the model at that point; no device is
involved, so the whole pipeline runs on the CPU (tests/backend/test_rewrites.py). Every fused node
keeps its unit beside it (``fused_units``) so that a node whose kernel declines at plan time runs
as written on the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import onnx

from onnx_quant.backend_wgpu import data_dependent as dd
from onnx_quant.backend_wgpu.graph_plan import DEFAULT_DOMAINS, VIEW_OPS, onnx_type
from onnx_quant.backend_wgpu.model_check import static_values
from onnx_quant.dtypes import type_name


@dataclass(frozen=True)
class RewriteOptions:
    """Which phases run (the Session's keyword arguments of the same names)."""

    fold_batch_norm: bool = True
    fuse_qdq: bool = True
    fuse_dynamic: bool = True
    fuse_elementwise: bool = True


@dataclass
class Rewritten:
    """What the phases made: the model to place, its static values, and what each phase did."""

    model: onnx.ModelProto
    static_values: dict[str, Any]
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


def op_text(domain: str, op_type: str) -> str:
    return f"{domain}::{op_type}" if domain not in DEFAULT_DOMAINS else op_type


def spec_rejects(spec: Any, node: onnx.NodeProto, elem_of: Callable[[str], int]) -> str:
    """Why kernel ``spec`` cannot take ``node`` whatever the shapes ('' if it can): arity, the
    attributes it understands, and the static element types (``elem_of``: 0 when unknown, which
    is decided per plan) against its type constraints."""
    inputs = list(node.input)
    outputs = list(node.output)
    if len(inputs) > len(spec.inputs):
        return f"the node has {len(inputs)} inputs, kernel {spec.name} takes {len(spec.inputs)}"
    if len(outputs) > len(spec.outputs):
        return f"the node has {len(outputs)} outputs, kernel {spec.name} writes {len(spec.outputs)}"
    for i, (sname, decl) in enumerate(spec.inputs.items()):
        vname = inputs[i] if i < len(inputs) else ""
        if not vname and not decl.optional:
            return f"kernel {spec.name} needs input {sname!r}, the node leaves it out"
    for i, (sname, decl) in enumerate(spec.outputs.items()):
        if (i >= len(outputs) or not outputs[i]) and not decl.optional:
            return f"kernel {spec.name} writes output {sname!r}, the node leaves it out"
    for a in node.attribute:
        if a.name not in spec.attributes:
            return f"kernel {spec.name} does not understand attribute {a.name!r}"
    bound: dict[str, tuple[str, str]] = {}
    for names, decls in ((inputs, spec.inputs), (outputs, spec.outputs)):
        for i, (sname, decl) in enumerate(decls.items()):
            vname = names[i] if i < len(names) else ""
            if not vname:
                continue
            code = elem_of(vname)
            if not code:
                continue  # decided per plan
            dt = onnx_type(code)
            allowed = spec.type_constraints[decl.dtype]
            if dt is None or dt not in allowed:
                return (f"kernel {spec.name}: {sname!r} is {type_name(code)}, {decl.dtype} allows only "
                        f"{', '.join(allowed)}")
            if decl.dtype in bound and bound[decl.dtype][0] != dt:
                return (f"kernel {spec.name}: {sname!r} is {dt} but {bound[decl.dtype][1]!r} is "
                        f"{bound[decl.dtype][0]} (both {decl.dtype})")
            bound.setdefault(decl.dtype, (dt, sname))
    return ""


def find_kernel(specs: Any, node: onnx.NodeProto, domain: str, version: int,
                elem_of: Callable[[str], int]) -> tuple[Any, str]:
    """The kernel spec of ``node``'s op at ``version`` and why it cannot take the node whatever the
    shapes ('' if it can); ``(None, why)`` where no spec covers the op."""
    spec = specs.find(domain, node.op_type, version)
    if spec is None:
        return None, f"no GPU kernel for {op_text(domain, node.op_type)} at opset {version}"
    return spec, spec_rejects(spec, node, elem_of)


class _Phases:
    """The running state of one rewrite: the current model and its static values."""

    def __init__(self, model: onnx.ModelProto, values: dict[str, Any], specs: Any) -> None:
        self.specs = specs
        self.out = Rewritten(model, values)

    def elem(self, name: str) -> int:
        info = self.out.static_values.get(name)
        return info.elem_type if info is not None else 0

    def kernel_rejects(self, node: onnx.NodeProto, domain: str, version: int) -> str:
        """Why no kernel spec takes a node a phase would write ('' if one does)."""
        if domain in DEFAULT_DOMAINS and node.op_type in VIEW_OPS:
            return ""  # a view of its (quantized) input
        return find_kernel(self.specs, node, domain, version, self.elem)[1]

    def replace(self, model: onnx.ModelProto) -> None:
        self.out.model = model
        self.out.static_values = static_values(model)

    def fusion(self, enabled: bool, fuse: Callable[[], Any]):
        """One fusion phase on the current model: its result (an empty one when disabled)."""
        from onnx_quant.backend_wgpu.qdq_fusion import FusionResult  # noqa: PLC0415

        if not enabled:
            return FusionResult(self.out.model)
        result = fuse()
        if result.units:
            self.replace(result.model)
            self.out.fused_units.update({u.node.output[0]: u for u in result.units})
        return result

    def fold_batch_norm(self) -> None:
        from onnx_quant.backend_wgpu.bn_folding import fold_batch_norm  # noqa: PLC0415

        result = fold_batch_norm(self.out.model)
        if result.folded:
            self.replace(result.model)
        self.out.folded_batch_norms = result.folded

    def split_data_dependent(self) -> None:
        model = self.out.model
        opsets = {(imp.domain or ""): imp.version for imp in model.opset_import}

        def rejects(node: onnx.NodeProto) -> str:
            info = self.out.static_values.get(node.input[0])
            spec, why = find_kernel(self.specs, node, "", opsets.get("", opsets.get("ai.onnx", 0)), self.elem)
            if spec is not None and info is not None and info.shape is not None and len(info.shape) == 0:
                return "the input's rank is 0 (a scalar's indices: [0, count] for ONNX's inference, [1, count] for numpy)"
            return why

        result = dd.split_model(model, rejects)
        if result.nonzeros:
            before = self.out.static_values
            self.replace(result.model)
            for name, info in before.items():  # what the region makes: as the model as written types it
                known = self.out.static_values.get(name)
                if known is None or not known.elem_type or known.shape is None:
                    self.out.static_values[name] = info
        self.out.nonzeros = result.nonzeros
        self.out.nonzero_declined = result.declined


def rewrite_model(model: onnx.ModelProto, values: dict[str, Any], specs: Any,
                  options: RewriteOptions = RewriteOptions()) -> Rewritten:
    """Run the construction phases on ``model`` (``values``: its static values, model_check's)
    with kernel registry ``specs``; the model is not modified (each phase writes a new one)."""
    from onnx_quant.backend_wgpu.dynamic_fusion import fuse_dynamic  # noqa: PLC0415
    from onnx_quant.backend_wgpu.elementwise_fusion import fuse_elementwise  # noqa: PLC0415
    from onnx_quant.backend_wgpu.qdq_fusion import fuse_qdq  # noqa: PLC0415

    run = _Phases(model, values, specs)
    out = run.out
    if options.fold_batch_norm:
        run.fold_batch_norm()
    out.fusion = run.fusion(options.fuse_qdq, lambda: fuse_qdq(out.model, elem_of=run.elem,
                                                               supported=run.kernel_rejects))
    out.dynamic_fusion = run.fusion(options.fuse_dynamic, lambda: fuse_dynamic(
        out.model, elem_of=run.elem, supported=run.kernel_rejects))
    out.elementwise_fusion = run.fusion(options.fuse_elementwise, lambda: fuse_elementwise(
        out.model, elem_of=run.elem, supported=run.kernel_rejects,
        spec_of=lambda node, version: specs.find("", node.op_type, version)))
    run.split_data_dependent()
    return out

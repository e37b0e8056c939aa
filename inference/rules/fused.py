"""The project's own fused operators (domain ``ai.onnx_quant``), written by the GPU backend's graph
compiler (backend_wgpu/elementwise_fusion.py) into the model a session runs.

==========================  =================================================================
FusedElementwise            x0, ..., x7 (float32, numpy broadcasting)     -> y (float32, the broadcast shape)
==========================  =================================================================
"""

from __future__ import annotations

from onnx import TensorProto

from onnx_quant.inference.context import TensorInfo
from onnx_quant.inference.registry import register
from onnx_quant.inference.rules._wm_common import broadcast_shapes, check_same_type, shape_text, type_text

DOMAIN = "ai.onnx_quant"


@register("FusedElementwise", 1, domain=DOMAIN)
def fused_elementwise(ctx, n) -> None:
    rule = "FusedElementwise"
    infos = [n.input(i) for i in range(len(n.node.input)) if n.has_input(i)]
    t = check_same_type(n, rule, infos)
    if t and t != TensorProto.FLOAT:
        n.report(rule, "the fused steps compute in float32", subject="input x0",
                 expected=type_text(TensorProto.FLOAT), found=type_text(t))
    shapes = [i.shape for i in infos]
    if any(s is None for s in shapes):
        n.set_output(0, TensorInfo(t or TensorProto.FLOAT, None))
        return
    try:
        out = broadcast_shapes(shapes)
    except ValueError:
        n.fail(rule, "the inputs do not broadcast", subject="inputs", expected="numpy-broadcastable shapes",
               found=", ".join(shape_text(s) for s in shapes))
    n.set_output(0, TensorInfo(t or TensorProto.FLOAT, out))

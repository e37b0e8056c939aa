"""The project's own fused operators (domain ``ai.onnx_quant``), written by the GPU backend's graph
compiler (backend_wgpu/elementwise_fusion.py, dynamic_fusion.py) into the model a session runs.

==========================  =================================================================
FusedElementwise            x0, ..., x7 (float32, numpy broadcasting)     -> y (float32, the broadcast shape)
FusedConv / FusedMatMul /   Conv's / MatMul's / Gemm's inputs, attributes and rule, plus ``activation``
FusedGemm                   (the steps applied to each output: its type and shape stay)
DynamicQuantizeMatMul       com.microsoft's inputs and rule; ``activation`` ("" or "Relu") applied last
MatMulIntegerToFloat        com.microsoft's inputs and rule; ``activation`` as above
DynamicQuantizeConv         x (float), w (int8/uint8), w_scale, w_zero_point?, bias? -> y (x's type,
                            ConvInteger's shape; Conv's attributes, ``activation``)
ConvIntegerToFloat          x, w (int8/uint8), x_scale, w_scale, x_zero_point?, w_zero_point?, bias?
                            -> y (the scales' type, ConvInteger's shape; as above)
QLinearConv / QLinearMatMul ai.onnx's inputs, attributes and rule (QLinearConv-10, QLinearMatMul-21), written
                            by qdq_fusion.py for a fused QDQ unit (requantized as onnxruntime does)
==========================  =================================================================
"""

from __future__ import annotations

from onnx import TensorProto

from onnx_quant.opsets import op_facts

from . import shape_math
from ..context import TensorInfo
from ..registry import register
from ._wm_common import (
    FLOAT, broadcast_shapes, check_same_type, need, shape_problem, shape_text, type_text,
)
from .com_microsoft import dynamic_quantize_matmul, matmul_integer_to_float
from .nn import conv, conv_attrs, gemm, matmul
from .qlinear import qlinear_conv, qlinear_matmul

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


# an elementwise epilogue keeps its producer's type and shape (elementwise_fusion.py)
register("FusedConv", 1, domain=DOMAIN)(conv)
register("FusedMatMul", 1, domain=DOMAIN)(matmul)
register("FusedGemm", 1, domain=DOMAIN)(gemm)
register("DynamicQuantizeMatMul", 1, domain=DOMAIN)(dynamic_quantize_matmul)
register("MatMulIntegerToFloat", 1, domain=DOMAIN)(matmul_integer_to_float)


@register("QLinearConv", 1, domain=DOMAIN)
def fused_qlinear_conv(ctx, n) -> None:
    qlinear_conv(ctx, n, op_facts("QLinearConv", 10))


@register("QLinearMatMul", 1, domain=DOMAIN)
def fused_qlinear_matmul(ctx, n) -> None:
    qlinear_matmul(ctx, n, op_facts("QLinearMatMul", 21))


def _conv_to_float(n, rule: str, x, w, elem: int) -> None:
    try:
        shape = shape_math.conv_output_shape(x.shape, w.shape, **conv_attrs(n))
    except shape_math.ShapeProblem as p:
        shape_problem(n, rule, p)
    n.set_output(0, TensorInfo(elem or FLOAT, shape))


@register("DynamicQuantizeConv", 1, domain=DOMAIN)
def dynamic_quantize_conv(ctx, n) -> None:
    x, w, _ = need(n, "DynamicQuantizeConv", "x", "w", "w_scale")
    _conv_to_float(n, "DynamicQuantizeConv", x, w, x.elem_type)


@register("ConvIntegerToFloat", 1, domain=DOMAIN)
def conv_integer_to_float(ctx, n) -> None:
    x, w, x_scale, _ = need(n, "ConvIntegerToFloat", "x", "w", "x_scale", "w_scale")
    _conv_to_float(n, "ConvIntegerToFloat", x, w, x_scale.elem_type)

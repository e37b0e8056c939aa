"""QuantizeLinear, DequantizeLinear (every since_version of onnx 1.23) and DynamicQuantizeLinear.

Output types follow the schema of the exact version (read from ``onnx.defs`` through
:mod:`onnx_quant.opsets`); the output shape is the shape of ``x``. Validation (type
constraints, version gates, granularity of scale and zero point) is in
:mod:`inference.rules.quant_params`.
"""

from __future__ import annotations

from onnx import TensorProto

from ..context import ShapesContext, TensorInfo
from ..registry import NodeContext, register
from .quant_params import (
    UNKNOWN,
    attr,
    check_int32_zero_point,
    check_output_dtype,
    check_quant_params,
    check_schema,
    dtype_text,
    fixed_output_type,
    is_data_type,
    precision_types,
    types_text,
)

#: since_versions claimed (a test checks them against onnx.defs)
QUANTIZE_LINEAR_VERSIONS = (10, 13, 19, 21, 23, 24, 25, 28)
DEQUANTIZE_LINEAR_VERSIONS = (10, 13, 19, 21, 23, 24, 25, 28)
DYNAMIC_QUANTIZE_LINEAR_VERSIONS = (11,)


@register("QuantizeLinear", *QUANTIZE_LINEAR_VERSIONS)
def quantize_linear(ctx: ShapesContext, n: NodeContext) -> None:
    facts = check_schema(n)
    x = n.input(0) or UNKNOWN
    scale = n.input(1) or UNKNOWN
    zp = n.input(2)
    check_quant_params(n, facts, x, scale, zp, scale_name="y_scale", zp_name="y_zero_point")

    output_dtype = attr(n, facts, "output_dtype", 0)
    if output_dtype:
        check_output_dtype(n, facts, output_dtype)
        if zp is not None and zp.elem_type and zp.elem_type != output_dtype:
            n.report("quant.output-dtype-mismatch", "output_dtype and the type of y_zero_point must agree",
                     subject="attribute output_dtype", expected=dtype_text(zp.elem_type),
                     found=dtype_text(output_dtype))
    precision = attr(n, facts, "precision", 0)
    if precision:
        allowed = precision_types(facts)
        if precision not in allowed:
            n.report("quant.precision", "precision must be a floating-point type for the division x / y_scale",
                     subject="attribute precision", expected=types_text(allowed), found=dtype_text(precision))

    valid_dtype = output_dtype if is_data_type(output_dtype) else 0
    if zp is not None:
        y_type = zp.elem_type or valid_dtype
    elif output_dtype:
        y_type = valid_dtype
    else:
        y_type = TensorProto.UINT8
    n.set_output(0, TensorInfo(y_type, x.shape))


@register("DequantizeLinear", *DEQUANTIZE_LINEAR_VERSIONS)
def dequantize_linear(ctx: ShapesContext, n: NodeContext) -> None:
    facts = check_schema(n)
    x = n.input(0) or UNKNOWN
    scale = n.input(1) or UNKNOWN
    zp = n.input(2)
    check_quant_params(n, facts, x, scale, zp, scale_name="x_scale", zp_name="x_zero_point")
    check_int32_zero_point(n, x, zp, "x_zero_point")

    output_dtype = attr(n, facts, "output_dtype", 0)
    if output_dtype:
        check_output_dtype(n, facts, output_dtype)
    if output_dtype and is_data_type(output_dtype):
        y_type = output_dtype  # as onnx does, even when the version does not allow it (reported)
    else:
        # 10/13: always float; 19+: the type of x_scale
        y_type = fixed_output_type(facts, 0) or scale.elem_type
        if y_type and y_type in facts.input_types(1) and y_type not in facts.output_types(0):
            # e.g. a float8e8m0 x_scale (24+) without output_dtype
            n.report("schema.type-constraint",
                     "y takes the type of x_scale, which this version does not allow for y: set output_dtype",
                     subject="output y", expected=types_text(facts.output_types(0)), found=dtype_text(y_type))
    n.set_output(0, TensorInfo(y_type, x.shape))


@register("DynamicQuantizeLinear", *DYNAMIC_QUANTIZE_LINEAR_VERSIONS)
def dynamic_quantize_linear(ctx: ShapesContext, n: NodeContext) -> None:
    facts = check_schema(n)
    x = n.input(0) or UNKNOWN
    n.set_output(0, TensorInfo(fixed_output_type(facts, 0), x.shape))
    n.set_output(1, TensorInfo(fixed_output_type(facts, 1), ()))
    n.set_output(2, TensorInfo(fixed_output_type(facts, 2), ()))

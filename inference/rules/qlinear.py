"""QLinearConv-10, ConvInteger-10, QLinearMatMul-10/21 and MatMulInteger-10.

Shapes come from :mod:`inference.rules.shape_math` (the same code later serves Conv and
MatMul); types from the schema of the exact version. Shape problems are reported under
``conv.*`` / ``matmul.*``, problems of the quantization parameters under ``qlinear.*``,
schema problems under ``schema.*`` (see ``docs/validation.md``).
"""

from __future__ import annotations

from onnx_quant.opsets import OpFacts

from .. import dims
from ..context import ShapesContext, TensorInfo
from ..registry import NodeContext, register
from .quant_params import (
    UNKNOWN,
    attr,
    check_per_tensor,
    check_same_shape,
    check_schema,
    fixed_output_type,
    is_per_tensor_shape,
)
from .shape_math import (
    ShapeProblem,
    checked_conv_output_shape,
    conv_problems,
    matmul_output_shape,
    matmul_problems,
    provably_different,
    shape_text,
)

QLINEAR_CONV_VERSIONS = (10,)
CONV_INTEGER_VERSIONS = (10,)
QLINEAR_MATMUL_VERSIONS = (10, 21)
MATMUL_INTEGER_VERSIONS = (10,)


def _report_problem(n: NodeContext, p: ShapeProblem) -> None:
    n.report(p.rule, p.message, subject=p.subject, expected=p.expected, found=p.found)


# ---------------------------------------------------------------- convolution
def _conv_attrs(n: NodeContext, facts) -> dict:
    return dict(
        auto_pad=attr(n, facts, "auto_pad", "NOTSET"),
        pads=attr(n, facts, "pads"),
        strides=attr(n, facts, "strides"),
        dilations=attr(n, facts, "dilations"),
        group=attr(n, facts, "group", 1),
        kernel_shape=attr(n, facts, "kernel_shape"),
    )


def _conv_shape(n: NodeContext, facts, x: TensorInfo, w: TensorInfo):
    attrs = _conv_attrs(n, facts)
    problems = conv_problems(x.shape, w.shape, **attrs)
    for p in problems:
        _report_problem(n, p)
    if problems:
        return None  # rank and dims are not trustworthy after a shape problem
    return checked_conv_output_shape(x.shape, w.shape, **attrs)


def _out_channels(w: TensorInfo):
    return w.shape[0] if w.shape else None


def _check_per_channel(n: NodeContext, rule: str, t: TensorInfo | None, name: str, w: TensorInfo) -> None:
    """A scalar / one-element tensor, or a 1-D tensor of M = w.shape[0] elements."""
    if t is None or t.shape is None or is_per_tensor_shape(t.shape):
        return
    m = _out_channels(w)
    s = t.shape
    if len(s) != 1:
        n.report(rule, f"{name} must be a scalar (per-tensor) or 1-D with one value per output channel",
                 subject=f"input {name}", expected=f"[] or [{dims.to_text(m)}]", found=shape_text(s))
    elif provably_different(s[0], m) and provably_different(s[0], 1):
        n.report(rule, f"a 1-D {name} needs one value per output channel (M = w.shape[0])",
                 subject=f"input {name}", expected=f"[{dims.to_text(m)}]", found=shape_text(s))


@register("QLinearConv", *QLINEAR_CONV_VERSIONS)
def qlinear_conv(ctx: ShapesContext, n: NodeContext, facts: OpFacts | None = None) -> None:
    """``facts``: the schema to check against (default: the node's own; the QDQ fusion's
    ai.onnx_quant node is checked as ai.onnx's)."""
    facts = check_schema(n, facts)
    x = n.input(0) or UNKNOWN
    w = n.input(3) or UNKNOWN
    y_zp = n.input(7)
    for i, name in ((1, "x_scale"), (2, "x_zero_point"), (6, "y_scale"), (7, "y_zero_point")):
        check_per_tensor(n, "qlinear.scalar-param", n.input(i), name)
    _check_per_channel(n, "qlinear.w-scale-length", n.input(4), "w_scale", w)
    if n.input(4) is not None:
        check_same_shape(n, "qlinear.zero-point-shape", n.input(4), n.input(5), "w_scale", "w_zero_point")
    bias = n.input(8)
    if bias is not None and bias.shape is not None:
        m = _out_channels(w)
        if len(bias.shape) != 1 or provably_different(bias.shape[0], m):
            n.report("qlinear.bias", "B is a 1-D bias with one value per output channel (M = w.shape[0])",
                     subject="input B", expected=f"[{dims.to_text(m)}]", found=shape_text(bias.shape))
    shape = _conv_shape(n, facts, x, w)
    y_type = (y_zp.elem_type if y_zp is not None else 0) or fixed_output_type(facts, 0)
    n.set_output(0, TensorInfo(y_type, shape))


@register("ConvInteger", *CONV_INTEGER_VERSIONS)
def conv_integer(ctx: ShapesContext, n: NodeContext) -> None:
    facts = check_schema(n)
    x = n.input(0) or UNKNOWN
    w = n.input(1) or UNKNOWN
    check_per_tensor(n, "qlinear.scalar-param", n.input(2), "x_zero_point")
    _check_per_channel(n, "qlinear.w-scale-length", n.input(3), "w_zero_point", w)
    shape = _conv_shape(n, facts, x, w)
    n.set_output(0, TensorInfo(fixed_output_type(facts, 0), shape))


# ---------------------------------------------------------------- matmul
def _check_matmul_param(n: NodeContext, t: TensorInfo | None, name: str, operand: TensorInfo,
                        operand_name: str, per: str) -> None:
    """Scale / zero point of a matmul operand: per-tensor, per-row of ``a`` or per-column of ``b``.

    For ``a`` of shape ``[..., M, K]``: ``[M]`` (2-D ``a``) or ``[..., M, 1]``;
    for ``b`` of shape ``[..., K, N]``: ``[N]`` (2-D ``b``) or ``[..., 1, N]``.
    """
    if t is None or t.shape is None or is_per_tensor_shape(t.shape):
        return
    s, o = t.shape, operand.shape
    if o is None:
        return
    r = len(o)
    if r < 2:
        accepted = ["a scalar"]
        ok = False
    else:
        if per == "row":
            full = tuple(o[:-1]) + (1,)
            vec = (o[-2],)
        else:
            full = tuple(o[:-2]) + (1, o[-1])
            vec = (o[-1],)
        candidates = [full]
        if r == 2:
            candidates.append(vec)
        ok = any(len(c) == len(s) and not any(provably_different(a, b) for a, b in zip(c, s)) for c in candidates)
        accepted = ["a scalar"] + [shape_text(c) for c in candidates]
    if not ok:
        n.report("qlinear.param-shape",
                 f"{name} must be per-tensor or per-{per} of {operand_name} {shape_text(o)}",
                 subject=f"input {name}", expected=" or ".join(accepted), found=shape_text(s))


def _matmul_shape(n: NodeContext, a: TensorInfo, b: TensorInfo):
    problems = matmul_problems(a.shape, b.shape)
    for p in problems:
        _report_problem(n, p)
    if problems:
        return None
    return matmul_output_shape(a.shape, b.shape)


@register("QLinearMatMul", *QLINEAR_MATMUL_VERSIONS)
def qlinear_matmul(ctx: ShapesContext, n: NodeContext, facts: OpFacts | None = None) -> None:
    """``facts`` as :func:`qlinear_conv`'s."""
    facts = check_schema(n, facts)
    a = n.input(0) or UNKNOWN
    b = n.input(3) or UNKNOWN
    y_zp = n.input(7)
    for s_i, z_i, s_name, z_name in ((1, 2, "a_scale", "a_zero_point"), (4, 5, "b_scale", "b_zero_point"),
                                     (6, 7, "y_scale", "y_zero_point")):
        if n.input(s_i) is not None:
            check_same_shape(n, "qlinear.zero-point-shape", n.input(s_i), n.input(z_i), s_name, z_name)
    for i, name in ((1, "a_scale"), (2, "a_zero_point")):
        _check_matmul_param(n, n.input(i), name, a, "a", "row")
    for i, name in ((4, "b_scale"), (5, "b_zero_point")):
        _check_matmul_param(n, n.input(i), name, b, "b", "column")
    for i, name in ((6, "y_scale"), (7, "y_zero_point")):
        check_per_tensor(n, "qlinear.scalar-param", n.input(i), name)
    shape = _matmul_shape(n, a, b)
    y_type = (y_zp.elem_type if y_zp is not None else 0) or fixed_output_type(facts, 0)
    n.set_output(0, TensorInfo(y_type, shape))


@register("MatMulInteger", *MATMUL_INTEGER_VERSIONS)
def matmul_integer(ctx: ShapesContext, n: NodeContext) -> None:
    facts = check_schema(n)
    a = n.input(0) or UNKNOWN
    b = n.input(1) or UNKNOWN
    _check_matmul_param(n, n.input(2), "a_zero_point", a, "A", "row")
    _check_matmul_param(n, n.input(3), "b_zero_point", b, "B", "column")
    shape = _matmul_shape(n, a, b)
    n.set_output(0, TensorInfo(fixed_output_type(facts, 0), shape))

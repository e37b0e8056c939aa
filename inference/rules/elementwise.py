"""Elementwise operators: arithmetic, activations, comparisons, casts.

Binary and ternary operators broadcast numpy-style with symbols (``dims.broadcast``);
comparisons give bool. Small constant values (see :mod:`inference.rules._wm_common`) go
through Add/Sub/Mul/Div, Min/Max/Clip, Equal/Less/Greater/Not, Where, Cast/CastLike and
Identity, symbolic entries included where the operation is defined on dims.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from .. import dims
from ..context import SequenceInfo, TensorInfo
from ..registry import register
from . import float_values
from .float_values import SYMBOLIC_FLOAT_TYPES
from ._wm_common import (
    make_value, BOOL, MAX_VALUE_ELEMS, broadcast_shapes, check_same_type, dim_min, elementwise_symbolic, exact_div, need, nonneg, np_dtype, shape_text, tidy, type_text,
)

# ---------------------------------------------------------------- value arithmetic
def _np_div(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        if np.any(b == 0):
            return None
        q = np.floor_divide(a, b)
        fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
        return q + fix.astype(q.dtype)
    return np.divide(a, b)


def _sym_div(a, b):
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            return None
        q = abs(a) // abs(b)
        return q if (a < 0) == (b < 0) else -q
    if isinstance(b, int) and b > 0 and nonneg(a):
        return dims.floordiv(a, b)
    if a == b and a is not None:
        return 1
    if nonneg(a) and nonneg(b):  # exact monomial quotients: (N*C*H*W) / N
        return exact_div([a], [b])
    return None


_NP_BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": _np_div}
_SYM_BINARY = {"Add": dims.add, "Sub": dims.sub, "Mul": dims.mul, "Div": _sym_div}
#: the same on float values: exact rational arithmetic (``float_values``)
_SYM_FLOAT_BINARY = {"Add": float_values.add, "Sub": float_values.sub, "Mul": float_values.mul,
                     "Div": float_values.div}


def _sym_equal(a, b):
    if a == b:
        return True
    d = dims.sub(a, b)
    return (d == 0) if isinstance(d, int) else None


def _sym_less(a, b):
    d = dims.sub(a, b)
    return (d < 0) if isinstance(d, int) else None


def _sym_greater(a, b):
    d = dims.sub(a, b)
    return (d > 0) if isinstance(d, int) else None


def _float_compare(want):
    def op(a, b):
        sign = float_values.compare(a, b)
        return None if sign is None else sign in want
    return op


_NP_COMPARE = {"Equal": np.equal, "Less": np.less, "Greater": np.greater}
_SYM_COMPARE = {"Equal": _sym_equal, "Less": _sym_less, "Greater": _sym_greater}
_SYM_FLOAT_COMPARE = {"Equal": _float_compare((0,)), "Less": _float_compare((-1,)), "Greater": _float_compare((1,))}


def _binary_value(op: str, a: TensorInfo, b: TensorInfo, out_type: int, np_ops, sym_ops):
    # read b's value only when a has one: every read ties the node's memo entry to that constant
    va = a.value
    if va is None:
        return None
    vb = b.value
    if vb is None or not out_type or va.size > MAX_VALUE_ELEMS or vb.size > MAX_VALUE_ELEMS:
        return None
    try:
        if va.dtype.kind != "O" and vb.dtype.kind != "O":
            with np.errstate(all="ignore"):
                r = np_ops[op](va, vb)
            if r is None:
                return None
            return tidy(np.asarray(r), out_type)
        return tidy(elementwise_symbolic(sym_ops[op], va, vb), out_type)
    except (ValueError, TypeError, ArithmeticError):
        return None


# ---------------------------------------------------------------- shapes
def _broadcast(n, rule: str, infos) -> tuple | None:
    shapes = [i.shape for i in infos]
    if any(s is None for s in shapes):
        return None
    try:
        return broadcast_shapes(shapes)
    except ValueError as e:
        n.fail(rule, "inputs do not broadcast", subject="inputs",
               expected="numpy-broadcastable shapes", found=", ".join(shape_text(s) for s in shapes) + f" ({e})")
    return None  # pragma: no cover


# ---------------------------------------------------------------- binary arithmetic
def arithmetic(ctx, n) -> None:
    rule = n.node.op_type
    a, b = need(n, rule, "A", "B")
    t = check_same_type(n, rule, (a, b), ("A", "B"))
    shape = _broadcast(n, rule, (a, b))
    sym = _SYM_FLOAT_BINARY if t in SYMBOLIC_FLOAT_TYPES else _SYM_BINARY
    n.set_output(0, TensorInfo(t, shape, _binary_value(rule, a, b, t, _NP_BINARY, sym) if shape is not None else None))


for _op in ("Add", "Sub", "Mul", "Div"):
    register(_op, 7, 13, 14)(arithmetic)


@register("Pow", 7, 12, 13, 15)
def pow_rule(ctx, n) -> None:
    x, y = need(n, "Pow", "X", "Y")
    if n.version < 12:
        check_same_type(n, "Pow", (x, y), ("X", "Y"))
    n.set_output(0, TensorInfo(x.elem_type, _broadcast(n, "Pow", (x, y))))


# ---------------------------------------------------------------- Min / Max (variadic)
_NP_EXTREMUM = {"Min": np.minimum, "Max": np.maximum}
_SYM_EXTREMUM = {"Min": dim_min, "Max": dims.maximum}


def _float_extremum(op, pick_first_when: int):
    def extremum_of(a, b):
        ia, ib = float_values.as_integer(a), float_values.as_integer(b)
        if ia is not None and ib is not None:
            return op(ia, ib)
        sign = float_values.compare(a, b)
        return None if sign is None else (a if sign in (0, pick_first_when) else b)
    return extremum_of


_SYM_FLOAT_EXTREMUM = {"Min": _float_extremum(dim_min, -1), "Max": _float_extremum(dims.maximum, 1)}


def extremum(ctx, n) -> None:
    """Min and Max of any number of inputs; on shape values (``Min(boxes, 8)`` for a TopK's K)
    symbolic entries give ``min``/``max`` dims."""
    rule = n.node.op_type
    infos = [n.input(i) for i in range(len(n.node.input)) if n.has_input(i)]
    if not infos:
        n.fail(rule, "needs at least one input", subject="inputs", expected=">= 1 input", found="none")
    t = check_same_type(n, rule, infos)
    shape = _broadcast(n, rule, infos)
    value = infos[0].value if shape is not None and infos[0].value is not None and infos[0].value.size <= MAX_VALUE_ELEMS else None
    sym = _SYM_FLOAT_EXTREMUM if t in SYMBOLIC_FLOAT_TYPES else _SYM_EXTREMUM
    for other in infos[1:]:
        if value is None:
            break
        value = _binary_value(rule, TensorInfo(t, shape, value), other, t, _NP_EXTREMUM, sym)
    n.set_output(0, TensorInfo(t, shape, value))


register("Min", 6, 8, 12, 13)(extremum)
register("Max", 6, 8, 12, 13)(extremum)


# ---------------------------------------------------------------- comparisons
def compare(ctx, n) -> None:
    rule = n.node.op_type
    a, b = need(n, rule, "A", "B")
    check_same_type(n, rule, (a, b), ("A", "B"))
    shape = _broadcast(n, rule, (a, b))
    sym = _SYM_FLOAT_COMPARE if a.elem_type in SYMBOLIC_FLOAT_TYPES else _SYM_COMPARE
    value = _binary_value(rule, a, b, BOOL, _NP_COMPARE, sym) if shape is not None else None
    n.set_output(0, TensorInfo(BOOL, shape, value))


register("Equal", 7, 11, 13, 19)(compare)
register("Less", 7, 9, 13)(compare)
register("Greater", 7, 9, 13)(compare)


@register("Not", 1)
def not_rule(ctx, n) -> None:
    x, = need(n, "Not", "X")
    if x.elem_type and x.elem_type != BOOL:
        n.report("Not", "input must be bool", subject="input X", expected="bool", found=type_text(x.elem_type))
    value = None
    if x.value is not None and x.value.size <= MAX_VALUE_ELEMS:
        if x.value.dtype.kind == "O":
            value = tidy(elementwise_symbolic(lambda v: not v, x.value), BOOL)
        else:
            value = tidy(np.logical_not(x.value), BOOL)
    n.set_output(0, TensorInfo(BOOL, x.shape, value))


# ---------------------------------------------------------------- unary, same type and shape
def same_as_input(ctx, n) -> None:
    x, = need(n, n.node.op_type, "X")
    n.set_output(0, TensorInfo(x.elem_type, x.shape))


for _op, _versions in (
    ("Relu", (1, 6, 13, 14)), ("LeakyRelu", (1, 6, 16)), ("Sigmoid", (1, 6, 13)), ("Tanh", (1, 6, 13)),
    ("Erf", (9, 13)), ("Gelu", (20,)), ("Sqrt", (1, 6, 13)), ("Exp", (1, 6, 13)), ("Neg", (1, 6, 13)),
    ("Clip", (1, 6)),
):
    register(_op, *_versions)(same_as_input)


_ROUNDING = {"Floor": (np.floor, float_values.floor), "Ceil": (np.ceil, float_values.ceil)}


def rounding(ctx, n) -> None:
    """Floor / Ceil: the input's type and shape; a value entry by entry (exact symbolic entries
    of a float value, ``floor(W / 2)``, become dims: ``float_values``)."""
    x, = need(n, n.node.op_type, "X")
    np_op, sym_op = _ROUNDING[n.node.op_type]
    v, value = x.value, None
    if v is not None and v.size <= MAX_VALUE_ELEMS:
        if v.dtype.kind == "f":
            value = np_op(v)
        elif v.dtype.kind == "O" and x.elem_type in SYMBOLIC_FLOAT_TYPES:
            value = tidy(make_value([sym_op(e) for e in v.reshape(-1)], v.shape, x.elem_type), x.elem_type)
    n.set_output(0, TensorInfo(x.elem_type, x.shape, value))


register("Floor", 1, 6, 13)(rounding)
register("Ceil", 1, 6, 13)(rounding)


@register("Clip", 11, 12, 13)
def clip(ctx, n) -> None:
    """Type and shape of the input; an integer value (a dim that ``Shape`` read, clamped as
    exporters clamp it: tf2onnx's ``Clip(d, 0, 10**9)``) is clamped entry by entry,
    ``min(max(x, lo), hi)``, symbolic entries as dims."""
    x, = need(n, "Clip", "input")
    value = x.value
    if value is not None and (value.size > MAX_VALUE_ELEMS or value.dtype.kind not in "iuO"):
        value = None
    for i, op in ((1, "Max"), (2, "Min")):
        if value is None or not n.has_input(i):
            continue
        bound = n.input(i)
        if bound is None or bound.value is None or bound.value.size != 1:  # min and max are scalars
            value = None
            continue
        value = _binary_value(op, TensorInfo(x.elem_type, x.shape, value), bound, x.elem_type,
                              _NP_EXTREMUM, _SYM_EXTREMUM)
    if value is not None and value.shape != tuple(x.value.shape):
        value = None
    n.set_output(0, TensorInfo(x.elem_type, x.shape, value))


@register("Identity", 1, 13, 14, 16, 19, 21, 23, 24, 25)
def identity(ctx, n) -> None:
    need(n, "Identity", "input")
    info = ctx.get(n.input_name(0))
    if isinstance(info, SequenceInfo) and n.output_name(0):  # a sequence or optional passed on
        ctx.define_other(n.output_name(0), info.type_proto, info.items)
    elif info is not None:
        n.set_output(0, info)


# ---------------------------------------------------------------- Where
def _select(c, a, b):
    return a if c else b


@register("Where", 9, 16)
def where(ctx, n) -> None:
    c, x, y = need(n, "Where", "condition", "X", "Y")
    if c.elem_type and c.elem_type != BOOL:
        n.report("Where", "condition must be bool", subject="input condition", expected="bool",
                 found=type_text(c.elem_type))
    t = check_same_type(n, "Where", (x, y), ("X", "Y"))
    shape = _broadcast(n, "Where", (c, x, y))
    value = None
    if shape is not None and t and all(v.value is not None and v.value.size <= MAX_VALUE_ELEMS for v in (c, x, y)):
        try:
            if all(v.value.dtype.kind != "O" for v in (c, x, y)):
                value = tidy(np.where(c.value, x.value, y.value), t)
            else:
                value = tidy(elementwise_symbolic(_select, c.value, x.value, y.value), t)
        except (ValueError, TypeError):
            value = None
    n.set_output(0, TensorInfo(t, shape, value))


# ---------------------------------------------------------------- casts
_TYPE_CODES = frozenset(TensorProto.DataType.values())

def _cast_value(v: np.ndarray | None, source: int, to: int) -> np.ndarray | None:
    if v is None or v.size > MAX_VALUE_ELEMS:
        return None
    dt = np_dtype(to)
    if dt is None:
        return None
    if v.dtype.kind == "O":
        flat = list(v.reshape(-1))
        if source in SYMBOLIC_FLOAT_TYPES:  # exact entries: truncated toward zero to an integer type
            if dt.kind in "iu":
                flat = [float_values.trunc(x) for x in flat]
            elif to not in SYMBOLIC_FLOAT_TYPES:
                return None
            return tidy(make_value(flat, v.shape, to), to)
        if dt.kind in "iu" or (to in SYMBOLIC_FLOAT_TYPES and dt.kind == "f"):
            return tidy(v, to)  # a dim as an integer, or as a float (float_values: exact)
        if all(isinstance(x, int) for x in flat):
            return tidy(np.array([int(x) for x in flat]).reshape(v.shape), to)
        return None
    if v.dtype.kind not in "iubf":
        return None
    with np.errstate(all="ignore"):
        return tidy(v.astype(dt), to)


@register("Cast", 6, 9, 13, 19, 21, 23, 24, 25, 28)
def cast(ctx, n) -> None:
    x, = need(n, "Cast", "input")
    to = n.attr("to")
    if to is None or int(to) not in _TYPE_CODES or int(to) == 0:
        n.fail("Cast", "attribute 'to' must name an element type", subject="attribute to",
               expected="a TensorProto data type", found="none" if to is None else to)
    n.set_output(0, TensorInfo(int(to), x.shape, _cast_value(x.value, x.elem_type, int(to))))


@register("CastLike", 15, 19, 21, 23, 24, 25)
def cast_like(ctx, n) -> None:
    x, like = need(n, "CastLike", "input", "target_type")
    to = like.elem_type
    n.set_output(0, TensorInfo(to, x.shape, _cast_value(x.value, x.elem_type, to) if to else None))


# ---------------------------------------------------------------- Dropout
@register("Dropout", 1, 6, 7, 10, 12, 13, 22)
def dropout(ctx, n) -> None:
    x, = need(n, "Dropout", "data")
    n.set_output(0, TensorInfo(x.elem_type, x.shape))
    if n.output_name(1):
        mask_type = x.elem_type if n.version < 10 else BOOL
        n.set_output(1, TensorInfo(mask_type, x.shape))


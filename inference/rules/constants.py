"""Operators that make shapes and constants: Shape, Size, ConstantOfShape, Constant, Range.

They *produce* small values (see :mod:`inference.rules._wm_common` for the value convention), so
shapes computed inside the graph resolve, symbolically when the dims are symbolic.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, numpy_helper

from .. import dims
from ..dims import DimLike
from ..registry import register
from . import float_values
from .float_values import SYMBOLIC_FLOAT_TYPES
from ._wm_common import (
    INT64, MAX_VALUE_ELEMS, check_same_type, entries, make_value, max0, need, nonneg, product, shape_text, tidy,
    set_info, rank_only, clamp, scalar,
)

#: Constant nodes whose tensor has at most this many elements get their value decoded
CONST_DECODE_ELEMS = 4096

_LATEST = (21, 23, 24, 25)  # since_versions that only widened the type lists


# ---------------------------------------------------------------- Shape / Size
@register("Shape", 1, 13, 15, 19, *_LATEST)
def shape_rule(ctx, n) -> None:
    x, = need(n, "Shape", "data")
    if x.shape is None:  # a 1-D value of some length: the rank, a size of its own
        set_info(n, 0, INT64, (n.fresh_dim(0, 0),))
        return
    r = len(x.shape)
    start, end = 0, r
    if n.version >= 15:
        start = int(n.attr("start", 0))
        end = n.attr("end")
        end = r if end is None else int(end)
        start = clamp(start + r if start < 0 else start, 0, r)
        end = clamp(end + r if end < 0 else end, 0, r)
    picked = list(x.shape[start:end]) if end > start else []
    set_info(n, 0, INT64, (len(picked),), make_value(picked, (len(picked),), INT64))


@register("Size", 1, 13, 19, *_LATEST)
def size_rule(ctx, n) -> None:
    x, = need(n, "Size", "data")
    total = x.numel()
    set_info(n, 0, INT64, (), None if total is None else make_value([total], (), INT64))


# ---------------------------------------------------------------- constants
@register("ConstantOfShape", 9, 20, *_LATEST)
def constant_of_shape(ctx, n) -> None:
    shape_info, = need(n, "ConstantOfShape", "input")
    fill = n.attr("value")
    t = fill.data_type if fill is not None else TensorProto.FLOAT
    target = entries(shape_info)
    if target is None:
        k = rank_only(shape_info)
        set_info(n, 0, t, None if k is None else tuple(n.fresh_dim(0, a) for a in range(k)))
        return
    # an entry the pass cannot compute (a dim of a value of unknown rank) is a size of its own
    target = [n.fresh_dim(0, a) if d is None else d for a, d in enumerate(target)]
    for d in target:
        if isinstance(d, int) and d < 0:
            n.fail("ConstantOfShape", "dims must not be negative", subject="input input", expected=">= 0 each",
                   found=target)
    value = None
    if all(isinstance(d, int) for d in target) and product(target) <= MAX_VALUE_ELEMS:
        try:
            scalar = numpy_helper.to_array(fill).reshape(-1)[0] if fill is not None else np.float32(0)
            value = tidy(np.full(tuple(target), scalar), t)
        except Exception:  # exotic element types: shape only
            value = None
    set_info(n, 0, t, target, value)


def _decode(tensor) -> np.ndarray | None:
    count = 1
    for d in tensor.dims:
        count *= d
    if count > CONST_DECODE_ELEMS or tensor.data_location == TensorProto.EXTERNAL:
        return None
    try:
        return numpy_helper.to_array(tensor)
    except Exception:  # unsupported or malformed payload: shape and type still hold
        return None


@register("Constant", 1, 9, 11, 12, 13, 19, *_LATEST)
def constant(ctx, n) -> None:
    names = n.attr_names()
    if len(names) != 1:
        n.fail("Constant", "exactly one value attribute is required", subject="attributes",
               expected="one of value, sparse_value, value_*", found=names or "none")
    name = names[0]
    a = n.attr(name)
    if name == "value":
        set_info(n, 0, a.data_type, tuple(a.dims), _decode(a))
    elif name == "sparse_value":
        set_info(n, 0, a.values.data_type, tuple(a.dims))
    elif name == "value_int":
        set_info(n, 0, INT64, (), np.array(a, dtype=np.int64))
    elif name == "value_ints":
        set_info(n, 0, INT64, (len(a),), np.array(a, dtype=np.int64).reshape(len(a)))
    elif name == "value_float":
        set_info(n, 0, TensorProto.FLOAT, (), np.array(a, dtype=np.float32))
    elif name == "value_floats":
        set_info(n, 0, TensorProto.FLOAT, (len(a),), np.array(a, dtype=np.float32).reshape(len(a)))
    elif name == "value_string":
        set_info(n, 0, TensorProto.STRING, ())
    elif name == "value_strings":
        set_info(n, 0, TensorProto.STRING, (len(a),))
    else:
        n.fail("Constant", "unknown value attribute", subject=f"attribute {name}",
               expected="value, sparse_value or value_*", found=name)




@register("Range", 11, 27)
def range_rule(ctx, n) -> None:
    infos = need(n, "Range", "start", "limit", "delta")
    t = check_same_type(n, "Range", infos, ("start", "limit", "delta"))
    for info, name in zip(infos, ("start", "limit", "delta")):
        if info.shape is not None and len(info.shape) > 1:
            n.fail("Range", f"{name} must be a scalar", subject=f"input {name}", expected="rank 0",
                   found=shape_text(info.shape))
    start, limit, delta = (scalar(i) for i in infos)
    length: DimLike = None
    value = None
    if delta == 0:
        n.fail("Range", "delta cannot be 0", subject="input delta", expected="non-zero", found=0)
    if all(isinstance(v, (int, float)) for v in (start, limit, delta)):
        span = (limit - start) / delta
        if not math.isfinite(span):
            n.fail("Range", "start, limit and delta must be finite", subject="inputs", expected="finite values",
                   found=f"start={start}, limit={limit}, delta={delta}")
        length = max(int(math.ceil(span)), 0)
        if length <= MAX_VALUE_ELEMS:
            value = tidy(np.arange(length) * np.array(delta) + np.array(start), t) if t else None
    elif t in SYMBOLIC_FLOAT_TYPES and all(float_values.parts(v) is not None for v in (start, limit, delta)):
        # exact float bounds made from dims (torch's arange(w, dtype=float): Range(0.0, Cast<float>(w), 1.0))
        length = float_values.ceil(float_values.div(float_values.sub(limit, start), delta))
        length = max0(length) if length is not None else None
        if length is not None and not nonneg(length):
            length = None
    elif isinstance(delta, int) and start is not None and limit is not None and not isinstance(start, float) \
            and not isinstance(limit, float):
        if delta > 0:
            length = max0(dims.ceildiv(dims.sub(limit, start), delta))
        else:
            length = max0(dims.ceildiv(dims.sub(start, limit), -delta))
        if length is not None and not nonneg(length):
            length = None
    set_info(n, 0, t, (length,), value)

"""Operators whose output size depends on the data: NonZero, Unique, Compress, NonMaxSuppression.

Where the input's value is known the size is counted; otherwise the dim is a fresh symbol
named after the output (``NodeContext.fresh_dim``: ``keep_dim1`` for NonZero output ``keep``),
so two such dims are never taken for the same one and the user can tell where each comes from.
"""

from __future__ import annotations

import numpy as np

from ..context import TensorInfo
from ..registry import register
from ._wm_common import INT64, need, norm_axis, numeric, product


@register("NonZero", 9, 13)
def nonzero(ctx, n) -> None:
    x, = need(n, "NonZero", "X")
    if x.shape is None:
        n.set_output(0, TensorInfo(INT64, None))
        return
    known = numeric(x)
    count = int(np.count_nonzero(known)) if known is not None else n.fresh_dim(0, 1)
    n.set_output(0, TensorInfo(INT64, (len(x.shape), count)))


@register("Unique", 11)
def unique(ctx, n) -> None:
    x, = need(n, "Unique", "X")
    has_axis = n.has_attr("axis")
    if x.shape is None:
        for i in range(4):
            n.set_output(i, TensorInfo(x.elem_type if i == 0 else INT64, None))
        return
    if has_axis:
        axis = norm_axis(n, "Unique", int(n.attr("axis")), len(x.shape))
        count = n.fresh_dim(0, axis)
        y = x.shape[:axis] + (count,) + x.shape[axis + 1:]
        inverse = (x.shape[axis],)
    else:
        count = n.fresh_dim(0, 0)
        y, inverse = (count,), (product(x.shape),)
    n.set_output(0, TensorInfo(x.elem_type, y))
    n.set_output(1, TensorInfo(INT64, (count,)))
    n.set_output(2, TensorInfo(INT64, inverse))
    n.set_output(3, TensorInfo(INT64, (count,)))


@register("Compress", 9, 11)
def compress(ctx, n) -> None:
    x, cond = need(n, "Compress", "input", "condition")
    if x.shape is None:
        n.set_output(0, TensorInfo(x.elem_type, None))
        return
    known = numeric(cond)
    if n.has_attr("axis"):
        axis = norm_axis(n, "Compress", int(n.attr("axis")), len(x.shape))
        count = int(np.count_nonzero(known)) if known is not None else n.fresh_dim(0, axis)
        n.set_output(0, TensorInfo(x.elem_type, x.shape[:axis] + (count,) + x.shape[axis + 1:]))
    else:
        count = int(np.count_nonzero(known)) if known is not None else n.fresh_dim(0, 0)
        n.set_output(0, TensorInfo(x.elem_type, (count,)))


@register("NonMaxSuppression", 10, 11)
def non_max_suppression(ctx, n) -> None:
    need(n, "NonMaxSuppression", "boxes", "scores")
    n.set_output(0, TensorInfo(INT64, (n.fresh_dim(0, 0), 3)))

"""Output sizes of data-dependent host nodes, computed from their actual inputs before
``onnx.reference`` allocates them (the plan-time check in model_check.py can only use shapes
inference knew). One function per op whose output size follows from input *values*; every other
op's outputs are bounded by its inputs' (already allocated) sizes or were checked at plan time."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np


def _ints(v: Any) -> list[int]:
    return [int(x) for x in np.asarray(v).reshape(-1)]


def _range(ins: Sequence[Any], attrs: Mapping[str, Any]) -> list[int]:
    start, limit, delta = (float(np.asarray(v).reshape(-1)[0]) for v in ins[:3])
    if delta == 0 or not all(math.isfinite(x) for x in (start, limit, delta)):
        return [0]
    return [max(math.ceil((limit - start) / delta), 0)]


def _constant_of_shape(ins: Sequence[Any], attrs: Mapping[str, Any]) -> list[int]:
    return _ints(ins[0]) if ins and ins[0] is not None else []


def _tile(ins: Sequence[Any], attrs: Mapping[str, Any]) -> list[int]:
    x, reps = np.asarray(ins[0]), _ints(ins[1])
    return [d * r for d, r in zip(x.shape, reps)]


def _expand(ins: Sequence[Any], attrs: Mapping[str, Any]) -> list[int]:
    x, shape = np.asarray(ins[0]), _ints(ins[1])
    a, b = list(x.shape), shape
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + a, [1] * (n - len(b)) + b
    return [max(p, q) for p, q in zip(a, b)]  # incompatible dims: onnx.reference refuses them


def _resize(ins: Sequence[Any], attrs: Mapping[str, Any]) -> list[int]:
    x = np.asarray(ins[0])
    sizes = ins[3] if len(ins) > 3 else None
    if sizes is not None and np.asarray(sizes).size:
        return _ints(sizes)
    scales = ins[2] if len(ins) > 2 else (ins[1] if len(ins) == 2 else None)  # Resize-10 / Upsample: (X, scales)
    if scales is None or not np.asarray(scales).size:
        return list(x.shape)
    s = [float(v) for v in np.asarray(scales).reshape(-1)]
    return [int(math.floor(d * f)) if math.isfinite(f) else 0 for d, f in zip(x.shape, s)]


def _pad(ins: Sequence[Any], attrs: Mapping[str, Any]) -> list[int]:
    x = np.asarray(ins[0])
    pads = _ints(ins[1]) if len(ins) > 1 and ins[1] is not None else list(attrs.get("pads", []))
    r = x.ndim
    if len(pads) != 2 * r:
        return list(x.shape)  # with axes: at most the padded axes grow; onnx.reference checks the rest
    return [d + pads[i] + pads[i + r] for i, d in enumerate(x.shape)]


def _one_hot(ins: Sequence[Any], attrs: Mapping[str, Any]) -> list[int]:
    return list(np.asarray(ins[0]).shape) + [max(_ints(ins[1])[0], 0)]


#: op -> output shape from the node's input values (None where an input is absent)
OUTPUT_SHAPE: dict[str, Callable[[Sequence[Any], Mapping[str, Any]], list[int]]] = {
    "Range": _range, "ConstantOfShape": _constant_of_shape, "Tile": _tile, "Expand": _expand,
    "Resize": _resize, "Upsample": _resize, "Pad": _pad, "OneHot": _one_hot,
}


def check_host_node(budget, label: str, op: str, inputs: Sequence[Any], attrs: Mapping[str, Any],
                    itemsize_bits: int) -> None:
    """``BudgetError`` before a data-dependent host node allocates beyond the budget."""
    fn = OUTPUT_SHAPE.get(op)
    if fn is None:
        return
    try:
        shape = fn(inputs, attrs)
    except (IndexError, TypeError, ValueError):
        return  # malformed inputs: onnx.reference reports them
    budget.check_array(shape, max(8, itemsize_bits), f"node {label!r} ({op}) output computed from its input values")

"""Helpers shared by the whole-model rule families (elementwise, nn, tensor_ops, com_microsoft).

Constant values
---------------
Rules propagate small constants through ``TensorInfo.value`` so that shapes computed inside
the graph (``Shape -> Gather -> Concat -> Reshape``) resolve. A value is a numpy array whose
shape equals the tensor's shape, in one of two forms:

* a numeric array of the element type's numpy dtype (``int64``, ``float32``, ``bool`` ...):
  every entry known;
* an ``object`` array (integer and bool tensors only) whose entries are ``int`` (or ``bool``),
  symbolic :class:`inference.dims.Dim` or ``None`` (that entry unknown): the form ``Shape``
  gives for an input with symbolic or unknown dims;
* an ``object`` array of a ``float``/``double`` tensor whose entries are exact numbers made
  from dims (``Cast<float>(Shape(x)[3])``): ints, ``Dim``, :class:`float_values.Ratio`,
  floats or ``None`` (see :mod:`inference.rules.float_values` for what is exact).

Rules keep computed values only while they are small (:data:`MAX_VALUE_ELEMS` entries); an
object array is turned back into a numeric one as soon as every entry is a known int.
Readers that need numbers call :func:`numeric` (``None`` for the symbolic form).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import numpy as np
from onnx import TensorProto, helper

from .. import dims
from ..context import TensorInfo
from ..dims import Dim, DimLike
from . import float_values
from .float_values import SYMBOLIC_FLOAT_TYPES

#: largest value (in elements) a rule computes and keeps
MAX_VALUE_ELEMS = 64
#: a slice bound at or beyond this is "to the end" for a symbolic dim
BIG = 2**31 - 1

INT64 = TensorProto.INT64
BOOL = TensorProto.BOOL
FLOAT = TensorProto.FLOAT

_INT_TYPES = frozenset({TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
                        TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64})
#: types whose values rules compute with numpy (sub-byte and float8 types are left alone)
_NUMPY_TYPES: dict[int, np.dtype] = {
    t: np.dtype(helper.tensor_dtype_to_np_dtype(t))
    for t in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BOOL, *_INT_TYPES)
}


def is_int_type(elem_type: int) -> bool:
    return elem_type in _INT_TYPES


def np_dtype(elem_type: int) -> np.dtype | None:
    """numpy dtype rules compute values of ``elem_type`` in (None: values not propagated)."""
    return _NUMPY_TYPES.get(elem_type)


def type_text(elem_type: int) -> str:
    if not elem_type:
        return "unknown"
    try:
        return TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"<type {elem_type}>"


def shape_text(shape: Sequence[DimLike] | None) -> str:
    if shape is None:
        return "?"
    return "[" + ", ".join(dims.to_text(d) for d in shape) + "]"


# ---------------------------------------------------------------- values
def entries(info: TensorInfo | None) -> list | None:
    """The flat entries of a small integer/bool value: ints, ``Dim`` or ``None``; else None."""
    if info is None:
        return None
    v = info.value
    if v is None:
        return None
    kind = v.dtype.kind
    if kind == "O":
        return None if info.elem_type in SYMBOLIC_FLOAT_TYPES else list(v.reshape(-1))
    if kind in "iub":
        return [int(x) for x in v.reshape(-1)]
    return None


def numeric(info: TensorInfo | None) -> np.ndarray | None:
    """The value as a numeric array (None when absent or symbolic)."""
    if info is None or info.value is None or info.value.dtype.kind == "O":
        return None
    return info.value


def ints_of(info: TensorInfo | None) -> list[int] | None:
    """All-known integer entries of a value (None when absent, symbolic or partly unknown)."""
    e = entries(info)
    if e is None or not all(isinstance(x, int) for x in e):
        return None
    return e


def make_value(flat: Sequence, shape: Sequence[int], elem_type: int) -> np.ndarray | None:
    """A value from flat entries (ints/bools, ``Dim``, ``None``); None when too big."""
    if len(flat) > MAX_VALUE_ELEMS:
        return None
    dt = _NUMPY_TYPES.get(elem_type)
    if dt is None:
        return None
    symbolic = False
    for x in flat:
        if not isinstance(x, int):  # bool is an int; numpy scalars are not
            if isinstance(x, (np.integer, np.bool_)):
                continue
            symbolic = True
            break
    if not symbolic:
        return np.array(flat, dtype=dt).reshape(tuple(shape))
    if dt.kind not in "iub":
        return _float_object(flat, shape, elem_type)
    out = np.empty(len(flat), dtype=object)
    out[:] = [int(x) if isinstance(x, (np.integer, np.bool_)) else x for x in flat]
    return out.reshape(tuple(shape))


def tidy(value: np.ndarray | None, elem_type: int) -> np.ndarray | None:
    """Keep a computed value only when small; object arrays of known ints become numeric."""
    if value is None or value.size > MAX_VALUE_ELEMS:
        return None
    dt = _NUMPY_TYPES.get(elem_type)
    if dt is None:
        return None
    if value.dtype.kind == "O":
        flat = list(value.reshape(-1))
        if all(isinstance(x, (int, np.integer)) for x in flat):
            return np.array([int(x) for x in flat], dtype=dt).reshape(value.shape)
        if dt.kind not in "iub":
            return _float_object(flat, value.shape, elem_type)
        return value
    if value.dtype != dt:
        with np.errstate(all="ignore"):
            value = value.astype(dt)
    return value


def _float_object(flat: list, shape, elem_type: int) -> np.ndarray | None:
    """A float value of exact symbolic entries (None where the type does not carry them, or an
    entry is not one): all-number entries become a numeric array."""
    if elem_type not in SYMBOLIC_FLOAT_TYPES:
        return None
    flat = [x.item() if isinstance(x, (np.integer, np.floating)) else x for x in flat]
    if not all(float_values.is_entry(x) for x in flat):
        return None
    if all(isinstance(x, (int, float)) for x in flat):
        return np.array(flat, dtype=_NUMPY_TYPES[elem_type]).reshape(tuple(shape))
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(tuple(shape))


def as_object(value: np.ndarray) -> np.ndarray:
    return value if value.dtype.kind == "O" else value.astype(object)


def elementwise_symbolic(fn: Callable[..., DimLike], *values: np.ndarray) -> np.ndarray | None:
    """Apply ``fn`` entry by entry on broadcast object arrays (``None`` entries propagate)."""
    arrays = [as_object(v) for v in values]
    shape = arrays[0].shape
    if any(a.shape != shape for a in arrays):  # (numpy's broadcast_arrays costs ~10 µs even when shapes agree)
        arrays = np.broadcast_arrays(*arrays)
        shape = arrays[0].shape
    flats = [a.reshape(-1) for a in arrays]
    out = np.empty(len(flats[0]), dtype=object)
    for i in range(len(out)):
        args = [f[i] for f in flats]
        out[i] = None if any(a is None for a in args) else fn(*args)
    return out.reshape(shape)


# ---------------------------------------------------------------- dims
def dim_min(a: DimLike, b: DimLike) -> DimLike:
    return dims.minimum(a, b)


#: True when ``d`` is >= 0 for every binding of its symbols (symbols are dims, >= 0)
nonneg = dims.nonneg


def max0(d: DimLike) -> DimLike:
    """max(d, 0), folded when ``d`` is provably non-negative."""
    return dims.maximum(d, 0)


def product(ds: Iterable[DimLike]) -> DimLike:
    out: DimLike = 1
    for d in ds:
        out = dims.mul(out, d)
    return out


def exact_div(num: Sequence[DimLike], den: Sequence[DimLike]) -> DimLike:
    """product(num) / product(den) for a division known to be exact (Reshape's -1).

    Equal factors cancel first (so ``[N, C, H, W] / [N]`` is ``C*H*W`` with symbols);
    what remains is divided when the denominator is a known int or a single monomial.
    """
    num = list(num)
    rest_den: list[DimLike] = []
    for d in den:
        if isinstance(d, int):
            rest_den.append(d)
            continue
        if d is not None and d in num:
            num.remove(d)
        else:
            rest_den.append(d)
    if any(d is None for d in rest_den):
        return None
    n = product(num)
    k = product(rest_den)
    if n is None or k is None:
        return None
    if isinstance(k, int):
        if k <= 0:
            return None
        if isinstance(n, int):
            return n // k if n % k == 0 else None
        return dims.floordiv(n, k)
    # a single monomial denominator divides term by term
    if len(k.terms) == 1 and k.terms[0][1] > 0 and isinstance(n, Dim):
        kmono, kcoeff = k.terms[0]
        out: DimLike = 0
        for mono, coeff in n.terms:
            rest = list(mono)
            for atom in kmono:
                if atom in rest:
                    rest.remove(atom)
                else:
                    return None
            if coeff % kcoeff:
                return None
            term: DimLike = coeff // kcoeff
            if rest:
                term = dims.mul(term, Dim(((tuple(rest), 1),)))
            out = dims.add(out, term)
        return out
    return None


def broadcast_shapes(shapes: Sequence[Sequence[DimLike]]) -> tuple:
    """numpy broadcasting of several shapes (raises ValueError on two different known dims)."""
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        d: DimLike = 1
        for s in shapes:
            k = len(s) - rank + i
            if k >= 0:
                d = dims.broadcast(d, s[k])
        out.append(d)
    return tuple(out)


def merge_dim(a: DimLike, b: DimLike) -> DimLike:
    """Two dims that must be equal: the more informative one (known beats symbolic)."""
    if a is None:
        return b
    if b is None or a == b:
        return a
    if isinstance(a, int):
        return a
    if isinstance(b, int):
        return b
    return a


def norm_axis(n, rule: str, axis: int, rank: int, what: str = "attribute axis") -> int:
    if not -rank <= axis < rank:
        n.fail(rule, "axis out of range", subject=what, expected=f"an axis in [{-rank}, {rank - 1}]", found=axis)
    return axis + rank if axis < 0 else axis


def norm_axes(n, rule: str, axes: Sequence[int], rank: int, what: str = "axes") -> list[int]:
    out = [norm_axis(n, rule, int(a), rank, what) for a in axes]
    if len(set(out)) != len(out):
        n.fail(rule, "axes repeat", subject=what, expected="distinct axes", found=list(axes))
    return out


def shape_problem(n, rule: str, problem: Any) -> None:
    """Turn a ``shape_math.ShapeProblem`` into this node's failure."""
    n.fail(rule, problem.message, subject=problem.subject, expected=problem.expected, found=problem.found)


def first_type(*infos: TensorInfo | None) -> int:
    for i in infos:
        if i is not None and i.elem_type:
            return i.elem_type
    return 0


def check_same_type(n, rule: str, infos: Sequence[TensorInfo | None], names: Sequence[str] | None = None) -> int:
    """The common element type of inputs that must agree (reports a mismatch).

    ``names`` name the inputs in messages (default ``#0``, ``#1`` ...).
    """
    t = 0
    first = 0
    for i, info in enumerate(infos):
        if info is None:
            continue
        et = info.elem_type
        if not et:
            continue
        if not t:
            t, first = et, i
        elif et != t:
            name = names[i] if names is not None else f"#{i}"
            first_name = names[first] if names is not None else f"#{first}"
            n.report(rule, f"input {name} must have the element type of {first_name}", subject=f"input {name}",
                     expected=type_text(t), found=type_text(et))
    return t


def need(n, rule: str, *names: str, at: Sequence[int] | None = None) -> list[TensorInfo]:
    """Infos of required inputs ``names`` (at positions 0, 1 ... or ``at``).

    A required input that is absent (or given the empty name) stops the rule with an error
    naming it.
    """
    positions = range(len(names)) if at is None else at
    out = []
    for i, name in zip(positions, names):
        info = n.input(i)
        if info is None:
            n.fail(rule, f"required input {name} (#{i}) is missing", subject=f"input {name}",
                   expected=f"a tensor at input #{i}", found="no input")
        out.append(info)
    return out


def set_info(n, i: int, elem_type: int, shape, value=None) -> None:
    """Output ``i`` of ``n`` typed ``elem_type`` with ``shape`` (None: unknown) and ``value``."""
    n.set_output(i, TensorInfo(elem_type, None if shape is None else tuple(shape), value))


def rank_only(shape_info: TensorInfo | None) -> int | None:
    """Length of a 1-D tensor whose shape is known (e.g. an unknown Reshape target)."""
    if shape_info is None or shape_info.shape is None or len(shape_info.shape) != 1:
        return None
    d = shape_info.shape[0]
    return d if isinstance(d, int) else None


def clamp(v: int, lo: int, hi: int) -> int:
    return lo if v < lo else hi if v > hi else v


def scalar(info: TensorInfo):
    """The single entry of a 1-element value: int/float, Dim, or None."""
    v = info.value
    if v is None or v.size != 1:
        return None
    x = v.reshape(-1)[0]
    if v.dtype.kind == "O":
        return x
    return int(x) if v.dtype.kind in "iu" else float(x)


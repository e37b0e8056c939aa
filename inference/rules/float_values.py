"""Exact values of float tensors computed from dims: ``Cast<float>(Gather(Shape(x), 3))``.

Exporters turn a dim into a float to build grids and scales (torch's ``arange(w, dtype=float)``
is ``Range(0.0, Cast<float>(w), 1.0)``; ``int(w / 32)`` is ``Cast<int64>(Div(Cast<float>(w),
32.0))``). A float value may carry the same symbolic entries an integer value does, on one
condition: each entry is an exact number. An entry of a float value's object array is

- an ``int`` or a ``Dim`` (an exact integer),
- a :class:`Ratio` ``num / den`` of an integer (or ``Dim``) by an int ``den >= 2`` whose
  numerator it does not divide (``W / 2``, ``W + 0.5`` as ``(2*W + 1) / 2``),
- a Python ``float`` (a known entry beside symbolic ones), or ``None`` (unknown).

What is chosen, and why it is exact: only ``float`` and ``double`` values carry symbolic
entries (``float16`` represents integers exactly only to 2048 and ``bfloat16`` to 256, less
than image sizes and sequence lengths: a dim cast to them loses its value). float32 represents
every integer up to 2**24 and every ``1/den`` step below ``2**24 / den``, and divisions round
correctly, so ``floor``, ``ceil`` and truncation of these entries are what a runtime computes
while the dims stay below 2**24 / den; a ``den`` above :data:`MAX_DEN` is not carried. The
pass cannot prove a symbol's bound from the model, so this is the one assumption it makes:
dims that reach a float cast are below 2**24 (16.7 million), as image sizes, sequence lengths
and grid sizes are. A float constant joins the arithmetic only when it is a ratio of small
ints (``0.5``, ``32.0``); ``0.1`` is not, and the result is unknown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from onnx import TensorProto

from .. import dims
from ..dims import Dim

#: float types whose values carry symbolic entries (see the module text)
SYMBOLIC_FLOAT_TYPES = frozenset((TensorProto.FLOAT, TensorProto.DOUBLE))
#: the largest denominator a carried ratio may have
MAX_DEN = 1 << 10


@dataclass(frozen=True)
class Ratio:
    """``num / den`` exactly: ``den >= 2`` and ``num`` (an int or ``Dim``) not a multiple of it."""

    num: int | Dim
    den: int

    def __str__(self) -> str:
        return f"({dims.to_text(self.num)}) / {self.den}"


def _content(d: int | Dim) -> int:
    """gcd of every coefficient of ``d`` (its constant included)."""
    if isinstance(d, int):
        return abs(d)
    g = 0
    for _, c in d.terms:
        g = math.gcd(g, c)
    return g


def _divide(d: int | Dim, k: int) -> int | Dim:
    """``d / k`` for a ``k`` that divides every coefficient."""
    if isinstance(d, int):
        return d // k
    return dims.floordiv(d, k)


def make(num, den: int):
    """The entry ``num / den`` (``den > 0``) in lowest terms: an int or ``Dim`` when exact,
    a float when ``num`` is a known int, else a :class:`Ratio`; None when ``den`` is too big."""
    if num is None:
        return None
    if isinstance(num, int):
        f = Fraction(num, den)
        return f.numerator if f.denominator == 1 else float(f)
    g = math.gcd(_content(num), den)
    if g > 1:
        num, den = _divide(num, g), den // g
    if den == 1:
        return num
    if den > MAX_DEN:
        return None
    return Ratio(num, den)


def parts(x) -> tuple | None:
    """``(num, den)`` of an entry: a ``Dim``, int, :class:`Ratio` or float that is a ratio of
    small ints; None when unknown or not exactly such a ratio."""
    if x is None:
        return None
    if isinstance(x, Ratio):
        return x.num, x.den
    if isinstance(x, (int, Dim)):
        return int(x) if isinstance(x, int) else x, 1
    if isinstance(x, float):
        if not math.isfinite(x):
            return None
        f = Fraction(x)
        if f.denominator > MAX_DEN:
            return None
        return f.numerator, f.denominator
    return None


def add(a, b):
    pa, pb = parts(a), parts(b)
    if pa is None or pb is None:
        return None
    return make(dims.add(dims.mul(pa[0], pb[1]), dims.mul(pb[0], pa[1])), pa[1] * pb[1])


def sub(a, b):
    pb = parts(b)
    return None if pb is None else add(a, make(dims.neg(pb[0]), pb[1]))


def mul(a, b):
    pa, pb = parts(a), parts(b)
    if pa is None or pb is None:
        return None
    return make(dims.mul(pa[0], pb[0]), pa[1] * pb[1])


def div(a, b):
    """``a / b`` for a known non-zero ``b`` (a symbolic divisor: None)."""
    pa, pb = parts(a), parts(b)
    if pa is None or pb is None or not isinstance(pb[0], int) or pb[0] == 0:
        return None
    sign = -1 if pb[0] < 0 else 1
    return make(dims.mul(pa[0], pb[1] * sign), pa[1] * abs(pb[0]))


def floor(x):
    if isinstance(x, float):
        return math.floor(x) if math.isfinite(x) else None
    p = parts(x)
    return None if p is None else dims.floordiv(p[0], p[1])


def ceil(x):
    if isinstance(x, float):
        return math.ceil(x) if math.isfinite(x) else None
    p = parts(x)
    return None if p is None else dims.ceildiv(p[0], p[1])


def trunc(x):
    """Rounding toward zero (a float -> integer ``Cast``): floor of a non-negative entry."""
    if isinstance(x, float):
        return int(x) if math.isfinite(x) else None
    p = parts(x)
    if p is None:
        return None
    if isinstance(p[0], int):
        return int(p[0] / p[1])
    return dims.floordiv(p[0], p[1]) if dims.nonneg(p[0]) else None


def as_integer(x):
    """The entry as an int or ``Dim`` when it is an exact integer (``3.0`` -> 3), else None."""
    p = parts(x)
    return p[0] if p is not None and p[1] == 1 else None


def compare(a, b) -> int | None:
    """The sign of ``a - b`` where it is the same for every binding, else None."""
    d = sub(a, b)
    if isinstance(d, (int, float)) and not isinstance(d, bool):
        return (d > 0) - (d < 0)
    return None


def is_entry(x) -> bool:
    """Whether ``x`` may be an entry of a float value's object array."""
    return x is None or isinstance(x, (int, float, Dim, Ratio))

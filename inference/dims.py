"""Symbolic dimensions.

A dimension is a Python ``int`` (known), a :class:`Dim` expression over named symbols, or
``None`` (unknown, unnamed). A ``Dim`` is a polynomial with integer coefficients whose atoms
are symbols (``N``), floors of a polynomial divided by a positive int
(``floor((H + 1) / 2)``) and maxima of polynomials; ``min(a, b)`` is ``-max(-a, -b)`` and
``ceil(a / k)`` is ``floor((a + k - 1) / k)``. The form is canonical, so equal expressions
compare and hash equal; anything that folds to a constant becomes an ``int``. Dims are written
back to ONNX as ``dim_value`` (ints) or ``dim_param`` (``to_text``).

Simplification
--------------
Every symbol is a dim, so the algebra simplifies under one fact: **each symbol lies in
0 .. DIM_MAX** (an ONNX dim is a non-negative int64). :func:`nonneg` proves ``d >= 0`` from it
(a sufficient test, never a guess: it eliminates max and floor atoms one at a time, exactly for
max, by the bounds ``(n - k + 1) / k <= floor(n / k) <= n / k`` with integer rounding for floor,
and bounds what is left by its symbols' range), and the constructors use it:

* ``maximum`` flattens nested maxima (``max(a, max(b, c))``, and ``m + max(b, c)`` as
  ``max(m + b, m + c)``), drops every argument another one provably bounds
  (``max(x, c) = x`` when ``x >= c``: ``max(N, 0) = N``, ``max(min(N, K), N) = N``,
  ``max(N + 1, N) = N + 1``) and takes out a part every argument shares
  (``max(N + 1, H + 1) = max(H, N) + 1``);
* ``floordiv`` divides out what divides evenly (``floor((k*x + r) / k) = x + floor(r / k)``),
  reduces by a common factor of the divisor and the symbolic coefficients
  (``floor((2*N + 3) / 4) = floor((N + 1) / 2)``, so ``ceil(ceil(x / a) / b) = ceil(x / (a*b))``),
  merges nested floors (``floor((floor(a / b) + c) / k) = floor((a + b*c) / (b*k))``) and
  folds to 0 a numerator provably in ``0 .. k - 1``.

What is not assumed: any bound on a dim below int64's. tf2onnx writes slices "to the end" with
an end of 10**9, and ONNX clamps it, so such an axis is ``min(N, 1000000000)``: equal to ``N``
only for ``N <= 10**9``, which nothing in a model guarantees, so it stays (and reads as
``min``); ``min(N, 2**63 - 1)`` is ``N``. (The Slice rule's own ``BIG`` threshold, 2**31 - 1,
treats an end at or beyond it as "to the end" of a symbolic axis; see
``inference/rules/_wm_common.py``.) Where the model itself brings the symbol back, e.g.
broadcasting that axis with ``N``, ``max(min(N, 10**9), N)`` is ``N``, for every ``N``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from math import gcd
from typing import Union

from onnx import TensorShapeProto

from onnx_quant.dim_text import is_anonymous

# A monomial is a sorted tuple of atoms (repeats are powers); () is the constant term.
_Monomial = tuple
_Terms = tuple  # sorted tuple of (monomial, coeff), coeff != 0


@dataclass(frozen=True, order=True)
class _Sym:
    name: str

    def text(self) -> str:
        return self.name


@dataclass(frozen=True, order=True)
class _Floor:
    num: "Dim"
    den: int

    @cached_property
    def _text(self) -> str:  # sort keys ask for it over and over
        num = self.num.text()
        if len(self.num.terms) == 1:  # one term needs no parentheses: floor(W / 2), floor(2*N / 3)
            return f"floor({num} / {self.den})"
        return f"floor(({num}) / {self.den})"

    def text(self) -> str:
        return self._text


@dataclass(frozen=True, order=True)
class _Max:
    args: tuple  # of Dim, sorted, at least two

    @cached_property
    def _text(self) -> str:
        return "max(" + ", ".join(a.text() for a in self.args) + ")"

    def text(self) -> str:
        return self._text

    @cached_property
    def reads_as_min(self) -> bool:
        """Whether ``-max(...)`` reads better as ``min(...)`` of the negated arguments: when most
        arguments are negative (``-max(-1000000000, -N)`` is ``min(1000000000, N)``)."""
        return 2 * sum(a.text().startswith("-") for a in self.args) > len(self.args)

    @cached_property
    def min_text(self) -> str:
        """The text of ``-max(args)`` as ``min(-args)``."""
        return "min(" + ", ".join(sorted(to_text(neg(_plain(a))) for a in self.args)) + ")"


def _atom_key(atom) -> tuple:
    return (type(atom).__name__, atom.text())


@dataclass(frozen=True)
class Dim:
    """A symbolic dimension in canonical polynomial form (never a plain constant)."""

    terms: _Terms

    @staticmethod
    def symbol(name: str) -> "Dim":
        if not name or not isinstance(name, str):
            raise ValueError(f"a symbol needs a non-empty name, got {name!r}")
        return Dim((((_Sym(name),), 1),))

    def __hash__(self) -> int:
        # the value a frozen dataclass computes, hash((terms,)), but once per Dim: hashing the
        # nested terms costs microseconds, and memo keys, value keys and the rules' dicts and
        # sets hash the same dims over and over
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash((self.terms,))
        return h

    def __lt__(self, other: "Dim") -> bool:  # for sorting max() args canonically
        return self.text() < other.text()

    @cached_property
    def _text(self) -> str:  # canonical ordering sorts by text: compute it once per Dim
        return _terms_text(self.terms)

    def text(self) -> str:
        return self._text

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"Dim({self.text()!r})"

    @cached_property
    def symbols(self) -> frozenset[str]:
        out: set[str] = set()
        for mono, _ in self.terms:
            for atom in mono:
                if isinstance(atom, _Sym):
                    out.add(atom.name)
                elif isinstance(atom, _Floor):
                    out |= atom.num.symbols
                else:
                    for a in atom.args:
                        out |= a.symbols
        return frozenset(out)


DimLike = Union[int, Dim, None]


# ---------------------------------------------------------------- polynomial algebra
def _as_terms(d: int | Dim) -> dict:
    if isinstance(d, Dim):
        return dict(d.terms)
    return {(): int(d)} if d else {}


def _make(terms: dict) -> int | Dim:
    clean = {m: c for m, c in terms.items() if c != 0}
    if not clean:
        return 0
    if set(clean) == {()}:
        return clean[()]
    return Dim(tuple(sorted(clean.items(), key=lambda mc: _mono_key(mc[0]))))


def _mono_key(mono: _Monomial) -> tuple:
    # constant term last so text reads "H + 1"
    return (len(mono) == 0, tuple(_atom_key(a) for a in mono))


def _mul_terms(a: dict, b: dict) -> dict:
    out: dict = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            mono = tuple(sorted(ma + mb, key=_atom_key))
            out[mono] = out.get(mono, 0) + ca * cb
    return out


def add(a: DimLike, b: DimLike) -> DimLike:
    if a is None or b is None:
        return None
    if isinstance(a, int):
        if isinstance(b, int):
            return a + b
        if b.terms[0][0]:  # Dim + int (the common case): only the constant term changes
            return _add_constant(b, a)
    elif isinstance(b, int) and a.terms[0][0]:
        return _add_constant(a, b)
    ta, tb = _as_terms(a), _as_terms(b)
    for m, c in tb.items():
        ta[m] = ta.get(m, 0) + c
    return _make(ta)


def _add_constant(d: Dim, k: int) -> Dim:
    """``d + k`` for a Dim with a non-constant term: the canonical order keeps the constant
    term last (see ``_mono_key``), so only that term changes and nothing is sorted again."""
    k = int(k)  # a bool is an int: keep coefficients plain ints
    if not k:
        return d
    terms = d.terms
    if terms[-1][0]:
        return Dim(terms + (((), k),))
    c = terms[-1][1] + k
    return Dim(terms[:-1] + (((), c),) if c else terms[:-1])


def _scale(d: Dim, k: int) -> DimLike:
    """``d * k`` for a Dim with a non-constant term and an int ``k``: the monomials and their
    canonical order stay, only the coefficients scale."""
    k = int(k)
    if not k:
        return 0
    if k == 1:
        return d
    return Dim(tuple((m, c * k) for m, c in d.terms))


def neg(a: DimLike) -> DimLike:
    return mul(a, -1)


def sub(a: DimLike, b: DimLike) -> DimLike:
    return add(a, neg(b))


def mul(a: DimLike, b: DimLike) -> DimLike:
    if a is None or b is None:
        return None
    if isinstance(a, int):
        if isinstance(b, int):
            return a * b
        if b.terms[0][0]:
            return _scale(b, a)
    elif isinstance(b, int) and a.terms[0][0]:
        return _scale(a, b)
    return _make(_mul_terms(_as_terms(a), _as_terms(b)))


def floordiv(a: DimLike, k: DimLike) -> DimLike:
    """floor(a / k) for a positive int k (a symbolic divisor gives None)."""
    if a is None or k is None or not isinstance(k, int):
        return None
    if k <= 0:
        raise ValueError(f"floordiv by a non-positive divisor {k}")
    if isinstance(a, int):
        return a // k
    if k == 1:
        return a
    return _floordiv(a, k)


@lru_cache(maxsize=8192)
def _floordiv(a: Dim, k: int) -> DimLike:
    # floor((k*q + r) / k) = q + floor(r / k) for an integer-valued q: what divides evenly comes
    # out, and the floor keeps a numerator whose coefficients are in 1 .. k - 1, or in
    # -(k - 1) .. -1 for a term with a max (a min: floor(min(N, 1) / 2) stays whole, and is 0)
    quotient: dict = {}
    remainder: dict = {}
    for m, c in a.terms:
        if c < 0 and any(type(atom) is _Max for atom in m):
            q, r = divmod(c, k)
            if r:
                q, r = q + 1, r - k
        else:
            q, r = divmod(c, k)
        if q:
            quotient[m] = q
        if r:
            remainder[m] = r
    rest = _make(remainder)
    if isinstance(rest, int):
        return add(_make(quotient), rest // k)
    return add(_make(quotient), _floor_of(rest, k))


def _floor_of(rest: Dim, k: int) -> DimLike:
    """floor(rest / k) for a numerator whose coefficients are all in -(k - 1) .. k - 1."""
    # a factor g of k and of every symbolic coefficient: floor((g*m + c) / (g*k')) is
    # floor((m + floor(c / g)) / k') for an integer m (floor(floor(y / g) / k') = floor(y / (g*k')))
    g = k
    const = 0
    for m, c in rest.terms:
        if m:
            g = gcd(g, abs(c))
        else:
            const = c
    if g > 1:
        reduced = add(_make({m: c // g for m, c in rest.terms if m}), const // g)
        return floordiv(reduced, k // g)
    # floor((floor(n / b) + r) / k) = floor((n + b*r) / (b*k)) for an integer-valued r
    for m, c in rest.terms:
        if c == 1 and len(m) == 1 and type(m[0]) is _Floor:
            inner = m[0]
            others = _make({m2: c2 for m2, c2 in rest.terms if m2 != m})
            return floordiv(add(inner.num, mul(others, inner.den)), inner.den * k)
    # a numerator provably in 0 .. k - 1 (only a bounded one can be: a min somewhere in it)
    if any(type(atom) is _Max for m, _ in rest.terms for atom in m):
        if nonneg(rest) and nonneg(sub(k - 1, rest)):
            return 0
    return Dim((((_Floor(rest, k),), 1),))


def ceildiv(a: DimLike, k: DimLike) -> DimLike:
    """ceil(a / k) for a positive int k: ``floor((a + k - 1) / k)``."""
    if a is None or k is None or not isinstance(k, int):
        return None
    return floordiv(add(a, k - 1), k)


def maximum(a: DimLike, b: DimLike) -> DimLike:
    """max(a, b), simplified under "every symbol is >= 0" (see the module's docstring)."""
    if a is None or b is None:
        return None
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    if a == b:
        return a
    diff = sub(a, b)
    if isinstance(diff, int):  # e.g. max(H + 1, H) folds
        return a if diff >= 0 else b
    return _maximum(a, b)


def minimum(a: DimLike, b: DimLike) -> DimLike:
    """min(a, b), written ``-max(-a, -b)``."""
    if a is None or b is None:
        return None
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    if a == b:
        return a
    diff = sub(a, b)
    if isinstance(diff, int):
        return a if diff <= 0 else b
    return neg(_maximum(neg(a), neg(b)))


def _plain(d):
    """An argument as stored in a max (a Dim, or a constant one for an int) back as a dim."""
    if isinstance(d, Dim) and len(d.terms) == 1 and not d.terms[0][0]:
        return d.terms[0][1]
    return d


def _max_args(d: DimLike) -> list:
    """The arguments ``d`` is the max of: ``m + max(b, c)`` is ``max(m + b, m + c)``."""
    if isinstance(d, int):
        return [d]
    lone = [t for t in d.terms if t[1] == 1 and len(t[0]) == 1 and type(t[0][0]) is _Max]
    if len(lone) != 1:
        return [d]
    mono = lone[0][0]
    rest = _make({m: c for m, c in d.terms if m != mono})
    return [add(_plain(x), rest) for x in mono[0].args]


def _geq(a: DimLike, b: DimLike) -> bool:
    """a >= b for every binding (proved, see :func:`nonneg`), on the terms of a - b: no Dim is
    built, sorted or hashed for it (maximum asks this of every pair of arguments)."""
    diff = _as_terms(a)
    for m, c in _as_terms(b).items():
        v = diff.get(m, 0) - c
        if v:
            diff[m] = v
        else:
            diff.pop(m, None)
    if len(diff) <= 1 and () in diff or not diff:
        return diff.get((), 0) >= 0
    return _prove(diff, [_PROOF_STEPS])


@lru_cache(maxsize=8192)
def _maximum(a: DimLike, b: DimLike) -> DimLike:
    args = set(_max_args(a))
    args.update(_max_args(b))
    # Drop every argument another one provably bounds; arguments are taken in text order, so
    # the result does not depend on the order of a and b (of two provably equal, the first stays).
    kept: list = []
    for x in sorted(args, key=to_text):
        if any(_geq(y, x) for y in kept):
            continue
        kept = [y for y in kept if not _geq(x, y)]
        kept.append(x)
    if len(kept) == 1:
        return kept[0]
    # take out the terms every argument has with the same coefficient:
    # max(N + 1, H + 1) = max(H, N) + 1
    first, *others = (_as_terms(x) for x in kept)
    common = {m: c for m, c in first.items() if all(t.get(m) == c for t in others)}
    shared = _make(common) if common else 0
    if common:
        kept = [sub(x, shared) for x in kept]
    atom = _Max(tuple(sorted((x if isinstance(x, Dim) else _IntDim(x) for x in kept), key=_dim_sort_key)))
    return add(shared, Dim((((atom,), 1),)))


def _IntDim(v: int):  # ints inside max() are stored as their own constant-polynomial Dim
    return Dim((((), v),))


def _dim_sort_key(d: Dim) -> str:
    return d.text()


# ---------------------------------------------------------------- proving d >= 0
#: the largest value of a symbol: every symbol is a dim, a non-negative int64
DIM_MAX = 2**63 - 1
#: steps one proof may take (each eliminates one atom); past it the answer is "not proved"
_PROOF_STEPS = 48


def nonneg(d: DimLike) -> bool:
    """True when ``d >= 0`` is proved for every binding of its symbols to 0 .. DIM_MAX.

    Sufficient, never a guess: ``False`` means "not proved". A term ``c * rest * A`` with a max
    or floor atom ``A`` (and ``rest`` provably >= 0) is eliminated, one at a time, first from the
    terms with negative coefficients: ``c * rest * max(b1, b2)`` is ``max(c*rest*b1, c*rest*b2)``
    (c > 0: some branch must hold) or the min of them (c < 0: every branch must hold);
    ``floor(n / k)`` is bounded by ``(n - k + 1) / k`` from below and ``n / k`` from above, and
    the scaled ``k * d >= e`` proves ``d >= 0`` once ``e + k - 1 >= 0`` (``d`` is an integer).
    What is left, a polynomial in the symbols, is >= 0 when its negative terms cannot outweigh its
    constant even at DIM_MAX."""
    if d is None:
        return False
    if isinstance(d, int):
        return d >= 0
    return _nonneg(d)


@lru_cache(maxsize=16384)
def _nonneg(d: Dim) -> bool:
    return _prove(dict(d.terms), [_PROOF_STEPS])


@lru_cache(maxsize=16384)
def _atom_nonneg(atom) -> bool:
    if type(atom) is _Sym:
        return True
    if type(atom) is _Floor:
        return nonneg(atom.num)  # floor(n / k) >= 0 exactly when n >= 0
    return any(nonneg(_plain(a)) for a in atom.args)


def _prove(terms: dict, steps: list) -> bool:
    steps[0] -= 1
    if steps[0] < 0:
        return False
    low = 0  # a lower bound of the constant and the terms over symbols alone
    # terms with a max or floor atom, in the order they are eliminated: negative coefficients
    # first (they are what may make it negative), then positive ones not provably >= 0, then
    # the rest (whose lower bounds may outweigh a negative term over symbols); a max before a
    # floor (a max is replaced exactly, a floor by a bound)
    order: list = []
    below: list = []  # negative terms over symbols alone
    for mono, c in terms.items():
        if not c:
            continue
        if not mono:
            low += c
        elif all(type(a) is _Sym for a in mono):
            if c < 0:
                low += c * DIM_MAX ** len(mono)
                below.append(mono)
        else:
            has_max = any(type(a) is _Max for a in mono)
            if c < 0:
                rank = 0 if has_max else 1
            elif not all(_atom_nonneg(a) for a in mono):
                rank = 2 if has_max else 3
            else:
                rank = 4 if has_max else 5
            order.append((rank, len(order), mono, c))
    if low >= 0 and all(rank >= 4 for rank, *_ in order):
        return True
    if below and terms.get((), 0) < DIM_MAX and not _may_cancel(terms, below):
        return False  # e.g. floor(H / 2) - W: nothing else has W, so W = DIM_MAX makes it negative
    order.sort()
    for rank, _, mono, c in order:
        done = _eliminate(terms, mono, c, steps)
        if done is not None:
            return done
        if rank < 2:  # a negative term none of whose atoms can be replaced: not proved
            return False
    return False


def _may_cancel(terms: dict, below: list) -> bool:
    """Whether every symbol of the negative terms over symbols alone is in some other term (a
    shortcut: else that symbol at DIM_MAX outweighs any constant below DIM_MAX)."""
    need = {a.name for mono in below for a in mono}
    have: set = set()
    for mono, c in terms.items():
        if c > 0 or mono not in below:
            for a in mono:
                if type(a) is _Sym:
                    have.add(a.name)
                elif type(a) is _Floor:
                    have |= a.num.symbols
                else:
                    for b in a.args:
                        have |= b.symbols
    return need <= have


def _eliminate(terms: dict, mono: tuple, c: int, steps: list) -> bool | None:
    """Prove ``terms >= 0`` with one max or floor atom of the term ``c * mono`` replaced by what
    bounds it; ``None`` when no atom of the term can be (the rest of it not provably >= 0)."""
    for i, atom in enumerate(mono):
        if type(atom) is _Sym:
            continue
        rest = mono[:i] + mono[i + 1:]
        if not all(_atom_nonneg(a) for a in rest):
            continue
        others = {m: v for m, v in terms.items() if m != mono}
        if type(atom) is _Max:
            branches = (_add_scaled(others, c, rest, _as_terms(_plain(b))) for b in atom.args)
            if c > 0:
                return any(_prove(t, steps) for t in branches)
            return all(_prove(t, steps) for t in branches)
        k = atom.den
        num = _as_terms(atom.num)
        if c > 0:
            num[()] = num.get((), 0) - (k - 1)  # floor(n / k) >= (n - k + 1) / k
        scaled = {m: v * k for m, v in others.items()}
        scaled = _add_scaled(scaled, c, rest, num)
        scaled[()] = scaled.get((), 0) + k - 1  # k*d >= e with e >= 1 - k: d > -1, so d >= 0
        return _prove(scaled, steps)
    return None


def _add_scaled(terms: dict, c: int, rest: tuple, poly: dict) -> dict:
    """``terms + c * rest * poly`` (``rest`` a monomial)."""
    out = dict(terms)
    for m, v in poly.items():
        mono = tuple(sorted(rest + m, key=_atom_key)) if rest else m
        out[mono] = out.get(mono, 0) + c * v
    return out


def is_known(d: DimLike) -> bool:
    return isinstance(d, int)


def broadcast(a: DimLike, b: DimLike) -> DimLike:
    """One dim of numpy-style broadcasting; raises ValueError on two different known dims."""
    if a == 1:
        return b
    if b == 1:
        return a
    if a is None or b is None:
        # the unknown one may be 1: only a known dim > 1 survives for sure
        other = b if a is None else a
        return other if is_known(other) and other > 1 else None
    if a == b:
        return a
    if is_known(a) and is_known(b):
        raise ValueError(f"dims {a} and {b} do not broadcast")
    # one known (>1) and one symbolic: the symbol must equal the known dim at run time
    if is_known(a):
        return a
    if is_known(b):
        return b
    return maximum(a, b)


# ---------------------------------------------------------------- text form
def _terms_text(terms: _Terms) -> str:
    pieces: list[str] = []
    for mono, coeff in terms:
        if not mono:
            body, mag = str(abs(coeff)), None
        else:
            texts = [a.text() for a in mono]
            if coeff < 0:  # -max(-a, -b) reads as min(a, b)
                for i, a in enumerate(mono):
                    if type(a) is _Max and a.reads_as_min:
                        texts[i] = a.min_text
                        coeff = -coeff
                        break
            atoms = "*".join(texts)
            mag = abs(coeff)
            body = atoms if mag == 1 else f"{mag}*{atoms}"
        sign = "-" if coeff < 0 else "+"
        pieces.append((sign, body))
    out = ""
    for i, (sign, body) in enumerate(pieces):
        if i == 0:
            out = ("-" if sign == "-" else "") + body
        else:
            out += f" {sign} {body}"
    return out


def to_text(d: DimLike) -> str:
    if d is None:
        return "?"
    if isinstance(d, int):
        return str(d)
    return d.text()


_ALLOWED_CALLS = {"floor", "ceil", "max", "min"}


_NOT_IDENT = re.compile(r"\W")


def named_symbol(base: str, suffix: str) -> Dim:
    """A fresh symbol named after a value: ``named_symbol("loop_out", "dim1")`` is ``loop_out_dim1``
    (characters that cannot be in an identifier become ``_``)."""
    text = _NOT_IDENT.sub("_", base) or "value"
    if text[0].isdigit():
        text = "v_" + text
    return Dim.symbol(f"{text}_{suffix}")


@lru_cache(maxsize=4096)
def parse_dim_param(text: str) -> DimLike:
    """A ``dim_param`` as a dim: unknown when anonymous (``?``, ``-1``, ``None``), else :func:`parse`.
    Cached per process: dims are immutable, and ``ast.parse`` costs tens of µs a text."""
    return None if is_anonymous(text) else parse(text)


def parse(text: str) -> DimLike:
    """Read a dim_param: a symbol name or an expression written by ``to_text``.

    A dim_param that is not a valid expression (e.g. ``"batch size"``) is kept as one
    opaque symbol, as ONNX treats it.
    """
    text = text.strip()
    if not text:
        return None
    try:
        tree = ast.parse(text, mode="eval")
        return _from_ast(tree.body)
    except (SyntaxError, ValueError, TypeError):
        return Dim.symbol(text)


def _from_ast(node) -> DimLike:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        return Dim.symbol(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return neg(_from_ast(node.operand))
    if isinstance(node, ast.BinOp):
        left = _from_ast(node.left)
        if isinstance(node.op, ast.Add):
            return add(left, _from_ast(node.right))
        if isinstance(node.op, ast.Sub):
            return sub(left, _from_ast(node.right))
        if isinstance(node.op, ast.Mult):
            return mul(left, _from_ast(node.right))
        if isinstance(node.op, ast.FloorDiv):
            return floordiv(left, _from_ast(node.right))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ALLOWED_CALLS and not node.keywords:
        if node.func.id in ("floor", "ceil") and len(node.args) == 1 and isinstance(node.args[0], ast.BinOp) and isinstance(node.args[0].op, ast.Div):
            fn = floordiv if node.func.id == "floor" else ceildiv
            return fn(_from_ast(node.args[0].left), _from_ast(node.args[0].right))
        if node.func.id in ("max", "min") and len(node.args) >= 2:
            fn = maximum if node.func.id == "max" else minimum
            out = _from_ast(node.args[0])
            for a in node.args[1:]:
                out = fn(out, _from_ast(a))
            return out
    raise ValueError(f"not a dimension expression: {ast.dump(node)}")


# ---------------------------------------------------------------- ONNX protos
def from_proto(dim: TensorShapeProto.Dimension) -> DimLike:
    which = dim.WhichOneof("value")
    if which == "dim_value":
        value = int(dim.dim_value)
        return value if value >= 0 else None  # exporters write -1 for "unknown"
    if which == "dim_param":
        return parse_dim_param(dim.dim_param)
    return None


def to_proto(d: DimLike, dim: TensorShapeProto.Dimension) -> None:
    if d is None:
        return
    if isinstance(d, int):
        dim.dim_value = d
    else:
        dim.dim_param = d.text()


def evaluate(d: DimLike, bindings: dict[str, int]) -> int | None:
    """The value of ``d`` with every symbol bound (``None`` if a symbol is unbound)."""
    if d is None:
        return None
    if isinstance(d, int):
        return d
    total = 0
    for mono, coeff in d.terms:
        value = coeff
        for atom in mono:
            if isinstance(atom, _Sym):
                if atom.name not in bindings:
                    return None
                v = bindings[atom.name]
            elif isinstance(atom, _Floor):
                num = evaluate(atom.num, bindings)
                if num is None:
                    return None
                v = num // atom.den
            else:
                vals = [evaluate(a, bindings) for a in atom.args]
                if any(x is None for x in vals):
                    return None
                v = max(vals)
            value *= v
        total += value
    return total

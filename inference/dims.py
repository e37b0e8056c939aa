"""Symbolic dimensions.

A dimension is a Python ``int`` (known), a :class:`Dim` expression over named symbols, or
``None`` (unknown, unnamed). A ``Dim`` is a polynomial with integer coefficients whose atoms
are symbols (``N``), floors of a polynomial divided by a positive int
(``floor((H + 1) / 2)``) and maxima of polynomials. The form is canonical, so equal
expressions compare and hash equal; anything that folds to a constant becomes an ``int``.
Dims are written back to ONNX as ``dim_value`` (ints) or ``dim_param`` (``to_text``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Union

from onnx import TensorShapeProto

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
        return f"floor(({self.num.text()}) / {self.den})"

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

    @property
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
    quotient: dict = {}
    remainder: dict = {}
    for m, c in a.terms:
        q, r = divmod(c, k)
        if q:
            quotient[m] = q
        if r:
            remainder[m] = r
    rest = _make(remainder)
    if isinstance(rest, int):
        return add(_make(quotient), rest // k)
    return add(_make(quotient), _make({(_Floor(rest, k),): 1}))


def ceildiv(a: DimLike, k: DimLike) -> DimLike:
    """ceil(a / k) for a positive int k."""
    if a is None or k is None or not isinstance(k, int):
        return None
    return floordiv(add(a, k - 1), k)


def maximum(a: DimLike, b: DimLike) -> DimLike:
    if a is None or b is None:
        return None
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    if a == b:
        return a
    diff = sub(a, b)
    if isinstance(diff, int):  # e.g. max(H + 1, H) folds
        return a if diff >= 0 else b
    args: set = set()
    for x in (a, b):
        if isinstance(x, Dim) and len(x.terms) == 1 and x.terms[0][1] == 1 and isinstance(x.terms[0][0][0], _Max) and len(x.terms[0][0]) == 1:
            args |= set(x.terms[0][0][0].args)
        else:
            args.add(x if isinstance(x, Dim) else _IntDim(x))
    # Arguments that differ by a constant (max(0, 1, N), max(N + 1, N, H)) keep only the
    # larger one, else merging nested maxima gives forms that text round trips cannot match.
    kept: list = []
    for x in sorted(args, key=_dim_sort_key):
        for i, y in enumerate(kept):
            diff = sub(x, y)
            if isinstance(diff, int):
                if diff > 0:
                    kept[i] = x
                break
        else:
            kept.append(x)
    if len(kept) == 1:
        return _make(dict(kept[0].terms))
    return _make({(_Max(tuple(sorted(kept, key=_dim_sort_key))),): 1})


def _IntDim(v: int):  # ints inside max() are stored as their own constant-polynomial Dim
    return Dim((((), v),))


def _dim_sort_key(d: Dim) -> str:
    return d.text()


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
            atoms = "*".join(a.text() for a in mono)
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


_ALLOWED_CALLS = {"floor", "max"}


#: dim_param texts exporters write for "unknown" (paddle2onnx ``?``; ``-1`` and ``None`` from
#: shape lists printed as text): not names, so two of them are not the same dim
ANONYMOUS_TEXTS = frozenset({"", "?", "-1", "None"})


def is_anonymous(text: str) -> bool:
    """Whether a dim_param text names no dim (see :data:`ANONYMOUS_TEXTS`)."""
    return text.strip() in ANONYMOUS_TEXTS


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
        if node.func.id == "floor" and len(node.args) == 1 and isinstance(node.args[0], ast.BinOp) and isinstance(node.args[0].op, ast.Div):
            return floordiv(_from_ast(node.args[0].left), _from_ast(node.args[0].right))
        if node.func.id == "max" and len(node.args) >= 2:
            out = _from_ast(node.args[0])
            for a in node.args[1:]:
                out = maximum(out, _from_ast(a))
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

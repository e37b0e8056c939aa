"""The kernel-spec expression language: a small, whitelisted interpreter.

Spec files are data a user may have written, so expressions are parsed with Python's
``ast`` (``mode="eval"``) and evaluated by walking a whitelist of node types: nothing
here calls ``eval``/``compile``, looks up Python attributes or calls Python callables.

Values are ``int`` (exact Python integers), ``float``, ``bool``, ``str`` and lists
(Python tuples; a shape is a list of ints). Names:

- ``true`` / ``false`` (also ``True`` / ``False``);
- ``shapes.<io>`` (list of ints), ``ranks.<io>`` (int), ``tunables.<X>`` (int),
  ``device.limits.<X>`` (int), ``device.features.has("name")`` (bool);
- ``attrs.<name>`` (the node's attribute or its declared default: int, float, str or a
  list), ``dtypes.<io>`` (element type name, e.g. ``"int4"``), ``present.<io>`` (bool:
  false for an absent optional input), ``values.<input>`` (the contents of an input the
  spec declares ``"constant": true``, read when the node is planned: a flat list of numbers);
- bare identifiers: derived names (``derive`` blocks) visible at that point.

Functions: ``numel(shape[, start[, stop]])`` (product of ``shape[start:stop]``),
``slice(list, start[, stop])`` (``list[start:stop]``), ``ceilDiv(a, b)``, ``min(...)``,
``max(...)``, ``bits(dtypeName)`` (bit width of an element type).
Operators: ``+ - * // %``, unary ``-``/``+``, comparisons (chains allowed), ``and``,
``or``, ``not``, ``a if c else b``, list literals ``[a, b]`` and subscripts ``s[i]``.
``/`` is rejected (use ``//`` or ``ceilDiv``). See docs/kernel-spec.md for the full rules.

Every failure is an :class:`~onnx_quant.errors.ExpressionError` whose message carries the
expression text and the reason.
"""

from __future__ import annotations

import ast
import difflib
import math
from collections import ChainMap
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Iterable, Mapping

from onnx_quant.errors import ExpressionError

from .device_info import KNOWN_FEATURES, WEBGPU_DEFAULT_LIMITS
from .index_math import SPEC_FUNCTIONS, div_magic

__all__ = [
    "Expr", "Env", "Scope", "Value", "parse", "evaluate", "evaluate_value", "free_names",
    "check", "expression_error", "suggest", "FUNCTIONS", "NAMESPACES", "RESERVED_NAMES",
    "MAX_EXPRESSION_LENGTH", "MAX_INT_BITS", "MAX_EVAL_STEPS", "type_name",
]

#: Longest expression text accepted (keeps parsing and evaluation bounded).
MAX_EXPRESSION_LENGTH = 4096
#: integers an expression may compute (shapes, byte sizes and products of them fit many times
#: over); a derive chain that squares a value each step is refused at this size, not hours later
MAX_INT_BITS = 256
#: nodes one evaluation may visit (a tree of MAX_EXPRESSION_LENGTH characters has fewer)
MAX_EVAL_STEPS = 20_000

#: Names that only make sense followed by an attribute.
NAMESPACES = frozenset({"shapes", "ranks", "tunables", "device", "attrs", "dtypes", "present", "values"})
#: Namespaces read as ``<ns>.<name>`` (two parts).
_TWO_PART = ("shapes", "ranks", "tunables", "attrs", "dtypes", "present", "values")
#: Function name -> (minimum, maximum or None) argument count.
FUNCTIONS: dict[str, tuple[int, int | None]] = {
    "numel": (1, 3), "ceilDiv": (2, 2), "min": (1, None), "max": (1, None), "bits": (1, 1),
    "slice": (2, 3), "lastNonUnit": (1, 1), "rowStrides": (1, 1), "broadcastStrides": (2, 2), "nonzeroIndices": (1, 1), "listLength": (1, 1), "convWindows": (5, 5), "samePadTotals": (5, 5), "sliceMap": (5, 5), "divMagic": (1, 1), "resizeTables": (15, 15),
    "padMap": (4, 4), "tileMap": (2, 2), "einsumMap": (2, 2),
    "dftTwiddles": (1, 1), "melBins": (7, 7),
}
_BOOL_NAMES = {"true": True, "false": False}
#: Identifiers a derived value may not be called.
RESERVED_NAMES = frozenset(NAMESPACES | set(FUNCTIONS) | set(_BOOL_NAMES))

_NODE_WORDS = {
    "Div": "'/' is not supported: use '//' (floor division) or ceilDiv(a, b) (rounding up)",
    "Pow": "'**' is not supported",
    "Tuple": "tuples are not supported: write a list as [a, b]",
    "Slice": "slices are not supported: index one element, e.g. shapes.x[-1]",
    "Lambda": "lambda is not supported",
    "JoinedStr": "f-strings are not supported",
    "NamedExpr": "':=' is not supported",
    "Dict": "dict literals are not supported",
    "Set": "set literals are not supported",
    "ListComp": "comprehensions are not supported",
    "GeneratorExp": "comprehensions are not supported",
    "In": "'in' is not supported", "NotIn": "'not in' is not supported",
    "Is": "'is' is not supported: use ==", "IsNot": "'is not' is not supported: use !=",
    "MatMul": "'@' is not supported", "LShift": "'<<' is not supported",
    "RShift": "'>>' is not supported", "BitAnd": "'&' is not supported",
    "BitOr": "'|' is not supported", "BitXor": "'^' is not supported",
    "Invert": "'~' is not supported", "Starred": "'*' arguments are not supported",
}

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}
_CMPOPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}

#: A derive/member/dispatch value: an expression, or a JSON literal used as is.
Value = Any  # Expr | bool | int | float


def expression_error(text: str, reason: str) -> ExpressionError:
    """An :class:`ExpressionError` for ``text`` with ``reason`` (both kept as attributes)."""
    err = ExpressionError(f"expression {text!r}: {reason}")
    err.expression = text  # type: ignore[attr-defined]
    err.reason = reason  # type: ignore[attr-defined]
    return err


def suggest(name: str, candidates: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest candidate, or ``""``."""
    cands = sorted(set(candidates))
    close = difflib.get_close_matches(name, cands, n=1, cutoff=0.6)
    if not close:
        lowered = {c.lower(): c for c in cands}
        if name.lower() in lowered:
            close = [lowered[name.lower()]]
    return f" (did you mean {close[0]!r}?)" if close else ""


def type_name(value: Any) -> str:
    """The language's name for a value's type."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, tuple):
        return "list"
    return type(value).__name__


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# --------------------------------------------------------------------------- parsing


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"]; None when the chain does not end in a Name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return None


_ATTR_HINT = ("attribute access is only allowed as shapes.<io>, ranks.<io>, tunables.<name>, "
              "attrs.<name>, dtypes.<io>, present.<io>, "
              "device.limits.<name> or device.features.has(\"feature\")")


def _is_feature_has(func: ast.AST) -> bool:
    return _dotted(func) == ["device", "features", "has"]


class _Validator:
    """Checks that a tree uses only whitelisted syntax (names are checked later)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def fail(self, reason: str) -> ExpressionError:
        return expression_error(self.text, reason)

    def visit(self, node: ast.AST) -> None:
        kind = type(node).__name__
        if isinstance(node, ast.Expression):
            self.visit(node.body)
        elif isinstance(node, ast.Constant):
            v = node.value
            if v is None or not isinstance(v, (bool, int, float, str)):
                raise self.fail(f"unsupported constant {v!r}")
        elif isinstance(node, ast.Name):
            if node.id in NAMESPACES:
                raise self.fail(f"{node.id!r} must be followed by '.<name>'")
            if node.id in FUNCTIONS:
                raise self.fail(f"function {node.id!r} must be called, e.g. {node.id}(...)")
        elif isinstance(node, ast.Attribute):
            parts = _dotted(node)
            ok = parts is not None and (
                (len(parts) == 2 and parts[0] in _TWO_PART)
                or (len(parts) == 3 and parts[:2] == ["device", "limits"]))
            if not ok:
                if parts and parts[:3] == ["device", "features", "has"] and len(parts) == 3:
                    raise self.fail("device.features.has must be called with a feature name")
                raise self.fail(_ATTR_HINT)
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINOPS:
                raise self.fail(_NODE_WORDS.get(type(node.op).__name__,
                                                f"operator {type(node.op).__name__} is not supported"))
            self.visit(node.left)
            self.visit(node.right)
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
                raise self.fail(_NODE_WORDS.get(type(node.op).__name__, "unsupported unary operator"))
            self.visit(node.operand)
        elif isinstance(node, ast.BoolOp):
            for v in node.values:
                self.visit(v)
        elif isinstance(node, ast.Compare):
            for op in node.ops:
                if type(op) not in _CMPOPS:
                    raise self.fail(_NODE_WORDS.get(type(op).__name__, "unsupported comparison"))
            self.visit(node.left)
            for c in node.comparators:
                self.visit(c)
        elif isinstance(node, ast.IfExp):
            self.visit(node.test)
            self.visit(node.body)
            self.visit(node.orelse)
        elif isinstance(node, ast.List):
            for e in node.elts:
                self.visit(e)
        elif isinstance(node, ast.Subscript):
            if isinstance(node.slice, (ast.Slice, ast.Tuple)):
                raise self.fail(_NODE_WORDS[type(node.slice).__name__])
            self.visit(node.value)
            self.visit(node.slice)
        elif isinstance(node, ast.Call):
            if node.keywords:
                raise self.fail("keyword arguments are not supported")
            for a in node.args:
                if isinstance(a, ast.Starred):
                    raise self.fail(_NODE_WORDS["Starred"])
            if _is_feature_has(node.func):
                if len(node.args) != 1:
                    raise self.fail(f"device.features.has takes 1 argument, got {len(node.args)}")
                arg = node.args[0]
                if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                    raise self.fail("device.features.has needs a string literal, e.g. "
                                    "device.features.has(\"subgroup\")")
                return
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
                shown = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
                raise self.fail(f"unknown function {shown!r}; known: "
                                f"{', '.join(sorted(FUNCTIONS))}, device.features.has"
                                + (suggest(shown, FUNCTIONS) if isinstance(node.func, ast.Name) else ""))
            lo, hi = FUNCTIONS[node.func.id]
            n = len(node.args)
            if n < lo or (hi is not None and n > hi):
                want = str(lo) if hi == lo else (f"at least {lo}" if hi is None else f"{lo} to {hi}")
                raise self.fail(f"{node.func.id}() takes {want} argument{'' if want == '1' else 's'}, got {n}")
            for a in node.args:
                self.visit(a)
        else:
            raise self.fail(_NODE_WORDS.get(kind, f"unsupported syntax ({kind})"))


class Expr:
    """A parsed, syntax-checked expression. Immutable; ``text`` is the source."""

    __slots__ = ("text", "_tree", "_free")

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise ExpressionError(f"an expression must be a string, found {type(text).__name__}")
        self.text = text
        src = text.strip()
        if not src:
            raise expression_error(text, "empty expression")
        if len(src) > MAX_EXPRESSION_LENGTH:
            raise expression_error(text[:60] + "...", f"longer than {MAX_EXPRESSION_LENGTH} characters")
        try:
            tree = ast.parse(src, mode="eval")
        except SyntaxError as e:
            where = f" at column {e.offset}" if e.offset else ""
            raise expression_error(text, f"syntax error{where}: {e.msg}") from None
        except (ValueError, RecursionError, MemoryError) as e:
            raise expression_error(text, f"cannot parse: {type(e).__name__}: {e}") from None
        try:
            _Validator(text).visit(tree)
        except RecursionError:
            raise expression_error(text, "too deeply nested") from None
        self._tree: ast.Expression | None = tree
        self._free: frozenset[str] | None = None

    @property
    def tree(self) -> ast.Expression:
        """The parsed expression (one restored from a pickle is parsed on first use)."""
        if self._tree is None:
            self._tree = parse(self.text).tree
        return self._tree

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"

    def __reduce__(self):
        # pickled as its text (spec.py keeps the loaded specs on disk): parsed on first use, once per text
        return (_unparsed, (self.text,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Expr) and other.text == self.text

    def __hash__(self) -> int:
        return hash(("Expr", self.text))

    @property
    def free_names(self) -> frozenset[str]:
        """Bare identifiers the expression reads: its derived-name dependencies."""
        if self._free is None:
            names = set()
            for node in ast.walk(self.tree):
                if isinstance(node, ast.Name) and node.id not in RESERVED_NAMES:
                    names.add(node.id)
            self._free = frozenset(names)
        return self._free

    def evaluate(self, env: "Env") -> Any:
        try:
            return _Evaluator(self.text, env).eval(self.tree.body)
        except RecursionError:
            raise expression_error(self.text, "too deeply nested") from None

    def check(self, scope: "Scope") -> None:
        key = (self.text, scope)
        if key in _CHECKED:  # the same text in the same scope recurs across a spec's variants
            return
        try:
            _Checker(self.text, scope).visit(self.tree.body)
        except RecursionError:
            raise expression_error(self.text, "too deeply nested") from None
        if len(_CHECKED) >= _MAX_CHECKED:
            _CHECKED.clear()
        _CHECKED.add(key)


#: (text, scope) pairs that passed ``Expr.check`` (a check is a pure function of the two)
_CHECKED: set[tuple[str, "Scope"]] = set()
_MAX_CHECKED = 1 << 16


def _unparsed(text: str) -> Expr:
    """An Expr of a text already checked (what ``Expr.__reduce__`` stores), its tree parsed on first use."""
    e = Expr.__new__(Expr)
    e.text, e._tree, e._free = text, None, None
    return e


@lru_cache(maxsize=16384)  # the installed specs hold ~1,300 distinct texts: none is parsed twice
def parse(text: str) -> Expr:
    """Parse and syntax-check ``text`` (cached). Raises ExpressionError."""
    return Expr(text)


def _as_expr(expr: Expr | str) -> Expr:
    if isinstance(expr, Expr):
        return expr
    if not isinstance(expr, str):
        raise ExpressionError(f"an expression must be a string, found {type(expr).__name__}")
    return parse(expr)


def free_names(expr: Expr | str) -> set[str]:
    """Derived names an expression depends on (bare identifiers other than reserved ones)."""
    return set(_as_expr(expr).free_names)


# --------------------------------------------------------------------------- static check


@dataclass(frozen=True)
class Scope:
    """What an expression may name, for checking without evaluating.

    ``io`` names the inputs/outputs (for ``shapes.``/``ranks.``/``dtypes.``/``present.``),
    ``tunables`` the tunables, ``names`` the derived names visible at that point,
    ``attributes`` the declared node attributes (for ``attrs.``), ``constants`` the inputs
    declared ``"constant": true`` (for ``values.``).
    """

    io: frozenset[str] = frozenset()
    constants: frozenset[str] = frozenset()
    tunables: frozenset[str] = frozenset()
    names: frozenset[str] = frozenset()
    attributes: frozenset[str] = frozenset()
    limits: frozenset[str] = frozenset(WEBGPU_DEFAULT_LIMITS)
    features: frozenset[str] = KNOWN_FEATURES

    def with_names(self, more: Iterable[str]) -> "Scope":
        return replace(self, names=self.names | frozenset(more))


class _Checker:
    def __init__(self, text: str, scope: Scope) -> None:
        self.text = text
        self.scope = scope

    def fail(self, reason: str) -> ExpressionError:
        return expression_error(self.text, reason)

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            if node.id in _BOOL_NAMES:
                return
            if node.id not in self.scope.names:
                raise self.fail(f"unknown name {node.id!r}" + suggest(node.id, self.scope.names))
            return
        if isinstance(node, ast.Attribute):
            parts = _dotted(node)
            assert parts is not None
            if parts[0] in ("shapes", "ranks", "dtypes", "present"):
                if parts[1] not in self.scope.io:
                    raise self.fail(f"unknown input/output {parts[1]!r} in {parts[0]}.{parts[1]}"
                                    + suggest(parts[1], self.scope.io))
            elif parts[0] == "values":
                if parts[1] not in self.scope.constants:
                    raise self.fail(f"values.{parts[1]}: {parts[1]!r} is not an input declared "
                                    f"\"constant\": true" + suggest(parts[1], self.scope.constants))
            elif parts[0] == "tunables":
                if parts[1] not in self.scope.tunables:
                    raise self.fail(f"unknown tunable {parts[1]!r}" + suggest(parts[1], self.scope.tunables))
            elif parts[0] == "attrs":
                if parts[1] not in self.scope.attributes:
                    raise self.fail(f"unknown attribute {parts[1]!r} in attrs.{parts[1]}"
                                    + suggest(parts[1], self.scope.attributes)
                                    + "; declare it in the top-level 'attributes'")
            else:  # device.limits.X
                if parts[2] not in self.scope.limits:
                    raise self.fail(f"unknown device limit {parts[2]!r}" + suggest(parts[2], self.scope.limits))
            return
        if isinstance(node, ast.Call) and _is_feature_has(node.func):
            name = node.args[0].value  # validated: a str constant
            if name not in self.scope.features:
                raise self.fail(f"unknown device feature {name!r}" + suggest(name, self.scope.features)
                                + f"; known: {', '.join(sorted(self.scope.features))}")
            return
        if isinstance(node, ast.Call):
            for a in node.args:
                self.visit(a)
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.operator, ast.cmpop, ast.boolop, ast.unaryop, ast.expr_context)):
                continue
            self.visit(child)


def check(expr: Expr | str, scope: Scope) -> Expr:
    """Parse ``expr`` and check every name it uses against ``scope``; return the Expr.

    Raises ExpressionError for syntax outside the language, unknown names, unknown
    inputs/outputs, tunables, device limits or features, and wrong function arity.
    """
    e = _as_expr(expr)
    e.check(scope)
    return e


# --------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class Env:
    """What names mean during evaluation.

    ``shapes`` maps input/output names to shapes (tuples of ints); ``ranks`` defaults to
    their lengths; ``limits`` are the device limits; ``features`` the device's feature
    names; ``names`` the derived values visible at this point; ``attrs`` the node's
    attribute values (declared defaults filled in; lists as tuples); ``dtypes`` each
    input/output's element type name; ``present`` whether each input/output is present
    (an io missing from ``present`` counts as present when it has a shape); ``values`` the
    contents of the constant inputs (tuples of numbers, flattened).
    """

    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    tunables: Mapping[str, int] = field(default_factory=dict)
    limits: Mapping[str, int] = field(default_factory=lambda: dict(WEBGPU_DEFAULT_LIMITS))
    features: frozenset[str] = frozenset()
    names: Mapping[str, Any] = field(default_factory=dict)
    ranks: Mapping[str, int] | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)
    dtypes: Mapping[str, str] = field(default_factory=dict)
    present: Mapping[str, bool] = field(default_factory=dict)
    values: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    def rank_of(self, io: str) -> int | None:
        if self.ranks is not None and io in self.ranks:
            return self.ranks[io]
        if io in self.shapes:
            return len(self.shapes[io])
        return None

    def with_names(self, more: Mapping[str, Any]) -> "Env":
        """A child environment that also sees ``more`` (which wins over existing names)."""
        return replace(self, names=ChainMap(dict(more), self.names))


class _Evaluator:
    def __init__(self, text: str, env: Env) -> None:
        self.text = text
        self.env = env
        self.steps = 0

    def fail(self, reason: str) -> ExpressionError:
        return expression_error(self.text, reason)

    def src(self, node: ast.AST) -> str:
        try:
            return ast.unparse(node)
        except Exception:  # pragma: no cover - defensive
            return type(node).__name__

    def eval(self, node: ast.AST) -> Any:
        m = getattr(self, "_" + type(node).__name__, None)
        if m is None:  # validated trees never get here
            raise self.fail(f"unsupported syntax ({type(node).__name__})")
        self.steps += 1
        if self.steps > MAX_EVAL_STEPS:
            raise self.fail(f"evaluation takes more than {MAX_EVAL_STEPS} steps")
        v = m(node)
        if type(v) is int and v.bit_length() > MAX_INT_BITS:  # squaring chains grow without bound
            raise self.fail(f"integer of {v.bit_length()} bits ({self.src(node)[:60]}): expected at most "
                            f"{MAX_INT_BITS} bits")
        return v

    # -- leaves
    def _Constant(self, node: ast.Constant) -> Any:
        return node.value

    def _Name(self, node: ast.Name) -> Any:
        if node.id in _BOOL_NAMES:
            return _BOOL_NAMES[node.id]
        try:
            return self.env.names[node.id]
        except KeyError:
            raise self.fail(f"unknown name {node.id!r}" + suggest(node.id, self.env.names)) from None

    def _Attribute(self, node: ast.Attribute) -> Any:
        parts = _dotted(node)
        assert parts is not None
        ns = parts[0]
        if ns == "shapes":
            if parts[1] not in self.env.shapes:
                raise self.fail(f"unknown input/output {parts[1]!r} in shapes.{parts[1]}"
                                + suggest(parts[1], self.env.shapes))
            return tuple(self.env.shapes[parts[1]])
        if ns == "ranks":
            r = self.env.rank_of(parts[1])
            if r is None:
                known = set(self.env.shapes) | set(self.env.ranks or ())
                raise self.fail(f"unknown input/output {parts[1]!r} in ranks.{parts[1]}" + suggest(parts[1], known))
            return r
        if ns == "tunables":
            if parts[1] not in self.env.tunables:
                raise self.fail(f"unknown tunable {parts[1]!r}" + suggest(parts[1], self.env.tunables))
            return self.env.tunables[parts[1]]
        if ns == "attrs":
            if parts[1] not in self.env.attrs:
                raise self.fail(f"unknown attribute {parts[1]!r} in attrs.{parts[1]}"
                                + suggest(parts[1], self.env.attrs))
            v = self.env.attrs[parts[1]]
            return tuple(v) if isinstance(v, list) else v
        if ns == "dtypes":
            if parts[1] not in self.env.dtypes:
                raise self.fail(f"unknown input/output {parts[1]!r} in dtypes.{parts[1]}"
                                + suggest(parts[1], self.env.dtypes))
            return self.env.dtypes[parts[1]]
        if ns == "present":
            if parts[1] in self.env.present:
                return bool(self.env.present[parts[1]])
            if parts[1] in self.env.shapes:
                return True
            known = set(self.env.present) | set(self.env.shapes)
            raise self.fail(f"unknown input/output {parts[1]!r} in present.{parts[1]}" + suggest(parts[1], known))
        if ns == "values":
            if parts[1] not in self.env.values:
                raise self.fail(f"no value for input {parts[1]!r} in values.{parts[1]}"
                                + suggest(parts[1], self.env.values))
            return self.env.values[parts[1]]
        # device.limits.X
        if parts[2] not in self.env.limits:
            raise self.fail(f"unknown device limit {parts[2]!r}" + suggest(parts[2], self.env.limits))
        return self.env.limits[parts[2]]

    # -- operators
    def _UnaryOp(self, node: ast.UnaryOp) -> Any:
        v = self.eval(node.operand)
        if isinstance(node.op, ast.Not):
            if not isinstance(v, bool):
                raise self.fail(f"'not' needs a bool, found {type_name(v)} ({self.src(node.operand)})")
            return not v
        if not _is_num(v):
            raise self.fail(f"unary '{'-' if isinstance(node.op, ast.USub) else '+'}' needs a number, "
                            f"found {type_name(v)}")
        return -v if isinstance(node.op, ast.USub) else +v

    def _BinOp(self, node: ast.BinOp) -> Any:
        sym = _BINOPS[type(node.op)]
        a = self.eval(node.left)
        b = self.eval(node.right)
        if sym == "+" and isinstance(a, str) and isinstance(b, str):
            return a + b
        if not (_is_num(a) and _is_num(b)):
            raise self.fail(f"'{sym}' needs two numbers, found {type_name(a)} and {type_name(b)}"
                            f" ({self.src(node)})")
        try:
            if sym == "+":
                return a + b
            if sym == "-":
                return a - b
            if sym == "*":
                return a * b
            if b == 0:
                raise self.fail(f"division by zero ({self.src(node)})")
            return a // b if sym == "//" else a % b
        except (OverflowError, ArithmeticError) as e:
            raise self.fail(f"arithmetic error: {e} ({self.src(node)})") from None

    def _BoolOp(self, node: ast.BoolOp) -> bool:
        is_and = isinstance(node.op, ast.And)
        word = "and" if is_and else "or"
        for operand in node.values:
            v = self.eval(operand)
            if not isinstance(v, bool):
                raise self.fail(f"'{word}' needs bools, found {type_name(v)} ({self.src(operand)})")
            if is_and and not v:
                return False
            if not is_and and v:
                return True
        return is_and

    def _Compare(self, node: ast.Compare) -> bool:
        left = self.eval(node.left)
        for op, comp in zip(node.ops, node.comparators):
            right = self.eval(comp)
            sym = _CMPOPS[type(op)]
            if _is_num(left) and _is_num(right):
                pass
            elif sym in ("==", "!=") and type_name(left) == type_name(right):
                pass
            else:
                raise self.fail(f"cannot compare {type_name(left)} {sym} {type_name(right)}"
                                f" ({self.src(node.left)} {sym} {self.src(comp)})")
            if sym == "==":
                ok = left == right
            elif sym == "!=":
                ok = left != right
            elif sym == "<":
                ok = left < right
            elif sym == "<=":
                ok = left <= right
            elif sym == ">":
                ok = left > right
            else:
                ok = left >= right
            if not ok:
                return False
            left = right
        return True

    def _IfExp(self, node: ast.IfExp) -> Any:
        c = self.eval(node.test)
        if not isinstance(c, bool):
            raise self.fail(f"the condition of 'if' must be a bool, found {type_name(c)} ({self.src(node.test)})")
        return self.eval(node.body) if c else self.eval(node.orelse)

    def _List(self, node: ast.List) -> tuple:
        return tuple(self.eval(e) for e in node.elts)

    def _Subscript(self, node: ast.Subscript) -> Any:
        seq = self.eval(node.value)
        idx = self.eval(node.slice)
        if not isinstance(seq, tuple):
            raise self.fail(f"only lists can be indexed, found {type_name(seq)} ({self.src(node.value)})")
        if not _is_int(idx):
            raise self.fail(f"a list index must be an int, found {type_name(idx)}")
        if not -len(seq) <= idx < len(seq):
            raise self.fail(f"index {idx} out of range for a list of length {len(seq)} ({self.src(node)})")
        return seq[idx]

    def _Call(self, node: ast.Call) -> Any:
        if _is_feature_has(node.func):
            name = node.args[0].value
            if name not in KNOWN_FEATURES:
                raise self.fail(f"unknown device feature {name!r}" + suggest(name, KNOWN_FEATURES))
            return name in self.env.features
        fname = node.func.id  # validated: a known function
        args = [self.eval(a) for a in node.args]
        if fname in ("numel", "slice"):
            seq = args[0]
            if fname == "numel" and (not isinstance(seq, tuple) or not all(_is_int(d) for d in seq)):
                raise self.fail(f"numel() needs a list of ints, found {type_name(seq)}")
            if fname == "slice" and not isinstance(seq, tuple):
                raise self.fail(f"slice() needs a list, found {type_name(seq)}")
            for b in args[1:]:
                if not _is_int(b):
                    raise self.fail(f"{fname}() bounds must be ints, found {type_name(b)}")
            part = seq[args[1]:(args[2] if len(args) > 2 else None)] if len(args) > 1 else seq
            return math.prod(part) if fname == "numel" else part
        if fname in SPEC_FUNCTIONS:  # functions of int lists (index_math.py, einsum.py)
            try:
                return SPEC_FUNCTIONS[fname](*args)
            except ValueError as err:
                raise self.fail(f"{fname}() {err}, found {args!r}") from None
        if fname == "listLength":  # a list's length (numel multiplies its items)
            if not isinstance(args[0], tuple):
                raise self.fail(f"listLength() needs a list, found {type_name(args[0])}")
            return len(args[0])
        if fname == "nonzeroIndices":  # the positions of a list's nonzero (true) items: Compress's condition
            if not isinstance(args[0], tuple):
                raise self.fail(f"nonzeroIndices() needs a list, found {type_name(args[0])}")
            return tuple(i for i, v in enumerate(args[0]) if v)
        if fname == "divMagic":
            x = args[0]
            if _is_int(x) and 0 <= x < 2 ** 31:
                return div_magic(x)
            if isinstance(x, tuple) and all(_is_int(d) and 0 <= d < 2 ** 31 for d in x):
                return tuple(div_magic(d) for d in x)
            raise self.fail(f"divMagic() needs an int in [0, 2^31) or a list of them, found {x!r}")
        if fname == "resizeTables":  # Resize's per-axis tap tables (backend_wgpu/resize_taps.py)
            from .resize_taps import resize_tables  # noqa: PLC0415 - numpy

            return _as_value(resize_tables(*args))
        if fname in ("dftTwiddles", "melBins"):  # the signal kernels' tables (backend_wgpu/signal_tables.py)
            from .signal_tables import dft_twiddles, mel_bin_edges  # noqa: PLC0415 - numpy
            if fname == "dftTwiddles" and not _is_int(args[0]):
                raise self.fail(f"dftTwiddles() needs an int, found {type_name(args[0])}")
            return _as_value(dft_twiddles(*args) if fname == "dftTwiddles" else mel_bin_edges(*args))
        if fname == "bits":
            name = args[0]
            if not isinstance(name, str):
                raise self.fail(f"bits() needs an element type name (a str), found {type_name(name)}")
            from onnx_quant.dtypes import BY_NAME  # noqa: PLC0415 - keeps expr import-light

            if name not in BY_NAME:
                raise self.fail(f"bits(): unknown element type {name!r}" + suggest(name, BY_NAME))
            return BY_NAME[name].bits
        if fname == "ceilDiv":
            a, b = args
            if not (_is_int(a) and _is_int(b)):
                raise self.fail(f"ceilDiv() needs two ints, found {type_name(a)} and {type_name(b)}")
            if b == 0:
                raise self.fail(f"division by zero ({self.src(node)})")
            return -((-a) // b)
        # min / max
        if len(args) == 1:
            seq = args[0]
            if not isinstance(seq, tuple):
                raise self.fail(f"{fname}() with one argument needs a list, found {type_name(seq)}")
            if not seq:
                raise self.fail(f"{fname}() of an empty list")
            args = list(seq)
        for a in args:
            if not _is_num(a):
                raise self.fail(f"{fname}() needs numbers, found {type_name(a)}")
        return min(args) if fname == "min" else max(args)


def _as_value(v: Any) -> Any:
    """A Python result in the language's terms: lists as tuples, numpy scalars as numbers."""
    if isinstance(v, (list, tuple)):
        return tuple(_as_value(x) for x in v)
    if hasattr(v, "item") and getattr(v, "shape", None) == ():
        return v.item()
    return v


def evaluate(expr: Expr | str, env: Env) -> Any:
    """Evaluate ``expr`` (an Expr or source text) in ``env``. Raises ExpressionError."""
    return _as_expr(expr).evaluate(env)


def evaluate_value(value: Value, env: Env) -> Any:
    """A spec value: an Expr is evaluated, a JSON literal (bool/int/float) is returned as is."""
    if isinstance(value, Expr):
        return value.evaluate(env)
    if isinstance(value, (list, tuple)):
        return tuple(evaluate_value(v, env) for v in value)
    return value

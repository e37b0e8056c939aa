"""Symbolic dims: canonical form, text round trip, evaluation against integer arithmetic."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st
from onnx import TensorShapeProto

from onnx_quant.inference import dims
from onnx_quant.inference.dims import Dim

SYMBOLS = ("N", "H", "W", "batch_size")

# An expression tree: ("int", v) | ("sym", name) | (op, left, right) | ("floordiv", e, k) | ("max", a, b)
leaves = st.one_of(
    st.integers(-20, 20).map(lambda v: ("int", v)),
    st.sampled_from(SYMBOLS).map(lambda s: ("sym", s)),
)


def _extend(children):
    return st.one_of(
        st.tuples(st.sampled_from(["add", "sub", "mul"]), children, children),
        st.tuples(st.just("floordiv"), children, st.integers(1, 7)),
        st.tuples(st.just("ceildiv"), children, st.integers(1, 7)),
        st.tuples(st.just("max"), children, children),
    )


trees = st.recursive(leaves, _extend, max_leaves=8)
# symbols are dims: every binding is >= 0 (the fact the simplification rests on)
bindings = st.fixed_dictionaries({s: st.integers(0, 30) for s in SYMBOLS})


def build(tree) -> dims.DimLike:
    kind = tree[0]
    if kind == "int":
        return tree[1]
    if kind == "sym":
        return Dim.symbol(tree[1])
    if kind in ("floordiv", "ceildiv"):
        return getattr(dims, kind)(build(tree[1]), tree[2])
    op = {"add": dims.add, "sub": dims.sub, "mul": dims.mul, "max": dims.maximum}[kind]
    return op(build(tree[1]), build(tree[2]))


def value(tree, env: dict[str, int]) -> int:
    """The tree computed with plain Python ints: the reference ``evaluate`` must agree with."""
    kind = tree[0]
    if kind == "int":
        return tree[1]
    if kind == "sym":
        return env[tree[1]]
    if kind == "floordiv":
        return value(tree[1], env) // tree[2]
    if kind == "ceildiv":
        return -(-value(tree[1], env) // tree[2])
    a, b = value(tree[1], env), value(tree[2], env)
    return {"add": a + b, "sub": a - b, "mul": a * b, "max": max(a, b)}[kind]


@given(trees, bindings)
def test_evaluate_agrees_with_integer_arithmetic(tree, env):
    assert dims.evaluate(build(tree), env) == value(tree, env)


@given(trees)
def test_text_round_trip(tree):
    d = build(tree)
    back = dims.parse(dims.to_text(d))
    assert back == d
    assert hash(back) == hash(d)
    assert dims.to_text(back) == dims.to_text(d)


@given(trees, bindings)
def test_text_round_trip_evaluates_the_same(tree, env):
    d = build(tree)
    assert dims.evaluate(dims.parse(dims.to_text(d)), env) == value(tree, env)


@given(trees)
def test_proto_round_trip(tree):
    d = build(tree)
    proto = TensorShapeProto.Dimension()
    dims.to_proto(d, proto)
    # a negative dim_value is what exporters write for "unknown": it reads back as unknown
    assert dims.from_proto(proto) == (None if isinstance(d, int) and d < 0 else d)
    if isinstance(d, int):
        assert proto.WhichOneof("value") == "dim_value"
    else:
        assert proto.WhichOneof("value") == "dim_param"


@given(trees, trees, trees)
def test_polynomial_identities_are_canonical(a, b, c):
    x, y, z = build(a), build(b), build(c)
    # commutativity, associativity, distributivity: equal expressions compare and hash equal
    assert dims.add(x, y) == dims.add(y, x)
    assert dims.mul(x, y) == dims.mul(y, x)
    assert dims.add(dims.add(x, y), z) == dims.add(x, dims.add(y, z))
    assert dims.mul(dims.mul(x, y), z) == dims.mul(x, dims.mul(y, z))
    left, right = dims.mul(x, dims.add(y, z)), dims.add(dims.mul(x, y), dims.mul(x, z))
    assert left == right and hash(left) == hash(right)
    assert dims.to_text(left) == dims.to_text(right)
    assert dims.sub(x, x) == 0
    assert dims.add(x, 0) == x and dims.mul(x, 1) == x and dims.mul(x, 0) == 0


@given(trees)
def test_constants_fold_to_int(tree):
    d = build(tree)
    if isinstance(d, Dim):
        assert d.symbols, "a Dim without symbols should have folded to an int"
    folded = dims.sub(dims.add(d, 5), d)
    assert folded == 5 and isinstance(folded, int)


@given(trees, st.integers(1, 9), st.integers(0, 20))
def test_floordiv_identities(tree, k, r):
    x = build(tree)
    assert dims.floordiv(x, 1) == x
    assert dims.floordiv(dims.mul(x, k), k) == x
    # (k*x + r) // k == x + r // k, exactly (the symbolic part divides evenly)
    assert dims.floordiv(dims.add(dims.mul(x, k), r), k) == dims.add(x, r // k)
    assert dims.ceildiv(x, k) == dims.floordiv(dims.add(x, k - 1), k)


@given(trees, st.integers(1, 6), st.integers(1, 6), bindings)
def test_nested_floordiv_evaluates_as_one(tree, a, b, env):
    x = build(tree)
    assert dims.evaluate(dims.floordiv(dims.floordiv(x, a), b), env) == value(tree, env) // (a * b)


@given(trees, trees, bindings)
def test_maximum_commutes_and_evaluates(a, b, env):
    x, y = build(a), build(b)
    assert dims.maximum(x, y) == dims.maximum(y, x)
    assert dims.maximum(x, x) == x
    assert dims.evaluate(dims.maximum(x, y), env) == max(value(a, env), value(b, env))


def test_text_examples():
    H, N = Dim.symbol("H"), Dim.symbol("N")
    assert dims.to_text(dims.floordiv(dims.add(H, 1), 2)) == "floor((H + 1) / 2)"
    assert dims.to_text(dims.sub(dims.mul(N, 2), 3)) == "2*N - 3"
    assert dims.to_text(dims.maximum(H, 3)) == "max(3, H)"
    assert dims.to_text(None) == "?"
    assert dims.parse("floor((H + 1) / 2)") == dims.floordiv(dims.add(H, 1), 2)


def test_nested_max_drops_arguments_a_constant_apart():
    N, H = Dim.symbol("N"), Dim.symbol("H")
    assert dims.maximum(0, dims.maximum(1, N)) == dims.maximum(1, N)
    assert dims.maximum(dims.maximum(N, H), dims.add(N, 1)) == dims.maximum(dims.add(N, 1), H)
    assert dims.parse("max(0, 1, N)") == dims.maximum(1, N)


@pytest.mark.parametrize("text", ["batch size", "seq-len?", "a.b", "1x"])
def test_opaque_dim_param_is_one_symbol(text):
    d = dims.parse(text)
    assert isinstance(d, Dim) and d.symbols == frozenset({text})
    assert dims.to_text(d) == text


def test_unbound_symbol_evaluates_to_none():
    assert dims.evaluate(dims.add(Dim.symbol("N"), 1), {}) is None
    assert dims.evaluate(None, {"N": 1}) is None


def test_floordiv_rejects_non_positive_divisor():
    with pytest.raises(ValueError):
        dims.floordiv(Dim.symbol("N"), 0)
    assert dims.floordiv(Dim.symbol("N"), Dim.symbol("K")) is None

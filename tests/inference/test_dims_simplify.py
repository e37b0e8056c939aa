"""Simplification of symbolic dims (inference/dims.py) under the one fact inference knows: every
symbol is a dim, 0 <= s <= DIM_MAX. Property tests that simplifying never changes a value (each
expression is built through the simplifying constructors and compared, at random non-negative
bindings, with the same tree computed on plain Python ints), that the form stays canonical, and
that ``nonneg`` proves nothing false; then the identities one by one, and the clamp idioms
exporters write (tf2onnx's ends and limits of 10**9) inferred through whole graphs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_quant import inference
from onnx_quant.cli import main
from onnx_quant.inference import dims
from onnx_quant.inference.dims import DIM_MAX, Dim
from support.models import make_model

SYMBOLS = ("N", "H", "W")
N, H, W = (Dim.symbol(s) for s in SYMBOLS)

# A tree: ("int", v) | ("sym", s) | ("add"|"sub"|"max"|"min", a, b) | ("scale", a, k)
#       | ("floordiv"|"ceildiv", a, k)
leaves = st.one_of(
    st.integers(-12, 12).map(lambda v: ("int", v)),
    st.sampled_from([10**9, 2**31 - 1, DIM_MAX]).map(lambda v: ("int", v)),  # exporters' "no limit"
    st.sampled_from(SYMBOLS).map(lambda s: ("sym", s)),
)


def _extend(children):
    return st.one_of(
        st.tuples(st.sampled_from(["add", "sub", "max", "min"]), children, children),
        st.tuples(st.just("scale"), children, st.integers(-4, 4)),
        st.tuples(st.sampled_from(["floordiv", "ceildiv"]), children, st.integers(1, 8)),
    )


trees = st.recursive(leaves, _extend, max_leaves=10)
small = st.integers(0, 40)
# mostly small, sometimes near the ends of the range a dim can have
values = st.one_of(small, small, small, st.integers(0, DIM_MAX), st.integers(DIM_MAX - 40, DIM_MAX),
                   st.sampled_from([10**9 - 1, 10**9, 10**9 + 1]))
bindings = st.fixed_dictionaries({s: values for s in SYMBOLS})

#: these properties cost microseconds an example: several times the profile's count
_MANY = settings(max_examples=8 * settings.default.max_examples)

_OPS = {"add": dims.add, "sub": dims.sub, "max": dims.maximum, "min": dims.minimum,
        "scale": dims.mul, "floordiv": dims.floordiv, "ceildiv": dims.ceildiv}


def build(tree) -> dims.DimLike:
    kind = tree[0]
    if kind == "int":
        return tree[1]
    if kind == "sym":
        return Dim.symbol(tree[1])
    left = build(tree[1])
    right = tree[2] if kind in ("scale", "floordiv", "ceildiv") else build(tree[2])
    return _OPS[kind](left, right)


def value(tree, env: dict[str, int]) -> int:
    """The tree on plain Python ints, no simplification."""
    kind = tree[0]
    if kind == "int":
        return tree[1]
    if kind == "sym":
        return env[tree[1]]
    a = value(tree[1], env)
    if kind == "scale":
        return a * tree[2]
    if kind == "floordiv":
        return a // tree[2]
    if kind == "ceildiv":
        return -(-a // tree[2])
    b = value(tree[2], env)
    return {"add": a + b, "sub": a - b, "max": max(a, b), "min": min(a, b)}[kind]


@_MANY
@given(trees, bindings)
def test_simplification_never_changes_a_value(tree, env):
    assert dims.evaluate(build(tree), env) == value(tree, env)


@_MANY
@given(trees, bindings)
def test_text_round_trip_keeps_form_and_value(tree, env):
    d = build(tree)
    back = dims.parse(dims.to_text(d))
    assert back == d and hash(back) == hash(d)
    assert dims.to_text(back) == dims.to_text(d)
    assert dims.evaluate(back, env) == value(tree, env)


@_MANY
@given(trees, bindings)
def test_nonneg_proves_nothing_false(tree, env):
    d = build(tree)
    if dims.nonneg(d):
        assert dims.evaluate(d, env) >= 0
    if dims.nonneg(dims.neg(d)):
        assert dims.evaluate(d, env) <= 0


@_MANY
@given(trees, trees, bindings)
def test_max_and_min_are_canonical_and_exact(a, b, env):
    x, y = build(a), build(b)
    for fn, ref in ((dims.maximum, max), (dims.minimum, min)):
        got = fn(x, y)
        assert got == fn(y, x) and hash(got) == hash(fn(y, x))  # order of the arguments
        assert fn(x, x) == x
        assert fn(got, y) == got and fn(x, got) == got  # absorption: max(max(x, y), y)
        assert dims.evaluate(got, env) == ref(value(a, env), value(b, env))
    # min through max: min(x, y) = -max(-x, -y), the same form either way
    assert dims.minimum(x, y) == dims.neg(dims.maximum(dims.neg(x), dims.neg(y)))
    # a shift keeps the value (the form too when no argument has a constant of its own)
    shifted = dims.maximum(dims.add(x, 3), dims.add(y, 3))
    assert dims.evaluate(shifted, env) == max(value(a, env), value(b, env)) + 3


def _no_floor(children):
    return st.one_of(
        st.tuples(st.sampled_from(["add", "sub", "max", "min"]), children, children),
        st.tuples(st.just("scale"), children, st.integers(-4, 4)),
    )


#: trees without floors of their own: a floor of such a tree has one canonical form
floorless = st.recursive(leaves, _no_floor, max_leaves=6)


@_MANY
@given(trees, st.integers(1, 6), st.integers(1, 6), bindings)
def test_nested_floors_and_ceils_keep_their_value(tree, a, b, env):
    x = build(tree)
    v = value(tree, env)
    assert dims.evaluate(dims.floordiv(dims.floordiv(x, a), b), env) == v // (a * b)
    assert dims.evaluate(dims.ceildiv(dims.ceildiv(x, a), b), env) == -(-v // (a * b))


@_MANY
@given(floorless, st.integers(1, 6), st.integers(1, 6))
def test_nested_floors_and_ceils_merge(tree, a, b):
    # floor(floor(x / a) / b) = floor(x / (a*b)), ceil(ceil(x / a) / b) = ceil(x / (a*b)): one form
    x = build(tree)
    assert dims.floordiv(dims.floordiv(x, a), b) == dims.floordiv(x, a * b)
    assert dims.ceildiv(dims.ceildiv(x, a), b) == dims.ceildiv(x, a * b)


# ---------------------------------------------------------------- the identities, one by one
def t(d) -> str:
    return dims.to_text(d)


BIG_K = 10**9


@pytest.mark.parametrize("got, text", [
    # dims are >= 0
    (dims.maximum(N, 0), "N"),
    (dims.maximum(dims.add(N, 1), 1), "N + 1"),
    (dims.maximum(dims.mul(N, H), 0), "H*N"),
    (dims.maximum(dims.floordiv(N, 2), 0), "floor(N / 2)"),
    (dims.minimum(N, 0), "0"),
    (dims.maximum(dims.sub(N, 1), 0), "max(0, N - 1)"),  # N = 0 makes N - 1 negative: stays
    # min is -max(-a, -b), written min(a, b)
    (dims.minimum(N, H), "min(H, N)"),
    (dims.minimum(N, BIG_K), "min(1000000000, N)"),  # N <= 10**9 is not known: stays
    (dims.minimum(N, DIM_MAX), "N"),  # every dim is an int64
    (dims.maximum(dims.minimum(N, BIG_K), 0), "min(1000000000, N)"),
    (dims.maximum(dims.minimum(N, BIG_K), N), "N"),  # min(N, K) <= N, whatever K
    (dims.minimum(dims.maximum(N, H), N), "N"),
    (dims.maximum(dims.minimum(N, H), dims.add(N, H)), "H + N"),
    # nested maxima flatten, and an argument another one bounds goes
    (dims.maximum(dims.maximum(N, H), dims.maximum(0, dims.add(N, 1))), "max(H, N + 1)"),
    (dims.maximum(dims.add(N, 1), dims.add(H, 1)), "max(H, N) + 1"),
    (dims.minimum(dims.add(N, 1), dims.add(H, 1)), "min(H, N) + 1"),
    (dims.maximum(dims.mul(N, 2), N), "2*N"),
    # floors
    (dims.floordiv(N, 1), "N"),
    (dims.floordiv(dims.mul(N, 3), 3), "N"),
    (dims.floordiv(dims.add(dims.mul(N, 4), 6), 4), "N + 1"),
    (dims.floordiv(dims.floordiv(W, 2), 2), "floor(W / 4)"),
    (dims.floordiv(dims.add(dims.floordiv(dims.add(H, 1), 2), 1), 2), "floor((H + 3) / 4)"),
    (dims.ceildiv(N, 2), "floor((N + 1) / 2)"),
    (dims.ceildiv(dims.ceildiv(N, 2), 3), "floor((N + 5) / 6)"),
    (dims.ceildiv(dims.mul(N, 2), 4), "floor((N + 1) / 2)"),  # ceil(2N / 4) = ceil(N / 2)
    (dims.floordiv(dims.minimum(N, 1), 2), "0"),  # 0 <= min(N, 1) <= 1
    (dims.sub(N, dims.mul(dims.floordiv(N, 2), 2)), "-2*floor(N / 2) + N"),
])
def test_identity(got, text):
    assert t(got) == text
    assert dims.parse(text) == got


def test_strided_conv_chain_broadcast_is_the_larger_side():
    # an FPN adds a 2x-upsampled coarse map to a finer one: the broadcast of the two sizes is
    # max(2*ceil(x / 16), ceil(x / 8)), which is 2*ceil(x / 16) for every x >= 0
    x = Dim.symbol("x")
    sizes = [x]
    for _ in range(4):
        sizes.append(dims.floordiv(dims.add(sizes[-1], 1), 2))  # kernel 3, stride 2, pads 1
    assert t(sizes[4]) == "floor((x + 15) / 16)"
    up = dims.mul(sizes[4], 2)
    assert dims.broadcast(up, sizes[3]) == up
    assert dims.broadcast(dims.mul(up, 2), sizes[2]) == dims.mul(up, 2)


def test_nonneg_table():
    assert dims.nonneg(N) and dims.nonneg(dims.mul(N, H)) and dims.nonneg(dims.floordiv(N, 3))
    assert dims.nonneg(dims.minimum(N, 5)) and dims.nonneg(dims.sub(N, dims.minimum(N, H)))
    assert dims.nonneg(dims.sub(N, dims.mul(dims.floordiv(N, 2), 2)))  # N mod 2
    assert dims.nonneg(dims.sub(dims.mul(dims.floordiv(dims.add(N, 1), 2), 2), N))  # 2*ceil(N/2) - N
    assert dims.nonneg(dims.sub(DIM_MAX, N))
    assert not dims.nonneg(dims.sub(N, 1)) and not dims.nonneg(dims.sub(BIG_K, N))
    assert not dims.nonneg(dims.sub(N, H)) and not dims.nonneg(None)


def test_tf2onnx_text_reads_back_simplified():
    # the text older versions wrote for a tf2onnx classifier's batch dim
    assert dims.parse("max(-max(-1000000000, -unk__214), 0, unk__214)") == Dim.symbol("unk__214")
    assert t(dims.parse("-max(-1000000000, -unk__214)")) == "min(1000000000, unk__214)"
    assert dims.parse("ceil(N / 4)") == dims.ceildiv(N, 4)
    assert dims.parse("min(N, H, 3)") == dims.minimum(dims.minimum(N, H), 3)


@_MANY
@given(trees, trees, trees)
def test_maximum_is_associative(a, b, c):
    # the arguments a max keeps are those no other provably bounds: the same set whatever the
    # grouping, as long as the proofs agree (nonneg is a sufficient test, not a decision)
    x, y, z = build(a), build(b), build(c)
    assert dims.maximum(dims.maximum(x, y), z) == dims.maximum(x, dims.maximum(y, z))
    assert dims.minimum(dims.minimum(x, y), z) == dims.minimum(x, dims.minimum(y, z))


# ---------------------------------------------------------------- exporters' clamp idioms, whole graphs
I64_MAX = 2**63 - 1
F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def _i64(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def _model(nodes, inits, outputs=("y",), opset=15) -> onnx.ModelProto:
    return make_model(nodes, [("x", F32, ["N", 8])], [(o, F32, None) for o in outputs], inits, opset,
                      graph_name="tf2onnx_idiom")


def _shapes(model) -> dict[str, str]:
    values = inference.infer_values(model, strict=True)
    return {name: "[" + ", ".join(dims.to_text(d) for d in info.shape) + "]"
            for name, info in values.items() if info.shape is not None}


def _batch_through(clamp_nodes, inits, opset=15) -> onnx.ModelProto:
    """x [N, 8] -> Shape -> Gather(0) -> Unsqueeze -> <clamp> -> Concat with [8] -> Reshape(x),
    then the result added to x: the graph tf2onnx writes for a reshape to [batch, 8] with the batch
    read from the input and clamped (``b`` is the clamped batch, a 1-element int64)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        *clamp_nodes,
        helper.make_node("Concat", ["b", "eight"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Add", ["r", "x"], ["y"]),
    ]
    base = [_i64("zero", 0), _i64("axes0", [0]), _i64("eight", [8])]
    return _model(nodes, base + list(inits), outputs=("y", "r"), opset=opset)


@pytest.mark.parametrize("limit, reshaped", [
    (10**9, "[min(1000000000, N), 8]"),  # sound only for N <= 10**9: kept as a min
    (2**31 - 1, "[min(2147483647, N), 8]"),
    (I64_MAX, "[N, 8]"),  # every dim is an int64
])
def test_min_of_a_batch_read_by_shape(limit, reshaped):
    model = _batch_through([helper.make_node("Min", ["n1", "limit"], ["b"])], [_i64("limit", [limit])])
    shapes = _shapes(model)
    assert shapes["b"] == "[1]" and shapes["r"] == reshaped
    # added to x itself, the clamped batch meets N again: max(min(N, K), N) is N for every N
    assert shapes["y"] == "[N, 8]"


@pytest.mark.parametrize("lo, hi, reshaped", [
    (0, 10**9, "[min(1000000000, N), 8]"),
    (0, I64_MAX, "[N, 8]"),  # max(N, 0) = N and min(N, int64 max) = N
    (1, I64_MAX, "[max(1, N), 8]"),  # N may be 0
])
def test_clip_of_a_batch_read_by_shape(lo, hi, reshaped):
    model = _batch_through([helper.make_node("Clip", ["n1", "lo", "hi"], ["b"])],
                           [_i64("lo", lo), _i64("hi", hi)], opset=13)
    shapes = _shapes(model)
    assert shapes["r"] == reshaped
    if lo == 0:
        assert shapes["y"] == "[N, 8]"


def test_slice_of_the_shape_to_1e9_is_exact():
    # tf2onnx's strided_slice of a shape vector: the vector's length is known, so the clamp is exact
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Slice", ["shape", "starts", "ends", "axes"], ["b"]),
             helper.make_node("Reshape", ["x", "b"], ["y"])]
    model = _model(nodes, [_i64("starts", [0]), _i64("ends", [10**9]), _i64("axes", [0])])
    assert _shapes(model)["y"] == "[N, 8]"


def _sliced_classifier() -> onnx.ModelProto:
    """What a tf2onnx byte classifier does to its batch (magika's standard_v3_3, tf2onnx 1.16):
    a strided_slice of the data with every end 10**9 (int32), a second one with ends 2**31 - 1,
    then, after the layers, an elementwise op with a tensor whose batch is the input's own."""
    nodes = [
        helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["s1"]),
        helper.make_node("Relu", ["s1"], ["h"]),
        helper.make_node("Slice", ["h", "starts2", "ends2", "axes2"], ["s2"]),
        helper.make_node("ReduceSum", ["x", "axes1"], ["mean"], keepdims=1),
        helper.make_node("Sub", ["s2", "mean"], ["y"]),
    ]
    i32 = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.int32), name)  # noqa: E731
    inits = [i32("starts", [0, 0]), i32("ends", [10**9, 10**9]), i32("axes", [0, 1]), i32("steps", [1, 1]),
             _i64("starts2", [0, 0]), _i64("ends2", [2**31 - 1, 2**31 - 1]), _i64("axes2", [0, 1]), _i64("axes1", [1])]
    return _model(nodes, inits, outputs=("y",))


def test_tf2onnx_classifier_batch_is_the_plain_symbol():
    shapes = _shapes(_sliced_classifier())
    assert shapes["s1"] == "[min(1000000000, N), 8]"  # what ONNX's Slice clamps to, no assumption
    assert shapes["s2"] == "[min(1000000000, N), 8]"  # was max(-max(-1000000000, -N), 0)
    assert shapes["y"] == "[N, 8]"  # was max(-max(-1000000000, -N), 0, N)


def test_infer_cli_prints_the_plain_symbol(tmp_path, capsys):
    path = tmp_path / "classifier.onnx"
    onnx.save(_sliced_classifier(), str(path))
    assert main(["infer", str(path)]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:-1]}
    assert "[N, 8]" in rows["y"] and "max(" not in rows["y"]
    assert "[min(1000000000, N), 8]" in rows["s2"]

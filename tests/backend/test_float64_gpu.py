"""float64 on the device (templates/snippets/float64.wgsl.jinja; docs/backend.md, "float64 on the
device"): soft-float binary64 on the two u32 words of each element, through the elementwise
table's float64 ops (Add, Sub, Mul, Mod with fmod 0 and 1, Max, Min, Neg, Abs and the five
comparisons), all of them in one model.

Every result is compared with numpy's float64 bit for bit (NaN results: NaN-ness only, the bits
of a NaN being the CPU's choice), on hypothesis' pairs (random bit patterns, specials,
subnormals, operands of close magnitude, exact ties of a sum and of a product, normal and
subnormal) and on a dense deterministic sample of each kind; fmod's remainder loop at the widest
exponent gap (the largest finite value by the smallest subnormal) in both elementwise variants.
CumSum / CumProd and Einsum take float64 through the same snippet (test_reductions_gpu.py,
test_einsum_gpu.py).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper

from support.gpu import gpu_examples
from support.models import make_model

#: (output, op, attributes, numpy function over (a, b)); the unary ops read a
OPS = [("add", "Add", {}, np.add), ("sub", "Sub", {}, np.subtract), ("mul", "Mul", {}, np.multiply),
       ("fmod", "Mod", {"fmod": 1}, np.fmod), ("mod", "Mod", {"fmod": 0}, np.mod),
       ("max", "Max", {}, np.maximum), ("min", "Min", {}, np.minimum),
       ("neg", "Neg", {}, lambda a, b: np.negative(a)), ("abs", "Abs", {}, lambda a, b: np.abs(a)),
       ("eq", "Equal", {}, np.equal), ("lt", "Less", {}, np.less), ("gt", "Greater", {}, np.greater),
       ("le", "LessOrEqual", {}, np.less_equal), ("ge", "GreaterOrEqual", {}, np.greater_equal)]
_COMPARES = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"}
_UNARY = {"Neg", "Abs"}

MAX = 1.7976931348623157e308
TINY = 5e-324  # the smallest subnormal
SPECIALS = [0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 1.0, -1.0, 0.5, 1.5, 3.0, -3.0, 0.1, TINY, -TINY,
            2.2250738585072014e-308, 2.225073858507201e-308, -2.225073858507201e-308, MAX, -MAX,
            2.0 ** 53, 2.0 ** 53 + 2, 2.0 ** -1022 * 1.5, 1e308, 1e-308, 4.9e-322]


def _model():
    nodes = [helper.make_node(op, ["a"] if op in _UNARY else ["a", "b"], [out], **attrs) for out, op, attrs, _ in OPS]
    outs = [(out, TensorProto.BOOL if op in _COMPARES else TensorProto.DOUBLE, ["n"]) for out, op, _, _ in OPS]
    return make_model(nodes, [("a", TensorProto.DOUBLE, ["n"]), ("b", TensorProto.DOUBLE, ["n"])], outs, opset=18)


@pytest.fixture(scope="module")
def session(best):
    from onnx_quant.backend_wgpu.session import Session

    with Session(_model(), device=best, allow_host_fallback=False) as s:
        yield s


def assert_like_numpy(session, a, b):
    """Every op of OPS on (a, b) against numpy: the same bits, NaN where numpy has a NaN."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    got = session.run(None, {"a": a, "b": b})
    for (out, op, _, fn), g in zip(OPS, got):
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = fn(a, b)
        assert g.dtype == want.dtype and g.shape == want.shape, out
        nan = np.isnan(want) if want.dtype == np.float64 else np.zeros(want.shape, bool)
        if nan.any():
            assert np.array_equal(np.isnan(g), nan), (out, a[np.isnan(g) != nan][:4], b[np.isnan(g) != nan][:4])
        g_, w_ = g[~nan], want[~nan]
        bad = np.nonzero(g_.view(np.uint64) != w_.view(np.uint64) if g.dtype == np.float64 else g_ != w_)[0]
        if bad.size:
            k = np.nonzero(~nan)[0][bad[0]]
            raise AssertionError(f"{out}({a[k]!r}, {b[k]!r}): got {g[k]!r}, numpy {want[k]!r} "
                                 f"({bad.size} of {a.size} differ)")


def _f64(bits: int) -> float:
    return float(np.array([bits], np.uint64).view(np.float64)[0])


def _bits(x: float) -> int:
    return int(np.array([x], np.float64).view(np.uint64)[0])


_value = st.one_of(
    st.integers(0, 2 ** 64 - 1).map(_f64),                                     # random bit patterns
    st.sampled_from(SPECIALS),
    st.tuples(st.integers(0, 1), st.integers(0, 2 ** 52 - 1)).map(lambda t: _f64(t[0] << 63 | t[1])),  # subnormals
    st.floats(width=64),
)


@st.composite
def _close(draw):
    """Operands within a few binades of each other (cancellation, alignment by a few bits)."""
    a = _bits(draw(st.floats(allow_nan=False, allow_infinity=False, width=64)))
    e = min(max((a >> 52 & 0x7ff) + draw(st.integers(-60, 60)), 0), 2046)
    b = draw(st.integers(0, 1)) << 63 | e << 52 | draw(st.integers(0, 2 ** 52 - 1))
    return _f64(a), _f64(b)


@st.composite
def _add_tie(draw):
    """a + b exactly halfway between two float64 values: a = M 2^k (53 bits), b = +-j 2^(k-1), j odd."""
    m, k = draw(st.integers(2 ** 52 + 8, 2 ** 53 - 8)), draw(st.integers(-1073, 970))
    j = draw(st.sampled_from([1, 3, 5, 7, 9, 15])) * draw(st.sampled_from([1, -1]))
    return math.ldexp(m, k), math.ldexp(j, k - 1)


@st.composite
def _mul_tie(draw):
    """a * b exactly halfway: odd m1, m2 whose product has 54 bits (a normal result), or any
    odd m1 m2 < 2^53 scaled by 2^-1075 (halfway between two subnormals)."""
    m1 = draw(st.integers(2 ** 25, 2 ** 26 - 1)) * 2 + 1
    if draw(st.booleans()):
        m2 = draw(st.integers(0, 2 ** 25)) * 2 + 1
        m2 -= 2 if m1 * m2 >= 2 ** 53 else 0
        k1 = draw(st.integers(-1074, -1))
        k2 = -1075 - k1
    else:
        lo, hi = -(-(2 ** 53) // m1), (2 ** 54 - 1) // m1
        m2 = draw(st.integers(lo // 2, (hi - 1) // 2)) * 2 + 1
        k1 = draw(st.integers(-1074, 996))
        k2 = draw(st.integers(max(-1074, -1075 - k1), min(996, 969 - k1)))
    sa, sb = draw(st.sampled_from([1, -1])), draw(st.sampled_from([1, -1]))
    return sa * math.ldexp(m1, k1), sb * math.ldexp(m2, k2)


_pairs = st.lists(st.one_of(st.tuples(_value, _value), _close(), _add_tie(), _mul_tie()), min_size=1, max_size=64)


@settings(max_examples=gpu_examples())
@given(pairs=_pairs)
def test_every_op_is_numpys_float64_bit_for_bit(session, pairs):
    a, b = zip(*pairs)
    assert_like_numpy(session, a, b)


def _from_fields(r, n, exp_lo, exp_hi):
    sign = r.integers(0, 2, n, dtype=np.uint64) << np.uint64(63)
    exp = r.integers(exp_lo, exp_hi, n, dtype=np.uint64) << np.uint64(52)
    return (sign | exp | r.integers(0, 2 ** 52, n, dtype=np.uint64)).view(np.float64)


@np.errstate(over="ignore")
def dense_sample(n=4000, seed=3):
    """(a, b): each kind of operand pair of the property test, n of each, and every pair of SPECIALS."""
    r = np.random.default_rng(seed)
    sp = np.array(SPECIALS)
    a = [np.repeat(sp, sp.size), r.integers(0, 2 ** 64, n, dtype=np.uint64).view(np.float64)]
    b = [np.tile(sp, sp.size), r.integers(0, 2 ** 64, n, dtype=np.uint64).view(np.float64)]
    a.append(_from_fields(r, n, 0, 2047))
    b.append((a[-1].view(np.uint64) ^ r.integers(0, 2 ** 56, n, dtype=np.uint64)).view(np.float64))  # close
    a.append(_from_fields(r, n, 0, 3)), b.append(_from_fields(r, n, 0, 60))  # subnormal and tiny
    a.append(_from_fields(r, n, 1, 2047))  # products near underflow and overflow
    b.append(np.where(r.integers(0, 2, n) == 1, 1.0, -1.0) * np.ldexp(1.0 + r.random(n), 1024 - (a[-1].view(
        np.uint64) >> np.uint64(52)).astype(np.int64) + r.integers(-1100, 1030, n)))
    m, k = r.integers(2 ** 52 + 8, 2 ** 53 - 8, n).astype(np.float64), r.integers(-1073, 970, n)  # sum ties
    a.append(np.ldexp(m, k)), b.append(np.ldexp(2.0 * r.integers(0, 8, n) + 1, k - 1) * np.sign(r.random(n) - 0.5))
    m1 = r.integers(2 ** 25, 2 ** 26, n) * 2 + 1  # product ties: odd m1 m2 of 54 bits
    lo, hi = -(-(2 ** 53) // m1), (2 ** 54 - 1) // m1
    m2 = (lo + (r.random(n) * (hi - lo - 1)).astype(np.int64)) | 1
    k1 = r.integers(-1074, 997, n)
    k2 = np.floor(np.maximum(-1074, -1075 - k1) + r.random(n) * (np.minimum(996, 969 - k1) - np.maximum(-1074, -1075 - k1)))
    a.append(np.ldexp(m1.astype(np.float64), k1)), b.append(np.ldexp(m2.astype(np.float64), k2.astype(np.int64)))
    return np.concatenate(a), np.concatenate(b)


def test_a_dense_sample_is_numpys_float64_bit_for_bit(session):
    a, b = dense_sample()
    assert_like_numpy(session, a, b)
    assert_like_numpy(session, b, a)


def test_fmod_across_the_widest_exponent_gap_in_every_variant(best):
    from onnx_quant.backend_wgpu.session import Session

    # the largest finite values by the smallest subnormals: 2097 doublings each (263 loop iterations)
    r = np.random.default_rng(5)
    a = np.concatenate([[MAX, -MAX, MAX], _from_fields(r, 997, 2040, 2047)])
    b = np.concatenate([[TINY, TINY, -3 * TINY], _from_fields(r, 997, 0, 1)])
    model = make_model([helper.make_node("Mod", ["a", "b"], ["y"], fmod=1), helper.make_node("Mod", ["a", "b"], ["z"], fmod=0)],
                       [("a", TensorProto.DOUBLE, ["n"]), ("b", TensorProto.DOUBLE, ["n"])],
                       [("y", TensorProto.DOUBLE, ["n"]), ("z", TensorProto.DOUBLE, ["n"])], opset=18)
    with np.errstate(all="ignore"):
        want = [np.fmod(a, b), np.mod(a, b)]
    for variant in ("word_per_invocation", "words_per_invocation"):
        with Session(model, device=best, allow_host_fallback=False, variants={"Mod": variant},
                     tunables={"Mod": {"COARSE_MIN_WORDS": 0, "WORDS_PER_THREAD": 16}}) as s:
            got = s.run(None, {"a": a, "b": b})
        for g, w in zip(got, want):
            assert np.array_equal(g.view(np.uint64), w.view(np.uint64)), variant

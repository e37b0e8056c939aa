"""The elementwise table's kernels (templates/elementwise.ops.json) on the GPU.

- ONNX's node cases of every op of the table pass with no host fallback, or are named in
  DECLINED with the clause that declines them (never a wrong value);
- ops whose result is one correctly rounded operation (or exact) agree with numpy bit for
  bit, NaN, infinities, zeros and subnormals included;
- the transcendental ones meet ONNX's rule (rtol 1e-3, atol 1e-7) against float64 on a dense
  sample (tests/support/elementwise_accuracy.py; the measured errors are in docs/kernels.md);
- every variant gives the same bits.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from support.gpu import assert_node_cases_pass_or_declined
from support.elementwise_accuracy import REFERENCES, errors, reference, unary_model
from support.models import node_model
from onnx_quant.backend_wgpu.spec import templates_dir

OPS = sorted(json.loads((templates_dir() / "elementwise.ops.json").read_text())["ops"])

#: node cases of these ops that stay off the GPU, and the words of the reason
_NARROW = "T allows only"
DECLINED = {
    "test_equal_string": "element type string", "test_equal_string_broadcast": "element type string",
    "test_celu_bfloat16": _NARROW, "test_celu_bfloat16_expanded": "bfloat16",
    # integer bases with float exponents: onnxruntime's double pow has no exact f32 form here
    "test_pow_types_int64_float32": "'exprOk' is false", "test_pow_types_int32_float32": "'exprOk' is false",
}


def test_onnx_node_cases_pass_on_the_gpu_or_are_declined_by_name(best):
    assert_node_cases_pass_or_declined(best, OPS, DECLINED, 320)


def _run(model, feeds, **kw):
    from onnx_quant.backend_wgpu.session import Session

    with Session(model, allow_host_fallback=False, **kw) as s:
        return s.run(None, feeds)


def _specials(seed=0) -> np.ndarray:
    r = np.random.default_rng(seed)
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-39, -3e-39, 1.0, -1.0,
                        0.5, -0.5, 2.5, -2.5, 3.4e38, -3.4e38, 1e-30, 6.0, -3.0, 3.0], np.float32)
    rand = (r.standard_normal(2000) * np.exp(r.uniform(-8, 8, 2000))).astype(np.float32)
    return np.concatenate([special, rand])


def _bits(a):
    a = np.asarray(a)
    if a.dtype.kind == "f":
        a = np.where(np.isnan(a), np.array(np.nan, a.dtype), a)
    return a.view(np.uint8)


def _model(op, arrays, out_dtype, attrs=None, opset=18, inits=()):
    return node_model(op, list(arrays.items()), ["out"], attrs=attrs, opset=opset, out_types=[out_dtype],
                      inits={n: arrays[n] for n in inits})


f32 = np.float32
X = _specials()
with np.errstate(all="ignore"):
    UNARY_EXACT = {  # op -> (attributes, numpy in float32)
        "Abs": ({}, np.abs), "Neg": ({}, np.negative), "Floor": ({}, np.floor), "Ceil": ({}, np.ceil),
        "Reciprocal": ({}, lambda x: np.reciprocal(x)), "Softsign": ({}, lambda x: x / (f32(1) + np.abs(x))),
        "Sign": ({}, np.sign), "Relu": ({}, lambda x: np.where(x < 0, f32(0), x)),
        "HardSigmoid": ({"alpha": 0.3, "beta": 0.4},
                        lambda x: np.maximum(f32(0), np.minimum(f32(1), x * f32(0.3) + f32(0.4)))),
        "HardSwish": ({}, lambda x: x * np.maximum(f32(0), np.minimum(f32(1), x * f32(1 / 6) + f32(0.5)))),
        "ThresholdedRelu": ({"alpha": 0.5}, lambda x: np.where(x > f32(0.5), x, f32(0))),
        "LeakyRelu": ({"alpha": 0.1}, lambda x: np.where(x >= 0, x, x * f32(0.1))),
        "Round": ({}, np.round),
        "Shrink": ({"bias": 0.25, "lambd": 0.5},
                   lambda x: np.where(x < f32(-0.5), x + f32(0.25), np.where(x > f32(0.5), x - f32(0.25), f32(0)))),
    }


@pytest.mark.parametrize("op", sorted(UNARY_EXACT))
def test_exact_unary_ops_match_numpy_bit_for_bit(best, op):
    attrs, fn = UNARY_EXACT[op]
    with np.errstate(all="ignore"):
        expected = fn(X).astype(f32)
    (got,) = _run(_model(op, {"x": X}, f32, attrs), {"x": X}, device=best)
    bad = np.nonzero(_bits(got).view(np.uint32) != _bits(expected).view(np.uint32))[0]
    assert bad.size == 0, (op, X[bad[:5]], got[bad[:5]], expected[bad[:5]])


def test_integer_unary_ops_wrap_as_numpy(best):
    for dtype in (np.int8, np.uint8, np.int32):
        info = np.iinfo(dtype)
        x = np.array([info.min, info.min + 1, -1 if info.min else 1, 0, 1, 7, info.max], dtype)
        for op, fn in (("Abs", np.abs), ("Sign", np.sign), ("Neg", np.negative), ("Relu", lambda v: np.maximum(v, 0))):
            if (op == "Neg" and dtype == np.uint8) or (op == "Relu" and dtype == np.uint8):
                continue  # not in ONNX's constraints
            (got,) = _run(_model(op, {"x": x}, dtype), {"x": x}, device=best)
            assert got.dtype == dtype and np.array_equal(got, fn(x)), (op, dtype, got)


def test_predicates_compare_and_logic_match_numpy(best):
    (nan,) = _run(_model("IsNaN", {"x": X}, bool), {"x": X}, device=best)
    assert np.array_equal(nan, np.isnan(X))
    for pos, neg in ((1, 1), (1, 0), (0, 1)):
        (inf,) = _run(_model("IsInf", {"x": X}, bool, {"detect_positive": pos, "detect_negative": neg}), {"x": X},
                      device=best)
        assert np.array_equal(inf, (np.isposinf(X) & bool(pos)) | (np.isneginf(X) & bool(neg)))
    a = X[:600].reshape(20, 30)
    b = np.concatenate([X[600:630]]).reshape(1, 30)
    b[0, :5] = a[0, :5]  # some equal pairs
    for op, fn in (("Equal", np.equal), ("Less", np.less), ("Greater", np.greater),
                   ("LessOrEqual", np.less_equal), ("GreaterOrEqual", np.greater_equal)):
        for lhs, rhs in ((a, b), (a.astype(np.int8), b.astype(np.int8)), (a.astype(np.float16), b.astype(np.float16))):
            with np.errstate(all="ignore"):
                lhs, rhs = np.nan_to_num(lhs) if lhs.dtype.kind == "i" else lhs, rhs
                (got,) = _run(_model(op, {"a": lhs, "b": rhs}, bool), {"a": lhs, "b": rhs}, device=best)
            assert np.array_equal(got, fn(lhs, rhs)), (op, lhs.dtype)
    p = np.random.default_rng(1).integers(0, 2, (4, 1, 5)).astype(bool)
    q = np.random.default_rng(2).integers(0, 2, (3, 1)).astype(bool)
    for op, fn in (("And", np.logical_and), ("Or", np.logical_or), ("Xor", np.logical_xor)):
        (got,) = _run(_model(op, {"a": p, "b": q}, bool), {"a": p, "b": q}, device=best)
        assert np.array_equal(got, fn(p, q)), op
    (got,) = _run(_model("Not", {"x": p}, bool), {"x": p}, device=best)
    assert np.array_equal(got, ~p)


def test_prelu_broadcasts_its_slope(best):
    x = X[:600].reshape(2, 3, 100)
    slope = np.array([[0.5], [-2.0], [0.0]], f32)  # per channel
    (got,) = _run(_model("PRelu", {"x": x, "slope": slope}, f32, inits=("slope",)), {"x": x}, device=best)
    with np.errstate(all="ignore"):
        expected = np.where(x > 0, x, x * slope).astype(f32)
    assert np.array_equal(_bits(got), _bits(expected))
    xi = np.arange(-6, 6, dtype=np.int32).reshape(3, 4)
    (got,) = _run(_model("PRelu", {"x": xi, "slope": np.int32([3])}, np.int32, inits=("slope",)), {"x": xi},
                  device=best)
    assert np.array_equal(got, np.where(xi > 0, xi, xi * 3))


def test_pow_special_cases_follow_c(best):
    bases = np.array([-8, -2, -0.0, 0, 0.5, 1, 2, 3, np.inf, -np.inf, np.nan, -1, 1.5], f32)
    exps = np.array([0, 1, 2, 3, -1, 0.5, -2, np.inf, -np.inf, np.nan, 4, 1 / 3], f32)
    a = np.repeat(bases, exps.size).reshape(bases.size, exps.size)
    b = np.tile(exps, bases.size).reshape(bases.size, exps.size)
    (got,) = _run(_model("Pow", {"a": a, "b": b}, f32), {"a": a, "b": b}, device=best)
    with np.errstate(all="ignore"):
        expected = np.power(a.astype(np.float64), b.astype(np.float64)).astype(f32)
    same_class = (np.isnan(got) == np.isnan(expected)) & ((np.signbit(got) == np.signbit(expected)) | np.isnan(got))
    assert same_class.all(), list(zip(a[~same_class], b[~same_class], got[~same_class]))
    close = np.isclose(got, expected, rtol=1e-6, atol=0, equal_nan=True)
    assert close.all(), list(zip(a[~close], b[~close], got[~close], expected[~close]))
    exact2 = np.power(X[np.isfinite(X)], f32(2))
    (sq,) = _run(_model("Pow", {"a": X[np.isfinite(X)], "b": f32(2)}, f32, inits=("b",)), {"a": X[np.isfinite(X)]},
                 device=best)
    assert np.array_equal(_bits(sq), _bits(exact2))  # x * x: one rounding, as numpy
    ib = np.array([3, -2, 0, 5], np.int32)
    (gi,) = _run(_model("Pow", {"a": np.full(4, -2, f32), "b": ib}, f32), {"a": np.full(4, -2, f32), "b": ib},
                 device=best)
    assert np.array_equal(gi, np.power(f32(-2), ib.astype(f32)))


@pytest.mark.parametrize("op", sorted(REFERENCES))
def test_transcendentals_meet_onnx_rule_on_a_dense_sample(best, op):
    x, _, attrs = REFERENCES[op]
    (y,) = _run(unary_model(op, x.size, attrs), {"x": x}, device=best)
    exact = reference(op, x)
    assert np.array_equal(np.isnan(y), np.isnan(exact))
    worst_abs, worst_rel, excess = errors(y, exact)
    assert excess <= 0 and worst_rel < 1e-3, (op, worst_abs, worst_rel)


def test_float16_is_computed_in_float32_and_rounded_once(best):
    x = np.linspace(-4, 4, 4001).astype(np.float16)
    for op, fn in (("Exp", np.exp), ("Tanh", np.tanh), ("HardSwish", None), ("Sqrt", np.sqrt)):
        xs = np.abs(x) if op == "Sqrt" else x
        (got,) = _run(_model(op, {"x": xs}, np.float16), {"x": xs}, device=best)
        assert got.dtype == np.float16
        x64 = xs.astype(np.float64)
        ref = x64 * np.clip(x64 / 6 + 0.5, 0, 1) if fn is None else fn(x64)
        assert np.allclose(got.astype(np.float64), ref, rtol=2 ** -10, atol=2 ** -24), op


def test_every_variant_gives_the_same_bits(best):
    x = np.tile(X, 40)  # > COARSE_MIN_WORDS = 0 forced below either way
    for op in ("Exp", "Softplus", "HardSigmoid", "Abs"):
        outs = []
        for variant in ("word_per_invocation", "words_per_invocation"):
            (y,) = _run(_model(op, {"x": x}, f32), {"x": x}, device=best, variants={op: variant},
                        tunables={"COARSE_MIN_WORDS": 0})
            outs.append(_bits(y))
        assert np.array_equal(outs[0], outs[1]), op
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = (x > 0)
        outs = [_bits(_run(_model("Not", {"x": b}, bool), {"x": b}, device=best, variants={"Not": v},
                           tunables={"COARSE_MIN_WORDS": 0})[0]) for v in ("word_per_invocation", "words_per_invocation")]
    assert np.array_equal(*outs)


def test_float64_is_declined_by_type_never_narrowed(best):
    from onnx_quant.errors import ExecutionError

    x = np.array([1.0, 2.0], np.float64)
    with pytest.raises(ExecutionError, match=r"'x' is float64, T allows only float32, float16"):
        _run(_model("Exp", {"x": x}, np.float64), {"x": x}, device=best)


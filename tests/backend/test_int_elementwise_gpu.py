"""Exact integer elementwise arithmetic on the GPU, every integer width ONNX allows, int64 and
uint64 included (vec2<u32> registers, templates/snippets/int64.wgsl.jinja; docs/backend.md,
"int64 on the device").

Every result is compared bit for bit: with numpy (wrapping integer arithmetic) on each type's
edge values (minimum, maximum, 0, -1, the 32-bit word boundaries of the 64-bit types) crossed
with each other and with random values; with onnx.reference for Div, Mod and BitShift (their
ONNX definitions: truncating division, x / 0 and x mod 0 give 0, shift counts out of range
give the sign fill); with onnxruntime for integer Pow and where it defines the result. Also:
n-ary Max / Min / Sum / Mean (1 to 8 inputs, broadcasting; float64 too), Where over every type
with a device layout, float Mod exact as C's fmod and numpy's mod (float64 too), every variant
giving the same bits, and what is declined (an op without float64 arithmetic, more inputs than
bindings) is declined by type or count.
The exactness tests run on the default adapter and on the OpenGL one where present (naga
translates the WGSL to GLSL there: integer division, remainders and shifts meet another
compiler).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from support.models import node_model

INT_TYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
SIGNED = [t for t in INT_TYPES if np.dtype(t).kind == "i"]
IDS = [np.dtype(t).name for t in INT_TYPES]


def _model(op, arrays, out_dtype, attrs=None, opset=18, names=None):
    return node_model(op, list(zip(names or list(arrays), arrays.values())), ["out"], attrs=attrs, opset=opset,
                      out_types=[out_dtype])


def _run(op, arrays, out_dtype, device, attrs=None, opset=18, **kw):
    from onnx_quant.backend_wgpu.session import Session

    names = [f"i{k}" for k in range(len(arrays))]
    model = _model(op, arrays, out_dtype, attrs, opset, names)
    with Session(model, allow_host_fallback=False, device=device, **kw) as s:
        (got,) = s.run(None, dict(zip(names, arrays.values())))
    return got


def _reference(op, arrays, out_dtype, attrs=None, opset=18):
    from onnx.reference import ReferenceEvaluator

    names = [f"i{k}" for k in range(len(arrays))]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(_model(op, arrays, out_dtype, attrs, opset, names)).run(
            None, dict(zip(names, arrays.values())))[0]


def edges(dtype) -> np.ndarray:
    """The type's edge values, the 32-bit word boundaries of 64-bit types, small values."""
    info = np.iinfo(dtype)
    vals = {info.min, info.min + 1, info.max, info.max - 1, 0, 1, 2, 3, 7, info.max // 2, info.max // 2 + 1}
    if info.min < 0:
        vals |= {-1, -2, -3, -7, info.min // 2}
    if info.bits == 64:
        vals |= {2 ** 32 - 1, 2 ** 32, 2 ** 32 + 1, 2 ** 31, 3 * 2 ** 40 + 12345, 2 ** 53 + 1}
        if info.min < 0:
            vals |= {-(2 ** 32), -(2 ** 32) - 1, -(2 ** 31) - 1, -(3 * 2 ** 40) - 12345}
    return np.array(sorted(vals), dtype)


def random_values(dtype, n, seed) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max, n, dtype=dtype, endpoint=True)


def pairs(dtype, seed=0):
    """(a, b) broadcasting to every pair of edge values, plus random pairs."""
    e = edges(dtype)
    a = np.concatenate([np.repeat(e, e.size), random_values(dtype, 300, seed)])
    b = np.concatenate([np.tile(e, e.size), random_values(dtype, 300, seed + 1)])
    return a, b


def assert_same(got, expected, what):
    expected = np.asarray(expected)
    assert got.dtype == expected.dtype and got.shape == expected.shape, (what, got.dtype, got.shape, expected.shape)
    bad = np.nonzero(got.reshape(-1).view(np.uint8) != expected.reshape(-1).view(np.uint8))[0]
    if bad.size:
        k = bad[0] // got.dtype.itemsize
        raise AssertionError(f"{what}: element {k}: got {got.reshape(-1)[k]}, expected {expected.reshape(-1)[k]}")


# ----------------------------------------------------------------------------- arithmetic


@pytest.mark.parametrize("dtype", INT_TYPES, ids=IDS)
def test_add_sub_mul_wrap_as_numpy(dev, dtype):
    a, b = pairs(dtype)
    for op, fn in (("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply)):
        with np.errstate(all="ignore"):
            expected = fn(a, b)
        assert_same(_run(op, {"a": a, "b": b}, dtype, dev), expected, f"{op} {np.dtype(dtype).name}")


@pytest.mark.parametrize("dtype", INT_TYPES, ids=IDS)
def test_div_and_mod_follow_onnx_reference(dev, dtype):
    a, b = pairs(dtype, seed=5)
    for op, attrs in (("Div", {}), ("Mod", {"fmod": 0}), ("Mod", {"fmod": 1})):
        got = _run(op, {"a": a, "b": b}, dtype, dev, attrs)
        assert_same(got, _reference(op, {"a": a, "b": b}, dtype, attrs), f"{op} {attrs} {np.dtype(dtype).name}")
    # the documented cases, from Python's exact integers
    info = np.iinfo(dtype)
    a = np.array([7, info.max, 0, 5, info.min], dtype)
    b = np.array([0, 0, 0, 3, 1], dtype)
    assert_same(_run("Div", {"a": a, "b": b}, dtype, dev), np.array([0, 0, 0, 1, info.min], dtype), "x / 0")
    for fmod in (0, 1):
        assert_same(_run("Mod", {"a": a, "b": b}, dtype, dev, {"fmod": fmod}), np.array([0, 0, 0, 2, 0], dtype),
                    "x mod 0")
    if info.min < 0:
        a = np.array([info.min, -7, 7, -7, info.min], dtype)
        b = np.array([-1, 2, -2, -2, 7], dtype)
        trunc = [info.min, -3, -3, 3, -(-info.min // 7)]
        assert_same(_run("Div", {"a": a, "b": b}, dtype, dev), np.array(trunc, dtype), "truncating division")
        assert_same(_run("Mod", {"a": a, "b": b}, dtype, dev, {"fmod": 1}),
                    np.array([0, -1, 1, -1, info.min - trunc[4] * 7], dtype), "fmod 1: the dividend's sign")
        assert_same(_run("Mod", {"a": a, "b": b}, dtype, dev), np.array([0, 1, -1, -1, info.min % 7], dtype),
                    "fmod 0: the divisor's sign")


@pytest.mark.parametrize("dtype", INT_TYPES, ids=IDS)
def test_div_agrees_with_onnxruntime_where_it_defines_the_result(best, dtype):
    import onnxruntime as ort

    a, b = pairs(dtype, seed=9)
    info = np.iinfo(dtype)
    keep = (b != 0) & ~((a == info.min) & (b == -1)) if info.min < 0 else b != 0  # onnxruntime errors / traps
    a, b = a[keep], b[keep]
    for op, attrs in (("Div", {}), ("Mod", {"fmod": 1}), ("Mod", {"fmod": 0})):
        model = _model(op, {"a": a, "b": b}, dtype, attrs, 18, ["i0", "i1"])
        expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"i0": a, "i1": b})[0]
        assert_same(_run(op, {"a": a, "b": b}, dtype, best, attrs), expected, f"{op} {attrs} {np.dtype(dtype).name}")


@pytest.mark.parametrize("dtype", INT_TYPES, ids=IDS)
def test_unary_ops_wrap_as_numpy(dev, dtype):
    x = np.concatenate([edges(dtype), random_values(dtype, 200, 3)])
    ops = [("Abs", np.abs), ("Sign", np.sign), ("BitwiseNot", np.invert)]
    if dtype in SIGNED:
        ops.append(("Neg", np.negative))
    for op, fn in ops:
        with np.errstate(all="ignore"):
            expected = fn(x)
        assert_same(_run(op, {"x": x}, dtype, dev), expected, f"{op} {np.dtype(dtype).name}")


@pytest.mark.parametrize("dtype", INT_TYPES, ids=IDS)
def test_comparisons_and_bitwise_ops_match_numpy(dev, dtype):
    a, b = pairs(dtype, seed=11)
    b[::7] = a[::7]  # equal pairs
    for op, fn in (("Equal", np.equal), ("Less", np.less), ("Greater", np.greater), ("LessOrEqual", np.less_equal),
                   ("GreaterOrEqual", np.greater_equal)):
        assert_same(_run(op, {"a": a, "b": b}, bool, dev), fn(a, b), f"{op} {np.dtype(dtype).name}")
    for op, fn in (("BitwiseAnd", np.bitwise_and), ("BitwiseOr", np.bitwise_or), ("BitwiseXor", np.bitwise_xor)):
        assert_same(_run(op, {"a": a, "b": b}, dtype, dev), fn(a, b), f"{op} {np.dtype(dtype).name}")


@pytest.mark.parametrize("dtype", INT_TYPES, ids=IDS)
def test_bitshift_follows_onnx_definition(dev, dtype):
    bits = np.iinfo(dtype).bits
    x = np.concatenate([edges(dtype), random_values(dtype, 64, 4)])
    counts = [0, 1, 3, bits // 2, bits - 1, bits, bits + 1, 2 * bits]
    if dtype in SIGNED:
        counts += [-1, -bits, np.iinfo(dtype).min]
    else:
        counts += [np.iinfo(dtype).max]
    a = np.repeat(x, len(counts))
    b = np.tile(np.array(counts, dtype), x.size)
    opset = 28 if dtype in SIGNED else 18  # signed types from BitShift-28
    for direction in ("LEFT", "RIGHT"):
        attrs = {"direction": direction}
        expected = _reference("BitShift", {"a": a, "b": b}, dtype, attrs, opset)
        assert_same(_run("BitShift", {"a": a, "b": b}, dtype, dev, attrs, opset), expected,
                    f"BitShift {direction} {np.dtype(dtype).name}")


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_pow_is_onnxruntimes_double_pow(dev, dtype):
    import onnxruntime as ort

    bases = np.array([0, 1, -1, 2, -2, 3, -3, 7, 10, -10, 46341, 2 ** 31 - 1], np.int64)
    exps = np.array([-3, -2, -1, 0, 1, 2, 3, 5, 19, 20, 21, 30, 31, 32, 33, 39, 40, 41, 62, 63, 64, 65, 1000], np.int64)
    a = np.repeat(bases, exps.size).astype(dtype)
    b = np.tile(exps, bases.size)
    expected = {}
    for etype in (np.int64, np.int32):  # the exponent types onnxruntime implements
        model = _model("Pow", {"a": a, "b": b.astype(etype)}, dtype, None, 18, ["i0", "i1"])
        expected[etype] = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"i0": a, "i1": b.astype(etype)})[0]
        assert_same(_run("Pow", {"a": a, "b": b.astype(etype)}, dtype, dev), expected[etype],
                    f"Pow {np.dtype(dtype).name} ** {np.dtype(etype).name}")
    # the other exponent types give what the same exponent gives as int64
    for etype in (np.int8, np.int16, np.uint8, np.uint16, np.uint32, np.uint64):
        info = np.iinfo(etype)
        keep = (b >= info.min) & (b <= info.max)
        got = _run("Pow", {"a": a[keep], "b": b[keep].astype(etype)}, dtype, dev)
        assert_same(got, expected[np.int64][keep], f"Pow {np.dtype(dtype).name} ** {np.dtype(etype).name}")
    huge = np.array([2 ** 64 - 1, 2 ** 63, 2 ** 32 + 1, 2 ** 40], np.uint64)  # beyond any i32 exponent
    got = _run("Pow", {"a": np.array([1, -1, 2, 0], dtype), "b": huge}, dtype, dev)
    assert_same(got, np.array([1, 1, np.iinfo(dtype).min, 0], dtype), "huge exponents")
    # exact where the power fits: numpy's integer power agrees
    small = np.array([0, 1, 2, 3, 5], dtype)
    assert_same(_run("Pow", {"a": small, "b": small}, dtype, dev), small ** small, "exact powers")


def test_float_pow_takes_every_integer_exponent_type(best):
    a = np.array([2, -2, 0.5, 3, -1], np.float32)
    for etype in (np.int64, np.uint64, np.uint32, np.int16):
        b = np.array([3, 2, 4, 0, 7], etype)
        got = _run("Pow", {"a": a, "b": b}, np.float32, best)
        assert np.array_equal(got, np.power(a, b.astype(np.float32))), (etype, got)


def test_integer_base_with_a_float_exponent_is_declined(best):
    from onnx_quant.errors import ExecutionError

    a = np.array([2, 3], np.int32)
    with pytest.raises(ExecutionError, match="exprOk"):
        _run("Pow", {"a": a, "b": np.array([0.5, 2], np.float32)}, np.int32, best)


# ----------------------------------------------------------------------------- float Mod


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_float_mod_is_exact_c_fmod_and_numpy_mod(dev, dtype):
    r = np.random.default_rng(7)
    special = np.array([0.0, -0.0, 1.0, -1.0, 3.0, -3.0, 0.5, 7.5, -7.5, 1e-3, np.inf, -np.inf, np.nan,
                        np.finfo(dtype).max, -np.finfo(dtype).max, np.finfo(dtype).tiny, 6.0, -6.0], dtype)
    rand = (r.standard_normal(400) * np.exp(r.uniform(-6, 6, 400))).astype(dtype)
    a = np.concatenate([np.repeat(special, special.size), rand])
    b = np.concatenate([np.tile(special, special.size), np.roll(rand, 1)])
    with np.errstate(all="ignore"):
        for fmod, fn in ((1, np.fmod), (0, np.mod)):
            expected = fn(a, b)
            got = _run("Mod", {"a": a, "b": b}, dtype, dev, {"fmod": fmod})
            nan = np.isnan(expected)
            assert np.array_equal(np.isnan(got), nan), fmod
            assert_same(got[~nan], expected[~nan], f"Mod fmod={fmod} {np.dtype(dtype).name}")


# ----------------------------------------------------------------------------- n-ary, Where


@pytest.mark.parametrize("dtype", INT_TYPES + [np.float32, np.float16, np.float64],
                         ids=IDS + ["float32", "float16", "float64"])
def test_nary_max_min_fold_left_to_right_with_broadcasting(dev, dtype):
    shapes = [(3, 1, 4), (4,), (2, 1), (1, 1, 1), (3, 2, 4), (1,), (2, 4), ()]
    r = np.random.default_rng(2)
    if np.dtype(dtype).kind == "f":
        pool = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf, 1.5, -2.25, 3.0], dtype)
        values = [r.choice(pool, s).astype(dtype) if s else np.array(r.choice(pool), dtype) for s in shapes]
    else:
        pool = edges(dtype)
        values = [np.array(r.choice(pool, s), dtype) for s in shapes]
    for n in (1, 2, 3, 5, 7):
        ins = {f"x{k}": values[k] for k in range(n)}
        for op, fn in (("Max", np.maximum), ("Min", np.minimum)):
            # float16 is computed in float32 (the sign of max(-0, +0) is numpy's float32 one)
            wide = np.float32 if dtype == np.float16 else dtype
            expected = values[0].astype(wide)
            for v in values[1:n]:
                expected = fn(expected, v.astype(wide))
            expected = expected.astype(dtype)
            expected = np.broadcast_to(expected, np.broadcast_shapes(*[v.shape for v in values[:n]]))
            got = _run(op, ins, dtype, dev)
            nan = np.isnan(expected) if np.dtype(dtype).kind == "f" else np.zeros(expected.shape, bool)
            assert np.array_equal(np.isnan(got) if nan.any() else nan, nan), (op, n)
            assert_same(got[~nan], np.ascontiguousarray(expected)[~nan], f"{op} of {n} {np.dtype(dtype).name}")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_sum_and_mean_round_each_step_as_numpy(dev, dtype):
    r = np.random.default_rng(4)
    values = [(r.standard_normal(s) * 100).astype(dtype) for s in [(5, 6), (6,), (5, 1), (1, 6), (5, 6), (6,)]]
    for n in (1, 2, 3, 6):
        acc = values[0]
        for v in values[1:n]:
            acc = acc + v  # numpy: one rounding to the type per addition
        acc = np.broadcast_to(acc, (5, 6)) if n > 1 else acc
        ins = {f"x{k}": values[k] for k in range(n)}
        assert_same(_run("Sum", ins, dtype, dev), np.ascontiguousarray(acc), f"Sum of {n}")
        assert_same(_run("Mean", ins, dtype, dev), np.ascontiguousarray(acc / dtype(n)), f"Mean of {n}")


def test_nary_nodes_beyond_the_binding_limit_are_declined(best):
    from onnx_quant.errors import ExecutionError

    # WebGPU's default limit: 8 storage buffers per stage, the output is one of them
    ins = {f"x{k}": np.array([k, -k], np.int64) for k in range(8)}
    with pytest.raises(ExecutionError, match="maxStorageBuffersPerShaderStage"):
        _run("Max", ins, np.int64, best)
    ins = {f"x{k}": np.array([k, -k], np.int64) for k in range(7)}
    assert_same(_run("Max", ins, np.int64, best), np.array([6, 0], np.int64), "Max of 7")


WHERE_TYPES = INT_TYPES + [np.float32, np.float16, bool]


@pytest.mark.parametrize("dtype", WHERE_TYPES + ["bfloat16"], ids=[np.dtype(t).name for t in WHERE_TYPES] + ["bfloat16"])
def test_where_selects_bits_of_every_type(dev, dtype):
    from onnx_quant.dtypes import element_type

    dt = element_type("bfloat16").dtype if dtype == "bfloat16" else np.dtype(dtype)
    r = np.random.default_rng(6)
    cond = r.integers(0, 2, (3, 1, 5)).astype(bool)
    x = r.integers(0, 255, (4, 5 * dt.itemsize), dtype=np.uint8).view(dt).reshape(4, 5)
    y = r.integers(0, 255, (5 * dt.itemsize,), dtype=np.uint8).view(dt).reshape(5)
    if dt == np.bool_:
        x, y = x.view(np.uint8) % 2 == 1, y.view(np.uint8) % 2 == 1
    expected = np.where(cond, x, y)
    got = _run("Where", {"c": cond, "x": x, "y": y}, dt, dev)
    assert_same(got, expected, f"Where {dt}")


# ----------------------------------------------------------------------------- variants, declines


def test_every_variant_gives_the_same_bits(best):
    a, b = pairs(np.int64, seed=21)
    for op in ("Mul", "Div", "Mod"):
        outs = []
        for variant in ("word_per_invocation", "words_per_invocation"):
            outs.append(_run(op, {"a": a, "b": b}, np.int64, best, variants={op: variant},
                             tunables={"COARSE_MIN_WORDS": 0}))
        assert_same(outs[1], outs[0], op)
        assert_same(outs[0], _reference(op, {"a": a, "b": b}, np.int64), op)


def test_empty_64_bit_tensors(best):
    e = np.zeros((0, 3), np.int64)
    got = _run("Add", {"a": e, "b": np.array([1, 2, 3], np.int64)}, np.int64, best)
    assert got.shape == (0, 3) and got.dtype == np.int64


def test_float64_is_declined_by_type_never_narrowed(best):
    from onnx_quant.errors import ExecutionError

    # Div has no float64 arithmetic (Add, Sub, Mul, Mod, Max, Min do: test_float64_gpu.py)
    x = np.array([1.0, 2.0], np.float64)
    with pytest.raises(ExecutionError, match=r"'a' is float64, T allows only"):
        _run("Div", {"a": x, "b": x}, np.float64, best)


def test_relu_and_prelu_of_wide_integers(dev):
    for dtype in (np.int16, np.int64):
        x = edges(dtype)
        assert_same(_run("Relu", {"x": x}, dtype, dev), np.maximum(x, 0), f"Relu {np.dtype(dtype).name}")
    for dtype in (np.int64, np.uint32, np.uint64):
        x, s = pairs(dtype, seed=30)
        with np.errstate(all="ignore"):
            expected = np.where(x > 0, x, x * s)
        assert_same(_run("PRelu", {"x": x, "s": s}, dtype, dev), expected, f"PRelu {np.dtype(dtype).name}")

"""Narrow-float codecs on the GPU (templates/snippets/{minifloat,float8,float_small}.wgsl.jinja)
against ml_dtypes / numpy / onnx's saturate_cast, bit for bit.

- every code point of each float8 type (256), float4e2m1 (16), the float6 types (64), float16
  (65536) and bfloat16 (65536) decodes exactly as ml_dtypes/numpy does (NaN: same NaN-ness);
- encoding float32 -> format, saturate on and off, matches ml_dtypes' cast (saturate off) and
  onnx.numpy_helper.saturate_cast (saturate on) on: every exactly representable value, every
  midpoint between neighbours (ties), one float32 ULP either side of each, the overflow
  boundary, subnormals of the format and of float32, zeros, infinities, NaNs with both signs,
  and random float32 bit patterns;
- int32 -> float32 round-to-nearest-even matches numpy.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from onnx import numpy_helper

from onnx_quant.backend_wgpu.pipelines import layout_key
from onnx_quant.backend_wgpu.plan import BindingPlan
from onnx_quant.backend_wgpu.render import render_string

F8 = {"float8e4m3fn": ml_dtypes.float8_e4m3fn, "float8e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
      "float8e5m2": ml_dtypes.float8_e5m2, "float8e5m2fnuz": ml_dtypes.float8_e5m2fnuz}
SMALL = {"float4e2m1": ml_dtypes.float4_e2m1fn, "float6e2m3": ml_dtypes.float6_e2m3fn,
         "float6e3m2": ml_dtypes.float6_e3m2fn}
WIDE = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
ALL = {**F8, **SMALL, **WIDE, "float8e8m0": ml_dtypes.float8_e8m0fnu}
BITS = {"float4e2m1": 4, "float6e2m3": 6, "float6e3m2": 6, "float16": 16, "bfloat16": 16}
# WGSL function suffix per type
FN = {"float8e4m3fn": "e4m3fn", "float8e4m3fnuz": "e4m3fnuz", "float8e5m2": "e5m2", "float8e5m2fnuz": "e5m2fnuz",
      "float4e2m1": "e2m1", "float6e2m3": "e2m3", "float6e3m2": "e3m2", "float16": "f16", "bfloat16": "bf16",
      "float8e8m0": "e8m0"}

_KERNEL = """
{% include "snippets/numerics.wgsl.jinja" %}
{% include "snippets/minifloat.wgsl.jinja" %}
{% include "snippets/float8.wgsl.jinja" %}
{% include "snippets/float_small.wgsl.jinja" %}
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> o: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = g.y * nwg.x * 64u + g.x;
  if (i >= arrayLength(&a)) { return; }
  let v = a[i];
  o[i] = {{ expr }};
}
"""
_BINDS = (BindingPlan(0, "a", "a", "read", "u32"), BindingPlan(1, "o", "o", "read_write", "u32"))


def run_expr(dev, expr: str, words: np.ndarray) -> np.ndarray:
    """o[i] = expr(v = a[i]) over u32 words, on the device."""
    words = np.ascontiguousarray(words, dtype=np.uint32)
    n = words.size
    src = render_string(_KERNEL, {"expr": expr})
    comp = dev.compile(src, layout_key(_BINDS), label=f"codec {expr}")
    a, o = dev.allocate(max(4, 4 * n)), dev.allocate(max(4, 4 * n))
    dev.upload(a, words)
    bg = dev.bind(comp, [(0, a, a.size), (1, o, o.size)])
    staging = dev.allocate_staging(o.size)
    groups = -(-n // 64)
    grid = (min(groups, 65535), -(-groups // 65535), 1)
    raw = dev.launch([(comp, bg, grid, "codec")], copies=[(o, 0, staging, 0, o.size)], read=staging)
    return np.frombuffer(raw, np.uint32)[:n].copy()


def f32_bits(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def assert_f32_same(got_bits: np.ndarray, expected: np.ndarray, inputs, what: str):
    exp_bits = f32_bits(expected)
    got = got_bits.view(np.float32)
    same = (got_bits == exp_bits) | (np.isnan(got) & np.isnan(expected))
    bad = np.nonzero(~same)[0]
    assert bad.size == 0, (what, [hex(int(x)) for x in np.asarray(inputs).reshape(-1)[bad[:6]]],
                           got[bad[:6]], np.asarray(expected)[bad[:6]])


def assert_codes_same(got: np.ndarray, expected: np.ndarray, inputs: np.ndarray, what: str):
    bad = np.nonzero(got != expected)[0]
    assert bad.size == 0, (what, len(bad), inputs[bad[:6]], [hex(int(g)) for g in got[bad[:6]]],
                           [hex(int(e)) for e in expected[bad[:6]]])


def code_points(name: str) -> np.ndarray:
    bits = BITS.get(name, 8)
    return np.arange(1 << bits, dtype=np.uint32)


def host_decode(name: str, codes: np.ndarray) -> np.ndarray:
    dt = np.dtype(ALL[name])
    store = codes.astype(np.uint16 if dt.itemsize == 2 else np.uint8)
    return store.view(dt).astype(np.float32)


# ----------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("name", list(ALL))
def test_every_code_point_decodes_like_ml_dtypes(dev, name):
    codes = code_points(name)
    got = run_expr(dev, f"bitcast<u32>(oq_decode_{FN[name]}(v))", codes)
    assert_f32_same(got, host_decode(name, codes), codes, name)


# ----------------------------------------------------------------------------- encoding


def encode_inputs(name: str, seed: int = 0) -> np.ndarray:
    """float32 values probing every rounding decision of a format."""
    values = host_decode(name, code_points(name))
    finite = np.unique(values[np.isfinite(values)].astype(np.float64))
    mids = (finite[:-1] + finite[1:]) / 2  # exact in f64; f32 holds them for these formats
    info = ml_dtypes.finfo(ALL[name])
    top = float(info.max)
    ulp_top = top - float(np.nextafter(np.float32(top), np.float32(0)).astype(ALL[name]).astype(np.float32)) \
        if name not in WIDE else 0.0
    extra = [top * 1.0625, top * 1.125, top * 2, top + ulp_top / 2 if ulp_top else top * 1.03125,
             3.4028235e38, 1e-45, 1e-40, 1.1754944e-38, float(info.smallest_subnormal) / 2,
             float(info.smallest_subnormal) / 4, float(info.smallest_subnormal) * 0.75]
    with np.errstate(over="ignore"):
        base = np.concatenate([finite, mids, extra]).astype(np.float32)
        base = np.concatenate([base, -base])
        near = np.concatenate([np.nextafter(base, np.float32(np.inf)), np.nextafter(base, np.float32(-np.inf))])
    rng = np.random.default_rng(seed)
    rand = rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32).view(np.float32)
    # random values around the format's range
    scaled = (rng.standard_normal(4096) * top / 4).astype(np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf], np.float32)
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF], np.uint32).view(np.float32)
    return np.concatenate([base, near, rand, scaled, specials, nans]).astype(np.float32)


def host_encode(name: str, x: np.ndarray, saturate: bool) -> np.ndarray:
    dt = np.dtype(ALL[name])
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        y = numpy_helper.saturate_cast(x, dt) if saturate else x.astype(dt)
    raw = y.view(np.uint16 if dt.itemsize == 2 else np.uint8).astype(np.uint32)
    return raw


@pytest.mark.parametrize("saturate", [True, False], ids=["saturate", "no-saturate"])
@pytest.mark.parametrize("name", list(F8))
def test_float8_encoding_matches_reference(dev, name, saturate):
    x = encode_inputs(name)
    got = run_expr(dev, f"oq_encode_{FN[name]}(bitcast<f32>(v), {'true' if saturate else 'false'})", f32_bits(x))
    assert_codes_same(got, host_encode(name, x, saturate), x, f"{name} saturate={saturate}")


@pytest.mark.parametrize("name", list(SMALL))
def test_small_float_encoding_matches_ml_dtypes(dev, name):
    x = encode_inputs(name)
    got = run_expr(dev, f"oq_encode_{FN[name]}(bitcast<f32>(v))", f32_bits(x))
    expected = host_encode(name, x, False)
    assert_codes_same(got, expected, x, name)
    # saturate has no other choice for these types: saturate_cast agrees except on NaN
    sat = host_encode(name, x, True)
    assert np.array_equal(sat[~np.isnan(x)], expected[~np.isnan(x)])


def test_small_float_nan_encodes_as_zero_with_the_opposite_sign(dev):
    nans = np.array([0x7FC00000, 0xFFC00000], np.uint32)
    assert run_expr(dev, "oq_encode_e2m1(bitcast<f32>(v))", nans).tolist() == [0x8, 0x0]
    assert run_expr(dev, "oq_encode_e2m3(bitcast<f32>(v))", nans).tolist() == [0x20, 0x0]


@pytest.mark.parametrize("name", list(WIDE))
def test_f16_bf16_encoding_matches_numpy(dev, name):
    x = encode_inputs(name)
    got = run_expr(dev, f"oq_encode_{FN[name]}(bitcast<f32>(v))", f32_bits(x))
    expected = host_encode(name, x, False)
    finite = ~np.isnan(x)
    assert_codes_same(got[finite], expected[finite], x[finite], name)
    # NaN stays a NaN (payload bits are not compared)
    assert np.isnan(host_decode(name, got[~finite])).all()


def test_every_f32_exponent_rounds_to_f16_and_bf16(dev):
    """Dense sweep: every f32 exponent with random mantissas, ties and near-ties."""
    rng = np.random.default_rng(5)
    exps = np.repeat(np.arange(0, 255, dtype=np.uint32), 64)
    mant = rng.integers(0, 1 << 23, exps.size, dtype=np.uint32)
    mant[::4] = (mant[::4] & ~np.uint32(0x1FFF)) | np.uint32(0x1000)  # f16 ties
    mant[1::4] = (mant[1::4] & ~np.uint32(0xFFFF)) | np.uint32(0x8000)  # bf16 ties
    bits = (exps << np.uint32(23)) | mant | (rng.integers(0, 2, exps.size, dtype=np.uint32) << np.uint32(31))
    x = bits.view(np.float32)
    for name in WIDE:
        got = run_expr(dev, f"oq_encode_{FN[name]}(bitcast<f32>(v))", bits)
        assert_codes_same(got, host_encode(name, x, False), x, name)


def test_int32_to_f32_rounds_to_nearest_even(dev):
    rng = np.random.default_rng(3)
    v = np.concatenate([rng.integers(-2**31, 2**31, 20000, dtype=np.int64),
                        np.arange(2**24 - 8, 2**24 + 40), -np.arange(2**24 - 8, 2**24 + 40),
                        [2**31 - 1, -2**31, 0, 1, -1, 2**25 + 2, 2**25 + 6, 2**25 + 1, 2**25 + 3]]).astype(np.int32)
    got = run_expr(dev, "bitcast<u32>(oq_i32_to_f32(bitcast<i32>(v)))", v.view(np.uint32))
    assert_f32_same(got, v.astype(np.float32), v, "int32 -> f32")

"""Host packing of every element type into the device's u32 words (backend_wgpu/packing.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st
from onnx import numpy_helper

from onnx_quant.backend_wgpu.packing import (
    device_bits, device_nbytes, pack_array, packed_nbytes, per_word, unpack_array,
)
from onnx_quant.backend_wgpu.planner import packed_byte_size
from onnx_quant.dtypes import BY_NAME
from onnx_quant.errors import ExecutionError

ALL = [n for n in BY_NAME]
LAYOUT = {  # type -> (device bits, elements per word)
    "float32": (32, 1), "int32": (32, 1), "uint32": (32, 1),
    "float64": (64, 1), "int64": (64, 1), "uint64": (64, 1),
    "float16": (16, 2), "bfloat16": (16, 2), "int16": (16, 2), "uint16": (16, 2),
    "int8": (8, 4), "uint8": (8, 4), "bool": (8, 4),
    "float8e4m3fn": (8, 4), "float8e4m3fnuz": (8, 4), "float8e5m2": (8, 4), "float8e5m2fnuz": (8, 4),
    "float8e8m0": (8, 4), "float6e2m3": (8, 4), "float6e3m2": (8, 4),
    "int4": (4, 8), "uint4": (4, 8), "float4e2m1": (4, 8), "int2": (2, 16), "uint2": (2, 16),
}


def values_of(name: str, count: int, seed: int = 0) -> np.ndarray:
    et = BY_NAME[name]
    rng = np.random.default_rng(seed)
    if et.is_integer:
        lo, hi = et.int_range
        if et.bits == 64:
            return rng.integers(0, 2**63, count, dtype=np.int64).astype(et.dtype)
        return rng.integers(lo, hi, count, endpoint=True, dtype=np.int64).astype(et.dtype)
    if et.kind == "bool":
        return rng.integers(0, 2, count).astype(bool)
    if et.bits <= 8:  # every code point, NaN included
        codes = rng.integers(0, 1 << et.bits, count).astype(np.uint8)
        return codes.view(et.dtype)
    return (rng.standard_normal(count) * 100).astype(et.dtype)


def codes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def test_every_type_has_a_layout():
    assert set(LAYOUT) == set(BY_NAME)
    for name, (bits, per) in LAYOUT.items():
        assert device_bits(name) == bits and per_word(name) == per, name


@pytest.mark.parametrize("name", ALL)
def test_round_trip(name):
    for count in (0, 1, 2, 3, 4, 5, 15, 16, 17, 31, 33, 64, 67):
        check_round_trip(name, count, count)


@given(name=st.sampled_from(ALL), count=st.integers(0, 300), seed=st.integers(0, 2**16))
def test_round_trip_random(name, count, seed):
    check_round_trip(name, count, seed)


def check_round_trip(name, count, seed):
    v = values_of(name, count, seed)
    data = bytes(pack_array(v, name))
    assert device_nbytes(name, count) == packed_byte_size(name, count)
    # whole words; an empty tensor packs to no bytes (its buffer still has one word)
    assert len(data) == (device_nbytes(name, count) if count else 0)
    assert not any(data[packed_nbytes(name, count):]), "padding must be zero bits"
    back = unpack_array(data, name, (count,))
    assert back.dtype == v.dtype and back.shape == (count,)
    assert np.array_equal(codes(back), codes(v))


@pytest.mark.parametrize("name", ["int4", "uint4", "float4e2m1", "int2", "uint2"])
def test_sub_byte_element_positions(name):
    bits, per = LAYOUT[name]
    n = 3 * per + 1
    v = values_of(name, n, 7)
    words = np.frombuffer(bytes(pack_array(v, name)), dtype="<u4")
    mask = (1 << bits) - 1
    for i in range(n):
        assert (int(words[i // per]) >> (bits * (i % per))) & mask == int(codes(v)[i]) & mask, i


@pytest.mark.parametrize("name", ["int4", "uint4", "int2", "uint2", "float4e2m1", "uint8", "int16", "float16",
                                  "bfloat16", "float8e5m2", "int32"])
@pytest.mark.parametrize("count", [1, 5, 33])
def test_matches_onnx_raw_data(name, count):
    v = values_of(name, count, count)
    raw = numpy_helper.from_array(v).raw_data
    data = bytes(pack_array(v, name))
    assert data[:len(raw)] == raw and not any(data[len(raw):])


@pytest.mark.parametrize("name", ["float6e2m3", "float6e3m2"])
def test_float6_byte_containers(name):
    v = np.arange(64, dtype=np.uint8).view(BY_NAME[name].dtype)
    data = bytes(pack_array(v, name))
    assert data == bytes(range(64))
    assert np.array_equal(codes(unpack_array(data, name, (64,))), np.arange(64))
    # top bits of a container are ignored on the way back
    assert np.array_equal(codes(unpack_array(bytes([0xC5] * 4), name, (4,))), [5] * 4)


def test_int4_minus_one_is_code_f():
    v = np.array([-1, -8, 7, 0], BY_NAME["int4"].dtype)
    assert bytes(pack_array(v, "int4"))[:2] == bytes([0x8F, 0x07])
    assert unpack_array(bytes([0x8F, 0x07, 0, 0]), "int4", (2, 2)).tolist() == [[-1, -8], [7, 0]]


def test_errors():
    with pytest.raises(ExecutionError, match="expected a uint8 array"):
        pack_array(np.zeros(3, np.int8), "uint8")
    with pytest.raises(ExecutionError, match="holds 4 bytes, needs 8"):
        unpack_array(b"\0" * 4, "float32", (2,))
    with pytest.raises(ExecutionError, match="element type"):
        device_bits("float7")
    with pytest.raises(ExecutionError):
        device_bits(None)


def test_big_endian_input_is_stored_little_endian():
    v = np.array([1, 2], dtype=">i4")
    with pytest.raises(ExecutionError):  # not the host dtype
        pack_array(v, "int32")
    assert bytes(pack_array(v.astype("<i4"), "int32")) == bytes([1, 0, 0, 0, 2, 0, 0, 0])

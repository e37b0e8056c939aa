"""The element-type table against onnx's own mapping and ml_dtypes, entry by entry."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_quant import dtypes
from onnx_quant.dtypes import ELEMENT_TYPES, UnknownElementType

ENTRIES = [pytest.param(t, id=t.name) for t in ELEMENT_TYPES]


@pytest.mark.parametrize("t", ENTRIES)
def test_dtype_matches_onnx_mapping(t):
    assert helper.tensor_dtype_to_np_dtype(t.code) == t.dtype
    assert helper.np_dtype_to_tensor_dtype(t.dtype) == t.code
    assert t.proto_name == TensorProto.DataType.Name(t.code)


@pytest.mark.parametrize("t", ENTRIES)
def test_numpy_helper_round_trip_gives_the_table_dtype(t):
    proto = numpy_helper.from_array(np.zeros((2, 3), dtype=t.dtype), "x")
    assert proto.data_type == t.code
    back = numpy_helper.to_array(proto)
    assert back.dtype == t.dtype and back.shape == (2, 3)


@pytest.mark.parametrize("t", [p for p in ENTRIES if p.values[0].is_integer])
def test_integer_range_and_width_match_ml_dtypes(t):
    info = ml_dtypes.iinfo(t.dtype)
    assert t.int_range == (int(info.min), int(info.max))
    assert t.bits == info.bits
    assert t.kind == ("int" if info.min < 0 else "uint")
    assert t.float_format is None
    assert t.per_u32_word == 32 // t.bits if t.bits < 32 else t.per_u32_word == 1


@pytest.mark.parametrize("t", [p for p in ENTRIES if p.values[0].is_float])
def test_float_format_matches_ml_dtypes(t):
    info = ml_dtypes.finfo(t.dtype)
    fmt = t.float_format
    assert t.bits == info.bits
    assert fmt.exponent_bits == info.nexp and fmt.mantissa_bits == info.nmant
    assert fmt.max == float(info.max)
    assert fmt.min_normal == float(info.smallest_normal)
    with np.errstate(all="ignore"):
        inf = np.array([np.inf], np.float32).astype(t.dtype).astype(np.float32)[0]
        nan = np.array([np.nan], np.float32).astype(t.dtype).astype(np.float32)[0]
    assert fmt.has_inf == bool(np.isinf(inf))
    assert fmt.has_nan == bool(np.isnan(nan))
    assert t.int_range is None


def test_known_float_formats():
    e4m3fn = dtypes.element_type("float8e4m3fn").float_format
    assert (e4m3fn.max, e4m3fn.has_inf, e4m3fn.has_nan, e4m3fn.unsigned_zero) == (448.0, False, True, False)
    e5m2 = dtypes.element_type("float8e5m2").float_format
    assert (e5m2.max, e5m2.has_inf) == (57344.0, True)
    assert dtypes.element_type("float8e4m3fnuz").float_format.unsigned_zero
    assert dtypes.element_type("float4e2m1").float_format.max == 6.0


def test_table_covers_every_numeric_onnx_type():
    not_numeric = {TensorProto.UNDEFINED, TensorProto.STRING, TensorProto.COMPLEX64, TensorProto.COMPLEX128}
    codes = set(helper.get_all_tensor_dtypes()) - not_numeric
    assert codes <= set(dtypes.BY_CODE), sorted(TensorProto.DataType.Name(c) for c in codes - set(dtypes.BY_CODE))


@pytest.mark.parametrize("t", ENTRIES)
def test_lookup_by_every_key(t):
    assert dtypes.element_type(t.code) is t
    assert dtypes.element_type(t.name) is t
    assert dtypes.element_type(t.proto_name) is t
    assert dtypes.element_type(t.dtype) is t
    assert dtypes.type_name(t.code) == t.name


def test_unknown_types():
    assert dtypes.type_name(TensorProto.STRING) == "string"
    assert dtypes.type_name(999) == "<type 999>"
    with pytest.raises(UnknownElementType):
        dtypes.element_type(999)
    with pytest.raises(UnknownElementType):
        dtypes.element_type("float7")
    with pytest.raises(UnknownElementType):
        dtypes.element_type(np.dtype(np.complex64))


def test_to_host_converts_exactly_as_ml_dtypes():
    values = [1000.0, -1000.0, 0.3, 0.0]
    out = dtypes.to_host(values, "float8e4m3fn")
    assert out.dtype == ml_dtypes.float8_e4m3fn
    expected = np.array(values, np.float32).astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(out.view(np.uint8), expected.view(np.uint8))  # bits, NaN included
    assert float(out[2]) == 0.3125  # round to nearest representable

"""One table of the ONNX tensor element types the quantization family touches.

Each entry knows its TensorProto code, its host numpy/ml_dtypes dtype (the same dtype
``onnx.numpy_helper.to_array`` returns), bit width, and either its integer range or its
float format. Host conversions go through ml_dtypes; nothing here twiddles bits by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import ml_dtypes
import numpy as np
from onnx import TensorProto

from onnx_quant.errors import QuantError


@dataclass(frozen=True)
class FloatFormat:
    """Layout and special values of a floating-point element type."""

    exponent_bits: int
    mantissa_bits: int
    has_inf: bool
    has_nan: bool
    #: "fnuz" types have a single NaN (the negative-zero code) and no negative zero.
    unsigned_zero: bool
    max: float
    min_normal: float


@dataclass(frozen=True)
class ElementType:
    """An ONNX tensor element type: code, name, host dtype, width and range or format."""

    name: str
    code: int
    dtype: np.dtype
    bits: int
    kind: str  # "int" | "uint" | "float" | "bool"
    int_range: tuple[int, int] | None = None
    float_format: FloatFormat | None = None

    @property
    def is_integer(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_float8(self) -> bool:
        return self.kind == "float" and self.bits == 8

    @property
    def is_sub_byte(self) -> bool:
        return self.bits < 8

    @property
    def per_u32_word(self) -> int:
        """How many elements pack into one u32 word on the device (1 for 32-bit types)."""
        return max(1, 32 // self.bits)

    @cached_property
    def proto_name(self) -> str:
        return TensorProto.DataType.Name(self.code)

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.name


def _int(name: str, code: int, dtype, bits: int) -> ElementType:
    info = ml_dtypes.iinfo(dtype)
    kind = "int" if int(info.min) < 0 else "uint"
    return ElementType(name, code, np.dtype(dtype), bits, kind, int_range=(int(info.min), int(info.max)))


def _float(name: str, code: int, dtype, bits: int) -> ElementType:
    info = ml_dtypes.finfo(dtype)
    np_dtype = np.dtype(dtype)
    with np.errstate(all="ignore"):
        has_inf = bool(np.isinf(np.array(np.inf, dtype=np.float32).astype(np_dtype)))
        has_nan = bool(np.isnan(np.array(np.nan, dtype=np.float32).astype(np_dtype)))
        neg_zero = np.array(-0.0, dtype=np.float32).astype(np_dtype)
    unsigned_zero = not bool(np.signbit(neg_zero.astype(np.float32)))
    fmt = FloatFormat(
        exponent_bits=int(info.nexp),
        mantissa_bits=int(info.nmant),
        has_inf=has_inf,
        has_nan=has_nan,
        unsigned_zero=unsigned_zero,
        max=float(info.max),
        min_normal=float(info.smallest_normal),
    )
    return ElementType(name, code, np_dtype, bits, "float", float_format=fmt)


_T = TensorProto
ELEMENT_TYPES: tuple[ElementType, ...] = (
    _float("float32", _T.FLOAT, np.float32, 32),
    _float("float16", _T.FLOAT16, np.float16, 16),
    _float("bfloat16", _T.BFLOAT16, ml_dtypes.bfloat16, 16),
    _float("float64", _T.DOUBLE, np.float64, 64),
    _int("int64", _T.INT64, np.int64, 64),
    _int("uint64", _T.UINT64, np.uint64, 64),
    _int("int32", _T.INT32, np.int32, 32),
    _int("uint32", _T.UINT32, np.uint32, 32),
    _int("int16", _T.INT16, np.int16, 16),
    _int("uint16", _T.UINT16, np.uint16, 16),
    _int("int8", _T.INT8, np.int8, 8),
    _int("uint8", _T.UINT8, np.uint8, 8),
    _int("int4", _T.INT4, ml_dtypes.int4, 4),
    _int("uint4", _T.UINT4, ml_dtypes.uint4, 4),
    _int("int2", _T.INT2, ml_dtypes.int2, 2),
    _int("uint2", _T.UINT2, ml_dtypes.uint2, 2),
    _float("float8e4m3fn", _T.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn, 8),
    _float("float8e4m3fnuz", _T.FLOAT8E4M3FNUZ, ml_dtypes.float8_e4m3fnuz, 8),
    _float("float8e5m2", _T.FLOAT8E5M2, ml_dtypes.float8_e5m2, 8),
    _float("float8e5m2fnuz", _T.FLOAT8E5M2FNUZ, ml_dtypes.float8_e5m2fnuz, 8),
    _float("float8e8m0", _T.FLOAT8E8M0, ml_dtypes.float8_e8m0fnu, 8),
    _float("float4e2m1", _T.FLOAT4E2M1, ml_dtypes.float4_e2m1fn, 4),
    _float("float6e2m3", _T.FLOAT6E2M3, ml_dtypes.float6_e2m3fn, 6),
    _float("float6e3m2", _T.FLOAT6E3M2, ml_dtypes.float6_e3m2fn, 6),
    ElementType("bool", _T.BOOL, np.dtype(np.bool_), 8, "bool"),
)

BY_CODE: dict[int, ElementType] = {t.code: t for t in ELEMENT_TYPES}
BY_NAME: dict[str, ElementType] = {t.name: t for t in ELEMENT_TYPES}


class UnknownElementType(QuantError):
    """An element type code or name this table does not know."""


def element_type(key: int | str | np.dtype | ElementType) -> ElementType:
    """Look an element type up by TensorProto code, table name, proto name or numpy dtype."""
    if isinstance(key, ElementType):
        return key
    if isinstance(key, (int, np.integer)):
        try:
            return BY_CODE[int(key)]
        except KeyError:
            raise UnknownElementType(f"element type code {int(key)} is not a quantization-family type") from None
    if isinstance(key, str):
        if key in BY_NAME:
            return BY_NAME[key]
        code = TensorProto.DataType.Value(key.upper()) if key.upper() in TensorProto.DataType.keys() else None
        if code is not None and code in BY_CODE:
            return BY_CODE[code]
        raise UnknownElementType(f"unknown element type name {key!r}")
    dt = np.dtype(key)
    for t in ELEMENT_TYPES:
        if t.dtype == dt:
            return t
    raise UnknownElementType(f"numpy dtype {dt} has no ONNX element type here")


def ort_type(code: int) -> str:
    """onnxruntime's type string of a TensorProto element type (``"tensor(float)"``)."""
    try:
        return f"tensor({TensorProto.DataType.Name(code).lower()})"
    except ValueError:
        return f"tensor(<type {code}>)"


def type_name(code: int) -> str:
    """Short name for any TensorProto code, including ones outside the table."""
    if code in BY_CODE:
        return BY_CODE[code].name
    try:
        return TensorProto.DataType.Name(code).lower()
    except ValueError:
        return f"<type {code}>"


def to_host(values, key) -> np.ndarray:
    """Convert values to the host dtype of an element type (ml_dtypes rounding/saturation rules)."""
    return np.asarray(values).astype(element_type(key).dtype)

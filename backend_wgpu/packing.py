"""Host-side packing of every element type into (and out of) the device's u32 words.

GPU storage has no 8- or 16-bit types: every tensor lives in an ``array<u32>`` (or f32/i32)
buffer, little-endian, element 0 in the lowest bits of word 0, padded with zero bits to a
whole word (and to at least 4 bytes). The device layout of each type:

=================================================  ===========  ============  ==========================
element types                                      device bits  per u32 word  element ``i`` lives in
=================================================  ===========  ============  ==========================
float32, int32, uint32                             32           1             word ``i``
float64, int64, uint64                             64           1/2           words ``2i`` (low), ``2i+1``
float16, bfloat16, int16, uint16                   16           2             bits ``16*(i%2)`` of word ``i//2``
int8, uint8, bool, float8 (e4m3fn, e4m3fnuz,       8            4             bits ``8*(i%4)`` of word ``i//4``
e5m2, e5m2fnuz, e8m0)
float6e2m3, float6e3m2 (8-bit containers:          8            4             bits ``8*(i%4)``; code in the low 6 bits,
the 6-bit code in the low bits, top 2 bits 0)                                 the top 2 bits are 0
int4, uint4, float4e2m1                            4            8             bits ``4*(i%8)`` of word ``i//8``
int2, uint2                                        2            16            bits ``2*(i%16)`` of word ``i//16``
=================================================  ===========  ============  ==========================

For the 4- and 2-bit types this is exactly ONNX's own packing (``raw_data``: element 0 in
the low nibble / low bit pair of byte 0), so a word is four such bytes. float6 keeps one
element per byte: a shader reads element ``i`` with one shift and mask, exactly like
uint8, and a thread writing one word writes four whole elements (5⅓ packed float6 per word
would straddle words). Integer codes are stored as the type's two's-complement bits
(int4 -1 is ``0xF``); signed values are sign-extended in the shader.

Conversions go through numpy views and ml_dtypes: nothing here computes float codes by
hand (the host dtype of each type is ``onnx_quant.dtypes``' one, the dtype
``onnx.numpy_helper.to_array`` returns).
"""

from __future__ import annotations

import math

import numpy as np

from onnx_quant.dtypes import ElementType, element_type
from onnx_quant.errors import ExecutionError, QuantError

__all__ = [
    "device_bits", "per_word", "packed_nbytes", "device_nbytes", "pack_array", "unpack_array",
    "etype",
]

#: types stored in 8-bit containers although narrower
_CONTAINER_8 = frozenset({"float6e2m3", "float6e3m2"})


def etype(onnx_type: str | int | ElementType | None) -> ElementType:
    """The element type, or ExecutionError (a buffer without one cannot hold a tensor)."""
    if onnx_type is None:
        raise ExecutionError("buffer without an element type cannot hold a tensor")
    try:
        return element_type(onnx_type)
    except QuantError as e:
        raise ExecutionError(str(e)) from None


def device_bits(onnx_type: str | int | ElementType) -> int:
    """Bits one element occupies on the device (8 for the 6-bit float types)."""
    et = etype(onnx_type)
    return 8 if et.name in _CONTAINER_8 else et.bits


def per_word(onnx_type: str | int | ElementType) -> int:
    """Elements per u32 word on the device (1 for 32- and 64-bit types)."""
    return max(1, 32 // device_bits(onnx_type))


def packed_nbytes(onnx_type: str | int | ElementType, count: int) -> int:
    """Bytes ``count`` elements take on the device, before padding to a whole word."""
    return (count * device_bits(onnx_type) + 7) // 8


def device_nbytes(onnx_type: str | int | ElementType, count: int) -> int:
    """Bytes of the device buffer: whole u32 words, at least one."""
    return max(4, -(-packed_nbytes(onnx_type, count) // 4) * 4)


def _pad4(raw: bytes) -> bytes:
    pad = (-len(raw)) % 4
    return raw + b"\0" * pad if pad else raw


def pack_array(array: np.ndarray, onnx_type: str | int) -> bytes | memoryview:
    """Host bytes of a tensor as the device stores it, padded with zeros to a multiple of 4.

    The array must already have the type's host dtype (ExecutionError otherwise).
    """
    et = etype(onnx_type)
    arr = np.ascontiguousarray(array)
    if arr.dtype != et.dtype:
        raise ExecutionError(f"expected a {et.name} array ({et.dtype}), found {arr.dtype}")
    bits = device_bits(et)
    if bits >= 8:
        if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and not np.little_endian):
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        flat = arr.reshape(-1).view(np.uint8)
        if et.name in _CONTAINER_8:
            flat = flat & np.uint8(0x3F)
        if flat.nbytes % 4 == 0:
            return memoryview(flat)  # no copy: write_buffer copies once
        return _pad4(flat.tobytes())
    per = 8 // bits
    codes = arr.reshape(-1).view(np.uint8) & np.uint8((1 << bits) - 1)
    pad = (-codes.size) % per
    if pad:
        codes = np.concatenate([codes, np.zeros(pad, np.uint8)])
    lanes = codes.reshape(-1, per)
    packed = lanes[:, 0].copy()
    for k in range(1, per):
        packed |= lanes[:, k] << np.uint8(k * bits)
    return _pad4(packed.tobytes())


def unpack_array(data: bytes | memoryview | np.ndarray, onnx_type: str | int,
                 shape: tuple[int, ...]) -> np.ndarray:
    """The tensor a device buffer holds, as the dtype ``onnx.numpy_helper.to_array`` returns."""
    et = etype(onnx_type)
    shape = tuple(int(d) for d in shape)
    count = math.prod(shape)
    need = packed_nbytes(et, count)
    buf = memoryview(data).cast("B")[:need] if not isinstance(data, np.ndarray) else \
        memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))[:need]
    if len(buf) < need:
        raise ExecutionError(f"{et.name} tensor {list(shape)}: buffer holds {len(buf)} bytes, needs {need}")
    bits = device_bits(et)
    if bits >= 8:
        dt = et.dtype.newbyteorder("<") if et.dtype.itemsize > 1 else et.dtype
        out = np.frombuffer(buf, dtype=dt, count=count).astype(et.dtype, copy=True)
        if et.name in _CONTAINER_8:
            out = (out.view(np.uint8) & np.uint8(0x3F)).view(et.dtype)
        return out.reshape(shape)
    per = 8 // bits
    raw = np.frombuffer(buf, dtype=np.uint8)
    mask = np.uint8((1 << bits) - 1)
    lanes = np.empty((raw.size, per), np.uint8)
    for k in range(per):
        lanes[:, k] = (raw >> np.uint8(k * bits)) & mask
    # ml_dtypes keeps a narrow element's code in the low bits of its byte (int4 -1 is 0x0F)
    return lanes.reshape(-1)[:count].view(et.dtype).copy().reshape(shape)

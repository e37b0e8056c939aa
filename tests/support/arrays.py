"""Test inputs: seeded arrays of any element type."""

from __future__ import annotations

import ml_dtypes
import numpy as np

#: every element type with a device layout (64-bit types as two words, 16- and 8-bit packed)
TYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.int8, np.int16, np.int32, np.int64,
         np.uint8, np.uint16, np.uint32, np.uint64, np.bool_]


def rng(seed=0):
    return np.random.default_rng(seed)


def data(shape, dtype, seed=0, scale=3.0):
    """Floats normal times ``scale``, integers within +-1000 (and the type's range), bools 0/1."""
    r = rng(seed + 7 * len(shape))
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.asarray(r.standard_normal(shape) * scale).astype(dtype)
    if dtype == np.bool_:
        return np.asarray(r.integers(0, 2, shape)).astype(bool)
    info = np.iinfo(dtype)
    return np.asarray(r.integers(max(info.min, -1000), min(info.max, 1000) + 1, shape)).astype(dtype)


def typed(shape, dtype, seed=0):
    """Distinct bit patterns in every byte (64-bit values beyond 2^32 included)."""
    r = np.random.default_rng(seed)
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = r.integers(0, 256, size, dtype=np.uint8)
    if np.dtype(dtype) == np.bool_:
        raw = raw & 1
    a = raw.view(dtype).reshape(shape)
    if np.dtype(dtype).kind == "f" or dtype is ml_dtypes.bfloat16:
        with np.errstate(invalid="ignore"):
            a = np.where(np.isnan(a), np.zeros((), dtype), a).astype(dtype)
    return a


def ints(rng, dt, shape):
    """Integers over the whole range of ``dt``."""
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max + 1, size=shape).astype(dt)

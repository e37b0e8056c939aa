"""Tensors that stay on the device between runs (onnxruntime's ``OrtValue`` on a GPU).

A run can return an output as a :class:`DeviceValue` instead of a numpy array
(``Session.run(..., device_outputs=...)`` or the IO binding of ``InferenceSession``); a later run
of the same session, or of another session on the same :class:`GpuDevice`, takes it as a feed:
the executor copies it device-to-device into the plan's buffer, so nothing crosses to the host.

Lifetime is explicit: the value owns one device buffer until :meth:`DeviceValue.release` (or
the ``with`` block ends, or the object is garbage collected); a released value refuses to be
read or fed. The buffer holds the tensor in the device layout (``packing.pack_array``: sub-32-bit
elements packed into u32 words), so ``numpy()`` is one read-back and an unpack.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np

from onnx_quant.dtypes import element_type, ort_type
from onnx_quant.errors import ExecutionError

from .device import release_quietly
from .packing import device_nbytes, pack_array, unpack_array


class DeviceValue:
    """One tensor in a device buffer: ``device`` (a GpuDevice), ``onnx_type`` (``"float"``,
    ``"uint8"``, ...), ``dims`` (a tuple of ints)."""

    def __init__(self, device, buffer, onnx_type: str, dims: tuple[int, ...]) -> None:
        self.device = device
        self.onnx_type = onnx_type
        self.dims = tuple(int(d) for d in dims)
        self.nbytes = device_nbytes(onnx_type, math.prod(self.dims))
        self._buffer = buffer
        self._finalizer = weakref.finalize(self, release_quietly, buffer)

    # -- making one ------------------------------------------------------------------------

    @classmethod
    def from_numpy(cls, array: np.ndarray, device, onnx_type: str | None = None) -> "DeviceValue":
        """Upload a host array (its ONNX type from its dtype unless given)."""
        shape = np.shape(array)  # np.ascontiguousarray makes a rank-0 array [1]
        arr = np.ascontiguousarray(array)
        onnx_type = onnx_type or element_type(arr.dtype).name
        data = pack_array(arr, onnx_type)
        buf = device.allocate(len(memoryview(data).cast("B")), label=f"device value {onnx_type}{list(shape)}")
        device.upload(buf, data)
        return cls(device, buf, onnx_type, shape)

    @classmethod
    def borrowed(cls, device, buffer, onnx_type: str, dims: tuple[int, ...]) -> "DeviceValue":
        """A view of the first elements of a buffer someone else owns (a plan's pooled buffer):
        valid while that owner keeps it; releasing or collecting the view frees nothing."""
        value = cls(device, buffer, onnx_type, dims)
        value._finalizer.detach()
        return value

    # -- onnxruntime's OrtValue surface ----------------------------------------------------

    @property
    def buffer(self):
        if self._buffer is None:
            raise ExecutionError(f"device value {self.onnx_type}{list(self.dims)}: already released")
        return self._buffer

    @property
    def released(self) -> bool:
        return self._buffer is None

    @property
    def owned(self) -> bool:
        """Whether the value owns its buffer (False for a borrowed view of a plan's buffer)."""
        return self._buffer is not None and self._finalizer.alive

    @property
    def dtype(self) -> np.dtype:
        return element_type(self.onnx_type).dtype

    def shape(self) -> list[int]:
        return list(self.dims)

    def data_type(self) -> str:
        """onnxruntime's type string (``"tensor(float)"``)."""
        return ort_type(element_type(self.onnx_type).code)

    def element_type(self) -> type:
        return self.dtype.type

    def device_name(self) -> str:
        return "webgpu"

    def is_tensor(self) -> bool:
        return True

    def has_value(self) -> bool:
        return not self.released

    def tensor_size_in_bytes(self) -> int:
        return self.nbytes

    def numpy(self) -> np.ndarray:
        """Read the tensor back to the host (one staging buffer, one wait)."""
        raw = self.device.download(self.buffer, max(4, (self.nbytes + 3) // 4 * 4))
        return unpack_array(memoryview(raw), self.onnx_type, self.dims)

    def release(self) -> None:
        """Free the device buffer now (idempotent; a borrowed view only forgets it)."""
        if self._buffer is not None:
            self._finalizer()  # a no-op once detached (a borrowed view)
            self._buffer = None

    def __enter__(self) -> "DeviceValue":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else self.device.info.name
        return f"DeviceValue({self.data_type()}, shape={list(self.dims)}, {state})"


def stand_in(value: DeviceValue) -> np.ndarray:
    """A zero-stride array with the value's dtype and shape (no memory), for the checks a feed
    goes through; refuses a released value."""
    value.buffer  # noqa: B018 - raises when released
    return np.lib.stride_tricks.as_strided(np.zeros(1, value.dtype), shape=value.dims, strides=(0,) * len(value.dims))

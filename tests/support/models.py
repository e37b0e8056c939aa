"""Test models and the pieces they are built from."""

from __future__ import annotations

import onnx
from onnx import helper


def value_info_of(name: str, array) -> onnx.ValueInfoProto:
    """A ValueInfoProto typed like ``array`` (its dtype and shape)."""
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)

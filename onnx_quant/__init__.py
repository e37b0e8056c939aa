"""onnx-quant: type and shape inference, GPU execution and conformance for quantized ONNX models.

The names users import from the top (loaded on first use, so ``import onnx_quant`` stays cheap
and never loads wgpu):

* ``infer_shapes``, ``check_model`` — :mod:`onnx_quant.inference`;
* ``InferenceSession``, ``SessionOptions``, ``GraphOptimizationLevel``, ``RunOptions``, ``OrtValue``
  (= ``DeviceValue``), ``get_available_providers`` — onnxruntime's call shapes over the GPU backend
  (:mod:`onnx_quant.backend_wgpu.inference_session`).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "infer_shapes": "onnx_quant.inference",
    "check_model": "onnx_quant.inference",
    "InferenceSession": "onnx_quant.backend_wgpu.inference_session",
    "SessionOptions": "onnx_quant.backend_wgpu.inference_session",
    "RunOptions": "onnx_quant.backend_wgpu.inference_session",
    "GraphOptimizationLevel": "onnx_quant.backend_wgpu.inference_session",
    "OrtValue": "onnx_quant.backend_wgpu.inference_session",
    "DeviceValue": "onnx_quant.backend_wgpu.device_value",
    "get_available_providers": "onnx_quant.backend_wgpu.inference_session",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'onnx_quant' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))

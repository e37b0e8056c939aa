"""The wgpu backend: device layer, kernel specs and planning, rendering, execution, Session.

``import onnx_quant.backend_wgpu`` stays cheap: ``Session`` (and wgpu with it) loads on first use, and
``backend`` (the ``onnx.backend`` Backend, :class:`onnx_quant.backend_wgpu.onnx_backend.WgpuBackend`) too.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Session", "backend"]


def __getattr__(name: str) -> Any:
    if name == "Session":
        from .session import Session

        return Session
    if name == "backend":
        from .onnx_backend import WgpuBackend

        return WgpuBackend
    raise AttributeError(f"module 'onnx_quant.backend_wgpu' has no attribute {name!r}")

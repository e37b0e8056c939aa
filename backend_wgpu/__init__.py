"""The wgpu backend: device layer, kernel specs and planning, rendering, execution, Session.

``import backend_wgpu`` stays cheap: ``Session`` (and wgpu with it) loads on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Session"]


def __getattr__(name: str) -> Any:
    if name == "Session":
        from backend_wgpu.session import Session

        return Session
    raise AttributeError(f"module 'backend_wgpu' has no attribute {name!r}")

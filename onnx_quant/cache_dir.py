"""Where onnx-quant keeps what it computed once and can reuse in a later process.

One root serves every on-disk cache (compiled plans and rendered WGSL, tuned variant choices):
``ONNX_QUANT_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/onnx-quant`` (``~/.cache/onnx-quant``).
Each cache lives in its own sub-folder named by the project version, so an upgrade never reads
what an older version wrote. ``onnx-quant cache clear`` (or :func:`clear`) removes it all; the
downloaded real-model wheels (``ONNX_QUANT_MODEL_CACHE``) are not part of it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from . import __version__

#: the environment variable that moves the whole cache
ENV = "ONNX_QUANT_CACHE_DIR"


def root() -> Path:
    """The cache root (not created)."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "onnx-quant"


def folder(kind: str) -> Path:
    """The folder of one cache (``plans``, ``tuning``, ...) for this version, created on demand."""
    path = root() / kind / __version__
    path.mkdir(parents=True, exist_ok=True)
    return path


def clear(kind: str | None = None) -> list[Path]:
    """Remove one cache (every version of it) or, with no ``kind``, every cache but the model
    wheels; returns the folders removed."""
    base = root()
    if not base.is_dir():
        return []
    targets = [base / kind] if kind else [p for p in base.iterdir() if p.is_dir() and p.name != "wheels"]
    removed = []
    for path in targets:
        if path.is_dir():
            shutil.rmtree(path)
            removed.append(path)
    return removed

"""Shared test setup: hypothesis profiles and the GPU-adapter policy.

In CI (``CI`` or ``ONNX_QUANT_REQUIRE_GPU`` set) a missing wgpu adapter is a failure;
on a developer's machine without one, GPU tests skip with the reason.
"""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import HealthCheck, settings

# lavapipe's GL probe complains without a private runtime dir
os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="onnx-quant-xdg-"))

settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev", max_examples=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough", max_examples=500, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def gpu_required() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("ONNX_QUANT_REQUIRE_GPU"))


def no_gpu(reason: str):
    """Fail in CI, skip elsewhere: the one place this policy lives."""
    if gpu_required():
        pytest.fail(f"no usable wgpu adapter in CI: {reason}")
    pytest.skip(f"no usable wgpu adapter: {reason}")

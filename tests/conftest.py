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


def gpu_examples(divisor: int = 3) -> int:
    """Fewer hypothesis examples than the profile, for GPU-heavy properties (each example
    compiles shaders)."""
    return max(4, settings.default.max_examples // divisor)


def value_info_of(name: str, array):
    """A ValueInfoProto typed like ``array`` (its dtype and shape)."""
    from onnx import helper

    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)


def gpu_required() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("ONNX_QUANT_REQUIRE_GPU"))


def no_gpu(reason: str):
    """Fail in CI, skip elsewhere: the one place this policy lives."""
    if gpu_required():
        pytest.fail(f"no usable wgpu adapter in CI: {reason}")
    pytest.skip(f"no usable wgpu adapter: {reason}")


def gpu_device(kind: str = "best"):
    """A wgpu device for tests, with WebGPU default limits so tests never depend on big ones.

    ``kind``: ``"best"`` (the default adapter), ``"best-no-subgroup"`` (same adapter, no
    optional features, to exercise the workgroup-memory paths) or ``"opengl"`` (skipped
    where no OpenGL adapter exists: it is an extra, not the adapter CI requires).
    A missing adapter goes through :func:`no_gpu` (fail in CI, skip elsewhere).
    """
    from backend_wgpu.device import get_device, list_adapters
    from onnx_quant.errors import DeviceError

    try:
        adapters = list_adapters()
    except DeviceError as e:
        no_gpu(str(e))
    if not adapters:
        no_gpu("wgpu lists no adapter")
    try:
        if kind == "best":
            return get_device(None, limits="default")
        if kind == "best-no-subgroup":
            return get_device(None, limits="default", features=())
        if kind == "opengl":
            if not any(a.backend == "OpenGL" for a in adapters):
                pytest.skip("no OpenGL adapter here")
            return get_device("opengl", limits="default")
    except DeviceError as e:
        no_gpu(str(e))
    raise ValueError(f"unknown device kind {kind!r}")


@pytest.fixture(scope="module")
def best():
    """The default adapter with WebGPU default limits (GPU test modules may define their own)."""
    return gpu_device("best")


@pytest.fixture(scope="module", params=["best", "opengl"])
def dev(request):
    """The default adapter, then the OpenGL one where present (no subgroups, no f16)."""
    return gpu_device(request.param)

"""Shared test setup: hypothesis profiles, the onnxruntime guard and the GPU fixtures.

In CI (``CI`` or ``ONNX_QUANT_REQUIRE_GPU`` set) a missing wgpu adapter is a failure;
on a developer's machine without one, GPU tests skip with the reason (support/gpu.py).
Helpers are in tests/support/ (importable as ``support``); no test imports this file.
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

from support.gpu import gpu_device  # noqa: E402 - after the runtime dir is set


# ----------------------------------------------------------------------------- onnxruntime guard

def _model_of(source):
    """The ModelProto behind what onnxruntime.InferenceSession was given (bytes or a path)."""
    import onnx

    if isinstance(source, (bytes, bytearray)):
        return onnx.load_from_string(bytes(source))
    if isinstance(source, (str, os.PathLike)):
        return onnx.load(os.fspath(source), load_external_data=False)
    return None


@pytest.fixture(autouse=True, scope="session")
def _no_saturating_oracle():
    """Every onnxruntime session the suite runs is refused where the model holds a uint8 x int8
    integer GEMM (as written or after onnxruntime's QDQ fusion) whose weights could saturate (any
    but constants within +-64): on an AVX2 host without VNNI its sums saturate at int16, so such a
    comparison's verdict would depend on the CPU. Tests compare
    those models through ``onnxruntime_run`` (the exact, widened oracle); code using onnxruntime
    for something other than values runs inside ``onnx_quant.oracles.not_an_oracle()``."""
    try:
        import onnxruntime as ort
    except ImportError:
        yield
        return
    from onnx_quant import oracles

    original = ort.InferenceSession.__init__

    def guarded(self, path_or_bytes, *args, **kwargs):
        model = None if oracles.in_non_oracle_use() else _model_of(path_or_bytes)
        nodes = oracles.u8s8_nodes(model, saturable_only=True) if model is not None else []
        if nodes:
            raise AssertionError(
                f"an onnxruntime session over uint8 x int8 integer GEMMs ({', '.join(nodes[:4])}"
                f"{', ...' if len(nodes) > 4 else ''}): its sums saturate on AVX2 hosts without VNNI; "
                f"compare with support.oracles.onnxruntime_run / onnx_quant.oracles.exact_onnxruntime_run")
        original(self, path_or_bytes, *args, **kwargs)

    ort.InferenceSession.__init__ = guarded
    try:
        yield
    finally:
        ort.InferenceSession.__init__ = original


# ----------------------------------------------------------------------------- GPU fixtures

@pytest.fixture(scope="module")
def best():
    """The default adapter with WebGPU default limits (GPU test modules may define their own)."""
    return gpu_device("best")


@pytest.fixture(scope="module", params=["best", "opengl"])
def dev(request):
    """The default adapter, then the OpenGL one where present (no subgroups, no f16)."""
    return gpu_device(request.param)

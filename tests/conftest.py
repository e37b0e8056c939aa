"""Shared test setup: hypothesis profiles, the onnxruntime guard, the GPU fixtures and the
``gpu`` marker.

- Fixtures ``gpu`` (wgpu's adapters), ``best`` (the default adapter with WebGPU default limits)
  and ``dev`` (the devices a module asks for with ``pytest.mark.devices(...)``; default: the
  default adapter, then the OpenGL one where present). A missing adapter fails in CI (``CI`` or
  ``ONNX_QUANT_REQUIRE_GPU`` set) and skips elsewhere (support/gpu.py).
- Every test that takes one of these fixtures is marked ``gpu`` (pytest_collection_modifyitems);
  a test that makes a device itself carries ``@pytest.mark.gpu`` (or its module
  ``pytestmark``). ``pytest -m "not gpu"`` runs the rest, the CPU suite, with no adapter at all.
  A test without the marker that reaches for an adapter fails (``_gpu_only_when_marked``).
- Helpers are in tests/support/ (importable as ``support``); no test imports this file.
"""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import HealthCheck, settings

# lavapipe's GL probe complains without a private runtime dir
os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="onnx-quant-xdg-"))
# on-disk caches (plans, tuning) of a test run start empty and never touch the user's
os.environ["ONNX_QUANT_CACHE_DIR"] = tempfile.mkdtemp(prefix="onnx-quant-cache-")
# and plans are compiled in every test: a plan an earlier test stored would hide what a test
# changes in the compiler (a monkeypatched planner); tests/backend/test_plan_cache.py turns it on
os.environ["ONNX_QUANT_PLAN_CACHE"] = "0"

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

from support.gpu import gpu_adapters, gpu_device  # noqa: E402 - after the runtime dir is set
from support.run import COLLECTED  # noqa: E402


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

#: the fixtures that need an adapter: a test taking one (directly or through another fixture)
#: is marked ``gpu``
GPU_FIXTURES = frozenset({"gpu", "best", "dev"})
#: what ``dev`` runs on where no ``devices`` marker says otherwise
DEFAULT_DEVICES = ("best", "opengl")


@pytest.fixture(scope="module")
def gpu():
    """wgpu's adapters, best first (no adapter: fail in CI, skip elsewhere)."""
    return gpu_adapters()


@pytest.fixture(scope="module")
def best():
    """The default adapter with WebGPU default limits."""
    return gpu_device("best")


def _device_kinds(node) -> tuple[str, ...]:
    marker = node.get_closest_marker("devices")
    return tuple(marker.args) if marker else DEFAULT_DEVICES


@pytest.fixture(scope="module")
def dev(request):
    """The device kinds (support.gpu.gpu_device) the module asks for with
    ``pytestmark = pytest.mark.devices(...)``, one after the other; default: the default adapter,
    then the OpenGL one where present (no subgroups, no f16). Several kinds parametrize the
    tests (ids ``[best]``, ``[opengl]``, ...); one kind does not."""
    kind = request.param if hasattr(request, "param") else _device_kinds(request.node)[0]
    return gpu_device(kind)


def pytest_generate_tests(metafunc):
    defs = metafunc._arg2fixturedefs.get("dev") if "dev" in metafunc.fixturenames else None
    if not defs or defs[-1].func is not dev.__wrapped__:  # a module's own ``dev`` is left alone
        return
    kinds = _device_kinds(metafunc.definition)
    if len(kinds) > 1 or kinds != _device_kinds(metafunc.definition.getparent(pytest.Module)):
        metafunc.parametrize("dev", kinds, indirect=True, scope="module")


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the marker must be there to select on
def pytest_collection_modifyitems(config, items):
    """Mark ``gpu`` every test that takes a GPU fixture; count the tests of each module."""
    counts: dict = {}
    for item in items:
        counts[item.path] = counts.get(item.path, 0) + 1
        if GPU_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.gpu)
    config.stash[COLLECTED] = counts


class _NoAdapters:
    """wgpu as the device layer sees it in a test not marked ``gpu``: everything but ``wgpu.gpu``,
    where the adapters are enumerated; reaching for that fails the test."""

    def __init__(self, real, nodeid: str):
        self._real, self._nodeid = real, nodeid

    def __getattr__(self, name):
        if name == "gpu":
            pytest.fail(f"{self._nodeid} reaches for a GPU adapter but is not marked gpu: take a GPU fixture "
                        "(gpu, best, dev) or mark it @pytest.mark.gpu", pytrace=False)
        return getattr(self._real, name)


@pytest.fixture(autouse=True)
def _gpu_only_when_marked(request, monkeypatch):
    """A test not marked ``gpu`` that reaches for a wgpu adapter fails, on any machine: the
    marker must cover every test that needs a GPU, so that ``-m "not gpu"`` runs without one.
    (The adapter list and the devices are cached per process: both are emptied for the test.)"""
    if request.node.get_closest_marker("gpu") is not None:
        return
    from onnx_quant.backend_wgpu import device

    real = device._wgpu
    monkeypatch.setattr(device, "_ADAPTERS", None)
    monkeypatch.setattr(device, "_DEVICES", {})
    monkeypatch.setattr(device, "_wgpu", lambda: _NoAdapters(real(), request.node.nodeid))

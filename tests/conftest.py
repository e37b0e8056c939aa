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


def onnxruntime_run(model, feeds, *, level: str = "ORT_ENABLE_ALL", threads: int | None = None) -> list:
    """onnxruntime CPU's outputs for ``model`` on ``feeds``, with every uint8 x int8 integer GEMM
    summed exactly (onnx_quant.oracles.exact_onnxruntime_run: the model's int8 weight sides widened
    to uint8), so that no verdict depends on whether the host CPU has VNNI. ``level``: a
    GraphOptimizationLevel name (``ORT_DISABLE_ALL`` runs the graph as written); ``threads``:
    intra_op_num_threads (None: onnxruntime's default)."""
    from onnx_quant.oracles import exact_onnxruntime_run

    return exact_onnxruntime_run(model, feeds, level=level, threads=threads)


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
                f"compare with conftest.onnxruntime_run / onnx_quant.oracles.exact_onnxruntime_run")
        original(self, path_or_bytes, *args, **kwargs)

    ort.InferenceSession.__init__ = guarded
    try:
        yield
    finally:
        ort.InferenceSession.__init__ = original


def assert_agree(got, want, rtol: float) -> None:
    """Outputs against an oracle's: same shapes and dtypes; integer and bool outputs bit for bit,
    float ones within ``rtol`` of the largest expected magnitude (+1e-6)."""
    import numpy as np

    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if g.dtype.kind in "iub":
            assert np.array_equal(g, w)
            continue
        scale = float(np.abs(w.astype(np.float64)).max(initial=0))
        assert float(np.abs(g.astype(np.float64) - w).max(initial=0)) <= rtol * scale + 1e-6


def runs_from_a_cold_cache(device, model, feeds_list, *, kernel=None, variant=None, **session_kw):
    """``model`` run in one Session at each of ``feeds_list`` from a cold pipeline cache: (outputs
    per run, labels of the pipelines each run compiled). With ``variant``, ``kernel``'s node is
    forced to it and every plan is checked to have taken it."""
    from onnx_quant.backend_wgpu.session import Session

    variants = {kernel: variant} if variant else None
    outs, compiled = [], []
    with Session(model, device=device, variants=variants, allow_host_fallback=False, **session_kw) as sess:
        cache = sess.device.pipelines
        cache.forget()
        for feeds in feeds_list:
            before = set(cache._pipelines)
            outs.append(sess.run(None, feeds))
            compiled.append([cache._pipelines[k].label for k in set(cache._pipelines) - before])
            if variant:
                plan = next(p for p in sess.plans({k: v.shape for k, v in feeds.items()}) if p.kernel == kernel)
                assert plan.variant == variant
    return outs, compiled


def value_info_of(name: str, array):
    """A ValueInfoProto typed like ``array`` (its dtype and shape)."""
    from onnx import helper

    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)


def assert_bits(got, expected, what=""):
    """Same dtype, shape and bits (1-byte types, float8 included, compared as raw bytes)."""
    import numpy as np

    expected = np.asarray(expected)
    assert got.dtype == expected.dtype, (what, got.dtype, expected.dtype)
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    g = got.view(np.uint8) if got.dtype.itemsize == 1 else got
    e = expected.view(np.uint8) if expected.dtype.itemsize == 1 else expected
    if not np.array_equal(g, e):
        bad = np.argwhere(g != e)[:6]
        raise AssertionError(f"{what}: {int((g != e).sum())} of {g.size} differ, first at {bad.tolist()}: "
                             f"got {[got[tuple(i)] for i in bad]}, expected {[expected[tuple(i)] for i in bad]}")


def assert_node_cases_every_variant(device, op_types, variants) -> int:
    """ONNX's node cases with a node of ``op_types``, run with each of ``variants`` forced on
    their first node: outputs bit for bit as the case expects. Returns the number of cases."""
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.node_cases import all_node_cases

    cases = [c for c in all_node_cases() if any(n.op_type in op_types for n in c.model.graph.node)]
    for case in cases:
        op = case.model.graph.node[0].op_type
        for inputs, outputs in case.data_sets:
            feeds = {vi.name: x for vi, x in zip(case.model.graph.input, inputs)}
            for v in variants:
                with Session(case.model, device=device, variants={op: v}) as s:
                    got = s.run(None, feeds)
                for g, e in zip(got, outputs):
                    assert_bits(g, e, f"{case.name} {v}")
    return len(cases)


def assert_declined(device, case, words: str) -> None:
    """A node case the GPU declines: not passing, no value computed (never a wrong one), and the
    refusal says ``words``."""
    from onnx_quant.backend_wgpu.conformance import run_case

    row = run_case(case, device=device, host_fallback=False)
    assert not row.passed and row.max_error is None and words in (row.error or ""), (case.name, row.error)


def assert_node_cases_pass_or_declined(device, ops, declined, at_least: int, *, expanded: bool = True,
                                       check=None) -> list[str]:
    """ONNX's node cases whose op type is in ``ops`` (with ``expanded``, an expansion counts as its
    op): each passes on the GPU with no host fallback, or is named in ``declined`` (case name ->
    words of the reason) and refused with them, never a wrong value; every named case exists; at
    least ``at_least`` pass. ``check(case, feeds, expected, output_names)``, given, judges each data
    set instead of one plain run. Returns the passing case names."""
    from onnx_quant.backend_wgpu.conformance import case_op_type, run_case
    from onnx_quant.node_cases import all_node_cases

    passed, refused = [], []
    for case in all_node_cases():
        op = None if case.model is None else case_op_type(case)
        if op is None or (op.split(" ")[0] if expanded else op) not in ops:
            continue
        if case.name in declined:
            assert_declined(device, case, declined[case.name])
            refused.append(case.name)
            continue
        if check is None:
            row = run_case(case, device=device, host_fallback=False)
            assert row.passed, (case.name, row.error)
        else:
            names = [o.name for o in case.model.graph.output]
            for inputs, expected in case.data_sets:
                check(case, {vi.name: x for vi, x in zip(case.model.graph.input, inputs)}, expected, names)
        passed.append(case.name)
    assert sorted(refused) == sorted(declined)
    assert len(passed) >= at_least, len(passed)
    return passed


def run_every_variant(device, model, feeds, op_type):
    """The model run with each variant of its ``op_type`` node (the first node of that op type,
    else the first node) that applies, forced, no host fallback; asserts they give the same bits
    and returns (outputs, variant ids)."""
    import numpy as np

    from onnx_quant.backend_wgpu.session import Session

    with Session(model, device=device) as s:
        entries = s.explain({k: v.shape for k, v in feeds.items()})
        selection = next((e for e in entries if e["op_type"] == op_type), entries[0])["selection"]
    ids = [v for v, failing in selection.items() if failing is None]
    assert ids, selection
    runs = []
    for v in ids:
        with Session(model, device=device, variants={op_type: v}, allow_host_fallback=False) as s:
            runs.append(s.run(None, feeds))
    for outs in runs[1:]:
        for a, b in zip(outs, runs[0]):
            assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), ids
    return runs[0], ids


def gpu_required() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("ONNX_QUANT_REQUIRE_GPU"))


def no_gpu(reason: str):
    """Fail in CI, skip elsewhere: the one place this policy lives."""
    skip_unless_ci(f"no usable wgpu adapter: {reason}")


def skip_unless_ci(reason: str):
    """Skip on a developer's machine; in CI (``CI`` or ``ONNX_QUANT_REQUIRE_GPU``) a check
    that cannot run here (no adapter, a CPU without the onnxruntime kernels a test pins, a
    device that will not lower a limit) is a failure: CI must run every check."""
    if gpu_required():
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


def gpu_adapters():
    """wgpu's adapters, best first; none (or an error listing them) goes through
    :func:`no_gpu`."""
    from onnx_quant.backend_wgpu.device import list_adapters
    from onnx_quant.errors import DeviceError

    try:
        adapters = list_adapters()
    except DeviceError as e:
        no_gpu(str(e))
    if not adapters:
        no_gpu("wgpu lists no adapter")
    return adapters


def gpu_device(kind: str = "best"):
    """A wgpu device for tests, with WebGPU default limits so tests never depend on big ones.

    ``kind``: ``"best"`` (the default adapter), ``"best-no-subgroup"`` (same adapter, no
    optional features, to exercise the workgroup-memory paths) or ``"opengl"`` (skipped
    where no OpenGL adapter exists: it is an extra, not the adapter CI requires).
    A missing adapter goes through :func:`no_gpu` (fail in CI, skip elsewhere).
    """
    from onnx_quant.backend_wgpu.device import get_device
    from onnx_quant.errors import DeviceError

    adapters = gpu_adapters()
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

"""The GPU side of the tests: the adapter policy, devices, and checks that run node cases or
every variant on a device.

Policy (the one place it lives): in CI (``CI`` or ``ONNX_QUANT_REQUIRE_GPU`` set) a check that
cannot run here (no adapter, a device that will not lower a limit, ...) is a failure; on a
developer's machine without an adapter it skips with the reason.

Tests get devices from conftest's fixtures (``gpu``, ``best``, ``dev``), which also mark them
``gpu``; a test that makes a device itself calls :func:`gpu_device` / :func:`gpu_adapters` and
carries ``@pytest.mark.gpu``.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from support.oracles import assert_bits

#: the device kinds :func:`gpu_device` makes (``pytest.mark.devices`` picks among them)
DEVICE_KINDS = ("best", "best-no-subgroup", "best-max-limits", "opengl")


def gpu_examples(divisor: int = 3) -> int:
    """Fewer hypothesis examples than the profile, for GPU-heavy properties (each example
    compiles shaders)."""
    return max(4, settings.default.max_examples // divisor)


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
    optional features, to exercise the workgroup-memory paths), ``"best-max-limits"`` (the
    default adapter at its maximum limits: the device the commands create, ``get_device(None)``)
    or ``"opengl"`` (skipped where no OpenGL adapter exists: it is an extra, not the adapter CI
    requires). A missing adapter goes through :func:`no_gpu` (fail in CI, skip elsewhere).
    """
    from onnx_quant.backend_wgpu.device import get_device
    from onnx_quant.errors import DeviceError

    adapters = gpu_adapters()
    try:
        if kind == "best":
            return get_device(None, limits="default")
        if kind == "best-no-subgroup":
            return get_device(None, limits="default", features=())
        if kind == "best-max-limits":
            return get_device(None)
        if kind == "opengl":
            if not any(a.backend == "OpenGL" for a in adapters):
                pytest.skip("no OpenGL adapter here")
            return get_device("opengl", limits="default")
    except DeviceError as e:
        no_gpu(str(e))
    raise ValueError(f"unknown device kind {kind!r}")


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


def assert_first_run_alone_compiles(compiled, kernel: str) -> None:
    """``runs_from_a_cold_cache``'s labels: the first run compiled ``kernel``'s pipelines and no later
    run compiled any (its sizes are runtime uniforms)."""
    assert any(kernel in lab for lab in compiled[0]), compiled[0]
    for labels in compiled[1:]:
        assert not [lab for lab in labels if kernel in lab], labels


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


def run_every_variant(device, model, feeds, op_type, tunables=None):
    """The model run with each variant of its ``op_type`` node (the first node of that op type,
    else the first node) that applies (under ``tunables``: e.g. a size bound set to 0), forced,
    no host fallback; asserts they give the same bits and returns (outputs, variant ids)."""
    import numpy as np

    from onnx_quant.backend_wgpu.session import Session

    with Session(model, device=device, tunables=tunables) as s:
        entries = s.explain({k: v.shape for k, v in feeds.items()})
        selection = next((e for e in entries if e["op_type"] == op_type), entries[0])["selection"]
    ids = [v for v, failing in selection.items() if failing is None]
    assert ids, selection
    runs = []
    for v in ids:
        with Session(model, device=device, variants={op_type: v}, allow_host_fallback=False, tunables=tunables) as s:
            runs.append(s.run(None, feeds))
    for outs in runs[1:]:
        for a, b in zip(outs, runs[0]):
            assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), ids
    return runs[0], ids


#: sessions kept across hypothesis examples, per key (device, model parameters)
_KEPT_SESSIONS: dict[tuple, object] = {}


def kept_session(device, key: tuple, make_model, tunables=None):
    """One GPU-only Session per (device, ``key``), built from ``make_model()`` the first time: a
    property test's examples share it (its plans are keyed on the shapes they feed)."""
    from onnx_quant.backend_wgpu.session import Session

    full = (id(device), *key)
    if full not in _KEPT_SESSIONS:
        _KEPT_SESSIONS[full] = Session(make_model(), device=device, allow_host_fallback=False, tunables=tunables)
    return _KEPT_SESSIONS[full]

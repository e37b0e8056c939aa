"""DynamicQuantizeLinear on the GPU: every variant, chosen naturally and forced, bit for bit.

Devices: the best adapter with WebGPU default limits (lavapipe Vulkan here: subgroups), the
same adapter without the ``subgroup`` feature (workgroup-memory tree), and the OpenGL adapter
where present (no subgroups). Oracles: onnx's ReferenceEvaluator on every input it accepts
(edge cases included: its behaviour is the one we implement), the same in numpy
(``numpy_dynamic_quantize_linear``, which also covers empty input), and onnxruntime CPU on
inputs without NaN whose range is not empty (it differs there, see docs/backend.md).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from onnx_quant.backend_wgpu.commands import dql_model, numpy_dynamic_quantize_linear
from onnx_quant.backend_wgpu.device_info import WEBGPU_DEFAULT_LIMITS
from onnx_quant.errors import ExecutionError

VARIANTS = ("single_invocation", "parallel_subgroup_reduce_vec4", "parallel_subgroup_reduce",
            "grid_stride_reduce_vec4", "grid_stride_reduce")


#: dev: also the default adapter without its optional features (the workgroup-memory paths)
pytestmark = pytest.mark.devices("best", "best-no-subgroup", "opengl")


def _session(dev, rank=1, variant=None, tunables=None):
    from onnx_quant.backend_wgpu.session import Session

    return Session(dql_model(rank), device=dev, tunables=tunables,
                   variants={"DynamicQuantizeLinear": variant} if variant else None)


def _bits(a: np.ndarray) -> np.ndarray:
    """Bit patterns, with every float NaN mapped to one pattern (payloads are not compared)."""
    a = np.asarray(a)
    if a.dtype == np.float32:
        return np.where(np.isnan(a), np.uint32(0x7FC00000), a.view(np.uint32))
    return a


def assert_same(got, expected, what=""):
    assert len(got) == len(expected)
    for name, g, e in zip(("y", "y_scale", "y_zero_point"), got, expected):
        e = np.asarray(e)
        assert g.dtype == e.dtype, (what, name, g.dtype, e.dtype)
        assert g.shape == e.shape, (what, name, g.shape, e.shape)
        if not np.array_equal(_bits(g), _bits(e)):
            bad = np.nonzero(_bits(g).reshape(-1) != _bits(e).reshape(-1))[0]
            raise AssertionError(f"{what}: {name} differs at {bad[:8].tolist()} ({len(bad)} elements): "
                                 f"got {g.reshape(-1)[bad[:8]]}, expected {e.reshape(-1)[bad[:8]]}")


def reference(x: np.ndarray):
    from onnx.reference import ReferenceEvaluator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(dql_model(x.ndim)).run(None, {"x": x})


_ORT = {}


def onnxruntime_outputs(x: np.ndarray):
    import onnxruntime as ort
    if x.ndim not in _ORT:
        _ORT[x.ndim] = ort.InferenceSession(dql_model(x.ndim).SerializeToString(),
                                            providers=["CPUExecutionProvider"])
    return _ORT[x.ndim].run(None, {"x": x})


def data(n: int, seed: int = 0, ties: bool = True) -> np.ndarray:
    """Random values with a good share of exact ties (x / scale == k + 0.5 in f32)."""
    rng = np.random.default_rng(seed + n)
    x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 50.0])).astype(np.float32)
    if ties and n >= 8:
        lo, hi = min(np.float32(0), x.min()), max(np.float32(0), x.max())
        scale = np.float32(hi - lo) / np.float32(255)
        m = n // 3
        k = rng.integers(-255, 256, m).astype(np.float32) + np.float32(0.5)
        t = (k * scale).astype(np.float32)
        x[1:m + 1] = np.clip(t, lo, hi)
        x[0], x[-1] = lo, hi  # keep the range (so the scale) unchanged
    return x


def onnxruntime_agrees(x: np.ndarray) -> bool:
    """Inputs where onnxruntime's DynamicQuantizeLinear is deterministic and equals the reference."""
    return x.size > 0 and not np.isnan(x).any() and bool(np.any(x != 0))


def check(dev, x, *, variant=None, tunables=None, expect_variant=None, oracle="all"):
    s = _session(dev, x.ndim, variant, tunables)
    got = s.run(None, {"x": x})
    try:
        if expect_variant:
            assert s.plans({"x": x.shape})[0].variant == expect_variant
        assert_same(got, numpy_dynamic_quantize_linear(x), f"numpy n={x.size} {variant}")
        if oracle in ("all", "reference") and x.size:
            assert_same(got, reference(x), f"reference n={x.size} {variant}")
        if oracle in ("all", "onnxruntime") and onnxruntime_agrees(x):
            assert_same(got, onnxruntime_outputs(x), f"onnxruntime n={x.size} {variant}")
    finally:
        s.close()
    return got


# ----------------------------------------------------------------------------- natural choice

NATURAL = [
    (1, "single_invocation"), (5, "single_invocation"), (8191, "single_invocation"),
    (8192, "single_invocation"), (8193, "parallel_subgroup_reduce"), (8196, "parallel_subgroup_reduce_vec4"),
    (262143, "parallel_subgroup_reduce"), (262144, "grid_stride_reduce_vec4"),
    (262145, "grid_stride_reduce"), (262148, "grid_stride_reduce_vec4"),
]


@pytest.mark.parametrize("n,variant", NATURAL)
def test_natural_variant_is_exact(dev, n, variant):
    check(dev, data(n), expect_variant=variant)


def test_rank_and_shape_kept(best):
    x = data(3 * 5 * 7).reshape(3, 5, 7)
    got = check(best, x)
    assert got[0].shape == (3, 5, 7)


# ----------------------------------------------------------------------------- forced variants

def _tunables_for(variant: str, n: int) -> dict[str, int]:
    if variant == "single_invocation":
        return {"SERIAL_MAX_ELEMENTS": max(n, 8192)}
    if variant.startswith("grid_stride"):
        return {"GRID_STRIDE_MIN_ELEMENTS": 1}
    return {}


def _size_for(variant: str, n: int) -> int:
    if "vec4" in variant:
        return n - n % 4
    if variant == "grid_stride_reduce" and n % 4 == 0:
        return n + 1
    return n


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n", [4, 1000, 8193, 70001])
def test_forced_variant_is_exact(dev, variant, n):
    n = _size_for(variant, n)
    check(dev, data(n, seed=7), variant=variant, tunables=_tunables_for(variant, n), expect_variant=variant)


def test_single_invocation_long_tie_heavy_input(best):
    """One invocation over 200003 elements, a third of them exact ties: the division refinement
    must not eat llvmpipe's per-invocation loop budget (65535 iterations)."""
    n = 200003
    check(best, data(n, seed=13), variant="single_invocation", tunables={"SERIAL_MAX_ELEMENTS": n},
          expect_variant="single_invocation", oracle="reference")


@pytest.mark.parametrize("variant", VARIANTS[1:])
def test_small_tunables_many_partials(best, variant):
    # a workgroup of 8 with 2 elements each: many partials, uneven last block
    n = _size_for(variant, 5003)
    tun = {"WORKGROUP_SIZE": 8, "ELEMENTS_PER_THREAD": 2, **_tunables_for(variant, n)}
    check(best, data(n, seed=3), variant=variant, tunables=tun, expect_variant=variant, oracle="reference")


@pytest.mark.parametrize("n,variant", [(300000, "parallel_subgroup_reduce_vec4"), (300001, "parallel_subgroup_reduce")])
def test_two_dimensional_dispatch(dev, n, variant):
    # WORKGROUP_SIZE * ELEMENTS_PER_THREAD = 4: 75000 partials > 65535 workgroups per dimension
    tun = {"WORKGROUP_SIZE": 4, "ELEMENTS_PER_THREAD": 1, "GRID_STRIDE_MIN_ELEMENTS": 1 << 30}
    s = _session(dev, 1, None, tun)
    plan = s.plans({"x": (n,)})[0]
    assert plan.variant == variant
    reduce = plan.passes[0]
    assert reduce.id == "reduce" and reduce.dispatch[0] == 65535 and reduce.dispatch[1] == 2
    assert max(p.dispatch[0] for p in plan.passes) <= WEBGPU_DEFAULT_LIMITS["maxComputeWorkgroupsPerDimension"]
    x = data(n, seed=11)
    x[-1] = np.float32(-1000.0)  # the extreme sits in the last (second-row) workgroup
    try:
        got = s.run(None, {"x": x})
        assert_same(got, numpy_dynamic_quantize_linear(x), "2-D dispatch")
    finally:
        s.close()


# ----------------------------------------------------------------------------- edge inputs

NAN, INF = np.float32(np.nan), np.float32(np.inf)
EDGE = {
    "all_zero": [0.0] * 6,
    "negative_zero": [-0.0] * 6,
    "nan_inside": [1.0, NAN, -2.0, 3.0, 0.5, -1.5],
    "nan_first": [NAN, 1.0, -2.0, 3.0, 4.0, 5.0],
    "nan_last": [1.0, -2.0, 3.0, 4.0, 5.0, NAN],
    "all_nan": [NAN] * 6,
    "plus_inf": [1.0, INF, -2.0, 3.0, 0.0, 7.0],
    "minus_inf": [1.0, -INF, -2.0, 3.0, 0.0, 7.0],
    "both_inf": [1.0, -INF, INF, 3.0, 0.0, 7.0],
    "inf_and_nan": [NAN, INF, -2.0, 3.0, 0.0, 7.0],
    "positive_only": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
    "negative_only": [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0],
    "denormal_only": [1e-45, 0.0, 3e-45, 1e-44, 0.0, 2e-45],
    "subnormal_range": [1e-40, -3e-41, 2e-39, 0.0, 5e-39, -1e-38],
    "overflowing_range": [3e38, -3e38, 1.0, -1.0, 0.0, 2e38],
    "max_float": [3.4028235e38, 1.0, -1.0, 0.0, 1e38, 2.0],
    "one_value": [2.5, 2.5, 2.5, 2.5, 2.5, 2.5],
}


def _edge(name: str, n: int) -> np.ndarray:
    base = np.array(EDGE[name], dtype=np.float32)
    return np.resize(base, n).astype(np.float32)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", sorted(EDGE))
def test_edge_inputs_every_variant(dev, name, variant):
    n = 8 if "vec4" in variant else 7  # vec4 variants need a multiple of 4, grid_stride_reduce not
    x = _edge(name, n)
    expected = reference(x)
    assert_same(numpy_dynamic_quantize_linear(x), expected, f"numpy formula vs the reference on {name}")
    s = _session(dev, 1, variant, _tunables_for(variant, n))
    try:
        got = s.run(None, {"x": x})
    finally:
        s.close()
    assert_same(got, expected, f"{name} {variant}")
    if onnxruntime_agrees(x):
        assert_same(got, onnxruntime_outputs(x), f"{name} {variant} vs onnxruntime")


@pytest.mark.parametrize("x", [np.zeros((0,), np.float32), np.zeros((0, 3), np.float32),
                               np.array(2.5, np.float32), np.array(-2.5, np.float32),
                               np.array(np.nan, np.float32), np.array(0.0, np.float32)],
                         ids=["empty", "empty-2d", "rank0", "rank0-negative", "rank0-nan", "rank0-zero"])
def test_empty_and_rank0(dev, x):
    s = _session(dev, x.ndim)
    try:
        got = s.run(None, {"x": x})
        assert s.plans({"x": x.shape})[0].variant == "single_invocation"
    finally:
        s.close()
    assert_same(got, numpy_dynamic_quantize_linear(x), f"shape {x.shape}")
    if x.size:
        assert_same(got, reference(x), f"shape {x.shape}")
    if onnxruntime_agrees(x):
        assert_same(got, onnxruntime_outputs(x), f"shape {x.shape}")
    if x.size == 0:  # the reference cannot reduce an empty tensor: the all-zero rule applies
        assert float(got[1]) == np.float32(1) / np.float32(255) and int(got[2]) == 0


def test_documented_comparison_table():
    """The reference/onnxruntime table in docs/backend.md, checked against the installed packages."""
    zero = np.zeros(8, np.float32)
    assert float(reference(zero)[1]) == np.float32(1) / np.float32(255)  # reference (and we): RN(1/255)
    assert float(onnxruntime_outputs(zero)[1]) == 1.0  # onnxruntime: 1.0
    nan = np.array([1.0, np.nan, -2.0, 3.0], np.float32)
    r = reference(nan)
    assert np.isnan(r[1]) and int(r[2]) == 255 and not r[0].any()  # NaN propagates
    # onnxruntime's NaN handling depends on where the NaN sits (its vectorised min/max)
    scales = set()
    for pos in range(8):
        x = np.linspace(-2, 3, 8).astype(np.float32)
        x[pos] = np.nan
        scales.add("nan" if np.isnan(onnxruntime_outputs(x)[1]) else float(onnxruntime_outputs(x)[1]))
    assert len(scales) > 1
    with pytest.raises(ValueError):
        reference(np.zeros((0,), np.float32))  # the reference cannot reduce an empty tensor
    assert float(onnxruntime_outputs(np.zeros((0,), np.float32))[1]) == 1.0


# ----------------------------------------------------------------------------- ties and random

@pytest.mark.parametrize("variant", VARIANTS)
def test_every_tie_quotient(best, variant):
    """For several scales: x = (k + 0.5) * scale and its float neighbours, k in [-255, 255]."""
    rng = np.random.default_rng(5)
    parts = []
    for scale_range in (1.0, 255.0, 3.1e-3, 7.7e5, 1e-30, 2.2e30):
        lo = np.float32(-scale_range * rng.uniform(0.2, 0.8))
        hi = np.float32(scale_range)
        scale = np.float32(hi - lo) / np.float32(255)
        k = np.arange(-255, 256, dtype=np.float32) + np.float32(0.5)
        t = (k * scale).astype(np.float32)
        t = np.clip(t, lo, hi)
        chunk = np.concatenate([[lo, hi], t, np.nextafter(t, np.float32(np.inf)), np.nextafter(t, np.float32(-np.inf))])
        parts.append(np.clip(chunk, lo, hi).astype(np.float32))
    for chunk in parts:
        n = _size_for(variant, chunk.size)
        x = np.resize(chunk, n).astype(np.float32)
        check(best, x, variant=variant, tunables=_tunables_for(variant, n))


@settings(deadline=None)
@given(x=hnp.arrays(np.float32, st.integers(1, 600),
                    elements=st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)))
def test_random_arrays_every_variant(best, x):
    for variant in VARIANTS:
        n = _size_for(variant, x.size)
        if n == 0:
            continue
        xv = np.resize(x, n).astype(np.float32) if n != x.size else x
        exp = reference(xv)
        assert_same(numpy_dynamic_quantize_linear(xv), exp, "numpy formula vs reference")
        s = _session(best, 1, variant, _tunables_for(variant, n))
        try:
            assert_same(s.run(None, {"x": xv}), exp, f"{variant} n={n}")
        finally:
            s.close()


# ----------------------------------------------------------------------------- ONNX's node cases

def _onnx_dql_cases():
    from onnx_quant.node_cases import all_node_cases

    return [c for c in all_node_cases() if any(n.op_type == "DynamicQuantizeLinear" for n in c.model.graph.node)]


_CASES = _onnx_dql_cases()


@pytest.mark.parametrize("case", _CASES, ids=[c.name for c in _CASES])
def test_onnx_node_cases(dev, case):
    from onnx_quant.backend_wgpu.session import Session

    assert len(_CASES) >= 3
    s = Session(case.model, device=dev)
    try:
        for inputs, outputs in case.data_sets:
            feeds = {vi.name: np.asarray(v) for vi, v in zip(case.model.graph.input, inputs)}
            got = s.run(None, feeds)
            for g, e in zip(got, outputs):
                e = np.asarray(e)
                assert g.dtype == e.dtype and g.shape == e.shape
                assert np.array_equal(_bits(g), _bits(e)), (case.name, g, e)
    finally:
        s.close()


# ----------------------------------------------------------------------------- caching and limits

def test_second_run_compiles_and_allocates_nothing(dev):
    x = data(20000, seed=2)
    s = _session(dev)
    try:
        s.run(None, {"x": x})
        comp, bufs, groups = dev.pipelines.compilations, dev.stats.buffers_allocated, dev.stats.bind_groups_created
        hits = dev.pipelines.cache_hits
        got = s.run(None, {"x": x})
        assert (dev.pipelines.compilations, dev.stats.buffers_allocated, dev.stats.bind_groups_created) == (comp, bufs, groups)
        assert dev.pipelines.cache_hits == hits  # the prepared plan holds its pipelines: no lookup at all
        assert_same(got, numpy_dynamic_quantize_linear(x), "second run")
        # a new session with the same shapes plans again but compiles nothing
        s2 = _session(dev)
        try:
            s2.run(None, {"x": x})
            assert dev.pipelines.compilations == comp
        finally:
            s2.close()
    finally:
        s.close()


def test_input_beyond_max_storage_binding(best):
    """WebGPU default maxStorageBufferBindingSize is 128 MiB: one float more is refused before
    anything is allocated (the feed is a zero-stride view, no memory behind it)."""
    limit = best.info.limits["maxStorageBufferBindingSize"]
    assert limit == WEBGPU_DEFAULT_LIMITS["maxStorageBufferBindingSize"]
    x = np.broadcast_to(np.float32(1.0), (limit // 4 + 1,))
    s = _session(best)
    bufs = best.stats.buffers_allocated
    with pytest.raises(ExecutionError, match="storage buffer|maxStorageBufferBindingSize"):
        s.run(None, {"x": x})
    assert best.stats.buffers_allocated == bufs


@pytest.mark.usefixtures("best")  # an adapter exists (fail in CI, skip elsewhere)
def test_input_beyond_a_small_device_limit():
    from onnx_quant.backend_wgpu.device import get_device

    small = get_device(None, limits={"maxStorageBufferBindingSize": 65536})
    assert small.info.limits["maxStorageBufferBindingSize"] == 65536
    s = _session(small)
    with pytest.raises(ExecutionError, match="x"):
        s.run(None, {"x": np.ones(16385, np.float32)})
    got = s.run(None, {"x": data(16384)})  # exactly at the limit still runs
    assert_same(got, numpy_dynamic_quantize_linear(data(16384)), "at the limit")
    s.close()

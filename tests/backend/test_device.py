"""The device layer: adapter choice, limits, features, buffers, pipelines, launch, errors,
host packing, and the division refinement the kernels rely on."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

from support.gpu import gpu_adapters
from onnx_quant.backend_wgpu import device as devmod
from onnx_quant.backend_wgpu.device_info import WEBGPU_DEFAULT_LIMITS
from onnx_quant.backend_wgpu.executor import pack_array, packed_nbytes, unpack_array
from onnx_quant.backend_wgpu.pipelines import layout_key
from onnx_quant.backend_wgpu.plan import BindingPlan
from onnx_quant.backend_wgpu.render import render_string
from onnx_quant.dtypes import BY_NAME
from onnx_quant.errors import DeviceError


# ----------------------------------------------------------------------------- adapters

@pytest.mark.gpu
def test_adapters_listed_best_first():
    adapters = gpu_adapters()
    assert [a.index for a in adapters] == list(range(len(adapters)))
    assert [a.rank for a in adapters] == sorted(a.rank for a in adapters)
    for a in adapters:
        assert a.summary and a.backend
        assert all(isinstance(v, int) for v in a.limits.values())
        assert "maxStorageBufferBindingSize" in a.limits


@pytest.mark.gpu
def test_adapter_selection(monkeypatch):
    adapters = gpu_adapters()
    monkeypatch.delenv("ONNX_QUANT_ADAPTER", raising=False)
    assert devmod.select_adapter().index == 0
    last = adapters[-1]
    assert devmod.select_adapter(last.index).index == last.index
    assert devmod.select_adapter(str(last.index)).index == last.index
    assert devmod.select_adapter(last.backend.upper()).backend == last.backend
    monkeypatch.setenv("ONNX_QUANT_ADAPTER", last.backend.lower())
    assert devmod.select_adapter().backend == last.backend
    monkeypatch.setenv("ONNX_QUANT_ADAPTER", str(last.index))
    assert devmod.select_adapter().index == last.index
    # the argument wins over the environment
    assert devmod.select_adapter(0).index == 0


@pytest.mark.parametrize("choice", [99, "-1", "no-such-adapter"])
@pytest.mark.gpu
def test_bad_adapter_choice(monkeypatch, choice):
    gpu_adapters()
    with pytest.raises(DeviceError, match="no usable adapter"):
        devmod.select_adapter(choice)
    monkeypatch.setenv("ONNX_QUANT_ADAPTER", str(choice))
    with pytest.raises(DeviceError, match="ONNX_QUANT_ADAPTER"):
        devmod.select_adapter()


def test_no_adapter_is_a_clear_device_error(monkeypatch):
    monkeypatch.setattr(devmod, "list_adapters", lambda **kw: [])
    with pytest.raises(DeviceError, match="no usable adapter"):
        devmod.select_adapter()
    with pytest.raises(DeviceError, match="no usable adapter"):
        devmod.GpuDevice()


def test_kebab_camel_names():
    assert devmod.camel_to_kebab("maxStorageBufferBindingSize") == "max-storage-buffer-binding-size"
    assert devmod.kebab_to_camel("max-compute-workgroup-size-x") == "maxComputeWorkgroupSizeX"
    for name in WEBGPU_DEFAULT_LIMITS:
        assert devmod.kebab_to_camel(devmod.camel_to_kebab(name)) == name


# ----------------------------------------------------------------------------- limits/features

def test_default_limits_are_requested_and_read_back(best):
    assert best.limits_mode == "default"
    for name, value in WEBGPU_DEFAULT_LIMITS.items():
        assert best.info.limits[name] == value, name


@pytest.mark.gpu
def test_limits_from_environment(monkeypatch):
    gpu_adapters()
    monkeypatch.setenv("ONNX_QUANT_LIMITS", "default")
    dev = devmod.get_device(None)
    assert dev.limits_mode == "default"
    assert dev.info.limits["maxComputeInvocationsPerWorkgroup"] == 256
    monkeypatch.setenv("ONNX_QUANT_LIMITS", "bogus")
    with pytest.raises(DeviceError, match="limits"):
        devmod.get_device(None)


def test_lower_limits_and_unknown_limits(best):
    small = devmod.get_device(None, limits={"maxStorageBufferBindingSize": 4096})
    assert small.info.limits["maxStorageBufferBindingSize"] == 4096
    with pytest.raises(DeviceError, match="notALimit"):
        devmod.GpuDevice(None, limits={"notALimit": 1})


def test_kernel_features_requested_by_their_real_names(best):
    adapter = best.adapter_entry
    for feature in devmod.WANTED_FEATURES:
        assert (feature in best.info.features) == (feature in adapter.features)
    assert "subgroups" not in best.info.features
    plain = devmod.get_device(None, limits="default", features=())
    assert "subgroup" not in plain.info.features
    with pytest.raises(DeviceError, match="lacks features"):
        devmod.GpuDevice(None, features=["no-such-feature"])


def test_device_is_shared(best):
    assert devmod.get_device(None, limits="default") is best


# ----------------------------------------------------------------------------- buffers

def test_allocate_rounds_and_counts(best):
    before = best.stats.buffers_allocated
    b1 = best.allocate(0, label="empty")
    b2 = best.allocate(5, label="five")
    assert (b1.size, b2.size) == (4, 8)
    assert best.stats.buffers_allocated == before + 2


def test_upload_download_roundtrip(best):
    data = np.arange(1001, dtype=np.uint8)
    packed = pack_array(data, "uint8")
    buf = best.allocate(len(packed), label="roundtrip")
    best.upload(buf, packed)
    back = best.download(buf, len(packed))
    assert bytes(back) == bytes(packed)
    assert np.array_equal(unpack_array(back, "uint8", (1001,)), data)
    with pytest.raises(DeviceError, match="multiple of 4"):
        best.upload(buf, b"abc")


# ----------------------------------------------------------------------------- pipelines/launch

_ADD = """
struct P { v: u32, };
@group(0) @binding(0) var<storage, read_write> o: array<u32>;
@group(0) @binding(1) var<uniform> params: P;
@compute @workgroup_size(1)
fn main() {
  o[0] = o[0] * 10u + params.v;
}
"""
_ADD_BINDINGS = (BindingPlan(0, "o", "o", "read_write", "u32", 1),
                 BindingPlan(1, "params", "params", "uniform", "P", None, (("v", "u32"),)))


def test_pipeline_cache_counts(best):
    key = layout_key(_ADD_BINDINGS)
    assert key == ((0, "storage"), (1, "uniform"))
    a = best.compile(_ADD, key, label="add")
    c0, h0 = best.pipelines.compilations, best.pipelines.cache_hits
    b = best.compile(_ADD, key, label="add")
    assert a is b
    assert (best.pipelines.compilations, best.pipelines.cache_hits) == (c0, h0 + 1)
    c = best.compile(_ADD + "\n// another source\n", key, label="add2")
    assert c is not a and best.pipelines.compilations == c0 + 1
    assert c.bind_group_layout is a.bind_group_layout  # explicit layouts are shared
    assert best.pipelines.counters()["pipelines"] == len(best.pipelines)


def test_passes_in_one_encoder_each_with_its_own_params(best):
    """Three dispatches in one submit, each reading its own uniform buffer: 0 -> 1 -> 12 -> 123.
    (One params buffer rewritten between dispatches would give every dispatch the last value.)"""
    key = layout_key(_ADD_BINDINGS)
    comp = best.compile(_ADD, key, label="add")
    out = best.allocate(4, label="o")
    best.upload(out, np.zeros(1, np.uint32))
    steps = []
    for i, v in enumerate((1, 2, 3)):
        params = best.allocate_uniform(4, label=f"params{i}")
        best.upload(params, np.array([v, 0, 0, 0], np.uint32))
        bg = best.bind(comp, [(0, out, 4), (1, params, 16)])
        steps.append((comp, bg, (1, 1, 1), f"add{v}"))
    steps.append((comp, steps[0][1], (0, 1, 1), "skipped"))
    staging = best.allocate_staging(4)
    submits = best.stats.submits
    raw = best.launch(steps, copies=[(out, 0, staging, 0, 4)], read=staging)
    assert best.stats.submits == submits + 1
    assert np.frombuffer(raw, np.uint32)[0] == 123


def test_shader_errors_name_kernel_variant_and_pass(best):
    with pytest.raises(DeviceError) as e:
        best.compile("fn main( {", (), kernel="K", variant="V", pass_id="P")
    msg = str(e.value)
    assert "kernel K" in msg and "variant V" in msg and "pass P" in msg


def test_validation_errors_become_device_errors(best):
    small = devmod.get_device(None, limits={"maxStorageBufferBindingSize": 4096})
    comp = small.compile(_ADD, layout_key(_ADD_BINDINGS))
    big = small.allocate(8192)
    params = small.allocate_uniform(4)
    with pytest.raises(DeviceError, match="bind group"):
        small.bind(comp, [(0, big, 8192), (1, params, 16)], kernel="K", variant="V", pass_id="P")


# ----------------------------------------------------------------------------- division

def _division_shader(out_type: str, body: str) -> str:
    """A division test's shader: element i of a / b, p[i] a perturbation in ULPs, results in o."""
    return '''
{% include "snippets/numerics.wgsl.jinja" %}
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read> p: array<i32>;
@group(0) @binding(3) var<storage, read_write> o: array<OUT>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let i = g.x;
  if (i >= arrayLength(&a)) { return; }
'''.replace("OUT", out_type) + body


def _run_division(dev, src: str, out_type: str, a, b, p, out_words: int, label: str) -> bytes:
    """The shader run over a, b, p (one invocation per element): o's bytes."""
    binds = [BindingPlan(0, "a", "a", "read", "f32"), BindingPlan(1, "b", "b", "read", "f32"),
             BindingPlan(2, "p", "p", "read", "i32"), BindingPlan(3, "o", "o", "read_write", out_type)]
    comp = dev.compile(src, layout_key(binds), label=label)
    bufs = [dev.allocate(a.nbytes), dev.allocate(b.nbytes), dev.allocate(p.nbytes), dev.allocate(4 * out_words)]
    for buf, arr in zip(bufs, (a, b, p)):
        dev.upload(buf, arr)
    bg = dev.bind(comp, [(i, buf, buf.size) for i, buf in enumerate(bufs)])
    staging = dev.allocate_staging(4 * out_words)
    return dev.launch([(comp, bg, (a.size // 64, 1, 1), label)], copies=[(bufs[3], 0, staging, 0, 4 * out_words)],
                      read=staging)


_DIV_TEST = _division_shader("f32", '''
  let x = a[i];
  let s = b[i];
  let q = x / s;
  // start the refinement p[i] ULPs away from the hardware quotient (same sign, clamped to [0, inf])
  let mag = i32(bitcast<u32>(q) & 0x7fffffffu);
  let q0 = bitcast<f32>(u32(clamp(mag + p[i], 0, 0x7f800000)) | (bitcast<u32>(q) & 0x80000000u));
  o[3u * i] = select(q, oq_div_refine(x, s, q0), oq_is_finite_nonzero(x) && oq_is_finite_nonzero(s) && oq_is_finite(q));
  o[3u * i + 1u] = oq_div_rn(x, s);
  o[3u * i + 2u] = oq_div_rint(x, s);
}
''')


def _random_f32(rng, n):
    bits = rng.integers(0, 0x7F800000, n, dtype=np.uint32) | (rng.integers(0, 2, n, dtype=np.uint32) << 31)
    return bits.view(np.float32)


@pytest.mark.parametrize("straight_line", [False, True], ids=["loop", "unrolled"])
@pytest.mark.parametrize("seed", [0, 1])
def test_division_is_correctly_rounded_from_a_perturbed_start(dev, seed, straight_line):
    """x / s must equal numpy's (correctly rounded) f32 quotient even when the device's first
    quotient is up to 3 ULP off (WGSL allows 2.5), over all finite values incl. subnormals,
    quotients near overflow and underflow, and exact half-integer quotients for rint."""
    dev = dev
    rng = np.random.default_rng(seed)
    n = 1 << 16
    a, b = _random_f32(rng, n), _random_f32(rng, n)
    m = n // 4
    s = (rng.random(m) * 10.0 ** rng.integers(-40, 38, m)).astype(np.float32)
    k = (rng.integers(-300, 300, m) + rng.choice([0.5, 0.0, 0.25], m)).astype(np.float32)
    with np.errstate(all="ignore"):
        a[:m] = (k * s).astype(np.float32)
    b[:m] = s
    a[m:2 * m] = _random_f32(rng, m) * np.float32(1e-38)  # subnormal dividends
    b[2 * m:2 * m + m // 2] = _random_f32(rng, m // 2) * np.float32(1e-38)  # subnormal divisors
    p = rng.integers(-3, 4, n).astype(np.int32)
    src = render_string(_DIV_TEST, {"oq_straight_line_refine": straight_line})
    assert ("step 4" in src) == straight_line
    raw = _run_division(dev, src, "f32", a, b, p, 3 * n, "division test")
    out = np.frombuffer(raw, np.float32).reshape(n, 3)
    with np.errstate(all="ignore"):
        q = a / b
        r = np.rint(q)
    finite = np.isfinite(a) & np.isfinite(b) & (a != 0) & (b != 0)
    for col, expected, name in ((0, q, "refine"), (1, q, "div_rn"), (2, r, "div_rint")):
        got = out[:, col]
        same = (got.view(np.uint32) == expected.view(np.uint32)) | (np.isnan(got) & np.isnan(expected))
        bad = np.nonzero(~same & finite)[0]
        assert bad.size == 0, (name, a[bad[:4]], b[bad[:4]], p[bad[:4]], got[bad[:4]], expected[bad[:4]])


def test_llvmpipe_loop_limiter_is_real(best):
    """Documents why the kernels avoid long per-invocation loops: llvmpipe ends a loop after
    65535 iterations per invocation (all loops together). Skipped on other devices."""
    if "llvmpipe" not in best.info.name:
        pytest.skip("llvmpipe only")
    src = """
@group(0) @binding(0) var<storage, read_write> o: array<u32>;
@compute @workgroup_size(1)
fn main() {
  var c = 0u;
  for (var i = 0u; i < 100000u; i = i + 1u) { c = c + 1u; }
  o[0] = c;
}"""
    binds = [BindingPlan(0, "o", "o", "read_write", "u32")]
    comp = best.compile(src, layout_key(binds))
    out = best.allocate(4)
    bg = best.bind(comp, [(0, out, 4)])
    staging = best.allocate_staging(4)
    raw = best.launch([(comp, bg, (1, 1, 1), "loop")], copies=[(out, 0, staging, 0, 4)], read=staging)
    assert np.frombuffer(raw, np.uint32)[0] == 65535


# ----------------------------------------------------------------------------- host packing

@pytest.mark.parametrize("name", ["int4", "uint4", "int2", "uint2", "float4e2m1", "uint8", "int8", "float16",
                                  "bfloat16", "float8e4m3fn", "int32", "float32", "int16", "bool"])
@pytest.mark.parametrize("count", [0, 1, 3, 4, 5, 17])
def test_pack_matches_onnx_raw_data(name, count):
    et = BY_NAME[name]
    rng = np.random.default_rng(count)
    if et.is_integer:
        lo, hi = et.int_range
        values = rng.integers(lo, hi, count, endpoint=True).astype(et.dtype)
    elif et.kind == "bool":
        values = rng.integers(0, 2, count).astype(bool)
    else:
        values = rng.standard_normal(count).astype(np.float32).astype(et.dtype)
    data = bytes(pack_array(values, name))
    assert len(data) % 4 == 0 and len(data) >= packed_nbytes(name, count)
    tensor = numpy_helper.from_array(values)
    raw = tensor.raw_data if tensor.raw_data else None
    if raw is not None and count:
        assert data[:len(raw)] == raw, name
        assert not any(data[len(raw):])
    back = unpack_array(data, name, (count,))
    assert back.dtype == values.dtype
    assert np.array_equal(back.view(np.uint8), values.view(np.uint8)) or np.array_equal(back, values)


def test_pack_rejects_wrong_dtype():
    from onnx_quant.errors import ExecutionError

    with pytest.raises(ExecutionError, match="uint8"):
        pack_array(np.zeros(4, np.int8), "uint8")
    # float6 has a device layout now (byte containers, backend_wgpu/packing.py)
    assert len(bytes(pack_array(np.zeros(4, BY_NAME["float6e2m3"].dtype), "float6e2m3"))) == 4
    assert TensorProto.UINT8 == BY_NAME["uint8"].code


_CERTIFIED_TEST = _division_shader("u32", '''
  let q = a[i] / b[i];
  // the quotient p[i] ULPs away from the device's (a device within 3 ULP), as the test's checks see it
  let mag = i32(bitcast<u32>(q) & 0x7fffffffu);
  let qp = bitcast<f32>(u32(clamp(mag + p[i], 0, 0x7f800000)) | (bitcast<u32>(q) & 0x80000000u));
  let qq = select(q, qp, oq_is_finite(q));
  o[2u * i] = bitcast<u32>(qq);
  o[2u * i + 1u] = select(0u, 1u, oq_div_certified(a[i], oq_divisor(b[i]), qq));
}
''')


@pytest.mark.parametrize("seed", [0, 1])
def test_certified_quotients_are_the_correctly_rounded_ones(dev, seed):
    """oq_div_certified (a cheap residual test, so that callers run oq_div_refine only where it
    fails) never certifies a quotient that is not numpy's correctly rounded one, for quotients
    up to 3 ULP off (WGSL allows 2.5): random values, subnormals, quotients near powers of two
    on both sides, near overflow and underflow, divisors outside WGSL's accuracy range; and it
    certifies almost every exact one. (Its power-of-two rule, for a quotient between 1/4 and 1/2
    ULP below a power of two, guards what no quotient of two floats reaches: two 24-bit
    significands put x / s at least half a ULP from any power of two it is not equal to.)"""
    rng = np.random.default_rng(10 + seed)
    n = 1 << 16
    a, b = _random_f32(rng, n), _random_f32(rng, n)
    m = n // 8
    b[:4 * m] = (rng.random(4 * m) * 10.0 ** rng.integers(-30, 30, 4 * m)).astype(np.float32)
    # quotients within 2 ULP of a power of two, below and above it
    pw = np.float32(2.0) ** rng.integers(-60, 60, m).astype(np.float32)
    with np.errstate(all="ignore"):
        a[:m] = (pw.astype(np.float64) * b[:m] * (1 + rng.uniform(-2, 2, m) * 2.0 ** -23)).astype(np.float32)
        a[m:2 * m] = (rng.standard_normal(m) * b[m:2 * m]).astype(np.float32)      # ordinary quotients
        a[2 * m:3 * m] = (rng.integers(-300, 300, m) * b[2 * m:3 * m]).astype(np.float32)  # integer quotients
    a[3 * m:4 * m] = _random_f32(rng, m) * np.float32(1e-38)  # subnormal dividends
    b[4 * m:5 * m] = _random_f32(rng, m) * np.float32(1e-38)  # subnormal divisors
    a[5 * m:5 * m + 64] = [0.0, -0.0, np.inf, -np.inf, np.nan] * 12 + [0.0] * 4
    b[5 * m + 64:5 * m + 128] = [0.0, -0.0, np.inf, -np.inf, np.nan] * 12 + [0.0] * 4
    p = np.where(rng.random(n) < 0.5, 0, rng.integers(-3, 4, n)).astype(np.int32)
    raw = _run_division(dev, render_string(_CERTIFIED_TEST), "u32", a, b, p, 2 * n, "certified division test")
    out = np.frombuffer(raw, np.uint32).reshape(n, 2)
    q, certified = out[:, 0].view(np.float32), out[:, 1] == 1
    with np.errstate(all="ignore"):
        rn = a / b
    finite = np.isfinite(a) & np.isfinite(b) & (a != 0) & (b != 0)
    exact = q.view(np.uint32) == rn.view(np.uint32)
    wrong = np.nonzero(certified & finite & ~exact)[0]
    assert wrong.size == 0, (a[wrong[:4]], b[wrong[:4]], p[wrong[:4]], q[wrong[:4]], rn[wrong[:4]])
    assert certified[~finite].all()  # special operands: oq_div_rn returns the device's quotient
    # the exact quotients of ordinary operands (divisor in range, normal quotient) are certified
    normal = finite & exact & (np.abs(b) >= 2.0 ** -126) & (np.abs(b) < 2.0 ** 126) \
        & (np.abs(rn) >= 2.0 ** -126) & np.isfinite(rn)
    assert certified[normal].mean() > 0.999, certified[normal].mean()
    below = np.nonzero(finite & ~exact & (p != 0) & (np.abs(q.view(np.uint32) & 0x7FFFFF) == 0))[0]
    assert below.size > 100  # perturbed quotients on powers of two, the true one below or above

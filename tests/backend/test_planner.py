"""Planning: derive, dtype/shape checks, variant selection, buffers, uniforms, bindings,
dispatch and device limits. Pure Python: no GPU needed."""

from __future__ import annotations

import copy
import json
import math
import struct
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from onnx_quant.backend_wgpu.device_info import WEBGPU_DEFAULT_LIMITS, DeviceInfo
from onnx_quant.backend_wgpu.plan import KernelPlan
from onnx_quant.backend_wgpu.planner import (
    default_element_type, describe, pack_uniform, packed_byte_size, plan_node, uniform_layout,
)
from onnx_quant.backend_wgpu.spec import StructMember, load_spec
from onnx_quant.errors import ExecutionError, ExpressionError, SpecError

REPO = Path(__file__).resolve().parents[2]
SPEC_FILE = REPO / "templates" / "dynamic_quantize_linear.kernel.json"
SEED: dict = json.loads(SPEC_FILE.read_text())
SHADERS = sorted({p["shader"] for v in SEED["variants"] for p in v["passes"]})

DEFAULT = DeviceInfo()
LAVAPIPE = DeviceInfo(
    name="llvmpipe (Vulkan)", backend="Vulkan",
    limits=dict(WEBGPU_DEFAULT_LIMITS, maxStorageBufferBindingSize=134217728, maxBufferSize=2147483648,
                maxStorageBuffersPerShaderStage=32, maxComputeInvocationsPerWorkgroup=1024,
                maxComputeWorkgroupSizeX=1024, maxComputeWorkgroupStorageSize=32768,
                maxComputeWorkgroupsPerDimension=65535),
    features=frozenset({"subgroup", "shader-f16", "timestamp-query", "timestamp-query-inside-passes",
                        "shader-float32-atomic", "immediates"}),
)
GL = DeviceInfo(name="llvmpipe (OpenGL)", backend="OpenGL",
                limits=dict(WEBGPU_DEFAULT_LIMITS, maxStorageBuffersPerShaderStage=16))
TINY = DeviceInfo(name="tiny", limits=dict(WEBGPU_DEFAULT_LIMITS, maxComputeInvocationsPerWorkgroup=64))
DEVICES = {"default": DEFAULT, "lavapipe": LAVAPIPE, "gl": GL}


def _write(directory: Path, doc: dict, shaders=SHADERS) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for s in shaders:
        (directory / s).write_text("// dummy\n")
    path = directory / "k.kernel.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def dql(tmp_path_factory):
    return load_spec(_write(tmp_path_factory.mktemp("dql"), SEED))


def plan_dql(spec, shape, device=DEFAULT, **kw):
    shape = tuple(shape)
    kw.setdefault("node_label", "dql0")
    return plan_node(spec, shapes={"x": shape, "y": shape, "y_scale": (), "y_zero_point": ()},
                     dtypes={"x": "float32", "y": "uint8", "y_scale": "float32", "y_zero_point": "uint8"},
                     device=device, **kw)


def expected_variant(count: int, rank: int, device: DeviceInfo, tun: dict | None = None) -> str:
    """The seed spec's intent, written independently of the expression machinery."""
    t = {**dict(WORKGROUP_SIZE=256, ELEMENTS_PER_THREAD=4, GRID_STRIDE_MIN_ELEMENTS=262144,
                MAX_GRID_PARTIALS=256, SERIAL_MAX_ELEMENTS=8192), **(tun or {})}
    lim = {**WEBGPU_DEFAULT_LIMITS, **device.limits}
    wg = t["WORKGROUP_SIZE"]
    full = -(-count // (wg * t["ELEMENTS_PER_THREAD"]))
    grid = min(t["MAX_GRID_PARTIALS"], full)
    storage = min(lim["maxStorageBufferBindingSize"], lim["maxBufferSize"])
    per_dim = min(lim["maxComputeWorkgroupsPerDimension"], 65535)
    device_ok = (wg <= min(lim["maxComputeInvocationsPerWorkgroup"], lim["maxComputeWorkgroupSizeX"])
                 and 8 * wg <= lim["maxComputeWorkgroupStorageSize"])
    full_fits = device_ok and 4 * full <= storage and -(-full // per_dim) <= per_dim
    grid_fits = full_fits and 4 * grid <= storage and grid <= per_dim
    if rank == 0 or count == 0 or count <= t["SERIAL_MAX_ELEMENTS"] or not full_fits:
        return "single_invocation"
    suffix = "_vec4" if count % 4 == 0 else ""
    if count >= t["GRID_STRIDE_MIN_ELEMENTS"] and grid_fits:
        return "grid_stride_reduce" + suffix
    return "parallel_subgroup_reduce" + suffix


# ---------------------------------------------------------------- selection on the seed spec

@pytest.mark.parametrize("device", ["default", "lavapipe", "gl"])
@pytest.mark.parametrize("shape, variant", [
    ((), "single_invocation"),
    ((0,), "single_invocation"),
    ((3, 0, 5), "single_invocation"),
    ((1,), "single_invocation"),
    ((7,), "single_invocation"),
    ((8192,), "single_invocation"),
    ((64, 128), "single_invocation"),
    ((8193,), "parallel_subgroup_reduce"),
    ((8196,), "parallel_subgroup_reduce_vec4"),
    ((3, 3000), "parallel_subgroup_reduce_vec4"),
    ((3, 3001), "parallel_subgroup_reduce"),
    ((262143,), "parallel_subgroup_reduce"),
    ((262140,), "parallel_subgroup_reduce_vec4"),
    ((262144,), "grid_stride_reduce_vec4"),
    ((262145,), "grid_stride_reduce"),
    ((1001, 1001), "grid_stride_reduce"),
    ((1000, 1000), "grid_stride_reduce_vec4"),
    ((33554432,), "grid_stride_reduce_vec4"),
])
def test_seed_selection(dql, device, shape, variant):
    plan = plan_dql(dql, shape, DEVICES[device])
    assert plan.variant == variant
    assert plan.variant == expected_variant(math.prod(shape), len(shape), DEVICES[device])
    assert plan.selection[variant] is None


def test_tiny_device_takes_single_invocation(dql):
    for shape in [(8193,), (100000,), (262144,), (4_000_000,)]:
        plan = plan_dql(dql, shape, TINY)
        assert plan.variant == "single_invocation"
        assert plan.selection["single_invocation"] is None
        assert plan.selection["grid_stride_reduce_vec4"] is not None
        assert plan.selection["parallel_subgroup_reduce"] == "parallelFullFits"
        assert plan.derived["parallelDeviceOk"] is False


def test_small_workgroup_storage_takes_single_invocation(dql):
    dev = DeviceInfo(limits=dict(WEBGPU_DEFAULT_LIMITS, maxComputeWorkgroupStorageSize=1024))
    assert plan_dql(dql, (100000,), dev).variant == "single_invocation"
    # ... unless the workgroup is made small enough for it
    assert plan_dql(dql, (100000,), dev, tunables={"WORKGROUP_SIZE": 128}).variant == "parallel_subgroup_reduce_vec4"


def test_scalars_and_empty_inputs_stay_serial_when_tuned_parallel(dql):
    # SERIAL_MAX_ELEMENTS=0 pushes every non-empty tensor of rank >= 1 to the parallel path;
    # rank-0 and empty inputs must still find single_invocation (the parallel variants exclude them)
    tun = {"SERIAL_MAX_ELEMENTS": 0}
    assert plan_dql(dql, (), tunables=tun).variant == "single_invocation"
    assert plan_dql(dql, (0,), tunables=tun).variant == "single_invocation"
    assert plan_dql(dql, (2, 0), tunables={"SERIAL_MAX_ELEMENTS": -1}).variant == "single_invocation"
    assert plan_dql(dql, (1,), tunables=tun).variant == "parallel_subgroup_reduce"


def test_selection_records_first_failing_clause(dql):
    plan = plan_dql(dql, (10001,))
    assert plan.selection == {
        "single_invocation": "serialFallbackNeeded",
        "parallel_subgroup_reduce_vec4": "inputCount % 4 == 0",
        "parallel_subgroup_reduce": None,
        "grid_stride_reduce_vec4": "inputCount % 4 == 0",
        "grid_stride_reduce": "inputCount >= tunables.GRID_STRIDE_MIN_ELEMENTS",
    }
    assert plan_dql(dql, ()).selection["grid_stride_reduce"] == "baseContract"


def test_tunables_move_the_thresholds(dql):
    assert plan_dql(dql, (10000,), tunables={"GRID_STRIDE_MIN_ELEMENTS": 0}).variant == "grid_stride_reduce_vec4"
    assert plan_dql(dql, (10000,), tunables={"SERIAL_MAX_ELEMENTS": 10000}).variant == "single_invocation"
    assert plan_dql(dql, (100,), tunables={"SERIAL_MAX_ELEMENTS": 0}).variant == "parallel_subgroup_reduce_vec4"


def test_forced_variant(dql):
    plan = plan_dql(dql, (10000,), tunables={"GRID_STRIDE_MIN_ELEMENTS": 0}, variant="grid_stride_reduce_vec4")
    assert plan.variant == "grid_stride_reduce_vec4"
    # a forced variant may rank below the natural choice
    plan = plan_dql(dql, (300000,), variant="parallel_subgroup_reduce")
    assert plan.variant == "parallel_subgroup_reduce"
    with pytest.raises(ExecutionError) as info:
        plan_dql(dql, (10000,), variant="grid_stride_reduce_vec4")
    msg = str(info.value)
    assert "dql0" in msg and "inputCount >= tunables.GRID_STRIDE_MIN_ELEMENTS" in msg
    with pytest.raises(ExecutionError, match="'serialFallbackNeeded'"):
        plan_dql(dql, (10000,), variant="single_invocation")
    with pytest.raises(ExecutionError) as info:
        plan_dql(dql, (10,), variant="fast")
    assert "no variant 'fast'" in str(info.value)
    assert "single_invocation, parallel_subgroup_reduce_vec4" in str(info.value)


# ---------------------------------------------------------------- passes, buffers, bindings

def test_single_invocation_plan(dql):
    plan = plan_dql(dql, (2, 5))
    assert isinstance(plan, KernelPlan)
    assert plan.kernel == "DynamicQuantizeLinear"
    (p,) = plan.passes
    assert (p.id, p.name, p.shader, p.dispatch) == ("main", "DynamicQuantizeLinear", "dynamic-quantize-linear.wgsl.jinja",
                                                   (1, 1, 1))
    b = plan.buffers
    assert (b["x"].role, b["x"].byte_size, b["x"].onnx_type, b["x"].shape) == ("input", 40, "float32", (2, 5))
    assert (b["y"].role, b["y"].byte_size, b["y"].onnx_type) == ("output", 12, "uint8")
    assert b["y_scale"].byte_size == 4 and b["y_zero_point"].byte_size == 4
    assert b["main.params"].role == "uniform" and b["main.params"].byte_size == 16
    assert struct.unpack_from("<I", b["main.params"].data)[0] == 10
    assert [(x.index, x.var_name, x.buffer, x.access, x.element_type, x.length) for x in p.bindings] == [
        (0, "x", "x", "read", "f32", None),
        (1, "y", "y", "read_write", "u32", None),
        (2, "y_scale", "y_scale", "read_write", "f32", 1),
        (3, "y_zero_point", "y_zero_point", "read_write", "u32", 1),
        (4, "params", "main.params", "uniform", "Params", None),
    ]
    assert p.bindings[4].struct == (("count", "u32"),)
    assert list(b) == ["x", "y", "y_scale", "y_zero_point", "main.params"]


def test_empty_input_plan(dql):
    plan = plan_dql(dql, (0, 3))
    assert plan.variant == "single_invocation"
    assert plan.buffers["x"].byte_size == 4 and plan.buffers["y"].byte_size == 4
    assert plan.passes[0].dispatch == (1, 1, 1)
    assert struct.unpack_from("<I", plan.buffers["main.params"].data)[0] == 0


def test_parallel_plan(dql):
    plan = plan_dql(dql, (10000,), LAVAPIPE)
    assert plan.variant == "parallel_subgroup_reduce_vec4"
    reduce_, finalize, quantize = plan.passes
    assert reduce_.dispatch == (10, 1, 1) and finalize.dispatch == (1, 1, 1) and quantize.dispatch == (10, 1, 1)
    b = plan.buffers
    assert (b["partial_min"].role, b["partial_min"].shape, b["partial_min"].byte_size) == ("intermediate", (10,), 40)
    assert b["partial_max"].byte_size == 40
    assert struct.unpack_from("<I", b["reduce.params"].data)[0] == 10000
    assert struct.unpack_from("<I", b["finalize.params"].data)[0] == 10
    assert struct.unpack_from("<I", b["quantize.params"].data)[0] == 10000
    assert [(x.var_name, x.buffer, x.access, x.element_type) for x in reduce_.bindings] == [
        ("x", "x", "read", "vec4<f32>"), ("partial_min", "partial_min", "read_write", "f32"),
        ("partial_max", "partial_max", "read_write", "f32"), ("params", "reduce.params", "uniform", "Params")]
    assert [(x.var_name, x.access) for x in finalize.bindings] == [
        ("partial_min", "read"), ("partial_max", "read"), ("y_scale", "read_write"),
        ("y_zero_point", "read_write"), ("params", "uniform")]
    assert finalize.bindings[4].struct == (("numPartials", "u32"),)
    assert [(x.var_name, x.access, x.element_type) for x in quantize.bindings] == [
        ("x", "read", "vec4<f32>"), ("y_scale", "read", "f32"), ("y_zero_point", "read", "u32"),
        ("y", "read_write", "u32"), ("params", "uniform", "Params")]
    assert plan_dql(dql, (10001,)).passes[0].bindings[0].element_type == "f32"


def test_grid_stride_plan(dql):
    plan = plan_dql(dql, (1_000_000,))
    assert plan.variant == "grid_stride_reduce_vec4"
    assert [p.dispatch for p in plan.passes] == [(256, 1, 1), (1, 1, 1), (977, 1, 1)]
    assert plan.buffers["partial_min"].shape == (256,)
    assert struct.unpack_from("<I", plan.buffers["finalize.params"].data)[0] == 256
    plan = plan_dql(dql, (1_000_001,))
    assert plan.variant == "grid_stride_reduce"
    assert plan.passes[2].dispatch == (977, 1, 1)


def test_two_dimensional_dispatch(dql):
    # grid-stride quantize over more than 65535 workgroups
    n = 4 * 64 * 65535 + 4 * 64 * 10
    plan = plan_dql(dql, (n,), tunables={"WORKGROUP_SIZE": 64})
    assert plan.variant == "grid_stride_reduce_vec4"
    assert plan.passes[2].dispatch == (65535, 2, 1)
    # parallel reduce over more than 65535 partials
    n = 64 * 65535 + 64 * 3 + 1
    plan = plan_dql(dql, (n,), LAVAPIPE, tunables={"WORKGROUP_SIZE": 64, "ELEMENTS_PER_THREAD": 1,
                                                   "GRID_STRIDE_MIN_ELEMENTS": 10**12})
    assert plan.variant == "parallel_subgroup_reduce"
    assert plan.derived["fullPartials"] == 65539
    assert plan.passes[0].dispatch == (65535, 2, 1)
    assert plan.buffers["partial_min"].byte_size == 4 * 65539
    # a device with big buffers and the default tunables
    big = DeviceInfo(limits=dict(WEBGPU_DEFAULT_LIMITS, maxStorageBufferBindingSize=2**31, maxBufferSize=2**32))
    plan = plan_dql(dql, (70_000_000,), big)
    assert plan.variant == "grid_stride_reduce_vec4"
    assert plan.passes[2].dispatch == (65535, 2, 1)


def test_storage_buffer_over_device_limit(dql):
    with pytest.raises(ExecutionError) as info:
        plan_dql(dql, (40_000_000,))
    msg = str(info.value)
    assert "dql0" in msg and "'x'" in msg and "160000000 bytes" in msg and "134217728" in msg
    # the same input fits a device with bigger limits
    big = DeviceInfo(limits=dict(WEBGPU_DEFAULT_LIMITS, maxStorageBufferBindingSize=2**31, maxBufferSize=2**32))
    assert plan_dql(dql, (40_000_000,), big).variant == "grid_stride_reduce_vec4"
    # maxBufferSize binds too
    small = DeviceInfo(limits=dict(WEBGPU_DEFAULT_LIMITS, maxBufferSize=1000))
    with pytest.raises(ExecutionError, match="'x'.*1000 bytes"):
        plan_dql(dql, (300,), small)


def test_too_many_storage_buffers(dql):
    dev = DeviceInfo(limits=dict(WEBGPU_DEFAULT_LIMITS, maxStorageBuffersPerShaderStage=3))
    with pytest.raises(ExecutionError, match="pass main: binds 4 storage buffers.*maxStorageBuffersPerShaderStage = 3"):
        plan_dql(dql, (5,), dev)


def test_context_contract(dql):
    plan = plan_dql(dql, (300001,), LAVAPIPE, tunables={"MAX_GRID_PARTIALS": 128})
    reduce_, finalize, quantize = plan.passes
    ctx = reduce_.context
    fixed = {"kernel", "variant", "pass_id", "tunables", "bindings", "binding", "features", "workgroup_size",
             "attrs", "dtypes", "present", "values", "loop_checks"}
    derived_names = set(dql.derive.names) | {"workgroupSize", "elemsPerThread", "vec4", "inputElement",
                                              "useSubgroups", "gridStride"}
    assert set(ctx) == fixed | derived_names
    assert (ctx["kernel"], ctx["variant"], ctx["pass_id"]) == ("DynamicQuantizeLinear", "grid_stride_reduce", "reduce")
    assert ctx["tunables"]["MAX_GRID_PARTIALS"] == 128 and ctx["tunables"]["WORKGROUP_SIZE"] == 256
    assert ctx["workgroup_size"] == 256 and ctx["workgroupSize"] == 256
    assert ctx["gridStride"] is True and ctx["vec4"] is False and ctx["inputElement"] == "f32"
    assert ctx["useSubgroups"] is True
    assert ctx["features"] == sorted(LAVAPIPE.features)
    assert ctx["gridPartials"] == 128 and ctx["inputCount"] == 300001
    assert ctx["bindings"] == [
        {"index": 0, "var_name": "x", "access": "read", "element_type": "f32", "length": None, "struct": None},
        {"index": 1, "var_name": "partial_min", "access": "read_write", "element_type": "f32", "length": None,
         "struct": None},
        {"index": 2, "var_name": "partial_max", "access": "read_write", "element_type": "f32", "length": None,
         "struct": None},
        {"index": 3, "var_name": "params", "access": "uniform", "element_type": "Params", "length": None,
         "struct": [["count", "u32"]]},
    ]
    assert ctx["binding"]["params"] is ctx["bindings"][3]
    assert finalize.context["fromPartials"] is True and "gridStride" not in finalize.context
    assert "fromPartials" not in quantize.context
    assert plan_dql(dql, (300000,)).passes[0].context["useSubgroups"] is False
    single = plan_dql(dql, (4,)).passes[0].context
    assert single["workgroup_size"] == 1 and single["fromPartials"] is False
    # KernelPlan.derived: top-level and variant values, not pass values
    assert set(plan.derived) == set(dql.derive.names) | {"workgroupSize", "elemsPerThread", "vec4", "inputElement",
                                                         "useSubgroups"}


def test_describe(dql):
    plan = plan_dql(dql, (300000,))
    d = describe(plan)
    json.dumps(d)
    assert d["kernel"] == "DynamicQuantizeLinear" and d["variant"] == "grid_stride_reduce_vec4"
    assert d["node"] == "dql0"
    assert d["passes"] == [
        {"id": "reduce", "name": "DynamicQuantizeLinear.ReduceMinMax", "dispatch": [256, 1, 1]},
        {"id": "finalize", "name": "DynamicQuantizeLinear.Finalize", "dispatch": [1, 1, 1]},
        {"id": "quantize", "name": "DynamicQuantizeLinear.Quantize", "dispatch": [293, 1, 1]},
    ]
    assert d["selection"]["grid_stride_reduce"] == "inputCount % 4 != 0"
    # the deciding values: the chosen variant's clauses, the guard that failed, and their inputs
    for name in ("baseContract", "inputCount", "parallelGridFits", "serialFallbackNeeded", "gridPartials"):
        assert name in d["derived"], name
    assert d["derived"]["serialFallbackNeeded"] is False and d["derived"]["inputCount"] == 300000
    assert "serialContract" not in d["derived"]   # read by no deciding clause
    assert d["when"][0] == "baseContract"
    single = describe(plan_dql(dql, (3,)))
    assert single["derived"]["serialFallbackNeeded"] is True and "gridScratchFits" not in single["derived"]
    # a plain KernelPlan (not from plan_node) describes all its derived values
    plain = KernelPlan("K", "v", {"a": (1, 2)}, {}, ())
    assert describe(plain)["derived"] == {"a": [1, 2]}


# ---------------------------------------------------------------- node-level checks

def test_dtype_checks_name_the_node(dql):
    shapes = {"x": (4,), "y": (4,), "y_scale": (), "y_zero_point": ()}
    ok = {"x": "float32", "y": "uint8", "y_scale": "float32", "y_zero_point": "uint8"}
    with pytest.raises(ExecutionError, match="node 'n7'.*'x' has type float16, but T allows only float32"):
        plan_node(dql, shapes=shapes, dtypes={**ok, "x": "float16"}, device=DEFAULT, node_label="n7")
    with pytest.raises(ExecutionError, match="'y_zero_point' has type int8"):
        plan_node(dql, shapes=shapes, dtypes={**ok, "y_zero_point": "int8"}, device=DEFAULT, node_label="n7")
    with pytest.raises(ExecutionError, match="no dtype given for 'y'"):
        plan_node(dql, shapes=shapes, dtypes={k: v for k, v in ok.items() if k != "y"}, device=DEFAULT)
    with pytest.raises(ExecutionError, match="unknown element type"):
        plan_node(dql, shapes=shapes, dtypes={**ok, "x": "float33"}, device=DEFAULT)
    # TensorProto names and codes are accepted too
    plan = plan_node(dql, shapes=shapes, dtypes={**ok, "x": "FLOAT", "y": 2}, device=DEFAULT)
    assert plan.buffers["x"].onnx_type == "float32" and plan.buffers["y"].onnx_type == "uint8"


def test_shape_checks(dql):
    ok = {"x": (4,), "y": (4,), "y_scale": (), "y_zero_point": ()}
    dt = {"x": "float32", "y": "uint8", "y_scale": "float32", "y_zero_point": "uint8"}
    with pytest.raises(ExecutionError, match="no shape given for 'y_scale'"):
        plan_node(dql, shapes={k: v for k, v in ok.items() if k != "y_scale"}, dtypes=dt, device=DEFAULT)
    with pytest.raises(ExecutionError, match="'y' must have shape \\(4,\\), found \\(5,\\)"):
        plan_node(dql, shapes={**ok, "y": (5,)}, dtypes=dt, device=DEFAULT)
    with pytest.raises(ExecutionError, match="'y' must have rank 1, found shape \\(2, 2\\)"):
        plan_node(dql, shapes={**ok, "y": (2, 2)}, dtypes=dt, device=DEFAULT)
    with pytest.raises(ExecutionError, match="'y_scale' must have rank 0"):
        plan_node(dql, shapes={**ok, "y_scale": (1,)}, dtypes=dt, device=DEFAULT)
    with pytest.raises(ExecutionError, match="concrete"):
        plan_node(dql, shapes={**ok, "x": ("N",), "y": ("N",)}, dtypes=dt, device=DEFAULT)
    with pytest.raises(ExecutionError, match="concrete"):
        plan_node(dql, shapes={**ok, "x": (-1,)}, dtypes=dt, device=DEFAULT)


def test_tunable_checks(dql):
    with pytest.raises(ExecutionError, match="unknown tunable 'WG'.*WORKGROUP_SIZE"):
        plan_dql(dql, (4,), tunables={"WG": 1})
    with pytest.raises(ExecutionError, match="must be an int"):
        plan_dql(dql, (4,), tunables={"WORKGROUP_SIZE": True})


# ---------------------------------------------------------------- synthetic specs

def kernel(variants, *, derive=None, tunables=None, bindings=None, types=("float32",)) -> dict:
    return {
        "name": "Copy", "sinceVersion": 1,
        "inputs": {"a": {"dtype": "T"}},
        "outputs": {"b": {"dtype": "T", "shape": "shapes.a"}},
        "typeConstraints": {"T": list(types)},
        "tunables": tunables or {"WG": {"default": 64}},
        "derive": {"n": "numel(shapes.a)", **(derive or {})},
        "bindings": bindings or {},
        "variants": variants,
    }


def one_pass(vid="v", *, priority=None, when=None, dispatch=None, binds=None, derive=None, inter=None):
    v = {"id": vid, "passes": [{"id": "p", "shader": "k.wgsl.jinja", "bindings": binds or ["a", "b"],
                                "dispatch": dispatch or {"x": 1}}]}
    if priority is not None:
        v["priority"] = priority
    if when is not None:
        v["when"] = when
    if derive is not None:
        v["derive"] = derive
    if inter is not None:
        v["intermediates"] = inter
    return v


def load_kernel(tmp_path, doc):
    return load_spec(_write(tmp_path, doc, ["k.wgsl.jinja"]))


def plan_copy(spec, shape, dtype="float32", device=DEFAULT, **kw):
    return plan_node(spec, shapes={"a": tuple(shape), "b": tuple(shape)}, dtypes={"a": dtype, "b": dtype},
                     device=device, node_label=kw.pop("node_label", "c1"), **kw)


def test_selection_rule_guards_then_priority_then_file_order(tmp_path):
    spec = load_kernel(tmp_path, kernel([
        one_pass("low", priority=1),
        one_pass("hi_a", priority=5, when=["n > 2"]),
        one_pass("guard", when=["n > 10"]),
        one_pass("hi_b", priority=5),
        one_pass("guard2", when=["n > 20"]),
        one_pass("never", priority=100, when=["n > 2", "false"]),
    ]))
    assert plan_copy(spec, (1,)).variant == "hi_b"       # hi_a's when fails; hi_b ties and is next
    assert plan_copy(spec, (3,)).variant == "hi_a"       # ties keep file order
    assert plan_copy(spec, (11,)).variant == "guard"     # an unprioritized variant ranks above priorities
    assert plan_copy(spec, (21,)).variant == "guard"     # guards among themselves: file order
    sel = plan_copy(spec, (21,)).selection
    assert sel == {"low": None, "hi_a": None, "guard": None, "hi_b": None, "guard2": None, "never": "false"}


def test_no_variant_applies(tmp_path):
    spec = load_kernel(tmp_path, kernel([one_pass("a", when=["n > 5"]), one_pass("b", priority=1, when=["n > 9"])]))
    with pytest.raises(ExecutionError) as info:
        plan_copy(spec, (2,))
    msg = str(info.value)
    assert "node 'c1'" in msg and "no variant applies" in msg and "a: 'n > 5'" in msg and "b: 'n > 9'" in msg


def test_when_must_be_bool(tmp_path):
    spec = load_kernel(tmp_path, kernel([one_pass("a", when=["n"])]))
    with pytest.raises(ExpressionError, match="must be a bool, found int"):
        plan_copy(spec, (2,))


def test_expression_errors_at_plan_time_carry_context(tmp_path):
    spec = load_kernel(tmp_path, kernel([one_pass()], derive={"k": "100 // (n - 4)"}))
    assert plan_copy(spec, (5,)).derived["k"] == 100
    with pytest.raises(ExpressionError) as info:
        plan_copy(spec, (4,))
    msg = str(info.value)
    assert "node 'c1'" in msg and "derive.k" in msg and "division by zero" in msg and "100 // (n - 4)" in msg


def test_when_guards_the_variant_derive(tmp_path):
    # the variant derive is evaluated only for the chosen variant, so its when can guard it
    spec = load_kernel(tmp_path, kernel([
        one_pass("scalar", when=["ranks.a == 0"]),
        one_pass("last_dim", priority=1, derive={"inner": "shapes.a[-1]"}, dispatch={"x": "inner"}),
    ]))
    assert plan_copy(spec, ()).variant == "scalar"
    assert plan_copy(spec, (3, 7)).passes[0].dispatch == (7, 1, 1)


def test_zero_dispatch_drops_the_pass(tmp_path):
    v = one_pass(dispatch={"x": "ceilDiv(n, 64)"}, binds=["a", "b", {"name": "params", "struct": [
        {"name": "count", "type": "u32", "value": "n"}]}])
    v["passes"].append({"id": "q", "shader": "k.wgsl.jinja", "bindings": ["b"], "dispatch": {"x": 1, "y": 1}})
    spec = load_kernel(tmp_path, kernel([v]))
    plan = plan_copy(spec, (0, 4))
    assert [p.id for p in plan.passes] == ["q"]
    assert "p.params" not in plan.buffers
    plan = plan_copy(spec, (65,))
    assert [(p.id, p.dispatch) for p in plan.passes] == [("p", (2, 1, 1)), ("q", (1, 1, 1))]
    assert "p.params" in plan.buffers


def test_dispatch_over_device_limit(tmp_path):
    spec = load_kernel(tmp_path, kernel([one_pass("flat", dispatch={"x": 1, "y": "n"})]))
    assert plan_copy(spec, (65535,)).passes[0].dispatch == (1, 65535, 1)
    with pytest.raises(ExecutionError) as info:
        plan_copy(spec, (65536,))
    msg = str(info.value)
    for part in ("node 'c1'", "kernel Copy", "variant flat", "pass p", "dispatch.y = 65536",
                 "maxComputeWorkgroupsPerDimension = 65535"):
        assert part in msg, part


def test_dispatch_must_be_an_int(tmp_path):
    spec = load_kernel(tmp_path, kernel([one_pass(dispatch={"x": "n > 1"})]))
    with pytest.raises(ExpressionError, match="dispatch.x must be an int, found bool"):
        plan_copy(spec, (3,))
    spec = load_kernel(tmp_path / "b", kernel([one_pass(dispatch={"x": "1 - n"})]))
    with pytest.raises(ExpressionError, match="negative"):
        plan_copy(spec, (3,))


def test_packed_buffer_sizes(tmp_path):
    spec = load_kernel(tmp_path, kernel([one_pass()], types=("float32", "uint8", "int4", "int64", "float16", "int2")))
    cases = {("float32", (3,)): 12, ("uint8", (9,)): 12, ("int4", (9,)): 8, ("int4", (8,)): 4,
             ("int2", (17,)): 8, ("int64", (3,)): 24, ("float16", (3,)): 8, ("uint8", (0,)): 4,
             ("float32", ()): 4, ("int4", ()): 4}
    for (dt, shape), size in cases.items():
        plan = plan_copy(spec, shape, dt)
        assert plan.buffers["a"].byte_size == size, (dt, shape)
        assert plan.buffers["b"].byte_size == size
        assert plan.buffers["b"].onnx_type == dt
        assert plan.passes[0].bindings[0].element_type == default_element_type(dt)
    assert packed_byte_size("uint4", 7) == 4 and packed_byte_size("bool", 5) == 8
    assert [default_element_type(t) for t in ("float32", "int32", "uint32", "uint8", "float16", "int64")] == [
        "f32", "i32", "u32", "u32", "u32", "vec2<u32>"]


def test_type_constraint_binds_one_type(tmp_path):
    spec = load_kernel(tmp_path, kernel([one_pass()], types=("float32", "float16")))
    with pytest.raises(ExecutionError, match="'b' has type float16 but 'a' has float32; both are T"):
        plan_node(spec, shapes={"a": (2,), "b": (2,)}, dtypes={"a": "float32", "b": "float16"}, device=DEFAULT)


def test_intermediate_typed_by_constraint(tmp_path):
    spec = load_kernel(tmp_path, kernel([one_pass(
        inter=[{"id": "tmp", "dtype": "T", "shape": "[n, 2]"}, {"id": "w", "dtype": "uint4", "shape": [3]}],
        binds=["a", "tmp", "w", "b"])], types=("float32", "float16")))
    plan = plan_copy(spec, (5,), "float16")
    assert (plan.buffers["tmp"].onnx_type, plan.buffers["tmp"].shape, plan.buffers["tmp"].byte_size) == (
        "float16", (5, 2), 20)
    assert (plan.buffers["w"].onnx_type, plan.buffers["w"].byte_size) == ("uint4", 4)
    assert [b.access for b in plan.passes[0].bindings] == ["read", "read_write", "read_write", "read_write"]


def test_intermediate_shape_must_be_ints(tmp_path):
    spec = load_kernel(tmp_path, kernel([one_pass(inter=[{"id": "t", "dtype": "float32", "shape": "[n > 1]"}])]))
    with pytest.raises(ExpressionError, match="non-negative ints"):
        plan_copy(spec, (3,))


def test_dollar_element_type(tmp_path):
    doc = kernel([one_pass(derive={"et": '"vec2<f32>" if n % 2 == 0 else "f32"'}, binds=["xa", "b"])],
                 bindings={"xa": {"name": "a", "elementType": "$et"}})
    spec = load_kernel(tmp_path, doc)
    assert plan_copy(spec, (4,)).passes[0].bindings[0].element_type == "vec2<f32>"
    assert plan_copy(spec, (3,)).passes[0].bindings[0].element_type == "f32"
    doc["variants"][0]["derive"]["et"] = "n"
    spec = load_kernel(tmp_path / "b", doc)
    with pytest.raises(SpecError, match="evaluated to 4 \\(int\\)"):
        plan_copy(spec, (4,))
    doc["variants"][0]["derive"]["et"] = '"float"'
    spec = load_kernel(tmp_path / "c", doc)
    with pytest.raises(SpecError, match="not a WGSL element type"):
        plan_copy(spec, (4,))


def test_vector_element_type_must_tile_the_buffer(tmp_path):
    spec = load_kernel(tmp_path, kernel([one_pass(binds=[{"arg": "a", "elementType": "vec4<f32>"}, "b"])]))
    assert plan_copy(spec, (8,)).passes[0].bindings[0].element_type == "vec4<f32>"
    with pytest.raises(ExecutionError, match="not a whole number of vec4<f32>"):
        plan_copy(spec, (10,))


def test_binding_length(tmp_path):
    spec = load_kernel(tmp_path, kernel([one_pass(binds=[{"arg": "a", "length": "n"}, {"arg": "b", "length": 2}])]))
    plan = plan_copy(spec, (2,))
    assert [b.length for b in plan.passes[0].bindings] == [2, 2]
    with pytest.raises(ExecutionError, match="declares 2 x f32 \\(8 bytes\\) but tensor 'b' has 4 bytes"):
        plan_copy(spec, (1,))


def test_workgroup_size_over_device_limit(tmp_path):
    spec = load_kernel(tmp_path, kernel([one_pass(derive={"workgroupSize": "tunables.WG"})]))
    assert plan_copy(spec, (1,), tunables={"WG": 256}).passes[0].context["workgroup_size"] == 256
    with pytest.raises(ExecutionError, match="workgroupSize 512 exceeds"):
        plan_copy(spec, (1,), tunables={"WG": 512})
    assert plan_copy(spec, (1,), device=LAVAPIPE, tunables={"WG": 512}).passes[0].context["workgroup_size"] == 512


def test_uniform_values_and_range(tmp_path):
    spec = load_kernel(tmp_path, kernel([one_pass(binds=["a", "b", {"name": "u", "struct": [
        {"name": "flag", "type": "u32", "value": "n > 2"},
        {"name": "off", "type": "i32", "value": "0 - n"},
        {"name": "scale", "type": "f32", "value": 0.5},
        {"name": "dims", "type": "vec4<u32>", "value": "[n, 1, 2, 3]"},
        {"name": "big", "type": "u32", "value": "n * 1000000000"}]}])]))
    plan = plan_copy(spec, (3,))
    data = plan.buffers["p.u"].data
    assert plan.buffers["p.u"].byte_size == len(data) == 48
    assert struct.unpack_from("<Iif", data, 0) == (1, -3, 0.5)
    assert struct.unpack_from("<4I", data, 16) == (3, 1, 2, 3)
    assert struct.unpack_from("<I", data, 32) == (3_000_000_000,)
    assert plan.passes[0].bindings[2].element_type == "U"
    with pytest.raises(ExecutionError, match="member 'big': 5000000000 does not fit in u32"):
        plan_copy(spec, (5,))


# ---------------------------------------------------------------- uniform layout

@pytest.mark.parametrize("members, offsets, struct_size, size", [
    ([("count", "u32")], [0], 4, 16),
    ([("a", "u32"), ("b", "f32"), ("c", "i32"), ("d", "u32")], [0, 4, 8, 12], 16, 16),
    ([("a", "u32"), ("b", "f32"), ("c", "i32"), ("d", "u32"), ("e", "u32")], [0, 4, 8, 12, 16], 20, 32),
    ([("a", "u32"), ("v", "vec4<f32>")], [0, 16], 32, 32),
    ([("a", "f32"), ("v", "vec3<f32>"), ("b", "f32")], [0, 16, 28], 32, 32),
    ([("a", "u32"), ("v", "vec2<u32>"), ("b", "u32")], [0, 8, 16], 24, 32),
    ([("h", "f16"), ("g", "f16"), ("i", "u32")], [0, 2, 4], 8, 16),
    ([("h", "f16"), ("v", "vec3h")], [0, 8], 16, 16),
    ([("v", "vec3<f32>"), ("a", "u32")], [0, 12], 16, 16),
])
def test_uniform_layout(members, offsets, struct_size, size):
    layout = uniform_layout(members)
    assert [f.offset for f in layout.fields] == offsets
    assert layout.struct_size == struct_size and layout.size == size
    assert layout.size % 16 == 0
    assert uniform_layout([StructMember(n, t, 0) for n, t in members]) == layout


def test_pack_uniform():
    layout = uniform_layout([("a", "u32"), ("b", "f32"), ("v", "vec2<i32>"), ("h", "f16")])
    data = pack_uniform(layout, {"a": True, "b": 1, "v": (-1, 2), "h": 0.5})
    assert len(data) == layout.size == 32
    assert struct.unpack_from("<Ifii", data) == (1, 1.0, -1, 2)
    assert struct.unpack_from("<e", data, 16) == (0.5,)
    assert data[18:] == bytes(14)
    for bad, match in [({"a": -1}, "does not fit in u32"), ({"a": 1.5}, "needs an int"),
                       ({"b": "x"}, "needs a number"), ({"v": (1,)}, "list of 2"), ({"b": 1e300}, "out of range"),
                       ({"v": (2**31, 0)}, "does not fit in i32")]:
        values = {"a": 0, "b": 0.0, "v": (0, 0), "h": 0.0, **bad}
        with pytest.raises(ValueError, match=match):
            pack_uniform(layout, values)
    with pytest.raises(ValueError, match="no value"):
        pack_uniform(layout, {"a": 0})


# ---------------------------------------------------------------- properties

@given(
    dims=st.lists(st.integers(0, 400), min_size=0, max_size=3).filter(lambda d: math.prod(d) <= 33_554_432),
    device=st.sampled_from(["default", "lavapipe", "gl", "tiny"]),
    tun=st.fixed_dictionaries({}, optional={
        "WORKGROUP_SIZE": st.sampled_from([32, 64, 128, 256, 512]),
        "GRID_STRIDE_MIN_ELEMENTS": st.integers(0, 300000),
        "SERIAL_MAX_ELEMENTS": st.integers(0, 20000),
        "MAX_GRID_PARTIALS": st.integers(1, 1024),
    }),
)
def test_seed_plans_follow_the_rule_and_fit_the_device(dql, dims, device, tun):
    dev = {**DEVICES, "tiny": TINY}[device]
    shape = tuple(dims)
    count = math.prod(shape)
    plan = plan_dql(dql, shape, dev, tunables=tun)
    assert plan.variant == expected_variant(count, len(shape), dev, tun)
    lim = {**WEBGPU_DEFAULT_LIMITS, **dev.limits}
    for p in plan.passes:
        assert all(1 <= d <= lim["maxComputeWorkgroupsPerDimension"] for d in p.dispatch)
        assert [b.index for b in p.bindings] == list(range(len(p.bindings)))
        assert len({b.buffer for b in p.bindings}) == len(p.bindings)
        for b in p.bindings:
            assert b.buffer in plan.buffers
        if "count" in dict(p.bindings[-1].struct or ()):
            assert struct.unpack_from("<I", plan.buffers[f"{p.id}.params"].data)[0] == count
    if plan.variant != "single_invocation":
        wg = plan.passes[0].context["workgroup_size"]
        ept = 4 if plan.variant.endswith("vec4") else plan.derived["elemsPerThread"]
        reduce_, _, quantize = plan.passes
        x, y, _ = quantize.dispatch
        assert x * y * wg * ept >= count > (x * y - x) * wg * ept  # covers every element, at most one spare row
        partials = plan.buffers["partial_min"].shape[0]
        if plan.variant.startswith("grid"):
            assert reduce_.dispatch == (partials, 1, 1) and partials <= plan.derived["gridPartials"]
        else:
            assert reduce_.dispatch[0] * reduce_.dispatch[1] >= partials == plan.derived["fullPartials"]
    for b in plan.buffers.values():
        assert b.byte_size % 4 == 0 and b.byte_size >= 4
        if b.role == "uniform":
            assert b.byte_size % 16 == 0 and len(b.data) == b.byte_size


# ---------------------------------------------------------------- spec format v2: attributes, optional inputs

V2_DOC = {
    "name": "Q", "sinceVersion": 1,
    "attributes": {"axis": {"default": 1}, "block_size": {"default": 0}, "mode": {"default": "a"},
                   "req": {"required": True}},
    "inputs": {"x": {"dtype": "T1"}, "scale": {"dtype": "T1"},
               "zp": {"dtype": "T2", "optional": True, "rank": 5}},
    "outputs": {"y": {"dtype": "T2"}},
    "typeConstraints": {"T1": ["float32", "float16"], "T2": ["uint8", "int8", "int4"], "T3": ["int16"]},
    "derive": {
        "axisN": "attrs.axis if attrs.axis >= 0 else attrs.axis + ranks.x",
        "hasZp": "present.zp",
        "zpRank": "ranks.zp",
        "zpShape": "shapes.zp",
        "perWord": "32 // bits(dtypes.y)",
        "zpType": "dtypes.zp",
        "req2": "attrs.req[1]",
    },
    "variants": [{"id": "main", "passes": [{"id": "p", "shader": "s.wgsl.jinja",
                                             "bindings": ["x", "scale", "zp", "y"], "dispatch": {"x": 1}}]}],
}


@pytest.fixture(scope="module")
def v2(tmp_path_factory):
    return load_spec(_write(tmp_path_factory.mktemp("v2"), V2_DOC, shaders=["s.wgsl.jinja"]))


def plan_v2(spec, *, zp=None, attributes=None, y="uint8", **kw):
    shapes = {"x": (2, 3), "scale": (), "y": (2, 3)}
    dtypes = {"x": "float32", "scale": "float32", "y": y}
    if zp is not None:
        shapes["zp"], dtypes["zp"] = zp
    attributes = {"req": [1, 2]} if attributes is None else attributes
    return plan_node(spec, shapes=shapes, dtypes=dtypes, device=DEFAULT, node_label="q0",
                     attributes=attributes, **kw)


def test_v2_absent_optional_input(v2):
    plan = plan_v2(v2, y="int4")
    assert plan.derived["hasZp"] is False and plan.derived["zpRank"] == 0 and plan.derived["zpShape"] == ()
    # the absent input takes the type its constraint is bound to (by y)
    assert plan.derived["zpType"] == "int4" and plan.derived["perWord"] == 8
    b = plan.buffers["zp"]
    assert (b.role, b.byte_size, b.onnx_type, b.shape) == ("absent", 4, "int4", ())
    (p,) = plan.passes
    assert [x.buffer for x in p.bindings] == ["x", "scale", "zp", "y"]
    assert p.bindings[2].access == "read" and p.bindings[2].element_type == "u32"
    ctx = p.context
    assert ctx["present"] == {"x": True, "scale": True, "zp": False, "y": True}
    assert ctx["dtypes"] == {"x": "float32", "scale": "float32", "zp": "int4", "y": "int4"}
    assert ctx["attrs"] == {"axis": 1, "block_size": 0, "mode": "a", "req": (1, 2)}
    assert plan.attrs["req"] == (1, 2)


def test_v2_absent_input_unbound_constraint_takes_first_type(tmp_path):
    doc = copy.deepcopy(V2_DOC)
    doc["inputs"]["zp"]["dtype"] = "T3"
    spec = load_spec(_write(tmp_path, doc, shaders=["s.wgsl.jinja"]))
    plan = plan_v2(spec)
    assert plan.buffers["zp"].onnx_type == "int16" and plan.derived["zpType"] == "int16"


def test_v2_absent_optional_output(tmp_path):
    doc = copy.deepcopy(V2_DOC)
    doc["outputs"]["stats"] = {"dtype": "T1", "optional": True}
    doc["derive"]["hasStats"] = "present.stats"
    doc["variants"][0]["passes"][0]["bindings"].append("stats")
    spec = load_spec(_write(tmp_path, doc, shaders=["s.wgsl.jinja"]))
    plan = plan_v2(spec)  # the node leaves stats out: no shape given
    assert plan.derived["hasStats"] is False
    b = plan.buffers["stats"]
    assert (b.role, b.byte_size, b.onnx_type, b.shape) == ("absent", 4, "float32", ())
    (p,) = plan.passes
    assert p.bindings[-1].buffer == "stats" and p.bindings[-1].access == "read_write"
    assert p.context["present"]["stats"] is False
    shapes = {"x": (2, 3), "scale": (), "y": (2, 3), "stats": (2, 1)}
    dtypes = {"x": "float32", "scale": "float32", "y": "uint8", "stats": "float32"}
    plan = plan_node(spec, shapes=shapes, dtypes=dtypes, device=DEFAULT, attributes={"req": [1, 2]})
    assert plan.derived["hasStats"] is True and plan.buffers["stats"].role == "output"
    assert plan.buffers["stats"].shape == (2, 1)


def test_v2_present_optional_input(v2):
    plan = plan_v2(v2, zp=((1, 1, 1, 1, 1), "uint8"))
    assert plan.derived["hasZp"] is True and plan.derived["zpRank"] == 5
    assert plan.buffers["zp"].role == "input" and plan.buffers["zp"].shape == (1, 1, 1, 1, 1)
    assert plan.passes[0].context["present"]["zp"] is True
    # declared rank still checked when present
    with pytest.raises(ExecutionError, match="'zp' must have rank 5"):
        plan_v2(v2, zp=((1,), "uint8"))
    # and the constraint still binds
    with pytest.raises(ExecutionError, match="'y' has type uint8 but 'zp' has int8"):
        plan_v2(v2, zp=((1, 1, 1, 1, 1), "int8"))


def test_v2_attributes_override_defaults(v2):
    plan = plan_v2(v2, attributes={"axis": -1, "mode": b"DCR", "req": (3, 4), "block_size": 32})
    assert plan.derived["axisN"] == 1 and plan.derived["req2"] == 4
    assert plan.attrs == {"axis": -1, "block_size": 32, "mode": "DCR", "req": (3, 4)}


def test_v2_undeclared_attribute_names_node_kernel_attribute(v2):
    with pytest.raises(ExecutionError) as info:
        plan_v2(v2, attributes={"req": [1, 2], "saturate": 1})
    msg = str(info.value)
    assert "node 'q0'" in msg and "kernel Q" in msg and "'saturate'" in msg


def test_v2_required_attribute_missing(v2):
    with pytest.raises(ExecutionError, match="node 'q0': kernel Q: required attribute 'req' not given"):
        plan_v2(v2, attributes={})


def test_v2_unsupported_attribute_value(v2):
    with pytest.raises(ExecutionError, match="attribute 'req'.*not supported"):
        plan_v2(v2, attributes={"req": object()})


def test_v2_required_input_still_required(v2):
    with pytest.raises(ExecutionError, match="no shape given for 'scale'"):
        plan_node(v2, shapes={"x": (1,), "y": (1,)}, dtypes={"x": "float32", "scale": "float32", "y": "uint8"},
                  device=DEFAULT, attributes={"req": [1, 2]})


def test_v2_numpy_attribute_values(v2):
    import numpy as np

    plan = plan_v2(v2, attributes={"axis": np.int64(0), "req": [np.int64(5), np.int64(6)]})
    assert plan.attrs["axis"] == 0 and type(plan.attrs["axis"]) is int and plan.attrs["req"] == (5, 6)

"""``graph_plan.compile`` without a device: the zoo's and the exported models, rewritten by the
construction phases, compiled for their run shapes with the device's facts given as a plain dict
(WebGPU's default limits, no features) while wgpu cannot be imported and no GpuDevice can be
made. The plan is frozen data; per-plan state (a host step's output types) lives in the plan;
the host-fallback decisions come back as data, never as a warning."""

from __future__ import annotations

import dataclasses
import logging
import sys
import warnings

import numpy as np
import pytest
from onnx import TensorProto as TP, helper

from onnx_quant import exported_models as em
from onnx_quant import model_zoo
from onnx_quant.backend_wgpu import device as device_module
from onnx_quant.backend_wgpu import graph_plan as gp
from onnx_quant.backend_wgpu.device_info import WEBGPU_DEFAULT_LIMITS
from onnx_quant.backend_wgpu.model_check import static_values
from onnx_quant.backend_wgpu.plan import GraphPlan, HostStep, Segment
from onnx_quant.backend_wgpu.rewrites import rewrite_model
from onnx_quant.backend_wgpu.spec import load_specs
from onnx_quant.budget import resolve as resolve_budget
from onnx_quant.model_io import initializer_arrays

SPECS = load_specs()
#: the device as the compiler sees it: plain data
FACTS = {"name": "webgpu defaults", "limits": dict(WEBGPU_DEFAULT_LIMITS), "features": []}
#: the zoo's run shapes (bench_models.RUN_DIMS)
ZOO_DIMS = {"cnn": {"N": 1, "H": 32, "W": 32}, "mlp": {"N": 8}, "transformer": {"B": 1, "S": 16}}
ZOO = [(fam, fmt) for fam in ZOO_DIMS for fmt in model_zoo.FORMATS]
EXPORTED = [(name, form) for name in em.MODELS for form in em.FORMS]


@pytest.fixture
def no_device(monkeypatch):
    """wgpu cannot be imported and no device can be made while the test runs."""
    def refuse(*a, **kw):
        raise AssertionError("the compiler asked for a device")

    monkeypatch.setitem(sys.modules, "wgpu", None)
    monkeypatch.setattr(device_module, "get_device", refuse)
    monkeypatch.setattr(device_module.GpuDevice, "__init__", refuse)


def _quiet(build):
    logging.getLogger().setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build()


def compile_model(model, shapes, feeds=None):
    """What a Session does for one binding, without one: rewrite, classify, compile."""
    rewritten = rewrite_model(model, static_values(model), SPECS)
    graph = gp.model_graph(rewritten, model, SPECS, initializer_arrays(rewritten.model, resolve_budget(None)))
    return gp.compile(graph, FACTS, shapes, feeds=feeds)


def _check_plan(compiled, graph_nodes=None):
    plan = compiled.plan
    assert isinstance(plan, GraphPlan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.key = ()
    steps = plan.gpu_steps
    assert all(st.plan.passes for st in steps)
    kinds = {k for k, _ in plan.placement.values()}
    assert "gpu" in kinds or "control" in kinds   # a model of If / Loop runs its bodies on the GPU
    # every GPU-read value has a pooled buffer or one of its own
    for st in steps:
        for bname, where in st.buffers.items():
            if where[0] == "value" and plan.roots[where[1]].origin in ("feed", "gpu", "host"):
                assert where[1] in plan.slot_of
    return plan


@pytest.mark.parametrize("family,fmt", ZOO, ids=[f"{a}-{b}" for a, b in ZOO])
def test_the_zoo_models_compile_without_a_device(no_device, family, fmt):
    model = _quiet(lambda: model_zoo.quantized(family, fmt, per_channel=True))
    shapes = model_zoo.input_shapes(model, ZOO_DIMS[family])
    compiled = compile_model(model, shapes)
    plan = _check_plan(compiled)
    assert compiled.host == ()           # every node has a kernel: nothing for the policy to warn of
    assert len(plan.segments) == 1       # so one submit per run
    assert plan.key == gp.shape_key(shapes)


@pytest.mark.parametrize("name,form", EXPORTED, ids=[f"{a}-{b}" for a, b in EXPORTED])
def test_the_exported_models_compile_without_a_device(no_device, name, form):
    model = _quiet(lambda: em.build(name, form))
    shapes = em.MODELS[name][1]
    compiled = compile_model(model, shapes, feeds=em.feeds(model, shapes, seed=1))
    _check_plan(compiled)
    assert compiled.host == ()           # the exported models run on the GPU with no host fallback


def _host_model():
    """Relu -> Det of 41 x 41 matrices (beyond its kernel's MAX_ORDER: declined, the host) -> Relu."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("Det", ["a"], ["h"], name="det"),
             helper.make_node("Relu", ["h"], ["y"], name="b")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 41, 41])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N"])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_host_nodes_come_back_as_data_and_each_plan_types_its_own_host_outputs(no_device):
    model = _host_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # the compiler never warns: the Session's policy does
        compiled = compile_model(model, {"x": (4, 41, 41)})
    assert [(h.index, h.declined) for h in compiled.host] == [(1, True)]
    assert "kernel Det: no variant applies" in compiled.host[0].reason
    (host,) = [s for s in compiled.plan.schedule if isinstance(s, HostStep)]
    assert host.outputs == ("h",) and host.output_types == (TP.FLOAT,)
    assert [type(s) for s in compiled.plan.schedule] == [Segment, HostStep, Segment]
    other = compile_model(model, {"x": (6, 41, 41)})
    assert other.plan.key != compiled.plan.key and other.plan.roots["h"].shape == (6,)
    assert compiled.plan.roots["h"].shape == (4,)   # the first plan is unchanged by the second


def test_a_node_no_variant_takes_at_these_shapes_is_declined_as_data(no_device):
    """com.microsoft Gelu has a kernel, but no variant's grid fits 2^50 elements: the plan at
    those shapes sends it to the host as a declined node, saying which clause failed."""
    x = helper.make_tensor_value_info("x", TP.FLOAT, ["N", 1024])
    y = helper.make_tensor_value_info("y", TP.FLOAT, None)
    g = helper.make_graph([helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft", name="gelu")], "g", [x], [y])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
    rewritten = rewrite_model(model, static_values(model), SPECS)
    graph = gp.model_graph(rewritten, model, SPECS, {})
    (h,) = gp.compile(graph, FACTS, {"x": (2**40, 1024)}).host
    assert h.declined and h.reason.startswith("kernel Gelu: no variant applies (word_per_invocation: 'gridFits' is false")
    assert gp.compile(graph, FACTS, {"x": (4, 1024)}).host == ()


def test_phase_zero_keys_a_plan_on_the_small_integer_inputs_it_needs(no_device):
    """A Reshape whose target shape is a graph input: the plan needs its contents and keys on them."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="r"), helper.make_node("Reshape", ["r", "s"], ["y"], name="v"),
             helper.make_node("Relu", ["y"], ["z"], name="z")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [2, 3]),
                                       helper.make_tensor_value_info("s", TP.INT64, [2])],
                          [helper.make_tensor_value_info("z", TP.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    feeds = {"x": np.zeros((2, 3), np.float32), "s": np.array([3, 2], np.int64)}
    compiled = compile_model(model, {"x": (2, 3), "s": (2,)}, feeds=feeds)
    assert compiled.keyed == ("s",)
    assert compiled.plan.key == gp.shape_key({"x": (2, 3), "s": (2,)}) + gp.value_key(("s",), feeds)
    assert compiled.plan.alias["y"][1] == (3, 2)

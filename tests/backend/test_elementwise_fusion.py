"""Elementwise fusion (backend_wgpu/elementwise_fusion.py): which float32 elementwise nodes become one
FusedElementwise node (on the CPU, no adapter), the fused model's inference, and the fused kernel
on the GPU against the same session unfused and onnxruntime.

Agreement: the fused kernel computes each step in float32 as the unfused kernels do; the shader
compiler may contract a multiply and an add of two steps into one fused multiply-add, which moves
such a step by at most an ulp of its value, so fused and unfused agree within 4 float32 ulps of the
largest value (measured: bit-identical on lavapipe for every chain here) and onnxruntime within 1e-5
relative (its exp/tanh/sigmoid differ from the shader's in the last bits).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from onnx import TensorProto as TP, helper

from onnx_quant.backend_wgpu.elementwise_fusion import DOMAIN, MAX_INPUTS, MAX_STEPS, OP_TYPE, fuse_elementwise
from onnx_quant.backend_wgpu.model_check import static_values
from onnx_quant.backend_wgpu.session import _specs
from support import models
from support.oracles import onnxruntime_run


def make_model(nodes, inputs, output="y", elem=TP.FLOAT, outputs=None) -> onnx.ModelProto:
    """``inputs``: (name, shape), every value of type ``elem``."""
    return models.make_model(nodes, [(n, elem, s) for n, s in inputs], [(o, elem, None) for o in (outputs or [output])])


def fuse(model):
    values = static_values(model)
    return fuse_elementwise(model, elem_of=lambda n: values[n].elem_type if n in values else 0,
                            spec_of=lambda node, version: _specs().find("", node.op_type, version))


def silu_chain():
    """x + b -> Sigmoid -> Mul(t, sigmoid) -> HardSigmoid(alpha 0.3) -> Relu: the sum is read twice."""
    nodes = [helper.make_node("Add", ["x", "b"], ["t1"]), helper.make_node("Sigmoid", ["t1"], ["t2"]),
             helper.make_node("Mul", ["t1", "t2"], ["t3"]), helper.make_node("HardSigmoid", ["t3"], ["t4"], alpha=0.3),
             helper.make_node("Relu", ["t4"], ["y"])]
    return make_model(nodes, [("x", ["n", 8]), ("b", [8])])


# ----------------------------------------------------------------------------- the phase (CPU)


def test_a_chain_with_a_value_read_twice_becomes_one_node():
    r = fuse(silu_chain())
    (node,) = r.model.graph.node
    assert (node.op_type, node.domain, list(node.input), list(node.output)) == (OP_TYPE, DOMAIN, ["x", "b"], ["y"])
    steps = json.loads(helper.get_attribute_value(node.attribute[0]))
    assert [s["op"] for s in steps] == ["Add", "Sigmoid", "Mul", "HardSigmoid", "Relu"]
    assert [s["args"] for s in steps] == [["x0", "x1"], ["t0"], ["t0", "t1"], ["t2"], ["t3"]]
    assert ["alpha", "f32", "f32(0.30000001192092896)"] in steps[3]["consts"]
    assert [n.op_type for n in r.units[0].nodes] == ["Add", "Sigmoid", "Mul", "HardSigmoid", "Relu"]
    assert any(o.domain == DOMAIN for o in r.model.opset_import)


def test_a_value_read_outside_the_group_or_a_graph_output_ends_it():
    nodes = [helper.make_node("Sub", ["x", "m"], ["d"]), helper.make_node("Mul", ["d", "d"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]), helper.make_node("Add", ["var", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["std"]), helper.make_node("Div", ["d", "std"], ["y"])]
    model = make_model(nodes, [("x", [2, 8]), ("m", [2, 1]), ("eps", [1])])
    r = fuse(model)
    # d is read by Mul and Div, in different groups: Sub stays; sq feeds ReduceMean: Mul stays alone;
    # Add -> Sqrt -> Div fuse
    assert [n.op_type for n in r.model.graph.node] == ["Sub", "Mul", "ReduceMean", OP_TYPE]
    assert [n.op_type for n in r.units[0].nodes] == ["Add", "Sqrt", "Div"]
    # sq is a graph output: Sub -> Mul(d, d) fuse up to it, Relu after it stays on its own
    out = make_model(nodes[:2] + [helper.make_node("Relu", ["sq"], ["y"])], [("x", [4]), ("m", [4])],
                     outputs=["sq", "y"])
    r = fuse(out)
    assert [(n.op_type, list(n.output)) for n in r.model.graph.node] == [(OP_TYPE, ["sq"]), ("Relu", ["y"])]


def test_other_types_and_ops_stay():
    ints = [helper.make_node("Add", ["x", "x"], ["t"]), helper.make_node("Relu", ["t"], ["y"])]
    assert not fuse(make_model(ints, [("x", [4])], elem=TP.INT32)).units
    mixed = [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Softmax", ["t"], ["y"])]
    assert not fuse(make_model(mixed, [("x", [4])])).units


def test_a_group_reads_at_most_max_inputs():
    names = [f"x{k}" for k in range(12)]
    nodes, cur = [], names[0]
    for k, n in enumerate(names[1:]):
        out = "y" if k == len(names) - 2 else f"s{k}"
        nodes.append(helper.make_node("Add", [cur, n], [out]))
        cur = out
    r = fuse(make_model(nodes, [(n, [3]) for n in names]))
    assert len(r.units) >= 2
    assert all(len(u.node.input) <= MAX_INPUTS for u in r.units)
    assert sum(len(u.nodes) for u in r.units) + sum(n.op_type == "Add" for n in r.model.graph.node) == 11


def test_a_long_chain_becomes_nodes_of_at_most_max_steps():
    n = 2 * MAX_STEPS + 3
    nodes = [helper.make_node("Relu", ["x" if k == 0 else f"r{k}"], ["y" if k == n - 1 else f"r{k + 1}"])
             for k in range(n)]
    r = fuse(make_model(nodes, [("x", [4])]))
    assert [len(u.nodes) for u in r.units] == [MAX_STEPS, MAX_STEPS, 3]
    assert [n.op_type for n in r.model.graph.node] == [OP_TYPE] * 3


def test_the_fused_model_infers_the_broadcast_shape():
    from onnx_quant.inference import infer_values

    r = fuse(silu_chain())
    values = infer_values(r.model, {"x": [5, 8], "b": [8]})
    assert values["y"].elem_type == TP.FLOAT and tuple(values["y"].shape) == (5, 8)


# ----------------------------------------------------------------------------- on the GPU


def run_both(device, model, feeds):
    from onnx_quant.backend_wgpu.session import Session

    out = {}
    for fused in (True, False):
        with Session(model, device=device, allow_host_fallback=False, fuse_elementwise=fused) as s:
            out[fused] = (s.run(None, feeds)[0], s.last_run_stats["dispatches"])
    return out[True], out[False]



def assert_agree(got, unfused, want):
    # infinities (an Exp that overflows) and NaNs in the same places with the same values; the
    # finite values within the bounds of the module docstring
    for other in (unfused, want):
        assert np.array_equal(np.isnan(got), np.isnan(other)) and np.array_equal(np.isinf(got), np.isinf(other))
        assert np.array_equal(got[np.isinf(got)], other[np.isinf(got)])
    finite = np.isfinite(got)
    got, unfused, want = got[finite], unfused[finite], want[finite]
    scale = float(np.abs(want).max(initial=0.0))
    assert np.abs(got - unfused).max(initial=0.0) <= 4 * np.spacing(np.float32(max(scale, 1e-30)))
    assert np.abs(got - want).max(initial=0.0) <= 1e-5 * scale + 1e-7


def test_a_fused_chain_runs_in_one_dispatch(best):
    model = silu_chain()
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32),
             "b": np.linspace(-1, 1, 8, dtype=np.float32)}
    (got, n_fused), (unfused, n_unfused) = run_both(best, model, feeds)
    assert (n_fused, n_unfused) == (1, 5)
    assert_agree(got, unfused, onnxruntime_run(model, feeds)[0])


def test_a_declined_group_runs_as_written_on_the_host(best):
    from onnx_quant.backend_wgpu.session import Session

    model = silu_chain()
    feeds = {"x": np.ones((2, 8), np.float32), "b": np.linspace(-1, 1, 8, dtype=np.float32)}
    with Session(model, device=best) as s:
        (info,) = [i for i in s._nodes if i.node.op_type == OP_TYPE]
        ev, inputs = s._evaluator(info)
        got = ev.run(None, {n: feeds[n] for n in inputs})[0]
    np.testing.assert_allclose(got, onnxruntime_run(model, feeds)[0], rtol=1e-6)


UNARY = ["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Exp", "Softsign", "HardSwish"]
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min"]


@st.composite
def chains(draw):
    """A random chain of table ops over a [2, 3, 4] input, binary ops reading a broadcast operand."""
    shapes = [[2, 3, 4], [4], [3, 1], [1], [2, 1, 4]]
    nodes, inputs, cur = [], [("x", [2, 3, 4])], "x"
    for k in range(draw(st.integers(2, 6))):
        out = f"t{k}"
        if draw(st.booleans()):
            op = draw(st.sampled_from(UNARY))
            nodes.append(helper.make_node(op, [cur], [out]))
        else:
            op = draw(st.sampled_from(BINARY))
            name = f"c{k}"
            inputs.append((name, draw(st.sampled_from(shapes))))
            args = [cur, name] if draw(st.booleans()) else [name, cur]
            nodes.append(helper.make_node(op, args, [out]))
        cur = out
    nodes[-1].output[0] = "y"
    return make_model(nodes, inputs)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=chains(), seed=st.integers(0, 2**16))
def test_random_chains_agree_with_the_unfused_session_and_onnxruntime(best, model, seed):
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        # Div's divisor away from 0: values in [0.5, 2] with a random sign
        feeds[vi.name] = (rng.uniform(0.5, 2, shape) * rng.choice([-1, 1], shape)).astype(np.float32)
    (got, n_fused), (unfused, n_unfused) = run_both(best, model, feeds)
    assert n_fused == 1 and n_unfused == len(model.graph.node)
    assert_agree(got, unfused, onnxruntime_run(model, feeds)[0])


def test_onnxruntime_optimization_levels_map_to_elementwise_fusion():
    from onnx_quant.backend_wgpu.inference_session import GraphOptimizationLevel, SessionOptions, fuses_elementwise

    assert fuses_elementwise(SessionOptions())
    options = SessionOptions()
    for level, fused in ((GraphOptimizationLevel.ORT_DISABLE_ALL, False), (GraphOptimizationLevel.ORT_ENABLE_BASIC, True),
                         (GraphOptimizationLevel.ORT_ENABLE_ALL, True)):
        options.graph_optimization_level = level
        assert fuses_elementwise(options) == fused


def test_nodes_of_constants_alone_stay_out_of_groups():
    """Relu over a weight runs once per plan (the prologue); fused with the Add that reads the feed it
    would run every run."""
    from onnx import numpy_helper

    nodes = [helper.make_node("Relu", ["w"], ["wr"]), helper.make_node("Neg", ["wr"], ["wn"]),
             helper.make_node("Add", ["x", "wn"], ["t"]), helper.make_node("Sigmoid", ["t"], ["y"])]
    model = make_model(nodes, [("x", [4])])
    model.graph.initializer.append(numpy_helper.from_array(np.float32([1, -2, 3, -4]), "w"))
    r = fuse(model)
    assert [n.op_type for n in r.model.graph.node] == ["Relu", "Neg", OP_TYPE]
    assert [n.op_type for n in r.units[0].nodes] == ["Add", "Sigmoid"]


# ----------------------------------------------------------------------------- epilogues


def producer_model(op: str, tail: str, *, extra_reader: bool = False):
    """A float32 Conv / MatMul / Gemm (constant weights) followed by an activation as exporters
    write them: ``silu`` (Sigmoid, Mul(p, sigmoid)), ``hardswish`` or ``relu``."""
    from onnx import numpy_helper

    rng = np.random.default_rng(3)
    if op == "Conv":
        x, w = ("x", [1, 3, 6, 6]), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
        node = helper.make_node("Conv", ["x", "w", "bias"], ["p"], pads=[1, 1, 1, 1], name="p")
        bias = rng.standard_normal(4).astype(np.float32)
    else:
        x, w = ("x", [5, 6]), rng.standard_normal((6, 4)).astype(np.float32)
        bias = rng.standard_normal(4).astype(np.float32)
        node = (helper.make_node("Gemm", ["x", "w", "bias"], ["p"], alpha=0.5, beta=2.0, name="p") if op == "Gemm"
                else helper.make_node("MatMul", ["x", "w"], ["p"], name="p"))
    tails = {"silu": [helper.make_node("Sigmoid", ["p"], ["s"]), helper.make_node("Mul", ["p", "s"], ["y"])],
             "hardswish": [helper.make_node("HardSwish", ["p"], ["y"])],
             "relu": [helper.make_node("Relu", ["p"], ["y"])]}
    nodes = [node, *tails[tail]]
    outputs = ["y"]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["p"], ["z"]))
        outputs.append("z")
    model = make_model(nodes, [x], outputs=outputs)
    model.graph.initializer.extend([numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "bias")])
    return model


@pytest.mark.parametrize("op,tail", [("Conv", "silu"), ("Conv", "hardswish"), ("MatMul", "relu"), ("Gemm", "silu")])
def test_a_group_reading_only_a_producer_becomes_its_epilogue(op, tail):
    model = producer_model(op, tail)
    r = fuse(model)
    (node,) = r.model.graph.node
    assert (node.op_type, node.domain) == (f"Fused{op}", DOMAIN)
    assert list(node.input) == list(model.graph.node[0].input) and list(node.output) == ["y"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    steps = json.loads(attrs.pop("activation"))
    assert steps[0]["args"][0] == "x0" and [s["op"] for s in steps] == [n.op_type for n in model.graph.node[1:]]
    assert attrs == {a.name: helper.get_attribute_value(a) for a in model.graph.node[0].attribute}
    assert r.units[0].rule == "epilogue" and r.units[0].nodes[0] == model.graph.node[0]


def test_a_producer_read_elsewhere_keeps_its_output():
    r = fuse(producer_model("Conv", "silu", extra_reader=True))
    # p is read by Neg too: it stays a Conv; Sigmoid -> Mul read p beside it, a FusedElementwise of two steps
    assert [n.op_type for n in r.model.graph.node] == ["Conv", OP_TYPE, "Neg"]


@pytest.mark.parametrize("op,tail", [("Conv", "silu"), ("Conv", "hardswish"), ("MatMul", "relu"), ("Gemm", "silu")])
def test_epilogues_agree_with_the_unfused_session_and_onnxruntime(best, op, tail):
    model = producer_model(op, tail)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = {"x": np.random.default_rng(7).standard_normal(shape).astype(np.float32)}
    (got, n_fused), (unfused, n_unfused) = run_both(best, model, feeds)
    assert n_fused == 1 and n_unfused == len(model.graph.node)
    assert_agree(got, unfused, onnxruntime_run(model, feeds)[0])

"""The inference pass: seeding, rule selection, the onnx fallback, strict vs lenient,
constant propagation, write-back, and the three public views of one pass."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_quant import inference
from onnx_quant.inference import dims, engine, registry
from onnx_quant.inference.context import TensorInfo
from onnx_quant.inference.diagnostics import Diagnostic
from onnx_quant.inference.dims import Dim
from onnx_quant.errors import InferenceError
from onnx_quant.examples import example_model, example_models
from onnx_quant.oracles import widen_u8s8
from support import models

F, I64 = TensorProto.FLOAT, TensorProto.INT64
FAKE = "test.onnx_quant.engine"  # a domain onnx has no schema for


def make_model(nodes, inputs, outputs, initializers=(), opset=21, extra_opsets=(), value_info=()):
    return models.make_model(nodes, inputs, outputs, initializers, opset, extra_opsets=extra_opsets, value_info=value_info)


def vi(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def onnx_types(model) -> dict[str, TensorInfo]:
    """onnx's own strict inference, as TensorInfo by name."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    g = inferred.graph
    return {v.name: TensorInfo.from_type_proto(v.type) for v in list(g.value_info) + list(g.output) + list(g.input)}


def ours(model, **kw) -> dict[str, TensorInfo]:
    out = inference.infer_shapes(model, **kw)
    g = out.graph
    return {v.name: TensorInfo.from_type_proto(v.type) for v in list(g.value_info) + list(g.output) + list(g.input)}


def assert_agrees_with_onnx(model):
    """Every element type matches onnx's; every dim onnx knows as an int, we know the same."""
    theirs, mine = onnx_types(model), ours(model, strict=True)
    assert set(theirs) <= set(mine), sorted(set(theirs) - set(mine))
    for name, t in theirs.items():
        m = mine[name]
        assert m.elem_type == t.elem_type, name
        if t.shape is None:
            continue
        assert m.shape is not None and len(m.shape) == len(t.shape), (name, m.shape, t.shape)
        for a, b in zip(m.shape, t.shape):
            if isinstance(b, int):
                assert a == b, (name, m.shape, t.shape)


@pytest.fixture
def fallback_only(monkeypatch):
    """No own rules: every ai.onnx node goes through onnx's per-node inference."""
    monkeypatch.setattr(engine.registry, "lookup", lambda *a, **k: None)


# ------------------------------------------------------------------ a float model onnx fully knows
def float_cnn(batch=2):
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(np.zeros(4, np.float32), "b"),
        numpy_helper.from_array(rng.standard_normal((4 * 4 * 4, 5)).astype(np.float32), "fc"),
        numpy_helper.from_array(np.array([0, -1], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Reshape", ["p", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "fc"], ["mm"]),
        helper.make_node("Softmax", ["mm"], ["y"], axis=-1),
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Transpose", ["r"], ["rt"], perm=[0, 2, 3, 1]),
    ]
    return make_model(nodes, [vi("x", F, [batch, 3, 16, 16])], [vi("y", F, None), vi("rt", F, None)], inits)


def test_fallback_only_matches_onnx_exactly(fallback_only):
    model = float_cnn()
    theirs, mine = onnx_types(model), ours(model, strict=True)
    for name, t in theirs.items():
        assert mine[name] == t, name
    assert mine["flat"].shape == (2, 64)
    result = inference.infer(model)
    assert {r.source for r in result.nodes} == {"onnx-fallback"}


def test_with_rules_agrees_with_onnx():
    assert_agrees_with_onnx(float_cnn())


@pytest.mark.parametrize("name", sorted(example_models()))
def test_examples_agree_with_onnx(name):
    assert_agrees_with_onnx(example_models()[name])


@pytest.mark.parametrize("name", sorted(example_models()))
def test_examples_have_no_diagnostics_and_every_value_typed(name):
    model = example_models()[name]
    assert inference.check_model(model) == []
    values = inference.infer_values(model)
    for node in model.graph.node:
        for out in node.output:
            assert values[out].is_typed, out
            assert all(d is not None for d in values[out].shape), (out, values[out].shape_text())


def _run_all_values(model, feed):
    """onnxruntime's dtype and shape of every node output (all exposed as graph outputs)."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    del exposed.graph.output[:]
    names = [o for n in model.graph.node for o in n.output if o]
    exposed.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    sess = ort.InferenceSession(widen_u8s8(exposed).model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(names, sess.run(names, feed)))


@pytest.mark.parametrize("name,shape", [("cnn", (2, 3, 9, 7)), ("cnn", (1, 3, 4, 5)),
                                        ("qlinear_matmul", (3, 16)), ("qdq", (2, 5, 8))])
def test_concrete_input_shapes_match_onnxruntime(name, shape):
    model = example_models()[name]
    inp = model.graph.input[0].name
    values = inference.infer_values(model, {inp: shape}, strict=True)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    actual = _run_all_values(model, {inp: x})
    for out, array in actual.items():
        info = values[out]
        assert info.is_fully_known, (out, info.shape_text())
        assert info.shape == array.shape, out
        assert helper.tensor_dtype_to_np_dtype(info.elem_type) == array.dtype, out


@pytest.mark.parametrize("hw", [(9, 7), (1, 1), (16, 33)])
def test_symbolic_expressions_evaluate_to_the_concrete_run(hw):
    model = example_model()
    symbolic = inference.infer_values(model)
    concrete = inference.infer_values(model, {"image": (3, 3) + hw})
    env = {"N": 3, "H": hw[0], "W": hw[1]}
    for name, info in symbolic.items():
        if info.shape is None:
            continue
        assert tuple(dims.evaluate(d, env) for d in info.shape) == concrete[name].shape, name


def test_symbolic_dims_survive_the_fallback(fallback_only):
    model = make_model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "b"], ["y"])],
        [vi("x", F, ["N", 3, "floor((H + 1) / 2)"]), vi("b", F, [3, 1])], [vi("y", F, None)])
    values = inference.infer_values(model, strict=True)
    H = Dim.symbol("H")
    assert values["r"].shape == (Dim.symbol("N"), 3, dims.floordiv(dims.add(H, 1), 2))
    assert values["y"].shape == values["r"].shape
    out = inference.infer_shapes(model)
    assert [d.dim_param or d.dim_value for d in out.graph.output[0].type.tensor_type.shape.dim] == \
        ["N", 3, "floor((H + 1) / 2)"]


# ------------------------------------------------------------------ constants
def test_constant_nodes_carry_values():
    nodes = [
        helper.make_node("Constant", [], ["ci"], value_ints=[2, -1]),
        helper.make_node("Constant", [], ["cf"], value_float=1.5),
        helper.make_node("Constant", [], ["ct"], value=numpy_helper.from_array(np.arange(6, dtype=np.int32).reshape(2, 3))),
        helper.make_node("Reshape", ["x", "ci"], ["y"]),
    ]
    model = make_model(nodes, [vi("x", F, [4, 3])], [vi("y", F, None)])
    result = inference.infer(model, strict=True)
    values = result.values()
    np.testing.assert_array_equal(values["ci"].value, [2, -1])
    assert values["ci"].elem_type == I64 and values["ci"].shape == (2,)
    assert values["cf"].elem_type == F and values["cf"].shape == () and values["cf"].value == 1.5
    assert values["ct"].elem_type == TensorProto.INT32 and values["ct"].shape == (2, 3)
    assert values["y"].shape == (2, 6)
    assert result.typed_by["ci"] == "constant"


@pytest.mark.parametrize("rules", ["with-rules", "fallback-only"])
def test_shape_arithmetic_is_folded_for_reshape(rules, monkeypatch):
    if rules == "fallback-only":
        monkeypatch.setattr(engine.registry, "lookup", lambda *a, **k: None)
    # Shape -> Gather -> Unsqueeze -> Concat -> Reshape: exported models' way to flatten
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "axes"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one")]
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
        helper.make_node("Shape", ["x"], ["tail"], start=-2),
    ]
    model = make_model(nodes, [vi("x", F, [5, 3, 4])], [vi("y", F, None)], inits)
    values = inference.infer_values(model, strict=True)
    np.testing.assert_array_equal(values["target"].value, [5, -1])
    np.testing.assert_array_equal(values["tail"].value, [3, 4])
    assert values["y"].shape == (5, 12)
    # onnx's own pass (no data propagation by default) does not get there: we do better or equal
    assert_agrees_with_onnx(model)


def test_symbolic_shape_is_not_folded_to_numbers():
    nodes = [helper.make_node("Shape", ["x"], ["s"])]
    model = make_model(nodes, [vi("x", F, ["N", 3])], [vi("s", I64, None)])
    values = inference.infer_values(model)
    # a rule may keep the symbolic form (an object array); never a numeric guess
    assert values["s"].shape == (2,)
    assert values["s"].value is None or values["s"].value.dtype == object
    folded = inference.infer_values(model, {"x": (7, 3)})
    np.testing.assert_array_equal(folded["s"].value, [7, 3])


def test_initializer_that_is_also_an_input_is_not_a_constant():
    shape = numpy_helper.from_array(np.array([3, 4], np.int64), "shape")
    model = make_model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                       [vi("x", F, [12]), vi("shape", I64, [2])], [vi("y", F, None)], [shape])
    model.ir_version = 8
    values = inference.infer_values(model)
    assert values["shape"].value is None  # a default the caller may override
    assert values["y"].rank == 2 and values["y"].shape != (3, 4)


# ------------------------------------------------------------------ custom rules and domains
def _twice_v1(ctx, n):
    x = n.input(0)
    n.set_output(0, TensorInfo(x.elem_type, tuple(dims.mul(d, 2) for d in x.shape)))


def _twice_v3(ctx, n):
    x = n.input(0)
    if n.attr("fail", 0):
        n.fail("twice-attr", "attribute fail is set", subject="attribute 'fail'", expected=0, found=1)
    if x.elem_type != F:
        n.report("twice-type", "input must be float", subject="input 0", expected="float32", found=x.elem_type)
    if n.attr("crash", 0):
        raise ZeroDivisionError("boom")
    n.set_output(0, TensorInfo(x.elem_type, tuple(dims.mul(d, 3) for d in x.shape)))


registry.register("Twice", 1, domain=FAKE)(_twice_v1)
registry.register("Twice", 3, domain=FAKE)(_twice_v3)


def twice_model(opset, x_type=F, **attrs):
    nodes = [helper.make_node("Twice", ["x"], ["t"], domain=FAKE, name="twice", **attrs),
             helper.make_node("Relu", ["t"], ["y"], name="after")]
    # outputs declare a rank with unnamed dims: onnx's checker wants a shape field on them
    return make_model(nodes, [vi("x", x_type, ["N", 4])], [vi("y", x_type, [None, None])], extra_opsets=[(FAKE, opset)])


@pytest.mark.parametrize("opset,factor,version", [(1, 2, 1), (2, 2, 2), (3, 3, 3), (9, 3, 9)])
def test_rule_selected_by_the_domain_opset(opset, factor, version):
    result = inference.infer(twice_model(opset), strict=True)
    assert result.ctx["t"].shape == (dims.mul(Dim.symbol("N"), factor), 4 * factor)
    assert result.ctx["y"].shape == result.ctx["t"].shape
    record = result.nodes[0]
    assert (record.source, record.version, record.label) == ("rule", version, "'twice' (Twice)")
    assert result.typed_by["t"] == f"rule {FAKE}::Twice v{version}"


def test_reported_violation_lenient_keeps_going_strict_raises():
    model = twice_model(3, x_type=TensorProto.DOUBLE)
    result = inference.infer(model)
    [d] = result.diagnostics
    assert (d.node, d.rule) == ("'twice' (Twice)", "twice-type")
    assert "expected float32, found 11" in d.message
    assert result.ctx["t"].shape == (dims.mul(Dim.symbol("N"), 3), 12)  # report does not stop the node
    with pytest.raises(InferenceError) as e:
        inference.infer(model, strict=True)
    assert e.value.rule == "twice-type" and "'twice' (Twice)" in str(e.value)


def test_failed_rule_leaves_outputs_unknown_and_the_pass_goes_on():
    model = twice_model(3, fail=1)
    result = inference.infer(model)
    [d] = result.diagnostics
    assert d.rule == "twice-attr" and d.node == "'twice' (Twice)"
    assert str(d) == "'twice' (Twice): twice-attr: attribute 'fail': attribute fail is set: expected 0, found 1"
    assert result.ctx["t"] == TensorInfo()
    assert result.nodes[0].source == "failed" and result.nodes[1].source in ("rule", "onnx-fallback", "unknown")
    with pytest.raises(InferenceError, match="twice-attr"):
        inference.infer(model, strict=True)
    assert [x.rule for x in inference.check_model(model)] == ["twice-attr"]


def test_crashing_rule_becomes_an_internal_diagnostic():
    model = twice_model(3, crash=1)
    [d] = inference.check_model(model)
    assert d.rule == "internal" and "ZeroDivisionError" in d.message and d.node == "'twice' (Twice)"
    with pytest.raises(InferenceError) as e:
        inference.infer(model, strict=True)
    assert isinstance(e.value.__cause__, ZeroDivisionError)


def test_unknown_domain_op():
    nodes = [helper.make_node("Mystery", ["x"], ["m"], domain="com.example", name="mystery"),
             helper.make_node("Relu", ["m"], ["y"])]
    model = make_model(nodes, [vi("x", F, [2])], [vi("y", F, None)], extra_opsets=[("com.example", 1)])
    result = inference.infer(model)
    assert result.diagnostics == []
    assert result.ctx["m"] == TensorInfo() and not result.ctx["y"].is_typed  # unknown flows on quietly
    assert result.nodes[0].source == "unknown"
    with pytest.raises(InferenceError) as e:
        inference.infer(model, strict=True)
    assert e.value.rule == "unknown-op" and "'mystery' (Mystery)" in str(e.value)


def test_declared_value_info_types_an_unknown_op_output():
    nodes = [helper.make_node("Mystery", ["x"], ["m"], domain="com.example"),
             helper.make_node("Relu", ["m"], ["y"])]
    model = make_model(nodes, [vi("x", F, [2])], [vi("y", F, None)], extra_opsets=[("com.example", 1)],
                       value_info=[vi("m", F, [2, "K"])])
    result = inference.infer(model)
    assert result.ctx["m"].shape == (2, Dim.symbol("K")) and result.typed_by["m"] == "declared"
    assert result.ctx["y"].shape == (2, Dim.symbol("K"))


def test_unknown_ai_onnx_op_and_op_too_new_for_the_opset():
    model = make_model([helper.make_node("NoSuchOp", ["x"], ["y"])], [vi("x", F, [2])], [vi("y", F, None)])
    [d] = inference.infer(model).diagnostics
    assert d.rule == "unknown-op" and "NoSuchOp" in d.message
    model = make_model([helper.make_node("Gelu", ["x"], ["y"])], [vi("x", F, [2])], [vi("y", F, None)], opset=19)
    [d] = inference.infer(model).diagnostics
    assert "first appears in opset 20" in d.message


def test_domain_missing_from_opset_import():
    model = make_model([helper.make_node("Twice", ["x"], ["y"], domain=FAKE)], [vi("x", F, [2])], [vi("y", F, None)])
    [d] = inference.infer(model).diagnostics
    assert d.rule == "opset-import" and FAKE in d.message


# ------------------------------------------------------------------ the fallback's errors
def test_fallback_rejection_is_a_diagnostic_naming_the_node(fallback_only):
    nodes = [helper.make_node("Add", ["x", "i"], ["y"], name="bad_add"), helper.make_node("Relu", ["y"], ["z"])]
    model = make_model(nodes, [vi("x", F, [2]), vi("i", I64, [2])], [vi("z", F, None)])
    result = inference.infer(model)
    [d] = result.diagnostics  # the Relu after it is not blamed
    assert d.rule == "onnx-fallback" and d.node == "'bad_add' (Add)"
    assert "\n" not in str(d)
    assert result.ctx["y"] == TensorInfo()
    with pytest.raises(InferenceError, match="onnx-fallback: node 'bad_add'"):
        inference.infer(model, strict=True)


def test_graph_not_topologically_sorted():
    nodes = [helper.make_node("Relu", ["a"], ["y"], name="first"), helper.make_node("Relu", ["x"], ["a"], name="second")]
    model = make_model(nodes, [vi("x", F, [2])], [vi("y", F, None)])
    [d] = inference.infer(model).diagnostics
    assert d.rule == "graph-order" and d.node == "'first' (Relu)"
    assert "'a'" in d.message and "not topologically sorted" in d.message
    with pytest.raises(InferenceError, match="graph-order"):
        inference.infer(model, strict=True)
    model = make_model([helper.make_node("Relu", ["ghost"], ["y"])], [vi("x", F, [2])], [vi("y", F, None)])
    [d] = inference.infer(model).diagnostics
    assert "no node, graph input or initializer produces it" in d.message


def test_value_defined_twice():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["x"], ["a"], name="again")]
    model = make_model(nodes, [vi("x", F, [2])], [vi("a", F, None)])
    [d] = inference.infer(model).diagnostics
    assert d.rule == "single-assignment" and d.node == "'again' (Relu)"


# ------------------------------------------------------------------ declared outputs
def relu_model(declared):
    return make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", F, ["N", 3])],
                      [vi("y", *declared) if declared else onnx.ValueInfoProto(name="y")])


def test_output_typed_and_known_declared_dims_kept():
    out = inference.infer_shapes(relu_model((F, [5, None])))
    dims_ = out.graph.output[0].type.tensor_type.shape.dim
    assert [(d.dim_value, d.dim_param) for d in dims_] == [(5, ""), (3, "")]
    out = inference.infer_shapes(relu_model(None))
    assert TensorInfo.from_type_proto(out.graph.output[0].type) == TensorInfo(F, (Dim.symbol("N"), 3))
    out = inference.infer_shapes(relu_model((F, ["batch", 3])))
    assert out.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"


@pytest.mark.parametrize("declared,what", [((F, ["N", 4]), "dim 1"), ((TensorProto.DOUBLE, ["N", 3]), "element type"),
                                           ((F, ["N", 3, 1]), "rank")])
def test_conflicting_output_declaration(declared, what):
    model = relu_model(declared)
    result = inference.infer(model)
    [d] = result.diagnostics
    assert d.rule == "output-type" and d.node == "'relu' (Relu)" and what in d.message
    out = inference.infer_shapes(model)
    assert out.graph.output[0].type == model.graph.output[0].type  # the declaration stands
    with pytest.raises(InferenceError, match="output-type"):
        inference.infer_shapes(model, strict=True)


def test_output_never_produced():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", F, [2])], [vi("y", F, None), vi("z", F, [1])])
    [d] = inference.infer(model).diagnostics
    assert d.rule == "graph-output" and "'z'" in d.message and d.node == "<model>"


# ------------------------------------------------------------------ write-back
def test_infer_shapes_returns_a_copy_with_value_info_for_every_intermediate():
    model = example_model()
    before = model.SerializeToString()
    out = inference.infer_shapes(model)
    assert model.SerializeToString() == before
    intermediates = {o for n in model.graph.node for o in n.output} - {v.name for v in model.graph.output}
    assert {v.name for v in out.graph.value_info} == intermediates
    onnx.checker.check_model(out, full_check=True)
    conv = next(v for v in out.graph.value_info if v.name == "conv_q")
    assert [d.dim_param or d.dim_value for d in conv.type.tensor_type.shape.dim] == \
        ["N", 8, "floor((H + 1) / 2)", "floor((W + 1) / 2)"]


def test_infer_shapes_accepts_path_and_bytes(tmp_path):
    model = example_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    a = inference.infer_shapes(str(path))
    b = inference.infer_shapes(model.SerializeToString())
    assert a.SerializeToString() == b.SerializeToString() == inference.infer_shapes(model).SerializeToString()


def test_sequence_values_pass_through_the_fallback():
    nodes = [helper.make_node("SequenceConstruct", ["x", "x"], ["seq"]),
             helper.make_node("SequenceAt", ["seq", "idx"], ["y"])]
    model = make_model(nodes, [vi("x", F, [2, 3])], [vi("y", F, None)],
                       [numpy_helper.from_array(np.array(1, np.int64), "idx")])
    result = inference.infer(model, strict=True)
    assert result.ctx["y"] == TensorInfo(F, (2, 3))
    out = inference.infer_shapes(model)
    [seq] = out.graph.value_info
    assert seq.type.HasField("sequence_type")
    assert_agrees_with_onnx(model)


def test_if_with_outer_scope_values():
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [vi("t", F, None)])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", F, None)])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    model = make_model(nodes, [vi("c", TensorProto.BOOL, []), vi("x", F, [4, 2])], [vi("y", F, None)])
    assert inference.infer(model, strict=True).ctx["y"] == TensorInfo(F, (4, 2))


# ------------------------------------------------------------------ input shapes
def two_inputs():
    nodes = [helper.make_node("Relu", ["a"], ["ra"]), helper.make_node("Relu", ["b"], ["rb"])]
    return make_model(nodes, [vi("a", F, ["N", 3]), vi("b", F, ["N", "K"])], [vi("ra", F, None), vi("rb", F, None)])


def test_input_shapes_bind_symbols_in_other_inputs():
    values = inference.infer_values(two_inputs(), {"a": (4, 3)})
    assert values["ra"].shape == (4, 3)
    assert values["rb"].shape == (4, Dim.symbol("K"))
    values = inference.infer_values(two_inputs(), {"a": ("M", 3), "b": (None, 2)})
    assert values["a"].shape == (Dim.symbol("M"), 3) and values["rb"].shape == (None, 2)


@pytest.mark.parametrize("shapes,match", [
    ({"c": (1, 3)}, "not a graph input"),
    ({"a": (4, 3, 1)}, "rank"),
    ({"a": (4, 5)}, "fixed dim"),
    ({"a": (4, 3), "b": (5, 1)}, "bound twice"),
    ({"a": (-1, 3)}, "negative"),
])
def test_bad_input_shapes(shapes, match):
    with pytest.raises(InferenceError, match=match) as e:
        inference.infer_values(two_inputs(), shapes)
    assert e.value.rule == "input-shapes"


# ------------------------------------------------------------------ check_model and diagnostics
def test_checker_failure_is_a_model_diagnostic():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", F, [2])], [vi("y", F, None)])
    model.ir_version = 0  # the checker requires an IR version; the pass does not care
    [found] = inference.check_model(model)
    assert found.node == "<model>" and found.rule == "onnx.checker" and "ir_version" in found.message
    assert "\n" not in str(found)


def test_check_collects_every_violation():
    nodes = [helper.make_node("Twice", ["x"], ["t"], domain=FAKE, name="one", fail=1),
             helper.make_node("Twice", ["x"], ["u"], domain=FAKE, name="two", fail=1),
             helper.make_node("Add", ["x", "i"], ["v"], name="three")]
    model = make_model(nodes, [vi("x", F, [2]), vi("i", I64, [2])], [vi("t", F, [None]), vi("u", F, [None]), vi("v", F, [None])],
                       extra_opsets=[(FAKE, 3)])
    found = inference.check_model(model)
    assert [d.node for d in found if d.rule == "twice-attr"] == ["'one' (Twice)", "'two' (Twice)"]
    assert any(d.node == "'three' (Add)" for d in found)
    assert all(isinstance(d, Diagnostic) for d in found)


def test_diagnostic_from_error():
    err = InferenceError("quant-axis", "'q' (QuantizeLinear)", "axis out of range", subject="attribute 'axis'",
                         expected="[-2, 1]", found="3")
    d = Diagnostic.from_error(err)
    assert str(d) == "'q' (QuantizeLinear): quant-axis: attribute 'axis': axis out of range: expected [-2, 1], found 3"
    assert Diagnostic.from_error(InferenceError("r", "#0 (X)", "plain")).message == "plain"


def test_big_chain_is_linear_and_complete():
    n = 2000
    nodes = [helper.make_node("Relu" if i % 2 else "Neg", [f"v{i}"], [f"v{i + 1}"]) for i in range(n)]
    model = make_model(nodes, [vi("v0", F, ["N", 8])], [vi(f"v{n}", F, None)])
    out = inference.infer_shapes(model)
    assert len(out.graph.value_info) == n - 1
    assert all(v.type.tensor_type.shape.dim[0].dim_param == "N" for v in out.graph.value_info)


# ------------------------------------------------------------------ onnx's own node test cases
@pytest.fixture(scope="module")
def onnx_node_cases():
    """Every node test case of the installed onnx (collected once per process)."""
    from onnx_quant.node_cases import all_node_cases

    return [c for c in all_node_cases() if c.model is not None]


def _disagreements(model) -> list[str]:
    try:
        theirs = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception:  # onnx cannot judge it: nothing to compare with
        return []
    mine = inference.infer_shapes(model)
    found = []
    mine_by_name = {v.name: TensorInfo.from_type_proto(v.type) for v in list(mine.graph.value_info) + list(mine.graph.output)}
    for v in list(theirs.graph.value_info) + list(theirs.graph.output):
        t, m = TensorInfo.from_type_proto(v.type), mine_by_name.get(v.name)
        if not v.type.HasField("tensor_type"):
            continue
        if m is None or (t.elem_type and m.elem_type != t.elem_type):
            found.append(f"{v.name}: type {m and m.elem_type} vs onnx {t.elem_type}")
        elif t.shape is not None and m.shape is not None and (
                len(m.shape) != len(t.shape) or any(isinstance(b, int) and a != b for a, b in zip(m.shape, t.shape))):
            found.append(f"{v.name}: {m.shape_text()} vs onnx {t.shape_text()}")
    return found


@pytest.mark.parametrize("rules", ["with-rules", "fallback-only"])
def test_every_onnx_node_case_agrees_with_onnx_and_checks_clean(onnx_node_cases, rules, monkeypatch):
    if rules == "fallback-only":
        monkeypatch.setattr(engine.registry, "lookup", lambda *a, **k: None)
    problems = []
    for case in onnx_node_cases:
        problems += [f"{case.name}: {p}" for p in _disagreements(case.model)]
        if rules == "with-rules":  # valid models: nothing to report (the fallback alone adds nothing)
            problems += [f"{case.name}: check: {d}" for d in inference.check_model(case.model)]
    assert not problems, "\n".join(problems[:30])
    assert len(onnx_node_cases) > 1000


# ------------------------------------------------------------------ required inputs
@pytest.mark.parametrize("op,inputs,missing,attrs", [
    ("MatMul", ["x", ""], "B", {}),
    ("MatMul", ["x"], "B", {}),
    ("Mul", ["", "x"], "A", {}),
    ("Relu", [""], "X", {}),
    ("Reshape", ["x", ""], "shape", {}),
    ("GlobalAveragePool", [""], "X", {}),
    ("Cast", [""], "input", {"to": TensorProto.INT8}),
    ("QuantizeLinear", ["x", ""], "y_scale", {}),
    ("QLinearMatMul", ["x", "", "", "x", "", "", "", ""], "a_scale", {}),
    ("DequantizeLinear", [""], "x", {}),
])
def test_missing_required_input_is_one_clear_diagnostic(op, inputs, missing, attrs):
    nodes = [helper.make_node(op, inputs, ["y"], name="n", **attrs), helper.make_node("Identity", ["y"], ["z"])]
    model = make_model(nodes, [vi("x", F, [2, 2])], [vi("z", F, None)])
    result = inference.infer(model)
    found = result.diagnostics
    assert found and {d.rule for d in found} == {"schema.required-input"}, [str(d) for d in found]  # no "internal", no rule's own
    assert all(d.node == f"'n' ({op})" for d in found)
    assert any(f"input {missing}" in d.message and "expected a value name, found nothing" in d.message for d in found)
    assert result.nodes[0].source == "failed" and result.ctx["y"] == TensorInfo()
    with pytest.raises(InferenceError) as e:
        inference.infer(model, strict=True)
    assert str(e.value).startswith(f"schema.required-input: node 'n' ({op}): input ")


def test_variadic_input_needs_its_minimum():
    model = make_model([helper.make_node("Concat", [], ["y"], axis=0, name="cat")], [vi("x", F, [2])], [vi("y", F, None)])
    [d] = inference.infer(model).diagnostics
    assert (d.rule, d.node) == ("schema.required-input", "'cat' (Concat)")
    assert "expected at least 1, found 0" in d.message


def test_optional_inputs_left_out_are_fine():
    nodes = [helper.make_node("Clip", ["x", "", "hi"], ["y"]), helper.make_node("DequantizeLinear", ["q", "s"], ["d"])]
    model = make_model(nodes, [vi("x", F, [2]), vi("hi", F, []), vi("q", TensorProto.INT8, [3]), vi("s", F, [])],
                       [vi("y", F, None), vi("d", F, None)])
    result = inference.infer(model, strict=True)
    assert result.ctx["y"] == TensorInfo(F, (2,)) and result.ctx["d"] == TensorInfo(F, (3,))


# ------------------------------------------------------------------ the memo
@pytest.mark.parametrize("rules", ["with-rules", "fallback-only"])
def test_repeated_nodes_are_memoized_but_constants_read_by_rules_are_not_shared(rules, monkeypatch):
    if rules == "fallback-only":
        monkeypatch.setattr(engine.registry, "lookup", lambda *a, **k: None)
    # two Reshapes with the same input type but different constant targets must not share a result
    inits = [numpy_helper.from_array(np.array([3, 4], np.int64), "s1"),
             numpy_helper.from_array(np.array([4, 3], np.int64), "s2"),
             numpy_helper.from_array(np.array([2, 6], np.int64), "s3")]
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["a"]), helper.make_node("Reshape", ["x", "s2"], ["b"]),
             helper.make_node("Reshape", ["x", "s3"], ["c"]), helper.make_node("Reshape", ["x", "s1"], ["d"])]
    model = make_model(nodes, [vi("x", F, [12])], [vi(o, F, None) for o in "abcd"], inits)
    values = inference.infer_values(model, strict=True)
    assert [values[o].shape for o in "abcd"] == [(3, 4), (4, 3), (2, 6), (3, 4)]


def test_memo_does_not_hide_diagnostics_of_repeated_nodes():
    nodes = [helper.make_node("Add", ["x", "i"], [f"y{k}"], name=f"bad{k}") for k in range(3)]
    model = make_model(nodes, [vi("x", F, [2]), vi("i", I64, [2])], [vi(f"y{k}", F, [None]) for k in range(3)])
    assert [d.node for d in inference.infer(model).diagnostics] == ["'bad0' (Add)", "'bad1' (Add)", "'bad2' (Add)"]


def test_unreadable_constant_is_reported_when_a_rule_reads_it():
    shape = onnx.TensorProto(name="shape", data_type=TensorProto.INT64, dims=[2], raw_data=b"\x01\x02\x03")  # 3 bytes, not 16
    model = make_model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="r")], [vi("x", F, [4, 3])],
                       [vi("y", F, None)], [shape])
    result = inference.infer(model)
    assert [(d.rule, d.node) for d in result.diagnostics][:1] == [("initializer", "<model>")]
    assert "'shape'" in result.diagnostics[0].message
    assert result.ctx["y"].rank == 2 and result.ctx["y"].shape != (2, 6)  # no value: no guessed dims


def test_a_contradicted_output_declaration_is_kept_for_typing_and_dropped_for_running():
    # the model declares y [1, 3] but computes [3, 1]: typing keeps the model's contract (and
    # records the conflict); a runtime asks for what the model computes, as onnxruntime does
    from onnx import TensorProto, helper

    from onnx_quant.inference import infer, infer_values

    g = helper.make_graph([helper.make_node("Transpose", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert [e.rule for e in infer(m).errors] == ["output-type"]
    assert infer_values(m)["y"].shape == (1, 3)
    assert infer_values(m, declared_outputs_win=False)["y"].shape == (3, 1)


def test_shape_values_fold_through_mod_and_or_where():
    # the expansion of Attention computes the GQA interleave factor this way: Mod of head counts,
    # Equal, And / Or, Where; each must fold for the Expand after it to have a shape
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from onnx_quant.inference import infer_values

    c = lambda name, v: helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.int64), name))  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["q"], start=1, end=2), helper.make_node("Shape", ["k"], ["kv"], start=1, end=2),
             c("zero", [0]), c("one", [1]),
             helper.make_node("Mod", ["q", "kv"], ["rem"]), helper.make_node("Mod", ["q", "kv"], ["crem"], fmod=1),
             helper.make_node("Equal", ["rem", "zero"], ["divides"]), helper.make_node("Equal", ["q", "kv"], ["same"]),
             helper.make_node("Not", ["same"], ["differ"]), helper.make_node("And", ["divides", "differ"], ["gqa"]),
             helper.make_node("Or", ["same", "gqa"], ["any"]),
             helper.make_node("Div", ["q", "kv"], ["ratio"]), helper.make_node("Where", ["gqa", "ratio", "one"], ["factor"]),
             helper.make_node("Concat", ["factor", "one"], ["shape"], axis=0),
             helper.make_node("ConstantOfShape", ["shape"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                                       helper.make_tensor_value_info("k", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    v = infer_values(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert v["rem"].value.tolist() == [0] and v["crem"].value.tolist() == [0]
    assert v["gqa"].value.tolist() == [True] and v["any"].value.tolist() == [True]
    assert v["factor"].value.tolist() == [2] and v["y"].shape == (2, 1)

"""If / Loop / Scan bodies and model-local functions are inferred by the pass itself.

Bodies see outer-scope values and get ``value_info``; If merges its branches; Loop and Scan
outputs follow the ONNX spec (loop-carried values, scan outputs with a leading iteration
dim); a function call is typed by inlining its body. Each behaviour is checked against
onnx's own inference where onnx knows a dim, and against onnxruntime running the model.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_quant import inference
from onnx_quant.inference import dims
from onnx_quant.inference.context import TensorInfo
from onnx_quant.inference.dims import Dim
from onnx_quant.errors import InferenceError
from support import models

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
N, H = Dim.symbol("N"), Dim.symbol("H")


def vi(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def make_model(nodes, inputs, outputs, initializers=(), *, opset=21, functions=(), extra_opsets=()):
    return models.make_model(nodes, inputs, outputs, initializers, opset, extra_opsets=extra_opsets,
                             functions=functions, ir_version=10)


def by_name(graph: onnx.GraphProto) -> dict[str, TensorInfo]:
    return {v.name: TensorInfo.from_type_proto(v.type) for v in list(graph.value_info) + list(graph.output)}


def body_of(model: onnx.ModelProto, node_index: int, attr: str) -> onnx.GraphProto:
    return next(a.g for a in model.graph.node[node_index].attribute if a.name == attr)


def run_ort(model, feeds) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def onnx_knows(model) -> dict[str, TensorInfo]:
    out = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    return by_name(out.graph)


def assert_agrees_with_onnx(model):
    """Every dim onnx knows as an int we know the same; element types equal."""
    theirs, mine = onnx_knows(model), by_name(inference.infer_shapes(model, strict=True).graph)
    for name, t in theirs.items():
        m = mine[name]
        assert m.elem_type == t.elem_type, name
        if t.shape is None:
            continue
        assert m.shape is not None and len(m.shape) == len(t.shape), (name, m.shape_text(), t.shape_text())
        for a, b in zip(m.shape, t.shape):
            if isinstance(b, int):
                assert a == b, (name, m.shape_text(), t.shape_text())


# ------------------------------------------------------------------ If
def if_model(then_shape, else_shape, cond_init=None, x_shape=("N", 6)):
    """y = If(c): then Reshape(Relu(x), then_shape) else Reshape(Neg(x), else_shape); x outer."""
    def out(name, shape):  # onnx's checker wants a shape field on declared outputs
        return vi(name, F, [None] * len(shape))

    then = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t_relu"], name="t_relu"),
         helper.make_node("Reshape", ["t_relu", "then_shape"], ["t_out"], name="t_reshape")],
        "then", [], [out("t_out", then_shape)],
        [numpy_helper.from_array(np.array(then_shape, np.int64), "then_shape")])
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e_neg"], name="e_neg"),
         helper.make_node("Reshape", ["e_neg", "else_shape"], ["e_out"], name="e_reshape")],
        "else", [], [out("e_out", else_shape)],
        [numpy_helper.from_array(np.array(else_shape, np.int64), "else_shape")])
    inits = [] if cond_init is None else [numpy_helper.from_array(np.array(cond_init), "c")]
    inputs = [vi("x", F, list(x_shape))] + ([] if cond_init is not None else [vi("c", B, [])])
    nodes = [helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other),
             helper.make_node("Relu", ["y"], ["z"], name="after")]
    rank = len(then_shape) if len(then_shape) == len(else_shape) else None
    return make_model(nodes, inputs, [vi("z", F, None if rank is None else [None] * rank)], inits)


def test_if_branches_see_outer_values_and_get_value_info():
    model = if_model([0, 6], [0, 6])
    out = inference.infer_shapes(model, strict=True)
    assert by_name(out.graph)["z"] == TensorInfo(F, (N, 6))
    then = by_name(body_of(out, 0, "then_branch"))
    assert then["t_relu"] == TensorInfo(F, (N, 6)) and then["t_out"] == TensorInfo(F, (N, 6))
    assert by_name(body_of(out, 0, "else_branch"))["e_neg"] == TensorInfo(F, (N, 6))
    values = inference.infer(model).subgraph_values()
    assert values["'branch' (If)/then_branch"]["t_relu"] == TensorInfo(F, (N, 6))
    onnx.checker.check_model(out, full_check=True)
    assert_agrees_with_onnx(model)


def test_if_merges_branch_types():
    # then [N, 6] -> [N, 2, 3]; else -> [N, 3, 2]: dim 1 and 2 differ, a fresh symbol each
    model = if_model([0, 2, 3], [0, 3, 2])
    y = inference.infer_values(model, strict=True)["y"]
    assert y.elem_type == F and y.shape == (N, Dim.symbol("y_dim1"), Dim.symbol("y_dim2"))
    assert inference.infer_values(model)["z"].shape == y.shape  # consumers keep the symbols
    # different ranks: the rank is unknown
    y = inference.infer_values(if_model([0, 6], [0, 2, 3]))["y"]
    assert y.elem_type == F and y.shape is None
    # onnx knows nothing more than we do
    assert_agrees_with_onnx(if_model([0, 2, 3], [0, 3, 2]))


@pytest.mark.parametrize("cond,expected", [(True, (Dim.symbol("N"), 2, 3)), (False, (Dim.symbol("N"), 3, 2))])
def test_if_with_constant_condition_takes_its_branch(cond, expected):
    model = if_model([0, 2, 3], [0, 3, 2], cond_init=cond)
    assert inference.infer_values(model, strict=True)["y"].shape == expected
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    assert run_ort(model, {"x": x})["z"].shape == tuple(dims.evaluate(d, {"N": 4}) for d in expected)


def test_branch_that_never_runs_is_typed_but_not_blamed():
    # the else branch reshapes [2, 6] to [2, 4]: impossible, but the condition is constant true
    model = if_model([0, 6], [0, 4], cond_init=True, x_shape=(2, 6))
    result = inference.infer(model, strict=True)
    assert result.diagnostics == []
    assert result.ctx["y"].shape == (2, 6)
    # with a runtime condition the same branch is a problem, named by its path
    found = inference.check_model(if_model([0, 6], [0, 4], x_shape=(2, 6)))
    assert [(d.node, d.rule) for d in found] == [("'branch' (If)/else_branch/'e_reshape' (Reshape)", "Reshape")]
    with pytest.raises(InferenceError) as e:
        inference.infer(if_model([0, 6], [0, 4], x_shape=(2, 6)), strict=True)
    assert "'branch' (If)/else_branch/'e_reshape' (Reshape)" in str(e.value)


# ------------------------------------------------------------------ Loop
def loop_model(*, trip_count=5, with_cond=False, grow=False):
    """Loop carrying acc [N, 4] (acc + x each step) and scanning out acc * i.

    ``grow``: a second carried value gains a row per iteration (Concat)."""
    body_nodes = [
        helper.make_node("Add", ["acc_in", "x"], ["acc_out"], name="accumulate"),   # x from the outer scope
        helper.make_node("Cast", ["i"], ["i_f"], to=F, name="cast_i"),
        helper.make_node("Mul", ["acc_out", "i_f"], ["scan_out"], name="scale"),
        helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going"),
    ]
    body_inputs = [vi("i", I64, []), vi("cond_in", B, []), vi("acc_in", F, None)]
    body_outputs = [vi("cond_out", B, []), vi("acc_out", F, None)]
    loop_inputs = ["M" if trip_count is not None else "", "cond" if with_cond else "", "acc0"]
    loop_outputs = ["acc_final"]
    if grow:
        body_nodes.append(helper.make_node("Concat", ["rows_in", "one_row"], ["rows_out"], axis=0, name="grow"))
        body_inputs.append(vi("rows_in", F, None))
        body_outputs.append(vi("rows_out", F, None))
        loop_inputs.append("rows0")
        loop_outputs.append("rows_final")
    body_outputs.append(vi("scan_out", F, None))
    loop_outputs.append("scanned")
    body = helper.make_graph(body_nodes, "body", body_inputs, body_outputs)
    inits = [numpy_helper.from_array(np.zeros((1, 4), np.float32), "one_row"),
             numpy_helper.from_array(np.zeros((2, 4), np.float32), "rows0")]
    if trip_count is not None:
        inits.append(numpy_helper.from_array(np.array(trip_count, np.int64), "M"))
    if with_cond:
        inits.append(numpy_helper.from_array(np.array(True), "cond"))
    nodes = [helper.make_node("Relu", ["x"], ["acc0"], name="start"),
             helper.make_node("Loop", loop_inputs, loop_outputs, name="loop", body=body)]
    return make_model(nodes, [vi("x", F, ["N", 4])], [vi(o, F, None) for o in loop_outputs], inits)


def test_loop_carried_and_scan_outputs():
    model = loop_model()
    out = inference.infer_shapes(model, strict=True)
    values = by_name(out.graph)
    assert values["acc_final"] == TensorInfo(F, (N, 4))
    assert values["scanned"] == TensorInfo(F, (5, N, 4))  # M is a constant and there is no cond
    body = by_name(body_of(out, 1, "body"))
    assert body["acc_out"] == TensorInfo(F, (N, 4)) and body["i_f"] == TensorInfo(F, ())
    assert body["scan_out"] == TensorInfo(F, (N, 4))
    onnx.checker.check_model(out, full_check=True)
    assert_agrees_with_onnx(model)
    x = np.ones((3, 4), np.float32)
    got = run_ort(model, {"x": x})
    assert got["scanned"].shape == (5, 3, 4) and got["acc_final"].shape == (3, 4)


def test_loop_iteration_dim_is_a_symbol_when_the_loop_may_stop_early():
    model = loop_model(trip_count=None, with_cond=True)
    scanned = inference.infer_values(model, strict=True)["scanned"]
    assert scanned.shape == (Dim.symbol("loop_iterations"), N, 4)
    # a constant true condition that the body passes on unchanged: still the body decides
    model = loop_model(trip_count=3, with_cond=True)
    assert inference.infer_values(model)["scanned"].shape[0] == Dim.symbol("loop_iterations")


def test_loop_carried_value_that_grows_gets_a_fresh_dim():
    model = loop_model(grow=True)
    values = inference.infer_values(model, strict=True)
    assert values["rows_final"] == TensorInfo(F, (Dim.symbol("rows_final_dim0"), 4))
    assert values["acc_final"] == TensorInfo(F, (N, 4))
    got = run_ort(model, {"x": np.ones((2, 4), np.float32)})
    assert got["rows_final"].shape == (7, 4)  # 2 + 5 rows: what the symbol stands for
    assert_agrees_with_onnx(model)


# ------------------------------------------------------------------ Scan
def scan_model(*, output_axis=0, input_axis=0):
    """Running sum over the scan axis of seq [T, N, 3] (or axis 1), scanning out each sum."""
    body = helper.make_graph(
        [helper.make_node("Add", ["sum_in", "item"], ["sum_out"], name="add"),
         helper.make_node("Identity", ["sum_out"], ["each"], name="copy")],
        "body", [vi("sum_in", F, None), vi("item", F, None)], [vi("sum_out", F, None), vi("each", F, None)])
    seq_shape = ["T", "N", 3] if input_axis == 0 else ["N", "T", 3]
    nodes = [helper.make_node("Scan", ["init", "seq"], ["total", "sums"], name="scan", body=body, num_scan_inputs=1,
                              scan_input_axes=[input_axis], scan_output_axes=[output_axis])]
    return make_model(nodes, [vi("init", F, ["N", 3]), vi("seq", F, seq_shape)],
                      [vi("total", F, None), vi("sums", F, None)])


@pytest.mark.parametrize("input_axis,output_axis,expected", [
    (0, 0, ("T", "N", 3)), (1, 0, ("T", "N", 3)), (0, 1, ("N", "T", 3)), (0, -1, ("N", 3, "T"))])
def test_scan_outputs(input_axis, output_axis, expected):
    model = scan_model(input_axis=input_axis, output_axis=output_axis)
    out = inference.infer_shapes(model, strict=True)
    values = by_name(out.graph)
    assert values["total"] == TensorInfo(F, (N, 3))
    assert values["sums"].shape == tuple(Dim.symbol(d) if isinstance(d, str) else d for d in expected)
    assert by_name(body_of(out, 0, "body"))["sum_out"] == TensorInfo(F, (N, 3))
    env = {"N": 2, "T": 5}
    seq = np.ones((5, 2, 3) if input_axis == 0 else (2, 5, 3), np.float32)
    got = run_ort(model, {"init": np.zeros((2, 3), np.float32), "seq": seq})
    assert got["sums"].shape == tuple(dims.evaluate(d, env) for d in values["sums"].shape)
    assert_agrees_with_onnx(model)


def test_scan_axis_out_of_range_is_reported():
    model = scan_model(output_axis=5)
    [d] = inference.infer(model).diagnostics
    assert d.rule == "control-flow.axis" and d.node == "'scan' (Scan)" and "scan_output_axes[0]" in d.message


# ------------------------------------------------------------------ nesting and diagnostics
def test_nested_bodies_get_value_info_and_problems_name_the_path():
    inner_then = helper.make_graph([helper.make_node("Add", ["acc_in", "bad"], ["t"], name="bad_add")], "then", [],
                                   [vi("t", F, None)])
    inner_else = helper.make_graph([helper.make_node("Identity", ["acc_in"], ["e"], name="same")], "else", [],
                                   [vi("e", F, None)])
    body = helper.make_graph(
        [helper.make_node("If", ["cond_in"], ["acc_out"], name="inner", then_branch=inner_then, else_branch=inner_else),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", I64, []), vi("cond_in", B, []), vi("acc_in", F, None)],
        [vi("cond_out", B, []), vi("acc_out", F, None)])
    nodes = [helper.make_node("Loop", ["M", "", "x"], ["y"], name="outer", body=body)]
    inits = [numpy_helper.from_array(np.array(2, np.int64), "M"),
             numpy_helper.from_array(np.zeros(7, np.int64), "bad")]
    model = make_model(nodes, [vi("x", F, ["N", 7])], [vi("y", F, None)], inits)
    [d] = inference.infer(model).diagnostics
    assert d.node == "'outer' (Loop)/body/'inner' (If)/then_branch/'bad_add' (Add)"
    out = inference.infer_shapes(model)
    inner = next(a.g for a in body_of(out, 0, "body").node[0].attribute if a.name == "else_branch")
    assert by_name(inner)["e"] == TensorInfo(F, (N, 7))


def test_a_model_given_as_bytes_is_typed_in_place_exactly_as_a_copy_would_be():
    # infer_shapes types a model it parsed itself in place (no weight copy): the result must
    # not differ from the copy it returns for a ModelProto, bodies and old value_info included
    model = if_model([0, 6], [0, 6])
    noted = inference.infer_shapes(model)  # value_info in every body now: the in-place path keeps them
    for source in (model, noted):
        before = source.SerializeToString()
        copied = inference.infer_shapes(source)
        assert source.SerializeToString() == before  # a ModelProto is never touched
        in_place = inference.infer_shapes(before)
        assert in_place.SerializeToString() == copied.SerializeToString()
        assert by_name(body_of(in_place, 0, "then_branch"))["t_relu"] == TensorInfo(F, (N, 6))


def test_unknown_domain_inside_a_body_is_unknown_lenient_and_an_error_strict():
    body = helper.make_graph([helper.make_node("Mystery", ["x"], ["t"], domain="com.example", name="m")], "then", [],
                             [vi("t", F, None)])
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["e"])], "else", [], [vi("e", F, None)])
    nodes = [helper.make_node("If", ["c"], ["y"], name="branch", then_branch=body, else_branch=other)]
    model = make_model(nodes, [vi("c", B, []), vi("x", F, [2])], [vi("y", F, None)], extra_opsets=[("com.example", 1)])
    result = inference.infer(model)
    assert result.diagnostics == []
    assert result.ctx["y"] == TensorInfo(F, None)  # one branch unknown: the rank is unknown
    with pytest.raises(InferenceError) as e:
        inference.infer(model, strict=True)
    assert e.value.rule == "unknown-op" and "'branch' (If)/then_branch/'m' (Mystery)" in str(e.value)


# ------------------------------------------------------------------ model-local functions
def scaled_act():
    """local::ScaledAct(X, B?) = LeakyRelu(X * scale, alpha=@alpha) (+ B when given); alpha
    defaults to 0.5, a Constant's value comes from the attribute ``scale``."""
    return helper.make_function(
        "local", "ScaledAct", ["X", "B"], ["Y", "S"],
        [helper.make_node("Constant", [], ["s"], value_float=2.0),
         helper.make_node("Mul", ["X", "s"], ["xs"]),
         onnx.NodeProto(op_type="LeakyRelu", input=["xs"], output=["act"],
                        attribute=[onnx.AttributeProto(name="alpha", ref_attr_name="alpha", type=onnx.AttributeProto.FLOAT)]),
         helper.make_node("Add", ["act", "B"], ["Y"]),
         helper.make_node("Shape", ["Y"], ["S"])],
        opset_imports=[helper.make_opsetid("", 21)], attributes=[],
        attribute_protos=[helper.make_attribute("alpha", 0.5)])


def test_function_calls_are_inlined_with_symbolic_dims():
    nodes = [helper.make_node("ScaledAct", ["x", "b"], ["y", "s"], domain="local", name="call", alpha=0.1),
             helper.make_node("ScaledAct", ["y", "b"], ["z", ""], domain="local", name="again"),
             helper.make_node("Relu", ["z"], ["out"])]
    model = make_model(nodes, [vi("x", F, ["N", 1, "H"]), vi("b", F, [5, 1])], [vi("out", F, None), vi("s", I64, None)],
                       functions=[scaled_act()], extra_opsets=[("local", 1)])
    result = inference.infer(model, strict=True)
    assert result.ctx["y"] == TensorInfo(F, (N, 5, H))
    assert result.ctx["s"] == TensorInfo(I64, (3,))
    assert result.ctx["out"] == TensorInfo(F, (N, 5, H))
    assert result.typed_by["y"] == "function local::ScaledAct"
    assert [r.source for r in result.nodes] == ["function", "function", "rule"]
    assert_agrees_with_onnx(model)
    got = run_ort(model, {"x": np.ones((2, 1, 3), np.float32), "b": np.ones((5, 1), np.float32)})
    assert got["out"].shape == (2, 5, 3)


def test_function_attribute_references_are_resolved():
    # a body attribute referencing a function attribute: the call's value, else the default
    fn = helper.make_function(
        "local", "Pick", ["X"], ["Y"],
        [onnx.NodeProto(op_type="Flatten", input=["X"], output=["Y"],
                        attribute=[onnx.AttributeProto(name="axis", ref_attr_name="where", type=onnx.AttributeProto.INT)])],
        opset_imports=[helper.make_opsetid("", 21)], attributes=[], attribute_protos=[helper.make_attribute("where", 2)])
    nodes = [helper.make_node("Pick", ["x"], ["given"], domain="local", where=1),
             helper.make_node("Pick", ["x"], ["default"], domain="local")]
    model = make_model(nodes, [vi("x", F, [2, 3, 4])], [vi("given", F, None), vi("default", F, None)],
                       functions=[fn], extra_opsets=[("local", 1)])
    values = inference.infer_values(model, strict=True)
    assert values["given"].shape == (2, 12) and values["default"].shape == (6, 4)
    assert_agrees_with_onnx(model)


def test_function_omitted_optional_input_is_absent_inside():
    # Clip(X, min?, max?) wrapped: the call leaves max out, inside it is an absent input
    fn = helper.make_function("local", "Clamp", ["X", "lo", "hi"], ["Y"],
                              [helper.make_node("Clip", ["X", "lo", "hi"], ["Y"])],
                              opset_imports=[helper.make_opsetid("", 21)], attributes=[])
    nodes = [helper.make_node("Clamp", ["x", "zero"], ["y"], domain="local", name="clamp")]
    model = make_model(nodes, [vi("x", F, ["N"])], [vi("y", F, None)],
                       [numpy_helper.from_array(np.array(0, np.float32), "zero")], functions=[fn],
                       extra_opsets=[("local", 1)])
    assert inference.infer(model, strict=True).ctx["y"] == TensorInfo(F, (N,))


def test_function_uses_its_own_opset_and_nested_calls():
    inner = helper.make_function("local", "Inner", ["X"], ["Y"], [helper.make_node("Gelu", ["X"], ["Y"])],
                                 opset_imports=[helper.make_opsetid("", 20)], attributes=[])
    outer = helper.make_function("local", "Outer", ["X"], ["Y"],
                                 [helper.make_node("Inner", ["X"], ["t"], domain="local"),
                                  helper.make_node("Transpose", ["t"], ["Y"], perm=[1, 0])],
                                 opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("local", 1)],
                                 attributes=[])
    # the model itself imports opset 18 (no Gelu there): the function's opset 20 selects it
    model = make_model([helper.make_node("Outer", ["x"], ["y"], domain="local")], [vi("x", F, ["N", 3])],
                       [vi("y", F, None)], opset=18, functions=[inner, outer], extra_opsets=[("local", 1)])
    result = inference.infer(model, strict=True)
    assert result.ctx["y"] == TensorInfo(F, (3, N))


def test_recursive_function_is_reported_not_expanded_forever():
    loop = helper.make_function("local", "Forever", ["X"], ["Y"], [helper.make_node("Forever", ["X"], ["Y"], domain="local")],
                                opset_imports=[helper.make_opsetid("local", 1)], attributes=[])
    model = make_model([helper.make_node("Forever", ["x"], ["y"], domain="local", name="call")], [vi("x", F, [2])],
                       [vi("y", F, None)], functions=[loop], extra_opsets=[("local", 1)])
    found = inference.infer(model).diagnostics
    assert [d.rule for d in found] == ["function-recursion"]
    assert found[0].node == "'call' (Forever)/#0 (Forever)"
    with pytest.raises(InferenceError, match="function-recursion"):
        inference.infer(model, strict=True)


def test_problem_inside_a_function_names_the_call():
    fn = helper.make_function("local", "Bad", ["X"], ["Y"], [helper.make_node("MatMul", ["X", "X"], ["Y"], name="mm")],
                              opset_imports=[helper.make_opsetid("", 21)], attributes=[])
    model = make_model([helper.make_node("Bad", ["x"], ["y"], domain="local", name="call")], [vi("x", F, [2, 3])],
                       [vi("y", F, None)], functions=[fn], extra_opsets=[("local", 1)])
    [d] = inference.infer(model).diagnostics
    assert d.node == "'call' (Bad)/'mm' (MatMul)"


def test_loop_carrying_a_sequence():
    seq_type = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None))
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["i_f"], to=F),
         helper.make_node("Unsqueeze", ["i_f", "axes"], ["row"]),
         helper.make_node("SequenceInsert", ["seq_in", "row"], ["seq_out"], name="insert")],
        "body", [vi("i", I64, []), vi("cond_in", B, []), helper.make_value_info("seq_in", seq_type)],
        [vi("cond_out", B, []), helper.make_value_info("seq_out", seq_type)],
        [numpy_helper.from_array(np.array([0], np.int64), "axes")])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=F),
             helper.make_node("Loop", ["M", "", "empty"], ["rows"], name="loop", body=body)]
    model = make_model(nodes, [], [helper.make_value_info("rows", seq_type)],
                       [numpy_helper.from_array(np.array(3, np.int64), "M")])
    result = inference.infer(model, strict=True)
    rows = result.other_types["rows"]
    assert rows.sequence_type.elem_type.tensor_type.elem_type == F
    body_values = result.subgraph_values()["'loop' (Loop)/body"]
    assert body_values["row"] == TensorInfo(F, (1,))
    out = inference.infer_shapes(model)
    seq_out = next(v for v in body_of(out, 1, "body").output if v.name == "seq_out")
    assert seq_out.type.HasField("sequence_type")

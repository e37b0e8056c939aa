"""Case splitting on an If whose branches differ in rank (``inference.case_split``): torch's
"squeeze if this dim is 1" If, followed by what asks for the rank again or needs one rank.
Checked against onnx.reference's runs at sizes that take each branch."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnx_quant import inference
from onnx_quant.inference import case_split, dims, engine
from support.models import make_model
from support.oracles import ref_run


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def _squeeze_if(x: str, out: str) -> list:
    """``out = x.squeeze(-1)`` as torch exports it for a dim it cannot see."""
    then = helper.make_graph([_const(f"{out}_axes", np.array([-1], np.int64)),
                              helper.make_node("Squeeze", [x, f"{out}_axes"], [f"{out}_sq"])],
                             "then", [], [helper.make_tensor_value_info(f"{out}_sq", T.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Identity", [x], [f"{out}_id"])], "else", [],
                              [helper.make_tensor_value_info(f"{out}_id", T.FLOAT, None)])
    return [helper.make_node("Shape", [x], [f"{out}_shape"]), _const(f"{out}_last", np.array([-1], np.int64)),
            helper.make_node("Gather", [f"{out}_shape", f"{out}_last"], [f"{out}_dim"], axis=0),
            _const(f"{out}_one", np.array([1], np.int64)),
            helper.make_node("Equal", [f"{out}_dim", f"{out}_one"], [f"{out}_eq"]),
            helper.make_node("Squeeze", [f"{out}_eq"], [f"{out}_cond"]),
            helper.make_node("If", [f"{out}_cond"], [out], then_branch=then, else_branch=other)]


def _model(tail: list, outputs: list, inits=()):
    return make_model(_squeeze_if("x", "s") + tail, [("x", T.FLOAT, ["N", 4, "L"])], outputs, inits)


def _rank_back():
    """The rank asked again (``Size(Shape(s)) == 2``) and the axis put back: rank 3 either way."""
    then = helper.make_graph([_const("ax", np.array([2], np.int64)), helper.make_node("Unsqueeze", ["s", "ax"], ["u"])],
                             "then", [], [helper.make_tensor_value_info("u", T.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Identity", ["s"], ["v"])], "else", [],
                              [helper.make_tensor_value_info("v", T.FLOAT, None)])
    tail = [helper.make_node("Shape", ["s"], ["ss"]), helper.make_node("Size", ["ss"], ["rank"]),
            _const("two", np.array(2, np.int64)), helper.make_node("Equal", ["rank", "two"], ["unbatched"]),
            helper.make_node("If", ["unbatched"], ["z"], then_branch=then, else_branch=other),
            helper.make_node("Relu", ["z"], ["y"])]
    return _model(tail, ["y"])


def test_what_follows_a_rank_split_is_typed_in_each_case_and_merged():
    result = inference.infer(_rank_back(), strict=True)
    assert result.ctx["s"].shape is None  # the squeeze If's own output: rank 2 or 3, by the data
    y = result.ctx["y"].shape
    assert y[:2] == (dims.parse("N"), 4) and len(y) == 3 and isinstance(y[2], dims.Dim)
    for length in (1, 5):
        [got] = ref_run(_rank_back(), {"x": np.ones((2, 4, length), np.float32)}, ["y"])
        assert got.ndim == 3 and got.shape[:2] == (2, 4)


def test_a_case_in_which_the_model_cannot_run_is_left_out():
    """Gemm takes rank 2 only: the rank-3 branch (last dim not 1) cannot run, so the model runs
    where that dim is 1 and everything after it has that case's type."""
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    model = _model([helper.make_node("Gemm", ["s", "w"], ["g"]), helper.make_node("Relu", ["g"], ["y"])], ["y"], [w])
    result = inference.infer(model)
    assert result.errors == []
    assert result.ctx["y"].shape == (dims.parse("N"), 3)
    [got] = ref_run(model, {"x": np.ones((2, 4, 1), np.float32)}, ["y"])
    assert got.shape == (2, 3)
    with pytest.raises(Exception):  # the case left out: no runtime runs it either
        ref_run(model, {"x": np.ones((2, 4, 5), np.float32)}, ["y"])


def test_no_other_run_without_such_an_if(monkeypatch):
    runs = []
    monkeypatch.setattr(engine.Pass, "_forced_run", lambda self, *a: runs.append(a) or (None, []))
    same_rank = _model([helper.make_node("Relu", ["s"], ["y"])], ["y"])
    inference.infer(make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", T.FLOAT, ["N", 3])], ["y"]))
    assert runs == []
    inference.infer(same_rank, input_shapes={"x": (2, 4, 1)})  # the condition folds: nothing to split
    assert runs == []


def _constant_ifs():
    """The rank-split model followed by two Ifs on a constant condition: the branch that never
    runs reads ``x`` (fully typed in the first run) in one, ``s`` (rank unknown there) in the
    other."""
    def branch(op, src, out):
        return helper.make_graph([helper.make_node(op, [src], [out])], op, [],
                                 [helper.make_tensor_value_info(out, T.FLOAT, None)])

    model = _rank_back()
    graph = model.graph
    graph.node.extend([
        _const("yes", np.array(True)),
        helper.make_node("If", ["yes"], ["a"], then_branch=branch("Relu", "x", "a_then"),
                         else_branch=branch("Neg", "x", "a_else")),
        helper.make_node("If", ["yes"], ["b"], then_branch=branch("Relu", "y", "b_then"),
                         else_branch=branch("Neg", "s", "b_else"))])
    graph.output.extend([helper.make_tensor_value_info("a", T.FLOAT, None), helper.make_tensor_value_info("b", T.FLOAT, None)])
    return model


def test_a_case_run_reuses_a_never_run_branch_the_first_run_typed_fully(monkeypatch):
    seen = {}
    settled = case_split.FirstBodies.settled

    def spy(self, key):
        got = settled(self, key)
        seen[key] = got
        return got

    monkeypatch.setattr(case_split.FirstBodies, "settled", spy)
    reused = inference.infer_shapes(_constant_ifs(), strict=True)
    by_node = {step[0]: g for (_, step), g in seen.items() if step[1] == "else_branch"}
    nodes = list(_constant_ifs().graph.node)
    a_node, b_node = (next(i for i, n in enumerate(nodes) if n.output[0] == out) for out in ("a", "b"))
    assert by_node[a_node] is not None  # Neg(x): typed fully in the first run, not walked again
    assert by_node[b_node] is None      # Neg(s): s has no rank there, the cases may type it
    # the same answer as walking every never-run branch again in each case
    monkeypatch.setattr(case_split.FirstBodies, "settled", lambda self, key: None)
    walked = inference.infer_shapes(_constant_ifs(), strict=True)
    assert reused.SerializeToString() == walked.SerializeToString()
    body = next(a.g for a in reused.graph.node[a_node].attribute if a.name == "else_branch")
    assert len(body.output[0].type.tensor_type.shape.dim) == 3  # the reused branch is written back

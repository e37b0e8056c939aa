"""Fresh, distinct symbols: anonymous graph-input dims (no value, ``?``, ``-1``, ``None``) become
``<input>_dim<axis>``; data-dependent output dims (NonZero, Unique, Compress, NonMaxSuppression,
TopK with a K known only at run time) become ``<output>_dim<axis>``; both are written back as
``dim_param``, and two such dims are never the same symbol."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_quant import inference
from onnx_quant.errors import InferenceError
from onnx_quant.inference import dims
from support.models import make_model as _model

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _input_with_dims(*dim_protos) -> onnx.ValueInfoProto:
    """A float input whose dims are given as ('value', v), ('param', text) or None (anonymous)."""
    vi = helper.make_tensor_value_info("x", F, None)
    shape = vi.type.tensor_type.shape
    shape.SetInParent()
    for d in dim_protos:
        dim = shape.dim.add()
        if d is not None:
            setattr(dim, "dim_value" if d[0] == "value" else "dim_param", d[1])
    return vi


def _paddle_model() -> onnx.ModelProto:
    """x [?, 3, ?, -1] -> Relu -> Transpose: each anonymous dim is its own."""
    x = _input_with_dims(("param", "?"), ("value", 3), ("param", "?"), ("value", -1))
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Transpose", ["r"], ["y"], perm=[3, 2, 1, 0])]
    return _model(nodes, [x], [helper.make_tensor_value_info("y", F, None)])


def test_anonymous_input_dims_become_distinct_symbols_named_after_input_and_axis():
    values = inference.infer_values(_paddle_model(), strict=True)
    assert values["x"].shape == (dims.parse("x_dim0"), 3, dims.parse("x_dim2"), dims.parse("x_dim3"))
    assert values["y"].shape == (dims.parse("x_dim3"), dims.parse("x_dim2"), 3, dims.parse("x_dim0"))


@pytest.mark.parametrize("dim", [None, ("param", "?"), ("param", "None"), ("param", "-1"), ("value", -1)])
def test_every_way_of_writing_unknown_is_anonymous(dim):
    x = _input_with_dims(("param", "N"), dim)
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [x], [helper.make_tensor_value_info("y", F, None)])
    assert inference.infer_values(model, strict=True)["y"].shape == (dims.parse("N"), dims.parse("x_dim1"))


def test_fresh_symbols_are_written_back_as_dim_param():
    written = inference.infer_shapes(_paddle_model(), strict=True)
    out = written.graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in out] == ["x_dim3", "x_dim2", 3, "x_dim0"]


def test_two_question_marks_bind_independently():
    values = inference.infer_values(_paddle_model(), {"x": (2, 3, 48, 192)}, strict=True)
    assert values["y"].shape == (192, 48, 3, 2)


def test_a_fixed_dim_still_refuses_another_value():
    with pytest.raises(InferenceError, match="input-shapes"):
        inference.infer_values(_paddle_model(), {"x": (2, 4, 48, 192)}, strict=True)


def test_a_graph_output_declared_with_question_marks_takes_the_inferred_dims():
    model = _paddle_model()
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", F, ["?", "?", 3, "?"]))
    assert inference.infer_values(model, strict=True)["y"].shape[0] == dims.parse("x_dim3")


def _nonzero_twice() -> onnx.ModelProto:
    nodes = [helper.make_node("NonZero", ["x"], ["a"]), helper.make_node("NonZero", ["x"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1)]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [4, 5])],
                  [helper.make_tensor_value_info("c", I64, None)])


def test_nonzero_count_is_a_fresh_symbol_per_node_not_shared_through_the_memo():
    values = inference.infer_values(_nonzero_twice(), strict=True)
    a, b = dims.parse("a_dim1"), dims.parse("b_dim1")
    assert values["a"].shape == (2, a) and values["b"].shape == (2, b)
    assert values["c"].shape == (2, dims.add(a, b))


def test_nonzero_of_a_known_value_counts_it():
    cond = numpy_helper.from_array(np.array([[1, 0, 2], [0, 0, 3]], np.int64), "cond")
    model = _model([helper.make_node("NonZero", ["cond"], ["nz"])], [], [helper.make_tensor_value_info("nz", I64, None)], [cond])
    assert inference.infer_values(model, strict=True)["nz"].shape == (2, 3)


def test_unique_outputs_share_one_fresh_count():
    model = _model([helper.make_node("Unique", ["x"], ["y", "idx", "inv", "counts"], axis=1)],
                   [helper.make_tensor_value_info("x", F, [2, 6, 3])],
                   [helper.make_tensor_value_info(n, F if n == "y" else I64, None) for n in ("y", "idx", "inv", "counts")])
    values = inference.infer_values(model, strict=True)
    u = dims.parse("y_dim1")
    assert values["y"].shape == (2, u, 3)
    assert values["idx"].shape == values["counts"].shape == (u,)
    assert values["inv"].shape == (6,)
    flat = _model([helper.make_node("Unique", ["x"], ["y", "idx", "inv"])], [helper.make_tensor_value_info("x", F, [2, 6])],
                  [helper.make_tensor_value_info("inv", I64, None)])
    values = inference.infer_values(flat, strict=True)
    assert values["y"].shape == (dims.parse("y_dim0"),) and values["inv"].shape == (12,)


def test_topk_with_a_data_dependent_k_gets_a_fresh_dim_and_a_shape_value_k_its_expression():
    k_from_data = [helper.make_node("ReduceMax", ["ks"], ["kmax"], keepdims=1),
                   helper.make_node("TopK", ["x", "kmax"], ["v", "i"], axis=1)]
    k_from_shape = [helper.make_node("Shape", ["x"], ["shp"], start=1, end=2),
                    helper.make_node("Min", ["shp", "eight"], ["k"]),
                    helper.make_node("TopK", ["x", "k"], ["v2", "i2"], axis=1)]
    eight = numpy_helper.from_array(np.array([8], np.int64), "eight")
    model = _model(k_from_data + k_from_shape,
                   [helper.make_tensor_value_info("x", F, ["N", "B"]), helper.make_tensor_value_info("ks", I64, [3])],
                   [helper.make_tensor_value_info(n, F, None) for n in ("v", "v2")], [eight])
    values = inference.infer_values(model, strict=True)
    assert values["v"].shape == values["i"].shape == (dims.parse("N"), dims.parse("v_dim1"))
    k = values["v2"].shape[1]
    assert [dims.evaluate(k, {"B": b}) for b in (3, 8, 20)] == [3, 8, 8]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    v2 = sess.run(["v2"], {"x": x, "ks": np.array([1, 2, 1], np.int64)})[0]
    assert v2.shape == (2, dims.evaluate(k, {"B": 5}))


def test_compress_and_non_max_suppression_counts_are_fresh():
    nodes = [helper.make_node("Compress", ["x", "cond"], ["kept"], axis=0),
             helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["sel"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [5, 2]), helper.make_tensor_value_info("cond", TensorProto.BOOL, [5]),
                           helper.make_tensor_value_info("boxes", F, [1, 6, 4]), helper.make_tensor_value_info("scores", F, [1, 1, 6])],
                   [helper.make_tensor_value_info(n, F if n == "kept" else I64, None) for n in ("kept", "sel")])
    values = inference.infer_values(model, strict=True)
    assert values["kept"].shape == (dims.parse("kept_dim0"), 2)
    assert values["sel"].shape == (dims.parse("sel_dim0"), 3)

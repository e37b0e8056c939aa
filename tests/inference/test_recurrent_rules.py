"""RNN, GRU, LSTM and com.microsoft DynamicQuantizeLSTM: shapes against onnx's own inference
(ai.onnx ops, every layout and direction) and onnxruntime's run (DynamicQuantizeLSTM, from
``quantize_dynamic``), symbolic dims through, and bad weights named."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_quant import inference, model_zoo
from onnx_quant.errors import InferenceError
from onnx_quant.inference import dims
from onnx_quant.inference.context import TensorInfo
from onnx_quant.oracles import widen_u8s8

F = TensorProto.FLOAT
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
SEQ, BATCH, INPUT, HIDDEN = 5, 3, 4, 6


def _model(op: str, direction: str, layout: int, x_shape, *, opset: int = 22, hidden_attr: bool = True,
           w_rows: int | None = None) -> onnx.ModelProto:
    d = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((d, w_rows or g * HIDDEN, INPUT)).astype(np.float32), "W")
    r = numpy_helper.from_array(rng.standard_normal((d, g * HIDDEN, HIDDEN)).astype(np.float32), "R")
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    attrs = {"direction": direction, **({"hidden_size": HIDDEN} if hidden_attr else {})}
    if layout:
        attrs["layout"] = 1
    node = helper.make_node(op, ["X", "W", "R"], outs, name="rnn", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", F, x_shape)],
                              [helper.make_tensor_value_info(o, F, None) for o in outs], [w, r])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_shapes_match_onnx_and_onnxruntime(op, direction, layout):
    x_shape = (BATCH, SEQ, INPUT) if layout else (SEQ, BATCH, INPUT)
    model = _model(op, direction, layout, x_shape)
    mine = inference.infer_values(model, strict=True)
    theirs = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    declared = {v.name: TensorInfo.from_type_proto(v.type) for v in theirs.graph.output}
    x = np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)
    if layout:  # onnxruntime's CPU kernels refuse layout 1: onnx's reference runs it
        ran = ReferenceEvaluator(model).run(None, {"X": x})
    else:
        ran = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    for v, array in zip(model.graph.output, ran):
        assert mine[v.name].shape == declared[v.name].shape == array.shape, v.name
        assert mine[v.name].elem_type == F


def test_hidden_size_is_read_from_r_without_the_attribute_and_symbols_go_through():
    model = _model("LSTM", "bidirectional", 0, ["T", "N", INPUT], hidden_attr=False)
    values = inference.infer_values(model, strict=True)
    t, n = dims.parse("T"), dims.parse("N")
    assert values["Y"].shape == (t, 2, n, HIDDEN)
    assert values["Y_h"].shape == values["Y_c"].shape == (2, n, HIDDEN)


def test_layout_before_opset_14_is_not_read():
    model = _model("GRU", "forward", 0, (SEQ, BATCH, INPUT), opset=13)
    assert inference.infer_values(model, strict=True)["Y"].shape == (SEQ, 1, BATCH, HIDDEN)


def test_weights_that_do_not_fit_are_named():
    model = _model("LSTM", "forward", 0, (SEQ, BATCH, INPUT), w_rows=3 * HIDDEN)
    with pytest.raises(InferenceError, match=r"LSTM.shape: node 'rnn' \(LSTM\): input W: W dim 1 must be 4 \* hidden_size.*expected 24"):
        inference.infer_values(model, strict=True)
    bad_x = _model("RNN", "forward", 0, (SEQ, BATCH, INPUT + 1))
    with pytest.raises(InferenceError, match=r"RNN.shape: node 'rnn' \(RNN\): input X: X dim 2 must be the input size of W.*expected 4"):
        inference.infer_values(bad_x, strict=True)
    bad_dir = _model("RNN", "forward", 0, (SEQ, BATCH, INPUT))
    bad_dir.graph.node[0].attribute[0].s = b"sideways"
    with pytest.raises(InferenceError, match=r"RNN.direction: .*expected forward, reverse or bidirectional"):
        inference.infer_values(bad_dir, strict=True)


@pytest.fixture(scope="module")
def dynamic_lstm() -> onnx.ModelProto:
    """An LSTM (bidirectional, initial states given) through ``quantize_dynamic``."""
    logging.getLogger().setLevel(logging.ERROR)
    model = _model("LSTM", "bidirectional", 0, ["T", "N", INPUT])
    return model_zoo.run_quantizer(model, model, [], "dynamic")


def test_dynamic_quantize_lstm_matches_onnxruntime(dynamic_lstm):
    node = dynamic_lstm.graph.node[0]
    assert (node.domain, node.op_type) == ("com.microsoft", "DynamicQuantizeLSTM")
    values = inference.infer_values(dynamic_lstm, strict=True)
    assert values["Y"].shape == (dims.parse("T"), 2, dims.parse("N"), HIDDEN)
    sess = ort.InferenceSession(widen_u8s8(dynamic_lstm).model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(2).standard_normal((7, 2, INPUT)).astype(np.float32)
    concrete = inference.infer_values(dynamic_lstm, {"X": x.shape}, strict=True)
    for v, array in zip(dynamic_lstm.graph.output, sess.run(None, {"X": x})):
        assert concrete[v.name].shape == array.shape, v.name


def test_dynamic_quantize_lstm_refuses_float_weights(dynamic_lstm):
    bad = onnx.ModelProto()
    bad.CopyFrom(dynamic_lstm)
    w = next(t for t in bad.graph.initializer if t.name == bad.graph.node[0].input[1])
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w).astype(np.float32), w.name))
    with pytest.raises(InferenceError, match=r"DynamicQuantizeLSTM.weight-type: .*W must be quantized.*found float"):
        inference.infer_values(bad, strict=True)

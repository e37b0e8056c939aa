"""Whole-model inference on real quantized models: float models built with ``onnx.helper``
(a ResNet-like CNN, an MLP, a transformer block; symbolic batch, and H/W for the CNN)
quantized by ``onnxruntime.quantization`` (QOperator and QDQ, per tensor and per channel;
dynamic). Every value must get an element type and a shape of known rank, symbolic dims
must evaluate to what onnxruntime computes, and where onnx's own pass knows a dim we agree.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from onnx_quant import inference
from onnx_quant.inference import dims
from onnx_quant.inference.context import TensorInfo
from onnx_quant import model_zoo
from onnx_quant.oracles import widen_u8s8

#: (family, format, per_channel) of every model under test
CONFIGS = [
    ("cnn", "qoperator", False), ("cnn", "qoperator", True), ("cnn", "qdq", False), ("cnn", "qdq", True),
    ("cnn", "dynamic", False),
    ("mlp", "qoperator", False), ("mlp", "qdq", True), ("mlp", "dynamic", False),
    ("transformer", "qoperator", False), ("transformer", "qdq", True), ("transformer", "dynamic", False),
]
IDS = [f"{f}-{q}{'-per-channel' if pc else ''}" for f, q, pc in CONFIGS]
#: concrete dims for the runs (odd sizes so that every floor in a conv/pool expression matters)
BINDINGS = {"cnn": {"N": 2, "H": 13, "W": 17}, "mlp": {"N": 3}, "transformer": {"B": 2, "S": 5}}
BUILD = {"cnn": {"blocks": 2}, "mlp": {"layers": 3}, "transformer": {"blocks": 2}}


@pytest.fixture(scope="session")
def models() -> dict[str, onnx.ModelProto]:
    """Every quantized model, built once per test session."""
    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime's quantizer suggests pre-processing
    return {name: model_zoo.quantized(family, fmt, per_channel=pc, **BUILD[family])
            for name, (family, fmt, pc) in zip(IDS, CONFIGS)}


def _family(name: str) -> str:
    return name.split("-")[0]


def node_outputs(model: onnx.ModelProto) -> list[str]:
    return [o for n in model.graph.node for o in n.output if o]


@pytest.fixture(scope="session")
def runs(models) -> dict[str, dict[str, np.ndarray]]:
    """onnxruntime's value of every node output, per model (graph optimizations off, so that
    every intermediate is still there)."""
    out = {}
    for name, model in models.items():
        exposed = onnx.ModelProto()
        exposed.CopyFrom(model)
        del exposed.graph.output[:]
        names = node_outputs(model)
        exposed.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(widen_u8s8(exposed).model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        feeds = model_zoo.random_feeds(model, BINDINGS[_family(name)], seed=3)
        out[name] = dict(zip(names, sess.run(names, feeds)))
    return out


@pytest.mark.parametrize("name", IDS)
def test_every_value_is_typed_with_symbolic_dims_and_the_model_checks_clean(models, name):
    model = models[name]
    assert inference.check_model(model) == []
    result = inference.infer(model, strict=True)
    for out in node_outputs(model):
        info = result.ctx[out]
        assert info.elem_type and info.shape is not None, (out, info)
        assert all(d is not None for d in info.shape), (out, info.shape_text())
    assert {r.source for r in result.nodes} <= {"rule", "onnx-fallback", "constant"}
    written = inference.infer_shapes(model, strict=True)
    onnx.checker.check_model(written)
    assert {v.name for v in written.graph.value_info} == set(node_outputs(model)) - {v.name for v in model.graph.output}


@pytest.mark.parametrize("name", IDS)
def test_symbolic_dims_evaluate_to_what_onnxruntime_computes(models, runs, name):
    model, actual = models[name], runs[name]
    bindings = BINDINGS[_family(name)]
    symbolic = inference.infer_values(model, strict=True)
    concrete = inference.infer_values(model, model_zoo.input_shapes(model, bindings), strict=True)
    for out, array in actual.items():
        mine = symbolic[out]
        assert helper.tensor_dtype_to_np_dtype(mine.elem_type) == array.dtype, out
        assert tuple(dims.evaluate(d, bindings) for d in mine.shape) == array.shape, (out, mine.shape_text(), array.shape)
        assert concrete[out].shape == array.shape, (out, concrete[out].shape_text())


@pytest.mark.parametrize("name", IDS)
def test_where_onnx_knows_a_dim_we_agree(models, name):
    model = models[name]
    theirs = onnx.shape_inference.infer_shapes(model)
    mine = {v.name: TensorInfo.from_type_proto(v.type)
            for v in list(inference.infer_shapes(model).graph.value_info) + list(model.graph.output)}
    compared = 0
    for v in theirs.graph.value_info:
        t = TensorInfo.from_type_proto(v.type)
        if not t.elem_type:
            continue
        m = mine[v.name]
        assert m.elem_type == t.elem_type, v.name
        if t.shape is None:
            continue
        assert len(m.shape) == len(t.shape), (v.name, m.shape_text(), t.shape_text())
        for a, b in zip(m.shape, t.shape):
            if isinstance(b, int):
                assert a == b, (v.name, m.shape_text(), t.shape_text())
                compared += 1
    assert compared > 0


def test_onnx_loses_conv_dims_on_symbolic_input_we_give_the_expression(models):
    model = models["cnn-qdq"]
    stem = next(n for n in model.graph.node if n.op_type == "Conv")
    pool = next(n for n in model.graph.node if n.op_type == "MaxPool")
    theirs = {v.name: TensorInfo.from_type_proto(v.type) for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    for d in theirs[stem.output[0]].shape[2:]:  # onnx cannot compute with H and W: unknown, or a fresh unk__k
        assert d is None or not ({"H", "W"} & d.symbols), theirs[stem.output[0]].shape_text()
    mine = inference.infer_values(model, strict=True)
    half = dims.parse("floor((H + 1) / 2)")
    assert mine[stem.output[0]].shape == (dims.parse("N"), 8, half, dims.parse("floor((W + 1) / 2)"))
    assert mine[pool.output[0]].shape[2] == dims.floordiv(dims.add(half, 1), 2)


@pytest.mark.parametrize("name", [n for n in IDS if "qoperator" in n])
def test_onnx_types_fewer_values_of_qoperator_models(models, name):
    """The motivating gap: onnx's pass stops typing at the first com.microsoft op."""
    model = models[name]
    assert any(n.domain == "com.microsoft" for n in model.graph.node)

    def typed(graph) -> int:
        return sum(1 for v in list(graph.value_info) + list(graph.output)
                   if v.type.tensor_type.elem_type and v.type.tensor_type.HasField("shape"))

    ours = typed(inference.infer_shapes(model).graph)
    assert ours == len(node_outputs(model))
    assert typed(onnx.shape_inference.infer_shapes(model).graph) < ours


@pytest.mark.parametrize("family,fmt", [("cnn", "qoperator"), ("transformer", "qdq"), ("mlp", "dynamic")])
def test_stamped_models_match_quantized_ones(family, fmt):
    """``model_zoo.repeat`` (used by the benchmark for big models) gives the graph onnxruntime
    would give: same operators and initializers, valid, runnable, fully typed."""
    logging.getLogger().setLevel(logging.ERROR)
    arg = model_zoo.BLOCKS_ARG[family]
    direct = model_zoo.quantized(family, fmt, **{arg: 5})
    stamped = model_zoo.quantized(family, fmt, stamp=True, **{arg: 5})
    assert sorted((n.domain, n.op_type) for n in stamped.graph.node) == sorted((n.domain, n.op_type) for n in direct.graph.node)
    assert len(stamped.graph.initializer) == len(direct.graph.initializer)
    onnx.checker.check_model(stamped)
    bindings = model_zoo.CALIBRATION_DIMS[family]
    sess = ort.InferenceSession(widen_u8s8(stamped).model.SerializeToString(), providers=["CPUExecutionProvider"])
    [y] = sess.run(None, model_zoo.random_feeds(stamped, bindings))
    values = inference.infer_values(stamped, model_zoo.input_shapes(stamped, bindings), strict=True)
    assert values[stamped.graph.output[0].name].shape == y.shape
    assert all(values[o].is_fully_known for o in node_outputs(stamped))

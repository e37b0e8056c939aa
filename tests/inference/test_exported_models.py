"""Whole-model inference on the real-architecture models of ``onnx_quant.exported_models``
(YOLO head, an anchor-free YOLO head with float anchor grids, paddle2onnx MobileNetV3, torch
transformer, CRNN with a bidirectional LSTM, an If/Loop state model), float and quantized by onnxruntime (QOperator, QDQ, dynamic):

- every value of the main graph and of every If/Loop body gets an element type and a full
  shape (ints or symbols), and the model checks clean in strict mode;
- with the inputs' concrete shapes every dim is the int onnxruntime's run gives (a fresh
  symbol only where the dim is data-dependent); with symbolic inputs the dims evaluate to it;
- where onnx's C++ pass (``data_prop=True``) or onnxruntime's ``SymbolicShapeInference``
  knows a dim as an int, we have the same int (onnxruntime's pass needs sympy, a test
  dependency like onnxruntime itself).
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from onnx_quant import exported_models as em
from onnx_quant import inference
from onnx_quant.inference import dims
from onnx_quant.inference.context import TensorInfo
from onnx_quant.oracles import widen_u8s8

CASES = [(name, form) for name in em.MODELS for form in em.FORMS]
IDS = [f"{n}-{f}" for n, f in CASES]
#: values whose size depends on the data (NonZero's count): a fresh symbol is right for them
DATA_DEPENDENT = {"keep"}


@pytest.fixture(scope="module")
def models() -> dict[str, onnx.ModelProto]:
    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime's quantizer suggests pre-processing
    return {f"{n}-{f}": em.build(n, f) for n, f in CASES}


def _shapes(case: str) -> dict[str, tuple[int, ...]]:
    return em.MODELS[case.rsplit("-", 1)[0]][1]


def node_outputs(graph: onnx.GraphProto) -> list[str]:
    return [o for n in graph.node for o in n.output if o]


def _run_all(model: onnx.ModelProto, shapes) -> dict[str, np.ndarray]:
    """onnxruntime's value of every main-graph node output (optimizations off)."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    names = node_outputs(model.graph)
    del exposed.graph.output[:]
    exposed.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(widen_u8s8(exposed).model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(names, sess.run(names, em.feeds(model, shapes, seed=7))))


def _undeclared(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose graph outputs declare no shape: what the pass infers, not what the model says."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for v in out.graph.output:
        v.type.tensor_type.ClearField("shape")
    return out


def _full(info: TensorInfo) -> bool:
    return bool(info.elem_type) and info.shape is not None and all(d is not None for d in info.shape)


@pytest.mark.parametrize("case", IDS)
def test_every_value_gets_a_full_shape_and_the_model_checks_clean(models, case):
    model = models[case]
    assert inference.check_model(model) == []
    result = inference.infer(_undeclared(model), strict=True)
    missing = [o for o in node_outputs(model.graph) if not _full(result.ctx[o])]
    assert missing == [], [(o, result.ctx[o].shape_text()) for o in missing]
    for path, values in result.subgraph_values().items():
        bad = {k: v.shape_text() for k, v in values.items() if not _full(v)}
        assert bad == {}, path
    written = inference.infer_shapes(model, strict=True)
    onnx.checker.check_model(written)


@pytest.mark.parametrize("case", IDS)
def test_dims_are_what_onnxruntime_computes(models, case):
    model, shapes = models[case], _shapes(case)
    actual = _run_all(model, shapes)
    concrete = inference.infer_values(_undeclared(model), shapes, strict=True)
    symbolic = inference.infer_values(_undeclared(model), strict=True)
    bindings = {}
    for v in model.graph.input:
        for d, size in zip(symbolic[v.name].shape, shapes[v.name]):
            if isinstance(d, dims.Dim):
                bindings[next(iter(d.symbols))] = size
    for name, array in actual.items():
        mine, sym = concrete[name], symbolic[name]
        assert helper.tensor_dtype_to_np_dtype(mine.elem_type) == array.dtype, name
        if name in DATA_DEPENDENT:
            assert len(mine.shape) == array.ndim and any(isinstance(d, dims.Dim) for d in mine.shape), name
            continue
        assert mine.shape == array.shape, (name, mine.shape_text(), array.shape)
        assert tuple(dims.evaluate(d, bindings) for d in sym.shape) == array.shape, (name, sym.shape_text())


def _int_dims_agree(mine: dict[str, TensorInfo], theirs: onnx.ModelProto) -> int:
    compared = 0
    for v in list(theirs.graph.value_info) + list(theirs.graph.output):
        t = TensorInfo.from_type_proto(v.type)
        if not t.elem_type or t.shape is None or v.name not in mine:
            continue
        m = mine[v.name]
        assert m.elem_type == t.elem_type, v.name
        assert len(m.shape) == len(t.shape), (v.name, m.shape_text(), t.shape_text())
        for a, b in zip(m.shape, t.shape):
            if isinstance(b, int) and b >= 0:
                assert a == b, (v.name, m.shape_text(), t.shape_text())
                compared += 1
    return compared


@pytest.mark.parametrize("case", IDS)
def test_where_onnx_with_data_propagation_knows_a_dim_we_agree(models, case):
    model = models[case]
    theirs = onnx.shape_inference.infer_shapes(model, data_prop=True)
    assert _int_dims_agree(inference.infer_values(model, strict=True), theirs) > 0


@pytest.mark.parametrize("case", IDS)
def test_where_onnxruntime_symbolic_inference_knows_a_dim_we_agree(models, case):
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    model = models[case]
    try:
        theirs = SymbolicShapeInference.infer_shapes(model, auto_merge=True)
    except Exception:  # noqa: BLE001 - it fails on com.microsoft QLinear ops: nothing to compare
        theirs = None
    if theirs is None:
        assert "qoperator" in case or "dynamic" in case, "onnxruntime's pass fails on a float/QDQ model"
        return
    assert _int_dims_agree(inference.infer_values(model, strict=True), theirs) > 0


def _by_op(model: onnx.ModelProto, op: str) -> list[str]:
    return [n.output[0] for n in model.graph.node if n.op_type == op]


def test_exporter_shape_subgraphs_resolve_to_expressions(models):
    """The idioms themselves, on the float models: Range over Cast(Div(W, 2)), computed-size and
    constant-scale Resize, TopK with K = Min(boxes, 8), a Loop whose trip count is a Shape value
    behind an If whose condition folds, anonymous '?' dims kept apart."""
    p = dims.parse
    yolo = models["yolo_head-float"]
    v = inference.infer_values(_undeclared(yolo), strict=True)
    half_h, half_w = p("floor(height / 2)"), p("floor(width / 2)")
    assert [v[r].shape for r in _by_op(yolo, "Range")] == [(half_h,), (half_w,)] * 2
    assert [v[r].shape for r in _by_op(yolo, "Resize")] == [(p("batch"), 8, p("2*floor(height / 2)"), p("2*floor(width / 2)")),
                                                          (p("batch"), 8, half_h, half_w)]
    boxes = p("4*floor(height / 2)*floor(width / 2)")
    assert v["dets"].shape == (p("batch"), boxes, 8)
    assert v["top_values"].shape == (p("batch"), dims.neg(dims.maximum(dims.neg(boxes), -8)))
    assert v["keep"].shape == (2, p("keep_dim1"))
    vad = models["vad_state-float"]
    v = inference.infer_values(_undeclared(vad), strict=True)
    assert v["probs"].shape == (p("floor(samples / 16)"), p("batch"), 1)
    assert v["state_out"].shape == (2, p("batch"), 8)
    mobilenet = models["mobilenet_v3-qdq"]
    v = inference.infer_values(_undeclared(mobilenet), strict=True)
    assert v["x"].shape == (p("x_dim0"), 3, p("x_dim2"), p("x_dim3"))
    first_conv = next(n for n in mobilenet.graph.node if n.op_type == "Conv").output[0]
    assert v[first_conv].shape[2:] == (p("floor((x_dim2 + 1) / 2)"), p("floor((x_dim3 + 1) / 2)"))


@pytest.mark.parametrize("form", em.FORMS)
def test_float_anchor_grids_resolve_to_exact_expressions(models, form):
    """The anchor-free head's grids are float (``Range(0.0, Cast<float>(Gather(Shape(p), 3)),
    1.0) + 0.5``) and its second level is sized by float arithmetic (``int(h / 4)``): every value downstream, their Q/DQ pairs included, has the exact
    expression, and the anchors total the two levels' cells."""
    p = dims.parse
    model = models[f"yolo_anchors-{form}"]
    v = inference.infer_values(_undeclared(model), strict=True)
    levels = [(p("floor(height / 2)"), p("floor(width / 2)")), (p("floor(height / 4)"), p("floor(width / 4)"))]
    assert sorted(v[r].shape for r in _by_op(model, "Range")) == sorted((d,) for lv in levels for d in lv)
    cells = [dims.mul(h, w) for h, w in levels]
    grids = [v[r].shape for r in _by_op(model, "Reshape") if v[r].shape[-1:] == (2,)]
    assert grids == [(c, 2) for c in cells]
    anchors = dims.add(*cells)
    assert v["y"].shape == (p("batch"), 7, anchors)
    assert {v[t].shape for t in _by_op(model, "Transpose")} == {(2, anchors), (1, anchors)}

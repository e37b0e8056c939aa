"""Static validation of the quantization family: every invalid case and version gate.

Each case is a one-node model with exactly one violation. Strict mode
(``inference.infer_shapes(strict=True)``) must raise an ``InferenceError`` (a
``QuantError``) naming the node and the rule; ``inference.check_model`` must list a
diagnostic naming the same node and rule, and no other rule for that node.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnx_quant import inference
from onnx_quant.inference import dims, registry
from onnx_quant.inference.context import ShapesContext, TensorInfo
from onnx_quant.inference.diagnostics import MODEL_NODE
from onnx_quant.inference.registry import NodeContext
from onnx_quant.dtypes import ELEMENT_TYPES
from onnx_quant.errors import InferenceError, QuantError
from support.models import make_model

F, F16, BF16, U8, I8, I32 = T.FLOAT, T.FLOAT16, T.BFLOAT16, T.UINT8, T.INT8, T.INT32
Q, DQ = "QuantizeLinear", "DequantizeLinear"


def model(op, inputs, opset, attrs=None, *, name="n0", initializers=(), outputs=("y",), typed_outputs=None):
    """One node ``op`` reading ``inputs`` (name, type, shape); initializers are (name, array, type)."""
    init_names = {i[0] for i in initializers}
    node = helper.make_node(op, [i[0] for i in inputs], list(outputs), name=name, **(attrs or {}))
    graph_inputs = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs if n and n not in init_names]
    inits = []
    for n, arr, t in initializers:
        tp = numpy_helper.from_array(np.asarray(arr), n)
        tp.data_type = t
        inits.append(tp)
    return make_model(node, graph_inputs, typed_outputs or [o for o in outputs if o], inits, opset)


def qdq(op, x, scale, zp=None, *, opset, **attrs):
    inputs = [("x", x[0], x[1]), ("s", scale[0], scale[1])]
    if zp is not None:
        inputs.append(("z", zp[0], zp[1]))
    return model(op, inputs, opset, attrs)


def conv(x, w, *, ws=(F, []), wz=None, xs=(F, []), xz=None, ys=(F, []), yz=(U8, []), bias=None, **attrs):
    x_t = x[0]
    wz = wz or (w[0], ws[1])
    xz = xz or (x_t, [])
    inputs = [("x", *x), ("xs", *xs), ("xz", *xz), ("w", *w), ("ws", *ws), ("wz", *wz), ("ys", *ys), ("yz", *yz)]
    if bias is not None:
        inputs.append(("B", *bias))
    return model("QLinearConv", inputs, 10, attrs)


def qmatmul(a, b, *, opset=10, ts=F, a_p=(), b_p=(), y_p=(), az_t=None, bz_t=None, as_t=None, y_t=U8):
    inputs = [("a", *a), ("as", as_t or ts, list(a_p)), ("az", az_t or a[0], list(a_p)),
              ("b", *b), ("bs", ts, list(b_p)), ("bz", bz_t or b[0], list(b_p)),
              ("ys", ts, list(y_p)), ("yz", y_t, list(y_p))]
    return model("QLinearMatMul", inputs, opset)


INVALID = {
    # ---- granularity (Q and DQ share the code; both are exercised)
    "per-axis length Q": (qdq(Q, (F, [2, 3, 4]), (F, [4]), (U8, [4]), opset=21, axis=1), "quant.per-axis-scale-length"),
    "per-axis length DQ": (qdq(DQ, (I8, [2, 3, 4]), (F, [3]), (I8, [3]), opset=13, axis=-1), "quant.per-axis-scale-length"),
    "per-axis length symbolic": (qdq(DQ, (I8, ["N", "C"]), (F, ["C+1"]), opset=21, axis=1), "quant.per-axis-scale-length"),
    "axis out of range": (qdq(Q, (F, [2, 3]), (F, [3]), (U8, [3]), opset=21, axis=2), "quant.axis-range"),
    "axis out of range negative": (qdq(DQ, (I8, [2, 3]), (F, [2]), opset=19, axis=-3), "quant.axis-range"),
    "rank-1 x with default axis": (qdq(DQ, (I8, [3]), (F, [3]), opset=19), "quant.axis-range"),
    "blocked axis out of range": (qdq(DQ, (I8, [4, 6]), (F, [2, 6]), opset=21, axis=2, block_size=2), "quant.axis-range"),
    "block_size out of range": (qdq(DQ, (I8, [4, 6]), (F, [2, 6]), (I8, [2, 6]), opset=21, axis=0, block_size=1),
                                "quant.block-size-range"),
    "block_size out of range Q": (qdq(Q, (F, [4, 7]), (F, [4, 2]), opset=23, axis=1, block_size=7),
                                  "quant.block-size-range"),
    "block_size negative": (qdq(DQ, (I8, [4, 6]), (F, [2, 6]), opset=21, axis=0, block_size=-2), "quant.block-size-range"),
    "blocked scale of wrong rank": (qdq(DQ, (I8, [4, 6]), (F, [2, 6, 1]), (I8, [2, 6, 1]), opset=21, axis=0, block_size=2),
                                    "quant.blocked-scale-rank"),
    "blocked scale wrong other dim": (qdq(Q, (F, [4, 6]), (F, [2, 5]), opset=21, axis=0, block_size=2),
                                      "quant.blocked-scale-shape"),
    "block_size with per-tensor scale": (qdq(Q, (F, [4, 6]), (F, []), opset=21, axis=0, block_size=2),
                                         "quant.block-size-granularity"),
    "block_size with per-axis scale": (qdq(DQ, (I8, [4, 6]), (F, [6]), opset=21, axis=1, block_size=2),
                                       "quant.block-size-granularity"),
    "rank-2 scale without block_size": (qdq(DQ, (I8, [4, 6]), (F, [2, 6]), opset=21, axis=0), "quant.block-size-missing"),
    "per-axis at opset 10": (qdq(Q, (F, [2, 3]), (F, [3]), opset=10), "quant.granularity-version"),
    "blocked at opset 19": (qdq(DQ, (I8, [4, 6]), (F, [2, 6]), opset=19, axis=0), "quant.granularity-version"),
    "zero point shape": (qdq(Q, (F, [2, 3]), (F, [3]), (U8, [2]), opset=13, axis=1), "quant.zero-point-shape"),
    # ---- types and attributes
    "output_dtype vs zero point": (qdq(Q, (F, [2]), (F, []), (U8, []), opset=21, output_dtype=I8),
                                   "quant.output-dtype-mismatch"),
    "Q output_dtype float": (qdq(Q, (F, [2]), (F, []), opset=21, output_dtype=F), "quant.output-dtype"),
    "Q output_dtype int2 before 25": (qdq(Q, (F, [2]), (F, []), opset=24, output_dtype=T.INT2), "quant.output-dtype"),
    "DQ output_dtype int8": (qdq(DQ, (I8, [2]), (F, []), opset=23, output_dtype=I8), "quant.output-dtype"),
    "precision int8": (qdq(Q, (F, [2]), (F, []), opset=23, precision=I8), "quant.precision"),
    "e8m0 scale without output_dtype": (qdq(DQ, (T.INT4, [4, 6]), (T.FLOAT8E8M0, [2, 6]), opset=24, axis=0, block_size=2),
                                        "schema.type-constraint"),
    "DQ zero point type": (qdq(DQ, (I8, [2]), (F, []), (U8, []), opset=21), "schema.type-binding"),
    "Q-19 x and scale types": (qdq(Q, (F, [2]), (F16, []), opset=19), "schema.type-binding"),
    "Q x float64": (qdq(Q, (T.DOUBLE, [2]), (F, []), opset=25), "schema.type-constraint"),
    "DQ scale int32": (qdq(DQ, (I8, [2]), (I32, []), opset=25), "schema.type-constraint"),
    "unknown attribute": (qdq(Q, (F, [2]), (F, []), opset=21, foo=1), "schema.attribute"),
    "axis of wrong type": (qdq(Q, (F, [2, 3]), (F, [3]), opset=21, axis=1.0), "schema.attribute-type"),
    "missing scale": (model(Q, [("x", F, [2])], 21), "schema.required-input"),  # the engine checks, not the rule
    "DynamicQuantizeLinear float16": (model("DynamicQuantizeLinear", [("x", F16, [2])], 11, outputs=("y", "s", "z")),
                                      "schema.type-constraint"),
    # ---- QLinearConv / ConvInteger
    "conv x rank 2": (conv((U8, [1, 4]), (U8, [2, 4])), "conv.rank"),
    "conv w rank": (conv((U8, [1, 4, 5, 5]), (U8, [2, 4, 3])), "conv.rank"),
    "conv channels": (conv((U8, [1, 4, 5]), (U8, [2, 3, 3])), "conv.channels"),
    "conv group": (conv((U8, [1, 4, 5]), (U8, [3, 2, 3]), group=2), "conv.group"),
    "conv w_scale length": (conv((U8, [1, 4, 5]), (U8, [2, 4, 3]), ws=(F, [3]), wz=(U8, [3])), "qlinear.w-scale-length"),
    "conv w_zero_point shape": (conv((U8, [1, 4, 5]), (U8, [2, 4, 3]), ws=(F, [2]), wz=(U8, [])), "qlinear.zero-point-shape"),
    "conv x_scale not scalar": (conv((U8, [1, 4, 5]), (U8, [2, 4, 3]), xs=(F, [4])), "qlinear.scalar-param"),
    "conv y_zero_point not scalar": (conv((U8, [1, 4, 5]), (U8, [2, 4, 3]), yz=(U8, [2])), "qlinear.scalar-param"),
    "conv bias type": (conv((U8, [1, 4, 5]), (U8, [2, 4, 3]), bias=(T.INT64, [2])), "schema.type-constraint"),
    "conv bias length": (conv((U8, [1, 4, 5]), (U8, [2, 4, 3]), bias=(I32, [3])), "qlinear.bias"),
    "conv kernel_shape": (conv((U8, [1, 4, 5]), (U8, [2, 4, 3]), kernel_shape=[2]), "conv.kernel-shape"),
    "conv pads length": (conv((U8, [1, 4, 5, 5]), (U8, [2, 4, 3, 3]), pads=[1, 1]), "conv.pads"),
    "conv strides length": (conv((U8, [1, 4, 5, 5]), (U8, [2, 4, 3, 3]), strides=[1]), "conv.strides"),
    "conv dilations length": (conv((U8, [1, 4, 5, 5]), (U8, [2, 4, 3, 3]), dilations=[1, 1, 1]), "conv.dilations"),
    "conv auto_pad": (conv((U8, [1, 4, 5]), (U8, [2, 4, 3]), auto_pad="SAME"), "conv.auto-pad"),
    "conv kernel too large": (conv((U8, [1, 4, 2]), (U8, [2, 4, 3])), "conv.output-size"),
    "conv x int16": (conv((T.INT16, [1, 4, 5]), (U8, [2, 4, 3])), "schema.type-constraint"),
    "ConvInteger x_zero_point": (model("ConvInteger", [("x", U8, [1, 4, 5]), ("w", U8, [2, 4, 3]), ("xz", U8, [4])], 10),
                                 "qlinear.scalar-param"),
    "ConvInteger w_zero_point": (model("ConvInteger", [("x", U8, [1, 4, 5]), ("w", U8, [2, 4, 3]), ("xz", U8, []),
                                                       ("wz", U8, [3])], 10), "qlinear.w-scale-length"),
    "ConvInteger channels": (model("ConvInteger", [("x", U8, [1, 4, 5]), ("w", U8, [2, 2, 3])], 10), "conv.channels"),
    # ---- QLinearMatMul / MatMulInteger
    "matmul inner dim": (qmatmul((U8, [2, 4]), (U8, [5, 3])), "matmul.inner-dim"),
    "matmul inner dim symbolic": (qmatmul((U8, ["M", "K"]), (U8, ["K+1", 3])), "matmul.inner-dim"),
    "matmul batch": (qmatmul((U8, [2, 2, 4]), (U8, [3, 4, 3])), "matmul.batch-broadcast"),
    "matmul rank 0": (qmatmul((U8, []), (U8, [4, 3])), "matmul.rank"),
    "matmul a_scale shape": (qmatmul((U8, [2, 4]), (U8, [4, 3]), a_p=(4,)), "qlinear.param-shape"),
    "matmul b_scale shape": (qmatmul((U8, [5, 2, 4]), (U8, [5, 4, 3]), b_p=(5, 4, 1)), "qlinear.param-shape"),
    "matmul y_scale not scalar": (qmatmul((U8, [2, 4]), (U8, [4, 3]), y_p=(3,)), "qlinear.scalar-param"),
    "matmul a_zero_point type": (qmatmul((U8, [2, 4]), (U8, [4, 3]), az_t=I8), "schema.type-binding"),
    "matmul scale types (21)": (qmatmul((U8, [2, 4]), (U8, [4, 3]), opset=21, as_t=F16), "schema.type-binding"),
    "matmul zp shape": (model("QLinearMatMul", [("a", U8, [2, 4]), ("as", F, []), ("az", U8, [2]), ("b", U8, [4, 3]),
                                                ("bs", F, []), ("bz", U8, []), ("ys", F, []), ("yz", U8, [])], 10),
                        "qlinear.zero-point-shape"),
    "MatMulInteger inner dim": (model("MatMulInteger", [("a", U8, [2, 4]), ("b", I8, [3, 3])], 10), "matmul.inner-dim"),
    "MatMulInteger b_zero_point": (model("MatMulInteger", [("a", U8, [2, 4]), ("b", I8, [4, 3]), ("az", U8, []),
                                                           ("bz", I8, [4])], 10), "qlinear.param-shape"),
}

VERSION_GATES = {
    # (model, rule, the since_version the message must name)
    "int4 zero point before 21": (qdq(Q, (F, [2]), (F, []), (T.INT4, []), opset=19), 21),
    "uint4 x before 21 (DQ)": (qdq(DQ, (T.UINT4, [2]), (F, []), opset=19), 21),
    "int16 before 21": (qdq(DQ, (T.INT16, [2]), (F, []), opset=19), 21),
    "block_size attribute before 21": (qdq(DQ, (I8, [4]), (F, []), opset=19, block_size=2), 21),
    "Q output_dtype attribute before 21": (qdq(Q, (F, [4]), (F, []), opset=19, output_dtype=U8), 21),
    "DQ output_dtype attribute before 23": (qdq(DQ, (I8, [4]), (F, []), opset=21, output_dtype=F), 23),
    "saturate before 19": (qdq(Q, (F, [4]), (F, []), opset=13, saturate=1), 19),
    "precision before 23": (qdq(Q, (F, [4]), (F, []), opset=22, precision=F), 23),
    "axis before 13": (qdq(Q, (F, [4]), (F, []), opset=12, axis=0), 13),
    "float8 before 19": (qdq(Q, (F, [2]), (F, []), (T.FLOAT8E4M3FN, []), opset=18), 19),
    "float8 x before 19 (DQ)": (qdq(DQ, (T.FLOAT8E5M2, [2]), (F, []), opset=13), 19),
    "float16 x before 19": (qdq(Q, (F16, [2]), (F, []), opset=13), 19),
    "bfloat16 scale before 19 (DQ)": (qdq(DQ, (I8, [2]), (BF16, []), opset=13), 19),
    "float4e2m1 before 23": (qdq(Q, (F, [2]), (F, []), (T.FLOAT4E2M1, []), opset=22), 23),
    "float8e8m0 scale before 24 (Q)": (qdq(Q, (F, [2]), (T.FLOAT8E8M0, []), opset=23), 24),
    "float8e8m0 scale before 24 (DQ)": (qdq(DQ, (I8, [2]), (T.FLOAT8E8M0, []), opset=23, output_dtype=F), 24),
    "int2 before 25": (qdq(DQ, (T.INT2, [2]), (F, []), opset=24), 25),
    "uint2 before 25 (Q)": (qdq(Q, (F, [2]), (F, []), (T.UINT2, []), opset=24), 25),
    "float6 before 28": (qdq(DQ, (T.FLOAT6E2M3, [2]), (F, []), opset=25), 28),
    "float6e3m2 before 28 (Q)": (qdq(Q, (F, [2]), (F, []), (T.FLOAT6E3M2, []), opset=27), 28),
    "QLinearMatMul float8 before 21": (qmatmul((T.FLOAT8E4M3FN, [2, 4]), (U8, [4, 3])), 21),
    "QLinearMatMul float16 scales before 21": (qmatmul((U8, [2, 4]), (U8, [4, 3]), ts=F16), 21),
}


def _node_label(m: onnx.ModelProto) -> str:
    node = m.graph.node[0]
    return f"{node.name!r} ({node.op_type})" if node.name else f"#0 ({node.op_type})"


def _assert_rejected(m: onnx.ModelProto, rule: str) -> tuple[InferenceError, list]:
    label = _node_label(m)
    with pytest.raises(InferenceError) as exc:
        inference.infer_shapes(m, strict=True)
    err = exc.value
    assert isinstance(err, QuantError)
    assert err.rule == rule and err.node == label, str(err)
    assert str(err).startswith(f"{rule}: node {label}")
    diags = inference.check_model(m)
    ours = [d for d in diags if d.node != MODEL_NODE]
    assert {(d.node, d.rule) for d in ours} == {(label, rule)}, [str(d) for d in diags]
    return err, ours


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_case_rejected(case):
    m, rule = INVALID[case]
    err, _ = _assert_rejected(m, rule)
    assert err.expected is not None and err.found is not None and err.subject


@pytest.mark.parametrize("case", list(VERSION_GATES))
def test_version_gate_rejected(case):
    m, version = VERSION_GATES[case]
    err, _ = _assert_rejected(m, "schema.version-gate")
    assert f"-{version};" in err.detail or f"-{version} " in err.detail or f">= {version}" in str(err)


# ---------------------------------------------------------------- valid counterparts
VALID = {
    "per-axis": qdq(Q, (F, [2, 3, 4]), (F, [3]), (U8, [3]), opset=21, axis=1),
    "per-axis negative axis": qdq(DQ, (I8, [2, 3, 4]), (F, [4]), (I8, [4]), opset=13, axis=-1),
    "per-axis symbolic": qdq(DQ, (I8, ["N", "C"]), (F, ["C"]), opset=21, axis=1),
    "per-axis symbolic unknown length": qdq(DQ, (I8, ["N", "C"]), (F, ["L"]), opset=21, axis=1),
    "per-tensor 1-element with out-of-range axis": qdq(Q, (F, [2, 3]), (F, [1]), (U8, []), opset=21, axis=7),
    "rank-1 x per-axis axis 0": qdq(DQ, (I8, [3]), (F, [3]), opset=19, axis=0),
    "blocked": qdq(DQ, (I8, [4, 6]), (F, [2, 6]), (I8, [2, 6]), opset=21, axis=0, block_size=2),
    "blocked upper end": qdq(DQ, (I8, [4, 6]), (F, [2, 6]), opset=21, axis=0, block_size=3),
    "blocked ragged": qdq(Q, (F, [4, 7]), (F, [4, 2]), opset=23, axis=1, block_size=4),
    "blocked rank-1": qdq(DQ, (T.INT4, [7]), (F, [2]), opset=21, axis=0, block_size=4),
    "blocked symbolic": qdq(DQ, (T.INT4, ["N", "K"]), (F, ["N", "floor((K + 31) / 32)"]), opset=21, axis=1, block_size=32),
    "e8m0 scale with output_dtype": qdq(DQ, (T.INT4, [4, 6]), (T.FLOAT8E8M0, [2, 6]), opset=24, axis=0, block_size=2,
                                        output_dtype=BF16),
    "output_dtype agreeing": qdq(Q, (F, [2]), (F, []), (I8, []), opset=21, output_dtype=I8),
    "int32 DQ without zp": qdq(DQ, (I32, [2]), (F, []), opset=10),
    "scalar zp with 1-element scale": qdq(Q, (F, [2]), (F, [1]), (U8, []), opset=10),
    "conv per-channel": conv((U8, ["N", 4, "H", "W"]), (I8, [6, 2, 3, 3]), ws=(F, [6]), group=2,
                             bias=(I32, [6]), pads=[1, 1, 1, 1]),
    "conv VALID zero pads": conv((U8, [1, 4, 5]), (U8, [2, 4, 3]), auto_pad="VALID", pads=[0, 0]),
    "matmul per-row/column": qmatmul((U8, [2, 4]), (U8, [4, 3]), a_p=(2,), b_p=(3,)),
    "matmul N-D per-row/column": qmatmul((U8, [5, 2, 4]), (U8, [5, 4, 3]), a_p=(5, 2, 1), b_p=(5, 1, 3)),
}


@pytest.mark.parametrize("case", list(VALID))
def test_valid_case_accepted(case):
    m = VALID[case]
    inference.infer_shapes(m, strict=True)
    assert [d for d in inference.check_model(m) if d.node != MODEL_NODE] == []


def test_int32_zero_point():
    nonzero = model(DQ, [("x", I32, [2]), ("s", F, []), ("z", I32, [])], 21,
                    initializers=[("z", np.array(3, dtype=np.int32), I32)])
    _assert_rejected(nonzero, "quant.int32-zero-point")
    zero = model(DQ, [("x", I32, [2]), ("s", F, []), ("z", I32, [])], 21,
                 initializers=[("z", np.array(0, dtype=np.int32), I32)])
    inference.infer_shapes(zero, strict=True)


def test_unnamed_node_label_and_all_problems_listed():
    m = qdq(DQ, (I8, [4, 6]), (F, [3]), (U8, [2]), opset=21, axis=0)
    m.graph.node[0].name = ""
    diags = [d for d in inference.check_model(m) if d.node != MODEL_NODE]
    assert {d.node for d in diags} == {"#0 (DequantizeLinear)"}
    assert {d.rule for d in diags} == {"schema.type-binding", "quant.zero-point-shape", "quant.per-axis-scale-length"}
    for d in diags:
        assert "expected" in d.message and "found" in d.message


# ---------------------------------------------------------------- what onnx and onnxruntime let through
ACCEPTED_ELSEWHERE = {
    "per-axis scale of the wrong length": (
        model(DQ, [("x", I8, [2, 3, 4]), ("s", F, [4]), ("z", I8, [4])], 21, {"axis": 1},
              typed_outputs=[("y", F, [2, 3, 4])]), "quant.per-axis-scale-length"),
    "axis out of range": (
        model(DQ, [("x", I8, [2, 3]), ("s", F, [3]), ("z", I8, [3])], 21, {"axis": 2},
              typed_outputs=[("y", F, [2, 3])]), "quant.axis-range"),
    "block_size out of range": (
        model(DQ, [("x", I8, [4, 6]), ("s", F, [2, 6]), ("z", I8, [2, 6])], 21, {"axis": 0, "block_size": 1},
              typed_outputs=[("y", F, [4, 6])]), "quant.block-size-range"),
    "blocked scale of the wrong rank": (
        model(DQ, [("x", I8, [4, 6]), ("s", F, [2, 6, 1]), ("z", I8, [2, 6, 1])], 21, {"axis": 0, "block_size": 2},
              typed_outputs=[("y", F, [4, 6])]), "quant.blocked-scale-rank"),
}


@pytest.mark.parametrize("case", list(ACCEPTED_ELSEWHERE))
def test_onnx_accepts_but_we_reject(case):
    m, rule = ACCEPTED_ELSEWHERE[case]
    onnx.checker.check_model(m, full_check=True)
    onnx.shape_inference.infer_shapes(m, strict_mode=True)
    import onnxruntime as ort
    ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    _assert_rejected(m, rule)
    assert [d.rule for d in inference.check_model(m)] == [rule]  # the checker itself has nothing to say


# ---------------------------------------------------------------- robustness

_FAMILY = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "ConvInteger",
           "QLinearMatMul", "MatMulInteger")
_dim = st.one_of(st.integers(0, 6), st.sampled_from([None, "N", "H", "H + 1"]))
_shape = st.one_of(st.none(), st.lists(_dim, max_size=5))
_info = st.builds(lambda t, s: TensorInfo(t, None if s is None else tuple(
    dims.parse(d) if isinstance(d, str) else d for d in s)),
    st.sampled_from([0] + [t.code for t in ELEMENT_TYPES] + [T.DOUBLE]), _shape)
_ints = st.lists(st.integers(-2, 4), max_size=7)
_attrs = st.fixed_dictionaries({}, optional={
    # each attribute sometimes has the wrong kind (a list for an int, an int for a list or string)
    "axis": st.integers(-6, 6) | _ints, "block_size": st.integers(-2, 5) | _ints,
    "output_dtype": st.integers(-1, 30), "saturate": st.integers(0, 1), "precision": st.integers(-1, 30) | _ints,
    "group": st.integers(-1, 3) | _ints, "pads": _ints | st.integers(0, 2), "strides": _ints,
    "dilations": _ints, "kernel_shape": _ints | st.integers(1, 3),
    "auto_pad": st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID", "same", ""]) | st.integers(0, 1),
    "foo": st.integers(0, 1),
})


@given(op=st.sampled_from(_FAMILY), opset=st.integers(10, 28), infos=st.lists(_info, max_size=10),
       attrs=_attrs, holes=st.sets(st.integers(0, 9)), strict=st.booleans())
def test_rules_never_crash(op, opset, infos, attrs, holes, strict):
    """Whatever the node looks like, a rule types it or raises InferenceError, nothing else."""
    found = registry.lookup("", op, opset)
    if found is None:
        return
    rule, version = found
    names = ["" if i in holes else f"i{i}" for i in range(len(infos))]
    node = helper.make_node(op, names, ["y", "y1", "y2"][: 3 if op == "DynamicQuantizeLinear" else 1])
    for key, value in attrs.items():
        kind = onnx.AttributeProto.INTS if isinstance(value, list) else None
        node.attribute.append(helper.make_attribute(key, value, attr_type=kind))
    ctx = ShapesContext({"": opset}, strict=strict)
    for name, info in zip(names, infos):
        if name:
            ctx.set(name, info)
    try:
        rule(ctx, NodeContext(node, 0, ctx, version, opset))
    except InferenceError as e:
        assert str(e).startswith(f"{e.rule}: node #0 ({op})")
    for e in ctx.diagnostics:
        assert isinstance(e, InferenceError)

"""QDQ node-unit fusion (backend_wgpu/qdq_fusion.py), on the CPU: no adapter, no device.

Small hand-built QDQ graphs: each of onnxruntime's rules fuses its unit, each failing condition
leaves the unit as written (and says why). The oracle for what a fused graph computes is
onnxruntime itself: the fused model run with no optimizations (its QLinear kernels as written)
equals, bit for bit, the original model run with all optimizations (onnxruntime's own QDQ
fusion), and onnxruntime's optimized model holds the same fused operators.
"""

from __future__ import annotations

import collections
import logging
import os
import tempfile
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

from onnx_quant.backend_wgpu.qdq_fusion import fuse_qdq
from onnx_quant.oracles import not_an_oracle
from support.oracles import onnxruntime_run

U8, I8, I32, F = TP.UINT8, TP.INT8, TP.INT32, TP.FLOAT
NP = {U8: np.uint8, I8: np.int8, I32: np.int32, TP.UINT16: np.uint16, TP.INT16: np.int16}


class G:
    """A QDQ graph under construction: float inputs quantized at the start, the output dequantized."""

    def __init__(self, seed: int = 0) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.rng = np.random.default_rng(seed)
        self.n = 0

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}{self.n}"

    def init(self, base: str, value) -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs, *, name: str | None = None, domain: str = "", **attrs) -> str:
        out = self.name(op.lower() + "_out")
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=name or self.name(op), domain=domain,
                                           **attrs))
        return out

    def q(self, x: str, scale=0.05, zp=128, t=U8, **kw) -> str:
        return self.node("QuantizeLinear", [x, self.init("s", np.float32(scale)), self.init("z", NP[t](zp))], **kw)

    def dq(self, x: str, scale=0.05, zp=128, t=U8, axis=None) -> str:
        zp_v = NP[t](zp) if np.ndim(zp) == 0 else np.asarray(zp, NP[t])
        attrs = {} if axis is None else {"axis": axis}
        return self.node("DequantizeLinear", [x, self.init("s", np.asarray(scale, np.float32)),
                                              self.init("z", zp_v)], **attrs)

    def qdq_input(self, shape, scale=0.05, zp=128, t=U8) -> str:
        x = self.name("x")
        self.inputs.append(helper.make_tensor_value_info(x, F, list(shape)))
        return self.dq(self.q(x, scale, zp, t), scale, zp, t)

    def weight(self, shape, scale=0.02, t=I8) -> str:
        w = self.init("w", self.rng.integers(-60, 60, size=shape).astype(NP[t]))
        return self.dq(w, scale, 0, t)

    def model(self, outputs, opset: int = 21) -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(o, F, None) for o in outputs]
        g = helper.make_graph(self.nodes, "qdq", self.inputs, outs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 10
        return m


def feeds_of(model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i.name: rng.uniform(-3, 3, [d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input}


def onnxruntime_form(model: onnx.ModelProto) -> onnx.ModelProto:
    """A fused model as onnxruntime runs it: the fusion's ai.onnx_quant QLinearConv / QLinearMatMul
    (ai.onnx's operators requantized as onnxruntime's kernels do) written as ai.onnx's."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for n in out.graph.node:
        if n.domain == "ai.onnx_quant" and n.op_type in ("QLinearConv", "QLinearMatMul"):
            n.domain = ""
    return out


def ort_run(model, feeds, optimize: bool):
    return onnxruntime_run(onnxruntime_form(model), feeds, level="ORT_ENABLE_ALL" if optimize else "ORT_DISABLE_ALL")


def ort_fused_ops(model: onnx.ModelProto) -> collections.Counter:
    """The QLinear/QGemm operators in onnxruntime's own optimized model (ORT_ENABLE_EXTENDED: its
    QDQ fusion without the NCHWc/NHWC layout rewrites)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = os.path.join(tmp, "opt.onnx")
        with not_an_oracle():  # its graph, not its values
            ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        opt = onnx.load(so.optimized_model_filepath)
    return collections.Counter(n.op_type for n in opt.graph.node if n.op_type.startswith(("QLinear", "QGemm")))


def assert_matches_onnxruntime(model: onnx.ModelProto, fused: onnx.ModelProto) -> None:
    feeds = feeds_of(model)
    want = ort_run(model, feeds, optimize=True)
    got = ort_run(fused, feeds, optimize=False)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert np.array_equal(g, w), f"max |diff| {np.abs(g.astype(np.float64) - w).max()}"
    ours = collections.Counter(n.op_type for n in fused.graph.node if n.op_type.startswith(("QLinear", "QGemm")))
    assert ours == ort_fused_ops(model)


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


# ----------------------------------------------------------------------------- each rule fuses


def conv_model(bias: bool = True, **kw) -> onnx.ModelProto:
    g = G()
    x = g.qdq_input([1, 3, 6, 6])
    ins = [x, g.weight([4, 3, 3, 3])]
    if bias:
        ins.append(g.dq(g.init("b", np.arange(-2, 2, dtype=np.int32) * 50), 0.05 * 0.02, 0, I32))
    y = g.node("Conv", ins, name="conv", pads=[1, 1, 1, 1])
    return g.model([g.dq(g.q(y, 0.1, 100, **kw), 0.1, 100)])


@pytest.mark.parametrize("bias", [True, False])
def test_conv_unit_becomes_qlinear_conv(bias):
    model = conv_model(bias)
    r = fuse_qdq(model)
    assert [u.rule for u in r.units] == ["conv"]
    node = r.units[0].node
    assert (node.op_type, node.domain, node.name) == ("QLinearConv", "ai.onnx_quant", "conv")
    assert len(node.input) == (9 if bias else 8) and [a.name for a in node.attribute] == ["pads"]
    assert ops(r.model) == ["QuantizeLinear", "QLinearConv", "DequantizeLinear"]
    assert_matches_onnxruntime(model, r.model)


def test_per_channel_conv_weights_fuse():
    g = G()
    x = g.qdq_input([1, 2, 5, 5])
    w = g.dq(g.init("w", g.rng.integers(-50, 50, (3, 2, 3, 3)).astype(np.int8)), [0.01, 0.02, 0.03], [0, 0, 0],
             I8, axis=0)
    y = g.node("Conv", [x, w])
    model = g.model([g.dq(g.q(y, 0.1, 120), 0.1, 120)])
    r = fuse_qdq(model)
    assert ops(r.model) == ["QuantizeLinear", "QLinearConv", "DequantizeLinear"]
    assert_matches_onnxruntime(model, r.model)


def matmul_model(q_after: bool = True) -> onnx.ModelProto:
    g = G()
    a = g.qdq_input([3, 8])
    y = g.node("MatMul", [a, g.weight([8, 5])], name="mm")
    return g.model([g.dq(g.q(y, 0.08, 128), 0.08, 128) if q_after else y])


def test_matmul_unit_becomes_qlinear_matmul():
    model = matmul_model()
    r = fuse_qdq(model)
    assert ops(r.model) == ["QuantizeLinear", "QLinearMatMul", "DequantizeLinear"]
    assert_matches_onnxruntime(model, r.model)


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_binary_units_become_contrib_qlinear_ops(op):
    g = G()
    a, b = g.qdq_input([2, 4], 0.05, 128), g.qdq_input([4], 0.03, 100)
    y = g.node(op, [a, b])
    model = g.model([g.dq(g.q(y, 0.1, 128), 0.1, 128)])
    r = fuse_qdq(model)
    node = r.units[0].node
    assert (node.op_type, node.domain, len(node.input)) == ("QLinear" + op, "com.microsoft", 8)
    assert any(o.domain == "com.microsoft" for o in r.model.opset_import)
    assert_matches_onnxruntime(model, r.model)


UNARY = [("Sigmoid", {}), ("LeakyRelu", {"alpha": 0.25}), ("Softmax", {"axis": -1}),
         ("AveragePool", {"kernel_shape": [2, 2]}), ("GlobalAveragePool", {})]


@pytest.mark.parametrize("op,attrs", UNARY, ids=[u[0] for u in UNARY])
def test_unary_units_become_contrib_qlinear_ops(op, attrs):
    g = G()
    x = g.qdq_input([1, 2, 4, 4])
    y = g.node(op, [x], **attrs)
    model = g.model([g.dq(g.q(y, 1 / 256 if op == "Softmax" else 0.05, 0 if op == "Softmax" else 128),
                          1 / 256 if op == "Softmax" else 0.05, 0 if op == "Softmax" else 128)])
    r = fuse_qdq(model)
    node = r.units[0].node
    assert (node.op_type, node.domain) == ("QLinear" + op, "com.microsoft")
    got = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert got == ({**attrs, "opset": 13} if op == "Softmax" else attrs)  # Softmax-13 is opset 21's
    assert_matches_onnxruntime(model, r.model)


def test_concat_unit_becomes_qlinear_concat():
    g = G()
    a, b = g.qdq_input([1, 2, 3], 0.05, 128), g.qdq_input([1, 3, 3], 0.02, 90)
    y = g.node("Concat", [a, b], axis=1)
    model = g.model([g.dq(g.q(y, 0.06, 120), 0.06, 120)])
    r = fuse_qdq(model)
    node = r.units[0].node
    assert node.op_type == "QLinearConcat" and len(node.input) == 2 + 2 * 3
    assert_matches_onnxruntime(model, r.model)


@pytest.mark.parametrize("q_after", [True, False], ids=["quantized-output", "float-output"])
def test_gemm_unit_becomes_qgemm(q_after):
    g = G()
    a = g.qdq_input([3, 6])
    b = g.weight([4, 6])
    c = g.dq(g.init("b", np.array([5, -7, 100, 0], np.int32)), 0.05 * 0.02, 0, I32)
    y = g.node("Gemm", [a, b, c], transB=1, beta=1.0, alpha=1.0)
    model = g.model([g.dq(g.q(y, 0.07, 128), 0.07, 128) if q_after else y])
    r = fuse_qdq(model)
    node = r.units[0].node
    assert node.op_type == "QGemm" and "beta" not in {a.name for a in node.attribute}
    assert len(node.input) == (9 if q_after else 7)
    assert_matches_onnxruntime(model, r.model)


@pytest.mark.parametrize("op", ["MaxPool", "Reshape", "Transpose"])
def test_data_movement_between_equal_params_drops_the_pair(op):
    g = G()
    x = g.qdq_input([1, 2, 4, 4], 0.05, 128)
    if op == "MaxPool":
        y = g.node(op, [x], kernel_shape=[2, 2])
    elif op == "Reshape":
        y = g.node(op, [x, g.init("shape", np.array([1, -1], np.int64))])
    else:
        y = g.node(op, [x], perm=[0, 2, 3, 1])
    model = g.model([g.dq(g.q(y, 0.05, 128), 0.05, 128)])
    r = fuse_qdq(model)
    assert ops(r.model) == ["QuantizeLinear", op, "DequantizeLinear"]
    (unit,) = r.units
    assert unit.rule == "drop" and unit.node.input[0] == model.graph.node[0].output[0]
    assert_matches_onnxruntime(model, r.model)


def test_a_relu_the_quantize_makes_redundant_joins_the_unit():
    g = G()
    x = g.qdq_input([1, 3, 5, 5])
    y = g.node("Relu", [g.node("Conv", [x, g.weight([2, 3, 1, 1])])])
    model = g.model([g.dq(g.q(y, 0.05, 0), 0.05, 0)])
    r = fuse_qdq(model)
    assert ops(r.model) == ["QuantizeLinear", "QLinearConv", "DequantizeLinear"]
    assert [n.op_type for n in r.units[0].nodes] == ["DequantizeLinear", "DequantizeLinear", "Conv", "Relu",
                                                    "QuantizeLinear"]
    assert_matches_onnxruntime(model, r.model)


def test_a_shared_dequantize_feeds_both_fused_units_and_goes():
    """onnxruntime duplicates a DequantizeLinear per consumer: both consumers fuse."""
    g = G()
    x = g.qdq_input([1, 2, 4, 4])
    a = g.node("Conv", [x, g.weight([2, 2, 1, 1])])
    s = g.node("Add", [g.dq(g.q(a, 0.05, 128), 0.05, 128), x])
    model = g.model([g.dq(g.q(s, 0.1, 128), 0.1, 128)])
    r = fuse_qdq(model)
    assert ops(r.model) == ["QuantizeLinear", "QLinearConv", "QLinearAdd", "DequantizeLinear"]
    assert_matches_onnxruntime(model, r.model)


def test_a_dequantize_another_consumer_reads_stays_for_it():
    g = G()
    x = g.qdq_input([1, 2, 4, 4])
    y = g.node("Sigmoid", [x])
    model = g.model([g.dq(g.q(y, 1 / 256, 0), 1 / 256, 0), g.node("Abs", [x])])
    r = fuse_qdq(model)
    assert ops(r.model) == ["QuantizeLinear", "DequantizeLinear", "QLinearSigmoid", "DequantizeLinear", "Abs"]
    assert_matches_onnxruntime(model, r.model)


def test_a_missing_zero_point_becomes_a_zero_initializer():
    g = G()
    x = g.name("x")
    g.inputs.append(helper.make_tensor_value_info(x, F, [2, 3]))
    s = g.init("s", np.float32(0.05))
    xq = g.node("QuantizeLinear", [x, s])       # uint8, zero point 0
    y = g.node("Sigmoid", [g.node("DequantizeLinear", [xq, s])])
    out = g.node("DequantizeLinear", [g.node("QuantizeLinear", [y, g.init("s", np.float32(1 / 256))]), s])
    model = g.model([out])
    r = fuse_qdq(model)
    node = r.units[0].node
    assert node.input[2] == node.input[4] == "qdq_fusion_zero_point_uint8"
    zp = {t.name: numpy_helper.to_array(t) for t in r.model.graph.initializer}["qdq_fusion_zero_point_uint8"]
    assert zp.dtype == np.uint8 and zp.shape == () and zp == 0
    assert_matches_onnxruntime(model, r.model)


def test_the_input_model_is_not_changed():
    model = conv_model()
    before = model.SerializeToString()
    fuse_qdq(model)
    assert model.SerializeToString() == before


# ----------------------------------------------------------------------------- each condition declines


def declined(model, **kw) -> str:
    r = fuse_qdq(model, **kw)
    assert not r.units, [u.rule for u in r.units]
    assert r.model.SerializeToString() == model.SerializeToString()
    assert r.declined
    return r.declined[0][2]


def test_matmul_without_quantize_is_not_fused():
    assert "MatMulIntegerToFloat" in declined(matmul_model(q_after=False))


def test_a_target_with_another_consumer_is_not_fused():
    g = G()
    x = g.qdq_input([2, 3])
    y = g.node("Sigmoid", [x])
    model = g.model([g.dq(g.q(y, 1 / 256, 0), 1 / 256, 0), g.node("Neg", [y])])
    assert "consumers other than one QuantizeLinear" in declined(model)


def test_a_target_whose_output_is_a_graph_output_is_not_fused():
    g = G()
    x = g.qdq_input([2, 3])
    y = g.node("Sigmoid", [x])
    model = g.model([g.dq(g.q(y, 1 / 256, 0), 1 / 256, 0), y])
    assert "graph output" in declined(model)


def test_int8_activations_fuse_only_where_int8_is_allowed():
    g = G()
    x = g.qdq_input([1, 2, 4, 4], 0.05, 0, I8)
    y = g.node("Conv", [x, g.weight([2, 2, 1, 1])])
    model = g.model([g.dq(g.q(y, 0.05, 0, I8), 0.05, 0, I8)])
    assert "int8 activations" in declined(model)
    assert [u.rule for u in fuse_qdq(model, int8_allowed=True).units] == ["conv"]


def test_input_and_output_types_must_match():
    g = G()
    x = g.qdq_input([2, 3], 0.05, 128, U8)
    y = g.node("Sigmoid", [x])
    model = g.model([g.dq(g.q(y, 1 / 256, 0, I8), 1 / 256, 0, I8)])
    assert "types differ" in declined(model)


def test_a_float_bias_keeps_conv_as_written():
    g = G()
    x = g.qdq_input([1, 2, 4, 4])
    y = g.node("Conv", [x, g.weight([2, 2, 1, 1]), g.init("b", np.float32([0.5, -0.5]))])
    model = g.model([g.dq(g.q(y, 0.05, 128), 0.05, 128)])
    assert "2 of 3" in declined(model)


def test_sixteen_bit_units_are_not_fused():
    g = G()
    a, b = g.qdq_input([4], 0.001, 0, TP.UINT16), g.qdq_input([4], 0.001, 0, TP.UINT16)
    y = g.node("Add", [a, b])
    model = g.model([g.dq(g.q(y, 0.002, 0, TP.UINT16), 0.002, 0, TP.UINT16)])
    assert "16-bit" in declined(model)


@pytest.mark.parametrize("q_scale,q_zp,why", [(0.06, 128, "parameters differ"), (0.05, 127, "parameters differ"),
                                              (-0.05, 128, "not positive")])
def test_a_pair_is_dropped_only_with_equal_positive_params(q_scale, q_zp, why):
    g = G()
    x = g.qdq_input([1, 2, 4, 4], -0.05 if q_scale < 0 else 0.05, 128)
    y = g.node("MaxPool", [x], kernel_shape=[2, 2])
    model = g.model([g.dq(g.q(y, q_scale, q_zp), q_scale, q_zp)])
    assert why in declined(model)


def test_an_initializer_a_feed_can_override_is_not_a_constant():
    # the pair's parameters are initializers listed among the graph inputs: a feed may replace
    # them, so they are not constant and the pair stays (as onnxruntime keeps it)
    g = G()
    x = g.qdq_input([1, 2, 4, 4], 0.05, 128)
    y = g.node("MaxPool", [x], kernel_shape=[2, 2])
    model = g.model([g.dq(g.q(y, 0.05, 128), 0.05, 128)])
    q = model.graph.node[-2]
    model.graph.input.extend([helper.make_tensor_value_info(q.input[1], F, []),
                              helper.make_tensor_value_info(q.input[2], U8, [])])
    assert "not constant" in declined(model)


def test_a_relu_the_quantize_does_not_make_redundant_blocks_the_unit():
    g = G()
    x = g.qdq_input([1, 3, 5, 5])
    y = g.node("Relu", [g.node("Conv", [x, g.weight([2, 3, 1, 1])])])
    model = g.model([g.dq(g.q(y, 0.05, 10), 0.05, 10)])
    assert "not made redundant" in declined(model)


def test_a_clip_joins_only_when_its_bounds_quantize_outside_the_range():
    def model_with(lo, hi):
        g = G()
        x = g.qdq_input([1, 3, 5, 5])
        c = g.node("Conv", [x, g.weight([2, 3, 1, 1])])
        y = g.node("Clip", [c, g.init("lo", np.float32(lo)), g.init("hi", np.float32(hi))])
        return g.model([g.dq(g.q(y, 0.05, 0), 0.05, 0)])

    wide = model_with(-1.0, 13.0)   # quantizes to [-20, 260]: covers uint8's [0, 255]
    r = fuse_qdq(wide)
    assert [n.op_type for n in r.units[0].nodes][-2:] == ["Clip", "QuantizeLinear"]
    assert_matches_onnxruntime(wide, r.model)
    assert "not made redundant" in declined(model_with(0.0, 6.0))  # 6 / 0.05 = 120 < 255


def test_gemm_with_a_bias_needs_beta_one():
    g = G()
    a = g.qdq_input([3, 6])
    c = g.dq(g.init("b", np.array([5, -7, 100, 0], np.int32)), 0.05 * 0.02, 0, I32)
    y = g.node("Gemm", [a, g.weight([6, 4]), c], beta=0.5)
    model = g.model([g.dq(g.q(y, 0.07, 128), 0.07, 128)])
    assert "beta" in declined(model)


def test_a_replacement_no_kernel_takes_is_declined():
    why = declined(conv_model(), supported=lambda node, domain, version: "no kernel in this test")
    assert "no kernel takes QLinearConv: no kernel in this test" in why


# ----------------------------------------------------------------------------- whole models


@pytest.fixture(scope="module")
def zoo():
    from onnx_quant import model_zoo

    logging.getLogger().setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "cnn": (model_zoo.quantized("cnn", "qdq", blocks=1, channels=4), {"N": 2, "H": 8, "W": 8}),
            "mlp": (model_zoo.quantized("mlp", "qdq", layers=2, features=16, hidden=16), {"N": 3}),
            "transformer": (model_zoo.quantized("transformer", "qdq", blocks=1, d_model=16, heads=2, ffn=32),
                            {"B": 2, "S": 4}),
        }


@pytest.mark.parametrize("family", ["cnn", "mlp", "transformer"])
def test_zoo_qdq_models_fuse_as_onnxruntime_does(zoo, family):
    from onnx_quant import model_zoo

    model, dims = zoo[family]
    r = fuse_qdq(model)
    feeds = model_zoo.random_feeds(model, dims, seed=3)
    want, got = ort_run(model, feeds, True), ort_run(r.model, feeds, False)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    ours = collections.Counter(n.op_type for n in r.model.graph.node if n.op_type.startswith(("QLinear", "QGemm")))
    assert ours == ort_fused_ops(model)
    # what stays: the input's QuantizeLinear, the output's DequantizeLinear and ops with no QDQ unit
    left = collections.Counter(ops(r.model))
    assert left["QuantizeLinear"] == left["DequantizeLinear"] == 1 or family == "transformer"
    print(f"{family}: {len(model.graph.node)} -> {len(r.model.graph.node)} nodes {dict(left)}")


def test_onnxruntime_optimization_levels_map_to_fusion():
    import onnxruntime as ort

    from onnx_quant.backend_wgpu.inference_session import GraphOptimizationLevel, SessionOptions, fuses_qdq

    assert fuses_qdq(SessionOptions()) and fuses_qdq(object())  # the default: all optimizations
    levels = GraphOptimizationLevel
    for level, fused in [(levels.ORT_DISABLE_ALL, False), (levels.ORT_ENABLE_BASIC, False),
                         (levels.ORT_ENABLE_EXTENDED, True), (levels.ORT_ENABLE_ALL, True)]:
        for options in (SessionOptions(), ort.SessionOptions()):
            options.graph_optimization_level = level if isinstance(options, SessionOptions) else \
                getattr(ort.GraphOptimizationLevel, level.name)
            assert fuses_qdq(options) == fused, (type(options).__module__, level)

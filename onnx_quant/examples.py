"""Built-in example models: small quantized graphs built with ``onnx.helper``.

They exercise the whole quantization family with symbolic dims and are what
``onnx-quant infer example`` and the demo run. Weights are tiny and drawn from a fixed
seed, so every call builds the same bytes.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 21
IR_VERSION = 10  # the IR version opset 21 ships with; onnxruntime loads it


def _init(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def _model(graph: onnx.GraphProto, doc: str) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="onnx-quant",
        producer_version="examples",
        doc_string=doc,
    )
    return model


def cnn_model() -> onnx.ModelProto:
    """A quantized CNN: QuantizeLinear -> QLinearConv -> DequantizeLinear -> Relu ->
    GlobalAveragePool -> Flatten -> DynamicQuantizeLinear -> MatMulInteger -> rescale.

    Input ``image`` float [N, 3, H, W] (N, H, W symbolic); output ``logits`` float [N, 10].
    The fully connected tail is onnxruntime's dynamic-quantization pattern: the int32
    accumulator is cast to float and multiplied by ``x_scale * w_scale``.
    """
    rng = np.random.default_rng(20240521)
    c_in, c_out, classes = 3, 8, 10

    x_scale = np.float32(1.0 / 64)
    x_zp = np.uint8(128)
    w = rng.integers(-127, 128, size=(c_out, c_in, 3, 3)).astype(np.int8)
    w_scale = (rng.uniform(0.002, 0.01, size=c_out)).astype(np.float32)  # per output channel
    w_zp = np.zeros(c_out, dtype=np.int8)  # symmetric int8 weights, as quantizers emit them
    bias = rng.integers(-2000, 2000, size=c_out).astype(np.int32)  # scale x_scale * w_scale[c]
    y_scale = np.float32(0.05)
    y_zp = np.uint8(0)
    fc_w = rng.integers(-127, 128, size=(c_out, classes)).astype(np.int8)
    fc_w_scale = np.float32(0.01)
    fc_w_zp = np.int8(0)

    initializers = [
        _init("x_scale", x_scale), _init("x_zero_point", x_zp),
        _init("conv_w", w), _init("conv_w_scale", w_scale), _init("conv_w_zero_point", w_zp),
        _init("conv_bias", bias), _init("conv_y_scale", y_scale), _init("conv_y_zero_point", y_zp),
        _init("flatten_shape", np.array([0, -1], dtype=np.int64)),
        _init("fc_w", fc_w), _init("fc_w_scale", fc_w_scale), _init("fc_w_zero_point", fc_w_zp),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["image", "x_scale", "x_zero_point"], ["image_q"], name="quantize_input"),
        helper.make_node(
            "QLinearConv",
            ["image_q", "x_scale", "x_zero_point", "conv_w", "conv_w_scale", "conv_w_zero_point",
             "conv_y_scale", "conv_y_zero_point", "conv_bias"],
            ["conv_q"], name="conv", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
        ),
        helper.make_node("DequantizeLinear", ["conv_q", "conv_y_scale", "conv_y_zero_point"], ["conv_out"], name="dequantize_conv"),
        helper.make_node("Relu", ["conv_out"], ["relu_out"], name="relu"),
        helper.make_node("GlobalAveragePool", ["relu_out"], ["pooled"], name="pool"),
        helper.make_node("Reshape", ["pooled", "flatten_shape"], ["features"], name="flatten"),
        helper.make_node("DynamicQuantizeLinear", ["features"], ["features_q", "features_scale", "features_zero_point"], name="quantize_features"),
        helper.make_node("MatMulInteger", ["features_q", "fc_w", "features_zero_point", "fc_w_zero_point"], ["fc_acc"], name="fc"),
        helper.make_node("Cast", ["fc_acc"], ["fc_acc_f"], name="fc_cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["features_scale", "fc_w_scale"], ["fc_scale"], name="fc_scale"),
        helper.make_node("Mul", ["fc_acc_f", "fc_scale"], ["logits"], name="fc_rescale"),
    ]
    graph = helper.make_graph(
        nodes, "quantized_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", c_in, "H", "W"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        initializers,
    )
    return _model(graph, "onnx-quant example: a small quantized CNN (QOperator conv, dynamic-quantized fc)")


def qlinear_matmul_model() -> onnx.ModelProto:
    """QuantizeLinear -> QLinearMatMul (int8 weights) -> DequantizeLinear on [N, 16] -> [N, 4]."""
    rng = np.random.default_rng(7)
    k, m = 16, 4
    initializers = [
        _init("a_scale", np.float32(0.02)), _init("a_zero_point", np.uint8(128)),
        _init("b", rng.integers(-127, 128, size=(k, m)).astype(np.int8)),
        _init("b_scale", np.float32(0.005)), _init("b_zero_point", np.int8(0)),
        _init("y_scale", np.float32(0.1)), _init("y_zero_point", np.uint8(128)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "a_scale", "a_zero_point"], ["x_q"], name="quantize"),
        helper.make_node(
            "QLinearMatMul",
            ["x_q", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point"],
            ["y_q"], name="matmul",
        ),
        helper.make_node("DequantizeLinear", ["y_q", "y_scale", "y_zero_point"], ["y"], name="dequantize"),
    ]
    graph = helper.make_graph(
        nodes, "qlinear_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", m])],
        initializers,
    )
    return _model(graph, "onnx-quant example: QLinearMatMul")


def qdq_model() -> onnx.ModelProto:
    """A QDQ-format linear layer: activations Q/DQ per tensor, int4 weights dequantized
    block-wise (block_size 4 along the input dim), then a float MatMul: [B, S, 8] -> [B, S, 6]."""
    rng = np.random.default_rng(11)
    k, m, block = 8, 6, 4
    w_q = rng.integers(-8, 8, size=(k, m)).astype(np.int8)
    initializers = [
        _init("act_scale", np.float32(0.05)), _init("act_zero_point", np.int8(0)),
        # make_tensor packs the int4 values two per byte
        helper.make_tensor("w_q", TensorProto.INT4, (k, m), w_q.flatten().tolist()),
        _init("w_scale", rng.uniform(0.01, 0.1, size=(k // block, m)).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "act_scale", "act_zero_point"], ["x_q"], name="quantize_x"),
        helper.make_node("DequantizeLinear", ["x_q", "act_scale", "act_zero_point"], ["x_dq"], name="dequantize_x"),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale"], ["w"], name="dequantize_w", axis=0, block_size=block),
        helper.make_node("MatMul", ["x_dq", "w"], ["y"], name="matmul"),
    ]
    graph = helper.make_graph(
        nodes, "qdq_linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", m])],
        initializers,
    )
    return _model(graph, "onnx-quant example: QDQ linear layer with block-quantized int4 weights")


_EXAMPLES: dict[str, Callable[[], onnx.ModelProto]] = {
    "cnn": cnn_model,
    "qlinear_matmul": qlinear_matmul_model,
    "qdq": qdq_model,
}


def example_model() -> onnx.ModelProto:
    """The built-in example (the quantized CNN), what the model name ``example`` loads."""
    return cnn_model()


def example_models() -> dict[str, onnx.ModelProto]:
    """Every built-in example by name (``cnn`` is ``example_model()``)."""
    return {name: build() for name, build in _EXAMPLES.items()}

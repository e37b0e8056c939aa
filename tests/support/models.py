"""Test models: one builder for a graph from nodes (:func:`make_model`), one for a single node
fed by arrays (:func:`node_model`), and the models several test modules share.

A module's builder for its kind of model (its op's inputs and attributes) builds the nodes and
hands the graph to :func:`make_model`, so that what a test model looks like (graph name ``g``,
opset imports, IR version, how an untyped output is declared) is decided in one place.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = np.float32


def vi(name: str, elem_type: int, shape) -> onnx.ValueInfoProto:
    """A tensor ValueInfoProto (``shape`` None: rank unknown)."""
    return helper.make_tensor_value_info(name, elem_type, shape)


def value_info_of(name: str, array) -> onnx.ValueInfoProto:
    """A ValueInfoProto typed like ``array`` (its dtype and shape)."""
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)


def _value_info(v) -> onnx.ValueInfoProto:
    if isinstance(v, onnx.ValueInfoProto):
        return v
    if isinstance(v, str):  # a name only: type and shape left to inference
        return onnx.ValueInfoProto(name=v)
    return vi(*v)  # (name, elem_type, shape)


def _opset_imports(opset, extra_opsets) -> list[onnx.OperatorSetIdProto]:
    pairs = [("", opset)] if isinstance(opset, int) else list(opset)
    pairs += [(d, 1) if isinstance(d, str) else tuple(d) for d in extra_opsets]
    return [helper.make_opsetid(d, v) for d, v in pairs]


def make_model(nodes, inputs=(), outputs=("y",), inits=(), opset=17, *, extra_opsets=(), value_info=(),
               functions=(), ir_version: int | None = None, graph_name: str = "g") -> onnx.ModelProto:
    """A model of one graph.

    ``nodes``: a NodeProto or a list of them. ``inputs`` / ``outputs``: ValueInfoProtos, names
    (declared without a type: inference fills it in) or ``(name, elem_type, shape)``.
    ``inits``: TensorProtos, or a mapping name -> array. ``opset``: the ai.onnx version, or
    every ``(domain, version)`` import in order; ``extra_opsets``: imports after ai.onnx's, each a
    ``(domain, version)`` pair or a domain name (version 1). ``ir_version``: None keeps
    onnx.helper's (the newest this onnx writes).
    """
    if isinstance(nodes, onnx.NodeProto):
        nodes = [nodes]
    if isinstance(inits, Mapping):
        inits = [numpy_helper.from_array(np.asarray(a), n) for n, a in inits.items()]
    graph = helper.make_graph(list(nodes), graph_name, [_value_info(v) for v in inputs],
                              [_value_info(v) for v in outputs], initializer=list(inits),
                              value_info=[_value_info(v) for v in value_info])
    kw = {} if ir_version is None else {"ir_version": ir_version}
    return helper.make_model(graph, opset_imports=_opset_imports(opset, extra_opsets), functions=list(functions), **kw)


def node_model(op: str, inputs, outputs, *, attrs=None, domain: str = "", opset: int = 17,
               out_types=None, inits=None) -> onnx.ModelProto:
    """A one-node model. ``inputs``: (name, array or None for an absent optional input), graph
    inputs typed like their arrays; ``inits``: name -> array, inputs stored as initializers
    (their values feed inference); ``out_types``: the outputs' dtypes (default: the first
    present input's), their shapes left to inference. A ``domain`` is imported at version 1."""
    inits = dict(inits or {})
    present = [(n, a) for n, a in inputs if a is not None]
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
           for n, a in present if n not in inits]
    node = helper.make_node(op, [n if a is not None else "" for n, a in inputs], list(outputs),
                            domain=domain, **(attrs or {}))
    types = out_types or [present[0][1].dtype] * len(outputs)
    outs = [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(np.dtype(t)), None)
            for o, t in zip(outputs, types)]
    return make_model([node], vis, outs, [numpy_helper.from_array(a, n) for n, a in inits.items()], opset,
                      extra_opsets=[domain] if domain else ())


# ----------------------------------------------------------------------------- shared models

#: small sizes of the model zoo's families (``model_zoo.quantized`` keywords) and their dims
ZOO = {
    "cnn": (dict(blocks=1, channels=4), {"N": 2, "H": 8, "W": 8}),
    "mlp": (dict(layers=2, features=16, hidden=16), {"N": 3}),
    "transformer": (dict(blocks=1, d_model=16, heads=2, ffn=32), {"B": 2, "S": 4}),
}


def qsm_model(x, x_scale, y_scale, y_zp, axis, opset, with_y_zp=True):
    """One com.microsoft QLinearSoftmax over ``x`` (its scales and zero points initializers)."""
    dt = helper.np_dtype_to_tensor_dtype(x.dtype)
    attrs = {"opset": opset} | ({} if axis is None else {"axis": axis})
    names = ["x", "x_scale", "x_zp", "y_scale"] + (["y_zp"] if with_y_zp else [])
    node = helper.make_node("QLinearSoftmax", names, ["y"], domain="com.microsoft", name="qsm", **attrs)
    inits = [numpy_helper.from_array(np.asarray(x_scale, F32), "x_scale"),
             numpy_helper.from_array(np.zeros((), x.dtype), "x_zp"),
             numpy_helper.from_array(np.asarray(y_scale, F32), "y_scale")]
    if with_y_zp:
        inits.append(numpy_helper.from_array(np.asarray(y_zp, x.dtype), "y_zp"))
    return make_model([node], [helper.make_tensor_value_info("x", dt, x.shape)],
                      [helper.make_tensor_value_info("y", dt, None)], inits, 21, extra_opsets=["com.microsoft"])


# the conv family (tests/backend/test_polymorphic_conv.py at two batch sizes,
# tests/backend/test_polymorphic_spatial.py at symbolic image dims)

def _conv_model(nodes, inputs, outputs, inits=(), opset=17):
    return make_model(nodes, inputs, outputs, inits, opset, ir_version=10)


def qlinear_conv_model(image=(6, 5)):
    """A grouped QLinearConv (uint8 x int8, per-channel weights, bias); ``image``: the input's
    spatial dims (ints or symbols)."""
    rng = np.random.default_rng(1)
    M, Cg, G = 6, 2, 2
    inits = [
        numpy_helper.from_array(np.array(0.05, F32), "x_scale"),
        numpy_helper.from_array(np.array(7, np.uint8), "x_zero_point"),
        numpy_helper.from_array(rng.integers(-128, 128, [M, Cg, 3, 3]).astype(np.int8), "w"),
        numpy_helper.from_array((rng.random(M) * 0.02 + 0.005).astype(F32), "w_scale"),
        numpy_helper.from_array(rng.integers(-4, 5, M).astype(np.int8), "w_zero_point"),
        numpy_helper.from_array(np.array(0.3, F32), "y_scale"),
        numpy_helper.from_array(np.array(120, np.uint8), "y_zero_point"),
        numpy_helper.from_array(rng.integers(-500, 500, M).astype(np.int32), "B"),
    ]
    names = ["x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "B"]
    node = helper.make_node("QLinearConv", names, ["y"], group=G, pads=[1, 1, 1, 1], strides=[1, 1])
    return _conv_model([node], [vi("x", TensorProto.UINT8, ["N", Cg * G, *image])], [vi("y", TensorProto.UINT8, None)],
                       inits, opset=10)


def conv_integer_model(image=(7, 6)):
    """A strided, asymmetrically padded ConvInteger (uint8, both zero points)."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.integers(0, 256, [5, 3, 3, 2]).astype(np.uint8), "w"),
             numpy_helper.from_array(np.array(11, np.uint8), "x_zero_point"),
             numpy_helper.from_array(np.array(130, np.uint8), "w_zero_point")]
    node = helper.make_node("ConvInteger", ["x", "w", "x_zero_point", "w_zero_point"], ["y"],
                            pads=[1, 0, 1, 1], strides=[2, 1])
    return _conv_model([node], [vi("x", TensorProto.UINT8, ["N", 3, *image])], [vi("y", TensorProto.INT32, None)],
                       inits, opset=10)


def dynamic_conv_unit(shared, image=(7, 6), strides=(1, 1)):
    """DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul -> Add -> Relu, as quantize_dynamic
    writes it (dynamic_fusion.py fuses it into DynamicQuantizeConv, or ConvIntegerToFloat when
    the quantized x has a second consumer)."""
    rng = np.random.default_rng(3)
    M = 4
    inits = [numpy_helper.from_array(rng.integers(-127, 128, [M, 3, 3, 3]).astype(np.int8), "W"),
             numpy_helper.from_array((rng.random([1, M, 1, 1]) * 0.02 + 0.001).astype(F32), "w_scale"),
             numpy_helper.from_array(np.array(3, np.int8), "w_zp"),
             numpy_helper.from_array(rng.standard_normal([1, M, 1, 1]).astype(F32), "bias")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("Mul", ["xs", "w_scale"], ["s"]),
             helper.make_node("ConvInteger", ["xq", "W", "xz", "w_zp"], ["acc"], pads=[1, 1, 1, 1], strides=list(strides)),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "s"], ["scaled"]),
             helper.make_node("Add", ["scaled", "bias"], ["biased"]),
             helper.make_node("Relu", ["biased"], ["y"])]
    outputs = [vi("y", TensorProto.FLOAT, None)]
    if shared:
        nodes.append(helper.make_node("Identity", ["xq"], ["xq_out"]))
        outputs.append(vi("xq_out", TensorProto.UINT8, None))
    return _conv_model(nodes, [vi("x", TensorProto.FLOAT, ["N", 3, *image])], outputs, inits, opset=21)


def float_conv_model(relu, image=(6, 7), **attrs):
    """Conv [-> Relu]; ``attrs``: the Conv's (default pads 1, strides [1, 2])."""
    attrs = attrs or {"pads": [1, 1, 1, 1], "strides": [1, 2]}
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal([8, 3, 3, 3]).astype(F32), "w"),
             numpy_helper.from_array(rng.standard_normal(8).astype(F32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if relu else "y"], **attrs)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    return _conv_model(nodes, [vi("x", TensorProto.FLOAT, ["N", 3, *image])], [vi("y", TensorProto.FLOAT, None)], inits)


def conv_bn_model(*, relu: bool = False) -> onnx.ModelProto:
    """Conv (4 filters 3 x 3, pads 1) -> BatchNormalization [-> Relu] over x [1, 3, 6, 6], random
    weights and statistics (seed 0), opset 17: the pair the BatchNormalization folding takes."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")]
    for name, value in (("s", rng.uniform(0.5, 1.5, 4)), ("b", rng.standard_normal(4)),
                        ("m", rng.standard_normal(4)), ("v", rng.uniform(0.5, 1.5, 4))):
        inits.append(numpy_helper.from_array(value.astype(np.float32), name))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n" if relu else "y"], name="bn")]
    if relu:
        nodes.append(helper.make_node("Relu", ["n"], ["y"], name="relu"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)



# ----------------------------------------------------------------------------- an op no kernel covers

#: the opset import (domain, version) a model holding :func:`no_kernel_node` needs beside ai.onnx's
NO_KERNEL_OPSET = ("ai.onnx.ml", 1)


def no_kernel_node(x: str, y: str, name: str | None = None) -> onnx.NodeProto:
    """A node of an operator no kernel spec covers, for the tests of host fallback: ai.onnx.ml's
    Binarizer (threshold 0: 1.0 where x > 0, else 0.0; :func:`no_kernel_expected`). Its model imports
    :data:`NO_KERNEL_OPSET` too. (These tests ran Unique until Unique got a kernel.)"""
    return helper.make_node("Binarizer", [x], [y], name=name, domain=NO_KERNEL_OPSET[0])


def no_kernel_expected(x: np.ndarray) -> np.ndarray:
    """What :func:`no_kernel_node` computes of ``x``."""
    return (x > 0).astype(x.dtype)

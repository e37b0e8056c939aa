"""ONNX's own node test cases of the quantization family, typed by this project.

``onnx_quant.node_cases.all_node_cases()`` collects onnx's cases once per process; they are
filtered by the op_type of each case's nodes.
Every graph output's type is stripped (names kept) and must come back exactly as declared,
through ``inference.infer_shapes`` (the whole pass, strict) and, for the one-node cases,
through the rules alone.
"""

from __future__ import annotations

import functools

import onnx
import pytest
from onnx import numpy_helper

import onnx_quant.inference.rules  # noqa: F401
from onnx_quant.inference import infer_shapes, registry
from onnx_quant.inference.context import ShapesContext, TensorInfo
from onnx_quant.inference.registry import NodeContext

FAMILY = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
          "MatMulInteger", "ConvInteger"}

EXPECTED_NAMES = [
    "test_convinteger_without_padding", "test_convinteger_with_padding",
    "test_dequantizelinear", "test_dequantizelinear_axis", "test_dequantizelinear_e4m3fn",
    "test_dequantizelinear_e4m3fn_float16", "test_dequantizelinear_e4m3fn_zero_point",
    "test_dequantizelinear_e5m2", "test_dequantizelinear_uint16", "test_dequantizelinear_int16",
    "test_dequantizelinear_uint4", "test_dequantizelinear_int4", "test_dequantizelinear_uint2",
    "test_dequantizelinear_int2", "test_dequantizelinear_float4e2m1", "test_dequantizelinear_blocked",
    "test_dynamicquantizelinear", "test_dynamicquantizelinear_expanded",
    "test_dynamicquantizelinear_max_adjusted", "test_dynamicquantizelinear_max_adjusted_expanded",
    "test_dynamicquantizelinear_min_adjusted", "test_dynamicquantizelinear_min_adjusted_expanded",
    "test_matmulinteger", "test_qlinearconv",
    "test_qlinearmatmul_2D_uint8_float32", "test_qlinearmatmul_3D_uint8_float32",
    "test_qlinearmatmul_2D_uint8_float16", "test_qlinearmatmul_3D_uint8_float16",
    "test_qlinearmatmul_2D_int8_float32", "test_qlinearmatmul_3D_int8_float32",
    "test_qlinearmatmul_2D_int8_float16", "test_qlinearmatmul_3D_int8_float16",
    "test_quantizelinear", "test_quantizelinear_axis", "test_quantizelinear_e4m3fn", "test_quantizelinear_e5m2",
    "test_quantizelinear_uint16", "test_quantizelinear_int16", "test_quantizelinear_uint4",
    "test_quantizelinear_int4", "test_quantizelinear_uint2", "test_quantizelinear_int2",
    "test_quantizelinear_float4e2m1", "test_quantizelinear_blocked_asymmetric",
    "test_quantizelinear_blocked_symmetric",
]


@functools.lru_cache(maxsize=1)
def family_cases() -> dict[str, onnx.ModelProto]:
    from onnx_quant.node_cases import all_node_cases

    return {
        c.name: c.model for c in all_node_cases()
        if c.model is not None and any(n.op_type in FAMILY for n in c.model.graph.node)
    }


def test_case_count_and_names():
    names = sorted(family_cases())
    assert len(names) == 45
    assert names == sorted(EXPECTED_NAMES)


def stripped(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for vo in out.graph.output:
        vo.ClearField("type")
    del out.graph.value_info[:]
    return out


def declared_outputs(model: onnx.ModelProto) -> dict[str, TensorInfo]:
    return {vo.name: TensorInfo.from_type_proto(vo.type) for vo in model.graph.output}


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_node_case_through_infer_shapes(name):
    model = family_cases()[name]
    want = declared_outputs(model)
    got = infer_shapes(stripped(model), strict=True)
    have = {vo.name: TensorInfo.from_type_proto(vo.type) for vo in got.graph.output}
    assert have == want


@pytest.mark.parametrize("name", [n for n in EXPECTED_NAMES if not n.endswith("_expanded")])
def test_node_case_through_rules(name):
    model = family_cases()[name]
    assert len(model.graph.node) == 1
    opset_map = {o.domain or "": int(o.version) for o in model.opset_import}
    ctx = ShapesContext(opset_map, strict=True)
    for vi in model.graph.input:
        ctx.set(vi.name, TensorInfo.from_type_proto(vi.type))
    for t in model.graph.initializer:
        ctx.set(t.name, TensorInfo.from_array(numpy_helper.to_array(t), t.data_type))
    node = model.graph.node[0]
    rule, version = registry.lookup(node.domain, node.op_type, opset_map[""])
    rule(ctx, NodeContext(node, 0, ctx, version, opset_map[""]))
    for out_name, want in declared_outputs(model).items():
        assert ctx[out_name] == want, out_name

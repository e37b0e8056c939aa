"""Dispatch facts come from ``onnx_quant.opsets`` and agree with ``onnx.defs`` read directly;
onnx's per-node inference (the fallback) is reached through onnx's public
``onnx.shape_inference.infer_node_outputs``."""

from __future__ import annotations

import onnx
import onnx.shape_inference
import pytest
from onnx import TensorProto, defs, helper

from onnx_quant import opsets
from onnx_quant.inference import check_model, dispatch, infer_values
from onnx_quant.inference.context import TensorInfo


def _direct(schema) -> tuple[tuple, tuple | None]:
    """Required inputs and the variadic one, read from the schema itself."""
    required, var = [], None
    for i, p in enumerate(schema.inputs):
        if p.option == defs.OpSchema.FormalParameterOption.Single:
            required.append(i)
        elif p.option == defs.OpSchema.FormalParameterOption.Variadic and p.min_arity > 0:
            var = (i, int(p.min_arity), p.name)
    return tuple(required), var


def test_schema_facts_equal_onnx_defs_for_every_schema_version():
    checked = 0
    for s in defs.get_all_schemas_with_history():
        domain = "" if s.domain in ("", "ai.onnx") else s.domain
        schema, required, variadic = dispatch.schema_facts(domain, s.name, s.since_version)
        assert schema is not None and schema.since_version == s.since_version, (s.domain, s.name)
        assert (required, variadic) == _direct(s), (s.domain, s.name, s.since_version)
        checked += 1
    assert checked > 600  # every version of every operator of the installed onnx


def test_opsets_schema_is_the_one_onnx_selects_or_none():
    assert opsets.schema("Relu", 13).since_version == 13
    assert opsets.schema("Relu", 12).since_version == 6
    assert opsets.schema("Relu", 13, "ai.onnx").since_version == 13
    assert opsets.schema("NoSuchOp", 13) is None
    assert opsets.schema("Attention", 21) is None  # defined from opset 23 only
    concat = opsets.op_facts("Concat", 13).inputs[0]
    assert concat.variadic and concat.min_arity == 1
    assert opsets.op_facts("Conv", 11).inputs[2].optional


def test_unknown_op_names_the_opset_it_first_appears_in():
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"])
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 3, 4]) for n in "qkv"]
    model = helper.make_model(helper.make_graph(
        [node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 21)])
    found = [d for d in check_model(model) if d.rule == "unknown-op"]
    assert found and "first appears in opset 23" in found[0].message


def test_the_fallback_goes_through_onnx_public_infer_node_outputs(monkeypatch):
    calls = []
    public = onnx.shape_inference.infer_node_outputs

    def counting(schema, node, *args, **kwargs):
        calls.append(schema.name)
        return public(schema, node, *args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_node_outputs", counting)
    # Det has no rule of this project: onnx types it; its reduced dims come from onnx's answer
    node = helper.make_node("Det", ["x"], ["y"])
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 17)])
    values = infer_values(model, strict=True)
    assert calls == ["Det"]
    assert values["y"] == TensorInfo(TensorProto.FLOAT, (5,))


@pytest.mark.parametrize("shape", [[4, "N"], None])
def test_the_fallback_hands_onnx_small_constants_as_data(shape):
    """Reshape's shape (a rule's business) aside, onnx reads small constant inputs of ops it
    types: Tile's repeats here."""
    repeats = helper.make_tensor("r", TensorProto.INT64, [2], [2, 3])
    node = helper.make_node("Tile", ["x", "r"], ["y"])
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], [repeats]),
        opset_imports=[helper.make_opsetid("", 17)])
    y = infer_values(model)["y"]
    assert y.elem_type == TensorProto.FLOAT and y.shape == (4, 15)

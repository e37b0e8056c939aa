"""``inference.functions`` and ``inference.subgraphs`` see the pass only through
``inference.protocol.InferencePass``: the engine's pass has every member of it, and the two
modules use no other attribute of the pass they receive (read from their source with ast)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from onnx import TensorProto, helper

from onnx_quant.inference import engine, functions, protocol, subgraphs

MEMBERS = {name for name in vars(protocol.InferencePass) if not name.startswith("_")} | \
    set(protocol.InferencePass.__annotations__)


def test_the_protocol_names_what_the_helpers_need():
    assert {"strict", "opsets", "diagnostics", "raise_or_record", "from_type_proto", "dispatch_table", "walk",
            "infer_body", "body_outputs", "forced", "note_rank_split"} == MEMBERS


def test_the_engine_pass_has_every_member():
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]))
    p = engine.Pass(model, strict=False)
    for name in MEMBERS:
        assert hasattr(p, name), name
        declared = getattr(protocol.InferencePass, name, None)
        if callable(declared):
            assert callable(getattr(p, name)), name
            ours = inspect.signature(getattr(engine.Pass, name))
            assert list(ours.parameters) == list(inspect.signature(declared).parameters), name


@pytest.mark.parametrize("module", [functions, subgraphs], ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_the_helpers_use_nothing_else_of_the_pass(module):
    tree = ast.parse(Path(module.__file__).read_text())
    used = {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "p"}
    assert used and used <= MEMBERS, sorted(used - MEMBERS)
    assert "__dict__" not in Path(module.__file__).read_text()

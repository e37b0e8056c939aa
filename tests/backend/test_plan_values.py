"""Plan-time input values: a spec input declared ``"constant": true`` is read when the node is
planned (``values.<name>``), and a Session keys its plans on the contents of the small integer
graph inputs a plan needs (graph_plan.value_keyed_inputs)."""

from __future__ import annotations

import dataclasses

import copy
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from onnx import TensorProto as TP, helper

from onnx_quant.backend_wgpu import graph_plan as gp
from onnx_quant.backend_wgpu.device_info import DeviceInfo
from onnx_quant.backend_wgpu.planner import MAX_CONSTANT_ELEMENTS, plan_node
from onnx_quant.errors import ExecutionError, KernelRejected, SpecError
from onnx_quant.inference import infer_values

from support.models import make_model
from support.specs import load_doc, reject, write_spec

SHADER = "k.wgsl.jinja"

#: a Tile-like kernel whose output shape comes from the contents of ``repeats``
DOC = {
    "name": "TileLike", "sinceVersion": 1,
    "inputs": {"x": {"dtype": "T"}, "repeats": {"dtype": "I", "constant": True},
               "offsets": {"dtype": "I", "optional": True, "constant": True}},
    "outputs": {"y": {"dtype": "T", "shape": "outShape"}},
    "typeConstraints": {"T": ["float32"], "I": ["int64"]},
    "derive": {"outShape": "[shapes.x[0] * values.repeats[0], shapes.x[1] * values.repeats[1]]",
               "copies": "values.repeats[0] * values.repeats[1]"},
    "variants": [{"id": "main", "when": ["copies > 0"],
                  "passes": [{"id": "main", "shader": SHADER, "bindings": ["x", "y"], "dispatch": {"x": 1}}]}],
}


def spec(tmp_path, doc=None):
    write_spec(tmp_path, "", name="unused.json", shaders=[SHADER])
    return load_doc(tmp_path, doc or DOC)


def plan(s, repeats, *, x=(2, 3), out=None, **kw):
    r = np.asarray(repeats, np.int64)
    out = out or (x[0] * int(r[0]), x[1] * int(r[1]))
    return plan_node(s, shapes={"x": x, "repeats": (2,), "y": out}, dtypes={"x": "float32", "repeats": "int64",
                     "y": "float32"}, device=DeviceInfo(), values={"repeats": r}, **kw)


def test_values_feed_derive_shapes_and_the_template_context(tmp_path):
    s = spec(tmp_path)
    assert s.inputs["repeats"].constant and not s.inputs["x"].constant
    p = plan(s, [2, 3])
    assert p.derived["outShape"] == (4, 9) and p.derived["copies"] == 6
    assert p.passes[0].context["values"] == {"repeats": [2, 3], "offsets": []}  # an absent input reads as []


def test_a_constant_input_without_a_value_declines_the_node(tmp_path):
    s = spec(tmp_path)
    with pytest.raises(KernelRejected, match="'repeats' must be known when the node is planned"):
        plan_node(s, shapes={"x": (2, 3), "repeats": (2,), "y": (2, 3)},
                  dtypes={"x": "float32", "repeats": "int64", "y": "float32"}, device=DeviceInfo())


def test_values_decide_the_variant_and_the_declared_shape(tmp_path):
    s = spec(tmp_path)
    with pytest.raises(KernelRejected, match="copies > 0"):
        plan(s, [0, 3], out=(0, 9))
    with pytest.raises(KernelRejected, match="must have shape"):
        plan(s, [2, 3], out=(4, 8))


def test_value_shape_and_size_are_checked(tmp_path):
    s = spec(tmp_path)
    with pytest.raises(ExecutionError, match="has shape"):
        plan_node(s, shapes={"x": (2, 3), "repeats": (2,), "y": (2, 3)},
                  dtypes={"x": "float32", "repeats": "int64", "y": "float32"}, device=DeviceInfo(),
                  values={"repeats": np.ones(3, np.int64)})
    big = MAX_CONSTANT_ELEMENTS + 1
    with pytest.raises(KernelRejected, match=f"{big} elements"):
        plan_node(s, shapes={"x": (2, 3), "repeats": (big,), "y": (2, 3)},
                  dtypes={"x": "float32", "repeats": "int64", "y": "float32"}, device=DeviceInfo(),
                  values={"repeats": np.ones(big, np.int64)})


def test_values_of_a_non_constant_input_and_constant_outputs_are_refused_at_load(tmp_path):
    doc = copy.deepcopy(DOC)
    doc["derive"]["other"] = "values.x[0]"
    write_spec(tmp_path, "", name="unused.json", shaders=[SHADER])
    reject(tmp_path, doc, reason="is not an input declared")
    doc = copy.deepcopy(DOC)
    doc["outputs"]["y"]["constant"] = True
    reject(tmp_path, doc, field="outputs.y.constant", reason="only an input")
    doc = copy.deepcopy(DOC)
    doc["inputs"]["repeats"]["constant"] = "yes"
    reject(tmp_path, doc, field="inputs.repeats.constant", reason="expected a boolean")


# ----------------------------------------------------------------------------- phase 0


def _model(nodes, inputs, outputs):
    m = make_model(nodes, inputs, outputs, opset=13)
    infos = [gp.NodeInfo(i, f"n{i}", n, "", 13, None, "host" if n.op_type == "Slice" else "gpu", "", ())
             for i, n in enumerate(m.graph.node)]
    return m, infos


def _vi(name, t, shape):
    return helper.make_tensor_value_info(name, t, None if shape is None else list(shape))


def test_value_keyed_inputs_follow_a_missing_shape_back_to_small_integer_inputs():
    # starts reaches Slice through a Cast: both small integer inputs are keyed, the float data is not
    nodes = [helper.make_node("Cast", ["s32"], ["s"], to=TP.INT64),
             helper.make_node("Slice", ["x", "s", "e"], ["y"]), helper.make_node("Relu", ["y"], ["z"])]
    m, infos = _model(nodes, [_vi("x", TP.FLOAT, (4, 5)), _vi("s32", TP.INT32, (1,)), _vi("e", TP.INT64, (1,))],
                      [_vi("z", TP.FLOAT, (None, 5))])
    values = infer_values(m, {"x": [4, 5], "s32": [1], "e": [1]})
    assert gp.value_keyed_inputs(infos, values, ["x", "s32", "e"]) == ("s32", "e")
    # given the values, inference knows every shape: nothing more is wanted
    values = infer_values(m, {"x": [4, 5], "s32": [1], "e": [1]},
                          input_values={"s32": np.int32([1]), "e": np.int64([3])})
    assert values["z"].shape == (2, 5)
    assert gp.value_keyed_inputs(infos, values, ["x", "s32", "e"]) == ()


def test_value_keyed_inputs_skip_big_inputs_and_shapes_that_are_known():
    nodes = [helper.make_node("Slice", ["x", "s", "e"], ["y"])]
    m, infos = _model(nodes, [_vi("x", TP.FLOAT, (4, 5)), _vi("s", TP.INT64, (100,)), _vi("e", TP.INT64, (100,))],
                      [_vi("y", TP.FLOAT, None)])
    assert gp.value_keyed_inputs(infos, infer_values(m, {"x": [4, 5], "s": [100], "e": [100]}), ["x", "s", "e"]) == ()
    # token ids feeding a Gather decide no shape: never keyed
    nodes = [helper.make_node("Gather", ["table", "ids"], ["y"])]
    m, infos = _model(nodes, [_vi("table", TP.FLOAT, (10, 4)), _vi("ids", TP.INT64, (1, 3))], [_vi("y", TP.FLOAT, None)])
    assert gp.value_keyed_inputs(infos, infer_values(m, {"table": [10, 4], "ids": [1, 3]}), ["table", "ids"]) == ()


def test_value_keyed_inputs_follow_a_kernel_constant_input_without_a_value():
    nodes = [helper.make_node("Tile", ["x", "r"], ["y"])]
    m, infos = _model(nodes, [_vi("x", TP.FLOAT, (2, 3)), _vi("r", TP.INT64, (2,))], [_vi("y", TP.FLOAT, (4, 3))])
    values = infer_values(m, {"x": [2, 3], "r": [2]})
    values["y"] = SimpleNamespace(elem_type=TP.FLOAT, shape=(4, 3), value=None)  # declared: shape known
    assert gp.value_keyed_inputs(infos, values, ["x", "r"]) == ()
    decl = SimpleNamespace(index=1, constant=True, name="repeats")
    infos[0] = dataclasses.replace(infos[0], spec=SimpleNamespace(
        inputs={"x": SimpleNamespace(index=0, constant=False), "repeats": decl}))
    assert gp.value_keyed_inputs(infos, values, ["x", "r"]) == ("r",)


# ----------------------------------------------------------------------------- Session


def test_session_keys_plans_on_the_values_that_decide_shapes(best):
    from onnx_quant.backend_wgpu.session import Session

    # Reshape's target shape is a graph input: with its contents known the Reshape is a view and
    # the model runs wholly on the GPU
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    g = helper.make_graph(nodes, "g", [_vi("x", TP.FLOAT, (2, 6)), _vi("shape", TP.INT64, (2,))],
                          [_vi("y", TP.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    x = np.arange(-6, 6, dtype=np.float32).reshape(2, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no host fallback warning
        with Session(m, device=best, allow_host_fallback=False) as s:
            for shape in ([3, 4], [4, 3], [3, 4], [12, 1]):
                (y,) = s.run(None, {"x": x, "shape": np.array(shape, np.int64)})
                np.testing.assert_array_equal(y, np.maximum(x.reshape(shape), 0))
            assert s.stats.plans == 3  # one per distinct value; [3, 4] again reuses its plan
            assert s.last_run_stats["dispatches"] >= 1

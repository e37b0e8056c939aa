"""Models with external data: typed without reading the weights; a ``location`` that escapes
the model's folder is refused (infer, check, the CLI) with one line naming the tensor."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_quant import inference
from onnx_quant.inference.context import TensorInfo
from onnx_quant.inference.dims import Dim
from onnx_quant.cli import main
from onnx_quant.errors import ModelLoadError, QuantError

REPO = Path(__file__).resolve().parents[2]
F = TensorProto.FLOAT
N = Dim.symbol("N")


def weights_model() -> onnx.ModelProto:
    """x [N, 64] -> MatMul(w [64, 32]) -> Add(b [32]) -> Relu; w and b big enough to go external."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "b"], ["biased"], name="bias"),
             helper.make_node("Relu", ["biased"], ["y"], name="act")]
    graph = helper.make_graph(nodes, "ext", [helper.make_tensor_value_info("x", F, ["N", 64])],
                              [helper.make_tensor_value_info("y", F, ["N", 32])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def save_external(model: onnx.ModelProto, folder: Path, location: str = "weights.bin") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=location, size_threshold=0)
    return path


def with_location(model_path: Path, location: str) -> onnx.ModelProto:
    """The saved model (data not loaded) with every external location rewritten."""
    model = onnx.load(str(model_path), load_external_data=False)
    for t in model.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    return model


def test_external_weights_are_typed_without_reading_them(tmp_path):
    path = save_external(weights_model(), tmp_path / "m")
    stored = onnx.load(str(path), load_external_data=False)
    assert all(t.data_location == TensorProto.EXTERNAL for t in stored.graph.initializer)
    os.remove(tmp_path / "m" / "weights.bin")  # nothing may read it
    result = inference.infer(str(path), strict=True)
    assert result.ctx["w"] == TensorInfo(F, (64, 32)) and result.ctx["b"] == TensorInfo(F, (32,))
    assert result.ctx["w"].value is None  # a rule asking for the weights gets nothing, not an error
    assert result.ctx["y"] == TensorInfo(F, (N, 32))
    out = inference.infer_shapes(str(path), strict=True)
    assert {v.name for v in out.graph.value_info} == {"mm", "biased"}
    assert out.graph.initializer[0].data_location == TensorProto.EXTERNAL  # the copy still points at the file


def test_check_with_external_data_beside_the_model(tmp_path, monkeypatch):
    path = save_external(weights_model(), tmp_path / "m")
    monkeypatch.chdir(tmp_path)  # the checker must resolve the data beside the model, not in the cwd
    assert inference.check_model(str(path)) == []
    assert main(["check", str(path)]) == 0


ESCAPES = ["../weights.bin", "sub/../../weights.bin", "/etc/passwd", "C:\\data\\w.bin", "..\\w.bin",
           "\\\\server\\share\\w.bin"]


@pytest.mark.parametrize("location", ESCAPES)
def test_location_outside_the_model_folder_is_refused(tmp_path, location):
    path = save_external(weights_model(), tmp_path / "m")
    bad = with_location(path, location)
    bad_path = tmp_path / "m" / "bad.onnx"
    onnx.save(bad, str(bad_path))
    for source in (bad, str(bad_path), bad.SerializeToString()):
        for call in (inference.infer, inference.infer_shapes, inference.check_model):
            with pytest.raises(ModelLoadError) as e:
                call(source)
            text = str(e.value)
            assert isinstance(e.value, QuantError) and "\n" not in text
            assert "'w'" in text and "outside the model's folder" in text and repr(location) in text


@pytest.mark.parametrize("command", ["infer", "check"])
def test_cli_refuses_an_escaping_location_with_one_line(tmp_path, capsys, command):
    path = save_external(weights_model(), tmp_path / "m")
    bad_path = tmp_path / "m" / "bad.onnx"
    onnx.save(with_location(path, "../../secret.bin"), str(bad_path))
    assert main([command, str(bad_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"onnx-quant {command}: error: ")
    assert "tensor 'w'" in err[0] and "'../../secret.bin'" in err[0]


def test_cli_subprocess_exit_code(tmp_path):
    path = save_external(weights_model(), tmp_path / "m")
    bad_path = tmp_path / "m" / "bad.onnx"
    onnx.save(with_location(path, "/etc/shadow"), str(bad_path))
    proc = subprocess.run([sys.executable, "-m", "onnx_quant", "infer", str(bad_path)], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "'/etc/shadow'" in proc.stderr


@pytest.mark.parametrize("location", ["weights.bin", "./data/../weights.bin", "data/w.bin"])
def test_locations_inside_the_folder_are_fine(tmp_path, location):
    path = save_external(weights_model(), tmp_path / "m")
    model = with_location(path, location)
    assert inference.infer(model, strict=True).ctx["y"] == TensorInfo(F, (N, 32))


def test_escaping_constant_and_subgraph_tensors_are_refused_too():
    tensor = numpy_helper.from_array(np.zeros((2, 2), np.float32), "const_w")
    onnx.external_data_helper.set_external_data(tensor, location="../x.bin")
    tensor.ClearField("raw_data")
    const = helper.make_node("Constant", [], ["c"], value=tensor, name="const")
    then = helper.make_graph([const], "then", [], [helper.make_tensor_value_info("c", F, [2, 2])])
    other = helper.make_graph([helper.make_node("Constant", [], ["e"], value=numpy_helper.from_array(np.zeros((2, 2), np.float32)))],
                              "else", [], [helper.make_tensor_value_info("e", F, [2, 2])])
    graph = helper.make_graph([helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)], "g",
                              [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", F, [2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(ModelLoadError, match="tensor 'const_w'.*'../x.bin'"):
        inference.infer(model)

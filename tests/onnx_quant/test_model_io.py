"""load_model: one clear ModelLoadError for every way the input can be unusable."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_quant.errors import ModelLoadError, QuantError
from onnx_quant.examples import example_model, example_models
from onnx_quant.model_io import load_model


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


@pytest.fixture(scope="module")
def example_bytes() -> bytes:
    return example_model().SerializeToString()


def test_loads_path_bytes_and_proto(tmp_path, example_bytes):
    path = tmp_path / "m.onnx"
    path.write_bytes(example_bytes)
    for source in (str(path), path, example_bytes, bytearray(example_bytes)):
        assert load_model(source).SerializeToString() == example_bytes
    proto = example_model()
    assert load_model(proto) is proto


def test_example_name_gives_the_builtin_model(example_bytes):
    assert load_model("example").SerializeToString() == example_bytes


def test_missing_path(tmp_path):
    with pytest.raises(ModelLoadError) as e:
        load_model(tmp_path / "nope.onnx")
    assert "nope.onnx" in _one_line(e) and "no such file" in str(e.value)


def test_directory(tmp_path):
    with pytest.raises(ModelLoadError) as e:
        load_model(tmp_path)
    assert "directory" in _one_line(e)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError) as e:
        load_model(path)
    assert "empty" in _one_line(e)


@pytest.mark.parametrize("text", [
    "hello world\n",
    "ir_version: 8\ngraph { node { op_type: 'Relu' } }\n",
    "import onnx\nprint('not a model')\n",
])
def test_text_file(tmp_path, text):
    path = tmp_path / "model.onnx"
    path.write_text(text)
    with pytest.raises(ModelLoadError) as e:
        load_model(path)
    assert "not an ONNX model" in _one_line(e) and str(path) in str(e.value)


def test_binary_garbage(tmp_path):
    path = tmp_path / "noise.onnx"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(ModelLoadError) as e:
        load_model(path)
    assert "not an ONNX model" in _one_line(e)


def test_every_truncation_is_rejected(example_bytes):
    # the example has no field after opset_import, so no strict prefix is a whole model
    for cut in range(1, len(example_bytes)):
        with pytest.raises(ModelLoadError):
            load_model(example_bytes[:cut])


def test_proto_without_graph():
    model = onnx.ModelProto(ir_version=10, producer_name="x")
    with pytest.raises(ModelLoadError) as e:
        load_model(model.SerializeToString())
    assert "no graph" in _one_line(e)
    with pytest.raises(ModelLoadError):
        load_model(model)


def test_model_without_opset_import():
    model = example_model()
    del model.opset_import[:]
    with pytest.raises(ModelLoadError) as e:
        load_model(model.SerializeToString())
    assert "opset_import" in _one_line(e)


def test_unsupported_source_type():
    with pytest.raises(ModelLoadError):
        load_model(42)


def test_load_error_is_a_quant_error():
    assert issubclass(ModelLoadError, QuantError)


def _external_model(tmp_path) -> str:
    weight = numpy_helper.from_array(np.arange(4096, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4096])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4096])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    path = str(tmp_path / "ext.onnx")
    onnx.save(model, path, save_as_external_data=True, location="ext.data", size_threshold=0)
    return path


def test_external_data_loaded_on_request(tmp_path):
    path = _external_model(tmp_path)
    lazy = load_model(path)
    assert lazy.graph.initializer[0].data_location == TensorProto.EXTERNAL
    full = load_model(path, load_external_data=True)
    np.testing.assert_array_equal(numpy_helper.to_array(full.graph.initializer[0]), np.arange(4096, dtype=np.float32))


def test_missing_external_data(tmp_path):
    path = _external_model(tmp_path)
    os.remove(tmp_path / "ext.data")
    with pytest.raises(ModelLoadError) as e:
        load_model(path, load_external_data=True)
    assert "external data" in _one_line(e)


def test_examples_are_valid_models():
    models = example_models()
    assert set(models) >= {"cnn"}
    for name, model in models.items():
        onnx.checker.check_model(model, full_check=True)
        assert model.opset_import[0].version == 21, name
    assert example_model().SerializeToString() == models["cnn"].SerializeToString()  # fixed seed

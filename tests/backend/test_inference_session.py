"""``onnx_quant.InferenceSession``: the calls onnxruntime users write, side by side with
onnxruntime; provider lists; device-resident values across runs and sessions."""

from __future__ import annotations

import sys
import subprocess
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper

import onnx_quant
from onnx_quant import model_zoo
from onnx_quant.backend_wgpu.inference_session import DISABLE_CPU_FALLBACK, resolve_providers
from onnx_quant.errors import DeviceError, ExecutionError
from onnx_quant.oracles import widen_u8s8
from support.models import NO_KERNEL_OPSET, no_kernel_expected, no_kernel_node

BINDINGS = {"N": 2, "H": 8, "W": 8}


@pytest.fixture(scope="module")
def qdq_cnn() -> onnx.ModelProto:
    return model_zoo.quantized("cnn", "qdq", per_channel=True, blocks=1, channels=8, seed=3)


def _args(args):
    return [(a.name, a.type, list(a.shape)) for a in args]


def test_import_onnx_quant_is_cheap_and_exposes_the_public_names():
    code = ("import sys, onnx_quant; assert 'wgpu' not in sys.modules; "
            "print(onnx_quant.infer_shapes.__module__, onnx_quant.check_model.__module__, "
            "onnx_quant.InferenceSession.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["onnx_quant.inference.engine", "onnx_quant.inference.engine", "InferenceSession"]
    with pytest.raises(AttributeError):
        onnx_quant.NoSuchThing  # noqa: B018


@pytest.mark.parametrize("family,fmt", [("cnn", "qdq"), ("mlp", "dynamic"), ("cnn", "qoperator")])
@pytest.mark.gpu
def test_same_calls_as_onnxruntime(family, fmt):
    """Same calls on both: providers list, get_inputs/get_outputs, get_modelmeta, run with output names."""
    model = model_zoo.quantized(family, fmt, per_channel=True, seed=1,
                                **({"blocks": 1, "channels": 8} if family == "cnn" else {"layers": 2}))
    model.metadata_props.add(key="source", value="test")
    data = model.SerializeToString()
    theirs = ort.InferenceSession(widen_u8s8(model).model.SerializeToString(), providers=["CPUExecutionProvider"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = onnx_quant.InferenceSession(data, providers=["vulkan", "CPUExecutionProvider"])
    assert _args(ours.get_inputs()) == _args(theirs.get_inputs())
    assert _args(ours.get_outputs()) == _args(theirs.get_outputs())
    mo, mt = ours.get_modelmeta(), theirs.get_modelmeta()
    for key in ("producer_name", "graph_name", "domain", "description", "graph_description", "version",
                "custom_metadata_map"):
        assert getattr(mo, key) == getattr(mt, key), key
    assert ours.get_providers()[-1] == "CPUExecutionProvider" and ours.get_providers()[0].startswith("vulkan:")
    feeds = model_zoo.random_feeds(model, model_zoo.CALIBRATION_DIMS[family], seed=7)
    names = [o.name for o in theirs.get_outputs()]
    got = ours.run(names, feeds)
    expected = theirs.run(names, feeds)
    assert len(got) == len(expected) == len(names)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        # onnxruntime's fused QLinear kernels requantize in their own fixed point: the model
        # zoo's logits agree to within a few quantization steps of the last layer
        np.testing.assert_allclose(g, e, rtol=0.05, atol=0.05 * float(np.abs(e).max()))
    assert ours.run(None, feeds)[0].tobytes() == got[0].tobytes()


@pytest.mark.gpu
def test_output_shapes_come_from_inference_when_undeclared():
    x = helper.make_tensor_value_info("x", TP.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TP.FLOAT, None)
    s = helper.make_tensor_value_info("s", TP.INT64, None)
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Shape", ["x"], ["s"])],
                          "g", [x], [y, s])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = onnx_quant.InferenceSession(m)
    assert _args(ours.get_outputs()) == _args(theirs.get_outputs()) == [
        ("y", "tensor(float)", ["N", 4]), ("s", "tensor(int64)", [2])]


def test_provider_list_semantics(gpu):
    backends = {a.backend for a in gpu}
    choice = resolve_providers(None)
    assert choice.host_fallback and choice.names[-1] == "CPUExecutionProvider"
    with pytest.warns(UserWarning, match="not available on this machine"):
        choice = resolve_providers(["metal-does-not-exist", "vulkan"])
    assert gpu[choice.adapter].backend == "Vulkan"
    if "OpenGL" in backends:
        choice = resolve_providers([("opengl", {"limits": "default"}), "vulkan"])
        assert gpu[choice.adapter].backend == "OpenGL" and choice.options == {"limits": "default"}
        assert resolve_providers(["opengl"]).host_fallback  # CPU is appended implicitly
    assert resolve_providers([len(gpu) - 1]).adapter == len(gpu) - 1
    assert resolve_providers([str(len(gpu) - 1)]).adapter == len(gpu) - 1
    with pytest.warns(UserWarning), pytest.raises(DeviceError, match="none names a GPU adapter"):
        resolve_providers(["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(ExecutionError, match="unknown options"):
        resolve_providers([("vulkan", {"arena": 1})])
    so = onnx_quant.SessionOptions()
    so.add_session_config_entry(DISABLE_CPU_FALLBACK, "1")
    choice = resolve_providers(["vulkan", "CPUExecutionProvider"], sess_options=so)
    assert not choice.host_fallback and choice.names == [f"vulkan:{choice.adapter}"]


def _host_only_model() -> onnx.ModelProto:
    """An op no kernel takes (support.models.no_kernel_node): runs only through the host."""
    x = helper.make_tensor_value_info("x", TP.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TP.FLOAT, [4])
    g = helper.make_graph([no_kernel_node("x", "y")], "g", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(*NO_KERNEL_OPSET)])


@pytest.mark.gpu
def test_disable_cpu_fallback_is_honoured():
    m = _host_only_model()
    so = ort.SessionOptions()   # onnxruntime's own options object works too
    so.add_session_config_entry(DISABLE_CPU_FALLBACK, "1")
    with pytest.raises(ExecutionError, match="allow_host_fallback is False"):
        onnx_quant.InferenceSession(m, so, providers=["vulkan"])
    with pytest.warns(onnx_quant.errors.HostFallbackWarning):
        sess = onnx_quant.InferenceSession(m, providers=["vulkan"])
    x = np.array([1, 3, -2, 0], np.float32)
    assert np.array_equal(sess.run(None, {"x": x})[0], no_kernel_expected(x))


# --------------------------------------------------------------------------- device-resident values


def _stage(name_in: str, name_out: str, c_in: int, c_out: int, seed: int) -> onnx.ModelProto:
    """One QOperator-free float stage (Conv -> Relu): a detector backbone's piece."""
    rng = np.random.default_rng(seed)
    w = onnx.numpy_helper.from_array(rng.standard_normal((c_out, c_in, 3, 3)).astype(np.float32), "w")
    x = helper.make_tensor_value_info(name_in, TP.FLOAT, ["N", c_in, 8, 8])
    y = helper.make_tensor_value_info(name_out, TP.FLOAT, ["N", c_out, 8, 8])
    g = helper.make_graph([helper.make_node("Conv", [name_in, "w"], ["c"], pads=[1, 1, 1, 1]),
                           helper.make_node("Relu", ["c"], [name_out])], f"stage_{seed}", [x], [y], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.gpu
def test_pipeline_passes_a_device_value_between_sessions(qdq_cnn):
    """detector -> recogniser: stage A's output stays on the device and feeds model B; the
    result matches the host round trip bit for bit, with fewer bytes read back."""
    stage_a = _stage("image", "features", 3, 3, seed=1)
    a = onnx_quant.InferenceSession(stage_a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = onnx_quant.InferenceSession(qdq_cnn)
    assert a.session.device is b.session.device
    image = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    # host round trip
    features = a.run(None, {"image": image})[0]
    host = b.run(None, {"image": features})[0]
    read_a, up_b = a.session.stats.bytes_read_back, b.session.stats.bytes_uploaded
    # device resident
    (kept,) = a.run_with_ort_values(["features"], {"image": image})
    assert isinstance(kept, onnx_quant.OrtValue) and kept.shape() == [2, 3, 8, 8]
    assert kept.data_type() == "tensor(float)" and kept.device_name() == "webgpu"
    assert a.session.stats.bytes_read_back == read_a      # nothing came back from A
    device = b.run(None, {"image": kept})[0]
    assert b.session.stats.bytes_uploaded - up_b == 0     # nor went up to B
    assert device.tobytes() == host.tobytes()
    assert kept.numpy().tobytes() == features.tobytes()
    kept.release()
    assert kept.released and not kept.has_value()
    with pytest.raises(ExecutionError, match="already released"):
        b.run(None, {"image": kept})
    with pytest.raises(ExecutionError, match="already released"):
        kept.numpy()


@pytest.mark.gpu
def test_io_binding_keeps_outputs_on_the_device_across_runs():
    stage_a = _stage("x", "y", 4, 4, seed=2)
    stage_b = _stage("y", "z", 4, 4, seed=3)
    a, b = onnx_quant.InferenceSession(stage_a), onnx_quant.InferenceSession(stage_b)
    x = np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype(np.float32)
    expected = b.run(None, {"y": a.run(None, {"x": x})[0]})[0]
    ba = a.io_binding()
    ba.bind_cpu_input("x", x)
    ba.bind_output("y", "webgpu")
    a.run_with_iobinding(ba)
    (y,) = ba.get_outputs()
    bb = b.io_binding()
    bb.bind_ortvalue_input("y", y)
    bb.bind_output("z")            # device_type "cpu": a numpy array
    read_before = b.session.stats.bytes_read_back
    b.run_with_iobinding(bb)
    (z,) = bb.get_outputs()
    assert isinstance(z, np.ndarray) and z.tobytes() == expected.tobytes()
    assert b.session.stats.bytes_read_back - read_before == z.nbytes
    assert ba.copy_outputs_to_cpu()[0].tobytes() == a.run(None, {"x": x})[0].tobytes()
    with pytest.raises(ExecutionError, match="raw buffer pointers"):
        bb.bind_output("z", "webgpu", buffer_ptr=1234)
    with y:
        pass
    assert y.released


def test_device_value_checks_device_dtype_and_shape(gpu):
    stage = _stage("x", "y", 2, 2, seed=4)
    sess = onnx_quant.InferenceSession(stage)
    dev = sess.session.device
    good = onnx_quant.DeviceValue.from_numpy(np.zeros((1, 2, 8, 8), np.float32), dev)
    assert sess.run(None, {"x": good})[0].shape == (1, 2, 8, 8)
    with pytest.raises(ExecutionError, match="expected float32"):
        sess.run(None, {"x": onnx_quant.DeviceValue.from_numpy(np.zeros((1, 2, 8, 8), np.int32), dev)})
    with pytest.raises(ExecutionError, match="dim 2 must be 8"):
        sess.run(None, {"x": onnx_quant.DeviceValue.from_numpy(np.zeros((1, 2, 4, 8), np.float32), dev)})
    if any(a.backend == "OpenGL" for a in gpu):
        from onnx_quant.backend_wgpu.device import get_device

        other = get_device("opengl")
        foreign = onnx_quant.DeviceValue.from_numpy(np.zeros((1, 2, 8, 8), np.float32), other)
        with pytest.raises(ExecutionError, match="a different device object"):
            sess.run(None, {"x": foreign})


@pytest.mark.gpu
def test_device_outputs_of_every_origin():
    """An output that is a feed, an initializer or a host value can be kept on the device too."""
    x = helper.make_tensor_value_info("x", TP.FLOAT, [3])
    c = onnx.numpy_helper.from_array(np.array([1, 2, 3], np.float32), "c")
    outs = [helper.make_tensor_value_info(n, TP.FLOAT, [3]) for n in ("x_out", "c_out", "sum")]
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["x_out"]), helper.make_node("Identity", ["c"], ["c_out"]),
                           helper.make_node("Add", ["x", "c"], ["sum"])], "g", [x], outs, [c])
    sess = onnx_quant.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    xv = np.array([10, 20, 30], np.float32)
    got = sess.run_with_ort_values(None, {"x": xv})
    assert [v.numpy().tolist() for v in got] == [[10, 20, 30], [1, 2, 3], [11, 22, 33]]
    dv = onnx_quant.DeviceValue.from_numpy(xv, sess.session.device)
    again = sess.run_with_ort_values(["x_out", "sum"], {"x": dv})
    assert [v.numpy().tolist() for v in again] == [[10, 20, 30], [11, 22, 33]]
    assert again[0].buffer is not dv.buffer        # its own buffer: releasing one keeps the other
    again[0].release()
    assert dv.numpy().tolist() == [10, 20, 30]
    with pytest.raises(ExecutionError, match="not among the outputs asked for"):
        sess.session.run(["sum"], {"x": xv}, device_outputs=["x_out"])

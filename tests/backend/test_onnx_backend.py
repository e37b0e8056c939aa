"""``backend_wgpu.backend``: the onnx.backend.base.Backend over Session — devices, prepare/run,
run_model, run_node on ONNX's own node cases, and ONNX's BackendTest harness restricted to the
DynamicQuantizeLinear cases (the family's other cases run in test_onnx_backend_harness.py)."""

from __future__ import annotations

import unittest
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import numpy_helper
from onnx import helper
from onnx.backend.base import Backend

from onnx_quant import backend_wgpu
from onnx_quant.errors import ExecutionError, HostFallbackWarning
from support.models import NO_KERNEL_OPSET, no_kernel_expected, no_kernel_node


def _gpu_reason() -> str | None:
    from onnx_quant.backend_wgpu.device import select_adapter
    from onnx_quant.errors import DeviceError

    try:
        select_adapter()
    except DeviceError as e:
        return str(e)
    return None


def _node_cases(*op_types):
    from onnx_quant.node_cases import all_node_cases

    return [c for c in all_node_cases() if c.model.graph.node[0].op_type in op_types and len(c.model.graph.node) == 1]


def test_backend_is_an_onnx_backend_and_reads_device_strings():
    b = backend_wgpu.backend
    assert isinstance(b, type) and issubclass(b, Backend)
    from onnx_quant.backend_wgpu import onnx_backend

    assert b is onnx_backend.WgpuBackend and onnx_backend.supports_device == b.supports_device
    for ok in ("CPU", "cpu", "GPU", "WGPU", "WebGPU", "GPU:0", "GPU:vulkan", "CPU:0"):
        assert b.supports_device(ok), ok
    for no in ("CUDA", "CUDA:1", "TPU", "CPU:1", ""):
        assert b.supports_device(no) is (no == ""), no  # "" is the default device


def test_prepare_and_run_in_graph_order(gpu):
    from onnx_quant.backend_wgpu.commands import dql_model, numpy_dynamic_quantize_linear

    x = np.linspace(-2, 6, 300, dtype=np.float32)
    rep = backend_wgpu.backend.prepare(dql_model(1), "CPU")
    expected = numpy_dynamic_quantize_linear(x)
    for inputs in ([x], (x,), x, {"x": x}):
        out = rep.run(inputs)
        assert len(out) == 3 and [o.dtype for o in out] == [np.uint8, np.float32, np.uint8]
        assert all(np.array_equal(g, e) for g, e in zip(out, expected))
    assert np.array_equal(out["y"], expected[0]) and out.y_scale == expected[1]  # named too
    with pytest.raises(ExecutionError, match="2 inputs given, the model takes 1"):
        rep.run([x, x])
    out = backend_wgpu.backend.run_model(dql_model(1), [x], device="GPU")
    assert all(np.array_equal(g, e) for g, e in zip(out, expected))
    with pytest.raises(ExecutionError, match="CUDA"):
        backend_wgpu.backend.prepare(dql_model(1), "CUDA")


def test_prepare_passes_session_options(gpu):
    m = helper.make_model(helper.make_graph([no_kernel_node("x", "y", name="s")], "g",
                                            [helper.make_tensor_value_info("x", TP.FLOAT, [3])],
                                            [helper.make_tensor_value_info("y", TP.FLOAT, [3])]),
                          opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(*NO_KERNEL_OPSET)])
    with pytest.raises(ExecutionError, match="allow_host_fallback"):
        backend_wgpu.backend.prepare(m, "GPU", allow_host_fallback=False)
    with pytest.warns(HostFallbackWarning):
        rep = backend_wgpu.backend.prepare(m, "GPU", rtol=1e-3)  # harness options are ignored
    x = np.array([-1, 0, 3], np.float32)
    (y,) = rep.run([x])
    assert np.array_equal(y, no_kernel_expected(x))  # on the host: no kernel
    bad = helper.make_model(helper.make_graph([helper.make_node("Unique", ["x"], ["y"])], "g", [], []),
                            opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ExecutionError, match="onnx.checker"):
        backend_wgpu.backend.prepare(bad)


@pytest.mark.parametrize("op_type", ["DynamicQuantizeLinear", "Add", "Cast"])
def test_run_node_on_onnx_node_cases(gpu, op_type):
    from onnx.backend.test.runner import Runner

    cases = _node_cases(op_type)
    if op_type == "Cast":  # keep it small: the float32 <-> float16 cases
        cases = [c for c in cases if c.name in ("test_cast_FLOAT_to_FLOAT16", "test_cast_FLOAT16_to_FLOAT")]
    assert cases
    for case in cases[:4]:
        node = case.model.graph.node[0]
        version = {i.domain: i.version for i in case.model.opset_import}[""]
        for inputs, expected in case.data_sets:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", HostFallbackWarning)
                out = backend_wgpu.backend.run_node(node, inputs, device="CPU", opset_version=version)
            assert len(out) == len(expected)
            expected = [numpy_helper.to_array(e) if isinstance(e, onnx.TensorProto) else e for e in expected]
            for g, e in zip(out, expected):
                assert g.dtype == e.dtype and g.shape == e.shape, case.name
            Runner.assert_similar_outputs(expected, list(out), rtol=case.rtol, atol=case.atol)


def test_run_node_takes_a_dict_and_checks_counts(gpu):
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    x = np.array([0, 1, 2], np.float32)
    from onnx_quant.backend_wgpu.commands import numpy_dynamic_quantize_linear

    out = backend_wgpu.backend.run_node(node, {"x": x}, opset_version=11)
    assert all(np.array_equal(g, e) for g, e in zip(out, numpy_dynamic_quantize_linear(x)))
    assert out.y[-1] == 255 and out.z == 0
    with pytest.raises(ExecutionError, match="2 inputs given"):
        backend_wgpu.backend.run_node(node, [x, x], opset_version=11)


# ----------------------------------------------------------------------------- BackendTest


def _harness_cases() -> dict[str, type]:
    """ONNX's harness over backend_wgpu.backend, only its DynamicQuantizeLinear cases (node and
    expanded forms) on the devices the backend supports; the other ~4000 generated tests are
    left out instead of being reported as skipped."""
    import re

    from onnx.backend.test import BackendTest

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bt = BackendTest(backend_wgpu.backend, __name__)
    bt.include(r"test_dynamicquantizelinear")
    pattern = re.compile(r"^test_dynamicquantizelinear.*_(cpu|cuda)$")
    out: dict[str, type] = {}
    for class_name, cls in bt.test_cases.items():
        methods = {n: getattr(cls, n) for n in dir(cls)
                   if pattern.match(n) and backend_wgpu.backend.supports_device(n.rsplit("_", 1)[1].upper())}
        if methods:
            out[class_name] = type(class_name, (unittest.TestCase,), {"__module__": __name__, **methods})
    return out


if _gpu_reason() is None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _CASES = _harness_cases()
    _CASES = {name: pytest.mark.gpu(cls) for name, cls in _CASES.items()}  # every case runs on the GPU
    globals().update(_CASES)

    @pytest.mark.gpu
    def test_harness_collected_the_dql_cases():
        names = sorted(n for cls in _CASES.values() for n in dir(cls) if n.startswith("test_"))
        assert "test_dynamicquantizelinear_cpu" in names and len(names) == 6, names
        assert not any(n.endswith("_cuda") for n in names)
else:
    @pytest.mark.gpu
    def test_harness_needs_an_adapter():
        from support.gpu import no_gpu

        no_gpu(_gpu_reason())

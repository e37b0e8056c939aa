"""A kernel that declines a node raises KernelRejected (node, kernel, clause); the session sends
exactly those nodes to the host, and any other planning error (a device limit) is raised."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_quant.backend_wgpu.device_info import WEBGPU_DEFAULT_LIMITS, DeviceInfo
from onnx_quant.backend_wgpu.planner import plan_node
from onnx_quant.backend_wgpu.spec import load_specs
from onnx_quant.errors import ExecutionError, HostFallbackWarning, KernelRejected

SPECS = load_specs()


def _relu():
    return SPECS.find("", "Relu", 14)


def test_a_dtype_outside_the_constraint_is_a_typed_rejection():
    with pytest.raises(KernelRejected) as e:
        plan_node(_relu(), shapes={"x": (4,), "y": (4,)}, dtypes={"x": "float64", "y": "float64"},
                  device=DeviceInfo(), node_label="r0")
    assert (e.value.node, e.value.kernel) == ("r0", "Relu")
    assert e.value.clause.startswith("'x' has type float64, but T allows only float32")
    assert str(e.value).startswith("node 'r0': kernel Relu: 'x' has type float64")


def test_no_variant_applying_is_a_typed_rejection_naming_each_clause():
    with pytest.raises(KernelRejected) as e:
        plan_node(_relu(), shapes={"x": (4,), "y": (4,)}, dtypes={"x": "float32", "y": "float32"},
                  device=DeviceInfo(), node_label="r1", tunables={"WORKGROUP_SIZE": 4096})
    assert e.value.clause.startswith("no variant applies (word_per_invocation: 'gridFits' is false")


def test_an_undeclared_attribute_and_a_wrong_shape_are_typed_rejections():
    with pytest.raises(KernelRejected, match="attribute 'beta' is not supported by kernel Relu"):
        plan_node(_relu(), shapes={"x": (4,), "y": (4,)}, dtypes={"x": "float32", "y": "float32"},
                  device=DeviceInfo(), attributes={"beta": 1.0})
    with pytest.raises(KernelRejected, match=r"'y' must have shape \(4,\), found \(5,\)"):
        plan_node(_relu(), shapes={"x": (4,), "y": (5,)}, dtypes={"x": "float32", "y": "float32"},
                  device=DeviceInfo())


def test_a_device_limit_is_not_a_rejection():
    small = DeviceInfo(limits=dict(WEBGPU_DEFAULT_LIMITS, maxStorageBufferBindingSize=4096))
    with pytest.raises(ExecutionError, match="storage buffer") as e:
        plan_node(_relu(), shapes={"x": (2048,), "y": (2048,)}, dtypes={"x": "float32", "y": "float32"},
                  device=small)
    assert not isinstance(e.value, KernelRejected)


def _relu_model(n):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])
    return helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu0")], "g", [x], [y]),
                             opset_imports=[helper.make_opsetid("", 14)])


def test_session_sends_a_rejected_node_to_the_host_with_the_clause(best):
    from onnx_quant.backend_wgpu.session import Session

    # a workgroup larger than the device allows: no variant's gridFits holds
    with pytest.raises(ExecutionError, match="relu0.*no variant applies.*'gridFits' is false"):
        Session(_relu_model(8), device=best, tunables={"WORKGROUP_SIZE": 4096}, allow_host_fallback=False).run(
            None, {"x": np.zeros(8, np.float32)})
    s = Session(_relu_model(8), device=best, tunables={"WORKGROUP_SIZE": 4096})
    v = np.array([-2, -0.5, 0, 3, -0.0, 1e30, -1e-30, 7], np.float32)
    with pytest.warns(HostFallbackWarning, match="relu0.*no variant applies"):
        (out,) = s.run(None, {"x": v})
    assert np.array_equal(out, np.maximum(v, 0))
    (entry,) = s.explain({"x": [8]})
    assert entry["placement"] == "host" and "'gridFits' is false" in str(entry)


def test_session_raises_a_device_limit_instead_of_falling_back(best):
    from onnx_quant.backend_wgpu.device import get_device
    from onnx_quant.backend_wgpu.session import Session

    small = get_device(None, limits={"maxStorageBufferBindingSize": 4096})
    s = Session(_relu_model(2048), device=small)
    with pytest.raises(ExecutionError, match="relu0.*storage buffer") as e:
        s.run(None, {"x": np.zeros(2048, np.float32)})
    assert not isinstance(e.value, KernelRejected)
    assert s.host_nodes == []

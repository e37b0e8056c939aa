"""The host fallback runs QuantizeLinear / DequantizeLinear of every opset: onnx 1.23's
onnx.reference has none before opset 19, so a Q/DQ node of an opset-10/13/17 model sent to the
host failed ("No implementation for operator 'DequantizeLinear' ... version 17"); the host now
evaluates through onnx_quant.reference_ops."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_quant.errors import HostFallbackWarning


class _WithoutDequantize:
    """A kernel registry that has no DequantizeLinear: every DQ node goes to the host."""

    def __init__(self, inner):
        self._inner = inner

    def find(self, domain, op_type, version):
        return None if op_type == "DequantizeLinear" else self._inner.find(domain, op_type, version)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _qdq_model(opset: int):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(7, np.uint8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq")]
    graph = helper.make_graph(nodes, "qdq", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("opset", [10, 13, 17, 18])
def test_dequantize_linear_of_an_old_opset_runs_on_the_host(best, opset):
    from onnx_quant.backend_wgpu.session import Session, _specs

    x = np.linspace(-1, 12, 10, dtype=np.float32).reshape(2, 5)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with Session(_qdq_model(opset), device=best, specs=_WithoutDequantize(_specs())) as s:
            (y,) = s.run(None, {"x": x})
            assert any("dq" in h for h in s.host_nodes)
    assert any(issubclass(w.category, HostFallbackWarning) for w in seen)
    q = np.clip(np.rint(x / np.float32(0.05)) + 7, 0, 255)
    assert np.array_equal(y, ((q - 7) * np.float32(0.05)).astype(np.float32))

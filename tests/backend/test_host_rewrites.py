"""BatchNormalization on the host: never onnx.reference's training-mode result for an
inference node (paddle2onnx writes ``momentum``; onnx.reference 1.23 then uses batch
statistics for opsets 9-13). Oracle: onnxruntime on the same model."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_quant.errors import ExecutionError

R = np.random.default_rng(3)
X = (R.standard_normal((2, 3, 4, 5)) * 2 + 1).astype(np.float32)
PARAMS = {"scale": R.uniform(0.5, 2, 3), "B": R.standard_normal(3), "mean": R.standard_normal(3),
          "var": R.uniform(0.5, 3, 3)}


def _bn_model(opset, outputs=("y",), **attrs):
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in PARAMS.items()]
    node = helper.make_node("BatchNormalization", ["x", *PARAMS], list(outputs), name="bn", **attrs)
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X.shape))],
                              outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


def _session(model, dev):
    """A session whose specs leave BatchNormalization out, so the node runs on the host (its GPU
    kernel is tested in tests/backend/test_normalization_gpu.py)."""
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.backend_wgpu.spec import SpecRegistry, load_specs

    specs = SpecRegistry(s for s in load_specs() if s.name != "BatchNormalization")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Session(model, device=dev, specs=specs)


@pytest.mark.parametrize("opset, attrs", [(9, {"momentum": 0.9}), (12, {"momentum": 0.5, "epsilon": 1e-3}),
                                          (13, {"momentum": 0.9}), (7, {"momentum": 0.9}), (7, {"spatial": 1}),
                                          (14, {"momentum": 0.9}), (15, {})])
def test_inference_batch_norm_on_the_host_matches_onnxruntime(best, opset, attrs):
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    model = _bn_model(opset, **attrs)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": X})[0]
    (got,) = _session(model, best).run(None, {"x": X})
    assert np.allclose(got, expected, rtol=1e-5, atol=1e-6)
    if opset < 14:
        # the reason for the rewrite: onnx.reference's own result is far off here (batch
        # statistics), or it fails (its BatchNormalization-7 returns a tuple)
        try:
            (ref,) = ReferenceEvaluator(model).run(None, {"x": X})
        except TypeError:
            return
        assert not np.allclose(ref, expected, rtol=1e-2, atol=1e-2)


def test_training_outputs_before_opset_14_are_refused(best):
    model = _bn_model(9, outputs=("y", "running_mean", "running_var"), momentum=0.9)
    with pytest.raises(ExecutionError, match=r"'bn' \(BatchNormalization\): training outputs before opset 14"):
        _session(model, best).run(None, {"x": X})

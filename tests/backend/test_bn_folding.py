"""BatchNormalization folded into the Conv before it (backend_wgpu/bn_folding.py): which pairs fold,
the folded parameters, and the folded models on the GPU against onnxruntime."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

from onnx_quant.backend_wgpu.bn_folding import fold_batch_norm

C_IN, C_OUT = 3, 4


def conv_bn(*, bias=True, extra_reader=False, conv_is_output=False, bn_inputs_are_inputs=False, training=False):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((C_OUT, C_IN, 3, 3)).astype(np.float32), "w")]
    conv_in = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(C_OUT).astype(np.float32), "b"))
        conv_in.append("b")
    params = {"scale": rng.uniform(0.5, 1.5, C_OUT), "bias": rng.standard_normal(C_OUT),
              "mean": rng.standard_normal(C_OUT), "var": rng.uniform(0.5, 1.5, C_OUT)}
    inits += [numpy_helper.from_array(v.astype(np.float32), k) for k, v in params.items()]
    nodes = [helper.make_node("Conv", conv_in, ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"], epsilon=1e-3,
                              name="bn", **({"training_mode": 1} if training else {}))]
    outputs = [helper.make_tensor_value_info("y", TP.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["c"], ["r"], name="relu"))
        outputs.append(helper.make_tensor_value_info("r", TP.FLOAT, None))
    if conv_is_output:
        outputs.append(helper.make_tensor_value_info("c", TP.FLOAT, None))
    inputs = [helper.make_tensor_value_info("x", TP.FLOAT, [1, C_IN, 5, 5])]
    if bn_inputs_are_inputs:  # initializers that are also inputs: defaults a caller may override
        inputs += [helper.make_tensor_value_info(k, TP.FLOAT, [C_OUT]) for k in params]
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])


def test_a_conv_and_its_batch_norm_become_one_conv_with_onnxruntimes_parameters():
    for bias in (True, False):
        model = conv_bn(bias=bias)
        result = fold_batch_norm(model)
        assert [(f.conv, f.batch_norm) for f in result.folded] == [("c", "y")]
        (node,) = result.model.graph.node
        assert node.op_type == "Conv" and list(node.output) == ["y"]
        inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        got = {t.name: numpy_helper.to_array(t) for t in result.model.graph.initializer}
        s = inits["scale"] / np.sqrt(inits["var"] + np.float32(1e-3))
        np.testing.assert_array_equal(got[node.input[1]], inits["w"] * s[:, None, None, None])
        b = inits["b"] if bias else np.zeros(C_OUT, np.float32)
        expected_b = (b - inits["mean"]) * s + inits["bias"] if bias else inits["bias"] - inits["mean"] * s
        np.testing.assert_array_equal(got[node.input[2]], expected_b)
        assert not {"scale", "mean", "var", "w"} & set(got)  # the folded parameters' originals are gone
        x = np.random.default_rng(1).standard_normal((1, C_IN, 5, 5)).astype(np.float32)
        run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})  # noqa: E731
        np.testing.assert_allclose(run(result.model)[0], run(model)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", [dict(extra_reader=True), dict(conv_is_output=True), dict(bn_inputs_are_inputs=True),
                                dict(training=True)])
def test_pairs_that_must_stay_are_left_alone(kw):
    model = conv_bn(**kw)
    result = fold_batch_norm(model)
    assert result.folded == [] and result.model is model


def _exported(name):
    from onnx_quant import exported_models as em

    logging.getLogger().setLevel(logging.ERROR)
    model = em.build(name, "float")
    return model, em.feeds(model, em.MODELS[name][1], seed=1)


@pytest.mark.parametrize("name, pairs", [("mobilenet_v3", 4), ("dbnet", 5)])
def test_folded_models_on_the_gpu_match_onnxruntime_with_fewer_dispatches(best, name, pairs):
    from onnx_quant.backend_wgpu.session import Session

    model, feeds = _exported(name)
    dispatches, outs = {}, {}
    for fold in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # epilogue fusion off: a folded Conv would also take the activation after it
            with Session(model, device=best, allow_host_fallback=False, fold_batch_norm=fold,
                         fuse_elementwise=False) as s:
                outs[fold] = s.run(None, feeds)[0]
                dispatches[fold] = s.last_run_stats["dispatches"]
                assert len(s.folded_batch_norms) == (pairs if fold else 0)
    assert dispatches[True] == dispatches[False] - pairs
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL  # folds them too
    (want,) = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    scale = float(np.abs(want).max())
    for got in outs.values():
        assert float(np.abs(got - want).max()) <= 1e-5 * scale


def test_optimization_levels_decide_the_folding(best):
    import onnx_quant

    model, feeds = _exported("mobilenet_v3")
    for level, folds in ((ort.GraphOptimizationLevel.ORT_DISABLE_ALL, False),
                         (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, True)):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        sess = onnx_quant.InferenceSession(model, so, providers=["vulkan"])
        assert bool(sess._session.folded_batch_norms) is folds

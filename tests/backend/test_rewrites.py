"""The construction phases (backend_wgpu/rewrites.py) as one pipeline, on the CPU (no device): each
phase runs on the previous one's model, in order; a phase turned off changes nothing; the model as
given is left as it was; the kernel registry's verdict (spec_rejects) decides what a phase may write."""

from __future__ import annotations

import logging
import warnings

import pytest
from onnx import TensorProto as TP, helper

from onnx_quant import model_zoo
from onnx_quant.backend_wgpu.model_check import static_values
from onnx_quant.backend_wgpu.rewrites import RewriteOptions, rewrite_model
from onnx_quant.backend_wgpu.verdict import spec_rejects
from onnx_quant.backend_wgpu.session import _specs

from support.models import conv_bn_model

OFF = RewriteOptions(expand_functions=False, fold_batch_norm=False, fuse_qdq=False, fuse_dynamic=False, fuse_elementwise=False)


def _zoo(family, fmt):
    logging.getLogger().setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model_zoo.quantized(family, fmt, per_channel=True)


def _rewrite(model, options=RewriteOptions()):
    return rewrite_model(model, static_values(model), _specs(), options)


def _ops(model):
    return [n.op_type for n in model.graph.node]


def test_the_qdq_cnn_is_fused_onto_qlinear_kernels_and_the_given_model_is_untouched():
    model = _zoo("cnn", "qdq")
    before = model.SerializeToString()
    out = _rewrite(model)
    assert model.SerializeToString() == before
    assert out.fusion.units and "QLinearConv" in _ops(out.model)
    assert "Conv" not in _ops(out.model)
    # every fused node keeps the unit it replaced (its host fallback)
    fused = {o for n in out.model.graph.node for o in n.output[:1]}
    assert out.fused_units and set(out.fused_units) <= fused
    # the static values are the rewritten model's: a fused node's output is typed
    qconv = next(n for n in out.model.graph.node if n.op_type == "QLinearConv")
    assert out.static_values[qconv.output[0]].elem_type in (TP.INT8, TP.UINT8)


def test_with_every_phase_off_nothing_changes():
    model = _zoo("cnn", "qdq")
    out = _rewrite(model, OFF)
    assert out.model.SerializeToString() == model.SerializeToString()
    assert not out.fusion.units and not out.dynamic_fusion.units and not out.elementwise_fusion.units
    assert out.fused_units == {} and out.folded_batch_norms == [] and out.nonzeros == []


@pytest.mark.parametrize("fuse_dynamic", [True, False])
def test_the_dynamic_units_run_before_the_elementwise_groups(fuse_dynamic):
    """With the dynamic phase on, its units keep their float tails (the scale Mul) from the
    elementwise groups; with it off, the same Mul is the elementwise phase's to take."""
    model = _zoo("mlp", "dynamic")
    out = _rewrite(model, RewriteOptions(fuse_dynamic=fuse_dynamic))
    ops = _ops(out.model)
    taken_by_groups = {n.name for u in out.elementwise_fusion.units for n in u.nodes}
    muls = {n.name for n in model.graph.node if n.op_type == "Mul"}
    if fuse_dynamic:
        assert out.dynamic_fusion.units and "MatMulInteger" not in ops and "DynamicQuantizeLinear" not in ops
        assert not (muls & taken_by_groups)
    else:
        assert not out.dynamic_fusion.units and "MatMulInteger" in ops
        assert muls & taken_by_groups
    units = list(out.dynamic_fusion.units) + list(out.elementwise_fusion.units)
    assert {u.node.output[0] for u in units} == set(out.fused_units)




def test_batch_norm_folds_first_and_the_relu_becomes_the_conv_epilogue():
    model = conv_bn_model(relu=True)
    out = _rewrite(model)
    assert len(out.folded_batch_norms) == 1
    assert _ops(out.model) == ["FusedConv"]  # the folded Conv with the Relu as its epilogue
    unfolded = _rewrite(model, RewriteOptions(fold_batch_norm=False))
    assert unfolded.folded_batch_norms == [] and "BatchNormalization" in _ops(unfolded.model)


def _nonzero_model(shape):
    graph = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["i"], name="nz"), helper.make_node("Transpose", ["i"], ["y"], name="t")],
        "g", [helper.make_tensor_value_info("x", TP.FLOAT, shape)], [helper.make_tensor_value_info("y", TP.INT64, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_nonzero_is_split_last_and_a_scalar_input_is_declined_by_name():
    out = _rewrite(_nonzero_model([3, 4]))
    assert len(out.nonzeros) == 1 and out.nonzero_declined == {}
    domains = {(n.domain, n.op_type) for n in out.model.graph.node}
    assert ("onnx_quant.sync", "DataDependent") in domains and ("", "Transpose") not in domains
    scalar = _rewrite(_nonzero_model([]))
    assert scalar.nonzeros == [] and "rank is 0" in scalar.nonzero_declined["i"]


def test_spec_rejects_names_the_kernel_the_value_and_the_constraint():
    spec = _specs().find("", "Relu", 17)
    node = helper.make_node("Relu", ["x"], ["y"])
    elem = {"x": TP.BOOL, "y": TP.BOOL}.get
    why = spec_rejects(spec, node, lambda n: elem(n, 0))
    assert spec.name in why and "bool" in why and "allows only" in why
    assert spec_rejects(spec, node, lambda n: TP.FLOAT) == ""
    assert spec_rejects(spec, node, lambda n: 0) == ""  # unknown types are decided per plan
    assert "attribute 'nope'" in spec_rejects(spec, helper.make_node("Relu", ["x"], ["y"], nope=1), lambda n: 0)

"""The rewrite passes (backend_wgpu/passes.py) as contracts, on the CPU: each pass requires a
well-formed model and refuses one that is not; each ensures what it promises, and a result that
breaks a promise (here: a pass whose call is replaced by a broken one) raises PassContractError
naming the pass; a pass that changes nothing hands back the given model."""

from __future__ import annotations

import json
import logging
import warnings

import onnx
import pytest
from onnx import TensorProto as TP, helper

from onnx_quant import model_zoo
from onnx_quant.backend_wgpu.bn_folding import FoldBatchNorm, FoldResult, Folded
from onnx_quant.backend_wgpu.data_dependent import SplitDataDependent, SplitResult, PaddedNonZero
from onnx_quant.backend_wgpu.dynamic_fusion import DynamicFusion
from onnx_quant.backend_wgpu.elementwise_fusion import MAX_STEPS, ElementwiseFusion
from onnx_quant.backend_wgpu.graph_index import GraphIndex
from onnx_quant.backend_wgpu.model_check import static_values
from onnx_quant.backend_wgpu.passes import PassContractError, PassResult, graph_faults
from onnx_quant.backend_wgpu.qdq_fusion import FusedUnit, FusionResult, QdqFusion
from onnx_quant.backend_wgpu.rewrites import rewrite_passes
from onnx_quant.backend_wgpu.spec import load_specs
from support.models import conv_bn_model

SPECS = load_specs()


def _zoo(family, fmt):
    logging.getLogger().setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model_zoo.quantized(family, fmt, per_channel=True)


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _vi(name, t=TP.FLOAT, shape=(4,)):
    return helper.make_tensor_value_info(name, t, list(shape) if shape is not None else None)


def _relu_chain():
    return _model([helper.make_node("Relu", ["x"], ["a"], name="r1"), helper.make_node("Neg", ["a"], ["b"], name="n"),
                   helper.make_node("Relu", ["b"], ["y"], name="r2")], [_vi("x")], [_vi("y")])


def _broken(pass_, result):
    """The pass with its call replaced by one returning ``result``."""
    pass_.call = lambda model, values: result
    return pass_


ALL_PASSES = [p.name for p in rewrite_passes(SPECS)]


def test_graph_faults_name_an_unordered_read_a_second_assignment_and_an_unmade_output():
    model = _model([helper.make_node("Relu", ["b"], ["a"], name="r1"), helper.make_node("Relu", ["x"], ["b"], name="r2"),
                    helper.make_node("Relu", ["x"], ["a"], name="r3")], [_vi("x")], [_vi("a"), _vi("z")])
    faults = graph_faults(model)
    assert "node 'r1' reads 'b' before any node makes it" in faults
    assert "node 'r3' makes 'a', which is already defined" in faults
    assert "graph output 'z' is made by no node" in faults
    assert graph_faults(_relu_chain()) == []


@pytest.mark.parametrize("name", ALL_PASSES)
def test_every_pass_requires_a_well_formed_graph(name):
    pass_ = next(p for p in rewrite_passes(SPECS) if p.name == name)
    bad = _model([helper.make_node("Relu", ["nowhere"], ["y"], name="r")], [_vi("x")], [_vi("y")])
    with pytest.raises(PassContractError, match=f"pass {name}: requires does not hold: node 'r' reads 'nowhere'"):
        pass_(bad, {})


@pytest.mark.parametrize("name", ALL_PASSES)
def test_every_pass_ensures_the_graph_outputs_stay_and_the_graph_is_well_formed(name):
    model = _relu_chain()
    lost = onnx.ModelProto()
    lost.CopyFrom(model)
    del lost.graph.output[:]
    pass_ = _broken(next(p for p in rewrite_passes(SPECS) if p.name == name), PassResult(lost, True, None))
    with pytest.raises(PassContractError, match=f"pass {name}: ensures does not hold: the graph outputs changed"):
        pass_(model, static_values(model))
    unordered = onnx.ModelProto()
    unordered.CopyFrom(model)
    unordered.graph.node.reverse()
    pass_ = _broken(next(p for p in rewrite_passes(SPECS) if p.name == name), PassResult(unordered, True, None))
    with pytest.raises(PassContractError, match="reads 'b' before any node makes it"):
        pass_(model, static_values(model))


@pytest.mark.parametrize("name", ALL_PASSES)
def test_a_pass_that_changes_nothing_hands_back_the_given_model(name):
    model = _relu_chain()
    pass_ = next(p for p in rewrite_passes(SPECS) if p.name == name)
    if name == "fuse_elementwise":
        model = _model([helper.make_node("Relu", ["x"], ["y"], name="r")], [_vi("x")], [_vi("y")])
    result = pass_(model, static_values(model))
    assert not result.modified and result.model is model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    with pytest.raises(PassContractError, match="the model is not the given one, though unmodified"):
        _broken(pass_, PassResult(copy, False, result.report))(model, static_values(model))




def test_batch_norm_folding_ensures_a_conv_makes_each_folded_output():
    model = conv_bn_model()
    result = FoldBatchNorm()(model, static_values(model))
    assert result.modified and [n.op_type for n in result.model.graph.node] == ["Conv"]
    # a report claiming a pair the model does not show folded
    report = FoldResult(model, [Folded("c", "y")])
    with pytest.raises(PassContractError, match="pass fold_batch_norm: ensures.*'y' is not made by a Conv"):
        _broken(FoldBatchNorm(), PassResult(conv_bn_model(), True, report))(model, static_values(model))


def test_the_fusions_ensure_each_fused_node_replaced_its_unit():
    model = _zoo("cnn", "qdq")
    values = static_values(model)
    result = QdqFusion(SPECS)(model, values)
    assert result.modified and result.report.units
    # the same report over the model as written: no fused node is there, the units' nodes still are
    stale = onnx.ModelProto()
    stale.CopyFrom(model)
    stale.graph.node[0].name = stale.graph.node[0].name + "_"  # a new model, well-formed
    with pytest.raises(PassContractError, match="pass fuse_qdq: ensures does not hold: the fused node"):
        _broken(QdqFusion(SPECS), PassResult(stale, True, result.report))(model, values)
    dyn = _zoo("mlp", "dynamic")
    dvalues = static_values(dyn)
    fused = DynamicFusion(SPECS)(dyn, dvalues)
    assert fused.modified
    with pytest.raises(PassContractError, match="pass fuse_dynamic: ensures does not hold"):
        _broken(DynamicFusion(SPECS), PassResult(_copy(dyn), True, fused.report))(dyn, dvalues)


def _copy(model):
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def test_the_elementwise_fusion_ensures_a_group_stays_within_its_bounds():
    model = _relu_chain()
    values = static_values(model)
    result = ElementwiseFusion(SPECS)(model, values)
    assert result.modified and len(result.report.units) == 1
    (unit,) = result.report.units
    steps = json.loads(next(a.s for a in unit.node.attribute if a.name == "steps"))
    long_node = onnx.NodeProto()
    long_node.CopyFrom(unit.node)
    next(a for a in long_node.attribute if a.name == "steps").s = json.dumps(steps * MAX_STEPS).encode()
    long_model = _copy(result.model)
    long_model.graph.node[0].CopyFrom(long_node)
    report = FusionResult(long_model, [FusedUnit(unit.rule, long_node, unit.nodes, unit.target)])
    with pytest.raises(PassContractError, match=f"steps, more than {MAX_STEPS}"):
        _broken(ElementwiseFusion(SPECS), PassResult(long_model, True, report))(model, values)


def _nonzero_model():
    return _model([helper.make_node("NonZero", ["x"], ["i"], name="nz"),
                   helper.make_node("Transpose", ["i"], ["y"], name="t")],
                  [_vi("x", shape=(3, 4))], [_vi("y", TP.INT64, None)])


def test_the_split_requires_no_region_and_ensures_nothing_outside_it_reads_nonzero():
    model = _nonzero_model()
    values = static_values(model)
    result = SplitDataDependent(SPECS)(model, values)
    assert result.modified and len(result.report.nonzeros) == 1
    with pytest.raises(PassContractError, match="pass split_data_dependent: requires does not hold: .*a region already"):
        SplitDataDependent(SPECS)(result.model, static_values(result.model))
    # a report claiming the split of a model left as written: Transpose still reads 'i'
    report = SplitResult(_copy(model), [PaddedNonZero("x", "i", "i::nonzero_all", "i::nonzero_count")])
    with pytest.raises(PassContractError, match="NonZero 'i' does not make.*reads 'i' outside the region"):
        _broken(SplitDataDependent(SPECS), PassResult(report.model, True, report))(model, values)


def test_the_split_types_what_the_region_makes_as_the_model_as_written():
    model = _nonzero_model()
    values = static_values(model)
    pass_ = SplitDataDependent(SPECS)
    result = pass_(model, values)
    after = pass_.values_after(values, result)
    # inference of the split model does not know the region's output shape; the model as written does
    assert static_values(result.model)["y"].shape is None
    assert after["y"].elem_type == TP.INT64 and len(after["y"].shape) == 2


def test_the_graph_index_is_what_the_fusions_share():
    model = conv_bn_model()
    G = GraphIndex(model)
    assert G.producer["c"] == 0 and G.edges["c"] == [(1, 0)] and G.readers("c") == 1
    assert set(G.initializers) == {"w", "s", "b", "m", "v"} and G.outputs == {"y"} and G.opset == 17
    assert G.constant("w").shape == (4, 3, 3, 3) and G.constant("x") is None
    fed = conv_bn_model()
    fed.graph.input.append(_vi("w", shape=(4, 3, 3, 3)))   # an initializer a feed overrides is no constant
    assert "w" not in GraphIndex(fed).initializers and GraphIndex(fed).constant("w") is None

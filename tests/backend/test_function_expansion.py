"""Ops without a GPU kernel expanded into their ONNX function bodies (backend_wgpu/function_expansion.py):
the pass on the CPU (which nodes it takes, what it leaves and why), then FlexAttention, which has no
kernel, on the GPU through its body against onnx.reference over shapes, heads and scales."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP, helper
from onnx.reference import ReferenceEvaluator

from onnx_quant.backend_wgpu.function_expansion import CALL_DOMAIN, ExpandFunctions
from onnx_quant.backend_wgpu.model_check import static_values
from onnx_quant.backend_wgpu.session import Session, _specs

from support.gpu import gpu_examples

PREVIEW = "ai.onnx.preview"


def flex_model(q, k, v, **attrs):
    """One FlexAttention node (ai.onnx.preview 1, opset 26) over graph inputs of these shapes."""
    node = helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], domain=PREVIEW, **attrs)
    ins = [helper.make_tensor_value_info(n, TP.FLOAT, list(s)) for n, s in zip("QKV", (q, k, v))]
    graph = helper.make_graph([node], "flex", ins, [helper.make_tensor_value_info("Y", TP.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26), helper.make_opsetid(PREVIEW, 1)])


def one_node(op, opset, shape=(4,), **attrs):
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TP.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TP.FLOAT, list(shape))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def expand(model):
    return ExpandFunctions(_specs())(model, static_values(model))


def test_a_node_without_a_kernel_becomes_its_function_body():
    model = flex_model((1, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8))
    result = expand(model)
    assert result.modified and result.model is not model
    ops = [n.op_type for n in result.model.graph.node]
    assert "FlexAttention" not in ops and {"MatMul", "Softmax"} <= set(ops)
    assert not [n for n in result.model.graph.node if n.domain == CALL_DOMAIN]
    assert CALL_DOMAIN not in {o.domain for o in result.model.opset_import}
    assert [o.name for o in result.model.graph.output] == ["Y"]
    assert any("Y" in n.output for n in result.model.graph.node)
    (rec,) = result.report.expanded
    assert (rec.op_type, rec.domain, rec.body_nodes) == ("FlexAttention", PREVIEW, len(result.model.graph.node))


def test_a_body_with_an_op_no_kernel_runs_stays_one_node_and_says_why():
    # Bernoulli's body draws with RandomUniformLike, which has no kernel: one host node, not a host
    # node among GPU ones
    result = expand(one_node("Bernoulli", 22))
    assert not result.modified
    assert result.report.failed == {"Bernoulli_0": "no GPU kernel for RandomUniformLike of its function body"}


@pytest.mark.parametrize("op, opset", [("Gelu", 20), ("LayerNormalization", 17), ("Relu", 14)])
def test_a_node_a_kernel_takes_is_left_alone(op, opset):
    shape = (2, 4)
    model = one_node(op, opset, shape)
    if op == "LayerNormalization":
        node = model.graph.node[0]
        node.input.append("scale")
        model.graph.initializer.append(helper.make_tensor("scale", TP.FLOAT, [4], [1.0] * 4))
    result = expand(model)
    assert not result.modified and result.report.expanded == []


def test_turned_off_it_changes_nothing():
    model = flex_model((1, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8))
    result = ExpandFunctions(_specs(), enabled=False)(model, static_values(model))
    assert not result.modified and result.model is model


@settings(max_examples=gpu_examples())
@given(b=st.integers(1, 2), kv_heads=st.integers(1, 3), group=st.sampled_from([1, 2]), q_len=st.integers(1, 7),
       kv_len=st.integers(1, 9), e=st.sampled_from([4, 8, 16]), ev=st.sampled_from([4, 8]),
       scale=st.sampled_from([None, 0.3]), seed=st.integers(0, 2**31))
def test_flex_attention_runs_on_the_gpu_through_its_body(best, b, kv_heads, group, q_len, kv_len, e, ev, scale, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, kv_heads * group, q_len, e)).astype(np.float32)
    k = rng.standard_normal((b, kv_heads, kv_len, e)).astype(np.float32)
    v = rng.standard_normal((b, kv_heads, kv_len, ev)).astype(np.float32)
    model = flex_model(q.shape, k.shape, v.shape, **({} if scale is None else {"scale": scale}))
    feeds = {"Q": q, "K": k, "V": v}
    with Session(model, device=best, allow_host_fallback=False) as s:
        assert [r.op_type for r in s.function_expansion.expanded] == ["FlexAttention"]
        (got,) = s.run(None, feeds)
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    # a softmax-weighted mean of V: float32 rounding of the scores and the two sums
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

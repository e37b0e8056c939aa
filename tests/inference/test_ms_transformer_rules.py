"""The com.microsoft transformer rules (inference/rules/ms_transformers.py): every output's type
and shape against an onnxruntime run of the node, the symbolic formulas, and the findings."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_quant import inference
from onnx_quant.inference import dims
from support.models import make_model

F, I32, I64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
MS = "com.microsoft"
rng = np.random.default_rng(0)


def _arr(shape, dtype=np.float32):
    return rng.uniform(-1, 1, shape).astype(dtype)


class Const:
    """An input given as an initializer (a value the pass knows), not fed."""

    def __init__(self, array) -> None:
        self.array = np.asarray(array)


def _fed(inputs: dict) -> dict:
    return {k: v for k, v in inputs.items() if v is not None and not isinstance(v, Const)}


def _node_model(op, inputs: dict, outputs, attrs=None, domain=MS):
    """One node; ``inputs`` name -> array (fed), ``Const`` (an initializer) or None (absent)."""
    names = [("" if a is None else k) for k, a in inputs.items()]
    node = helper.make_node(op, names, outputs, name="n", domain=domain, **(attrs or {}))
    vis = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
           for k, a in _fed(inputs).items()]
    inits = [numpy_helper.from_array(v.array, k) for k, v in inputs.items() if isinstance(v, Const)]
    return make_model([node], vis, [o for o in outputs if o], inits, extra_opsets=[MS], ir_version=9)


CASES = {
    "SkipLayerNormalization": ("SkipLayerNormalization", {"x": _arr((2, 3, 8)), "skip": _arr((2, 3, 8)),
                                                          "gamma": _arr(8), "beta": _arr(8), "bias": _arr(8)},
                               ["y", "mean", "inv_std", "sum"], {"epsilon": 1e-5}),
    "SkipLayerNormalization-2d-skip": ("SkipLayerNormalization", {"x": _arr((2, 3, 8)), "skip": _arr((3, 8)),
                                                                  "gamma": _arr(8)}, ["y", "", "", "sum"], {}),
    "SkipSimplifiedLayerNormalization": ("SkipSimplifiedLayerNormalization",
                                         {"x": _arr((2, 3, 8)), "skip": _arr((2, 3, 8)), "gamma": _arr(8),
                                          "bias": _arr(8)}, ["y", "mean", "inv_std", "sum"], {}),
    "RotaryEmbedding-3d": ("RotaryEmbedding", {"x": _arr((2, 3, 16)), "pos": np.array([[0, 1, 2], [3, 4, 5]]),
                                               "cos": _arr((8, 4)), "sin": _arr((8, 4))}, ["y"], {"num_heads": 2}),
    "RotaryEmbedding-4d": ("RotaryEmbedding", {"x": _arr((2, 2, 3, 8)), "pos": np.array([[0, 1, 2], [3, 4, 5]]),
                                               "cos": _arr((8, 4)), "sin": _arr((8, 4))}, ["y"], {}),
    "MultiHeadAttention-past": ("MultiHeadAttention", {"q": _arr((2, 3, 16)), "k": _arr((2, 3, 16)),
                                                       "v": _arr((2, 3, 16)), "bias": None, "kpm": None,
                                                       "ab": _arr((2, 1, 3, 8)), "pk": _arr((2, 2, 5, 8)),
                                                       "pv": _arr((2, 2, 5, 8))},
                                ["y", "present_k", "present_v"], {"num_heads": 2}),
    "MultiHeadAttention-no-past": ("MultiHeadAttention", {"q": _arr((2, 3, 16)), "k": _arr((2, 4, 16)),
                                                          "v": _arr((2, 4, 24))}, ["y"], {"num_heads": 2}),
    "GroupQueryAttention-past": ("GroupQueryAttention", {"q": _arr((2, 1, 32)), "k": _arr((2, 1, 16)),
                                                         "v": _arr((2, 1, 16)), "pk": _arr((2, 2, 5, 8)),
                                                         "pv": _arr((2, 2, 5, 8)),
                                                         "seqlens_k": np.array([5, 5], np.int32),
                                                         "total": Const(np.array(6, np.int32))},
                                 ["y", "present_k", "present_v"], {"num_heads": 4, "kv_num_heads": 2}),
    "GroupQueryAttention-prefill-rotary": ("GroupQueryAttention",
                                           {"q": _arr((1, 3, 64)), "k": _arr((1, 3, 32)), "v": _arr((1, 3, 32)),
                                            "pk": None, "pv": None, "seqlens_k": np.array([2], np.int32),
                                            "total": Const(np.array(3, np.int32)), "cos": _arr((8, 8)),
                                            "sin": _arr((8, 8))},
                                           ["y", "present_k", "present_v"],
                                           {"num_heads": 4, "kv_num_heads": 2, "do_rotary": 1}),
    "MatMulNBits-3d-bias": ("MatMulNBits", {"a": _arr((2, 3, 64)),
                                             "b": Const(rng.integers(0, 256, (16, 2, 16), dtype=np.uint8)),
                                             "scales": Const(_arr(32)), "zp": None, "g_idx": None,
                                             "bias": Const(_arr(16))},
                            ["y"], {"K": 64, "N": 16, "bits": 4, "block_size": 32}),
    "MatMulNBits-2d-scales": ("MatMulNBits", {"a": _arr((5, 48)),
                                              "b": Const(rng.integers(0, 256, (8, 3, 8), dtype=np.uint8)),
                                              "scales": Const(_arr((8, 3)))},
                              ["y"], {"K": 48, "N": 8, "bits": 4, "block_size": 16}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_outputs_match_an_onnxruntime_run(case):
    op, inputs, outputs, attrs = CASES[case]
    model = _node_model(op, inputs, outputs, attrs)
    result = inference.infer(model)
    assert not result.errors, [str(e) for e in result.errors]
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feeds = _fed(inputs)
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    assert set(got) == {o for o in outputs if o}
    for name, array in got.items():
        info = result.ctx[name]
        assert (info.elem_type, info.shape) == (helper.np_dtype_to_tensor_dtype(array.dtype), array.shape), name


def test_simplified_layer_normalization_in_both_domains():
    """onnxruntime registers it in the ONNX domain (what the genai builder writes) and in com.microsoft."""
    inputs = {"x": _arr((2, 3, 8)), "scale": _arr(8)}
    for domain in ("", MS):
        model = _node_model("SimplifiedLayerNormalization", inputs, ["y", "inv_std"], {"axis": -1}, domain=domain)
        result = inference.infer(model)
        assert not result.errors
        assert result.ctx["y"].shape == (2, 3, 8) and result.ctx["inv_std"].shape == (2, 3, 1)
        assert result.ctx["inv_std"].elem_type == F
    opts = ort.SessionOptions()
    sess = ort.InferenceSession(_node_model("SimplifiedLayerNormalization", inputs, ["y", "inv_std"], {"axis": -1},
                                            domain="").SerializeToString(), opts, providers=["CPUExecutionProvider"])
    y, inv = sess.run(None, inputs)
    assert (y.shape, inv.shape) == ((2, 3, 8), (2, 3, 1))


# ---------------------------------------------------------------- symbolic
B, S, P = (dims.Dim.symbol(s) for s in ("batch", "seq", "past"))


def _sym_model(nodes, inputs, outputs):
    return make_model(nodes, inputs, outputs, extra_opsets=[MS], ir_version=9)


def test_multi_head_attention_present_is_past_plus_kv_sequence():
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "", "", "pk", "pv"], ["y", "pk2", "pv2"],
                            domain=MS, num_heads=4)
    model = _sym_model([node], [("q", F, ["batch", "seq", 64]), ("k", F, ["batch", "seq", 64]),
                                ("v", F, ["batch", "seq", 64]), ("pk", F, ["batch", 4, "past", 16]),
                                ("pv", F, ["batch", 4, "past", 16])], ["y", "pk2", "pv2"])
    ctx = inference.infer(model).ctx
    assert ctx["y"].shape == (B, S, 64)
    assert ctx["pk2"].shape == ctx["pv2"].shape == (B, 4, dims.add(P, S), 16)
    assert dims.to_text(ctx["pk2"].shape[2]) == "past + seq"


def _gqa_model(total_from_shape: bool):
    """GQA whose total_sequence_length is Cast(Shape(mask)[1]) (the genai builder's), or an input."""
    nodes = []
    if total_from_shape:
        nodes += [helper.make_node("Shape", ["mask"], ["mask_shape"]),
                  helper.make_node("Gather", ["mask_shape", "one"], ["total64"], axis=0),
                  helper.make_node("Cast", ["total64"], ["total"], to=I32)]
    nodes.append(helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens_k", "total"],
                                  ["y", "pk2", "pv2"], name="gqa", domain=MS, num_heads=4, kv_num_heads=2))
    inputs = [("q", F, ["batch", "seq", 64]), ("k", F, ["batch", "seq", 32]), ("v", F, ["batch", "seq", 32]),
              ("pk", F, ["batch", 2, "past", 16]), ("pv", F, ["batch", 2, "past", 16]), ("seqlens_k", I32, ["batch"])]
    inputs.append(("mask", I64, ["batch", "total_len"]) if total_from_shape else ("total", I32, []))
    model = _sym_model(nodes, inputs, ["y", "pk2", "pv2"])
    if total_from_shape:
        model.graph.initializer.append(numpy_helper.from_array(np.array(1, np.int64), "one"))
    return model


def test_group_query_attention_present_is_max_of_past_and_total_length():
    ctx = inference.infer(_gqa_model(True)).ctx
    assert ctx["y"].shape == (B, S, 64)
    total = dims.Dim.symbol("total_len")
    assert ctx["pk2"].shape == ctx["pv2"].shape == (B, 2, dims.maximum(P, total), 16)


def test_group_query_attention_unknown_total_gets_a_fresh_symbol():
    ctx = inference.infer(_gqa_model(False)).ctx
    length = ctx["pk2"].shape[2]
    assert isinstance(length, dims.Dim) and length not in (P, S)
    assert ctx["pk2"].shape[:2] == (B, 2) and ctx["pk2"].shape[3] == 16


# ---------------------------------------------------------------- findings
def _errors(model):
    """The diagnostics, as ``node: rule: message``."""
    return [str(d) for d in inference.infer(model).diagnostics]


def test_group_query_attention_heads_must_group():
    model = _gqa_model(False)
    next(a for a in model.graph.node[0].attribute if a.name == "kv_num_heads").i = 3  # does not divide 4
    errs = _errors(model)
    assert errs and errs[0].startswith("'gqa' (GroupQueryAttention): GroupQueryAttention:"), errs
    assert "multiple of kv_num_heads: expected a multiple of 3, found 4" in errs[0]


def test_group_query_attention_lengths_must_be_int32():
    model = _gqa_model(False)
    model.graph.input[5].type.tensor_type.elem_type = I64
    errs = _errors(model)
    assert any("seqlens_k" in e and "expected int32" in e for e in errs), errs


def test_skip_layer_normalization_gamma_must_match_hidden():
    node = helper.make_node("SkipLayerNormalization", ["x", "s", "g"], ["y"], name="sln", domain=MS)
    model = _sym_model([node], [("x", F, ["batch", "seq", 8]), ("s", F, ["batch", "seq", 8]), ("g", F, [6])], ["y"])
    errs = _errors(model)
    assert errs and errs[0].startswith("'sln' (SkipLayerNormalization): SkipLayerNormalization:"), errs
    assert "expected [8], found [6]" in errs[0]


def test_rotary_embedding_position_ids_must_be_int64():
    node = helper.make_node("RotaryEmbedding", ["x", "p", "c", "s"], ["y"], name="rot", domain=MS)
    model = _sym_model([node], [("x", F, ["batch", "seq", 16]), ("p", I32, ["batch", "seq"]), ("c", F, [8, 4]),
                                ("s", F, [8, 4])], ["y"])
    result = inference.infer(model)
    assert any("position_ids" in str(e) and "int64" in str(e) for e in result.errors)
    assert result.ctx["y"].shape == (B, S, 16)


def test_multi_head_attention_needs_num_heads():
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], name="mha", domain=MS)
    model = _sym_model([node], [(x, F, ["batch", "seq", 16]) for x in "qkv"], ["y"])
    errs = _errors(model)
    assert errs and "'mha' (MultiHeadAttention): MultiHeadAttention: attribute num_heads" in errs[0], errs


@pytest.mark.parametrize("scales, bias, finding", [
    ((31,), (16,), "scales must hold one scale per block of each column: expected N * ceil(K / block_size) = 32"),
    ((32,), (8,), "bias must be 1-D of N entries: expected [16], found [8]"),
])
def test_matmul_nbits_scales_and_bias_must_fit(scales, bias, finding):
    node = helper.make_node("MatMulNBits", ["a", "b", "s", "", "", "bias"], ["y"], name="mm", domain=MS, K=64, N=16,
                            bits=4, block_size=32)
    model = _sym_model([node], [("a", F, ["batch", "seq", 64]), ("b", TensorProto.UINT8, [16, 2, 16]),
                                ("s", F, list(scales)), ("bias", F, list(bias))], ["y"])
    result = inference.infer(model)
    errs = [str(d) for d in result.diagnostics]
    assert len(errs) == 1 and errs[0].startswith("'mm' (MatMulNBits): MatMulNBits:") and finding in errs[0], errs
    assert result.ctx["y"].shape == (B, S, 16)

"""Attention (opsets 23, 24, 25; templates/attention.kernel.json) on the GPU.

- ONNX's Attention node cases pass with no host fallback under each variant (the softmax's
  workgroup and serial forms), or are named in DECLINED with the clause that declines them;
- random nodes over every feature (3-D / 4-D, grouped-query heads, bool and float masks of
  every rank, causal, nonpad_kv_seqlen, windows, scale, softcap, past / present,
  qk_matmul_output modes 0-3, softmax_precision, float16) meet ONNX's rule (rtol 1e-3,
  atol 1e-7) against onnx.reference, float32 also a tighter one against float64 (the measured
  errors are in docs/kernels.md), and both variants give the same bits;
- what the kernel cannot compute as the reference does is declined (KernelRejected).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from support.gpu import assert_node_cases_pass_or_declined, run_every_variant
from support.models import value_info_of

#: node cases kept off the GPU, and the words of the reason
DECLINED = {f"test_attention_{c}": "T allows only float32, float16"
            for c in ("4d_causal_bf16", "4d_padded_kv_bf16", "4d_causal_padded_kv_bf16",
                      "4d_attn_mask_causal_bf16", "3d_causal_bf16")}
VARIANTS = ("workgroup", "serial")
RTOL, ATOL = 1e-3, 1e-7


def test_onnx_node_cases_pass_under_every_variant_or_are_declined_by_name(best):
    from onnx_quant.backend_wgpu.conformance import compare_outputs
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import KernelRejected

    def every_variant(case, feeds, expected, names):
        for v in VARIANTS:
            try:
                with Session(case.model, device=best, variants={"Attention": v}, allow_host_fallback=False) as s:
                    got = s.run(None, feeds)
            except KernelRejected:  # the serial form declines rows beyond SERIAL_MAX_ROW only
                assert v == "serial"
                continue
            cmp = compare_outputs(got, expected, names, rtol=RTOL, atol=ATOL)
            assert cmp.passed, (case.name, v, cmp.detail)

    assert_node_cases_pass_or_declined(best, ("Attention",), DECLINED, 88, expanded=False, check=every_variant)


# ----------------------------------------------------------------------------- random nodes

def _model(opset, attrs, inputs, outputs, T):
    """One Attention node; ``inputs``: name -> array or None (absent); ``outputs``: names or "".
    The outputs are typed with onnx.reference's shapes (shape inference leaves some unknown)."""
    names = ["Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"]
    node_in = [n if inputs.get(n) is not None else "" for n in names]
    while node_in and node_in[-1] == "":
        node_in.pop()
    node = helper.make_node("Attention", node_in, outputs, name="Attention", **attrs)
    in_info = [value_info_of(n, inputs[n]) for n in node_in if n]
    opsets = [helper.make_opsetid("", opset)]
    untyped = helper.make_graph([node], "g", in_info, [helper.make_tensor_value_info(o, T, None) for o in outputs if o])
    shapes = [r.shape for r in _reference(helper.make_model(untyped, opset_imports=opsets), _feeds(inputs))]
    graph = helper.make_graph([node], "g", in_info, [helper.make_tensor_value_info(o, T, shape)
                                                     for o, shape in zip([o for o in outputs if o], shapes)])
    return helper.make_model(graph, opset_imports=opsets)


def _feeds(inputs):
    return {k: v for k, v in inputs.items() if v is not None}


#: masks as (kind, dims): B, H, S (queries), L (keys), "l" (L - 1: a shorter mask, padded), 1
# (name, opset, attributes, layout, mask); layout: B, Hq, Hkv, Sq, Skv, D, Dv, P (past), 3-D?
# onnx.reference (1.23) takes the causal frontier's query count from the mask's shape: a causal
# node's mask here has all Sq rows (test_causal_mask_broadcast_over_queries_follows_the_spec).
CONFIGS = [
    ("4d_plain", 23, {}, (2, 3, 3, 4, 6, 8, 8, 0, False), None),
    ("3d_gqa_scaled", 23, {"scale": 0.3}, (2, 6, 2, 3, 5, 4, 6, 0, True), ("bool", "l")),
    ("4d_causal_past", 23, {"is_causal": 1}, (1, 4, 2, 3, 3, 8, 8, 4, False), ("bool", "B1SL")),
    ("3d_softcap_past_qk1", 23, {"softcap": 1.5, "qk_matmul_output_mode": 1}, (2, 2, 2, 2, 3, 8, 4, 3, True),
     ("float", "1L")),
    ("4d_qk0", 23, {"qk_matmul_output_mode": 0}, (1, 2, 1, 5, 7, 4, 4, 0, False), ("float", "H1L")),
    ("4d_qk2_causal", 24, {"qk_matmul_output_mode": 2, "is_causal": 1}, (2, 2, 2, 4, 4, 4, 4, 2, False),
     ("bool", "SL")),
    ("4d_qk3_sp_double", 23, {"qk_matmul_output_mode": 3, "softmax_precision": 11}, (1, 3, 3, 3, 6, 8, 8, 0, False),
     ("float", "BHSl")),
    ("4d_sp_half", 23, {"softmax_precision": 10}, (1, 2, 2, 3, 5, 8, 8, 0, False), ("bool", "B11L")),
    ("4d_long_rows", 23, {"is_causal": 1}, (1, 2, 1, 3, 300, 8, 8, 0, False), ("float", "Sl")),
    ("3d_mqa_window", 25, {"is_causal": 1, "left_window_size": 2, "q_num_heads": 4, "kv_num_heads": 1},
     (2, 4, 1, 4, 6, 8, 6, 0, True), ("bool", "B11L")),
    ("4d_bidirectional_window", 25, {"left_window_size": 1, "right_window_size": 2}, (1, 2, 2, 5, 5, 4, 4, 0, False),
     ("float", "L")),
]


def _inputs(rng, layout, T, mask=None, nonpad=None):
    B, Hq, Hkv, Sq, Skv, D, Dv, P, is3d = layout
    L = P + Skv
    dt = np.float16 if T == TensorProto.FLOAT16 else np.float32

    def t(heads, s, d):
        return (rng.uniform(-1, 1, (B, s, heads * d)) if is3d else rng.uniform(-1, 1, (B, heads, s, d))).astype(dt)

    ins = {"Q": t(Hq, Sq, D), "K": t(Hkv, Skv, D), "V": t(Hkv, Skv, Dv)}
    if P:
        ins["past_key"] = rng.uniform(-1, 1, (B, Hkv, P, D)).astype(dt)
        ins["past_value"] = rng.uniform(-1, 1, (B, Hkv, P, Dv)).astype(dt)
    if mask is not None:
        kind, dims = mask
        shape = tuple({"B": B, "H": Hq, "S": Sq, "L": L, "l": L - 1, "1": 1}[c] for c in dims)
        if kind == "bool":
            m = rng.random(shape) < 0.7
        else:
            m = rng.uniform(-2, 1, shape).astype(dt)
            m[rng.random(shape) < 0.2] = -np.inf
        ins["attn_mask"] = m
    if nonpad is not None:
        ins["nonpad_kv_seqlen"] = np.asarray(nonpad, np.int64)
    return ins


def _outputs(attrs, past):
    outs = ["Y", "present_key" if past else "", "present_value" if past else ""]
    if "qk_matmul_output_mode" in attrs:
        outs.append("qk_matmul_output")
    while outs[-1] == "":
        outs.pop()
    return outs


def _reference(model, feeds):
    return ReferenceEvaluator(model).run(None, feeds)


def _run_variants(best, model, feeds):
    return run_every_variant(best, model, feeds, "Attention")


def _rel_err(got, ref):
    """max |got - ref| / max(|ref|, 1e-3) over finite reference elements (the same infinities
    and NaN required elsewhere)."""
    got = got.astype(np.float64)
    ref = ref.astype(np.float64)
    fin = np.isfinite(ref)
    assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(got[np.isinf(ref)], ref[np.isinf(ref)])
    if not fin.any():
        return 0.0
    return float((np.abs(got[fin] - ref[fin]) / np.maximum(np.abs(ref[fin]), 1e-3)).max())


def _within(got, ref, spread, rtol=RTOL, atol=ATOL):
    """ONNX's rule, |got - ref| <= atol + rtol |ref|, widened by spread times the tensor's largest
    finite magnitude; infinities equal, NaN where the reference has NaN.

    float16 (spread 2^-9): the kernel rounds where the reference does, but its tanh / exp /
    division may put a float16 rounding one ulp (2^-11 relative) away; such a step moves a
    probability by an ulp, and Y, a combination of values of both signs, by an ulp of the
    values it sums, not of its own (possibly cancelled) size: a few ulps of the largest value.
    """
    g = got.astype(np.float64)
    r = ref.astype(np.float64)
    fin = np.isfinite(r)
    if not (np.array_equal(np.isnan(g), np.isnan(r)) and np.array_equal(g[np.isinf(r)], r[np.isinf(r)])):
        return False
    top = np.abs(r[fin]).max() if fin.any() else 0.0
    return bool(np.all(np.abs(g[fin] - r[fin]) <= atol + rtol * np.abs(r[fin]) + spread * top))


@pytest.mark.parametrize("T", [TensorProto.FLOAT, TensorProto.FLOAT16], ids=["float32", "float16"])
@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=[c[0] for c in CONFIGS])
def test_random_nodes_meet_onnx_rule_against_onnx_reference(best, index, T):
    name, opset, attrs, layout, mask = CONFIGS[index]
    if layout[8]:  # 3-D inputs name their heads
        attrs = {"q_num_heads": layout[1], "kv_num_heads": layout[2]} | attrs
    rng = np.random.default_rng(index + 10 * T)
    ins = _inputs(rng, layout, T, mask)
    past = layout[7] > 0
    model = _model(opset, attrs, ins, _outputs(attrs, past), T)
    got, ids = _run_variants(best, model, _feeds(ins))
    if layout[4] + layout[7] > 256:
        assert ids == ["workgroup"]
    ref = _reference(model, _feeds(ins))
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        assert _within(g, r, 0.0 if T == TensorProto.FLOAT else 2.0**-9), (name, _rel_err(g, r))
    if T == TensorProto.FLOAT and "softmax_precision" not in attrs:
        # float32 against the same node computed in float64: a few float32 roundings (2^-24)
        # and WGSL's exp (a few ulps), spread by the sums: 2^-20 of the largest magnitude
        ins64 = {k: (v.astype(np.float64) if v is not None and v.dtype == np.float32 else v) for k, v in ins.items()}
        ref64 = _reference(_model(opset, attrs, ins64, _outputs(attrs, past), TensorProto.DOUBLE), _feeds(ins64))
        for g, r in zip(got, ref64):
            assert _within(g, r, 2.0**-20, rtol=2.0**-20, atol=0.0), (name, _rel_err(g, r))


@pytest.mark.parametrize("causal", [0, 1])
def test_nonpad_kv_seqlen_external_cache(best, causal):
    rng = np.random.default_rng(5 + causal)
    layout = (3, 4, 2, 3, 8, 8, 8, 0, False)
    ins = _inputs(rng, layout, TensorProto.FLOAT, ("bool", "HSL"), nonpad=[8, 5, 2])  # 2 < Sq: empty rows
    model = _model(24, {"is_causal": causal}, ins, ["Y"], TensorProto.FLOAT)
    got, _ = _run_variants(best, model, _feeds(ins))
    ref = _reference(model, _feeds(ins))
    assert np.allclose(got[0], ref[0], rtol=RTOL, atol=ATOL)
    if causal:
        assert np.all(got[0][2, :, 0] == 0)  # offset 2 - 3 < 0: query 0 of batch 2 sees no key


@pytest.mark.parametrize("dims", ["1L", "B11L", "L"])
def test_causal_mask_broadcast_over_queries_follows_the_spec(best, dims):
    """Query i attends key j iff j <= i + offset, whatever the mask's shape. onnx.reference (1.23)
    takes the frontier's query count from the mask's shape (`base.shape[-2:]` in _apply_causal):
    with a mask of one query row it applies row 0's frontier to every row (a rank-1 mask fails).
    The kernel follows the spec; the reference agrees once the mask has all Sq rows."""
    rng = np.random.default_rng(11)
    layout = (2, 2, 2, 4, 3, 8, 8, 2, False)
    ins = _inputs(rng, layout, TensorProto.FLOAT, ("float", dims))
    full = dict(ins, attn_mask=np.broadcast_to(ins["attn_mask"], ins["attn_mask"].shape[:-2] + (4, 5)).copy())
    model = _model(23, {"is_causal": 1}, full, ["Y", "present_key", "present_value"], TensorProto.FLOAT)
    ref = _reference(model, _feeds(full))
    broadcast = _model(23, {"is_causal": 1}, full, ["Y", "present_key", "present_value"], TensorProto.FLOAT)
    broadcast.graph.input[3].CopyFrom(value_info_of("attn_mask", ins["attn_mask"]))
    got, _ = _run_variants(best, broadcast, _feeds(ins))
    for g, r in zip(got, ref):
        assert _within(g, r, 0.0)


def test_fully_masked_rows_are_zero_not_nan(best):
    rng = np.random.default_rng(7)
    ins = _inputs(rng, (1, 2, 2, 3, 4, 8, 8, 0, False), TensorProto.FLOAT)
    ins["attn_mask"] = np.array([[False] * 4, [True, False, True, False], [False] * 4])
    model = _model(23, {"qk_matmul_output_mode": 3}, ins, ["Y", "", "", "qk_matmul_output"], TensorProto.FLOAT)
    (y, probs), _ = _run_variants(best, model, _feeds(ins))
    assert np.all(y[:, :, [0, 2]] == 0) and np.all(probs[:, :, [0, 2]] == 0)
    assert np.allclose(probs[:, :, 1].sum(-1), 1, rtol=1e-6) and np.all(probs[:, :, 1, [1, 3]] == 0)


@pytest.mark.parametrize("attrs, reason", [
    ({"softmax_precision": 16}, "attributesOk"),                    # bfloat16 softmax: not emulated
    ({"qk_matmul_output_mode": 0, "softcap": 2.0}, "attributesOk"),  # onnx.reference softcaps mode 0, the spec does not
    ({"scale": -1.0}, "attributesOk"),                               # sqrt of a negative scale
])
def test_what_the_kernel_cannot_compute_as_the_reference_is_declined(best, attrs, reason):
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import QuantError

    rng = np.random.default_rng(1)
    ins = _inputs(rng, (1, 2, 2, 3, 4, 8, 8, 0, False), TensorProto.FLOAT)
    model = _model(23, attrs, ins, ["Y", "", "", "qk_matmul_output"], TensorProto.FLOAT)
    with pytest.raises(QuantError, match=reason):
        with Session(model, device=best, allow_host_fallback=False) as s:
            s.run(None, _feeds(ins))


def test_float_mask_of_another_type_is_declined(best):
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import QuantError

    rng = np.random.default_rng(2)
    ins = _inputs(rng, (1, 2, 2, 3, 4, 8, 8, 0, False), TensorProto.FLOAT16)
    ins["attn_mask"] = rng.uniform(-1, 0, (3, 4)).astype(np.float32)  # numpy would promote the scores to float32
    model = _model(23, {}, ins, ["Y"], TensorProto.FLOAT16)
    with pytest.raises(QuantError, match="maskOk"):
        with Session(model, device=best, allow_host_fallback=False) as s:
            s.run(None, _feeds(ins))


# ============================================================================= RotaryEmbedding

def _rotary_model(x, cos, sin, pos, attrs):
    T = helper.np_dtype_to_tensor_dtype(x.dtype)
    names = ["X", "cos_cache", "sin_cache"] + (["position_ids"] if pos is not None else [])
    arrays = [x, cos, sin] + ([pos] if pos is not None else [])
    node = helper.make_node("RotaryEmbedding", names, ["Y"], name="RotaryEmbedding", **attrs)
    graph = helper.make_graph([node], "g", [value_info_of(n, a) for n, a in zip(names, arrays)],
                              [helper.make_tensor_value_info("Y", T, x.shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]), dict(zip(names, arrays))


# shape of X, attributes, rotary dim, position ids?
ROTARY = [
    ((2, 3, 5, 8), {}, 8, True),
    ((2, 3, 5, 8), {"interleaved": 1}, 8, True),
    ((2, 5, 12), {"num_heads": 2, "rotary_embedding_dim": 4}, 4, True),
    ((1, 5, 18), {"num_heads": 3, "interleaved": 1, "rotary_embedding_dim": 4}, 4, False),
    ((2, 2, 5, 10), {"rotary_embedding_dim": 6}, 6, False),
]


@pytest.mark.parametrize("dt", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("index", range(len(ROTARY)), ids=[f"r{i}" for i in range(len(ROTARY))])
def test_rotary_embedding_bit_for_bit_with_onnx_reference(best, index, dt):
    """Every product rounded alone (never fused into the sum), float16 rounded at each step:
    onnx.reference's numbers exactly, negative position ids counting from the cache's end."""
    from support.oracles import assert_bits
    from onnx_quant.backend_wgpu.session import Session

    shape, attrs, rot, with_pos = ROTARY[index]
    rng = np.random.default_rng(index)
    B, S = shape[0], shape[1] if len(shape) == 3 else shape[2]
    x = rng.uniform(-4, 4, shape).astype(dt)
    if with_pos:
        cache = (40, rot // 2)
        pos = rng.integers(-5, 40, (B, S)).astype(np.int64)
    else:
        cache, pos = (B, S, rot // 2), None
    angles = rng.uniform(0, 7, cache)
    model, feeds = _rotary_model(x, np.cos(angles).astype(dt), np.sin(angles).astype(dt), pos, attrs)
    with Session(model, device=best, allow_host_fallback=False) as s:
        got = s.run(None, feeds)[0]
    assert_bits(got, ReferenceEvaluator(model).run(None, feeds)[0], f"rotary {index}")

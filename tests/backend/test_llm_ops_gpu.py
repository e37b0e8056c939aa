"""onnx 1.23's new LLM ops on the GPU: SwiGLU (a row of templates/elementwise.ops.json) and
TensorScatter (templates/tensor_scatter.kernel.json), over shapes, attributes and types against
onnx.reference (TensorScatter and float16 SwiGLU bit for bit: the kernel rounds where the
reference stores), ONNX's node cases, and a second shape from a cold cache compiling nothing new."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import given, settings, strategies as st
from onnx import TensorProto as TP, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from support.gpu import (assert_first_run_alone_compiles, assert_node_cases_pass_or_declined, gpu_examples,
                         runs_from_a_cold_cache)
from support.models import make_model
from support.oracles import assert_bits

from onnx_quant.backend_wgpu.session import Session


def _run(best, model, feeds):
    with Session(model, device=best, allow_host_fallback=False) as s:
        return s.run(None, feeds)


def _swiglu_model(code, rank, alpha):
    attrs = {} if alpha is None else {"alpha": alpha}
    ins = [helper.make_tensor_value_info(n, code, [f"d{i}" for i in range(rank)]) for n in ("a", "b")]
    return make_model(helper.make_node("SwiGLU", ["a", "b"], ["y"], **attrs), ins,
                      [helper.make_tensor_value_info("y", code, None)], opset=28)


@settings(max_examples=gpu_examples(), deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), alpha=st.sampled_from([None, 0.5, 1.702, -1.0]),
       f16=st.booleans(), seed=st.integers(0, 2**16))
def test_swiglu_matches_onnx_reference(best, shape, alpha, f16, seed):
    dtype = np.float16 if f16 else np.float32
    model = _swiglu_model(TP.FLOAT16 if f16 else TP.FLOAT, len(shape), alpha)
    rng = np.random.default_rng(seed)
    feeds = {n: rng.uniform(-12, 12, shape).astype(dtype) for n in ("a", "b")}
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    (got,) = _run(best, model, feeds)
    assert got.dtype == want.dtype and got.shape == want.shape
    # float32: WGSL's exp within a few ulps of numpy's; float16: each stored value rounded as the reference does
    np.testing.assert_allclose(got, want, rtol=2e-6 if not f16 else 1e-3, atol=1e-30)


def test_swiglu_node_cases(best):
    assert_node_cases_pass_or_declined(best, {"SwiGLU"}, {}, 6)


def test_swiglu_second_shape_compiles_nothing(best):
    model = _swiglu_model(TP.FLOAT, 2, 0.5)
    rng = np.random.default_rng(1)
    feeds = [{n: rng.uniform(-4, 4, s).astype(np.float32) for n in ("a", "b")} for s in [(2, 8), (5, 24)]]
    outs, compiled = runs_from_a_cold_cache(best, model, feeds)
    assert_first_run_alone_compiles(compiled, "SwiGLU")
    ref = ReferenceEvaluator(model)
    for f, (got,) in zip(feeds, outs):
        np.testing.assert_allclose(got, ref.run(None, f)[0], rtol=2e-6)


# ----------------------------------------------------------------------------- TensorScatter

_TYPES = [(np.float32, TP.FLOAT), (np.float16, TP.FLOAT16), (np.int64, TP.INT64), (np.uint8, TP.UINT8),
          (np.bool_, TP.BOOL), (ml_dtypes.int4, TP.INT4), (ml_dtypes.float8_e4m3fn, TP.FLOAT8E4M3FN)]


def _scatter_model(code, rank, axis, mode, with_indices):
    attrs = {k: v for k, v in (("axis", axis), ("mode", mode)) if v is not None}
    names = ["past", "update"] + (["idx"] if with_indices else [])
    ins = [helper.make_tensor_value_info(n, code, [f"{n}{i}" for i in range(rank)]) for n in ("past", "update")]
    if with_indices:
        ins.append(helper.make_tensor_value_info("idx", TP.INT64, ["b"]))
    return make_model(helper.make_node("TensorScatter", names, ["y"], **attrs), ins,
                      [helper.make_tensor_value_info("y", code, None)], opset=24)


def _values(rng, dtype, shape):
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype == ml_dtypes.int4:
        return rng.integers(-8, 8, shape).astype(dtype)
    return rng.uniform(-100, 100, shape).astype(dtype)


@settings(max_examples=gpu_examples(), deadline=None)
@given(data=st.data(), rank=st.integers(2, 4), circular=st.booleans(), typ=st.sampled_from(_TYPES),
       seed=st.integers(0, 2**16))
def test_tensor_scatter_matches_onnx_reference_bit_for_bit(best, data, rank, circular, typ, seed):
    dtype, code = typ
    axis = data.draw(st.integers(1, rank - 1))
    shape = [data.draw(st.integers(1, 3)) for _ in range(rank)]
    shape[axis] = data.draw(st.integers(1, 8))
    seq = data.draw(st.integers(0, shape[axis]))
    ushape = list(shape)
    ushape[axis] = seq
    if circular:  # any int64: the kernel reduces it mod the cache length exactly
        idx = data.draw(st.lists(st.integers(-2**63, 2**63 - 1) | st.integers(-20, 20), min_size=shape[0],
                                 max_size=shape[0]))
    else:  # linear: in range, or negative within the cache (numpy's wrap)
        idx = data.draw(st.lists(st.integers(-shape[axis], shape[axis] - seq), min_size=shape[0], max_size=shape[0]))
    with_indices = data.draw(st.booleans())
    model = _scatter_model(code, rank, axis - rank if data.draw(st.booleans()) else axis,
                           "circular" if circular else data.draw(st.sampled_from([None, "linear"])), with_indices)
    rng = np.random.default_rng(seed)
    feeds = {"past": _values(rng, dtype, shape), "update": _values(rng, dtype, ushape)}
    if with_indices:
        feeds["idx"] = np.array(idx, np.int64)
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    (got,) = _run(best, model, feeds)
    assert_bits(got, want, "TensorScatter")


def test_tensor_scatter_node_cases(best):
    assert_node_cases_pass_or_declined(best, {"TensorScatter"}, {}, 3)


def test_tensor_scatter_second_shape_compiles_nothing(best):
    model = _scatter_model(TP.FLOAT, 4, 2, "circular", True)
    rng = np.random.default_rng(2)
    feeds = [{"past": rng.random((2, 2, 8, 4), np.float32), "update": rng.random((2, 2, 3, 4), np.float32),
              "idx": np.array([6, 1], np.int64)},
             {"past": rng.random((3, 2, 16, 4), np.float32), "update": rng.random((3, 2, 5, 4), np.float32),
              "idx": np.array([14, 0, 9], np.int64)}]
    outs, compiled = runs_from_a_cold_cache(best, model, feeds)
    assert_first_run_alone_compiles(compiled, "TensorScatter")
    ref = ReferenceEvaluator(model)
    for f, (got,) in zip(feeds, outs):
        assert_bits(got, ref.run(None, f)[0], "TensorScatter")


# ----------------------------------------------------------------------------- CausalConvWithState


def _causal_conv_model(code, bias, past, activation):
    names = ["x", "w", "bias" if bias else "", "past" if past else ""]
    while names[-1] == "":
        names.pop()
    ins = [helper.make_tensor_value_info("x", code, ["b", "c", "t"]), helper.make_tensor_value_info("w", code, ["c", 1, "k"])]
    ins += [helper.make_tensor_value_info(n, code, None) for n in names[2:] if n]
    attrs = {} if activation is None else {"activation": activation}
    node = helper.make_node("CausalConvWithState", names, ["y", "state"], **attrs)
    return make_model(node, ins, [helper.make_tensor_value_info(o, code, None) for o in ("y", "state")], opset=27)


@settings(max_examples=gpu_examples(), deadline=None)
@given(b=st.integers(1, 2), c=st.integers(1, 4), t=st.integers(1, 9), k=st.integers(1, 5), bias=st.booleans(),
       past=st.booleans(), activation=st.sampled_from([None, "none", "silu", "swish"]), f16=st.booleans(),
       seed=st.integers(0, 2**16))
def test_causal_conv_with_state_matches_onnx_reference(best, b, c, t, k, bias, past, activation, f16, seed):
    dtype, code = (np.float16, TP.FLOAT16) if f16 else (np.float32, TP.FLOAT)
    rng = np.random.default_rng(seed)
    model = _causal_conv_model(code, bias, past, activation)
    feeds = {"x": rng.uniform(-2, 2, (b, c, t)).astype(dtype), "w": rng.uniform(-1, 1, (c, 1, k)).astype(dtype)}
    if bias:
        feeds["bias"] = rng.uniform(-1, 1, c).astype(dtype)
    if past:
        feeds["past"] = rng.uniform(-2, 2, (b, c, k - 1)).astype(dtype)
    want = ReferenceEvaluator(model).run(None, feeds)
    got = _run(best, model, feeds)
    assert_bits(got[1], want[1], "present_state")  # a copy
    assert got[0].dtype == want[0].dtype and got[0].shape == want[0].shape
    # a k-term sum of products below 4 (plus a bias below 1): k + 1 roundings of the type
    eps = float(np.finfo(dtype).eps)
    np.testing.assert_allclose(got[0].astype(np.float64), want[0].astype(np.float64), rtol=4 * eps,
                               atol=(4 * k + 2) * eps * (4 if f16 else 1))


def test_causal_conv_with_state_node_cases(best):
    assert_node_cases_pass_or_declined(best, {"CausalConvWithState"}, {}, 13, expanded=False)


def test_causal_conv_with_state_second_shape_compiles_nothing(best):
    model = _causal_conv_model(TP.FLOAT, True, True, "silu")
    rng = np.random.default_rng(4)

    def feeds(b, c, t, k):
        return {"x": rng.uniform(-2, 2, (b, c, t)).astype(np.float32), "w": rng.uniform(-1, 1, (c, 1, k)).astype(np.float32),
                "bias": rng.uniform(-1, 1, c).astype(np.float32), "past": rng.uniform(-2, 2, (b, c, k - 1)).astype(np.float32)}

    runs = [feeds(2, 4, 8, 4), feeds(3, 6, 1, 3)]  # a new batch, channel count, decode step and kernel width
    outs, compiled = runs_from_a_cold_cache(best, model, runs)
    assert_first_run_alone_compiles(compiled, "CausalConvWithState")
    ref = ReferenceEvaluator(model)
    for f, got in zip(runs, outs):
        want = ref.run(None, f)
        assert_bits(got[1], want[1], "present_state")
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- LinearAttention


def _linear_attention_model(hq, hkv, rule, past, decay, beta, scale, code=TP.FLOAT, state_code=TP.FLOAT):
    names = ["q", "k", "v", "past" if past else "", "decay" if decay else "", "beta" if beta else ""]
    while names[-1] == "":
        names.pop()
    ins = [helper.make_tensor_value_info(n, state_code if n == "past" else code, None) for n in names if n]
    attrs = {"q_num_heads": hq, "kv_num_heads": hkv}
    if rule is not None:
        attrs["update_rule"] = rule
    if scale is not None:
        attrs["scale"] = scale
    node = helper.make_node("LinearAttention", names, ["y", "state"], **attrs)
    outs = [helper.make_tensor_value_info("y", code, None),
            helper.make_tensor_value_info("state", state_code if past else code, None)]
    return make_model(node, ins, outs, opset=27)


def _linear_attention_feeds(rng, b, t, hq, hkv, dk, dv, rule, past, decay_per_dim, beta_per_head,
                            dtype=np.float32, state_dtype=np.float32):
    f = {"q": rng.uniform(-1, 1, (b, t, hq * dk)), "k": rng.uniform(-1, 1, (b, t, hkv * dk)) / np.sqrt(dk),
         "v": rng.uniform(-1, 1, (b, t, hkv * dv))}
    if past:
        f["past"] = rng.uniform(-0.5, 0.5, (b, hkv, dk, dv))
    if rule in ("gated", "gated_delta", None):
        f["decay"] = -rng.uniform(0, 0.5, (b, t, hkv * dk if decay_per_dim else hkv))
    if rule in ("delta", "gated_delta", None):
        f["beta"] = rng.uniform(0, 1, (b, t, hkv if beta_per_head else 1))
    return {k: v.astype(state_dtype if k == "past" else dtype) for k, v in f.items()}


@settings(max_examples=gpu_examples(), deadline=None)
@given(b=st.integers(1, 2), t=st.integers(1, 6), hkv=st.integers(1, 3), group=st.integers(1, 3), dk=st.integers(1, 6),
       dv=st.integers(1, 6), rule=st.sampled_from([None, "linear", "gated", "delta", "gated_delta"]), past=st.booleans(),
       decay_per_dim=st.booleans(), beta_per_head=st.booleans(), scale=st.sampled_from([None, 0.0, 0.3]),
       types=st.sampled_from([(np.float32, np.float32), (np.float16, np.float16), (np.float16, np.float32)]),
       seed=st.integers(0, 2**16))
def test_linear_attention_matches_onnx_reference(best, b, t, hkv, group, dk, dv, rule, past, decay_per_dim,
                                                 beta_per_head, scale, types, seed):
    hq = hkv * group
    rng = np.random.default_rng(seed)
    feeds = _linear_attention_feeds(rng, b, t, hq, hkv, dk, dv, rule, past, decay_per_dim, beta_per_head, *types)
    codes = [helper.np_dtype_to_tensor_dtype(np.dtype(d)) for d in types]
    model = _linear_attention_model(hq, hkv, rule, past, "decay" in feeds, "beta" in feeds, scale, *codes)
    want = ReferenceEvaluator(model).run(None, feeds)
    got = _run(best, model, feeds)
    for g, w in zip(got, want):  # float32 sums of d_k products per step, t steps deep, rounded once to the type
        assert g.dtype == w.dtype and g.shape == w.shape
        tol = 1e-5 if g.dtype == np.float32 else 2e-3
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=tol, atol=tol * (dk + t))


def test_linear_attention_node_cases(best):
    assert_node_cases_pass_or_declined(best, {"LinearAttention"}, {}, 14, expanded=False)


def test_linear_attention_second_shape_compiles_nothing(best):
    model = _linear_attention_model(4, 2, None, True, True, True, None)
    rng = np.random.default_rng(6)
    runs = [_linear_attention_feeds(rng, 2, 4, 4, 2, 8, 8, None, True, True, True),
            _linear_attention_feeds(rng, 1, 7, 4, 2, 4, 6, None, True, True, True)]  # batch, steps, head sizes
    outs, compiled = runs_from_a_cold_cache(best, model, runs)
    assert_first_run_alone_compiles(compiled, "LinearAttention")
    ref = ReferenceEvaluator(model)
    for f, got in zip(runs, outs):
        for g, w in zip(got, ref.run(None, f)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4)

"""onnxruntime's transformer contrib operators (domain ``com.microsoft``, since_version 1), as
its transformer optimizer and onnxruntime-genai's model builder write them into decoders.

Input orders and output shapes follow onnxruntime's schemas and kernels (its own shape
inference computes only with ints; here the same formulas run on symbolic dims):

================================  ==============================================================
SkipLayerNormalization            input, skip, gamma, beta?, bias?   -> output (input's type and shape),
                                  mean?, inv_std_var? (float, input's shape with the last dim 1),
                                  input_skip_bias_sum? (input's)
SkipSimplifiedLayerNormalization  input, skip, gamma, bias?          -> as SkipLayerNormalization
SimplifiedLayerNormalization      X, scale                           -> Y (scale's type, X's shape),
(ai.onnx and com.microsoft)                                             inv_std_var? (stash_type, 1 from axis on)
RotaryEmbedding                   input, position_ids, cos_cache, sin_cache -> output (input's)
MultiHeadAttention                query, key?, value?, bias?, key_padding_mask?, attention_bias?,
                                  past_key?, past_value?, past_sequence_length?, cache_indirection?
                                  -> output [batch, sequence, v_hidden], present_key/value
                                  [batch, heads, past + kv_sequence, head_size], qk?
GroupQueryAttention               query, key?, value?, past_key?, past_value?, seqlens_k,
                                  total_sequence_length, cos_cache?, sin_cache?, ...
                                  -> output [batch, sequence, heads * head_size], present_key/value
                                  [batch, kv_heads, max(past, total_sequence_length), head_size]
================================  ==============================================================

GroupQueryAttention's present length is ``max(past_sequence_length, total_sequence_length)``
(the kernel's ``present_sequence_length``), with ``total_sequence_length`` the *value* of input
6: a graph computes it from ``Shape(attention_mask)``, so it is the mask's length symbol. When
that value is not known, the present length is a fresh symbol of the node's. MatMulNBits and
DynamicQuantizeMatMul, the decoders' quantized projections, are in ``com_microsoft``.
"""

from __future__ import annotations

from onnx import TensorProto

from . import shape_math
from .. import dims
from ..context import TensorInfo
from ..registry import register
from ._wm_common import FLOAT, check_same_type, need, norm_axis, scalar, shape_text, type_text

MS = "com.microsoft"
_FLOATS = frozenset({TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.BFLOAT16})


def _opt(n, i: int) -> TensorInfo | None:
    return n.input(i) if n.has_input(i) else None


def _check_float(n, rule: str, t: int, name: str) -> None:
    if t and t not in _FLOATS:
        n.report(rule, f"{name} must be a float type", subject=f"input {name}",
                 expected="float16, float, double or bfloat16", found=type_text(t))


def _check_rank(n, rule: str, info: TensorInfo | None, name: str, ranks: tuple[int, ...]) -> int | None:
    if info is None or info.shape is None:
        return None
    if len(info.shape) not in ranks:
        n.fail(rule, f"{name} has the wrong rank", subject=f"input {name}",
               expected=" or ".join(f"rank {r}" for r in ranks), found=shape_text(info.shape))
    return len(info.shape)


def _check_vector(n, rule: str, info: TensorInfo | None, name: str, length) -> None:
    """``info`` must be 1-D of ``length`` (the normalized dim)."""
    if info is None or info.shape is None:
        return
    if len(info.shape) != 1 or (length is not None and shape_math.provably_different(info.shape[0], length)):
        n.report(rule, f"{name} must be 1-D with the input's last dim", subject=f"input {name}",
                 expected=f"[{dims.to_text(length) if length is not None else '?'}]", found=shape_text(info.shape))


def _check_int(n, rule: str, info: TensorInfo | None, name: str, allowed: tuple[int, ...]) -> None:
    if info is not None and info.elem_type and info.elem_type not in allowed:
        n.report(rule, f"{name} has the wrong element type", subject=f"input {name}",
                 expected=" or ".join(type_text(t) for t in allowed), found=type_text(info.elem_type))


# ---------------------------------------------------------------- normalizations
def _skip_norm(n, rule: str, optional: tuple[tuple[int, str], ...]) -> None:
    x, skip, gamma = need(n, rule, "input", "skip", "gamma")
    extra = [(_opt(n, i), name) for i, name in optional]
    t = check_same_type(n, rule, [x, skip, gamma, *(e for e, _ in extra)],
                        ["input", "skip", "gamma", *(name for _, name in extra)])
    _check_float(n, rule, t, "input")
    rank = _check_rank(n, rule, x, "input", (2, 3))
    last = x.shape[-1] if rank else None
    if skip.shape is not None and x.shape is not None:
        # onnxruntime takes skip of input's shape, or of its last two dims ([1,] seq, hidden)
        tail = x.shape[-len(skip.shape):] if 0 < len(skip.shape) <= len(x.shape) else None
        if tail is None or any(shape_math.provably_different(a, b) for a, b in zip(skip.shape[-2:], tail[-2:])) \
                or (len(skip.shape) == 3 and rank == 3 and not (skip.shape[0] in (1, x.shape[0]))):
            n.report(rule, "skip must have input's shape or its last two dims", subject="input skip",
                     expected=shape_text(x.shape), found=shape_text(skip.shape))
    _check_vector(n, rule, gamma, "gamma", last)
    for info, name in extra:
        _check_vector(n, rule, info, name, last)
    n.set_output(0, TensorInfo(t, x.shape))
    stat = None if x.shape is None else (*x.shape[:-1], 1)
    for i in (1, 2):
        if n.output_name(i):
            n.set_output(i, TensorInfo(FLOAT, stat))
    if n.output_name(3):
        n.set_output(3, TensorInfo(t, x.shape))


@register("SkipLayerNormalization", 1, domain=MS)
def skip_layer_normalization(ctx, n) -> None:
    _skip_norm(n, "SkipLayerNormalization", ((3, "beta"), (4, "bias")))


@register("SkipSimplifiedLayerNormalization", 1, domain=MS)
def skip_simplified_layer_normalization(ctx, n) -> None:
    _skip_norm(n, "SkipSimplifiedLayerNormalization", ((3, "bias"),))


def simplified_layer_normalization(ctx, n) -> None:
    rule = "SimplifiedLayerNormalization"
    x, scale = need(n, rule, "X", "scale")
    _check_float(n, rule, x.elem_type, "X")
    _check_float(n, rule, scale.elem_type, "scale")
    stat = None
    if x.shape is not None:
        r = len(x.shape)
        axis = norm_axis(n, rule, int(n.attr("axis", -1)), r)
        stat = (*x.shape[:axis], *(1,) * (r - axis))
    n.set_output(0, TensorInfo(scale.elem_type or x.elem_type, x.shape))
    if n.output_name(1):
        n.set_output(1, TensorInfo(int(n.attr("stash_type", FLOAT)), stat))


# onnxruntime registers it in the ONNX domain (the genai builder's final norm) and in com.microsoft
register("SimplifiedLayerNormalization", 1)(simplified_layer_normalization)
register("SimplifiedLayerNormalization", 1, domain=MS)(simplified_layer_normalization)


# ---------------------------------------------------------------- rotary embedding
@register("RotaryEmbedding", 1, domain=MS)
def rotary_embedding(ctx, n) -> None:
    rule = "RotaryEmbedding"
    x, pos, cos, sin = need(n, rule, "input", "position_ids", "cos_cache", "sin_cache")
    t = check_same_type(n, rule, [x, cos, sin], ["input", "cos_cache", "sin_cache"])
    _check_float(n, rule, t, "input")
    _check_rank(n, rule, x, "input", (3, 4))
    _check_int(n, rule, pos, "position_ids", (TensorProto.INT64,))
    for info, name in ((cos, "cos_cache"), (sin, "sin_cache")):
        _check_rank(n, rule, info, name, (2, 3))
    if cos.shape is not None and sin.shape is not None and len(cos.shape) == len(sin.shape) and any(
            shape_math.provably_different(a, b) for a, b in zip(cos.shape, sin.shape)):
        n.report(rule, "cos_cache and sin_cache must have one shape", subject="input sin_cache",
                 expected=shape_text(cos.shape), found=shape_text(sin.shape))
    n.set_output(0, TensorInfo(t, x.shape))


# ---------------------------------------------------------------- attention
def _heads_attr(n, rule: str, name: str) -> int:
    v = n.attr(name)
    if v is None or int(v) <= 0:
        n.fail(rule, f"attribute {name} must be a positive int", subject=f"attribute {name}",
               expected="an int > 0", found="none" if v is None else v)
    return int(v)


def _head_size(n, rule: str, hidden, heads: int, what: str):
    """``hidden / heads``, which must divide exactly."""
    if isinstance(hidden, int):
        if hidden % heads:
            n.fail(rule, f"{what}'s hidden size must be a multiple of the head count", subject=f"input {what}",
                   expected=f"a multiple of {heads}", found=hidden)
        return hidden // heads
    return None if hidden is None else dims.floordiv(hidden, heads)


def _set_present(n, t: int, shape) -> None:
    for i in (1, 2):
        if n.output_name(i):
            n.set_output(i, TensorInfo(t, shape))


@register("MultiHeadAttention", 1, domain=MS)
def multi_head_attention(ctx, n) -> None:
    rule = "MultiHeadAttention"
    q, = need(n, rule, "query")
    heads = _heads_attr(n, rule, "num_heads")
    key, value, past_k, past_v = _opt(n, 1), _opt(n, 2), _opt(n, 6), _opt(n, 7)
    t = check_same_type(n, rule, [q, key, value, _opt(n, 3), _opt(n, 5), past_k, past_v],
                        ["query", "key", "value", "bias", "attention_bias", "past_key", "past_value"])
    _check_float(n, rule, t, "query")
    q_rank = _check_rank(n, rule, q, "query", (3, 5))
    k_rank = _check_rank(n, rule, key, "key", (3, 4, 5))
    v_rank = _check_rank(n, rule, value, "value", (3, 4))
    for info, name in ((past_k, "past_key"), (past_v, "past_value")):
        _check_rank(n, rule, info, name, (4,))
    out = None
    if q_rank == 5:  # packed QKV: [batch, sequence, heads, 3, head_size]
        out = (q.shape[0], q.shape[1], dims.mul(q.shape[2], q.shape[4]))
    elif q_rank == 3 and v_rank == 3:
        out = (q.shape[0], q.shape[1], value.shape[2])
    elif q_rank == 3 and v_rank == 4:
        out = (q.shape[0], q.shape[1], dims.mul(value.shape[1], value.shape[3]))
    elif q_rank == 3 and k_rank == 5:  # packed KV
        out = q.shape
    n.set_output(0, TensorInfo(t, out))
    present = None
    if past_k is not None and past_k.shape is not None and n.has_input(8):
        present = past_k.shape  # past and present share one buffer
    elif k_rank == 4:  # keys already split into heads, no past: what is given is the cache
        present = key.shape
    elif k_rank == 3:
        kv_seq = key.shape[1]
        head_size = _head_size(n, rule, key.shape[2], heads, "key")
        if past_k is not None and past_k.shape is not None:
            present = (past_k.shape[0], past_k.shape[1], dims.add(past_k.shape[2], kv_seq), past_k.shape[3])
        elif past_k is None:
            present = (key.shape[0], heads, kv_seq, head_size)
    _set_present(n, t, present)
    if n.output_name(3):
        total = None if present is None else present[2]
        qk = None if q.shape is None or q_rank != 3 else (q.shape[0], heads, q.shape[1], total)
        n.set_output(3, TensorInfo(t, qk))


@register("GroupQueryAttention", 1, domain=MS)
def group_query_attention(ctx, n) -> None:
    rule = "GroupQueryAttention"
    q, seqlens_k, total = need(n, rule, "query", "seqlens_k", "total_sequence_length", at=(0, 5, 6))
    heads, kv_heads = _heads_attr(n, rule, "num_heads"), _heads_attr(n, rule, "kv_num_heads")
    if heads % kv_heads:
        n.fail(rule, "num_heads must be a multiple of kv_num_heads", subject="attribute num_heads",
               expected=f"a multiple of {kv_heads}", found=heads)
    key, value, past_k, past_v = _opt(n, 1), _opt(n, 2), _opt(n, 3), _opt(n, 4)
    t = check_same_type(n, rule, [q, key, value, _opt(n, 7), _opt(n, 8)],
                        ["query", "key", "value", "cos_cache", "sin_cache"])
    _check_float(n, rule, t, "query")
    _check_int(n, rule, seqlens_k, "seqlens_k", (TensorProto.INT32,))
    _check_int(n, rule, total, "total_sequence_length", (TensorProto.INT32,))
    if total.shape is not None and not (len(total.shape) == 0 or total.shape == (1,)):
        n.report(rule, "total_sequence_length must be a scalar", subject="input total_sequence_length",
                 expected="a scalar", found=shape_text(total.shape))
    q_rank = _check_rank(n, rule, q, "query", (3,))
    for info, name in ((past_k, "past_key"), (past_v, "past_value")):
        _check_rank(n, rule, info, name, (4,))
    if (key is None) != (value is None):
        n.fail(rule, "key and value are given together or not at all (packed QKV)", subject="input value",
               expected="both or neither", found="only one")
    out = head_size = None
    if q_rank == 3:
        if key is None:  # packed QKV: [batch, sequence, (heads + 2 * kv_heads) * head_size]
            head_size = _head_size(n, rule, q.shape[2], heads + 2 * kv_heads, "query")
            out = (q.shape[0], q.shape[1], None if head_size is None else dims.mul(head_size, heads))
        else:
            head_size = _head_size(n, rule, q.shape[2], heads, "query")
            out = q.shape
    n.set_output(0, TensorInfo(t, out))
    total_len = scalar(total) if total.value is not None else None
    if isinstance(total_len, float):
        total_len = None
    cache_t = past_k.elem_type if past_k is not None and past_k.elem_type else t
    if past_k is not None:
        if past_k.shape is None:
            _set_present(n, cache_t, None)
            return
        length = dims.maximum(past_k.shape[2], total_len) if total_len is not None else n.fresh_dim(1, 2)
        _set_present(n, cache_t, (past_k.shape[0], past_k.shape[1], length, past_k.shape[3]))
        return
    if q_rank != 3:
        _set_present(n, cache_t, None)
        return
    length = total_len if total_len is not None else (key.shape[1] if key is not None and key.shape else q.shape[1])
    _set_present(n, cache_t, (q.shape[0], kv_heads, length, head_size))

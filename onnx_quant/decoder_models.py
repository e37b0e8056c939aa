"""Decoder-only transformer graphs (Llama-style) with a KV cache, as the exporters and
onnxruntime's tools write them: the test and benchmark stand-ins for exported LLMs.

Three graph styles:

- ``exporter``: what torch.onnx (opset 17) writes for a Hugging Face decoder through Optimum:
  RMS norm decomposed (Pow, ReduceMean, Add, Sqrt, Div, Mul), heads split and merged with
  shapes ``Concat``-ed from ``Shape -> Gather -> Unsqueeze``, rotary embeddings as
  ``Gather(cos_cached, position_ids)`` with rotate-half (``Slice``, ``Neg``, ``Concat``), the KV
  cache as ``Concat(past, new, axis=2)``, grouped-query heads repeated with
  ``Unsqueeze -> Expand -> Reshape``, the causal mask built once from ``Shape``, ``Range``,
  ``Greater``, ``Equal``, ``Or``, ``Expand`` and ``Where``;
- ``gqa``: what onnxruntime-genai's model builder and the transformer optimizer write:
  ``SimplifiedLayerNormalization`` / ``com.microsoft.SkipSimplifiedLayerNormalization``, and
  ``com.microsoft.GroupQueryAttention`` (rotary inside, ``seqlens_k`` from ``ReduceSum`` of the
  mask, ``total_sequence_length`` from its ``Shape``);
- ``mha``: the transformer optimizer's form for a model without grouped heads:
  ``com.microsoft.RotaryEmbedding`` on Q and K, ``com.microsoft.MultiHeadAttention`` with
  ``past_key`` / ``past_value`` and the exporter's additive mask as ``attention_bias``,
  ``SkipLayerNormalization``-family norms (needs ``kv_heads == heads``).

Four weight forms for every projection (q, k, v, o, gate, up, down, lm_head): ``float``
(``MatMul``), ``qdq`` (uint8 activations and per-channel int8 weights through
``QuantizeLinear`` / ``DequantizeLinear``, as ``quantize_static`` writes them), ``nbits``
(``com.microsoft.MatMulNBits``, 4 bits, blocks of 32) and ``dynamic``
(``com.microsoft.DynamicQuantizeMatMul``, int8 weights).

Inputs: ``input_ids`` and ``position_ids`` ``[batch_size, sequence_length]``,
``attention_mask`` ``[batch_size, <mask_dim>]`` (Optimum's name,
``past_sequence_length + sequence_length``, by default; onnxruntime-genai's
``total_sequence_length`` with ``mask_dim=TOTAL``), ``past_key_values.N.key`` / ``.value``
``[batch_size, kv_heads, past_sequence_length, head_dim]``; outputs ``logits``
``[batch_size, sequence_length, vocab]`` and ``present.N.key`` / ``.value``
``[batch_size, kv_heads, past_sequence_length + sequence_length, head_dim]``.

Weights are random (fixed seed) and inline, or, with ``external_data=LOCATION``, references
into a file of that name beside the model that is never written: no weight is made at all, so
a graph of any width costs only its nodes (what the pass must handle without reading weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
MS = "com.microsoft"
F, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32

BATCH, SEQ, PAST, TOTAL = "batch_size", "sequence_length", "past_sequence_length", "total_sequence_length"
#: Optimum's name for the attention mask's and the present cache's length
PAST_PLUS_SEQ = f"{PAST} + {SEQ}"

STYLES = ("exporter", "gqa", "mha")
FORMS = ("float", "qdq", "nbits", "dynamic")
NBITS_BLOCK = 32
#: bytes from which a tensor goes to the external file (onnx.save's default size_threshold)
EXTERNAL_THRESHOLD = 1024
#: float32's lowest, what torch writes for a masked position
MASK_MIN = float(np.finfo(np.float32).min)


@dataclass(frozen=True)
class DecoderConfig:
    """Sizes of the decoder; ``head_dim = hidden // heads``."""

    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    vocab: int = 96
    max_positions: int = 128

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def check(self, style: str) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads or self.head_dim % 2:
            raise ValueError(f"heads ({self.heads}) must divide hidden ({self.hidden}) into an even head_dim, and "
                             f"kv_heads ({self.kv_heads}) must divide heads")
        if style == "mha" and self.kv_heads != self.heads:
            raise ValueError(f"the mha style has no grouped heads: kv_heads ({self.kv_heads}) must equal heads "
                             f"({self.heads})")
        if self.layers < 1:
            raise ValueError(f"layers must be >= 1, found {self.layers}")


class _Graph:
    """Nodes and initializers with torch-like scoped names (``/model/layers.3/attn/MatMul_2``)."""

    def __init__(self, form: str, seed: int, external_data: str | None) -> None:
        self.form = form
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.scope = "/model"
        self.counts: dict[str, int] = {}
        self.external = external_data
        self.offset = 0

    def name(self, base: str) -> str:
        key = f"{self.scope}/{base}"
        k = self.counts[key] = self.counts.get(key, 0) + 1
        return key if k == 1 else f"{key}_{k - 1}"

    def node(self, op: str, inputs, outputs: int | list = 1, domain: str = "", **attrs):
        name = self.name(op)
        outs = outputs if isinstance(outputs, list) else [f"{name}_output_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=name, domain=domain, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def constant(self, array) -> str:
        """A ``Constant`` node (torch writes every shape constant as one)."""
        name = self.name("Constant")
        array = np.asarray(array)
        self.nodes.append(helper.make_node("Constant", [], [f"{name}_output_0"], name=name,
                                           value=numpy_helper.from_array(array)))
        return f"{name}_output_0"

    def ints(self, *values: int) -> str:
        return self.constant(np.array(values, np.int64))

    def init(self, base: str, array) -> str:
        """A small tensor (scales, zero points, caches): inline, or external from 1 KiB on as
        ``onnx.save`` puts it with its default threshold."""
        array = np.ascontiguousarray(array)
        if self.external is not None and array.nbytes >= EXTERNAL_THRESHOLD:
            return self.reference(self.name(base), array.shape, array.dtype)
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def weight(self, base: str, shape, dtype=np.float32, low: float = -0.1, high: float = 0.1) -> str:
        """A weight: random data, or a reference into the external file (no data made)."""
        name = self.name(base)
        np_dtype = np.dtype(dtype)
        if self.external is not None:
            return self.reference(name, shape, np_dtype)
        if np_dtype.kind == "f":
            data = self.rng.uniform(low, high, shape).astype(np_dtype)
        else:
            info = np.iinfo(np_dtype)
            data = self.rng.integers(max(info.min, -64), min(info.max, 64) + 1, shape, dtype=np_dtype)
        self.inits.append(numpy_helper.from_array(data, name))
        return name

    def reference(self, name: str, shape, np_dtype) -> str:
        """An initializer whose data is at the next offset of the external file, never written."""
        np_dtype = np.dtype(np_dtype)
        t = onnx.TensorProto(name=name, dims=list(shape), data_type=helper.np_dtype_to_tensor_dtype(np_dtype))
        length = int(np.prod(shape)) * np_dtype.itemsize
        t.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.external), ("offset", str(self.offset)), ("length", str(length))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        self.offset += length
        self.inits.append(t)
        return name

    def act(self, x: str) -> str:
        """An activation as the QDQ form feeds it to an op: ``quantize_static`` puts a
        QuantizeLinear / DequantizeLinear pair (uint8) on every float input of the ops it
        quantizes (Add, Mul, Softmax, MatMul ...); the other forms leave it as it is."""
        if self.form != "qdq":
            return x
        s, z = self.init("act_scale", np.float32(0.05)), self.init("act_zero_point", np.uint8(128))
        return self.node("DequantizeLinear", [self.node("QuantizeLinear", [x, s, z]), s, z])

    # ---------------------------------------------------------------- projections
    def linear(self, x: str, k: int, n: int, what: str) -> str:
        """``x @ W`` (``W`` ``[k, n]``) in the graph's weight form."""
        outer, self.scope = self.scope, f"{self.scope}/{what}"
        try:
            if self.form == "float":
                return self.node("MatMul", [x, self.weight("weight", (k, n))])
            if self.form == "qdq":
                xd = self.act(x)
                w = self.weight("weight_quantized", (k, n), np.int8)
                ws = self.init("weight_scale", self.rng.uniform(0.001, 0.003, n).astype(np.float32))
                wz = self.init("weight_zero_point", np.zeros(n, np.int8))
                wd = self.node("DequantizeLinear", [w, ws, wz], axis=1)
                return self.node("MatMul", [xd, wd])
            if self.form == "dynamic":
                w = self.weight("weight_quantized", (k, n), np.int8)
                ws = self.init("weight_scale", self.rng.uniform(0.001, 0.003, n).astype(np.float32))
                wz = self.init("weight_zero_point", np.zeros(n, np.int8))
                return self.node("DynamicQuantizeMatMul", [x, w, ws, wz], domain=MS)
            if self.form == "nbits":
                blocks = -(-k // NBITS_BLOCK)
                w = self.weight("weight_Q4", (n, blocks, NBITS_BLOCK // 2), np.uint8)
                s = self.init("weight_scales", self.rng.uniform(0.001, 0.003, n * blocks).astype(np.float32))
                return self.node("MatMulNBits", [x, w, s], domain=MS, K=k, N=n, bits=4, block_size=NBITS_BLOCK,
                                 accuracy_level=4)
            raise ValueError(f"unknown weight form {self.form!r}: expected one of {', '.join(FORMS)}")
        finally:
            self.scope = outer

    # ---------------------------------------------------------------- exporter idioms
    def size(self, x: str, axis: int) -> str:
        """``x.size(axis)``: ``Gather(Shape(x), axis)``, a 0-d int64."""
        return self.node("Gather", [self.node("Shape", [x]), self.constant(np.array(axis, np.int64))], axis=0)

    def unsqueeze(self, x: str, *axes: int) -> str:
        return self.node("Unsqueeze", [x, self.ints(*axes)])

    def shape_of(self, *parts) -> str:
        """``Concat`` of 0-d sizes (unsqueezed) and ints: a shape computed as torch writes it."""
        items = [self.ints(p) if isinstance(p, int) else self.unsqueeze(p, 0) for p in parts]
        return self.node("Concat", items, axis=0)

    def rms_norm(self, x: str, hidden: int) -> str:
        p = self.node("Pow", [x, self.constant(np.float32(2.0))])
        m = self.node("ReduceMean", [p], axes=[-1], keepdims=1)
        r = self.node("Sqrt", [self.node("Add", [m, self.constant(np.float32(1e-6))])])
        y = self.node("Mul", [x, self.node("Div", [self.constant(np.float32(1.0)), r])])
        return self.node("Mul", [self.weight("weight", (hidden,), low=0.9, high=1.1), y])


def _io(name: str, elem: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _rotary_caches(g: _Graph, cfg: DecoderConfig, full: bool) -> tuple[str, str]:
    """cos / sin caches ``[max_positions, head_dim]`` (``full``: torch's cat(freqs, freqs)) or
    ``[max_positions, head_dim / 2]`` (onnxruntime's ops)."""
    half = cfg.head_dim // 2
    inv = 1.0 / (10000.0 ** (np.arange(half, dtype=np.float64) / half))
    freqs = np.outer(np.arange(cfg.max_positions, dtype=np.float64), inv)
    if full:
        freqs = np.concatenate([freqs, freqs], axis=-1)
    return g.init("cos_cached", np.cos(freqs).astype(np.float32)), g.init("sin_cached", np.sin(freqs).astype(np.float32))


def _attention_bias(g: _Graph, ids: str, mask: str, past0: str) -> str:
    """The additive causal mask ``[batch_size, 1, sequence_length, <mask length>]`` as torch
    exports it: ``Range`` over the cache positions, ``Greater``, the padding ``Equal(mask, 0)``,
    ``Or``, ``Expand`` to the batch, ``Where``."""
    g.scope = "/model/mask"
    batch, seq, past = g.size(ids, 0), g.size(ids, 1), g.size(past0, 2)
    total = g.size(mask, 1)
    one = g.constant(np.array(1, np.int64))
    cache_position = g.node("Range", [past, g.node("Add", [past, seq]), one])
    columns = g.node("Range", [g.constant(np.array(0, np.int64)), total, one])
    causal = g.node("Greater", [g.unsqueeze(columns, 0), g.unsqueeze(cache_position, 1)])
    padding = g.unsqueeze(g.node("Equal", [mask, g.constant(np.array(0, np.int64))]), 1, 2)
    masked = g.node("Or", [g.unsqueeze(causal, 0, 1), padding])
    masked = g.node("Expand", [masked, g.shape_of(batch, 1, seq, total)])
    return g.node("Where", [masked, g.constant(np.float32(MASK_MIN)), g.constant(np.float32(0.0))])


def _exporter_attention(g: _Graph, cfg: DecoderConfig, h: str, i: int, cos: str, sin: str, bias: str,
                        past_k: str, past_v: str) -> tuple[str, str, str]:
    hd, heads, kv = cfg.head_dim, cfg.heads, cfg.kv_heads
    batch, seq = g.size(h, 0), g.size(h, 1)

    def heads_first(x: str, count: int) -> str:
        return g.node("Transpose", [g.node("Reshape", [x, g.shape_of(batch, seq, count, hd)])], perm=[0, 2, 1, 3])

    def rotate(x: str) -> str:
        x1 = g.node("Slice", [x, g.ints(0), g.ints(hd // 2), g.ints(-1), g.ints(1)])
        x2 = g.node("Slice", [x, g.ints(hd // 2), g.ints(2**63 - 1), g.ints(-1), g.ints(1)])
        turned = g.node("Concat", [g.node("Neg", [x2]), x1], axis=-1)
        return g.node("Add", [g.act(g.node("Mul", [g.act(x), cos])), g.act(g.node("Mul", [g.act(turned), sin]))])

    q = rotate(heads_first(g.linear(h, cfg.hidden, heads * hd, "q_proj"), heads))
    k = rotate(heads_first(g.linear(h, cfg.hidden, kv * hd, "k_proj"), kv))
    v = heads_first(g.linear(h, cfg.hidden, kv * hd, "v_proj"), kv)
    present_k = g.node("Concat", [past_k, k], [f"present.{i}.key"], axis=2)
    present_v = g.node("Concat", [past_v, v], [f"present.{i}.value"], axis=2)
    keys, values = present_k, present_v
    if heads != kv:  # repeat_kv: [b, kv, t, hd] -> [b, kv, n_rep, t, hd] -> [b, heads, t, hd]
        b, t = g.size(present_k, 0), g.size(present_k, 2)
        grown, merged = g.shape_of(b, kv, heads // kv, t, hd), g.shape_of(b, heads, t, hd)
        keys = g.node("Reshape", [g.node("Expand", [g.unsqueeze(present_k, 2), grown]), merged])
        values = g.node("Reshape", [g.node("Expand", [g.unsqueeze(present_v, 2), grown]), merged])
    scores = g.node("MatMul", [g.act(q), g.act(g.node("Transpose", [keys], perm=[0, 1, 3, 2]))])
    scores = g.node("Add", [g.act(g.node("Mul", [g.act(scores), g.constant(np.float32(hd ** -0.5))])), bias])
    context = g.node("MatMul", [g.act(g.node("Softmax", [g.act(scores)], axis=-1)), g.act(values)])
    context = g.node("Reshape", [g.node("Transpose", [context], perm=[0, 2, 1, 3]),
                                 g.shape_of(batch, seq, cfg.hidden)])
    return g.linear(context, heads * hd, cfg.hidden, "o_proj"), present_k, present_v


def _mlp(g: _Graph, cfg: DecoderConfig, h: str) -> str:
    gate = g.linear(h, cfg.hidden, cfg.intermediate, "gate_proj")
    up = g.linear(h, cfg.hidden, cfg.intermediate, "up_proj")
    act = g.node("Mul", [g.act(gate), g.act(g.node("Sigmoid", [g.act(gate)]))])
    return g.linear(g.node("Mul", [g.act(act), g.act(up)]), cfg.intermediate, cfg.hidden, "down_proj")


def _exporter_layers(g: _Graph, cfg: DecoderConfig, ids: str, pos: str, mask: str, pasts) -> tuple[str, list]:
    bias = _attention_bias(g, ids, mask, pasts[0][0])
    g.scope = "/model/rotary_emb"
    cos_cached, sin_cached = _rotary_caches(g, cfg, full=True)
    cos = g.unsqueeze(g.node("Gather", [cos_cached, pos], axis=0), 1)
    sin = g.unsqueeze(g.node("Gather", [sin_cached, pos], axis=0), 1)
    g.scope = "/model/embed_tokens"
    x = g.node("Gather", [g.weight("weight", (cfg.vocab, cfg.hidden)), ids], axis=0)
    presents = []
    for i in range(cfg.layers):
        g.scope = f"/model/layers.{i}/input_layernorm"
        h = g.rms_norm(x, cfg.hidden)
        g.scope = f"/model/layers.{i}/self_attn"
        attn, pk, pv = _exporter_attention(g, cfg, h, i, cos, sin, bias, *pasts[i])
        presents += [pk, pv]
        g.scope = f"/model/layers.{i}"
        x = g.node("Add", [g.act(x), g.act(attn)])
        g.scope = f"/model/layers.{i}/post_attention_layernorm"
        h = g.rms_norm(x, cfg.hidden)
        g.scope = f"/model/layers.{i}/mlp"
        m = _mlp(g, cfg, h)
        g.scope = f"/model/layers.{i}"
        x = g.node("Add", [g.act(x), g.act(m)])
    g.scope = "/model/norm"
    return g.rms_norm(x, cfg.hidden), presents


def _fused_layers(g: _Graph, cfg: DecoderConfig, style: str, ids: str, pos: str, mask: str,
                  pasts) -> tuple[str, list]:
    hd, heads, kv = cfg.head_dim, cfg.heads, cfg.kv_heads
    simplified = style == "gqa"
    skip_norm = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
    if simplified:  # onnxruntime-genai: the mask's row sums and its length, as int32
        g.scope = "/model/attn_mask_reformat"
        sums = g.node("ReduceSum", [mask, g.ints(1)], keepdims=0)
        seqlens_k = g.node("Cast", [g.node("Sub", [sums, g.constant(np.array(1, np.int64))])], to=I32)
        total = g.node("Cast", [g.size(mask, 1)], to=I32)
    else:
        bias = _attention_bias(g, ids, mask, pasts[0][0])
    g.scope = "/model/rotary_emb"
    cos_cache, sin_cache = _rotary_caches(g, cfg, full=False)
    g.scope = "/model/embed_tokens"
    x = g.node("Gather", [g.weight("weight", (cfg.vocab, cfg.hidden)), ids], axis=0)

    def norm(x_in: str, residual: str | None) -> tuple[str, str]:
        gamma = g.weight("weight", (cfg.hidden,), low=0.9, high=1.1)
        if residual is None:
            if simplified:
                return g.node("SimplifiedLayerNormalization", [x_in, gamma], axis=-1, epsilon=1e-6, stash_type=1), x_in
            beta = g.weight("bias", (cfg.hidden,))
            return g.node("LayerNormalization", [x_in, gamma, beta], axis=-1, epsilon=1e-6), x_in
        extra = [] if simplified else [g.weight("bias", (cfg.hidden,))]
        name = g.name(skip_norm)
        outs = [f"{name}_output_0", "", "", f"{name}_output_3"]
        g.nodes.append(helper.make_node(skip_norm, [x_in, residual, gamma, *extra], outs, name=name, domain=MS,
                                        epsilon=1e-6))
        return outs[0], outs[3]

    presents, residual = [], None
    for i in range(cfg.layers):
        g.scope = f"/model/layers.{i}/input_layernorm"
        h, residual = norm(x, residual)
        g.scope = f"/model/layers.{i}/attn"
        q = g.linear(h, cfg.hidden, heads * hd, "q_proj")
        k = g.linear(h, cfg.hidden, kv * hd, "k_proj")
        v = g.linear(h, cfg.hidden, kv * hd, "v_proj")
        outs = [g.name("output"), f"present.{i}.key", f"present.{i}.value"]
        if simplified:
            g.node("GroupQueryAttention", [q, k, v, *pasts[i], seqlens_k, total, cos_cache, sin_cache], outs,
                   domain=MS, num_heads=heads, kv_num_heads=kv, do_rotary=1, scale=hd ** -0.5)
        else:
            q = g.node("RotaryEmbedding", [q, pos, cos_cache, sin_cache], domain=MS, num_heads=heads)
            k = g.node("RotaryEmbedding", [k, pos, cos_cache, sin_cache], domain=MS, num_heads=kv)
            g.node("MultiHeadAttention", [q, k, v, "", "", bias, *pasts[i]], outs, domain=MS, num_heads=heads,
                   scale=hd ** -0.5)
        presents += outs[1:]
        attn = g.linear(outs[0], heads * hd, cfg.hidden, "o_proj")
        g.scope = f"/model/layers.{i}/post_attention_layernorm"
        h, residual = norm(attn, residual)
        g.scope = f"/model/layers.{i}/mlp"
        x = _mlp(g, cfg, h)
    g.scope = "/model/norm"
    return norm(x, residual)[0], presents


def build(style: str = "exporter", form: str = "float", config: DecoderConfig | None = None, *,
          mask_dim: str = PAST_PLUS_SEQ, external_data: str | None = None, seed: int = 0) -> onnx.ModelProto:
    """A decoder of ``config.layers`` layers in ``style`` (:data:`STYLES`) and weight ``form``
    (:data:`FORMS`), outputs declared as the exporters declare them."""
    cfg = config or DecoderConfig()
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}: expected one of {', '.join(STYLES)}")
    if form not in FORMS:
        raise ValueError(f"unknown weight form {form!r}: expected one of {', '.join(FORMS)}")
    cfg.check(style)
    g = _Graph(form, seed, external_data)
    kv_shape = [BATCH, cfg.kv_heads, PAST, cfg.head_dim]
    inputs = [_io("input_ids", I64, [BATCH, SEQ]), _io("attention_mask", I64, [BATCH, mask_dim]),
              _io("position_ids", I64, [BATCH, SEQ])]
    pasts = []
    for i in range(cfg.layers):
        pasts.append((f"past_key_values.{i}.key", f"past_key_values.{i}.value"))
        inputs += [_io(name, F, kv_shape) for name in pasts[-1]]
    if style == "exporter":
        h, presents = _exporter_layers(g, cfg, "input_ids", "position_ids", "attention_mask", pasts)
    else:
        h, presents = _fused_layers(g, cfg, style, "input_ids", "position_ids", "attention_mask", pasts)
    g.scope = "/lm_head"
    g.linear(h, cfg.hidden, cfg.vocab, "lm_head")
    g.nodes[-1].output[0] = logits = "logits"
    present_shape = [BATCH, cfg.kv_heads, PAST_PLUS_SEQ, cfg.head_dim]
    outputs = [_io(logits, F, [BATCH, SEQ, cfg.vocab])] + [_io(p, F, present_shape) for p in presents]
    graph = helper.make_graph(g.nodes, f"decoder_{style}_{form}", inputs, outputs, g.inits)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION, producer_name="onnx-quant",
                             producer_version="decoder_models")


#: Llama-3-8B's widths (32 layers of these make the 8B model)
LLAMA_8B = DecoderConfig(layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=128256,
                         max_positions=8192)


def layers_for(style: str, form: str, nodes: int) -> int:
    """The layer count whose decoder has about ``nodes`` nodes (every layer adds the same)."""
    one, two = (len(build(style, form, DecoderConfig(layers=k, kv_heads=4 if style == "mha" else 2),
                          external_data="weights.bin").graph.node) for k in (1, 2))
    return max(1, round((nodes - one) / (two - one)) + 1)


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the model's initializers stored outside it (what a pass must not read)."""
    return sum(int(e.value) for t in model.graph.initializer for e in t.external_data if e.key == "length")


def strip_types(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with the graph outputs' shapes removed (element types kept) and no value_info:
    what inference must find on its own."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.value_info[:]
    for o in out.graph.output:
        o.type.tensor_type.ClearField("shape")
    return out


def bindings(batch: int, past: int, seq: int) -> dict[str, int]:
    """The symbols' values for one call: ``total_sequence_length = past + seq``."""
    return {BATCH: batch, SEQ: seq, PAST: past, TOTAL: past + seq}


def feeds(model: onnx.ModelProto, batch: int, past: int, seq: int, seed: int = 0) -> Mapping[str, np.ndarray]:
    """Inputs for one decoding call: random token ids, positions ``past .. past + seq - 1``, a
    mask of ones (no padding: GroupQueryAttention reads lengths from it), random past keys and values."""
    rng = np.random.default_rng(seed)
    vocab = next(t for t in model.graph.initializer if t.name.startswith("/model/embed_tokens/")).dims[0]
    out: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        name = vi.name
        if name == "input_ids":
            out[name] = rng.integers(0, vocab, (batch, seq), dtype=np.int64)
        elif name == "position_ids":
            out[name] = np.broadcast_to(np.arange(past, past + seq, dtype=np.int64), (batch, seq)).copy()
        elif name == "attention_mask":
            out[name] = np.ones((batch, past + seq), np.int64)
        else:
            d = vi.type.tensor_type.shape.dim
            out[name] = rng.uniform(-1, 1, (batch, d[1].dim_value, past, d[3].dim_value)).astype(np.float32)
    return out

"""Decoder graphs of onnx_quant.decoder_models: every value typed with expressions in the
decoder's symbols (1, 8 and 32 layers, every style and weight form), the shapes equal to an
onnxruntime run at two (past, sequence) pairs, and weights stored outside the model never read."""

from __future__ import annotations

import tracemalloc

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from onnx_quant import decoder_models as dm
from onnx_quant import inference
from onnx_quant.inference import dims
from onnx_quant.oracles import not_an_oracle

SYMBOLS = {dm.BATCH, dm.SEQ, dm.PAST, dm.TOTAL}
CASES = [(style, form) for style in dm.STYLES for form in dm.FORMS]
#: (past, sequence) pairs: a prefill and a decoding step (GroupQueryAttention on CPU takes a batch
#: of more than one only one token at a time once there is a past)
PAIRS = ((0, 3), (5, 1))


def config(style: str, layers: int) -> dm.DecoderConfig:
    return dm.DecoderConfig(layers=layers, kv_heads=4 if style == "mha" else 2)


def node_outputs(model: onnx.ModelProto) -> list[str]:
    return [o for n in model.graph.node for o in n.output if o]


def assert_typed_fully(result, model: onnx.ModelProto) -> None:
    """Every node output: an element type and every dim an int or an expression in SYMBOLS."""
    untyped = []
    for name in node_outputs(model):
        info = result.ctx[name]
        if not info.elem_type or info.shape is None or any(
                d is None or (not isinstance(d, int) and not d.symbols <= SYMBOLS) for d in info.shape):
            untyped.append(f"{name}: {info.shape_text()}")
    assert not untyped, f"{len(untyped)} values not typed fully, e.g. {untyped[:3]}"


@pytest.mark.parametrize("layers", (1, 8, 32))
@pytest.mark.parametrize("style, form", CASES)
def test_typed_fully_with_decoder_expressions(style, form, layers):
    cfg = config(style, layers)
    model = dm.strip_types(dm.build(style, form, cfg))
    result = inference.infer(model)
    assert not result.diagnostics, [str(d) for d in result.diagnostics[:3]]
    assert_typed_fully(result, model)
    batch, seq = dims.Dim.symbol(dm.BATCH), dims.Dim.symbol(dm.SEQ)
    assert result.ctx["logits"].shape == (batch, seq, cfg.vocab)
    present = (batch, cfg.kv_heads, dims.parse(dm.PAST_PLUS_SEQ), cfg.head_dim)
    names = [o.name for o in model.graph.output if o.name.startswith("present.")]
    assert len(names) == 2 * layers
    assert {result.ctx[p].shape for p in names} == {present}
    assert dims.to_text(present[2]) == "past_sequence_length + sequence_length"


def test_genai_mask_length_gives_max_of_past_and_total():
    """With onnxruntime-genai's ``attention_mask [batch_size, total_sequence_length]``
    GroupQueryAttention's present is the kernel's max(past, total); the exporter's mask
    broadcasts against the cache length the same way."""
    for style in ("gqa", "exporter"):
        model = dm.strip_types(dm.build(style, "float", config(style, 1), mask_dim=dm.TOTAL))
        result = inference.infer(model)
        assert_typed_fully(result, model)
        present = result.ctx["present.0.key"].shape[2]
        if style == "gqa":
            assert present == dims.maximum(dims.Dim.symbol(dm.PAST), dims.Dim.symbol(dm.TOTAL))
        else:
            assert present == dims.parse(dm.PAST_PLUS_SEQ)  # Concat(past, new)
            bias = next(n.output[0] for n in model.graph.node if n.op_type == "Where")
            assert result.ctx[bias].shape == (dims.Dim.symbol(dm.BATCH), 1, dims.Dim.symbol(dm.SEQ),
                                              dims.Dim.symbol(dm.TOTAL))


@pytest.mark.parametrize("style, form", CASES)
def test_agrees_with_onnx_wherever_onnx_has_a_dim(style, form):
    """Every dim onnx's pass (data_prop=True) gives as an int or a named symbol is ours too."""
    model = dm.strip_types(dm.build(style, form, config(style, 2)))
    ctx = inference.infer(model).ctx
    theirs = onnx.shape_inference.infer_shapes(model, data_prop=True)
    compared, bad = 0, []
    for vi in list(theirs.graph.value_info) + list(theirs.graph.output):
        if not vi.type.tensor_type.HasField("shape"):
            continue
        mine, their_dims = ctx[vi.name].shape, vi.type.tensor_type.shape.dim
        for i, d in enumerate(their_dims):
            if d.HasField("dim_value") or (d.dim_param and not d.dim_param.startswith("unk__")):
                compared += 1
                want = d.dim_value if d.HasField("dim_value") else dims.parse(d.dim_param)
                if mine is None or len(mine) != len(their_dims) or mine[i] != want:
                    bad.append(f"{vi.name} dim {i}: ours {ctx[vi.name].shape_text()}, onnx {want}")
    assert compared and not bad, bad[:3]


def exposed(model: onnx.ModelProto, result) -> onnx.ModelProto:
    """The model with every node output a graph output (typed by element only), so that a run
    returns every value."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    have = {o.name for o in out.graph.output}
    for name in node_outputs(model):
        if name not in have:
            out.graph.output.append(helper.make_tensor_value_info(name, result.ctx[name].elem_type, None))
    return out


def runtime_mismatches(model: onnx.ModelProto, batch: int = 2) -> tuple[int, list[str]]:
    """(values compared, mismatches) of the inferred types, evaluated at each pair of PAIRS,
    against onnxruntime's run of every value."""
    result = inference.infer(dm.strip_types(model))
    full = exposed(model, result)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    with not_an_oracle():  # shapes only: the values of a u8s8 QDQ run may saturate on this CPU
        sess = ort.InferenceSession(full.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    bad, compared = [], 0
    for past, seq in PAIRS:
        binding = dm.bindings(batch, past, seq)
        for name, array in zip(names, sess.run(None, dm.feeds(model, batch, past, seq))):
            info = result.ctx[name]
            expected = tuple(d if isinstance(d, int) else dims.evaluate(d, binding) for d in info.shape)
            compared += 1
            if expected != array.shape or helper.np_dtype_to_tensor_dtype(array.dtype) != info.elem_type:
                bad.append(f"{name} at past={past}, seq={seq}: {info.shape_text()} -> {expected}, ran {array.shape}")
    return compared, bad


@pytest.mark.parametrize("style, form", CASES)
def test_shapes_equal_an_onnxruntime_run_at_two_pairs(style, form):
    model = dm.build(style, form, config(style, 2))
    compared, bad = runtime_mismatches(model)
    assert compared == 2 * len(node_outputs(model))
    assert not bad, bad[:3]


@pytest.mark.parametrize("style", ("exporter", "gqa"))
def test_shapes_equal_an_onnxruntime_run_with_a_total_length_mask(style):
    compared, bad = runtime_mismatches(dm.build(style, "nbits", config(style, 1), mask_dim=dm.TOTAL))
    assert compared and not bad, bad[:3]


# ---------------------------------------------------------------- weights outside the model
def test_external_weights_are_not_read(tmp_path):
    """Saved with its weights in a file beside it, then the file removed: the model is still
    typed fully from its path."""
    model = dm.build("exporter", "qdq", config("exporter", 4))
    path = tmp_path / "decoder.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="decoder.bin",
              size_threshold=1024)
    weights = tmp_path / "decoder.bin"
    assert weights.stat().st_size > 100_000
    weights.unlink()
    result = inference.infer(str(path))
    assert not result.diagnostics, [str(d) for d in result.diagnostics[:3]]
    assert_typed_fully(result, model)
    assert result.ctx["present.3.value"].shape[2] == dims.parse(dm.PAST_PLUS_SEQ)


def test_memory_is_bounded_by_the_graph_not_the_weights():
    """Llama-7B widths, 2 layers, the weights (about 2.5 GB) as references into a file that was
    never written: the pass allocates a tiny fraction of them."""
    cfg = dm.DecoderConfig(layers=2, hidden=4096, heads=32, kv_heads=8, intermediate=11008, vocab=32000,
                           max_positions=64)
    model = dm.build("gqa", "float", cfg, external_data="weights.bin")
    weight_bytes = sum(int(e.value) for t in model.graph.initializer for e in t.external_data if e.key == "length")
    assert weight_bytes > 2 * 10**9
    tracemalloc.start()
    try:
        result = inference.infer(model)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert_typed_fully(result, model)
    assert peak < weight_bytes / 1000


def test_generator_refuses_what_it_cannot_build():
    with pytest.raises(ValueError, match="kv_heads"):
        dm.build("mha", "float", dm.DecoderConfig(kv_heads=2))
    with pytest.raises(ValueError, match="unknown weight form 'int4'"):
        dm.build("exporter", "int4")
    with pytest.raises(ValueError, match="unknown style"):
        dm.build("fused")
    assert np.all(dm.feeds(dm.build(), 1, 2, 3)["position_ids"] == [[2, 3, 4]])

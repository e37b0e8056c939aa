"""Small kernels of issue #23 on the GPU: BitCast, ReverseSequence, CenterCropPad, Compress, LRN, Det
and the window ops. Oracles: onnx.reference, bit for bit where the output is data movement or
integers, within float32 rounding where it computes; ONNX's node cases; a second shape from a cold
cache compiles none of their pipelines."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from onnx import helper

from support.gpu import assert_node_cases_pass_or_declined, gpu_examples, runs_from_a_cold_cache
from support.models import node_model
from support.oracles import assert_agree, assert_same_bits, ref_run

#: element types by bit width (BitCast's pairs), numpy's view of each
WIDTHS = {8: [np.int8, np.uint8, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2], 16: [np.int16, np.uint16, np.float16, ml_dtypes.bfloat16],
          32: [np.int32, np.uint32, np.float32], 64: [np.int64, np.uint64, np.float64]}


def _run(device, model, feeds):
    from onnx_quant.backend_wgpu.session import Session

    with Session(model, device=device, allow_host_fallback=False) as s:
        return s.run(None, feeds)


def _bit_for_bit(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        assert_same_bits(g, w)


def test_onnx_node_cases_pass_on_the_gpu(best):
    assert_node_cases_pass_or_declined(best, ("BitCast",), {}, 10)


@settings(max_examples=gpu_examples(), deadline=None)
@given(width=st.sampled_from(sorted(WIDTHS)), pair=st.tuples(st.integers(0, 3), st.integers(0, 3)),
       shape=st.lists(st.integers(0, 5), max_size=3), seed=st.integers(0, 2**16))
def test_bit_cast_matches_onnx_reference(best, width, pair, shape, seed):
    types = WIDTHS[width]
    src, dst = types[pair[0] % len(types)], types[pair[1] % len(types)]
    raw = np.random.default_rng(seed).integers(0, 256, (*shape, width // 8), dtype=np.uint8)
    x = raw.view(np.dtype(src)).reshape(shape)
    model = node_model("BitCast", [("x", x)], ["y"], opset=26, out_types=[dst],
                       attrs={"to": helper.np_dtype_to_tensor_dtype(np.dtype(dst))})
    _bit_for_bit(_run(best, model, {"x": x}), ref_run(model, {"x": x}))


def test_bit_cast_a_second_shape_compiles_nothing(best):
    model = node_model("BitCast", [("x", np.zeros((2, 3), np.float32))], ["y"], opset=26, out_types=[np.int32],
                       attrs={"to": 6})
    model.graph.input[0].type.tensor_type.ClearField("shape")
    feeds = [{"x": np.arange(n, dtype=np.float32)} for n in (6, 40)]
    outs, compiled = runs_from_a_cold_cache(best, model, feeds)
    assert any("BitCast" in lab for lab in compiled[0]) and not [lab for lab in compiled[1] if "BitCast" in lab]
    for f, (got,) in zip(feeds, outs):
        assert np.array_equal(got, f["x"].view(np.int32))

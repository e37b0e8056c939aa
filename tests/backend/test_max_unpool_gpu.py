"""MaxUnpool on the GPU (templates/max_unpool.kernel.json, max-unpool.wgsl.jinja): X scattered into
zeros of the inferred shape at Indices, the last of duplicate indices winning, a negative index
counting from the end, then placed at the start of every axis of output_shape's tensor.

Oracles, bit for bit: onnx.reference for every case (opsets 9, 11, 22; float32, float16, float64,
bfloat16; with and without output_shape; MaxPool's own indices and arbitrary ones, duplicates and
negatives included); onnxruntime where it defines the same thing (float32, no output_shape,
indices in range and not negative: it reads output_shape's indices in that shape's layout, as
ONNX's node case does not). Out-of-range indices: tests/backend/test_index_checks_gpu.py."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st
from onnx import TensorProto, helper

from support.gpu import (assert_first_run_alone_compiles, assert_node_cases_pass_or_declined, gpu_examples,
                         runs_from_a_cold_cache)
from support.conv_cases import opset_type_window
from support.models import make_model, vi
from support.oracles import assert_bits, ort_run, ref_run

#: MaxUnpool's schema versions and the element types of X each allows (all of them move as bits)
OPSETS = {9: ("float32", "float16", "float64"), 11: ("float32", "float16", "float64"),
          22: ("float32", "float16", "float64", "bfloat16")}
NP = {"float32": np.float32, "float16": np.float16, "float64": np.float64, "bfloat16": ml_dtypes.bfloat16}


def _model(dtype: str, rank: int, attrs: dict, opset: int, with_shape: bool, symbolic: bool = False, out_rank=None):
    code = helper.np_dtype_to_tensor_dtype(np.dtype(NP[dtype]))
    dims = ["N", "C", *["H", "W", "D"][:rank]] if symbolic else None
    inputs = [vi("x", code, dims), vi("i", TensorProto.INT64, dims)]
    if with_shape:
        inputs.append(vi("s", TensorProto.INT64, [out_rank or rank + 2]))
    node = helper.make_node("MaxUnpool", ["x", "i"] + (["s"] if with_shape else []), ["y"], **attrs)
    return make_model([node], inputs, [vi("y", code, None)], opset=opset)


def _inferred(shape, attrs):
    rank = len(shape) - 2
    st_ = attrs.get("strides") or [1] * rank
    pads = attrs.get("pads") or [0] * (2 * rank)
    k = attrs["kernel_shape"]
    return [shape[0], shape[1]] + [(shape[2 + d] - 1) * st_[d] - pads[d] - pads[d + rank] + k[d] for d in range(rank)]


def _run(dev, model, feeds):
    from onnx_quant.backend_wgpu.session import Session

    with Session(model, device=dev, allow_host_fallback=False) as s:
        return s.run(None, feeds)[0]


@st.composite
def unpools(draw):
    opset, dtype, kernel, strides = draw(opset_type_window(OPSETS, 3))
    rank = len(kernel)
    attrs = {"kernel_shape": kernel}
    if strides:
        attrs["strides"] = strides
    if draw(st.booleans()):
        attrs["pads"] = [draw(st.integers(0, kernel[d % rank] - 1)) for d in range(2 * rank)]
    shape = [draw(st.integers(1, 2)), draw(st.integers(1, 3))] + [draw(st.integers(1, 4)) for _ in range(rank)]
    inferred = _inferred(shape, attrs)
    assume(min(inferred) >= 1)  # pads eating the whole axis leave no position an index may name
    out = None
    if draw(st.booleans()):  # output_shape: the inferred shape grown on some axes
        out = [d + draw(st.integers(0, 2)) for d in inferred]
    return opset, dtype, attrs, shape, out, draw(st.sampled_from(["maxpool", "random", "duplicates"])), \
        draw(st.integers(0, 2**16))


@settings(max_examples=gpu_examples(), deadline=None)
@given(case=unpools())
def test_matches_onnx_reference(best, case):
    """Spatial ranks 1-3, kernels, strides, pads, output_shape (larger than inferred), every opset and
    type; indices as MaxPool writes them, arbitrary in [-M, M), or all on a few positions (duplicates:
    the last wins); X with -0.0 (its bits survive, the fill is +0.0)."""
    opset, dtype, attrs, shape, out, kind, seed = case
    rng = np.random.default_rng(seed)
    inferred = _inferred(shape, attrs)
    m = int(np.prod(inferred))
    x = rng.choice(np.array([-0.0, 1.5, -2.25, 3.0, 7.0], NP[dtype]), size=shape)
    if kind == "maxpool":  # distinct positions of each (n, c) plane, as MaxPool's Indices
        plane = int(np.prod(inferred[2:]))
        nc = np.arange(shape[0] * shape[1]).reshape(shape[:2] + [1] * (len(shape) - 2))
        per = int(np.prod(shape[2:]))
        picks = np.stack([rng.choice(plane, size=per, replace=plane < per) for _ in range(nc.size)])
        i = (picks.reshape(shape) + nc * plane).astype(np.int64)
    elif kind == "random":
        i = rng.integers(-m, m, size=shape).astype(np.int64)
    else:
        i = rng.choice(rng.integers(-m, m, size=2), size=shape).astype(np.int64)
    feeds = {"x": x, "i": i}
    if out is not None:
        feeds["s"] = np.array(out, np.int64)
    model = _model(dtype, len(shape) - 2, attrs, opset, out is not None)
    got = _run(best, model, feeds)
    want = ref_run(model, feeds)[0]
    assert_bits(got, want, f"MaxUnpool {dtype} {attrs} out {out} {kind}")
    if dtype == "float32" and out is None and (i >= 0).all():
        assert_bits(got, ort_run(model, feeds)[0], "vs onnxruntime")


def test_duplicates_take_the_last_write_and_negatives_count_from_the_end(best):
    model = _model("float32", 1, {"kernel_shape": [2], "strides": [2]}, 22, False)
    x = np.float32([[[1, 2, 3, 4]]])
    i = np.array([[[5, 1, 5, -3]]], np.int64)  # inferred [1, 1, 8]: -3 is 5 too
    got = _run(best, model, {"x": x, "i": i})
    assert np.array_equal(got, [[[0, 2, 0, 0, 0, 4, 0, 0]]])
    assert_bits(got, ref_run(model, {"x": x, "i": i})[0])


def test_a_second_size_compiles_nothing(best):
    """Shapes are runtime uniforms (the inferred and output shapes, the counts): a second batch and
    image size from a cold cache compiles no pipeline; both runs are onnx.reference's bits."""
    attrs = {"kernel_shape": [2, 3], "strides": [2, 2], "pads": [1, 0, 0, 1]}
    model = _model("float16", 2, attrs, 22, False, symbolic=True)
    rng = np.random.default_rng(3)
    feeds = []
    for shape in ([1, 2, 3, 4], [2, 3, 5, 3]):
        m = int(np.prod(_inferred(shape, attrs)))
        feeds.append({"x": rng.standard_normal(shape).astype(np.float16), "i": rng.integers(-m, m, shape).astype(np.int64)})
    outs, compiled = runs_from_a_cold_cache(best, model, feeds)
    assert_first_run_alone_compiles(compiled, "MaxUnpool")
    for got, f in zip(outs, feeds):
        assert_bits(got[0], ref_run(model, f)[0])


@pytest.mark.parametrize("out, words", [([1, 1, 3], "shapesOk"), ([1, 1, 5, 1], "shapesOk")])
def test_an_output_smaller_than_the_inferred_shape_or_of_another_rank_is_declined(best, out, words):
    """onnx.reference cannot place the inferred tensor there (it raises): declined, never a value."""
    from onnx_quant.errors import ExecutionError

    model = _model("float32", 1, {"kernel_shape": [2], "strides": [2]}, 22, True, out_rank=len(out))
    feeds = {"x": np.float32([[[1, 2]]]), "i": np.array([[[0, 3]]], np.int64), "s": np.array(out, np.int64)}
    with pytest.raises(ExecutionError, match=words):
        _run(best, model, feeds)


def test_onnx_node_cases_pass_on_the_gpu(best):
    assert_node_cases_pass_or_declined(best, ("MaxUnpool",), {}, 2)

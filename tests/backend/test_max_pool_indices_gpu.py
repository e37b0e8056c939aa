"""MaxPool's second output, Indices (opset 8 on), on the GPU (templates/max_pool.kernel.json over
pool.base.json and pool.wgsl.jinja): the first window position inside the input, then each strictly
greater value, in row-major window order; Y is X at Indices; Indices counts over the whole of X, its
spatial part row-major (storage_order 0) or column-major (1).

Oracles, bit for bit: onnxruntime (MaxPool-8's kernel) for every case, and onnx.reference where it
runs its explicit loop (strides or dilations other than 1) with explicit pads. Its other path
(strides and dilations 1, ``CommonPool``) leaves out the batch and channel offset and fails on some
padded windows, and its loop mis-sizes SAME_* padding (``_oracle``), so it is no oracle there:
onnxruntime and the reference's loop agree on every case both run right."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st
from onnx import TensorProto, helper

from support.gpu import (assert_first_run_alone_compiles, assert_node_cases_pass_or_declined, gpu_examples,
                         runs_from_a_cold_cache)
from support.conv_cases import opset_type_window
from support.models import make_model, vi
from support.oracles import assert_same_bits, ort_run, ref_run

#: MaxPool's schema versions with Indices, and the element types each allows of the kernel's
OPSETS = {8: ("float32", "float16"), 10: ("float32", "float16"), 11: ("float32", "float16"),
          12: ("float32", "float16", "int8", "uint8"), 22: ("float32", "float16", "int8", "uint8")}
CODES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int8": TensorProto.INT8,
         "uint8": TensorProto.UINT8}


def _model(dtype: str, rank: int, attrs: dict, opset: int, symbolic: bool = False):
    dims = ["N", "C", *["H", "W", "D"][:rank]] if symbolic else None
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    return make_model([node], [vi("x", CODES[dtype], dims)], [vi("y", CODES[dtype], None), vi("i", TensorProto.INT64, None)],
                      opset=opset)


def _oracle(model, x, attrs, want=None):
    """onnxruntime's outputs, checked against onnx.reference's loop where it runs it, with explicit
    pads: its auto_pad sizes differ (SAME_LOWER: floor(in / stride) outputs where ONNX takes the
    ceiling; VALID ignores ceil_mode, onnxruntime and onnx's inference do not)."""
    want = ort_run(model, {"x": x}) if want is None else want
    loop = any(s != 1 for s in attrs.get("strides", [])) or any(d != 1 for d in attrs.get("dilations", []))
    if loop and attrs.get("auto_pad", "NOTSET") == "NOTSET":
        ref = ref_run(model, {"x": x})
        assert_same_bits(ref[0], want[0], "onnx.reference vs onnxruntime: Y")
        assert np.array_equal(np.asarray(ref[1], np.int64), want[1]), "onnx.reference vs onnxruntime: Indices"
    return want


def _values(rng, dtype: str, shape, specials: bool):
    """Few distinct values (ties in most windows); floats with -inf, +inf and NaN where ``specials``."""
    if dtype in ("int8", "uint8"):
        info = np.iinfo(dtype)
        pool = np.array([info.min, info.min + 1, 0, 1, 3, info.max], dtype=dtype)
    else:
        pool = np.array([-2.0, -0.5, 0.0, 1.0, 3.0] + ([-np.inf, np.inf, np.nan] if specials else []), dtype=dtype)
    return rng.choice(pool, size=shape)


@st.composite
def pools(draw):
    opset, dtype, kernel, strides = draw(opset_type_window(OPSETS, 4))
    rank = len(kernel)
    sizes = [draw(st.integers(1, 7)) for _ in range(rank)]
    attrs = {"kernel_shape": kernel, "storage_order": draw(st.integers(0, 1))}
    if strides:
        attrs["strides"] = strides
    dil = [1] * rank
    if opset >= 10 and draw(st.booleans()):
        dil = attrs["dilations"] = [draw(st.integers(1, 3)) for _ in range(rank)]
    if opset >= 10 and draw(st.booleans()):
        attrs["ceil_mode"] = 1
    # onnxruntime pads SAME_* for the undilated kernel (a dilated one gets too small an output)
    modes = ["pads", "NOTSET", "VALID"] + (["SAME_UPPER", "SAME_LOWER"] if dil == [1] * rank else [])
    mode = draw(st.sampled_from(modes))
    pads = [0] * (2 * rank)
    if mode == "pads":  # onnxruntime's rule: each pad below its (undilated) kernel size
        pads = attrs["pads"] = [draw(st.integers(0, kernel[d % rank] - 1)) for d in range(2 * rank)]
    elif mode != "NOTSET":
        attrs["auto_pad"] = mode
    for d in range(rank):
        span = (kernel[d] - 1) * dil[d] + 1
        assume(sizes[d] + (pads[d] + pads[d + rank] if mode in ("pads", "NOTSET") else 0) >= span)
    shape = [draw(st.integers(1, 2)), draw(st.integers(1, 3)), *sizes]
    return opset, dtype, attrs, shape, draw(st.booleans()), draw(st.integers(0, 2**16))


@settings(max_examples=gpu_examples(), deadline=None)
@given(case=pools())
def test_indices_match_onnxruntime_and_the_reference_loop(best, case):
    """Any spatial rank 1-3, strides, dilations, pads / auto_pad, ceil_mode, storage_order, every
    opset with Indices and its types; ties everywhere, -inf / +inf / NaN in some float inputs."""
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import ExecutionError

    opset, dtype, attrs, shape, specials, seed = case
    x = _values(np.random.default_rng(seed), dtype, shape, specials)
    model = _model(dtype, len(shape) - 2, attrs, opset)
    same = "SAME" in attrs.get("auto_pad", "") and max(attrs.get("strides", [1])) > min(attrs["kernel_shape"])
    if same or max(attrs.get("dilations", [1])) > min(shape[2:]):
        # the padding may be negative, or a window may hold no input position: the runtimes part
        # (pool.base.json's samePadsOk, windowsOk)
        with pytest.raises(ExecutionError, match="samePadsOk" if same else "windowsOk"):
            with Session(model, device=best, allow_host_fallback=False) as s:
                s.run(None, {"x": x})
        return
    try:
        want = ort_run(model, {"x": x})
    except Exception:  # noqa: BLE001 - a model onnxruntime refuses is no case
        assume(False)
    _oracle(model, x, attrs, want)
    with Session(model, device=best, allow_host_fallback=False) as s:
        got = s.run(None, {"x": x})
    assert_same_bits(got[0], want[0], f"Y {attrs}")
    assert got[1].dtype == np.int64 and np.array_equal(got[1], want[1]), (attrs, got[1], want[1])


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_every_variant_writes_the_same_indices(best, dtype):
    """The per-word and the grid-strided variant (forced, COARSE_MIN_WORDS 0): the oracle's bits; 8-bit
    Y packs four elements to a word, the invocation writing it writes their four indices."""
    from onnx_quant.backend_wgpu.session import Session

    attrs = dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], storage_order=1)
    x = _values(np.random.default_rng(1), dtype, [2, 3, 9, 7], False)
    model = _model(dtype, 2, attrs, 22)
    want = _oracle(model, x, attrs)
    for variant in ("word_per_invocation", "words_per_invocation"):
        with Session(model, device=best, variants={"MaxPool": variant}, tunables={"MaxPool": {"COARSE_MIN_WORDS": 0}},
                     allow_host_fallback=False) as s:
            got = s.run(None, {"x": x})
            assert next(p for p in s.plans({"x": x.shape}) if p.kernel == "MaxPool").variant == variant
        assert_same_bits(got[0], want[0], f"Y {variant}")
        assert np.array_equal(got[1], want[1]), variant


def test_a_second_image_size_compiles_nothing(best):
    """Sizes are runtime uniforms: a second batch and image size from a cold cache compiles no
    pipeline, and both runs agree with the oracles."""
    attrs = dict(kernel_shape=[2, 3], strides=[2, 2], pads=[1, 1, 0, 2], storage_order=1)
    model = _model("float32", 2, attrs, 22, symbolic=True)
    rng = np.random.default_rng(2)
    feeds = [{"x": _values(rng, "float32", s, True)} for s in ([1, 3, 7, 6], [2, 3, 10, 13])]
    outs, compiled = runs_from_a_cold_cache(best, model, feeds)
    assert_first_run_alone_compiles(compiled, "MaxPool")
    for got, f in zip(outs, feeds):
        want = _oracle(model, f["x"], attrs)
        assert_same_bits(got[0], want[0], "Y")
        assert np.array_equal(got[1], want[1])


def test_nan_and_infinity_follow_the_first_position_rule(best):
    """A NaN first in its window stays (Y NaN, its index); a NaN later is never greater; a window of
    -inf gives its first -inf: onnxruntime's MaxPool-8 loop. Y alone takes the same walk: a window
    of NaN alone is NaN, as onnx.reference gives it (the fuzzer's finding: skipping every NaN wrote
    -inf there). onnxruntime's Y-only kernel (MLAS) is no oracle for these windows: it passes over
    every NaN and starts from -FLT_MAX, so a window of -inf or of NaN alone is -3.4e38 there."""
    from onnx_quant.backend_wgpu.session import Session

    x = np.array([[[-np.inf, -np.inf, np.nan, 1, np.nan, -np.inf, 2, np.nan, np.nan, np.nan]]], np.float32)
    for strides in ([1], [2]):
        attrs = dict(kernel_shape=[2], strides=strides)
        model = _model("float32", 1, attrs, 22)
        with Session(model, device=best, allow_host_fallback=False) as s:
            got = s.run(None, {"x": x})
        want = ort_run(model, {"x": x})
        assert_same_bits(got[0], want[0], f"Y {strides}")
        assert np.array_equal(got[1], want[1])
        alone = make_model([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], [vi("x", TensorProto.FLOAT, None)],
                           [vi("y", TensorProto.FLOAT, None)], opset=22)
        with Session(alone, device=best, allow_host_fallback=False) as s:
            (y,) = s.run(None, {"x": x})
        assert_same_bits(y, got[0], f"Y alone is Y {strides}")
    assert np.array_equal(got[1].ravel(), [0, 2, 4, 6, 8])
    assert np.isnan(y.ravel()[-1])  # the window of NaN alone


def test_onnx_node_cases_pass_on_the_gpu(best):
    passed = assert_node_cases_pass_or_declined(best, ("MaxPool",), {}, 19)
    assert {"test_maxpool_with_argmax_2d_precomputed_pads", "test_maxpool_with_argmax_2d_precomputed_strides"} <= set(passed)


def test_the_other_pools_decline_a_second_output(best):
    """AveragePool's schema has one output: a node with two is declined by the spec (indicesOk), never
    run with an unwritten second output."""
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import ExecutionError

    node = helper.make_node("AveragePool", ["x"], ["y", "i"], kernel_shape=[2])
    model = make_model([node], [vi("x", TensorProto.FLOAT, [1, 1, 4])],
                       [vi("y", TensorProto.FLOAT, None), vi("i", TensorProto.INT64, [1, 1, 3])], opset=19)
    with pytest.raises(ExecutionError, match="indicesOk"):
        with Session(model, device=best, allow_host_fallback=False) as s:
            s.run(None, {"x": np.ones((1, 1, 4), np.float32)})

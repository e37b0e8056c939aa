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

from onnx_quant.errors import ExecutionError

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


#: element types the data-movement kernels are drawn over (8-, 16-, 32- and 64-bit)
MOVE_TYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.int64, np.uint8, np.bool_, np.int32]


def _newest_if(dtype, opset: int, newest: int) -> int:
    """The opset a case of ``dtype`` is built at: bfloat16 joined these ops' T later."""
    return newest if dtype is ml_dtypes.bfloat16 else opset


def _data(rng, shape, dtype):
    return rng.integers(-8, 8, shape).astype(dtype) if np.dtype(dtype).kind in "iub" or dtype is ml_dtypes.int4 \
        else rng.standard_normal(shape).astype(dtype)


@settings(max_examples=gpu_examples(), deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=4), batch_axis=st.sampled_from([0, 1]),
       dtype=st.sampled_from(MOVE_TYPES), seed=st.integers(0, 2**16))
def test_reverse_sequence_matches_onnx_reference(best, shape, batch_axis, dtype, seed):
    rng = np.random.default_rng(seed)
    x = _data(rng, shape, dtype)
    lens = rng.integers(0, shape[1 - batch_axis] + 1, shape[batch_axis]).astype(np.int64)
    model = node_model("ReverseSequence", [("x", x), ("sequence_lens", lens)], ["y"], opset=_newest_if(dtype, 10, 28),
                       attrs={"batch_axis": batch_axis, "time_axis": 1 - batch_axis})
    feeds = {"x": x, "sequence_lens": lens}
    _bit_for_bit(_run(best, model, feeds), ref_run(model, feeds))


@settings(max_examples=gpu_examples(), deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), data=st.data(),
       dtype=st.sampled_from(MOVE_TYPES),
       seed=st.integers(0, 2**16))
def test_center_crop_pad_matches_onnx_reference(best, shape, data, dtype, seed):
    rng = np.random.default_rng(seed)
    axes = data.draw(st.one_of(st.none(), st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1,
                                                   max_size=len(shape), unique_by=lambda a: a % len(shape))))
    target = np.array(data.draw(st.lists(st.integers(0, 8), min_size=len(axes or shape), max_size=len(axes or shape))), np.int64)
    x = _data(rng, shape, dtype)
    model = node_model("CenterCropPad", [("x", x)], ["y"], opset=18, attrs={} if axes is None else {"axes": axes},
                       inits={"shape": target})
    model.graph.node[0].input.append("shape")
    _bit_for_bit(_run(best, model, {"x": x}), ref_run(model, {"x": x}))


@settings(max_examples=gpu_examples(), deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), data=st.data(), dtype=st.sampled_from(MOVE_TYPES),
       seed=st.integers(0, 2**16))
def test_compress_matches_onnx_reference(best, shape, data, dtype, seed):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    length = int(np.prod(shape)) if axis is None else shape[axis]
    condition = rng.integers(0, 2, data.draw(st.integers(0, length))).astype(bool)
    x = _data(rng, shape, dtype)
    model = node_model("Compress", [("x", x), ("condition", condition)], ["y"], opset=_newest_if(dtype, 11, 28),
                       attrs={} if axis is None else {"axis": axis})
    feeds = {"x": x, "condition": condition}
    _bit_for_bit(_run(best, model, feeds), ref_run(model, feeds))


def test_data_movement_second_shapes_compile_nothing(best):
    """ReverseSequence, CenterCropPad and Compress at a second input shape (and condition) from a cold cache."""
    rng = np.random.default_rng(1)
    cases = []
    rs = node_model("ReverseSequence", [("x", np.zeros((2, 3), np.float32)), ("sequence_lens", np.zeros(2, np.int64))],
                    ["y"], opset=10, attrs={"batch_axis": 0, "time_axis": 1})
    cases.append((rs, [{"x": rng.standard_normal((b, t)).astype(np.float32), "sequence_lens": rng.integers(0, t + 1, b)}
                       for b, t in ((2, 3), (5, 7))], "ReverseSequence"))
    ccp = node_model("CenterCropPad", [("x", np.zeros((4, 6), np.float32))], ["y"], opset=18, inits={"shape": np.array([5, 3], np.int64)})
    ccp.graph.node[0].input.append("shape")
    cases.append((ccp, [{"x": rng.standard_normal(s).astype(np.float32)} for s in ((4, 6), (9, 2))], "CenterCropPad"))
    cp = node_model("Compress", [("x", np.zeros((3, 4), np.float32)), ("condition", np.zeros(4, bool))], ["y"], opset=11,
                    attrs={"axis": 1})
    cases.append((cp, [{"x": rng.standard_normal((r, 4)).astype(np.float32), "condition": c}
                       for r, c in ((3, np.array([1, 0, 1, 1], bool)), (6, np.array([0, 1, 1, 0], bool)))], "Compress"))
    for model, feeds, kernel in cases:
        for inp in model.graph.input:
            inp.type.tensor_type.ClearField("shape")
        outs, compiled = runs_from_a_cold_cache(best, model, feeds)
        assert any(kernel in lab for lab in compiled[0]) and not [lab for lab in compiled[1] if kernel in lab], (kernel, compiled)
        for f, got in zip(feeds, outs):
            _bit_for_bit(got, ref_run(model, f))


@settings(max_examples=gpu_examples(), deadline=None)
@given(spatial=st.lists(st.integers(5, 8), min_size=1, max_size=3), p=st.integers(1, 4), data=st.data(),
       opset=st.sampled_from([11, 18, 22]), seed=st.integers(0, 2**16))
def test_lp_pool_matches_onnx_reference(best, spatial, p, data, opset, seed):
    """Windows with strides, pads (or auto_pad), dilations and ceil_mode (18), p from 1 to 4."""
    kernel = [data.draw(st.integers(1, 3)) for _ in spatial]
    attrs = {"kernel_shape": kernel, "p": p, "strides": [data.draw(st.integers(1, 2)) for _ in spatial]}
    pad_mode = data.draw(st.sampled_from(["pads", "SAME_UPPER", "NOTSET"]))
    if pad_mode == "pads":
        attrs["pads"] = [data.draw(st.integers(0, k - 1)) for k in kernel * 2]
    elif pad_mode == "SAME_UPPER":
        attrs["auto_pad"] = pad_mode
    if opset >= 18 and pad_mode != "SAME_UPPER":
        attrs["dilations"] = [data.draw(st.integers(1, 2)) for _ in spatial]
    x = np.random.default_rng(seed).standard_normal((2, 3, *spatial)).astype(np.float32)
    model = node_model("LpPool", [("x", x)], ["y"], opset=opset, attrs=attrs)
    if pad_mode == "SAME_UPPER" and any((-(-n // s) - 1) * s + k - n < 0 for n, s, k in zip(spatial, attrs["strides"], kernel)):
        with pytest.raises(ExecutionError, match="samePadsOk"):  # a negative padding: ONNX leaves it open
            _run(best, model, {"x": x})
        return
    assert_agree(_run(best, model, {"x": x}), ref_run(model, {"x": x}), 1e-5)


@settings(max_examples=gpu_examples(), deadline=None)
@given(op=st.sampled_from(["HannWindow", "HammingWindow", "BlackmanWindow"]), size=st.integers(1, 300),
       periodic=st.sampled_from([0, 1]), out=st.sampled_from([1, 10]), index=st.sampled_from([np.int32, np.int64]))
def test_windows_match_onnx_reference(best, op, size, periodic, out, index):
    if size == 1 and not periodic:
        return  # the reference divides by zero (declined)
    model = node_model(op, [], ["y"], opset=17, attrs={"periodic": periodic, "output_datatype": out},
                       out_types=[np.float32 if out == 1 else np.float16], inits={"size": np.array(size, index)})
    model.graph.node[0].input.append("size")
    if out == 10 and op != "BlackmanWindow":  # the reference computes them in float16
        from onnx_quant.backend_wgpu.session import Session
        from onnx_quant.errors import ExecutionError

        with pytest.raises(ExecutionError, match=f"{op}.*accepts"):
            Session(model, device=best, allow_host_fallback=False).run(None, {})
        return
    assert_agree(_run(best, model, {}), ref_run(model, {}), 1e-6 if out == 1 else 1e-3)


def test_windows_a_second_length_compiles_nothing(best):
    from onnx import TensorProto as TP
    from support.models import make_model

    model = make_model(helper.make_node("HannWindow", ["n"], ["y"]), [("n", TP.INT64, [])], [("y", TP.FLOAT, None)], opset=17)
    feeds = [{"n": np.array(n, np.int64)} for n in (16, 1000)]
    outs, compiled = runs_from_a_cold_cache(best, model, feeds)
    assert any("HannWindow" in lab for lab in compiled[0]) and not [lab for lab in compiled[1] if "HannWindow" in lab]
    for f, got in zip(feeds, outs):
        assert_agree(got, ref_run(model, f), 1e-6)


@settings(max_examples=gpu_examples(), deadline=None)
@given(rank=st.integers(2, 3), data=st.data(), seed=st.integers(0, 2**16))
def test_col2im_matches_onnx_reference(best, rank, data, seed):
    """Blocks with strides, pads and dilations over 2-3 image axes (onnx.reference's col2im takes 2-D and more)."""
    image = [data.draw(st.integers(2, 6)) for _ in range(rank)]
    block = [data.draw(st.integers(1, 3)) for _ in range(rank)]
    strides = [data.draw(st.integers(1, 2)) for _ in range(rank)]
    dil = [data.draw(st.integers(1, 2)) for _ in range(rank)]
    pads = [data.draw(st.integers(0, 1)) for _ in range(2 * rank)]
    blocks = [(image[d] + pads[d] + pads[d + rank] - dil[d] * (block[d] - 1) - 1) // strides[d] + 1 for d in range(rank)]
    if min(blocks) < 1:
        return
    x = np.random.default_rng(seed).standard_normal((2, 3 * int(np.prod(block)), int(np.prod(blocks)))).astype(np.float32)
    model = node_model("Col2Im", [("input", x)], ["output"], opset=18, attrs={"strides": strides, "dilations": dil, "pads": pads},
                       inits={"image_shape": np.array(image, np.int64), "block_shape": np.array(block, np.int64)})
    model.graph.node[0].input.extend(["image_shape", "block_shape"])
    assert_agree(_run(best, model, {"input": x}), ref_run(model, {"input": x}), 1e-5)


@pytest.mark.parametrize("columns", [3, 5, 7])
def test_col2im_with_a_column_count_other_than_the_block_count_is_declined(best, columns):
    """4 columns of 2x2 blocks make a 3x3 image; any other count is input onnx.reference refuses,
    so the kernel declines it rather than fold some of the columns."""
    from onnx_quant.errors import ExecutionError

    x = np.ones((1, 4, columns), np.float32)
    model = node_model("Col2Im", [("input", x)], ["output"], opset=18,
                       inits={"image_shape": np.array([3, 3], np.int64), "block_shape": np.array([2, 2], np.int64)})
    model.graph.node[0].input.extend(["image_shape", "block_shape"])
    with pytest.raises(ExecutionError, match="Col2Im.*accepts"):
        _run(best, model, {"input": x})


@settings(max_examples=gpu_examples(), deadline=None)
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 7), st.integers(1, 4), st.integers(1, 4)), size=st.integers(1, 6),
       alpha=st.sampled_from([1e-4, 0.5]), beta=st.sampled_from([0.75, 0.5, 1.3]), bias=st.sampled_from([1.0, 2.0]),
       opset=st.sampled_from([1, 13]), seed=st.integers(0, 2**16))
def test_lrn_matches_onnxruntime(best, shape, size, alpha, beta, bias, opset, seed):
    """onnxruntime is the oracle for odd sizes (it takes no other); onnx.reference for even ones, with as
    many images as channels (its LRN walks the batch axis where it means the channels)."""
    from support.oracles import onnxruntime_run

    if size % 2 == 0:
        shape = (shape[1], *shape[1:])
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    model = node_model("LRN", [("x", x)], ["y"], opset=opset, attrs={"size": size, "alpha": alpha, "beta": beta, "bias": bias})
    want = onnxruntime_run(model, {"x": x}) if size % 2 else ref_run(model, {"x": x})
    assert_agree(_run(best, model, {"x": x}), want, 1e-5)


@settings(max_examples=gpu_examples(), deadline=None)
@given(batch=st.lists(st.integers(0, 3), max_size=2), order=st.integers(1, 7), dtype=st.sampled_from([np.float32, np.float16]),
       singular=st.booleans(), seed=st.integers(0, 2**16))
def test_det_matches_onnx_reference(best, batch, order, dtype, singular, seed):
    x = np.random.default_rng(seed).standard_normal((*batch, order, order)).astype(dtype)
    if singular and order > 1:
        x[..., 1, :] = x[..., 0, :]  # a repeated row: determinant 0 (or float rounding of it)
    model = node_model("Det", [("x", x)], ["y"], opset=11 if dtype is np.float32 else 22)
    if dtype is np.float32:
        want = ref_run(model, {"x": x})
    else:  # numpy's linalg (the reference's) takes no float16: its float32 determinant, rounded
        want = [np.linalg.det(x.astype(np.float32)).astype(np.float16)]
    assert_agree(_run(best, model, {"x": x}), want, 1e-4 if dtype is np.float32 else 2e-2)


def test_det_a_second_shape_compiles_nothing(best):
    model = node_model("Det", [("x", np.zeros((2, 3, 3), np.float32))], ["y"], opset=11)
    model.graph.input[0].type.tensor_type.ClearField("shape")
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal(s).astype(np.float32)} for s in ((2, 3, 3), (4, 5, 5))]
    outs, compiled = runs_from_a_cold_cache(best, model, feeds)
    assert any("Det" in lab for lab in compiled[0]) and not [lab for lab in compiled[1] if "Det" in lab]
    for f, got in zip(feeds, outs):
        assert_agree(got, ref_run(model, f), 1e-4)

"""The signal kernels on the GPU (templates/dft.kernel.json): DFT-17 and DFT-20 over shapes, axes,
lengths (truncated and zero-padded), real and complex signals, forward, onesided and irfft, against
onnx.reference (its float32 FFT; a direct sum differs from it by rounding only, so within a bound
of n ulps of the signal's size), the inverse complex transform declined by name, ONNX's node
cases, and a second shape from a cold cache compiling nothing new."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto as TP, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from support.gpu import (assert_first_run_alone_compiles, assert_node_cases_pass_or_declined, gpu_examples,
                         runs_from_a_cold_cache)
from support.models import make_model
from support.oracles import assert_bits

from onnx_quant.backend_wgpu.session import Session
from onnx_quant.errors import ExecutionError


def _dft_model(opset, rank, axis, n, inverse, onesided, dtype=TP.FLOAT):
    inits, names = [], ["x"]
    if n is not None:
        inits.append(numpy_helper.from_array(np.array(n, np.int64), "n"))
    names.append("n" if n is not None else "")
    attrs = dict(inverse=int(inverse), onesided=int(onesided))
    if opset >= 20:
        inits.append(numpy_helper.from_array(np.array(axis, np.int64), "axis"))
        names.append("axis")
    else:
        attrs["axis"] = axis
    node = helper.make_node("DFT", names, ["y"], **attrs)
    x = helper.make_tensor_value_info("x", dtype, [f"d{i}" for i in range(rank)])
    return make_model(node, [x], [helper.make_tensor_value_info("y", dtype, None)], inits, opset)


def _run_signal(best, model, feeds):
    with Session(model, device=best, allow_host_fallback=False) as s:
        return s.run(None, feeds)


def _close(got, want, x, n):
    """Within a direct sum's rounding of the reference: n ulps (of the output's type) of the signal's
    largest value."""
    scale = float(np.max(np.abs(x.astype(np.float64)))) if x.size else 0.0
    atol = 4 * max(n, 1) * np.finfo(want.dtype).eps * max(scale, 1.0)
    assert got.dtype == want.dtype and got.shape == want.shape
    rtol = 1e-4 if want.dtype == np.float32 else 2e-3  # float16: one rounding of the output apart
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)


@st.composite
def _dft_cases(draw):
    rank = draw(st.integers(2, 4))
    axis = draw(st.integers(0, rank - 2))
    shape = [draw(st.integers(1, 3)) for _ in range(rank - 1)] + [draw(st.sampled_from([1, 2]))]
    shape[axis] = draw(st.integers(2, 12))
    form = draw(st.sampled_from(["forward", "onesided", "irfft"]))
    if form != "forward":  # ONNX's inference: a onesided forward takes a real signal, irfft a complex one
        shape[-1] = 2 if form == "irfft" else 1
    n = draw(st.one_of(st.none(), st.integers(1, 16)))
    if form == "irfft" and n is None and shape[axis] < 2:
        n = 2
    neg = draw(st.booleans())
    return dict(shape=shape, axis=axis - rank if neg else axis, n=n, inverse=form == "irfft",
                onesided=form != "forward", opset=draw(st.sampled_from([17, 20])),
                dtype=draw(st.sampled_from([np.float32, np.float32, np.float16])))


@settings(max_examples=gpu_examples(), deadline=None)
@given(case=_dft_cases(), seed=st.integers(0, 2**16))
def test_dft_matches_onnx_reference(best, case, seed):
    code = TP.FLOAT if case["dtype"] == np.float32 else TP.FLOAT16
    model = _dft_model(case["opset"], len(case["shape"]), case["axis"], case["n"], case["inverse"],
                       case["onesided"], code)
    x = np.random.default_rng(seed).uniform(-4, 4, case["shape"]).astype(case["dtype"])
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    (got,) = _run_signal(best, model, {"x": x})
    ax = case["axis"] % len(case["shape"])
    _close(got, want, x, case["n"] or case["shape"][ax])


def test_dft_inverse_complex_is_declined_by_name(best):
    model = _dft_model(20, 3, 1, None, True, False)
    with pytest.raises(ExecutionError, match="complexInverseDeclined"):
        with Session(model, device=best, allow_host_fallback=False) as s:
            s.run(None, {"x": np.ones((1, 8, 2), np.float32)})


def test_dft_node_cases(best):
    assert_node_cases_pass_or_declined(best, {"DFT"}, {"test_dft_inverse": "complexInverseDeclined",
                                                       "test_dft_inverse_opset19": "complexInverseDeclined"}, 8)


@pytest.mark.parametrize("inverse,onesided", [(False, False), (False, True), (True, True)])
def test_dft_second_shape_compiles_nothing(best, inverse, onesided):
    model = _dft_model(20, 4, 1, None, inverse, onesided)
    rng = np.random.default_rng(3)
    shapes = [(1, 10, 3, 1 if not inverse else 2), (2, 6, 5, 1 if not inverse else 2)]
    feeds = [{"x": rng.uniform(-2, 2, s).astype(np.float32)} for s in shapes]
    outs, compiled = runs_from_a_cold_cache(best, model, feeds)
    assert_first_run_alone_compiles(compiled, "DFT")
    ref = ReferenceEvaluator(model)
    for f, (got,) in zip(feeds, outs):
        (want,) = ref.run(None, f)
        _close(got, want, f["x"], f["x"].shape[1])


# ----------------------------------------------------------------------------- STFT


def _stft_model(step, frame_length, window, onesided, dtype=TP.FLOAT):
    inits = [numpy_helper.from_array(np.array(step, np.int64), "step")]
    names = ["x", "step", "window" if window is not None else "", "len" if frame_length is not None else ""]
    if window is not None:
        inits.append(numpy_helper.from_array(window, "window"))
    if frame_length is not None:
        inits.append(numpy_helper.from_array(np.array(frame_length, np.int64), "len"))
    attrs = {} if onesided is None else {"onesided": int(onesided)}
    node = helper.make_node("STFT", names, ["y"], **attrs)
    x = helper.make_tensor_value_info("x", dtype, ["b", "t", "c"])
    return make_model(node, [x], [helper.make_tensor_value_info("y", dtype, None)], inits, 17)


@settings(max_examples=gpu_examples(), deadline=None)
@given(batch=st.integers(1, 2), frame=st.integers(1, 12), extra=st.integers(0, 20), step=st.integers(1, 5),
       complex_=st.booleans(), windowed=st.booleans(), onesided=st.sampled_from([None, 0, 1]),
       f16=st.booleans(), seed=st.integers(0, 2**16))
def test_stft_matches_onnx_reference(best, batch, frame, extra, step, complex_, windowed, onesided, f16, seed):
    if complex_ and onesided != 0:
        onesided = 0  # ONNX: a onesided transform of a complex signal is not defined
    dtype = np.float16 if f16 else np.float32
    rng = np.random.default_rng(seed)
    window = rng.uniform(0, 1, frame).astype(dtype) if windowed else None
    model = _stft_model(step, None if windowed and seed % 2 else frame, window, onesided,
                        TP.FLOAT16 if f16 else TP.FLOAT)
    x = rng.uniform(-3, 3, (batch, frame + extra, 2 if complex_ else 1)).astype(dtype)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    (got,) = _run_signal(best, model, {"x": x})
    _close(got, want, x, frame)


def test_stft_node_cases(best):
    assert_node_cases_pass_or_declined(best, {"STFT"}, {}, 2)


def test_stft_second_shape_compiles_nothing(best):
    window = np.hanning(16).astype(np.float32)
    model = _stft_model(4, None, window, 1)
    rng = np.random.default_rng(5)
    feeds = [{"x": rng.uniform(-1, 1, s).astype(np.float32)} for s in [(1, 64, 1), (3, 90, 1)]]
    outs, compiled = runs_from_a_cold_cache(best, model, feeds)
    assert_first_run_alone_compiles(compiled, "STFT")
    ref = ReferenceEvaluator(model)
    for f, (got,) in zip(feeds, outs):
        (want,) = ref.run(None, f)
        _close(got, want, f["x"], 16)


# ----------------------------------------------------------------------------- MelWeightMatrix


def _mel_model(mel, dft, rate, lo, hi, int_type, float_type, out_type):
    vals = {"mel": np.array(mel, int_type), "dft": np.array(dft, int_type), "rate": np.array(rate, int_type),
            "lo": np.array(lo, float_type), "hi": np.array(hi, float_type)}
    attrs = {} if out_type is None else {"output_datatype": out_type}
    node = helper.make_node("MelWeightMatrix", list(vals), ["y"], **attrs)
    code = TP.FLOAT if out_type is None else out_type
    return make_model(node, [], [helper.make_tensor_value_info("y", code, None)],
                      [numpy_helper.from_array(v, k) for k, v in vals.items()], 17)


@settings(max_examples=gpu_examples(), deadline=None)
@given(mel=st.integers(1, 12), dft=st.integers(8, 96), rate=st.sampled_from([8000, 16000, 22050]),
       lo=st.floats(0, 2000, width=32), span=st.floats(100, 8000, width=32), int_type=st.sampled_from([np.int32, np.int64]),
       float_type=st.sampled_from([np.float32, np.float64]), out_type=st.sampled_from([None, TP.FLOAT, TP.FLOAT16]))
def test_mel_weight_matrix_matches_onnx_reference_bit_for_bit(best, mel, dft, rate, lo, span, int_type, float_type,
                                                              out_type):
    model = _mel_model(mel, dft, rate, lo, min(lo + span, rate / 2), int_type, float_type, out_type)
    try:
        (want,) = ReferenceEvaluator(model).run(None, {})
    except IndexError:  # the reference indexes outside the rows: the kernel must decline
        want = None
    try:
        (got,) = _run_signal(best, model, {})
    except ExecutionError as e:
        assert "edgesOk" in str(e) or want is None, e
        return
    assert want is not None
    assert_bits(got, want, "MelWeightMatrix")


def test_mel_weight_matrix_node_case(best):
    assert_node_cases_pass_or_declined(best, {"MelWeightMatrix"}, {}, 1)

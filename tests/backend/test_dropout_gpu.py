"""Dropout's inference form on the GPU (templates/dropout.kernel.json): the output a copy, the mask
all true, bit for bit onnx.reference's, over shapes, float types, the opset versions and ratio /
training_mode inputs (training with ratio 0 included); training with a nonzero ratio (numpy's
random stream) is declined by name; a second shape compiles nothing."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto as TP, helper

from support.gpu import gpu_examples, runs_from_a_cold_cache
from support.models import make_model
from support.oracles import assert_same_bits, ref_run

TYPES = {"float32": np.float32, "float16": np.float16, "float64": np.float64, "bfloat16": ml_dtypes.bfloat16}


def _dropout(opset: int, dtype, ratio: float | None, training: bool | None, mask: bool):
    code = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = {}
    inputs = ["x"]
    if opset >= 12 and (ratio is not None or training is not None):
        inputs.append("r")
        inits["r"] = np.array(0.5 if ratio is None else ratio, np.float32)
    if opset >= 12 and training is not None:
        inputs.append("t")
        inits["t"] = np.array(training)
    attrs = {"ratio": ratio} if opset < 12 and ratio is not None else {}
    node = helper.make_node("Dropout", inputs, ["y"] + (["z"] if mask else []), **attrs)
    outs = [("y", code, None)] + ([("z", TP.BOOL, None)] if mask else [])
    return make_model(node, [("x", code, ["a", "b"])], outs, inits, opset=opset)


@settings(max_examples=gpu_examples(), deadline=None)
@given(shape=st.tuples(st.integers(0, 5), st.integers(1, 9)), dtype=st.sampled_from(sorted(TYPES)),
       opset=st.sampled_from([10, 12, 13, 22]), ratio=st.sampled_from([None, 0.0, 0.3]),
       training=st.sampled_from([None, False, True]), mask=st.booleans(), seed=st.integers(0, 2**16))
def test_inference_form_matches_onnx_reference(best, shape, dtype, opset, ratio, training, mask, seed):
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import ExecutionError

    if dtype == "bfloat16" and opset < 13:
        return  # not in Dropout-12's T
    x = np.random.default_rng(seed).standard_normal(shape).astype(TYPES[dtype])
    model = _dropout(opset, TYPES[dtype], ratio, training, mask)
    random = opset >= 12 and bool(training) and ratio != 0.0
    with Session(model, device=best, allow_host_fallback=False) as s:
        if random:
            with pytest.raises(ExecutionError, match="Dropout.*noRandomMask"):
                s.run(None, {"x": x})
            return
        got = s.run(None, {"x": x})
    want = ref_run(model, {"x": x})
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert_same_bits(g, w)


def test_a_second_shape_compiles_nothing(best):
    model = _dropout(13, np.float16, 0.2, False, True)
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal(s).astype(np.float16)} for s in ((3, 5), (7, 9))]
    outs, compiled = runs_from_a_cold_cache(best, model, feeds)
    assert any("Dropout" in lab for lab in compiled[0]) and not [lab for lab in compiled[1] if "Dropout" in lab]
    for f, got in zip(feeds, outs):
        assert np.array_equal(got[0], f["x"]) and got[1].dtype == bool and got[1].all()

"""Unique on the GPU (templates/unique.kernel.json, unique.wgsl.jinja) in its padded form, its
data-dependent count read back as NonZero's is (backend_wgpu/data_dependent.py): Y, indices and counts
at capacity with one count, inverse_indices as written; what reads them runs as the region's session.

Oracle: onnx.reference (numpy.unique), bit for bit, for every output: element types (floats with NaN,
-0.0, +-inf: one NaN value without axis, a NaN row equal to no other with one), ranks 1-3, every axis
(negative too) or none, sorted 1 and 0 (first-occurrence order with more than one output, the sorted Y
with one, as the reference), each prefix of the outputs; onnxruntime on a model that rebuilds X from Y
and inverse_indices."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper

from support.gpu import (assert_first_run_alone_compiles, assert_node_cases_pass_or_declined, gpu_examples,
                         runs_from_a_cold_cache)
from support.models import make_model, vi
from support.oracles import assert_same_bits, onnxruntime_run, ref_run

#: element types the kernel takes, and the values drawn for them (few, so that values repeat)
VALUES = {
    "float32": (np.float32, [0.0, -0.0, 1.5, -2.0, np.nan, np.inf, -np.inf, 3.0]),
    "float16": (np.float16, [0.0, -0.0, 1.5, -2.0, np.nan, -np.inf, 6e-8]),
    "float64": (np.float64, [0.0, -0.0, 1.5, -2.0, np.nan, np.inf, 5e-324]),
    "int64": (np.int64, [0, 1, -1, 2**40, -(2**63), 2**63 - 1]),
    "uint64": (np.uint64, [0, 1, 2**32, 2**64 - 1]),
    "int32": (np.int32, [0, 1, -1, 2**31 - 1, -(2**31)]),
    "uint32": (np.uint32, [0, 1, 2**31, 2**32 - 1]),
    "int16": (np.int16, [0, 1, -1, -(2**15)]),
    "uint16": (np.uint16, [0, 1, 2**15, 2**16 - 1]),
    "int8": (np.int8, [0, 1, -1, -128, 127]),
    "uint8": (np.uint8, [0, 1, 128, 255]),
    "bool": (np.bool_, [False, True]),
}
OUTPUTS = ["y", "indices", "inverse_indices", "counts"]


def _model(dtype: str, rank: int, attrs: dict, outputs: int, opset: int = 11):
    code = helper.np_dtype_to_tensor_dtype(np.dtype(VALUES[dtype][0]))
    node = helper.make_node("Unique", ["x"], OUTPUTS[:outputs], **attrs)
    outs = [vi("y", code, None)] + [vi(o, TensorProto.INT64, None) for o in OUTPUTS[1:outputs]]
    return make_model([node], [vi("x", code, [f"d{k}" for k in range(rank)])], outs, opset=opset)


def _run(dev, model, feeds, **kw):
    from onnx_quant.backend_wgpu.session import Session

    with Session(model, device=dev, allow_host_fallback=False, **kw) as s:
        return s.run(None, feeds)


def _assert_reference(got, model, feeds, what):
    want = ref_run(model, feeds)
    assert len(got) == len(want)
    for g, w, name in zip(got, want, OUTPUTS):
        w = np.asarray(w)
        if name != "y":
            w = w.astype(np.int64)
        assert_same_bits(g, w, f"{what}: {name}")


def test_onnx_node_cases_pass_on_the_gpu(best):
    assert_node_cases_pass_or_declined(best, ("Unique",), {"test_unique_bfloat16_sorted_without_axis": "bfloat16"}, 6)


@settings(max_examples=gpu_examples(), deadline=None)
@given(dtype=st.sampled_from(sorted(VALUES)), shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
       axis=st.one_of(st.none(), st.integers(-3, 2)), ordered=st.sampled_from([0, 1]), outputs=st.integers(1, 4),
       seed=st.integers(0, 2**16), opset=st.sampled_from([11, 28]))
def test_matches_onnx_reference(best, dtype, shape, axis, ordered, outputs, seed, opset):
    np_type, pool = VALUES[dtype]
    rank = len(shape)
    if axis is not None and not -rank <= axis < rank:
        axis = None
    rng = np.random.default_rng(seed)
    x = np.array(rng.choice(np.array(pool, dtype=object), size=tuple(shape)), dtype=np_type).reshape(shape)
    if axis is not None and rank > 1 and rng.random() < 0.5:  # repeated rows along the axis
        x = np.take(x, rng.integers(0, shape[axis], shape[axis]), axis=axis)
    attrs = {"sorted": ordered} | ({} if axis is None else {"axis": axis})
    model = _model(dtype, rank, attrs, outputs, opset)
    feeds = {"x": x}
    reordered = ordered == 0 and outputs > 1
    if reordered and not (rank == 1 or (axis is not None and axis % rank == 0)):
        # onnx.reference takes the first occurrences along axis 0 whatever the axis: declined
        from onnx_quant.errors import ExecutionError

        with pytest.raises(ExecutionError, match="orderOk"):
            _run(best, model, feeds)
        return
    _assert_reference(_run(best, model, feeds), model, feeds, f"{dtype} {shape} {attrs} {outputs}")


def test_nan_and_signed_zero_as_numpy_unique_takes_them(best):
    """Without axis every NaN is one value (the first one's bits), -0.0 and 0.0 one value (the first
    one's sign); with an axis a row holding a NaN equals no other row, NaN rows sort last."""
    x = np.array([np.nan, 1, -0.0, 0.0, -np.nan, np.inf, -np.inf, 1, np.nan, 2], np.float32)
    model = _model("float32", 1, {}, 4)
    got = _run(best, model, {"x": x})
    _assert_reference(got, model, {"x": x}, "flat")
    assert got[0].shape == (6,) and np.signbit(got[0][1]) and got[3].tolist() == [1, 2, 2, 1, 1, 3]
    rows = np.array([[np.nan, 1], [0, 1], [np.nan, 1], [-0.0, 1], [np.nan, 0]], np.float32)
    model = _model("float32", 2, {"axis": 0}, 4)
    got = _run(best, model, {"x": rows})
    _assert_reference(got, model, {"x": rows}, "rows")
    assert got[1].tolist() == [1, 4, 0, 2] and got[3].tolist() == [2, 1, 1, 1]


def test_a_second_size_compiles_nothing(best):
    """Sizes are runtime uniforms: a second input size (and another count) from a cold cache compiles
    no pipeline of the kernel."""
    model = _model("int32", 2, {"axis": 1}, 4)
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.integers(0, 3, s).astype(np.int32)} for s in ([2, 5], [3, 9])]
    outs, compiled = runs_from_a_cold_cache(best, model, feeds)
    assert_first_run_alone_compiles(compiled, "Unique")
    for got, f in zip(outs, feeds):
        _assert_reference(got, model, f, "second size")


def test_what_reads_the_outputs_runs_on_the_gpu(best):
    """Gather(Y, inverse_indices) rebuilds X, Mul(counts) reads the counted outputs: the region's
    session runs them on the GPU for the count read back; onnxruntime's values."""
    from onnx_quant.backend_wgpu.session import Session

    nodes = [helper.make_node("Unique", ["x"], ["y", "", "inv", "c"], sorted=1),
             helper.make_node("Gather", ["y", "inv"], ["back"]),
             helper.make_node("Cast", ["c"], ["cf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["y", "cf"], ["weighted"])]
    model = make_model(nodes, [vi("x", TensorProto.FLOAT, ["N"])],
                       [vi("back", TensorProto.FLOAT, None), vi("weighted", TensorProto.FLOAT, None)], opset=17)
    x = np.array([3, 1, 3, 2, 1, 3], np.float32)
    with Session(model, device=best, allow_host_fallback=False) as s:
        got = s.run(None, {"x": x})
        placements = {e["op_type"]: e["placement"] for e in s.explain({"x": x.shape})}
    assert placements["Unique"] == "gpu"
    for g, w in zip(got, onnxruntime_run(model, {"x": x})):
        assert_same_bits(g, w)
    assert np.array_equal(got[0], x) and got[1].tolist() == [2.0, 2.0, 9.0]


def test_empty_input(best):
    model = _model("float32", 1, {}, 4)
    x = np.zeros((0,), np.float32)
    got = _run(best, model, {"x": x})
    assert [g.shape for g in got] == [(0,), (0,), (0,), (0,)]


def test_beyond_the_loop_limit_the_padded_form_runs_on_the_host(best):
    """More rows than MAX_LANE_ITERATIONS comparisons: the kernel declines the plan, the padded form
    runs on the host (onnx.reference's Unique written at capacity) and the values are the same."""
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import ExecutionError

    model = _model("int32", 1, {}, 4)
    x = np.random.default_rng(2).integers(0, 50, 40).astype(np.int32)
    tunables = {"Unique": {"MAX_LANE_ITERATIONS": 16}}
    with pytest.raises(ExecutionError, match="rowsFit"):
        _run(best, model, {"x": x}, tunables=tunables)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Session(model, device=best, tunables=tunables) as s:
            got = s.run(None, {"x": x})
    _assert_reference(got, model, {"x": x}, "on the host")


def test_sorted_0_with_only_empty_optional_outputs_is_declined(best):
    """onnx.reference reorders Y by first occurrence when the node names more than one output, even
    empty ones; the kernel sees which are present: such a node runs on the host."""
    from onnx_quant.errors import ExecutionError

    node = helper.make_node("Unique", ["x"], ["y", ""], sorted=0)
    model = make_model([node], [vi("x", TensorProto.FLOAT, [4])], [vi("y", TensorProto.FLOAT, None)], opset=11)
    with pytest.raises(ExecutionError, match="empty optional outputs"):
        _run(best, model, {"x": np.float32([3, 1, 3, 2])})

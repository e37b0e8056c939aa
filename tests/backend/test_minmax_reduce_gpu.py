"""Min, Max, Round, ReduceMin, ReduceMax on the GPU — the ops ONNX's expanded
DynamicQuantizeLinear cases are made of — bit for bit against onnx.reference and numpy."""

from __future__ import annotations

import numpy as np
import pytest

from support.arrays import data
from support.models import node_model
from support.oracles import assert_same_bits, ref_run
from support.run import run_all_variants, run_node


@pytest.mark.parametrize("op", ["Min", "Max"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("shapes", [((5,), (5,)), ((2, 3, 4), (4,)), ((3, 1), (1, 4)), ((), (3,))])
def test_binary_min_max_with_broadcasting(best, op, dtype, shapes):
    a, b = data(shapes[0], dtype, seed=1), data(shapes[1], dtype, seed=2)
    model = node_model(op, [("a", a), ("b", b)], ["c"], opset=13)
    (got,), _ = run_all_variants(best, model, {"a": a, "b": b})
    expected = np.minimum(a, b) if op == "Min" else np.maximum(a, b)
    assert_same_bits(got, expected.astype(dtype), op)
    assert_same_bits(got, ref_run(model, {"a": a, "b": b})[0], f"{op} vs onnx.reference")


@pytest.mark.parametrize("op", ["Min", "Max"])
def test_min_max_propagate_nan_from_either_side(best, op):
    a = np.array([np.nan, 1.0, -2.0, np.nan, np.inf, -0.0], np.float32)
    b = np.array([1.0, np.nan, -3.0, np.nan, 5.0, 0.0], np.float32)
    model = node_model(op, [("a", a), ("b", b)], ["c"], opset=13)
    (got,), _ = run_node(best, model, {"a": a, "b": b})
    expected = np.minimum(a, b) if op == "Min" else np.maximum(a, b)
    assert np.array_equal(np.isnan(got), np.isnan(expected))
    finite = ~np.isnan(expected)
    assert np.array_equal(got[finite], expected[finite])


def test_round_is_half_to_even(best):
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4999998, 2.5000002, np.inf, -np.inf, np.nan, 1e30, -0.0],
                 np.float32)
    model = node_model("Round", [("x", x)], ["y"], opset=11)
    (got,), _ = run_all_variants(best, model, {"x": x})
    assert_same_bits(got, np.round(x), "Round")
    assert_same_bits(got, ref_run(model, {"x": x})[0], "Round vs onnx.reference")


@pytest.mark.parametrize("op", ["ReduceMin", "ReduceMax"])
@pytest.mark.parametrize("axes,keepdims", [(None, 0), (None, 1), ([1], 1), ([0, 2], 0), ([-1], 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_reduce_min_max(best, op, axes, keepdims, dtype):
    x = data((3, 70, 5), dtype, seed=3)  # 70: more reduced elements than lanes on axis 1
    attrs = {"keepdims": keepdims, **({"axes": axes} if axes is not None else {})}
    model = node_model(op, [("x", x)], ["y"], attrs=attrs, opset=11)
    (got,), _ = run_node(best, model, {"x": x})
    fn = np.min if op == "ReduceMin" else np.max
    expected = fn(x, axis=None if axes is None else tuple(axes), keepdims=bool(keepdims))
    assert_same_bits(got, np.asarray(expected, dtype), op)
    assert_same_bits(got, ref_run(model, {"x": x})[0], f"{op} vs onnx.reference")


@pytest.mark.parametrize("op", ["ReduceMin", "ReduceMax"])
def test_reduce_lane_count_does_not_change_bits_and_nan_wins(best, op):
    x = data((4, 300), np.float32, seed=5)
    x[2, 177] = np.nan
    model = node_model(op, [("x", x)], ["y"], attrs={"axes": [1], "keepdims": 0}, opset=11)
    outs = [run_node(best, model, {"x": x}, tunables={"WORKGROUP_SIZE": w})[0][0] for w in (1, 8, 64, 256)]
    for o in outs[1:]:
        assert_same_bits(o, outs[0], f"{op}: lane counts")
    fn = np.min if op == "ReduceMin" else np.max
    expected = fn(x, axis=1)
    assert np.isnan(outs[0][2]) and np.isnan(expected[2])
    assert_same_bits(outs[0], expected, op)

"""The data-movement kernels (templates/data_movement.base.json and its families, one template
data-movement.wgsl.jinja) on the GPU with no host fallback, bit for bit:

- Gather, GatherElements, GatherND (batch_dims), Slice (attributes and inputs: negative starts,
  ends and steps, clamping), Split (attribute, input, num_outputs), Expand, Tile, Pad (constant,
  reflect, edge, wrap; pads / axes / constant_value inputs; attributes), ScatterElements and
  ScatterND (reduction none / add / mul / max / min), over element types of every device width
  (float32, float16, int8, uint8, bool, int64, uint64, float64; int4 and int2 where Pad allows
  them) against onnx.reference (and onnxruntime / numpy where the reference cannot say);
- indices ONNX calls an error raise IndexRangeError on the device: tests/backend/test_index_checks_gpu.py;
- what they decline (a reduction over a type without device arithmetic) goes to the host by name;
- ONNX's node cases of these ops pass on the GPU (DECLINED names any that do not, with why).
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from onnx import helper, numpy_helper
from support.gpu import assert_node_cases_pass_or_declined
from support.oracles import ref_run as reference



def assert_bits(got, expected, what=""):
    """Same dtype, shape and raw bits (NaN payloads included)."""
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype, (what, got.dtype, expected.dtype)
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    raw = f"u{got.dtype.itemsize}"
    g, e = np.ascontiguousarray(got).view(raw), np.ascontiguousarray(expected).view(raw)
    if not np.array_equal(g, e):
        bad = np.argwhere(g != e)[:6]
        raise AssertionError(f"{what}: {int((g != e).sum())} of {g.size} differ, first at {bad.tolist()}: "
                             f"got {[hex(g[tuple(i)]) for i in bad]}, expected {[hex(e[tuple(i)]) for i in bad]}")

OPS = ("Slice", "Split", "Gather", "GatherElements", "GatherND", "Expand", "Tile", "Pad", "ScatterElements",
       "ScatterND", "Scatter")

#: node cases of these ops that stay off the GPU, and the words of the reason (none today)
DECLINED: dict[str, str] = {}

#: one type of each device width and kind: 32-bit float, 16, 8 (signed, unsigned, bool), 64 (two lanes)
TYPES = [np.float32, np.float16, np.int8, np.uint8, np.bool_, np.int64, np.uint64, np.float64]


def values(shape, dtype, seed=0):
    r = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return r.integers(0, 2, shape).astype(bool)
    if dtype.kind == "f":
        return (r.standard_normal(shape) * 100).astype(dtype)
    if dtype in (np.int64, np.uint64):  # both words matter
        return r.integers(-2**62, 2**62, shape).astype(dtype)
    info = np.iinfo(dtype)
    return r.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def model_of(op, inputs, n_out=1, *, attrs=None, opset=18, consts=()):
    """A one-node model; inputs named in ``consts`` are initializers (plan-time values)."""
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
           for n, a in inputs if a is not None and n not in consts]
    node = helper.make_node(op, [n if a is not None else "" for n, a in inputs], [f"y{i}" for i in range(n_out)],
                            **(attrs or {}))
    out_type = helper.np_dtype_to_tensor_dtype(inputs[0][1].dtype)  # every op here outputs its data's type
    outs = [helper.make_tensor_value_info(f"y{i}", out_type, None) for i in range(n_out)]
    inits = [numpy_helper.from_array(a, n) for n, a in inputs if a is not None and n in consts]
    graph = helper.make_graph([node], "g", vis, outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def feeds_of(inputs, consts=()):
    return {n: a for n, a in inputs if a is not None and n not in consts}


def on_gpu(dev, model, feeds):
    """Outputs of a Session that must run every node on the GPU."""
    from onnx_quant.backend_wgpu.session import Session

    with Session(model, device=dev, allow_host_fallback=False) as s:
        assert s.host_nodes == []
        return s.run(None, feeds)


def check(dev, op, inputs, n_out=1, *, attrs=None, opset=18, consts=(), expected=None):
    model = model_of(op, inputs, n_out, attrs=attrs, opset=opset, consts=consts)
    feeds = feeds_of(inputs, consts)
    got = on_gpu(dev, model, feeds)
    want = reference(model, feeds) if expected is None else expected
    assert len(got) == len(want)
    for i, (g, e) in enumerate(zip(got, want)):
        assert_bits(g, np.asarray(e), f"{op} {attrs} output {i} ({np.asarray(e).dtype})")
    return got


def I64(*v):
    return np.array(v, np.int64)


# ------------------------------------------------------------------------------------------ gathers

@pytest.mark.parametrize("dtype", TYPES)
def test_gather_any_axis_negative_indices_both_index_types(best, dtype):
    x = values((3, 4, 5), dtype)
    for itype in (np.int32, np.int64):
        for axis, idx in ((0, [[0, -1], [2, 1]]), (1, [3, -4, 0]), (-1, [[-5, 4, 2]]), (2, -2)):
            check(best, "Gather", [("x", x), ("i", np.array(idx, itype))], attrs={"axis": axis}, opset=13)


@pytest.mark.parametrize("dtype", TYPES)
def test_gather_elements_and_gather_nd(best, dtype):
    x = values((3, 4, 5), dtype, seed=1)
    r = np.random.default_rng(2)
    check(best, "GatherElements", [("x", x), ("i", r.integers(-3, 3, (2, 4, 5)))], attrs={"axis": 0})
    i = r.integers(-5, 5, (3, 4, 7)).astype(np.int32)  # onnx.reference mishandles a negative axis: numpy
    check(best, "GatherElements", [("x", x), ("i", i)], attrs={"axis": -1},
          expected=[np.take_along_axis(x, np.where(i < 0, i + 5, i), axis=-1)])
    check(best, "GatherND", [("x", x), ("i", I64([1, -2], [0, 3]))])          # rows of data[:2]
    check(best, "GatherND", [("x", x), ("i", I64([[1, -2, 4]], [[0, 3, 0]]))])  # single elements
    check(best, "GatherND", [("x", x), ("i", I64([[1], [-2]], [[0], [3]], [[3], [3]]))], attrs={"batch_dims": 1})
    check(best, "GatherND", [("x", x), ("i", I64([[2, 0]], [[1, -1]], [[0, 0]]))], attrs={"batch_dims": 1},
          opset=12)


# ------------------------------------------------------------------------------------------ slices

@pytest.mark.parametrize("dtype", TYPES)
def test_slice_attributes_and_inputs_clamp_as_onnx_defines(best, dtype):
    x = values((3, 4, 5), dtype, seed=3)
    check(best, "Slice", [("x", x)], attrs={"starts": [1, -1, 0], "ends": [100, -5, -1], "axes": [0, 2, 1]}, opset=9)
    check(best, "Slice", [("x", x)], attrs={"starts": [-100, 2], "ends": [2, 2**62]}, opset=1)
    cases = [
        (I64(1, -1, 0), I64(2**62, -5, -1), I64(0, 2, 1), None),       # clamped ends, negative start
        (I64(-1, 4), I64(-100, 0), I64(-1, 1), I64(-2, -1)),            # negative steps, negative axes
        (I64(10), I64(20), I64(1), None),                               # start past the end: empty
        (I64(0, 0, 4), I64(-1, 4, -2**62), None, I64(2, 3, -3)),        # default axes, steps > 1 / < -1
    ]
    for starts, ends, axes, steps in cases:
        check(best, "Slice", [("x", x), ("s", starts), ("e", ends), ("a", axes), ("t", steps)], consts=("s", "e", "a", "t"))
    check(best, "Slice", [("x", x), ("s", np.array([1, 1], np.int32)), ("e", np.array([3, 4], np.int32))],
          consts=("s", "e"), opset=10)


@pytest.mark.parametrize("dtype", TYPES)
def test_split_attribute_input_and_num_outputs(best, dtype):
    x = values((3, 6, 5), dtype, seed=4)
    check(best, "Split", [("x", x)], 3, attrs={"axis": 2, "split": [1, 3, 1]}, opset=11)
    check(best, "Split", [("x", x)], 2, attrs={"axis": -2}, opset=11)
    check(best, "Split", [("x", x), ("s", I64(2, 0, 4))], 3, attrs={"axis": 1}, consts=("s",), opset=13)
    check(best, "Split", [("x", x)], 4, attrs={"axis": 1, "num_outputs": 4}, opset=18)  # uneven: 2, 2, 2, 0


@pytest.mark.parametrize("dtype", TYPES)
def test_expand_and_tile(best, dtype):
    x = values((3, 1, 5), dtype, seed=5)
    check(best, "Expand", [("x", x), ("s", I64(2, 1, 4, 1))], consts=("s",))
    check(best, "Expand", [("x", x[0, 0]), ("s", I64(3, 1))], consts=("s",), opset=8)
    check(best, "Tile", [("x", x), ("r", I64(2, 3, 1))], consts=("r",))
    check(best, "Tile", [("x", x), ("r", I64(1, 1, 0))], consts=("r",))  # an empty output


# ------------------------------------------------------------------------------------------ pads

@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_modes_axes_and_constant_value(dev, dtype, mode):
    best = dev  # OpenGL too: its % of a negative operand differs (the maps keep operands >= 0)
    x = values((3, 4, 5), dtype, seed=6)
    cv = values((), dtype, seed=7)
    check(best, "Pad", [("x", x), ("p", I64(1, 0, 2, 0, 3, 1)), ("v", cv)], attrs={"mode": mode}, consts=("p",), opset=19)
    check(best, "Pad", [("x", x), ("p", I64(2, 3, 1, 2)), ("v", cv), ("a", I64(0, -1))], attrs={"mode": mode},
          consts=("p", "a"), opset=19)
    # pads beyond the axis: reflect / wrap go round again, as numpy
    pads = ((4, 7), (0, 0), (9, 2))
    want = np.pad(x, pads, mode=mode, **({"constant_values": cv} if mode == "constant" else {}))
    check(best, "Pad", [("x", x), ("p", I64(4, 0, 9, 7, 0, 2)), ("v", cv)], attrs={"mode": mode}, consts=("p",),
          opset=19, expected=[want])


def test_pad_without_constant_value_pads_zero_and_negative_pads_crop(best):
    x = values((4, 6), np.float16, seed=8)
    check(best, "Pad", [("x", x), ("p", I64(1, 2, 0, 1))], consts=("p",), opset=13)
    want = np.full((4, 3), 2.5, np.float16)
    want[1:] = x[:3, 2:5]  # begins [1, -2], ends [-1, -1]: negative pads crop (onnx.reference refuses them)
    inputs = [("x", x), ("p", I64(1, -2, -1, -1)), ("v", np.array(2.5, np.float16))]
    got = check(best, "Pad", inputs, consts=("p",), opset=13, expected=[want])
    import onnxruntime as ort

    sess = ort.InferenceSession(model_of("Pad", inputs, consts=("p",), opset=13).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    assert_bits(got[0], sess.run(None, feeds_of(inputs, ("p",)))[0], "Pad with negative pads vs onnxruntime")


def test_pad_attribute_form(best):
    x = values((3, 4), np.float64, seed=9)
    for mode in ("constant", "edge", "reflect"):
        check(best, "Pad", [("x", x)], attrs={"pads": [1, 2, 0, 3], "mode": mode, "value": -1.25}, opset=2)
    check(best, "Pad", [("x", x.astype(np.float32))], attrs={"pads": [0, 1, 1, 0]}, opset=10)


@pytest.mark.parametrize("dtype, opset", [(ml_dtypes.int4, 21), (ml_dtypes.uint4, 21), (ml_dtypes.int2, 25),
                                          (ml_dtypes.float8_e4m3fn, 21)])
def test_pad_packed_narrow_types(dev, dtype, opset):
    """4- and 2-bit elements packed 8 / 16 to a word; odd lengths straddle words."""
    best = dev
    r = np.random.default_rng(10)
    x = r.integers(0 if dtype in (ml_dtypes.uint4,) else -1, 2, (3, 7)).astype(dtype)
    cv = np.array(1, dtype)
    for mode, pads in (("constant", ((1, 2), (3, 5))), ("edge", ((0, 1), (2, 9))), ("reflect", ((2, 0), (1, 3)))):
        p = I64(pads[0][0], pads[1][0], pads[0][1], pads[1][1])
        want = np.pad(x, pads, mode=mode, **({"constant_values": cv} if mode == "constant" else {}))
        check(best, "Pad", [("x", x), ("p", p), ("v", cv)], attrs={"mode": mode}, consts=("p",), opset=opset,
              expected=[want])


# ------------------------------------------------------------------------------------------ scatters

@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int8, np.uint8])
@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_reductions_in_the_reference_order(best, dtype, reduction):
    r = np.random.default_rng(11)
    # small magnitudes: products stay finite (a GPU's NaN from inf * 0 need not have numpy's bits)
    x = (r.integers(-4, 5, (3, 4, 5)) * (0.75 if np.dtype(dtype).kind == "f" else 1)).astype(dtype)
    upd = (r.integers(-4, 5, (6, 4, 5)) * (1.25 if np.dtype(dtype).kind == "f" else 1)).astype(dtype)
    idx = r.integers(-3, 3, (6, 4, 5))  # many duplicates: the order of the steps decides float sums
    check(best, "ScatterElements", [("x", x), ("i", idx), ("u", upd)], attrs={"axis": 0, "reduction": reduction})
    idx_nd = I64([1, -2], [0, 3], [1, 2], [1, -2], [2, 0])  # a duplicate row
    check(best, "ScatterND", [("x", x), ("i", idx_nd), ("u", upd.reshape(-1, 5)[:5].copy())],
          attrs={"reduction": reduction})


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_scatter_max_min_follow_the_reference_on_nan_and_zeros(dev, dtype):
    """ScatterElements uses Python's max/min (a NaN update never wins), ScatterND numpy's
    maximum/minimum (NaN propagates, its payload kept; ±0 ties take the update for float32, the
    data for float16, as numpy's float16 loops compare with >=). On every adapter (OpenGL's
    compiler turns a compare-and-select into max())."""
    best = dev
    x = np.array([1.0, np.nan, 0.0, -0.0, 5.0], dtype)
    upd = np.array([np.nan, 2.0, -0.0, 0.0, 7.0], dtype)
    upd.view(f"u{upd.itemsize}")[0] |= 3  # a NaN with a payload
    idx = np.arange(5, dtype=np.int64)
    for red in ("max", "min"):
        check(best, "ScatterElements", [("x", x), ("i", idx), ("u", upd)], attrs={"reduction": red})
        check(best, "ScatterND", [("x", x), ("i", idx.reshape(5, 1)), ("u", upd)], attrs={"reduction": red})


@pytest.mark.parametrize("dtype", [np.bool_, np.int64, np.float64, np.uint16])
def test_scatter_without_reduction_moves_any_type(best, dtype):
    x = values((4, 3), dtype, seed=14)
    upd = values((2, 3), dtype, seed=15)
    check(best, "ScatterElements", [("x", x), ("i", I64([3, 0, -1], [1, 2, 0])), ("u", upd)], attrs={"axis": 0})
    check(best, "ScatterND", [("x", x), ("i", I64([2], [-4])), ("u", upd)])
    inputs = [("x", x), ("i", np.array([[2, 0, 1]], np.int32)), ("u", upd[:1])]
    as_elements = reference(model_of("ScatterElements", inputs, attrs={"axis": 1}, opset=11), feeds_of(inputs))
    check(best, "Scatter", inputs, attrs={"axis": 1}, opset=10, expected=as_elements)  # no reference of its own


def test_a_reduction_without_device_arithmetic_is_declined_to_the_host(best):
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import ExecutionError

    x, upd = values((4,), np.int64), values((2,), np.int64, seed=1)
    model = model_of("ScatterElements", [("x", x), ("i", I64(1, 1)), ("u", upd)], attrs={"reduction": "add"})
    feeds = {"x": x, "i": I64(1, 1), "u": upd}
    with pytest.raises(ExecutionError, match="no variant applies.*accepts"):
        Session(model, device=best, allow_host_fallback=False).run(None, feeds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Session(model, device=best) as s:
            got = s.run(None, feeds)
            assert s.host_nodes and "ScatterElements" in s.host_nodes[0]
    assert_bits(got[0], reference(model, feeds)[0], "host ScatterElements")


def test_pad_declines_extending_an_empty_input_except_with_a_constant(best):
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import ExecutionError

    x = np.zeros((0, 3), np.float32)
    check(best, "Pad", [("x", x), ("p", I64(1, 0, 2, 1))], consts=("p",), opset=13)  # constant: fine
    model = model_of("Pad", [("x", x), ("p", I64(1, 0, 2, 1))], attrs={"mode": "edge"}, consts=("p",), opset=13)
    with pytest.raises(ExecutionError, match="no variant applies.*accepts"):
        Session(model, device=best, allow_host_fallback=False).run(None, {"x": x})


def test_many_workgroups_and_odd_word_counts(best):
    """Outputs of several workgroups, and lengths that leave a partial last word."""
    x = values((301, 257), np.int8, seed=16)
    check(best, "Slice", [("x", x), ("s", I64(-1, 1)), ("e", I64(-2**62, 256)), ("a", None), ("t", I64(-1, 1))],
          consts=("s", "e", "t"), opset=13)
    check(best, "Gather", [("x", x), ("i", np.arange(256, -1, -3, dtype=np.int64))], attrs={"axis": 1})


# ------------------------------------------------------------------------------------------ ONNX's cases

def test_onnx_node_cases_pass_on_the_gpu_or_are_declined_by_name(best):
    assert_node_cases_pass_or_declined(best, OPS, DECLINED, 60)

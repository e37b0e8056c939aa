"""Shape-polymorphic data movement (issue #11): Resize (tables as plan-time data), Split, Slice,
Concat, QLinearConcat, BatchNormalization and ConstantOfShape compile their pipelines once: from a cold pipeline cache,
a model planned at one shape and run at a second batch size and a new spatial size compiles
nothing the second time, and both outputs agree with onnx.reference (bit for bit for the
data movement and integer outputs). Plus the two plan-time helpers the kernels rely on: the
division magic numbers (divMagic) and the Slice map (sliceMap)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from support.models import make_model as _model

F32 = np.float32


pytestmark = pytest.mark.devices("best")  # dev: the default adapter only (conftest's default adds OpenGL)


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _data(rng, shape, dtype):
    if np.issubdtype(dtype, np.integer):  # int64 within 2^50: onnx.reference's Resize goes through float64
        info = np.iinfo(dtype)
        lo, hi = max(int(info.min), -2 ** 50), min(int(info.max), 2 ** 50)
        return rng.integers(lo, hi, shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


#: input shapes: the first, a second batch size, a new spatial size (the last two must compile nothing)
SHAPES = [(1, 3, 5, 7), (2, 3, 5, 7), (2, 3, 9, 6)]


def _cases():
    """(name, kernels that must compile nothing at the later shapes, model, input dtype, exact[,
    shapes])"""
    out = []
    sym = ["N", 3, "H", "W"]
    for dt, tp in ((np.float32, TP.FLOAT), (np.uint8, TP.UINT8), (np.int64, TP.INT64)):
        out.append((f"Resize nearest {np.dtype(dt).name}", {"Resize"},
                    _model([helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest",
                                             coordinate_transformation_mode="asymmetric", nearest_mode="floor")],
                           [_vi("x", tp, sym)], [_vi("y", tp, None)], [_const("s", np.array([1, 1, 2, 2], F32))]),
                    dt, True, SHAPES, "word_per_invocation"))
    out.append(("Resize linear half_pixel", {"Resize"},
                _model([helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear")],
                       [_vi("x", TP.FLOAT, sym)], [_vi("y", TP.FLOAT, None)],
                       [_const("s", np.array([1, 1, 1.5, 0.5], F32))]), np.float32, False))
    for mode in ("nearest", "linear"):  # output rows of a workgroup or more: the rows variant
        out.append((f"Resize rows {mode}", {"Resize"},
                    _model([helper.make_node("Resize", ["x", "", "s"], ["y"], mode=mode)],
                           [_vi("x", TP.FLOAT, sym)], [_vi("y", TP.FLOAT, None)],
                           [_const("s", np.array([1, 1, 2, 2], F32))]), np.float32, mode == "nearest",
                    [(1, 2, 3, 130), (2, 2, 3, 130), (2, 2, 4, 129)], "rows"))
    out.append(("Resize cubic tf_crop_and_resize", {"Resize"},
                _model([helper.make_node("Resize", ["x", "roi", "s"], ["y"], mode="cubic",
                                         coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=2.5)],
                       [_vi("x", TP.FLOAT, sym)], [_vi("y", TP.FLOAT, None)],
                       [_const("roi", np.array([0, 0, -0.2, 0.1, 1, 1, 1.1, 0.8], F32)),
                        _const("s", np.array([1, 1, 2, 1.5], F32))]), np.float32, False))
    # sizes computed in the graph (torch.onnx / YOLO): Shape -> Slice -> Mul -> Concat -> Resize
    shape_nodes = [helper.make_node("Shape", ["x"], ["shp"]),
                   helper.make_node("Slice", ["shp", "z", "two"], ["nc"]),
                   helper.make_node("Slice", ["shp", "two", "four"], ["hw"]),
                   helper.make_node("Mul", ["hw", "two"], ["hw2"]),
                   helper.make_node("Concat", ["nc", "hw2"], ["sizes"], axis=0),
                   helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest")]
    out.append(("Resize sizes from Shape", {"Resize"},
                _model(shape_nodes, [_vi("x", TP.INT8, sym)], [_vi("y", TP.INT8, None)],
                       [_const("z", np.array([0], np.int64)), _const("two", np.array([2], np.int64)),
                        _const("four", np.array([4], np.int64))]), np.int8, True))
    for dt, tp in ((np.int64, TP.INT64), (np.uint8, TP.UINT8), (np.float16, TP.FLOAT16)):
        out.append((f"Split axis 1 {np.dtype(dt).name}", {"Split"},
                    _model([helper.make_node("Split", ["x", "sp"], ["a", "b"], axis=1)],
                           [_vi("x", tp, sym)], [_vi("a", tp, None), _vi("b", tp, None)],
                           [_const("sp", np.array([1, 2], np.int64))]), dt, True))
    for dt, tp in ((np.float32, TP.FLOAT), (np.int64, TP.INT64)):  # runs of a workgroup or more: rows
        out.append((f"Split rows {np.dtype(dt).name}", {"Split"},
                    _model([helper.make_node("Split", ["x", "sp"], ["a", "b", "c"], axis=1)],
                           [_vi("x", tp, ["N", 4, "H", "W"])], [_vi(n, tp, None) for n in "abc"],
                           [_const("sp", np.array([1, 2, 1], np.int64))]),
                    dt, True, [(1, 4, 16, 20), (2, 4, 16, 20), (2, 4, 18, 17)], "rows"))
    out.append(("Split axis -2 in three", {"Split"},
                _model([helper.make_node("Split", ["x"], ["a", "b", "c"], axis=-2, num_outputs=3)],
                       [_vi("x", TP.FLOAT, ["N", 3, 12, "W"])], [_vi(n, TP.FLOAT, None) for n in "abc"],
                       opset=18), np.float32, True, [(n, 3, 12, w) for n, _, _, w in SHAPES]))
    out.append(("Slice negative step int16", {"Slice"},
                _model([helper.make_node("Slice", ["x", "st", "en", "ax", "stp"], ["y"])],
                       [_vi("x", TP.INT16, sym)], [_vi("y", TP.INT16, None)],
                       [_const("st", np.array([-1, 1], np.int64)), _const("en", np.array([-100, 100], np.int64)),
                        _const("ax", np.array([3, 2], np.int64)), _const("stp", np.array([-2, 1], np.int64))]),
                np.int16, True))
    # the end computed from the shape (x[..., :W - 1]), a start past the end on another axis
    out.append(("Slice end from Shape int64", {"Slice"},
                _model([helper.make_node("Shape", ["x"], ["shp"]),
                        helper.make_node("Slice", ["shp", "three", "four"], ["w"]),
                        helper.make_node("Sub", ["w", "one"], ["wend"]),
                        helper.make_node("Slice", ["x", "one", "wend", "three"], ["y"])],
                       [_vi("x", TP.INT64, sym)], [_vi("y", TP.INT64, None)],
                       [_const("one", np.array([1], np.int64)), _const("three", np.array([3], np.int64)),
                        _const("four", np.array([4], np.int64))]), np.int64, True))
    for dt, tp in ((np.float32, TP.FLOAT), (np.int64, TP.INT64), (np.uint8, TP.UINT8)):
        out.append((f"Concat axis 1 {np.dtype(dt).name}", {"Concat"},
                    _model([helper.make_node("Concat", ["x", "x2"], ["y"], axis=1)],
                           [_vi("x", tp, sym), _vi("x2", tp, ["N", 2, "H", "W"])], [_vi("y", tp, None)]),
                    dt, True))
    for dt, tp in ((np.float32, TP.FLOAT), (np.int64, TP.INT64)):  # 5 inputs, runs of a workgroup+: rows
        ins = [_vi("x", tp, ["N", 2, "H", "W"])] + [_vi(f"x{k}", tp, ["N", k % 2 + 1, "H", "W"]) for k in range(2, 6)]
        out.append((f"Concat rows {np.dtype(dt).name}", {"Concat"},
                    _model([helper.make_node("Concat", [i.name for i in ins], ["y"], axis=1)], ins, [_vi("y", tp, None)]),
                    dt, True, [(1, 2, 16, 20), (2, 2, 16, 20), (2, 2, 18, 17)], "rows"))
    out.append(("Concat spatial axis, three int8", {"Concat"},
                _model([helper.make_node("Concat", ["x", "x2", "x3"], ["y"], axis=-1)],
                       [_vi("x", TP.INT8, sym), _vi("x2", TP.INT8, ["N", 3, "H", 2]), _vi("x3", TP.INT8, sym)],
                       [_vi("y", TP.INT8, None)]), np.int8, True))
    # Expand to a shape computed from the input's (YOLO's grids): a broadcast [1, 3, 1, W] and a
    # leading axis added; int64 (two lanes) and float16
    for dt, tp in ((np.int64, TP.INT64), (np.float16, TP.FLOAT16)):
        out.append((f"Expand from Shape {np.dtype(dt).name}", {"Expand"},
                    _model([helper.make_node("Shape", ["x"], ["shp"]),
                            helper.make_node("Concat", ["two", "shp"], ["big"], axis=0),
                            helper.make_node("Slice", ["x", "z", "one", "hax"], ["row"]),
                            helper.make_node("Expand", ["row", "big"], ["y"])],
                           [_vi("x", tp, sym)], [_vi("y", tp, None)],
                           [_const("two", np.array([2], np.int64)), _const("z", np.array([0], np.int64)),
                            _const("one", np.array([1], np.int64)), _const("hax", np.array([2], np.int64))]),
                    dt, True))
    rng = np.random.default_rng(7)
    bn = [_const(n, v) for n, v in (("g", rng.uniform(0.5, 2, 3).astype(F32)), ("b", rng.normal(0, 1, 3).astype(F32)),
                                    ("m", rng.normal(0, 1, 3).astype(F32)), ("v", rng.uniform(0.5, 3, 3).astype(F32)))]
    for name, shapes, variant in (("BatchNormalization", SHAPES, "word_per_invocation"),
                                  ("BatchNormalization rows", [(1, 3, 16, 16), (2, 3, 16, 16), (2, 3, 17, 16)], "rows")):
        out.append((name, {"BatchNormalization"},
                    _model([helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"])],
                           [_vi("x", TP.FLOAT, sym)], [_vi("y", TP.FLOAT, None)], bn), np.float32, False, shapes,
                    variant))
    out.append(("ConstantOfShape of Shape", {"ConstantOfShape"},
                _model([helper.make_node("Shape", ["x"], ["shp"]),
                        helper.make_node("ConstantOfShape", ["shp"], ["c"],
                                         value=numpy_helper.from_array(np.array([-3], np.int64))),
                        helper.make_node("Add", ["c", "x"], ["y"])],
                       [_vi("x", TP.INT64, sym)], [_vi("y", TP.INT64, None)]), np.int64, True))
    return out


CASES = _cases()


def _check(name, got, want, exact):
    assert got.shape == want.shape and got.dtype == want.dtype, name
    if exact:
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), name  # the bits
    elif name.startswith("BatchNormalization"):  # float32 with a correctly rounded division: within 2^-21
        np.testing.assert_allclose(got, want, rtol=2.0 ** -21, atol=2.0 ** -21 * np.abs(want).max())
    else:  # a float32 sum of the taps against the reference's float64 one
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_second_batch_and_spatial_size_compile_nothing(dev, case):
    from onnx_quant.backend_wgpu.session import Session

    name, kernels, model, dtype, exact = case[:5]
    sess = Session(model, device=dev, allow_host_fallback=False)
    dev.pipelines.forget()  # a cold cache
    ref = ReferenceEvaluator(model)
    rng = np.random.default_rng(0)
    for i, shape in enumerate(case[5] if len(case) > 5 else SHAPES):
        feeds = {}
        for inp in model.graph.input:  # symbolic dims take the case's shape, fixed ones stay
            dims = inp.type.tensor_type.shape.dim
            feeds[inp.name] = _data(rng, tuple(d.dim_value or shape[k] for k, d in enumerate(dims)), dtype)
        before = set(dev.pipelines._pipelines)
        got = sess.run(None, feeds)
        new = [dev.pipelines._pipelines[k].label for k in set(dev.pipelines._pipelines) - before]
        mine = [lab for lab in new if lab.split("/")[-3] in kernels]
        if i == 0:
            assert mine, f"{name}: the first shape compiled none of {kernels}: {new}"
            if len(case) > 6:  # the variant the case is about
                assert all(lab.split("/")[-2] == case[6] for lab in mine), mine
        else:
            assert not mine, f"{name}: shape {shape} compiled {mine}"
            assert sess.last_run_stats["pipelines_compiled"] == 0, new
        for g, w in zip(got, ref.run(None, feeds)):
            _check(name, g, w, exact)


def test_resize_tables_are_plan_time_data_not_source(dev):
    """The tables reach the shader as a data buffer: two scales of one rank key alike (one
    pipeline), and the source holds no table."""
    from onnx_quant.backend_wgpu.device_info import DeviceInfo
    from onnx_quant.backend_wgpu.planner import plan_node
    from onnx_quant.backend_wgpu.render import pipeline_key, render
    from onnx_quant.backend_wgpu.session import _specs

    spec = _specs().find("", "Resize", 19)
    plans = [plan_node(spec, shapes={"x": (n, 2, h, 5), "scales": (4,), "y": (n, 2, 2 * h, 10)},
                       dtypes={"x": "float32", "scales": "float32", "y": "float32"}, device=DeviceInfo(),
                       attributes={"mode": "linear"}, values={"scales": np.array([1, 1, 2, 2], F32)})
             for n, h in ((1, 3), (4, 11))]
    assert [len(p.passes) for p in plans] == [1, 1]
    assert pipeline_key(plans[0].passes[0]) == pipeline_key(plans[1].passes[0])
    assert plans[0].buffers["tables"].data != plans[1].buffers["tables"].data
    assert "oq_dims.tapOffsets" in render(plans[1].passes[0])


def test_div_magic_divides_exactly_below_2_31():
    """divMagic's pairs with the shader's formula ((mulhi(n, m) + n) >> l in u32) against //,
    at the edges (n = 0, q d - 1, q d, 2^31 - 1) and at random, for small, power-of-two and large
    divisors."""
    from onnx_quant.backend_wgpu.expr import Env, evaluate

    rng = np.random.default_rng(1)
    ds = ([1, 2, 3, 5, 7, 12, 64, 65, 255, 4095, 4097, 2 ** 20 + 1, 2 ** 30, 2 ** 31 - 1]
          + rng.integers(1, 2 ** 31, 40).tolist())
    for d in ds:
        m, l = evaluate(f"divMagic({d})", Env())
        assert 0 <= m < 2 ** 32 and 0 <= l <= 31
        ns = np.concatenate([[0, 1, d - 1, d, d + 1, 2 ** 31 - 1], rng.integers(0, 2 ** 31, 2000),
                             np.arange(1, 50) * d - 1]).astype(np.uint64)
        ns = ns[ns < 2 ** 31]
        hi = (ns * np.uint64(m)) >> np.uint64(32)
        q = ((hi + ns) & np.uint64(0xFFFFFFFF)) >> np.uint64(l)
        assert np.array_equal(q, ns // np.uint64(d)), d
    assert evaluate("divMagic([0, 1, 6])", Env()) == ((0, 0), (1, 0), evaluate("divMagic(6)", Env()))


@pytest.mark.parametrize("shape,starts,ends,axes,steps", [
    ((4, 5, 6), (1,), (3,), (0,), ()),
    ((4, 5, 6), (-1, 0), (-100, 5), (2, 1), (-2, 2)),
    ((2, 3, 4, 5), (0, 1), (2, 3), (), ()),
    ((3, 4), (10,), (20,), (1,), ()),
    ((3, 4, 2), (2, -5), (-9, 9), (-3, 1), (-1, 1)),
])
def test_slice_map_walks_the_elements_numpy_slices(shape, starts, ends, axes, steps):
    from onnx_quant.backend_wgpu.index_math import slice_map

    offset, lens, ok, dims, strides = slice_map(shape, starts, ends, axes, steps)
    x = np.arange(int(np.prod(shape))).reshape(shape)
    idx = [slice(None)] * len(shape)
    for i, a in enumerate(axes or range(len(starts))):
        idx[a] = slice(starts[i], ends[i], steps[i] if steps else 1)
    want = x[tuple(idx)]
    assert ok and lens == want.shape and np.prod(dims) == want.size
    flat = np.zeros(want.size, np.int64)  # the affine map over the merged dims, in wrapping u32
    for e in range(want.size):
        rest, s = e, offset
        for d in range(len(dims) - 1, -1, -1):
            s += (rest % dims[d] if d else rest) * strides[d]
            rest //= dims[d] if d else 1
        flat[e] = s % 2 ** 32
    assert np.array_equal(flat, want.reshape(-1))


def test_slice_map_flags_malformed_parameters():
    from onnx_quant.backend_wgpu.index_math import slice_map

    assert not slice_map((4, 5), (0,), (2,), (2,), ())[2]       # axis out of range
    assert not slice_map((4, 5), (0,), (2,), (0,), (0,))[2]     # step 0
    assert not slice_map((4, 5), (0, 1), (2,), (), ())[2]       # lengths differ


def test_qlinear_concat_at_three_shapes_is_onnxruntime_bit_for_bit(dev):
    """QLinearConcat (the per-input passes requantize) along the channels and along the width:
    the later shapes compile nothing, every output onnxruntime's bits."""
    from onnx_quant.backend_wgpu.session import Session
    from support.oracles import onnxruntime_run

    rng = np.random.default_rng(5)
    inits = [_const(n, np.array(v, dt)) for n, v, dt in
             [("ys", 0.05, F32), ("yz", 128, np.uint8), ("as", 0.04, F32), ("az", 120, np.uint8),
              ("bs", 0.07, F32), ("bz", 131, np.uint8)]]
    for axis in (1, 3):
        node = helper.make_node("QLinearConcat", ["ys", "yz", "a", "as", "az", "b", "bs", "bz"], ["y"], axis=axis,
                                domain="com.microsoft")
        graph = helper.make_graph([node], "g", [_vi("a", TP.UINT8, ["N", 3, "H", "W"]), _vi("b", TP.UINT8, ["N", 3, "H", "W"])],
                                  [_vi("y", TP.UINT8, None)], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        sess = Session(model, device=dev, allow_host_fallback=False)
        dev.pipelines.forget()
        for i, shape in enumerate(SHAPES):
            feeds = {n: rng.integers(0, 256, shape, dtype=np.uint8) for n in "ab"}
            got = sess.run(None, feeds)[0]
            assert (sess.last_run_stats["pipelines_compiled"] > 0) == (i == 0), (axis, shape)
            assert np.array_equal(got, onnxruntime_run(model, feeds)[0]), (axis, shape)

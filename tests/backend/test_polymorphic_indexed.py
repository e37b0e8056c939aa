"""GatherElements, ScatterElements, ScatterND, Pad, Tile, the reduce family's chunked variant, Einsum
and Attention take their sizes as runtime uniforms (issue #23; backend_wgpu/uniforms.py): each model
runs at a first shape, then a second batch size, then a new length / image size, in one Session from
a cold pipeline cache. The later runs compile none of the kernel's pipelines, and every output
agrees with its oracle: onnx.reference (onnxruntime for negative pads, numpy for the reductions and
Einsum) bit for bit for integers and data movement, float sums within their rounding bounds,
Attention within ONNX's rule. The device-side index checks still flag an index out of range at a
shape that compiled nothing. Plus the plan-time maps the data-movement kernels read (padMap,
tileMap, einsumMap) against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP, helper

from support.gpu import assert_first_run_alone_compiles, runs_from_a_cold_cache
from support.models import make_model, vi
from support.oracles import assert_agree, onnxruntime_run, ref_run

F32 = np.float32

pytestmark = pytest.mark.devices("best")  # dev: the default adapter only (conftest's default adds OpenGL)


def _assert_exact(got, want):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        assert np.ascontiguousarray(g).tobytes() == np.ascontiguousarray(w).tobytes()


def _compiles_once(dev, model, feeds_list, kernel, **kw):
    """The outputs of ``model`` at each of ``feeds_list`` (one Session, a cold cache); only the first
    run compiled ``kernel``'s pipelines."""
    outs, compiled = runs_from_a_cold_cache(dev, model, feeds_list, kernel=kernel if kw.get("variant") else None, **kw)
    assert_first_run_alone_compiles(compiled, kernel)
    return outs


# ----------------------------------------------------------------------------- data movement

#: (batch, length) of the three runs: the first, a second batch size, a new length
SIZES = [(1, 7), (3, 7), (2, 12)]


def _ints(rng, shape, lo, hi, dtype=np.int64):
    return rng.integers(lo, hi, shape).astype(dtype)


def _data_cases():
    """(name, kernel, model, feeds per run (rng, n, length) -> dict, oracle)"""
    out = []
    for dt, tp in ((np.float32, TP.FLOAT), (np.int64, TP.INT64), (np.uint8, TP.UINT8)):
        model = make_model([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)],
                           [vi("x", tp, ["N", 5, "L"]), vi("i", TP.INT64, ["N", 3, "L"])], [vi("y", tp, None)], opset=13)
        out.append((f"GatherElements {np.dtype(dt).name}", "GatherElements", model,
                    lambda rng, n, w, dt=dt: {"x": _ints(rng, (n, 5, w), 0, 200, dt), "i": _ints(rng, (n, 3, w), -5, 5)}))
    for reduction, dt, tp in (("none", np.float16, TP.FLOAT16), ("add", np.int32, TP.INT32), ("max", np.float32, TP.FLOAT)):
        model = make_model([helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=-1, reduction=reduction)],
                           [vi("x", tp, ["N", 4, "L"]), vi("i", TP.INT64, ["N", 4, 3]), vi("u", tp, ["N", 4, 3])],
                           [vi("y", tp, None)], opset=18)
        out.append((f"ScatterElements {reduction} {np.dtype(dt).name}", "ScatterElements", model,
                    lambda rng, n, w, dt=dt: {"x": (rng.standard_normal((n, 4, w)) * 50).astype(dt),
                                              "i": _ints(rng, (n, 4, 3), -w, w),
                                              "u": (rng.standard_normal((n, 4, 3)) * 50).astype(dt)}))
    for reduction, dt, tp in (("none", np.int64, TP.INT64), ("mul", np.int32, TP.INT32)):
        # index rows (n, c) into data [N, 5, L]: the row count and the block follow the batch and length
        model = make_model([helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)],
                           [vi("x", tp, ["N", 5, "L"]), vi("i", TP.INT64, ["Q", 2]), vi("u", tp, ["Q", "L"])],
                           [vi("y", tp, None)], opset=18)

        def nd_feeds(rng, n, w, dt=dt):
            q = 2 * n + 1  # duplicate rows: the reference's order decides
            return {"x": _ints(rng, (n, 5, w), -9, 9, dt),
                    "i": np.stack([_ints(rng, q, -n, n), _ints(rng, q, -5, 5)], axis=1),
                    "u": _ints(rng, (q, w), -9, 9, dt)}
        out.append((f"ScatterND {reduction} {np.dtype(dt).name}", "ScatterND", model, nd_feeds))
    for reps, dt, tp in (([2, 1, 3], np.int8, TP.INT8), ([1, 2, 1], np.float64, TP.DOUBLE)):
        model = make_model([helper.make_node("Tile", ["x", "r"], ["y"])], [vi("x", tp, ["N", 3, "L"])],
                           [vi("y", tp, None)], {"r": np.array(reps, np.int64)}, opset=13)
        out.append((f"Tile {reps} {np.dtype(dt).name}", "Tile", model,
                    lambda rng, n, w, dt=dt: {"x": _ints(rng, (n, 3, w), -100, 100, dt)}))
    wide = np.array([0, 1, 2, 3, 0, 2, 1, 4], np.int64)  # beyond a period (reflect's axis 1 of 2): the modulo (plan-time)
    fold = np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)  # within one: a fold; N, C unpadded: one axis
    for mode, opset, pads in (("constant", 18, wide), ("reflect", 18, wide), ("reflect", 18, fold), ("edge", 18, wide),
                              ("wrap", 19, fold), ("wrap", 19, np.array([0, 0, 0, 13, 0, 0, 0, 2], np.int64))):
        ins = ["x", "p", "v"] if mode == "constant" else ["x", "p"]
        model = make_model([helper.make_node("Pad", ins, ["y"], mode=mode)],
                           [vi("x", TP.FLOAT16, ["N", 2, 3, "L"])] + ([vi("v", TP.FLOAT16, [])] if mode == "constant" else []),
                           [vi("y", TP.FLOAT16, None)], {"p": pads}, opset=opset)
        out.append((f"Pad {mode} {pads.tolist()}", "Pad", model,
                    lambda rng, n, w, m=mode: {"x": rng.standard_normal((n, 2, 3, w)).astype(np.float16),
                                               **({"v": np.array(-2.5, np.float16)} if m == "constant" else {})}))
    return out


DATA_CASES = _data_cases()


@pytest.mark.parametrize("case", DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_data_movement_compiles_once_and_is_the_references_bits(dev, case):
    name, kernel, model, make = case
    rng = np.random.default_rng(len(name))
    feeds = [make(rng, n, w) for n, w in SIZES]
    outs = _compiles_once(dev, model, feeds, kernel)
    for got, f in zip(outs, feeds):
        _assert_exact(got, ref_run(model, f))


def test_pad_of_negative_and_computed_pads_compiles_once(dev):
    """Negative pads crop (onnxruntime's bits); pads that follow the width (to a multiple of 8, as
    window attention pads) are runtime values: a new width compiles nothing."""
    crop = make_model([helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect")], [vi("x", TP.INT32, ["N", 3, "L"])],
                      [vi("y", TP.INT32, None)], {"p": np.array([0, -1, 2, 0, 1, -3], np.int64)}, opset=18)
    rng = np.random.default_rng(1)
    feeds = [{"x": _ints(rng, (n, 3, w), -50, 50, np.int32)} for n, w in SIZES]
    for got, f in zip(_compiles_once(dev, crop, feeds, "Pad"), feeds):
        _assert_exact(got, onnxruntime_run(crop, f))
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=-1),
             helper.make_node("Sub", ["eight", "s"], ["d"]),
             helper.make_node("Mod", ["d", "eight"], ["e"]),
             helper.make_node("Concat", ["zeros", "e"], ["p"], axis=0),
             helper.make_node("Pad", ["x", "p"], ["y"])]
    to8 = make_model(nodes, [vi("x", TP.FLOAT, ["N", 2, "L"])], [vi("y", TP.FLOAT, None)],
                     {"eight": np.array([8], np.int64), "zeros": np.zeros(5, np.int64)}, opset=18)
    feeds = [{"x": rng.standard_normal((n, 2, w)).astype(F32)} for n, w in ((1, 5), (2, 5), (1, 11), (2, 3))]
    outs = _compiles_once(dev, to8, feeds, "Pad")
    for got, f in zip(outs, feeds):
        assert got[0].shape[-1] % 8 == 0
        _assert_exact(got, ref_run(to8, f))


@pytest.mark.parametrize("op", ["GatherElements", "ScatterND"])
def test_an_index_out_of_range_at_a_second_shape_is_still_flagged(dev, op):
    """The index check pass (indexChecks) reads its bounds at run time too: at a second batch size,
    compiling nothing, an index outside its axis raises IndexRangeError naming the node."""
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import IndexRangeError

    case = next(c for c in DATA_CASES if c[1] == op)
    _, _, model, make = case
    rng = np.random.default_rng(3)
    first, second = make(rng, 1, 7), make(rng, 3, 7)
    second["i"] = second["i"].copy()
    if op == "GatherElements":
        second["i"][-1, -1, -1] = 5  # the axis has 5
    else:
        second["i"][-1, 0] = 3  # the first axis has 3 (the batch)
    with Session(model, device=dev, allow_host_fallback=False) as s:
        s.device.pipelines.forget()
        _assert_exact(s.run(None, first), ref_run(model, first))
        before = set(s.device.pipelines._pipelines)
        with pytest.raises(IndexRangeError, match=op):
            s.run(None, second)
        assert set(s.device.pipelines._pipelines) == before


def _pad_map_walk(x, pads, axes, mode):
    """np.pad's result as the Pad shader computes it from padMap (merged axes, u32 begins, the
    one-fold and the modulo paths), -1 outside in constant mode."""
    from onnx_quant.backend_wgpu.index_math import pad_map

    ok, lens, outs, ins, begins, strides, padded, wide = pad_map(x.shape, pads, axes, mode)
    assert ok
    got = np.full(lens, -1)
    for e in range(got.size):
        s, inside = 0, True
        for c, n, b, st, pad in zip(np.unravel_index(e, outs), ins, begins, strides, padded):
            p = int(c)
            if pad:
                p = (p - b) % 2 ** 32
                p = p - 2 ** 32 if p >= 2 ** 31 else p
                if mode == "constant":
                    inside = inside and 0 <= p < n
                elif mode == "edge":
                    p = min(max(p, 0), n - 1)
                elif wide:
                    per = n if mode == "wrap" else max(2 * (n - 1), 1)
                    bb = max(b - 2 ** 32 if b >= 2 ** 31 else b, 0)
                    p = (p + per * -(-bb // per)) % per
                    p = per - p if mode == "reflect" and p >= n else p
                elif mode == "reflect":
                    p = abs(p)
                    p = 2 * (n - 1) - p if p >= n else p
                else:
                    p = p + n if p < 0 else p
                    p = p - n if p >= n else p
            s += p * st
        got.flat[e] = x.flat[s] if inside else -1
    return got, wide, len(outs)


@pytest.mark.parametrize("shape, pads, axes, mode, wide, map_rank", [
    ((3, 4), (1, 2, 2, 5), (), "reflect", True, 2),          # 5 past a period of 3: the modulo
    ((2, 3, 5, 6), (1, 2, 2, 1), (2, 3), "reflect", False, 3),  # N, C unpadded: one axis
    ((2, 5), (3, 7), (-1,), "wrap", True, 2),
    ((2, 3, 4), (0, 0, 4, 0, 0, 3), (), "wrap", False, 2),
    ((4, 3, 2), (1, 0, 2, 0), (0, 2), "edge", False, 2),  # axis 2 listed, not padded: merged with 1
    ((5,), (-2, 1), (), "constant", False, 1),
    ((2, 3, 4, 2), (0, 1, 0, 0, 0, 2, 0, 0), (), "constant", False, 3),  # an unpadded axis inside
])
def test_pad_map_walks_numpys_elements(shape, pads, axes, mode, wide, map_rank):
    """padMap (backend_wgpu/index_math.py) followed as the shader does gives numpy's np.pad
    (negative pads: np.pad of the positive part, then cropped); malformed pads are not ok."""
    x = np.arange(int(np.prod(shape))).reshape(shape)
    got, is_wide, rank = _pad_map_walk(x, pads, axes, mode)
    per_axis = [(0, 0)] * len(shape)
    for i, a in enumerate(axes or range(len(shape))):
        per_axis[a] = (pads[i], pads[i + len(pads) // 2])
    want = np.pad(x, [(max(b, 0), max(e, 0)) for b, e in per_axis], mode=mode,
                  **({"constant_values": -1} if mode == "constant" else {}))
    want = want[tuple(slice(-min(b, 0), want.shape[k] + min(e, 0)) for k, (b, e) in enumerate(per_axis))]
    assert np.array_equal(got, want) and (is_wide, rank) == (wide, map_rank)


def test_pad_and_tile_maps_decline_or_walk_numpys_elements():
    from onnx_quant.backend_wgpu.index_math import pad_map, tile_map

    assert not pad_map((3, 4), (1, 2, 3), (), "constant")[0]         # pads that do not fit the axes
    assert not pad_map((3, 4), (1, 1, 1, 1), (1, -1), "constant")[0]  # an axis twice
    assert not pad_map((3, 4), (0, -5, 0, 0), (), "constant")[0]      # a negative length
    rng = np.random.default_rng(2)
    for ins, reps, map_rank in [((2, 3), (2, 1), 2), ((1, 4, 2), (3, 1, 2), 4), ((3,), (1,), 1), ((2, 3, 4), (1, 1, 2), 3)]:
        x = rng.integers(0, 99, ins)
        want = np.tile(x, reps)
        ok, dims, strides, repeats = tile_map(ins, want.shape)
        got = [sum(c * st for c, st in zip(np.unravel_index(e, dims), strides)) for e in range(want.size)]
        assert ok and np.array_equal(x.reshape(-1)[got], want.reshape(-1)) and len(dims) == map_rank
        assert all(st == 0 for st, r in zip(strides, repeats) if r)
    assert not tile_map((2, 3), (3, 3))[0]


# ----------------------------------------------------------------------------- chunked reductions, Einsum, Attention

def test_chunked_reductions_compile_once(dev):
    """The chunked variant (rows of CHUNKED_MIN_ROW elements or more): its chunk count and
    workgroups are runtime values too. int32 ReduceSum wraps as numpy's does (bit for bit);
    ReduceLogSumExp (three passes: shift, partial, final) within the float32 summation bound."""
    rng = np.random.default_rng(4)
    sizes = [(1, 17000), (3, 17000), (2, 40000)]  # 5, 5, then 10 chunks per output
    for op, tp, make in (("ReduceSum", TP.INT32, lambda s: rng.integers(-2 ** 30, 2 ** 30, s).astype(np.int32)),
                         ("ReduceLogSumExp", TP.FLOAT, lambda s: (rng.standard_normal(s) * 3).astype(F32))):
        model = make_model([helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)], [vi("x", tp, ["N", "L"])],
                           [vi("y", tp, None)], {"axes": np.array([1], np.int64)}, opset=18)
        feeds = [{"x": make(s)} for s in sizes]
        outs = _compiles_once(dev, model, feeds, op, variant="chunked")
        for (got,), f in zip(outs, feeds):
            x = f["x"]
            if op == "ReduceSum":
                assert got.dtype == np.int32 and np.array_equal(got, x.sum(axis=1, dtype=np.int32))
            else:
                x64 = x.astype(np.float64)
                m = x64.max(axis=1, keepdims=True)
                want = np.log(np.exp(x64 - m).sum(axis=1)) + m[:, 0]
                assert got.dtype == F32 and np.all(np.abs(got - want) <= x.shape[1] * 2.0 ** -23 * (np.abs(want) + 1))


EINSUM_CASES = [  # (equation, symbolic shapes, run shapes, dtype)
    ("bhqd,bhkd->bhqk", [["B", 2, "S", 8], ["B", 2, "S", 8]], lambda b, s: [(b, 2, s, 8), (b, 2, s, 8)], np.float32),
    ("bij,bjk->bik", [["B", "S", 5], ["B", 5, 4]], lambda b, s: [(b, s, 5), (b, 5, 4)], np.int32),
    # broadcast ellipsis: x0's leading dim is 1 against x1's 5 at every batch, its batch B against none
    ("...ij,...jk->...ik", [["B", 1, "S", 4], [5, 4, 6]], lambda b, s: [(b, 1, s, 4), (5, 4, 6)], np.float32),
    ("ii->i", [["S", "S"]], lambda b, s: [(s, s)], np.int32),
]


@pytest.mark.parametrize("equation, sym, shapes, dtype", EINSUM_CASES, ids=[c[0] for c in EINSUM_CASES])
def test_einsum_compiles_once(dev, equation, sym, shapes, dtype):
    tp = TP.INT32 if dtype == np.int32 else TP.FLOAT
    names = [f"x{i}" for i in range(len(sym))]
    model = make_model([helper.make_node("Einsum", names, ["y"], equation=equation)],
                       [vi(n, tp, s) for n, s in zip(names, sym)], [vi("y", tp, None)], opset=12)
    rng = np.random.default_rng(5)
    feeds = [{n: (rng.integers(-50, 50, sh) if dtype == np.int32 else rng.standard_normal(sh)).astype(dtype)
              for n, sh in zip(names, shapes(b, s))} for b, s in ((1, 3), (2, 3), (1, 6))]
    outs = _compiles_once(dev, model, feeds, "Einsum")
    for (got,), f in zip(outs, feeds):
        arrays = [f[n] for n in names]
        if dtype == np.int32:
            assert got.dtype == np.int32 and np.array_equal(got, np.einsum(equation, *arrays))
        else:  # float32 sums against float64: within 8 ulp of the sum of |terms|
            want = np.einsum(equation, *[a.astype(np.float64) for a in arrays])
            bound = 8 * 2.0 ** -23 * np.einsum(equation, *[np.abs(a.astype(np.float64)) for a in arrays])
            assert got.shape == want.shape and np.all(np.abs(got - want) <= bound + 1e-30)


def _attention_model(past, mask):
    """3-D Q / K / V (4 query heads over 2 kv heads of 8), a causal node with a float mask [S, P + S]
    (a past cache) or a bool one [B, 1, S, S] (none), every output."""
    ins = [vi("Q", TP.FLOAT, ["B", "S", 32]), vi("K", TP.FLOAT, ["B", "S", 16]), vi("V", TP.FLOAT, ["B", "S", 16])]
    names = ["Q", "K", "V", "mask"]
    if mask == "float":
        ins.append(vi("mask", TP.FLOAT, ["S", "T"]))
    else:
        ins.append(vi("mask", TP.BOOL, ["B", 1, "S", "S"]))
    if past:
        ins += [vi("pk", TP.FLOAT, ["B", 2, "P", 8]), vi("pv", TP.FLOAT, ["B", 2, "P", 8])]
        names += ["pk", "pv"]
    outs = ["Y", "present_k", "present_v", "qk"] if past else ["Y", "", "", "qk"]
    node = helper.make_node("Attention", names, outs, is_causal=1, q_num_heads=4, kv_num_heads=2, qk_matmul_output_mode=2)
    return make_model([node], ins, [vi(o, TP.FLOAT, None) for o in outs if o], opset=23)


@pytest.mark.parametrize("variant", ["serial", "workgroup"])
@pytest.mark.parametrize("past, mask", [(True, "float"), (False, "bool")], ids=["past-float-mask", "bool-mask"])
def test_attention_compiles_once(dev, variant, past, mask):
    """The batch, the query and key counts, the past length and the mask's strides are runtime
    values: a second batch size and a longer sequence (and past) compile nothing, under each
    softmax variant; every output within ONNX's rule (rtol 1e-3, atol 1e-7) of onnx.reference."""
    model = _attention_model(past, mask)
    rng = np.random.default_rng(6)
    feeds = []
    for b, s, p in ((1, 4, 3), (2, 4, 3), (1, 7, 5)):
        f = {"Q": rng.standard_normal((b, s, 32)).astype(F32), "K": rng.standard_normal((b, s, 16)).astype(F32),
             "V": rng.standard_normal((b, s, 16)).astype(F32)}
        if past:
            f.update(pk=rng.standard_normal((b, 2, p, 8)).astype(F32), pv=rng.standard_normal((b, 2, p, 8)).astype(F32),
                     mask=rng.standard_normal((s, p + s)).astype(F32))
        else:
            f["mask"] = rng.random((b, 1, s, s)) < 0.8
        feeds.append(f)
    outs = _compiles_once(dev, model, feeds, "Attention", variant=variant)
    for got, f in zip(outs, feeds):
        for g, w in zip(got, ref_run(model, f)):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-7)


# ----------------------------------------------------------------------------- the zoo CNN at batch 8

def test_the_dynamic_cnn_at_batch_8_compiles_only_its_classifiers_row_tile(dev):
    """The zoo CNN in dynamic form, batch 1 then 8 (benchmarks/second_shape_compiles.py's batch 2
    compiled nothing; batch 8 compiled 3 pipelines): its first DynamicQuantizeConv turns from fused
    to two_pass there (workgroups x numel(x) pass FUSED_MAX_REDUCE_READS), whose passes were two
    pipelines of their own; the variants now share one (the pass's stage is a runtime uniform), so
    what compiles is DynamicQuantizeMatMul's row tile alone (2 -> 8 rows: a register tile, bucketed
    2 / 4 / ROW_TILE by row count). Both runs agree with onnxruntime."""
    import logging
    import warnings

    from onnx_quant import model_zoo

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        level = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)
        try:
            model = model_zoo.quantized("cnn", "dynamic", per_channel=True)
        finally:
            logging.getLogger().setLevel(level)
    feeds = [model_zoo.random_feeds(model, {"N": n, "H": 32, "W": 32}, seed=n) for n in (1, 8)]
    outs, compiled = runs_from_a_cold_cache(dev, model, feeds)
    from onnx_quant.backend_wgpu.session import Session

    with Session(model, device=dev) as s:
        variants = [[p.variant for p in s.plans({k: v.shape for k, v in f.items()}) if p.kernel == "DynamicQuantizeConv"]
                    for f in feeds]
    assert "two_pass" in variants[1] and "two_pass" not in variants[0], variants  # the switch happens
    assert {lab.split("/")[-3] for lab in compiled[1]} == {"DynamicQuantizeMatMul"}, compiled[1]
    for got, f in zip(outs, feeds):
        assert_agree(got, onnxruntime_run(model, f, level="ORT_DISABLE_ALL"), 1e-4)

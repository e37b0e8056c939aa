"""Float and data-movement kernels on the GPU: every variant, forced, against the CPU oracles.

Kernels (templates/*.kernel.json): Add, Sub, Mul, Div, Relu, LeakyRelu, Sigmoid, Clip (6, 11),
Cast, Identity, Reshape, Flatten, Squeeze / Unsqueeze (1, 13), Transpose, Concat, MatMul,
Gemm, Conv, MaxPool, AveragePool, GlobalAveragePool, Softmax (1/11 and 13).

Each test builds a one-node model, takes its shapes from ``inference.infer_values``, finds the
spec in the registry, plans it with the node's attributes and runs it with
``executor.run_plan``; every variant whose ``when`` can hold is forced (gating tunables set
to their extremes) and all of them must give the same bits.

Oracles and tolerances:
- integer outputs and pure data movement: bit for bit with onnxruntime / numpy;
- Add, Sub, Mul (single correctly rounded operations), Div (correctly rounded on the device,
  oq_div_rn), float16 (computed in f32, rounded once), Relu, LeakyRelu, Clip, Cast: bit for
  bit with onnxruntime (and numpy for Cast, including NaN and out-of-range inputs);
- Sigmoid and Softmax use WGSL's exp, which WGSL bounds by 3 + 2|x| ULP: compared per
  element within that bound (plus a few ULP for the division and the sum);
- MatMul, Gemm, Conv, AveragePool, GlobalAveragePool: the classical bound for a sum of n
  float32 products in any order, |computed - exact| <= n * 2^-24 * sum |terms| (both the
  device and the float64 reference lie within it).
Devices: the best adapter with WebGPU default limits; the numerics helpers also on OpenGL.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnx_quant.errors import ExecutionError, QuantError
from onnx_quant.reference_ops import fma_f32
from support.arrays import data, rng
from support.models import node_model
from support.oracles import assert_same_bits, assert_within_sum_bound, ort_run, ref_run
from support.run import RAN, module_fully_selected, node_spec, registry, run_all_variants, run_node

EPS = 2.0 ** -24


# ----------------------------------------------------------------------------- numerics helpers

def _run_helper(dev, body: str, inputs: list[np.ndarray], n_out: int) -> np.ndarray:
    """Run a WGSL body (the numerics, float_exact and qlinear snippets included) with u32
    inputs in0.. and output `out`; one invocation per output word (64 per workgroup)."""
    from onnx_quant.backend_wgpu.render import render_string

    n = len(inputs)
    decl = "\n".join(f"@group(0) @binding({i}) var<storage, read> in{i}: array<u32>;" for i in range(n))
    decl += f"\n@group(0) @binding({n}) var<storage, read_write> out: array<u32>;\n"
    src = render_string('{% include "snippets/numerics.wgsl.jinja" %}\n{% include "snippets/float_exact.wgsl.jinja" %}\n'
                        '{% include "snippets/qlinear.wgsl.jinja" %}\n' + decl + body)
    key = tuple([(i, "read-only-storage") for i in range(n)] + [(n, "storage")])
    compiled = dev.compile(src, key, label="float-kernel-helper-test")
    bufs = []
    for a in inputs:
        a = np.ascontiguousarray(a, dtype=np.uint32)
        b = dev.allocate(max(4, a.nbytes))
        dev.upload(b, a.view(np.uint8))
        bufs.append((b, max(4, a.nbytes)))
    ob = dev.allocate(4 * n_out)
    bufs.append((ob, 4 * n_out))
    bg = dev.bind(compiled, [(i, b, s) for i, (b, s) in enumerate(bufs)])
    groups = -(-n_out // 64)
    dev.launch([(compiled, bg, (min(groups, 65535), -(-groups // 65535), 1), "helper")])
    result = np.frombuffer(dev.download(ob), np.uint32)[:n_out].copy()
    for b, _ in bufs:
        b.destroy()
    return result


_ELEMENTWISE_MAIN = """
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let i = (wid.y * nwg.x + wid.x) * 64u + lid;
  if (i >= arrayLength(&out)) { return; }
  out[i] = EXPR;
}
"""


def helper_values(n: int, seed: int) -> np.ndarray:
    """float32 values over the whole range: normal, tiny, huge, subnormal, integers, zeros."""
    r = rng(seed)
    kind = r.integers(0, 6, n)
    v = r.standard_normal(n) * np.exp2(r.integers(-40, 40, n).astype(float))
    v = np.where(kind == 0, r.standard_normal(n) * 1e-40, v)
    v = np.where(kind == 1, np.round(r.standard_normal(n) * 300), v)
    v = np.where(kind == 2, r.standard_normal(n) * 1e30, v)
    v = np.where(kind == 3, 0.0, v)
    return v.astype(np.float32)


def test_fma_exact_matches_a_correctly_rounded_fma(dev):
    n = 40000
    a, b, c = helper_values(n, 1), helper_values(n, 2), helper_values(n, 3)
    r = rng(4)
    with np.errstate(all="ignore"):
        cancel = r.random(n) < 0.3          # exact and near cancellation
        c[cancel] = -(a[cancel].astype(np.float64) * b[cancel]).astype(np.float32)
        near = r.random(n) < 0.1
        c[near] = c[near] * np.float32(1 + 2**-23)
        special = r.random(n) < 0.02
        c[special] = r.choice(np.array([np.inf, -np.inf, np.nan], np.float32), special.sum())
        expected = fma_f32(a, b, c)
    got = _run_helper(dev, _ELEMENTWISE_MAIN.replace(
        "EXPR", "bitcast<u32>(oq_fma_exact(bitcast<f32>(in0[i]), bitcast<f32>(in1[i]), bitcast<f32>(in2[i])))"),
        [a.view(np.uint32), b.view(np.uint32), c.view(np.uint32)], n)
    assert_same_bits(got.view(np.float32), expected, "oq_fma_exact")


def test_half_conversions_are_exact(dev):
    halves = np.arange(65536, dtype=np.uint32)
    got = _run_helper(dev, _ELEMENTWISE_MAIN.replace("EXPR", "bitcast<u32>(oq_half_to_f32(in0[i]))"), [halves], 65536)
    assert_same_bits(got.view(np.float32), halves.astype(np.uint16).view(np.float16).astype(np.float32), "half -> f32")
    # f32 -> half: random values, every half and every midpoint between neighbouring halves
    finite = halves.astype(np.uint16).view(np.float16)
    finite = np.sort(finite[np.isfinite(finite)].astype(np.float64))
    mids = ((finite[1:] + finite[:-1]) / 2).astype(np.float32)
    vals = np.concatenate([helper_values(20000, 5), finite.astype(np.float32), mids,
                           np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf)),
                           np.array([65504, 65519.996, 65520, 1e6, np.inf, -np.inf, np.nan, 2**-25, 2**-24,
                                     3 * 2**-26, -0.0], np.float32)])
    got = _run_helper(dev, _ELEMENTWISE_MAIN.replace("EXPR", "oq_f32_to_half(bitcast<f32>(in0[i]))"),
                      [vals.view(np.uint32)], len(vals))
    with np.errstate(over="ignore"):
        expected = vals.astype(np.float16)
    assert_same_bits(got.astype(np.uint16).view(np.float16), expected, "f32 -> half")


def test_integer_conversions(dev):
    ints = np.concatenate([rng(6).integers(-2**31, 2**31, 20000), np.arange(-70000, 70000, 7),
                           [2**31 - 1, -2**31, 2**24 + 1, -(2**24 + 3), 16777217, 2**30 + 65]]).astype(np.int32)
    got = _run_helper(dev, _ELEMENTWISE_MAIN.replace("EXPR", "bitcast<u32>(oq_i32_to_f32_rn(bitcast<i32>(in0[i])))"),
                      [ints.view(np.uint32)], len(ints))
    assert_same_bits(got.view(np.float32), ints.astype(np.float32), "i32 -> f32")
    vals = np.concatenate([helper_values(20000, 7), np.array([2.5, -2.5, 0.5, -0.5, 1.5, 2147483520, -2147483648,
                                                              2147483648, np.nan, np.inf, -np.inf], np.float32)])
    for fn, ref in (("oq_f32_to_i32_x86_trunc", np.trunc), ("oq_f32_to_i32_x86_rne", np.rint)):
        got = _run_helper(dev, _ELEMENTWISE_MAIN.replace("EXPR", f"bitcast<u32>({fn}(bitcast<f32>(in0[i])))"),
                          [vals.view(np.uint32)], len(vals))
        with np.errstate(invalid="ignore"):
            r = ref(vals.astype(np.float64))
            expected = np.where(np.isfinite(r) & (np.abs(r) < 2**31), r, -2**31).astype(np.int32)
        assert_same_bits(got.view(np.int32), expected, fn)


# ----------------------------------------------------------------------------- elementwise

BINARY_SHAPES = [((3, 4), (4,)), ((2, 1, 5), (3, 1)), ((), (7,)), ((6,), (6,)), ((2, 3, 4, 5), (1, 3, 1, 5)),
                 ((17, 33), (17, 1)), ((0, 3), (3,))]
INT_TYPES = (np.int32, np.int8, np.uint8)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int8, np.uint8], ids=lambda t: np.dtype(t).name)
def test_binary_ops_bit_exact_with_onnxruntime(best, op, dtype):
    for k, (sa, sb) in enumerate(BINARY_SHAPES):
        a = data(sa, dtype, k)
        b = data(sb, dtype, k + 100)
        if op == "Div" and np.dtype(dtype).kind in "iu":
            b = np.where(b == 0, 3, b).astype(dtype)  # onnxruntime traps on integer division by zero
        if np.dtype(dtype).kind == "f":
            b.reshape(-1)[::5] = 0 if op == "Div" else b.reshape(-1)[::5]  # x / 0 and 0 / 0 included
        model = node_model(op, [("A", a), ("B", b)], ["C"], opset=14)
        (got,), variants = run_all_variants(best, model, {"A": a, "B": b})
        with np.errstate(all="ignore"):
            assert_same_bits(got, ort_run(model, {"A": a, "B": b})[0], f"{op} {np.dtype(dtype).name} {sa} {sb}")
        assert set(variants) == {"word_per_invocation", "words_per_invocation"}


def test_float_division_ties_and_special_operands(best):
    """Quotients near ties of the float32 grid and IEEE special cases agree with numpy."""
    r = rng(11)
    b = (r.standard_normal(4096) * 10).astype(np.float32)
    q = (r.standard_normal(4096) * 10).astype(np.float32)
    a = (q.astype(np.float64) * b).astype(np.float32)  # a / b lands next to q
    a = np.concatenate([a, np.array([1, -1, 0, np.inf, -np.inf, np.nan, 1e-45, 3e38], np.float32)])
    b = np.concatenate([b, np.array([0, 0, 0, np.inf, 2, 1, 3, 1e-38], np.float32)])
    model = node_model("Div", [("A", a), ("B", b)], ["C"], opset=14)
    (got,), _ = run_all_variants(best, model, {"A": a, "B": b})
    with np.errstate(all="ignore"):
        assert_same_bits(got, a / b, "Div")


def test_unary_ops(best):
    x = data((5, 7, 3), np.float32, 1)
    x.reshape(-1)[:4] = [-0.0, 0.0, np.nan, -np.inf]
    for op, attrs in (("Relu", {}), ("LeakyRelu", {"alpha": 0.2}), ("LeakyRelu", {})):
        model = node_model(op, [("X", x)], ["Y"], attrs=attrs, opset=14)
        (got,), _ = run_all_variants(best, model, {"X": x})
        assert_same_bits(got, ort_run(model, {"X": x})[0], op)
    for dtype in (np.float16, np.int32, np.int8):
        xi = data((9, 4), dtype, 2)
        model = node_model("Relu", [("X", xi)], ["Y"], opset=14)
        (got,), _ = run_all_variants(best, model, {"X": xi})
        assert_same_bits(got, ort_run(model, {"X": xi})[0], f"Relu {np.dtype(dtype).name}")


def test_sigmoid_within_the_exp_error_bound(best):
    x = np.concatenate([np.linspace(-30, 30, 3001), [0.0, -0.0, 1e-8, -1e-8, 88, -88, 104, -104]]).astype(np.float32)
    model = node_model("Sigmoid", [("X", x)], ["Y"])
    (got,), _ = run_all_variants(best, model, {"X": x})
    exact = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    # WGSL: exp within 3 + 2|x| ULP; one division and one addition: a few ULP more; results
    # below the smallest normal float may be flushed to zero (WGSL allows it)
    ulps = 8 + 2 * np.abs(x.astype(np.float64))
    assert np.all(np.abs(got - exact) <= ulps * np.spacing(np.abs(exact).astype(np.float32)) + 2.0 ** -126)
    assert np.allclose(got, ref_run(model, {"X": x})[0], rtol=1e-5, atol=2.0 ** -126)
    assert np.allclose(got, ort_run(model, {"X": x})[0], rtol=1e-5, atol=1e-7)


def test_clip(best):
    x = data((5, 7), np.float32, 3)
    x.reshape(-1)[0] = np.nan
    lo, hi = np.array(-1.5, np.float32), np.array(2.0, np.float32)
    for inputs in ([("X", x), ("min", lo), ("max", hi)], [("X", x), ("min", None), ("max", hi)],
                   [("X", x), ("min", lo)], [("X", x)], [("X", x), ("min", hi), ("max", lo)]):
        model = node_model("Clip", inputs, ["Y"], opset=13)
        feeds = {n: a for n, a in inputs if a is not None}
        (got,), _ = run_all_variants(best, model, feeds)
        assert_same_bits(got, ort_run(model, feeds)[0], f"Clip {[n for n, a in inputs if a is not None]}")
    model = node_model("Clip", [("X", x)], ["Y"], attrs={"min": -0.5, "max": 0.7}, opset=6)
    (got,), _ = run_all_variants(best, model, {"X": x})
    assert_same_bits(got, np.clip(x, np.float32(-0.5), np.float32(0.7)), "Clip-6")
    for dtype in INT_TYPES + (np.float16,):
        xi = data((20,), dtype, 4)
        lo_i, hi_i = np.array(-5 if dtype != np.uint8 else 5, dtype), np.array(9, dtype)
        model = node_model("Clip", [("X", xi), ("min", lo_i), ("max", hi_i)], ["Y"], opset=13)
        feeds = {"X": xi, "min": lo_i, "max": hi_i}
        (got,), _ = run_all_variants(best, model, feeds)
        assert_same_bits(got, np.clip(xi, lo_i, hi_i), f"Clip {np.dtype(dtype).name}")


def test_clip_bounds_must_be_scalars(best):
    x = data((4,), np.float32)
    lo = np.zeros(2, np.float32)
    model = node_model("Clip", [("X", x), ("min", lo)], ["Y"], opset=13)
    with pytest.raises(ExecutionError, match="boundsAreScalars"):
        run_node(best, model, {"X": x, "min": lo})


CAST_TYPES = [np.float32, np.float16, np.int32, np.int8, np.uint8, np.bool_]


@pytest.mark.parametrize("src", CAST_TYPES, ids=lambda t: np.dtype(t).name)
def test_cast_matrix_matches_numpy_and_onnxruntime(best, src):
    floats = np.array([0, -0.0, 1.5, -1.5, 2.5, -2.7, 100.7, -100.2, 300.6, -300.6, 65519, 65521, 1e10, -1e10,
                       np.nan, np.inf, -np.inf, 1e-7, 6e-8, 3e-8, 127.9, -128.9, 255.5, 2147483520, -2147483648],
                      np.float32)
    ints = np.array([0, 1, -1, 127, -128, 255, 300, -300, 2**31 - 1, -2**31, 16777217, -16777219, 65504, 70000],
                    np.int64)
    if src == np.bool_:
        x = np.array([True, False, True, True, False])
    elif np.dtype(src).kind == "f":
        with np.errstate(over="ignore"):
            x = floats.astype(src)
    else:
        x = ints.astype(src)
    for dst in CAST_TYPES:
        to = helper.np_dtype_to_tensor_dtype(np.dtype(dst))
        model = node_model("Cast", [("X", x)], ["Y"], attrs={"to": to}, opset=14, out_types=[dst])
        (got,), _ = run_all_variants(best, model, {"X": x})
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = x.astype(dst)
        what = f"Cast {np.dtype(src).name} -> {np.dtype(dst).name}"
        assert_same_bits(got, expected, what + " vs numpy")
        assert_same_bits(got, ort_run(model, {"X": x})[0], what + " vs onnxruntime")


# ----------------------------------------------------------------------------- data movement

def test_copy_family(best):
    x = data((2, 3, 5), np.uint8, 5)
    shape = np.array([5, -1], np.int64)
    axes = np.array([1], np.int64)
    x1 = x.reshape(2, 1, 3, 5)
    cases = [
        (node_model("Identity", [("X", x)], ["Y"]), {"X": x}, x),
        (node_model("Reshape", [("X", x), ("S", shape)], ["Y"], inits={"S": shape}), {"X": x}, x.reshape(5, -1)),
        (node_model("Flatten", [("X", x)], ["Y"], attrs={"axis": 2}), {"X": x}, x.reshape(6, 5)),
        (node_model("Squeeze", [("X", x1), ("A", axes)], ["Y"], inits={"A": axes}, opset=13), {"X": x1}, x),
        (node_model("Squeeze", [("X", x1)], ["Y"], opset=13), {"X": x1}, x),
        (node_model("Squeeze", [("X", x1)], ["Y"], attrs={"axes": [1]}, opset=11), {"X": x1}, x),
        (node_model("Unsqueeze", [("X", x), ("A", axes)], ["Y"], inits={"A": axes}, opset=13), {"X": x}, x1),
        (node_model("Unsqueeze", [("X", x)], ["Y"], attrs={"axes": [1]}, opset=11), {"X": x}, x1),
    ]
    for model, feeds, expected in cases:
        (got,), _ = run_all_variants(best, model, feeds)
        assert_same_bits(got, expected, model.graph.node[0].op_type)
    for dtype in (np.int64, np.float16, np.float32, np.bool_):
        xd = data((3, 7), dtype, 6)
        (got,), _ = run_all_variants(best, node_model("Identity", [("X", xd)], ["Y"]), {"X": xd})
        assert_same_bits(got, xd, f"Identity {np.dtype(dtype).name}")


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.uint8, np.int32, np.bool_, np.int64, np.uint64],
                         ids=lambda t: np.dtype(t).name)
def test_transpose(best, dtype):
    for shape, perms in (((2, 3, 5), [[0, 2, 1], [2, 1, 0], [1, 0, 2], None]),
                         ((2, 1, 3, 4), [[3, 1, 0, 2], [0, 1, 2, 3], [3, 0, 1, 2]]), ((7,), [None])):
        x = data(shape, dtype, 7)
        for perm in perms:
            model = node_model("Transpose", [("X", x)], ["Y"], attrs={"perm": perm} if perm else {})
            (got,), _ = run_all_variants(best, model, {"X": x})
            assert_same_bits(got, np.ascontiguousarray(np.transpose(x, perm)), f"Transpose {shape} {perm}")


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.uint8, np.int64, np.float64],
                         ids=lambda t: np.dtype(t).name)
def test_concat(best, dtype):
    cases = [([(2, 3, 5), (2, 1, 5), (2, 4, 5)], 1), ([(3, 1), (3, 2), (3, 3)], -1), ([(1, 3), (2, 3)], 0),
             ([(2, 2, 3), (2, 2, 1), (2, 2, 2), (2, 2, 5), (2, 2, 1)], 2), ([(7,)], 0), ([(2, 3)] * 8, 1),
             ([(2, 0, 3), (2, 2, 3)], 1), ([(1, 1), (1, 1), (1, 1)], 1), ([(3, 2), (1, 2), (2, 2), (5, 2)], 0),
             # runs along the axis of at least a workgroup's lanes: the rows variant (32/64-bit types)
             ([(2, 1, 260), (2, 2, 260)], 1)]
    for k, (shapes, axis) in enumerate(cases):
        xs = [data(s, dtype, 10 * k + i) for i, s in enumerate(shapes)]
        if dtype == np.int64:  # both words of each element: the high ones too
            xs = [a * (2**33 + 7) for a in xs]
        inputs = [(f"X{i}", a) for i, a in enumerate(xs)]
        model = node_model("Concat", inputs, ["Y"], attrs={"axis": axis})
        (got,), variants = run_all_variants(best, model, dict(inputs))
        assert "per_input" in variants
        assert_same_bits(got, np.concatenate(xs, axis=axis), f"Concat {shapes} axis {axis}")


def test_concat_with_more_inputs_than_the_kernel_binds(best):
    xs = [data((2,), np.float32, i) for i in range(9)]
    model = node_model("Concat", [(f"X{i}", a) for i, a in enumerate(xs)], ["Y"], attrs={"axis": 0})
    spec = node_spec(model)
    assert len(spec.inputs) == 8 and len(model.graph.node[0].input) == 9  # the caller must split such nodes


# ----------------------------------------------------------------------------- MatMul / Gemm / Conv

@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
                                   ((4,), (4,)), ((2, 1, 3, 4), (3, 4, 2)), ((1, 17, 33), (33, 19)),
                                   ((3, 20, 40), (3, 40, 18)), ((0, 4), (4, 3))])
def test_matmul(best, sa, sb):
    a, b = data(sa, np.float32, 1), data(sb, np.float32, 2)
    model = node_model("MatMul", [("A", a), ("B", b)], ["Y"])
    (got,), variants = run_all_variants(best, model, {"A": a, "B": b})
    assert set(variants) == ({"simple", "tiled"} if 0 in sa else {"simple", "tiled", "blocked"})
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
    mag = np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))
    assert_within_sum_bound(got, exact, mag, sa[-1], f"MatMul {sa} {sb}")
    assert np.allclose(got, ort_run(model, {"A": a, "B": b})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ta,tb,cshape", [(0, 0, (5,)), (1, 0, (3, 5)), (0, 1, None), (1, 1, (3, 1)), (0, 0, ()),
                                          (0, 0, (1, 5))])
def test_gemm(best, ta, tb, cshape):
    m, k, n = 3, 40, 5
    a = data((k, m) if ta else (m, k), np.float32, 3)
    b = data((n, k) if tb else (k, n), np.float32, 4)
    inputs = [("A", a), ("B", b)] + ([("C", data(cshape, np.float32, 5))] if cshape is not None else [])
    alpha, beta = 0.7, 1.3
    model = node_model("Gemm", inputs, ["Y"], attrs={"transA": ta, "transB": tb, "alpha": alpha, "beta": beta})
    (got,), variants = run_all_variants(best, model, dict(inputs))
    assert set(variants) == {"simple", "tiled", "blocked"}
    a2 = (a.T if ta else a).astype(np.float64)
    b2 = (b.T if tb else b).astype(np.float64)
    c = np.broadcast_to(inputs[2][1], (m, n)).astype(np.float64) if cshape is not None else 0.0
    exact = np.float32(alpha) * (a2 @ b2) + np.float32(beta) * c
    mag = abs(alpha) * (np.abs(a2) @ np.abs(b2)) + abs(beta) * np.abs(c)
    assert_within_sum_bound(got, exact, mag, k + 2, f"Gemm {ta} {tb} {cshape}")
    assert np.allclose(got, ort_run(model, dict(inputs))[0], rtol=1e-5, atol=1e-5)


CONV_CASES = [
    ((1, 3, 7, 7), (8, 3, 3, 3), {}),
    ((2, 4, 9, 8), (8, 2, 3, 3), {"group": 2, "strides": [2, 1], "pads": [1, 0, 1, 2]}),
    ((1, 4, 8, 8), (4, 1, 3, 3), {"group": 4, "dilations": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 3, 10), (4, 3, 3), {"auto_pad": "SAME_LOWER", "strides": [2]}),
    ((1, 2, 5, 5, 5), (4, 2, 2, 2, 2), {"auto_pad": "VALID"}),
    ((1, 8, 6, 6), (16, 8, 1, 1), {}),
    ((1, 3, 7, 7), (8, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2], "kernel_shape": [3, 3]}),
]


def conv_reference(x, w, b, attrs):
    """float64 Conv and the magnitude sum |x| * |w| for the error bound (onnx.reference)."""
    inputs = [("X", x.astype(np.float64)), ("W", w.astype(np.float64))] + ([("B", b.astype(np.float64))] if b is not None else [])
    exact = ref_run(node_model("Conv", inputs, ["Y"], attrs=attrs), dict(inputs))[0]
    mag_inputs = [("X", np.abs(inputs[0][1])), ("W", np.abs(inputs[1][1]))] + ([("B", np.abs(inputs[2][1]))] if b is not None else [])
    mag = ref_run(node_model("Conv", mag_inputs, ["Y"], attrs=attrs), dict(mag_inputs))[0]
    return exact, mag


@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_conv(best, xs, ws, attrs, bias):
    x, w, b = data(xs, np.float32, 1, 1.0), data(ws, np.float32, 2, 1.0), data((ws[0],), np.float32, 3, 1.0)
    inputs = [("X", x), ("W", w)] + ([("B", b)] if bias else [])
    model = node_model("Conv", inputs, ["Y"], attrs=attrs)
    (got,), variants = run_all_variants(best, model, dict(inputs))
    assert "direct" in variants
    exact, mag = conv_reference(x, w, b if bias else None, attrs)
    assert_within_sum_bound(got, exact, mag, int(np.prod(ws[1:])) + 1, f"Conv {xs} {ws} {attrs}")


# ----------------------------------------------------------------------------- pools, softmax

POOL_CASES = [dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, pads=[1, 1, 0, 0]),
              # the last ceil-mode window starts in the end padding: dropped (as onnxruntime and
              # onnx.reference do) although onnx's inference keeps it before opset 22
              dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, pads=[1, 1, 1, 1]),
              dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
              dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
              dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER"),
              dict(kernel_shape=[2, 3], strides=[1, 2], auto_pad="SAME_LOWER"),
              dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2]),
              dict(kernel_shape=[5, 5])]


@pytest.mark.parametrize("attrs", POOL_CASES)
def test_max_pool(best, attrs):
    for dtype in (np.float32, np.float16, np.int8, np.uint8):
        x = data((2, 3, 5, 5), dtype, 8)
        model = node_model("MaxPool", [("X", x)], ["Y"], attrs=attrs, opset=12)
        (got,), _ = run_all_variants(best, model, {"X": x})
        expected = ort_run(model, {"X": x})[0] if "dilations" not in attrs or dtype == np.float32 else \
            ref_run(model, {"X": x})[0]
        assert_same_bits(got, expected, f"MaxPool {np.dtype(dtype).name} {attrs}")


@pytest.mark.parametrize("attrs", POOL_CASES)
@pytest.mark.parametrize("cip", [0, 1])
def test_average_pool(best, attrs, cip):
    x = data((2, 3, 5, 5), np.float32, 9)
    model = node_model("AveragePool", [("X", x)], ["Y"], attrs=dict(attrs, count_include_pad=cip), opset=19)
    (got,), _ = run_all_variants(best, model, {"X": x})
    expected = ref_run(model, {"X": x})[0]
    mag = ref_run(model, {"X": np.abs(x)})[0]
    kvol = int(np.prod(attrs["kernel_shape"]))
    assert_within_sum_bound(got, expected.astype(np.float64), mag.astype(np.float64) + np.abs(expected), kvol + 2,
                            f"AveragePool {attrs} cip {cip}")
    if "dilations" not in attrs:
        assert np.allclose(got, ort_run(model, {"X": x})[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_a_session_drops_the_last_ceil_window_in_the_padding_as_onnxruntime(best, op):
    """Opset 19: onnx's inference keeps a last ceil-mode window that starts in the end padding, the
    runtimes drop it; the Session plans what they compute (was: a row and a column of NaN / -inf)."""
    from onnx_quant.backend_wgpu.session import Session

    x = data((1, 2, 5, 5), np.float32, 11)
    model = node_model(op, [("X", x)], ["Y"], attrs=POOL_CASES[1], opset=19)
    with Session(model, device=best, allow_host_fallback=False) as sess:
        (got,) = sess.run(None, {"X": x})
    assert_same_bits(got, ort_run(model, {"X": x})[0], f"{op} {POOL_CASES[1]}")


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 4, 30, 30), (1, 2, 3), (1, 3, 2, 2, 2), (1, 1, 70, 70)])
def test_global_average_pool(best, shape):
    x = data(shape, np.float32, 10)
    model = node_model("GlobalAveragePool", [("X", x)], ["Y"])
    (got,), variants = run_all_variants(best, model, {"X": x})
    assert set(variants) == {"serial", "workgroup"}
    axes = tuple(range(2, len(shape)))
    n = int(np.prod(shape[2:]))
    exact = x.astype(np.float64).mean(axis=axes, keepdims=True)
    mag = np.abs(x).astype(np.float64).mean(axis=axes, keepdims=True)
    assert_within_sum_bound(got, exact, mag, n + 2, f"GlobalAveragePool {shape}")


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 4, 30, 30), (1, 2, 3), (1, 3, 2, 2, 2), (1, 1, 70, 70)])
def test_global_max_pool(best, shape):
    x = data(shape, np.float32, 11)
    x.reshape(-1)[::17] = -np.inf
    if x.size > 40:
        x.reshape(shape[0] * shape[1], -1)[0, 5] = np.nan  # a NaN wins its (n, c)
    model = node_model("GlobalMaxPool", [("X", x)], ["Y"])
    (got,), variants = run_all_variants(best, model, {"X": x})
    assert set(variants) == {"serial", "workgroup"}
    assert_same_bits(got, x.max(axis=tuple(range(2, len(shape))), keepdims=True), f"GlobalMaxPool {shape}")


def softmax_reference(x, axis, coerce):
    x = x.astype(np.float64)
    if coerce:
        axis = axis % x.ndim
        rows = x.reshape(int(np.prod(x.shape[:axis])), -1)
        e = np.exp(rows - rows.max(axis=1, keepdims=True))
        return (e / e.sum(axis=1, keepdims=True)).reshape(x.shape)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("opset", [13, 11])
@pytest.mark.parametrize("shape,axis", [((3, 5), -1), ((2, 3, 4), 1), ((2, 3, 4), 0), ((2, 300), 1), ((4,), 0),
                                        ((2, 3, 4, 5), 2), ((2, 3, 4), -2)])
def test_softmax(best, opset, shape, axis):
    x = data(shape, np.float32, 11)
    model = node_model("Softmax", [("X", x)], ["Y"], attrs={"axis": axis}, opset=opset)
    (got,), variants = run_all_variants(best, model, {"X": x})
    assert set(variants) == {"serial", "workgroup"}
    # the multi-pass variant (rows beyond WORKGROUP_MAX_ROW) sums in the same order
    (multi,), _ = run_node(best, model, {"X": x}, variant="multipass", tunables={"WORKGROUP_MAX_ROW": 0})
    assert_same_bits(multi, got, "Softmax: multipass vs serial")
    exact = softmax_reference(x, axis, coerce=opset < 13)
    # each exp within 3 + 2|x - max| ULP (WGSL), the sum and the division add a few more
    spread = float(np.ptp(x)) if x.size else 0.0
    assert np.all(np.abs(got - exact) <= (8 + 2 * spread + 64) * EPS * 2 * np.abs(exact) + 1e-30)
    assert np.allclose(got, ort_run(model, {"X": x})[0], rtol=1e-5, atol=1e-7)


def test_softmax_before_13_coerces_to_2d_unlike_onnx_reference(best):
    """Softmax-11 normalises over every dimension from axis on (the ONNX spec, onnxruntime);
    onnx.reference (1.23) applies the opset-13 meaning here, so it is not the oracle."""
    x = data((2, 3, 4), np.float32, 12)
    model = node_model("Softmax", [("X", x)], ["Y"], attrs={"axis": 1}, opset=11)
    (got,), _ = run_node(best, model, {"X": x})
    assert np.allclose(got, softmax_reference(x, 1, coerce=True), rtol=1e-6)
    assert np.allclose(got, ort_run(model, {"X": x})[0], rtol=1e-6)
    assert not np.allclose(ref_run(model, {"X": x})[0], got, rtol=1e-3)


# ----------------------------------------------------------------------------- errors

def test_unknown_attribute_is_a_clear_error(best):
    x = data((3,), np.float32)
    model = node_model("Relu", [("X", x)], ["Y"], attrs={"beta": 2.0})
    with pytest.raises(ExecutionError, match="attribute 'beta' is not supported by kernel Relu"):
        run_node(best, model, {"X": x})


def test_bad_perm_is_a_clear_error(best):
    x = data((2, 3), np.float32)
    model = node_model("Transpose", [("X", x)], ["Y"], attrs={"perm": [1, 1]})
    with pytest.raises(QuantError):
        run_node(best, model, {"X": x})


def test_unsupported_dtype_is_a_clear_error(best):
    x = data((3,), np.float64)
    with pytest.raises(ExecutionError, match="float64"):
        run_node(best, node_model("Relu", [("X", x)], ["Y"]), {"X": x})


# ----------------------------------------------------------------------------- ONNX node test cases

OUR_OPS = ("Add", "Sub", "Mul", "Div", "Relu", "LeakyRelu", "Sigmoid", "Clip", "Cast", "Identity", "Reshape",
           "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "MatMul", "Gemm", "Conv", "MaxPool",
           "AveragePool", "GlobalAveragePool", "Softmax")


def _node_cases():
    from onnx_quant.node_cases import all_node_cases

    return [c for c in all_node_cases() if len(c.model.graph.node) == 1 and c.model.graph.node[0].op_type in OUR_OPS
            and not c.model.graph.node[0].domain]


def test_onnx_node_test_cases(best):
    """ONNX's own node test cases of these ops: every case our kernels take must pass (floats
    within the case's rtol / atol, everything else bit for bit); cases with element types or
    features the kernels do not take are counted, not failed."""
    ran, skipped = {}, {}
    for case in _node_cases():
        op = case.model.graph.node[0].op_type
        for inputs, outputs in case.data_sets:
            names = [vi.name for vi in case.model.graph.input
                     if vi.name not in {i.name for i in case.model.graph.initializer}]
            feeds = {n: numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v
                     for n, v in zip(names, inputs)}
            outputs = [numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v for v in outputs]
            if any(not isinstance(v, np.ndarray) for v in feeds.values()):
                skipped[op] = skipped.get(op, 0) + 1
                continue
            try:
                got, _ = run_node(best, case.model, feeds)
            except (ExecutionError, QuantError, AssertionError) as e:
                if isinstance(e, AssertionError) and "no kernel spec" not in str(e):
                    raise
                skipped[op] = skipped.get(op, 0) + 1
                continue
            for g, e in zip(got, outputs):
                e = np.asarray(e)
                if e.dtype.kind == "f" and g.dtype == e.dtype:
                    np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=case.rtol,
                                               atol=case.atol, err_msg=case.name)
                else:
                    assert_same_bits(g, e, case.name)
            ran[op] = ran.get(op, 0) + 1
    assert set(ran) == set(OUR_OPS), f"ops without a passing node case: {set(OUR_OPS) - set(ran)}"
    assert sum(ran.values()) >= 150, (ran, skipped)


@pytest.mark.gpu
def test_every_variant_was_run(request):
    """Every variant of every kernel spec this module covers ran at least once above."""
    if not module_fully_selected(request):
        from support.gpu import skip_unless_ci

        skip_unless_ci("only meaningful when the whole module ran (-k, -m or node ids selected a part)")
    assert len(RAN) >= 40, f"the module's node tests recorded only {len(RAN)} (kernel, variant) runs"
    missing = []
    for spec in registry():
        if spec.name in OUR_OPS and not spec.domain.startswith("com."):
            missing.extend((spec.name, v.id) for v in spec.variants if (spec.name, v.id) not in RAN)
    assert not missing, missing

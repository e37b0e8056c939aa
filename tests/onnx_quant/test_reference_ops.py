"""onnx_quant.reference_ops against onnxruntime CPU (ORT_DISABLE_ALL), one-node models.

Oracle rule: onnxruntime's uint8 x int8 integer GEMMs saturate pairs of products at int16 on x86
CPUs with AVX2 and no VNNI, so every integer-GEMM case here (QGemm, DynamicQuantizeMatMul,
MatMulIntegerToFloat, DynamicQuantizeLSTM) uses uint8 weights or int8 weights within [-64, 64]:
no pair of products can reach 2^15 (2 * 255 * 64 = 32640) and onnxruntime is exact on every CPU.
The exactness of the reference with full-range int8 weights is checked against int64 numpy.

Bit for bit where the module claims it; onnxruntime runs the AVX2/FMA3 MLAS kernels the
reference reproduces only on such CPUs (QLinearAdd's fused multiply-adds, the FMA3 logistic),
elsewhere those comparisons allow one quantization step.
"""

from __future__ import annotations


import numpy as np
import onnx
import pytest
from hypothesis import given, strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from support import models
from support.oracles import onnxruntime_run
from onnx_quant.reference_ops import OPS, reference_evaluator
from onnx_quant.oracles import avx2_fma_on, cpu_flags

F32 = np.float32
MS = "com.microsoft"


#: onnxruntime runs the MLAS kernels the reference reproduces (else: one step allowed)
MLAS_AVX2 = avx2_fma_on(cpu_flags())


def node_model(op, inputs, out_types, *, consts=(), domain=MS, onnx_opset=21, **attrs):
    """A one-node model: ``inputs`` (name, array or None: absent); names in ``consts`` are
    initializers, the others graph inputs (returned as feeds)."""
    model = models.node_model(op, inputs, [f"Y{i}" for i in range(len(out_types))], attrs=attrs, domain=domain,
                              opset=onnx_opset, out_types=out_types,  # absent inputs kept as "": onnxruntime reads them
                              inits={n: np.asarray(v) for n, v in inputs if v is not None and n in consts})
    return model, {n: v for n, v in inputs if v is not None and n not in consts}


def run_both(model, feeds, threads=None):
    ref = reference_evaluator(model).run(None, feeds)
    ort = onnxruntime_run(model, feeds, level="ORT_DISABLE_ALL", threads=threads)
    for r, o in zip(ref, ort):
        assert r.shape == o.shape and r.dtype == o.dtype, (r.shape, r.dtype, o.shape, o.dtype)
    return ref, ort


def assert_bits(ref, ort, what=""):
    for r, o in zip(ref, ort):
        diff = np.count_nonzero(r != o)
        assert diff == 0, f"{what}: {diff} of {r.size} differ, max {np.abs(r.astype(float) - o).max()}"


def assert_exact(ref, ort, what=""):
    """Bit for bit where onnxruntime runs the x86-64 AVX2/FMA3 MLAS kernels the reference
    reproduces; elsewhere integer outputs within one quantization step, float ones 1e-6."""
    if MLAS_AVX2:
        return assert_bits(ref, ort, what)
    for r, o in zip(ref, ort):
        if r.dtype.kind in "iu":
            assert np.abs(r.astype(np.int32) - o.astype(np.int32)).max(initial=0) <= 1, what
        else:
            assert_close([r], [o], rtol=1e-6, atol=0, what=what)


def assert_close(ref, ort, rtol=1e-5, atol=1e-6, what=""):
    for r, o in zip(ref, ort):
        scale = float(np.abs(o.astype(np.float64)).max(initial=0))
        assert float(np.abs(r.astype(np.float64) - o).max(initial=0)) <= rtol * scale + atol, what


def ints(rng, dtype, shape, lo=None, hi=None):
    info = np.iinfo(dtype)
    lo = info.min if lo is None else lo
    hi = info.max if hi is None else hi
    return np.asarray(rng.integers(lo, hi + 1, shape)).astype(dtype)


def s(v):
    return np.array(v, F32)


QTYPES = [np.uint8, np.int8]
seeds = st.integers(0, 2**32 - 1)


# ----------------------------------------------------------------------------- Q / DQ of every opset

@pytest.mark.parametrize("opset", [10, 13, 17, 18, 19, 21])
@pytest.mark.parametrize("dtype", QTYPES + [None], ids=["uint8", "int8", "no_zp"])
def test_quantize_dequantize_every_opset_equals_onnxruntime(opset, dtype):
    rng = np.random.default_rng(opset)
    x = (rng.standard_normal((2, 3, 4)) * 20).astype(F32)
    x[0, 0, :] = [1e10, -1e10, 0.5, 2.5]  # saturation in float; ties to even
    per_axis = opset >= 13
    scale = rng.uniform(0.05, 0.2, 3).astype(F32) if per_axis else s(0.1)
    lo, hi = (-20, 20) if dtype == np.int8 else (100, 150)
    zp = None if dtype is None else ints(rng, dtype, scale.shape, lo, hi)
    q_type = np.uint8 if dtype is None else dtype
    nodes = [helper.make_node("QuantizeLinear", ["x", "s"] + (["z"] if zp is not None else []), ["q"], axis=1),
             helper.make_node("DequantizeLinear", ["q", "s"] + (["z"] if zp is not None else []), ["y"], axis=1)]
    if opset < 13:
        for n in nodes:
            del n.attribute[:]
    inits = [numpy_helper.from_array(scale, "s")] + ([numpy_helper.from_array(zp, "z")] if zp is not None else [])
    outs = [helper.make_tensor_value_info("q", helper.np_dtype_to_tensor_dtype(np.dtype(q_type)), None),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)], outs,
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if opset < 19:
        with pytest.raises(Exception, match="DequantizeLinear"):  # why the module supplies it
            ReferenceEvaluator(model).run(None, {"x": x})
    assert_bits(*run_both(model, {"x": x}), f"Q/DQ opset {opset}")


def test_quantize_linear_nan_and_huge_values_saturate_in_float():
    x = np.array([np.nan, 3e9, -3e9, np.inf, -np.inf, 127.5, -128.5], F32)
    model, feeds = node_model("QuantizeLinear", [("x", x), ("s", s(1.0)), ("z", np.array(0, np.int8))],
                              [np.int8], consts=("s", "z"), domain="", onnx_opset=13)
    (got,) = reference_evaluator(model).run(None, feeds)
    assert got.tolist() == [-128, 127, -128, 127, -128, 127, -128]


# ----------------------------------------------------------------------------- QLinearAdd / QLinearMul

@st.composite
def broadcast_pair(draw):
    out = draw(st.lists(st.integers(1, 6), min_size=0, max_size=3))
    def operand():
        dims = [d if draw(st.booleans()) else 1 for d in out]
        return tuple(dims[draw(st.integers(0, len(dims))):])
    return operand(), operand()


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@given(shapes=broadcast_pair(), seed=seeds, dtype=st.sampled_from(QTYPES))
def test_qlinear_binary(op, shapes, seed, dtype):
    rng = np.random.default_rng(seed)
    a, b = ints(rng, dtype, shapes[0]), ints(rng, dtype, shapes[1])
    base = F32(rng.uniform(0.01, 0.1))
    sa, sb, sc = base, F32(base * F32(rng.choice([0.5, 1.0, 2.0]))), F32(base * F32(rng.choice([0.75, 1.5, 3.0])))
    za, zb, zc = ints(rng, dtype, (3,))
    inputs = [("A", a), ("As", s(sa)), ("Az", za), ("B", b), ("Bs", s(sb)), ("Bz", zb), ("Cs", s(sc)), ("Cz", zc)]
    if seed % 3 == 0:  # C's zero point left out (onnxruntime refuses models that leave out A's or B's)
        inputs.pop()
    model, feeds = node_model(op, inputs, [dtype], consts=("As", "Az", "Bs", "Bz", "Cs", "Cz"))
    assert_exact(*run_both(model, feeds), f"{op} {shapes}")


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary_every_operand_pair(op):
    """All 256 x 256 pairs, both orders of broadcasting (onnxruntime swaps the operands in one)."""
    rng = np.random.default_rng(5)
    codes = np.arange(256, dtype=np.uint8)
    for shapes in [((256, 1), (1, 256)), ((1, 256), (256, 1))]:
        a, b = codes.reshape(shapes[0]), codes.reshape(shapes[1])
        sa, sb, sc = (F32(v) for v in rng.uniform(0.001, 0.1, 3))
        za, zb, zc = (np.array(v, np.uint8) for v in rng.integers(0, 256, 3))
        model, feeds = node_model(op, [("A", a), ("As", s(sa)), ("Az", za), ("B", b), ("Bs", s(sb)), ("Bz", zb),
                                       ("Cs", s(sc)), ("Cz", zc)], [np.uint8],
                                  consts=("As", "Az", "Bs", "Bz", "Cs", "Cz"))
        assert_exact(*run_both(model, feeds), f"{op} {shapes}")


# ----------------------------------------------------------------------------- lookup-table ops

@pytest.mark.parametrize("op", ["QLinearSigmoid", "QLinearLeakyRelu"])
@pytest.mark.parametrize("dtype", QTYPES, ids=["uint8", "int8"])
def test_lookup_table_ops_every_input(op, dtype):
    rng = np.random.default_rng(7)
    x = np.arange(256, dtype=np.uint8).view(dtype).reshape(16, 16)
    for t in range(16):
        xs = F32(rng.uniform(0.001, 0.2))
        ys = F32(rng.uniform(0.001, 0.01)) if op == "QLinearSigmoid" else F32(xs * F32(rng.choice([0.5, 1.0, 2.0])))
        xz, yz = ints(rng, dtype, (2,))
        attrs = {"alpha": float(rng.choice([0.1, 0.2, 0.3333]))} if op == "QLinearLeakyRelu" and t % 2 else {}
        absent = t % 4 == 3
        model, feeds = node_model(op, [("X", x), ("Xs", s(xs)), ("Xz", None if absent else xz), ("Ys", s(ys)),
                                       ("Yz", None if absent else yz)], [dtype], consts=("Xs", "Xz", "Ys", "Yz"),
                                  **attrs)
        assert_exact(*run_both(model, feeds), f"{op} trial {t}")


@given(seed=seeds, dtype=st.sampled_from(QTYPES), shape=st.lists(st.integers(1, 7), min_size=1, max_size=3),
       axis_pick=st.integers(0, 5), opset=st.sampled_from([11, 13, 21]))
def test_qlinear_softmax(seed, dtype, shape, axis_pick, opset):
    rng = np.random.default_rng(seed)
    x = ints(rng, dtype, shape)
    axis = axis_pick % len(shape) - (len(shape) if axis_pick % 2 else 0)
    yz = np.array(0 if dtype == np.uint8 else -128, dtype)
    ys = F32(rng.choice([1 / 256, 0.013, 1 / 255]))
    model, feeds = node_model("QLinearSoftmax", [("X", x), ("Xs", s(rng.uniform(0.01, 0.3))),
                                                 ("Xz", ints(rng, dtype, ())), ("Ys", s(ys)), ("Yz", yz)],
                              [dtype], consts=("Xs", "Xz", "Ys", "Yz"), axis=axis, opset=opset)
    assert_exact(*run_both(model, feeds), f"QLinearSoftmax {shape} axis {axis} opset {opset}")


def test_qlinear_softmax_long_row():
    rng = np.random.default_rng(3)
    x = np.clip(ints(rng, np.uint8, (2, 5000)), 215, 255).astype(np.uint8)  # every term counts in the sum
    model, feeds = node_model("QLinearSoftmax", [("X", x), ("Xs", s(0.05)), ("Xz", np.array(0, np.uint8)),
                                                 ("Ys", s(1 / 4 / 5000)), ("Yz", np.array(0, np.uint8))],
                              [np.uint8], consts=("Xs", "Xz", "Ys", "Yz"), opset=13)
    assert_exact(*run_both(model, feeds), "QLinearSoftmax 5000")


# ----------------------------------------------------------------------------- concat and pools

@given(seed=seeds, dtype=st.sampled_from(QTYPES), n=st.integers(1, 4), axis=st.integers(-2, 1))
def test_qlinear_concat(seed, dtype, n, axis):
    rng = np.random.default_rng(seed)
    ys, yz = F32(rng.uniform(0.01, 0.1)), ints(rng, dtype, ())
    inputs, consts = [("Ys", s(ys)), ("Yz", yz)], ["Ys", "Yz"]
    for i in range(n):
        shape = [3, 4]
        shape[axis] = int(rng.integers(1, 4))
        same = i == 0
        inputs += [(f"X{i}", ints(rng, dtype, shape)), (f"S{i}", s(ys if same else rng.uniform(0.005, 0.2))),
                   (f"Z{i}", yz if same else ints(rng, dtype, ()))]
        consts += [f"S{i}", f"Z{i}"]
    model, feeds = node_model("QLinearConcat", inputs, [dtype], consts=consts, axis=axis)
    assert_exact(*run_both(model, feeds), "QLinearConcat")


@given(shapes=broadcast_pair(), seed=seeds, dtype=st.sampled_from(QTYPES), same=st.integers(0, 2))
def test_qlinear_where(shapes, seed, dtype, same):
    rng = np.random.default_rng(seed)
    zs, zz = F32(rng.uniform(0.01, 0.1)), ints(rng, dtype, ())
    params = [(s(zs), zz) if same == i else (s(rng.uniform(0.005, 0.2)), ints(rng, dtype, ())) for i in range(2)]
    cond = rng.integers(0, 2, np.broadcast_shapes(*shapes)[-1:]).astype(bool)
    inputs = [("C", cond), ("X", ints(rng, dtype, shapes[0])), ("Xs", params[0][0]), ("Xz", params[0][1]),
              ("Y", ints(rng, dtype, shapes[1])), ("Ys", params[1][0]), ("Yz", params[1][1]), ("Zs", s(zs)), ("Zz", zz)]
    model, feeds = node_model("QLinearWhere", inputs, [dtype], consts=("Xs", "Xz", "Ys", "Yz", "Zs", "Zz"))
    assert_exact(*run_both(model, feeds), "QLinearWhere")


def pool_params(rng, dtype):
    return [("Xs", s(rng.uniform(0.01, 0.1))), ("Xz", ints(rng, dtype, ())), ("Ys", s(rng.uniform(0.01, 0.1))),
            ("Yz", ints(rng, dtype, ()))]


@given(seed=seeds, dtype=st.sampled_from(QTYPES), shape=st.lists(st.integers(1, 9), min_size=3, max_size=5),
       channels_last=st.integers(0, 1))
def test_qlinear_global_average_pool(seed, dtype, shape, channels_last):
    rng = np.random.default_rng(seed)
    x = ints(rng, dtype, shape)
    model, feeds = node_model("QLinearGlobalAveragePool", [("X", x)] + pool_params(rng, dtype), [dtype],
                              consts=("Xs", "Xz", "Ys", "Yz"), channels_last=channels_last)
    assert_exact(*run_both(model, feeds), "QLinearGlobalAveragePool")


AVG_CASES = [dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, pads=[1, 1, 0, 0]),
             dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
             dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER"),
             dict(kernel_shape=[2, 3], strides=[1, 2], auto_pad="SAME_LOWER"),
             dict(kernel_shape=[6, 7]),  # the whole image: onnxruntime's integer global path
             dict(kernel_shape=[3], strides=[2], pads=[1, 1]),
             dict(kernel_shape=[2, 2, 2], strides=[1, 2, 2], pads=[0, 1, 0, 1, 0, 1])]


@pytest.mark.parametrize("attrs", AVG_CASES, ids=[str(i) for i in range(len(AVG_CASES))])
@pytest.mark.parametrize("dtype", QTYPES, ids=["uint8", "int8"])
def test_qlinear_average_pool(attrs, dtype):
    rng = np.random.default_rng(11)
    for cip in (0, 1):
        for cl in (0, 1):
            shape = {1: (2, 4, 9), 2: (2, 3, 6, 7), 3: (1, 2, 4, 5, 6)}[len(attrs["kernel_shape"])]
            if cl:
                shape = (shape[0],) + shape[2:] + (shape[1],)
            model, feeds = node_model("QLinearAveragePool", [("X", ints(rng, dtype, shape))] + pool_params(rng, dtype),
                                      [dtype], consts=("Xs", "Xz", "Ys", "Yz"), count_include_pad=cip,
                                      channels_last=cl, **attrs)
            assert_exact(*run_both(model, feeds), f"QLinearAveragePool {attrs} cip {cip} cl {cl}")


# ----------------------------------------------------------------------------- integer GEMMs

def weights(rng, dtype, shape):
    """uint8 anywhere, int8 within [-64, 64]: no int16 saturation in onnxruntime on any CPU."""
    return ints(rng, dtype, shape, -64, 64) if dtype == np.int8 else ints(rng, dtype, shape)


def weight_zp(rng, dtype, shape=()):
    return np.zeros(shape, np.int8) if dtype == np.int8 else ints(rng, np.uint8, shape, 100, 156)


@given(seed=seeds, m=st.integers(1, 9), k=st.integers(1, 40), n=st.integers(1, 9), ta=st.integers(0, 1),
       tb=st.integers(0, 1), types=st.sampled_from([(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)]),
       per_column=st.booleans(), quantized=st.booleans(), c_kind=st.sampled_from([None, "N", "MN", "1"]))
def test_qgemm(seed, m, k, n, ta, tb, types, per_column, quantized, c_kind):
    rng = np.random.default_rng(seed)
    at, bt = types
    a = ints(rng, at, (k, m) if ta else (m, k))
    b = weights(rng, bt, (n, k) if tb else (k, n))
    bshape = (n,) if per_column else ()
    c = None if c_kind is None else ints(rng, np.int32, {"N": (n,), "MN": (m, n), "1": (1,)}[c_kind], -5000, 5000)
    yt = at if quantized else np.float32
    alpha = float(rng.choice([1.0, 0.5, 2.5]))
    inputs = [("A", a), ("As", s(rng.uniform(0.001, 0.05))), ("Az", ints(rng, at, ())), ("B", b),
              ("Bs", rng.uniform(0.001, 0.05, bshape).astype(F32)), ("Bz", weight_zp(rng, bt, bshape)), ("C", c),
              ("Ys", s(rng.uniform(0.01, 0.5)) if quantized else None), ("Yz", ints(rng, at, ()) if quantized else None)]
    model, feeds = node_model("QGemm", inputs, [yt], consts=("As", "Az", "B", "Bs", "Bz", "C", "Ys", "Yz"),
                              transA=ta, transB=tb, alpha=alpha)
    assert_exact(*run_both(model, feeds), "QGemm")


def test_qgemm_exact_where_onnxruntime_may_saturate():
    """Full-range int8 weights with uint8 A: the reference is the exact int64 sum (what
    onnxruntime gives on VNNI hosts, and not on AVX2-only ones), so no onnxruntime here."""
    rng = np.random.default_rng(1)
    a, b = np.full((4, 64), 255, np.uint8), ints(rng, np.int8, (64, 5), -128, 127)
    b[:, 0] = 127
    model, feeds = node_model("QGemm", [("A", a), ("As", s(1.0)), ("Az", np.array(0, np.uint8)), ("B", b),
                                        ("Bs", s(1.0)), ("Bz", np.array(0, np.int8))], [np.float32],
                              consts=("As", "Az", "B", "Bs", "Bz"))
    (got,) = reference_evaluator(model).run(None, feeds)
    assert np.array_equal(got, (a.astype(np.int64) @ b.astype(np.int64)).astype(F32))
    assert got[0, 0] == 255 * 127 * 64


@given(seed=seeds, a_shape=st.lists(st.integers(1, 6), min_size=1, max_size=3), k=st.integers(1, 33),
       n=st.integers(1, 8), bt=st.sampled_from(QTYPES), per_column=st.booleans(), bias=st.booleans(),
       zp=st.booleans())
def test_dynamic_quantize_matmul(seed, a_shape, k, n, bt, per_column, bias, zp):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(a_shape + [k]) * rng.uniform(0.1, 5) + rng.uniform(-1, 1)).astype(F32)
    bshape = (n,) if per_column else ()
    model, feeds = node_model("DynamicQuantizeMatMul", [
        ("A", a), ("B", weights(rng, bt, (k, n))), ("Bs", rng.uniform(0.001, 0.05, bshape).astype(F32)),
        ("Bz", weight_zp(rng, bt, bshape) if zp else None),
        ("bias", rng.standard_normal(n).astype(F32) if bias else None)],
        [np.float32], consts=("B", "Bs", "Bz", "bias"))
    assert_exact(*run_both(model, feeds), "DynamicQuantizeMatMul")


@given(seed=seeds, a_shape=st.lists(st.integers(1, 6), min_size=1, max_size=3), k=st.integers(1, 33),
       n=st.integers(1, 8), types=st.sampled_from([(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)]),
       per_column=st.booleans(), bias=st.booleans())
def test_matmul_integer_to_float(seed, a_shape, k, n, types, per_column, bias):
    rng = np.random.default_rng(seed)
    at, bt = types
    bshape = (n,) if per_column else ()
    model, feeds = node_model("MatMulIntegerToFloat", [
        ("A", ints(rng, at, a_shape + [k])), ("B", weights(rng, bt, (k, n))), ("As", s(rng.uniform(0.001, 0.05))),
        ("Bs", rng.uniform(0.001, 0.05, bshape).astype(F32)), ("Az", ints(rng, at, ())),
        ("Bz", weight_zp(rng, bt, bshape)), ("bias", rng.standard_normal(n).astype(F32) if bias else None)],
        [np.float32], consts=("B", "As", "Bs", "Az", "Bz", "bias"))
    assert_exact(*run_both(model, feeds), "MatMulIntegerToFloat")


# ----------------------------------------------------------------------------- DynamicQuantizeLSTM

LSTM_CASES = {
    "forward": {},
    "reverse": {"direction": "reverse"},
    "bidirectional per-column uint8": {"direction": "bidirectional", "per_channel": True, "wtype": np.uint8},
    "initial states, peepholes": {"initial": True, "peepholes": True, "direction": "bidirectional"},
    "sequence_lens": {"batch": 4, "seq_lens": [4, 1, 3, 0], "direction": "bidirectional", "initial": True},
    "sequence_lens without Y": {"batch": 3, "seq_lens": [2, 4, 1], "outputs": ("Y_h", "Y_c")},
    "clip, input_forget, no bias": {"clip": 0.7, "input_forget": 1, "bias": False},
    "activations": {"activations": ["HardSigmoid", "LeakyRelu", "Tanh"], "activation_alpha": [0.3, 0.05],
                    "activation_beta": [0.4]},
}


@pytest.mark.parametrize("case", list(LSTM_CASES))
def test_dynamic_quantize_lstm(case):
    cfg = dict(seq=4, batch=2, inp=5, hidden=3, direction="forward", wtype=np.int8, per_channel=False, bias=True,
               seq_lens=None, initial=False, peepholes=False, outputs=("Y", "Y_h", "Y_c")) | LSTM_CASES[case]
    attrs = {k: cfg.pop(k) for k in list(cfg) if k in ("clip", "input_forget", "activations", "activation_alpha",
                                                        "activation_beta")}
    rng = np.random.default_rng(len(case))
    d, h, wt = 2 if cfg["direction"] == "bidirectional" else 1, cfg["hidden"], cfg["wtype"]
    sshape = [d, 4 * h] if cfg["per_channel"] else [d]
    zp = np.zeros(sshape, wt) if wt == np.int8 else np.full(sshape, rng.integers(100, 150), wt)
    x = rng.standard_normal([cfg["seq"], cfg["batch"], cfg["inp"]]).astype(F32)
    opt = {"B": rng.standard_normal([d, 8 * h]).astype(F32) if cfg["bias"] else None,
           "sequence_lens": None if cfg["seq_lens"] is None else np.asarray(cfg["seq_lens"], np.int32),
           "initial_h": rng.standard_normal([d, cfg["batch"], h]).astype(F32) if cfg["initial"] else None,
           "initial_c": rng.standard_normal([d, cfg["batch"], h]).astype(F32) if cfg["initial"] else None,
           "P": rng.standard_normal([d, 3 * h]).astype(F32) if cfg["peepholes"] else None}
    inputs = [("X", x), ("W", weights(rng, wt, [d, cfg["inp"], 4 * h])), ("R", weights(rng, wt, [d, h, 4 * h]))]
    inputs += list(opt.items()) + [("W_scale", (rng.random(sshape) * 0.02 + 0.001).astype(F32)),
                                   ("W_zero_point", zp), ("R_scale", (rng.random(sshape) * 0.02 + 0.001).astype(F32)),
                                   ("R_zero_point", zp.copy())]
    model, feeds = node_model("DynamicQuantizeLSTM", inputs, [F32] * 3, consts=("W", "R", "W_scale", "W_zero_point",
                                                                             "R_scale", "R_zero_point"),
                              hidden_size=h, direction=cfg["direction"], **attrs)
    node = model.graph.node[0]
    keep = [o if o in cfg["outputs"] else "" for o in ("Y", "Y_h", "Y_c")]
    names = dict(zip(("Y", "Y_h", "Y_c"), node.output))
    del node.output[:], model.graph.output[:]
    node.output.extend([names[o] if o else "" for o in keep])
    model.graph.output.extend([helper.make_tensor_value_info(names[o], TensorProto.FLOAT, None) for o in keep if o])
    ref = reference_evaluator(model).run(None, feeds)
    ort = onnxruntime_run(model, feeds, level="ORT_DISABLE_ALL", threads=1)
    assert len(ref) == len(ort)
    for r, o in zip(ref, ort):
        assert r.shape == o.shape and r.dtype == o.dtype
        assert float(np.abs(r - o).max(initial=0)) <= 1e-5, case


# ----------------------------------------------------------------------------- float contrib ops

@given(seed=seeds, batch=st.lists(st.integers(1, 3), min_size=0, max_size=2), m=st.integers(1, 5),
       k=st.integers(1, 6), n=st.integers(1, 5), ta=st.integers(0, 1), tb=st.integers(0, 1),
       tba=st.integers(0, 1), tbb=st.integers(0, 1))
def test_fused_matmul(seed, batch, m, k, n, ta, tb, tba, tbb):
    rng = np.random.default_rng(seed)

    def shaped(rows, cols, trans, trans_batch):
        last = [cols, rows] if trans else [rows, cols]
        return (last[:1] + batch + last[1:]) if trans_batch and batch else (batch + last)
    tba, tbb = (tba, tbb) if batch else (0, 0)  # onnxruntime: transBatch needs rank >= 3
    a = rng.standard_normal(shaped(m, k, ta, tba)).astype(F32)
    b = rng.standard_normal(shaped(k, n, tb, tbb)).astype(F32)
    model, feeds = node_model("FusedMatMul", [("A", a), ("B", b)], [F32], alpha=float(rng.choice([1.0, 0.5, -2.0])),
                              transA=ta, transB=tb, transBatchA=tba, transBatchB=tbb)
    assert_close(*run_both(model, feeds), what="FusedMatMul")


CONV_ACTS = [("Relu", []), ("LeakyRelu", [0.1]), ("Clip", [-0.5, 0.7]), ("HardSigmoid", [0.3, 0.4]), ("Sigmoid", []),
             ("Tanh", [])]


@pytest.mark.parametrize("act,params", CONV_ACTS, ids=[a for a, _ in CONV_ACTS])
@pytest.mark.parametrize("with_z", [False, True])
def test_fused_conv(act, params, with_z):
    rng = np.random.default_rng(len(act))
    x, w = rng.standard_normal((2, 4, 7, 6)).astype(F32), rng.standard_normal((6, 2, 3, 3)).astype(F32)
    z = rng.standard_normal((2, 6, 4, 3)).astype(F32) if with_z else None
    attrs = dict(activation=act, strides=[2, 2], pads=[1, 1, 1, 0], group=2)
    if params:
        attrs["activation_params"] = params
    model, feeds = node_model("FusedConv", [("X", x), ("W", w), ("B", rng.standard_normal(6).astype(F32)), ("Z", z)],
                              [F32], consts=("W", "B"), **attrs)
    assert_close(*run_both(model, feeds), what=f"FusedConv {act}")


GEMM_ACTS = [("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.2}),
             ("HardSigmoid", {"activation_alpha": 0.3, "activation_beta": 0.6}), ("Sigmoid", {}), ("Tanh", {}),
             ("Elu", {"activation_alpha": 0.7}), ("Selu", {"activation_alpha": 1.6, "activation_gamma": 1.1}),
             ("Softplus", {}), ("Softsign", {}), ("ThresholdedRelu", {"activation_alpha": 0.3}),
             ("ScaledTanh", {"activation_alpha": 0.5, "activation_beta": 2.0}),
             ("ParametricSoftplus", {"activation_alpha": 0.8, "activation_beta": 1.5})]


@pytest.mark.parametrize("act,params", GEMM_ACTS, ids=[a for a, _ in GEMM_ACTS])
def test_fused_gemm(act, params):
    rng = np.random.default_rng(len(act))
    a, b, c = (rng.standard_normal(sh).astype(F32) for sh in [(6, 4), (5, 6), (5,)])
    model, feeds = node_model("FusedGemm", [("A", a), ("B", b), ("C", c)], [F32], transA=1, transB=1, alpha=0.5,
                              beta=2.0, activation=act, **params)
    assert_close(*run_both(model, feeds), what=f"FusedGemm {act}")


@pytest.mark.parametrize("op,attrs", [("Gelu", {}), ("QuickGelu", {}), ("QuickGelu", {"alpha": 1.0})])
def test_gelu_family(op, attrs):
    x = np.concatenate([np.linspace(-10, 10, 401), [0.0, -0.0, 1e-30, 50, -50]]).astype(F32)
    model, feeds = node_model(op, [("X", x)], [F32], **attrs)
    assert_close(*run_both(model, feeds), what=op)


def test_every_op_is_covered_here():
    covered = {"QuantizeLinear", "DequantizeLinear", "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu",
               "QLinearSoftmax", "QLinearConcat", "QLinearWhere", "QLinearGlobalAveragePool", "QLinearAveragePool",
               "QGemm", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLSTM", "FusedMatMul", "FusedConv",
               "FusedGemm", "QuickGelu", "Gelu"}
    assert {c.__name__ for c in OPS} == covered
    assert all(c.op_domain == (MS if c.__name__ not in ("QuantizeLinear", "DequantizeLinear") else "") for c in OPS)


# ----------------------------------------------------------------------------- whole quantized models

def small_cnn(rng):
    """A float CNN whose quantization writes every QOperator op above but the GEMM-free ones."""
    w = {"W": rng.standard_normal((8, 3, 3, 3)) * 0.3, "B": rng.standard_normal(8),
         "W2": rng.standard_normal((8, 8, 3, 3)) * 0.2, "B2": rng.standard_normal(8),
         "G": rng.standard_normal((16, 5)) * 0.3, "GB": rng.standard_normal(5)}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "W2", "B2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r"], ["a"]),
             helper.make_node("LeakyRelu", ["a"], ["l"], alpha=0.1), helper.make_node("Sigmoid", ["l"], ["sg"]),
             helper.make_node("Mul", ["sg", "l"], ["mm"]), helper.make_node("Concat", ["l", "mm"], ["cc"], axis=1),
             helper.make_node("AveragePool", ["cc"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["ap"], ["gp"]), helper.make_node("Flatten", ["gp"], ["fl"]),
             helper.make_node("Gemm", ["fl", "G", "GB"], ["gm"]), helper.make_node("Softmax", ["gm"], ["y"])]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
                              initializer=[numpy_helper.from_array(v.astype(F32), k) for k, v in w.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def small_rnn(rng):
    w = {"W": rng.standard_normal((1, 16, 6)) * 0.5, "R": rng.standard_normal((1, 16, 4)) * 0.5,
         "B": rng.standard_normal((1, 32)), "M": rng.standard_normal((4, 3))}
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["h", "", ""], hidden_size=4),
             helper.make_node("Squeeze", ["h", "one"], ["hs"]), helper.make_node("MatMul", ["hs", "M"], ["y"])]
    graph = helper.make_graph(nodes, "rnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 2, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 2, 3])],
                              initializer=[numpy_helper.from_array(v.astype(F32), k) for k, v in w.items()]
                              + [numpy_helper.from_array(np.array([1], np.int64), "one")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("form", ["QOperator", "QDQ", "dynamic"])
def test_models_quantized_by_onnxruntime(tmp_path, form):
    """Whole models as onnxruntime.quantization writes them (uint8 weights: see the oracle rule):
    QOperator bit for bit (QLinearConv is onnx.reference's own), QDQ within one step of the
    output's scale (its float Conv / Softmax sum in another order), dynamic within 1e-5."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)

    rng = np.random.default_rng(12)
    float_path, q_path = str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx")
    onnx.save((small_rnn if form == "dynamic" else small_cnn)(rng), float_path)
    shape = (5, 2, 6) if form == "dynamic" else (1, 3, 8, 8)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.data = iter([{"x": rng.standard_normal(shape).astype(F32)} for _ in range(8)])

        def get_next(self):
            return next(self.data, None)

    if form == "dynamic":
        quantize_dynamic(float_path, q_path, weight_type=QuantType.QUInt8)
    else:
        quantize_static(float_path, q_path, Reader(), quant_format=getattr(QuantFormat, form),
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QUInt8)
    q = onnx.load(q_path)
    ops = {n.op_type for n in q.graph.node}
    if form == "QOperator":
        assert {"QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat",
                "QLinearAveragePool", "QLinearGlobalAveragePool", "QGemm", "QLinearSoftmax"} <= ops, ops
    if form == "dynamic":
        assert {"DynamicQuantizeLSTM", "MatMulInteger", "DynamicQuantizeLinear"} <= ops, ops
    for seed in range(3):
        feeds = {"x": np.random.default_rng(100 + seed).standard_normal(shape).astype(F32)}
        ref, ort = run_both(q, feeds, threads=1)
        if form == "QOperator":
            assert_exact(ref, ort, "QOperator model")
        else:
            assert_close(ref, ort, rtol=0, atol=1.01 / 255 if form == "QDQ" else 1e-5, what=form)

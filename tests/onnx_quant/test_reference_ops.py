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

import platform

import numpy as np
import onnx
import pytest
from hypothesis import given, strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from conftest import onnxruntime_run
from onnx_quant.reference_ops import OPS, reference_evaluator

F32 = np.float32
MS = "com.microsoft"


def _has_avx2_fma() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx2" in flags and "fma" in flags


#: onnxruntime runs the MLAS kernels the reference reproduces (else: one step allowed)
MLAS_AVX2 = _has_avx2_fma()


def node_model(op, inputs, out_types, *, consts=(), domain=MS, onnx_opset=21, **attrs):
    """A one-node model: ``inputs`` (name, array or None: absent); names in ``consts`` are
    initializers, the others graph inputs (returned as feeds)."""
    names = [n if v is not None else "" for n, v in inputs]  # trailing "" kept: onnxruntime reads them
    outs = [f"Y{i}" for i in range(len(out_types))]
    node = helper.make_node(op, names, outs, domain=domain, **attrs)
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for n, v in inputs if v is not None and n not in consts]
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in inputs if v is not None and n in consts]
    ovis = [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(np.dtype(t)), None)
            for o, t in zip(outs, out_types)]
    imports = [helper.make_opsetid("", onnx_opset)] + ([helper.make_opsetid(MS, 1)] if domain == MS else [])
    model = helper.make_model(helper.make_graph([node], "g", vis, ovis, initializer=inits), opset_imports=imports)
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

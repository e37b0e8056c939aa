"""onnx_quant.oracles: which CPUs make onnxruntime's uint8 x int8 GEMMs inexact, the U8U8 widening
that makes it exact on every CPU, and the oracle a comparison picks. No verdict here depends on
the host CPU: the flag sets of both kinds are given, and the widened model is checked against
exact integer sums computed in numpy."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import onnx
import pytest
from hypothesis import given, strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_quant import model_zoo, oracles

#: /proc/cpuinfo flags of the two kinds of x86 host (abridged): an AMD EPYC (Zen 3) without VNNI
#: and an Intel Xeon (Sapphire Rapids) with AVX-512 VNNI, AVX-VNNI and AMX
EPYC_AVX2 = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma bmi2 sha_ni vaes vpclmulqdq".split()
XEON_VNNI = EPYC_AVX2 + "avx512f avx512bw avx512_vnni avx_vnni amx_int8 amx_tile".split()


@pytest.mark.parametrize("flags, machine, exact", [
    (EPYC_AVX2, "x86_64", False),
    (XEON_VNNI, "x86_64", True),
    (EPYC_AVX2 + ["avx_vnni"], "x86_64", True),      # Alder Lake: AVX-VNNI without AVX-512
    (EPYC_AVX2 + ["avx512f", "avx512bw"], "x86_64", False),  # Skylake-X: VPMADDUBSW in 512 bits
    ([], "aarch64", True),
])
def test_which_cpus_make_onnxruntime_u8s8_inexact(flags, machine, exact):
    assert oracles.u8s8_exact_on(flags, machine) is exact


def test_the_probe_agrees_with_this_hosts_flags():
    """The measured answer (a MatMulInteger that saturates where pairs are summed in int16) is
    the one the CPU flags predict, whichever kind this host is."""
    assert oracles.probe_u8s8_exact() == oracles.u8s8_exact_on(oracles.cpu_flags())


def _qlinear_matmul(w: np.ndarray, w_zp: int, k: int, n: int) -> onnx.ModelProto:
    a = helper.make_tensor_value_info("a", TensorProto.UINT8, [None, k])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, [None, n])
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(w_zp, np.int8), "w_zp"),
             numpy_helper.from_array(np.array(3, np.uint8), "a_zp")]
    node = helper.make_node("MatMulInteger", ["a", "w", "a_zp", "w_zp"], ["y"], name="mm")
    graph = helper.make_graph([node], "g", [a], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@given(st.integers(1, 40), st.integers(1, 6), st.integers(-128, 127), st.integers(0, 2**31 - 1))
def test_the_widened_model_sums_exactly(k, n, w_zp, seed):
    """MatMulInteger over saturating inputs (uint8 near 255, int8 near the ends): the widened
    model's outputs are numpy's exact int64 sums, on every CPU."""
    rng = np.random.default_rng(seed)
    w = rng.choice(np.array([-128, -127, 126, 127], np.int8), size=(k, n))
    a = rng.integers(250, 256, size=(5, k)).astype(np.uint8)
    model = _qlinear_matmul(w, w_zp, k, n)
    widened = oracles.widen_u8s8(model)
    assert widened.nodes == ("mm",) and oracles.u8s8_nodes(widened.model) == []
    (got,) = oracles.onnxruntime_run(widened.model, {"a": a}, level="ORT_DISABLE_ALL")
    want = (a.astype(np.int64) - 3) @ (w.astype(np.int64) - w_zp)
    assert np.array_equal(got, want)


def test_runtime_weights_are_widened_by_nodes():
    """A weight computed at run time (a graph input here) is moved to uint8 by Cast -> Add -> Cast."""
    a = helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 3])
    b = helper.make_tensor_value_info("b", TensorProto.INT8, [3, 2])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, [2, 2])
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"], name="mm")], "g", [a, b], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    widened = oracles.widen_u8s8(model)
    assert [n.op_type for n in widened.model.graph.node] == ["Cast", "Add", "Cast", "MatMulInteger"]
    av = np.full((2, 3), 255, np.uint8)
    bv = np.array([[127, -128], [127, -128], [127, 5]], np.int8)
    (got,) = oracles.onnxruntime_run(widened.model, {"a": av, "b": bv}, level="ORT_DISABLE_ALL")
    assert np.array_equal(got, av.astype(np.int64) @ bv.astype(np.int64))


def test_models_without_u8s8_gemms_are_left_as_written():
    model = _qlinear_matmul(np.ones((2, 2), np.int8), 0, 2, 2)
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.INT8  # int8 x int8
    model.graph.initializer[2].CopyFrom(numpy_helper.from_array(np.array(3, np.int8), "a_zp"))
    assert oracles.u8s8_nodes(model) == [] and oracles.widen_u8s8(model).nodes == ()


@pytest.fixture(scope="module")
def zoo_models():
    logging.getLogger().setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {(f, form): model_zoo.quantized(f, form, **kw)
                for f, kw in [("cnn", dict(blocks=1, channels=4)), ("mlp", dict(layers=2, features=16, hidden=16))]
                for form in model_zoo.FORMATS}


@pytest.mark.parametrize("family", ["cnn", "mlp"])
@pytest.mark.parametrize("form", model_zoo.FORMATS)
def test_widening_finds_every_gemm_and_keeps_onnxruntimes_fusions(zoo_models, family, form):
    """Every integer GEMM of the quantizer's three forms is found (QDQ: the weight DQs that
    onnxruntime fuses), the widened model has none left, and its optimized graph holds the same
    ops onnxruntime fuses the original into (so its QDQ fusion, and its numerics, are unchanged)."""
    model = zoo_models[(family, form)]
    gemm_ops = {"Conv", "Gemm", "MatMul"} if form == "qdq" else set(t for _, t in oracles.INTEGER_GEMMS)
    expected = sum(1 for n in model.graph.node if n.op_type in gemm_ops)
    widened = oracles.widen_u8s8(model)
    assert len(oracles.u8s8_nodes(model)) == expected > 0
    assert len(widened.nodes) == expected and oracles.u8s8_nodes(widened.model) == []
    assert _optimized_ops(widened.model) == _optimized_ops(model)


def _optimized_ops(model) -> list[str]:
    import tempfile

    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp, oracles.not_an_oracle():
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = f"{tmp}/m.onnx"
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return sorted(n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node)


@pytest.mark.parametrize("exact", [True, False])
def test_auto_picks_the_exact_oracle_on_either_kind_of_cpu(zoo_models, exact):
    """A u8s8 model is compared with the widened model on both kinds of host (the same verdict
    everywhere); the reason says what this CPU's onnxruntime would have done."""
    choice = oracles.choose_oracle(zoo_models[("cnn", "qoperator")], "auto", host_exact=exact)
    assert choice.name == "onnxruntime-u8u8"
    assert ("saturates" in choice.reason) is (not exact)


def test_auto_keeps_onnxruntime_for_models_without_u8s8(zoo_models):
    float_model = model_zoo.cnn(blocks=1, channels=4)
    choice = oracles.choose_oracle(float_model, "auto", host_exact=False)
    assert choice.name == "onnxruntime" and "no uint8 x int8" in choice.reason
    assert oracles.choose_oracle(float_model, "reference").name == "reference"
    with pytest.raises(ValueError, match="unknown oracle"):
        oracles.choose_oracle(float_model, "numpy")


def test_the_suite_refuses_a_saturating_oracle(zoo_models):
    """The suite's guard (tests/conftest.py): an onnxruntime session over a u8s8 model is refused,
    so no test can compare with it unguarded; the widened oracle passes it."""
    import onnxruntime as ort

    model = zoo_models[("mlp", "qoperator")]
    with pytest.raises(AssertionError, match="saturate"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ort.InferenceSession(oracles.widen_u8s8(model).model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_weights_within_64_cannot_saturate_and_pass_the_guard():
    """Constant int8 weights within +-64: no pair of products passes int16 (2 x 255 x 64 =
    32,640), so onnxruntime is exact on them on any CPU and the guard lets the session be."""
    import onnxruntime as ort

    bounded = _qlinear_matmul(np.full((4, 2), -64, np.int8), 0, 4, 2)
    assert oracles.u8s8_nodes(bounded) == ["mm"] and oracles.u8s8_nodes(bounded, saturable_only=True) == []
    a = np.full((1, 4), 255, np.uint8)
    (got,) = ort.InferenceSession(bounded.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})
    assert np.array_equal(got, (a.astype(np.int64) - 3) @ np.full((4, 2), -64))
    assert oracles.u8s8_nodes(_qlinear_matmul(np.full((4, 2), 65, np.int8), 0, 4, 2), saturable_only=True) == ["mm"]

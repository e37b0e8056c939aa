"""The conformance runner (backend_wgpu/conformance.py) and the run/conformance/demo commands.

The comparison rules are tested without a GPU; the rest runs a few cases and small models on
the default adapter (the whole 45-case run is tests/backend/test_onnx_backend_harness.py and
``onnx-quant conformance``).
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnx_quant.backend_wgpu.conformance import (
    FAMILY_OPS, case_names, case_op_type, compare_outputs, family_cases, run_case, status,
)
from onnx_quant.cli import main
from onnx_quant.errors import ExecutionError


#: dev: the default adapter at its maximum limits, get_device(None)'s device: the one the commands
#: these tests run (conformance, run, demo, bench_models) make, so that they share it and its caches
pytestmark = pytest.mark.devices("best-max-limits")


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# ------------------------------------------------------------------- cases and comparison


def test_the_family_has_45_cases_at_opset_28():
    cases = family_cases()
    assert len(cases) == 45
    ops = {case_op_type(c) for c in cases}
    assert ops == set(FAMILY_OPS) | {"DynamicQuantizeLinear (expanded)"}
    assert case_names(["qlinearmatmul"]) == [c.name for c in cases if c.name.startswith("test_qlinearmatmul")]
    assert len(case_names(["DynamicQuantizeLinear"])) == 6  # the expanded cases count as the op
    with pytest.raises(ExecutionError, match="Nope: not in the quantization family"):
        family_cases(["QuantizeLinear", "Nope"])


def test_integers_are_compared_exactly():
    a = np.array([1, 2, 3], np.uint8)
    assert compare_outputs([a], [a.copy()], ["y"]).exact
    c = compare_outputs([a], [np.array([1, 2, 4], np.uint8)], ["y"])
    assert not c.passed and c.max_error == 1 and "1 of 3 uint8 elements differ" in c.detail
    c = compare_outputs([a.astype(np.int8)], [a], ["y"])
    assert not c.passed and "dtype int8, expected uint8" in c.detail
    c = compare_outputs([a[:2]], [a], ["y"])
    assert not c.passed and "shape [2], expected [3]" in c.detail


def test_narrow_floats_are_compared_bit_for_bit():
    f8 = ml_dtypes.float8_e4m3fn
    e = np.array([1.0, -2.0, np.nan, 0.0], np.float32).astype(f8)
    nan_other = e.copy()
    nan_other.view(np.uint8)[2] = 0xFF  # another NaN code
    assert compare_outputs([nan_other], [e], ["y"]).passed
    neg_zero = e.copy()
    neg_zero.view(np.uint8)[3] = 0x80  # -0: equal as a number, not as bits
    c = compare_outputs([neg_zero], [e], ["y"])
    assert not c.passed and c.max_error == 0 and "bit for bit" in c.detail
    up = e.copy()
    up.view(np.uint8)[0] += 1  # one ulp: within rtol 1e-3? no: 1.125 vs 1, but bits decide anyway
    assert not compare_outputs([up], [e], ["y"]).passed


def test_wide_floats_use_the_harness_tolerance():
    e = np.array([1.0, 100.0, np.nan, np.inf], np.float32)
    g = e.copy()
    g[1] = np.float32(100.05)  # within rtol 1e-3
    c = compare_outputs([g], [e], ["y"])
    assert c.passed and not c.exact and c.max_error == pytest.approx(0.05, rel=1e-3)
    g[1] = np.float32(100.2)
    assert not compare_outputs([g], [e], ["y"]).passed
    g = e.copy()
    g[2] = 0.0
    c = compare_outputs([g], [e], ["y"])
    assert not c.passed and c.max_error == float("inf")


# ------------------------------------------------------------------- on the GPU


def _case(name):
    return next(c for c in family_cases() if c.name == name)


def test_a_case_passes_with_its_variant(dev):
    row = run_case(_case("test_qlinearmatmul_2D_int8_float32"), device=dev)
    assert row.passed and row.exact and row.max_error == 0 and not row.host_fallback, row
    assert row.variants and all(v.startswith("QLinearMatMul/") for v in row.variants)
    assert status(row) == "PASS" and json.dumps(row.as_dict())


def test_host_fallback_does_not_pass(dev):
    row = run_case(_case("test_dynamicquantizelinear_expanded"), device=dev)
    if not row.host_fallback:  # every op of the expansion got a GPU kernel
        assert row.passed
        return
    assert not row.passed and row.outputs_match and status(row) == "HOST"
    assert "ran on the host" in row.error


def test_conformance_command(dev, capsys):
    code, out, err = run_cli(capsys, "conformance", "--ops", "MatMulInteger,ConvInteger", "--json")
    rows = json.loads(out)
    assert [r["case"] for r in rows] == case_names(["MatMulInteger", "ConvInteger"])
    assert all({"case", "passed", "op_type", "max_error", "variants", "host_fallback", "error"} <= set(r) for r in rows)
    assert code == (0 if all(r["passed"] for r in rows) else 1)
    assert "[1/3] test_convinteger_without_padding" in err  # progress on stderr
    code, out, _ = run_cli(capsys, "conformance", "--ops", "MatMulInteger")
    assert "test_matmulinteger" in out and "1/1 passed" in out
    code, _, err = run_cli(capsys, "conformance", "--ops", "Relu")
    assert code == 1 and "not in the quantization family" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------- run


@pytest.fixture
def dql_path(tmp_path):
    from onnx_quant.backend_wgpu.commands import dql_model

    path = tmp_path / "dql.onnx"
    onnx.save(dql_model(1), path)
    return path


def test_run_prints_summary_timing_and_steps(dev, capsys, dql_path, tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, np.array([1.0, -2.0, 3.0, 0.5], np.float32))
    code, out, err = run_cli(capsys, "run", dql_path, "--input", f"x={x}", "--compare", "onnxruntime")
    assert code == 0, err
    assert "output y: uint8 [4] min " in out and "mean" in out
    assert "steady state" in out and "host fallback: none" in out
    assert "compare onnxruntime y: identical" in out
    # a NaN: onnxruntime skips it, the reference (and this backend) propagate it
    np.save(x, np.array([1.0, np.nan, -2.0, 3.0], np.float32))
    code, out, _ = run_cli(capsys, "run", dql_path, "--input", f"x={x}", "--compare", "onnxruntime")
    assert code == 1 and "compare onnxruntime y: 2 of 4 elements differ" in out and "255 quantization steps" in out
    assert "compare onnxruntime y_scale: 1 of 1 elements differ (1 NaN against a number)" in out


def test_run_steps_of_a_dequantized_output(dev, capsys, tmp_path):
    """A float output of a per-tensor DequantizeLinear: the difference is also given in steps."""
    from onnx_quant.backend_wgpu.reporting import describe_difference

    x = helper.make_tensor_value_info("q", TensorProto.UINT8, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    init = [onnx.numpy_helper.from_array(np.array(0.5, np.float32), "s")]
    model = helper.make_model(helper.make_graph([helper.make_node("DequantizeLinear", ["q", "s"], ["y"])],
                                                "g", [x], [y], init), opset_imports=[helper.make_opsetid("", 21)])
    same, text = describe_difference(model, "y", np.array([0, 1, 2, 3], np.float32), np.array([0, 1, 3, 3], np.float32))
    assert not same and "2 quantization steps of 0.5" in text


def test_run_bad_input_is_one_line(dev, capsys, dql_path, tmp_path):
    cases = []
    np.save(tmp_path / "f64.npy", np.zeros(4))
    np.save(tmp_path / "r2.npy", np.zeros((2, 2), np.float32))
    cases.append((["run", dql_path], "input 'x' (float32 ['d0']) is missing: give --input x=FILE.npy or --random"))
    cases.append((["run", dql_path, "--input", "x=/no/such.npy"], "cannot read /no/such.npy"))
    cases.append((["run", dql_path, "--input", f"z={tmp_path / 'f64.npy'}"], "the model has no input 'z'"))
    cases.append((["run", dql_path, "--input", f"x={tmp_path / 'f64.npy'}"], "input 'x': expected float32, found float64"))
    cases.append((["run", dql_path, "--input", f"x={tmp_path / 'r2.npy'}"], "rank"))
    cases.append((["run", dql_path, "--input", "x"], "expected NAME=FILE.npy"))
    for argv, expected in cases:  # bad arguments: exit 2 (docs/cli.md)
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, (argv, err)
    code, _, err = run_cli(capsys, "run", tmp_path / "missing.onnx")
    assert code == 2 and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------- demo


def test_demo_agrees_with_onnxruntime(dev, capsys):
    code, out, err = run_cli(capsys, "demo")
    assert "inferred" in out and "QLinearConv" in out and "[N, 8, 1, 1]" in out
    assert "host fallback:" in out
    assert code == 0, out + err
    assert "agreement" in out


# ------------------------------------------------------------------- whole-model benchmark


def test_bench_models_smoke(dev):
    """benchmarks/bench_models.py on a 10-node chain: one submit per run, the phase split adds up."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_models

    result = bench_models.run(families=(), formats=(), chain=10, repeat=2, log=lambda s: None)
    (row,) = result["rows"]
    assert "gpu_error" not in row, row
    assert row["submits_per_run"] == 1 and row["compilations_after_warmup"] == 0 and row["host_nodes"] == []
    assert row["max_abs_diff_vs_ort"] == 0
    assert row["split_ms"]["submit"] > 0 and row["split_ms"]["wait+read"] > 0
    assert "Per-node overhead" in bench_models.format_markdown(result)


def test_bench_models_interleaves_its_runs_with_a_served_revision(dev):
    """--interleave's protocol: this tree serving itself (``--serve``, as the baseline revision's
    package would) answers each round's timings; every row gets both medians and their ratio."""
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    sys.path.insert(0, str(bench))
    import bench_models

    args = ["--chain", "10", "--families", "", "--formats", "", "--exported", ""]
    server = subprocess.Popen([sys.executable, str(bench / "bench_models.py"), "--serve", *args], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    result = {"rows": [{"model": "chain"}]}
    try:
        items = bench_models.bench_items([], [], 10, [], shape_changes=False)
        bench_models.interleave(result, items, server, rounds=2, repeat=3, device=dev, log=lambda s: None)
    finally:
        server.stdin.close()
        assert server.wait(timeout=60) == 0
    (row,) = result["rows"]
    il = row["interleaved"]
    assert "error" not in il, il
    assert il["runs"] == 6 and il["gpu_ms"] > 0 and il["baseline_ms"] > 0
    assert il["speedup"] == il["baseline_ms"] / il["gpu_ms"]


def test_bench_models_counts_the_pipelines_a_second_shape_needs(dev):
    """The second-shape column counts the pipelines a run at another shape asks for that the first
    shape's run did not: 0 at the same shape, and, at shapes no run has compiled before, what the
    device's cache compiles for the second shape."""
    import sys
    from pathlib import Path

    import numpy as np
    from onnx import TensorProto, helper

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_models

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
                              "relu_neg", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    kw = dict(device=dev, repeat=1, timer=bench_models.PhaseTimer())
    feeds = {"x": np.linspace(-1, 1, 37, dtype=np.float32)}
    same = bench_models.bench_one("same", model, feeds, shape_changes={"batch": feeds}, **kw)
    assert "gpu_error" not in same, same
    # Relu -> Neg: one fused kernel, one pipeline
    assert same["compilations_new_batch"] == 0 and same["pipelines_first_run"] == same["dispatches_per_run"] == 1
    # from a cold cache the device compiles exactly what the row counts for both shapes
    dev.pipelines.forget()
    before = dev.pipelines.compilations
    row = bench_models.bench_one("other", model, {"x": np.ones(4099, np.float32)},
                                 shape_changes={"batch": {"x": np.ones(4103, np.float32)}}, **kw)
    assert "gpu_error" not in row, row
    assert dev.pipelines.compilations - before == row["pipelines_first_run"] + row["compilations_new_batch"]

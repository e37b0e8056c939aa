"""ONNX's whole node suite on the GPU (backend_wgpu/suite.py, ``onnx-quant conformance --suite all``):
outcomes per case and per op, the command, and the suite itself: no wrong value, no internal
error, and at least the measured number of passing cases."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper

from onnx_quant.backend_wgpu.conformance import CaseResult
from onnx_quant.backend_wgpu.reporting import make_session
from onnx_quant.backend_wgpu.spec import load_specs
from onnx_quant.backend_wgpu.verdict import HOST_ONLY_OPS, kernel_verdict
from onnx_quant.backend_wgpu.suite import OUTCOMES, outcome, run_suite, suite_cases, summarise
from onnx_quant.cli import main
from onnx_quant.errors import KernelRejected

#: measured on lavapipe with this commit's kernels (docs/conformance.md); a kernel lost or a case
#: newly declined shows here
MIN_PASSING = 1762


def _row(case, op, **kw):
    return CaseResult(case=case, op_type=op, **kw)


def test_outcomes_of_rows():
    rows = [
        _row("a", "Relu", passed=True, outputs_match=True, max_error=0.0),
        _row("b", "Relu", outputs_match=False, max_error=3.0, error="y: 1 of 4 differ"),
        _row("c", "Hardmax", error="1 node(s) cannot run on the GPU: node 'h' (Hardmax): no GPU kernel for Hardmax at opset 13"),
        _row("d", "Cast", error="1 node(s) cannot run on the GPU: node 'c' (Cast): kernel Cast: 'x' is string"),
        _row("e", "Cast", error="internal error: ValueError: boom"),
        _row("f", "LSTM", error="compiling the shader failed (kernel LSTM, variant v, pass main): GPUValidationError"),
        _row("g", "StringSplit", error="1 node(s) cannot run on the GPU: node 's' (StringSplit): StringSplit is host-only: "
                                       "string tensors have no device form"),
    ]
    assert [outcome(r) for r in rows] == ["pass", "wrong", "no kernel", "declined", "error", "error", "host-only"]
    summary = summarise(rows, [_row("a", "Relu", passed=True), _row("c", "Hardmax", passed=True)])
    by_op = {s.op_type: s for s in summary}
    assert (by_op["Relu"].cases, by_op["Relu"].passed, by_op["Relu"].wrong, by_op["Relu"].onnxruntime) == (2, 1, 1, 1)
    assert (by_op["Cast"].declined, by_op["Cast"].errors) == (1, 1)
    total = summary[-1]
    assert total.op_type == "all" and total.cases == 7 and total.onnxruntime == 2 and total.host_only == 1
    assert total.passed + total.wrong + total.declined + total.no_kernel + total.host_only + total.errors == total.cases
    assert summarise(rows)[-1].onnxruntime is None


def test_suite_cases_filter_by_op_and_count_expansions_as_their_op():
    cases = suite_cases(["LayerNormalization"])
    names = {c.name for c in cases}
    assert "test_layer_normalization_2d_axis0" in names
    assert "test_layer_normalization_2d_axis0_expanded_ver18" in names  # an expansion counts as its op
    assert len(suite_cases()) >= 1800


def test_sequence_inputs_run_and_compare_element_by_element(best):
    gpu, ort = run_suite(["SequenceInsert"], device=best)
    assert gpu and all(outcome(r) == "pass" for r in gpu)  # a list feed, a list output (sequence_steps.py)
    assert all(r.passed for r in ort)  # onnxruntime compares sequence outputs element by element


def test_string_feeds_are_typed_declines(best):
    """A string feed, alone or as a sequence's element, raises KernelRejected, as a kernel's
    decline does, naming the input: never a bare ExecutionError."""
    (case,) = [c for c in suite_cases(["Equal"]) if c.name == "test_equal_string"]
    session = make_session(case.model, device=best, host_fallback=True)
    x = np.array(["a", "b"], dtype=object)
    with pytest.raises(KernelRejected, match="input 'x': element type string has no device form"):
        session.run(None, {"x": x, "y": x})
    strings = helper.make_model(helper.make_graph(
        [helper.make_node("SequenceLength", ["s"], ["n"])], "g",
        [helper.make_tensor_sequence_value_info("s", onnx.TensorProto.STRING, None)],
        [helper.make_tensor_value_info("n", onnx.TensorProto.INT64, [])]))
    with pytest.raises(KernelRejected, match=r"input 's\[0\]': element type string has no device form"):
        make_session(strings, device=best, host_fallback=False).run(None, {"s": [x]})


def test_host_only_ops_are_declined_by_name():
    specs = load_specs()
    for (domain, op), why in HOST_ONLY_OPS.items():
        verdict = kernel_verdict(specs, helper.make_node(op, ["x"], ["y"], domain=domain), domain, 30, lambda n: 0)
        assert verdict.spec is None and verdict.reason.endswith(f"is host-only: {why}"), (op, verdict)


def test_conformance_suite_all_command(best, capsys):
    rc = main(["conformance", "--suite", "all", "--ops", "Relu,TfIdfVectorizer", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["suite"] == "all"
    ops = {o["op_type"]: o for o in out["ops"]}
    assert ops["Relu"]["passed"] == ops["Relu"]["cases"] > 0
    assert ops["TfIdfVectorizer"]["host_only"] == ops["TfIdfVectorizer"]["cases"] > 0
    assert ops["all"]["onnxruntime"] >= ops["Relu"]["cases"]
    assert {c["outcome"] for c in out["cases"]} <= set(OUTCOMES)
    rc = main(["conformance", "--suite", "all", "--ops", "Relu", "--no-onnxruntime"])
    text = capsys.readouterr()
    assert rc == 0 and "onnxruntime" not in text.out and "pass on" in text.err


def test_the_whole_node_suite_has_no_wrong_value(best):
    gpu, _ = run_suite(device=best, onnxruntime=False)
    total = summarise(gpu)[-1]
    bad = [(r.case, r.error) for r in gpu if outcome(r) in ("wrong", "error")]
    assert not bad, bad
    assert total.passed >= MIN_PASSING, total

"""ONNX's whole node suite on the GPU (backend_wgpu/suite.py, ``onnx-quant conformance --suite all``):
outcomes per case and per op, the command, and the suite itself: no wrong value, no internal
error, and at least the measured number of passing cases."""

from __future__ import annotations

import json

from onnx_quant.backend_wgpu.conformance import CaseResult
from onnx_quant.backend_wgpu.suite import OUTCOMES, outcome, run_suite, suite_cases, summarise
from onnx_quant.cli import main

#: measured on lavapipe with this commit's kernels (docs/conformance.md); a kernel lost or a case
#: newly declined shows here
MIN_PASSING = 1545


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
    ]
    assert [outcome(r) for r in rows] == ["pass", "wrong", "no kernel", "declined", "error", "error"]
    summary = summarise(rows, [_row("a", "Relu", passed=True), _row("c", "Hardmax", passed=True)])
    by_op = {s.op_type: s for s in summary}
    assert (by_op["Relu"].cases, by_op["Relu"].passed, by_op["Relu"].wrong, by_op["Relu"].onnxruntime) == (2, 1, 1, 1)
    assert (by_op["Cast"].declined, by_op["Cast"].errors) == (1, 1)
    total = summary[-1]
    assert total.op_type == "all" and total.cases == 6 and total.onnxruntime == 2
    assert total.passed + total.wrong + total.declined + total.no_kernel + total.errors == total.cases
    assert summarise(rows)[-1].onnxruntime is None


def test_suite_cases_filter_by_op_and_count_expansions_as_their_op():
    cases = suite_cases(["LayerNormalization"])
    names = {c.name for c in cases}
    assert "test_layer_normalization_2d_axis0" in names
    assert "test_layer_normalization_2d_axis0_expanded_ver18" in names  # an expansion counts as its op
    assert len(suite_cases()) >= 1800


def test_sequence_inputs_are_declined_not_internal_errors(best):
    gpu, ort = run_suite(["SequenceInsert"], device=best)
    assert gpu and all(outcome(r) == "declined" and "runs tensors only" in r.error for r in gpu)
    assert all(r.passed for r in ort)  # onnxruntime compares sequence outputs element by element


def test_conformance_suite_all_command(best, capsys):
    rc = main(["conformance", "--suite", "all", "--ops", "Relu,TfIdfVectorizer", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["suite"] == "all"
    ops = {o["op_type"]: o for o in out["ops"]}
    assert ops["Relu"]["passed"] == ops["Relu"]["cases"] > 0
    assert ops["TfIdfVectorizer"]["no_kernel"] == ops["TfIdfVectorizer"]["cases"] > 0
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

"""``onnx-quant infer``, ``check`` and ``example`` through ``onnx_quant.cli.main``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from onnx_quant.cli import main
from onnx_quant.examples import example_model

REPO = Path(__file__).resolve().parents[2]
F = TensorProto.FLOAT


def save(model, path) -> str:
    onnx.save(model, str(path))
    return str(path)


def problem_model():
    """Two nodes onnx's inference rejects (float + int64 Add), with names."""
    nodes = [helper.make_node("Add", ["x", "i"], ["a"], name="add_one"),
             helper.make_node("Add", ["x", "i"], ["b"], name="add_two")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, [2]), helper.make_tensor_value_info("i", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("a", F, [2]), helper.make_tensor_value_info("b", F, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def unknown_op_model():
    graph = helper.make_graph(
        [helper.make_node("Mystery", ["x"], ["y"], domain="com.example", name="m")], "g",
        [helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("y", F, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.example", 1)])


def contradicted_model():
    """``y = Transpose(x)`` declared ``[1, 3]`` where it is ``[3, 1]``, and a ``value_info``
    giving the intermediate ``t`` (``[1, 3]`` float) another element type and rank."""
    nodes = [helper.make_node("Relu", ["x"], ["t"], name="relu"), helper.make_node("Transpose", ["t"], ["y"], name="tr")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 3])],
                              [helper.make_tensor_value_info("y", F, [1, 3])],
                              value_info=[helper.make_tensor_value_info("t", TensorProto.DOUBLE, [1, 3, 1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


# ------------------------------------------------------------------ infer
def test_infer_example_prints_a_table_and_summary(capsys):
    assert main(["infer", "example"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["value", "dtype", "shape", "typed", "by"]
    rows = {line.split()[0]: line for line in out[1:-1]}
    model = example_model()
    expected_names = {v.name for v in model.graph.input} | {t.name for t in model.graph.initializer} | \
        {o for n in model.graph.node for o in n.output}
    assert set(rows) == expected_names
    assert re.search(r"^conv_q\s+uint8\s+\[N, 8, floor\(\(H \+ 1\) / 2\), floor\(\(W \+ 1\) / 2\)\]\s+\S", rows["conv_q"])
    assert "initializer" in rows["conv_w"] and "int8" in rows["conv_w"] and "[8, 3, 3, 3]" in rows["conv_w"]
    assert "input" in rows["image"]
    m = re.fullmatch(r"typed (\d+) values: (\d+) fully known, (\d+) symbolic, (\d+) unknown", out[-1])
    assert m, out[-1]
    total, known, symbolic, unknown = map(int, m.groups())
    assert total == len(rows) == known + symbolic + unknown
    assert unknown == 0 and symbolic >= 10 and known == len(model.graph.initializer) + 3  # scales of the fc


def test_infer_writes_the_model(tmp_path, capsys):
    out_path = tmp_path / "inferred.onnx"
    assert main(["infer", "example", "-o", str(out_path)]) == 0
    line = capsys.readouterr().out.strip()
    assert "\n" not in line and line.startswith(f"wrote {out_path}: typed ")
    written = onnx.load(str(out_path))
    onnx.checker.check_model(written, full_check=True)
    assert {v.name for v in written.graph.value_info} >= {"conv_q", "features", "fc_acc"}


def test_infer_unknown_marks_and_lenient_exit(tmp_path, capsys):
    path = save(unknown_op_model(), tmp_path / "u.onnx")
    assert main(["infer", path]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^y\s+float32\s+\[2\]\s+declared$", out, re.M)  # the declared output stands in
    assert out.strip().endswith("typed 2 values: 2 fully known, 0 symbolic, 0 unknown")


def test_infer_strict_fails_with_one_line(tmp_path, capsys):
    path = save(unknown_op_model(), tmp_path / "u.onnx")
    assert main(["infer", path, "--strict"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "unknown-op" in err and "'m' (Mystery)" in err and "Traceback" not in err


def test_infer_lenient_prints_problems_as_warnings(tmp_path, capsys):
    path = save(problem_model(), tmp_path / "p.onnx")
    assert main(["infer", path]) == 0
    err = capsys.readouterr().err.splitlines()
    # which rule rejects it (own rule or onnx's fallback) does not matter here
    assert len(err) == 2
    assert re.match(r"warning: 'add_one' \(Add\): [\w.:-]+: .*int64", err[0]), err[0]
    assert re.match(r"warning: 'add_two' \(Add\): [\w.:-]+: .*int64", err[1]), err[1]


# ------------------------------------------------------------------ check
def test_check_valid(tmp_path, capsys):
    path = save(example_model(), tmp_path / "ok.onnx")
    assert main(["check", path]) == 0
    assert capsys.readouterr().out.strip() == f"ok: {path}: no problems"
    assert main(["check", "example"]) == 0
    assert capsys.readouterr().out.strip() == "ok: example: no problems"


def test_check_notes_unchecked_unknown_ops(tmp_path, capsys):
    path = save(unknown_op_model(), tmp_path / "u.onnx")
    assert main(["check", path]) == 0
    assert capsys.readouterr().out.strip() == f"ok: {path}: no problems (1 node of unknown ops not checked)"


def test_check_lists_one_line_per_problem(tmp_path, capsys):
    path = save(problem_model(), tmp_path / "bad.onnx")
    assert main(["check", path]) == 1
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == 2
    assert re.match(r"'add_one' \(Add\): [\w.:-]+: .*int64", lines[0]), lines[0]
    assert re.match(r"'add_two' \(Add\): [\w.:-]+: .*int64", lines[1]), lines[1]
    assert captured.err.strip() == f"{path}: 2 problems"


def test_check_reports_checker_failure(tmp_path, capsys):
    model = example_model()
    model.ir_version = 0
    path = save(model, tmp_path / "noir.onnx")
    assert main(["check", path]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("<model>: onnx.checker: ")


@pytest.mark.parametrize("kind", ["missing", "directory", "text", "empty", "truncated"])
def test_check_unusable_input_exits_2(tmp_path, capsys, kind):
    path = tmp_path / "model.onnx"
    if kind == "directory":
        path = tmp_path
    elif kind == "text":
        path.write_text("this is not a model\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(example_model().SerializeToString()[:300])
    assert main(["check", str(path)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == ""
    assert "\n" not in err and err.startswith("onnx-quant check: error: ") and str(path) in err


def test_infer_unusable_input_exits_2(tmp_path, capsys):
    assert main(["infer", str(tmp_path / "missing.onnx")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_missing_file_via_subprocess(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "onnx_quant", "check", str(tmp_path / "nope.onnx")],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "nope.onnx: no such file" in lines[0]
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------ example
def test_example_writes_the_builtin_model(tmp_path, capsys):
    path = tmp_path / "ex.onnx"
    assert main(["example", "-o", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {path}: ")
    assert path.read_bytes() == example_model().SerializeToString()


def test_example_unwritable_path(tmp_path, capsys):
    assert main(["example", "-o", str(tmp_path / "no" / "such" / "dir.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "cannot write" in err


def test_check_resolves_external_data_beside_the_model(tmp_path, monkeypatch, capsys):
    import numpy as np
    from onnx import numpy_helper

    weight = numpy_helper.from_array(np.arange(64, dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", F, [64])], [helper.make_tensor_value_info("y", F, [64])],
                              [weight])
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    path = model_dir / "ext.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(path),
              save_as_external_data=True, location="ext.data", size_threshold=0)
    monkeypatch.chdir(tmp_path)  # not the model's folder
    assert main(["check", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"ok: {path}: no problems"


# ------------------------------------------------------------------ declared types
def test_declared_types_that_contradict_the_graph_are_named_by_check_and_infer(tmp_path, capsys):
    path = save(contradicted_model(), tmp_path / "m.onnx")
    assert main(["check", path]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "'relu' (Relu): value-info: value_info 't': the declared type contradicts what the graph computes "
        "(the element type differs): expected float32[1, 3] (inferred), found float64[1, 3, 1] (declared)",
        "'tr' (Transpose): output-type: graph output 'y': the declared type contradicts what the graph computes "
        "(the dim 0 differs): expected float32[3, 1] (inferred), found float32[1, 3] (declared)"]
    assert main(["infer", path, "-o", str(tmp_path / "kept.onnx")]) == 0
    err = capsys.readouterr().err
    assert [line.removeprefix("warning: ") for line in err.splitlines()] == lines
    kept = onnx.load(str(tmp_path / "kept.onnx"))
    assert [d.dim_value for d in kept.graph.output[0].type.tensor_type.shape.dim] == [1, 3]  # the contract stands
    assert main(["infer", path, "--runtime", "-o", str(tmp_path / "runtime.onnx")]) == 0
    assert "--runtime" in capsys.readouterr().err
    written = onnx.load(str(tmp_path / "runtime.onnx"))
    assert [d.dim_value for d in written.graph.output[0].type.tensor_type.shape.dim] == [3, 1]
    [t] = [v for v in written.graph.value_info if v.name == "t"]
    assert t.type.tensor_type.elem_type == F and len(t.type.tensor_type.shape.dim) == 2  # the stale note replaced

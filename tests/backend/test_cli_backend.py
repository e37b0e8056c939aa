"""The GPU subcommands: devices, explain, run, bench; conformance and demo say they come later."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnx_quant.backend_wgpu.commands import dql_model, numpy_dynamic_quantize_linear
from onnx_quant.cli import main
from support.models import NO_KERNEL_OPSET, no_kernel_node


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "dql.onnx"
    onnx.save(dql_model(1), path)
    return path


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_devices(gpu, capsys):
    code, out, _ = run_cli(capsys, "devices")
    assert code == 0
    assert gpu[0].summary in out and "(default)" in out
    assert "maxStorageBufferBindingSize" in out and "maxComputeWorkgroupsPerDimension" in out
    code, out, _ = run_cli(capsys, "devices", "--json")
    report = json.loads(out)
    assert code == 0 and len(report) == len(gpu)
    first = report[0]
    assert first["default"] and first["index"] == 0
    assert {"summary", "backend", "features", "kernel_features", "limits"} <= set(first)
    assert "maxComputeInvocationsPerWorkgroup" in first["limits"]  # read by the DQL spec
    if "subgroup" in gpu[0].features:
        assert "subgroup" in first["kernel_features"]


def test_explain(gpu, capsys, model_path):
    code, out, _ = run_cli(capsys, "explain", model_path)
    assert code == 0
    assert "DynamicQuantizeLinear" in out and "single_invocation" in out and "dispatch [1, 1, 1]" in out
    code, out, _ = run_cli(capsys, "explain", model_path, "--json")
    entries = json.loads(out)
    assert code == 0 and len(entries) == 1
    e = entries[0]
    assert {"node", "op_type", "kernel", "variant", "passes"} <= set(e)
    assert e["passes"][0]["name"] and e["passes"][0]["dispatch"] == [1, 1, 1]


def test_run_random_and_compare(gpu, capsys, model_path, tmp_path):
    out_dir = tmp_path / "out"
    code, out, err = run_cli(capsys, "run", model_path, "--random", "-o", out_dir, "--compare", "onnxruntime")
    assert code == 0, err
    assert "compare onnxruntime y: identical" in out
    x = np.load(out_dir / "x.npy")
    y = np.load(out_dir / "y.npy")
    assert np.array_equal(y, numpy_dynamic_quantize_linear(x)[0])
    code, out, err = run_cli(capsys, "run", model_path, "--input", f"x={out_dir / 'x.npy'}", "--compare", "reference")
    assert code == 0 and "compare reference y_scale: identical" in out


def test_run_reports_a_difference(gpu, capsys, model_path, tmp_path):
    zeros = tmp_path / "zeros.npy"
    np.save(zeros, np.zeros(8, np.float32))
    # all zero: onnxruntime's scale is 1.0, ours (the reference's) RN(1/255)
    code, out, _ = run_cli(capsys, "run", model_path, "--input", f"x={zeros}", "--compare", "onnxruntime")
    assert code == 1 and "compare onnxruntime y_scale: 1 of 1 elements differ" in out
    code, out, _ = run_cli(capsys, "run", model_path, "--input", f"x={zeros}", "--compare", "reference")
    assert code == 0


def test_run_errors_are_one_line(gpu, capsys, model_path, tmp_path):
    # bad arguments (an input left without a value, a file that cannot be read) exit 2, as docs/cli.md says
    code, _, err = run_cli(capsys, "run", model_path)
    assert code == 2 and "missing" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, "run", model_path, "--input", "x=/no/such.npy")
    assert code == 2 and "cannot read" in err
    code, _, err = run_cli(capsys, "run", tmp_path / "missing.onnx")
    assert code == 2
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    # an op of an unknown domain: no kernel and the host reference cannot run it either
    custom = helper.make_model(
        helper.make_graph([helper.make_node("Frobnicate", ["x"], ["y"], domain="example.custom")], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.custom", 1)])
    onnx.save(custom, tmp_path / "custom.onnx")
    code, _, err = run_cli(capsys, "run", tmp_path / "custom.onnx", "--random")
    assert code == 1 and "Frobnicate" in err and "no GPU kernel" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, "explain", model_path, "--adapter", "no-such-adapter")
    assert code == 1 and "no usable adapter" in err


def test_bench_small(gpu, capsys):
    code, out, err = run_cli(capsys, "bench", "--sizes", "10", "--repeat", "1", "--json")
    assert code == 0, err
    result = json.loads(out)
    rows = result["rows"]
    impls = {r["impl"] for r in rows}
    assert {"numpy", "gpu"} <= impls
    gpu_rows = [r for r in rows if r["impl"] == "gpu"]
    assert {r["variant"] for r in gpu_rows} == {"single_invocation", "parallel_subgroup_reduce_vec4",
                                                "parallel_subgroup_reduce", "grid_stride_reduce_vec4",
                                                "grid_stride_reduce"}
    for r in gpu_rows:
        assert r["exact"] and r["compilations"] == 0 and r["buffers"] == 0 and r["gb_per_s"] > 0
    code, out, err = run_cli(capsys, "bench", "--sizes", "1")
    assert code == 1 and "--sizes" in err


@pytest.mark.parametrize("command", ["conformance", "demo"])
@pytest.mark.gpu
def test_later_commands_do_not_traceback(capsys, command):
    code, _, err = run_cli(capsys, command)
    assert code in (0, 1) and "Traceback" not in err


def test_cli_entry_point_runs(gpu, model_path):
    out = subprocess.run([sys.executable, "-m", "onnx_quant", "explain", str(model_path), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)[0]["variant"] == "single_invocation"


# --------------------------------------------------------------------------- shapes, feeds, explain


def detector_like_model() -> onnx.ModelProto:
    """images [N, 3, H, W] -> Conv (stride 2) -> BatchNormalization -> Relu -> Resize x2 -> Concat with
    images -> Conv 1x1 -> Mul -> Sigmoid: valid only where H and W are even (a 1x1 image makes the
    Concat invalid, as a detector's does at sizes that are no multiple of its stride). 8 nodes: the
    BatchNormalization folds into the Conv, Conv+BN+Relu fuse, Mul+Sigmoid fuse."""
    rng = np.random.default_rng(0)
    f = lambda name, a: onnx.numpy_helper.from_array(np.asarray(a, np.float32), name)  # noqa: E731
    inits = [f("w", rng.standard_normal((4, 3, 3, 3))), f("bn_s", np.ones(4)), f("bn_b", np.zeros(4)),
             f("bn_m", np.zeros(4)), f("bn_v", np.ones(4)), f("scales", [1, 1, 2, 2]),
             f("w2", rng.standard_normal((2, 7, 1, 1))), f("two", 2.0)]
    nodes = [helper.make_node("Conv", ["images", "w"], ["c1"], name="conv1", kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"], ["b1"], name="bn1"),
             helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
             helper.make_node("Resize", ["r1", "", "scales"], ["up"], name="up", mode="nearest"),
             helper.make_node("Concat", ["images", "up"], ["cat"], name="cat", axis=1),
             helper.make_node("Conv", ["cat", "w2"], ["c2"], name="conv2", kernel_shape=[1, 1]),
             helper.make_node("Mul", ["c2", "two"], ["m"], name="mul"),
             helper.make_node("Sigmoid", ["m"], ["out"], name="sig")]
    g = helper.make_graph(nodes, "det", [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 2, "H", "W"])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def detector_path(tmp_path):
    path = tmp_path / "det.onnx"
    onnx.save(detector_like_model(), path)
    return path


USER_NODES = ["conv1", "bn1", "relu1", "up", "cat", "conv2", "mul", "sig"]


def test_explain_plans_at_the_default_shapes_and_accounts_for_every_node(gpu, capsys, detector_path):
    code, out, err = run_cli(capsys, "explain", detector_path)
    assert code == 0, err
    assert err == ""  # no raw warning
    lines = out.splitlines()
    assert lines[1].startswith("dims: N=1, H=32, W=32 (all defaults") and lines[2] == "input images: [1, 3, 32, 32]"
    assert lines[3] == ("nodes: 8 as written -> 5 below (1 BatchNormalization folded into the Conv before it; "
                        "2 fused nodes stand for 4)")
    assert lines[4] == "placement: 5 gpu"
    assert "  fused (epilogue): conv1 (Conv), bn1 (BatchNormalization, folded), relu1 (Relu) -> conv1+relu1" in lines
    assert "  fused (elementwise): mul (Mul), sig (Sigmoid) -> mul+sig" in lines
    assert "host" not in out and "None" not in out
    code, out, _ = run_cli(capsys, "explain", detector_path, "--json")
    entries = json.loads(out)
    assert sorted(n["node"] for e in entries for n in e["as_written"]) == sorted(USER_NODES)
    assert [n["node"] for e in entries for n in e["as_written"] if n["folded"]] == ["bn1"]


def test_explain_names_the_cause_where_the_shapes_make_nodes_invalid(gpu, capsys, detector_path):
    code, out, err = run_cli(capsys, "explain", detector_path, "--dim", "H=1", "--dim", "W=1")
    assert code == 0 and err == ""
    assert "host" not in out and "kernel unused" not in out and "locking.py" not in out + err
    stuck = next(ln for ln in out.splitlines() if ln.startswith("not planned at these input shapes"))
    assert "3 node(s) (cat, conv2, mul+sig)" in stuck
    assert "'cat' (Concat): Concat: input #1: dim 2 differs between inputs" in stuck
    assert "N=1 took defaults" in stuck and "--shape images=N,3,1,1" in stuck and "--dim SYMBOL=V" in stuck
    assert "cat (Concat): not planned: its shapes are not known at these input shapes" in out
    code, out, _ = run_cli(capsys, "explain", detector_path, "--shape", "images=1,3,1,1")
    assert code == 0 and "these are the shapes given: check them against the model" in out
    code, out, _ = run_cli(capsys, "explain", detector_path, "--shape", "images=1,3,1,1", "--json")
    placements = {e["node"]: e["placement"] for e in json.loads(out)}
    assert placements["cat"] == "not_planned" and "host" not in placements.values()


def test_explain_says_what_nodes_without_a_kernel_are(gpu, capsys, tmp_path):
    """A view, a constant-folded shape computation, a Shape only a view reads, an unused node and a
    host node: each says what it is, none reads "kernel unused, variant unused"; the host fallback
    warning is in the listing, not on stderr."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["u"])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Shape", ["r"], ["s"], name="shape"),
             helper.make_node("Reshape", ["r", "s"], ["v"], name="view"),
             helper.make_node("Size", ["r"], ["n"], name="size"),
             helper.make_node("Cast", ["n"], ["nf"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Add", ["v", "nf"], ["a"], name="add"),
             no_kernel_node("a", "y", name="host_node"),
             helper.make_node("Neg", ["x"], ["dead"], name="unused_neg")]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(*NO_KERNEL_OPSET)])
    onnx.save(m, tmp_path / "m.onnx")
    code, out, err = run_cli(capsys, "explain", tmp_path / "m.onnx")
    assert code == 0 and err == "", err
    assert "placement: 3 gpu, 1 not run, 1 view, 1 constant folded, 1 host, 1 unused" in out
    assert "shape (Shape): not run: what reads it needs nothing of it at run time" in out
    assert "size (Size): constant-folded: no kernel" in out
    assert "view (Reshape): view: no kernel" in out
    assert "unused_neg (Neg): unused: no graph output depends on it" in out
    op = nodes[6].op_type
    assert f"host_node ({op}): host (onnx.reference)" in out and f"no GPU kernel for {NO_KERNEL_OPSET[0]}::{op}" in out
    assert "kernel unused" not in out and "variant view" not in out and "kernel host" not in out
    code, _, err = run_cli(capsys, "run", tmp_path / "m.onnx", "--random")
    # run reports its warnings in one line each, never Python's two-line form
    assert code == 0 and "Warning:" not in err and all(ln.startswith("onnx-quant run: warning: ")
                                                       for ln in err.splitlines()), err


def test_run_binds_shapes_prints_dims_and_draws_small_integers(gpu, capsys, tmp_path):
    x = helper.make_tensor_value_info("ids", TensorProto.INT32, ["batch", "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, ["batch", "seq"])
    m = helper.make_model(helper.make_graph([helper.make_node("Neg", ["ids"], ["y"], name="neg")], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, tmp_path / "m.onnx")
    code, out, err = run_cli(capsys, "run", tmp_path / "m.onnx", "--random", "-o", tmp_path / "o")
    assert code == 0, err
    assert "dims: batch=1, seq=32 (all defaults" in out and "input  ids: int32 [1, 32]" in out
    ids = np.load(tmp_path / "o" / "ids.npy")
    assert ids.min() >= 0 and ids.max() < 16  # the documented default range [0, 16)
    code, out, err = run_cli(capsys, "run", tmp_path / "m.onnx", "--random", "--dim", "seq=5", "--shape", "ids=3,5",
                             "--int-range", "100,200", "-o", tmp_path / "o")
    assert code == 0, err
    assert "dims: batch=3, seq=5\n" in out and "input  ids: int32 [3, 5]" in out
    ids = np.load(tmp_path / "o" / "ids.npy")
    assert ids.min() >= 100 and ids.max() < 200


def test_session_dtype_message_reads_cleanly(gpu, model_path):
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import ExecutionError

    x = helper.make_tensor_value_info("x", TensorProto.INT32, [2])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, [2])
    m = helper.make_model(helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17)])
    with Session(m) as s, pytest.raises(ExecutionError) as e:
        s.run(None, {"x": np.zeros(2, np.int64)})
    assert str(e.value) == "input 'x': expected int32, found int64"

"""Hostile and broken inputs, each through the API (error class and rule) and the CLI
(``python -m onnx_quant``: exit code, one line, no traceback). The corpus is built here, in
tmp_path: special files, external data escaping the folder, structural faults, nesting
bombs, models asking for huge host allocations, spec expression bombs."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper as h, numpy_helper

from onnx_quant import inference
from onnx_quant.errors import BudgetError, InferenceError, ModelLoadError
from onnx_quant.inference.structure import MAX_SUBGRAPH_DEPTH
from onnx_quant.model_io import load_model

F = T.FLOAT


def cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 120):
    """(exit code, stderr lines) of ``python -m onnx_quant ARGS``."""
    full_env = {**os.environ, **(env or {})}
    p = subprocess.run([sys.executable, "-m", "onnx_quant", *args], capture_output=True, text=True,
                       cwd=cwd, env=full_env, timeout=timeout)
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, p.stderr
    return p.returncode, [line for line in p.stderr.splitlines() if line.strip()]


def one_error_line(lines: list[str], command: str, *needles: str) -> str:
    errors = [line for line in lines if line.startswith(f"onnx-quant {command}: error: ")]
    assert len(errors) == 1, lines
    for n in needles:
        assert n in errors[0], (n, errors[0])
    return errors[0]


def relu_model(x_shape=(2,), opset: int = 17) -> onnx.ModelProto:
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"], name="act")], "g",
                     [h.make_tensor_value_info("x", F, list(x_shape))], [h.make_tensor_value_info("y", F, list(x_shape))])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


# ---------------------------------------------------------------- special files


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    with pytest.raises(ModelLoadError, match="is a FIFO: expected an .onnx file"):
        load_model(str(fifo))
    code, lines = cli("infer", str(fifo), timeout=60)
    assert code == 2
    one_error_line(lines, "infer", "is a FIFO")


def test_dev_zero_and_folders_are_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="is a character device"):
        load_model("/dev/zero")
    with pytest.raises(ModelLoadError, match="is a directory"):
        load_model(str(tmp_path))
    code, lines = cli("check", "/dev/zero")
    assert code == 2
    one_error_line(lines, "check", "/dev/zero: is a character device")


def test_unreadable_path_is_a_load_error(tmp_path, monkeypatch, capsys):
    path = save(relu_model(), tmp_path / "m.onnx")

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "stat", denied)  # what a folder without search permission gives
    with pytest.raises(ModelLoadError, match="m.onnx: cannot access: Permission denied"):
        load_model(str(path))
    # the CLI in-process (root, as CI runs, ignores real folder permissions: the test below)
    from onnx_quant.cli import main

    assert main(["infer", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("onnx-quant infer: error: ") and "cannot access: Permission denied" in err[0]


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores folder permissions (the test above covers the API and the CLI)")
def test_folder_without_search_permission(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    path = save(relu_model(), folder / "m.onnx")
    folder.chmod(0)
    try:
        with pytest.raises(ModelLoadError, match="cannot access: Permission denied"):
            load_model(str(path))
        code, lines = cli("infer", str(path))
        assert code == 2
        one_error_line(lines, "infer", "cannot access: Permission denied")
    finally:
        folder.chmod(stat.S_IRWXU)


def test_file_beyond_the_budget_is_refused_before_reading(tmp_path):
    path = save(relu_model(), tmp_path / "m.onnx")
    size = path.stat().st_size
    with pytest.raises(ModelLoadError, match=f"file of {size} bytes: expected at most 16 bytes"):
        load_model(str(path), budget=16)
    code, lines = cli("infer", str(path), env={"ONNX_QUANT_MEMORY_BUDGET": "16"})
    assert code == 2
    one_error_line(lines, "infer", f"file of {size} bytes")


# ---------------------------------------------------------------- external data


def external_model(folder: Path, location: str = "weights.bin", n: int = 4) -> Path:
    w = numpy_helper.from_array(np.arange(n, dtype=np.float32), "w")
    g = h.make_graph([h.make_node("Add", ["x", "w"], ["y"], name="add")], "g",
                     [h.make_tensor_value_info("x", F, [n])], [h.make_tensor_value_info("y", F, [n])], [w])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "m.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), str(path), save_as_external_data=True,
              location=location, size_threshold=0)
    return path


def test_in_memory_model_never_reads_external_data_from_the_cwd(tmp_path, monkeypatch):
    path = external_model(tmp_path / "m", "secret.bin")
    data = path.read_bytes()
    monkeypatch.chdir(tmp_path / "m")  # secret.bin is right here: it must not be read
    for source in (data, onnx.load(str(path), load_external_data=False)):
        with pytest.raises(ModelLoadError, match="tensor 'w': the model was given in memory.*expected base_dir="):
            load_model(source, load_external_data=True)
        with pytest.raises(ModelLoadError, match="tensor 'w'.*base_dir="):
            inference.check_model(source)
    loaded = load_model(data, load_external_data=True, base_dir=tmp_path / "m")
    assert np.array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), np.arange(4, dtype=np.float32))
    assert inference.check_model(data, base_dir=tmp_path / "m") == []


def test_a_symlink_out_of_the_model_folder_is_refused(tmp_path):
    path = external_model(tmp_path / "m")
    outside = tmp_path / "outside.bin"
    (tmp_path / "m" / "weights.bin").rename(outside)
    (tmp_path / "m" / "weights.bin").symlink_to(outside)
    with pytest.raises(ModelLoadError, match="tensor 'w' points outside the model's folder.*a link to"):
        load_model(str(path), load_external_data=True)


def test_external_data_shorter_than_its_tensor_and_a_fifo_as_data(tmp_path):
    path = external_model(tmp_path / "m")
    (tmp_path / "m" / "weights.bin").write_bytes(b"\0" * 8)
    with pytest.raises(ModelLoadError, match=r"tensor 'w': expected bytes 0\.\.16 of 'weights.bin', found a file of 8"):
        load_model(str(path), load_external_data=True)
    os.remove(tmp_path / "m" / "weights.bin")
    os.mkfifo(tmp_path / "m" / "weights.bin")
    with pytest.raises(ModelLoadError, match="tensor 'w': is a FIFO"):
        load_model(str(path), load_external_data=True)


def test_external_data_beyond_the_budget_is_refused_before_loading(tmp_path):
    path = external_model(tmp_path / "m", n=1024)
    assert path.stat().st_size < 1000
    with pytest.raises(BudgetError, match="tensor 'w'.*needs 4096 bytes.*budget of 1000 bytes"):
        load_model(str(path), load_external_data=True, budget=1000)


def test_a_too_short_initializer_names_the_tensor():
    model = relu_model()
    t = numpy_helper.from_array(np.zeros(2, dtype=np.float32), "big")
    del t.dims[:]
    t.dims.append(1000)
    model.graph.initializer.append(t)
    from onnx_quant.model_io import initializer_arrays
    from onnx_quant.budget import resolve

    with pytest.raises(ModelLoadError, match=r"initializer 'big': its data does not fill dims \[1000\]"):
        initializer_arrays(model, resolve(None))


# ---------------------------------------------------------------- structural faults


def cycle_model() -> onnx.ModelProto:
    g = h.make_graph([h.make_node("Relu", ["b"], ["a"], name="r1"), h.make_node("Relu", ["a"], ["b"], name="r2"),
                      h.make_node("Add", ["x", "b"], ["y"], name="add")], "g",
                     [h.make_tensor_value_info("x", F, [2])], [h.make_tensor_value_info("y", F, [2])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def twice_model() -> onnx.ModelProto:
    g = h.make_graph([h.make_node("Relu", ["x"], ["a"], name="r1"), h.make_node("Neg", ["x"], ["a"], name="r2"),
                      h.make_node("Add", ["x", "a"], ["y"], name="add")], "g",
                     [h.make_tensor_value_info("x", F, [2])], [h.make_tensor_value_info("y", F, [2])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def nested_if(depth: int) -> onnx.ModelProto:
    """``depth`` If nodes, each the then-branch of the one above; built outside in, in place
    (onnx.helper copies each level, and protobuf refuses to parse past 100 levels)."""
    out = h.make_tensor_value_info("t", F, [2])
    g = h.make_graph([], "g", [h.make_tensor_value_info("x", F, [2]), h.make_tensor_value_info("c", T.BOOL, [])], [out])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    graph = model.graph
    for i in range(depth):
        node = graph.node.add()
        node.op_type, node.name = "If", f"if{i}"
        node.input.append("c")
        node.output.append("t")
        els = node.attribute.add()
        els.name, els.type = "else_branch", onnx.AttributeProto.GRAPH
        els.g.CopyFrom(h.make_graph([h.make_node("Identity", ["x"], ["t"])], f"e{i}", [], [out]))
        then = node.attribute.add()
        then.name, then.type = "then_branch", onnx.AttributeProto.GRAPH
        graph = then.g
        graph.name = f"b{i}"
        graph.output.add().CopyFrom(out)
    graph.node.add().CopyFrom(h.make_node("Identity", ["x"], ["t"]))
    return model


@pytest.mark.parametrize("build, rule, node", [(cycle_model, "graph-order", "'r1' (Relu)"),
                                               (twice_model, "single-assignment", "'r2' (Neg)")])
def test_structural_faults_are_refused_by_session_with_checks_rule(best, build, rule, node, tmp_path):
    from onnx_quant.backend_wgpu.session import Session

    model = build()
    assert [(d.rule, d.node) for d in inference.check_model(model) if d.rule != "onnx.checker"] == [(rule, node)]
    with pytest.raises(InferenceError) as e:
        Session(model, device=best)
    assert (e.value.rule, e.value.node) == (rule, node)
    path = save(model, tmp_path / "bad.onnx")
    code, lines = cli("run", str(path), "--random")
    assert code == 1
    one_error_line(lines, "run", f"{rule}: node {node}")
    code, out = cli("check", str(path))
    assert code == 1


@pytest.mark.parametrize("depth", [MAX_SUBGRAPH_DEPTH + 1, 250])
def test_nesting_bombs_are_bounded(best, depth, tmp_path):
    from onnx_quant.backend_wgpu.session import Session

    model = nested_if(depth)
    for call in (inference.infer_shapes, lambda m: Session(m, device=best)):
        with pytest.raises(InferenceError) as e:
            call(model)
        assert e.value.rule == "graph-depth" and e.value.node == "'if0' (If)"
    rules = [d.rule for d in inference.check_model(model)]
    assert "graph-depth" in rules


def test_nesting_at_the_bound_still_infers():
    out = inference.infer_shapes(nested_if(MAX_SUBGRAPH_DEPTH), strict=True)
    assert out.graph.output[0].type.tensor_type.elem_type == F


# ---------------------------------------------------------------- check: model facts


def test_check_flags_negative_dims_and_unknown_opsets(tmp_path):
    neg = relu_model((-5,))
    assert [(d.rule, d.message) for d in inference.check_model(neg) if d.rule == "shape.negative-dim"] == [
        ("shape.negative-dim", "input 'x' dim 0: expected a dim >= 0 (or a symbol), found -5"),
        ("shape.negative-dim", "output 'y' dim 0: expected a dim >= 0 (or a symbol), found -5")]
    newest = onnx.defs.onnx_opset_version()
    bad = relu_model(opset=1000)
    assert [d.rule for d in inference.check_model(bad)] == ["opset-import.version"]
    assert inference.check_model(relu_model(opset=newest)) == []
    code, _ = cli("check", str(save(bad, tmp_path / "o.onnx")))
    assert code == 1


def test_session_reads_external_data_of_bytes_only_from_base_dir(best, tmp_path, monkeypatch):
    from onnx_quant.backend_wgpu.session import Session

    path = external_model(tmp_path / "m", "secret.bin")
    monkeypatch.chdir(tmp_path / "m")
    with pytest.raises(ModelLoadError, match="tensor 'w'.*expected base_dir="):
        Session(path.read_bytes(), device=best)
    x = np.array([1, -2, 3, 0.5], dtype=np.float32)
    (got,) = Session(path.read_bytes(), device=best, base_dir=tmp_path / "m").run(None, {"x": x})
    assert got.tobytes() == (x + np.arange(4, dtype=np.float32)).tobytes()


# ---------------------------------------------------------------- spec bombs

SEED_SPEC = Path(__file__).resolve().parents[1] / "templates" / "dynamic_quantize_linear.kernel.json"


def seed_spec(tmp_path: Path, edit) -> "object":
    import json

    from onnx_quant.backend_wgpu.spec import load_spec

    doc = json.loads(SEED_SPEC.read_text())
    edit(doc)
    for v in doc["variants"]:
        for p in v["passes"]:
            (tmp_path / p["shader"]).write_text("// not rendered\n")
    path = tmp_path / "k.kernel.json"
    path.write_text(json.dumps(doc))
    return load_spec(path)


def plan_tiny(spec):
    from onnx_quant.backend_wgpu.device_info import DeviceInfo
    from onnx_quant.backend_wgpu.planner import plan_node

    return plan_node(spec, shapes={"x": (4,), "y": (4,), "y_scale": (), "y_zero_point": ()},
                     dtypes={"x": "float32", "y": "uint8", "y_scale": "float32", "y_zero_point": "uint8"},
                     device=DeviceInfo(), node_label="dql0")


def test_a_squaring_derive_chain_is_refused_quickly(tmp_path):
    import time

    from onnx_quant.backend_wgpu.expr import MAX_INT_BITS
    from onnx_quant.errors import ExpressionError

    def chain(doc):
        doc["derive"]["b0"] = "7" * 4000  # a 4000-digit literal, within the length limit
        for k in range(1, 40):
            doc["derive"][f"b{k}"] = f"b{k - 1} * b{k - 1}"

    spec = seed_spec(tmp_path, chain)
    t0 = time.perf_counter()
    with pytest.raises(ExpressionError, match=f"integer of 13288 bits .*expected at most {MAX_INT_BITS} bits"):
        plan_tiny(spec)
    assert time.perf_counter() - t0 < 5

    def small_chain(doc):
        doc["derive"]["b0"] = "3"
        for k in range(1, 40):
            doc["derive"][f"b{k}"] = f"b{k - 1} * b{k - 1}"

    with pytest.raises(ExpressionError, match="bits .*expected at most 256 bits"):
        plan_tiny(seed_spec(tmp_path, small_chain))


def test_a_dispatch_far_beyond_the_tensor_is_refused_naming_the_node(tmp_path):
    from onnx_quant.backend_wgpu.work_bounds import DispatchBoundError

    def bomb(doc):
        for v in doc["variants"]:
            for p in v["passes"]:
                p["dispatch"] = {"x": "65535", "y": "65535"}

    with pytest.raises(DispatchBoundError, match=r"node 'dql0'.*dispatch \[65535, 65535, 1\].*expected at most"):
        plan_tiny(seed_spec(tmp_path, bomb))
    assert plan_tiny(seed_spec(tmp_path, lambda doc: None)).passes  # the seed spec itself plans


# ---------------------------------------------------------------- memory budget


def big_output_model(op: str) -> onnx.ModelProto:
    """A tiny input, a node whose output inference sizes at 4-64 GiB."""
    x = h.make_tensor_value_info("x", F, [2])
    inits, nodes = [], []
    if op == "ConstantOfShape":
        inits.append(numpy_helper.from_array(np.array([2**30], dtype=np.int64), "shape"))
        nodes.append(h.make_node("ConstantOfShape", ["shape"], ["big"], name="fill",
                                 value=numpy_helper.from_array(np.array([1.5], dtype=np.float32))))
    elif op == "Tile":
        inits.append(numpy_helper.from_array(np.array([2**31], dtype=np.int64), "reps"))
        nodes.append(h.make_node("Tile", ["x", "reps"], ["big"], name="tile"))
    else:  # Expand
        inits.append(numpy_helper.from_array(np.array([2**40, 2], dtype=np.int64), "shape"))
        nodes.append(h.make_node("Expand", ["x", "shape"], ["big"], name="expand"))
    g = h.make_graph(nodes, "g", [x], [h.make_tensor_value_info("big", F, None)], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("op, node, nbytes", [("ConstantOfShape", "fill", 4 * 2**30), ("Tile", "tile", 8 * 2**31),
                                              ("Expand", "expand", 8 * 2**40)])
def test_host_work_beyond_the_budget_is_refused_before_it_is_allocated(best, op, node, nbytes, tmp_path):
    import time
    import warnings

    from onnx_quant.backend_wgpu.session import Session

    from onnx_quant.backend_wgpu.spec import SpecRegistry, load_specs

    model = big_output_model(op)
    # Tile, Expand and ConstantOfShape have GPU kernels: a registry without them makes the node host work
    host_specs = SpecRegistry(s for s in load_specs() if s.name not in ("Tile", "Expand", "ConstantOfShape"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = Session(model, device=best, memory_budget="1G", specs=host_specs)
        t0 = time.perf_counter()
        with pytest.raises(BudgetError, match=f"node '{node}' .*needs {nbytes} bytes.*budget of {2**30} bytes"):
            s.run(None, {"x": np.ones(2, dtype=np.float32)})
    assert time.perf_counter() - t0 < 10
    code, lines = cli("run", str(save(model, tmp_path / "m.onnx")), "--random", env={"ONNX_QUANT_MEMORY_BUDGET": "1G"})
    # a GPU ConstantOfShape of 4 GiB is refused for the device's storage limit (a run failure, exit 1),
    # never sent to the host; Tile's kernel declines 2^31 lanes or more (its index math is u32), so
    # its 16 GiB output, like Expand's 8 TiB, is refused by the plan-time budget check (exit 2)
    on_gpu = op == "ConstantOfShape"
    assert code == (1 if on_gpu else 2)
    one_error_line(lines, "run", f"node '{node}'", "more than this device allows" if on_gpu else f"needs {nbytes} bytes")


@pytest.mark.parametrize("dim, needle", [(2**62, f"needs {4 * 2**62} bytes"), (-5, "expected dims >= 0, found -5")])
def test_random_feeds_of_absurd_dims_are_a_clear_error(dim, needle, tmp_path):
    path = save(relu_model((dim,)), tmp_path / "m.onnx")
    code, lines = cli("run", str(path), "--random")
    assert code == 2
    one_error_line(lines, "run", "--random input 'x'", needle)


def test_budget_setting_is_validated():
    from onnx_quant.budget import parse_size, resolve

    assert parse_size("512M") == 512 * 2**20 and parse_size("3g") == 3 * 2**30 and parse_size("4096") == 4096
    assert resolve("2G").limit == 2 * 2**30
    with pytest.raises(BudgetError, match="expected a byte count like 4096, 512M or 8G, found 'lots'"):
        parse_size("lots")
    with pytest.raises(BudgetError, match="expected a positive byte count, found 0"):
        resolve(0)


def data_dependent_model(op: str) -> tuple[onnx.ModelProto, dict]:
    """A host node whose output size depends on an input's value (inference cannot size it):
    the feed asks for 4-8 TiB."""
    i64 = onnx.TensorProto.INT64
    if op == "Range":
        node = h.make_node("Range", ["s", "n", "d"], ["big"], name="range")
        inits = [numpy_helper.from_array(np.array(0, np.int64), "s"), numpy_helper.from_array(np.array(1, np.int64), "d")]
        return (h.make_model(h.make_graph([node], "g", [h.make_tensor_value_info("n", i64, [])],
                                          [h.make_tensor_value_info("big", i64, None)], inits),
                             opset_imports=[h.make_opsetid("", 17)]), {"n": np.array(2**40, np.int64)})
    if op == "ConstantOfShape":
        node = h.make_node("ConstantOfShape", ["shape"], ["big"], name="fill")
        return (h.make_model(h.make_graph([node], "g", [h.make_tensor_value_info("shape", i64, [2])],
                                          [h.make_tensor_value_info("big", F, None)]),
                             opset_imports=[h.make_opsetid("", 17)]), {"shape": np.array([2**20, 2**20], np.int64)})
    node = h.make_node("Tile", ["x", "reps"], ["big"], name="tile")  # Tile
    return (h.make_model(h.make_graph([node], "g", [h.make_tensor_value_info("x", F, [2]),
                                                    h.make_tensor_value_info("reps", i64, [1])],
                                      [h.make_tensor_value_info("big", F, None)]),
                         opset_imports=[h.make_opsetid("", 17)]),
            {"x": np.ones(2, np.float32), "reps": np.array([2**40], np.int64)})


def computed_on_the_device(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """The same model with its int64 inputs fed as float32 and cast in the graph: their values
    are computed at run time (a Session keys its plans only on small integer graph inputs)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    casts = []
    for vi in out.graph.input:
        if vi.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            casts.append(h.make_node("Cast", [vi.name + "_f"], [vi.name], to=onnx.TensorProto.INT64))
            vi.name += "_f"
            vi.type.tensor_type.elem_type = F
    nodes = casts + list(out.graph.node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, {(k + "_f" if v.dtype == np.int64 else k): (v.astype(np.float32) if v.dtype == np.int64 else v)
                 for k, v in feeds.items()}


@pytest.mark.parametrize("computed", [False, True])
@pytest.mark.parametrize("op, node, nbytes", [("Range", "range", 8 * 2**40), ("ConstantOfShape", "fill", 4 * 2**40),
                                              ("Tile", "tile", 8 * 2**40)])
def test_data_dependent_host_work_is_sized_from_its_inputs_before_it_runs(best, op, node, nbytes, computed):
    import time
    import warnings

    from onnx_quant.backend_wgpu.session import Session

    model, feeds = data_dependent_model(op)
    if computed:
        model, feeds = computed_on_the_device(model, feeds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = Session(model, device=best, memory_budget="1G")
        t0 = time.perf_counter()
        # fed directly, the plan is keyed on the small integer inputs (graph_plan.value_keyed_inputs):
        # the output's size is known when the node is placed, and it is refused then; computed on
        # the device, the host node is sized from the values it receives just before it runs
        why = "computed from its input values .*" if computed else ""
        with pytest.raises(BudgetError, match=f"node '{node}' .*{why}needs {nbytes} bytes"):
            s.run(None, feeds)
    assert time.perf_counter() - t0 < 10
    small = {k: (np.array(3, np.int64) if op == "Range" else np.array([2, 3], np.int64) if op == "ConstantOfShape"
                 else np.array([3], np.int64) if k.startswith("reps") else v) for k, v in feeds.items()}
    small = {k: v.astype(np.float32) if computed and k.endswith("_f") else v for k, v in small.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = s.run(None, small)[0]
    assert out.size == {"Range": 3, "ConstantOfShape": 6, "Tile": 6}[op]


# ---------------------------------------------------------------- no raw MemoryError, no raw jinja2 error


def sparse_external_model(folder: Path, nbytes: int = 4 * 2**30) -> Path:
    """A model whose one initializer's external data is a sparse file of ``nbytes`` (no disk used)."""
    w = numpy_helper.from_array(np.zeros(1, np.float32), "w")
    w.ClearField("raw_data")
    del w.dims[:]
    w.dims.append(nbytes // 4)
    w.data_location = T.EXTERNAL
    for key, value in (("location", "big.bin"), ("offset", "0"), ("length", str(nbytes))):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    g = h.make_graph([h.make_node("ReduceSum", ["w"], ["y"], name="sum", keepdims=0)], "g", [],
                     [h.make_tensor_value_info("y", F, [])], [w])
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), str(folder / "m.onnx"))
    with open(folder / "big.bin", "wb") as f:
        f.truncate(nbytes)
    return folder / "m.onnx"


def limited_address_space(nbytes: int):
    """A subprocess preexec_fn: ``ulimit -v`` (numpy raises MemoryError beyond it, whatever the machine has)."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))


def test_external_data_beyond_the_address_space_is_a_budget_error(tmp_path):
    path = sparse_external_model(tmp_path / "m")
    # the default budget sees the rlimit (it was half of MemAvailable only: a raw MemoryError, exit 3)
    p = subprocess.run([sys.executable, "-m", "onnx_quant", "run", str(path)], capture_output=True, text=True,
                       timeout=120, preexec_fn=limited_address_space(3 * 2**30))
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    one_error_line(p.stderr.splitlines(), "run", "tensor 'w'", "needs 4294967296 bytes (4.0 GiB)", "memory budget")
    api = ("from onnx_quant.model_io import load_model\nfrom onnx_quant.errors import BudgetError\n"
           f"try:\n    load_model({str(path)!r}, load_external_data=True)\n"
           "except BudgetError as e:\n    print('BudgetError', e)\n")
    p = subprocess.run([sys.executable, "-c", api], capture_output=True, text=True, timeout=120,
                       preexec_fn=limited_address_space(3 * 2**30))
    assert p.stdout.startswith("BudgetError ") and "tensor 'w'" in p.stdout and "4294967296 bytes" in p.stdout, p


def test_a_memory_error_while_loading_external_data_names_the_tensor(tmp_path, monkeypatch):
    path = external_model(tmp_path / "m")

    def fail(*_args, **_kw):
        raise MemoryError()

    # a limit the budget cannot see: the allocation fails, the error still names the tensor and the size
    monkeypatch.setattr(onnx.external_data_helper, "load_external_data_for_model", fail)
    with pytest.raises(BudgetError, match=r"external data of tensor\(s\) 'w': 16 bytes could not be allocated"):
        load_model(str(path), load_external_data=True)


def resize_model(scale: float = 1e9) -> onnx.ModelProto:
    scales = numpy_helper.from_array(np.array([1, 1, scale, 1], np.float32), "scales")
    g = h.make_graph([h.make_node("Resize", ["x", "", "scales"], ["y"], name="up", mode="nearest")], "g",
                     [h.make_tensor_value_info("x", F, [1, 1, 2, 2])], [h.make_tensor_value_info("y", F, None)],
                     [scales])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 19)])


def test_a_resize_by_1e9_is_a_budget_error_before_numpy_allocates(best, tmp_path):
    import time
    import warnings

    from onnx_quant.backend_wgpu.session import Session

    model = resize_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        # the kernel's tap tables decline an axis of 2e9 rows before computing them (15 GiB of
        # float64 coordinates); the host node's output is then checked against the budget
        with pytest.raises(BudgetError, match=r"node 'up' \(Resize\) output 'y' .*needs 16000000000 bytes"):
            Session(model, device=best, memory_budget="1G").run(None, {"x": np.ones((1, 1, 2, 2), np.float32)})
    assert time.perf_counter() - t0 < 30
    code, lines = cli("run", str(save(model, tmp_path / "m.onnx")), "--random", env={"ONNX_QUANT_MEMORY_BUDGET": "1G"})
    assert code == 2
    one_error_line(lines, "run", "node 'up' (Resize)", "needs 16000000000 bytes (14.9 GiB)")
    small = resize_model(2.0)  # the kernel still takes sane scales
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = Session(small, device=best, allow_host_fallback=False)
        assert s.run(None, {"x": np.ones((1, 1, 2, 2), np.float32)})[0].shape == (1, 1, 4, 2)


def blocked_qdq_model(op: str, block_size: int) -> onnx.ModelProto:
    x_type = T.INT8 if op == "DequantizeLinear" else F
    scale = numpy_helper.from_array(np.array([[0.5], [0.25]], np.float32), "s")
    zp = numpy_helper.from_array(np.array([[3], [-2]], np.int8), "z")
    g = h.make_graph([h.make_node(op, ["x", "s", "z"], ["y"], name="q", axis=1, block_size=block_size)], "g",
                     [h.make_tensor_value_info("x", x_type, [2, 3])],
                     [h.make_tensor_value_info("y", F if op == "DequantizeLinear" else T.INT8, [2, 3])], [scale, zp])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 21)])


@pytest.mark.parametrize("op", ["DequantizeLinear", "QuantizeLinear"])
def test_a_block_size_of_2_40_is_one_block_not_48_tib(best, op, tmp_path):
    """block_size 2^40 over an axis of 3 is valid (ceil(3 / 2^40) == 1 scale): one block. The
    host reference repeated the scale 2^40 times (a raw MemoryError); the kernel's u32 block size
    overflowed. Both now compute it, equal to block_size 3 (the same blocks) in onnx.reference."""
    import warnings

    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.backend_wgpu.spec import SpecRegistry, load_specs
    from support.oracles import ref_run

    x = (np.arange(6, dtype=np.int8).reshape(2, 3) - 2 if op == "DequantizeLinear"
         else np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3))
    want = ref_run(blocked_qdq_model(op, 3), {"x": x})[0]
    model = blocked_qdq_model(op, 2**40)
    host = SpecRegistry(s for s in load_specs() if s.name != op)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for specs in (None, host):
            got = Session(model, device=best, specs=specs).run(None, {"x": x})[0]
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (specs, got, want)
    code, lines = cli("run", str(save(model, tmp_path / "m.onnx")), "--random")
    assert code == 0, lines


USER_SPEC = {
    "name": "Neg", "sinceVersion": 6,
    "inputs": {"x": {"dtype": "T"}}, "outputs": {"y": {"dtype": "T", "shape": "shapes.x"}},
    "typeConstraints": {"T": ["float32"]}, "derive": {"n": "numel(shapes.x)"},
    "variants": [{"id": "one", "priority": 1, "passes": [{
        "id": "main", "shader": "user-affine.wgsl.jinja",
        "bindings": [{"arg": "x", "elementType": "f32"}, {"arg": "y", "elementType": "f32"}],
        "dispatch": {"x": "ceilDiv(n, 64)"}}]}],
}
USER_SHADER = """{% include "snippets/header.wgsl.jinja" %}
{% include "snippets/bindings.wgsl.jinja" %}
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  if (g.x < {{ n }}u) {
    y[g.x] = 2.0 * x[g.x] + 1.0;
  }
}
"""


def user_spec_folder(folder: Path, shader: str | None = USER_SHADER, name: str = "user-affine.wgsl.jinja") -> Path:
    import json

    folder.mkdir(parents=True, exist_ok=True)
    doc = json.loads(json.dumps(USER_SPEC))
    doc["variants"][0]["passes"][0]["shader"] = name
    (folder / "neg.kernel.json").write_text(json.dumps(doc))
    if shader is not None:
        (folder / name).write_text(shader)
    return folder


def test_a_user_spec_folder_s_own_shader_is_found(best, tmp_path):
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.backend_wgpu.spec import load_specs
    from onnx_quant.errors import SpecError

    g = h.make_graph([h.make_node("Neg", ["x"], ["y"], name="neg")], "g", [h.make_tensor_value_info("x", F, [5])],
                     [h.make_tensor_value_info("y", F, [5])])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    x = np.arange(5, dtype=np.float32)
    # the folder's shader (which includes the installed snippets) ran: 2x + 1, not Neg's -x
    out = Session(model, device=best, specs=user_spec_folder(tmp_path / "mine")).run(None, {"x": x})[0]
    assert np.array_equal(out, 2 * x + 1)
    # a shader in neither the folder nor the installed templates: refused when loaded, naming the file
    with pytest.raises(SpecError, match=r"neg.kernel.json: variants\[0\].passes\[0\].shader: shader file "
                                        r"'absent.wgsl.jinja' not found in .*missing or .*templates"):
        load_specs(user_spec_folder(tmp_path / "missing", None, "absent.wgsl.jinja"))
    # an include that exists nowhere: a SpecError naming the shader, not jinja2's TemplateNotFound
    bad = user_spec_folder(tmp_path / "bad", '{% include "snippets/no-such.wgsl.jinja" %}\n')
    with pytest.raises(SpecError, match=r"user-affine.wgsl.jinja: shader: template 'snippets/no-such.wgsl.jinja' "
                                        r"not found"):
        Session(model, device=best, specs=bad).run(None, {"x": x})

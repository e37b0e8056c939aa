"""The on-disk plan cache (plan_cache.py, cold_start.py): a second Session of the same model and
shapes reads its plan and WGSL instead of compiling and rendering them, and runs to the same bits;
a corrupt, foreign or stale entry is ignored and rewritten; the version, the code, the options and
the shapes are in the key; the cold-start breakdown the CLI prints."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from support.models import conv_bn_model
from onnx_quant.backend_wgpu import cold_start, graph_plan, plan_cache, render
from onnx_quant.backend_wgpu.session import Session
from onnx_quant.cli import main


@pytest.fixture(autouse=True)
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNX_QUANT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(plan_cache.ENV, raising=False)
    return tmp_path / "cache"


def _feeds(batch: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(3).standard_normal((batch, 3, 6, 6)).astype(np.float32)}


def _entries(root) -> list:
    return sorted((root / "plans").rglob("*.plan"))


def _model():
    """conv_bn_model with a symbolic batch dim."""
    model = conv_bn_model(relu=True)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    return model


def _session(device, **kw) -> Session:
    return Session(_model(), device=device, **kw)


def test_second_session_reads_the_plan_and_wgsl_and_gives_the_same_bits(best, cache_root, monkeypatch):
    fresh = _session(best, plan_cache=False)
    expected = fresh.run(None, _feeds())[0]
    assert fresh.cold_start.plan_cache == "off" and not _entries(cache_root)

    first = _session(best)
    assert first.run(None, _feeds())[0].tobytes() == expected.tobytes()
    assert first.cold_start.plan_cache == "miss" and len(_entries(cache_root)) == 1

    def no_compile(*a, **k):
        raise AssertionError("the graph compiler ran on a cache hit")

    monkeypatch.setattr(graph_plan, "compile", no_compile)
    monkeypatch.setattr(render, "render", no_compile)
    best.pipelines.forget()  # the driver compiles again, from the cached WGSL
    compilations, renders = best.pipelines.compilations, best.pipelines.renders
    second = _session(best)
    got = second.run(None, _feeds())[0]
    assert second.cold_start.plan_cache == "hit"
    assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()
    assert best.pipelines.renders == renders and best.pipelines.compilations > compilations
    assert second.cold_start.seconds["render"] < 0.05 and second.cold_start.seconds["compile"] > 0


def test_a_corrupt_entry_is_ignored_and_rewritten(best, cache_root):
    _session(best).run(None, _feeds())
    (path,) = _entries(cache_root)
    path.write_bytes(b"\x80\x05not a pickle at all")
    again = _session(best)
    out = again.run(None, _feeds())[0]
    assert again.cold_start.plan_cache == "miss" and again._disk.store.ignored == 1
    assert np.isfinite(out).all()
    (rewritten,) = _entries(cache_root)
    assert isinstance(pickle.loads(rewritten.read_bytes()), plan_cache.Entry)


def test_an_entry_of_another_key_or_format_is_ignored(best, cache_root):
    _session(best).run(None, _feeds())
    (path,) = _entries(cache_root)
    entry = pickle.loads(path.read_bytes())
    entry.key = "0" * 64  # a file renamed or copied over another
    path.write_bytes(pickle.dumps(entry))
    s = _session(best)
    s.run(None, _feeds())
    assert s.cold_start.plan_cache == "miss" and s._disk.store.ignored == 1
    entry = pickle.loads(path.read_bytes())
    entry.format = plan_cache.FORMAT + 1
    path.write_bytes(pickle.dumps(entry))
    s = _session(best)
    s.run(None, _feeds())
    assert s.cold_start.plan_cache == "miss" and s._disk.store.ignored == 1


def test_version_code_options_and_shapes_are_in_the_key(best, cache_root, monkeypatch):
    _session(best).run(None, _feeds())
    assert len(_entries(cache_root)) == 1
    other_shapes = _session(best)
    other_shapes.run(None, _feeds(batch=2))
    assert other_shapes.cold_start.plan_cache == "miss"
    unfused = _session(best, fold_batch_norm=False)
    unfused.run(None, _feeds())
    assert unfused.cold_start.plan_cache == "miss"
    assert len(_entries(cache_root)) == 3
    monkeypatch.setattr(plan_cache, "code_digest", lambda: "edited")
    edited = _session(best)
    edited.run(None, _feeds())
    assert edited.cold_start.plan_cache == "miss"
    monkeypatch.setattr(plan_cache, "__version__", "999.0")
    upgraded = _session(best)
    upgraded.run(None, _feeds())
    assert upgraded.cold_start.plan_cache == "miss"
    assert _session(best).run(None, _feeds()) is not None  # and the same again hits
    assert len(_entries(cache_root)) == 5


def test_the_cache_can_be_turned_off(best, cache_root, monkeypatch):
    monkeypatch.setenv(plan_cache.ENV, "0")
    s = _session(best)
    s.run(None, _feeds())
    assert s.cold_start.plan_cache == "off" and not _entries(cache_root)


def test_the_code_digest_follows_an_edited_file(tmp_path):
    (tmp_path / "kernel.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("not code")
    digest = plan_cache.tree_digest([tmp_path])
    assert plan_cache.tree_digest([tmp_path]) == digest
    (tmp_path / "notes.txt").write_text("still not code, longer")
    assert plan_cache.tree_digest([tmp_path]) == digest
    (tmp_path / "kernel.py").write_text("x = 22\n")
    assert plan_cache.tree_digest([tmp_path]) != digest
    assert len(plan_cache.code_digest()) == 64


def test_cold_start_line_names_every_phase():
    cs = cold_start.ColdStart()
    for phase in cold_start.PHASES:
        cs.add(phase, 0.001)
    line = cs.line()
    assert line.startswith("cold start 7 ms: ") and all(f"{p} 1" in line for p in cold_start.PHASES)
    assert cs.as_dict()["total"] == pytest.approx(0.007)


def _run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_run_and_profile_print_the_cold_start(best, cache_root, capsys, tmp_path):
    import onnx  # noqa: PLC0415

    path = tmp_path / "conv.onnx"
    onnx.save(_model(), path)
    code, out, _ = _run_cli(capsys, "run", path, "--random")
    assert code == 0
    (line,) = [x for x in out.splitlines() if x.startswith("cold start ")]
    assert all(f" {p} " in line for p in cold_start.PHASES) and line.endswith("(plan cache miss)")
    code, out, _ = _run_cli(capsys, "run", path, "--random")
    assert code == 0 and "(plan cache hit)" in out
    code, out, _ = _run_cli(capsys, "profile", path, "--runs", "1", "--json")
    report = json.loads(out)
    assert code == 0 and set(cold_start.PHASES) <= set(report["cold_start"])
    assert report["cold_start"]["plan_cache"] == "hit"


def test_cli_cache_info_and_clear(best, cache_root, capsys):
    _session(best).run(None, _feeds())
    code, out, _ = _run_cli(capsys, "cache", "info", "--json")
    info = json.loads(out)
    assert code == 0 and info["root"] == str(cache_root) and info["caches"]["plans"]["files"] >= 1
    code, out, _ = _run_cli(capsys, "cache", "info")
    assert code == 0 and "plans:" in out and str(cache_root) in out
    code, out, _ = _run_cli(capsys, "cache", "clear", "--kind", "plans")
    assert code == 0 and "removed" in out and not _entries(cache_root)
    code, out, _ = _run_cli(capsys, "cache", "clear")
    assert code == 0
    code, out, _ = _run_cli(capsys, "cache", "info", "--json")
    assert json.loads(out)["caches"] == {}


def test_the_installed_specs_are_kept_on_disk_and_read_back_equal(cache_root):
    from onnx_quant.backend_wgpu import spec  # noqa: PLC0415

    built = spec.load_specs()
    (stored,) = (cache_root / "plans").rglob("specs-*.pickle")
    read = spec.load_specs()
    direct = spec.load_specs(spec.templates_dir())  # a folder named: never the disk copy
    # read back one op at a time (unpickled on first use), then whole
    assert read.ops() == direct.ops() and ("", "Conv") in read and ("", "NoSuchOp") not in read
    for op, version in (("Conv", 22), ("QuantizeLinear", 13), ("Relu", 6)):
        assert repr(read.find("", op, version)) == repr(direct.find("", op, version)) != "None"
    assert read.find("", "NoSuchOp", 22) is None
    # repr: every field's value (two loads of the same files are not == : NaN defaults)
    assert read is not built and repr(list(read)) == repr(list(direct)) == repr(list(built)) and len(read) > 100
    stored.write_bytes(b"truncated")
    assert repr(list(spec.load_specs())) == repr(list(direct))


def test_an_expression_pickles_as_its_text_and_evaluates_the_same():
    from onnx_quant.backend_wgpu import expr  # noqa: PLC0415

    e = expr.parse("ceilDiv(shapes.x[0] * 3, 4) + tunables.tile + n")
    back = pickle.loads(pickle.dumps(e))
    assert back == e and back is not e and back.free_names == e.free_names == {"n"}
    env = expr.Env(shapes={"x": (7, 2)}, tunables={"tile": 8}, names={"n": 5})
    assert back.evaluate(env) == e.evaluate(env) == 6 + 8 + 5


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int32, np.int64,
                                   np.uint64, np.bool_])
def test_a_plain_constant_is_read_without_onnx_reference_and_equals_it(dtype):
    from onnx import helper, numpy_helper  # noqa: PLC0415
    from onnx.reference import ReferenceEvaluator  # noqa: PLC0415

    from onnx_quant.backend_wgpu.model_check import plain_constant  # noqa: PLC0415

    value = (np.arange(6).reshape(2, 3) % 3).astype(dtype)
    node = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(value, "c"))
    got = plain_constant(node)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("c", 0, None)])
    (expected,) = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).run(None, {})
    assert got.dtype == expected.dtype and got.shape == expected.shape and got.tobytes() == expected.tobytes()
    assert plain_constant(helper.make_node("Constant", [], ["f"], value_float=1.5)) is None


def test_a_tuned_choice_is_in_the_key(best, cache_root):
    """A plan stored before ``tune`` wrote a choice is not read after it (it would keep the static
    variant over the measured one), and a tuning session stores no plan of its own."""
    from onnx_quant.backend_wgpu.tuning_cache import Choice, TuningTable

    _session(best).run(None, _feeds())
    assert len(_entries(cache_root)) == 1
    table = TuningTable.load(best.info)
    table.entries["Conv|x:float32:1x4x8x8|y:float32"] = Choice("direct", {}, {"direct": 1.0})
    table.save()
    after = _session(best)
    after.run(None, _feeds())
    assert after.cold_start.plan_cache == "miss" and len(_entries(cache_root)) == 2
    assert _session(best, tune=True)._disk.store is None

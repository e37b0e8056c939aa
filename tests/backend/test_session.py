"""Session: onnxruntime-shaped runs, feed checks before anything is submitted, unsupported
nodes, variant/tunable overrides, plan caching per input shapes, explain()."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnx_quant.backend_wgpu.commands import dql_model, numpy_dynamic_quantize_linear
from onnx_quant.errors import ExecutionError, ModelLoadError
from support.models import NO_KERNEL_OPSET, no_kernel_expected, no_kernel_node


pytestmark = pytest.mark.devices("best")  # dev: the default adapter only (conftest's default adds OpenGL)


def Session(model, dev, **kw):
    from onnx_quant.backend_wgpu.session import Session as S

    return S(model, device=dev, **kw)


def _two_dql_model():
    xs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N"]) for n in ("a", "b")]
    outs = []
    nodes = []
    for name in ("a", "b"):
        outs += [helper.make_tensor_value_info(f"{name}_q", TensorProto.UINT8, ["N"]),
                 helper.make_tensor_value_info(f"{name}_scale", TensorProto.FLOAT, []),
                 helper.make_tensor_value_info(f"{name}_zp", TensorProto.UINT8, [])]
        nodes.append(helper.make_node("DynamicQuantizeLinear", [name], [f"{name}_q", f"{name}_scale", f"{name}_zp"],
                                      name=f"dql_{name}"))
    graph = helper.make_graph(nodes, "two", xs, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)


def _fixed_model(shape):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    outs = [helper.make_tensor_value_info("y", TensorProto.UINT8, shape),
            helper.make_tensor_value_info("y_scale", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("y_zero_point", TensorProto.UINT8, [])]
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "y_scale", "y_zero_point"])
    return helper.make_model(helper.make_graph([node], "g", [x], outs),
                             opset_imports=[helper.make_opsetid("", 21)], ir_version=9)


X = np.linspace(-3, 5, 1000).astype(np.float32)


def test_run_like_onnxruntime(dev, tmp_path):
    model = dql_model(1)
    path = tmp_path / "dql.onnx"
    onnx.save(model, path)
    expected = numpy_dynamic_quantize_linear(X)
    for source in (model, str(path), path, model.SerializeToString()):
        s = Session(source, dev)
        out = s.run(None, {"x": X})
        assert isinstance(out, list) and len(out) == 3
        for g, e in zip(out, expected):
            assert g.dtype == e.dtype and g.shape == e.shape and np.array_equal(g, e)
        assert [o.dtype for o in out] == [np.uint8, np.float32, np.uint8]
    s = Session(model, dev)
    scale, y = s.run(["y_scale", "y"], {"x": X})
    assert scale.shape == () and y.shape == (1000,)
    assert s.input_names == ["x"] and s.output_names == ["y", "y_scale", "y_zero_point"]
    assert s.get_inputs()[0].type == "tensor(float)" and s.get_inputs()[0].shape == ["d0"]


def test_bad_model_sources(dev, tmp_path):
    with pytest.raises(ModelLoadError):
        Session(str(tmp_path / "missing.onnx"), dev)
    (tmp_path / "junk.onnx").write_text("not a model")
    with pytest.raises(ModelLoadError):
        Session(str(tmp_path / "junk.onnx"), dev)


def _submits_unchanged(dev, fn):
    before = (dev.stats.submits, dev.stats.buffers_allocated)
    with pytest.raises(ExecutionError) as e:
        fn()
    assert (dev.stats.submits, dev.stats.buffers_allocated) == before
    return str(e.value)


def test_bad_feeds_fail_before_submitting(dev):
    s = Session(dql_model(1), dev)
    assert "missing" in _submits_unchanged(dev, lambda: s.run(None, {}))
    assert "float64" in _submits_unchanged(dev, lambda: s.run(None, {"x": X.astype(np.float64)}))
    assert "rank" in _submits_unchanged(dev, lambda: s.run(None, {"x": X.reshape(10, 100)}))
    assert "rank" in _submits_unchanged(dev, lambda: s.run(None, {"x": np.float32(1.0)}))
    assert "not inputs" in _submits_unchanged(dev, lambda: s.run(None, {"x": X, "z": X}))
    assert "dict" in _submits_unchanged(dev, lambda: s.run(None, [X]))
    assert "not outputs" in _submits_unchanged(dev, lambda: s.run(["nope"], {"x": X}))
    fixed = Session(_fixed_model([4, 3]), dev)
    msg = _submits_unchanged(dev, lambda: fixed.run(None, {"x": np.zeros((4, 2), np.float32)}))
    assert "dim 1 must be 3" in msg
    out = fixed.run(None, {"x": np.ones((4, 3), np.float32)})
    assert out[0].shape == (4, 3)


def test_declared_minus_one_and_question_mark_dims_are_free_each_on_its_own(dev):
    """paddle2onnx writes '?' for every unknown dim (and some exporters dim_value -1): at run
    time each is free, and two '?' dims do not have to agree; a named symbol still binds."""
    model = _fixed_model(["?", -1, "?"])
    s = Session(model, dev)
    for shape in ((2, 3, 4), (5, 1, 7)):
        x = np.linspace(-2, 3, int(np.prod(shape))).astype(np.float32).reshape(shape)
        out = s.run(None, {"x": x})
        for g, e in zip(out, numpy_dynamic_quantize_linear(x.reshape(-1))):
            assert np.array_equal(g.reshape(-1), e.reshape(-1))
        assert out[0].shape == shape
    named = Session(_fixed_model(["N", "N"]), dev)
    msg = _submits_unchanged(dev, lambda: named.run(None, {"x": np.zeros((2, 3), np.float32)}))
    assert "'N' = 3" in msg and "binds 'N' = 2" in msg


def test_node_without_kernel_runs_on_the_host_or_is_refused(dev):
    from onnx_quant.errors import HostFallbackWarning, QuantWarning

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    # an op no kernel spec covers
    model = helper.make_model(helper.make_graph([no_kernel_node("x", "y", name="my_node")], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(*NO_KERNEL_OPSET)])
    op = model.graph.node[0].op_type
    with pytest.raises(ExecutionError, match=f"my_node.*{op}"):
        Session(model, dev, allow_host_fallback=False)
    with pytest.warns(HostFallbackWarning, match=f"my_node.*{op}") as rec:
        s = Session(model, dev)
    assert issubclass(rec[0].category, QuantWarning) and issubclass(QuantWarning, UserWarning)
    v = np.array([-2, -0.5, 0, 3], np.float32)
    (out,) = s.run(None, {"x": v})
    assert np.array_equal(out, no_kernel_expected(v)) and out.dtype == np.float32
    assert s.host_nodes == [f"my_node ({NO_KERNEL_OPSET[0]}::{op})"]
    assert s.explain()[0]["placement"] == "host" and s.explain()[0]["kernel"] == "host"


def test_a_node_no_variant_takes_is_refused_naming_the_clause(dev):
    # com.microsoft Gelu has a kernel, but no variant's grid fits 2^50 elements: without the host
    # fallback the error says which clause failed; with it, the host (onnx.reference with
    # reference_ops' com.microsoft ops) could run it, and the memory budget refuses its 4 PiB
    # output by name before anything is allocated
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1024])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft", name="gelu")], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
    s = Session(model, dev, allow_host_fallback=False)
    with pytest.raises(ExecutionError, match=r"node 'gelu' \(com\.microsoft::Gelu\): kernel Gelu: no variant applies "
                                             r"\(word_per_invocation: 'gridFits' is false; "):
        s.explain({"x": [2**40, 1024]})
    s = Session(model, dev)
    with pytest.raises(ExecutionError, match=r"^node 'gelu' \(com\.microsoft::Gelu\) output 'y' .*beyond the memory budget"):
        s.explain({"x": [2**40, 1024]})
    assert s.explain({"x": [4, 1024]})[0]["placement"] == "gpu"


def test_node_attributes_reach_the_planner(dev):
    model = dql_model(1)
    model.graph.node[0].attribute.append(helper.make_attribute("not_an_attribute", 3))
    with pytest.raises(ExecutionError, match="not_an_attribute"):
        Session(model, dev)


def test_variants_by_node_name_and_op_type(dev):
    s = Session(dql_model(1), dev, variants={"DynamicQuantizeLinear": "parallel_subgroup_reduce"})
    assert s.plans({"x": (1000,)})[0].variant == "parallel_subgroup_reduce"
    two = Session(_two_dql_model(), dev, variants={"dql_b": "parallel_subgroup_reduce_vec4"})
    plans = two.plans({"a": (1000,), "b": (1000,)})
    assert [p.variant for p in plans] == ["single_invocation", "parallel_subgroup_reduce_vec4"]
    with pytest.raises(ExecutionError, match="neither a node name nor an op type"):
        Session(dql_model(1), dev, variants={"Conv": "x"})
    bad = Session(dql_model(1), dev, variants={"DynamicQuantizeLinear": "no_such_variant"})
    with pytest.raises(ExecutionError, match="no_such_variant"):
        bad.run(None, {"x": X})
    cannot = Session(dql_model(1), dev, variants={"DynamicQuantizeLinear": "grid_stride_reduce_vec4"})
    with pytest.raises(ExecutionError, match="cannot force"):
        cannot.run(None, {"x": X})


def test_tunables_global_and_per_node(dev):
    s = Session(dql_model(1), dev, tunables={"SERIAL_MAX_ELEMENTS": 10})
    assert s.plans({"x": (1000,)})[0].variant == "parallel_subgroup_reduce_vec4"
    s = Session(_two_dql_model(), dev, tunables={"dql_a": {"SERIAL_MAX_ELEMENTS": 10}})
    assert [p.variant for p in s.plans({"a": (1000,), "b": (1000,)})] == ["parallel_subgroup_reduce_vec4",
                                                                          "single_invocation"]
    with pytest.raises(ExecutionError, match="NOT_A_TUNABLE"):
        Session(dql_model(1), dev, tunables={"NOT_A_TUNABLE": 1})


def test_two_nodes_and_plan_cache(dev):
    s = Session(_two_dql_model(), dev)
    a = np.linspace(-1, 1, 100).astype(np.float32)
    b = np.linspace(0, 7, 100).astype(np.float32)
    out = s.run(None, {"a": a, "b": b})
    for got, exp in zip(out, numpy_dynamic_quantize_linear(a) + numpy_dynamic_quantize_linear(b)):
        assert np.array_equal(got, exp)
    s.run(None, {"a": a[:50], "b": b[:50]})
    assert len(s._plans) == 2
    comp, bufs = dev.pipelines.compilations, dev.stats.buffers_allocated
    again = s.run(None, {"a": a, "b": b})
    assert (dev.pipelines.compilations, dev.stats.buffers_allocated) == (comp, bufs)
    assert all(np.array_equal(g, e) for g, e in zip(again, out))
    s.close()
    assert not s._plans


def test_explain(dev):
    s = Session(dql_model(2), dev)
    entries = s.explain({"x": (512, 1024)})
    assert len(entries) == 1
    e = entries[0]
    for key in ("node", "op_type", "kernel", "variant", "derived", "selection", "passes", "shapes"):
        assert key in e
    assert e["op_type"] == "DynamicQuantizeLinear" and e["kernel"] == "DynamicQuantizeLinear"
    assert e["variant"] == "grid_stride_reduce_vec4"
    assert [p["id"] for p in e["passes"]] == ["reduce", "finalize", "quantize"]
    assert all(len(p["dispatch"]) == 3 and all(isinstance(d, int) for d in p["dispatch"]) for p in e["passes"])
    assert e["shapes"]["x"] == [512, 1024]
    assert e["derived"]  # the values that decided the variant
    # symbolic dims default to 1 without shapes: the serial variant
    assert s.explain()[0]["variant"] == "single_invocation"


def test_import_backend_wgpu_is_cheap():
    code = "import sys; from onnx_quant import backend_wgpu; assert 'wgpu' not in sys.modules; print(backend_wgpu.Session.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Session"

"""Shape-polymorphic pipelines (issue #11; backend_wgpu/uniforms.py): kernels whose sizes are
runtime uniforms compile once for every batch size, their pipeline key is computed without
rendering, a template that reads a uniform at Jinja level fails loudly, and the zoo models'
second shape compiles nothing but a variant a new size selects."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_quant.backend_wgpu.uniforms import UniformMisuse, UniformScalar
from onnx_quant.errors import DeviceError
from support.models import make_model
from support.oracles import onnxruntime_run

F32 = np.float32


pytestmark = pytest.mark.devices("best")  # dev: the default adapter only (conftest's default adds OpenGL)


def _model(nodes, inputs, outputs, inits=(), opset=17, domains=()):
    return make_model(nodes, inputs, outputs, inits, opset, extra_opsets=domains)


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _cases():
    """(name, model, feeds at the first shape, feeds at the second): every model's sizes follow
    its symbolic dims N / S."""
    rng = np.random.default_rng(0)
    out = []
    c = numpy_helper.from_array(rng.standard_normal(8).astype(F32), "c")
    add = _model([helper.make_node("Add", ["x", "c"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
                 [_vi("x", TensorProto.FLOAT, ["N", 3, 8])], [_vi("y", TensorProto.FLOAT, None)], [c])
    out.append(("Add+Relu broadcast", add, {"x": rng.standard_normal((1, 3, 8)).astype(F32)},
                {"x": rng.standard_normal((5, 3, 8)).astype(F32)}))
    tr = _model([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
                 helper.make_node("Cast", ["t"], ["y"], to=TensorProto.FLOAT16)],
                [_vi("x", TensorProto.FLOAT, ["N", "S", 4])], [_vi("y", TensorProto.FLOAT16, None)])
    out.append(("Transpose+Cast", tr, {"x": rng.standard_normal((1, 16, 4)).astype(F32)},
                {"x": rng.standard_normal((2, 24, 4)).astype(F32)}))
    sm = _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                [_vi("x", TensorProto.FLOAT, ["N", "S", 16])], [_vi("y", TensorProto.FLOAT, None)])
    out.append(("Softmax rows", sm, {"x": rng.standard_normal((1, 16, 16)).astype(F32)},
                {"x": rng.standard_normal((2, 24, 16)).astype(F32)}))
    scale = numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(F32), "scale")
    bias = numpy_helper.from_array(rng.standard_normal(8).astype(F32), "bias")
    ln = _model([helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], axis=-1)],
                [_vi("x", TensorProto.FLOAT, ["N", "S", 8])], [_vi("y", TensorProto.FLOAT, None)], [scale, bias])
    out.append(("LayerNormalization", ln, {"x": rng.standard_normal((1, 16, 8)).astype(F32)},
                {"x": rng.standard_normal((2, 24, 8)).astype(F32)}))
    pool = _model([helper.make_node("MaxPool", ["x"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
                   helper.make_node("GlobalAveragePool", ["m"], ["y"])],
                  [_vi("x", TensorProto.FLOAT, ["N", 3, 8, 8])], [_vi("y", TensorProto.FLOAT, None)])
    out.append(("MaxPool+GlobalAveragePool", pool, {"x": rng.standard_normal((1, 3, 8, 8)).astype(F32)},
                {"x": rng.standard_normal((2, 3, 8, 8)).astype(F32)}))
    cat = _model([helper.make_node("Concat", ["x", "x2"], ["c"], axis=1),
                  helper.make_node("Mul", ["c", "c"], ["y"])],
                 [_vi("x", TensorProto.FLOAT, ["N", 3, 4]), _vi("x2", TensorProto.FLOAT, ["N", 2, 4])],
                 [_vi("y", TensorProto.FLOAT, None)])
    out.append(("Concat+Mul", cat, {"x": rng.standard_normal((1, 3, 4)).astype(F32),
                                    "x2": rng.standard_normal((1, 2, 4)).astype(F32)},
                {"x": rng.standard_normal((3, 3, 4)).astype(F32), "x2": rng.standard_normal((3, 2, 4)).astype(F32)}))
    return out


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_second_shape_compiles_nothing_and_both_are_right(dev, case):
    from onnx_quant.backend_wgpu.session import Session

    _, model, first, second = case
    sess = Session(model, device=dev, allow_host_fallback=False)
    dev.pipelines.forget()
    ref = ReferenceEvaluator(model)
    got1 = sess.run(None, first)
    compiled_first = sess.last_run_stats["pipelines_compiled"]
    got2 = sess.run(None, second)
    assert compiled_first > 0
    assert sess.last_run_stats["pipelines_compiled"] == 0, "the second shape compiled a pipeline"
    assert sess.last_run_stats["plans"] == 1  # a plan of its own: its sizes went into uniforms
    for got, feeds in ((got1, first), (got2, second)):
        (want,) = ref.run(None, feeds)
        assert got[0].shape == want.shape
        if want.dtype == np.float16 or case[0].startswith(("Add", "Concat")):  # exact ops
            assert np.array_equal(got[0], want)
        else:
            np.testing.assert_allclose(got[0], want, rtol=2e-6, atol=1e-6)


def test_quantized_binary_broadcast_at_two_shapes(dev):
    """QLinearAdd (its operand order derived by the spec) at three batch sizes: bit for bit
    onnxruntime's; the second and third share the pipelines (at batch 1 the [1, 6] operand is the
    output's shape: the identity index, a pipeline of its own)."""
    from onnx_quant.backend_wgpu.session import Session

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(np.array(v, dt), n) for n, v, dt in
             [("as", 0.05, F32), ("az", 3, np.uint8), ("bs", 0.04, F32), ("bz", 130, np.uint8),
              ("cs", 0.07, F32), ("cz", 120, np.uint8)]]
    inits.append(numpy_helper.from_array(rng.integers(0, 256, (1, 6), dtype=np.uint8), "b"))
    node = helper.make_node("QLinearAdd", ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["c"],
                            domain="com.microsoft")
    model = _model([node], [_vi("a", TensorProto.UINT8, ["N", 6])], [_vi("c", TensorProto.UINT8, None)], inits,
                   domains=("com.microsoft",))
    sess = Session(model, device=dev, allow_host_fallback=False)
    dev.pipelines.forget()
    for n, compiled in ((1, None), (2, None), (7, 0)):
        feeds = {"a": rng.integers(0, 256, (n, 6), dtype=np.uint8)}
        got = sess.run(None, feeds)[0]
        assert np.array_equal(got, onnxruntime_run(model, feeds)[0])
        if compiled is not None:
            assert sess.last_run_stats["pipelines_compiled"] == compiled


@pytest.fixture(scope="module")
def info(dev):
    return dev.info


def _spec(op, version):
    from onnx_quant.backend_wgpu.session import _specs

    return _specs().find("", op, version)


def _relu_plan(info, shape):
    from onnx_quant.backend_wgpu.planner import plan_node

    return plan_node(_spec("Relu", 17), shapes={"x": shape, "y": shape}, dtypes={"x": "float32", "y": "float32"}, device=info)


def test_the_key_is_computed_without_rendering_on_a_hit(dev, info, monkeypatch):
    from onnx_quant.backend_wgpu import render as render_mod
    from onnx_quant.backend_wgpu.pipelines import layout_key

    small, big = _relu_plan(info, (2, 3)), _relu_plan(info, (40, 3))
    (p_small,), (p_big,) = small.passes, big.passes
    assert isinstance(p_small.context["count"], UniformScalar)
    assert render_mod.pipeline_key(p_small) == render_mod.pipeline_key(p_big)
    assert p_small.dispatch != p_big.dispatch or small.buffers["x"].byte_size != big.buffers["x"].byte_size
    cache = dev.pipelines
    cache.forget()
    first = cache.for_pass(p_small, layout_key(p_small.bindings))
    renders, compilations = cache.renders, cache.compilations

    def no_render(*_a, **_k):
        raise AssertionError("rendered on a cache hit")

    monkeypatch.setattr(render_mod, "render", no_render)
    assert cache.for_pass(p_big, layout_key(p_big.bindings)) is first
    assert (cache.renders, cache.compilations) == (renders, compilations)
    # another rank is another key (the rank is read by the template)
    assert render_mod.pipeline_key(_relu_plan(info, (2, 3, 1)).passes[0]) != render_mod.pipeline_key(p_small)


QDQ_NODES = [  # (op, version, shapes at batch n, dtypes, attributes)
    ("QuantizeLinear", 21, lambda n: {"x": (n, 8, 4, 4), "y_scale": (8,), "y_zero_point": (8,), "y": (n, 8, 4, 4)},
     {"x": "float32", "y_scale": "float32", "y_zero_point": "uint8", "y": "uint8"}, {"axis": 1}),
    ("DequantizeLinear", 21, lambda n: {"x": (n, 32), "x_scale": (), "x_zero_point": (), "y": (n, 32)},
     {"x": "int8", "x_scale": "float32", "x_zero_point": "int8", "y": "float32"}, None),
    ("DynamicQuantizeLinear", 11, lambda n: {"x": (n, 32), "y": (n, 32), "y_scale": (), "y_zero_point": ()},
     {"x": "float32", "y": "uint8", "y_scale": "float32", "y_zero_point": "uint8"}, None),
]


@pytest.mark.parametrize("op,version,shapes,dtypes,attrs", QDQ_NODES, ids=[n[0] for n in QDQ_NODES])
def test_quantization_kernels_key_alike_at_every_batch_size(info, op, version, shapes, dtypes, attrs):
    """QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear read their sizes from uniform
    structs of their own: every pass keys alike at batch 8 and 16 (so compiles once)."""
    from onnx_quant.backend_wgpu.planner import plan_node
    from onnx_quant.backend_wgpu.render import pipeline_key

    spec = _spec(op, version)
    keys = []
    for n in (8, 16):
        plan = plan_node(spec, shapes=shapes(n), dtypes=dtypes, device=info, attributes=attrs)
        keys.append([(p.id, pipeline_key(p)) for p in plan.passes])
    assert keys[0] == keys[1]


def test_a_template_reading_a_uniform_at_jinja_level_fails_loudly(info):
    """Hardmax's map pass computes rows * rowLength in Jinja: declared uniforms, its render fails
    naming the value instead of baking it in."""
    from onnx_quant.backend_wgpu.planner import plan_node
    from onnx_quant.backend_wgpu.render import render, render_string

    plan = plan_node(dataclasses.replace(_spec("Hardmax", 13), uniforms=("rows", "rowLength")), shapes={"x": (3, 5), "y": (3, 5)},
                     dtypes={"x": "float32", "y": "float32"}, device=info)
    with pytest.raises(DeviceError, match=r"rows\b.*runtime uniform|rowLength.*runtime uniform"):
        for p in plan.passes:
            render(p)
    guard = UniformScalar("count", "count", "u32")
    for text in ("{% if count > 4 %}x{% endif %}", "{{ count * 2 }}", "{% for i in range(count) %}{% endfor %}",
                 "{{ count | int }}", "{% if count is even %}{% endif %}", "{{ '%d' % count }}"):
        with pytest.raises(DeviceError, match="runtime uniform"):
            render_string(text, {"count": guard})
    assert render_string("{{ count }} {{ count | u32 }} {{ 7 | u32 }}", {"count": guard}) == \
        "oq_dims.count oq_dims.count 7u"
    with pytest.raises(UniformMisuse):
        bool(guard)


def test_a_uniform_that_is_not_derived_is_an_error(info):
    from onnx_quant.backend_wgpu.planner import plan_node
    from onnx_quant.errors import ExecutionError

    with pytest.raises(ExecutionError, match="not a derived value"):
        plan_node(dataclasses.replace(_spec("Relu", 17), uniforms=("nope",)), shapes={"x": (2,), "y": (2,)},
                  dtypes={"x": "float32", "y": "float32"}, device=info)


# --------------------------------------------------------------------------- the zoo models

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

#: pipelines a second shape compiles (benchmarks/second_shape_compiles.py; cnn N 1 -> 2, mlp N 8 -> 16,
#: transformer B 1 -> 2 and S 16 -> 24; on main before shape-polymorphic pipelines (329e643): cnn
#: 8/8/7, mlp 10/10/4, transformer 21/21/14; then 2/2/3 while K and N were constants). A new batch
#: size alone compiles nothing (below), nor does a new sequence length (tests/backend/
#: test_polymorphic_sequence.py) but for the dynamic transformer's attention MatMuls, whose
#: multiply-adds at B 2, S 24 cross TILED_MIN_MACS: they take the blocked variant, one pipeline
SECOND_SHAPE = {("cnn", "qoperator"): 0, ("cnn", "qdq"): 0, ("cnn", "dynamic"): 0,
                ("mlp", "qoperator"): 0, ("mlp", "qdq"): 0, ("mlp", "dynamic"): 0,
                ("transformer", "qoperator"): 0, ("transformer", "qdq"): 0, ("transformer", "dynamic"): 1}
#: what a second shape may compile (a variant selected by size)
SEQUENCE_KERNELS = {"MatMul"}


@pytest.mark.parametrize("family,fmt", sorted(SECOND_SHAPE))
def test_zoo_models_second_shape_compiles_only_what_the_sequence_length_sizes(dev, family, fmt):
    from second_shape_compiles import second_shape_compiles

    compiled, labels = second_shape_compiles(family, fmt, device=dev)
    kernels = {lab.split("/")[0] for lab in labels}
    assert kernels <= SEQUENCE_KERNELS, f"kernels recompiled: {sorted(kernels - SEQUENCE_KERNELS)}"
    assert compiled <= SECOND_SHAPE[(family, fmt)]


@pytest.mark.parametrize("family,fmt", sorted(SECOND_SHAPE))
def test_zoo_models_second_batch_size_compiles_nothing(dev, family, fmt):
    """Issue #11: a second batch size compiles 0 pipelines (cnn N 1 -> 2, mlp N 8 -> 16, transformer
    B 1 -> 2), from a cold pipeline cache."""
    from second_shape_compiles import second_shape_compiles

    compiled, labels = second_shape_compiles(family, fmt, device=dev, batch_only=True)
    assert compiled == 0, labels

"""Dynamic-quantization unit fusion (backend_wgpu/dynamic_fusion.py) and its kernels
(DynamicQuantizeMatMul / MatMulIntegerToFloat, com.microsoft and ai.onnx_quant; ai.onnx_quant
DynamicQuantizeConv).

The rewrite is checked on the CPU: which nodes each unit takes, and what stays when a condition
fails. The kernels are checked against onnxruntime CPU with all optimizations off (the unfused
graph: DynamicQuantizeLinear, MatMulInteger/ConvInteger, Cast, Mul, Add, Relu) and on (its own
DynamicQuantizeMatMul / MatMulIntegerToFloat). DynamicQuantizeLinear and the integer sums are
exact, and the epilogue rounds f32(acc) * (a_scale * b_scale) + bias in the unfused graph's
order, each step once, so the fused kernels equal the unfused graph: asserted exactly against
onnxruntime ORT_DISABLE_ALL and against this project's unfused kernels. onnxruntime's own fused
kernels (ORT_ENABLE_ALL) may contract the scale and bias into an FMA on some CPUs: the check
there allows ULPS (4) ulp of the output's magnitude. Measured when written (lavapipe, x86
onnxruntime 1.32, 3 seeds of every one-unit model here, both levels): max |diff| 0 everywhere;
zoo dynamic CNN 0; MLP 3e-8 and transformer 4.8e-7 (1 ulp of outputs ~5), both from their float
Softmax / LayerNormalization / Gelu kernels, the same as before the fusion.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_quant import model_zoo
from onnx_quant.backend_wgpu.dynamic_fusion import INTERNAL_DOMAIN, fuse_dynamic
from onnx_quant.oracles import not_an_oracle
from support.gpu import run_every_variant
from support.oracles import onnxruntime_run

MS = "com.microsoft"
ULPS = 4


def _tol(ref: np.ndarray) -> float:
    return ULPS * float(np.spacing(np.float32(max(float(np.abs(ref).max()), 1e-30))))


def _mm_unit(*, n=6, k=20, rows=5, w_type=TensorProto.INT8, per_channel=True, bias=True, relu=False,
             shared=False, const_weights=True, scale_shape=None, cast_to=TensorProto.FLOAT, conv=False,
             seed=0) -> onnx.ModelProto:
    """One unit as quantize_dynamic writes it: DQL -> MatMulInteger/ConvInteger -> Cast -> Mul(Mul of
    scales) [-> Add] [-> Relu]. shared: a second consumer of the DQL's output (an Identity graph
    output); scale_shape: the weight scale's shape (default [] or [n])."""
    rng = np.random.default_rng(seed)
    wdt = np.int8 if w_type == TensorProto.INT8 else np.uint8
    lo, hi = (-127, 128) if wdt == np.int8 else (0, 256)
    if conv:
        wshape, xshape, yshape = [n, 3, 3, 3], [1, 3, 7, 7], [1, n, 7, 7]
    else:
        wshape, xshape, yshape = [k, n], [rows, k], [rows, n]
    W = rng.integers(lo, hi, wshape).astype(wdt)
    sshape = scale_shape if scale_shape is not None else (([1, n, 1, 1] if conv else [n]) if per_channel else [])
    w_scale = (rng.random(sshape) * 0.02 + 0.001).astype(np.float32)
    # onnxruntime's ConvInteger takes a per-tensor weight zero point only
    w_zp = rng.integers(lo // 2, hi // 2, [n] if per_channel and not conv else []).astype(wdt)
    inits = [numpy_helper.from_array(w_scale, "w_scale"), numpy_helper.from_array(w_zp, "w_zp")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, xshape)]
    if const_weights:
        inits.append(numpy_helper.from_array(W, "W"))
    else:
        inputs.append(helper.make_tensor_value_info("W", w_type, wshape))
    int_op = "ConvInteger" if conv else "MatMulInteger"
    int_attrs = {"pads": [1, 1, 1, 1]} if conv else {}
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("Mul", ["xs", "w_scale"], ["s"]),
        helper.make_node(int_op, ["xq", "W", "xz", "w_zp"], ["acc"], **int_attrs),
        helper.make_node("Cast", ["acc"], ["accf"], to=cast_to),
        helper.make_node("Mul", ["accf", "s"], ["scaled"]),
    ]
    last = "scaled"
    if bias:
        b = rng.standard_normal([1, n, 1, 1] if conv else [n]).astype(np.float32)
        inits.append(numpy_helper.from_array(b, "bias"))
        nodes.append(helper.make_node("Add", [last, "bias"], ["biased"]))
        last = "biased"
    if relu:
        nodes.append(helper.make_node("Relu", [last], ["relu"]))
        last = "relu"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, yshape)]
    if shared:
        nodes.append(helper.make_node("Identity", ["xq"], ["xq_out"]))
        outputs.append(helper.make_tensor_value_info("xq_out", TensorProto.UINT8, xshape))
    g = helper.make_graph(nodes, "unit", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _feeds(model: onnx.ModelProto, seed=1) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            out[vi.name] = (rng.standard_normal(shape) * 3 + 0.5).astype(np.float32)
        else:
            out[vi.name] = rng.integers(-127, 128, shape).astype(np.int8)
    return out



def _ops(model: onnx.ModelProto) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in model.graph.node]


# ----------------------------------------------------------------------------- the rewrite (CPU)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_matmul_unit_fused_with_its_dql(bias, relu):
    r = fuse_dynamic(_mm_unit(bias=bias, relu=relu))
    assert r.declined == []
    (u,) = r.units
    assert u.rule == "dynamic_matmul"
    assert (u.node.domain, u.node.op_type) == ((INTERNAL_DOMAIN if relu else MS), "DynamicQuantizeMatMul")
    assert list(u.node.input) == ["x", "W", "w_scale", "w_zp"] + (["bias"] if bias else [])
    taken = {"DynamicQuantizeLinear", "MatMulInteger", "Cast", "Mul"} | ({"Add"} if bias else set()) | ({"Relu"} if relu else set())
    assert {n.op_type for n in u.nodes} == taken
    assert _ops(r.model) == [(u.node.domain, u.node.op_type), ("", "Identity")]
    assert u.node.output[0] == ("relu" if relu else "biased" if bias else "scaled")


def test_conv_unit_fused_with_bias_through_reshape_shape():
    r = fuse_dynamic(_mm_unit(conv=True, per_channel=False, relu=True))
    (u,) = r.units
    assert (u.rule, u.node.domain, u.node.op_type) == ("dynamic_conv", INTERNAL_DOMAIN, "DynamicQuantizeConv")
    attrs = {a.name: helper.get_attribute_value(a) for a in u.node.attribute}
    assert attrs["activation"] == b"Relu" and attrs["pads"] == [1, 1, 1, 1]
    assert any(o.domain == INTERNAL_DOMAIN for o in r.model.opset_import)


def test_shared_dql_keeps_the_dql_and_fuses_matmul_integer_to_float():
    r = fuse_dynamic(_mm_unit(shared=True))
    (u,) = r.units
    assert (u.rule, u.node.domain, u.node.op_type) == ("integer_to_float", MS, "MatMulIntegerToFloat")
    assert list(u.node.input) == ["xq", "W", "xs", "w_scale", "xz", "w_zp", "bias"]
    assert ("", "DynamicQuantizeLinear") in _ops(r.model) and ("", "MatMulInteger") not in _ops(r.model)


def test_shared_dql_conv_unit_becomes_conv_integer_to_float():
    r = fuse_dynamic(_mm_unit(shared=True, conv=True))
    (u,) = r.units
    assert (u.rule, u.node.domain, u.node.op_type) == ("conv_integer_to_float", INTERNAL_DOMAIN, "ConvIntegerToFloat")
    assert list(u.node.input) == ["xq", "W", "xs", "w_scale", "xz", "w_zp", "bias"]
    assert ("", "DynamicQuantizeLinear") in _ops(r.model) and ("", "ConvInteger") not in _ops(r.model)


@pytest.mark.parametrize("kwargs, words", [
    ({"const_weights": False}, "not constant"),
    ({"scale_shape": [3]}, "neither per-tensor nor per-output"),
    ({"scale_shape": [1, 6, 1]}, "neither per-tensor nor per-output"),
    ({"scale_shape": [1, 6]}, "neither per-tensor nor per-output"),
    ({"scale_shape": [6], "conv": True}, "neither per-tensor nor per-output"),
    ({"scale_shape": [1, 1, 6, 1, 1], "conv": True}, "neither per-tensor nor per-output"),
    ({"cast_to": TensorProto.DOUBLE}, "Cast to float32"),
])
def test_declined_units_stay_as_written(kwargs, words):
    model = _mm_unit(**kwargs)
    r = fuse_dynamic(model)
    assert r.units == [] and list(r.model.graph.node) == list(model.graph.node)
    assert len(r.declined) == 1 and words in r.declined[0][2], r.declined


def test_inner_value_as_graph_output_declines():
    model = _mm_unit()
    model.graph.output.append(helper.make_tensor_value_info("accf", TensorProto.FLOAT, None))
    r = fuse_dynamic(model)
    assert r.units == [] and "graph output" in r.declined[0][2]


def test_bias_add_with_two_consumers_leaves_the_add():
    model = _mm_unit(bias=True)
    model.graph.node.append(helper.make_node("Identity", ["scaled"], ["scaled_out"]))
    model.graph.output.append(helper.make_tensor_value_info("scaled_out", TensorProto.FLOAT, None))
    r = fuse_dynamic(model)
    (u,) = r.units
    assert u.node.output[0] == "scaled" and len(u.node.input) == 4  # no bias taken
    assert ("", "Add") in _ops(r.model)


@pytest.mark.parametrize("family, expect", [
    ("mlp", ["dynamic_matmul"] * 4),
    ("cnn", ["dynamic_conv"] * 5 + ["dynamic_matmul"]),
    ("transformer", ["integer_to_float"] * 3 + ["dynamic_matmul"] * 3),
])
def test_zoo_dynamic_models_rewrite(family, expect):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_zoo.quantized(family, "dynamic", per_channel=True)
    r = fuse_dynamic(model)
    assert [u.rule for u in r.units] == expect and r.declined == []
    left = {op for _, op in _ops(r.model)}
    assert not left & {"MatMulInteger", "ConvInteger", "Cast"}
    # the transformer's QKV DQL is shared by three units: it stays (onnxruntime keeps it too)
    assert sum(op == "DynamicQuantizeLinear" for _, op in _ops(r.model)) == (1 if family == "transformer" else 0)


# ----------------------------------------------------------------------------- kernels (GPU)


#: every variant a candidate: DynamicQuantizeMatMul's blocked takes weights of BLOCKED_MIN_WEIGHTS and more
ALL_VARIANTS = {"DynamicQuantizeMatMul": {"BLOCKED_MIN_WEIGHTS": 0}}


def _check_against_ort(device, model, op_type):
    from onnx_quant.backend_wgpu.session import Session

    feeds = _feeds(model)
    outs, ids = run_every_variant(device, model, feeds, op_type,
                                  tunables=ALL_VARIANTS if op_type == "DynamicQuantizeMatMul" else None)
    with Session(model, device=device, fuse_dynamic=False, allow_host_fallback=False) as s:
        unfused = s.run(None, feeds)
    for got, want in zip(outs, onnxruntime_run(model, feeds, level="ORT_DISABLE_ALL")):
        assert got.shape == want.shape and np.array_equal(got, want), ids
    for got, want in zip(outs, onnxruntime_run(model, feeds, level="ORT_ENABLE_ALL")):
        assert float(np.abs(got.astype(np.float64) - want).max()) <= _tol(want), ids
    for got, want in zip(outs, unfused):  # the project's unfused kernels: the same bits
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    return ids


@pytest.mark.parametrize("w_type", [TensorProto.INT8, TensorProto.UINT8])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias, relu", [(True, False), (False, True), (True, True)])
def test_dynamic_quantize_matmul_unit(best, w_type, per_channel, bias, relu):
    ids = _check_against_ort(best, _mm_unit(w_type=w_type, per_channel=per_channel, bias=bias, relu=relu, k=70),
                             "DynamicQuantizeMatMul")
    assert set(ids) == {"blocked", "fused", "two_pass"}


@pytest.mark.parametrize("per_channel", [False, True])
def test_matmul_integer_to_float_unit(best, per_channel):
    ids = _check_against_ort(best, _mm_unit(shared=True, per_channel=per_channel, rows=9), "MatMulIntegerToFloat")
    assert ids == ["blocked", "gemm"]


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("relu", [False, True])
def test_dynamic_quantize_conv_unit(best, per_channel, relu):
    ids = _check_against_ort(best, _mm_unit(conv=True, per_channel=per_channel, relu=relu), "DynamicQuantizeConv")
    assert set(ids) == {"fused", "two_pass"}


@pytest.mark.parametrize("w_type", [TensorProto.INT8, TensorProto.UINT8])
@pytest.mark.parametrize("relu", [False, True])
def test_conv_integer_to_float_unit(best, w_type, relu):
    ids = _check_against_ort(best, _mm_unit(conv=True, shared=True, w_type=w_type, relu=relu), "ConvIntegerToFloat")
    assert ids == ["gemm"]


def test_contrib_dynamic_quantize_matmul_node(best):
    """A model that already holds com.microsoft DynamicQuantizeMatMul (as onnxruntime writes it)."""
    from onnx_quant.backend_wgpu.session import Session

    rng = np.random.default_rng(3)
    W = rng.integers(-128, 128, [33, 7]).astype(np.int8)
    inits = [numpy_helper.from_array(W, "W"),
             numpy_helper.from_array((rng.random([7]) * 0.01).astype(np.float32), "s"),
             numpy_helper.from_array(rng.integers(-5, 5, [7]).astype(np.int8), "z"),
             numpy_helper.from_array(rng.standard_normal([7]).astype(np.float32), "b")]
    node = helper.make_node("DynamicQuantizeMatMul", ["x", "W", "s", "z", "b"], ["y"], domain=MS)
    g = helper.make_graph([node], "dqmm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 33])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 7])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)], ir_version=10)
    feeds = _feeds(model)
    with Session(model, device=best, allow_host_fallback=False) as s:
        got = s.run(None, feeds)[0]
    want = onnxruntime_run(model, feeds, level="ORT_DISABLE_ALL")[0]
    assert float(np.abs(got - want).max()) <= _tol(want)


def _ort_optimized_nodes(model: onnx.ModelProto, tmp_path) -> int:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    with not_an_oracle():  # its graph, not its values
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return len(onnx.load(so.optimized_model_filepath).graph.node)


#: dispatches per run measured when written (lavapipe) beside onnxruntime's optimized node count
ZOO_DISPATCHES = {"cnn": 10, "mlp": 5, "transformer": 20}  # with elementwise fusion on (cnn: 12 without)


@pytest.mark.parametrize("family", ["cnn", "mlp", "transformer"])
def test_zoo_dynamic_models_dispatches_and_values(best, family, tmp_path):
    import sys
    from pathlib import Path

    from onnx_quant.backend_wgpu.session import Session

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_models import RUN_DIMS  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_zoo.quantized(family, "dynamic", per_channel=True)
    inp = model.graph.input[0]
    dims = [d.dim_value or RUN_DIMS[family][d.dim_param] for d in inp.type.tensor_type.shape.dim]
    feeds = {inp.name: np.random.default_rng(0).standard_normal(dims).astype(np.float32)}
    with Session(model, device=best, allow_host_fallback=False) as s:
        got = s.run(None, feeds)[0]
        dispatches = s.last_run_stats["dispatches"]
    assert dispatches <= _ort_optimized_nodes(model, tmp_path)
    assert dispatches == ZOO_DISPATCHES[family]
    with Session(model, device=best, allow_host_fallback=False, fuse_dynamic=False) as s:
        unfused = s.run(None, feeds)[0]
        assert s.last_run_stats["dispatches"] > dispatches and not s.dynamic_fusion.units
    for level in ("ORT_DISABLE_ALL", "ORT_ENABLE_ALL"):
        want = onnxruntime_run(model, feeds, level=level)[0]
        assert float(np.abs(got - want).max()) <= _tol(want) + (5e-7 if family == "transformer" else 0)
    assert float(np.abs(got - unfused).max()) <= _tol(unfused)


def test_dynamic_quantize_matmul_many_tiles(best):
    """rows, columns and k each past one workgroup tile (ROW_TILE 8, 64 columns, K_TILE 64)."""
    ids = _check_against_ort(best, _mm_unit(rows=19, n=130, k=150, relu=True), "DynamicQuantizeMatMul")
    assert set(ids) == {"blocked", "fused", "two_pass"}


SPECIAL_INPUTS = {"zeros": 0.0, "constant": 3.0, "nan": np.nan, "plus_inf": np.inf, "minus_inf": -np.inf,
                  "range_overflows": 3e38}


@pytest.mark.parametrize("case", sorted(SPECIAL_INPUTS))
def test_dynamic_quantize_matmul_variants_agree_on_special_inputs(best, case):
    """DynamicQuantizeLinear's special cases (an all-zero or constant A, a NaN, an infinity, a range
    that overflows float32: docs/backend.md) reach every variant's GEMM alike: the blocked one's
    quantize pass and the others' on-load quantization are the same snippet (dql.wgsl.jinja), so the
    outputs are the same bits, and those of the project's unfused kernels."""
    from onnx_quant.backend_wgpu.session import Session

    model = _mm_unit(rows=9, k=70, n=6)
    x = _feeds(model)["x"]
    value = SPECIAL_INPUTS[case]
    if case in ("zeros", "constant"):
        x[:] = value
    elif case == "range_overflows":
        x[0, 0], x[1, 1] = value, -value
    else:
        x[2, 3] = value
    outs, ids = run_every_variant(best, model, {"x": x}, "DynamicQuantizeMatMul", tunables=ALL_VARIANTS)
    assert set(ids) == {"blocked", "fused", "two_pass"}
    with Session(model, device=best, fuse_dynamic=False, allow_host_fallback=False) as s:
        unfused = s.run(None, {"x": x})
    for got, want in zip(outs, unfused):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op_type, conv", [("DynamicQuantizeMatMul", False), ("DynamicQuantizeConv", True)])
def test_planner_ranks_fused_then_two_pass(best, op_type, conv):
    """The one-pass variant while every workgroup's reduction of the activation stays within
    FUSED_MAX_REDUCE_READS (workgroups x numel), else the two-pass one."""
    from onnx_quant.backend_wgpu.session import Session

    model = _mm_unit(conv=conv)
    shapes = {k: v.shape for k, v in _feeds(model).items()}
    chosen = {}
    for reads in (None, 1):
        tunables = {} if reads is None else {"FUSED_MAX_REDUCE_READS": reads}
        with Session(model, device=best, tunables=tunables) as s:
            (entry,) = [e for e in s.explain(shapes) if e["op_type"] == op_type]
            chosen[reads] = (entry["variant"], len(entry["passes"]))
    assert chosen == {None: ("fused", 1), 1: ("two_pass", 2)}


@pytest.mark.parametrize("op_type", ["DynamicQuantizeMatMul", "MatMulIntegerToFloat"])
def test_planner_ranks_blocked_first(best, op_type):
    """The register-blocked variant outranks the workgroup-memory ones (PREFER_TILED 0); for
    DynamicQuantizeMatMul from BLOCKED_MIN_WEIGHTS weights (K x N) on, below which its one-pass
    fused variant is as fast with one dispatch, not three (reduce, quantize, GEMM)."""
    from onnx_quant.backend_wgpu.session import Session

    dqmm = op_type == "DynamicQuantizeMatMul"
    model = _mm_unit(k=128, n=64, shared=not dqmm)  # 8192 weights
    shapes = {k: v.shape for k, v in _feeds(model).items()}
    chosen = {}
    cases = {"default": {}, "tiled": {"PREFER_TILED": 1}} | ({"above": {"BLOCKED_MIN_WEIGHTS": 8193}} if dqmm else {})
    for name, tunables in cases.items():
        with Session(model, device=best, tunables=tunables) as s:
            (entry,) = [e for e in s.explain(shapes) if e["op_type"] == op_type]
            chosen[name] = (entry["variant"], len(entry["passes"]))
    if dqmm:
        assert chosen == {"default": ("blocked", 3), "above": ("fused", 1), "tiled": ("fused", 1)}
    else:
        assert chosen == {"default": ("blocked", 1), "tiled": ("gemm", 1)}


def test_declined_fused_node_runs_as_the_unit_on_the_host(best):
    """A batched (3-D) B: the fused DynamicQuantizeMatMul's kernel declines it (2-D B only), so
    the node runs on the host as the unit as written, with onnxruntime's values."""
    from onnx_quant.backend_wgpu.session import Session

    rng = np.random.default_rng(5)
    W = rng.integers(-127, 128, [2, 16, 5]).astype(np.int8)
    inits = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(np.float32(0.01), "w_scale"),
             numpy_helper.from_array(np.int8(3), "w_zp")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("Mul", ["xs", "w_scale"], ["s"]),
             helper.make_node("MatMulInteger", ["xq", "W", "xz", "w_zp"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "s"], ["y"])]
    g = helper.make_graph(nodes, "batched", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 5])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    feeds = _feeds(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Session(model, device=best) as s:
            assert [u.rule for u in s.dynamic_fusion.units] == ["dynamic_matmul"]
            got = s.run(None, feeds)[0]
            (entry,) = s.explain({"x": (2, 3, 16)})
    assert entry["device"] == "host" and entry["fused"]["rule"] == "dynamic_matmul"
    assert np.array_equal(got, onnxruntime_run(model, feeds, level="ORT_DISABLE_ALL")[0])


@pytest.mark.parametrize("level, fused", [("ORT_DISABLE_ALL", False), ("ORT_ENABLE_BASIC", False),
                                          ("ORT_ENABLE_EXTENDED", True), ("ORT_ENABLE_ALL", True)])
def test_inference_session_fuses_from_extended_on(best, level, fused):
    """As onnxruntime, whose MatMulIntegerToFloat / DynamicQuantizeMatMul fusions are level 2."""
    import onnxruntime as ort

    import onnx_quant

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    model = _mm_unit()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sess = onnx_quant.InferenceSession(model.SerializeToString(), so, providers=["vulkan"])
    assert bool(sess.session.dynamic_fusion.units) == fused
    feeds = _feeds(model)
    assert np.array_equal(sess.run(None, feeds)[0], onnxruntime_run(model, feeds, level="ORT_DISABLE_ALL")[0])

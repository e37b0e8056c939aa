"""The whole-model rules (elementwise, nn, tensor_ops, com_microsoft) against their oracles.

* ``onnx.shape_inference.infer_shapes(strict_mode=True)`` on the same model: where onnx
  knows a dim (a value, or a symbol it passed through) ours must be the same;
* symbolic dims onnx loses (``unk__*``): ours is an expression, and ``dims.evaluate`` of it
  must agree with onnx's value on concrete copies of the model (symbols bound to ints);
* onnxruntime (static inference and an actual run) for the com.microsoft operators;
* constant propagation: shapes computed inside the graph resolve, symbolically.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, strategies as st
from onnx import TensorProto as T, helper, numpy_helper, shape_inference

from onnx_quant import inference
from onnx_quant.inference import dims
from onnx_quant.inference.context import ShapesContext, TensorInfo
from onnx_quant.inference.dims import Dim
from onnx_quant.inference.registry import NodeContext, lookup
from onnx_quant.errors import InferenceError
from onnx_quant.oracles import widen_u8s8
from support.models import make_model

OPSET = 21
N, H, W, S = Dim.symbol("N"), Dim.symbol("H"), Dim.symbol("W"), Dim.symbol("S")


# ---------------------------------------------------------------- helpers
def vi(name: str, elem_type: int = T.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, elem_type, shape)


def model(nodes, inputs, outputs=("y",), inits=(), opset: int = OPSET, ms: bool = False) -> onnx.ModelProto:
    return make_model(nodes, inputs, outputs, inits, opset, extra_opsets=["com.microsoft"] if ms else (), ir_version=10)


def ints(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def floats(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=np.float32), name)


def ours(m: onnx.ModelProto) -> dict[str, TensorInfo]:
    return inference.infer_values(m, strict=True)


def theirs(m: onnx.ModelProto) -> dict[str, TensorInfo]:
    inferred = shape_inference.infer_shapes(m, strict_mode=True, data_prop=True)
    g = inferred.graph
    return {v.name: TensorInfo.from_type_proto(v.type) for v in list(g.value_info) + list(g.output)}


def bind(shape, bindings):
    return [dims.evaluate(d, bindings) if isinstance(d, Dim) else d for d in shape]


def concrete(m: onnx.ModelProto, bindings: dict[str, int]) -> onnx.ModelProto:
    """A copy with every graph-input dim_param bound."""
    c = onnx.ModelProto()
    c.CopyFrom(m)
    for v in c.graph.input:
        for d in v.type.tensor_type.shape.dim:
            if d.HasField("dim_param"):
                d.dim_value = dims.evaluate(dims.parse(d.dim_param), bindings)
    return c


def assert_agrees_with_onnx(m: onnx.ModelProto, name: str = "y") -> TensorInfo:
    """Our type of ``name`` matches onnx's wherever onnx knows it."""
    mine, other = ours(m)[name], theirs(m)[name]
    assert mine.elem_type == other.elem_type, (mine, other)
    if other.shape is not None:
        assert mine.shape is not None and len(mine.shape) == len(other.shape), (mine.shape_text(), other.shape_text())
        for d_mine, d_other in zip(mine.shape, other.shape):
            if d_other is None or (isinstance(d_other, Dim) and d_other.text().startswith("unk__")):
                continue
            assert d_mine == d_other, (mine.shape_text(), other.shape_text())
    return mine


def assert_evaluates_like_onnx(m: onnx.ModelProto, bindings_list, name: str = "y") -> TensorInfo:
    """Our symbolic type, evaluated under each binding, equals onnx's on the concrete model."""
    mine = assert_agrees_with_onnx(m, name)
    assert mine.shape is not None
    for bindings in bindings_list:
        expected = theirs(concrete(m, bindings))[name]
        assert expected.is_fully_known
        assert bind(mine.shape, bindings) == list(expected.shape), (mine.shape_text(), bindings, expected.shape_text())
    return mine


def run_rule(op: str, inputs: dict[str, TensorInfo], outputs=("y",), *, domain: str = "", opset: int = OPSET,
             strict: bool = True, **attrs) -> ShapesContext:
    """Drive one rule directly (ShapesContext + registry.lookup + NodeContext), no engine."""
    ctx = ShapesContext({"": OPSET, domain: opset} if domain else {"": opset}, strict=strict)
    for name, info in inputs.items():
        ctx.set(name, info)
    node = helper.make_node(op, list(inputs), list(outputs), domain=domain or None, **attrs)
    found = lookup(domain, op, opset)
    assert found is not None, f"no rule for {domain}::{op} at opset {opset}"
    rule, version = found
    rule(ctx, NodeContext(node, 0, ctx, version, opset))
    return ctx


def const(values, elem_type: int = T.INT64) -> TensorInfo:
    a = np.asarray(values, dtype=helper.tensor_dtype_to_np_dtype(elem_type))
    return TensorInfo.from_array(a, elem_type)


# ---------------------------------------------------------------- broadcasting
_SYMS = ("N", "M")


@st.composite
def broadcast_pair(draw):
    rank = draw(st.integers(0, 4))
    a, b = [], []
    for _ in range(rank):
        kind = draw(st.sampled_from(["same", "a1", "b1", "sym", "sym_a1", "sym_b1", "ones"]))
        k = draw(st.integers(2, 5))
        s = draw(st.sampled_from(_SYMS))
        a.append({"same": k, "a1": 1, "b1": k, "sym": s, "sym_a1": 1, "sym_b1": s, "ones": 1}[kind])
        b.append({"same": k, "a1": k, "b1": 1, "sym": s, "sym_a1": s, "sym_b1": 1, "ones": 1}[kind])
    a = a[draw(st.integers(0, rank)):]
    b = b[draw(st.integers(0, rank)):]
    return a, b


@given(broadcast_pair(), st.sampled_from(["Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater", "Where"]))
def test_broadcasting_matches_onnx(pair, op):
    a, b = pair
    if op == "Where":
        node = helper.make_node("Where", ["c", "a", "b"], ["y"])
        inputs = [vi("c", T.BOOL, a), vi("a", T.FLOAT, b), vi("b", T.FLOAT, a)]
    else:
        node = helper.make_node(op, ["a", "b"], ["y"])
        inputs = [vi("a", T.FLOAT, a), vi("b", T.FLOAT, b)]
    m = model([node], inputs)
    mine = assert_evaluates_like_onnx(m, [{"N": 3, "M": 7}, {"N": 1, "M": 2}])
    assert mine.elem_type == (T.BOOL if op in ("Equal", "Less", "Greater") else T.FLOAT)


def test_broadcast_of_two_symbols_is_their_max():
    m = model([helper.make_node("Add", ["a", "b"], ["y"])], [vi("a", T.FLOAT, ["N", 1]), vi("b", T.FLOAT, ["M", 4])])
    assert ours(m)["y"].shape == (dims.maximum(Dim.symbol("N"), Dim.symbol("M")), 4)


def test_broadcast_mismatch_names_rule_and_shapes():
    m = model([helper.make_node("Mul", ["a", "b"], ["y"])], [vi("a", T.FLOAT, [2, 3]), vi("b", T.FLOAT, [4, 3])])
    with pytest.raises(InferenceError) as e:
        ours(m)
    assert str(e.value).startswith("Mul: node #0 (Mul)")
    assert "expected" in str(e.value) and "found [2, 3], [4, 3]" in str(e.value)


def test_type_mismatch_is_reported():
    m = model([helper.make_node("Add", ["a", "b"], ["y"])], [vi("a", T.FLOAT, [2]), vi("b", T.INT64, [2])])
    with pytest.raises(InferenceError, match=r"^Add: .*expected float, found int64"):
        ours(m)
    assert inference.infer_values(m)["y"].shape == (2,)  # lenient: typed anyway, diagnostic kept


@pytest.mark.parametrize("op,to,expected", [
    ("Cast", T.FLOAT16, T.FLOAT16), ("Not", None, T.BOOL), ("Relu", None, T.FLOAT), ("Gelu", None, T.FLOAT),
    ("Clip", None, T.FLOAT), ("Identity", None, T.FLOAT), ("LeakyRelu", None, T.FLOAT),
])
def test_unary_keep_shape(op, to, expected):
    attrs = {"to": to} if to else {}
    x_type = T.BOOL if op == "Not" else T.FLOAT
    m = model([helper.make_node(op, ["x"], ["y"], **attrs)], [vi("x", x_type, ["N", 3])])
    assert ours(m)["y"] == TensorInfo(expected, (N, 3))


def test_dropout_mask_is_bool_and_castlike_takes_the_target_type():
    m = model([helper.make_node("Dropout", ["x"], ["y", "mask"]), helper.make_node("CastLike", ["y", "t"], ["z"])],
              [vi("x", T.FLOAT, ["N", 4]), vi("t", T.FLOAT16, [])], ["y", "mask", "z"])
    got = ours(m)
    assert got["mask"] == TensorInfo(T.BOOL, (N, 4))
    assert got["z"] == TensorInfo(T.FLOAT16, (N, 4))
    old = model([helper.make_node("Dropout", ["x"], ["y", "mask"])], [vi("x", T.FLOAT, [2])], ["y", "mask"], opset=7)
    assert ours(old)["mask"].elem_type == T.FLOAT  # before opset 10 the mask has the input's type


# ---------------------------------------------------------------- Reshape / Flatten with a symbolic batch
@pytest.mark.parametrize("target,expected", [
    ([0, -1], (N, 60)),
    ([-1, 60], (N, 60)),
    ([0, 3, -1], (N, 3, 20)),
    ([0, 0, 4, 5], (N, 3, 4, 5)),
    ([-1], (dims.mul(N, 60),)),
    ([2, -1, 5], (2, dims.mul(N, 6), 5)),
])
def test_reshape_symbolic_batch(target, expected):
    m = model([helper.make_node("Reshape", ["x", "s"], ["y"])], [vi("x", T.FLOAT, ["N", 3, 4, 5])],
              inits=[ints("s", target)])
    mine = assert_evaluates_like_onnx(m, [{"N": 2}, {"N": 7}])
    assert mine.shape == expected


def test_reshape_cancels_symbols_in_minus_one():
    m = model([helper.make_node("Reshape", ["x", "s"], ["y"])], [vi("x", T.FLOAT, ["N", "H", "W", 3])],
              inits=[ints("s", [0, -1, 3])])
    assert ours(m)["y"].shape == (N, dims.mul(H, W), 3)


def test_reshape_errors_and_unknown_target():
    bad = model([helper.make_node("Reshape", ["x", "s"], ["y"])], [vi("x", T.FLOAT, [2, 3])], inits=[ints("s", [4, -1])])
    with pytest.raises(InferenceError, match=r"^Reshape: node #0 \(Reshape\): input shape: cannot infer -1"):
        ours(bad)
    count = model([helper.make_node("Reshape", ["x", "s"], ["y"])], [vi("x", T.FLOAT, [2, 3])], inits=[ints("s", [4, 2])])
    with pytest.raises(InferenceError, match="element count changes: expected 6 elements"):
        ours(count)
    unknown = model([helper.make_node("Reshape", ["x", "s"], ["y"])], [vi("x", T.FLOAT, [2, 3]), vi("s", T.INT64, [3])])
    assert ours(unknown)["y"] == TensorInfo(T.FLOAT, (None, None, None))
    zero = model([helper.make_node("Reshape", ["x", "s"], ["y"], allowzero=1)], [vi("x", T.FLOAT, [0, 3])],
                 inits=[ints("s", [3, 0])])
    assert ours(zero)["y"].shape == (3, 0)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, 4])
def test_flatten_symbolic(axis):
    m = model([helper.make_node("Flatten", ["x"], ["y"], axis=axis)], [vi("x", T.FLOAT, ["N", 3, "H", 5])])
    assert_evaluates_like_onnx(m, [{"N": 2, "H": 4}, {"N": 5, "H": 1}])


# ---------------------------------------------------------------- Conv / pools with symbolic H, W
@st.composite
def conv_case(draw):
    k = draw(st.integers(1, 4))
    s = draw(st.integers(1, 3))
    d = draw(st.integers(1, 2))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]))
    pads = [draw(st.integers(0, 2)) for _ in range(4)] if auto_pad == "NOTSET" else None
    group = draw(st.sampled_from([1, 2]))
    return k, s, d, auto_pad, pads, group


@given(conv_case())
def test_conv_symbolic_spatial_dims_evaluate_like_onnx(case):
    k, s, d, auto_pad, pads, group = case
    attrs = dict(strides=[s, s], dilations=[d, 1], auto_pad=auto_pad, group=group)
    if pads is not None:
        attrs["pads"] = pads
    w = floats("w", np.zeros((4, 4 // group, k, k)))
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], **attrs)], [vi("x", T.FLOAT, ["N", 4, "H", "W"])], inits=[w])
    eff = (k - 1) * d + 1
    bindings = [{"N": 1, "H": h, "W": wd} for h, wd in ((eff + 5, k + 3), (eff + 8, k + 10), (2 * eff + 1, 2 * k))]
    mine = assert_evaluates_like_onnx(m, bindings)
    assert all(x is not None for x in mine.shape)  # onnx loses H and W; the rule keeps them


@given(st.integers(1, 4), st.integers(1, 3), st.integers(0, 3), st.integers(0, 3), st.booleans(),
       st.sampled_from(["MaxPool", "AveragePool"]), st.integers(1, 2), st.sampled_from([19, 22]))
def test_pool_ceil_mode_evaluates_like_onnx(k, s, pb, pe, ceil_mode, op, d, opset):
    """Opset 22 drops a last ceil-mode window that starts in the padding; earlier opsets do not."""
    pb, pe = min(pb, k - 1), min(pe, k - 1)
    eff = (k - 1) * d + 1
    pb, pe = min(pb, eff - 1), min(pe, eff - 1)
    attrs = dict(kernel_shape=[k], strides=[s], pads=[pb, pe], ceil_mode=int(ceil_mode), dilations=[d])
    m = model([helper.make_node(op, ["x"], ["y"], **attrs)], [vi("x", T.FLOAT, [1, 2, "H"])], opset=opset)
    mine = ours(m)["y"]
    for h in range(max(1, eff - pb - pe), eff + 3 * s + 2):
        expected = theirs(concrete(m, {"H": h}))["y"]
        if mine.shape[2] is not None:
            assert dims.evaluate(mine.shape[2], {"H": h}) == expected.shape[2], (mine.shape_text(), h, expected.shape_text())
        fixed = model([helper.make_node(op, ["x"], ["y"], **attrs)], [vi("x", T.FLOAT, [1, 2, h])], opset=opset)
        assert ours(fixed)["y"].shape == expected.shape


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_a_runtimes_pass_drops_the_last_ceil_window_in_the_padding_at_every_opset(op):
    """Before opset 22 onnx's inference keeps a last ceil-mode window that starts in the end padding
    (the default pass agrees with it); onnx.reference and onnxruntime drop it, and a runtime's pass
    (``runtime=True``, what the GPU Session plans with) types what they compute."""
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator
    from onnx_quant.inference import infer

    attrs = dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)
    m = model([helper.make_node(op, ["x"], ["y"], **attrs)], [vi("x", T.FLOAT, [1, 1, 5, 5])], opset=19)
    assert ours(m)["y"].shape == theirs(m)["y"].shape == (1, 1, 4, 4)
    x = np.zeros((1, 1, 5, 5), np.float32)
    ran = {ReferenceEvaluator(m).run(None, {"x": x})[0].shape,
           ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0].shape}
    assert ran == {(1, 1, 3, 3)}
    assert infer(m, runtime=True).values()["y"].shape == (1, 1, 3, 3)


@pytest.mark.parametrize("attrs", [
    dict(strides=[2, 2]), dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
    dict(strides=[3, 2], dilations=[2, 1]), dict(output_shape=[10, 9], strides=[2, 2]),
    dict(auto_pad="SAME_UPPER", strides=[2, 2]), dict(group=2),
])
def test_conv_transpose_symbolic(attrs):
    g = attrs.get("group", 1)
    w = floats("w", np.zeros((4, 6 // g if g > 1 else 3, 3, 3)))
    m = model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], **attrs)], [vi("x", T.FLOAT, ["N", 4, "H", "W"])],
              inits=[w])
    assert_evaluates_like_onnx(m, [{"N": 1, "H": 4, "W": 5}, {"N": 2, "H": 7, "W": 3}])


def test_conv_errors_name_the_rule():
    w = floats("w", np.zeros((4, 3, 3, 3)))
    m = model([helper.make_node("Conv", ["x", "w"], ["y"])], [vi("x", T.FLOAT, [1, 5, 8, 8])], inits=[w])
    with pytest.raises(InferenceError, match=r"^Conv: node #0 \(Conv\): input x: .*expected 3, found 5"):
        ours(m)


@pytest.mark.parametrize("node,inputs,inits", [
    (helper.make_node("MatMul", ["a", "b"], ["y"]), [vi("a", T.FLOAT, ["N", "S", 8]), vi("b", T.FLOAT, [8, 4])], []),
    (helper.make_node("MatMul", ["a", "b"], ["y"]), [vi("a", T.FLOAT, [8]), vi("b", T.FLOAT, ["N", 8, 4])], []),
    (helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=1, transB=1),
     [vi("a", T.FLOAT, [8, "N"]), vi("b", T.FLOAT, [4, 8]), vi("c", T.FLOAT, [4])], []),
    (helper.make_node("GlobalAveragePool", ["x"], ["y"]), [vi("x", T.FLOAT, ["N", 3, "H", "W"])], []),
    (helper.make_node("GlobalMaxPool", ["x"], ["y"]), [vi("x", T.FLOAT, ["N", 3, "H"])], []),
    (helper.make_node("Softmax", ["x"], ["y"], axis=1), [vi("x", T.FLOAT, ["N", 3])], []),
    (helper.make_node("LogSoftmax", ["x"], ["y"]), [vi("x", T.FLOAT, ["N", 3])], []),
])
def test_nn_symbolic_matches_onnx(node, inputs, inits):
    assert_evaluates_like_onnx(model([node], inputs, inits=inits), [{"N": 2, "S": 3, "H": 4, "W": 5}])


def test_normalization_statistics_outputs():
    ln = model([helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean", "inv"], axis=2)],
               [vi("x", T.FLOAT16, ["N", "S", 8])], ["y", "mean", "inv"], inits=[numpy_helper.from_array(np.ones(8, np.float16), "s")])
    got = ours(ln)
    assert got["mean"] == TensorInfo(T.FLOAT, (N, S, 1)) == got["inv"]
    assert got["y"].elem_type == T.FLOAT16
    bn = model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1)],
               [vi("x", T.FLOAT, ["N", 3, "H"])], ["y", "rm", "rv"],
               inits=[floats(nm, np.ones(3)) for nm in "sbmv"], opset=15)
    got = ours(bn)
    assert got["y"].shape == (N, 3, H) and got["rm"].shape == (3,) and got["rv"].elem_type == T.FLOAT


def test_maxpool_indices_are_int64():
    m = model([helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], strides=[2, 2])],
              [vi("x", T.FLOAT, ["N", 3, "H", "W"])], ["y", "i"])
    got = ours(m)
    assert got["i"].elem_type == T.INT64 and got["i"].shape == got["y"].shape


@pytest.mark.parametrize("opset", [9, 11, 22])
@pytest.mark.parametrize("attrs", [dict(kernel_shape=[2, 2], strides=[2, 2]),
                                   dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 0, 1]),
                                   dict(kernel_shape=[3, 3])])
def test_max_unpool_evaluates_like_onnx(opset, attrs):
    """(in - 1) * stride - pads + kernel per spatial axis, symbolic where the input is."""
    m = model([helper.make_node("MaxUnpool", ["x", "i"], ["y"], **attrs)],
              [vi("x", T.FLOAT, ["N", 3, "H", "W"]), vi("i", T.INT64, ["N", 3, "H", "W"])], opset=opset)
    mine = assert_evaluates_like_onnx(m, [{"N": 1, "H": 4, "W": 5}, {"N": 2, "H": 7, "W": 3}])
    assert all(d is not None for d in mine.shape)


def test_max_unpool_takes_output_shape_values_onnx_leaves_unknown():
    m = model([helper.make_node("MaxUnpool", ["x", "i", "s"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
              [vi("x", T.FLOAT, [1, 3, 2, 2]), vi("i", T.INT64, [1, 3, 2, 2])], inits=[ints("s", [1, 3, 5, 5])])
    assert ours(m)["y"] == TensorInfo(T.FLOAT, (1, 3, 5, 5))
    assert theirs(m)["y"].shape is None  # onnx 1.23: no shape, even for an initializer
    unknown = model([helper.make_node("MaxUnpool", ["x", "i", "s"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                    [vi("x", T.FLOAT, [1, 3, 2, 2]), vi("i", T.INT64, [1, 3, 2, 2]), vi("s", T.INT64, [4])])
    assert len(ours(unknown)["y"].shape) == 4  # the rank from output_shape's length, the dims fresh


# ---------------------------------------------------------------- Slice
_BIG = 2**63 - 1


@st.composite
def slice_case(draw):
    step = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
    bound = st.one_of(st.integers(-12, 12), st.sampled_from([_BIG, -_BIG, 2**31 - 1]))
    return draw(bound), draw(bound), step


@given(slice_case(), st.integers(0, 9))
def test_slice_concrete_matches_onnx_and_numpy_clamping(case, d):
    start, end, step = case
    m = model([helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])], [vi("x", T.FLOAT, [2, d])],
              inits=[ints("s", [start]), ints("e", [end]), ints("a", [1]), ints("t", [step])])
    mine = ours(m)["y"]
    assert mine.shape == theirs(m)["y"].shape


@given(slice_case())
def test_slice_symbolic_evaluates_like_onnx(case):
    start, end, step = case
    m = model([helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])], [vi("x", T.FLOAT, [2, "N"])],
              inits=[ints("s", [start]), ints("e", [end]), ints("a", [-1]), ints("t", [step])])
    mine = ours(m)["y"]
    for n in (0, 1, 2, 5, 13):
        expected = theirs(concrete(m, {"N": n}))["y"].shape
        if mine.shape[1] is not None:
            assert dims.evaluate(mine.shape[1], {"N": n}) == expected[1], (case, n, mine.shape_text())


@pytest.mark.parametrize("start,end,step,text", [
    (0, _BIG, 1, "N"), (1, _BIG, 1, "max(N - 1, 0)"), (0, -1, 1, "max(N - 1, 0)"), (-1, -_BIG, -1, "N"),
    (0, _BIG, 2, "floor((N + 1) / 2)"), (2, 5, 1, None),
])
def test_slice_symbolic_forms(start, end, step, text):
    m = model([helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])], [vi("x", T.FLOAT, ["N"])],
              inits=[ints("s", [start]), ints("e", [end]), ints("a", [0]), ints("t", [step])])
    d = ours(m)["y"].shape[0]
    if text is None:  # min(max(N - 2, 0), 3): an expression, whatever its spelling
        assert [dims.evaluate(d, {"N": v}) for v in range(8)] == [0, 0, 0, 1, 2, 3, 3, 3]
    else:
        assert d == dims.parse(text), dims.to_text(d)


def test_slice_with_unknown_starts_keeps_rank():
    m = model([helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])],
              [vi("x", T.FLOAT, ["N", 4, 5]), vi("s", T.INT64, [1]), vi("e", T.INT64, [1])], inits=[ints("a", [2])])
    assert ours(m)["y"].shape == (N, 4, None)


# ---------------------------------------------------------------- Gather / Concat / Transpose / Split / others
@pytest.mark.parametrize("data,idx,axis", [
    (["N", 4, 5], [2, 3], 1), (["N", 4], [], 0), (["N", 4, "H"], ["K"], -1), ([3], [2, 2], 0),
])
def test_gather_matches_onnx(data, idx, axis):
    m = model([helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)],
              [vi("x", T.FLOAT, data), vi("i", T.INT64, idx)])
    assert_agrees_with_onnx(m)


@pytest.mark.parametrize("shapes,axis", [
    ([["N", 3], ["N", 5]], 1), ([["N", 3], ["M", 3]], 0), ([[2, "H"], [4, "H"], [1, "H"]], 0), ([["N", 3], [2, 3]], -2),
])
def test_concat_matches_onnx(shapes, axis):
    names = [f"x{i}" for i in range(len(shapes))]
    m = model([helper.make_node("Concat", names, ["y"], axis=axis)], [vi(nm, T.FLOAT, s) for nm, s in zip(names, shapes)])
    mine = assert_evaluates_like_onnx(m, [{"N": 2, "M": 3, "H": 4}])
    assert None not in mine.shape


def test_concat_rank_error():
    m = model([helper.make_node("Concat", ["a", "b"], ["y"], axis=0)], [vi("a", T.FLOAT, [2, 3]), vi("b", T.FLOAT, [2])])
    with pytest.raises(InferenceError, match=r"^Concat: .*input #1: inputs must have the same rank: expected rank 2"):
        ours(m)


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1]])
def test_transpose_matches_onnx(perm):
    attrs = {} if perm is None else {"perm": perm}
    m = model([helper.make_node("Transpose", ["x"], ["y"], **attrs)], [vi("x", T.FLOAT, ["N", 3, "H"])])
    assert_agrees_with_onnx(m)


def test_transpose_bad_perm():
    m = model([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 0])], [vi("x", T.FLOAT, [2, 3])])
    with pytest.raises(InferenceError, match=r"^Transpose: .*expected a permutation of 0..1, found \[0, 0\]"):
        ours(m)


def test_split_variants():
    even = model([helper.make_node("Split", ["x"], ["a", "b"], axis=1)], [vi("x", T.FLOAT, ["N", "H"])], ["a", "b"], opset=13)
    assert ours(even)["a"].shape == (N, dims.floordiv(H, 2))
    uneven = model([helper.make_node("Split", ["x"], ["a", "b", "c"], axis=0, num_outputs=3)], [vi("x", T.FLOAT, [7])],
                   ["a", "b", "c"], opset=18)
    got = ours(uneven)
    assert [got[k].shape for k in "abc"] == [(3,), (3,), (1,)]
    sizes = model([helper.make_node("Split", ["x", "s"], ["a", "b"], axis=-1)], [vi("x", T.FLOAT, ["N", 6])],
                  ["a", "b"], inits=[ints("s", [2, 4])])
    got = ours(sizes)
    assert (got["a"].shape, got["b"].shape) == ((N, 2), (N, 4))


@pytest.mark.parametrize("node,inputs,inits,opset", [
    (helper.make_node("Squeeze", ["x", "a"], ["y"]), [vi("x", T.FLOAT, ["N", 1, 3])], [ints("a", [1])], OPSET),
    (helper.make_node("Squeeze", ["x"], ["y"], axes=[-1]), [vi("x", T.FLOAT, ["N", 1])], [], 11),
    (helper.make_node("Unsqueeze", ["x", "a"], ["y"]), [vi("x", T.FLOAT, ["N", 3])], [ints("a", [0, -1])], OPSET),
    (helper.make_node("Expand", ["x", "s"], ["y"]), [vi("x", T.FLOAT, ["N", 1])], [ints("s", [2, 1, 4])], OPSET),
    (helper.make_node("Tile", ["x", "r"], ["y"]), [vi("x", T.FLOAT, ["N", 3])], [ints("r", [2, 2])], OPSET),
    (helper.make_node("Pad", ["x", "p"], ["y"]), [vi("x", T.FLOAT, ["N", 3])], [ints("p", [0, 1, 0, 2])], OPSET),
    (helper.make_node("Pad", ["x", "p", "", "a"], ["y"]), [vi("x", T.FLOAT, ["N", 3, 4])],
     [ints("p", [1, 1]), ints("a", [-1])], OPSET),
    (helper.make_node("Resize", ["x", "", "s"], ["y"]), [vi("x", T.FLOAT, ["N", 3, 4, 6])],
     [floats("s", [1, 1, 2, 0.5])], OPSET),
    (helper.make_node("Resize", ["x", "", "", "z"], ["y"]), [vi("x", T.FLOAT, ["N", 3, 4, 6])],
     [ints("z", [2, 3, 8, 9])], OPSET),
    (helper.make_node("Shape", ["x"], ["y"], start=1, end=-1), [vi("x", T.FLOAT, ["N", 3, 4, 6])], [], OPSET),
    (helper.make_node("Size", ["x"], ["y"]), [vi("x", T.FLOAT, ["N", 3])], [], OPSET),
    (helper.make_node("TopK", ["x", "k"], ["y", "i"]), [vi("x", T.FLOAT, ["N", 9])], [ints("k", [4])], OPSET),
    (helper.make_node("ArgMax", ["x"], ["y"], axis=-1, keepdims=0), [vi("x", T.FLOAT, ["N", 9])], [], OPSET),
    (helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=0), [vi("x", T.FLOAT, ["N", 9, 2])], [], 13),
    (helper.make_node("ReduceSum", ["x", "a"], ["y"]), [vi("x", T.FLOAT, ["N", 9, 2])], [ints("a", [-1])], OPSET),
    (helper.make_node("ReduceMax", ["x", "a"], ["y"], keepdims=0), [vi("x", T.FLOAT, ["N", 9, 2])], [ints("a", [0, 2])], 18),
    (helper.make_node("ReduceMin", ["x"], ["y"]), [vi("x", T.FLOAT, ["N", 9])], [], OPSET),
    (helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1), [vi("x", T.FLOAT, ["N", 9]), vi("i", T.INT64, ["N", 2])],
     [], OPSET),
    (helper.make_node("Einsum", ["a", "b"], ["y"], equation="bij,bjk->bik"),
     [vi("a", T.FLOAT, ["N", 2, 3]), vi("b", T.FLOAT, ["N", 3, 4])], [], OPSET),
    (helper.make_node("Einsum", ["a"], ["y"], equation="...ii->...i"), [vi("a", T.FLOAT, ["N", 3, 3])], [], OPSET),
    (helper.make_node("Einsum", ["a", "b"], ["y"], equation="ij,jk"), [vi("a", T.FLOAT, [2, 3]), vi("b", T.FLOAT, [3, 5])],
     [], OPSET),
])
def test_tensor_ops_match_onnx(node, inputs, inits, opset):
    outputs = list(node.output)
    m = model([node], inputs, outputs, inits=inits, opset=opset)
    for name in outputs:
        assert_evaluates_like_onnx(m, [{"N": 2, "K": 3}], name)


def test_squeeze_without_axes_and_a_symbolic_dim_has_unknown_rank():
    m = model([helper.make_node("Squeeze", ["x"], ["y"])], [vi("x", T.FLOAT, ["N", 1, 3])])
    assert ours(m)["y"].shape is None
    bad = model([helper.make_node("Squeeze", ["x", "a"], ["y"])], [vi("x", T.FLOAT, [2, 3])], inits=[ints("a", [0])])
    with pytest.raises(InferenceError, match=r"^Squeeze: .*axes: axis 0 has size 2"):
        ours(bad)


def test_constant_of_shape_and_range():
    m = model([helper.make_node("ConstantOfShape", ["s"], ["y"],
                                value=helper.make_tensor("v", T.INT32, [1], [7]))], [], inits=[ints("s", [2, 3])])
    got = ours(m)["y"]
    assert got.elem_type == T.INT32 and got.shape == (2, 3) and got.value.tolist() == [[7] * 3] * 2
    r = model([helper.make_node("Range", ["a", "b", "c"], ["y"])], [],
              inits=[floats("a", 1.0), floats("b", 5.5), floats("c", 1.5)])
    got = ours(r)["y"]
    assert got.shape == (3,) and got.value.tolist() == [1.0, 2.5, 4.0]


def test_constant_rule_directly():
    """Well-formed Constant nodes are typed by the pass itself; the rule serves direct use."""
    ctx = run_rule("Constant", {}, value=numpy_helper.from_array(np.arange(6, dtype=np.int32).reshape(2, 3)))
    assert ctx["y"].elem_type == T.INT32 and ctx["y"].shape == (2, 3) and ctx["y"].value.sum() == 15
    ctx = run_rule("Constant", {}, value_ints=[1, 2])
    assert ctx["y"].shape == (2,) and ctx["y"].value.tolist() == [1, 2]
    with pytest.raises(InferenceError, match="^Constant: .*exactly one value attribute"):
        run_rule("Constant", {}, value_int=1, value_float=2.0)


# ---------------------------------------------------------------- constant propagation inside the graph
def _flatten_chain(x_shape):
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [ints("zero", 0), ints("axes0", [0]), ints("minus1", [-1])]
    return model(nodes, [vi("x", T.FLOAT, x_shape)], inits=inits)


def test_shape_gather_concat_reshape_chain_is_symbolic():
    got = inference.infer_values(_flatten_chain(["N", 3, 8, 8]), strict=True)
    assert got["y"].shape == (N, 192)
    assert list(got["target"].value) == [N, -1]  # object array: symbolic entries
    got = inference.infer_values(_flatten_chain(["N", 3, "H", "W"]), strict=True)
    assert got["y"].shape == (N, dims.mul(3, dims.mul(H, W)))
    # the same model with concrete dims folds to ints
    got = inference.infer_values(_flatten_chain(["N", 3, "H", "W"]), {"x": [2, 3, 4, 5]}, strict=True)
    assert got["y"].shape == (2, 60) and got["target"].value.dtype == np.int64


def test_shape_arithmetic_builds_reshape_and_expand_targets():
    # target = [N, C * H * W] built with Gather/Mul/Concat; Expand(ones, [N, 4]); Range(0, N)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["n"]),
        helper.make_node("Gather", ["s", "i1"], ["c"]),
        helper.make_node("Slice", ["s", "two", "big"], ["hw"]),
        helper.make_node("ReduceProd", ["hw"], ["hw_prod"], keepdims=1),
        helper.make_node("Mul", ["c", "hw_prod"], ["chw"]),
        helper.make_node("Concat", ["n", "chw"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
        helper.make_node("Concat", ["n", "four"], ["etarget"], axis=0),
        helper.make_node("Expand", ["one", "etarget"], ["e"]),
        helper.make_node("Squeeze", ["n"], ["n0"]),
        helper.make_node("Range", ["zero", "n0", "step"], ["r"]),
        helper.make_node("Cast", ["n0"], ["n0_32"], to=T.INT32),
        helper.make_node("Equal", ["n", "n"], ["same"]),
        helper.make_node("Where", ["same", "n", "four"], ["w"]),
        helper.make_node("Size", ["x"], ["size"]),
        helper.make_node("Div", ["size", "n"], ["per_item"]),
    ]
    inits = [ints("i0", [0]), ints("i1", [1]), ints("two", [2]), ints("big", [_BIG]), ints("four", [4]),
             floats("one", [1.0]), ints("zero", 0), ints("step", 1)]
    m = model(nodes, [vi("x", T.FLOAT, ["N", 3, "H", "W"])], ["y", "e", "r", "w", "per_item", "n0_32"], inits=inits)
    got = inference.infer_values(m, strict=True)
    hw = dims.mul(H, W)
    assert got["s"].value.tolist() == [N, 3, H, W]
    assert got["chw"].value is None or list(got["chw"].value) == [dims.mul(3, hw)]  # ReduceProd: onnx fallback
    assert got["e"].shape == (N, 4)
    assert got["r"].shape == (N,)
    assert got["w"].value.tolist() == [N]
    assert got["per_item"].value.tolist() == [dims.mul(3, hw)]
    assert got["n0_32"].elem_type == T.INT32 and got["n0_32"].value.tolist() == N  # 0-d object array
    assert got["y"].shape[0] == N


def test_values_stay_small():
    big = model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("ConstantOfShape", ["s"], ["y"])],
                [vi("x", T.FLOAT, [10, 10])])
    got = ours(big)["y"]
    assert got.shape == (10, 10) and got.value is None  # 100 elements: shape only


def test_shape_value_directly_from_the_rule():
    ctx = run_rule("Shape", {"x": TensorInfo(T.FLOAT, (N, None, 3))}, start=0)
    v = ctx["y"].value
    assert v.dtype == object and list(v) == [N, None, 3]
    ctx = run_rule("Gather", {"s": ctx["y"], "i": const([2, 0])}, axis=0)
    assert list(ctx["y"].value) == [3, N]
    ctx = run_rule("Gather", {"s": TensorInfo(T.INT64, (2,), np.array([N, 3], dtype=object)), "i": const([1])})
    assert ctx["y"].value.dtype == np.int64 and ctx["y"].value.tolist() == [3]  # known entries turn numeric


def test_rank_only_outputs_for_unknown_data():
    ctx = run_rule("Expand", {"x": TensorInfo(T.FLOAT, (3, 1)), "s": TensorInfo(T.INT64, (3,))})
    assert ctx["y"].shape == (None, 3, None)
    ctx = run_rule("ReduceMean", {"x": TensorInfo(T.FLOAT, (N, 3)), "a": TensorInfo(T.INT64, (1,))}, keepdims=1)
    assert ctx["y"].shape == (None, None)
    ctx = run_rule("Unsqueeze", {"x": TensorInfo(T.FLOAT, (N,)), "a": TensorInfo(T.INT64, (2,))})
    assert ctx["y"].shape == (None, None, None)


# ---------------------------------------------------------------- com.microsoft
def _ort_types(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, tuple]:
    """onnxruntime's static output types and the (dtype, shape) of an actual run."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(widen_u8s8(m).model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    outs = sess.run(None, feeds)
    return {o.name: (o.type, tuple(o.shape), r.dtype, r.shape) for o, r in zip(sess.get_outputs(), outs)}


_U8 = np.uint8


def _q(name, values, dtype=_U8):
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


_MS_CASES = {
    "QuantizeLinear": (
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], domain="com.microsoft")],
        [vi("x", T.FLOAT, [2, 3])], [floats("s", 0.1), _q("z", 3, np.int8)], {"x": np.ones((2, 3), np.float32)}),
    "DequantizeLinear": (
        [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], domain="com.microsoft", axis=1)],
        [vi("x", T.UINT8, [2, 3])], [floats("s", [0.1, 0.2, 0.3]), _q("z", [1, 2, 3])], {"x": np.ones((2, 3), _U8)}),
    "QLinearAdd": (
        [helper.make_node("QLinearAdd", ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["y"], domain="com.microsoft")],
        [vi("a", T.UINT8, [2, 1, 4]), vi("b", T.UINT8, [3, 1])],
        [floats("as", 0.1), _q("az", 1), floats("bs", 0.2), _q("bz", 2), floats("cs", 0.3), _q("cz", 3)],
        {"a": np.ones((2, 1, 4), _U8), "b": np.ones((3, 1), _U8)}),
    "QLinearMul": (  # no C_zero_point: the output takes A's type
        [helper.make_node("QLinearMul", ["a", "as", "az", "b", "bs", "bz", "cs"], ["y"], domain="com.microsoft")],
        [vi("a", T.INT8, [2, 4]), vi("b", T.INT8, [4])],
        [floats("as", 0.1), _q("az", 0, np.int8), floats("bs", 0.2), _q("bz", 0, np.int8), floats("cs", 0.3)],
        {"a": np.ones((2, 4), np.int8), "b": np.ones(4, np.int8)}),
    "QLinearConcat": (
        [helper.make_node("QLinearConcat", ["ys", "yz", "a", "as", "az", "b", "bs", "bz"], ["y"], domain="com.microsoft",
                          axis=1)],
        [vi("a", T.INT8, [2, 3]), vi("b", T.INT8, [2, 5])],
        [floats("ys", 0.1), _q("yz", 0, np.int8), floats("as", 0.1), _q("az", 0, np.int8), floats("bs", 0.1),
         _q("bz", 0, np.int8)], {"a": np.ones((2, 3), np.int8), "b": np.ones((2, 5), np.int8)}),
    "QLinearGlobalAveragePool": (
        [helper.make_node("QLinearGlobalAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft",
                          channels_last=1)],
        [vi("x", T.UINT8, [1, 5, 5, 3])], [floats("xs", 0.1), _q("xz", 1), floats("ys", 0.1), _q("yz", 1)],
        {"x": np.ones((1, 5, 5, 3), _U8)}),
    "QLinearAveragePool": (
        [helper.make_node("QLinearAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft",
                          kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)],
        [vi("x", T.UINT8, [1, 2, 8, 7])], [floats("xs", 0.1), _q("xz", 1), floats("ys", 0.1), _q("yz", 1)],
        {"x": np.ones((1, 2, 8, 7), _U8)}),
    "QLinearAveragePool_nhwc": (
        [helper.make_node("QLinearAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft",
                          kernel_shape=[2, 2], strides=[2, 2], channels_last=1)],
        [vi("x", T.UINT8, [1, 8, 6, 3])], [floats("xs", 0.1), _q("xz", 1), floats("ys", 0.1), _q("yz", 1)],
        {"x": np.ones((1, 8, 6, 3), _U8)}),
    "QLinearLeakyRelu": (
        [helper.make_node("QLinearLeakyRelu", ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft", alpha=0.1)],
        [vi("x", T.INT8, [2, 3])], [floats("xs", 0.1), _q("xz", 0, np.int8), floats("ys", 0.1), _q("yz", 0, np.int8)],
        {"x": np.ones((2, 3), np.int8)}),
    "QLinearSigmoid": (
        [helper.make_node("QLinearSigmoid", ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft")],
        [vi("x", T.UINT8, [2, 3])], [floats("xs", 0.1), _q("xz", 1), floats("ys", 0.1), _q("yz", 1)],
        {"x": np.ones((2, 3), _U8)}),
    "QLinearSoftmax": (
        [helper.make_node("QLinearSoftmax", ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft", opset=13,
                          axis=-1)],
        [vi("x", T.UINT8, [2, 3])], [floats("xs", 0.1), _q("xz", 1), floats("ys", 1 / 256), _q("yz", 0)],
        {"x": np.ones((2, 3), _U8)}),
    "QLinearWhere": (
        [helper.make_node("QLinearWhere", ["c", "a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"],
                          domain="com.microsoft")],
        [vi("c", T.BOOL, [2, 1]), vi("a", T.UINT8, [3]), vi("b", T.UINT8, [1, 3])],
        [floats("as", 0.1), _q("az", 1), floats("bs", 0.1), _q("bz", 1), floats("ys", 0.1), _q("yz", 1)],
        {"c": np.ones((2, 1), bool), "a": np.ones(3, _U8), "b": np.ones((1, 3), _U8)}),
    "QGemm": (
        [helper.make_node("QGemm", ["a", "as", "az", "b", "bs", "bz", "", "ys", "yz"], ["y"], domain="com.microsoft",
                          transB=1)],
        [vi("a", T.UINT8, [2, 4])],
        [floats("as", 0.1), _q("az", 1), _q("b", np.ones((3, 4)), np.int8), floats("bs", 0.1), _q("bz", 0, np.int8),
         floats("ys", 0.1), _q("yz", 1)], {"a": np.ones((2, 4), _U8)}),
    "QGemm_float": (
        [helper.make_node("QGemm", ["a", "as", "az", "b", "bs", "bz"], ["y"], domain="com.microsoft", transA=1)],
        [vi("a", T.UINT8, [4, 2])],
        [floats("as", 0.1), _q("az", 1), _q("b", np.ones((4, 3)), np.int8), floats("bs", 0.1), _q("bz", 0, np.int8)],
        {"a": np.ones((4, 2), _U8)}),
    "DynamicQuantizeMatMul": (
        [helper.make_node("DynamicQuantizeMatMul", ["a", "b", "bs", "bz"], ["y"], domain="com.microsoft")],
        [vi("a", T.FLOAT, [2, 5, 4])], [_q("b", np.ones((4, 3)), np.int8), floats("bs", 0.1), _q("bz", 0, np.int8)],
        {"a": np.ones((2, 5, 4), np.float32)}),
    "MatMulIntegerToFloat": (
        [helper.make_node("MatMulIntegerToFloat", ["a", "b", "as", "bs", "az", "bz"], ["y"], domain="com.microsoft")],
        [vi("a", T.UINT8, [2, 5, 4])],
        [_q("b", np.ones((4, 3)), np.int8), floats("as", 0.1), floats("bs", 0.1), _q("az", 1), _q("bz", 0, np.int8)],
        {"a": np.ones((2, 5, 4), _U8)}),
    "MatMulNBits": (
        [helper.make_node("MatMulNBits", ["a", "b", "s"], ["y"], domain="com.microsoft", K=32, N=6, bits=4,
                          block_size=16)],
        [vi("a", T.FLOAT, [2, 3, 32])], [_q("b", np.zeros((6, 2, 8))), floats("s", np.ones(12))],
        {"a": np.ones((2, 3, 32), np.float32)}),
    "GatherBlockQuantized": (
        [helper.make_node("GatherBlockQuantized", ["d", "i", "s"], ["y"], domain="com.microsoft", block_size=16,
                          bits=4, quantize_axis=1, gather_axis=0)],
        [vi("i", T.INT64, [2, 3])], [_q("d", np.zeros((10, 16))), floats("s", np.ones((10, 2)))],
        {"i": np.zeros((2, 3), np.int64)}),
    "Gelu": (
        [helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")],
        [vi("x", T.FLOAT, [2, 3])], [], {"x": np.ones((2, 3), np.float32)}),
    "QuickGelu": (
        [helper.make_node("QuickGelu", ["x"], ["y"], domain="com.microsoft", alpha=1.702)],
        [vi("x", T.FLOAT16, [2, 5])], [], {"x": np.ones((2, 5), np.float16)}),
    "BiasGelu": (
        [helper.make_node("BiasGelu", ["a", "b"], ["y"], domain="com.microsoft")],
        [vi("a", T.FLOAT, [2, 3, 4])], [floats("b", np.ones(4))], {"a": np.ones((2, 3, 4), np.float32)}),
    "FastGelu": (
        [helper.make_node("FastGelu", ["x", "b"], ["y"], domain="com.microsoft")],
        [vi("x", T.FLOAT, [3, 8])], [floats("b", np.ones(8))], {"x": np.ones((3, 8), np.float32)}),
    "FastGelu without bias": (
        [helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft")],
        [vi("x", T.FLOAT, [3, 8])], [], {"x": np.ones((3, 8), np.float32)}),
}


@pytest.mark.parametrize("case", sorted(_MS_CASES))
def test_com_microsoft_matches_onnxruntime(case):
    nodes, inputs, inits, feeds = _MS_CASES[case]
    m = model(nodes, inputs, inits=inits, ms=True)
    mine = ours(m)["y"]
    ort_type, ort_static, dtype, shape = _ort_types(m, feeds)["y"]
    assert mine.shape == shape, (mine.shape_text(), shape)
    assert helper.tensor_dtype_to_np_dtype(mine.elem_type) == dtype
    if all(isinstance(d, int) for d in ort_static):
        assert mine.shape == tuple(ort_static)


def _scalars(*names, elem_type=T.FLOAT):
    return {nm: TensorInfo(elem_type, ()) for nm in names}


@pytest.mark.parametrize("op,inputs,attrs,expected", [
    ("QLinearAdd", {"a": TensorInfo(T.INT8, (N, 1, 8)), "as": TensorInfo(T.FLOAT, ()), "az": TensorInfo(T.INT8, ()),
                    "b": TensorInfo(T.INT8, (4, 1)), **_scalars("bs"), "bz": TensorInfo(T.INT8, ()), **_scalars("cs"),
                    "cz": TensorInfo(T.INT8, ())}, {}, TensorInfo(T.INT8, (N, 4, 8))),
    ("MatMulIntegerToFloat", {"a": TensorInfo(T.UINT8, (N, S, 16)), "b": TensorInfo(T.INT8, (16, 8)),
                              "as": TensorInfo(T.FLOAT16, ()), "bs": TensorInfo(T.FLOAT16, (8,))}, {},
     TensorInfo(T.FLOAT16, (N, S, 8))),
    ("DynamicQuantizeMatMul", {"a": TensorInfo(T.FLOAT, (N, 16)), "b": TensorInfo(T.UINT8, (16, 8)),
                               "bs": TensorInfo(T.FLOAT, (8,))}, {}, TensorInfo(T.FLOAT, (N, 8))),
    # onnxruntime's CPU provider has no QLinearReduceMean kernel: checked here, not by a run
    ("QLinearReduceMean", {"x": TensorInfo(T.UINT8, (N, 3, H)), **_scalars("xs"), "xz": TensorInfo(T.UINT8, ()),
                           **_scalars("ys"), "yz": TensorInfo(T.UINT8, ())}, {"axes": [1], "keepdims": 0},
     TensorInfo(T.UINT8, (N, H))),
    ("QLinearReduceMean", {"x": TensorInfo(T.INT8, (N, 3, H)), **_scalars("xs"), "xz": TensorInfo(T.INT8, ()),
                           **_scalars("ys"), "yz": TensorInfo(T.INT8, ())}, {"axes": [-1], "keepdims": 1},
     TensorInfo(T.INT8, (N, 3, 1))),
    ("QLinearGlobalAveragePool", {"x": TensorInfo(T.UINT8, (N, 3, H, W)), **_scalars("xs"), "xz": TensorInfo(T.UINT8, ()),
                                  **_scalars("ys"), "yz": TensorInfo(T.UINT8, ())}, {},
     TensorInfo(T.UINT8, (N, 3, 1, 1))),
    ("QLinearAveragePool", {"x": TensorInfo(T.UINT8, (N, H, W, 8)), **_scalars("xs"), "xz": TensorInfo(T.UINT8, ()),
                            **_scalars("ys"), "yz": TensorInfo(T.UINT8, ())},
     {"kernel_shape": [2, 2], "strides": [2, 2], "channels_last": 1},
     TensorInfo(T.UINT8, (N, dims.floordiv(H, 2), dims.floordiv(W, 2), 8))),
    ("QGemm", {"a": TensorInfo(T.UINT8, (N, 16)), **_scalars("as"), "az": TensorInfo(T.UINT8, ()),
               "b": TensorInfo(T.INT8, (8, 16)), "bs": TensorInfo(T.FLOAT, (8,)), "bz": TensorInfo(T.INT8, (8,))},
     {"transB": 1}, TensorInfo(T.FLOAT, (N, 8))),
    ("QLinearConcat", {"ys": TensorInfo(T.FLOAT, ()), "yz": TensorInfo(T.UINT8, ()), "a": TensorInfo(T.UINT8, (N, 3)),
                       **_scalars("as"), "az": TensorInfo(T.UINT8, ()), "b": TensorInfo(T.UINT8, (N, 5)),
                       **_scalars("bs"), "bz": TensorInfo(T.UINT8, ())}, {"axis": -1}, TensorInfo(T.UINT8, (N, 8))),
])
def test_com_microsoft_symbolic(op, inputs, attrs, expected):
    ctx = run_rule(op, inputs, domain="com.microsoft", opset=1, **attrs)
    assert ctx["y"] == expected


def test_com_microsoft_gelu_family_keeps_symbolic_shapes_and_checks_the_bias():
    x = TensorInfo(T.FLOAT16, (N, S, 64))
    for op in ("Gelu", "QuickGelu"):
        assert run_rule(op, {"x": x}, domain="com.microsoft", opset=1)["y"] == x
    assert run_rule("FastGelu", {"x": x}, domain="com.microsoft", opset=1)["y"] == x
    for op in ("BiasGelu", "FastGelu"):
        assert run_rule(op, {"x": x, "b": TensorInfo(T.FLOAT16, (64,))}, domain="com.microsoft", opset=1)["y"] == x
        with pytest.raises(InferenceError, match=rf"^{op}: .*must be 1-D with .* last dim: expected \[64\], found \[32\]"):
            run_rule(op, {"x": x, "b": TensorInfo(T.FLOAT16, (32,))}, domain="com.microsoft", opset=1)
        with pytest.raises(InferenceError, match=rf"^{op}: .*must have the element type of .*: expected float16, found float$"):
            run_rule(op, {"x": x, "b": TensorInfo(T.FLOAT, (64,))}, domain="com.microsoft", opset=1)
    with pytest.raises(InferenceError, match=r"^BiasGelu: .*required input B \(#1\) is missing"):
        run_rule("BiasGelu", {"x": x}, domain="com.microsoft", opset=1)
    with pytest.raises(InferenceError, match=r"^Gelu: .*X must be a float type: expected float16, float, double or bfloat16, found int8"):
        run_rule("Gelu", {"x": TensorInfo(T.INT8, (2,))}, domain="com.microsoft", opset=1)


def test_com_microsoft_symbolic_matmul_nbits_and_gather_block_quantized():
    ctx = run_rule("MatMulNBits", {"a": TensorInfo(T.FLOAT16, (N, S, 64)), "b": TensorInfo(T.UINT8, (32, 2, 16)),
                                   "s": TensorInfo(T.FLOAT16, (64,))},
                   domain="com.microsoft", opset=1, K=64, N=32, block_size=32, bits=4)
    assert ctx["y"] == TensorInfo(T.FLOAT16, (N, S, 32))
    with pytest.raises(InferenceError, match=r"^MatMulNBits: .*A's last dim must equal K: expected \[\.\.\., 64\]"):
        run_rule("MatMulNBits", {"a": TensorInfo(T.FLOAT, (2, 48)), "b": TensorInfo(T.UINT8, (32, 2, 16)),
                                 "s": TensorInfo(T.FLOAT, (64,))}, domain="com.microsoft", opset=1, K=64, N=32,
                 block_size=32)
    ctx = run_rule("GatherBlockQuantized", {"d": TensorInfo(T.INT4, (100, 64)), "i": TensorInfo(T.INT64, (N, S)),
                                            "s": TensorInfo(T.BFLOAT16, (100, 2))},
                   domain="com.microsoft", opset=1, block_size=32)
    assert ctx["y"] == TensorInfo(T.BFLOAT16, (N, S, 64))


def test_com_microsoft_errors_and_defaults():
    ctx = run_rule("QuantizeLinear", {"x": TensorInfo(T.FLOAT, (N, 3)), "s": TensorInfo(T.FLOAT, ())},
                   domain="com.microsoft", opset=1)
    assert ctx["y"] == TensorInfo(T.UINT8, (N, 3))  # no zero point: uint8
    with pytest.raises(InferenceError, match=r"^QLinearConcat: .*expected 2 \+ 3k inputs"):
        run_rule("QLinearConcat", {k: TensorInfo(T.UINT8, (2,)) for k in ("ys", "yz", "a", "as")},
                 domain="com.microsoft", opset=1, axis=0)
    with pytest.raises(InferenceError, match=r"^QLinearAdd: .*input A_scale: .*expected float, found float16"):
        run_rule("QLinearAdd", {"a": TensorInfo(T.UINT8, (2,)), "as": TensorInfo(T.FLOAT16, ()), "az": TensorInfo(T.UINT8, ()),
                                "b": TensorInfo(T.UINT8, (2,)), **_scalars("bs"), "bz": TensorInfo(T.UINT8, ()),
                                **_scalars("cs")}, domain="com.microsoft", opset=1)
    with pytest.raises(InferenceError, match=r"^QLinearAdd: .*required input B_scale \(#4\) is missing"):
        run_rule("QLinearAdd", {"a": TensorInfo(T.UINT8, (2,)), "as": TensorInfo(T.FLOAT, ()), "az": TensorInfo(T.UINT8, ()),
                                "b": TensorInfo(T.UINT8, (2,))}, domain="com.microsoft", opset=1)
    with pytest.raises(InferenceError, match=r"^DequantizeLinear: .*input x_scale: .*expected \[4\], found \[3\]"):
        run_rule("DequantizeLinear", {"x": TensorInfo(T.UINT8, (2, 4)), "s": TensorInfo(T.FLOAT, (3,))},
                 domain="com.microsoft", opset=1, axis=1)


def test_symbolic_resize_and_slice_bounds_from_values():
    m = model([helper.make_node("Resize", ["x", "", "s"], ["y"])], [vi("x", T.FLOAT, ["N", 3, "H", "W"])],
              inits=[floats("s", [1, 1, 2, 0.5])])
    mine = assert_evaluates_like_onnx(m, [{"N": 1, "H": 3, "W": 5}, {"N": 2, "H": 4, "W": 8}])
    assert mine.shape == (N, 3, dims.mul(H, 2), dims.floordiv(W, 2))
    # Slice(x, 1, Shape(x)[1]) on axis 1: the end is the dim itself
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=1, end=2),
             helper.make_node("Slice", ["x", "one", "s", "one"], ["y"])]
    m = model(nodes, [vi("x", T.FLOAT, ["N", "H"])], inits=[ints("one", [1])])
    assert ours(m)["y"].shape == (N, dims.maximum(dims.sub(H, 1), 0))


def test_einsum_ellipsis_broadcast():
    m = model([helper.make_node("Einsum", ["a", "b"], ["y"], equation="...ij,...jk->...ik")],
              [vi("a", T.FLOAT, ["N", 1, 2, 3]), vi("b", T.FLOAT, [1, 4, 3, 5])])
    assert_evaluates_like_onnx(m, [{"N": 2}])
    assert ours(m)["y"].shape == (N, 4, 2, 5)


# ---------------------------------------------------------------- robustness
_FUZZ_DIMS = (None, 0, 1, 2, 3, 4, N)
_FUZZ_TYPES = (0, T.FLOAT, T.INT64, T.INT32, T.UINT8, T.INT8, T.BOOL, T.FLOAT16, T.INT4)
_MS_ATTRS = {"K": "i", "N": "i", "block_size": "i", "bits": "i", "axes": "l", "keepdims": "i", "axis": "i",
             "channels_last": "i", "gather_axis": "i", "quantize_axis": "i", "kernel_shape": "l", "strides": "l",
             "pads": "l", "ceil_mode": "i", "transA": "i", "transB": "i", "opset": "i"}
_STRINGS = ("NOTSET", "SAME_UPPER", "VALID", "stretch", "not_larger", "bad", "ij,jk->ik", "...i,i", "i,,", "ab->c",
            "->", "a...b...,c", "ii", "...ii->...i")


def _fuzz_info(rng) -> TensorInfo:
    t = rng.choice(_FUZZ_TYPES)
    shape = None if rng.random() < 0.1 else tuple(rng.choice(_FUZZ_DIMS) for _ in range(rng.randint(0, 4)))
    value = None
    if shape is not None and all(isinstance(d, int) for d in shape) and 0 < int(np.prod(shape)) <= 8:
        count = int(np.prod(shape))
        if t in (T.INT64, T.INT32) and rng.random() < 0.7:
            raw = [rng.choice([-3, -1, 0, 1, 2, 3, 5, 2**63 - 1, -2**63 + 1]) for _ in range(count)]
            value = np.array(raw, dtype=np.int64).astype(np.int64 if t == T.INT64 else np.int32).reshape(shape)
        elif t == T.FLOAT and rng.random() < 0.5:
            value = np.array([rng.choice([0.0, 0.5, 1.0, 2.0, -1.0, np.nan]) for _ in range(count)],
                             np.float32).reshape(shape)
    elif shape == (2,) and t == T.INT64 and rng.random() < 0.5:
        value = np.array([N, rng.choice([1, -1, 0, None])], dtype=object)
    return TensorInfo(t, shape, value)


def _fuzz_attr(rng, kind):
    if kind == "i":
        return rng.choice([-2, -1, 0, 1, 2, 3, 7, 16])
    if kind == "l":
        return [rng.choice([-2, -1, 0, 1, 2, 3]) for _ in range(rng.randint(1, 5))]
    if kind == "f":
        return rng.choice([0.0, 1.0, -1.0])
    if kind == "s":
        return rng.choice(_STRINGS)
    return helper.make_tensor("v", rng.choice([T.FLOAT, T.INT64]), [1], [1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rules_never_crash(seed):
    """Random inputs and attributes: a rule either types the node or raises InferenceError."""
    import random

    from onnx import defs

    from onnx_quant.inference import registry

    modules = {"onnx_quant.inference.rules.elementwise", "onnx_quant.inference.rules.nn", "onnx_quant.inference.rules.tensor_ops",
               "onnx_quant.inference.rules.constants", "onnx_quant.inference.rules.reductions",
               "onnx_quant.inference.rules.com_microsoft", "onnx_quant.inference.rules.recurrent",
               "onnx_quant.inference.rules.data_dependent"}
    ours_ = [(dom, op, v, fn) for (dom, op), table in registry._RULES.items() for v, fn in table.items()
             if fn.__module__ in modules]
    kinds = {helper.AttributeProto.INT: "i", helper.AttributeProto.INTS: "l", helper.AttributeProto.FLOAT: "f",
             helper.AttributeProto.STRING: "s", helper.AttributeProto.TENSOR: "t"}
    onnx_attrs: dict[str, dict[str, str]] = {}
    for s in defs.get_all_schemas_with_history():
        for name, a in s.attributes.items():
            if a.type in kinds:
                onnx_attrs.setdefault(s.name, {})[name] = kinds[a.type]
    rng = random.Random(seed)
    for _ in range(3000):
        dom, op, v, fn = rng.choice(ours_)
        ctx = ShapesContext({"": OPSET, "com.microsoft": 1}, strict=rng.random() < 0.5)
        names = []
        for i in range(rng.randint(1, 9)):
            name = "" if rng.random() < 0.05 else f"i{i}"
            if name:
                ctx.set(name, _fuzz_info(rng))
            names.append(name)
        spec = _MS_ATTRS if dom else onnx_attrs.get(op, {})
        attrs = {k: _fuzz_attr(rng, kind) for k, kind in spec.items() if rng.random() < 0.4}
        node = helper.make_node(op, names, [f"o{j}" for j in range(rng.randint(1, 3))], domain=dom or None, **attrs)
        try:
            fn(ctx, NodeContext(node, 0, ctx, v, v))
        except InferenceError:
            continue
        for name, info in ctx.items():
            assert info.shape is None or isinstance(info.shape, tuple), (op, attrs, name, info)

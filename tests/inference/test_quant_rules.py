"""The quantization-family rules agree with onnx's own inference (strict mode).

Each test generates valid one-node models for every since_version a rule claims and every
element type that version allows (types come from onnx_quant.opsets, i.e. onnx.defs),
runs ``onnx.shape_inference.infer_shapes(strict_mode=True)`` and the rule, and asserts the
same element type and the same dims wherever onnx knows them. Where onnx loses a dim the
rule gives an expression; it is evaluated for the concrete sizes and compared with onnx's
result on the concrete model. A valid model must not produce a single diagnostic.
"""

from __future__ import annotations

import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import onnx_quant.inference.rules  # noqa: F401  (registers the rules)
from onnx_quant.inference import dims, registry
from onnx_quant.inference.context import ShapesContext, TensorInfo
from onnx_quant.inference.registry import NodeContext
from onnx_quant.inference.rules import qlinear, quantization
from onnx_quant import opsets
from support.models import make_model

SYMBOLS = ("N", "H", "W", "C")


# ---------------------------------------------------------------- harness
def vinfo(name: str, elem_type: int, shape) -> onnx.ValueInfoProto:
    if shape is None:
        return helper.make_tensor_value_info(name, elem_type, None)
    return helper.make_tensor_value_info(name, elem_type, [dims.to_text(d) if not isinstance(d, int) else d for d in shape])


def one_node_model(node: onnx.NodeProto, inputs: list[tuple[str, int, tuple]], opset: int,
                   initializers=()) -> onnx.ModelProto:
    return make_model(node, [vinfo(*i) for i in inputs], [o for o in node.output if o], initializers, opset)


def drive(model: onnx.ModelProto, *, strict: bool = False) -> ShapesContext:
    """Run the registered rules over the model's nodes (no engine involved)."""
    opset_map = {o.domain or "": int(o.version) for o in model.opset_import}
    ctx = ShapesContext(opset_map, strict=strict)
    for vi in model.graph.input:
        ctx.set(vi.name, TensorInfo.from_type_proto(vi.type))
    for t in model.graph.initializer:
        ctx.set(t.name, TensorInfo.from_array(numpy_helper.to_array(t), t.data_type))
    for i, node in enumerate(model.graph.node):
        opset = ctx.opset(node.domain)
        found = registry.lookup(node.domain, node.op_type, opset)
        assert found is not None, f"no rule for {node.op_type} at opset {opset}"
        rule, version = found
        rule(ctx, NodeContext(node, i, ctx, version, opset))
    return ctx


def onnx_outputs(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    return {o.name: o.type for o in inferred.graph.output}


def assert_same(ours: TensorInfo, theirs: onnx.TypeProto, *, what: str = "") -> list[int]:
    """Equal element type, equal rank, equal dims where onnx knows them; returns the
    indices of dims onnx left unknown (for the caller to evaluate)."""
    tt = theirs.tensor_type
    assert ours.elem_type == tt.elem_type, f"{what}: elem_type {ours.elem_type} != onnx {tt.elem_type}"
    if not tt.HasField("shape"):
        return []
    assert ours.shape is not None and len(ours.shape) == len(tt.shape.dim), f"{what}: {ours.shape_text()} vs onnx"
    lost = []
    for i, (mine, d) in enumerate(zip(ours.shape, tt.shape.dim)):
        which = d.WhichOneof("value")
        if which == "dim_value":
            assert mine == d.dim_value, f"{what}: dim {i}: {dims.to_text(mine)} != onnx {d.dim_value}"
        elif which == "dim_param" and not d.dim_param.startswith("unk__"):
            assert mine == dims.parse(d.dim_param), f"{what}: dim {i}: {dims.to_text(mine)} != onnx {d.dim_param}"
        else:
            lost.append(i)
    return lost


def check_against_onnx(model: onnx.ModelProto, concrete: onnx.ModelProto | None = None,
                       bindings: dict[str, int] | None = None) -> ShapesContext:
    ctx = drive(model)
    assert ctx.diagnostics == [], [str(e) for e in ctx.diagnostics]
    theirs = onnx_outputs(model)
    concrete_theirs = onnx_outputs(concrete) if concrete is not None else None
    for name, tp in theirs.items():
        ours = ctx[name]
        lost = assert_same(ours, tp, what=name)
        if concrete_theirs is None:
            continue
        cdims = concrete_theirs[name].tensor_type.shape.dim
        for i, d in enumerate(ours.shape or ()):
            value = dims.evaluate(d, bindings)
            assert value == cdims[i].dim_value, (
                f"{name} dim {i}: {dims.to_text(d)} at {bindings} = {value}, onnx says {cdims[i].dim_value}"
                f" (onnx lost dims {lost} on the symbolic model)")
    return ctx


# ---------------------------------------------------------------- strategies
@st.composite
def sized_dim(draw, allow_zero=True, lo=0, hi=5):
    """(dim as the model declares it, its concrete size)."""
    size = draw(st.integers(lo if allow_zero else max(lo, 1), hi))
    if draw(st.integers(0, 3)) == 0:
        name = draw(st.sampled_from(SYMBOLS)) + str(draw(st.integers(0, 9)))
        return dims.Dim.symbol(name), size
    return size, size


def draw_types(draw, facts: opsets.OpFacts, indices) -> dict[int, int]:
    """One element type per input index, equal for inputs bound to one type parameter."""
    by_param: dict[str, int] = {}
    out: dict[int, int] = {}
    for i in indices:
        p = facts.inputs[i]
        tp = p.type_param
        if tp is not None and tp in by_param:
            out[i] = by_param[tp]
            continue
        t = draw(st.sampled_from(sorted(p.allowed)))
        out[i] = t
        if tp is not None:
            by_param[tp] = t
    return out


@st.composite
def qdq_case(draw, op: str):
    version = draw(st.sampled_from(opsets.since_versions(op)))
    facts = opsets.op_facts(op, version)
    has_zp = draw(st.booleans())
    types = draw_types(draw, facts, [0, 1, 2] if has_zp else [0, 1])
    rank = draw(st.integers(0, 4))
    x_dims = [draw(sized_dim()) for _ in range(rank)]
    x_shape = tuple(d for d, _ in x_dims)
    kinds = ["per-tensor"]
    if facts.has_attr("axis") and rank >= 1:
        kinds.append("per-axis")
    if facts.has_attr("block_size") and rank >= 1:
        kinds.append("blocked")
    kind = draw(st.sampled_from(kinds))
    attrs: dict = {}
    if kind == "per-tensor":
        scale_shape = draw(st.sampled_from([(), (1,)]))
        zp_shape = draw(st.sampled_from([(), (1,)]))
        if facts.has_attr("axis") and draw(st.booleans()):
            attrs["axis"] = draw(st.integers(-5, 5))  # ignored for per-tensor
    elif kind == "per-axis":
        axis = draw(st.integers(-rank, rank - 1))
        if axis != 1 or draw(st.booleans()):
            attrs["axis"] = axis
        scale_shape = zp_shape = (x_shape[axis],)
    else:
        axis = draw(st.integers(-rank, rank - 1))
        attrs["axis"] = axis
        block = draw(st.integers(1, 4))
        attrs["block_size"] = block
        a = axis % rank
        scale_shape = zp_shape = x_shape[:a] + (dims.ceildiv(x_shape[a], block),) + x_shape[a + 1:]
    if facts.has_attr("output_dtype") and draw(st.booleans()):
        if op == "QuantizeLinear":
            attrs["output_dtype"] = types[2] if has_zp else draw(st.sampled_from(sorted(facts.output_types(0))))
        else:
            attrs["output_dtype"] = draw(st.sampled_from(sorted(facts.output_types(0))))
    if op == "DequantizeLinear" and types[1] not in facts.output_types(0) and facts.has_attr("output_dtype"):
        # e.g. a float8e8m0 scale: y cannot take its type, output_dtype is required
        attrs["output_dtype"] = draw(st.sampled_from(sorted(facts.output_types(0))))
    if facts.has_attr("saturate") and draw(st.booleans()):
        attrs["saturate"] = draw(st.integers(0, 1))
    if facts.has_attr("precision") and draw(st.booleans()):
        attrs["precision"] = draw(st.sampled_from([TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16]))
    names = ["x", "scale"] + (["zp"] if has_zp else [])
    node = helper.make_node(op, names, ["y"], **attrs)
    inputs = [("x", types[0], x_shape), ("scale", types[1], scale_shape)]
    if has_zp:
        inputs.append(("zp", types[2], zp_shape))
    return version, node, inputs


def _check_qdq(case):
    version, node, inputs = case
    model = one_node_model(node, inputs, version)
    ctx = check_against_onnx(model)
    assert ctx["y"].shape == inputs[0][2]


@given(qdq_case("QuantizeLinear"))
def test_quantize_linear_matches_onnx(case):
    _check_qdq(case)


@given(qdq_case("DequantizeLinear"))
def test_dequantize_linear_matches_onnx(case):
    _check_qdq(case)


@pytest.mark.parametrize("op", ["QuantizeLinear", "DequantizeLinear"])
@pytest.mark.parametrize("version", opsets.since_versions("QuantizeLinear"))
def test_qdq_every_allowed_type(op, version):
    """Each element type the version allows, for each input slot, gives onnx's output type."""
    facts = opsets.op_facts(op, version)
    base = {0: sorted(facts.input_types(0))[0], 1: sorted(facts.input_types(1))[0], 2: None}
    for slot in (0, 1, 2):
        for t in sorted(facts.input_types(slot)):
            types = dict(base)
            types[slot] = t
            # honour type-parameter bindings
            for other in (0, 1, 2):
                if other != slot and facts.inputs[other].type_param == facts.inputs[slot].type_param:
                    types[other] = t
            if op == "DequantizeLinear" and types[2] is None:
                types[2] = types[0]
            attrs = {}
            if op == "DequantizeLinear" and types[1] not in facts.output_types(0) and facts.has_attr("output_dtype"):
                attrs["output_dtype"] = TensorProto.FLOAT
            names = ["x", "s"] + (["z"] if types[2] else [])
            inputs = [("x", types[0], (2, 3)), ("s", types[1], ())]
            if types[2]:
                inputs.append(("z", types[2], ()))
            check_against_onnx(one_node_model(helper.make_node(op, names, ["y"], **attrs), inputs, version))


@given(st.lists(sized_dim(), max_size=4))
def test_dynamic_quantize_linear_matches_onnx(x_dims):
    shape = tuple(d for d, _ in x_dims)
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "y_scale", "y_zero_point"])
    ctx = check_against_onnx(one_node_model(node, [("x", TensorProto.FLOAT, shape)], 11))
    assert ctx["y"] == TensorInfo(TensorProto.UINT8, shape)
    assert ctx["y_scale"] == TensorInfo(TensorProto.FLOAT, ())
    assert ctx["y_zero_point"] == TensorInfo(TensorProto.UINT8, ())


def test_registered_versions_are_onnx_versions():
    reg = registry.registered()
    for op, claimed in [
        ("QuantizeLinear", quantization.QUANTIZE_LINEAR_VERSIONS),
        ("DequantizeLinear", quantization.DEQUANTIZE_LINEAR_VERSIONS),
        ("DynamicQuantizeLinear", quantization.DYNAMIC_QUANTIZE_LINEAR_VERSIONS),
        ("QLinearConv", qlinear.QLINEAR_CONV_VERSIONS),
        ("ConvInteger", qlinear.CONV_INTEGER_VERSIONS),
        ("QLinearMatMul", qlinear.QLINEAR_MATMUL_VERSIONS),
        ("MatMulInteger", qlinear.MATMUL_INTEGER_VERSIONS),
    ]:
        assert claimed == opsets.since_versions(op), op
        assert reg[("", op)] == claimed


# ---------------------------------------------------------------- convolution
@st.composite
def conv_case(draw, op: str):
    nsp = draw(st.integers(1, 3))
    group = draw(st.integers(1, 3))
    cpg, mpg = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    c, m = cpg * group, mpg * group
    kernel = [draw(st.integers(1, 3)) for _ in range(nsp)]
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    dil = [draw(st.integers(1, 2)) for _ in range(nsp)]
    strides = [draw(st.integers(1, 3)) for _ in range(nsp)]
    pads = [draw(st.integers(0, 2)) for _ in range(2 * nsp)] if auto_pad == "NOTSET" else [0] * (2 * nsp)
    bindings: dict[str, int] = {}
    sym_shape, conc_shape = [], []

    def put(size, may_symbol=True, name=None):
        if may_symbol and draw(st.integers(0, 2)) == 0:
            sym = name or f"S{len(bindings)}"
            bindings[sym] = size
            sym_shape.append(dims.Dim.symbol(sym))
        else:
            sym_shape.append(size)
        conc_shape.append(size)

    put(draw(st.integers(0, 2)), name="N")
    put(c, name="C")
    for i in range(nsp):
        eff = (kernel[i] - 1) * dil[i] + 1
        size = max(1, eff - pads[i] - pads[i + nsp]) + draw(st.integers(0, 4))
        put(size)
    x_sym, x_conc = tuple(sym_shape), tuple(conc_shape)
    w_shape = (m, cpg, *kernel)
    attrs = {"group": group} if group != 1 or draw(st.booleans()) else {}
    if auto_pad != "NOTSET" or draw(st.booleans()):
        attrs["auto_pad"] = auto_pad
    if auto_pad == "NOTSET" and (any(pads) or draw(st.booleans())):
        attrs["pads"] = pads
    if any(s != 1 for s in strides) or draw(st.booleans()):
        attrs["strides"] = strides
    if any(d != 1 for d in dil) or draw(st.booleans()):
        attrs["dilations"] = dil
    if draw(st.booleans()):
        attrs["kernel_shape"] = kernel
    x_t = draw(st.sampled_from([TensorProto.UINT8, TensorProto.INT8]))
    w_t = draw(st.sampled_from([TensorProto.UINT8, TensorProto.INT8]))
    F = TensorProto.FLOAT
    if op == "QLinearConv":
        y_t = draw(st.sampled_from([TensorProto.UINT8, TensorProto.INT8]))
        per_channel = draw(st.booleans())
        ws = (m,) if per_channel else draw(st.sampled_from([(), (1,)]))
        inputs = [("x", x_t, None), ("xs", F, ()), ("xz", x_t, ()), ("w", w_t, w_shape), ("ws", F, ws),
                  ("wz", w_t, ws), ("ys", F, ()), ("yz", y_t, ())]
        if draw(st.booleans()):
            inputs.append(("B", TensorProto.INT32, (m,)))
    else:
        inputs = [("x", x_t, None), ("w", w_t, w_shape)]
        if draw(st.booleans()):
            inputs.append(("xz", x_t, ()))
            if draw(st.booleans()):
                inputs.append(("wz", w_t, (m,) if draw(st.booleans()) else ()))
    names = [i[0] for i in inputs]
    node = helper.make_node(op, names, ["y"], **attrs)

    def with_x(shape):
        return [("x", x_t, shape) if i[0] == "x" else i for i in inputs]

    return node, with_x(x_sym), with_x(x_conc), bindings


def _check_conv(case):
    node, sym_inputs, conc_inputs, bindings = case
    model = one_node_model(node, sym_inputs, 10)
    concrete = one_node_model(node, conc_inputs, 10)
    ctx = check_against_onnx(model, concrete, bindings)
    # and on the concrete model, exactly onnx's result
    check_against_onnx(concrete)
    return ctx


@given(conv_case("QLinearConv"))
def test_qlinear_conv_matches_onnx(case):
    _check_conv(case)


@given(conv_case("ConvInteger"))
def test_conv_integer_matches_onnx(case):
    ctx = _check_conv(case)
    assert ctx["y"].elem_type == TensorProto.INT32


def test_conv_symbolic_spatial_dim_is_an_expression():
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"],
                            pads=[1, 1, 1, 1], strides=[2, 2])
    F, U = TensorProto.FLOAT, TensorProto.UINT8
    inputs = [("x", U, ("N", 3, "H", 8)), ("xs", F, ()), ("xz", U, ()), ("w", U, (4, 3, 3, 3)), ("ws", F, ()),
              ("wz", U, ()), ("ys", F, ()), ("yz", U, ())]
    ctx = drive(one_node_model(node, [(n, t, tuple(dims.parse(d) if isinstance(d, str) else d for d in s))
                                      for n, t, s in inputs], 10))
    y = ctx["y"]
    assert y.shape[:2] == (dims.Dim.symbol("N"), 4) and y.shape[3] == 4
    assert y.shape[2] == dims.parse("floor((H + 1) / 2)")  # floor((H + 2 - 3) / 2) + 1, canonical


# ---------------------------------------------------------------- matmul
@st.composite
def matmul_case(draw, op: str, version: int):
    bindings: dict[str, int] = {}

    def dim(size, may_symbol=True):
        if may_symbol and draw(st.integers(0, 2)) == 0:
            name = f"D{len(bindings)}"
            bindings[name] = size
            return dims.Dim.symbol(name), size
        return size, size

    a_rank, b_rank = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    m, k, n = draw(st.integers(0, 4)), draw(st.integers(0, 4)), draw(st.integers(0, 4))
    nb = max(a_rank, b_rank) - 2
    batch = [draw(st.integers(1, 3)) for _ in range(max(nb, 0))]
    a_batch, b_batch = [], []
    for i, size in enumerate(batch):
        which = draw(st.sampled_from(["both", "a1", "b1"]))
        a_batch.append(dim(1 if which == "a1" else size))
        b_batch.append(dim(1 if which == "b1" else size))
    a_batch = a_batch[len(a_batch) - max(a_rank - 2, 0):] if a_rank > 2 else []
    b_batch = b_batch[len(b_batch) - max(b_rank - 2, 0):] if b_rank > 2 else []
    kd = dim(k)
    a = [kd] if a_rank == 1 else [*a_batch, dim(m), kd]
    b = [kd] if b_rank == 1 else [*b_batch, kd, dim(n)]
    a_sym, a_conc = tuple(d for d, _ in a), tuple(c for _, c in a)
    b_sym, b_conc = tuple(d for d, _ in b), tuple(c for _, c in b)
    if op == "QLinearMatMul":
        facts = opsets.op_facts(op, version)
        ts = draw(st.sampled_from(sorted(facts.input_types(1))))
        t1 = draw(st.sampled_from(sorted(facts.input_types(0))))
        t2 = draw(st.sampled_from(sorted(facts.input_types(3))))
        t3 = draw(st.sampled_from(sorted(facts.input_types(7))))
        a_ps = draw(st.sampled_from([(), (1,)] + ([(a_conc[0],)] if a_rank == 2 else [])))
        b_ps = draw(st.sampled_from([(), (1,)] + ([(b_conc[1],)] if b_rank == 2 else [])))
        y_ps = draw(st.sampled_from([(), (1,)]))
        rest = [("as", ts, a_ps), ("az", t1, a_ps), ("bs", ts, b_ps), ("bz", t2, b_ps), ("ys", ts, y_ps), ("yz", t3, y_ps)]
        order = ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]
        types = {"a": t1, "b": t2}
    else:
        t1 = draw(st.sampled_from([TensorProto.UINT8, TensorProto.INT8]))
        t2 = draw(st.sampled_from([TensorProto.UINT8, TensorProto.INT8]))
        rest = []
        order = ["a", "b"]
        if draw(st.booleans()):
            rest.append(("az", t1, draw(st.sampled_from([(), (1,)] + ([(a_conc[0],)] if a_rank == 2 else [])))))
            order.append("az")
            if draw(st.booleans()):
                rest.append(("bz", t2, draw(st.sampled_from([(), (1,)] + ([(b_conc[1],)] if b_rank == 2 else [])))))
                order.append("bz")
        types = {"a": t1, "b": t2}
    node = helper.make_node(op, order, ["y"])

    def inputs(a_shape, b_shape):
        table = {"a": ("a", types["a"], a_shape), "b": ("b", types["b"], b_shape)}
        table.update({r[0]: r for r in rest})
        return [table[name] for name in order]

    return version, node, inputs(a_sym, b_sym), inputs(a_conc, b_conc), bindings


def _check_matmul(case):
    version, node, sym_inputs, conc_inputs, bindings = case
    model = one_node_model(node, sym_inputs, version)
    concrete = one_node_model(node, conc_inputs, version)
    ctx = check_against_onnx(model, concrete, bindings)
    check_against_onnx(concrete)
    return ctx


@given(st.sampled_from(opsets.since_versions("QLinearMatMul")).flatmap(lambda v: matmul_case("QLinearMatMul", v)))
def test_qlinear_matmul_matches_onnx(case):
    _check_matmul(case)


@given(matmul_case("MatMulInteger", 10))
def test_matmul_integer_matches_onnx(case):
    ctx = _check_matmul(case)
    assert ctx["y"].elem_type == TensorProto.INT32


# ---------------------------------------------------------------- onnx_quant.opsets
def test_opsets_facts_follow_onnx_defs():
    assert opsets.type_str_code("tensor(float)") == TensorProto.FLOAT
    assert opsets.type_str_code("tensor(float8e8m0)") == TensorProto.FLOAT8E8M0
    assert opsets.type_str_code("seq(tensor(float))") is None
    q21 = opsets.op_facts("QuantizeLinear", 21)
    assert q21.inputs[0].type_param == q21.inputs[1].type_param == "T1"
    assert TensorProto.INT4 in q21.input_types(2) and TensorProto.INT2 not in q21.input_types(2)
    assert q21.has_attr("block_size") and not q21.has_attr("precision")
    assert (q21.min_input, q21.max_input, q21.min_output, q21.max_output) == (2, 3, 1, 1)
    dq10 = opsets.op_facts("DequantizeLinear", 10)
    assert dq10.output_types(0) == {TensorProto.FLOAT} and not dq10.attributes
    # an opset between two since_versions gives the schema in force
    assert opsets.op_facts("QuantizeLinear", 22).since_version == 21
    assert opsets.schema_since_version("QuantizeLinear", 22) == 21
    # version gates are derived, not tabled
    assert opsets.first_version_allowing_input("QuantizeLinear", 2, TensorProto.INT4) == 21
    assert opsets.first_version_allowing_input("QuantizeLinear", 1, TensorProto.FLOAT8E8M0) == 24
    assert opsets.first_version_allowing_input("DequantizeLinear", 0, TensorProto.INT2) == 25
    assert opsets.first_version_allowing_input("DequantizeLinear", 0, TensorProto.FLOAT6E2M3) == 28
    assert opsets.first_version_allowing_input("QuantizeLinear", 0, TensorProto.FLOAT16) == 19
    assert opsets.first_version_with_attr("QuantizeLinear", "precision") == 23
    assert opsets.first_version_with_attr("DequantizeLinear", "output_dtype") == 23
    assert opsets.first_version_with_attr("QuantizeLinear", "output_dtype") == 21
    assert opsets.first_version_allowing_input("QuantizeLinear", 0, TensorProto.DOUBLE) is None
    with pytest.raises(opsets.UnknownOperator):
        opsets.op_facts("NoSuchOp", 21)

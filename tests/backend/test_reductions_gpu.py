"""The reduction table's kernels (templates/reduce.ops.json) on the GPU: ReduceSum, ReduceMean,
ReduceProd, ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp, ReduceSumSquare, ReduceMax,
ReduceMin (family reduce), ArgMax, ArgMin (family arg), CumSum, CumProd (family scan), TopK
(family topk).

- ONNX's node cases of these ops pass with no host fallback, or are named in DECLINED with
  the clause that declines them (never a wrong value);
- exact results (integers, which wrap as numpy's astype does; Max/Min with NaN and signed
  zeros; ArgMax/ArgMin and TopK with ties and NaN; CumSum/CumProd float32 in the serial order,
  float64 (soft-float, serial only) and a leading -0.0 in every variant) agree bit for bit with
  numpy / onnx.reference in every variant (and for every lane count);
- float sums, computed in f32, lie within the classical bound of a sum of n rounded terms in
  any order against float64: |computed - exact| <= n * u * sum |terms| (u = 2^-24), plus
  the rounding of the finalisation (a division, sqrt, log) and of a float16 output, as each
  test states;
- the axes forms: the attribute (before opset 13 / 18), the input (an initializer: read when
  the node is planned), negative axes, keepdims 0/1, empty axes with and without
  noop_with_empty_axes, and reductions over an empty dimension, against onnx.reference.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper, numpy_helper

from onnx_quant.errors import ExecutionError
from support.gpu import assert_node_cases_pass_or_declined

U = 2.0 ** -24  # unit roundoff of float32
U16 = 2.0 ** -11  # of float16

#: node cases of these ops that stay off the GPU, and the words of the reason
_F64 = "is float64"
DECLINED = {
    **{f"test_reduce_log_sum_exp_{c}": _F64 for c in (
        "do_not_keepdims_example", "do_not_keepdims_random", "keepdims_example", "keepdims_random",
        "default_axes_keepdims_example", "default_axes_keepdims_random", "negative_axes_keepdims_example",
        "negative_axes_keepdims_random")},
    # the expansions run Cast/Exp/ReduceSum on float64 values
    **{f"test_reduce_log_sum_exp_{c}_expanded": "float64" for c in (
        "do_not_keepdims_example", "do_not_keepdims_random", "keepdims_example", "keepdims_random",
        "default_axes_keepdims_example", "default_axes_keepdims_random", "negative_axes_keepdims_example",
        "negative_axes_keepdims_random", "empty_set")},
}
OPS = ("ReduceSum", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
       "ReduceSumSquare", "ReduceMax", "ReduceMin", "ArgMax", "ArgMin", "CumSum", "CumProd", "TopK")


def test_onnx_node_cases_pass_on_the_gpu_or_are_declined_by_name(best):
    assert_node_cases_pass_or_declined(best, OPS, DECLINED, 158)


# ----------------------------------------------------------------------------- harness

def one_node(op, x, *, opset, attrs=None, consts=(), out_dtype=None):
    """A one-node model: graph input x, ``consts`` ((name, array) pairs) as initializers."""
    ins = [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), list(x.shape))]
    names = ["x"] + [n if a is not None else "" for n, a in consts]
    node = helper.make_node(op, names, ["y"], **(attrs or {}))
    out = helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype or x.dtype)), None)
    graph = helper.make_graph([node], "g", ins, [out],
                              initializer=[numpy_helper.from_array(a, n) for n, a in consts if a is not None])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run(dev, model, x, *, variant=None, tunables=None):
    from onnx_quant.backend_wgpu.session import Session

    op = model.graph.node[0].op_type
    with Session(model, device=dev, allow_host_fallback=False, variants={op: variant} if variant else None,
                 tunables={op: tunables} if tunables else None) as s:
        return s.run(None, {"x": x})[0]


def reference(model, x):
    from onnx.reference import ReferenceEvaluator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(None, {"x": x})[0]


#: every variant of each family, with the tunables that let it take small inputs
VARIANTS = {"reduce": [("serial", {"SERIAL_MAX_ROW": 10**6}), ("workgroup_per_word", {}),
                       ("workgroup_per_word", {"WORKGROUP_SIZE": 8}), ("chunked", {"CHUNKED_MIN_ROW": 0}),
                       ("chunked", {"CHUNKED_MIN_ROW": 0, "CHUNK_ITERATIONS": 1, "WORKGROUP_SIZE": 8})],
            "arg": [("serial", {"SERIAL_MAX_ROW": 10**6}), ("workgroup_per_output", {}),
                    ("workgroup_per_output", {"WORKGROUP_SIZE": 4})],
            "scan": [("serial", {"SERIAL_MAX_ROW": 10**6}), ("workgroup_per_row", {}),
                     ("workgroup_per_row", {"WORKGROUP_SIZE": 4})]}


def every_variant(dev, model, x, family="reduce"):
    """[(variant label, output)] for every variant of the family, forced."""
    return [(f"{v}/{t}", run(dev, model, x, variant=v, tunables=t)) for v, t in VARIANTS[family]]


def bits(a):
    a = np.ascontiguousarray(a)
    if a.dtype.kind == "f":
        a = np.where(np.isnan(a), np.array(np.nan, a.dtype), a)
    return a.reshape(-1).view(np.uint8)


def assert_same_bits(got, expected, what):
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype and got.shape == expected.shape, (what, got.dtype, got.shape,
                                                                         expected.dtype, expected.shape)
    assert np.array_equal(bits(got), bits(expected)), (what, got.reshape(-1)[:8], expected.reshape(-1)[:8])


def data(shape, dtype, seed=0, lo=None, hi=None):
    r = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return (r.standard_normal(shape) * 3).astype(dtype)
    if dtype == np.bool_:
        return r.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dtype)
    return r.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1, shape).astype(dtype)


SHAPE = (3, 37, 5)  # 37: more reduced elements than the 8- and 32-lane workgroups have
AXES_FORMS = [None, [1], [0, 2], [-1], [-3, -1]]


def _np_axes(axes):
    return None if axes is None else tuple(axes)


def axes_model(op, x, axes, keepdims, *, input_form, opset=None, out_dtype=None):
    """The node with ``axes`` as the attribute (opset 11) or as an initializer input (18; 13 for
    ReduceSum)."""
    attrs = {"keepdims": keepdims}
    if input_form:
        consts = [("axes", None if axes is None else np.array(axes, np.int64))]
        return one_node(op, x, opset=opset or (13 if op == "ReduceSum" else 18), attrs=attrs, consts=consts,
                        out_dtype=out_dtype)
    if axes is not None:
        attrs["axes"] = axes
    return one_node(op, x, opset=opset or 11, attrs=attrs, out_dtype=out_dtype)


# ----------------------------------------------------------------------------- exact reductions

def _wrap(v, dtype):
    """A Python/int64 result wrapped into ``dtype`` as numpy's astype does."""
    return np.asarray(v).astype(np.int64).astype(dtype)


def _int_expected(op, x, axes, keepdims):
    ax, kd = _np_axes(axes), bool(keepdims)
    w = x.astype(np.int64)
    if op == "ReduceSum":
        return _wrap(np.sum(w, axis=ax, keepdims=kd), x.dtype)
    if op == "ReduceL1":
        return _wrap(np.sum(np.abs(w), axis=ax, keepdims=kd), x.dtype)
    if op == "ReduceSumSquare":
        return _wrap(np.sum(w * w, axis=ax, keepdims=kd), x.dtype)
    if op == "ReduceProd":  # int32 products wrap at every step, which is the product mod 2^32
        p = np.prod(x, axis=ax, keepdims=kd, dtype=x.dtype)
        return np.asarray(p)
    if op == "ReduceMean":  # numpy's mean(dtype=int32): the wrapped sum, divided toward zero
        s = _wrap(np.sum(w, axis=ax, keepdims=kd), x.dtype).astype(np.int64)
        n = x.size // max(1, s.size)
        return (np.sign(s) * (np.abs(s) // n)).astype(x.dtype)
    if op == "ReduceMax":
        return np.asarray(np.max(x, axis=ax, keepdims=kd))
    if op == "ReduceMin":
        return np.asarray(np.min(x, axis=ax, keepdims=kd))
    raise AssertionError(op)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceL1", "ReduceSumSquare", "ReduceProd", "ReduceMean",
                                "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("axes", AXES_FORMS)
def test_int32_reductions_wrap_bit_for_bit_in_every_variant(best, op, axes):
    # the full int32 range, so sums and products overflow and wrap
    x = data(SHAPE, np.int32, seed=1)
    model = axes_model(op, x, axes, 0, input_form=True)
    expected = _int_expected(op, x, axes, 0)
    for label, got in every_variant(best, model, x):
        assert_same_bits(got, expected, f"{op} {axes} {label}")


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.bool_])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_min_max_of_narrow_types_in_every_variant(best, op, dtype, keepdims):
    x = data(SHAPE, dtype, seed=2)
    model = axes_model(op, x, [1], keepdims, input_form=True, opset=20)
    expected = (np.max if op == "ReduceMax" else np.min)(x, axis=1, keepdims=bool(keepdims))
    assert_same_bits(reference(model, x), expected, "reference")
    for label, got in every_variant(best, model, x):
        assert_same_bits(got, expected, f"{op} {np.dtype(dtype)} {label}")


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_min_max_floats_nan_wins_and_signed_zeros_are_order_free(best, op, dtype):
    x = data((6, 40), dtype, seed=3)
    x[1, 17] = np.nan
    x[2, :] = 0.0
    x[2, 29] = -0.0  # one -0 among +0: min gives -0, max +0, wherever it sits
    x[3, :] = -0.0
    x[3, 5] = 0.0
    x[4, 3], x[4, 30] = np.inf, -np.inf
    model = axes_model(op, x, [1], 0, input_form=False)
    maximum = op == "ReduceMax"
    expected = (np.max if maximum else np.min)(x, axis=1)
    expected[2] = np.float16(0.0) if maximum else -np.float16(0.0)
    expected[3] = np.float16(0.0) if maximum else -np.float16(0.0)
    assert np.isnan(expected[1])
    for label, got in every_variant(best, model, x):
        assert_same_bits(got, expected.astype(dtype), f"{op} {label}")


def test_lane_count_does_not_change_exact_bits(best):
    x = data((4, 300), np.int32, seed=5)
    model = axes_model("ReduceSum", x, [1], 0, input_form=False)
    outs = [run(best, model, x, variant="workgroup_per_word", tunables={"WORKGROUP_SIZE": w}) for w in (1, 8, 64, 256)]
    for o in outs:
        assert_same_bits(o, _int_expected("ReduceSum", x, [1], 0), "lane counts")


# ----------------------------------------------------------------------------- float reductions

def _float_bound(op, x64, axes, result64):
    """Per output: the bound on |f32 result - exact| the test justifies (see each line)."""
    ax = _np_axes(axes)
    n = x64.size // max(1, result64.size)
    absx = np.abs(x64)
    if op in ("ReduceSum", "ReduceL1"):  # n rounded additions of |terms|
        return n * U * np.sum(absx, axis=ax)
    if op == "ReduceMean":  # the sum's bound / n, then one division (correctly rounded)
        return U * np.sum(absx, axis=ax) + U * np.abs(result64)
    if op == "ReduceSumSquare":  # each square rounds once, then n additions
        return (n + 1) * U * np.sum(absx * absx, axis=ax)
    if op == "ReduceL2":  # sqrt halves the sum's relative error, plus WGSL sqrt's rounding (<= 2 ulp)
        return ((n + 1) * U / 2 + 3 * U) * np.abs(result64)
    if op == "ReduceProd":  # n rounded products: relative (1 + u)^n - 1
        return 1.01 * n * U * np.abs(result64)
    if op == "ReduceLogSum":  # relative error of a positive sum, then WGSL log (2^-21 absolute near 1, 3 ulp)
        s = np.sum(x64, axis=ax)
        return n * U * np.sum(absx, axis=ax) / s + 2.0 ** -21 + 4 * U * np.abs(result64)
    if op == "ReduceLogSumExp":
        # terms exp(x - m) in (0, 1]: x - m rounds (u |x - m|), WGSL exp (3 + 2 |x - m| ulp); the sum
        # (>= 1) n additions; then log as above
        m = np.max(x64, axis=ax, keepdims=True)
        spread = np.max(np.abs(x64 - m), axis=ax)
        return (n + 6 + 3 * spread) * U + 2.0 ** -21 + 4 * U * np.abs(result64)
    raise AssertionError(op)


_EXACT64 = {
    "ReduceSum": lambda x, ax: np.sum(x, axis=ax), "ReduceMean": lambda x, ax: np.mean(x, axis=ax),
    "ReduceL1": lambda x, ax: np.sum(np.abs(x), axis=ax), "ReduceSumSquare": lambda x, ax: np.sum(x * x, axis=ax),
    "ReduceL2": lambda x, ax: np.sqrt(np.sum(x * x, axis=ax)), "ReduceProd": lambda x, ax: np.prod(x, axis=ax),
    "ReduceLogSum": lambda x, ax: np.log(np.sum(x, axis=ax)),
    "ReduceLogSumExp": lambda x, ax: np.log(np.sum(np.exp(x - np.max(x, axis=ax, keepdims=True)), axis=ax))
    + np.max(x, axis=ax),
}


def _float_data(op, shape, dtype, seed):
    r = np.random.default_rng(seed)
    if op == "ReduceProd":  # magnitudes near 1, signs mixed: no overflow, even in float16
        x = np.exp(r.uniform(-0.1, 0.1, shape)) * r.choice([-1.0, 1.0], shape)
    elif op == "ReduceLogSum":  # a positive sum
        x = r.uniform(0.01, 4.0, shape)
    else:
        x = r.standard_normal(shape) * 3
    return x.astype(dtype)


@pytest.mark.parametrize("op", sorted(_EXACT64))
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("axes", [None, [1], [-3, -1]])
def test_float_reductions_within_the_bound_in_every_variant(best, op, dtype, axes):
    x = _float_data(op, SHAPE, dtype, seed=11)
    x64 = x.astype(np.float64)
    exact = np.asarray(_EXACT64[op](x64, _np_axes(axes)))
    bound = _float_bound(op, x64, axes, exact)
    if dtype == np.float16:  # the f32 result rounds once to float16
        bound = bound * (1 + U16) + U16 * np.abs(exact) + 2.0 ** -24
    model = axes_model(op, x, axes, 0, input_form=True)
    for label, got in every_variant(best, model, x):
        assert got.dtype == dtype and got.shape == exact.shape, (label, got.dtype, got.shape)
        err = np.abs(got.astype(np.float64) - exact)
        assert np.all(err <= bound), (op, label, float(np.max(err - bound)), got.reshape(-1)[:4], exact.reshape(-1)[:4])


# ----------------------------------------------------------------------------- axes forms

_ALL_REDUCE = ("ReduceSum", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
               "ReduceSumSquare", "ReduceMax", "ReduceMin")


def _close_to_reference(got, ref, what):
    assert got.dtype == ref.dtype and got.shape == ref.shape, (what, got.dtype, got.shape, ref.dtype, ref.shape)
    assert np.array_equal(np.isnan(got), np.isnan(ref)), what
    assert np.allclose(got, ref, rtol=1e-5, atol=1e-6, equal_nan=True), (what, got.reshape(-1)[:6], ref.reshape(-1)[:6])


@pytest.mark.parametrize("op", _ALL_REDUCE)
@pytest.mark.parametrize("input_form", [False, True])
@pytest.mark.parametrize("axes,keepdims", [(None, 1), ([1], 0), ([-1, 0], 1), ([2, -3], 0)])
def test_axes_forms_and_keepdims_match_onnx_reference(best, op, input_form, axes, keepdims):
    x = _float_data(op, (2, 3, 4), np.float32, seed=4)
    model = axes_model(op, x, axes, keepdims, input_form=input_form)
    _close_to_reference(run(best, model, x), reference(model, x), f"{op} {axes} {keepdims}")


@pytest.mark.parametrize("op", _ALL_REDUCE)
@pytest.mark.parametrize("noop", [0, 1])
def test_empty_axes_input_reduces_all_or_nothing(best, op, noop):
    x = _float_data(op, (2, 3, 4), np.float32, seed=6)
    opset = 13 if op == "ReduceSum" else 18
    model = one_node(op, x, opset=opset, attrs={"keepdims": 1, "noop_with_empty_axes": noop},
                     consts=[("axes", np.array([], np.int64))])
    got, ref = run(best, model, x), reference(model, x)
    assert got.shape == ((2, 3, 4) if noop else (1, 1, 1))
    _close_to_reference(got, ref, f"{op} noop={noop}")
    absent = one_node(op, x, opset=opset, attrs={"noop_with_empty_axes": noop})  # no axes input at all
    _close_to_reference(run(best, absent, x), reference(absent, x), f"{op} absent axes noop={noop}")


_FLOAT_ONLY = ("ReduceL2", "ReduceLogSum", "ReduceLogSumExp")  # int32 declined (see reduce.ops.json)


@pytest.mark.parametrize("op,dtype", [(op, t) for op in _ALL_REDUCE for t in (np.float32, np.int32)
                                      if not (t == np.int32 and op in _FLOAT_ONLY)])
def test_reduction_over_an_empty_dimension_gives_the_identity(best, op, dtype):
    x = np.zeros((2, 0, 3), dtype)
    model = axes_model(op, x, [1], 0, input_form=True)
    got, ref = run(best, model, x), reference(model, x)
    expected = {"ReduceSum": 0, "ReduceL1": 0, "ReduceL2": 0, "ReduceSumSquare": 0, "ReduceProd": 1,
                "ReduceMean": np.nan, "ReduceLogSum": -np.inf, "ReduceLogSumExp": -np.inf}
    if dtype == np.int32:
        expected.update(ReduceMax=np.iinfo(np.int32).min, ReduceMin=np.iinfo(np.int32).max,
                        ReduceMean=np.iinfo(np.int32).min)  # numpy's NaN cast to int32
    else:
        expected.update(ReduceMax=-np.inf, ReduceMin=np.inf)
    assert_same_bits(got, np.full((2, 3), expected[op], dtype), f"{op} empty")
    if not (op == "ReduceMean" and dtype == np.int32):  # the reference's cast of NaN is the platform's
        assert_same_bits(got, ref.astype(dtype), f"{op} empty vs reference")


def test_axes_not_known_when_planned_decline_the_node(best):
    """The axes input is read when the node is planned: without its contents the kernel declines
    (KernelRejected, so a session runs the node on the host); with them it plans."""
    from onnx_quant.backend_wgpu.planner import plan_node
    from onnx_quant.backend_wgpu.spec import load_specs
    from onnx_quant.errors import KernelRejected

    spec = load_specs().find("", "ReduceSum", 18)
    io = dict(shapes={"x": (2, 3), "axes": (1,), "y": (2, 1)}, dtypes={"x": "float32", "axes": "int64", "y": "float32"})
    with pytest.raises(KernelRejected, match="'axes' must be known when the node is planned"):
        plan_node(spec, device=best.info, **io)
    plan = plan_node(spec, device=best.info, values={"axes": np.array([1], np.int64)}, **io)
    assert plan.variant == "serial"


def test_axes_fed_as_a_small_graph_input_run_on_the_gpu(best):
    """Axes given as a graph input: the session keys its plan on their contents (plan-time input
    values), so each axes value runs its own kernel, on the GPU."""
    from onnx_quant.backend_wgpu.session import Session

    x = data((2, 3, 4), np.float32, seed=14)
    node = helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [2, 3, 4]),
                                            helper.make_tensor_value_info("axes", 7, [None])],
                              [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with Session(model, device=best, allow_host_fallback=False) as s:
        for axes in ([1], [0, -1], [2]):
            got = s.run(None, {"x": x, "axes": np.array(axes, np.int64)})[0]
            expected = np.mean(x.astype(np.float64), axis=tuple(axes))
            assert got.shape == expected.shape and np.allclose(got, expected, rtol=1e-6, atol=1e-7), axes
        assert s.host_nodes == []


def test_a_reduction_beyond_the_lane_iteration_limit_is_declined(best):
    """llvmpipe stops an invocation after 65535 loop iterations: a kernel that would need more
    declines the node instead of returning a cut-short sum."""
    x = data((1, 4000), np.float32)
    model = axes_model("ReduceSum", x, [1], 0, input_form=False)
    with pytest.raises(ExecutionError, match="lanesFit"):
        run(best, model, x, tunables={"MAX_LANE_ITERATIONS": 10, "WORKGROUP_SIZE": 64})


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceLogSumExp"])
def test_long_reductions_take_the_chunked_variant(best, op):
    """2^21 + 3 elements reduced into one output (more than one workgroup's lanes may loop over
    on llvmpipe): the default plan splits them into chunks; ReduceMax bit for bit, the sums
    within their bound."""
    from onnx_quant.backend_wgpu.session import Session

    x = _float_data(op, (1, 2 ** 21 + 3), np.float32, seed=13)
    x[0, 1234567] = 9.5  # the maximum, far from the first chunk
    model = axes_model(op, x, None, 0, input_form=True)
    with Session(model, device=best, allow_host_fallback=False) as s:
        got = s.run(None, {"x": x})[0]
        assert [p.variant for p in s.plans({"x": x.shape})] == ["chunked"]
    x64 = x.astype(np.float64)
    if op == "ReduceMax":
        assert_same_bits(got, np.max(x), op)
        return
    exact = np.asarray(_EXACT64[op](x64, None))
    bound = _float_bound(op, x64, None, exact)
    assert abs(float(got) - float(exact)) <= bound, (op, float(got), float(exact), float(bound))


# ----------------------------------------------------------------------------- ArgMax / ArgMin

@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int8, np.uint8])
@pytest.mark.parametrize("axis,keepdims,last", [(1, 1, 0), (-1, 0, 1), (0, 0, 0), (1, 0, 1)])
def test_argmax_argmin_ties_and_nan_bit_for_bit_in_every_variant(best, op, dtype, axis, keepdims, last):
    x = data((5, 37, 3), dtype, seed=7, lo=-3, hi=3)  # small ints: many ties
    if np.dtype(dtype).kind == "f":
        x = np.round(x).astype(dtype)
        x[2, 11, 1] = np.nan
        x[2, 30, 1] = np.nan
        x[0, :, 0] = 0.0
        x[0, 20, 0] = -0.0
    model = one_node(op, x, opset=13, attrs={"axis": axis, "keepdims": keepdims, "select_last_index": last},
                     out_dtype=np.int64)
    expected = reference(model, x)
    assert expected.dtype == np.int64
    for label, got in every_variant(best, model, x, "arg"):
        assert_same_bits(got, expected, f"{op} {label}")


def test_argmax_of_an_empty_axis_is_declined(best):
    x = np.zeros((2, 0), np.float32)
    model = one_node("ArgMax", x, opset=13, attrs={"axis": 1}, out_dtype=np.int64)
    with pytest.raises(ExecutionError, match="nonEmpty"):
        run(best, model, x)


# ----------------------------------------------------------------------------- CumSum / CumProd

def _scan_model(op, x, axis, exclusive, reverse, axis_dtype=np.int64):
    return one_node(op, x, opset=26, attrs={"exclusive": exclusive, "reverse": reverse},
                    consts=[("axis", np.array(axis, axis_dtype))])


@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("axis,exclusive,reverse", [(1, 0, 0), (1, 1, 0), (-1, 0, 1), (0, 1, 1)])
def test_scans_against_onnx_reference_in_every_variant(best, op, dtype, axis, exclusive, reverse):
    if op == "CumProd" and dtype == np.float32:
        x = _float_data("ReduceProd", (4, 37, 3), dtype, seed=8)
    else:
        x = data((4, 37, 3), dtype, seed=8)
    model = _scan_model(op, x, axis, exclusive, reverse, np.int32 if exclusive else np.int64)
    ref = reference(model, x)
    for label, got in every_variant(best, model, x, "scan"):
        assert got.dtype == ref.dtype and got.shape == ref.shape, label
        if dtype == np.int32 or label.startswith("serial"):
            # integers wrap (mod 2^32) whatever the order; float32 in the serial order rounds as numpy
            assert_same_bits(got, ref, f"{op} {label}")
        else:
            # a chunked scan sums in another order: within n u sum |terms| of float64 (n <= the row's
            # length); products: relative n u
            x64 = np.moveaxis(x.astype(np.float64), axis, -1)
            n = x64.shape[-1]
            if op == "CumSum":
                bound = n * U * np.sum(np.abs(x64), axis=-1, keepdims=True) * 2
            else:
                bound = 2.02 * n * U * np.abs(np.moveaxis(ref.astype(np.float64), axis, -1))
            err = np.abs(np.moveaxis(got.astype(np.float64) - ref.astype(np.float64), axis, -1))
            assert np.all(err <= bound), (op, label, float(np.max(err - bound)))


@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
@pytest.mark.parametrize("axis,exclusive,reverse", [(1, 0, 0), (1, 1, 0), (-1, 0, 1), (0, 1, 1)])
def test_float64_scans_are_numpys_bits(best, op, axis, exclusive, reverse):
    # rows past SERIAL_MAX_ROW (300 > 256) still scan serially: the chunked order would part from numpy's
    r = np.random.default_rng(13)
    x = r.standard_normal((4, 300, 3)) * (1.0 if op == "CumProd" else np.exp(r.uniform(-30, 30, (4, 300, 3))))
    x[0, :, 0] = -0.0  # numpy's first element is taken as it is: -0.0 stays
    x[1, 5:9, 1] = [5e-324, -2.2e-308, np.inf, 1e300]
    x[2, 7, 2] = np.nan
    model = _scan_model(op, x, axis, exclusive, reverse)
    assert_same_bits(run(best, model, x), reference(model, x), f"{op} float64")
    with pytest.raises(ExecutionError, match="float64"):
        run(best, model, x, variant="workgroup_per_row")
    long_row = np.ones(16385)  # serial beyond MAX_LANE_ITERATIONS would meet llvmpipe's loop cap
    with pytest.raises(ExecutionError, match="serialFits"):
        run(best, _scan_model(op, long_row, 0, 0, 0), long_row)


def test_a_leading_negative_zero_stays_in_every_variant(best):
    # numpy's cumsum copies the first element: -0.0 + -0.0 ... is -0.0 all along (0.0 + -0.0 is not)
    x = np.full((2, 300), -0.0, np.float32)
    x[1, 150:] = 1.0
    model = _scan_model("CumSum", x, 1, 0, 0)
    for label, got in every_variant(best, model, x, "scan"):
        assert_same_bits(got, reference(model, x), f"CumSum -0.0 {label}")


# ----------------------------------------------------------------------------- TopK

def _topk_model(x, k, *, axis=-1, largest=1, opset=11):
    attrs = {"axis": axis} if opset == 10 else {"axis": axis, "largest": largest, "sorted": 1}
    ins = [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), list(x.shape))]
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], **attrs)
    outs = [helper.make_tensor_value_info("values", helper.np_dtype_to_tensor_dtype(x.dtype), None),
            helper.make_tensor_value_info("indices", 7, None)]
    graph = helper.make_graph([node], "g", ins, outs, initializer=[numpy_helper.from_array(np.array([k], np.int64), "k")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.uint64])
@pytest.mark.parametrize("axis,k,largest", [(-1, 3, 1), (1, 37, 0), (0, 1, 1), (1, 0, 1), (1, 5, 0)])
def test_topk_ties_and_nan_bit_for_bit(best, dtype, axis, k, largest):
    from onnx.reference import ReferenceEvaluator
    from onnx_quant.backend_wgpu.session import Session

    if np.dtype(dtype).kind == "f":
        x = np.round(data((4, 37, 3), dtype, seed=9)).astype(dtype)  # many ties
        x[1, 3, 2] = x[1, 30, 2] = np.nan
        x[2, :, 0] = 0.0
        x[2, 7, 0] = -0.0
    elif dtype == np.uint64:  # both words matter: values above 2^32 and around 2^63
        x = (data((4, 37, 3), np.int64, seed=9, lo=0, hi=5).astype(np.uint64) * np.uint64(2 ** 31)
             + np.uint64(2 ** 62)).astype(np.uint64)
    elif dtype == np.int64:
        x = data((4, 37, 3), np.int64, seed=9, lo=-4, hi=4) * np.int64(3 * 2 ** 31)
    else:
        x = data((4, 37, 3), dtype, seed=9, lo=-4, hi=4)
    model = _topk_model(x, k, axis=axis, largest=largest)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_values, ref_indices = ReferenceEvaluator(model).run(None, {"x": x})
    with Session(model, device=best, allow_host_fallback=False) as s:
        values, indices = s.run(None, {"x": x})
    assert_same_bits(values, ref_values, f"TopK values {axis} {k} {largest}")
    assert_same_bits(indices, ref_indices, f"TopK indices {axis} {k} {largest}")


def test_topk_10_has_no_largest_and_int32_waits_for_11(best):
    from onnx_quant.backend_wgpu.spec import load_specs

    specs = load_specs()
    assert specs.find("", "TopK", 9) is None  # TopK-1's k attribute: no kernel
    t10, t11 = specs.find("", "TopK", 10), specs.find("", "TopK", 11)
    assert set(t10.attributes) == {"axis"} and t10.type_constraints["T"] == ("float32",)
    assert set(t11.attributes) == {"axis", "largest", "sorted"} and "int32" in t11.type_constraints["T"]
    x = data((3, 4), np.float32)
    model = _topk_model(x, 2, opset=10)
    from onnx_quant.backend_wgpu.session import Session

    with Session(model, device=best, allow_host_fallback=False) as s:
        values, indices = s.run(None, {"x": x})
    assert_same_bits(indices, np.argsort(-x, axis=1, kind="stable")[:, :2].astype(np.int64), "TopK-10")
    assert_same_bits(values, np.take_along_axis(x, indices, axis=1), "TopK-10 values")


# ----------------------------------------------------------------------------- every adapter

def test_every_family_and_variant_on_every_adapter(dev):
    """One case per family and variant on each adapter (OpenGL: no subgroups, no f16 in
    shaders; the kernels use neither): same bits as onnx.reference for exact results."""
    x = data((3, 37, 5), np.int32, seed=12, lo=-2000, hi=2000)  # exact in float16 too
    cases = [(axes_model("ReduceSum", x, [1], 0, input_form=True), "reduce"),
             (axes_model("ReduceMax", x.astype(np.float16), [0, 2], 1, input_form=True), "reduce"),
             (one_node("ArgMin", x, opset=13, attrs={"axis": 1, "select_last_index": 1}, out_dtype=np.int64), "arg"),
             (_scan_model("CumSum", x, 1, 1, 1), "scan")]
    for model, family in cases:
        feed = x.astype(np.float16) if model.graph.input[0].type.tensor_type.elem_type == 10 else x
        expected = reference(model, feed)
        for label, got in every_variant(dev, model, feed, family):
            assert_same_bits(got, expected, f"{model.graph.node[0].op_type} {label} on {dev}")
    from onnx_quant.backend_wgpu.session import Session

    model = _topk_model(x.astype(np.float32), 4, axis=1, largest=0)
    with Session(model, device=dev, allow_host_fallback=False) as s:
        values, indices = s.run(None, {"x": x.astype(np.float32)})
    ref_values, ref_indices = reference_outputs(model, x.astype(np.float32))
    assert_same_bits(values, ref_values, "TopK values")
    assert_same_bits(indices, ref_indices, "TopK indices")


def reference_outputs(model, x):
    from onnx.reference import ReferenceEvaluator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(None, {"x": x})

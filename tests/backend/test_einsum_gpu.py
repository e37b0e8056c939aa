"""Einsum on the GPU (templates/einsum.kernel.json, backend_wgpu/einsum.py) against numpy's einsum:
the forms exporters write (batched matmuls, attention scores, transposes, reductions, diagonals,
broadcast ellipses, three inputs, implicit outputs), float32 within float32 summation error,
float64 (soft-float) within float64 summation error of numpy's float64 (copies bit for bit) and
int32 bit for bit. ONNX's own Einsum cases are float64 (they pass) or bfloat16 (declined by type:
no such arithmetic on the device); their equations and shapes also run here in float32."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP, helper

from onnx_quant.backend_wgpu.einsum import EinsumError, einsum_plan
from onnx_quant.backend_wgpu.session import Session
from onnx_quant.errors import ExecutionError
from onnx_quant.node_cases import all_node_cases

from support.gpu import assert_node_cases_pass_or_declined


def einsum_model(equation, shapes, elem=TP.FLOAT):
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, elem, list(s)) for n, s in zip(names, shapes)],
                          [helper.make_tensor_value_info("y", elem, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)])


def run(device, equation, arrays):
    elem = {np.dtype(np.int32): TP.INT32, np.dtype(np.float64): TP.DOUBLE}.get(arrays[0].dtype, TP.FLOAT)
    with Session(einsum_model(equation, [a.shape for a in arrays], elem), device=device, allow_host_fallback=False) as s:
        (y,) = s.run(None, {f"x{i}": a for i, a in enumerate(arrays)})
    return y


FORMS = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 8), (1, 2, 5, 8)]),
    ("ij->ji", [(3, 5)]),
    ("ij->i", [(4, 7)]),
    ("ii->i", [(5, 5)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 6)]),
    ("i,i->", [(9,), (9,)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("ij,jk", [(3, 4), (4, 2)]),
    ("...ii->...i", [(3, 4, 4)]),
    ("bi,bj->bij", [(2, 3), (2, 4)]),
]


@pytest.mark.parametrize("equation, shapes", FORMS)
def test_forms_agree_with_numpy(best, equation, shapes):
    rng = np.random.default_rng(len(equation))
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    got = run(best, equation, arrays)
    want = np.einsum(equation, *[a.astype(np.float64) for a in arrays])
    assert got.shape == want.shape
    # float32 sums of at most 8 products against float64: within 8 ulp of sum |terms|
    bound = 8 * np.finfo(np.float32).eps * np.einsum(equation, *[np.abs(a.astype(np.float64)) for a in arrays])
    assert np.all(np.abs(got - want) <= bound + 1e-30)
    ints = [rng.integers(-50, 50, s).astype(np.int32) for s in shapes]
    assert np.array_equal(run(best, equation, ints), np.einsum(equation, *ints))


@pytest.mark.parametrize("equation, shapes", FORMS)
def test_float64_forms_within_float64_rounding_of_numpy(best, equation, shapes):
    rng = np.random.default_rng(len(equation) + 1)
    arrays = [rng.standard_normal(s) * np.exp(rng.uniform(-20, 20, s)) for s in shapes]
    got = run(best, equation, arrays)
    want = np.einsum(equation, *arrays)
    assert got.dtype == np.float64 and got.shape == want.shape
    # both sums of at most 8 correctly rounded products (numpy's in its own order): within 16 ulp
    # of sum |terms|, not the float32 bound (that would pass a sum computed in float32)
    bound = 16 * np.finfo(np.float64).eps * np.einsum(equation, *[np.abs(a) for a in arrays])
    assert np.all(np.abs(got - want) <= bound), float(np.max(np.abs(got - want) / (bound + 1e-300)))


@pytest.mark.parametrize("equation, shapes", [("ij->ji", [(3, 5)]), ("ii->i", [(5, 5)]), ("bi,bj->bij", [(2, 3), (2, 4)])])
def test_float64_copies_and_single_products_are_numpys_bits(best, equation, shapes):
    # no summed label: the element (or one rounded product) itself, -0.0, NaN and subnormals kept, as
    # onnx.reference's np.einsum(optimize=True) gives them (without optimize numpy adds the products
    # to a zeroed output: -0.0 becomes +0.0)
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s) for s in shapes]
    arrays[0].reshape(-1)[:4] = [-0.0, np.nan, 5e-324, -np.inf]
    got = run(best, equation, arrays)
    want = np.einsum(equation, *arrays, optimize=True)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got[~np.isnan(want)].view(np.uint64), want[~np.isnan(want)].view(np.uint64))


def test_onnx_einsum_cases_in_float32(best):
    cases = [c for c in all_node_cases() if c.model is not None and c.model.graph.node[0].op_type == "Einsum"]
    assert len(cases) == 9
    for case in cases:
        equation = next(a.s.decode() for a in case.model.graph.node[0].attribute if a.name == "equation")
        arrays = [np.asarray(x, np.float32) for x in case.data_sets[0][0]]
        got = run(best, equation, arrays)
        np.testing.assert_allclose(got, np.einsum(equation, *arrays), rtol=1e-5, atol=1e-6, err_msg=case.name)


def test_onnx_einsum_cases_pass_or_are_declined_by_type(best):
    # ONNX's Einsum cases are float64 (soft-float: they pass) or bfloat16 (declined by name, never a wrong value)
    declined = {c.name: "bfloat16" for c in all_node_cases()
                if c.model is not None and c.model.graph.node[0].op_type == "Einsum" and "bfloat16" in c.name}
    assert len(declined) == 3
    assert_node_cases_pass_or_declined(best, ("Einsum",), declined, 6)


def test_a_contraction_beyond_one_invocations_loops_is_declined(best):
    # the guard is conservative (the inputs' element counts over the output's bound the summed
    # products per output element): what it lets through runs to the end
    a = np.ones((1, 240), np.float32)
    b = np.ones((240, 1), np.float32)
    assert run(best, "ij,jk->ik", [a, b])[0, 0] == 240.0
    big = np.ones((1, 70000), np.float32)
    with pytest.raises(ExecutionError, match="loopsFit"):
        run(best, "ij,jk->ik", [big, big.T.copy()])


@pytest.mark.parametrize("equation, shapes, words", [
    ("ij,jk->ik", [(2, 3)], "2 input terms, the node 1 inputs"), ("ij->k", [(2, 3)], "name no input dim"),
    ("ij,jk->ik", [(2, 3), (4, 5)], "label 'j' is 3 and 4"), ("i.j->i", [(2, 3)], "not letters"),
    ("ijk->i", [(2, 3)], "names 3 dims"),
])
def test_malformed_equations_are_named(equation, shapes, words):
    with pytest.raises(EinsumError, match=words):
        einsum_plan(equation, shapes)


def test_plan_reads_numpys_implicit_output_and_broadcast_ellipsis():
    p = einsum_plan("...ij,...jk", [(2, 1, 3, 4), (5, 4, 6)])
    assert p.output == ("0", "1", "i", "k") and p.summed == ("j",)
    assert p.sizes["0"] == 2 and p.sizes["1"] == 5
    assert p.broadcast == ((False, True, False, False), (False, False, False))

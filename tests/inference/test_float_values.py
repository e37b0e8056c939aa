"""Dims carried through float tensors (``inference.rules.float_values``): ``Cast`` to float and
back, ``Range`` with float bounds, ``Floor``/``Ceil``/``Div``/``Add`` of such values. Each
expression is checked against onnx.reference's run of the same graph at several sizes (odd
ones, so every floor and ceil matters); what is not exact stays unknown."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnx_quant import inference
from onnx_quant.inference import dims
from onnx_quant.inference.rules import float_values as fv
from support.models import make_model
from support.oracles import ref_run


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def _width_model(extra=()):
    """``x [N, 3, H, W]``; ``wf = Cast<float>(W)`` and what exporters compute from it."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]), _const("i3", np.int64(3)),
        helper.make_node("Gather", ["s", "i3"], ["w"], axis=0), helper.make_node("Cast", ["w"], ["wf"], to=T.FLOAT),
        _const("zero", np.float32(0)), _const("one", np.float32(1)), _const("half", np.float32(0.5)),
        _const("k", np.float32(32)), _const("two", np.float32(2)),
        helper.make_node("Range", ["zero", "wf", "one"], ["grid"]),             # arange(w, dtype=float)
        helper.make_node("Add", ["grid", "half"], ["centres"]),                # + 0.5
        helper.make_node("Div", ["wf", "k"], ["w_32"]),
        helper.make_node("Floor", ["w_32"], ["floor_32"]),
        helper.make_node("Ceil", ["w_32"], ["ceil_32"]),
        helper.make_node("Cast", ["ceil_32"], ["ceil_int"], to=T.INT64),       # math.ceil(w / 32)
        helper.make_node("Cast", ["w_32"], ["trunc_int"], to=T.INT64),         # int(w / 32)
        helper.make_node("Range", ["zero", "floor_32", "one"], ["grid_32"]),
        helper.make_node("Add", ["wf", "half"], ["w_half"]),
        helper.make_node("Range", ["zero", "w_half", "one"], ["grid_half"]),   # ceil(w + 0.5) = w + 1
        helper.make_node("Div", ["wf", "two"], ["w_2"]),
        helper.make_node("Range", ["zero", "w_2", "half"], ["grid_step"]),     # (w / 2) / 0.5 = w
        helper.make_node("Less", ["w_32", "one"], ["narrow"]),
        *extra,
    ]
    outputs = ["centres", "grid_32", "grid_half", "grid_step", "ceil_int", "trunc_int", "narrow"]
    return make_model(nodes, [("x", T.FLOAT, ["N", 3, "H", "W"])], outputs + [n.output[0] for n in extra])


def test_float_casts_of_a_dim_give_exact_expressions():
    r = inference.infer(_width_model(), strict=True)
    p = dims.parse
    shape = {k: r.ctx[k].shape for k in ("grid", "centres", "grid_32", "grid_half", "grid_step")}
    assert shape == {"grid": (p("W"),), "centres": (p("W"),), "grid_32": (p("floor(W / 32)"),),
                     "grid_half": (p("W + 1"),), "grid_step": (p("W"),)}
    value = {k: r.ctx[k].value.reshape(-1)[0] for k in ("wf", "w_32", "floor_32", "ceil_int", "trunc_int")}
    assert value == {"wf": p("W"), "w_32": fv.Ratio(p("W"), 32), "floor_32": p("floor(W / 32)"),
                     "ceil_int": p("ceil(W / 32)"), "trunc_int": p("floor(W / 32)")}
    narrow = r.ctx["narrow"].value
    assert narrow is None or narrow.reshape(-1)[0] is None  # W < 32 depends on W


@pytest.mark.parametrize("width", [1, 31, 32, 33, 95, 1000])
def test_the_expressions_are_what_onnx_reference_computes(width):
    model = _width_model()
    names = [o.name for o in model.graph.output]
    got = dict(zip(names, ref_run(model, {"x": np.zeros((1, 3, 2, width), np.float32)}, names)))
    concrete = inference.infer_values(model, {"x": (1, 3, 2, width)}, strict=True)
    symbolic = inference.infer_values(model, strict=True)
    for name, array in got.items():
        assert concrete[name].shape == array.shape, name
        assert tuple(dims.evaluate(d, {"W": width, "N": 1, "H": 2}) for d in symbolic[name].shape) == array.shape, name
    for name in ("ceil_int", "trunc_int", "narrow"):
        assert concrete[name].value.tolist() == got[name].tolist(), name
    for name in ("ceil_int", "trunc_int"):
        assert dims.evaluate(symbolic[name].value.reshape(-1)[0], {"W": width}) == int(got[name]), name


def test_what_is_not_exact_is_not_carried():
    """float16 holds integers exactly only to 2048: a dim cast to it loses its value; a factor
    that is no small ratio (0.1) makes the result unknown, as a division by a dim does."""
    extra = [helper.make_node("Cast", ["w"], ["w16"], to=T.FLOAT16),
             _const("tenth", np.float32(0.1)), helper.make_node("Mul", ["wf", "tenth"], ["w_tenth"]),
             helper.make_node("Div", ["one", "wf"], ["inverse"])]
    r = inference.infer(_width_model(extra), strict=True)
    for k in ("w16", "w_tenth", "inverse"):
        v = r.ctx[k].value
        assert v is None or v.reshape(-1)[0] is None, (k, v)


def test_ratio_arithmetic_keeps_lowest_terms():
    w = dims.parse("W")
    assert fv.div(dims.mul(w, 4), 2.0) == dims.mul(w, 2)
    assert fv.div(dims.mul(w, 2), 4.0) == fv.Ratio(w, 2)
    assert fv.add(fv.Ratio(w, 2), 0.5) == fv.Ratio(dims.add(w, 1), 2)
    assert fv.mul(fv.Ratio(w, 2), 2.0) == w
    assert fv.ceil(fv.sub(w, 0.5)) == w and fv.floor(fv.sub(w, 0.5)) == dims.sub(w, 1)
    assert fv.trunc(fv.Ratio(dims.sub(w, 7), 2)) is None  # W - 7 may be negative: truncation is not floor
    assert fv.make(dims.mul(w, 3), 2 * fv.MAX_DEN + 2) is None

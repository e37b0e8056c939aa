"""One kernel verdict and one type binding (backend_wgpu/verdict.py), on the CPU: the binding the
planner and the construction phases share, and ``SpecRegistry.verdict``, which the rewrites, the
placement and NonZero's split ask."""

from __future__ import annotations

import pytest
from onnx import TensorProto as TP, helper

from onnx_quant.backend_wgpu.device_info import DeviceInfo
from onnx_quant.backend_wgpu.planner import plan_node
from onnx_quant.backend_wgpu.spec import load_specs
from onnx_quant.backend_wgpu.verdict import (
    TypeBinding, TypeClash, Verdict, kernel_verdict, op_text, written_node_rejects,
)
from onnx_quant.errors import KernelRejected

SPECS = load_specs()


def test_a_binding_fixes_each_constraint_once_and_names_what_clashes():
    b = TypeBinding({"T": ["float32", "float16"], "I": ["int64"]})
    assert b.bind("A", "T", "float32") is None and b.bind("B", "T", "float32") is None
    assert b.bind("C", "T", "float16") == TypeClash("C", "float16", "T", ("float32", "float16"), ("float32", "A"))
    assert b.bind("D", "I", "int32") == TypeClash("D", "int32", "I", ("int64",))
    assert b.bind("E", "I", None) == TypeClash("E", None, "I", ("int64",))   # no device type at all
    assert b.type_of("T") == "float32" and b.type_of("I") is None


def test_the_registry_verdict_names_a_missing_kernel_and_an_op_it_cannot_take():
    relu = helper.make_node("Relu", ["x"], ["y"])
    spec, why = SPECS.verdict(relu, "", 17, lambda n: TP.FLOAT)
    assert spec is SPECS.find("", "Relu", 17) and why == ""
    spec, why = SPECS.verdict(relu, "", 17, lambda n: TP.BOOL)
    assert spec is not None and "'x' is bool" in why and "allows only" in why
    nope = helper.make_node("NoSuchOp", ["x"], ["y"], domain="x.y")
    assert SPECS.verdict(nope, "x.y", 1, lambda n: 0) == Verdict(None, "no GPU kernel for x.y::NoSuchOp at opset 1")
    assert op_text("", "Relu") == "Relu" and op_text("com.microsoft", "QGemm") == "com.microsoft::QGemm"


def test_a_view_op_a_phase_writes_needs_no_kernel():
    rejects = written_node_rejects(SPECS, lambda n: TP.UINT8)
    assert rejects(helper.make_node("Reshape", ["x", "s"], ["y"]), "", 17) == ""
    assert rejects(helper.make_node("NoSuchOp", ["x"], ["y"]), "", 17).startswith("no GPU kernel for NoSuchOp")


def test_the_planner_binds_through_the_same_binding_and_words_its_clash_as_before():
    spec = SPECS.find("", "Add", 14)
    with pytest.raises(KernelRejected, match=r"'b' has type float16 but 'a' has float32; both are T"):
        plan_node(spec, shapes={"a": (4,), "b": (4,), "c": (4,)}, dtypes={"a": "float32", "b": "float16", "c": "float32"},
                  device=DeviceInfo())


def test_the_verdict_asks_the_registry_it_is_given_even_one_that_wraps_another():
    class WithoutRelu:
        def __init__(self, inner):
            self._inner = inner

        def find(self, domain, op_type, version):
            return None if op_type == "Relu" else self._inner.find(domain, op_type, version)

        def __getattr__(self, name):   # verdict, ops, ... of the wrapped registry
            return getattr(self._inner, name)

    relu = helper.make_node("Relu", ["x"], ["y"])
    assert kernel_verdict(WithoutRelu(SPECS), relu, "", 17, lambda n: TP.FLOAT).spec is None
    assert written_node_rejects(WithoutRelu(SPECS), lambda n: TP.FLOAT)(relu, "", 17).startswith("no GPU kernel")
    assert SPECS.verdict(relu, "", 17, lambda n: TP.FLOAT) == kernel_verdict(SPECS, relu, "", 17, lambda n: TP.FLOAT)

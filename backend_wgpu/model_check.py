"""What ``Session`` checks of a model before it does anything else: the inference pass over
the declared shapes, and the structural faults ``check`` reports (inference/structure.py),
refused with the same rule id instead of surfacing later as a KeyError or a RecursionError."""

from __future__ import annotations

import onnx

from onnx_quant.errors import ExecutionError, InferenceError, QuantError


def static_values(model: onnx.ModelProto) -> dict:
    """Name -> TensorInfo from a lenient pass; raises the first structural ``InferenceError``
    (``graph-order``, ``single-assignment``, ``graph-output``, ``function-recursion``,
    ``graph-depth``); any other failure of the pass is an ``ExecutionError``."""
    from ..inference import infer  # noqa: PLC0415
    from ..inference.structure import STRUCTURAL_RULES, first_structural_error  # noqa: PLC0415

    try:
        result = infer(model, strict=False, runtime=True)
    except InferenceError as e:
        if e.rule in STRUCTURAL_RULES:
            raise
        raise ExecutionError(f"shape inference of the model failed: {e}") from None
    except QuantError as e:
        raise ExecutionError(f"shape inference of the model failed: {e}") from None
    fault = first_structural_error(result.errors)
    if fault is not None:
        raise fault
    return result.values()


def check_host_outputs(budget, label: str, op: str, outputs, values) -> None:
    """Refuse a host node whose outputs (shapes from inference, before onnx.reference makes
    them) would take more than the memory budget together: ``BudgetError`` naming the node."""
    from onnx_quant.dtypes import element_type  # noqa: PLC0415

    total = 0
    for name in outputs:
        v = values.get(name)
        shape = None if v is None else v.shape
        if not v or not v.elem_type or shape is None or not all(type(d) is int for d in shape):
            continue  # unknown until it runs: nothing to check against beforehand
        try:
            bits = element_type(v.elem_type).bits
        except QuantError:
            continue
        total += budget.check_array(shape, max(8, bits), f"node {label!r} ({op}) output {name!r}")
    budget.check(total, f"node {label!r} ({op}) outputs")


#: the element types whose TensorProto numpy_helper reads as onnx.reference's Constant gives them
_PLAIN_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                          onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32,
                          onnx.TensorProto.INT64, onnx.TensorProto.UINT8, onnx.TensorProto.UINT16,
                          onnx.TensorProto.UINT32, onnx.TensorProto.UINT64, onnx.TensorProto.BOOL})


def plain_constant(node: onnx.NodeProto):
    """The value of a Constant whose only attribute is a plain numeric ``value`` tensor stored in
    the model (numpy_helper, no onnx.reference: importing it costs a new process 0.2-0.7 s), else
    None (the other forms go through onnx.reference)."""
    if node.op_type != "Constant" or len(node.attribute) != 1:
        return None
    attr = node.attribute[0]
    if attr.name != "value" or attr.type != onnx.AttributeProto.TENSOR or attr.t.data_type not in _PLAIN_TYPES \
            or attr.t.data_location == onnx.TensorProto.EXTERNAL:
        return None
    from onnx import numpy_helper  # noqa: PLC0415

    return numpy_helper.to_array(attr.t)

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

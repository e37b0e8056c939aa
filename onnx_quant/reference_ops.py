"""An exact host oracle: onnx.reference with every op onnxruntime's quantizer writes.

``reference_evaluator(model)`` is ``onnx.reference.ReferenceEvaluator(model, new_ops=OPS)``:

- ``QuantizeLinear`` / ``DequantizeLinear`` for every opset (onnx 1.23's reference has no
  DequantizeLinear before 19): onnx's newest implementation, whose defaults are the older
  versions' semantics (10: per-tensor; 13: ``axis``; 19: float8, ``saturate``; 21: blocks). An
  integer QuantizeLinear saturates in float before the cast (onnx's casts to int32 first, so
  |x / scale| >= 2^31 wrapped); NaN gives the type's lowest value, as onnxruntime's MLAS does.
  Equal to onnxruntime 1.32 bit for bit at opsets 10-21 (tests/onnx_quant/test_reference_ops.py).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnx.reference.ops._quant_utils import reshape_input
from onnx.reference.ops.op_dequantize_linear import _CommonDequantizeLinear
from onnx.reference.ops.op_quantize_linear import _QUANT_INTEGER_RANGES, _CommonQuantizeLinear


class QuantizeLinear(OpRun):
    """QuantizeLinear 10-25 (onnx's newest implementation; integer targets saturate in float)."""

    op_domain = ""

    def _run(self, x, y_scale, zero_point=None, axis=1, saturate=1, block_size=0, output_dtype=0, precision=0):
        target = onnx.helper.np_dtype_to_tensor_dtype(zero_point.dtype) if zero_point is not None else (
            output_dtype or onnx.TensorProto.UINT8)
        if target not in _QUANT_INTEGER_RANGES or x.size == 0:
            return _CommonQuantizeLinear._run(self, x, y_scale, zero_point, axis=axis, saturate=saturate,
                                              block_size=block_size, output_dtype=output_dtype or None,
                                              precision=precision or None)
        scale = reshape_input(y_scale, x.shape, axis, block_size)
        if precision:
            dt = onnx.helper.tensor_dtype_to_np_dtype(precision)
            x, scale = x.astype(dt), scale.astype(dt)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            q = np.rint(x / scale).astype(np.float64)
        if zero_point is not None:
            q = q + reshape_input(zero_point, x.shape, axis, block_size).astype(np.float64)
        lo, hi = _QUANT_INTEGER_RANGES[target]
        q = np.clip(np.where(np.isnan(q), lo, q), lo, hi)
        return (q.astype(onnx.helper.tensor_dtype_to_np_dtype(target)),)


class DequantizeLinear(OpRun):
    """DequantizeLinear 10-25 (onnx's newest implementation; onnx 1.23 has none before 19)."""

    op_domain = ""

    def _run(self, x, x_scale, x_zero_point=None, axis=1, block_size=0, output_dtype=0):
        return _CommonDequantizeLinear._run(self, x, x_scale, x_zero_point, axis=axis, block_size=block_size,
                                            output_dtype=output_dtype or None)


OPS: list[type[OpRun]] = [
    QuantizeLinear, DequantizeLinear,
]


def reference_evaluator(model, **kwargs) -> ReferenceEvaluator:
    """``onnx.reference.ReferenceEvaluator(model, new_ops=OPS, **kwargs)``; a caller's own
    ``new_ops`` come first (the first class registered for an op wins)."""
    new_ops = list(kwargs.pop("new_ops", None) or []) + OPS
    return ReferenceEvaluator(model, new_ops=new_ops, **kwargs)

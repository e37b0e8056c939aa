"""Type and shape inference for ONNX models (ShapesContext pass)."""

# context first: rule modules imported by the engine read ``onnx_quant.inference.TensorInfo``
from onnx_quant.inference.context import ShapesContext, TensorInfo
from onnx_quant.inference.diagnostics import Diagnostic
from onnx_quant.inference.engine import InferenceResult, NodeRecord, check_model, infer, infer_shapes, infer_values

__all__ = [
    "ShapesContext", "TensorInfo", "Diagnostic", "InferenceResult", "NodeRecord",
    "infer", "infer_shapes", "infer_values", "check_model",
]

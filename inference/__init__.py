"""Type and shape inference for ONNX models (ShapesContext pass)."""

# context first: rule modules imported by the engine read ``inference.TensorInfo``
from inference.context import ShapesContext, TensorInfo
from inference.diagnostics import Diagnostic
from inference.engine import InferenceResult, NodeRecord, check_model, infer, infer_shapes, infer_values

__all__ = [
    "ShapesContext", "TensorInfo", "Diagnostic", "InferenceResult", "NodeRecord",
    "infer", "infer_shapes", "infer_values", "check_model",
]

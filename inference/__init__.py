"""Type and shape inference for ONNX models (ShapesContext pass)."""

# context first: rule modules imported by the engine read ``onnx_quant.inference.TensorInfo``
from .context import ShapesContext, TensorInfo
from .diagnostics import Diagnostic
from .api import InferenceResult, NodeRecord
from .engine import check_model, infer, infer_shapes, infer_values

__all__ = [
    "ShapesContext", "TensorInfo", "Diagnostic", "InferenceResult", "NodeRecord",
    "infer", "infer_shapes", "infer_values", "check_model",
]

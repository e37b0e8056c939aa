"""Type and shape inference for ONNX models (ShapesContext pass)."""

from inference.context import ShapesContext, TensorInfo

__all__ = ["ShapesContext", "TensorInfo"]

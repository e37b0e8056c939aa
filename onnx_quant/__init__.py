"""onnx-quant: the shared vocabulary (element types, operator facts, errors, CLI)."""

__version__ = "0.1.0"

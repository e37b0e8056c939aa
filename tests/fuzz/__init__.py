"""Differential graph fuzzer: random valid ONNX graphs run on the GPU against an oracle (docs/testing.md)."""

"""ONNX's own backend test harness (``onnx.backend.test.BackendTest``) driving ``backend_wgpu.backend``.

The harness generates one unittest method per ONNX node test case and device; this module
keeps the quantization family's cases (the same 45 at opset 28 that ``onnx-quant conformance``
runs: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and its expanded form,
QLinearConv, QLinearMatMul, MatMulInteger, ConvInteger) and exposes them to pytest. The
harness compares with ``np.testing.assert_allclose`` at the case's rtol/atol (1e-3/1e-7)
after checking dtype and shape; ``onnx-quant conformance`` is stricter (bit for bit for
integer and narrow-float outputs). Every case is prepared with ``allow_host_fallback=False``:
a model with a node no GPU kernel covers fails here (as it does not pass in
``onnx-quant conformance``) instead of passing on onnx.reference's values.

Only the devices the backend supports are exposed, and the ~1800 other node cases are not
collected at all (the harness would otherwise add each as a skipped test). Nothing is marked
skip or xfail.
"""

from __future__ import annotations

import re
import unittest
import warnings

import pytest
from onnx.backend.test import BackendTest

from onnx_quant import backend_wgpu
from onnx_quant.backend_wgpu.conformance import case_names

backend = backend_wgpu.backend

_NAMES = case_names()
assert len(_NAMES) >= 45, _NAMES  # onnx 1.23: 45 cases of the family at opset 28
_PATTERN = re.compile(r"^(%s)_(cpu|cuda)$" % "|".join(re.escape(n) for n in _NAMES))

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    # allow_host_fallback=False: a case passes only if every node runs on the GPU (as in
    # ``onnx-quant conformance``), not because onnx.reference ran the nodes no kernel covers
    backend_test = BackendTest(backend, __name__,
                               test_kwargs={name: {"allow_host_fallback": False} for name in _NAMES})
backend_test.include(_PATTERN.pattern)


def _family_only(test_cases: dict[str, type]) -> dict[str, type]:
    """The harness's TestCase classes reduced to the family's methods for supported devices."""
    out: dict[str, type] = {}
    for class_name, cls in test_cases.items():
        methods = {}
        for name in dir(cls):
            m = _PATTERN.match(name)
            if m and backend.supports_device(m.group(2).upper()):
                methods[name] = getattr(cls, name)
        if methods:
            out[class_name] = type(class_name, (unittest.TestCase,), {"__module__": __name__, **methods})
    return out


with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # enable_report's onnx_coverage mark is not registered here
    _CASES = _family_only(backend_test.enable_report().test_cases)
_CASES = {name: pytest.mark.gpu(cls) for name, cls in _CASES.items()}  # every case runs on the GPU
globals().update(_CASES)


def test_every_family_case_is_exposed():
    exposed = {n for cls in _CASES.values() for n in dir(cls) if n.startswith("test_")}
    assert {f"{n}_cpu" for n in _NAMES} <= exposed, sorted({f"{n}_cpu" for n in _NAMES} - exposed)

"""The dense samples and float64 references the elementwise table's accuracy is measured on
(tests/backend/test_elementwise_table_gpu.py asserts the bounds; docs/kernels.md lists them)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

SAMPLES = 1 << 16


def _grid(lo: float, hi: float) -> np.ndarray:
    return np.linspace(lo, hi, SAMPLES, dtype=np.float64).astype(np.float32)


def _log_grid(lo: float, hi: float) -> np.ndarray:
    """Positive floats spread evenly over the exponents between lo and hi."""
    return np.exp(np.linspace(np.log(lo), np.log(hi), SAMPLES)).astype(np.float32)


def _both_signs(lo: float, hi: float) -> np.ndarray:
    g = _log_grid(lo, hi)
    return np.concatenate([-g[::2], g[::2]])


#: op -> (dense sample, float64 reference of the sample, attributes)
REFERENCES = {
    "Exp": (_grid(-87, 88), np.exp, {}),
    "Log": (_log_grid(1e-30, 1e30), np.log, {}),
    "Sqrt": (_log_grid(1e-30, 1e30), np.sqrt, {}),
    "Sin": (_grid(-100, 100), np.sin, {}),
    "Cos": (_grid(-100, 100), np.cos, {}),
    "Tan": (_grid(-1.5, 1.5), np.tan, {}),
    "Asin": (_grid(-1, 1), np.arcsin, {}),
    "Acos": (_grid(-1, 1), np.arccos, {}),
    "Atan": (_both_signs(1e-6, 1e6), np.arctan, {}),
    "Sinh": (_grid(-88, 88), np.sinh, {}),
    "Cosh": (_grid(-88, 88), np.cosh, {}),
    "Asinh": (_both_signs(1e-6, 1e6), np.arcsinh, {}),
    "Acosh": (_log_grid(1, 1e6), np.arccosh, {}),
    "Atanh": (_grid(-0.999, 0.999), np.arctanh, {}),
    "Tanh": (_grid(-12, 12), np.tanh, {}),
    "Sigmoid": (_grid(-80, 80), lambda x: 1 / (1 + np.exp(-x)), {}),
    "Erf": (_grid(-5, 5), None, {}),  # needs scipy's or math's erf: see reference()
    "Softplus": (_grid(-80, 80), lambda x: np.logaddexp(0, x), {}),
    "Elu": (_grid(-20, 5), lambda x: np.where(x > 0, x, np.expm1(x)), {}),
    "Selu": (_grid(-20, 5), lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(x)), {}),
    "Celu": (_grid(-20, 5), lambda x: np.maximum(x, 0) + np.minimum(0, np.expm1(x)), {}),
    "Mish": (_grid(-20, 20), lambda x: x * np.tanh(np.logaddexp(0, x)), {}),
    "Swish": (_grid(-80, 80), lambda x: x / (1 + np.exp(-1.5 * x)), {"alpha": 1.5}),
    "Pow": (_log_grid(1e-3, 1e3), lambda x: np.power(x, 2.5), {}),  # exponent 2.5 fed as b
}


def reference(op: str, x: np.ndarray) -> np.ndarray:
    fn = REFERENCES[op][1]
    if fn is None:  # erf: no numpy function; math.erf is correctly rounded enough in float64
        import math

        return np.array([math.erf(v) for v in x.astype(np.float64)])
    return fn(x.astype(np.float64))


def unary_model(op: str, n: int, attrs=None, opset: int = 24):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])
    inputs = ["x", "b"] if op == "Pow" else ["x"]
    inits = [helper.make_tensor("b", TensorProto.FLOAT, [], [2.5])] if op == "Pow" else []
    node = helper.make_node(op, inputs, ["y"], **(attrs or {}))
    return helper.make_model(helper.make_graph([node], "g", [x], [y], initializer=inits),
                             opset_imports=[helper.make_opsetid("", opset)])


def errors(got: np.ndarray, exact: np.ndarray) -> tuple[float, float, float]:
    """(max |got - exact|, max |got - exact| / |exact| where |exact| >= 1e-30, the largest
    excess over ONNX's rule atol 1e-7 + rtol 1e-3 |exact| as a fraction of it: <= 0 passes)."""
    g = got.astype(np.float64)
    finite = np.isfinite(exact) & (np.abs(exact) < 3.4e38)
    d = np.abs(g - exact)[finite]
    e = np.abs(exact)[finite]
    rel = d[e >= 1e-30] / e[e >= 1e-30]
    excess = (d - (1e-7 + 1e-3 * e)) / (1e-7 + 1e-3 * e)
    return float(d.max()), float(rel.max()), float(excess.max())

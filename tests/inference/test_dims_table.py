"""Direct table tests of the dims algebra (inference/dims.py): unknown (None), ints, symbols
and expressions, each row an exact expected result, so a one-line change to a rule fails."""

from __future__ import annotations

import pytest

from onnx_quant.inference import dims
from onnx_quant.inference.dims import Dim

N, M = Dim.symbol("N"), Dim.symbol("M")
N2 = dims.mul(N, 2)

BROADCAST = [
    (1, 5, 5), (5, 1, 5), (5, 5, 5), (1, 1, 1),
    (None, None, None),
    (None, 1, None), (1, None, None),
    (None, 5, 5), (5, None, 5),       # a known dim > 1 survives an unknown one
    (None, N, None), (N, None, None),  # N may be 1 at run time: the result is unknown, never N
    (None, N2, None),
    (N, 1, N), (1, N, N), (N, N, N),
    (N, 5, 5), (5, N, 5),             # the symbol must be 5 (or 1) at run time
    (N2, N2, N2),
]


@pytest.mark.parametrize("a, b, expected", BROADCAST)
def test_broadcast_table(a, b, expected):
    assert dims.broadcast(a, b) == expected
    assert dims.broadcast(b, a) == expected  # symmetric


def test_broadcast_of_two_symbols_is_their_max_and_known_dims_must_agree():
    assert dims.to_text(dims.broadcast(N, M)) == dims.to_text(dims.maximum(N, M))
    with pytest.raises(ValueError, match="dims 3 and 5 do not broadcast"):
        dims.broadcast(3, 5)


ARITH = [
    (dims.add, 2, 3, "5"), (dims.add, N, 0, "N"), (dims.add, N, N, "2*N"), (dims.sub, N, N, "0"),
    (dims.mul, N, 1, "N"), (dims.mul, N, 0, "0"), (dims.mul, N, M, "M*N"), (dims.add, N2, N, "3*N"),
    (dims.floordiv, N2, 2, "N"), (dims.floordiv, 7, 2, "3"), (dims.ceildiv, 7, 2, "4"),
    (dims.maximum, 3, 5, "5"), (dims.maximum, N, N, "N"),
]


@pytest.mark.parametrize("fn, a, b, text", ARITH)
def test_arithmetic_table(fn, a, b, text):
    assert dims.to_text(fn(a, b)) == text


@pytest.mark.parametrize("d, bindings, value", [
    (N, {"N": 4}, 4), (N2, {"N": 4}, 8), (dims.add(N, M), {"N": 1, "M": 2}, 3), (N, {}, None),
    (dims.floordiv(N, 2), {"N": 7}, 3),
])
def test_evaluate_table(d, bindings, value):
    assert dims.evaluate(d, bindings) == value


@pytest.mark.parametrize("d", [N, N2, dims.add(N, M), dims.maximum(N, M), dims.floordiv(N, 3)])
def test_text_round_trips(d):
    assert dims.parse(dims.to_text(d)) == d

"""Unit tests of inference.rules.shape_math (conv and matmul output shapes)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from onnx_quant.inference import dims
from onnx_quant.inference.dims import Dim
from onnx_quant.inference.rules.shape_math import (
    ShapeProblem,
    conv_output_shape,
    conv_problems,
    conv_spatial_dim,
    matmul_output_shape,
    matmul_problems,
    provably_different,
    provably_equal,
)

H, W, N, B = (Dim.symbol(s) for s in "HWNB")


def test_provably_different_and_equal():
    assert provably_different(3, 4)
    assert not provably_different(3, 3)
    assert not provably_different(H, 3)  # H may be 3
    assert provably_different(dims.add(H, 1), H)
    assert not provably_different(H, W)
    assert not provably_different(None, 3)
    assert provably_equal(dims.add(H, 0), H)
    assert not provably_equal(H, W)


@pytest.mark.parametrize(
    "auto_pad,pads,k,d,s,in_dim,expected",
    [
        ("NOTSET", (1, 1), 3, 1, 2, 7, 4),
        ("NOTSET", (0, 0), 3, 1, 1, 5, 3),
        ("NOTSET", (2, 1), 3, 2, 1, 6, 5),  # (6+3-5)//1+1
        ("VALID", (0, 0), 3, 1, 2, 8, 3),
        ("SAME_UPPER", (0, 0), 3, 1, 2, 7, 4),
        ("SAME_LOWER", (0, 0), 5, 3, 3, 8, 3),
        ("NOTSET", (0, 0), 1, 1, 1, 0, 0),  # size-0 input gives size-0 output
    ],
)
def test_conv_spatial_dim_ints(auto_pad, pads, k, d, s, in_dim, expected):
    got = conv_spatial_dim(in_dim, k, auto_pad=auto_pad, pad_begin=pads[0], pad_end=pads[1], stride=s, dilation=d)
    assert got == expected


def test_conv_spatial_dim_symbolic_is_canonical():
    got = conv_spatial_dim(H, 3, pad_begin=1, pad_end=1, stride=2)
    # floor((H + 2 - 3) / 2) + 1 == floor((H + 1) / 2)
    assert got == dims.parse("floor((H + 1) / 2)")
    for h in range(3, 20):
        assert dims.evaluate(got, {"H": h}) == (h + 2 - 3) // 2 + 1
    same = conv_spatial_dim(H, 3, auto_pad="SAME_UPPER", stride=3)
    assert [dims.evaluate(same, {"H": h}) for h in range(1, 8)] == [-(-h // 3) for h in range(1, 8)]


def test_conv_output_shape_full():
    out = conv_output_shape((N, 4, H, 10), (6, 2, 3, 3), pads=[1, 1, 1, 1], strides=[2, 2], group=2)
    assert out[0] == N and out[1] == 6 and out[3] == 5
    assert dims.evaluate(out[2], {"H": 9}) == 5
    assert conv_output_shape((1, 3, 5), (2, 3, 3)) == (1, 2, 3)
    assert conv_output_shape((1, 3, 5, 5, 5), (2, 3, 1, 1, 1), strides=[2, 2, 2]) == (1, 2, 3, 3, 3)
    # unknown rank of x: rank from w, spatial unknown
    assert conv_output_shape(None, (2, 3, 3, 3)) == (None, 2, None, None)


@pytest.mark.parametrize(
    "x,w,attrs,rule",
    [
        ((1, 4), (2, 4), {}, "conv.rank"),
        ((1, 4, 5), (2, 4, 3, 3), {}, "conv.rank"),
        ((1, 4, 5), (2, 3, 3), {}, "conv.channels"),
        ((1, 4, 5), (3, 2, 3), {"group": 2}, "conv.group"),
        ((1, 4, 5), (2, 4, 3), {"group": 0}, "conv.group"),
        ((1, 4, 5), (2, 4, 3), {"kernel_shape": [2]}, "conv.kernel-shape"),
        ((1, 4, 5), (2, 4, 3), {"kernel_shape": [3, 3]}, "conv.kernel-shape"),
        ((1, 4, 5), (2, 4, 3), {"pads": [1]}, "conv.pads"),
        ((1, 4, 5), (2, 4, 3), {"pads": [-1, 0]}, "conv.pads"),
        ((1, 4, 5), (2, 4, 3), {"pads": [1, 1], "auto_pad": "VALID"}, "conv.pads"),
        ((1, 4, 5), (2, 4, 3), {"strides": [1, 1]}, "conv.strides"),
        ((1, 4, 5), (2, 4, 3), {"strides": [0]}, "conv.strides"),
        ((1, 4, 5), (2, 4, 3), {"dilations": [0]}, "conv.dilations"),
        ((1, 4, 5), (2, 4, 3), {"auto_pad": "SAME"}, "conv.auto-pad"),
        ((1, 4, 2), (2, 4, 3), {}, "conv.output-size"),
        ((1, 4, 5), (2, 4, 3), {"dilations": [3]}, "conv.output-size"),
    ],
)
def test_conv_problems(x, w, attrs, rule):
    problems = conv_problems(x, w, **attrs)
    assert rule in [p.rule for p in problems]
    with pytest.raises(ShapeProblem) as e:
        conv_output_shape(x, w, **attrs)
    assert e.value.rule == problems[0].rule


def test_conv_problems_symbolic_only_when_certain():
    C = Dim.symbol("C")
    assert conv_problems((N, C, H), (4, 2, 3), group=2) == []
    assert [p.rule for p in conv_problems((N, dims.add(C, 1), H), (4, C, 3))] == ["conv.channels"]
    # zero pads together with auto_pad are harmless
    assert conv_problems((1, 2, 5), (1, 2, 3), auto_pad="VALID", pads=[0, 0]) == []
    assert conv_problems((1, 2, 5), (1, 2, 3), auto_pad=b"SAME_UPPER") == []


@given(
    a_batch=st.lists(st.integers(1, 3), max_size=2),
    b_batch=st.lists(st.integers(1, 3), max_size=2),
    m=st.integers(0, 3), k=st.integers(0, 3), n=st.integers(0, 3),
    a_vec=st.booleans(), b_vec=st.booleans(),
)
def test_matmul_output_shape_matches_numpy(a_batch, b_batch, m, k, n, a_vec, b_vec):
    a_shape = (k,) if a_vec else (*a_batch, m, k)
    b_shape = (k,) if b_vec else (*b_batch, k, n)
    try:
        want = np.matmul(np.zeros(a_shape), np.zeros(b_shape)).shape
    except ValueError:
        with pytest.raises(ShapeProblem):
            matmul_output_shape(a_shape, b_shape)
        return
    assert matmul_output_shape(a_shape, b_shape) == want


def test_matmul_symbolic():
    K = Dim.symbol("K")
    assert matmul_output_shape((B, 1, N, K), (4, K, 7)) == (B, 4, N, 7)
    assert matmul_output_shape((K,), (K,)) == ()
    assert matmul_output_shape((N, K), (K,)) == (N,)
    out = matmul_output_shape((B, 2, 3), (W, 3, 5))
    assert dims.evaluate(out[0], {"B": 4, "W": 1}) == 4 and dims.evaluate(out[0], {"B": 4, "W": 4}) == 4
    assert [p.rule for p in matmul_problems((N, K), (dims.add(K, 1), 3))] == ["matmul.inner-dim"]
    assert matmul_problems((N, K), (W, 3)) == []  # W may equal K
    assert [p.rule for p in matmul_problems((), (3,))] == ["matmul.rank"]
    assert [p.rule for p in matmul_problems((2, 3, 4), (5, 4, 2))] == ["matmul.batch-broadcast"]
    assert matmul_output_shape(None, (3, 4)) is None

"""What the tests compare the GPU with, and how: onnxruntime (exact on any host CPU),
onnx.reference, numpy models of onnxruntime's kernels; bit-for-bit and tolerance assertions.

The suite-wide guard that refuses a saturating onnxruntime session lives in conftest.py
(``_no_saturating_oracle``); ``onnxruntime_run`` is the oracle it points to.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from onnx_quant.oracles import avx2_fma_on, cpu_flags, widen_u8s8

f32 = np.float32
FLT_MAX = np.finfo(np.float32).max

#: onnxruntime runs the AVX2 / FMA3 kernels the numpy models of its QLinear kernels reproduce
ORT_FMA3 = avx2_fma_on(cpu_flags())


# ----------------------------------------------------------------------------- running the oracles

def onnxruntime_run(model, feeds, *, level: str = "ORT_ENABLE_ALL", threads: int | None = None) -> list:
    """onnxruntime CPU's outputs for ``model`` on ``feeds``, with every uint8 x int8 integer GEMM
    summed exactly (onnx_quant.oracles.exact_onnxruntime_run: the model's int8 weight sides widened
    to uint8), so that no verdict depends on whether the host CPU has VNNI. ``level``: a
    GraphOptimizationLevel name (``ORT_DISABLE_ALL`` runs the graph as written); ``threads``:
    intra_op_num_threads (None: onnxruntime's default)."""
    from onnx_quant.oracles import exact_onnxruntime_run

    return exact_onnxruntime_run(model, feeds, level=level, threads=threads)


def ort_run(model, feeds):
    """onnxruntime CPU's outputs with its default session options, the model's uint8 x int8
    GEMMs widened to uint8 first: exact sums on any CPU (onnx_quant/oracles.py)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(widen_u8s8(model).model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def ref_run(model, feeds, names=None):
    """onnx.reference's outputs (``names``: which; None: all), its warnings silenced."""
    from onnx.reference import ReferenceEvaluator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(names, feeds)


# ----------------------------------------------------------------------------- assertions

def assert_agree(got, want, rtol: float) -> None:
    """Outputs against an oracle's: same shapes and dtypes; integer and bool outputs bit for bit,
    float ones within ``rtol`` of the largest expected magnitude (+1e-6)."""
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if g.dtype.kind in "iub":
            assert np.array_equal(g, w)
            continue
        scale = float(np.abs(w.astype(np.float64)).max(initial=0))
        assert float(np.abs(g.astype(np.float64) - w).max(initial=0)) <= rtol * scale + 1e-6


def assert_bits(got, expected, what=""):
    """Same dtype, shape and bits (1-byte types, float8 included, compared as raw bytes)."""
    expected = np.asarray(expected)
    assert got.dtype == expected.dtype, (what, got.dtype, expected.dtype)
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    g = got.view(np.uint8) if got.dtype.itemsize == 1 else got
    e = expected.view(np.uint8) if expected.dtype.itemsize == 1 else expected
    if not np.array_equal(g, e):
        bad = np.argwhere(g != e)[:6]
        raise AssertionError(f"{what}: {int((g != e).sum())} of {g.size} differ, first at {bad.tolist()}: "
                             f"got {[got[tuple(i)] for i in bad]}, expected {[expected[tuple(i)] for i in bad]}")


def bits(a: np.ndarray) -> np.ndarray:
    """Bytes of an array with every float NaN mapped to one pattern."""
    a = np.ascontiguousarray(a)
    if a.dtype.kind == "f":
        a = np.where(np.isnan(a), np.array(np.nan, a.dtype), a)
    return a.reshape(-1).view(np.uint8)


def assert_same_bits(got, expected, what=""):
    """Same dtype, shape and bytes, every float NaN counting as one pattern (payloads not compared)."""
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype, (what, got.dtype, expected.dtype)
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    if not np.array_equal(bits(got), bits(expected)):
        bad = np.nonzero(bits(got) != bits(expected))[0]
        raise AssertionError(f"{what}: {len(bad)} bytes differ, e.g. got {got.reshape(-1)[:8]} expected "
                             f"{expected.reshape(-1)[:8]}")


def assert_within_sum_bound(got, exact, magnitude, n_terms, what="", slack: float = 1.0) -> None:
    """|got - exact| <= slack (n + 2) 2^-24 sum |terms| (+ the smallest subnormal): a float32 sum of
    ``n_terms`` rounded terms in any order against ``exact`` (float64), ``magnitude`` the sum of the
    terms' magnitudes."""
    bound = slack * (n_terms + 2) * 2.0 ** -24 * np.asarray(magnitude, np.float64) + 1e-45
    err = np.abs(np.asarray(got).astype(np.float64) - exact)
    assert np.shape(got) == np.shape(exact), (what, np.shape(got), np.shape(exact))
    assert np.all(err <= bound), f"{what}: max error {err.max()} exceeds the bound (worst ratio {(err / bound).max()})"


def assert_matches_ort(got: np.ndarray, ort_out: np.ndarray, what: str) -> None:
    """A QLinear kernel's output against onnxruntime's: bit for bit where onnxruntime runs the
    AVX2 / FMA3 kernels the numpy models reproduce, else within one quantization step."""
    if ORT_FMA3:
        assert_same_bits(got, ort_out, what + " vs onnxruntime")
    else:  # other MLAS kernels: documented to differ by at most one step
        assert np.abs(got.astype(np.int32) - ort_out.astype(np.int32)).max(initial=0) <= 1, what


# ----------------------------------------------------------------------------- numpy models of onnxruntime's kernels

def qrange(dtype):
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def model_qglobal(x, xs, xz, ys, yz, dtype, channels_last=False):
    """MlasQLinearGlobalAveragePool: integer sum - zp n, MlasRequantizeOutput with xs / (ys n)."""
    lo, hi = qrange(dtype)
    axes = tuple(range(1, x.ndim - 1)) if channels_last else tuple(range(2, x.ndim))
    n = int(np.prod([x.shape[a] for a in axes]))
    acc = x.astype(np.int64).sum(axis=axes, keepdims=True) - int(xz) * n
    scale = f32(f32(xs) / f32(f32(ys) * f32(n)))
    v = (acc.astype(f32) * scale).astype(f32)
    v = np.clip(v, f32(lo - int(yz)), f32(hi - int(yz)))
    return (np.rint(v).astype(np.int32) + int(yz)).astype(dtype)


def np_softmax_table(x_scale, D: int) -> np.ndarray:
    """onnxruntime's table by d = x - max + 255 (float64 arithmetic, logf in float32)."""
    L = float(f32(math.log(float(f32(f32(FLT_MAX) / f32(D))))))
    bs = max(0.0, L - 5.0) / float(f32(x_scale))
    with np.errstate(under="ignore"):
        return np.exp((np.arange(256, dtype=np.float64) - 255 + bs) * float(f32(x_scale))).astype(f32)


def np_qlinear_softmax(x, x_scale, y_scale, y_zp, axis=-1, opset=13):
    """onnxruntime's QLinearSoftmax (com.microsoft): the table, float32 row sums in row order."""
    x = np.asarray(x)
    rank = x.ndim
    ax = (axis if axis is not None else -1) % rank  # onnxruntime: -1 whatever the opset
    if opset < 13:
        rows = x.reshape(int(np.prod(x.shape[:ax])), -1)
        perm = None
    else:
        perm = list(range(rank))
        perm[ax], perm[-1] = perm[-1], perm[ax]
        rows = x.transpose(perm).reshape(-1, x.shape[ax])
    D = rows.shape[1]
    T = np_softmax_table(x_scale, D)
    ys = f32(np.floor(f32(1.0) / f32(y_scale)))
    info = np.iinfo(x.dtype)
    out = np.empty_like(rows)
    for r in range(rows.shape[0]):
        v = rows[r].astype(np.int64)
        t = T[v - v.max() + 255]
        s = np.cumsum(t, dtype=f32)[-1]  # float32, in row order
        inv = f32(f32(1.0) / s)
        q = ((t * inv).astype(f32) * ys).astype(f32).astype(np.float64)
        out[r] = np.clip(np.rint(q) + int(y_zp), info.min, info.max).astype(x.dtype)
    if opset < 13:
        return out.reshape(x.shape)
    return out.reshape([x.shape[p] for p in perm]).transpose(perm)

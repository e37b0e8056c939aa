"""Plan-time tables of the signal kernels (DFT, STFT): the twiddle factors of a transform length,
computed in float64 and rounded once to float32, as the expression function ``dftTwiddles(n)``
gives them to a spec's plan-time data (``intermediates``' ``data``), so that a new length writes a
new table and compiles nothing (docs/kernel-spec.md, "Intermediates").

Why a table and not the shader's cos/sin: WGSL bounds their error only absolutely (2^-11 on
[-pi, pi]), far from what onnx.reference's FFT gives; the table is exact to float32 rounding, and
the values symmetry makes exact (0, +-1 at the quarter turns) are exact."""

from __future__ import annotations

import numpy as np

#: the longest transform a table is made for (2 words per entry: 512 KiB)
MAX_DFT_LENGTH = 65536


def dft_twiddles(n: int) -> tuple[int, ...]:
    """``[cos(2 pi m / n), sin(2 pi m / n)]`` for m in [0, n), as float32 bits interleaved
    (2n words); ``()`` for n outside [1, MAX_DFT_LENGTH]."""
    if not 1 <= n <= MAX_DFT_LENGTH:
        return ()
    m = np.arange(n, dtype=np.int64)
    # reduce to the first half turn by symmetry so that m and n - m give the same magnitude
    angle = 2.0 * np.pi * m.astype(np.float64) / n
    cos, sin = np.cos(angle), np.sin(angle)
    quarter = (4 * m) % n == 0  # 0, a quarter, a half, three quarters of a turn: exact values
    q = np.where(quarter, (4 * m) // n, 0)
    cos = np.where(quarter, np.choose(q % 4, [1.0, 0.0, -1.0, 0.0]), cos)
    sin = np.where(quarter, np.choose(q % 4, [0.0, 1.0, 0.0, -1.0]), sin)
    words = np.empty(2 * n, np.float32)
    words[0::2], words[1::2] = cos, sin
    return tuple(int(w) for w in words.view(np.uint32))


def mel_bin_edges(num_mel_bins: int, dft_length: int, sample_rate: int, lower: float, upper: float,
                  edge_type: str, int_type: str) -> tuple[tuple[int, ...], bool, int]:
    """MelWeightMatrix's triangle edges: ``(edges, ok, widest)``. The ``num_mel_bins + 2`` spectrogram
    bins are computed as onnx.reference does, in its types (the edge frequencies held in
    ``edge_type``, the counts in ``int_type``, numpy's promotions between them), so that its floor
    division lands on the same bin; ``ok`` is False where the reference would index outside the
    ``dft_length // 2 + 1`` rows (or wrap a negative index); ``widest`` is the largest triangle side.
    The edges come clamped at 0 (table words): where ``ok`` holds, a negative one is a right edge
    left of its center, which writes nothing either way."""
    from onnx_quant.dtypes import BY_NAME  # noqa: PLC0415

    ints = BY_NAME[int_type].dtype
    mel, dft, rate = (np.asarray(v, ints) for v in (num_mel_bins, dft_length, sample_rate))
    lo, hi = (np.asarray(v, BY_NAME[edge_type].dtype) for v in (lower, upper))
    if mel < 1 or rate == 0:
        return (), False, 0
    with np.errstate(all="ignore"):
        bins = np.arange(0, mel + 2)
        low_mel = 2595 * np.log1p(lo / 700) / np.log(10)
        high_mel = 2595 * np.log1p(hi / 700) / np.log(10)
        step = (high_mel - low_mel) / bins.shape[0]
        freq = 700 * np.expm1((bins * step + low_mel) / 2595 * np.log(10))
        freq = ((dft + 1) * freq) // rate
    if not np.all(np.isfinite(freq)):
        return (), False, 0
    edges = tuple(int(v) for v in freq.astype(int))
    rows = int(dft) // 2 + 1
    ok, widest = True, 0
    for i in range(int(mel)):
        a, c, b = edges[i:i + 3]
        written = ([c] if c == a else list(range(a, c + 1))) + (list(range(c, b)) if b > c else [])
        ok &= all(0 <= j < rows for j in written)
        widest = max(widest, abs(c - a), b - c)
    return tuple(max(e, 0) for e in edges), ok, widest

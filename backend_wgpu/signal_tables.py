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

"""Wall-clock medians for the benchmarks and ``onnx-quant bench``: one helper, so every
figure beside its anchor is timed the same way."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def median_seconds(fn: Callable[[], Any], repeat: int, *, warm_up: bool = False) -> float:
    """Median wall time of ``max(1, repeat)`` calls of ``fn`` (after one untimed call when
    ``warm_up``)."""
    if warm_up:
        fn()
    times = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)

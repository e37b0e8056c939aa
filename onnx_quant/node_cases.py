"""ONNX's own node test cases (``onnx.backend.test.case.node.collect_testcases``), collected
once per process: the call imports ~200 case modules and warns as it builds them. Callers
filter the list by the op types of each case's nodes."""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np


@functools.lru_cache(maxsize=1)
def all_node_cases() -> tuple[Any, ...]:
    """Every node test case of the installed onnx, in onnx's order."""
    from onnx.backend.test.case.node import collect_testcases  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            return tuple(collect_testcases())

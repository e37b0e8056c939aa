"""One memory budget for host work and uploads.

Every host allocation whose size follows from the model (a host node's outputs, folded
constants, initializers, external data, random feeds, the model file itself) is checked
against the budget *before* it is made, from the sizes shape inference gives, so a model
that asks for 4 TiB is refused in microseconds with a line naming the node or tensor, the
bytes needed and the budget, instead of exhausting the machine.

The default is half of the memory available when the budget is first read (``MemAvailable``
in /proc/meminfo, else physical memory), at least 256 MiB. ``ONNX_QUANT_MEMORY_BUDGET``
(bytes, or with a K/M/G/T suffix, powers of 1024) or ``Session(..., memory_budget=)``
changes it. docs/security.md describes what is checked.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Iterable

from onnx_quant.errors import BudgetError

ENV = "ONNX_QUANT_MEMORY_BUDGET"
MIN_DEFAULT = 256 * 2**20
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def available_memory() -> int:
    """Bytes of memory available to this process now (MemAvailable, else physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return 8 * 2**30


def parse_size(text: str, what: str = ENV) -> int:
    """``"512M"`` -> 536870912; a plain number is bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise BudgetError(f"{what}: expected a byte count like 4096, 512M or 8G, found {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def default_limit() -> int:
    env = os.environ.get(ENV, "").strip()
    if env:
        return parse_size(env)
    return max(MIN_DEFAULT, available_memory() // 2)


@dataclass(frozen=True)
class MemoryBudget:
    """The most bytes one host allocation (or one group checked together) may take."""

    limit: int

    def check(self, nbytes: int, what: str) -> None:
        """``BudgetError`` naming ``what`` when ``nbytes`` is beyond the budget."""
        if nbytes > self.limit:
            raise BudgetError(f"{what}: needs {nbytes} bytes ({_human(nbytes)}), beyond the memory budget of "
                              f"{self.limit} bytes ({_human(self.limit)}; set {ENV} or memory_budget= to change it)")

    def check_array(self, shape: Iterable[int], itemsize_bits: int, what: str) -> int:
        """Check an array of ``shape`` (ints; a negative dim is refused) with elements of
        ``itemsize_bits``; returns the bytes it needs."""
        dims = [int(d) for d in shape]
        bad = [d for d in dims if d < 0]
        if bad:
            raise BudgetError(f"{what}: shape {dims}: expected dims >= 0, found {bad[0]}")
        nbytes = -(-math.prod(dims) * int(itemsize_bits) // 8)
        self.check(nbytes, f"{what} (shape {dims})")
        return nbytes


def resolve(budget: "MemoryBudget | int | str | None" = None) -> MemoryBudget:
    """A MemoryBudget from an argument (bytes or a size text) or, for None, the default."""
    if isinstance(budget, MemoryBudget):
        return budget
    if budget is None:
        return MemoryBudget(default_limit())
    if isinstance(budget, bool) or not isinstance(budget, (int, str)):
        raise BudgetError(f"memory_budget: expected bytes (int) or a size like '2G', found {type(budget).__name__}")
    limit = parse_size(budget, "memory_budget") if isinstance(budget, str) else int(budget)
    if limit <= 0:
        raise BudgetError(f"memory_budget: expected a positive byte count, found {limit}")
    return MemoryBudget(limit)


def _human(n: int) -> str:
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        scale = _UNITS[unit[0]]
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"

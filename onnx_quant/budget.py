"""One memory budget for host work and uploads.

Every host allocation whose size follows from the model (a host node's outputs, folded
constants, initializers, external data, random feeds, the model file itself) is checked
against the budget *before* it is made, from the sizes shape inference gives, so a model
that asks for 4 TiB is refused in microseconds with a line naming the node or tensor, the
bytes needed and the budget, instead of exhausting the machine.

The default is half of the memory available when the budget is first read (``MemAvailable``
in /proc/meminfo, else physical memory; less where the cgroup's limit or the process's
address-space rlimit leaves less), at least 256 MiB. ``ONNX_QUANT_MEMORY_BUDGET``
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
    """Bytes of memory this process can still take: the least of what the machine has available
    (MemAvailable, else physical memory), what the cgroup it runs in still allows (v2
    memory.max, v1 memory.limit_in_bytes, less the usage) and what its address-space / data
    rlimits leave above its current size (``ulimit -v``: numpy raises MemoryError there however
    much the machine has)."""
    found = [_meminfo_available()]
    found += [n for n in (_cgroup_headroom(), _rlimit_headroom()) if n is not None]
    return max(0, min(found))


def _meminfo_available() -> int:
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


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_headroom() -> int | None:
    """The cgroup's memory limit less its usage (None without a limit)."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit = _read_int(limit_file)
        if limit is not None and limit < 2**60:  # v1 writes "no limit" as a page-rounded 2^63
            return limit - (_read_int(usage_file) or 0)
    return None


def _rlimit_headroom() -> int | None:
    """RLIMIT_AS / RLIMIT_DATA less the process's current virtual / data size (None: unlimited)."""
    try:
        import resource  # noqa: PLC0415 - POSIX only
    except ImportError:  # pragma: no cover - Windows
        return None
    sizes = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmSize", "VmData"):
                    sizes[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    room = []
    for which, key in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")):
        soft = resource.getrlimit(which)[0]
        if soft != resource.RLIM_INFINITY:
            room.append(soft - sizes.get(key, 0))
    return min(room) if room else None


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

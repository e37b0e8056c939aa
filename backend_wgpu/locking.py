"""Thread safety: which lock guards what.

A ``Session`` serializes its public calls (``run``, ``plans``, ``explain``, ``summary``,
``close``) on one per-session ``RLock``: a run writes the plan's pooled buffers, the staging
buffer and the session's host evaluators, so two runs of one session must not overlap.
A ``GpuDevice`` is shared by every session of a process (``get_device``), and with it one queue
and one pipeline cache: its queue work (upload, submit and the staging map/unmap that follows,
read-back) and its caches (compile, allocate, bind: their counters too) hold a per-device
``RLock``, so sessions on one device interleave whole submits, never half of one.
Serializing (instead of per-run staging and scratch) costs no memory and keeps the counters
exact; GPU work of one device is queued in order anyway. docs/security.md says the same.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def holding(lock_attr: str) -> Callable[[F], F]:
    """Decorate a method so that it runs holding ``getattr(self, lock_attr)`` (an RLock)."""

    def deco(method: F) -> F:
        @functools.wraps(method)
        def locked(self, *args: Any, **kwargs: Any) -> Any:
            with getattr(self, lock_attr):
                return method(self, *args, **kwargs)

        return locked  # type: ignore[return-value]

    return deco

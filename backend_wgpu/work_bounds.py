"""How much GPU work one node may dispatch.

Per-dimension limits alone admit 65535 x 65535 x 65535 workgroups; a spec (or a spec file a
user wrote) whose dispatch expression is off by a square would queue hours of work for a
tiny tensor and never return. A pass may launch at most ``INVOCATIONS_PER_ELEMENT``
invocations per element of the node's largest tensor, plus ``INVOCATION_FLOOR`` (room for
fixed-size reductions and one-workgroup-per-row kernels over small tensors).
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from onnx_quant.errors import ExecutionError

INVOCATIONS_PER_ELEMENT = 256
INVOCATION_FLOOR = 2**20


class DispatchBoundError(ExecutionError):
    """A pass dispatches far more invocations than its node's tensors can need."""


def check_invocations(where: str, dispatch: Sequence[int], workgroup_size: int,
                      tensor_elements: Iterable[int]) -> None:
    largest = max(tensor_elements, default=1)
    allowed = INVOCATIONS_PER_ELEMENT * max(1, largest) + INVOCATION_FLOOR
    invocations = math.prod(int(d) for d in dispatch) * max(1, int(workgroup_size))
    if invocations > allowed:
        raise DispatchBoundError(
            f"{where}: dispatch {list(dispatch)} x workgroup size {workgroup_size} = {invocations} invocations: "
            f"expected at most {allowed} ({INVOCATIONS_PER_ELEMENT} per element of the largest tensor, "
            f"{largest} elements, + {INVOCATION_FLOOR})")

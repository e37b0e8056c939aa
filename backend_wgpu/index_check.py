"""Device-side checks of runtime indices: one error buffer, one node id, one read-back.

A kernel whose spec lists inputs in ``indexChecks`` (Gather, GatherElements, GatherND, the
Scatter family, RotaryEmbedding's position ids, the loss kernels' labels) checks every index it
reads from them against the range ONNX allows. Each pass that binds such an input gets two
bindings more (the planner adds them, :func:`pass_bindings`):

* ``oq_errors``: ``array<atomic<u32>, 8>``, ONE storage buffer per run shared by every checked
  pass (``BufferPlan`` role ``"errors"``): word 0 is the flag, words 1-5 the first fault
  (node id, input ordinal, the index's low and high words, the axis length, 1 where the range
  starts at 0: labels);
* ``oq_node``: a uniform ``{id: u32}`` holding the node's index (role ``"node_id"``): the graph
  compiler writes each step's own index into the plan's uniform buffer, so one pipeline serves
  every node.

The shader helper (``templates/snippets/index_check.wgsl.jinja``: ``oq_index_fault``) takes the
flag with ``atomicOr`` and only the invocation that found it 0 writes the record: the first
fault of the first failing node in submit order wins. The executor copies the 32 bytes into
the staging buffer it already maps for the segment's outputs (no extra submit), and
:func:`fault` turns a raised flag into :class:`~onnx_quant.errors.IndexRangeError` naming the
node, the input and the index, after the buffer is zeroed again for the next run.
"""

from __future__ import annotations

import struct
from typing import Any, Callable

from onnx_quant.errors import IndexRangeError

from .plan import BindingPlan, BufferPlan

ERRORS_VAR = "oq_errors"
NODE_VAR = "oq_node"
#: the BufferPlan names (one per plan: the errors buffer is shared by the passes of a node)
ERRORS_BUFFER = "oq_errors"
#: the read-back layout's key for the error record (no value can be named so: a NUL leads it)
READBACK_KEY = "\0index errors"
ERROR_WORDS = 8
ERROR_BYTES = 4 * ERROR_WORDS
ZEROS = bytes(ERROR_BYTES)


def node_buffer(pass_id: str) -> str:
    return f"{pass_id}.{NODE_VAR}"


def pass_bindings(pass_id: str, first_index: int, buffers: dict[str, BufferPlan]) -> list[BindingPlan]:
    """The two bindings a checking pass gets after its own (``first_index`` on), their buffers
    added to ``buffers``."""
    buffers[ERRORS_BUFFER] = BufferPlan(ERRORS_BUFFER, "errors", ERROR_BYTES, "uint32", (ERROR_WORDS,))
    nb = node_buffer(pass_id)
    buffers[nb] = BufferPlan(nb, "node_id", 16, None, None, node_id_data(0))
    return [BindingPlan(first_index, ERRORS_VAR, ERRORS_BUFFER, "read_write", "atomic<u32>", ERROR_WORDS),
            BindingPlan(first_index + 1, NODE_VAR, nb, "uniform", "OqNode", None, (("id", "u32"),))]


def node_id_data(index: int) -> bytes:
    """The ``oq_node`` uniform's bytes for the node of index ``index``."""
    return struct.pack("<I", index % 2**32) + bytes(12)


def checks(plan: Any) -> bool:
    """Whether a kernel plan checks indices (it has the errors buffer)."""
    return ERRORS_BUFFER in plan.buffers


def fault(raw: bytes | memoryview, describe: Callable[[int, int], tuple[str, str]]) -> IndexRangeError | None:
    """The error of a read-back error record, None when no kernel flagged one. ``describe(node
    id, input ordinal)`` gives (the node's label with its op, the input's name)."""
    words = struct.unpack("<8I", bytes(raw[:ERROR_BYTES]))
    if not words[0]:
        return None
    node_id, ordinal, lo, hi, bound, from_zero = words[1:7]
    index = lo | (hi << 32)
    if index >= 2**63:
        index -= 2**64
    where, name = describe(node_id, ordinal)
    return IndexRangeError(f"{where}: input {name}: index {index} is out of range [{0 if from_zero else -bound}, {bound}) "
                           f"(found on the device; ONNX makes it an error)", node=where, input=name,
                           index=index, bound=bound)


def input_name(plan: Any, ordinal: int) -> str:
    """The spec input checked with ``ordinal`` (1-based) in one of the plan's passes."""
    for p in plan.passes:
        names = p.context.get("index_checks") or ()
        if 0 < ordinal <= len(names):
            return str(names[ordinal - 1])
    return f"#{ordinal}"

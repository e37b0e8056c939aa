"""Device-side checks of runtime indices: one error buffer, one node id, one read-back.

A kernel whose spec lists inputs in ``indexChecks`` (Gather, GatherElements, GatherND, the
Scatter family, RotaryEmbedding's position ids, the loss kernels' labels) gets one *check pass*
ahead of its own passes, in the same submit (:func:`check_pass`,
``templates/index-check.wgsl.jinja``): one invocation per index element, each against the
bound the spec's expression gives for its column (GatherND's and ScatterND's index rows address
several axes), in [-b, b) or [0, b) (labels), an ``ignore`` value aside. The kernel's own passes
stay as they were (an index outside reads nothing: zero bits, a skipped update): on lavapipe a
check inside Gather's per-element code cost it 30-60%, a pass of its own one dispatch. It binds
the checked inputs and:

* ``oq_errors``: ``array<atomic<u32>, 8>``, ONE storage buffer per run shared by every check
  pass (``BufferPlan`` role ``"errors"``): word 0 is the flag, words 1-6 the first fault
  (node id, input ordinal, the index's low and high words, the bound, 1 where the range
  starts at 0);
* ``oq_node``: a uniform ``{id: u32}`` holding the node's index (role ``"node_id"``): the graph
  compiler writes each step's own index into the plan's uniform buffer, so one pipeline serves
  every node;
* ``oq_checks``: a uniform of the element counts and bounds (runtime values: nodes of other sizes
  share the pipeline).

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

from .plan import BindingPlan, BufferPlan, PassPlan

ERRORS_VAR = "oq_errors"
NODE_VAR = "oq_node"
CHECKS_VAR = "oq_checks"
#: the BufferPlan names (one per plan: the errors buffer is shared by the passes of a node)
ERRORS_BUFFER = "oq_errors"
#: the read-back layout's key for the error record (no value can be named so: a NUL leads it)
READBACK_KEY = "\0index errors"
ERROR_WORDS = 8
ERROR_BYTES = 4 * ERROR_WORDS
ZEROS = bytes(ERROR_BYTES)


def node_buffer(pass_id: str) -> str:
    return f"{pass_id}.{NODE_VAR}"


def check_bindings(pass_id: str, first_index: int, checks: list[tuple[Any, int, str, str, int, Any, Any]],
                   buffers: dict[str, BufferPlan]) -> tuple[list[BindingPlan], list[dict[str, Any]]] | None:
    """What a pass that reads the checked inputs gets (``checks``: per input, (the ``IndexCheck``,
    its 1-based ordinal, its WGSL variable, dtype, element count, bounds, ignore)): the error
    buffer, the node's id and a uniform ``oq_checks`` of the counts and bounds (runtime values,
    so nodes of other sizes share the pipeline), from binding ``first_index`` on, their buffers
    added to ``buffers``; and the context entries ``snippets/index_check.wgsl.jinja`` renders the
    checks from. None when there is nothing to check (no element, no bounds: the kernel declines)."""
    members: list[tuple[str, str, Any]] = []
    entries = []
    for check, ordinal, var, dtype, count, bounds, ignore in checks:
        bounds = list(bounds) if isinstance(bounds, (list, tuple)) else []
        if not count or not bounds or not all(isinstance(b, int) and 0 <= b < 2**32 for b in bounds):
            continue
        k = len(entries)
        members += [(f"count{k}", "u32", count)] + [(f"bound{k}_{j}", "u32", b) for j, b in enumerate(bounds)]
        # the template reads them as WGSL expressions: the values stay out of the pipeline key
        entries.append({"input": check.input, "var": var, "dtype": dtype, "ordinal": ordinal,
                        "n_bounds": len(bounds), "from_zero": bool(check.from_zero), "ignore": ignore,
                        "count": f"{CHECKS_VAR}.count{k}", "bounds": [f"{CHECKS_VAR}.bound{k}_{j}" for j in range(len(bounds))]})
    if not entries:
        return None
    data = struct.pack(f"<{len(members)}I", *(v for _, _, v in members))
    data += bytes(-len(data) % 16)
    nb, cb = node_buffer(pass_id), f"{pass_id}.{CHECKS_VAR}"
    buffers[ERRORS_BUFFER] = BufferPlan(ERRORS_BUFFER, "errors", ERROR_BYTES, "uint32", (ERROR_WORDS,))
    buffers[nb] = BufferPlan(nb, "node_id", 16, None, None, node_id_data(0))
    buffers[cb] = BufferPlan(cb, "uniform", len(data), None, None, data)
    bindings = [BindingPlan(first_index, ERRORS_VAR, ERRORS_BUFFER, "read_write", "atomic<u32>", ERROR_WORDS),
                BindingPlan(first_index + 1, NODE_VAR, nb, "uniform", "OqNode", None, (("id", "u32"),)),
                BindingPlan(first_index + 2, CHECKS_VAR, cb, "uniform", "OqChecks", None,
                            tuple((m, t) for m, t, _ in members))]
    return bindings, entries


#: the check pass's workgroup size
WORKGROUP = 64


def check_pass(kernel: str, variant: str, checks: list[tuple[Any, int, str, str, int, Any, Any]],
               buffers: dict[str, BufferPlan]) -> PassPlan | None:
    """The kernel's check pass over its checked inputs (``checks``: see :func:`check_bindings`;
    each input bound read-only by its own name), or None when there is nothing to check."""
    inputs = [BindingPlan(i, var, c.input, "read", "u32") for i, (c, _, var, *_rest) in enumerate(checks)]
    found = check_bindings("check", len(inputs), checks, buffers)
    if found is None:
        return None
    bindings, entries = found
    groups = -(-max(c[4] for c in checks) // WORKGROUP)
    context = {"kernel": kernel, "variant": variant, "pass_id": "check", "index_checks": entries,
               "workgroup_size": WORKGROUP}
    return PassPlan("check", "index checks", "index-check.wgsl.jinja", context, tuple(inputs + bindings),
                    (min(groups, 65535), -(-groups // 65535), 1))


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
    """The spec input checked with ``ordinal`` (1-based) by the plan's check passes."""
    for p in plan.passes:
        for entry in p.context.get("index_checks") or ():
            if entry["ordinal"] == ordinal:
                return str(entry["input"])
    return f"#{ordinal}"

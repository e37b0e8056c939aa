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

*Loop checks* (a spec's ``loopChecks``: RoiAlign's adaptive sampling grid, decided by the rois'
values) share the record: :func:`loop_checks` gives the kernel's own passes that read the input
the error buffer and the node's id (:func:`error_bindings`) and their template ``loop_checks``;
the kernel counts an element's loop steps and past the bound calls ``oq_loop_fault`` (the row,
its grid, the steps, the bound) and skips the loop; :func:`fault` turns that record into
:class:`~onnx_quant.errors.LoopLimitError`.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Callable, Mapping

from onnx_quant.errors import ExpressionError, IndexRangeError, LoopLimitError

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


def index_checks(spec: Any, io_types: Mapping[str, str], present: Mapping[str, bool], shapes: Mapping[str, Any],
                 value: Callable[[Any, str], Any]) -> list[tuple]:
    """The spec's present ``indexChecks`` inputs, as :func:`check_pass` takes them: (check, ordinal,
    variable, dtype, element count, bounds, ignore); ``value(expression, field)`` evaluates."""
    out = []
    for k, c in enumerate(spec.index_checks):
        if present.get(c.input):
            f = f"indexChecks.{c.input}"
            out.append((c, k + 1, c.input, io_types[c.input], math.prod(shapes[c.input]), value(c.bounds, f"{f}.bounds"),
                        None if c.ignore is None else value(c.ignore, f"{f}.ignore")))
    return out


def loop_checks(spec: Any, present: Mapping[str, bool], value: Callable[[Any, str], Any]) -> list[dict[str, Any]]:
    """The spec's present ``loopChecks`` inputs whose ``when`` holds, as a kernel pass's template
    reads them (``loop_checks``): input, ordinal (numbered after the ``indexChecks``), bound (an
    output element's loop steps), item (a row's noun in the error) and kind ``"loop"`` (:func:`fault`)."""
    out = []
    for k, c in enumerate(spec.loop_checks):
        f = f"loopChecks.{c.input}"
        if not present.get(c.input) or (c.when is not None and not value(c.when, f"{f}.when")):
            continue
        bound = value(c.bound, f"{f}.bound")
        if not isinstance(bound, int) or isinstance(bound, bool) or not 0 <= bound < 2**32:
            raise ExpressionError(f"{spec.name}: {f}: must be an int in [0, 2^32), found {bound!r}")
        out.append({"input": c.input, "ordinal": len(spec.index_checks) + k + 1, "bound": bound, "item": c.item,
                    "kind": "loop"})
    return out


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
    cb = f"{pass_id}.{CHECKS_VAR}"
    buffers[cb] = BufferPlan(cb, "uniform", len(data), None, None, data)
    bindings = error_bindings(pass_id, first_index, buffers) + [
        BindingPlan(first_index + 2, CHECKS_VAR, cb, "uniform", "OqChecks", None, tuple((m, t) for m, t, _ in members))]
    return bindings, entries


def error_bindings(pass_id: str, first_index: int, buffers: dict[str, BufferPlan]) -> list[BindingPlan]:
    """The error buffer and the node's id, bound at ``first_index`` and the next, their buffers
    added to ``buffers``: what a pass that flags a fault binds (the check pass; a kernel pass with
    ``loop_checks``)."""
    nb = node_buffer(pass_id)
    buffers[ERRORS_BUFFER] = BufferPlan(ERRORS_BUFFER, "errors", ERROR_BYTES, "uint32", (ERROR_WORDS,))
    buffers[nb] = BufferPlan(nb, "node_id", 16, None, None, node_id_data(0))
    return [BindingPlan(first_index, ERRORS_VAR, ERRORS_BUFFER, "read_write", "atomic<u32>", ERROR_WORDS),
            BindingPlan(first_index + 1, NODE_VAR, nb, "uniform", "OqNode", None, (("id", "u32"),))]


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


def fault(raw: bytes | memoryview, describe: Callable[[int, int], tuple[str, str, dict | None]]
          ) -> IndexRangeError | LoopLimitError | None:
    """The error of a read-back error record, None when no kernel flagged one. ``describe(node
    id, input ordinal)`` gives (the node's label with its op, the input's name, its check's
    context entry: :func:`check_entry`): a ``loop_checks`` entry's record is a LoopLimitError."""
    words = struct.unpack("<8I", bytes(raw[:ERROR_BYTES]))
    if not words[0]:
        return None
    node_id, ordinal = words[1:3]
    where, name, entry = describe(node_id, ordinal)
    if entry is not None and entry.get("kind") == "loop":
        index, grid_h, grid_w, steps, bound = words[3:8]
        count = f"{steps}" if steps < 2**32 - 1 else f"{steps} or more"  # the shader saturates it
        return LoopLimitError(f"{where}: input {name}: {entry['item']} {index} gives each output element a {grid_h} x "
                              f"{grid_w} loop grid ({count} loop steps), more than the {bound} an output element may "
                              f"take (MAX_LOOP_ITERATIONS: llvmpipe stops a shader invocation after 65535 loop "
                              f"iterations; found on the device, no output returned)", node=where, input=name,
                              index=index, grid=(grid_h, grid_w), steps=steps, bound=bound)
    lo, hi, bound, from_zero = words[3:7]
    index = lo | (hi << 32)
    if index >= 2**63:
        index -= 2**64
    return IndexRangeError(f"{where}: input {name}: index {index} is out of range [{0 if from_zero else -bound}, {bound}) "
                           f"(found on the device; ONNX makes it an error)", node=where, input=name,
                           index=index, bound=bound)


def check_entry(plan: Any, ordinal: int) -> dict | None:
    """The context entry of the plan's check (``index_checks`` of its check pass, ``loop_checks``
    of a kernel pass) of 1-based ``ordinal``, None when there is none."""
    for p in plan.passes:
        for entry in (*(p.context.get("index_checks") or ()), *(p.context.get("loop_checks") or ())):
            if entry["ordinal"] == ordinal:
                return entry
    return None


def input_name(plan: Any, ordinal: int) -> str:
    """The spec input checked with ``ordinal`` (1-based) by the plan's passes."""
    entry = check_entry(plan, ordinal)
    return f"#{ordinal}" if entry is None else str(entry["input"])

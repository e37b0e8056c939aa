"""``If``, ``Loop`` and ``Scan``: the pass infers their bodies itself.

A body is walked like the main graph, in a scope that reads the enclosing graphs' values
(outer-scope references) and keeps its own values local; every body value gets
``value_info`` in ``infer_shapes``' output. What each operator's outputs become
(ONNX's ``If``/``Loop``/``Scan`` specifications):

- ``If``: both branches are inferred; with a constant condition the taken branch's types are
  the outputs; otherwise the two branches' types are merged per output: equal dims stay,
  dims that differ become a fresh symbol named after the output (``y_dim1``), so does a dim
  unknown in either branch, a rank that differs makes the rank unknown.
- ``Loop``: the body sees ``iteration_num`` (int64 scalar), ``cond`` (bool scalar) and the
  loop-carried values. A carried value's type is the merge (as for ``If``) of its initial
  type and the body's output for it, found by re-inferring the body until the merge is
  stable; that is also the final output. Scan outputs get a leading iteration dim: the trip
  count ``M`` when it is a constant (or a symbolic dim carried as a value) and the loop
  cannot stop early (no ``cond`` input, or ``cond`` and the body's condition output both
  constant true); else a fresh symbol ``<node>_iterations``.
- ``Scan`` (opset 9+): the body sees the state values and one slice of each scan input
  (the scan axis removed); states merge as for ``Loop``; scan output ``k`` gets the
  sequence length (the scan inputs' dim along their axis) inserted at
  ``scan_output_axes[k]``.

Problems are reported with rule ids ``control-flow.*`` naming the node. ``Scan`` of opset 8
(batched) is left to onnx's per-node inference.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from onnx_quant.dtypes import type_name

from .context import TensorInfo, info_text, merge_info
from .dims import Dim, named_symbol
from .protocol import InferencePass
from .registry import NodeContext
from .scope import UNKNOWN, Graph, node_label

INT64, BOOL = TensorProto.INT64, TensorProto.BOOL
#: how many times a Loop/Scan body is re-inferred while the state types widen
MAX_ATTEMPTS = 4


def handles(op: str, since_version: int) -> bool:
    """Whether the engine infers this control-flow op itself (else onnx's inference does)."""
    return op != "Scan" or since_version >= 9


# ------------------------------------------------------------------ type merging
def union(a: TensorInfo, b: TensorInfo, base: str) -> TensorInfo:
    """The type of a value that is either ``a`` or ``b``: equal dims stay, different dims
    become the fresh symbol ``<base>_dim<i>``, and so does a dim unknown in either (it is some
    size, as onnx's ``unk__`` symbols say; silero-vad's If on its sample rate needs it)."""
    elem_type = a.elem_type or b.elem_type
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return TensorInfo(elem_type, None)
    shape = []
    for i, (x, y) in enumerate(zip(a.shape, b.shape)):
        if x == y and x is not None:
            shape.append(x)
        else:
            shape.append(named_symbol(base, f"dim{i}"))
    value = a.value if (a.value is not None and a.value is b.value) else None
    return TensorInfo(elem_type, tuple(shape), value)


def _same(a, b) -> bool:
    if isinstance(a, onnx.TypeProto) or isinstance(b, onnx.TypeProto):
        return isinstance(a, onnx.TypeProto) and isinstance(b, onnx.TypeProto) and a == b
    return a.elem_type == b.elem_type and a.shape == b.shape


def _graph_attr(n: NodeContext, name: str) -> onnx.GraphProto | None:
    for a in n.node.attribute:
        if a.name == name and a.type == onnx.AttributeProto.GRAPH:
            return a.g
    return None


def _missing_body(p: InferencePass, n: NodeContext, name: str) -> bool:
    p.raise_or_record(n.error("control-flow.attribute", f"{n.node.op_type} needs a graph attribute {name!r}",
                              subject=f"attribute {name}", expected="a graph", found="nothing"))
    return False


def _seed(p: InferencePass, n: NodeContext, body: onnx.GraphProto, i: int, outer):
    """Body input ``i``'s type: the outer type merged with the body's declaration (a
    ``TypeProto`` for a sequence/optional/map value, ``None`` to keep the declaration)."""
    if isinstance(outer, onnx.TypeProto):
        return outer
    if i >= len(body.input):
        return outer
    if body.input[i].type.WhichOneof("value") not in (None, "tensor_type"):
        return None if not outer.elem_type else outer
    declared = p.from_type_proto(body.input[i].type)
    merged, conflict = merge_info(declared, outer)
    if conflict:
        p.raise_or_record(n.error(
            "control-flow.body-input",
            f"body input {body.input[i].name!r} is declared with another type than the value it receives ({conflict})",
            subject=f"body input {i}", expected=info_text(outer), found=info_text(declared)))
        return outer
    return merged


def _set(n: NodeContext, i: int, info: TensorInfo, other: onnx.TypeProto | None = None) -> None:
    name = n.output_name(i)
    if not name:
        return
    if other is not None:
        n.ctx.define_other(name, other)
        return
    n.ctx.set(name, info)


def _state(n: NodeContext, i: int):
    """Input ``i`` as a state's initial type: a TensorInfo, or the TypeProto of a sequence ..."""
    name = n.input_name(i)
    other = n.ctx.other_type(name) if name else None
    return other if other is not None else (n.input(i) or UNKNOWN)


def _set_state(n: NodeContext, i: int, state, outs, j: int) -> None:
    """Output ``i``, a state: its merged type, or for a sequence/optional/map value the type the
    body gives it (else its initial type)."""
    other = outs[j][1] if j < len(outs) else None
    if other is not None or isinstance(state, onnx.TypeProto):
        _set(n, i, UNKNOWN, other if other is not None else state)
    else:
        _set(n, i, state)


def _label(n: NodeContext) -> str:
    return node_label(n.node, n.index)


def _count(p: InferencePass, n: NodeContext, what: str, expected: int, found: int) -> None:
    p.raise_or_record(n.error("control-flow." + what.replace(" ", "-"),
                              f"the body's {what} do not match the node's", subject=what,
                              expected=expected, found=found))


def _scalar(info: TensorInfo | None):
    """The single entry of a constant (int, bool, Dim) or None."""
    if info is None:
        return None
    v = info.value
    if v is None or v.size != 1:
        return None
    x = v.reshape(-1)[0]
    if isinstance(x, (np.integer, np.bool_)):
        return x.item()
    return x if isinstance(x, (int, bool, Dim)) else None


# ------------------------------------------------------------------ If
def infer_if(p: InferencePass, g: Graph, n: NodeContext) -> bool:
    node = n.node
    cond = n.input(0)
    if cond is not None and cond.elem_type and cond.elem_type != BOOL:
        p.raise_or_record(n.error("control-flow.condition", "If's condition must be a bool tensor",
                                  subject="input cond", expected="bool", found=type_name(cond.elem_type)))
    taken = _scalar(cond)
    if isinstance(taken, Dim):
        taken = None
    split_key = (g.where, n.index)
    if taken is None:
        taken = p.forced.get(split_key)  # a case of inference.case_split
    branches = []
    for attr in ("then_branch", "else_branch"):
        body = _graph_attr(n, attr)
        if body is None:
            return _missing_body(p, n, attr)
        if len(body.input):
            _count(p, n, "inputs", 0, len(body.input))
        # with a constant condition the other branch never runs: typed, but its problems are not the model's
        quiet = taken is not None and bool(taken) != (attr == "then_branch")
        bg = p.infer_body(body, g, [], label=_label(n), attr=attr, step=(n.index, attr, 0), quiet=quiet)
        outs = p.body_outputs(bg)
        if len(outs) != len(node.output):
            p.raise_or_record(n.error("control-flow.outputs", f"{attr} has {len(outs)} outputs, the node {len(node.output)}",
                                      subject=attr, expected=len(node.output), found=len(outs)))
        branches.append(outs)
    then_outs, else_outs = branches
    for i, name in enumerate(node.output):
        if not name:
            continue
        t = then_outs[i] if i < len(then_outs) else (UNKNOWN, None)
        e = else_outs[i] if i < len(else_outs) else (UNKNOWN, None)
        if t[1] is not None or e[1] is not None:
            _set(n, i, UNKNOWN, t[1] if t[1] is not None else e[1])
            continue
        ti, ei = t[0], e[0]
        if taken is None and ti.elem_type and ei.elem_type and ti.elem_type != ei.elem_type:
                p.raise_or_record(n.error("control-flow.branch-types", f"output {name!r}: the branches give different element types",
                                      subject=f"output {i}", expected=type_name(ti.elem_type), found=type_name(ei.elem_type)))
        if taken is not None:
            _set(n, i, ti if taken else ei)
        else:
            if ti.shape is not None and ei.shape is not None and len(ti.shape) != len(ei.shape):
                p.note_rank_split(split_key)
            _set(n, i, union(ti, ei, name))
    return True


# ------------------------------------------------------------------ Loop and Scan states
def _iterate(p: InferencePass, g: Graph, n: NodeContext, body: onnx.GraphProto, fixed: list[TensorInfo],
             initial: list[TensorInfo], state_offset: int, extra: list[TensorInfo], names: list[str]):
    """Infer ``body`` with inputs ``fixed + states + extra`` until the state types are stable.

    Returns (body graph, final state types, body outputs)."""
    state = list(initial)
    mark = len(p.diagnostics)
    for attempt in range(MAX_ATTEMPTS):
        seeds = [_seed(p, n, body, i, info) for i, info in enumerate(fixed + state + extra)]
        bg = p.infer_body(body, g, seeds, label=_label(n), attr="body", step=(n.index, "body", 0))
        outs = p.body_outputs(bg)
        new = []
        for i, info in enumerate(state):
            j = state_offset + i
            out, other = outs[j] if j < len(outs) else (UNKNOWN, None)
            if isinstance(info, onnx.TypeProto) or other is not None:  # a sequence ...: the body sees the initial type
                new.append(info)
            else:
                new.append(union(info, out, names[i]))
        if all(_same(a, b) for a, b in zip(new, state)) or attempt == MAX_ATTEMPTS - 1:
            return bg, new, outs
        state = new
        del p.diagnostics[mark:]  # the next attempt reports again what still holds
    raise AssertionError("unreachable")


def infer_loop(p: InferencePass, g: Graph, n: NodeContext) -> bool:
    node = n.node
    body = _graph_attr(n, "body")
    if body is None:
        return _missing_body(p, n, "body")
    n_state = max(0, len(node.input) - 2)
    n_scan = len(node.output) - n_state
    if len(body.input) != 2 + n_state:
        _count(p, n, "inputs", 2 + n_state, len(body.input))
    if len(body.output) != 1 + n_state + max(n_scan, 0):
        _count(p, n, "outputs", 1 + n_state + max(n_scan, 0), len(body.output))
    initial = [_state(n, 2 + i) for i in range(n_state)]
    names = [n.output_name(i) or f"{node.name or 'loop'}_state{i}" for i in range(n_state)]
    fixed = [TensorInfo(INT64, ()), TensorInfo(BOOL, ())]
    bg, states, outs = _iterate(p, g, n, body, fixed, initial, 1, [], names)
    for i in range(n_state):
        _set_state(n, i, states[i], outs, 1 + i)
    if n_scan <= 0:
        return True
    trips = _trip_count(n, outs)
    for k in range(n_scan):
        j = 1 + n_state + k
        info, other = outs[j] if j < len(outs) else (UNKNOWN, None)
        if other is not None:
            _set(n, n_state + k, UNKNOWN, None)
            continue
        shape = None if info.shape is None else (trips,) + tuple(info.shape)
        _set(n, n_state + k, TensorInfo(info.elem_type, shape))
    return True


def _trip_count(n: NodeContext, outs) -> object:
    """The number of iterations when the loop cannot stop early, else a fresh symbol."""
    node = n.node
    m = _scalar(n.input(0)) if n.has_input(0) else None
    if isinstance(m, bool):
        m = None
    if m is not None:
        if not n.has_input(1):
            return m
        cond_in = _scalar(n.input(1))
        cond_out = _scalar(outs[0][0]) if outs else None
        if cond_in is True and cond_out is True:
            return m
    return named_symbol(node.name or next((o for o in node.output if o), "loop"), "iterations")


def _axis(p: InferencePass, n: NodeContext, axis: int, rank: int, what: str) -> int | None:
    if -rank <= axis < rank:
        return axis + rank if axis < 0 else axis
    p.raise_or_record(n.error("control-flow.axis", f"{what} is out of range", subject=what,
                              expected=f"[{-rank}, {rank - 1}]", found=axis))
    return None


def infer_scan(p: InferencePass, g: Graph, n: NodeContext) -> bool:
    node = n.node
    body = _graph_attr(n, "body")
    if body is None:
        return _missing_body(p, n, "body")
    m = n.attr("num_scan_inputs")
    if m is None or not 0 < m <= len(node.input):
        p.raise_or_record(n.error("control-flow.attribute", "num_scan_inputs must count the node's scan inputs",
                                  subject="attribute num_scan_inputs", expected=f"1..{len(node.input)}", found=m))
        return False
    n_state = len(node.input) - m
    n_scan_out = len(node.output) - n_state
    in_axes = list(n.attr("scan_input_axes", [0] * m))
    out_axes = list(n.attr("scan_output_axes", [0] * max(n_scan_out, 0)))
    if len(body.input) != n_state + m:
        _count(p, n, "inputs", n_state + m, len(body.input))
    if len(body.output) != len(node.output):
        _count(p, n, "outputs", len(node.output), len(body.output))
    slices, seq_len = [], None
    for j in range(m):
        x = n.input(n_state + j) or UNKNOWN
        axis = in_axes[j] if j < len(in_axes) else 0
        if x.shape is None:
            slices.append(TensorInfo(x.elem_type, None))
            continue
        a = _axis(p, n, axis, len(x.shape), f"scan_input_axes[{j}]")
        if a is None:
            return False
        if seq_len is None:
            seq_len = x.shape[a]
        slices.append(TensorInfo(x.elem_type, x.shape[:a] + x.shape[a + 1:]))
    initial = [_state(n, i) for i in range(n_state)]
    names = [n.output_name(i) or f"{node.name or 'scan'}_state{i}" for i in range(n_state)]
    bg, states, outs = _iterate(p, g, n, body, [], initial, 0, slices, names)
    for i in range(n_state):
        _set_state(n, i, states[i], outs, i)
    for k in range(max(n_scan_out, 0)):
        j = n_state + k
        info, other = outs[j] if j < len(outs) else (UNKNOWN, None)
        if other is not None or info.shape is None:
            _set(n, j, TensorInfo(info.elem_type, None) if other is None else UNKNOWN)
            continue
        axis = out_axes[k] if k < len(out_axes) else 0
        a = _axis(p, n, axis, len(info.shape) + 1, f"scan_output_axes[{k}]")
        if a is None:
            _set(n, j, TensorInfo(info.elem_type, None))
            continue
        shape = tuple(info.shape[:a]) + (seq_len,) + tuple(info.shape[a:])
        _set(n, j, TensorInfo(info.elem_type, shape))
    return True


HANDLERS = {"If": infer_if, "Loop": infer_loop, "Scan": infer_scan}

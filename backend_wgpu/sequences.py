"""Sequences and optionals on the GPU: a sequence is a Python list of device values, an optional
a device value or None. What the compiler reads (pure: no device); the steps that run them are
sequence_steps.py.

A sequence value lives on the host as a list whose elements are the tensors themselves: a
``DeviceValue`` viewing the buffer a GPU node wrote (or a fed DeviceValue), or a host array (a
fed array, an initializer, a host node's output). The ops that only move tensors between lists
are list operations on the host, no tensor copied: ``SequenceEmpty``, ``SequenceConstruct``,
``SequenceInsert``, ``SequenceErase``, ``SequenceAt``, ``SequenceLength``, ``Optional``,
``OptionalHasElement``, ``OptionalGetElement`` and ``Identity`` of a sequence or optional. The
two that compute run kernels: ``ConcatFromSequence`` Concat's, ``SplitToSequence`` Split's or
Slice's. A position (``SequenceAt``, ``SequenceInsert``, ``SequenceErase``) and
``SplitToSequence``'s split are read on the host (``HOST_READS``), as NonZero's count is
(data_dependent.py), unless inference folds what reads them at plan time.

Each such node is a *sequence* step of the schedule (placement ``sequence``): its tensor inputs
made on the GPU come as views of their pooled buffers, which live until the run ends (a list
may hold them: ``plan.HostStep.holds``), and a tensor it gives a GPU node is copied
device-to-device into that node's buffer.

Before that, at construction, :class:`SequenceRewrite` removes the sequences an exporter builds
and reads back in the same graph (torch writes a Python list of tensors as ``SequenceConstruct
-> ConcatFromSequence``, a split into a list as ``SplitToSequence -> SequenceAt``): their readers
become the kernels they amount to, and the sequence nodes no longer read are not run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_quant.dtypes import ort_type, type_name

from ..inference.context import SequenceInfo
from ..inference.sequences import split_sizes
from .passes import PassResult, RewritePass
from .verdict import DEFAULT_DOMAINS

SEQUENCE_OPS = frozenset({
    "SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceErase", "SequenceAt", "SequenceLength",
    "SplitToSequence", "ConcatFromSequence", "Optional", "OptionalHasElement", "OptionalGetElement",
})
#: what placement says of a sequence step
SEQUENCE_WHY = "a sequence / optional op: a list of device values on the host (no copy), or its kernels"
#: per op, the inputs read on the host (positions, SplitToSequence's split)
HOST_READS = {"SequenceAt": (1,), "SequenceInsert": (2,), "SequenceErase": (1,), "SplitToSequence": (1,)}
#: the kernels' widest variadic forms (concat.kernel.json's inputs, split.kernel.json's outputs)
MAX_CONCAT_INPUTS = 8
MAX_SPLIT_OUTPUTS = 8


def is_sequence_step(domain: str, op_type: str, node: onnx.NodeProto, static_values: Mapping[str, Any]) -> bool:
    """A sequence / optional op, or an Identity of a sequence or optional value."""
    if domain not in DEFAULT_DOMAINS:
        return False
    if op_type in SEQUENCE_OPS:
        return True
    return op_type == "Identity" and bool(node.input) and isinstance(static_values.get(node.input[0]), SequenceInfo)


def host_reads(node: onnx.NodeProto) -> tuple[str, ...]:
    """The node's inputs read on the host (positions, a split)."""
    return tuple(node.input[i] for i in HOST_READS.get(node.op_type, ()) if i < len(node.input) and node.input[i])


def is_tensor_type(tp: onnx.TypeProto) -> bool:
    return tp.WhichOneof("value") in (None, "tensor_type")


def type_string(tp: onnx.TypeProto) -> str:
    """onnxruntime's type string: ``tensor(float)``, ``seq(tensor(int64))``, ``optional(seq(...))``."""
    kind = tp.WhichOneof("value")
    if kind == "sequence_type":
        return f"seq({type_string(tp.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({type_string(tp.optional_type.elem_type)})"
    if kind == "map_type":
        return f"map({type_name(tp.map_type.key_type)},{type_string(tp.map_type.value_type)})"
    return ort_type(tp.tensor_type.elem_type)


def to_host(value: Any) -> Any:
    """``value`` with its device values (anything with ``numpy()``: a DeviceValue) read back one
    by one, in a sequence too: what a host node or a host decision (a trip count) reads."""
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        return value.numpy()
    if isinstance(value, (list, tuple)):
        return [to_host(v) for v in value]
    return value


def concat_nodes(names: list[str], out: str, axis: int, prefix: str) -> list[onnx.NodeProto]:
    """``out = Concat(names)`` along ``axis`` as a tree of Concats of at most MAX_CONCAT_INPUTS
    inputs each (Concat is associative); intermediate values and nodes named from ``prefix``."""
    nodes, level = [], 0
    while len(names) > 1 or level == 0:
        groups = [names[k:k + MAX_CONCAT_INPUTS] for k in range(0, len(names), MAX_CONCAT_INPUTS)]
        made = []
        for j, group in enumerate(groups):
            y = out if len(groups) == 1 else f"{prefix}c{level}_{j}"
            nodes.append(helper.make_node("Concat", group, [y], axis=axis, name=f"{prefix}concat{level}_{j}"))
            made.append(y)
        names, level = made, level + 1
    return nodes


def axes_node(op: str, x: str, y: str, axis: int, opset: int, axes_name: str, name: str) -> onnx.NodeProto:
    """Unsqueeze / Squeeze of ``x`` on one axis: its axes an input (opset 13 on, ``axes_name``,
    an initializer the caller adds) or an attribute (before)."""
    if opset >= 13:
        return helper.make_node(op, [x, axes_name], [y], name=name)
    return helper.make_node(op, [x], [y], axes=[axis], name=name)


# ----------------------------------------------------------------------------- the rewrite


@dataclass
class SequenceReport:
    """What :class:`SequenceRewrite` did: per node it rewrote, (label, op, what it became)."""

    rewritten: list[tuple[str, str, str]] = field(default_factory=list)


def _static_int(values: Mapping[str, Any], name: str) -> int | None:
    info = values.get(name) if name else None
    v = None if info is None else info.value
    if v is None or np.size(v) != 1 or np.asarray(v).dtype.kind not in "iu":
        return None
    return int(np.asarray(v).reshape(-1)[0])


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


class SequenceRewrite(RewritePass):
    """Readers of a sequence built in the same graph by the nodes below, replaced by kernels
    (static positions and splits only; every other reader stays a sequence step):

    - ``ConcatFromSequence(SequenceConstruct(x...))`` -> ``Concat(x...)`` (a tree of Concats
      beyond 8 inputs; with ``new_axis`` each x ``Unsqueeze``-d on the axis first: the same
      negative-axis rule, against the output's rank);
    - ``SequenceAt(SequenceConstruct(x...), p)`` -> ``Identity(x_p)`` (a view);
    - ``SequenceAt(SplitToSequence(x, split), p)`` -> ``Slice(x)`` over the piece (``Squeeze``-d
      without ``keepdims``), where the axis' length is known statically.
    """

    name = "rewrite_sequences"

    def call(self, model: onnx.ModelProto, values: Mapping[str, Any]) -> PassResult:
        report = SequenceReport()
        g = model.graph
        opset = next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), 0)
        readers = {i for i, n in enumerate(g.node) if n.op_type in ("ConcatFromSequence", "SequenceAt") and n.input
                   and (n.domain or "") in DEFAULT_DOMAINS}
        if not readers:
            return PassResult(model, False, report)
        producer = {o: n for n in g.node for o in n.output if o and n.op_type in ("SequenceConstruct", "SplitToSequence")
                    and (n.domain or "") in DEFAULT_DOMAINS}
        taken = {x for n in g.node for x in list(n.input) + list(n.output)} | {i.name for i in g.input} | \
            {t.name for t in g.initializer}
        nodes, inits = [], []
        for i, node in enumerate(g.node):
            made = None
            src = producer.get(node.input[0]) if i in readers else None
            if src is not None:
                prefix = f"{node.output[0]}::"
                while any(t.startswith(prefix) for t in taken):
                    prefix = f"{prefix}_::"
                made = self._replace(node, src, values, opset, prefix)
            if made is None:
                nodes.append(node)
                continue
            new_nodes, new_inits, what = made
            nodes += new_nodes
            inits += new_inits
            report.rewritten.append((node.name or f"{node.op_type}_{i}", node.op_type, what))
        if not report.rewritten:
            return PassResult(model, False, report)
        out = onnx.ModelProto()
        out.CopyFrom(model)
        del out.graph.node[:]
        out.graph.node.extend(nodes)
        out.graph.initializer.extend(inits)
        return PassResult(out, True, report)

    def _replace(self, node: onnx.NodeProto, src: onnx.NodeProto, values: Mapping[str, Any], opset: int,
                 prefix: str) -> tuple[list, list, str] | None:
        """(nodes, initializers, what) replacing ``node``, or None where it stays."""
        out = node.output[0] if node.output else ""
        if not out:
            return None
        if node.op_type == "ConcatFromSequence" and src.op_type == "SequenceConstruct" and src.input:
            axis, new_axis = int(_attr(node, "axis", 0)), int(_attr(node, "new_axis", 0))
            names, nodes, inits = list(src.input), [], []
            if new_axis:
                inits.append(numpy_helper.from_array(np.array([axis], np.int64), f"{prefix}axes"))
                nodes = [axes_node("Unsqueeze", x, f"{prefix}u{k}", axis, opset, f"{prefix}axes", f"{prefix}unsqueeze{k}")
                         for k, x in enumerate(names)]
                names = [f"{prefix}u{k}" for k in range(len(names))]
            nodes += concat_nodes(names, out, axis, prefix)
            return nodes, inits, f"Concat of {len(names)}" + (" (new axis)" if new_axis else "")
        if node.op_type != "SequenceAt" or len(node.input) < 2:
            return None
        p = _static_int(values, node.input[1])
        if p is None:
            return None
        if src.op_type == "SequenceConstruct":
            n = len(src.input)
            if not -n <= p < n:
                return None
            return [helper.make_node("Identity", [src.input[p]], [out], name=f"{prefix}identity")], [], \
                f"Identity of element {p + n if p < 0 else p}"
        if src.op_type == "SplitToSequence":
            return self._split_at(src, p, out, values, opset, prefix)
        return None

    def _split_at(self, src: onnx.NodeProto, p: int, out: str, values: Mapping[str, Any], opset: int,
                  prefix: str) -> tuple[list, list, str] | None:
        x = values.get(src.input[0])
        shape = None if x is None else x.shape
        axis = int(_attr(src, "axis", 0))
        if shape is None or not -len(shape) <= axis < len(shape):
            return None
        axis += len(shape) if axis < 0 else 0
        if not isinstance(shape[axis], int):
            return None
        has_split = len(src.input) > 1 and bool(src.input[1])
        split = values.get(src.input[1]).value if has_split and values.get(src.input[1]) is not None else None
        if has_split and (split is None or np.asarray(split).dtype.kind not in "iu"):
            return None
        sizes = split_sizes(shape[axis], split)
        if sizes is None or not -len(sizes) <= p < len(sizes):
            return None
        p += len(sizes) if p < 0 else 0
        start = sum(sizes[:p])
        squeeze = not has_split and not int(_attr(src, "keepdims", 1))
        inits = [numpy_helper.from_array(np.array([v], np.int64), f"{prefix}{k}")
                 for k, v in (("starts", start), ("ends", start + sizes[p]), ("axes", axis))]
        sliced = f"{prefix}slice" if squeeze else out
        nodes = [helper.make_node("Slice", [src.input[0], f"{prefix}starts", f"{prefix}ends", f"{prefix}axes"],
                                  [sliced], name=f"{prefix}slice")]
        if squeeze:
            nodes.append(axes_node("Squeeze", sliced, out, axis, opset, f"{prefix}axes", f"{prefix}squeeze"))
        return nodes, inits, f"Slice of piece {p}" + (" (squeezed)" if squeeze else "")

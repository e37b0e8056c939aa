"""Running the sequence steps (sequences.py): lists of device values, the kernel-backed ops
through one-op sessions, and sequences in and out of a run.

:class:`SequenceStep` runs one sequence node on its feeds (sequences as Python lists, tensors as
``DeviceValue`` views or host arrays, positions read on the host). ``ConcatFromSequence`` and
``SplitToSequence`` run Concat's and Split's (Slice's beyond 8 pieces) kernels through a session
of their own over a one-op model (:func:`concat_model`, :func:`split_model`) on the same device,
built per element count, type and rank and kept (as an If's branch is, control_flow.py): the
elements are copied device-to-device into its plan, its outputs come back as DeviceValues of
their own. A feed's sequence is checked (:func:`check_feed`) and keys the plan by its elements'
shapes (:func:`value_shape`); a sequence output is read back at once (:func:`read_back`: one
submit and one map for all its elements), as onnxruntime's ``InferenceSession.run`` returns a
list of arrays (None for an empty optional).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_quant.dtypes import element_type, type_name
from onnx_quant.errors import ExecutionError, IndexRangeError, KernelRejected, QuantError

from ..inference.sequences import Elements, split_sizes
from .device_value import DeviceValue
from .packing import unpack_array
from .sequences import MAX_SPLIT_OUTPUTS, axes_node, concat_nodes, to_host

#: the opset of the one-op models the kernel-backed ops run
KERNEL_OPSET = 18
#: one-op sessions a step keeps (one per element count, type and rank)
MAX_KERNEL_SESSIONS = 8


def value_shape(value: Any) -> Any:
    """What a plan is keyed on for a feed: a tensor's shape; a sequence's elements' shapes
    (``Elements``); None for an empty optional."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return Elements(value_shape(v) for v in value)
    if isinstance(value, DeviceValue):
        return value.dims
    return tuple(int(d) for d in np.shape(value))


def check_feed(name: str, tp: onnx.TypeProto, value: Any, device_value: Callable[[str, DeviceValue], Any]) -> Any:
    """A sequence or optional feed as the run takes it: a list of arrays / DeviceValues, an
    optional's value or None. Element types are checked (``device_value`` checks a DeviceValue
    and gives its stand-in); an element type without a device form (strings) is a typed decline."""
    kind = tp.WhichOneof("value")
    if kind == "optional_type":
        return None if value is None else check_feed(name, tp.optional_type.elem_type, value, device_value)
    if kind == "sequence_type":
        if not isinstance(value, (list, tuple)):
            raise ExecutionError(f"input {name!r}: a sequence takes a list of tensors, found {type(value).__name__}")
        return [check_feed(f"{name}[{i}]", tp.sequence_type.elem_type, v, device_value) for i, v in enumerate(value)]
    if kind != "tensor_type":
        raise KernelRejected("", "", f"a {kind or 'untyped'} value has no device form", where=f"input {name!r}")
    want = feed_type(name, tp.tensor_type.elem_type)
    if isinstance(value, (list, tuple)) or value is None:
        raise ExecutionError(f"input {name!r}: expected a {want.name} tensor, found {type(value).__name__}")
    arr = device_value(name, value) if isinstance(value, DeviceValue) else np.asarray(value)
    check_feed_dtype(name, want, arr.dtype)
    return value if isinstance(value, DeviceValue) else arr


def feed_type(name: str, code: int) -> Any:
    """The element type a tensor feed declares; one without a device form (strings) is a typed
    decline, not a bad feed."""
    try:
        return element_type(code)
    except QuantError:
        raise KernelRejected("", "", f"element type {type_name(code)} has no device form", where=f"input {name!r}") from None


def check_feed_dtype(name: str, want: Any, dtype: np.dtype) -> None:
    """A feed's numpy dtype against the element type its input declares."""
    if dtype != want.dtype:
        numpy = "" if want.name == str(want.dtype) else f" (numpy {want.dtype})"
        raise ExecutionError(f"input {name!r}: expected {want.name}{numpy}, found {dtype}")


def read_back(device: Any, value: Any) -> tuple[Any, int]:
    """``value`` with every DeviceValue in it (a tensor, a list, an optional) read back into a
    numpy array, all in one submit and one map; host arrays are copied. Returns (the value,
    bytes read back)."""
    found: list[DeviceValue] = []

    def collect(v: Any) -> None:
        if isinstance(v, DeviceValue):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                collect(x)

    collect(value)
    arrays: dict[int, np.ndarray] = {}
    total = 0
    if found:
        offsets = []
        for v in found:  # DeviceValue.nbytes: whole words, at least one
            offsets.append(total)
            total += v.nbytes
        staging = device.allocate_staging(total, label="sequence read-back")
        try:
            raw = device.launch([], copies=[(v.buffer, 0, staging, off, v.nbytes) for v, off in zip(found, offsets)],
                                read=staging)
        finally:
            staging.destroy()
        mv = memoryview(raw)
        for v, off in zip(found, offsets):
            arrays[id(v)] = unpack_array(mv[off:off + v.nbytes], v.onnx_type, v.dims)

    def build(v: Any) -> Any:
        if isinstance(v, DeviceValue):
            return arrays[id(v)]
        if isinstance(v, (list, tuple)):
            return [build(x) for x in v]
        return None if v is None else np.array(v, copy=True)

    return build(value), total


def own(value: Any, device: Any, resources: Any) -> Any:
    """``value`` (a sequence, an optional or a tensor) kept on the device past the run: each
    element a DeviceValue of its own. A borrowed view (a plan's buffer, which the next run
    reuses) is copied device-to-device into a fresh buffer (one submit for all), a host array
    uploaded; a DeviceValue that owns its buffer already (a fed one, a previous run's) is the
    element as is. ``resources``: the session's (allocations and uploads counted)."""
    copies: list[tuple] = []

    def build(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return [build(x) for x in v]
        if v is None or (isinstance(v, DeviceValue) and v.owned):
            return v
        if isinstance(v, DeviceValue):
            buf = resources.allocate(v.nbytes, label="kept sequence element")
            copies.append((v.buffer, 0, buf, 0, v.nbytes))
            return DeviceValue(device, buf, v.onnx_type, v.dims)
        out = DeviceValue.from_numpy(np.asarray(v), device)
        resources.stats.bytes_uploaded += out.nbytes
        return out

    kept = build(value)
    if copies:
        device.launch([], copies=copies)
        resources.stats.submits += 1
    return kept


# ----------------------------------------------------------------------------- the step


def _dtype_code(value: Any) -> int:
    return element_type(value.onnx_type if isinstance(value, DeviceValue) else np.asarray(value).dtype).code


def _rank(value: Any) -> int:
    return len(value.dims) if isinstance(value, DeviceValue) else np.ndim(value)


def _dims(value: Any) -> tuple[int, ...]:
    return value.dims if isinstance(value, DeviceValue) else tuple(np.shape(value))


class SequenceStep:
    """Runs one sequence node: :meth:`run` takes the node's feeds (sequences as lists, tensors as
    DeviceValues or arrays, positions as arrays) and returns its outputs. ``make_session`` builds
    a session over a one-op model on the parent's device (its options: host fallback, budget)."""

    def __init__(self, info: Any, make_session: Callable[[onnx.ModelProto], Any],
                 absorb: Callable[[Mapping[str, Any]], None]):
        self.info = info
        self.node = info.node
        self.make_session = make_session
        self.absorb = absorb
        self.attrs = {a.name: helper.get_attribute_value(a) for a in info.node.attribute}
        self._sessions: dict[tuple, Any] = {}

    def body_sessions(self) -> list[Any]:
        """The one-op sessions built so far (their host nodes are the node's)."""
        return list(self._sessions.values())

    def _input(self, feeds: Mapping[str, Any], i: int) -> Any:
        names = self.node.input
        return feeds[names[i]] if i < len(names) and names[i] else None

    def _position(self, feeds: Mapping[str, Any], i: int, default: int, n: int, hi: int) -> int:
        """Input ``i`` as a position in [-n, hi) (``default`` when absent), counted from the start."""
        v = self._input(feeds, i)
        p = default if v is None else int(np.asarray(to_host(v)).reshape(-1)[0])
        if not -n <= p < hi:
            name = self.node.input[i]
            raise IndexRangeError(f"node {self.info.label!r} ({self.node.op_type}): position {p} is out of range "
                                  f"[{-n}, {hi}) of a sequence of {n}", node=self.info.label, input=name,
                                  index=p, bound=n)
        return p + n if p < 0 else p

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        op = self.node.op_type
        x = self._input(feeds, 0)
        if op in ("Identity", "Optional"):
            return [x]
        if op == "SequenceEmpty":
            return [[]]
        if op == "SequenceConstruct":
            return [[feeds[n] for n in self.node.input]]
        if op == "SequenceLength":
            return [np.array(len(x), np.int64)]
        if op == "SequenceAt":
            return [x[self._position(feeds, 1, 0, len(x), len(x))]]
        if op == "SequenceInsert":
            out = list(x)
            out.insert(self._position(feeds, 2, len(x), len(x), len(x) + 1), self._input(feeds, 1))
            return [out]
        if op == "SequenceErase":
            out = list(x)
            del out[self._position(feeds, 1, -1, len(x), len(x))]
            return [out]
        if op == "OptionalHasElement":
            return [np.array(x is not None)]
        if op == "OptionalGetElement":
            if x is None:
                raise ExecutionError(f"node {self.info.label!r} (OptionalGetElement): the optional is empty")
            return [x]
        if op == "ConcatFromSequence":
            return [self._concat(x)]
        if op == "SplitToSequence":
            return [self._split(x, self._input(feeds, 1))]
        raise ExecutionError(f"node {self.info.label!r}: {op} is not a sequence op")  # pragma: no cover

    # -- the kernel-backed ops ---------------------------------------------------------------

    def _kernel(self, key: tuple, build: Callable[[], onnx.ModelProto]) -> Any:
        """The one-op session for ``key`` (built on first use; the least recently used goes)."""
        session = self._sessions.pop(key, None)
        if session is None:
            try:
                session = self.make_session(build())
            except KernelRejected:
                raise
            except QuantError as e:  # no kernel takes it (and no host fallback): the node declines
                raise KernelRejected(self.info.label, self.node.op_type, f"its kernels cannot run it: {e}") from None
            while len(self._sessions) >= MAX_KERNEL_SESSIONS:
                self._sessions.pop(next(iter(self._sessions))).close()
        self._sessions[key] = session
        return session

    def _run_kernel(self, session: Any, feeds: Mapping[str, Any]) -> list[DeviceValue]:
        names = session.output_names
        try:
            outs = session.run(names, feeds, device_outputs=names)
        except KernelRejected as e:
            raise KernelRejected(self.info.label, self.node.op_type, f"its kernels cannot run it: {e}") from None
        except QuantError as e:
            raise ExecutionError(f"node {self.info.label!r} ({self.node.op_type}): {e}") from None
        self.absorb(session.last_run_stats)
        return outs

    def _concat(self, seq: list[Any]) -> DeviceValue:
        if not seq:
            raise ExecutionError(f"node {self.info.label!r} (ConcatFromSequence): the sequence is empty")
        new_axis = int(self.attrs.get("new_axis", 0))
        axis = int(self.attrs.get("axis", 0))
        rank = _rank(seq[0])
        if any(_rank(v) != rank for v in seq):
            raise ExecutionError(f"node {self.info.label!r} (ConcatFromSequence): elements of different ranks")
        out_rank = rank + 1 if new_axis else rank
        if not -out_rank <= axis < out_rank:
            raise ExecutionError(f"node {self.info.label!r} (ConcatFromSequence): axis {axis} is out of range "
                                 f"for rank {rank}{' (new_axis)' if new_axis else ''}")
        axis += out_rank if axis < 0 else 0
        code = _dtype_code(seq[0])
        key = ("concat", len(seq), code, rank, axis, new_axis)
        session = self._kernel(key, lambda: concat_model(len(seq), code, rank, axis, bool(new_axis)))
        return self._run_kernel(session, {f"x{i}": v for i, v in enumerate(seq)})[0]

    def _split(self, x: Any, split: Any) -> list[DeviceValue]:
        dims = _dims(x)
        axis = int(self.attrs.get("axis", 0))
        if not -len(dims) <= axis < len(dims):
            raise ExecutionError(f"node {self.info.label!r} (SplitToSequence): axis {axis} is out of range for rank "
                                 f"{len(dims)}")
        axis += len(dims) if axis < 0 else 0
        length = dims[axis]
        keep = split is not None or bool(int(self.attrs.get("keepdims", 1)))  # keepdims only without a split
        s = None if split is None else np.asarray(to_host(split))
        sizes = split_sizes(length, s)
        if sizes is None:
            raise ExecutionError(f"node {self.info.label!r} (SplitToSequence): split {s.tolist()} does not cut an "
                                 f"axis of {length} (a positive chunk length, or lengths that add up to it)")
        if not sizes:
            return []
        code = _dtype_code(x)
        key = ("split", tuple(sizes), code, len(dims), axis, keep)
        session = self._kernel(key, lambda: split_model(sizes, code, len(dims), axis, keep))
        return self._run_kernel(session, {"x": x})


# ----------------------------------------------------------------------------- one-op models


def _model(nodes: list, inputs: list, outputs: list, inits: list = ()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "sequence_kernel", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", KERNEL_OPSET)])


def _vi(name: str, code: int, rank: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, code, [None] * rank)


def concat_model(n: int, code: int, rank: int, axis: int, new_axis: bool) -> onnx.ModelProto:
    """``y = Concat(x0..x{n-1})`` along ``axis`` (each x unsqueezed there first for ``new_axis``),
    a tree of Concats (sequences.concat_nodes)."""
    nodes, inits = [], []
    names = [f"x{i}" for i in range(n)]
    if new_axis:
        inits.append(numpy_helper.from_array(np.array([axis], np.int64), "axes"))
        nodes += [axes_node("Unsqueeze", x, f"u{i}", axis, KERNEL_OPSET, "axes", f"unsqueeze{i}")
                  for i, x in enumerate(names)]
        names = [f"u{i}" for i in range(n)]
    nodes += concat_nodes(names, "y", axis, "")
    out_rank = rank + 1 if new_axis else rank
    return _model(nodes, [_vi(f"x{i}", code, rank) for i in range(n)], [_vi("y", code, out_rank)], inits)


def split_model(sizes: list[int], code: int, rank: int, axis: int, keep: bool) -> onnx.ModelProto:
    """``y0..y{n-1}``: ``x`` split along ``axis`` into pieces of ``sizes`` (one Split up to
    MAX_SPLIT_OUTPUTS pieces, a Slice per piece beyond), each squeezed on the axis unless ``keep``."""
    n = len(sizes)
    pieces = [f"p{i}" if not keep else f"y{i}" for i in range(n)]
    nodes, inits = [], []
    if n <= MAX_SPLIT_OUTPUTS:
        inits.append(numpy_helper.from_array(np.array(sizes, np.int64), "split"))
        nodes.append(helper.make_node("Split", ["x", "split"], pieces, axis=axis))
    else:
        inits.append(numpy_helper.from_array(np.array([axis], np.int64), "axis"))
        start = 0
        for i, s in enumerate(sizes):
            inits += [numpy_helper.from_array(np.array([start], np.int64), f"start{i}"),
                      numpy_helper.from_array(np.array([start + s], np.int64), f"end{i}")]
            nodes.append(helper.make_node("Slice", ["x", f"start{i}", f"end{i}", "axis"], [pieces[i]]))
            start += s
    if not keep:
        inits.append(numpy_helper.from_array(np.array([axis], np.int64), "squeeze_axes"))
        nodes += [axes_node("Squeeze", p, f"y{i}", axis, KERNEL_OPSET, "squeeze_axes", f"squeeze{i}")
                  for i, p in enumerate(pieces)]
    out_rank = rank if keep else rank - 1
    return _model(nodes, [_vi("x", code, rank)], [_vi(f"y{i}", code, out_rank) for i in range(n)], inits)

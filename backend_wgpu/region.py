"""Running the region of NonZero / NonMaxSuppression (data_dependent.py): the host step that runs the
nodes after them as a Session of their own, on the same device, per count.

:class:`DataDependentRegion` feeds the body NonZero's indices (NonMaxSuppression's selected rows) as a
:class:`DeviceValue` over the first ``rank * count`` (``count * 3``) elements of the padded buffer and
every other GPU-made value it reads as a view of its pooled buffer; :class:`HostPaddedNonZero` is the
padded form on the host, for a plan
where its kernel cannot run. Session builds them for its ``sync`` steps; the rewrite and the facts
the compiler reads stay in data_dependent.py, which imports nothing of the device.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np
import onnx
from onnx import helper

from onnx_quant.dtypes import element_type
from onnx_quant.errors import ExecutionError, QuantError, in_context

from .data_dependent import ALL_SUFFIX, COUNT_AXES_ATTR, capacity_shapes, counted_outputs
from .device_value import DeviceValue


class HostPaddedNonZero:
    """The padded form on the host, for a plan where the kernel cannot run it (its input's shape
    unknown for those input shapes, a plan the kernel declines): numpy.nonzero (onnx.reference's
    NonMaxSuppression, Unique) written as the kernel writes it, each counted output compact at the
    start of its capacity (shaped like ``ReferenceEvaluator``: ``run(None, feeds)``, the padded
    node's named outputs in order)."""

    def __init__(self, node: onnx.NodeProto, opset: int = 0):
        self.node = node
        self.opset = opset

    def _found(self, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        """The op's results, one per output position of the padded form but the count (None where
        the node leaves it out)."""
        if self.node.op_type == "NonZero":
            x = np.asarray(feeds[self.node.input[0]])
            if x.ndim == 0:
                raise ExecutionError("NonZero of a rank-0 input: numpy and ONNX's inference disagree on its output")
            return [np.array(np.nonzero(x), dtype=np.int64)]
        from onnx.reference import ReferenceEvaluator  # noqa: PLC0415 - onnx.reference loads on first use

        one = onnx.NodeProto()
        one.CopyFrom(self.node)
        del one.output[:]
        outs = [f"out{k}" if n else "" for k, n in enumerate(self.node.output[:-1])]
        while outs and not outs[-1]:
            outs.pop()
        one.output.extend(outs)
        names = [n for n in one.input if n]
        g = helper.make_graph([one], "counted", [onnx.ValueInfoProto(name=n) for n in names],
                              [onnx.ValueInfoProto(name=o) for o in outs if o])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset or 11)])
        found = iter(ReferenceEvaluator(model).run(None, {n: np.asarray(feeds[n]) for n in names}))
        results = [np.asarray(next(found)) if o else None for o in outs]
        if self.node.op_type == "NonMaxSuppression":
            results[0] = np.asarray(results[0], np.int64).reshape(-1, 3)
        return results + [None] * (len(self.node.output) - 1 - len(results))

    def run(self, _names: Any, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        results = self._found(feeds)
        shapes = [np.asarray(feeds[n]).shape for n in self.node.input[:2] if n]
        counted = counted_outputs(self.node, len(shapes[0]))
        out, count = [], None
        for k, name in enumerate(self.node.output[:-1]):
            found = results[k]
            if found is None:
                continue
            at = next((j for j, (pos, _) in enumerate(counted) if pos == k), None)
            if at is not None and name.endswith(ALL_SUFFIX):
                axis = counted[at][1]
                count = found.shape[axis]
                padded = np.zeros(capacity_shapes(self.node, shapes)[at], found.dtype)
                padded.reshape(-1)[:found.size] = found.reshape(-1)
                found = padded
            out.append(found)
        return out + [np.array([count], np.int64)]



def _value_info(name: str, value: Any, *, count_axis: int | None = None) -> onnx.ValueInfoProto:
    """A body input typed like ``value`` (an array or a DeviceValue), every dim anonymous but the
    one beside the count of a counted output (NonZero's rank, NonMaxSuppression's 3: fixed, what
    follows, a GatherND, knows its output's rank)."""
    dtype = value.dtype if isinstance(value, DeviceValue) else np.asarray(value).dtype
    dims = list(value.dims) if isinstance(value, DeviceValue) else list(np.asarray(value).shape)
    if count_axis is not None:
        dims = [None if k == count_axis else d for k, d in enumerate(dims)]
    return helper.make_tensor_value_info(name, element_type(dtype).code,
                                         dims if count_axis is not None else [None] * len(dims))


#: body sessions a region keeps (one per binding of its inputs' fixed dims)
MAX_BODY_SESSIONS = 8


class DataDependentRegion:
    """Runs one region node: :meth:`run` takes the node's feeds (padded NonZero outputs and the
    device views of GPU-made values as DeviceValues, the counts and host values as arrays) and
    returns the node's outputs (the graph outputs the region makes, on the host)."""

    def __init__(self, info: Any, model: onnx.ModelProto, make_session: Callable[[onnx.ModelProto], Any],
                 absorb: Callable[[Mapping[str, Any]], None]):
        self.info = info
        self.model = model
        self.make_session = make_session
        self.absorb = absorb
        self.body = next(a.g for a in info.node.attribute if a.name == "body")
        #: the counted ops whose outputs the region reads: 2 node inputs each (padded, count), 1 body input (Y)
        self.n_nonzeros = len(info.node.input) - len(self.body.input)
        axes = next((list(a.ints) for a in info.node.attribute if a.name == COUNT_AXES_ATTR), [])
        #: per counted output, the axis of its count (NonZero's 1 where the attribute is absent)
        self.count_axes = axes or [1] * self.n_nonzeros
        #: body sessions by the fixed dims of their inputs (a counted input's other dims: NonZero's
        #: rank stays, Unique's Y rows follow X's shape), most recently used last
        self._sessions: dict[tuple, Any] = {}

    def body_sessions(self) -> list[Any]:
        return list(self._sessions.values())

    def _fail(self, what: str, cause: QuantError | None = None) -> ExecutionError:
        text = f"node {self.info.label!r} (NonZero's region): {what}"
        return ExecutionError(text) if cause is None else in_context(cause, text)

    def _feeds(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """The body's feeds: each Y a view of its padded buffer's first elements, the count on its axis."""
        names = list(self.info.node.input)
        inputs = [i.name for i in self.body.input]
        n_ys = self.n_nonzeros
        out: dict[str, Any] = {}
        for k in range(n_ys):
            padded, count = feeds[names[2 * k]], np.asarray(feeds[names[2 * k + 1]]).reshape(-1)
            dims = list(padded.dims if isinstance(padded, DeviceValue) else padded.shape)
            axis, c = self.count_axes[k], int(count[0])
            if not 0 <= c <= dims[axis]:  # impossible by construction (the buffer holds every element)
                raise self._fail(f"counted {c} elements of a capacity of {dims[axis]}")
            dims[axis] = c
            if isinstance(padded, DeviceValue):
                out[inputs[k]] = DeviceValue.borrowed(padded.device, padded.buffer, padded.onnx_type, tuple(dims))
            else:  # the padded form ran on the host
                out[inputs[k]] = np.ascontiguousarray(padded.reshape(-1)[:math.prod(dims)].reshape(dims))
        for name, body_name in zip(names[2 * n_ys:], inputs[n_ys:]):
            out[body_name] = feeds[name]
        return out

    def _body_session(self, feeds: Mapping[str, Any]) -> Any:
        inputs = [_value_info(i.name, feeds[i.name], count_axis=self.count_axes[k] if k < self.n_nonzeros else None)
                  for k, i in enumerate(self.body.input)]
        key = tuple(vi.SerializeToString(deterministic=True) for vi in inputs)
        session = self._sessions.pop(key, None)
        if session is None:
            g = onnx.GraphProto()
            g.CopyFrom(self.body)
            del g.input[:]
            g.input.extend(inputs)
            g.name = f"{self.info.label}_body"
            child = helper.make_model(g, opset_imports=list(self.model.opset_import),
                                      ir_version=self.model.ir_version, functions=list(self.model.functions))
            try:
                session = self.make_session(child)
            except QuantError as e:
                raise self._fail(f"cannot run: {e}") from None
            while len(self._sessions) >= MAX_BODY_SESSIONS:  # the least recently used goes
                self._sessions.pop(next(iter(self._sessions))).close()
        self._sessions[key] = session
        return session

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        body_feeds = self._feeds(feeds)
        session = self._body_session(body_feeds)
        try:
            outs = session.run(None, body_feeds)
        except QuantError as e:
            raise self._fail(str(e), e) from None
        self.absorb(session.last_run_stats)
        return outs

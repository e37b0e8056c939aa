"""Running NonZero's region (data_dependent.py): the host step that runs the nodes after a
NonZero as a Session of their own, on the same device, per count.

:class:`DataDependentRegion` feeds the body the NonZero's indices as a :class:`DeviceValue` over the
first ``rank * count`` elements of the padded buffer and every other GPU-made value it reads as a
view of its pooled buffer; :class:`HostPaddedNonZero` is the padded form on the host, for a plan
where its kernel cannot run. Session builds them for its ``sync`` steps; the rewrite and the facts
the compiler reads stay in data_dependent.py, which imports nothing of the device.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
import onnx
from onnx import helper

from onnx_quant.dtypes import element_type
from onnx_quant.errors import ExecutionError, QuantError, in_context

from .device_value import DeviceValue


class HostPaddedNonZero:
    """The padded form on the host, for a plan where the kernel cannot run it (its input's shape
    unknown for those input shapes): numpy.nonzero written as the kernel writes it (shaped like
    ``ReferenceEvaluator``: ``run(None, feeds)``)."""

    def __init__(self, node: onnx.NodeProto):
        self.x = node.input[0]

    def run(self, _names: Any, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        x = np.asarray(feeds[self.x])
        if x.ndim == 0:
            raise ExecutionError("NonZero of a rank-0 input: numpy and ONNX's inference disagree on its output")
        found = np.array(np.nonzero(x), dtype=np.int64)
        padded = np.zeros((x.ndim, x.size), np.int64)
        padded.reshape(-1)[:found.size] = found.reshape(-1)
        return [padded, np.array([found.shape[1]], np.int64)]



def _value_info(name: str, value: Any, *, indices: bool = False) -> onnx.ValueInfoProto:
    """A body input typed like ``value`` (an array or a DeviceValue), every dim anonymous but the
    rank of NonZero's ``indices`` (fixed: what follows, a GatherND, knows its output's rank)."""
    dtype = value.dtype if isinstance(value, DeviceValue) else np.asarray(value).dtype
    dims = list(value.dims) if isinstance(value, DeviceValue) else list(np.asarray(value).shape)
    return helper.make_tensor_value_info(name, element_type(dtype).code,
                                         [dims[0], None] if indices else [None] * len(dims))


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
        #: the NonZeros whose outputs the region reads: 2 node inputs each (padded, count), 1 body input (Y)
        self.n_nonzeros = len(info.node.input) - len(self.body.input)
        self._session: Any = None

    def body_sessions(self) -> list[Any]:
        return [] if self._session is None else [self._session]

    def _fail(self, what: str, cause: QuantError | None = None) -> ExecutionError:
        text = f"node {self.info.label!r} (NonZero's region): {what}"
        return ExecutionError(text) if cause is None else in_context(cause, text)

    def _feeds(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """The body's feeds: each Y a view of the first rank * count elements of its padded buffer."""
        names = list(self.info.node.input)
        inputs = [i.name for i in self.body.input]
        n_ys = self.n_nonzeros
        out: dict[str, Any] = {}
        for k in range(n_ys):
            padded, count = feeds[names[2 * k]], np.asarray(feeds[names[2 * k + 1]]).reshape(-1)
            rank, capacity = padded.dims if isinstance(padded, DeviceValue) else padded.shape
            c = int(count[0])
            if not 0 <= c <= capacity:  # impossible by construction (the buffer holds every element)
                raise self._fail(f"NonZero counted {c} nonzero elements of {capacity}")
            if isinstance(padded, DeviceValue):
                out[inputs[k]] = DeviceValue.borrowed(padded.device, padded.buffer, "int64", (rank, c))
            else:  # the padded form ran on the host
                out[inputs[k]] = np.ascontiguousarray(padded.reshape(-1)[:rank * c].reshape(rank, c))
        for name, body_name in zip(names[2 * n_ys:], inputs[n_ys:]):
            out[body_name] = feeds[name]
        return out

    def _body_session(self, feeds: Mapping[str, Any]) -> Any:
        if self._session is None:
            g = onnx.GraphProto()
            g.CopyFrom(self.body)
            del g.input[:]
            g.input.extend(_value_info(i.name, feeds[i.name], indices=k < self.n_nonzeros)
                           for k, i in enumerate(self.body.input))
            g.name = f"{self.info.label}_body"
            child = helper.make_model(g, opset_imports=list(self.model.opset_import),
                                      ir_version=self.model.ir_version, functions=list(self.model.functions))
            try:
                self._session = self.make_session(child)
            except QuantError as e:
                raise self._fail(f"cannot run: {e}") from None
        return self._session

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        body_feeds = self._feeds(feeds)
        session = self._body_session(body_feeds)
        try:
            outs = session.run(None, body_feeds)
        except QuantError as e:
            raise self._fail(str(e), e) from None
        self.absorb(session.last_run_stats)
        return outs

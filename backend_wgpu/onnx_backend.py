"""The ``onnx.backend`` interface over :class:`~backend_wgpu.session.Session`.

``backend_wgpu.backend`` is :class:`WgpuBackend`, an ``onnx.backend.base.Backend`` subclass, so
ONNX's own harness can drive it::

    import onnx.backend.test, backend_wgpu
    tests = onnx.backend.test.BackendTest(backend_wgpu.backend, __name__)
    tests.include("test_dynamicquantizelinear")
    globals().update(tests.test_cases)

Devices. ONNX's harness only knows ``"CPU"`` and ``"CUDA"`` and generates every test once per
device (``<test>_cpu``, ``<test>_cuda``), skipping those ``supports_device`` refuses. This
backend runs on a wgpu adapter whatever the string says, so it accepts ``"CPU"`` — the
harness's default device, read as "the default device": the adapter ``ONNX_QUANT_ADAPTER``
names, else the best one (on a machine without a GPU that is lavapipe, a CPU) — and the
explicit ``"GPU"``, ``"WGPU"``, ``"WEBGPU"``, optionally with an adapter index or name after a
colon (``"GPU:1"``, ``"WGPU:opengl"``). It refuses ``"CUDA"``: the harness's CUDA tests would run
the same cases a second time on the same adapter. ``supports_device`` only reads the string;
whether an adapter exists is found out by ``prepare`` (a ``DeviceError`` "no usable adapter").

``prepare(model, device, **kw)`` takes Session's keywords (``adapter``, ``limits``,
``tunables``, ``variants``, ``allow_host_fallback``, ``device``, ``specs``); other keywords
(harness options such as ``rtol``) are ignored. Nodes no kernel covers run on the host as in
``Session`` (a HostFallbackWarning names them) unless ``allow_host_fallback=False``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, namedtupledict

from onnx_quant.errors import ExecutionError

__all__ = ["WgpuBackend", "WgpuBackendRep", "prepare", "run_model", "run_node", "supports_device"]

#: device strings this backend accepts (case-insensitive), optionally followed by ``:adapter``
DEVICE_NAMES = ("CPU", "GPU", "WGPU", "WEBGPU")

_SESSION_KEYWORDS = ("adapter", "limits", "tunables", "variants", "allow_host_fallback", "device", "specs")


def _array(value: Any) -> Any:
    """A feed as numpy: TensorProtos (ONNX's test data holds some) through numpy_helper."""
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return value


def _parse_device(device: str | None) -> tuple[bool, int | str | None]:
    """(accepted, adapter selector) for a device string."""
    text = (device or "CPU").strip()
    kind, _, rest = text.partition(":")
    if kind.upper() not in DEVICE_NAMES:
        return False, None
    rest = rest.strip()
    if not rest:
        return True, None
    if kind.upper() == "CPU":
        # "CPU:0" is how onnx's Device spells the default CPU; never an adapter choice
        return (rest == "0"), None
    return True, int(rest) if rest.isdigit() else rest


class WgpuBackendRep(BackendRep):
    """A prepared model: ``run(inputs)`` returns the graph outputs in graph order."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:  # noqa: ARG002
        names = self.session.input_names
        if isinstance(inputs, Mapping):
            feeds = {k: _array(v) for k, v in inputs.items()}
        else:
            if isinstance(inputs, (np.ndarray, onnx.TensorProto)):
                inputs = [inputs]
            values = [_array(v) for v in inputs]
            if len(values) != len(names):
                raise ExecutionError(f"{len(values)} inputs given, the model takes {len(names)}: {names}")
            feeds = dict(zip(names, values))
        outputs = self.session.run(None, feeds)
        return namedtupledict("Outputs", self.session.output_names)(*outputs)


class WgpuBackend(Backend):
    """ONNX backend running models through ``backend_wgpu.Session``."""

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return _parse_device(device)[0]

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:  # noqa: ARG003
        return cls.supports_device(device)

    @classmethod
    def _session_kwargs(cls, device: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        ok, adapter = _parse_device(device)
        if not ok:
            raise ExecutionError(f"device {device!r}: this backend runs on a wgpu adapter; use one of "
                                 f"{', '.join(DEVICE_NAMES)} (optionally 'GPU:<adapter index or name>')")
        kw = {k: v for k, v in kwargs.items() if k in _SESSION_KEYWORDS}
        if adapter is not None and kw.get("adapter") is None:
            kw["adapter"] = adapter
        return kw

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> WgpuBackendRep:
        from .session import Session  # noqa: PLC0415

        kw = cls._session_kwargs(device, kwargs)
        if isinstance(model, onnx.ModelProto):
            try:
                onnx.checker.check_model(model)
            except Exception as e:  # onnx raises ValidationError and C++ errors of other kinds
                raise ExecutionError(f"the model fails onnx.checker: {str(e).splitlines()[0] if str(e) else e}") from None
        return WgpuBackendRep(Session(model, **kw))

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run one node: ``inputs`` is a list matching the node's non-empty inputs in order, or a
        dict by name (numpy arrays or TensorProtos). ``opset_version`` (keyword) sets the default domain's opset (default: the
        installed onnx's); other domains are imported at version 1."""
        super().run_node(node, inputs, device=device, outputs_info=outputs_info,
                         **{k: v for k, v in kwargs.items() if k == "opset_version"})
        names = [n for n in node.input if n]
        if isinstance(inputs, Mapping):
            feeds = {n: np.asarray(_array(inputs[n])) for n in names if n in inputs}
            missing = [n for n in names if n not in inputs]
            if missing:
                raise ExecutionError(f"node {node.name or node.op_type}: inputs {missing} not given")
        else:
            values = [inputs] if isinstance(inputs, (np.ndarray, onnx.TensorProto)) else list(inputs)
            if len(values) != len(names):
                raise ExecutionError(f"node {node.name or node.op_type}: {len(values)} inputs given, it reads "
                                     f"{len(names)}: {names}")
            feeds = {n: np.asarray(_array(v)) for n, v in zip(names, values)}
        graph_inputs = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype),
                                                           list(a.shape)) for n, a in feeds.items()]
        outs = [o for o in node.output if o]
        if outputs_info is not None and len(outputs_info) == len(outs):
            graph_outputs = [onnx.helper.make_tensor_value_info(o, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dt)),
                                                                list(shape) if shape is not None else None)
                             for o, (dt, shape) in zip(outs, outputs_info)]
        else:
            graph_outputs = [onnx.ValueInfoProto(name=o) for o in outs]
        version = int(kwargs.get("opset_version") or onnx.defs.onnx_opset_version())
        imports = [onnx.helper.make_opsetid("", version)]
        if node.domain not in ("", "ai.onnx"):
            imports.append(onnx.helper.make_opsetid(node.domain, 1))
        model = onnx.helper.make_model(
            onnx.helper.make_graph([node], f"run_node_{node.op_type}", graph_inputs, graph_outputs),
            opset_imports=imports)
        kw = {k: v for k, v in kwargs.items() if k != "opset_version"}
        from .session import Session  # noqa: PLC0415

        session = Session(model, **cls._session_kwargs(device, kw))
        try:
            outputs = session.run(None, feeds)
        finally:
            session.close()
        return namedtupledict("Outputs", outs)(*outputs)


prepare = WgpuBackend.prepare
run_model = WgpuBackend.run_model
run_node = WgpuBackend.run_node
supports_device = WgpuBackend.supports_device

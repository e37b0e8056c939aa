"""``onnx_quant.InferenceSession``: onnxruntime's call shapes over :class:`Session`.

A user coming from onnxruntime writes the same calls::

    sess = onnx_quant.InferenceSession("model.onnx", providers=["vulkan", "CPUExecutionProvider"])
    [x.name for x in sess.get_inputs()]
    sess.run(None, {"input": x})

**Providers** name adapters, in priority order, as onnxruntime's provider list names execution
providers: ``"vulkan"``, ``"opengl"``, ``"metal"``, ``"d3d12"`` (an adapter of that backend),
an adapter index (``0`` or ``"1"``), a name substring (``"llvmpipe"``), ``"webgpu"`` /
``"WebGpuExecutionProvider"`` (the best adapter), each alone or as ``(name, options)``
(``{"limits": "default"}``). ``"cpu"`` / ``"CPUExecutionProvider"`` lets nodes no kernel takes
run on the host. As in onnxruntime: an entry this machine cannot provide is skipped with a
warning; the first available GPU entry runs the model; the host takes the nodes the GPU cannot
unless the session config ``session.disable_cpu_ep_fallback`` is ``"1"`` — onnxruntime appends
its CPU provider implicitly, and so does this (``providers=None`` means ``["webgpu", "cpu"]``).

**Device-resident values**: :meth:`InferenceSession.run_with_ort_values` and
:meth:`InferenceSession.io_binding` keep outputs on the device as :class:`DeviceValue`
(onnxruntime's ``OrtValue``); a later run of this or another session on the same device takes
them as feeds without a host round trip. ``DeviceValue.release()`` frees one.
"""

from __future__ import annotations

import enum
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from onnx_quant.errors import DeviceError, ExecutionError

from .device import get_device, list_adapters, select_adapter
from .device_value import DeviceValue
from .session import Session
from .session_io import NodeArg

CPU_NAMES = frozenset({"cpu", "cpuexecutionprovider"})
BEST_GPU_NAMES = frozenset({"webgpu", "webgpuexecutionprovider", "gpu"})
BACKEND_NAMES = {"Vulkan": "vulkan", "OpenGL": "opengl", "Metal": "metal", "D3D12": "d3d12"}
#: onnxruntime's session config key that turns the implicit CPU fallback off
DISABLE_CPU_FALLBACK = "session.disable_cpu_ep_fallback"

OrtValue = DeviceValue


class GraphOptimizationLevel(enum.IntEnum):
    """onnxruntime's levels (the same numbers; onnxruntime's own enum is accepted too). QDQ node
    units are fused (``Session(fuse_qdq=True)``) from ``ORT_ENABLE_EXTENDED`` on, where onnxruntime
    runs its QDQ selectors; ``ORT_DISABLE_ALL`` and ``ORT_ENABLE_BASIC`` run every node as written."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_ALL = 99


def _level(sess_options: Any) -> int:
    """onnxruntime's graph optimization level of these options (default: all)."""
    return int(getattr(sess_options, "graph_optimization_level", GraphOptimizationLevel.ORT_ENABLE_ALL))


def fuses_qdq(sess_options: Any) -> bool:
    """Whether a session with these options fuses QDQ node units (onnxruntime's QDQ selectors run
    from ORT_ENABLE_EXTENDED on)."""
    return _level(sess_options) >= GraphOptimizationLevel.ORT_ENABLE_EXTENDED


def folds_batch_norm(sess_options: Any) -> bool:
    """Whether a session with these options folds BatchNormalization into Conv (onnxruntime's
    ConvBNFusion runs from ORT_ENABLE_BASIC on)."""
    return _level(sess_options) >= GraphOptimizationLevel.ORT_ENABLE_BASIC


def fuses_elementwise(sess_options: Any) -> bool:
    """Whether a session with these options runs float32 elementwise groups as one kernel
    (elementwise_fusion.py; onnxruntime's CPU provider has no such fusion, so any level that
    optimizes at all turns it on)."""
    return _level(sess_options) >= GraphOptimizationLevel.ORT_ENABLE_BASIC


class SessionOptions:
    """The part of ``onnxruntime.SessionOptions`` this backend reads (an onnxruntime
    ``SessionOptions`` works too): profiling switches, session config entries and
    ``graph_optimization_level`` (:class:`GraphOptimizationLevel`)."""

    def __init__(self) -> None:
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.enable_profiling = False
        self.profile_file_prefix = "onnx_quant_profile"
        self.log_severity_level = 2
        self._config: dict[str, str] = {}

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise KeyError(f"SessionOptions does not have configuration with key: {key}")
        return self._config[key]


class RunOptions:
    """Accepted where onnxruntime takes ``RunOptions``; runs are synchronous, so only the tag is kept."""

    def __init__(self) -> None:
        self.run_tag = ""
        self.log_severity_level = 2


@dataclass(frozen=True)
class ModelMetadata:
    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ProviderChoice:
    """What a provider list resolved to: the adapter, its options, whether the host may run
    nodes, and the names ``get_providers()`` reports."""

    adapter: int
    options: dict[str, Any]
    host_fallback: bool
    names: list[str]


def _config_entry(sess_options: Any, key: str) -> str | None:
    getter = getattr(sess_options, "get_session_config_entry", None)
    if getter is None:
        return None
    try:
        return getter(key)
    except Exception:  # onnxruntime raises when the key was never set
        return None


def get_available_providers() -> list[str]:
    """Provider names this machine can honour: one per adapter backend (best adapter first), then
    the host, as ``onnxruntime.get_available_providers()`` lists execution providers."""
    names = [BACKEND_NAMES.get(a.backend, a.backend.lower()) for a in list_adapters()]
    return list(dict.fromkeys(names)) + ["CPUExecutionProvider"]


def _adapter_for(name: Any) -> int | None:
    """The adapter index an entry names (``device.select_adapter``'s matching: index, backend,
    name substring, best first), or None when this machine has none."""
    if isinstance(name, bool):
        raise ExecutionError(f"provider {name!r}: expected a name or an adapter index")
    key = str(name).strip().lower()
    alias = {"gl": "opengl", "dx12": "d3d12"}.get(key, key)
    try:
        return select_adapter(None if alias in BEST_GPU_NAMES else (name if isinstance(name, int) else alias)).index
    except DeviceError:
        return None


def resolve_providers(providers: Sequence[Any] | None, provider_options: Sequence[Mapping] | None = None,
                      sess_options: Any = None) -> ProviderChoice:
    """Apply onnxruntime's provider-list semantics to this machine's adapters."""
    entries = list(providers) if providers is not None else ["webgpu", "cpu"]
    if provider_options is not None and len(provider_options) != len(entries):
        raise ExecutionError(f"provider_options: {len(provider_options)} entries for {len(entries)} providers")
    host = _config_entry(sess_options, DISABLE_CPU_FALLBACK) != "1"
    chosen: tuple[int, dict, str] | None = None
    for k, entry in enumerate(entries):
        name, options = (entry if isinstance(entry, tuple) else (entry, {}))
        if provider_options is not None:
            options = {**dict(options), **dict(provider_options[k])}
        if isinstance(name, str) and name.strip().lower() in CPU_NAMES:
            continue
        if chosen is not None:
            continue
        index = _adapter_for(name)
        if index is None:
            names = ", ".join(a.summary for a in list_adapters()) or "none"
            warnings.warn(f"provider {name!r} is not available on this machine (adapters: {names}); skipped",
                          UserWarning, stacklevel=3)
            continue
        chosen = (index, dict(options), str(name))
    if chosen is None:
        names = ", ".join(f"[{a.index}] {a.summary}" for a in list_adapters()) or "none found"
        raise DeviceError(f"providers {entries!r}: none names a GPU adapter of this machine (adapters: {names}); "
                          "onnx-quant runs models on a GPU adapter, with the host only for nodes no kernel takes")
    index, options, name = chosen
    unknown = sorted(set(options) - {"limits", "device_id"})
    if unknown:
        raise ExecutionError(f"provider {name!r}: unknown options {unknown} (known: device_id, limits)")
    names = [f"{name}:{index}"] + (["CPUExecutionProvider"] if host else [])
    return ProviderChoice(index, options, host, names)


class InferenceSession:
    """onnxruntime's ``InferenceSession`` over a GPU :class:`~onnx_quant.backend_wgpu.session.Session`.

    ``path_or_bytes``: a path, serialized bytes or a ModelProto. Extra keyword arguments go to
    ``Session`` (``tunables``, ``variants``, ...)."""

    def __init__(self, path_or_bytes: Any, sess_options: Any = None, providers: Sequence[Any] | None = None,
                 provider_options: Sequence[Mapping] | None = None, **kwargs: Any) -> None:
        self._sess_options = sess_options if sess_options is not None else SessionOptions()
        self._choice = resolve_providers(providers, provider_options, self._sess_options)
        device = get_device(self._choice.adapter, limits=self._choice.options.get("limits"))
        profile = bool(getattr(self._sess_options, "enable_profiling", False))
        kwargs.setdefault("fuse_qdq", fuses_qdq(self._sess_options))
        kwargs.setdefault("fuse_dynamic", fuses_qdq(self._sess_options))  # MatMulIntegerToFloat: same level
        kwargs.setdefault("fold_batch_norm", folds_batch_norm(self._sess_options))
        kwargs.setdefault("fuse_elementwise", fuses_elementwise(self._sess_options))
        self._session = Session(path_or_bytes, device=device, allow_host_fallback=self._choice.host_fallback,
                                profile=profile, **kwargs)
        self._profile_start_ns = time.time_ns()

    # -- what the model declares ---------------------------------------------------------------

    @property
    def session(self):
        """The underlying :class:`~onnx_quant.backend_wgpu.session.Session` (stats, explain, ...)."""
        return self._session

    def get_inputs(self) -> list[NodeArg]:
        return self._session.get_inputs()

    def get_outputs(self) -> list[NodeArg]:
        return self._session.get_outputs()

    def get_overridable_initializers(self) -> list[NodeArg]:
        return []  # feeds never override initializers in this backend (Session refuses them)

    def get_modelmeta(self) -> ModelMetadata:
        m = self._session.model
        # onnxruntime reports INT64_MAX for a model without model_version
        version = int(m.model_version) if m.HasField("model_version") else 2**63 - 1
        return ModelMetadata(m.producer_name, m.graph.name, m.domain, m.doc_string, m.graph.doc_string,
                             version, {p.key: p.value for p in m.metadata_props})

    def get_providers(self) -> list[str]:
        return list(self._choice.names)

    def get_provider_options(self) -> dict[str, dict[str, Any]]:
        return {self._choice.names[0]: dict(self._choice.options)}

    def get_session_options(self) -> Any:
        return self._sess_options

    # -- running -------------------------------------------------------------------------------

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], run_options: Any = None) -> list:
        """Outputs as numpy arrays (all graph outputs when ``output_names`` is None or empty)."""
        return self._session.run(list(output_names) or None if output_names is not None else None, input_feed)

    def run_with_ort_values(self, output_names: Sequence[str] | None, input_dict_ort_values: Mapping[str, Any],
                            run_options: Any = None) -> list[DeviceValue]:
        """Outputs as :class:`DeviceValue` (kept on the device); feeds may be DeviceValues or arrays."""
        names = list(output_names) if output_names else self._session.output_names
        return self._session.run(names, input_dict_ort_values, device_outputs=names)

    def io_binding(self) -> "IOBinding":
        return IOBinding(self)

    def run_with_iobinding(self, iobinding: "IOBinding", run_options: Any = None) -> None:
        iobinding._run()

    # -- profiling -----------------------------------------------------------------------------

    def end_profiling(self) -> str:
        """Write the Chrome trace of the profiled runs (``<profile_file_prefix>_<time>.json``)
        and return its path, as onnxruntime does; "" when profiling is off."""
        prof = self._session.profiler
        if prof is None:
            return ""
        prefix = getattr(self._sess_options, "profile_file_prefix", "") or "onnx_quant_profile"
        path = f"{prefix}_{time.strftime('%Y-%m-%d_%H-%M-%S')}.json"
        return prof.write_trace(path)

    def get_profiling_start_time_ns(self) -> int:
        return self._profile_start_ns


class IOBinding:
    """onnxruntime's IO binding: feeds bound once (host arrays or DeviceValues), outputs bound
    to the host (``device_type="cpu"``) or kept on the device (any other device type)."""

    def __init__(self, sess: InferenceSession) -> None:
        self._sess = sess
        self._inputs: dict[str, Any] = {}
        self._outputs: dict[str, bool] = {}   # name -> keep on device
        self._results: list[Any] = []

    def bind_cpu_input(self, name: str, arr: Any) -> None:
        self._inputs[name] = arr

    def bind_ortvalue_input(self, name: str, value: DeviceValue) -> None:
        self._inputs[name] = value

    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0, element_type: Any = None,
                    shape: Any = None, buffer_ptr: Any = None) -> None:
        if buffer_ptr is not None:
            raise ExecutionError(f"bind_output({name!r}): raw buffer pointers cannot address wgpu buffers; "
                                 "bind without one and read get_outputs()")
        self._outputs[name] = str(device_type).lower() != "cpu"

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()

    def synchronize_inputs(self) -> None:
        """Nothing to wait for: uploads are ordered before the run's submit."""

    def synchronize_outputs(self) -> None:
        """Nothing to wait for: a run returns after its outputs are complete."""

    def _run(self) -> None:
        names = list(self._outputs) or self._sess.session.output_names
        device = [n for n in names if self._outputs.get(n, False)]
        self._results = self._sess.session.run(names, self._inputs, device_outputs=device)

    def get_outputs(self) -> list[Any]:
        """The last run's outputs in binding order: DeviceValue or numpy array."""
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[Any]:
        return [v.numpy() if isinstance(v, DeviceValue) else v for v in self._results]

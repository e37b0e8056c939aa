"""``Session``: run a whole ONNX model on the GPU, shaped like onnxruntime's ``InferenceSession``.

Construction (once per model):

* the model is rewritten as onnxruntime's optimizations would (``rewrites.py``, passes):
  BatchNormalization folded into its Conv; QDQ node units (``DequantizeLinear -> Conv/MatMul/Add/...
  -> QuantizeLinear``) replaced by the QLinear kernels (``qdq_fusion.py``); dynamic-quantization
  units and float32 elementwise groups fused into one node each; NonZero split into its padded GPU
  form and the region run per count (each phase has its keyword to keep the graph as written);
* every node gets its construction-time *placement* (``placement.classify``): a kernel spec that
  takes its op, attributes and element types (``gpu``); a view of its input (``view``: Reshape,
  Flatten, Squeeze, Unsqueeze, Identity, Dropout in inference mode); a Constant (evaluated once);
  or the host (``onnx.reference``), for a node no kernel covers. Host nodes are named in a
  :class:`~onnx_quant.errors.HostFallbackWarning`; ``allow_host_fallback=False`` refuses such a
  model with an ExecutionError listing them;
* initializers and Constant values are kept on the host and uploaded to the device once per
  session, the first time a plan needs them.

Per binding of input shapes (symbolic dims bound from the feeds; one *graph plan* per binding,
cached, at most ``MAX_PLANS`` per session), the graph compiler (``graph_plan.compile``, pure: no
device, no Session) infers every value, folds shape arithmetic, plans each GPU node (a node no
variant takes runs on the host), cuts the schedule into *segments* (one encoder, one submit each)
only where a host node needs a value the open segment produces, and pools the device buffers over
the values' lifetimes: a frozen ``plan.GraphPlan`` and its host nodes as data. The Session keeps
the plan cache and the policy: host nodes warned about or refused, their evaluators built. The
executor prepares a plan's device state once (``executor.prepare_graph``: buffers, pipelines, bind
groups, a ``PreparedGraph`` per plan) and runs it.

``run`` uploads the feeds, runs the schedule and reads back only what host nodes and the
requested outputs need, through one persistent staging buffer per plan. docs/backend.md
("Graph execution") has the details and the costs.
"""

from __future__ import annotations

import builtins
import os
import threading
import time
import warnings
from collections import OrderedDict
from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from onnx_quant.budget import resolve as resolve_budget
from onnx_quant.dtypes import element_type
from onnx_quant.errors import BudgetError, ExecutionError, HostFallbackWarning, IndexRangeError, QuantError
from onnx_quant.model_io import initializer_arrays, load_model

from . import data_dependent as dd
from . import graph_plan as gp
from . import placement, tuning
from .cold_start import ColdStart, PlanDisk
from .control_flow import ControlFlow, body_overrides
from .device import GpuDevice, get_device
from .device_value import DeviceValue
from .executor import (
    PreparedGraph, SessionResources, SessionStats, prepare_graph, release_graph, run_graph,
)
from .graph_index import attributes
from .host_rewrites import host_node
from .host_sizes import check_host_node
from .locking import holding
from .model_check import check_host_outputs, plain_constant, static_values
from .placement import NodeInfo, op_name
from .plan import GraphPlan, HostStep
from .plan_cache import PlanStore
from .plan_entries import plan_entries
from .profiling import Profiler
from .region import DataDependentRegion, HostPaddedNonZero
from .rewrites import RewriteOptions, rewrite_model
from .sequence_steps import SequenceStep, own, read_back, value_shape
from .sequences import is_tensor_type, to_host
from .session_io import NodeArg, check_feeds, input_args, output_args, value_info_shape
from .spec import load_specs
from .tuning_cache import TuningTable
from .verdict import onnx_type

#: graph plans (device buffers included) a session keeps; the least recently used is released
MAX_PLANS = 16


def _bits_of(code: int) -> int:
    """Element bits of a TensorProto code, 64 where unknown (the widest a host node makes)."""
    try:
        return element_type(code).bits
    except QuantError:
        return 64


_SPECS = None


def _specs():
    """The kernel specs, loaded once per process (they are package data)."""
    global _SPECS
    if _SPECS is None:
        _SPECS = load_specs()
    return _SPECS


class Session:
    """Run a model on a wgpu device.

    ``adapter``: index or name substring (see ``device.list_adapters``); ``limits``: "max"
    (default), "default" (WebGPU defaults) or a dict; ``device``: an existing GpuDevice.
    ``tunables``: ``{name: int}`` for every kernel that has the tunable, or
    ``{node name or op type: {name: int}}``. ``variants``: ``{node name or op type: variant id}``
    forces a variant (an ExecutionError when its ``when`` clauses do not hold). ``tune``: on each
    new binding of input shapes, time the variants and tunables the specs allow where the adapter's
    tuning table (tuning_cache.py) has no choice yet, and keep the fastest exact one (tuning.py);
    ``use_tuning_cache``: plan with the table's choices (False: the static rules alone).
    ``allow_host_fallback``: run nodes no kernel covers on the host (onnx.reference; a
    HostFallbackWarning names them), or refuse the model (False: ExecutionError listing them).
    ``specs``: a ``SpecRegistry`` or a folder of ``*.kernel.json`` (default: the installed
    templates). ``base_dir``: the folder external data of a model given as bytes or a ModelProto
    is read from (without it such data is refused; a path's own folder is used for a path).
    ``memory_budget``: bytes (or ``"2G"``) any host allocation may take (onnx_quant/budget.py).
    ``fold_batch_norm``: fold a BatchNormalization into the Conv before it where both have constant
    parameters (bn_folding.py; ``folded_batch_norms`` lists them), as onnxruntime does from
    ``ORT_ENABLE_BASIC`` on; False runs them as written.
    ``fuse_qdq``: replace QDQ node units (DequantizeLinear -> Conv/MatMul/Add/... -> QuantizeLinear)
    by the QLinear kernels onnxruntime substitutes from ``ORT_ENABLE_EXTENDED`` on (qdq_fusion.py;
    ``fusion`` lists them); False runs every node as written (onnxruntime's ``ORT_DISABLE_ALL``).
    ``fuse_dynamic``: replace dynamic-quantization units (DynamicQuantizeLinear -> MatMulInteger /
    ConvInteger -> Cast -> Mul [-> Add] [-> Relu]) by one fused node each (dynamic_fusion.py:
    com.microsoft DynamicQuantizeMatMul / MatMulIntegerToFloat as onnxruntime from
    ``ORT_ENABLE_EXTENDED`` on, or this project's fused ops; ``dynamic_fusion`` lists them).
    ``fuse_elementwise``: run each group of float32 elementwise nodes (a chain or small tree of
    table ops, each intermediate read once) as one generated kernel (elementwise_fusion.py;
    ``elementwise_fusion`` lists them); False runs them one kernel per node.
    ``plan_cache``: read and write the on-disk cache of plans and WGSL (plan_cache.py); False
    plans and renders in this process only. ``cold_start`` times construction and first run.

    ``stats`` (:class:`~backend_wgpu.executor.SessionStats`) counts what the session did:
    plans, pipelines compiled, buffers allocated, bind groups, submits, read-backs, bytes
    uploaded and read back, host nodes run, runs.
    """

    def __init__(
        self,
        model_or_path: Any,
        *,
        adapter: int | str | None = None,
        tunables: Mapping[str, Any] | None = None,
        variants: Mapping[str, str] | None = None,
        allow_host_fallback: bool = True,
        limits: str | Mapping[str, int] | None = None,
        device: GpuDevice | None = None,
        specs: Any = None,
        base_dir: str | os.PathLike | None = None,
        memory_budget: int | str | None = None,
        profile: bool = False,
        fuse_qdq: bool = True,
        fold_batch_norm: bool = True,
        fuse_dynamic: bool = True,
        fuse_elementwise: bool = True,
        tune: bool = False,
        use_tuning_cache: bool = True,
        plan_cache: bool = True,
    ) -> None:
        #: seconds per phase of construction and first run (cold_start.py)
        self.cold_start = ColdStart()
        self._lock = threading.RLock()  # one run at a time per session: backend_wgpu/locking.py
        self.budget = resolve_budget(memory_budget)
        self.model = load_model(model_or_path, load_external_data=True, base_dir=base_dir, budget=self.budget)
        #: the model as loaded, before the construction phases (what an oracle compares with)
        self.source_model = self.model
        self._static_values = static_values(self.model)  # structural faults are refused here, first
        self.cold_start.phase("load")
        self._specs = self._registry(specs)
        # the construction phases (rewrites.py): function bodies for ops without a kernel,
        # BatchNormalization folding, the QDQ, dynamic and elementwise fusions, NonZero's split
        rewritten = rewrite_model(self.model, self._static_values, self._specs, RewriteOptions(
            fold_batch_norm=fold_batch_norm, fuse_qdq=fuse_qdq, fuse_dynamic=fuse_dynamic,
            fuse_elementwise=fuse_elementwise))
        self.model, self._static_values = rewritten.model, rewritten.static_values
        #: nodes without a kernel replaced by their ONNX function bodies (function_expansion.py)
        self.function_expansion = rewritten.expansion
        #: sequence readers replaced by the kernels they amount to (sequences.SequenceRewrite)
        self.sequence_rewrites = rewritten.sequences
        #: the Conv -> BatchNormalization pairs folded into one Conv (bn_folding.py)
        self.folded_batch_norms = rewritten.folded_batch_norms
        #: the QDQ node units replaced by QLinear kernels (qdq_fusion.py), empty with fuse_qdq=False
        self.fusion = rewritten.fusion
        #: the dynamic-quantization units replaced by one fused node each (dynamic_fusion.py)
        self.dynamic_fusion = rewritten.dynamic_fusion
        #: the float32 elementwise groups run as one kernel each (elementwise_fusion.py)
        self.elementwise_fusion = rewritten.elementwise_fusion
        #: fused node -> the unit it replaced, run as written on the host if its kernel declines
        self._fused_units = rewritten.fused_units
        #: If / Loop runners (control_flow.py), per node index, built on first run
        self._control: dict[int, Any] = {}
        self._body_options = {"allow_host_fallback": allow_host_fallback, "memory_budget": self.budget,
                              "fuse_qdq": fuse_qdq, "fold_batch_norm": fold_batch_norm, "fuse_dynamic": fuse_dynamic,
                              "fuse_elementwise": fuse_elementwise, "specs": self._specs, "tunables": tunables, "variants": variants}
        graph = self.model.graph
        self.allow_host_fallback = bool(allow_host_fallback)
        self._opsets = {(imp.domain or ""): imp.version for imp in self.model.opset_import}
        self._initializers = initializer_arrays(self.model, self.budget)
        self._inputs = [vi for vi in graph.input if vi.name not in self._initializers]
        self._outputs = [vi.name for vi in graph.output]
        self._tunables = dict(tunables or {})
        self._variants = dict(variants or {})
        #: the compiler's input (graph_plan.model_graph): every node's construction-time placement
        self._graph = gp.model_graph(rewritten, self.source_model, self._specs, self._initializers)
        self._nodes: list[NodeInfo] = list(self._graph.nodes)
        placement.check_overrides(self._nodes, self._specs, self._opsets, self._tunables, self._variants)
        self._options = gp.CompileOptions(self._tunables, self._variants)
        self._constants: dict[str, np.ndarray] = {}
        self._evaluators: dict[int, Any] = {}
        for info in self._nodes:
            if info.kind == "const":
                self._eval_constant(info)
        # nodes that may fold (shape arithmetic) are only reported when a plan cannot fold them;
        # nodes no graph output can depend on never run
        live = placement.static_live(self._nodes, self._outputs)
        static_host = [i for i in self._nodes if i.kind == "host" and i.index in live
                       and not placement.may_fold(i, self._elem)]
        if static_host and not self.allow_host_fallback:
            raise ExecutionError(
                f"{len(static_host)} node(s) cannot run on the GPU and allow_host_fallback is False: "
                + "; ".join(f"node {i.label!r} ({self._user_op_name(i)}): {i.reason}" for i in static_host))
        for info in static_host:
            self._evaluator(info)  # a node onnx.reference cannot run either is refused now
        #: node index -> why it runs on the host: construction's view until the first plan, then
        #: every node some plan made so far placed on the host
        self._host_labels: dict[int, str] = {i.index: i.reason for i in static_host}
        self._planned_host = False
        if static_host:
            warnings.warn(self._fallback_text(static_host, {i.index: i.reason for i in static_host}),
                          HostFallbackWarning, stacklevel=2)
        self.cold_start.phase("rewrite")
        self.device = device if device is not None else get_device(adapter, limits=limits)
        self.cold_start.phase("device")
        self._tune = bool(tune)
        if use_tuning_cache or tune:
            self._options = gp.CompileOptions(self._tunables, self._variants, TuningTable.load(self.device.info))
        # the on-disk plan cache (plan_cache.py), for the installed specs only, keyed on the tuning
        # table's choices; a tuning session changes the table as it plans, so it stores nothing
        tuned = self._options.tuned
        self._disk = PlanDisk(PlanStore.default() if plan_cache and not tune and self._specs is _SPECS else None,
                              self.source_model, self.device.info,
                              {"rewrites": (fold_batch_norm, fuse_qdq, fuse_dynamic, fuse_elementwise),
                               "tunables": repr(sorted(self._tunables.items())),
                               "variants": repr(sorted(self._variants.items())),
                               "tuning": tuned.digest() if tuned is not None else None})
        self.stats = SessionStats()
        self._resources = SessionResources(self.device, self.stats)
        self._plans: "OrderedDict[tuple, GraphPlan]" = OrderedDict()
        #: plan key -> the executor's device state of that plan (buffers, bind groups, programs)
        self._prepared: dict[tuple, PreparedGraph] = {}
        #: per binding of input shapes: the inputs whose contents its plans are keyed on (phase 0)
        self._value_keyed: dict[tuple, tuple[str, ...]] = {}
        #: what the last ``run`` did (``SessionStats.since``): dispatches, submits, pipelines
        #: compiled, buffers allocated, bytes uploaded / read back, host encode µs, ...
        self.last_run_stats: dict[str, Any] = {}
        #: with ``profile=True``: per node device (or host-wall) times of every run, see profiling.py
        self.profiler = Profiler(self.device) if profile else None

    # -- construction ------------------------------------------------------------------------

    @property
    def kernel_specs(self) -> Any:
        """The kernel registry this session plans with (tuning.py reads its tunables' ``tune``)."""
        return self._specs

    @staticmethod
    def _registry(specs: Any):
        if specs is None:
            return _specs()
        if isinstance(specs, (str, os.PathLike)):
            return load_specs(specs)
        return specs

    def _fallback_text(self, infos: Sequence[NodeInfo], reasons: Mapping[int, str], prefix: str = "") -> str:
        """One warning line: the host nodes grouped by op and reason, a few names each."""
        groups: dict[tuple[str, str], list[str]] = {}
        for i in infos:
            groups.setdefault((op_name(i), reasons.get(i.index, "")), []).append(i.label)
        parts = []
        for (op, why), labels in groups.items():
            shown = ", ".join(labels[:3]) + (f" and {len(labels) - 3} more" if len(labels) > 3 else "")
            parts.append(f"{op} x{len(labels)} ({shown}): {why}" if len(labels) > 1 else f"{shown} ({op}): {why}")
        return (f"{prefix}{len(infos)} node(s) run on the host (onnx.reference); each GPU segment they "
                f"separate costs a submit and a read-back: " + "; ".join(parts))

    def _user_op_name(self, info: NodeInfo) -> str:
        """The op as the user's model has it, for errors: a fused node is named by the ops of the
        unit it replaced (never by the internal fused op)."""
        unit = self._fused_units.get(info.node.output[0]) if info.node.output else None
        if unit is None:
            return op_name(info)
        return "fused unit " + " + ".join(n.op_type for n in unit.nodes)

    def _elem(self, name: str) -> int:
        info = self._static_values.get(name)
        return info.elem_type if info is not None else 0

    # -- host nodes --------------------------------------------------------------------------

    def _evaluator(self, info: NodeInfo, reason: str | None = None):
        """onnx.reference's evaluator (with the com.microsoft ops and Q/DQ of every opset:
        reference_ops.py) of a one-node model holding this node (cached). ``reason``:
        why the node is not on the GPU, for the error when onnx.reference cannot run it either
        (default: the reason found when the session was built)."""
        ev = self._evaluators.get(info.index)
        if ev is not None:
            return ev
        from onnx_quant.reference_ops import reference_evaluator  # noqa: PLC0415 - onnx.reference loads on first use

        node = info.node
        inputs = [n for n in dict.fromkeys(list(node.input) + list(info.implicit)) if n]
        opset = next((o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx")), 0)
        if dd.is_padded(node):  # not an ONNX node: onnx.reference does not know it
            self._evaluators[info.index] = (HostPaddedNonZero(node, opset), inputs)
            return self._evaluators[info.index]
        host, host_opset = host_node(node, opset, info.label)  # where onnx.reference needs it said otherwise
        imports = [onnx.helper.make_opsetid("", host_opset) if o.domain in ("", "ai.onnx") else o
                   for o in self.model.opset_import]
        unit = self._fused_units.get(node.output[0]) if node.output else None
        hosted = [host] if unit is None else list(unit.nodes)  # a fused unit runs as written
        graph = onnx.helper.make_graph(
            hosted, f"host_{info.label}",
            [onnx.ValueInfoProto(name=n) for n in inputs],
            [onnx.ValueInfoProto(name=n) for n in node.output if n])
        one = onnx.helper.make_model(graph, opset_imports=imports,
                                     ir_version=self.model.ir_version, functions=list(self.model.functions))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ev = reference_evaluator(one)  # with the com.microsoft ops and Q/DQ of every opset
        except Exception as e:
            raise ExecutionError(f"node {info.label!r} ({self._user_op_name(info)}): {reason or info.reason or 'no GPU kernel'}, and "
                                 f"onnx.reference cannot run it on the host either: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}") from None
        self._evaluators[info.index] = (ev, inputs)
        return self._evaluators[info.index]

    def _eval_constant(self, info: NodeInfo) -> None:
        plain = plain_constant(info.node) if info.node.domain in ("", "ai.onnx") else None
        try:
            outs = [plain] if plain is not None else self._evaluator(info)[0].run(None, {})
        except Exception as e:
            raise ExecutionError(f"node {info.label!r} (Constant): cannot evaluate: {type(e).__name__}: {e}") from None
        for name, value in zip([o for o in info.node.output if o], outs):
            self._constants[name] = self._as_onnx_dtype(name, value, self._elem(name))

    @staticmethod
    def _as_onnx_dtype(name: str, value: Any, code: int) -> Any:
        if not isinstance(value, np.ndarray) and not np.isscalar(value):
            return value  # sequences, optionals, maps: host-only values
        arr = np.asarray(value)
        t = onnx_type(code)
        if t is not None and arr.dtype != element_type(t).dtype:
            arr = arr.astype(element_type(t).dtype)
        return arr

    def _control_flow(self, info: NodeInfo) -> Any:
        """The runner of an If / Loop / Scan / SequenceMap (control_flow.py), of NonZero's region
        (data_dependent.py) or of a sequence op (sequences.py)."""
        runner = self._control.get(info.index)
        if runner is None:
            make = lambda m: Session(m, device=self.device, **{  # noqa: E731
                **self._body_options, **body_overrides(m, self._tunables, self._variants, self._specs)})
            runner = self._control[info.index] = (
                DataDependentRegion(info, self.model, make, self.stats.add) if info.kind == "sync" else
                SequenceStep(info, make, self.stats.add) if info.kind == "sequence" else
                ControlFlow(info, self.model, {**self._initializers, **self._constants}, make, self.stats.add,
                            self._static_values))
        return runner

    def _run_host(self, step: HostStep, values: dict[str, Any]) -> list[Any]:
        info = self._nodes[step.index]
        feeds = {}
        for name, root, shape in step.inputs:
            v = values[root]
            if shape is not None and isinstance(v, np.ndarray) and tuple(v.shape) != shape:
                v = v.reshape(shape)
            elif shape is not None and isinstance(v, DeviceValue) and v.dims != tuple(shape):
                v = DeviceValue.borrowed(v.device, v.buffer, v.onnx_type, tuple(shape))  # a view op's shape
            feeds[name] = v
        if info.kind in ("control", "sync", "sequence"):
            outs = self._control_flow(info).run(feeds)
            return self._typed_outputs(step, outs)
        feeds = {k: to_host(v) for k, v in feeds.items()}  # onnx.reference reads host arrays
        ev, names = self._evaluator(info)
        out0 = next((o for o in info.node.output if o), "")
        bits = _bits_of((step.output_types[0] if step.output_types else 0) or self._elem(out0))
        check_host_node(self.budget, step.label, step.op_type, [feeds.get(n) if n else None for n in info.node.input],
                        attributes(info.node), bits)
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                outs = ev.run(None, feeds)
        except Exception as e:
            what = f"node {step.label!r} ({step.op_type}) failed on the host (onnx.reference)"
            text = str(e).splitlines()[0] if str(e) else ""
            if isinstance(e, MemoryError):  # beyond what the machine gives now, though within the budget
                raise BudgetError(f"{what}: the allocation failed: {text or 'MemoryError'} (memory budget "
                                  f"{self.budget.limit} bytes; set ONNX_QUANT_MEMORY_BUDGET lower)") from None
            if isinstance(e, builtins.IndexError):  # numpy's out-of-bounds index (Gather, Scatter...)
                raise IndexRangeError(f"{what}: index out of range: {text}") from None
            raise ExecutionError(f"{what}: {type(e).__name__}: {text}") from None
        return self._typed_outputs(step, outs)

    def _typed_outputs(self, step: HostStep, outs: Sequence[Any]) -> list[Any]:
        """A host step's outputs in the element types its plan gives them (else the static ones)."""
        return [self._as_onnx_dtype(n, v, t or self._elem(n)) for n, v, t in zip(step.outputs, outs, step.output_types)]

    # -- onnxruntime-like surface ------------------------------------------------------------

    def get_inputs(self) -> list[NodeArg]:
        return input_args(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        """Declared output types and shapes, completed by inference where the model leaves them
        out (as onnxruntime reports what its own inference found)."""
        return output_args(self.model.graph.output, self._static_values)

    @property
    def input_names(self) -> list[str]:
        return [vi.name for vi in self._inputs]

    @property
    def output_names(self) -> list[str]:
        return list(self._outputs)

    @property
    def host_nodes(self) -> list[str]:
        """``"name (op)"`` of every node placed on the host: those no kernel covers, and those
        a plan made so far sent there (e.g. no variant's ``when`` held for its shapes); with the
        host nodes of the If / Loop / Scan bodies run so far."""
        return list(self.host_node_reasons)

    @property
    def host_node_reasons(self) -> dict[str, str]:
        """``host_nodes`` with why each runs on the host."""
        out = {f"{i.label} ({op_name(i)})": self._host_labels[i.index] for i in self._nodes
               if i.index in self._host_labels}
        for runner in self._control.values():
            for body in runner.body_sessions():
                out.update(body.host_node_reasons)
        return out

    # -- feeds and shapes --------------------------------------------------------------------

    def _check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        return check_feeds(self.device, self._inputs, self._initializers, feeds)

    def _plan_for(self, shapes: Mapping[str, tuple[int, ...]], feeds: Mapping[str, Any] | None = None) -> GraphPlan:
        """The graph plan for these input shapes; where it needs the contents of small integer
        inputs (``graph_plan.value_keyed_inputs``), for those contents too (given ``feeds``)."""
        key = gp.shape_key(shapes)
        keyed = self._value_keyed.get(key, ())
        given = {n: feeds[n] for n in keyed if feeds is not None and isinstance(feeds.get(n), np.ndarray)}
        full = key + gp.value_key(keyed, given)
        gplan = self._plans.get(full)
        if gplan is None:
            gplan = self._build_plan(full, dict(key), given if len(given) == len(keyed) else {}, feeds)
            self._plans[gplan.key] = gplan
            self.stats.plans += 1
            while len(self._plans) > MAX_PLANS:
                old, _ = self._plans.popitem(last=False)
                release_graph(self._prepared.pop(old, None))
        else:
            self._plans.move_to_end(full)
        return gplan

    # -- planning ----------------------------------------------------------------------------

    def _build_plan(self, key: tuple, shapes: Mapping[str, tuple[int, ...]], input_values: Mapping[str, np.ndarray],
                    feeds: Mapping[str, Any] | None = None) -> GraphPlan:
        """The graph compiler (``graph_plan.compile``) for one binding of input shapes (and of the
        contents of the inputs in ``input_values``); the host fallback policy on what it decided."""
        if self._tune:  # measure what the table lacks for these shapes (tuning.py), then plan with it
            tuning.tune(lambda **kw: Session(self.source_model, device=self.device,
                                          **{**self._body_options, "plan_cache": False, **kw}),
                        tuning.feeds_for(self._inputs, shapes, feeds), self._options.tuned,
                        tunables=self._tunables, variants=self._variants)
        self.cold_start.restart()
        compiled = self._disk.lookup(key) if not input_values else None
        if self.stats.plans == 0:
            self.cold_start.plan_cache = "off" if self._disk.store is None else "hit" if compiled else "miss"
        if compiled is None:
            compiled = gp.compile(self._graph, self.device.info, shapes, options=self._options,
                                  input_values=input_values, feeds=feeds, key=key)
            if not input_values:
                self._disk.remember(key, compiled)
        if self.stats.plans == 0:
            self.cold_start.phase("plan")
        if compiled.keyed:  # phase 0: from now on this binding keys on those inputs' contents
            self._value_keyed[gp.shape_key(shapes)] = compiled.keyed
        self._host_policy(compiled, shapes)
        return compiled.plan

    def _host_policy(self, compiled: gp.Compiled, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Warn about (or, with ``allow_host_fallback=False``, refuse) the plan's host nodes not
        known to run there yet (a node no variant takes at these shapes, a shape computation
        inference could not fold); build every host node's evaluator (refusing one onnx.reference
        cannot run) and refuse one whose outputs exceed the memory budget."""
        reasons = {h.index: h.reason for h in compiled.host}
        new_host = [self._nodes[h.index] for h in compiled.host if h.declined or h.index not in self._host_labels]
        if new_host:
            if not self.allow_host_fallback:
                raise ExecutionError(
                    f"input shapes {dict(shapes)}: {len(new_host)} node(s) cannot run on the GPU and "
                    f"allow_host_fallback is False: "
                    + "; ".join(f"node {i.label!r} ({self._user_op_name(i)}): {reasons[i.index]}" for i in new_host))
            for info in new_host:
                self._evaluator(info, reasons.get(info.index))
            warnings.warn(self._fallback_text(new_host, reasons, f"input shapes {dict(shapes)}: "),
                          HostFallbackWarning, stacklevel=5)
        if not self._planned_host:  # from now on: what the plans placed on the host
            self._host_labels = {}
            self._planned_host = True
        for h in compiled.host:
            info = self._nodes[h.index]
            self._evaluator(info, h.reason)
            self._host_labels.setdefault(h.index, h.reason)
            # outputs inference sized: refused now, before any run allocates them
            check_host_outputs(self.budget, info.label, self._user_op_name(info), info.node.output, compiled.values)

    @holding("_lock")
    def plans(self, input_shapes: Mapping[str, Sequence[int]]) -> list[Any]:
        """The (cached) kernel plan of every node that runs on the GPU for these input shapes,
        in execution order (views, constants, folded and host nodes have none)."""
        return [st.plan for st in self._plan_for({k: gp.input_shape(v) for k, v in input_shapes.items()}).gpu_steps]

    # -- run ---------------------------------------------------------------------------------

    @holding("_lock")
    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any], run_options: Any = None, *,
            device_outputs: Sequence[str] = ()) -> list[Any]:
        """Outputs in the order asked for (all graph outputs when ``output_names`` is None), as
        numpy arrays in the dtypes ``onnx.numpy_helper.to_array`` uses; the names in
        ``device_outputs`` come back as :class:`DeviceValue` (kept on the device, each in a
        buffer of its own until released). A feed may be a DeviceValue of this session's device."""
        wanted = list(self._outputs) if output_names is None else list(output_names)
        known = set(self._outputs)
        missing = [n for n in wanted if n not in known]
        if missing:
            raise ExecutionError(f"outputs {missing}: not outputs of the model (outputs: {self._outputs})")
        keep = set(device_outputs or ())
        if keep - set(wanted):
            raise ExecutionError(f"device_outputs {sorted(keep - set(wanted))}: not among the outputs asked for "
                                 f"({wanted})")
        arrays = self._check_feeds(feeds)
        before = self.stats.snapshot()
        gplan = self._plan_for({k: value_shape(a) for k, a in arrays.items()}, arrays)
        constants = {**self._initializers, **self._constants}
        prep = self._prepared.get(gplan.key)
        first = self.stats.runs == 0
        if first:
            t_run, pipes = time.perf_counter(), self.device.pipelines
            before_pipes = (pipes.render_s, pipes.compile_s)
        if prep is None or prep.plan is not gplan:
            prep = self._prepared[gplan.key] = prepare_graph(self.device, gplan, self._resources, constants,
                                                             self._disk.shaders_for(gplan.key))
            self._disk.prepared(gplan.key, prep.shaders)
        host_values: dict[str, Any] = {**constants, **gplan.folded, **arrays}
        wanted_roots = frozenset(gplan.alias[n][0] for n in wanted if n not in keep)
        kept_roots = frozenset(r for r in (gplan.alias[n][0] for n in keep) if gplan.roots[r].origin == "gpu")
        self.stats.runs += 1
        values, kept = run_graph(self.device, prep, self._resources, arrays, host_values, self._run_host,
                                 wanted_roots, kept_roots=kept_roots, profiler=self.profiler)
        if first:
            rendered, compiled = pipes.render_s - before_pipes[0], pipes.compile_s - before_pipes[1]
            self.cold_start.add("render", rendered)
            self.cold_start.add("compile", compiled)
            self.cold_start.add("first run", time.perf_counter() - t_run - rendered - compiled)
        result: list[Any] = []
        made: dict[str, DeviceValue] = {}
        for n in wanted:
            root, shape = gplan.alias[n]
            if n in keep:
                result.append(self._device_output(gplan, root, shape, kept, made, values))
                continue
            if root not in values:
                raise ExecutionError(f"output {n!r} was not produced")
            v = values[root]
            if isinstance(v, list) or v is None:  # a sequence (its elements read back at once), an empty optional
                v, nbytes = read_back(self.device, v)
                if nbytes:
                    self.stats.readbacks += 1
                    self.stats.bytes_read_back += nbytes
            elif isinstance(v, DeviceValue):  # a device feed, or a sequence step's tensor, asked back
                v = v.numpy()
                self.stats.readbacks += 1
                self.stats.bytes_read_back += max(4, (v.nbytes + 3) // 4 * 4)
            elif isinstance(v, np.ndarray):
                if shape is not None and tuple(v.shape) != shape:
                    v = v.reshape(shape)
                if gplan.roots[root].origin in ("feed", "init", "const", "fold") or root != n or wanted.count(n) > 1:
                    v = np.array(v, copy=True)
            result.append(v)
        self.last_run_stats = self.stats.since(before)  # with the outputs' read-backs and copies
        return result

    def _device_output(self, gplan: GraphPlan, root: str, shape, kept: dict, made: dict,
                       values: Mapping[str, Any]) -> DeviceValue:
        """An output kept on the device: the run's own copy of a GPU-produced root; a device copy
        of a device value (a feed passed through, or the same root asked for twice); else the
        host value uploaded."""
        r = gplan.roots[root]
        dims = tuple(shape if shape is not None else r.shape or ())
        buf = kept.pop(root, None)
        if buf is not None:
            made[root] = DeviceValue(self.device, buf, r.onnx_type, dims)
            return made[root]
        src = made.get(root, values.get(root))
        if isinstance(src, list) or (src is None and root in values):  # a sequence, an optional
            return own(src, self.device, self._resources)
        if isinstance(src, DeviceValue):
            n = max(4, r.nbytes)
            dst = self._resources.allocate(n, label=f"kept output {root}")
            self.device.launch([], copies=[(src.buffer, 0, dst, 0, n)])
            self.stats.submits += 1
            return DeviceValue(self.device, dst, r.onnx_type, dims)
        if src is None:
            raise ExecutionError(f"output {root!r} was not produced")
        out = DeviceValue.from_numpy(np.asarray(src).reshape(dims), self.device, r.onnx_type)
        self.stats.bytes_uploaded += out.nbytes
        return out

    # -- explain -----------------------------------------------------------------------------

    def _explain_shapes(self, input_shapes: Mapping[str, Sequence[int]] | None) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {}
        given = dict(input_shapes or {})
        for vi in self._inputs:
            if vi.name in given:
                shapes[vi.name] = gp.input_shape(given[vi.name])
                continue
            if not is_tensor_type(vi.type):
                continue  # a sequence or optional: its contents stay unknown
            dims = value_info_shape(vi)
            if dims is None:
                raise ExecutionError(f"input {vi.name!r} has no declared shape; give its shape")
            shapes[vi.name] = tuple(d if isinstance(d, int) else 1 for d in dims)
        return shapes

    @holding("_lock")
    def explain(self, input_shapes: Mapping[str, Sequence[int]] | None = None) -> list[dict[str, Any]]:
        """Per node, in graph order: node, op_type, placement (``gpu``, ``host``, ``view``,
        ``constant``, ``folded``, ``unused``), reason (why not gpu), kernel and variant
        (``"host"``/``"view"``/... for the others), why (derived values, when clauses, the
        first failing clause of every variant), tunables, shapes, segment (None for a GPU node run once per
        plan: ``once_per_plan``), passes
        [{id, name, dispatch, once_per_plan}] (a leading pass over constants only runs once per plan), fused (for a node that replaced a QDQ node unit: {rule, nodes: the
        unit's nodes as written}; else None). Input dims the model leaves symbolic or unknown are taken
        from ``input_shapes``, else 1."""
        return plan_entries(self._plan_for(self._explain_shapes(input_shapes)), self._nodes,
                            self.device.info.name, self._fused_units)

    @holding("_lock")
    def summary(self, input_shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, Any]:
        """What a run for these input shapes costs: segments (= submits), GPU/host/view nodes,
        pooled values vs pooled buffers (buffer reuse), uniform bytes."""
        gplan = self._plan_for(self._explain_shapes(input_shapes))
        count: dict[str, int] = {}
        for kind, _ in gplan.placement.values():
            count[kind] = count.get(kind, 0) + 1
        return {
            "segments": len(gplan.segments),
            "submits_per_run": len(gplan.segments),
            "host_steps": sum(1 for s in gplan.schedule if isinstance(s, HostStep)),
            "placement": count,
            "memory": gplan.memory(),
            "uniform_bytes": gplan.uniform_size,
        }

    # -- lifetime ----------------------------------------------------------------------------

    @holding("_lock")
    def close(self) -> None:
        """Release the device buffers of this session's plans, initializers and constants (the
        pipelines stay cached on the device)."""
        for prep in self._prepared.values():
            release_graph(prep)
        self._prepared.clear()
        self._plans.clear()
        for runner in self._control.values():
            for body in runner.body_sessions():
                body.close()
        self._resources.release()
        if self.profiler is not None:
            self.profiler.release()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

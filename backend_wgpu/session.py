"""``Session``: run an ONNX model on the GPU, shaped like onnxruntime's ``InferenceSession``.

For now a Session runs models whose nodes all have a kernel spec (``templates/*.kernel.json``,
e.g. DynamicQuantizeLinear); a node without one is an ``ExecutionError`` naming the node and
its op (the graph executor generalises this). Per run:

1. the feeds are checked (every graph input present, no unknown names, the model's dtype,
   rank and fixed dims) before anything touches the device;
2. shapes come from ``inference.infer_values(model, input_shapes from the feeds)``;
3. each node is planned (``planner.plan_node``) once per binding of input shapes, and the
   plans are cached; the executor caches each plan's buffers, pipelines and bind groups on
   the device, so a second run of the same shapes compiles and allocates nothing;
4. every node runs as one submit (``executor.run_plan``), in graph order.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from backend_wgpu.device import GpuDevice, get_device
from onnx_quant.dtypes import element_type, type_name
from onnx_quant.errors import ExecutionError, QuantError
from onnx_quant.model_io import load_model

DEFAULT_DOMAINS = ("", "ai.onnx")


class _NodeArg:
    """What ``get_inputs()``/``get_outputs()`` return, like onnxruntime's NodeArg."""

    def __init__(self, name: str, elem_type: int, shape: list[Any]) -> None:
        self.name = name
        self.type = f"tensor({type_name(elem_type)})"
        self.elem_type = elem_type
        self.shape = shape

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape})"


def _value_info_shape(vi: onnx.ValueInfoProto) -> list[Any] | None:
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    dims: list[Any] = []
    for d in t.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dims


_SPECS = None


def _specs():
    """The kernel specs, loaded once per process (they are package data)."""
    global _SPECS
    if _SPECS is None:
        from backend_wgpu.spec import load_specs  # noqa: PLC0415

        _SPECS = load_specs()
    return _SPECS


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as onnx.helper.get_attribute_value gives them, bytes decoded."""
    out: dict[str, Any] = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif isinstance(v, list):
            v = [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in v]
        out[a.name] = v
    return out


def node_label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}_{index}"


class Session:
    """Run a model on a wgpu device.

    ``adapter``: index or name substring (see ``device.list_adapters``); ``limits``: "max"
    (default), "default" (WebGPU defaults) or a dict; ``device``: an existing GpuDevice.
    ``tunables``: ``{name: int}`` for every kernel that has the tunable, or
    ``{node name or op type: {name: int}}``. ``variants``: ``{node name or op type: variant id}``
    forces a variant (an ExecutionError when its ``when`` clauses do not hold).
    """

    def __init__(
        self,
        model_or_path: Any,
        *,
        adapter: int | str | None = None,
        tunables: Mapping[str, Any] | None = None,
        variants: Mapping[str, str] | None = None,
        device: GpuDevice | None = None,
        limits: str | Mapping[str, int] | None = None,
    ) -> None:
        self.model = load_model(model_or_path)
        graph = self.model.graph
        self._opsets = {(imp.domain or ""): imp.version for imp in self.model.opset_import}
        specs = _specs()
        self._initializers = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
        self._inputs = [vi for vi in graph.input if vi.name not in self._initializers]
        self._outputs = [vi.name for vi in graph.output]
        self._nodes: list[tuple[str, onnx.NodeProto, Any]] = []
        for i, node in enumerate(graph.node):
            label = node_label(node, i)
            domain = node.domain or ""
            version = self._opsets.get(domain, self._opsets.get("ai.onnx" if domain == "" else domain))
            if version is None:
                raise ExecutionError(f"node {label!r} ({node.op_type}): the model imports no opset for domain "
                                     f"{domain or 'ai.onnx'!r}")
            spec = specs.find(domain, node.op_type, version)
            if spec is None:
                known = ", ".join(f"{d or 'ai.onnx'}::{op}" for d, op in specs.ops()) or "none"
                raise ExecutionError(f"node {label!r}: op {domain + '::' if domain else ''}{node.op_type} "
                                     f"(opset {version}) has no GPU kernel yet (kernels: {known})")
            self._nodes.append((label, node, spec))
        self._tunables = dict(tunables or {})
        self._variants = dict(variants or {})
        self._check_overrides()
        self.device = device if device is not None else get_device(adapter, limits=limits)
        self._plans: dict[tuple, list[Any]] = {}

    # -- onnxruntime-like surface ------------------------------------------------------------

    def get_inputs(self) -> list[_NodeArg]:
        return [_NodeArg(vi.name, vi.type.tensor_type.elem_type, _value_info_shape(vi) or []) for vi in self._inputs]

    def get_outputs(self) -> list[_NodeArg]:
        return [_NodeArg(vi.name, vi.type.tensor_type.elem_type, _value_info_shape(vi) or [])
                for vi in self.model.graph.output]

    @property
    def input_names(self) -> list[str]:
        return [vi.name for vi in self._inputs]

    @property
    def output_names(self) -> list[str]:
        return list(self._outputs)

    # -- overrides ---------------------------------------------------------------------------

    def _check_overrides(self) -> None:
        names = {label for label, _, _ in self._nodes} | {n.op_type for _, n, _ in self._nodes}
        for key in self._variants:
            if key not in names:
                raise ExecutionError(f"variants: {key!r} is neither a node name nor an op type of this model "
                                     f"(nodes/ops: {', '.join(sorted(names))})")
        global_tun = {k: v for k, v in self._tunables.items() if not isinstance(v, Mapping)}
        for key, v in self._tunables.items():
            if isinstance(v, Mapping) and key not in names:
                raise ExecutionError(f"tunables: {key!r} is neither a node name nor an op type of this model")
        known = {t for _, _, spec in self._nodes for t in spec.tunables}
        unknown = sorted(set(global_tun) - known)
        if unknown and self._nodes:
            raise ExecutionError(f"tunables {unknown}: no kernel of this model has them (known: {sorted(known)})")

    def _node_overrides(self, label: str, node: onnx.NodeProto, spec) -> tuple[dict[str, int], str | None]:
        tun = {k: v for k, v in self._tunables.items() if not isinstance(v, Mapping) and k in spec.tunables}
        for key in (node.op_type, label):
            v = self._tunables.get(key)
            if isinstance(v, Mapping):
                tun.update(v)
        variant = self._variants.get(label, self._variants.get(node.op_type))
        return tun, variant

    # -- feeds and shapes --------------------------------------------------------------------

    def _check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if not isinstance(feeds, Mapping):
            raise ExecutionError(f"feeds must be a dict of input name -> array, found {type(feeds).__name__}")
        expected = {vi.name: vi for vi in self._inputs}
        unknown = sorted(set(feeds) - set(expected))
        if unknown:
            raise ExecutionError(f"feeds {unknown}: not inputs of the model (inputs: {sorted(expected)})")
        arrays: dict[str, np.ndarray] = {}
        for name, vi in expected.items():
            if name not in feeds:
                raise ExecutionError(f"input {name!r} is missing from the feeds")
            value = feeds[name]
            arr = value if isinstance(value, np.ndarray) else np.asarray(value)
            code = vi.type.tensor_type.elem_type
            try:
                want = element_type(code)
            except QuantError:
                raise ExecutionError(f"input {name!r}: element type {type_name(code)} is not supported") from None
            if arr.dtype != want.dtype:
                raise ExecutionError(f"input {name!r}: expected {want.name} ({want.dtype}), found {arr.dtype}")
            dims = _value_info_shape(vi)
            if dims is not None:
                if arr.ndim != len(dims):
                    raise ExecutionError(f"input {name!r}: expected rank {len(dims)} {dims}, found rank {arr.ndim} "
                                         f"{list(arr.shape)}")
                for axis, (d, n) in enumerate(zip(dims, arr.shape)):
                    if isinstance(d, int) and d != n:
                        raise ExecutionError(f"input {name!r}: dim {axis} must be {d}, found {n} "
                                             f"(shape {list(arr.shape)})")
            arrays[name] = arr
        return arrays

    def _plans_for(self, shapes: Mapping[str, tuple[int, ...]]) -> list[Any]:
        key = tuple(sorted((k, tuple(v)) for k, v in shapes.items()))
        plans = self._plans.get(key)
        if plans is None:
            plans = self._make_plans(shapes)
            self._plans[key] = plans
        return plans

    def _make_plans(self, shapes: Mapping[str, tuple[int, ...]]) -> list[Any]:
        from backend_wgpu.planner import plan_node  # noqa: PLC0415
        from inference import infer_values  # noqa: PLC0415

        try:
            values = infer_values(self.model, {k: list(v) for k, v in shapes.items()}, strict=False)
        except QuantError as e:
            raise ExecutionError(f"shape inference for input shapes {dict(shapes)} failed: {e}") from None
        plans = []
        for label, node, spec in self._nodes:
            io_shapes: dict[str, tuple[int, ...]] = {}
            io_types: dict[str, str] = {}
            for spec_names, value_names in ((list(spec.inputs), list(node.input)), (list(spec.outputs), list(node.output))):
                for i, sname in enumerate(spec_names):
                    vname = value_names[i] if i < len(value_names) else ""
                    if not vname:
                        if sname in spec.inputs and getattr(spec.inputs[sname], "optional", False):
                            continue  # an absent optional input: the planner binds a zero stand-in
                        raise ExecutionError(f"node {label!r} ({node.op_type}): {sname!r} is not connected")
                    info = values.get(vname)
                    if info is None or info.shape is None or not all(isinstance(d, int) for d in info.shape):
                        raise ExecutionError(f"node {label!r} ({node.op_type}): shape of {vname!r} is not known "
                                             f"({None if info is None else info.shape})")
                    io_shapes[sname] = tuple(int(d) for d in info.shape)
                    io_types[sname] = type_name(info.elem_type)
            tun, variant = self._node_overrides(label, node, spec)
            plan = plan_node(spec, shapes=io_shapes, dtypes=io_types, device=self.device.info,
                             tunables=tun, variant=variant, node_label=label,
                             attributes=_attributes(node))
            plans.append(plan)
        return plans

    def plans(self, input_shapes: Mapping[str, Sequence[int]]) -> list[Any]:
        """The (cached) plan of every node for the given input shapes."""
        return self._plans_for({k: tuple(int(d) for d in v) for k, v in input_shapes.items()})

    # -- run ---------------------------------------------------------------------------------

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any], run_options: Any = None) -> list[np.ndarray]:
        """Outputs in the order asked for (all graph outputs when ``output_names`` is None)."""
        from backend_wgpu.executor import run_plan  # noqa: PLC0415

        wanted = list(self._outputs) if output_names is None else list(output_names)
        known = set(self._outputs)
        missing = [n for n in wanted if n not in known]
        if missing:
            raise ExecutionError(f"outputs {missing}: not outputs of the model (outputs: {self._outputs})")
        arrays = self._check_feeds(feeds)
        plans = self._plans_for({k: tuple(a.shape) for k, a in arrays.items()})
        values: dict[str, np.ndarray] = {**self._initializers, **arrays}
        for (label, node, spec), plan in zip(self._nodes, plans):
            inputs = {}
            for i, sname in enumerate(spec.inputs):
                vname = node.input[i] if i < len(node.input) else ""
                if not vname:
                    continue  # absent optional input
                if vname not in values:
                    raise ExecutionError(f"node {label!r}: input {vname!r} has no value")
                inputs[sname] = values[vname]
            outs = run_plan(self.device, plan, inputs, node=label)
            for i, sname in enumerate(spec.outputs):
                if i < len(node.output) and node.output[i]:
                    values[node.output[i]] = outs[sname]
        result = []
        for n in wanted:
            if n not in values:
                raise ExecutionError(f"output {n!r} was not produced")
            v = values[n]
            result.append(np.array(v, copy=True) if (n in arrays or n in self._initializers) else v)
        return result

    # -- explain -----------------------------------------------------------------------------

    def explain(self, input_shapes: Mapping[str, Sequence[int]] | None = None) -> list[dict[str, Any]]:
        """Per node: node, op_type, kernel, variant, why (derived values, when clauses, the
        first failing clause of every variant), tunables, shapes, passes [{id, name, dispatch}].

        Input dims the model leaves symbolic or unknown are taken from ``input_shapes``, else 1.
        """
        from backend_wgpu.planner import describe  # noqa: PLC0415

        shapes: dict[str, tuple[int, ...]] = {}
        given = dict(input_shapes or {})
        for vi in self._inputs:
            if vi.name in given:
                shapes[vi.name] = tuple(int(d) for d in given[vi.name])
                continue
            dims = _value_info_shape(vi)
            if dims is None:
                raise ExecutionError(f"input {vi.name!r} has no declared shape; give its shape")
            shapes[vi.name] = tuple(d if isinstance(d, int) else 1 for d in dims)
        plans = self._plans_for(shapes)
        out = []
        for (label, node, spec), plan in zip(self._nodes, plans):
            d = describe(plan)
            shapes_here = {n: list(b.shape) for n, b in plan.buffers.items()
                           if b.role in ("input", "output") and b.shape is not None}
            out.append({
                "node": label,
                "op_type": node.op_type,
                "kernel": d["kernel"],
                "variant": d["variant"],
                "derived": d["derived"],
                "when": d["when"],
                "selection": d["selection"],
                "tunables": d["tunables"],
                "shapes": shapes_here,
                "device": self.device.info.name,
                "passes": [{"id": p["id"], "name": p["name"], "dispatch": p["dispatch"]} for p in d["passes"]],
            })
        return out

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Release the device buffers of this session's plans (the pipelines stay cached)."""
        from backend_wgpu.executor import release_plan  # noqa: PLC0415

        for plans in self._plans.values():
            for plan in plans:
                release_plan(self.device, plan)
        self._plans.clear()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


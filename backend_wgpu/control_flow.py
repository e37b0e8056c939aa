"""If, Loop, Scan and SequenceMap: the host decides, the bodies run on the GPU.

An ``If``, ``Loop``, ``Scan`` (9 on; Scan-8's batch axis is not taken) or ``SequenceMap`` node is a
step of the host schedule (like a host node, but no host fallback): its inputs are read back (for a
condition the plan folded, nothing is read; a sequence is the list of device values it is,
sequences.py), the host picks the branch, runs the loop's iterations or maps the body over the
sequences' elements, and each body runs through a
:class:`~onnx_quant.backend_wgpu.session.Session` of its own on the same device, built once per
body: the body graph as a model whose inputs are the body's own inputs and the outer-scope values
it reads (the parent's initializers and Constants it reads become the body model's initializers,
uploaded once). Its plans are cached like any session's, so a Loop's iterations compile nothing
after the first. The body session inherits the parent's ``allow_host_fallback``: a body node no
kernel takes is warned about or refused like any other.

Costs (docs/backend.md, "Control flow"): one read-back of the step's inputs (the condition, the
trip count and the values the body reads) and one upload of them into the body's plan; a Loop
pays that per iteration. Outputs come back to the host and are uploaded where GPU nodes read them.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_quant.dtypes import element_type
from onnx_quant.errors import ExecutionError, QuantError, in_context

from .graph_index import free_names, with_nested
from .sequences import to_host

CONTROL_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})
#: what placement says of an If / Loop / Scan
CONTROL_WHY = "control flow: the host reads the condition and runs the chosen body on the GPU"
#: iterations a Loop may run when neither its trip count nor its condition stops it sooner
MAX_LOOP_ITERATIONS = 1_000_000


def is_control(domain: str, op_type: str, version: int) -> bool:
    return domain in ("", "ai.onnx") and op_type in CONTROL_OPS and (op_type != "Scan" or version >= 9)


def body_overrides(model: onnx.ModelProto, tunables: Mapping[str, Any], variants: Mapping[str, str],
                   specs: Any) -> dict[str, Any]:
    """A body session's tunables and variants (an If / Loop / Scan body, NonZero's region): those
    naming its nodes (at any depth) or, global, some kernel it may run; the parent accepted the
    others for its own nodes or other bodies."""
    nodes = with_nested(model.graph.node)
    names = {n.name for n in nodes} | {n.op_type for n in nodes}
    opsets = {(o.domain or ""): o.version for o in model.opset_import}
    found = [specs.find(n.domain or "", n.op_type, opsets.get(n.domain or "", 0)) for n in nodes]
    known = {t for spec in found if spec is not None for t in spec.tunables}
    return {"tunables": {k: v for k, v in tunables.items() if k in (names if isinstance(v, Mapping) else known)},
            "variants": {k: v for k, v in variants.items() if k in names}}


def _anonymous(tp: onnx.TypeProto) -> onnx.TypeProto:
    """``tp`` with every dim of its tensors anonymous (a body's plans bind them)."""
    out = onnx.TypeProto()
    out.CopyFrom(tp)
    inner = out
    while inner.WhichOneof("value") in ("sequence_type", "optional_type"):
        inner = getattr(inner, inner.WhichOneof("value")).elem_type
    if inner.HasField("tensor_type") and inner.tensor_type.HasField("shape"):
        for d in inner.tensor_type.shape.dim:
            d.Clear()
    return out


def _value_info(name: str, value: Any, info: Any = None) -> onnx.ValueInfoProto:
    """A graph input typed like ``value`` (an array or DeviceValue), every dim anonymous (the
    body's plans bind them); a sequence or optional as inference types it (``info``)."""
    if getattr(info, "type_proto", None) is not None:
        return helper.make_value_info(name, _anonymous(info.type_proto))
    if isinstance(value, (list, tuple)) or value is None:
        raise ExecutionError(f"value {name!r}: a sequence or optional whose type is not known")
    code = element_type(value.dtype).code
    return helper.make_tensor_value_info(name, code, [None] * len(np.shape(value) if not hasattr(value, "dims")
                                                                else value.dims))


class ControlFlow:
    """Runs one If or Loop node: :meth:`run` takes the node's feeds (its inputs and the outer
    values its bodies read, by name) and returns its outputs."""

    def __init__(self, info: Any, model: onnx.ModelProto, constants: Mapping[str, np.ndarray],
                 make_session: Callable[[onnx.ModelProto], Any], absorb: Callable[[Mapping[str, Any]], None],
                 types: Mapping[str, Any] | None = None):
        self.info = info
        self.model = model
        self.constants = constants
        self.types = types or {}  # the parent's static values: the types of the sequences a body reads
        self.make_session = make_session
        self.absorb = absorb
        self.bodies = {a.name: a.g for a in info.node.attribute if a.type == onnx.AttributeProto.GRAPH}
        self._sessions: dict[str, tuple[Any, list[str]]] = {}

    def body_sessions(self) -> list[Any]:
        """The body sessions built so far (their host nodes are the node's)."""
        return [session for session, _ in self._sessions.values()]

    def _fail(self, what: str, cause: QuantError | None = None) -> ExecutionError:
        text = f"node {self.info.label!r} ({self.info.node.op_type}): {what}"
        return ExecutionError(text) if cause is None else in_context(cause, text)

    def _body(self, attr: str, explicit: list[np.ndarray], outer: Mapping[str, Any]) -> tuple[Any, list[str]]:
        """The body's Session (built on first use) and the names of its graph inputs."""
        if attr in self._sessions:
            return self._sessions[attr]
        body = self.bodies.get(attr)
        if body is None:
            raise self._fail(f"has no {attr} graph")
        g = onnx.GraphProto()
        g.CopyFrom(body)
        g.name = f"{self.info.label}_{attr}"
        del g.input[:]
        for decl, value in zip(body.input, explicit):
            # a sequence / optional as declared; a tensor with its element type, else typed from
            # the value (function bodies, e.g. Range's expansion, declare loop inputs untyped)
            kind = decl.type.WhichOneof("value")
            declared = kind in ("sequence_type", "optional_type") or (kind == "tensor_type"
                                                                      and decl.type.tensor_type.elem_type)
            g.input.append(decl if declared else _value_info(decl.name, value))
        inputs = [i.name for i in body.input]
        for name in free_names(body):
            if name in self.constants:  # a weight of the parent: uploaded once, with the body's plans
                g.initializer.append(numpy_helper.from_array(np.asarray(self.constants[name]), name))
            elif name in outer:
                g.input.append(_value_info(name, outer[name], self.types.get(name)))
                inputs.append(name)
            else:
                raise self._fail(f"its {attr} reads {name!r}, which the outer graph does not give it")
        for o in g.output:  # the branch's plans decide the shapes; types as declared
            if o.type.HasField("tensor_type"):
                o.type.tensor_type.ClearField("shape")
            else:
                o.type.CopyFrom(_anonymous(o.type))
        imports = list(self.model.opset_import)
        child = helper.make_model(g, opset_imports=imports, ir_version=self.model.ir_version,
                                  functions=list(self.model.functions))
        try:
            session = self.make_session(child)
        except QuantError as e:
            raise self._fail(f"its {attr} cannot run: {e}") from None
        self._sessions[attr] = (session, inputs)
        return self._sessions[attr]

    def _run_body(self, attr: str, explicit: list[Any], outer: Mapping[str, Any]) -> list[Any]:
        """One run of a body. Its sequences and optionals stay on the device (each element a
        DeviceValue of its own: a Loop's carried sequence copies only what an iteration adds),
        and so do SequenceMap's outputs, the elements of its sequences."""
        session, names = self._body(attr, explicit, outer)
        feeds = dict(zip(names, explicit))
        feeds.update({n: outer[n] for n in names[len(explicit):]})
        keep = [vo.name for vo in self.bodies[attr].output
                if self.info.node.op_type == "SequenceMap" or vo.type.WhichOneof("value") not in (None, "tensor_type")]
        try:
            outs = session.run(None, feeds, device_outputs=keep)
        except QuantError as e:
            raise self._fail(f"{attr}: {e}", e) from None
        self.absorb(session.last_run_stats)
        return outs

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        node = self.info.node
        if node.op_type == "If":
            cond = np.asarray(feeds[node.input[0]])
            if cond.size != 1:
                raise self._fail(f"the condition has {cond.size} elements, expected 1")
            return self._run_body("then_branch" if bool(cond.reshape(-1)[0]) else "else_branch", [], feeds)
        if node.op_type == "Scan":
            return self._scan(feeds)
        if node.op_type == "SequenceMap":
            return self._sequence_map(feeds)
        return self._loop(feeds)

    def _sequence_map(self, feeds: Mapping[str, Any]) -> list[Any]:
        """The body once per element of the sequence inputs (a tensor input given whole to each
        run), each output collected into a sequence."""
        node = self.info.node
        values = [feeds[n] for n in node.input]
        n = len(values[0])
        if any(isinstance(v, list) and len(v) != n for v in values):
            raise self._fail(f"its sequences have {sorted({len(v) for v in values if isinstance(v, list)})} "
                             "elements, expected one count")
        outs: list[list[Any]] = [[] for _ in node.output]
        for i in range(n):
            results = self._run_body("body", [v[i] if isinstance(v, list) else v for v in values], feeds)
            for k, o in enumerate(results):
                outs[k].append(o)
        return outs

    def _scan(self, feeds: Mapping[str, Any]) -> list[Any]:
        """Scan-9 on: the scan inputs sliced along their axes (reversed where asked), the state
        carried, the scan outputs stacked along theirs."""
        node = self.info.node
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.type != onnx.AttributeProto.GRAPH}
        m = int(attrs["num_scan_inputs"])
        values = [np.asarray(to_host(feeds[n])) for n in node.input]
        state, xs = values[:len(values) - m], values[len(values) - m:]
        in_axes = [a % x.ndim if x.ndim else 0 for a, x in zip(attrs.get("scan_input_axes", [0] * m), xs)]
        in_dirs = list(attrs.get("scan_input_directions", [0] * m))
        steps = {x.shape[a] for x, a in zip(xs, in_axes)}
        if len(steps) != 1:
            raise self._fail(f"the scan inputs have {sorted(steps)} steps along their axes, expected one count")
        n_steps = steps.pop()
        collected: list[list[np.ndarray]] = []
        for t in range(n_steps):
            slices = [np.take(x, n_steps - 1 - t if d else t, axis=a) for x, a, d in zip(xs, in_axes, in_dirs)]
            outs = self._run_body("body", [*state, *slices], feeds)
            state = [np.asarray(o) for o in outs[:len(state)]]
            if not collected:
                collected = [[] for _ in outs[len(state):]]
            for k, o in enumerate(outs[len(state):]):
                collected[k].append(np.asarray(o))
        k_out = len(node.output) - len(state)
        out_axes = list(attrs.get("scan_output_axes", [0] * k_out))
        out_dirs = list(attrs.get("scan_output_directions", [0] * k_out))
        scans = []
        for k in range(k_out):
            items = collected[k] if collected else []
            if not items:
                raise self._fail("a scan output of zero steps has no shape to take")
            if out_dirs[k]:
                items = items[::-1]
            scans.append(np.stack(items, axis=out_axes[k] % (items[0].ndim + 1)))
        return state + scans

    def _loop(self, feeds: Mapping[str, Any]) -> list[Any]:
        node = self.info.node
        ins = list(node.input) + [""] * max(0, 2 - len(node.input))
        trips = None if not ins[0] else int(np.asarray(to_host(feeds[ins[0]])).reshape(-1)[0])
        cond = True if not ins[1] else bool(np.asarray(to_host(feeds[ins[1]])).reshape(-1)[0])
        carried = [feeds[n] for n in ins[2:]]  # arrays, device values, sequences (lists), optionals
        body = self.bodies.get("body")
        if body is None:
            raise self._fail("has no body graph")
        n_scan = len(body.output) - 1 - len(carried)
        scans: list[list[np.ndarray]] = [[] for _ in range(max(0, n_scan))]
        i = 0
        limit = MAX_LOOP_ITERATIONS if trips is None else trips
        if trips is None and not ins[1]:
            raise self._fail("neither a trip count nor a condition: it would never stop")
        while i < limit and cond:
            if i >= MAX_LOOP_ITERATIONS:
                raise self._fail(f"more than {MAX_LOOP_ITERATIONS} iterations")
            explicit = [np.array(i, np.int64), np.array(cond, np.bool_), *carried]
            outs = self._run_body("body", explicit, feeds)
            cond = bool(np.asarray(outs[0]).reshape(-1)[0])
            carried = list(outs[1:1 + len(carried)])
            for k, o in enumerate(outs[1 + len(carried):]):
                scans[k].append(np.asarray(o))
            i += 1
        stacked = []
        for k, values in enumerate(scans):
            if values:
                stacked.append(np.stack(values))
            else:  # no iteration: an empty scan of the declared element type
                decl = body.output[1 + len(carried) + k].type.tensor_type
                dtype = element_type(decl.elem_type).dtype if decl.elem_type else np.float32
                stacked.append(np.zeros((0,), dtype))
        return carried + stacked

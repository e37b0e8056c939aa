"""Running models on the GPU in tests.

Two levels:

- the kernel: :func:`run_node` plans a model's one node from its spec (shapes and dtypes from
  inference, the node's attributes; a variant and tunables may be forced) and runs the plan with
  ``executor.run_plan``; :func:`run_all_variants` runs every variant that applies and asserts
  they agree bit for bit;
- the Session: :func:`session_run` runs a model through one Session with no host fallback;
  :func:`run_variants` forces each applicable variant of its one node;
  :func:`session_and_oracle` runs it on the GPU and on an oracle, the pair every comparison starts from.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnx_quant.dtypes import type_name
from onnx_quant.errors import ExecutionError
from support.oracles import assert_same_bits, ref_run

#: tunables that gate variants, set so that every variant's size clause holds
FORCE_TUNABLES = {"COARSE_MIN_WORDS": 0, "TILED_MIN_MACS": 0, "SERIAL_MAX_ELEMENTS": 10**9,
                  "SERIAL_MAX_ROW": 10**9, "TABLE_MIN_ELEMENTS": 0, "BLOCKED_MIN_WEIGHTS": 0}

#: (op type, variant) pairs :func:`run_node` ran in this process (test_float_kernels_gpu checks
#: that its kernels' variants all ran)
RAN: set[tuple[str, str]] = set()

_REGISTRY = []


def registry():
    """The kernel specs (loaded once per process)."""
    if not _REGISTRY:
        from onnx_quant.backend_wgpu.spec import load_specs

        _REGISTRY.append(load_specs())
    return _REGISTRY[0]


def node_spec(model: onnx.ModelProto):
    """The kernel spec of the model's first node (at the model's opset of its domain)."""
    node = model.graph.node[0]
    opsets = {(i.domain or ""): i.version for i in model.opset_import}
    spec = registry().find(node.domain or "", node.op_type, opsets[node.domain or ""])
    assert spec is not None, f"no kernel spec for {node.domain}::{node.op_type}"
    return spec


def plan_for(dev, model: onnx.ModelProto, feeds, *, variant=None, tunables=None):
    """Plan the model's single node: shapes and dtypes from inference, the node's attributes."""
    from onnx_quant.backend_wgpu.planner import plan_node
    from onnx_quant.inference import infer_values

    node = model.graph.node[0]
    spec = node_spec(model)
    init_names = {i.name for i in model.graph.initializer}
    values = infer_values(model, {k: list(np.shape(v)) for k, v in feeds.items() if k not in init_names}, runtime=True)
    shapes, dtypes = {}, {}
    for spec_names, value_names in ((list(spec.inputs), list(node.input)), (list(spec.outputs), list(node.output))):
        for i, sname in enumerate(spec_names):
            vname = value_names[i] if i < len(value_names) else ""
            if not vname:
                continue
            info = values[vname]
            if info.shape is None or not all(isinstance(d, int) for d in info.shape):
                raise ExecutionError(f"{node.op_type}: shape of {vname!r} not inferred ({info.shape})")
            shapes[sname] = tuple(int(d) for d in info.shape)
            dtypes[sname] = type_name(info.elem_type)
    attrs = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        attrs[a.name] = v.decode() if isinstance(v, bytes) else v
    tun = {k: v for k, v in (tunables or {}).items() if k in spec.tunables}
    return spec, plan_node(spec, shapes=shapes, dtypes=dtypes, device=dev.info, variant=variant,
                           tunables=tun, node_label=node.op_type, attributes=attrs)


def run_node(dev, model: onnx.ModelProto, feeds, *, variant=None, tunables=None):
    """The model's one node planned and run on ``dev`` (no Session): outputs (in the spec's
    output order) and the plan."""
    from onnx_quant.backend_wgpu.executor import run_plan

    node = model.graph.node[0]
    spec, plan = plan_for(dev, model, feeds, variant=variant, tunables=tunables)
    values = dict(feeds)
    values.update({i.name: numpy_helper.to_array(i) for i in model.graph.initializer})
    inputs = {s: values[node.input[i]] for i, s in enumerate(spec.inputs) if i < len(node.input) and node.input[i]}
    outs = run_plan(dev, plan, inputs, node=node.op_type)
    RAN.add((node.op_type, plan.variant))
    return [outs[s] for s in spec.outputs if s in outs], plan  # absent optional outputs left out


def run_all_variants(dev, model, feeds, tunables=None):
    """Run every variant of the node's spec whose when clauses hold with the gating tunables
    forced; assert they agree bit for bit; return (outputs of the first, [variant ids])."""
    spec = node_spec(model)
    tun = {**FORCE_TUNABLES, **(tunables or {})}
    results, ran = None, []
    for v in spec.variants:
        try:
            outs, plan = run_node(dev, model, feeds, variant=v.id, tunables=tun)
        except ExecutionError as e:
            if "cannot force this variant" in str(e):
                continue
            raise
        ran.append(v.id)
        if results is None:
            results = outs
        else:
            for g, e in zip(outs, results):
                assert_same_bits(g, e, f"{spec.name}: variant {v.id} vs {ran[0]}")
    assert ran, f"{spec.name}: no variant applies"
    return results, ran


# ----------------------------------------------------------------------------- through a Session

def session_run(dev, model, feeds, **session_kw):
    """Run through Session with no host fallback (graph inputs that decide shapes are read when
    the plan is made); ``session_kw``: more Session arguments (``variants``, ``tunables``, ...)."""
    from onnx_quant.backend_wgpu.session import Session

    with Session(model, device=dev, allow_host_fallback=False, **session_kw) as s:
        return s.run(None, feeds)


def session_and_oracle(dev, model, feeds, *, oracle=ref_run, **session_kw):
    """``model`` (typically one node) run on the GPU through a Session with no host fallback and
    on ``oracle(model, feeds)`` (default onnx.reference; ``support.oracles.onnxruntime_run`` for
    onnxruntime): ``(got, expected)``, lists of arrays in output order."""
    return session_run(dev, model, feeds, **session_kw), [np.asarray(e) for e in oracle(model, feeds)]


def applicable(dev, model, feeds, tunables=None):
    """Variant ids whose when clauses hold for these feeds (the one node of the model)."""
    from onnx_quant.backend_wgpu.session import Session

    with Session(model, device=dev, tunables=tunables) as s:
        sel = s.explain({k: v.shape for k, v in feeds.items()})[0]["selection"]
    return [v for v, failing in sel.items() if failing is None]


def run_variants(dev, model, feeds, tunables=None, expect=None):
    """Every applicable variant, forced; asserts they agree bit for bit; returns the output.
    ``expect``: variant ids that must be among the applicable ones."""
    from onnx_quant.backend_wgpu.session import Session

    op = model.graph.node[0].op_type
    ids = applicable(dev, model, feeds, tunables)
    assert ids, "no variant applies"
    for v in expect or ():
        assert v in ids, (v, ids)
    outs = []
    for v in ids:
        with Session(model, device=dev, variants={op: v}, tunables=tunables, allow_host_fallback=False) as s:
            outs.append((v, s.run(None, feeds)[0]))
    first = outs[0][1]
    for v, o in outs[1:]:
        assert o.dtype == first.dtype and o.shape == first.shape
        assert np.array_equal(o.view(np.uint8), first.view(np.uint8)), f"variant {v} differs from {outs[0][0]}"
    return first


# ----------------------------------------------------------------------------- what the run selected

#: tests collected per module, before -k / -m / node ids deselect any (conftest fills it)
COLLECTED = pytest.StashKey[dict]()


def module_fully_selected(request) -> bool:
    """Whether every test collected in the requesting test's module is selected in this run
    (a check over what the whole module ran means nothing when -k, -m or node ids left part out)."""
    path = request.node.path
    collected = request.config.stash.get(COLLECTED, {}).get(path)
    return collected is not None and collected == sum(1 for item in request.session.items if item.path == path)

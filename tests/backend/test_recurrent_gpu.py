"""RNN, GRU and LSTM on the GPU (templates/recurrent.base.json, recurrent.wgsl.jinja): ONNX's node
cases, and random models with every input and attribute form against onnxruntime CPU (layout 0)
and onnx.reference (layout 1, which onnxruntime does not run)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from onnx import TensorProto as TP, helper
from onnx.reference import ReferenceEvaluator

from onnx_quant.backend_wgpu.conformance import run_case
from onnx_quant.backend_wgpu.session import Session
from onnx_quant.errors import ExecutionError
from onnx_quant.node_cases import all_node_cases
from support.oracles import onnxruntime_run

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
#: float32 recurrences summed in another order than the oracle's. A gate's pre-activation sums
#: inputs + hidden products (|W|, |R| ~ 0.5, |x|, |h| ~ 1), each rounding within float32's epsilon of
#: the running sum, so the two orders part by up to ~ (inputs + hidden) x 1.5e-7 absolute (measured
#: over 30 seeds per form: 3.1e-6 at inputs + hidden = 79, where onnxruntime itself is 3.6e-6 from the
#: float64 result and the GPU 2.6e-6).
RTOL = 2e-5


def atol(model) -> float:
    w, r = (next(i for i in model.graph.input if i.name == n).type.tensor_type.shape.dim for n in "WR")
    return 1.5e-7 * (w[2].dim_value + r[2].dim_value)


def test_onnx_node_cases_pass_on_the_gpu(best):
    cases = [c for c in all_node_cases() if c.model is not None and len(c.model.graph.node) == 1
             and c.model.graph.node[0].op_type in GATES]
    assert len(cases) == 18
    for case in cases:
        row = run_case(case, device=best, host_fallback=False)
        assert row.passed, (case.name, row.error)


def recurrent_model(op, *, seq=5, batch=3, inputs=7, hidden=6, direction="forward", layout=0, bias=True,
                    seq_lens=False, initial=False, peepholes=False, outputs=("Y", "Y_h"), opset=14, scale=0.5,
                    **attrs):
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    # a stable seed: str hashes change per process, and a verdict must not
    rng = np.random.default_rng(zlib.crc32(repr((op, seq, batch, inputs, hidden, direction, layout)).encode()))
    x_shape = [batch, seq, inputs] if layout else [seq, batch, inputs]
    state = [batch, dirs, hidden] if layout else [dirs, batch, hidden]
    feeds = {"X": rng.standard_normal(x_shape).astype(np.float32),
             "W": (rng.standard_normal([dirs, g * hidden, inputs]) * scale).astype(np.float32),
             "R": (rng.standard_normal([dirs, g * hidden, hidden]) * scale).astype(np.float32)}
    names = ["X", "W", "R"]
    if bias:
        feeds["B"] = rng.standard_normal([dirs, 2 * g * hidden]).astype(np.float32)
    names.append("B" if bias else "")
    if seq_lens:
        feeds["sequence_lens"] = rng.integers(1, seq + 1, batch).astype(np.int32)
    names.append("sequence_lens" if seq_lens else "")
    if initial:
        feeds["initial_h"] = rng.standard_normal(state).astype(np.float32)
    names.append("initial_h" if initial else "")
    if op == "LSTM":
        if initial:
            feeds["initial_c"] = rng.standard_normal(state).astype(np.float32)
        names.append("initial_c" if initial else "")
        if peepholes:
            feeds["P"] = rng.standard_normal([dirs, 3 * hidden]).astype(np.float32)
        names.append("P" if peepholes else "")
    while names and not names[-1]:
        names.pop()
    all_outputs = ["Y", "Y_h", "Y_c"][: 3 if op == "LSTM" else 2]
    node_outputs = [o if o in outputs else "" for o in all_outputs]
    while not node_outputs[-1]:
        node_outputs.pop()
    if layout:
        attrs["layout"] = layout
    node = helper.make_node(op, names, node_outputs, hidden_size=hidden, direction=direction, **attrs)
    ins = [helper.make_tensor_value_info(n, TP.INT32 if n == "sequence_lens" else TP.FLOAT, list(v.shape))
           for n, v in feeds.items()]
    outs = [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in node_outputs if o]
    model = helper.make_model(helper.make_graph([node], "g", ins, outs), opset_imports=[helper.make_opsetid("", opset)])
    return model, feeds


def run_gpu(model, feeds, device):
    with Session(model, device=device, allow_host_fallback=False) as s:
        return s.run(None, feeds)


def run_oracle(model, feeds, layout):
    if layout:
        return ReferenceEvaluator(model).run(None, feeds)
    return onnxruntime_run(model, feeds, level="ORT_DISABLE_ALL")


FORMS = [
    dict(),
    dict(direction="reverse"),
    dict(direction="bidirectional", initial=True),
    dict(seq_lens=True, direction="bidirectional"),
    dict(seq_lens=True, direction="reverse", initial=True),
    dict(bias=False, outputs=("Y_h",)),
    dict(hidden=70, inputs=9, seq=3),              # two units per invocation, I not a multiple of 4
    dict(clip=0.7),
    dict(layout=1, direction="bidirectional", initial=True),
]


@pytest.mark.parametrize("op", sorted(GATES))
@pytest.mark.parametrize("form", range(len(FORMS)))
def test_random_models_agree_with_onnxruntime(best, op, form):
    kw = dict(FORMS[form])
    model, feeds = recurrent_model(op, **kw)
    got = run_gpu(model, feeds, best)
    want = run_oracle(model, feeds, kw.get("layout", 0))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=atol(model))


@pytest.mark.parametrize("op, attrs", [
    ("LSTM", dict(peepholes=True, initial=True, seq_lens=True, outputs=("Y", "Y_h", "Y_c"))),
    ("LSTM", dict(input_forget=1, outputs=("Y", "Y_h", "Y_c"))),
    ("LSTM", dict(activations=["HardSigmoid", "LeakyRelu", "Softsign"], activation_alpha=[0.3, 0.05],
                  activation_beta=[0.4])),
    ("GRU", dict(linear_before_reset=1, direction="bidirectional", initial=True)),
    ("GRU", dict(activations=["Sigmoid", "ScaledTanh", "HardSigmoid", "Tanh"], direction="bidirectional",
                 activation_alpha=[0.8, 0.25], activation_beta=[1.2, 0.45])),
    ("RNN", dict(activations=["Relu"])),
    ("RNN", dict(activations=["Affine", "Elu"], activation_alpha=[0.5, 0.9], activation_beta=[0.1],
                 direction="bidirectional")),
])
def test_cell_options_agree_with_onnxruntime(best, op, attrs):
    model, feeds = recurrent_model(op, **attrs)
    got = run_gpu(model, feeds, best)
    want = run_oracle(model, feeds, 0)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=atol(model))


@pytest.mark.parametrize("op", sorted(GATES))
def test_the_longest_sequence_an_invocation_may_loop_through(best, op):
    # llvmpipe stops an invocation after 65535 loop iterations: a sequence just under the spec's
    # count runs to its end (every step agrees), one just over is declined, never truncated.
    # Small weights keep the recurrence contracting: with large ones the float32 rounding
    # differences of two summation orders grow chaotically over hundreds of steps
    per_step = GATES[op] * (16 + 16) + 8
    longest = 60000 // per_step
    model, feeds = recurrent_model(op, seq=longest, hidden=64, inputs=64, batch=1, bias=False, scale=0.1)
    for g, w in zip(run_gpu(model, feeds, best), run_oracle(model, feeds, 0)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    model, feeds = recurrent_model(op, seq=longest + 1, hidden=64, inputs=64, batch=1, bias=False)
    with pytest.raises(ExecutionError, match="loopIterations <= tunables.MAX_LOOP_ITERATIONS"):
        run_gpu(model, feeds, best)

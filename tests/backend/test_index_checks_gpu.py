"""Device-side checks of runtime indices (backend_wgpu/index_check.py, docs/backend.md "Index
checks"): every kernel that reads through a runtime index raises IndexRangeError naming the
node, the input and the offending index for one outside the range ONNX allows (Gather,
GatherElements, GatherND, ScatterElements, Scatter, ScatterND, MaxUnpool, RotaryEmbedding's position ids,
NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss labels; a DQ -> Gather -> Q unit; the
consumers of a NonZero in its child session; the host's own runs), through the API and the CLI
(one line, exit 2); in-range negative indices still match onnx.reference bit for bit; OneHot's
out-of-range indices give the all-off rows ONNX defines; a hypothesis test walks the bounds."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto as T, helper as h, numpy_helper
from support.gpu import gpu_device, gpu_examples
from support.oracles import assert_bits, ref_run

from onnx_quant.backend_wgpu.session import Session
from onnx_quant.backend_wgpu.spec import SpecRegistry, load_specs
from onnx_quant.errors import ExecutionError, IndexRangeError

F, I64 = T.FLOAT, T.INT64


def model(nodes, inputs, outputs, inits=(), opset=18):
    vi = [h.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    vo = [h.make_tensor_value_info(n, t, None) for n, t in outputs]
    return h.make_model(h.make_graph(nodes, "g", vi, vo, list(inits)), opset_imports=[h.make_opsetid("", opset)])


def gpu_session(dev, m) -> Session:
    return Session(m, device=dev, allow_host_fallback=False)


X = np.arange(8, dtype=np.float32).reshape(4, 2) + 10  # 4 rows: valid row indices are [-4, 4)


def gather_model(axis=0, itype=I64, shape=(3,)):
    return model([h.make_node("Gather", ["x", "i"], ["y"], name="emb", axis=axis)],
                 [("x", F, [4, 2]), ("i", itype, list(shape))], [("y", F)])


# (model, feeds of a bad run, the node, the input's value name, the offending index, the bound) per kernel
def cases():
    upd = np.full((2, 2), -1.0, np.float32)
    yield ("Gather int64", gather_model(), {"x": X, "i": np.array([1, 1000, -7], np.int64)}, "emb", "i", 1000, 4)
    yield ("Gather int32 axis 1", gather_model(1, T.INT32, (2,)), {"x": X, "i": np.array([-3, 0], np.int32)},
           "emb", "i", -3, 2)
    yield ("Gather int64 high word", gather_model(), {"x": X, "i": np.array([0, 2**40, 1], np.int64)}, "emb", "i",
           2**40, 4)
    ge = model([h.make_node("GatherElements", ["x", "i"], ["y"], name="ge", axis=0)],
               [("x", F, [4, 2]), ("i", I64, [2, 2])], [("y", F)])
    yield ("GatherElements", ge, {"x": X, "i": np.array([[0, 1], [4, -1]], np.int64)}, "ge", "i", 4, 4)
    gnd = model([h.make_node("GatherND", ["x", "i"], ["y"], name="gnd")],
                [("x", F, [4, 2]), ("i", I64, [2, 2])], [("y", F)])
    yield ("GatherND", gnd, {"x": X, "i": np.array([[0, 1], [3, 2]], np.int64)}, "gnd", "i", 2, 2)
    se = model([h.make_node("ScatterElements", ["x", "i", "u"], ["y"], name="se", axis=0)],
               [("x", F, [4, 2]), ("i", I64, [2, 2]), ("u", F, [2, 2])], [("y", F)])
    yield ("ScatterElements", se, {"x": X, "i": np.array([[0, 1], [-5, 2]], np.int64), "u": upd}, "se", "i", -5, 4)
    sc = model([h.make_node("Scatter", ["x", "i", "u"], ["y"], name="sc", axis=1)],
               [("x", F, [4, 2]), ("i", I64, [2, 2]), ("u", F, [2, 2])], [("y", F)], opset=10)
    yield ("Scatter-10", sc, {"x": X, "i": np.array([[0, 1], [1, 9]], np.int64), "u": upd}, "sc", "i", 9, 2)
    snd = model([h.make_node("ScatterND", ["x", "i", "u"], ["y"], name="snd")],
                [("x", F, [4, 2]), ("i", I64, [2, 1]), ("u", F, [2, 2])], [("y", F)])
    yield ("ScatterND", snd, {"x": X, "i": np.array([[1], [100]], np.int64), "u": upd}, "snd", "i", 100, 4)
    rot = model([h.make_node("RotaryEmbedding", ["x", "c", "s", "p"], ["y"], name="rope", num_heads=1)],
                [("x", F, [1, 2, 4]), ("c", F, [3, 2]), ("s", F, [3, 2]), ("p", I64, [1, 2])], [("y", F)], opset=23)
    cache = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
    yield ("RotaryEmbedding", rot, {"x": np.ones((1, 2, 4), np.float32), "c": cache, "s": cache,
                                    "p": np.array([[1, 3]], np.int64)}, "rope", "p", 3, 3)
    mu = model([h.make_node("MaxUnpool", ["x", "i"], ["y"], name="mu", kernel_shape=[2], strides=[2])],
               [("x", F, [1, 1, 2]), ("i", I64, [1, 1, 2])], [("y", F)], opset=22)
    yield ("MaxUnpool", mu, {"x": np.float32([[[1, 2]]]), "i": np.array([[[1, 4]]], np.int64)}, "mu", "i", 4, 4)
    for op in ("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"):
        loss = model([h.make_node(op, ["x", "t"], ["y"], name="loss", reduction="mean")],
                     [("x", F, [3, 4]), ("t", I64, [3])], [("y", F)])
        yield (op, loss, {"x": np.zeros((3, 4), np.float32) - 1, "t": np.array([0, 4, 1], np.int64)}, "loss", "t", 4,
               4)


CASES = list(cases())


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_an_out_of_range_index_raises_naming_node_input_and_index(best, case):
    _, m, feeds, node, value, index, bound = case
    s = gpu_session(best, m)
    with pytest.raises(IndexRangeError, match=rf"node '{node}' \(\w+\): input '\w+' \(value '{value}'\): index "
                                              rf"{index} is out of range \[-?\d+, {bound}\)") as info:
        s.run(None, feeds)
    err = info.value
    assert isinstance(err, IndexError) and isinstance(err, ExecutionError)
    assert (err.index, err.bound) == (index, bound) and node in err.node
    # the record was cleared: the next run with valid indices answers (onnx.reference's bits)
    good = {k: (np.zeros_like(v) if k in ("i", "p", "t") else v) for k, v in feeds.items()}
    got = s.run(None, good)[0]
    oracle = m
    if m.graph.node[0].op_type == "Scatter":  # onnx.reference has no Scatter: ScatterElements is the same op
        oracle = model([h.make_node("ScatterElements", list(m.graph.node[0].input), ["y"], axis=1)],
                       [("x", F, [4, 2]), ("i", I64, [2, 2]), ("u", F, [2, 2])], [("y", F)], opset=11)
    assert_bits(got, ref_run(oracle, good)[0], "after the fault")


def test_in_range_negative_indices_match_onnx_reference(best):
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    runs = [
        (gather_model(), {"x": X, "i": np.array([-1, -4, 3], np.int64)}),
        (gather_model(1, T.INT32, (3,)), {"x": X, "i": np.array([-1, -2, 1], np.int32)}),
        (model([h.make_node("GatherElements", ["x", "i"], ["y"], axis=1)], [("x", F, [4, 6]), ("i", I64, [4, 2])],
               [("y", F)]), {"x": x, "i": np.array([[-1, -6], [0, 5], [-3, 2], [-2, -2]], np.int64)}),
        (model([h.make_node("GatherND", ["x", "i"], ["y"])], [("x", F, [4, 6]), ("i", I64, [3, 2])], [("y", F)]),
         {"x": x, "i": np.array([[-1, -6], [0, -1], [-4, 2]], np.int64)}),
        (model([h.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=0)],
               [("x", F, [4, 6]), ("i", I64, [1, 6]), ("u", F, [1, 6])], [("y", F)]),
         {"x": x, "i": np.array([[-1, -2, -3, -4, 0, 1]], np.int64), "u": -np.ones((1, 6), np.float32)}),
        (model([h.make_node("ScatterND", ["x", "i", "u"], ["y"])],
               [("x", F, [4, 6]), ("i", I64, [2, 1]), ("u", F, [2, 6])], [("y", F)]),
         {"x": x, "i": np.array([[-1], [-4]], np.int64), "u": -np.ones((2, 6), np.float32)}),
    ]
    for m, feeds in runs:
        assert_bits(gpu_session(best, m).run(None, feeds)[0], ref_run(m, feeds)[0], m.graph.node[0].op_type)


def test_onehot_out_of_range_indices_are_all_off_rows_as_onnx_defines(best):
    depth = numpy_helper.from_array(np.array(4, np.int64), "d")
    m = model([h.make_node("OneHot", ["i", "d", "v"], ["y"], axis=-1)], [("i", I64, [6]), ("v", F, [2])],
              [("y", F)], [depth])
    feeds = {"i": np.array([0, 4, -5, 2**40, -1, 3], np.int64), "v": np.array([0.5, 2.0], np.float32)}
    got = gpu_session(best, m).run(None, feeds)[0]
    assert_bits(got, ref_run(m, feeds)[0], "OneHot")
    assert (got[[1, 2, 3]] == 0.5).all() and got[0, 0] == 2.0 and got[4, 3] == 2.0


def test_a_dq_gather_q_unit_checks_its_indices(best):
    """The QDQ form onnxruntime's quantizer writes around an embedding Gather."""
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "s"), numpy_helper.from_array(np.array(3, np.int8), "z"),
             numpy_helper.from_array((np.arange(8, dtype=np.int8) - 4).reshape(4, 2), "w")]
    nodes = [h.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], name="dq"),
             h.make_node("Gather", ["wf", "i"], ["g"], name="lookup", axis=0),
             h.make_node("QuantizeLinear", ["g", "s", "z"], ["y"], name="q")]
    m = model(nodes, [("i", I64, [3])], [("y", T.INT8)], inits, opset=19)
    s = gpu_session(best, m)
    ok = {"i": np.array([-1, 0, 2], np.int64)}
    assert_bits(s.run(None, ok)[0], ref_run(m, ok)[0], "DQ -> Gather -> Q")
    with pytest.raises(IndexRangeError, match=r"node '\w+' .*index 7 is out of range \[-4, 4\)"):
        s.run(None, {"i": np.array([0, 7, 1], np.int64)})


def test_the_consumer_of_a_nonzero_checks_inside_its_child_session(best):
    """GatherND(data, Transpose(NonZero(mask))): the indices NonZero finds in a 3 x 3 mask are out of
    range for 2 x 2 data; the GatherND runs in NonZero's region (a child session)."""
    nodes = [h.make_node("NonZero", ["mask"], ["nz"], name="nz"),
             h.make_node("Transpose", ["nz"], ["idx"], name="t", perm=[1, 0]),
             h.make_node("GatherND", ["data", "idx"], ["y"], name="pick")]
    m = model(nodes, [("mask", F, [3, 3]), ("data", F, [2, 2])], [("y", F)])
    data = np.arange(4, dtype=np.float32).reshape(2, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = Session(m, device=best)
        mask = np.zeros((3, 3), np.float32)
        mask[0, 1] = mask[1, 0] = mask[1, 1] = 1  # every nonzero inside data's 2 x 2
        ok = {"mask": mask, "data": data}
        assert_bits(s.run(None, ok)[0], ref_run(m, ok)[0], "in range")
        with pytest.raises(IndexRangeError, match=r"node 'pick' \(GatherND\).*index 2 is out of range \[-2, 2\)"):
            s.run(None, {"mask": np.ones((3, 3), np.float32), "data": data})


def test_a_host_gather_raises_the_same_error_class(best):
    host = SpecRegistry(s for s in load_specs() if s.name != "Gather")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = Session(gather_model(), device=best, specs=host)
        with pytest.raises(IndexRangeError, match=r"node 'emb' \(Gather\) failed on the host.*index out of range"):
            s.run(None, {"x": X, "i": np.array([1, 1000, -7], np.int64)})


def test_the_cli_prints_one_line_and_exits_2(tmp_path):
    import onnx
    import subprocess
    import sys

    path = tmp_path / "m.onnx"
    onnx.save(gather_model(), str(path))
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "i.npy", np.array([1, 1000, -7], np.int64))
    p = subprocess.run([sys.executable, "-m", "onnx_quant", "run", str(path), "--input", f"x={tmp_path / 'x.npy'}",
                        "--input", f"i={tmp_path / 'i.npy'}"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.startswith("onnx-quant run: error: ")]
    assert len(lines) == 1 and "node 'emb' (Gather): input 'indices' (value 'i'): index 1000" in lines[0], p.stderr


@pytest.mark.gpu
@settings(deadline=None, max_examples=gpu_examples())
@given(st.lists(st.integers(-7, 6), min_size=1, max_size=5), st.sampled_from([np.int32, np.int64]))
def test_indices_near_the_bounds_answer_or_raise_exactly_when_onnx_says(indices, itype):
    dev = gpu_device("best")
    m = gather_model(0, T.INT32 if itype is np.int32 else I64, (len(indices),))
    feeds = {"x": X, "i": np.array(indices, itype)}
    bad = [i for i in indices if not -4 <= i < 4]
    s = gpu_session(dev, m)
    if bad:
        with pytest.raises(IndexRangeError) as info:
            s.run(None, feeds)
        assert info.value.index in bad and info.value.bound == 4
    else:
        assert_bits(s.run(None, feeds)[0], ref_run(m, feeds)[0], f"indices {indices}")


def test_a_constant_gather_is_checked_once_in_the_plan_s_prologue(best):
    """Data and indices both initializers (too big for inference to fold): the Gather runs once
    per plan in the prologue, whose error record is read back when the plan is prepared."""
    table = np.arange(64 * 4096, dtype=np.float32).reshape(4096, 64)

    def m(index):
        inits = [numpy_helper.from_array(table, "x"), numpy_helper.from_array(np.array([1, index], np.int64), "i")]
        return model([h.make_node("Gather", ["x", "i"], ["g"], name="emb"), h.make_node("Add", ["g", "z"], ["y"])],
                     [("z", F, [2, 64])], [("y", F)], inits)

    z = {"z": np.zeros((2, 64), np.float32)}
    s = gpu_session(best, m(-7))
    assert np.array_equal(s.run(None, z)[0], table[[1, -7]]) and s.stats.prologue_dispatches >= 1
    with pytest.raises(IndexRangeError, match=r"node 'emb' \(Gather\).*index 5000 is out of range \[-4096, 4096\)"):
        gpu_session(best, m(5000)).run(None, z)

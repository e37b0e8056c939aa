"""Sequences and optionals on the GPU (backend_wgpu/sequences.py, sequence_steps.py): a sequence is a
list of device values, its list ops move no tensor, ConcatFromSequence and SplitToSequence run Concat's
and Split's kernels, a sequence built and read back in one graph becomes those kernels at
construction. Oracles: ONNX's node cases, onnxruntime CPU and onnx.reference, bit for bit (these ops
move data; the kernels around them are exact on the values drawn)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper

from onnx_quant.backend_wgpu import Session
from onnx_quant.backend_wgpu.device_value import DeviceValue
from onnx_quant.backend_wgpu.spec import SpecRegistry, load_specs
from onnx_quant.errors import ExecutionError, HostFallbackWarning, IndexRangeError, KernelRejected

from support.gpu import assert_node_cases_pass_or_declined, gpu_examples, kept_session
from support.models import make_model, vi
from support.oracles import onnxruntime_run, ref_run

F, I64 = TensorProto.FLOAT, TensorProto.INT64
DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32, "uint8": np.uint8}
#: the types onnxruntime 1.2x's CPU SplitToSequence takes (NOT_IMPLEMENTED for the others)
ORT_TYPES = ("float32", "int64", "int32")


def seq(name: str, elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_sequence_value_info(name, elem, None)


def assert_same(got, want, what: str = "") -> None:
    """Outputs bit for bit: a sequence element by element (same count), a tensor's dtype, shape and bits."""
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (what, got, want)
        for k, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{what}[{k}]")
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape, want.dtype, want.shape)
    assert got.tobytes() == want.tobytes(), (what, got, want)


def placements(session: Session, feeds) -> list[str]:
    from onnx_quant.backend_wgpu.sequence_steps import value_shape

    return [e["placement"] for e in session.explain({k: value_shape(v) for k, v in feeds.items()})]


# ----------------------------------------------------------------------------- ONNX's cases


def test_onnx_node_cases_pass_on_the_gpu(best):
    """Every case of the sequence and optional ops and the sequence / optional cases of Identity,
    If and Loop (the expanded SequenceMap cases: a Loop body reading the outer sequences at its
    iteration's position, value-keyed)."""
    ops = ("SequenceInsert", "SplitToSequence", "SequenceMap", "OptionalGetElement", "OptionalHasElement",
           "Identity", "If", "Loop")
    passed = assert_node_cases_pass_or_declined(best, ops, {}, 39)
    assert {"test_identity_sequence", "test_if_opt", "test_loop16_seq_none",
            "test_sequence_map_add_2_sequences_expanded"} <= set(passed)


# ----------------------------------------------------------------------------- as exporters write them


def _stack_model(n: int, axis: int, new_axis: int) -> onnx.ModelProto:
    """torch's ``torch.stack([relu(x_i) ...])`` / ``torch.cat``: a list of tensors as SequenceConstruct
    -> ConcatFromSequence, the result read by a kernel."""
    nodes = [helper.make_node("Relu", [f"x{i}"], [f"r{i}"]) for i in range(n)]
    nodes += [helper.make_node("SequenceConstruct", [f"r{i}" for i in range(n)], ["s"]),
              helper.make_node("ConcatFromSequence", ["s"], ["c"], axis=axis, new_axis=new_axis),
              helper.make_node("Mul", ["c", "c"], ["y"])]
    return make_model(nodes, [vi(f"x{i}", F, [2, 3]) for i in range(n)], ["y"], opset=17)


def _split_model(split, keepdims: int, at: list[int]) -> onnx.ModelProto:
    """torch's ``torch.split(x, sizes)`` into a list read by index: SplitToSequence -> SequenceAt."""
    inits = {} if split is None else {"split": np.asarray(split, np.int64)}
    nodes = [helper.make_node("SplitToSequence", ["x"] + ([] if split is None else ["split"]), ["s"], axis=1,
                              keepdims=keepdims)]
    for k, p in enumerate(at):
        inits[f"p{k}"] = np.array(p, np.int64)
        nodes += [helper.make_node("SequenceAt", ["s", f"p{k}"], [f"e{k}"]),
                  helper.make_node("Neg", [f"e{k}"], [f"y{k}"])]
    return make_model(nodes, [vi("x", F, [3, 7])], [f"y{k}" for k in range(len(at))], inits=inits, opset=17)


@pytest.mark.parametrize("n,axis,new_axis", [(3, 0, 0), (3, -1, 0), (11, 1, 0), (4, 0, 1), (10, -1, 1), (2, 2, 1)])
def test_a_list_concatenated_is_a_concat(best, n, axis, new_axis):
    """Rewritten at construction (sequences.SequenceRewrite): no sequence step runs, one submit; a
    tree of Concats beyond the kernel's 8 inputs; the same bits as onnxruntime and onnx.reference."""
    model = _stack_model(n, axis, new_axis)
    rng = np.random.default_rng(n)
    feeds = {f"x{i}": rng.standard_normal((2, 3)).astype(np.float32) for i in range(n)}
    session = Session(model, device=best, allow_host_fallback=False)
    (got,) = session.run(None, feeds)
    assert_same(got, onnxruntime_run(model, feeds)[0])
    assert_same(got, ref_run(model, feeds)[0])
    assert [r[1] for r in session.sequence_rewrites.rewritten] == ["ConcatFromSequence"]
    assert "sequence" not in placements(session, feeds) and session.last_run_stats["submits"] == 1


@pytest.mark.parametrize("split,keepdims,at", [(None, 0, [0, 6, -1]), (None, 1, [2]), ([2, 5], 1, [1, -2]),
                                               (3, 1, [0, 2, -1])])
def test_a_split_read_by_index_is_a_slice(best, split, keepdims, at):
    model = _split_model(split, keepdims, at)
    feeds = {"x": np.random.default_rng(7).standard_normal((3, 7)).astype(np.float32)}
    session = Session(model, device=best, allow_host_fallback=False)
    got = session.run(None, feeds)
    assert_same(got, onnxruntime_run(model, feeds))
    assert_same(got, ref_run(model, feeds))
    assert len(session.sequence_rewrites.rewritten) == len(at) and "sequence" not in placements(session, feeds)


# ----------------------------------------------------------------------------- the steps, against the oracles


def _program(code: int) -> onnx.ModelProto:
    """A sequence fed with a GPU-made tensor inserted at a run-time position, one erased, one read
    by a kernel, the rest concatenated (Concat's kernel) and split again (Split's), its length."""
    nodes = [helper.make_node("Mul", ["t", "t"], ["t2"]),
             helper.make_node("SequenceInsert", ["s", "t2", "p"], ["s2"]),
             helper.make_node("SequenceErase", ["s2", "q"], ["s3"]),
             helper.make_node("SequenceAt", ["s3", "k"], ["e"]),
             helper.make_node("Mul", ["e", "e"], ["y"]),
             helper.make_node("ConcatFromSequence", ["s3"], ["c"], axis=1),
             helper.make_node("SequenceLength", ["s3"], ["n"]),
             helper.make_node("SplitToSequence", ["c", "sp"], ["pieces"], axis=1)]
    return make_model(nodes, [seq("s", code), vi("t", code, [None, None]), vi("p", I64, []), vi("q", I64, []),
                              vi("k", I64, []), vi("sp", I64, [None])],
                      [seq("s3", code), "y", "c", "n", seq("pieces", code)], opset=17)


@st.composite
def programs(draw):
    """A type, element shapes [rows, c] (one or more), the inserted tensor's width, and positions
    anywhere ONNX allows them (the sequence left non-empty for ConcatFromSequence)."""
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    rows = draw(st.integers(1, 3))
    cols = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    extra = draw(st.integers(1, 4))
    n = len(cols)
    p = draw(st.integers(-n, n))          # SequenceInsert into n: [-n, n]
    q = draw(st.integers(-(n + 1), n))    # SequenceErase of n + 1: [-(n + 1), n]
    k = draw(st.integers(-n, n - 1))      # SequenceAt of n
    return dtype, rows, cols, extra, p, q, k, draw(st.integers(0, 2**16))


@settings(max_examples=gpu_examples(), deadline=None)
@given(programs())
def test_list_steps_match_onnxruntime_and_onnx_reference(best, case):
    dtype, rows, cols, extra, p, q, k, seed = case
    np_type = DTYPES[dtype]
    rng = np.random.default_rng(seed)

    def draw(shape):
        return (rng.integers(0, 11, shape) if np.dtype(np_type).kind in "iu" else rng.standard_normal(shape)).astype(
            np_type)

    widths = list(cols)
    widths.insert(p, extra)  # Python's list semantics are ONNX's for these ranges
    del widths[q]
    width = sum(widths)
    feeds = {"s": [draw((rows, c)) for c in cols], "t": draw((rows, extra)), "p": np.array(p), "q": np.array(q),
             "k": np.array(k), "sp": np.array([1, width - 1] if width > 1 else [width], np.int64)}
    code = helper.np_dtype_to_tensor_dtype(np.dtype(np_type))
    model = _program(code)
    session = kept_session(best, ("sequence program", code), lambda: model)
    got = session.run(None, feeds)
    assert_same(got, _spec(feeds))
    if p != len(cols):  # onnx.reference inserts at position len(sequence) at the front ((p + n) % n)
        assert_same(got, ref_run(model, feeds))
    if dtype in ORT_TYPES:  # onnxruntime has SplitToSequence for these only
        assert_same(got, onnxruntime_run(model, feeds, level="ORT_DISABLE_ALL"))
    assert session.host_nodes == []


def _spec(feeds):
    """The program's outputs as ONNX's operator text defines them (Python's list operations
    follow them over these ranges), numpy computing the products in the element type."""
    s = list(feeds["s"])
    s.insert(int(feeds["p"]), feeds["t"] * feeds["t"])
    del s[int(feeds["q"])]
    e = s[int(feeds["k"])]
    c = np.concatenate(s, axis=1)
    return [s, e * e, c, np.array(len(s), np.int64), np.split(c, np.cumsum(feeds["sp"])[:-1], axis=1)]


# ----------------------------------------------------------------------------- the surface


def test_feeds_outputs_and_their_types(best):
    """A list feed (arrays or DeviceValues) and list outputs, onnxruntime's type strings, an empty
    optional as None; a wrong element type, an out-of-range position, an empty optional read."""
    opt = helper.make_value_info("o", helper.make_optional_type_proto(helper.make_tensor_type_proto(F, None)))
    nodes = [helper.make_node("SequenceAt", ["s", "p"], ["e"]), helper.make_node("Identity", ["s"], ["s_out"]),
             helper.make_node("Optional", [], ["none"], type=helper.make_tensor_type_proto(F, None)),
             helper.make_node("OptionalGetElement", ["o"], ["got"])]
    none_vi = helper.make_value_info("none", helper.make_optional_type_proto(helper.make_tensor_type_proto(F, None)))
    model = make_model(nodes, [seq("s"), vi("p", I64, []), opt], ["e", seq("s_out"), none_vi, "got"], opset=18)
    session = Session(model, device=best, allow_host_fallback=False)
    assert [a.type for a in session.get_inputs()] == ["seq(tensor(float))", "tensor(int64)", "optional(tensor(float))"]
    assert [a.type for a in session.get_outputs()] == ["tensor(float)", "seq(tensor(float))",
                                                       "optional(tensor(float))", "tensor(float)"]
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((4,), np.float32)
    e, s_out, none, got = session.run(None, {"s": [DeviceValue.from_numpy(a, best), b], "p": np.array(-2),
                                             "o": np.full((2,), 5, np.float32)})
    assert_same(e, a)
    assert_same(s_out, [a, b])
    assert_same(got, np.full((2,), 5, np.float32))
    assert none is None
    with pytest.raises(ExecutionError, match=r"input 's\[1\]': expected float32, found int64"):
        session.run(None, {"s": [a, np.ones(2, np.int64)], "p": np.array(0), "o": a})
    with pytest.raises(IndexRangeError, match="position 2 is out of range"):
        session.run(None, {"s": [a, b], "p": np.array(2), "o": a})
    with pytest.raises(ExecutionError, match="the optional is empty"):
        session.run(None, {"s": [a], "p": np.array(0), "o": None})


def test_list_operations_move_no_tensor(best):
    """SequenceConstruct of two GPU-made tensors, SequenceAt at a fed position, a kernel reading the
    element: the element is copied device-to-device into the kernel's input (nothing uploaded but
    the feeds, nothing read back but the output), and a second run allocates and compiles nothing."""
    nodes = [helper.make_node("Relu", ["a"], ["ra"]), helper.make_node("Neg", ["b"], ["nb"]),
             helper.make_node("SequenceConstruct", ["ra", "nb"], ["s"]),
             helper.make_node("SequenceAt", ["s", "p"], ["e"]), helper.make_node("Mul", ["e", "e"], ["y"])]
    model = make_model(nodes, [vi("a", F, [64]), vi("b", F, [64]), vi("p", I64, [])], ["y"], opset=17)
    session = Session(model, device=best, allow_host_fallback=False)
    rng = np.random.default_rng(3)
    feeds = {"a": rng.standard_normal(64).astype(np.float32), "b": rng.standard_normal(64).astype(np.float32),
             "p": np.array(1)}
    session.run(None, feeds)
    (got,) = session.run(None, feeds)
    assert_same(got, ref_run(model, feeds)[0])
    moved = session.last_run_stats
    assert moved["bytes_uploaded"] == 2 * 64 * 4 and moved["bytes_read_back"] == 64 * 4
    assert moved["buffers_allocated"] == 0 and moved["pipelines_compiled"] == 0 and moved["plans"] == 0


def test_a_kernel_backed_op_its_kernels_decline_is_a_typed_decline(best):
    """ConcatFromSequence where no Concat kernel runs (a registry without it): without host
    fallback the step declines with a KernelRejected naming the node, never a bare ExecutionError;
    with it, Concat runs on the host and the result is the same."""
    model = make_model([helper.make_node("ConcatFromSequence", ["s"], ["c"], axis=0)], [seq("s")], ["c"], opset=17)
    specs = SpecRegistry(s for s in load_specs() if s.name != "Concat")
    x = np.arange(3, dtype=np.float32)
    session = Session(model, device=best, allow_host_fallback=False, specs=specs)
    with pytest.raises(KernelRejected, match="ConcatFromSequence_0.*its kernels cannot run it"):
        session.run(None, {"s": [x, x]})
    with pytest.warns(HostFallbackWarning):
        (got,) = Session(model, device=best, specs=specs).run(None, {"s": [x, x]})
    assert_same(got, np.concatenate([x, x]))


def test_a_loop_builds_a_sequence_on_the_device(best):
    """A Loop appending a GPU-made tensor per iteration (the expanded SequenceMap's shape): the
    carried sequence's elements stay on the device between iterations (each iteration copies only
    the element it adds), so the whole run reads back only its two outputs."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]), helper.make_node("Cast", ["i"], ["f"], to=F),
         helper.make_node("Mul", ["x", "f"], ["v"]), helper.make_node("SequenceInsert", ["acc", "v"], ["acc_out"])],
        "body", [vi("i", I64, []), vi("cond", TensorProto.BOOL, []), seq("acc")],
        [vi("cond_out", TensorProto.BOOL, []), seq("acc_out")])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=F),
             helper.make_node("Loop", ["n", "go", "empty"], ["built"], body=body),
             helper.make_node("ConcatFromSequence", ["built"], ["y"], axis=0, new_axis=1)]
    model = make_model(nodes, [vi("x", F, [4]), vi("n", I64, []), vi("go", TensorProto.BOOL, [])],
                       [seq("built"), "y"], opset=17)
    feeds = {"x": np.arange(4, dtype=np.float32) + 0.5, "n": np.array(6), "go": np.array(True)}
    session = Session(model, device=best, allow_host_fallback=False)
    got = session.run(None, feeds)
    assert_same(got, onnxruntime_run(model, feeds))
    assert_same(got, ref_run(model, feeds))
    assert session.last_run_stats["readbacks"] == 2


def test_a_rank_0_device_value_keeps_its_rank(best):
    """DeviceValue.from_numpy of a scalar: numpy's ascontiguousarray makes it [1] (a scalar in a
    sequence came back [1] once)."""
    v = DeviceValue.from_numpy(np.array(2.5, np.float32), best)
    assert v.dims == () and v.numpy().shape == () and float(v.numpy()) == 2.5


def test_a_fed_device_value_in_a_sequence_is_read_after_its_copy(best):
    """A fed DeviceValue reaches the plan's buffer by a copy at the head of the first segment; a
    sequence step holding a view of that buffer comes after it. (ConcatFromSequence ran its own
    submit before the parent's first one and concatenated the previous run's bits, zeros at first.)"""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("SequenceConstruct", ["x"], ["s0"]),
             helper.make_node("SequenceInsert", ["s0", "x"], ["s"]),
             helper.make_node("ConcatFromSequence", ["s"], ["c"], axis=0)]
    model = make_model(nodes, [vi("x", F, [4])], ["c", "r"], opset=17)
    session = Session(model, device=best, allow_host_fallback=False)
    for k in range(3):
        x = np.arange(4, dtype=np.float32) - 1.5 + k
        c, r = session.run(None, {"x": DeviceValue.from_numpy(x, best)})
        assert_same(c, np.concatenate([x, x]))
        assert_same(r, np.maximum(x, np.float32(0)))


def test_the_positions_a_plan_is_keyed_on_grow_with_what_they_pick(best):
    """Same shapes, other positions: after insert and erase the elements are alike at first (the
    read needs no position), then differ (SequenceAt's position must key the plan too): the
    binding's keyed inputs grow instead of planning the read at an unknown shape."""
    model = _program(F)
    session = Session(model, device=best, allow_host_fallback=False)
    a, b, t = (np.full(shape, v, np.float32) for shape, v in (((1, 3), 1), ((1, 1), 2), ((1, 3), 3)))
    for p, q, k, width in ((0, 2, 1, 6), (0, 0, 1, 4), (0, 0, 0, 4)):
        feeds = {"s": [a, b], "t": t, "p": np.array(p), "q": np.array(q), "k": np.array(k),
                 "sp": np.array([1, width - 1], np.int64)}
        assert_same(session.run(None, feeds), _spec(feeds))

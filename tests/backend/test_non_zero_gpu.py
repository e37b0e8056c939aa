"""NonZero on the GPU (templates/non_zero.kernel.json) and its data-dependent output size as one sync
(backend_wgpu/data_dependent.py): the host reads back the count, the nodes reading NonZero's output
run as a body session planned for that count. Oracles: numpy.nonzero (bit for bit) and onnxruntime
CPU on models where NonZero feeds Transpose -> GatherND and a Shape, as YOLO / NMS exports do."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper

from support.gpu import assert_node_cases_pass_or_declined, gpu_examples, kept_session
from support.oracles import onnxruntime_run

#: element types of NonZero-13's T with a device layout, and the values their data is drawn from
#: (zeros of both signs, NaN: numpy.nonzero counts NaN, not -0.0)
VALUES = {
    "float32": (np.float32, [0.0, -0.0, 1.5, -2.0, np.nan, 1e-40]),
    "float16": (np.float16, [0.0, -0.0, 1.5, -2.0, np.nan, 6e-8]),
    "bfloat16": (ml_dtypes.bfloat16, [0.0, -0.0, 1.5, -2.0, np.nan]),
    "float64": (np.float64, [0.0, -0.0, 1.5, -2.0, np.nan, 5e-324]),
    "int64": (np.int64, [0, 1, -1, 2**40, -(2**63)]),
    "uint64": (np.uint64, [0, 1, 2**32, 2**64 - 1]),
    "int32": (np.int32, [0, 1, -1, 2**31 - 1]),
    "int16": (np.int16, [0, 1, -1, -(2**15)]),
    "uint16": (np.uint16, [0, 1, 2**15]),
    "int8": (np.int8, [0, 1, -1, -128]),
    "uint8": (np.uint8, [0, 1, 255]),
    "bool": (np.bool_, [False, True]),
}


def _non_zero_model(dtype: str, rank: int, opset: int = 13) -> onnx.ModelProto:
    code = helper.np_dtype_to_tensor_dtype(np.dtype(VALUES[dtype][0]))
    g = helper.make_graph([helper.make_node("NonZero", ["x"], ["y"])], "nz",
                          [helper.make_tensor_value_info("x", code, [None] * rank)],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _session(best, dtype: str, rank: int, workgroup: int):
    """One session per (type, rank, workgroup size): its plans are keyed on the shapes."""
    return kept_session(best, ("NonZero", dtype, rank, workgroup), lambda: _non_zero_model(dtype, rank),
                        {"WORKGROUP_SIZE": workgroup})


def test_onnx_node_cases_pass_on_the_gpu(best):
    assert_node_cases_pass_or_declined(best, ("NonZero",), {}, 1)


@settings(max_examples=gpu_examples(), deadline=None)
@given(dtype=st.sampled_from(sorted(VALUES)), shape=st.lists(st.integers(0, 7), min_size=1, max_size=4),
       fill=st.sampled_from(["random", "zeros", "nonzeros"]), workgroup=st.sampled_from([4, 256]),
       seed=st.integers(0, 2**16))
def test_matches_numpy_nonzero(best, dtype, shape, fill, workgroup, seed):
    """Any type, rank 1-4, empty tensors, all zero (count 0: a [rank, 0] output), all nonzero; a
    4-invocation workgroup makes many blocks, so the offsets pass runs over several chunks."""
    np_type, pool = VALUES[dtype]
    rng = np.random.default_rng(seed)
    nonzero = [v for v in pool if not (v == 0)]
    choices = {"random": pool, "zeros": [v for v in pool if v == 0], "nonzeros": nonzero}[fill]
    x = np.array(rng.choice(np.array(choices, dtype=object), size=tuple(shape)), dtype=np_type).reshape(shape)
    (got,) = _session(best, dtype, len(shape), workgroup).run(None, {"x": x})
    want = np.array(np.nonzero(x), dtype=np.int64)
    assert got.dtype == np.int64 and got.shape == want.shape and np.array_equal(got, want)
    if fill == "zeros":
        assert got.shape == (len(shape), 0)
    if fill == "nonzeros":
        assert got.shape == (len(shape), x.size)


def _yolo_like(opset: int = 17) -> onnx.ModelProto:
    """conf > 0.5 -> NonZero -> Transpose -> GatherND of the kept scores, and the Shape of the kept
    indices (what NMS exports do with NonZero's output)."""
    nodes = [helper.make_node("Greater", ["conf", "thresh"], ["mask"]),
             helper.make_node("NonZero", ["mask"], ["keep"]),
             helper.make_node("Transpose", ["keep"], ["keep_t"]),
             helper.make_node("GatherND", ["conf", "keep_t"], ["kept"]),
             helper.make_node("Shape", ["keep_t"], ["kept_shape"]),
             helper.make_node("Mul", ["kept", "two"], ["kept2"])]
    g = helper.make_graph(nodes, "yolo_like", [helper.make_tensor_value_info("conf", TensorProto.FLOAT, ["b", 6])],
                          [helper.make_tensor_value_info("kept2", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("kept_shape", TensorProto.INT64, None),
                           helper.make_tensor_value_info("keep_t", TensorProto.INT64, None)],
                          initializer=[helper.make_tensor("thresh", TensorProto.FLOAT, [], [0.5]),
                                       helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])



def _conf(rng, b: int, kept: int) -> np.ndarray:
    """Confidences of which exactly ``kept`` are above 0.5."""
    x = (rng.random((b, 6)) * 0.5).astype(np.float32)
    x.reshape(-1)[rng.choice(b * 6, kept, replace=False)] = 0.75
    return x


def test_nonzero_feeding_transpose_gather_nd_runs_on_the_gpu(best):
    from onnx_quant.backend_wgpu.session import Session

    model = _yolo_like()
    rng = np.random.default_rng(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no host fallback warning
        with Session(model, device=best, allow_host_fallback=False) as s:
            for b, kept in ((4, 5), (4, 0), (3, 18), (4, 5)):
                conf = _conf(rng, b, kept)
                got = s.run(None, {"conf": conf})
                for g, w in zip(got, onnxruntime_run(model, {"conf": conf})):
                    assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w)
                assert got[1].tolist() == [kept, 2]
            assert s.host_nodes == []
            # the outputs the region makes keep the types and shapes inference gives the model as written
            assert [o.shape for o in s.get_outputs()] == [["keep_dim1"], [2], ["keep_dim1", 2]]
            placement = {e["node"]: e["placement"] for e in s.explain({"conf": [4, 6]})}
    assert placement["NonZero_1"] == "gpu" and placement["data_dependent_region"] == "sync"


def test_a_new_count_compiles_nothing(best):
    """The region reading NonZero's output is planned per count, but its kernels take the count as
    a runtime uniform (GatherND's index rows, Transpose, Mul): from a cold cache, counts after the
    first compile no pipeline, and every output is onnxruntime's."""
    from onnx_quant.backend_wgpu.session import Session

    model = _yolo_like()
    rng = np.random.default_rng(11)
    with Session(model, device=best, allow_host_fallback=False) as s:
        cache = s.device.pipelines
        cache.forget()
        for i, (b, kept) in enumerate(((4, 5), (4, 9), (3, 2), (4, 17))):
            conf = _conf(rng, b, kept)
            before = set(cache._pipelines)
            got = s.run(None, {"conf": conf})
            new = [cache._pipelines[k].label for k in set(cache._pipelines) - before]
            assert bool(new) == (i == 0), new
            for g, w in zip(got, onnxruntime_run(model, {"conf": conf})):
                assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w)


@pytest.mark.parametrize("rows", [(3,), (5,), (2, 4)])
def test_gather_nd_with_batch_dims_at_several_row_counts(best, rows):
    """GatherND-12 with batch_dims 1 over index rows of several counts and ranks, bit for bit
    onnx.reference's; a count after the first compiles nothing (gather_nd.base.json's uniforms)."""
    from onnx.reference import ReferenceEvaluator
    from onnx_quant.backend_wgpu.session import Session

    node = helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=1)
    g = helper.make_graph([node], "gnd", [helper.make_tensor_value_info("x", TensorProto.INT64, ["n", 4, 5, 3]),
                                          helper.make_tensor_value_info("i", TensorProto.INT64, ["n", *("r" * len(rows)), 2])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    rng = np.random.default_rng(len(rows))
    with Session(model, device=best, allow_host_fallback=False) as s:
        cache = s.device.pipelines
        for k, count in enumerate((rows[0], rows[0] + 3)):
            shape = (2, *([count] * len(rows)), 2)
            feeds = {"x": rng.integers(-2 ** 40, 2 ** 40, (2, 4, 5, 3)),
                     "i": np.stack([rng.integers(-4, 4, shape[:-1]), rng.integers(-5, 5, shape[:-1])], -1)}
            before = set(cache._pipelines)
            (got,) = s.run(None, feeds)
            if k:
                assert not set(cache._pipelines) - before
            want = ReferenceEvaluator(model).run(None, feeds)[0]
            assert got.dtype == want.dtype and np.array_equal(got, want)


def test_same_session_different_counts_plans_per_count(best):
    """Counts 7, 2, 7 again (other values): each run right; the third replans nothing (the body
    session's plan for count 7 is cached), the second planned for its count."""
    from onnx_quant.backend_wgpu.session import Session

    model = _yolo_like()
    rng = np.random.default_rng(5)
    with Session(model, device=best, allow_host_fallback=False) as s:
        stats = []
        for kept in (7, 2, 7):
            conf = _conf(rng, 4, kept)
            got = s.run(None, {"conf": conf})
            for g, w in zip(got, onnxruntime_run(model, {"conf": conf})):
                assert np.array_equal(g, w)
            stats.append(dict(s.last_run_stats))
    assert stats[1]["pipelines_compiled"] > 0 or stats[1]["buffers_allocated"] > 0
    assert stats[2]["pipelines_compiled"] == 0 and stats[2]["buffers_allocated"] == 0


@pytest.mark.parametrize("kept", [0, 3])
def test_last_run_stats_show_the_count_read_back(best, kept):
    """One more read-back than the outputs need: the count's 8 bytes, after NonZero's segment."""
    from onnx_quant.backend_wgpu.session import Session

    g = helper.make_graph([helper.make_node("NonZero", ["x"], ["y"]), helper.make_node("Transpose", ["y"], ["t"])],
                          "nz_t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
                          [helper.make_tensor_value_info("t", TensorProto.INT64, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    x = np.zeros((2, 5), np.float32)
    x.reshape(-1)[[1, 4, 8][:kept]] = 1.0
    with Session(model, device=best, allow_host_fallback=False) as s:
        s.run(None, {"x": x})
        (t,) = s.run(None, {"x": x})
        st_ = s.last_run_stats
    assert np.array_equal(t, np.transpose(np.nonzero(x)))
    assert st_["readbacks"] == 2  # the count, then the output
    assert st_["bytes_read_back"] == 8 + max(4, 8 * 2 * kept)
    assert st_["submits"] == 2   # NonZero's segment, the body's


def test_rank_zero_input_is_declined(best):
    """NonZero of a scalar: numpy gives [1, count], ONNX's inference [0, count]; the kernel declines."""
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import ExecutionError

    g = helper.make_graph([helper.make_node("NonZero", ["x"], ["y"])], "nz0",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    with pytest.raises(ExecutionError, match="NonZero.*rank is 0"):
        Session(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), device=best,
                allow_host_fallback=False)


def test_nested_and_parallel_nonzeros_matchonnxruntime_run(best):
    """Two NonZeros of the head (one region reads both), a NonZero inside the region (the body
    session's own sync), a region reading a GPU-made value of the head (Relu) and a NonZero output
    that is also a graph output: every node on the GPU, every output as onnxruntime's."""
    from onnx_quant.backend_wgpu.session import Session

    nodes = [helper.make_node("Greater", ["x", "th"], ["m"]), helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("NonZero", ["m"], ["keep"]), helper.make_node("Less", ["x", "th"], ["m2"]),
             helper.make_node("NonZero", ["m2"], ["keep2"]), helper.make_node("Transpose", ["keep"], ["kt"]),
             helper.make_node("GatherND", ["r", "kt"], ["vals"]),
             helper.make_node("Greater", ["vals", "th2"], ["m3"]), helper.make_node("NonZero", ["m3"], ["keep3"]),
             helper.make_node("Shape", ["keep2"], ["s2"]),
             helper.make_node("Concat", ["keep", "keep2"], ["both"], axis=1)]
    outs = [("vals", TensorProto.FLOAT), ("keep3", TensorProto.INT64), ("s2", TensorProto.INT64),
            ("both", TensorProto.INT64), ("keep", TensorProto.INT64)]
    g = helper.make_graph(nodes, "nested", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
                          [helper.make_tensor_value_info(n, t, None) for n, t in outs],
                          initializer=[helper.make_tensor("th", TensorProto.FLOAT, [], [0.5]),
                                       helper.make_tensor("th2", TensorProto.FLOAT, [], [0.8])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(0)
    with Session(model, device=best, allow_host_fallback=False) as s:
        for k, scale in enumerate((0.5, 0.8, 1.1, 0.2, 0.5)):
            x = (rng.random((3, 5)) * scale).astype(np.float32)
            got = s.run(None, {"x": x})
            for g_, w in zip(got, onnxruntime_run(model, {"x": x})):
                assert g_.dtype == w.dtype and g_.shape == w.shape and np.array_equal(g_, w)
            if k == 4:  # a count seen before: x is the only upload (the region reads the head's values on the device)
                assert s.last_run_stats["bytes_uploaded"] == x.nbytes
        assert s.host_nodes == []


def test_a_declined_padded_form_runs_on_the_host_and_feeds_the_region(best):
    """Where the kernel declines a plan (here: a workgroup beyond the device), the padded form runs
    on the host (numpy.nonzero written as the kernel writes it) and the region still gets
    [rank, count]; with allow_host_fallback=False the same model is refused naming NonZero."""
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import ExecutionError

    model = _yolo_like()
    conf = _conf(np.random.default_rng(9), 4, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Session(model, device=best, tunables={"NonZero": {"WORKGROUP_SIZE": 1 << 20}}) as s:
            got = s.run(None, {"conf": conf})
            assert [h.split(" ")[0] for h in s.host_nodes] == ["NonZero_1"]
    for g, w in zip(got, onnxruntime_run(model, {"conf": conf})):
        assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w)
    with pytest.raises(ExecutionError, match="NonZero"):
        with Session(model, device=best, allow_host_fallback=False,
                     tunables={"NonZero": {"WORKGROUP_SIZE": 1 << 20}}) as s:
            s.run(None, {"conf": conf})


def test_overrides_naming_region_nodes_reach_the_body_session(best):
    """Tunables and variants keyed by an op the region runs are the body session's (checked there,
    at the first run); the parent accepts them though its own graph no longer holds that op."""
    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import ExecutionError

    model = _yolo_like()
    conf = _conf(np.random.default_rng(2), 4, 3)
    with Session(model, device=best, allow_host_fallback=False,
                 tunables={"Transpose": {"WORKGROUP_SIZE": 64}}, variants={"Transpose": "word_per_invocation"}) as s:
        got = s.run(None, {"conf": conf})
    for g, w in zip(got, onnxruntime_run(model, {"conf": conf})):
        assert np.array_equal(g, w)
    with Session(model, device=best, tunables={"Transpose": {"NO_SUCH_TUNABLE": 1}}) as s:
        with pytest.raises(ExecutionError, match="NO_SUCH_TUNABLE"):
            s.run(None, {"conf": conf})

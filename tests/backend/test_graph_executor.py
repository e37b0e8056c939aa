"""The graph executor: whole models through Session — GPU chains mixing DynamicQuantizeLinear
with the elementwise kernels, views, folded shape arithmetic, host-fallback segments, buffer
reuse, one submit per segment, counters that a second run does not move, symbolic batches,
feed errors. Every value is compared bit for bit with onnx.reference on the same model.

Most tests use a private spec registry (DynamicQuantizeLinear, Add, Sub, Mul, Cast) so that
which node runs on the host does not change as kernels are added to templates/.
"""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper

from onnx_quant.errors import ExecutionError, HostFallbackWarning, QuantWarning
from onnx_quant.oracles import widen_u8s8
from support.models import make_model
from support.oracles import ref_run as reference

KERNEL_FILES = ("dynamic_quantize_linear.kernel.json", "cast.kernel.json")
TABLE_OPS = ("Add", "Sub", "Mul")  # rows of templates/elementwise.ops.json


pytestmark = pytest.mark.devices("best")  # dev: the default adapter only (conftest's default adds OpenGL)


@pytest.fixture(scope="module")
def reg():
    from onnx_quant.backend_wgpu.spec import SpecRegistry, load_spec_file, templates_dir
    from onnx_quant.backend_wgpu.spec_tables import load_table

    table = [s for s in load_table(templates_dir() / "elementwise.ops.json") if s.name in TABLE_OPS]
    return SpecRegistry([s for f in KERNEL_FILES for s in load_spec_file(templates_dir() / f)] + table)


def session(model, dev, reg, **kw):
    from onnx_quant.backend_wgpu.session import Session

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostFallbackWarning)
        return Session(model, device=dev, specs=reg, **kw)


def assert_same(got, expected):
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        e = np.asarray(e)
        assert isinstance(g, np.ndarray), (i, type(g))
        assert g.dtype == e.dtype and g.shape == e.shape, (i, g.dtype, e.dtype, g.shape, e.shape)
        if g.dtype.kind == "f":
            assert np.array_equal(g.view(np.uint8 if g.itemsize == 1 else f"u{g.itemsize}"),
                                  e.view(np.uint8 if e.itemsize == 1 else f"u{e.itemsize}")), i
        else:
            assert np.array_equal(g, e), i


def model(nodes, inputs, outputs, initializers=(), opset=17):
    return make_model(nodes, inputs, outputs, initializers, opset, ir_version=8)


def vi(name, t, shape):
    return helper.make_tensor_value_info(name, t, shape)


def dequant_nodes(src, dst, tag):
    """DQL(src) then dequantize on the GPU with Cast/Sub/Mul: dst = (float(q) - float(zp)) * scale."""
    return [
        helper.make_node("DynamicQuantizeLinear", [src], [f"{tag}_q", f"{tag}_s", f"{tag}_zp"], name=f"{tag}_dql"),
        helper.make_node("Cast", [f"{tag}_q"], [f"{tag}_qf"], to=TP.FLOAT, name=f"{tag}_cast_q"),
        helper.make_node("Cast", [f"{tag}_zp"], [f"{tag}_zpf"], to=TP.FLOAT, name=f"{tag}_cast_zp"),
        helper.make_node("Sub", [f"{tag}_qf", f"{tag}_zpf"], [f"{tag}_c"], name=f"{tag}_sub"),
        helper.make_node("Mul", [f"{tag}_c", f"{tag}_s"], [dst], name=f"{tag}_mul"),
    ]


def rand(shape, seed=0, scale=3.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# ----------------------------------------------------------------------------- the allocator


def test_size_classes():
    from onnx_quant.backend_wgpu.graph_plan import SIZE_CLASS_MIN, size_class

    assert size_class(4) == size_class(SIZE_CLASS_MIN) == SIZE_CLASS_MIN
    for n in (257, 300, 1000, 4096, 4097, 123457, 2**20 + 1):
        c = size_class(n)
        assert n <= c <= n * 1.25 + 4 and c % 4 == 0
    assert size_class(4097) == size_class(5000)  # one class serves neighbours
    assert size_class(10**6, cap=600_000) == 10**6  # never below the value
    assert size_class(590_000) == 655_360 and size_class(590_000, cap=600_000) == 600_000


def test_assign_buffers_reuses_only_disjoint_lifetimes():
    from onnx_quant.backend_wgpu.graph_plan import assign_buffers
    from onnx_quant.backend_wgpu.plan import Lifetime

    chain = [Lifetime("x", 400, 0, 0)] + [Lifetime(f"v{i}", 400, i, i + 1) for i in range(8)]
    slot, sizes = assign_buffers(chain)
    assert len(sizes) == 2  # a chain needs two buffers, whatever its length
    assert slot["x"] != slot["v0"] and slot["v1"] == slot["x"] and slot["v2"] == slot["v0"]
    # different size classes never share
    slot, sizes = assign_buffers([Lifetime("a", 400, 0, 0), Lifetime("b", 40000, 1, 1)])
    assert slot["a"] != slot["b"] and len(sizes) == 2


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 6), st.sampled_from([4, 300, 1000, 5000])),
                min_size=1, max_size=40))
def test_assign_buffers_never_overlaps(items):
    from onnx_quant.backend_wgpu.graph_plan import assign_buffers
    from onnx_quant.backend_wgpu.plan import Lifetime

    lts = [Lifetime(i, n, s, s + d) for i, (s, d, n) in enumerate(items)]
    slot, sizes = assign_buffers(lts)
    for a in lts:
        assert sizes[slot[a.key]] >= a.nbytes
        for b in lts:
            if a.key < b.key and slot[a.key] == slot[b.key]:
                assert a.end < b.start or b.end < a.start, (a, b)
    # no more buffers than the peak number of live values of any class
    peak = max(sum(1 for lt in lts if lt.start <= p <= lt.end) for p in range(27))
    assert len(sizes) <= peak * 4  # at most one buffer per live value per class (4 classes here)


# ----------------------------------------------------------------------------- GPU chains


def test_gpu_chain_one_submit_and_second_run_moves_no_counter(dev, reg):
    nodes = (dequant_nodes("x", "d1", "a") + [helper.make_node("Add", ["d1", "x"], ["t"], name="add")]
             + dequant_nodes("t", "d2", "b"))
    m = model(nodes, [vi("x", TP.FLOAT, [500])],
              [vi("d2", TP.FLOAT, [500]), vi("b_q", TP.UINT8, [500]), vi("a_s", TP.FLOAT, [])])
    s = session(m, dev, reg)
    x = rand(500)
    assert_same(s.run(None, {"x": x}), reference(m, {"x": x}))
    assert [e["placement"] for e in s.explain()] == ["gpu"] * len(nodes)
    assert s.summary()["segments"] == 1 and s.host_nodes == []
    first = s.stats.snapshot()
    assert first["plans"] == 1 and first["submits"] == 1 and first["readbacks"] == 1
    assert first["pipelines_compiled"] + dev.pipelines.cache_hits > 0 and first["buffers_allocated"] > 0
    x2 = rand(500, seed=1)
    assert_same(s.run(None, {"x": x2}), reference(m, {"x": x2}))
    delta = {k: v - first[k] for k, v in s.stats.snapshot().items()}
    assert s.last_run_stats == delta    # one run's figures, public
    encode, record = delta.pop("host_encode_us"), delta.pop("host_record_us")
    assert 0 < record < encode  # recording ends before wgpu-native's pass end and finish
    gplan = s._plans[next(iter(s._plans))]
    passes = sum(1 for seg in gplan.segments for st in seg.steps for p in st.plan.passes if min(p.dispatch) > 0)
    assert passes >= len(nodes)
    assert delta == {"runs": 1, "plans": 0, "pipelines_compiled": 0, "buffers_allocated": 0, "bytes_allocated": 0,
                     "bind_groups_created": 0, "submits": 1, "dispatches": passes, "readbacks": 1, "bytes_uploaded": 2000,
                     "bytes_read_back": 2000 + 500 + 4, "host_nodes_run": 0,
                     "prologue_dispatches": 0}
    # only the requested outputs are read back
    before = s.stats.snapshot()
    (scale,) = s.run(["a_s"], {"x": x2})
    assert scale == reference(m, {"x": x2}, ["a_s"])[0]
    assert s.stats.bytes_read_back - before["bytes_read_back"] == 4
    assert s.stats.submits - before["submits"] == 1


def test_pipelines_are_shared_across_sessions(dev, reg):
    nodes = dequant_nodes("x", "y", "a")
    m = model(nodes, [vi("x", TP.FLOAT, [64])], [vi("y", TP.FLOAT, [64])])
    x = rand(64)
    session(m, dev, reg).run(None, {"x": x})
    other = session(m, dev, reg)
    assert_same(other.run(None, {"x": x}), reference(m, {"x": x}))
    assert other.stats.pipelines_compiled == 0 and other.stats.bind_groups_created > 0


def test_buffer_reuse_along_a_chain(dev, reg):
    """x -> Mul -> Add -> Mul -> ... (8 nodes): 9 pooled values live in 2 buffers."""
    c = helper.make_tensor("c", TP.FLOAT, [1], [1.5])
    nodes, prev = [], "x"
    for i in range(8):
        out = "y" if i == 7 else f"v{i}"
        nodes.append(helper.make_node("Mul" if i % 2 == 0 else "Add", [prev, "c"], [out], name=f"n{i}"))
        prev = out
    m = model(nodes, [vi("x", TP.FLOAT, [300])], [vi("y", TP.FLOAT, [300])], [c])
    s = session(m, dev, reg)
    x = rand(300)
    assert_same(s.run(None, {"x": x}), reference(m, {"x": x}))
    mem = s.summary()["memory"]
    assert mem == {"pooled_values": 9, "pooled_buffers": 2, "value_bytes": 9 * 1200, "buffer_bytes": 2 * 1280}
    # every buffer the session made: 2 pooled, 1 initializer (once), uniforms, 1 staging
    assert s.stats.buffers_allocated < 9 + 1
    assert list(s._resources.constants) == ["c"]


def test_uniform_regions_per_pass(dev, reg):
    """Two multi-pass DynamicQuantizeLinear nodes of different sizes in one submit: every pass
    reads its own uniform region (one buffer rewritten between dispatches would give every
    pass the last values)."""
    nodes = [helper.make_node("DynamicQuantizeLinear", [n], [f"{n}_q", f"{n}_s", f"{n}_zp"], name=f"dql_{n}")
             for n in ("a", "b")]
    outs = [vi(f"{n}_{k}", t, None) for n in ("a", "b") for k, t in (("q", TP.UINT8), ("s", TP.FLOAT), ("zp", TP.UINT8))]
    m = model(nodes, [vi("a", TP.FLOAT, [3000]), vi("b", TP.FLOAT, [257])], outs, opset=11)
    s = session(m, dev, reg, tunables={"SERIAL_MAX_ELEMENTS": 16})
    feeds = {"a": rand(3000, 1, 7.0), "b": rand(257, 2, 0.5)}
    assert_same(s.run(None, feeds), reference(m, feeds))
    assert all(len(p.passes) >= 2 for p in s.plans({"a": (3000,), "b": (257,)}))
    gplan = next(iter(s._plans.values()))
    offsets = [off for off, _ in gplan.uniform_regions]
    assert len(offsets) >= 4 and len(set(offsets)) == len(offsets) and all(o % 256 == 0 for o in offsets)
    assert s.stats.submits == 1


# ----------------------------------------------------------------------------- views, folding


def test_views_run_without_kernel_or_copy(dev, reg):
    shape = helper.make_tensor("shape", TP.INT64, [2], [4, 30])
    axes = helper.make_tensor("axes", TP.INT64, [1], [0])
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        helper.make_node("Unsqueeze", ["r", "axes"], ["u"], name="unsqueeze"),
        helper.make_node("DynamicQuantizeLinear", ["u"], ["q", "s", "zp"], name="dql"),
        helper.make_node("Squeeze", ["q", "axes"], ["sq"], name="squeeze"),
        helper.make_node("Flatten", ["sq"], ["f"], axis=0, name="flatten"),
        helper.make_node("Identity", ["f"], ["y"], name="identity"),
        helper.make_node("Dropout", ["x"], ["d"], name="dropout"),
        helper.make_node("Cast", ["d"], ["dc"], to=TP.INT32, name="cast"),
    ]
    m = model(nodes, [vi("x", TP.FLOAT, [120])], [vi("y", TP.UINT8, None), vi("dc", TP.INT32, None),
                                                  vi("r", TP.FLOAT, None)], [shape, axes], opset=13)
    s = session(m, dev, reg)
    x = rand(120)
    got = s.run(None, {"x": x})
    assert_same(got, reference(m, {"x": x}))
    placement = {e["node"]: e["placement"] for e in s.explain()}
    assert placement == {"reshape": "view", "unsqueeze": "view", "dql": "gpu", "squeeze": "view",
                         "flatten": "view", "identity": "view", "dropout": "view", "cast": "gpu"}
    mem = s.summary()["memory"]
    assert mem["pooled_values"] == 1 + 3 + 1  # x, dql's three outputs, cast's output: views add none
    # a view of a feed returned as an output is a copy, not the caller's array
    got[2][0, 0] = 1234.0
    assert x[0] != 1234.0


def test_shape_arithmetic_is_folded_per_binding(dev, reg):
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape with a symbolic batch: folded into each
    plan (no host node, no warning), the Reshape a view."""
    idx = helper.make_tensor("idx", TP.INT64, [], [0])
    minus1 = helper.make_tensor("minus1", TP.INT64, [1], [-1])
    zero = helper.make_tensor("zero", TP.INT64, [1], [0])
    nodes = [
        helper.make_node("Shape", ["x"], ["xs"], name="shape"),
        helper.make_node("Gather", ["xs", "idx"], ["n"], axis=0, name="gather"),
        helper.make_node("Unsqueeze", ["n", "zero"], ["n1"], name="unsq"),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0, name="concat"),
        helper.make_node("Reshape", ["x", "target"], ["x2"], name="reshape"),
        helper.make_node("DynamicQuantizeLinear", ["x2"], ["q", "s", "zp"], name="dql"),
    ]
    m = model(nodes, [vi("x", TP.FLOAT, ["N", 3, 4])], [vi("q", TP.UINT8, None), vi("target", TP.INT64, None)],
              [idx, minus1, zero], opset=13)
    from onnx_quant.backend_wgpu.session import Session

    with warnings.catch_warnings():
        warnings.simplefilter("error", HostFallbackWarning)  # nothing goes to the host
        s = Session(m, device=dev, specs=reg, allow_host_fallback=False)
        for n in (2, 5):
            x = rand((n, 3, 4), seed=n)
            assert_same(s.run(None, {"x": x}), reference(m, {"x": x}))
    placement = {e["node"]: e["placement"] for e in s.explain({"x": [5, 3, 4]})}
    assert placement["concat"] == "folded"  # its value is the plan's constant ...
    assert placement["shape"] == placement["gather"] == placement["unsq"] == "unused"  # ... so these need not run
    assert placement["reshape"] == "view" and placement["dql"] == "gpu"
    assert s.stats.host_nodes_run == 0


def test_unused_nodes_are_dropped_and_constants_uploaded_once(dev, reg):
    nodes = [
        helper.make_node("Constant", [], ["k"], value=helper.make_tensor("kv", TP.FLOAT, [1], [0.25]), name="const"),
        helper.make_node("Mul", ["x", "k"], ["y"], name="mul"),
        helper.make_node("Softsign", ["x"], ["dead"], name="dead_host"),  # no output needs it
    ]
    m = model(nodes, [vi("x", TP.FLOAT, ["N"])], [vi("y", TP.FLOAT, None)])
    s = session(m, dev, reg)
    for n in (7, 9):
        x = rand(n, seed=n)
        assert_same(s.run(None, {"x": x}), reference(m, {"x": x}, ["y"]))
    placement = {e["node"]: e["placement"] for e in s.explain({"x": [9]})}
    assert placement == {"const": "constant", "mul": "gpu", "dead_host": "unused"}
    assert s.stats.host_nodes_run == 0 and s.stats.plans == 2
    assert list(s._resources.constants) == ["k"]  # one buffer for both plans


# ----------------------------------------------------------------------------- host fallback


def _host_sandwich():
    """GPU -> host (Softsign) -> GPU -> host (Relu: not in the private registry) -> GPU."""
    nodes = (dequant_nodes("x", "d1", "a")
             + [helper.make_node("Softsign", ["d1"], ["h1"], name="soft")]
             + dequant_nodes("h1", "d2", "b")
             + [helper.make_node("Relu", ["d2"], ["h2"], name="relu")]
             + [helper.make_node("Add", ["h2", "x"], ["y"], name="add")])
    return model(nodes, [vi("x", TP.FLOAT, [200])], [vi("y", TP.FLOAT, [200]), vi("b_zp", TP.UINT8, [])])


def test_host_fallback_splits_the_run_into_segments(dev, reg):
    from onnx_quant.backend_wgpu.session import Session

    m = _host_sandwich()
    with pytest.warns(HostFallbackWarning) as rec:
        s = Session(m, device=dev, specs=reg)
    text = str(rec[0].message)
    assert "soft (Softsign)" in text and "relu (Relu)" in text and "a_dql" not in text
    assert issubclass(HostFallbackWarning, QuantWarning)
    x = rand(200)
    assert_same(s.run(None, {"x": x}), reference(m, {"x": x}))
    assert s.host_nodes == ["soft (Softsign)", "relu (Relu)"]
    summary = s.summary()
    assert summary["segments"] == 3 and summary["host_steps"] == 2
    assert s.stats.submits == 3 and s.stats.host_nodes_run == 2 and s.stats.readbacks == 3
    entries = {e["node"]: e for e in s.explain()}
    assert entries["soft"]["placement"] == "host" and entries["soft"]["kernel"] == "host"
    assert "no GPU kernel for Softsign" in entries["soft"]["reason"]
    assert [entries[n]["segment"] for n in ("a_dql", "b_dql", "add")] == [0, 1, 2]
    before = s.stats.snapshot()
    assert_same(s.run(None, {"x": x}), reference(m, {"x": x}))
    delta = {k: v - before[k] for k, v in s.stats.snapshot().items()}
    assert delta["submits"] == 3 and delta["buffers_allocated"] == 0 and delta["pipelines_compiled"] == 0


def test_allow_host_fallback_false_refuses_listing_the_nodes(dev, reg):
    from onnx_quant.backend_wgpu.session import Session

    with pytest.raises(ExecutionError) as e:
        Session(_host_sandwich(), device=dev, specs=reg, allow_host_fallback=False)
    msg = str(e.value)
    assert "'soft' (Softsign)" in msg and "'relu' (Relu)" in msg and "2 node(s)" in msg


def test_a_node_onnx_reference_cannot_run_is_refused(dev, reg):
    node = helper.make_node("NoSuchOp", ["x"], ["y"], name="mystery", domain="example.custom")
    g = helper.make_graph([node], "g", [vi("x", TP.FLOAT, [4])], [vi("y", TP.FLOAT, [4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.custom", 1)])
    with pytest.raises(ExecutionError, match="mystery.*onnx.reference cannot run it"):
        session(m, dev, reg)


@pytest.fixture
def picky_reg(tmp_path):
    """The DQL spec with every variant restricted to at least 64 elements, so that a when clause
    (not a missing spec) sends small inputs to the host."""
    from onnx_quant.backend_wgpu.spec import SpecRegistry, load_spec, templates_dir

    spec = json.loads((templates_dir() / "dynamic_quantize_linear.kernel.json").read_text())
    for v in spec["variants"]:
        v["when"] = ["inputCount >= 64"] + list(v.get("when", []))
    (tmp_path / "dql.kernel.json").write_text(json.dumps(spec))
    for f in templates_dir().glob("dynamic-quantize-linear*.wgsl.jinja"):
        shutil.copy(f, tmp_path / f.name)
    return SpecRegistry([load_spec(tmp_path / "dql.kernel.json")])


def test_when_clauses_send_a_node_to_the_host_per_binding(dev, picky_reg):
    from onnx_quant.backend_wgpu.commands import dql_model
    from onnx_quant.backend_wgpu.session import Session

    m = dql_model(1)
    s = Session(m, device=dev, specs=picky_reg)  # nothing is known to fall back yet: no warning
    with pytest.warns(HostFallbackWarning, match="inputCount >= 64"):
        small = s.run(None, {"x": rand(10)})
    assert_same(small, reference(m, {"x": rand(10)}))
    assert s.explain({"x": [10]})[0]["placement"] == "host"
    big = s.run(None, {"x": rand(100)})
    assert_same(big, reference(m, {"x": rand(100)}))
    assert s.explain({"x": [100]})[0]["placement"] == "gpu"
    assert s.stats.plans == 2 and s.stats.host_nodes_run == 1
    strict = Session(m, device=dev, specs=picky_reg, allow_host_fallback=False)
    with pytest.raises(ExecutionError, match="allow_host_fallback is False.*inputCount >= 64"):
        strict.run(None, {"x": rand(10)})


def test_subgraph_bodies_read_outer_scope_values(dev, reg):
    # the If is a control step: its branches run as sessions of their own (control_flow.py), each
    # reading the outer value d; this registry has Mul but no Neg, so the else branch's Neg is a
    # host node of the session
    then_g = helper.make_graph([helper.make_node("Mul", ["d", "d"], ["o"])], "then", [], [vi("o", TP.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["d"], ["o"])], "else", [], [vi("o", TP.FLOAT, None)])
    nodes = dequant_nodes("x", "d", "a") + [
        helper.make_node("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g, name="if"),
        helper.make_node("Add", ["z", "x"], ["y"], name="add"),
    ]
    m = model(nodes, [vi("x", TP.FLOAT, [16]), vi("cond", TP.BOOL, [])], [vi("y", TP.FLOAT, [16])])
    s = session(m, dev, reg)
    for c in (True, False):
        feeds = {"x": rand(16), "cond": np.array(c)}
        assert_same(s.run(None, feeds), reference(m, feeds))
    assert s.host_nodes == ["Neg_0 (Neg)"]
    assert [e["placement"] for e in s.explain({"x": (16,), "cond": ()}) if e["op_type"] == "If"] == ["control"]


# ----------------------------------------------------------------------------- feeds and plans


def test_symbolic_batch_bound_from_feeds(dev, reg):
    nodes = dequant_nodes("x", "y", "a")
    m = model(nodes, [vi("x", TP.FLOAT, ["N", 4])], [vi("y", TP.FLOAT, ["N", 4])])
    s = session(m, dev, reg)
    for n in (2, 3):
        x = rand((n, 4), seed=n)
        assert_same(s.run(None, {"x": x}), reference(m, {"x": x}))
    assert s.stats.plans == 2 and len(s._plans) == 2
    before = s.stats.snapshot()
    s.run(None, {"x": rand((2, 4))})
    after = s.stats.snapshot()
    assert after["plans"] == before["plans"] and after["buffers_allocated"] == before["buffers_allocated"]
    assert after["pipelines_compiled"] == before["pipelines_compiled"]
    s.close()
    assert not s._plans and not s._resources.constants


def test_bad_feeds_are_refused_before_anything_is_submitted(dev, reg):
    nodes = [helper.make_node("Mul", ["a", "b"], ["y"], name="mul")]
    m = model(nodes, [vi("a", TP.FLOAT, ["N", 4]), vi("b", TP.FLOAT, ["N", 1]), vi("sq", TP.FLOAT, ["M", "M"])],
              [vi("y", TP.FLOAT, None)])
    s = session(m, dev, reg)
    ok = {"a": rand((2, 4)), "b": rand((2, 1)), "sq": rand((3, 3))}

    def refused(feeds, *needles):
        before = (dev.stats.submits, dev.stats.buffers_allocated, s.stats.submits)
        with pytest.raises(ExecutionError) as e:
            s.run(None, feeds)
        assert (dev.stats.submits, dev.stats.buffers_allocated, s.stats.submits) == before
        for n in needles:
            assert n in str(e.value), (n, str(e.value))

    refused({k: v for k, v in ok.items() if k != "b"}, "'b'", "missing")
    refused({**ok, "c": ok["a"]}, "'c'", "not inputs")
    refused({**ok, "a": ok["a"].astype(np.float64)}, "'a'", "float64")
    refused({**ok, "a": ok["a"].reshape(8)}, "'a'", "rank")
    refused({**ok, "a": rand((2, 5))}, "'a'", "dim 1 must be 4")
    refused({**ok, "b": rand((3, 1))}, "'b'", "'N' = 3", "'a' dim 0", "'N' = 2")
    refused({**ok, "sq": rand((3, 2))}, "'sq'", "'M' = 2", "'M' = 3")
    assert_same(s.run(None, ok), reference(m, ok))


def test_feeding_an_initializer_is_refused(dev, reg):
    c = helper.make_tensor("c", TP.FLOAT, [1], [2.0])
    m = model([helper.make_node("Mul", ["x", "c"], ["y"])], [vi("x", TP.FLOAT, [3]), vi("c", TP.FLOAT, [1])],
              [vi("y", TP.FLOAT, [3])], [c])
    s = session(m, dev, reg)
    assert s.input_names == ["x"]
    with pytest.raises(ExecutionError, match="initializers"):
        s.run(None, {"x": rand(3), "c": np.ones(1, np.float32)})
    assert_same(s.run(None, {"x": np.ones(3, np.float32)}), [np.full(3, 2.0, np.float32)])


def test_outputs_that_are_inputs_or_repeated(dev, reg):
    nodes = [helper.make_node("Identity", ["x"], ["y"], name="id"), helper.make_node("Mul", ["x", "x"], ["sq"])]
    m = model(nodes, [vi("x", TP.FLOAT, [5])], [vi("y", TP.FLOAT, [5]), vi("sq", TP.FLOAT, [5])])
    s = session(m, dev, reg)
    x = rand(5)
    y, sq, y2 = s.run(["y", "sq", "y"], {"x": x})
    assert np.array_equal(y, x) and y is not x and y2 is not y and np.array_equal(sq, x * x)


def test_constant_nodes_run_once_per_plan(best):
    """The DequantizeLinear of every weight (and any GPU node of constants only) runs when the
    plan is prepared, into a buffer of its own: later runs dispatch only the rest, and the
    outputs are the same bits as a run that computes them every time (onnx.reference's)."""
    import warnings

    from onnx_quant import model_zoo
    from onnx_quant.backend_wgpu.session import Session

    model = model_zoo.quantized("cnn", "qdq", per_channel=True, blocks=1, channels=8, seed=2)
    feeds = model_zoo.random_feeds(model, {"N": 1, "H": 8, "W": 8}, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # as written (no QDQ fusion): the weights' DequantizeLinear nodes are what runs once
        s = Session(model, device=best, allow_host_fallback=False, fuse_qdq=False)
    first = s.run(None, feeds)
    entries = s.explain({k: v.shape for k, v in feeds.items()})
    once = [e for e in entries if e.get("once_per_plan")]
    weight_dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear"
                 and n.input[0] in {i.name for i in model.graph.initializer}]
    assert weight_dq and {e["node"] for e in once} >= {n.name for n in weight_dq}
    assert all(e["segment"] is None and e["placement"] == "gpu" for e in once)
    gplan = next(iter(s._plans.values()))
    prep = s._prepared[gplan.key]   # the executor's device state of the plan
    once_dispatches = sum(len(prep.dispatches[st.index]) for st in gplan.prologue)
    assert s.stats.prologue_dispatches == once_dispatches > 0
    before = s.stats.snapshot()
    again = s.run(None, feeds)
    per_run = s.stats.dispatches - before["dispatches"]
    assert per_run == sum(len(prep.dispatches[st.index]) for seg in gplan.segments for st in seg.steps)
    assert s.stats.prologue_dispatches == before["prologue_dispatches"]   # not repeated
    assert all(a.tobytes() == b.tobytes() for a, b in zip(first, again))
    import onnx.reference

    ref = onnx.reference.ReferenceEvaluator(model).run(None, feeds)
    np.testing.assert_allclose(again[0], ref[0], rtol=1e-4, atol=1e-4)


def test_compact_program_folds_runs_of_raw_dispatches_and_keeps_the_order():
    from onnx_quant.backend_wgpu.executor import compact_program

    d = lambda k, grid=(1, 1, 1): ("dispatch", f"c{k}", f"b{k}", grid, f"n{k}/main", (10 + k, 20 + k))  # noqa: E731
    copy = ("copy", "src", 0, "dst", 0, 4)
    prog = compact_program([d(0), d(1, (2, 3, 1)), copy, d(2, (0, 1, 1)), d(3), ("dispatch", "c", "b", (1, 1, 1), "x")])
    assert prog == [("dispatches", [(10, 20, 1, 1, 1), (11, 21, 2, 3, 1)], ["n0/main", "n1/main"]), copy,
                    ("dispatches", [(13, 23, 1, 1, 1)], ["n3/main"]), ("dispatch", "c", "b", (1, 1, 1), "x")]


def test_steady_runs_record_a_prebuilt_program(best):
    """The second run reuses the plan's program (no per-run command building) and gives the
    same bits; the host's encoding time is counted per run."""
    from onnx_quant.backend_wgpu.session import Session

    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"), helper.make_node("Relu", ["a"], ["y"], name="b")]
    m = model(nodes, [vi("x", TP.FLOAT, [64])], [vi("y", TP.FLOAT, [64])])
    s = Session(m, device=best, fuse_elementwise=False)  # two dispatches, not one fused
    x = rand(64)
    first = s.run(None, {"x": x})[0]
    gplan = next(iter(s._plans.values()))
    prep = s._prepared[gplan.key]
    assert len(prep.programs) == 1
    (program, n), = prep.programs.values()
    assert n == 2 and program[0][0] == ("dispatches" if best.raw_recording else "dispatch")
    again = s.run(None, {"x": x})[0]
    assert again.tobytes() == first.tobytes() == np.maximum(x, 0).tobytes()
    assert len(prep.programs) == 1 and s.last_run_stats["host_encode_us"] > 0
    assert s.last_run_stats["dispatches"] == 2


def test_constant_passes_run_once_per_plan(best):
    """QLinearConv's params pass reads only the node's constant scales and zero points: it runs
    in the plan's prologue into scratch of its own, each run dispatches the other passes, and the
    outputs stay onnxruntime's bits."""
    import warnings

    import onnxruntime as ort

    from onnx_quant import model_zoo
    from onnx_quant.backend_wgpu.session import Session

    model = model_zoo.quantized("cnn", "qoperator", blocks=1, channels=8, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = Session(model, device=best, allow_host_fallback=False)
    sess = ort.InferenceSession(widen_u8s8(model).model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in (3, 4):
        feeds = model_zoo.random_feeds(model, {"N": 1, "H": 8, "W": 8}, seed=seed)
        got = s.run(None, feeds)
        assert all(np.array_equal(g, w) for g, w in zip(got, sess.run(None, feeds)))
    gplan = next(iter(s._plans.values()))
    dispatches = s._prepared[gplan.key].dispatches   # per GPU step: its per-run commands
    convs = [st for st in gplan.gpu_steps if st.plan.kernel == "QLinearConv"]
    assert convs and all(st.hoisted >= 1 and st.plan.passes[0].id == "params" for st in convs)
    assert all(len(dispatches[st.index]) == len(st.plan.passes) - st.hoisted for st in convs)
    hoisted = sum(st.hoisted for st in gplan.gpu_steps)
    assert s.stats.prologue_dispatches == hoisted + sum(len(dispatches[st.index]) for st in gplan.prologue)
    assert s.last_run_stats["dispatches"] == sum(len(dispatches[st.index]) for seg in gplan.segments for st in seg.steps)
    conv = next(e for e in s.explain({"x": (1, 3, 8, 8)}) if e.get("kernel") == "QLinearConv")
    assert [p["once_per_plan"] for p in conv["passes"]][:2] == [True, False]

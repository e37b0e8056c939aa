"""Shapes and feeds of ``run``/``profile``/``explain`` (onnx_quant/feeds.py): parsing, binding, the
documented defaults, random ranges; and that a bad feed or shape exits 2 before any session is built
(no device needed: these tests fail if a Session is even constructed)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper

from onnx_quant import feeds
from onnx_quant.cli import build_parser, main
from onnx_quant.errors import ArgumentError


def two_input_model(x_dims=("N", 3, "H", "W"), m_dims=("N", "H", "W"), m_type=TP.INT32) -> onnx.ModelProto:
    """images float [N, 3, H, W] and mask int32 [N, H, W] (Identity each): symbols shared by two inputs."""
    ins = [helper.make_tensor_value_info("images", TP.FLOAT, list(x_dims)),
           helper.make_tensor_value_info("mask", m_type, list(m_dims))]
    outs = [helper.make_tensor_value_info("a", TP.FLOAT, list(x_dims)),
            helper.make_tensor_value_info("b", m_type, list(m_dims))]
    nodes = [helper.make_node("Identity", ["images"], ["a"], name="id_a"),
             helper.make_node("Identity", ["mask"], ["b"], name="id_b")]
    return helper.make_model(helper.make_graph(nodes, "g", ins, outs), opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "two.onnx"
    onnx.save(two_input_model(), path)
    return path


@pytest.fixture
def no_session(monkeypatch):
    """Any Session built from here on fails the test: feeds must be refused before one is."""
    from onnx_quant.backend_wgpu import session

    def refuse(*a, **k):
        raise AssertionError("a Session was built before the feeds were checked")

    monkeypatch.setattr(session.Session, "__init__", refuse)


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# --------------------------------------------------------------------------- parsing


def test_parse_shapes_dims_and_ranges():
    assert feeds.parse_shapes(["images=1,3,640,640", "s="]) == {"images": (1, 3, 640, 640), "s": ()}
    assert feeds.parse_shapes(["input:0=2, 4"]) == {"input:0": (2, 4)}  # tf2onnx names, spaces
    assert feeds.parse_dims(["N=1", "H=640"]) == {"N": 1, "H": 640}
    assert feeds.parse_int_range(None) == feeds.DEFAULT_INT_RANGE == (0, 16)
    assert feeds.parse_int_range("-8,8") == (-8, 8)
    assert feeds.parse_input_items(["x=a=b.npy"]) == {"x": "a=b.npy"}


@pytest.mark.parametrize("call, text, words", [
    (feeds.parse_shapes, ["images"], "expected NAME=D0,D1,..."),
    (feeds.parse_shapes, ["images=1,x"], "each dim must be an integer >= 0"),
    (feeds.parse_shapes, ["images=1,-3"], "each dim must be an integer >= 0"),
    (feeds.parse_shapes, ["a=1", "a=2"], "given twice"),
    (feeds.parse_dims, ["N"], "expected SYMBOL=V"),
    (feeds.parse_dims, ["N=-1"], "expected SYMBOL=V"),
    (feeds.parse_dims, ["N=1", "N=2"], "given twice"),
    (feeds.parse_int_range, "3", "expected LO,HI"),
    (feeds.parse_int_range, "4,4", "expected LO < HI"),
    (feeds.parse_input_items, ["x"], "expected NAME=FILE.npy"),
    (feeds.parse_input_items, ["=f.npy"], "expected NAME=FILE.npy"),
])
def test_malformed_options_are_argument_errors(call, text, words):
    with pytest.raises(ArgumentError, match=words.replace(".", r"\.")):
        call(text)


# --------------------------------------------------------------------------- binding


def test_defaults_are_one_for_a_batch_dim_and_32_elsewhere():
    b = feeds.bind_shapes(feeds.graph_inputs(two_input_model()))
    assert b.shapes == {"images": (1, 3, 32, 32), "mask": (1, 32, 32)}
    assert b.values == {"N": 1, "H": 32, "W": 32} and b.defaulted == ["N", "H", "W"]
    assert b.dims_text().startswith("dims: N=1, H=32, W=32 (all defaults: 1 on an input's first axis, 32 elsewhere")
    # a symbol's default is decided where it first appears (inputs in graph order): T on axis 1 first
    m = two_input_model(x_dims=("B", "T"), m_dims=("T", 4))
    assert feeds.bind_shapes(feeds.graph_inputs(m)).shapes == {"images": (1, 32), "mask": (32, 4)}


def test_dim_binds_a_symbol_in_every_input_and_shape_binds_its_symbols_in_others():
    inputs = feeds.graph_inputs(two_input_model())
    b = feeds.bind_shapes(inputs, dims={"H": 640, "W": 480})
    assert b.shapes == {"images": (1, 3, 640, 480), "mask": (1, 640, 480)} and b.defaulted == ["N"]
    assert b.dims_text() == "dims: N=1, H=640, W=480 (defaults: N; set them with --dim SYMBOL=V or --shape)"
    b = feeds.bind_shapes(inputs, given={"images": ((2, 3, 64, 96), "--shape images")})
    assert b.shapes["mask"] == (2, 64, 96) and b.defaulted == [] and b.dims_text() == "dims: N=2, H=64, W=96"


def test_dims_with_no_name_default_per_axis_and_are_listed_per_input():
    m = two_input_model(x_dims=(None, 3, "?", -1), m_dims=(4,))
    inputs = feeds.graph_inputs(m)
    assert inputs[0].dims == (None, 3, None, None)  # '?' and -1 name no dim
    b = feeds.bind_shapes(inputs)
    assert b.shapes == {"images": (1, 3, 32, 32), "mask": (4,)}
    assert list(b.values) == ["images[0]", "images[2]", "images[3]"] == b.defaulted
    assert b.shape_template("images", inputs[0].dims) == "--shape images=?,3,?,?"


@pytest.mark.parametrize("given, dims, words", [
    ({"images": ((1, 3, 8), "--shape images")}, {}, "--shape images: input 'images': expected rank 4 ['N', 3, 'H', 'W'], found rank 3"),
    ({"images": ((1, 4, 8, 8), "--shape images")}, {}, "dim 1 must be 3, found 4"),
    ({"images": ((2, 3, 8, 8), "--shape images")}, {"N": 1}, "dim 0 is 'N' = 2, but --dim N=1 binds 'N' = 1"),
    ({"images": ((1, 3, 8, 8), "--input images"), "mask": ((1, 9, 8), "--input mask")}, {},
     "--input mask: input 'mask': dim 1 is 'H' = 9, but --input images (input 'images' dim 2) binds 'H' = 8"),
    ({"nope": ((1,), "--shape nope")}, {}, "--shape nope: the model has no input 'nope' (inputs: images, mask)"),
    ({}, {"X": 1}, "--dim X=1: no input of the model has a symbolic dim 'X' (symbolic dims: N, H, W)"),
])
def test_shapes_that_contradict_the_model_or_each_other(given, dims, words):
    with pytest.raises(ArgumentError) as e:
        feeds.bind_shapes(feeds.graph_inputs(two_input_model()), given, dims)
    assert words in str(e.value)


def test_an_input_of_unknown_rank_needs_a_shape():
    m = two_input_model()
    m.graph.input[1].type.tensor_type.ClearField("shape")
    with pytest.raises(ArgumentError, match=r"input 'mask' has no declared shape: give it with --shape mask="):
        feeds.bind_shapes(feeds.graph_inputs(m))
    assert feeds.bind_shapes(feeds.graph_inputs(m), {"mask": ((5,), "--shape mask")}).shapes["mask"] == (5,)


def test_initializers_are_not_inputs_to_feed():
    m = two_input_model()
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros((1, 1, 1), np.int32), "mask"))
    assert [i.name for i in feeds.graph_inputs(m)] == ["images"]


# --------------------------------------------------------------------------- random feeds


def test_random_integers_come_from_the_documented_range():
    rng = np.random.default_rng(0)
    a = feeds.random_array("x", TP.INT32, (4096,), rng)
    assert a.dtype == np.int32 and a.min() == 0 and a.max() == 15  # [0, 16)
    a = feeds.random_array("x", TP.INT8, (4096,), rng, (-1000, 1000))  # clipped to int8's range
    assert a.min() == -128 and a.max() == 127
    a = feeds.random_array("x", TP.INT64, (4096,), rng, (100, 103))
    assert set(np.unique(a)) == {100, 101, 102}
    assert set(np.unique(feeds.random_array("b", TP.BOOL, (64,), rng))) == {False, True}
    f = feeds.random_array("f", TP.FLOAT, (4096,), rng)
    assert f.dtype == np.float32 and 3 < f.std() < 5
    with pytest.raises(ArgumentError, match="input 'u' is uint8, which holds 0..255: no value of the range fits"):
        feeds.random_array("u", TP.UINT8, (4,), rng, (-5, 0))


def test_make_feeds_reads_files_checks_them_and_draws_the_rest(tmp_path):
    m = two_input_model()
    np.save(tmp_path / "x.npy", np.ones((2, 3, 8, 4), np.float32))
    got = feeds.make_feeds(m, inputs=[f"images={tmp_path / 'x.npy'}"], random=True)
    assert got.random == ["mask"] and got.arrays["mask"].shape == (2, 8, 4) and got.arrays["mask"].dtype == np.int32
    again = feeds.make_feeds(m, inputs=[f"images={tmp_path / 'x.npy'}"], random=True)
    assert np.array_equal(again.arrays["mask"], got.arrays["mask"])  # a fixed seed
    np.save(tmp_path / "m64.npy", np.ones((2, 8, 4), np.int64))
    with pytest.raises(ArgumentError, match=r"^input 'mask': expected int32, found int64 \(--input mask="):
        feeds.make_feeds(m, inputs=[f"mask={tmp_path / 'm64.npy'}"], random=True)
    with pytest.raises(ArgumentError, match="the file of --input images holds shape"):
        feeds.make_feeds(m, inputs=[f"images={tmp_path / 'x.npy'}"], shapes=["images=2,3,8,8"], random=True)


# --------------------------------------------------------------------------- the CLI, before any session


def _bad_feed_cases(tmp_path, model_path):
    np.save(tmp_path / "x64.npy", np.zeros((1, 3, 4, 4)))
    np.save(tmp_path / "x3.npy", np.zeros((1, 3, 4), np.float32))
    np.save(tmp_path / "x_ok.npy", np.zeros((1, 3, 4, 4), np.float32))
    np.save(tmp_path / "m_bad.npy", np.zeros((1, 5, 4), np.int32))
    m = str(model_path)
    return [
        (["run", m], "input 'images' (float32 ['N', 3, 'H', 'W']) is missing: give --input images=FILE.npy or --random"),
        (["run", m, "--input", "images"], "--input 'images': expected NAME=FILE.npy"),
        (["run", m, "--input", f"images={tmp_path / 'none.npy'}", "--random"], "--input images: cannot read"),
        (["run", m, "--input", f"z={tmp_path / 'x_ok.npy'}", "--random"], "the model has no input 'z'"),
        (["run", m, "--input", f"images={tmp_path / 'x64.npy'}", "--random"], "input 'images': expected float32, found float64"),
        (["run", m, "--input", f"images={tmp_path / 'x3.npy'}", "--random"], "expected rank 4"),
        (["run", m, "--input", f"images={tmp_path / 'x_ok.npy'}", "--input", f"mask={tmp_path / 'm_bad.npy'}"],
         "dim 1 is 'H' = 5, but --input images (input 'images' dim 2) binds 'H' = 4"),
        (["run", m, "--random", "--shape", "images=1,3,8"], "expected rank 4"),
        (["run", m, "--random", "--dim", "C=3"], "no input of the model has a symbolic dim 'C'"),
        (["run", m, "--random", "--int-range", "a,b"], "--int-range 'a,b': expected LO,HI"),
        (["profile", m, "--shape", "images=2,3,4,4", "--dim", "N=1"], "binds 'N' = 1"),
        (["profile", m, "--runs", "0"], "--runs 0: expected at least 1"),
        (["profile", m, "--top", "0"], "--top 0: expected at least 1"),
        (["explain", m, "--shape", "mask=1,2"], "--shape mask: input 'mask': expected rank 3"),
        (["explain", m, "--dim", "N"], "--dim 'N': expected SYMBOL=V"),
    ]


def test_bad_feeds_and_shapes_exit_2_in_one_line_before_a_session(capsys, tmp_path, model_path, no_session):
    for argv, words in _bad_feed_cases(tmp_path, model_path):
        code, _, err = run_cli(capsys, *argv)
        assert code == 2, (argv, err)
        assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)


def test_run_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["run", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for words in ("path to an .onnx file", "feed this input from a .npy file", "feed every input no --input gives",
                  "an input's whole shape", "a symbolic dim's value wherever it appears", "[LO, HI)",
                  "write outputs as .npy files here", "adapter index or a substring", "1 where a symbol first appears"):
        assert words in text, words


def test_profile_defaults_are_small():
    args = build_parser().parse_args(["profile", "m.onnx"])
    assert args.runs == 3 and args.shape == [] and args.dim == [] and args.int_range is None

"""Sequences and optionals in the inference pass (inference/sequences.py): the items of a sequence
the pass knows, the exact types of what a model reads out of it, the element shapes a caller gives
for a sequence input, and every such type checked against what onnx.reference computes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from onnx_quant.inference import infer_shapes, infer_values
from onnx_quant.inference.context import SequenceInfo, TensorInfo
from onnx_quant.inference.sequences import Elements, split_sizes

from support.models import make_model, vi
from support.oracles import ref_run

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def seq(name, elem=F):
    return helper.make_tensor_sequence_value_info(name, elem, None)


def shapes_of(values, *names):
    return [values[n].shape for n in names]


def test_two_reads_of_two_sequences_are_typed_each_by_its_own():
    """Two SequenceAt nodes alike but for their sequence: the memo keyed both on one sequence type
    once (every sequence value had the key of an unknown tensor), and gave the second the first's."""
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node("SplitToSequence", ["a"], ["t"], axis=1, keepdims=0),
             helper.make_node("SequenceAt", ["s", "p"], ["z"]),
             helper.make_node("SequenceAt", ["t", "p"], ["u"])]
    m = make_model(nodes, [vi("a", F, [2, 3]), vi("b", F, [4, 3]), vi("p", I64, [])], ["z", "u"], opset=18)
    v = infer_values(m)
    assert v["u"].shape == (2,)          # onnx's merged type of t's elements, not s's [?, 3]
    assert v["z"].elem_type == F and v["z"].shape[1:] == (3,)


def test_known_items_give_exact_reads():
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node("SequenceInsert", ["s", "c", "one"], ["s2"]),      # [a, c, b]
             helper.make_node("SequenceErase", ["s2", "zero"], ["s3"]),          # [c, b]
             helper.make_node("SequenceAt", ["s3", "one"], ["e"]),               # b
             helper.make_node("SequenceLength", ["s3"], ["n"]),
             helper.make_node("ConcatFromSequence", ["s3"], ["cat"], axis=0),
             helper.make_node("ConcatFromSequence", ["s3"], ["stk"], axis=-1, new_axis=1)]
    m = make_model(nodes, [vi("a", F, [2, 3]), vi("b", F, [4, 3]), vi("c", F, [5, 3])], ["e", "n", "cat", "stk"],
                   inits={"one": np.array(1, np.int64), "zero": np.array(0, np.int64)}, opset=18)
    v = infer_values(m)
    assert isinstance(v["s3"], SequenceInfo) and [i.shape for i in v["s3"].items] == [(5, 3), (4, 3)]
    assert shapes_of(v, "e", "cat") == [(4, 3), (9, 3)]
    assert int(v["n"].value) == 2
    assert v["stk"].shape is None or None in v["stk"].shape  # new_axis needs equal shapes: unknown stays unknown


def test_split_to_sequence_items():
    nodes = [helper.make_node("SplitToSequence", ["x", "two"], ["s"], axis=1),
             helper.make_node("SplitToSequence", ["x", "sizes"], ["t"], axis=1),
             helper.make_node("SplitToSequence", ["x"], ["u"], axis=0, keepdims=0)]
    m = make_model(nodes, [vi("x", F, [3, 5])], ["s", "t", "u"],
                   inits={"two": np.array(2, np.int64), "sizes": np.array([1, 4], np.int64)}, opset=18)
    v = infer_values(m)
    assert [i.shape for i in v["s"].items] == [(3, 2), (3, 2), (3, 1)]
    assert [i.shape for i in v["t"].items] == [(3, 1), (3, 4)]
    assert [i.shape for i in v["u"].items] == [(5,)] * 3
    assert split_sizes(5, np.array(0)) is None and split_sizes(5, np.array([2, 2])) is None


def test_a_sequence_input_takes_its_elements_shapes():
    nodes = [helper.make_node("SequenceAt", ["s", "p"], ["z"]), helper.make_node("SequenceLength", ["s"], ["n"]),
             helper.make_node("ConcatFromSequence", ["s"], ["c"], axis=1)]
    m = make_model(nodes, [seq("s"), vi("p", I64, [])], ["z", "n", "c"], opset=18)
    v = infer_values(m, {"s": Elements([(2, 3), (2, 4)])})
    assert shapes_of(v, "z", "c") == [(2, None), (2, 7)] and int(v["n"].value) == 2
    v = infer_values(m, {"s": Elements([(2, 3), (2, 4)]), "p": ()}, input_values={"p": np.array(-1)})
    assert v["z"].shape == (2, 4)
    v = infer_values(m, {"s": Elements([(2, 3), (2, 3)])})  # equal elements: any position
    assert v["z"].shape == (2, 3)
    assert v["s"].type_proto.sequence_type.elem_type.tensor_type.shape.dim[1].dim_value == 3


def test_optionals():
    opt = helper.make_value_info("o", helper.make_optional_type_proto(helper.make_tensor_type_proto(F, None)))
    nodes = [helper.make_node("OptionalHasElement", ["o"], ["h"]), helper.make_node("OptionalGetElement", ["o"], ["g"]),
             helper.make_node("Optional", ["x"], ["ox"]), helper.make_node("OptionalHasElement", ["ox"], ["hx"]),
             helper.make_node("OptionalHasElement", ["x"], ["ht"])]
    m = make_model(nodes, [opt, vi("x", F, [2])], ["h", "g", "hx", "ht"], opset=18)
    v = infer_values(m, {"o": (4, 5)})
    assert bool(v["h"].value) and v["g"].shape == (4, 5) and bool(v["hx"].value) and bool(v["ht"].value)
    v = infer_values(m, {"o": None})
    assert not bool(v["h"].value)
    written = infer_shapes(m)  # the write-back keeps the sequence and optional types
    types = {x.name: x.type.WhichOneof("value") for x in written.graph.value_info}
    assert types["ox"] == "optional_type"


@st.composite
def sequence_program(draw):
    """A sequence input of 1-4 elements [r, c_i] and static positions for insert / erase / at."""
    rows = draw(st.integers(1, 3))
    cols = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    n = len(cols)
    insert_at = draw(st.integers(-n, n - 1))  # onnx.reference puts position n at the front
    erase_at = draw(st.integers(-(n + 1), n))
    at = draw(st.integers(-n, n - 1))
    extra = draw(st.integers(1, 4))
    return rows, cols, insert_at, erase_at, at, extra


@settings(max_examples=30)
@given(sequence_program())
def test_inferred_shapes_are_what_onnx_reference_computes(case):
    rows, cols, insert_at, erase_at, at, extra = case
    nodes = [helper.make_node("SequenceInsert", ["s", "t", "pi"], ["s2"]),
             helper.make_node("SequenceErase", ["s2", "pe"], ["s3"]),
             helper.make_node("SequenceAt", ["s3", "pa"], ["e"]),
             helper.make_node("ConcatFromSequence", ["s3"], ["c"], axis=1),
             helper.make_node("SequenceLength", ["s3"], ["n"]),
             helper.make_node("SplitToSequence", ["c", "two"], ["pieces"], axis=1)]
    m = make_model(nodes, [seq("s"), vi("t", F, [rows, extra])], ["s3", "e", "c", "n", "pieces"],
                   inits={"pi": np.array(insert_at, np.int64), "pe": np.array(erase_at, np.int64),
                          "pa": np.array(at, np.int64), "two": np.array(2, np.int64)}, opset=18)
    feeds = {"s": [np.zeros((rows, c), np.float32) for c in cols], "t": np.zeros((rows, extra), np.float32)}
    v = infer_values(m, {"s": Elements([(rows, c) for c in cols])})
    s3, e, c, n, pieces = ref_run(m, feeds)
    assert [i.shape for i in v["s3"].items] == [x.shape for x in s3]
    assert [i.shape for i in v["pieces"].items] == [x.shape for x in pieces]
    assert v["c"].shape == c.shape and int(v["n"].value) == int(n)
    if -len(s3) <= at < len(s3):
        assert v["e"].shape == e.shape


def test_a_sequence_info_equals_what_holds_the_same():
    """Equal where the type and the items are (never to a tensor's unknown TensorInfo)."""
    tp = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, ["N"]))
    info = SequenceInfo(tp)
    assert info.kind == "sequence" and info.items is None and info == SequenceInfo(tp)
    assert info != SequenceInfo(tp, ()) and info != TensorInfo()

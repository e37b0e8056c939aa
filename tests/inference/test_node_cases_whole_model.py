"""ONNX's own node test cases for the whole-model rules (elementwise, nn, tensor_ops).

Every case of ``collect_testcases()`` whose graph is one node of an operator below (and every
multi-node "expanded" case made only of such operators) is inferred by ``inference.infer``
with the graph outputs' types stripped (names kept); the declared output element types and
shapes must come back, and each node of these operators must have been typed by its own
rule (not by the onnx fallback).

Older opsets: each case is also converted (``onnx.version_converter``) down to the older
since_versions the rules claim, and compared with onnx's strict inference there.

Data-dependent inputs: the node cases feed Reshape's shape, Slice's starts, Resize's scales
... as graph inputs with data. Real models carry them as constants, and the rules read them
from values, so the case's data for those inputs (:data:`DATA_INPUTS`) is bound as an
initializer (and removed from the graph inputs). No case is excluded (:data:`EXCLUDED`).
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnx_quant import inference
from onnx_quant.inference import registry
from onnx_quant.inference.context import TensorInfo

ELEMENTWISE = ("Add Sub Mul Div Pow Relu LeakyRelu Sigmoid Tanh Erf Gelu Clip Where Equal Less Greater Not Cast "
               "CastLike Identity Sqrt Exp Neg Dropout").split()
NN = ("MatMul Gemm Conv ConvTranspose MaxPool AveragePool GlobalAveragePool GlobalMaxPool BatchNormalization "
      "LayerNormalization Softmax LogSoftmax").split()
TENSOR_OPS = ("Reshape Flatten Transpose Squeeze Unsqueeze Concat Split Slice Gather GatherElements Expand Tile Pad "
              "Resize Shape Size ConstantOfShape Constant Range Einsum TopK ArgMax ReduceMean ReduceSum ReduceMax "
              "ReduceMin").split()
OPS = frozenset(ELEMENTWISE + NN + TENSOR_OPS)

#: node inputs whose data decides the output shape: bound as initializers (see module doc)
DATA_INPUTS = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Pad": (1, 3), "Resize": (1, 2, 3), "Slice": (1, 2, 3, 4),
    "Split": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "TopK": (1,), "ConstantOfShape": (0,),
    "Range": (0, 1, 2), "ReduceMean": (1,), "ReduceSum": (1,), "ReduceMax": (1,), "ReduceMin": (1,),
}

#: case name -> why it is not run (none at present)
EXCLUDED: dict[str, str] = {}


@functools.lru_cache(maxsize=1)
def _selected() -> tuple[list, list]:
    """(single-node cases, multi-node cases) of the operators above; collected once."""
    from onnx_quant.node_cases import all_node_cases

    single, multi = [], []
    for case in all_node_cases():
        model = case.model
        if model is None or case.name in EXCLUDED:
            continue
        nodes = model.graph.node
        if any(nd.domain not in ("", "ai.onnx") for nd in nodes):
            continue
        ops = {nd.op_type for nd in nodes}
        if len(nodes) == 1 and ops <= OPS:
            single.append(case)
        elif len(nodes) > 1 and ops <= OPS:
            multi.append(case)
    return single, multi


def _prepared(case) -> onnx.ModelProto:
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    graph = model.graph
    feeds = dict(zip([v.name for v in graph.input], case.data_sets[0][0])) if case.data_sets else {}
    bound = {nd.input[i] for nd in graph.node for i in DATA_INPUTS.get(nd.op_type, ())
             if i < len(nd.input) and nd.input[i] in feeds}
    if bound:
        keep = [v for v in graph.input if v.name not in bound]
        del graph.input[:]
        graph.input.extend(keep)
        for name in sorted(bound):
            graph.initializer.append(numpy_helper.from_array(np.asarray(feeds[name]), name))
    for out in graph.output:
        out.type.Clear()
    return model


def _problems(case) -> list[str]:
    model = _prepared(case)
    try:
        result = inference.infer(model, strict=True)
    except Exception as e:  # report, do not stop the op's other cases
        return [f"{case.name}: {type(e).__name__}: {e}"]
    out = []
    for rec in result.nodes:
        # the pass types well-formed Constant nodes itself (source "constant")
        if rec.op_type in OPS and rec.source not in ("rule", "constant"):
            out.append(f"{case.name}: node {rec.label} typed by {rec.describe()}, not by its rule")
    for vo in case.model.graph.output:
        expected = TensorInfo.from_type_proto(vo.type)
        got = result.ctx[vo.name]
        if (got.elem_type, got.shape) != (expected.elem_type, expected.shape):
            out.append(f"{case.name}: output {vo.name!r}: expected type {expected.elem_type} "
                       f"{expected.shape_text()}, found {got.elem_type} {got.shape_text()}")
    # infer_shapes (the public drop-in) writes the same types back onto the stripped outputs
    written = {vo.name: TensorInfo.from_type_proto(vo.type) for vo in inference.infer_shapes(model).graph.output}
    for vo in case.model.graph.output:
        expected = TensorInfo.from_type_proto(vo.type)
        if (written[vo.name].elem_type, written[vo.name].shape) != (expected.elem_type, expected.shape):
            out.append(f"{case.name}: infer_shapes wrote {written[vo.name].shape_text()} for {vo.name!r}")
    return out


@pytest.mark.parametrize("op", sorted(OPS))
def test_node_cases_of_op(op: str) -> None:
    single, _ = _selected()
    cases = [c for c in single if c.model.graph.node[0].op_type == op]
    assert cases, f"{op}: onnx ships no single-node case for it"
    problems = [p for c in cases for p in _problems(c)]
    assert not problems, f"{len(problems)} problem(s) in {len(cases)} {op} cases:\n" + "\n".join(problems)


def test_expanded_node_cases() -> None:
    """Function-expanded cases (several nodes, all of these operators) chain the rules."""
    _, multi = _selected()
    assert len(multi) >= 100
    problems = [p for c in multi for p in _problems(c)]
    assert not problems, "\n".join(problems)


def test_case_counts() -> None:
    single, multi = _selected()
    # 635 single-node and 137 expanded cases with onnx 1.23; fewer means the filter broke
    assert len(single) >= 600, len(single)
    assert {c.model.graph.node[0].op_type for c in single} == OPS


def test_registered_versions_exist_in_onnx() -> None:
    """Every since_version a rule claims is one ONNX defines for that operator."""
    from onnx import defs

    onnx_versions: dict[str, set[int]] = {}
    for s in defs.get_all_schemas_with_history():
        if s.domain == "" and s.name in OPS:
            onnx_versions.setdefault(s.name, set()).add(s.since_version)
    table = registry.registered()
    for op in OPS:
        claimed = set(table[("", op)])
        assert claimed <= onnx_versions[op], (op, sorted(claimed - onnx_versions[op]))
        latest = max(onnx_versions[op])
        found = registry.lookup("", op, defs.onnx_opset_version())
        assert found is not None and found[1] == latest, op


def test_older_opsets_agree_with_onnx() -> None:
    """Node cases converted (onnx.version_converter) down to each older since_version a rule
    claims: ours must match onnx's strict inference where onnx knows the type. A few cases
    per (operator, version); conversions the converter refuses are skipped."""
    from onnx import shape_inference, version_converter

    single, _ = _selected()
    table = registry.registered()
    by_op: dict[str, list] = {}
    for case in single:
        by_op.setdefault(case.model.graph.node[0].op_type, []).append(case)
    checked, problems = 0, []
    for op, cases in sorted(by_op.items()):
        for version in table[("", op)]:
            tries = 0
            for case in cases:
                base = _prepared(case)
                current = next(o.version for o in base.opset_import if o.domain in ("", "ai.onnx"))
                if version >= current or tries >= 3:
                    continue
                tries += 1
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        old = version_converter.convert_version(base, version)
                    theirs = shape_inference.infer_shapes(old, strict_mode=True, data_prop=True)
                except Exception:  # no adapter for this case, or a model onnx rejects at that version
                    continue
                known = {v.name: TensorInfo.from_type_proto(v.type) for v in theirs.graph.output}
                try:
                    mine = inference.infer(old, strict=True).ctx
                except Exception as e:
                    problems.append(f"{case.name} @ opset {version}: {e}")
                    break
                for name, other in known.items():
                    got = mine[name]
                    if other.elem_type and got.elem_type != other.elem_type or other.shape is not None and (
                            got.shape is None or len(got.shape) != len(other.shape)
                            or any(isinstance(o, int) and g != o for g, o in zip(got.shape, other.shape))):
                        problems.append(f"{case.name} @ opset {version}: {name}: ours {got.elem_type} "
                                        f"{got.shape_text()}, onnx {other.elem_type} {other.shape_text()}")
                checked += 1
                break
    assert checked >= 80, checked  # 97 with onnx 1.23
    assert not problems, "\n".join(problems)

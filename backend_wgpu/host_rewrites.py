"""Nodes rewritten before onnx.reference evaluates them on the host, where its result for
the node as written differs from the operator's inference meaning (and onnxruntime's).

- BatchNormalization before opset 14: onnx.reference (onnx 1.23) computes the batch's own
  statistics for opsets 9-13 whatever the node says (its ``momentum`` default, 0.9, is always
  filled in; paddle2onnx also writes one) and for opsets 6-8 unless ``is_test`` is 1. A node
  whose only output is Y is an inference node (onnxruntime runs it with the given mean and
  var): it is evaluated as BatchNormalization-15 with training_mode 0, the same Y. One that
  asks for the running or saved statistics (training outputs) is refused, naming the node.
"""

from __future__ import annotations

import onnx

from onnx_quant.errors import ExecutionError


def host_node(node: onnx.NodeProto, opset: int, label: str) -> tuple[onnx.NodeProto, int]:
    """The node onnx.reference should evaluate for ``node`` and the ai.onnx opset its one-node
    model imports (``node`` and ``opset`` themselves where nothing differs)."""
    if node.op_type != "BatchNormalization" or node.domain not in ("", "ai.onnx") or opset >= 14:
        return node, opset
    if any(node.output[1:]):
        raise ExecutionError(f"node {label!r} (BatchNormalization): training outputs before opset 14: expected "
                             f"only Y (inference), found outputs {[o for o in node.output[1:] if o]}; "
                             f"onnx.reference would compute batch statistics")
    fixed = onnx.NodeProto()
    fixed.CopyFrom(node)
    del fixed.attribute[:]
    fixed.attribute.extend(a for a in node.attribute if a.name == "epsilon")  # spatial 1 is BN-15's only form
    fixed.attribute.append(onnx.helper.make_attribute("training_mode", 0))
    return fixed, 15

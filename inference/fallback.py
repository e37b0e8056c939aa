"""onnx's per-node inference, for a node no rule of this project serves (the *fallback*).

The node goes to onnx's per-node inference for the schema ``onnx.defs`` selects, with its inputs' types (and those of the outer-scope values its bodies read), small
constant inputs as data (Reshape's shape, Slice's starts, Resize's scales need it; weights
never do) and the model's opset imports. A unary same-type node whose signature onnx
accepted before is typed without the round trip (``_UNARY_ACCEPTED``).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from .api import SOURCE_FAILED, SOURCE_FALLBACK, SOURCE_UNKNOWN
from .context import TensorInfo
from .diagnostics import one_line
from .memo import Keys
from .scope import UNKNOWN, Bookkeeping, LazyConstant, NodeCtx, Scope

#: Constants up to this many elements are handed to onnx's inference as input data.
DATA_MAX_ELEMENTS = 64

_GRAPH_ATTRS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)

#: ai.onnx operators without an own rule whose output is, by the standard, their one input's
#: element type and shape (unary elementwise). Whether onnx's inference accepts such a node is
#: a function of its signature (schema version, input element type, attribute names and types),
#: not of its shape or data, so a signature onnx once accepted with exactly the input's type as
#: its answer is typed so again without the round trip through onnx (~10x the cost of a rule).
_UNARY_SAME_TYPE = frozenset({
    "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Ceil", "Celu", "Cos", "Cosh", "Elu", "Exp",
    "Floor", "HardSigmoid", "HardSwish", "Log", "Mish", "Neg", "Reciprocal", "Relu", "Round", "Selu",
    "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu",
    "LeakyRelu", "Erf", "Swish", "BitwiseNot",
})
_UNARY_ACCEPTED: set = set()
_UNARY_ACCEPTED_MAX = 4096


class Fallback:
    """onnx's inference for one pass: the model's opset imports and IR version, and each small
    constant's ``TensorProto`` bytes made once."""

    def __init__(self, model: onnx.ModelProto, keys: Keys, owner: Bookkeeping) -> None:
        self.keys = keys
        self.owner = owner  # notes the constants onnx reads (the memo), reports what onnx rejects
        self.onnx_opsets = {o.domain: int(o.version) for o in model.opset_import} or {"": 1}
        self.ir_version = int(model.ir_version) or onnx.IR_VERSION
        self._data_bytes: dict[int, tuple] = {}  # id(info) -> (info, TensorProto bytes or None)

    def run(self, schema, n: NodeCtx) -> str:
        """Type the node with onnx's inference; returns the node's source (see NodeRecord)."""
        node = n.node
        scope = n.ctx
        signature = _unary_signature(schema, node, scope)
        if signature is not None and signature in _UNARY_ACCEPTED:
            x = scope.get(node.input[0])  # what onnx answered for this signature before
            scope.define(node.output[0], TensorInfo(x.elem_type, x.shape))
            return SOURCE_FALLBACK
        types: dict[str, bytes] = {}
        data: dict[str, bytes] = {}
        all_typed = True
        for name in node.input:
            if not name or name in types:
                continue
            b = self._name_type_bytes(scope, name)
            all_typed &= bool(b)
            types[name] = b
            info = scope.get(name)
            if info is not None:
                d = self._data(info)
                if d is not None:
                    data[name] = d
        if any(a.type in _GRAPH_ATTRS for a in node.attribute):
            for name in _subgraph_references(node):
                if name not in types and name in scope:
                    types[name] = self._name_type_bytes(scope, name)
        try:
            out = schema._infer_node_outputs(node.SerializeToString(), types, data, {},
                                             self.onnx_opsets, self.ir_version)
        except Exception as e:
            if not all_typed:  # with an unknown input the failure is a consequence, not a finding
                return SOURCE_UNKNOWN
            self.owner.raise_or_record(n.error(SOURCE_FALLBACK, f"onnx's inference rejects the node: {one_line(e)}"))
            return SOURCE_FAILED
        keys = self.keys
        for name in node.output:
            if not name:
                continue
            b = out.get(name)
            if not b:
                scope.define(name, UNKNOWN)
                continue
            tp = onnx.TypeProto.FromString(b)
            if tp.WhichOneof("value") not in (None, "tensor_type"):
                scope.other[name] = tp
                scope.define(name, TensorInfo())
                continue
            info = keys.from_type_proto(tp)
            scope.define(name, info)
            keys.intern(info, b)  # consumers pass onnx's own bytes back to it
        if signature is not None:
            x = scope.get(node.input[0])
            if scope.local(node.output[0]) == TensorInfo(x.elem_type, x.shape):
                if len(_UNARY_ACCEPTED) >= _UNARY_ACCEPTED_MAX:
                    _UNARY_ACCEPTED.clear()
                _UNARY_ACCEPTED.add(signature)
        return SOURCE_FALLBACK

    def _name_type_bytes(self, scope: Scope, name: str) -> bytes:
        tp = scope.other_type(name)
        if tp is not None:
            return tp.SerializeToString()
        info = scope.get(name)
        if info is None or not info.elem_type:
            return b""
        return self.keys.type_bytes(info)

    def _data(self, info: TensorInfo) -> bytes | None:
        """A small constant as TensorProto bytes (onnx's inference reads Reshape's shape ...)."""
        rec = self._data_bytes.get(id(info))
        if rec is not None:
            if rec[1] is not None and type(info) is LazyConstant:
                self.owner.log.append(info)  # onnx reads it: the node's result depends on it
            return rec[1]
        b = None
        if type(info) is LazyConstant:
            if not info.external and info.size <= DATA_MAX_ELEMENTS:
                b = info.proto.SerializeToString()
                self.owner.log.append(info)
        else:
            v = info.value
            # object arrays (symbolic entries, a rule's form) have no TensorProto form
            if v is not None and v.dtype != object and v.size <= DATA_MAX_ELEMENTS:
                try:
                    b = numpy_helper.from_array(np.asarray(v)).SerializeToString()
                except Exception:  # a dtype numpy_helper cannot write: onnx gets no data
                    b = None
        self._data_bytes[id(info)] = (info, b)
        return b


def _unary_signature(schema, node: onnx.NodeProto, scope: Scope) -> tuple | None:
    """What onnx's verdict on a unary same-type node depends on; None for any other node (or
    an input that is not a typed tensor)."""
    if schema.name not in _UNARY_SAME_TYPE or schema.domain != "" or len(node.input) != 1 \
            or len(node.output) != 1 or not node.output[0]:
        return None
    name = node.input[0]
    x = scope.get(name) if name else None
    if x is None or not x.elem_type or scope.other_type(name) is not None:
        return None
    return (schema.name, schema.since_version, x.elem_type,
            tuple((a.name, a.type, a.ref_attr_name) for a in node.attribute))


def _subgraph_references(node: onnx.NodeProto) -> set[str]:
    """Every value name the node's bodies (at any depth) read or output."""
    names: set[str] = set()
    stack = [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
    stack += [g for a in node.attribute if a.type == onnx.AttributeProto.GRAPHS for g in a.graphs]
    while stack:
        g = stack.pop()
        for inner in g.node:
            names.update(x for x in inner.input if x)
            stack += [a.g for a in inner.attribute if a.type == onnx.AttributeProto.GRAPH]
            stack += [sg for a in inner.attribute if a.type == onnx.AttributeProto.GRAPHS for sg in a.graphs]
        names.update(o.name for o in g.output)
    return names

"""onnx's per-node inference, for a node no rule of this project serves (the *fallback*).

The node goes to ``onnx.shape_inference.infer_node_outputs`` for the schema ``onnx.defs``
selects, with its inputs' types (and those of the outer-scope values its bodies read), small
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
from .sequences import REFINED, refine

#: Constants up to this many elements are handed to onnx's inference as input data.
DATA_MAX_ELEMENTS = 64

_GRAPH_ATTRS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
_NO_TYPE = onnx.TypeProto()

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
    """onnx's inference for one pass: the model's opset imports and IR version, and each
    value's form for onnx (its ``TypeProto``, a small constant's ``TensorProto``) made once."""

    def __init__(self, model: onnx.ModelProto, keys: Keys, owner: Bookkeeping) -> None:
        self.keys = keys
        self.owner = owner  # notes the constants onnx reads (the memo), reports what onnx rejects
        self.opset_imports = list(model.opset_import) or [onnx.helper.make_opsetid("", 1)]
        self.ir_version = int(model.ir_version) or onnx.IR_VERSION
        self._types: dict[int, tuple] = {}  # id(info) -> (info, TypeProto)
        self._data: dict[int, tuple] = {}  # id(info) -> (info, TensorProto or None)

    def run(self, schema, n: NodeCtx) -> str:
        """Type the node with onnx's inference; returns the node's source (see NodeRecord)."""
        node = n.node
        scope = n.ctx
        signature = _unary_signature(schema, node, scope)
        if signature is not None and signature in _UNARY_ACCEPTED:
            x = scope.get(node.input[0])  # what onnx answered for this signature before
            scope.define(node.output[0], TensorInfo(x.elem_type, x.shape))
            return SOURCE_FALLBACK
        types: dict[str, onnx.TypeProto] = {}
        data: dict[str, onnx.TensorProto] = {}
        all_typed = True
        for name in node.input:
            if not name or name in types:
                continue
            tp, typed = self._type_of(scope, name)
            all_typed &= typed
            types[name] = tp
            info = scope.get(name)
            if info is not None:
                d = self._data_of(info)
                if d is not None:
                    data[name] = d
        if any(a.type in _GRAPH_ATTRS for a in node.attribute):
            for name in _subgraph_references(node):
                if name not in types and name in scope:
                    types[name] = self._type_of(scope, name)[0]
        try:
            out = onnx.shape_inference.infer_node_outputs(schema, node, types, data, None, self.opset_imports,
                                                          self.ir_version)
        except Exception as e:
            if not all_typed:  # with an unknown input the failure is a consequence, not a finding
                return SOURCE_UNKNOWN
            self.owner.raise_or_record(n.error(SOURCE_FALLBACK, f"onnx's inference rejects the node: {one_line(e)}"))
            return SOURCE_FAILED
        keys = self.keys
        for name in node.output:
            if not name:
                continue
            tp = out.get(name)
            if tp is None or not tp.ByteSize():
                scope.define(name, UNKNOWN)
                continue
            if tp.WhichOneof("value") not in (None, "tensor_type"):
                scope.define_other(name, tp)
                continue
            info = keys.from_type_proto(tp)
            scope.define(name, info)
            keys.intern(info, tp.SerializeToString())  # consumers pass onnx's own bytes back to it
        if node.op_type in REFINED and schema.domain == "":  # what a sequence's known items add
            refine(node, scope)
        if signature is not None:
            x = scope.get(node.input[0])
            if scope.local(node.output[0]) == TensorInfo(x.elem_type, x.shape):
                if len(_UNARY_ACCEPTED) >= _UNARY_ACCEPTED_MAX:
                    _UNARY_ACCEPTED.clear()
                _UNARY_ACCEPTED.add(signature)
        return SOURCE_FALLBACK

    def _type_of(self, scope: Scope, name: str) -> tuple[onnx.TypeProto, bool]:
        """(``name``'s type for onnx, whether it is typed): an empty ``TypeProto`` when unknown."""
        tp = scope.other_type(name)
        if tp is not None:
            return tp, bool(tp.ByteSize())
        info = scope.get(name)
        if info is None or not info.elem_type:
            return _NO_TYPE, False
        rec = self._types.get(id(info))
        if rec is None:
            rec = self._types[id(info)] = (info, onnx.TypeProto.FromString(self.keys.type_bytes(info)))
        return rec[1], True

    def _data_of(self, info: TensorInfo) -> onnx.TensorProto | None:
        """A small constant as a TensorProto (onnx's inference reads Reshape's shape ...)."""
        rec = self._data.get(id(info))
        if rec is not None:
            if rec[1] is not None and type(info) is LazyConstant:
                self.owner.log.append(info)  # onnx reads it: the node's result depends on it
            return rec[1]
        t = None
        if type(info) is LazyConstant:
            if not info.external and info.size <= DATA_MAX_ELEMENTS:
                t = info.proto
                self.owner.log.append(info)
        else:
            v = info.value
            # object arrays (symbolic entries, a rule's form) have no TensorProto form
            if v is not None and v.dtype != object and v.size <= DATA_MAX_ELEMENTS:
                try:
                    t = numpy_helper.from_array(np.asarray(v))
                except Exception:  # a dtype numpy_helper cannot write: onnx gets no data
                    t = None
        self._data[id(info)] = (info, t)
        return t


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

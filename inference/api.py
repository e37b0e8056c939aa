"""What a pass returns: ``InferenceResult`` (every value's type, what typed it, one
``NodeRecord`` per node, the diagnostics) and the names of how a value was typed.

``infer``, ``infer_shapes``, ``infer_values`` and ``check_model`` (``inference.engine``) are
views of one result; ``inference.writeback`` writes one into a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from onnx_quant.errors import InferenceError

from .context import ShapesContext, TensorInfo
from .diagnostics import Diagnostic
from .memo import Keys
from .registry import normalize_domain
from .scope import Graph, node_label

# How a value was typed, as ``InferenceResult.typed_by`` and the CLI name it.
SOURCE_INPUT = "input"
SOURCE_INITIALIZER = "initializer"
SOURCE_CONSTANT = "constant"
SOURCE_RULE = "rule"
SOURCE_FALLBACK = "onnx-fallback"
SOURCE_FUNCTION = "function"
SOURCE_UNKNOWN = "unknown"
SOURCE_FAILED = "failed"
SOURCE_DECLARED = "declared"
#: the sources of a node whose outputs are typed (the others leave them unknown)
TYPED_SOURCES = frozenset((SOURCE_RULE, SOURCE_FALLBACK, SOURCE_CONSTANT, SOURCE_FUNCTION))


@dataclass(frozen=True)
class NodeRecord:
    """How one node was typed.

    ``source`` is ``"rule"``, ``"onnx-fallback"``, ``"constant"``, ``"function"`` (a
    model-local function, inlined), ``"unknown"`` (no rule, no schema, no function) or
    ``"failed"`` (the rule or onnx rejected the node, or a required input is missing);
    ``version`` is the since_version of the rule's or schema's version that served the model's
    opset.
    """

    index: int
    label: str
    domain: str
    op_type: str
    source: str
    version: int | None = None

    def describe(self) -> str:
        """Short form for tables: ``rule QLinearConv v10``, ``onnx-fallback Relu v14``, ``unknown``."""
        return describe(self.source, self.domain, self.op_type, self.version)


def describe(source: str, domain: str, op_type: str, version: int | None) -> str:
    """``NodeRecord.describe`` of a node typed by ``source``."""
    op = f"{domain}::{op_type}" if domain else op_type
    if source == SOURCE_FUNCTION:
        return f"function {op}"
    ver = f" v{version}" if version is not None else ""
    if source in (SOURCE_RULE, SOURCE_FALLBACK, SOURCE_FAILED):
        return f"{source} {op}{ver}"
    return source


@dataclass
class InferenceResult:
    """The outcome of one pass; ``infer_shapes``, ``infer_values`` and ``check_model`` read it.

    ``ctx`` holds every value's ``TensorInfo`` (of the main graph); ``errors`` every violation
    found (lenient mode records them instead of raising) and ``diagnostics`` the same as
    ``Diagnostic``s; ``nodes`` one ``NodeRecord`` per node of the main graph; ``typed_by``
    value name -> what typed it (``input``, ``initializer``, a node's
    ``NodeRecord.describe()``, ``declared``...); ``other_types`` the non-tensor types
    (sequences, optionals, maps) onnx inferred, which a ``TensorInfo`` cannot hold;
    ``subgraphs`` the values of every ``If``/``Loop``/``Scan`` body, by path (see
    :func:`subgraph_values`). ``main`` is the main graph as walked and ``types`` the pass's
    serialized types (what the write-back reads).
    """

    ctx: ShapesContext
    typed_by: dict[str, str] = field(default_factory=dict)
    other_types: dict[str, onnx.TypeProto] = field(default_factory=dict)
    subgraphs: dict[tuple, Graph] = field(default_factory=dict, repr=False)
    #: one per node of the main graph, in order: (source, version), or the dispatch entry of a
    #: memo hit, which says how (``nodes`` reads them)
    records: list = field(default_factory=list, repr=False)
    _nodes: list | None = field(default=None, repr=False)
    main: Graph | None = field(default=None, repr=False)
    types: Keys | None = field(default=None, repr=False)

    @property
    def nodes(self) -> list[NodeRecord]:
        if self._nodes is None or len(self._nodes) != len(self.records):
            nodes = self.main.nodes
            self._nodes = [NodeRecord(i, node_label(node, i), normalize_domain(node.domain), node.op_type, *(
                           r if type(r) is tuple else (r.source, r.version)))
                           for i, (node, r) in enumerate(zip(nodes, self.records))]
        return self._nodes

    @property
    def errors(self) -> list[InferenceError]:
        return list(self.ctx.diagnostics)

    @property
    def diagnostics(self) -> list[Diagnostic]:
        return [Diagnostic.from_error(e) for e in self.ctx.diagnostics]

    def values(self) -> dict[str, TensorInfo]:
        return dict(self.ctx.items())

    def subgraph_values(self) -> dict[str, dict[str, TensorInfo]]:
        """Values of every subgraph body, keyed by where the body is:
        ``"<node label>/<attribute>"`` (nested bodies join with ``/``; ``Scan``/``Loop``
        bodies are ``.../body``, ``If`` branches ``.../then_branch`` and ``.../else_branch``)."""
        return {g.where: dict(g.scope.local_items()) for g in self.subgraphs.values()}

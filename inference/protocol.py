"""What the engine's helpers may use of the pass that walks a model.

``inference.subgraphs`` (``If``/``Loop``/``Scan`` bodies) and ``inference.functions``
(model-local functions, inlined) type a node by walking another graph: they receive the pass
as an ``InferencePass`` and use nothing of it but this.
"""

from __future__ import annotations

from typing import Protocol

import onnx

from onnx_quant.errors import InferenceError

from .context import TensorInfo
from .scope import Graph


class InferencePass(Protocol):
    """The pass as its helpers see it (``inference.engine.Pass`` is one)."""

    #: whether a violation raises (else it is recorded in ``diagnostics``)
    strict: bool
    #: the model's opset imports (domain ``""`` for ai.onnx)
    opsets: dict[str, int]
    #: every violation recorded so far, in order (a helper may drop those it made itself)
    diagnostics: list[InferenceError]
    #: If nodes whose branch a case of ``inference.case_split`` fixes: (graph path, node index) -> branch
    forced: dict[tuple, bool]

    def raise_or_record(self, err: InferenceError) -> None:
        """Raise ``err`` in strict mode, else record it."""

    def note_rank_split(self, key: tuple) -> None:
        """An If (graph path, node index) whose branches give an output different ranks."""

    def from_type_proto(self, tp: onnx.TypeProto) -> TensorInfo:
        """``tp`` as a ``TensorInfo`` (dim_param texts parsed once per pass)."""

    def dispatch_table(self, opsets: dict[str, int]) -> dict:
        """The dispatch table of nodes selected by ``opsets`` (one per distinct set)."""

    def walk(self, g: Graph) -> None:
        """Type every node of ``g`` in order."""

    def infer_body(self, proto: onnx.GraphProto, parent: Graph, inputs: list, *, label: str, attr: str,
                   step: tuple | None, quiet: bool = False) -> Graph:
        """Infer a subgraph body that sees ``parent``'s values (``inputs``: each body input's
        type, None to keep its declaration); ``step`` records it for the write-back; a
        ``quiet`` body's problems are neither raised nor recorded."""

    def body_outputs(self, g: Graph) -> list[tuple[TensorInfo, onnx.TypeProto | None]]:
        """Each body output's type (merged with its declaration), and its non-tensor type."""

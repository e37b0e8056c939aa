"""Diagnostics: one reported problem of a model, as ``check`` lists them."""

from __future__ import annotations

from dataclasses import dataclass

from onnx_quant.errors import InferenceError

#: The node name used for problems of the model as a whole (checker, graph outputs).
MODEL_NODE = "<model>"


@dataclass(frozen=True)
class Diagnostic:
    """One problem: the node at fault (its label), the rule it breaks, and what is wrong.

    ``str()`` gives the one line ``check`` prints: ``node: rule: message``.
    """

    node: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.node}: {self.rule}: {self.message}"

    @staticmethod
    def from_error(err: InferenceError) -> "Diagnostic":
        """The diagnostic an ``InferenceError`` stands for (its message without rule and node)."""
        parts = []
        if err.subject:
            parts.append(err.subject)
        detail = err.detail or ""
        if err.expected is not None or err.found is not None:
            tail = f"expected {err.expected}, found {err.found}"
            detail = f"{detail}: {tail}" if detail else tail
        if detail:
            parts.append(detail)
        return Diagnostic(err.node, err.rule, ": ".join(parts) or "violation")


def one_line(text: str) -> str:
    """Collapse a (possibly multi-line) message from onnx into one line."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())

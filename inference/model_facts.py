"""Model-level facts ``check`` verifies that no node rule sees: the opset versions the model
imports exist (``onnx.defs`` knows every domain's newest version), and no declared or
initializer dim is negative."""

from __future__ import annotations

import functools
from typing import Iterator

import onnx

from .diagnostics import MODEL_NODE, Diagnostic


@functools.lru_cache(maxsize=1)
def known_opset_versions() -> dict[str, int]:
    """Domain -> the newest opset version onnx.defs has a schema for ('' is ai.onnx)."""
    newest: dict[str, int] = {"": onnx.defs.onnx_opset_version()}
    for schema in onnx.defs.get_all_schemas_with_history():
        domain = schema.domain or ""
        newest[domain] = max(newest.get(domain, 0), schema.since_version)
    return newest


def opset_problems(model: onnx.ModelProto) -> Iterator[Diagnostic]:
    known = known_opset_versions()
    for imp in model.opset_import:
        domain = "" if imp.domain in ("", "ai.onnx") else imp.domain
        newest = known.get(domain)
        if newest is None:
            continue  # a custom domain: onnx cannot say which versions exist
        if not 1 <= imp.version <= newest:
            yield Diagnostic(MODEL_NODE, "opset-import.version",
                             f"domain {imp.domain or 'ai.onnx'!r} opset {imp.version}: expected a version "
                             f"onnx {onnx.__version__} defines (1..{newest}), found {imp.version}")


def negative_dims(graph: onnx.GraphProto, where: str = "") -> Iterator[Diagnostic]:
    """Negative dims of the graph's declared values and initializers, subgraphs included
    (walked with an explicit stack: nesting depth is bounded elsewhere, not here)."""
    stack = [(graph, where)]
    while stack:
        g, prefix = stack.pop()
        for kind, values in (("input", g.input), ("output", g.output), ("value_info", g.value_info)):
            for vi in values:
                if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
                    continue
                for axis, d in enumerate(vi.type.tensor_type.shape.dim):
                    if d.HasField("dim_value") and d.dim_value < 0:
                        yield _negative(prefix, f"{kind} {vi.name!r}", axis, d.dim_value)
        for t in g.initializer:
            for axis, d in enumerate(t.dims):
                if d < 0:
                    yield _negative(prefix, f"initializer {t.name!r}", axis, d)
        for node in g.node:
            for a in node.attribute:
                label = f"{prefix}{node.name or node.op_type}/{a.name}/"
                if a.type == onnx.AttributeProto.GRAPH:
                    stack.append((a.g, label))
                elif a.type == onnx.AttributeProto.GRAPHS:
                    stack.extend((sub, label) for sub in a.graphs)


def _negative(prefix: str, subject: str, axis: int, value: int) -> Diagnostic:
    return Diagnostic(MODEL_NODE, "shape.negative-dim",
                      f"{prefix}{subject} dim {axis}: expected a dim >= 0 (or a symbol), found {value}")


def model_facts(model: onnx.ModelProto) -> list[Diagnostic]:
    return [*opset_problems(model), *negative_dims(model.graph)]

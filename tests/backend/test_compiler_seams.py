"""The seams of the graph compiler, read from the source with ast (nothing imported): planning does
not depend on execution. graph_plan.py and executor.py do not import each other, at module level
or inside a function, directly or through other modules; both import plan.py, the frozen data
between them; the compiler and the rewrite passes reach no device module; and none of the
modules of the compiler, the passes and the executor hides an import of a sibling in a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "onnx_quant.backend_wgpu"
FOLDER = Path(__file__).resolve().parents[2] / "backend_wgpu"
#: what holds or drives a live device (wgpu objects, buffers, pipelines, the Session)
DEVICE_MODULES = frozenset({"device", "device_value", "executor", "pipelines", "render", "profiling", "session",
                            "region", "onnx_backend", "inference_session", "commands"})
#: the compiler, its phases and the rewrite passes: pure over plain data
COMPILER_MODULES = ("graph_plan", "placement", "plan", "planner", "passes", "graph_index", "verdict", "rewrites",
                    "bn_folding", "qdq_fusion", "dynamic_fusion", "elementwise_fusion", "data_dependent")
#: modules whose sibling imports all sit at module level
NO_HIDDEN_IMPORTS = COMPILER_MODULES + ("executor", "session", "region", "control_flow")


def _sibling(module: str | None, level: int, names: list[str]) -> set[str]:
    """The backend_wgpu modules an ``import`` / ``from ... import`` statement names."""
    if level:  # relative: ``from .spec import x`` / ``from . import spec``
        return {module.split(".")[0]} if module else set(names)
    if module is None or not (module == PACKAGE or module.startswith(PACKAGE + ".")):
        return set()
    rest = module[len(PACKAGE):].lstrip(".")
    return {rest.split(".")[0]} if rest else set(names)


def imports_of(name: str, *, local: bool | None = None) -> set[str]:
    """The sibling modules ``name`` imports: at module level (``local=False``), inside functions
    (``local=True``) or both (None)."""
    tree = ast.parse((FOLDER / f"{name}.py").read_text())
    found: set[str] = set()
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if local is not None and (id(node) not in top) != local:
            continue
        if isinstance(node, ast.ImportFrom):
            found |= _sibling(node.module, node.level, [a.name for a in node.names])
        else:
            for a in node.names:
                found |= _sibling(a.name, 0, [])
    return {m for m in found if (FOLDER / f"{m}.py").exists()}


def reach(name: str) -> set[str]:
    """Every sibling module ``name`` imports, directly or through others (any import)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for m in imports_of(todo.pop()):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def test_the_compiler_and_the_executor_do_not_import_each_other():
    assert "executor" not in reach("graph_plan")
    assert "graph_plan" not in reach("executor")


def test_both_import_the_plans_as_frozen_data():
    assert "plan" in imports_of("graph_plan", local=False)
    assert "plan" in imports_of("executor", local=False)


@pytest.mark.parametrize("name", COMPILER_MODULES)
def test_the_compiler_and_the_passes_reach_no_device_module(name):
    assert not reach(name) & DEVICE_MODULES, sorted(reach(name) & DEVICE_MODULES)


@pytest.mark.parametrize("name", NO_HIDDEN_IMPORTS)
def test_no_sibling_is_imported_inside_a_function(name):
    assert imports_of(name, local=True) == set()


def test_the_reader_understands_every_import_form():
    tree_module = "from onnx_quant.backend_wgpu.plan import GraphPlan\nfrom onnx_quant.backend_wgpu import placement\n"
    tree = ast.parse(tree_module + "from .spec import load_specs\nimport onnx_quant.backend_wgpu.verdict\n")
    found = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            found |= _sibling(node.module, node.level, [a.name for a in node.names])
        else:
            found |= {m for a in node.names for m in _sibling(a.name, 0, [])}
    assert found == {"plan", "placement", "spec", "verdict"}

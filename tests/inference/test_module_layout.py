"""The layout of ``inference/``, read from the files with ``ast`` (nothing is imported):

- module sizes: ``engine.py`` (the walk) at most 650 lines, every other module at most 800;
- no private name (leading underscore) imported from another module of the project;
- no function-local import that closes an import cycle (a local import that only hides a
  cycle from the module-level graph): every import inside a function of ``inference/``
  reaches a module that does not import it back, directly or through others.

The project's modules are found by path: ``onnx_quant/``, and the folders pyproject.toml maps
into its namespace (``inference/`` is ``onnx_quant.inference``, ``backend_wgpu/`` is
``onnx_quant.backend_wgpu``).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"onnx_quant": ROOT / "onnx_quant", "onnx_quant.inference": ROOT / "inference",
            "onnx_quant.backend_wgpu": ROOT / "backend_wgpu"}
INFERENCE = ROOT / "inference"
ENGINE_MAX_LINES = 650
MODULE_MAX_LINES = 800


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every Python module of the project (packages by ``__init__``)."""
    out: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if any(p.startswith(".") or p == "__pycache__" for p in parts):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join((package, *parts))
            # a mapped folder wins over a folder of the same name inside onnx_quant/ (none today)
            out.setdefault(name, path)
    return out


MODULES = _modules()
NAME_OF = {path: name for name, path in MODULES.items()}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The module an ``ImportFrom`` names, resolved against ``module`` when relative."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
    """(project module, name imported from it or None) for each thing ``node`` imports from
    the project; ``from package import submodule`` is an import of the submodule."""
    out = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name in MODULES:
                out.append((alias.name, None))
        return out
    source = _absolute(module, node)
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        if sub in MODULES:
            out.append((sub, None))
        elif source in MODULES:
            out.append((source, alias.name))
    return out


@functools.lru_cache(maxsize=None)
def _imports(path: Path) -> list[tuple[ast.AST, bool]]:
    """Every import statement of a file, with whether it is inside a function. Imports under
    ``if TYPE_CHECKING:`` are left out (annotations only: never executed)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[ast.AST, bool]] = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for sub in child.orelse:
                    visit_stmt(sub, local)
                continue
            visit_stmt(child, local)

    def visit_stmt(child: ast.AST, local: bool) -> None:
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            found.append((child, local))
        else:
            visit(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


@functools.lru_cache(maxsize=1)
def _graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (module level and inside functions)."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        edges = graph.setdefault(name, set())
        for node, _ in _imports(path):
            edges.update(target for target, _ in _targets(name, node))
    return graph


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """An import chain from ``start`` to ``goal``, or None."""
    seen, stack = {start}, [(start, [start])]
    while stack:
        here, chain = stack.pop()
        if here == goal:
            return chain
        for nxt in sorted(graph.get(here, ())):
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, chain + [nxt]))
    return None


def _inference_files() -> list[Path]:
    return sorted(INFERENCE.glob("*.py"))


def test_the_module_map_finds_the_inference_package():
    assert MODULES["onnx_quant.inference.engine"] == INFERENCE / "engine.py"
    assert _is_package("onnx_quant.inference")
    assert "onnx_quant.inference.rules.nn" in MODULES


@pytest.mark.parametrize("path", _inference_files(), ids=lambda p: p.name)
def test_module_size(path: Path):
    lines = len(path.read_text().splitlines())
    limit = ENGINE_MAX_LINES if path.name == "engine.py" else MODULE_MAX_LINES
    assert lines <= limit, f"{path.name} has {lines} lines (at most {limit}): split it along a seam"


@pytest.mark.parametrize("path", _inference_files(), ids=lambda p: p.name)
def test_no_private_name_imported_from_another_module(path: Path):
    module = NAME_OF[path]
    private = [f"line {node.lineno}: {name} from {source}"
               for node, _ in _imports(path) for source, name in _targets(module, node)
               if name is not None and name.startswith("_") and source != module]
    assert not private, f"{path.name} imports private names: " + "; ".join(private)


@pytest.mark.parametrize("path", _inference_files(), ids=lambda p: p.name)
def test_no_function_local_import_closes_a_cycle(path: Path):
    graph = _graph()
    module = NAME_OF[path]
    cycles = []
    for node, local in _imports(path):
        if not local:
            continue
        for target, _ in _targets(module, node):
            chain = _reaches(graph, target, module)
            if chain is not None:
                cycles.append(f"line {node.lineno}: {module} -> {' -> '.join(chain)}")
    assert not cycles, f"{path.name}: function-local imports hiding an import cycle: " + "; ".join(cycles)


def test_the_checks_see_what_they_must_fail_on(tmp_path):
    """The checks themselves: a local import back into a module that imports it is a cycle;
    a private name from a sibling is private."""
    src = "from .engine import _Pass\n\ndef f():\n    from . import engine\n"
    tree_imports = []
    path = tmp_path / "probe.py"
    path.write_text(src)
    for node, local in _imports(path):
        tree_imports.append((local, _targets("onnx_quant.inference.functions", node)))
    assert tree_imports == [(False, [("onnx_quant.inference.engine", "_Pass")]),
                            (True, [("onnx_quant.inference.engine", None)])]
    graph = {"onnx_quant.inference.engine": {"onnx_quant.inference.functions"}}
    assert _reaches(graph, "onnx_quant.inference.engine", "onnx_quant.inference.functions") == \
        ["onnx_quant.inference.engine", "onnx_quant.inference.functions"]

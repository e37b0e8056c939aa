"""The project's seams, read from the tree by path alone (no install, no package-dir mapping):

- every import inside the project resolves to a file of the tree: siblings and the other mapped
  folder by relative import (``from .spec import ...``, ``from ..inference.dims import ...``),
  ``onnx_quant/``'s own modules by absolute import (``from onnx_quant.errors import ...``);
- no private name (``_x``) is imported from another module of the project;
- no function-local import closes a cycle (a lazy import that only hides a cycle);
- no module is longer than its limit (inference/engine.py 650 lines, every other 800).
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the folders that install as the onnx_quant namespace (pyproject.toml's package-dir)
PACKAGES = {"onnx_quant": ROOT / "onnx_quant", "onnx_quant.inference": ROOT / "inference",
            "onnx_quant.backend_wgpu": ROOT / "backend_wgpu"}
LIMITS = {ROOT / "inference" / "engine.py": 650}
DEFAULT_LIMIT = 800


def _files() -> list[Path]:
    return sorted(p for folder in PACKAGES.values() for p in folder.rglob("*.py"))


def _module_name(path: Path) -> str:
    for name, folder in sorted(PACKAGES.items(), key=lambda kv: -len(str(kv[1]))):
        if folder in path.parents or path.parent == folder:
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            return ".".join([name, *parts]) if parts else name
    raise ValueError(path)


def _resolve_relative(path: Path, level: int, module: str | None) -> Path | None:
    """The file a relative import names, by path alone (None if there is none)."""
    base = path.parent
    for _ in range(level - 1):
        base = base.parent
    target = base.joinpath(*module.split(".")) if module else base
    for candidate in (target.with_suffix(".py"), target / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _resolve_absolute(module: str) -> Path | None:
    """An absolute ``onnx_quant...`` import resolved by path alone: only onnx_quant/'s own files."""
    parts = module.split(".")
    target = ROOT.joinpath(*parts)
    for candidate in (target.with_suffix(".py"), target / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _resolve_installed(module: str) -> Path | None:
    """An absolute import resolved through the package-dir mapping (as installed): the edges of
    the private-name and cycle checks, whichever way an import is written."""
    for name, folder in sorted(PACKAGES.items(), key=lambda kv: -len(kv[0])):
        if module == name or module.startswith(name + "."):
            target = folder.joinpath(*module[len(name):].strip(".").split(".")) if module != name else folder
            for candidate in (target.with_suffix(".py"), target / "__init__.py"):
                if candidate.is_file():
                    return candidate
    return None


class _Imports(ast.NodeVisitor):
    """(line, level, module, names, function-local) of every import of one file."""

    def __init__(self) -> None:
        self.found: list[tuple[int, int, str | None, list[str], bool]] = []
        self._depth = 0

    def visit_FunctionDef(self, node):  # noqa: N802 - ast's names
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node):  # noqa: N802 - imports for annotations only are no runtime arrow
        if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node):  # noqa: N802
        for alias in node.names:
            self.found.append((node.lineno, 0, alias.name, [], self._depth > 0))

    def visit_ImportFrom(self, node):  # noqa: N802
        self.found.append((node.lineno, node.level, node.module, [a.name for a in node.names], self._depth > 0))


@lru_cache(maxsize=None)
def _imports(path: Path) -> tuple:
    v = _Imports()
    v.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return tuple(v.found)


def _edges(path: Path) -> list[tuple[Path, bool, int, list[str]]]:
    """(imported project file, function-local, line, names) for every project import of ``path``."""
    out = []
    for line, level, module, names, local in _imports(path):
        if level:
            target = _resolve_relative(path, level, module)
            if target is not None and module is None:  # from . import x: each name a module
                for n in names:
                    sub = _resolve_relative(path, level, n)
                    out.append((sub or target, local, line, [n] if sub is None else []))
                continue
        elif module and (module == "onnx_quant" or module.startswith("onnx_quant.")):
            target = _resolve_installed(module)
            if target is not None and target.name == "__init__.py" and names:  # from pkg import module
                for n in names:
                    sub = _resolve_installed(f"{module}.{n}")
                    out.append((sub or target, local, line, [n] if sub is None else []))
                continue
        else:
            continue
        out.append((target, local, line, names))
    return out


def test_every_project_import_resolves_to_a_file_by_path():
    bad = []
    for path in _files():
        for line, level, module, names, _ in _imports(path):
            if level and _resolve_relative(path, level, module) is None:
                bad.append(f"{path.relative_to(ROOT)}:{line}: from {'.' * level}{module or ''} import ...")
            elif not level and module and module.startswith("onnx_quant") and _resolve_absolute(module) is None:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {module} (no such file in the tree: use a relative import)")
    assert not bad, "imports that no reader can follow by path:\n" + "\n".join(bad)


def test_no_private_name_is_imported_across_modules():
    bad = []
    for path in _files():
        for target, _, line, names in _edges(path):
            if target is None or target == path:
                continue
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {', '.join(private)} from {target.relative_to(ROOT)}")
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


def _graph(local: bool | None) -> dict[Path, set[Path]]:
    graph: dict[Path, set[Path]] = {p: set() for p in _files()}
    for path in _files():
        for target, is_local, _, _ in _edges(path):
            if target is not None and target != path and (local is None or is_local == local):
                graph[path].add(target)
    return graph


def _reaches(graph: dict[Path, set[Path]], start: Path, goal: Path) -> bool:
    seen, stack = set(), [start]
    while stack:
        node = stack.pop()
        if node == goal:
            return True
        if node in seen:
            continue
        seen.add(node)
        stack.extend(graph.get(node, ()))
    return False


def test_no_function_local_import_closes_a_cycle():
    """A lazy import of B inside A is fine for start-up cost; one where B (through any imports)
    imports A again only hides a cycle that the modules' seams should not have."""
    every = _graph(None)
    bad = []
    for path in _files():
        for target, local, line, _ in _edges(path):
            if local and target is not None and target != path and _reaches(every, target, path):
                bad.append(f"{path.relative_to(ROOT)}:{line} -> {target.relative_to(ROOT)}")
    assert not bad, "function-local imports that close a cycle:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_stay_readable_in_one_sitting(path):
    limit = LIMITS.get(path, DEFAULT_LIMIT)
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= limit, f"{path.relative_to(ROOT)}: {lines} lines (limit {limit})"


def test_the_checks_see_a_bad_import(tmp_path, monkeypatch):
    """The resolver refuses what the tree cannot show: an absolute import of a mapped folder."""
    assert _resolve_absolute("onnx_quant.backend_wgpu.spec") is None
    assert _resolve_absolute("onnx_quant.errors") == ROOT / "onnx_quant" / "errors.py"
    assert _resolve_relative(ROOT / "backend_wgpu" / "session.py", 2, "inference.dims") == ROOT / "inference" / "dims.py"
    assert _resolve_relative(ROOT / "backend_wgpu" / "session.py", 1, "no_such_module") is None

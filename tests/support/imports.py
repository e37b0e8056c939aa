"""The project's imports read from the source with ast (nothing imported): the one reader behind
tests/test_structure.py (imports resolve by path, no private names across modules, no hidden
cycles), tests/backend/test_compiler_seams.py (planning does not depend on execution) and
tests/test_suite_layout.py (tests share helpers through tests/support/ only).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the folders that install as the onnx_quant namespace (pyproject.toml's package-dir)
PACKAGES = {"onnx_quant": ROOT / "onnx_quant", "onnx_quant.inference": ROOT / "inference",
            "onnx_quant.backend_wgpu": ROOT / "backend_wgpu"}


@dataclass(frozen=True)
class Import:
    """One import statement: ``level`` dots, ``module`` (None for ``from . import x``), the
    ``names`` of a from-import, and whether it sits inside a function."""

    line: int
    level: int
    module: str | None
    names: tuple[str, ...]
    local: bool


class _Reader(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: list[Import] = []
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
            self.found.append(Import(node.lineno, 0, alias.name, (), self._depth > 0))

    def visit_ImportFrom(self, node):  # noqa: N802
        self.found.append(Import(node.lineno, node.level, node.module, tuple(a.name for a in node.names),
                                 self._depth > 0))


def imports_in(source: str, filename: str = "<source>") -> tuple[Import, ...]:
    """Every import of ``source`` (``if TYPE_CHECKING:`` blocks left out)."""
    reader = _Reader()
    reader.visit(ast.parse(source, filename))
    return tuple(reader.found)


@lru_cache(maxsize=None)
def file_imports(path: Path) -> tuple[Import, ...]:
    return imports_in(path.read_text(encoding="utf-8"), str(path))


def project_files() -> list[Path]:
    """Every .py file of onnx_quant/, inference/ and backend_wgpu/."""
    return sorted(p for folder in PACKAGES.values() for p in folder.rglob("*.py"))


def _module_file(target: Path) -> Path | None:
    for candidate in (target.with_suffix(".py"), target / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def resolve_relative(path: Path, level: int, module: str | None) -> Path | None:
    """The file a relative import in ``path`` names, by path alone (None if there is none)."""
    base = path.parent
    for _ in range(level - 1):
        base = base.parent
    return _module_file(base.joinpath(*module.split(".")) if module else base)


def resolve_absolute(module: str) -> Path | None:
    """An absolute ``onnx_quant...`` import resolved by path alone: only onnx_quant/'s own files."""
    return _module_file(ROOT.joinpath(*module.split(".")))


def resolve_installed(module: str) -> Path | None:
    """An absolute import resolved through the package-dir mapping (as installed), whichever way
    an import is written."""
    for name, folder in sorted(PACKAGES.items(), key=lambda kv: -len(kv[0])):
        if module == name or module.startswith(name + "."):
            rest = module[len(name):].strip(".")
            return _module_file(folder.joinpath(*rest.split(".")) if rest else folder)
    return None


def edges(path: Path, imports: tuple[Import, ...] | None = None) -> list[tuple[Path, bool, int, list[str]]]:
    """(imported project file, function-local, line, names) for every project import of ``path``
    (``imports``: read from ``path`` unless given); ``from pkg import module`` names the module."""
    out = []
    for imp in file_imports(path) if imports is None else imports:
        names = list(imp.names)
        if imp.level:
            target = resolve_relative(path, imp.level, imp.module)
            sub_of = lambda n, imp=imp: resolve_relative(path, imp.level, n if imp.module is None else f"{imp.module}.{n}")  # noqa: E731
        elif imp.module and (imp.module == "onnx_quant" or imp.module.startswith("onnx_quant.")):
            target = resolve_installed(imp.module)
            sub_of = lambda n, imp=imp: resolve_installed(f"{imp.module}.{n}")  # noqa: E731
        else:
            continue
        if target is not None and target.name == "__init__.py" and names:  # from pkg import module
            for n in names:
                sub = sub_of(n)
                out.append((sub or target, imp.local, imp.line, [n] if sub is None else []))
            continue
        out.append((target, imp.local, imp.line, names))
    return out


def import_graph(local: bool | None = None) -> dict[Path, set[Path]]:
    """File -> the project files it imports (only function-local imports with ``local=True``,
    only module-level ones with ``local=False``)."""
    graph: dict[Path, set[Path]] = {p: set() for p in project_files()}
    for path in project_files():
        for target, is_local, _, _ in edges(path):
            if target is not None and target != path and (local is None or is_local == local):
                graph[path].add(target)
    return graph


def reachable(graph: dict[Path, set[Path]], start: Path) -> set[Path]:
    """Every file ``start`` imports, directly or through others."""
    seen: set[Path] = set()
    stack = list(graph.get(start, ()))
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(graph.get(node, ()))
    return seen

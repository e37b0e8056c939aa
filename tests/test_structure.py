"""The project's seams, read from the tree by path alone (no install, no package-dir mapping):

- every import inside the project resolves to a file of the tree: siblings and the other mapped
  folder by relative import (``from .spec import ...``, ``from ..inference.dims import ...``),
  ``onnx_quant/``'s own modules by absolute import (``from onnx_quant.errors import ...``);
- no private name (``_x``) is imported from another module of the project;
- no function-local import closes a cycle (a lazy import that only hides a cycle);
- no module is longer than its limit (inference/engine.py 650 lines, every other 800).
"""

from __future__ import annotations

import pytest

from support.imports import (
    ROOT, edges, file_imports, import_graph, project_files, reachable, resolve_absolute, resolve_relative,
)

LIMITS = {ROOT / "inference" / "engine.py": 650}
DEFAULT_LIMIT = 800


def test_every_project_import_resolves_to_a_file_by_path():
    bad = []
    for path in project_files():
        for imp in file_imports(path):
            where = f"{path.relative_to(ROOT)}:{imp.line}"
            if imp.level and resolve_relative(path, imp.level, imp.module) is None:
                bad.append(f"{where}: from {'.' * imp.level}{imp.module or ''} import ...")
            elif (not imp.level and imp.module and imp.module.startswith("onnx_quant")
                  and resolve_absolute(imp.module) is None):
                bad.append(f"{where}: {imp.module} (no such file in the tree: use a relative import)")
    assert not bad, "imports that no reader can follow by path:\n" + "\n".join(bad)


def test_no_private_name_is_imported_across_modules():
    bad = []
    for path in project_files():
        for target, _, line, names in edges(path):
            if target is None or target == path:
                continue
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {', '.join(private)} from {target.relative_to(ROOT)}")
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


def test_no_function_local_import_closes_a_cycle():
    """A lazy import of B inside A is fine for start-up cost; one where B (through any imports)
    imports A again only hides a cycle that the modules' seams should not have."""
    every = import_graph()
    bad = []
    for path in project_files():
        for target, local, line, _ in edges(path):
            if local and target is not None and target != path and path in reachable(every, target):
                bad.append(f"{path.relative_to(ROOT)}:{line} -> {target.relative_to(ROOT)}")
    assert not bad, "function-local imports that close a cycle:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", project_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_stay_readable_in_one_sitting(path):
    limit = LIMITS.get(path, DEFAULT_LIMIT)
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= limit, f"{path.relative_to(ROOT)}: {lines} lines (limit {limit})"


def test_the_checks_see_a_bad_import(tmp_path, monkeypatch):
    """The resolver refuses what the tree cannot show: an absolute import of a mapped folder."""
    assert resolve_absolute("onnx_quant.backend_wgpu.spec") is None
    assert resolve_absolute("onnx_quant.errors") == ROOT / "onnx_quant" / "errors.py"
    assert resolve_relative(ROOT / "backend_wgpu" / "session.py", 2, "inference.dims") == ROOT / "inference" / "dims.py"
    assert resolve_relative(ROOT / "backend_wgpu" / "session.py", 1, "no_such_module") is None

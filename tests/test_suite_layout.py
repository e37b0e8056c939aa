"""The test suite's own layout: test modules share helpers through tests/support/ only.

conftest.py is pytest's (fixtures, hooks); importing it as a module makes a second module object
for the same file (``conftest`` and ``tests.conftest``), and a test module importing another one
runs that module's import-time work and ties the two together. Pure Python: no GPU needed.
"""

from __future__ import annotations

from pathlib import Path

from support.imports import imports_in

TESTS = Path(__file__).resolve().parent
SUPPORT = TESTS / "support"


def _modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def _imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import of ``path``, function-local ones included."""
    return [(i.line, i.module) for i in imports_in(path.read_text(), str(path)) if i.level == 0 and i.module]


def test_no_module_imports_conftest():
    bad = [f"{p.relative_to(TESTS)}:{line}: {name}" for p in _modules() for line, name in _imported(p)
           if name.split(".")[-1] == "conftest" or name.startswith("tests.")]
    assert not bad, "import helpers from tests/support/, not conftest: " + "; ".join(bad)


def test_no_test_module_imports_another():
    test_modules = {p.stem for p in _modules() if p.stem.startswith("test_")}
    bad = [f"{p.relative_to(TESTS)}:{line}: {name}" for p in _modules() for line, name in _imported(p)
           if name.split(".")[0] in test_modules]
    assert not bad, "move what test modules share into tests/support/: " + "; ".join(bad)


def test_support_is_a_package_of_helpers_only():
    assert (SUPPORT / "__init__.py").is_file()
    assert not list(SUPPORT.rglob("test_*.py")), "tests/support/ holds helpers, not tests"

"""The seams of the graph compiler, read from the source with ast (nothing imported): planning does
not depend on execution. graph_plan.py and executor.py do not import each other, at module level
or inside a function, directly or through other modules; both import plan.py, the frozen data
between them; the compiler and the rewrite passes reach no device module; and none of the
modules of the compiler, the passes and the executor hides an import of a sibling in a function."""

from __future__ import annotations

import pytest

from support.imports import ROOT, edges, import_graph, imports_in, reachable

FOLDER = ROOT / "backend_wgpu"

#: what holds or drives a live device (wgpu objects, buffers, pipelines, the Session)
DEVICE_MODULES = frozenset({"device", "device_value", "executor", "pipelines", "render", "profiling", "session",
                            "region", "onnx_backend", "inference_session", "commands"})
#: the compiler, its phases and the rewrite passes: pure over plain data
COMPILER_MODULES = ("graph_plan", "placement", "plan", "planner", "passes", "graph_index", "verdict", "rewrites",
                    "bn_folding", "qdq_fusion", "dynamic_fusion", "elementwise_fusion", "data_dependent")
#: modules whose sibling imports all sit at module level
NO_HIDDEN_IMPORTS = COMPILER_MODULES + ("executor", "session", "region", "control_flow")


def _siblings(files) -> set[str]:
    return {f.stem for f in files if f is not None and f.parent == FOLDER}


def imports_of(name: str, *, local: bool | None = None) -> set[str]:
    """The sibling modules ``name`` imports: at module level (``local=False``), inside functions
    (``local=True``) or both (None)."""
    return _siblings(t for t, is_local, _, _ in edges(FOLDER / f"{name}.py") if local is None or is_local == local)


def reach(name: str) -> set[str]:
    """Every sibling module ``name`` imports, directly or through others (any import)."""
    return _siblings(reachable(import_graph(), FOLDER / f"{name}.py"))


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
    source = ("from onnx_quant.backend_wgpu.plan import GraphPlan\nfrom onnx_quant.backend_wgpu import placement\n"
              "from .spec import load_specs\nimport onnx_quant.backend_wgpu.verdict\n")
    found = _siblings(t for t, _, _, _ in edges(FOLDER / "session.py", imports_in(source)))
    assert found == {"plan", "placement", "spec", "verdict"}

"""The wheel: one namespace (nothing but ``onnx_quant`` at the top level of site-packages) and
every module and package-data file of the repository's package folders inside it.
``scripts/check-wheel`` (run by .ci/run) installs the same wheel into a fresh venv and runs
``onnx-quant infer example`` and ``onnx-quant demo`` from it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import onnx_quant

REPO = Path(__file__).resolve().parents[1]
#: repository folder -> where it installs
FOLDERS = {"onnx_quant": "onnx_quant", "inference": "onnx_quant/inference",
           "backend_wgpu": "onnx_quant/backend_wgpu", "templates": "onnx_quant/templates"}


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> list[str]:
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(REPO)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    (whl,) = out.glob("*.whl")
    return zipfile.ZipFile(whl).namelist()


def test_wheel_installs_only_the_onnx_quant_namespace(wheel_names):
    tops = {n.split("/", 1)[0] for n in wheel_names}
    assert tops == {"onnx_quant", f"onnx_quant-{onnx_quant.__version__}.dist-info"}
    for generic in ("inference", "templates", "backend_wgpu"):
        assert not any(n.startswith(generic + "/") for n in wheel_names)


def test_wheel_ships_every_module_and_template(wheel_names):
    shipped = set(wheel_names)
    expected = set()
    for folder, target in FOLDERS.items():
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".json", ".jinja") and "__pycache__" not in path.parts:
                expected.add(f"{target}/{path.relative_to(REPO / folder).as_posix()}")
    assert any(n.endswith(".kernel.json") for n in expected) and any(n.endswith(".wgsl.jinja") for n in expected)
    assert sorted(expected - shipped) == []


def test_package_map_matches_the_folders():
    """pyproject's package-dir mapping names exactly the folders this test checks."""
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
    mapping = dict(line.replace('"', "").split(" = ") for line in section.strip().splitlines())
    assert {v: k for k, v in mapping.items()} == {f: t.replace("/", ".") for f, t in FOLDERS.items()}

"""An earlier revision of onnx-quant, built from git into a folder of its own, for benchmarks that
time this tree and that revision side by side (``bench_models.py --baseline REV``).

The revision is checked out with ``git worktree`` into a temporary folder, built as a wheel and
installed with ``pip install --no-deps --target`` into ``~/.cache/onnx-quant/baseline/<sha>``
(``ONNX_QUANT_MODEL_CACHE`` moves the cache), once per commit. :func:`run_json` runs a benchmark
script of *this* tree in a subprocess whose ``PYTHONPATH`` puts that folder first, so the script
measures the old package with the same harness and the same inputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cache() -> Path:
    base = os.environ.get("ONNX_QUANT_MODEL_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "onnx-quant") / "baseline"


def resolve(rev: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                          check=True, capture_output=True, text=True).stdout.strip()


def build(rev: str) -> Path:
    """The folder holding revision ``rev``'s ``onnx_quant`` package (built once per commit)."""
    sha = resolve(rev)
    target = _cache() / sha
    if (target / "onnx_quant" / "__init__.py").exists():
        return target
    with tempfile.TemporaryDirectory(prefix="onnx-quant-baseline-") as tmp:
        src = Path(tmp) / "src"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(src), sha],
                       check=True, capture_output=True)
        try:
            staging = Path(tmp) / "site"
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(staging),
                            str(src)], check=True)
            target.parent.mkdir(parents=True, exist_ok=True)
            staging.replace(target)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(src)],
                           check=False, capture_output=True)
    return target


def _environment(rev: str) -> tuple[dict, str]:
    """(the environment a subprocess imports revision ``rev``'s package in, that package's path)."""
    site = build(rev)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), env_path] if (env_path := os.environ.get("PYTHONPATH"))
                                                      else [str(site)]))
    # run outside the source tree: a script's folder and `-c`'s cwd come first on sys.path
    probe = subprocess.run([sys.executable, "-c", "import onnx_quant; print(onnx_quant.__file__)"],
                           env=env, check=True, capture_output=True, text=True, cwd=tempfile.gettempdir()).stdout.strip()
    if not probe.startswith(str(site)):
        raise RuntimeError(f"the baseline run would import {probe}, not revision {rev} from {site}")
    return env, probe


def run_json(rev: str, script: str, args: list[str]) -> dict:
    """Run ``benchmarks/<script>`` with ``args`` (which must make it print JSON) against revision
    ``rev``'s package; the parsed output, with ``rev`` and the package's path added."""
    env, probe = _environment(rev)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], env=env, check=True,
                         capture_output=True, text=True, cwd=tempfile.gettempdir())
    result = json.loads(out.stdout)
    result["rev"] = resolve(rev)
    result["package"] = probe
    return result


def spawn(rev: str, script: str, args: list[str]) -> subprocess.Popen:
    """``benchmarks/<script>`` with ``args`` against revision ``rev``'s package, left running with
    text pipes on its stdin and stdout (a server the caller talks to line by line)."""
    env, _ = _environment(rev)
    return subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / script), *args], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tempfile.gettempdir())

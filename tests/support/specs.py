"""Kernel spec files written for a test: a spec document (dict or text) saved beside dummy shaders,
loaded, or loaded and refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onnx_quant.backend_wgpu.spec import KernelSpec, load_spec, templates_dir
from onnx_quant.errors import SpecError

#: the shipped spec the field-level tests start from (tests/backend/test_spec.py's seed)
SEED_FILE = templates_dir() / "dynamic_quantize_linear.kernel.json"
#: the shaders its variants name: written as dummies beside a test's spec
SHADERS = sorted({p["shader"] for v in json.loads(SEED_FILE.read_text())["variants"] for p in v["passes"]})


def write_spec(directory: Path, doc, name: str = "k.kernel.json", *, shaders=SHADERS) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for s in shaders:
        (directory / s).write_text("// dummy shader\n")
    path = directory / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=1))
    return path


def load_doc(tmp_path: Path, doc) -> KernelSpec:
    return load_spec(write_spec(tmp_path, doc))


def reject(tmp_path: Path, doc, field: str | None = None, reason: str | None = None) -> SpecError:
    """The SpecError loading ``doc`` raises: naming the file, with a reason (``field`` /
    ``reason``: the field path it must name, words its reason must contain)."""
    path = write_spec(tmp_path, doc)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    err = info.value
    assert err.file == str(path)
    assert err.reason
    if field is not None:
        assert err.field == field, f"field {err.field!r}: {err}"
    if reason is not None:
        assert reason in err.reason, err.reason
    return err

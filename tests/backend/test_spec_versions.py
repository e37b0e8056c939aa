"""Kernel specs generated from onnx.defs (backend_wgpu/spec_versions.py): a ``*.kernel.json`` that
states ``since`` is one spec per schema version whose types or attributes change, its types
intersected with onnx.defs', its attribute defaults onnx.defs'. Pure Python: no GPU needed. The
oracle for types, versions and defaults is onnx.defs itself, read here directly (not through
onnx_quant.opsets, which the expansion uses)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from onnx import defs, helper

from onnx_quant.backend_wgpu.device_info import DeviceInfo
from onnx_quant.backend_wgpu.planner import plan_node
from onnx_quant.backend_wgpu.spec import load_spec, load_spec_file, load_specs, templates_dir
from onnx_quant.errors import KernelRejected, SpecError

SPECS = load_specs()
KERNEL_FILES = sorted(templates_dir().glob("*.kernel.json"))
_NAMES = {"float": "float32", "double": "float64"}


def _doc(path) -> dict:
    return json.loads(path.read_text())


def _schema(op: str, version: int):
    return defs.get_schema(op, version, "")


def _versions(op: str) -> list[int]:
    return sorted({s.since_version for s in defs.get_all_schemas_with_history() if s.name == op and s.domain == ""})


def _formal_types(schema, index: int, output: bool) -> set[str] | None:
    """Element type names the schema allows for input (output) ``index``, None past its formals."""
    formals = schema.outputs if output else schema.inputs
    if index >= len(formals):
        if not formals or formals[-1].option != defs.OpSchema.FormalParameterOption.Variadic:
            return None
        index = len(formals) - 1
    type_str = formals[index].type_str
    allowed = next((tc.allowed_type_strs for tc in schema.type_constraints if tc.type_param_str == type_str),
                   [type_str])
    return {_NAMES.get(t[7:-1], t[7:-1]) for t in allowed if t.startswith("tensor(")}


def _onnx_default(schema, name):
    a = schema.attributes[name]
    if a.required or a.default_value.type == 0:
        return None
    v = helper.get_attribute_value(a.default_value)
    return v.decode() if isinstance(v, bytes) else list(v) if isinstance(v, (list, tuple)) else v


def _chain(doc: dict) -> list[dict]:
    """The documents a kernel file's stated attributes come from: the file, its versions entries
    and every base they extend."""
    out, todo = [], [doc, *doc.get("versions", {}).values()]
    while todo:
        d = todo.pop()
        out.append(d)
        if "extends" in d:
            todo.append(_doc(templates_dir() / d["extends"]))
    return out


def test_no_per_version_copy_is_left():
    copies = [p.name for p in KERNEL_FILES if re.search(r"_\d+\.kernel\.json$", p.name)]
    assert not copies, copies


def test_every_onnx_kernel_file_states_its_versions_for_onnx_defs_to_fill():
    """A file of an operator onnx.defs knows states ``since`` (and ``until``), never a single
    ``sinceVersion``; only the contrib domains (com.microsoft, ai.onnx_quant) state their own."""
    for path in KERNEL_FILES:
        doc = _doc(path)
        if doc.get("domain", "ai.onnx") in ("ai.onnx", ""):
            assert "since" in doc and "sinceVersion" not in doc and "untilVersion" not in doc, path.name
        else:
            assert "sinceVersion" in doc and "since" not in doc, path.name


ONNX_OPS = sorted({s.name for s in SPECS if s.domain == "ai.onnx" and ".kernel.json[" in s.path})


@pytest.mark.parametrize("op", ONNX_OPS)
def test_generated_type_constraints_are_a_subset_of_onnx_defs_at_every_version(op):
    served = [v for v in range(1, max(_versions(op)) + 3) if SPECS.find("", op, v) is not None]
    assert served
    for version in served:
        spec = SPECS.find("", op, version)
        schema = _schema(op, min(version, max(_versions(op))))
        for output, decls in ((False, spec.inputs), (True, spec.outputs)):
            for i, decl in enumerate(decls.values()):
                allowed = _formal_types(schema, i, output)
                if allowed is None:
                    continue  # an input or output this version does not have (a later version's optional one)
                extra = set(spec.type_constraints[decl.dtype]) - allowed
                assert not extra, (op, version, decl.name, sorted(extra))


@pytest.mark.parametrize("op", ONNX_OPS)
def test_generated_specs_declare_every_attribute_of_their_schema_version(op):
    """onnx.defs' attributes of each version, with its defaults (a stated default only where onnx.defs
    has none); an attribute a version lacks is absent, or fixed at the value the kernel reads."""
    for version in [v for v in _versions(op) if SPECS.find("", op, v) is not None]:
        spec, schema = SPECS.find("", op, version), _schema(op, version)
        settable = {n for n, a in spec.attributes.items() if not a.fixed}
        assert settable == set(schema.attributes), (op, version)
        stated = {n for part in _chain(_doc(Path(spec.path.split("[")[0]))) for n, d in part.get("attributes", {}).items()
                  if "default" in d or "required" in d}
        for name in settable - stated:
            default = _onnx_default(schema, name)
            if schema.attributes[name].required:
                assert spec.attributes[name].required, (op, version, name)
            else:
                got = spec.attributes[name].default
                assert (list(got) if isinstance(got, tuple) else got) == default, (op, version, name)


@pytest.mark.parametrize("path", [p for p in KERNEL_FILES if "since" in _doc(p)], ids=lambda p: p.name)
def test_every_stated_attribute_default_differs_from_onnx_defs_or_is_absent(path):
    doc = _doc(path)
    op = doc["name"]
    versions = [v for v in _versions(op) if v >= doc["since"] and v <= doc.get("until", 10**6)]
    for part in _chain(doc):
        for name, decl in part.get("attributes", {}).items():
            for version in versions:
                schema = _schema(op, version)
                if name not in schema.attributes:
                    continue
                if "default" in decl:
                    assert decl["default"] != _onnx_default(schema, name), (path.name, name, version)
                if decl.get("required"):
                    assert not schema.attributes[name].required, (path.name, name, version)


# ---------------------------------------------------------------- the expansion, on small files


#: a small base: y = x as another type, one pass (the shader's contents are not read at load)
BASE = {"inputs": {"x": {"dtype": "T1"}}, "outputs": {"y": {"dtype": "T2", "shape": "shapes.x"}},
        "attributes": {"to": {}},
        "variants": [{"id": "main", "passes": [{"id": "main", "shader": "s.wgsl.jinja", "bindings": ["x", "y"],
                                                "dispatch": {"x": 1}}]}]}


def _kernel(tmp_path, doc: dict, name: str = "k.kernel.json"):
    (tmp_path / "s.wgsl.jinja").write_text("// dummy shader\n")
    (tmp_path / "b.base.json").write_text(json.dumps(BASE))
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


CAST = {"name": "Cast", "since": 6, "extends": "b.base.json",
        "typeConstraints": {"T1": ["float32", "float16", "bfloat16", "int8", "float8e4m3fn"],
                            "T2": ["float32", "float16", "bfloat16", "int8", "float8e4m3fn"]},
        "attributes": {"saturate": {}}}


def test_one_spec_per_schema_version_whose_generated_document_changes(tmp_path):
    specs = load_spec_file(_kernel(tmp_path, CAST))
    assert [s.since_version for s in specs] == [6, 13, 19]  # 9 (string) and 21.. (int4...) change nothing here
    assert [list(s.type_constraints["T1"]) for s in specs] == [
        ["float32", "float16", "int8"], ["float32", "float16", "bfloat16", "int8"],
        ["float32", "float16", "bfloat16", "int8", "float8e4m3fn"]]
    assert specs[0].path == f"{tmp_path / 'k.kernel.json'}[Cast-6]"
    # `to` from the base: onnx.defs requires it; saturate: Cast-19's default, fixed before 19
    assert specs[0].attributes["to"].required
    assert (specs[0].attributes["saturate"].default, specs[0].attributes["saturate"].fixed) == (1, True)
    assert (specs[2].attributes["saturate"].default, specs[2].attributes["saturate"].fixed) == (1, False)
    assert load_spec(tmp_path / "k.kernel.json", version=18) is specs[1] or \
        load_spec(tmp_path / "k.kernel.json", version=18).since_version == 13


def test_until_ends_the_last_generated_spec(tmp_path):
    specs = load_spec_file(_kernel(tmp_path, {**CAST, "until": 20}))
    assert specs[-1].since_version == 19 and specs[-1].until_version == 20
    reg = load_specs(tmp_path)
    assert reg.find("", "Cast", 20) is specs[-1] or reg.find("", "Cast", 20).since_version == 19
    assert reg.find("", "Cast", 21) is None and reg.find("", "Cast", 5) is None


def test_a_node_may_not_set_an_attribute_its_schema_version_does_not_have(tmp_path):
    spec = load_spec(_kernel(tmp_path, CAST), version=13)
    io = {"shapes": {"x": (4,), "y": (4,)}, "dtypes": {"x": "float32", "y": "float16"}, "device": DeviceInfo()}
    plan_node(spec, attributes={"to": 10}, **io)
    with pytest.raises(KernelRejected, match="'saturate' is not supported"):
        plan_node(spec, attributes={"to": 10, "saturate": 0}, **io)


@pytest.mark.parametrize("change, field, reason", [
    ({"attributes": {"saturate": {"default": 1}}}, "attributes.saturate.default", "restates onnx.defs' default"),
    ({"attributes": {"to": {"required": True}}}, "attributes.to.required", "restates onnx.defs"),
    ({"attributes": {"nope": {}}}, "attributes.nope", "no schema version of Cast"),
    ({"since": 7}, "since", "no schema of version 7"),
    ({"since": 6, "until": 5}, "until", "must be >= since"),
    ({"versions": {"7": {}}}, "versions.7", "not a schema version"),
    ({"versions": {"13": {"name": "Foo"}}}, "versions.13.name", "cannot change which operator"),
    ({"sinceVersion": 6}, "since", "not both"),
    ({"typeConstraints": {"T1": ["float8e4m3fn"], "T2": ["float32"]}}, "typeConstraints.T1", "allows none of"),
])
def test_generation_errors_name_the_field(tmp_path, change, field, reason):
    with pytest.raises(SpecError) as e:
        load_spec_file(_kernel(tmp_path, {**CAST, **change}))
    assert e.value.field == field and reason in e.value.reason, e.value
    assert e.value.file.startswith(str(tmp_path / "k.kernel.json"))


def test_a_versions_entry_applies_from_its_version_to_the_next_entry(tmp_path):
    doc = {"name": "Pad", "since": 2, "extends": "b.base.json",
           "typeConstraints": {"T1": ["float32"], "T2": ["float32"]},
           "attributes": {"to": {"default": 0}, "mode": {}, "pads": {}, "value": {}},
           "derive": {"flag": 0},
           "versions": {"11": {"derive": {"flag": 1}, "inputs": {"pads": {"dtype": "P"}},
                               "typeConstraints": {"P": ["int64"]}},
                        "19": {"inputs": {"pads": {"dtype": "P"}}, "typeConstraints": {"P": ["int64"]}}}}
    with pytest.raises(SpecError, match="no schema version of Pad in onnx.defs has an attribute 'to'"):
        load_spec_file(_kernel(tmp_path, doc))
    del doc["attributes"]["to"]
    BASE_PAD = {**BASE, "attributes": {}}
    (tmp_path / "b.base.json").write_text(json.dumps(BASE_PAD))
    path = tmp_path / "k.kernel.json"
    path.write_text(json.dumps(doc))
    specs = {s.since_version: s for s in load_spec_file(path)}
    assert specs[2].derive.as_dict()["flag"] == 0 and "pads" not in specs[2].inputs
    assert set(specs[2].attributes) == {"mode", "pads", "value"} and specs[2].attributes["pads"].required
    assert specs[2].attributes["value"].default == 0.0  # Pad-2's onnx.defs default
    assert specs[11].derive.as_dict()["flag"] == 1 and "pads" in specs[11].inputs
    assert set(specs[11].attributes) == {"mode"}  # pads and value are Pad-2's only
    assert specs[19].derive.as_dict()["flag"] == 0 and "pads" in specs[19].inputs

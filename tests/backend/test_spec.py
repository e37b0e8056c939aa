"""Kernel spec loading and validation: every malformed spec is a SpecError(file, field, reason)."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from onnx_quant.backend_wgpu.expr import Expr
from onnx_quant.backend_wgpu.spec import (
    KernelSpec, SpecRegistry, load_spec, load_specs, templates_dir, wgsl_type_layout,
)
from onnx_quant.errors import SpecError
from support.specs import load_doc, reject, write_spec

REPO = Path(__file__).resolve().parents[2]
SPEC_FILE = REPO / "templates" / "dynamic_quantize_linear.kernel.json"


def _single(doc: dict) -> dict:
    """A shipped kernel file in the single-spec form (``sinceVersion``), which the field-level tests
    below mutate; the shipped file states ``since`` (one spec per onnx.defs version: test_spec_versions.py)."""
    out = {k: v for k, v in doc.items() if k not in ("since", "until")}
    return {"name": out.pop("name"), "sinceVersion": doc.get("since", doc.get("sinceVersion")), **out}


SEED: dict = _single(json.loads(SPEC_FILE.read_text()))
SEED_TEXT = json.dumps(SEED, indent=1)
SHADERS = sorted({p["shader"] for v in SEED["variants"] for p in v["passes"]})


def seed() -> dict:
    return copy.deepcopy(SEED)


def variant(doc: dict, vid: str) -> dict:
    return next(v for v in doc["variants"] if v["id"] == vid)


# ---------------------------------------------------------------- the seed spec

def test_seed_spec_loads_and_resolves(tmp_path):
    spec = load_doc(tmp_path, seed())
    assert (spec.domain, spec.name, spec.since_version) == ("ai.onnx", "DynamicQuantizeLinear", 11)
    assert list(spec.inputs) == ["x"] and list(spec.outputs) == ["y", "y_scale", "y_zero_point"]
    assert spec.type_constraints == {"T": ("float32",), "TQ": ("uint8",)}
    assert spec.tunables["SERIAL_MAX_ELEMENTS"].default == 8192
    assert [v.id for v in spec.variants] == [
        "single_invocation", "parallel_subgroup_reduce_vec4", "parallel_subgroup_reduce",
        "grid_stride_reduce_vec4", "grid_stride_reduce"]
    assert [v.priority for v in spec.variants] == [None, 11, 10, 12, 12]

    single = spec.variant("single_invocation")
    main = single.passes[0]
    assert [(b.var_name, b.resource, b.role, b.access, b.element_type) for b in main.bindings] == [
        ("x", "x", "input", "read", "f32"),
        ("y", "y", "output", "read_write", "u32"),
        ("y_scale", "y_scale", "output", "read_write", "f32"),
        ("y_zero_point", "y_zero_point", "output", "read_write", "u32"),
        ("params", "params", "uniform", "uniform", None),
    ]
    assert main.derive.as_dict() == {"fromPartials": False}
    assert main.dispatch == (1, 1, 1)

    vec4 = spec.variant("parallel_subgroup_reduce_vec4")
    reduce_, finalize, quantize = vec4.passes
    # "x_reduce" carries name "x": the resource and the WGSL variable are x
    assert (reduce_.bindings[0].ref, reduce_.bindings[0].var_name, reduce_.bindings[0].element_type) == (
        "x_reduce", "x", "$inputElement")
    assert [b.access for b in finalize.bindings] == ["read", "read", "read_write", "read_write", "uniform"]
    assert finalize.bindings[4].struct[0].name == "numPartials"
    assert [b.access for b in quantize.bindings] == ["read", "read", "read", "read_write", "uniform"]
    assert [i.id for i in vec4.intermediates] == ["partial_min", "partial_max"]
    assert isinstance(reduce_.dispatch[0], Expr) and reduce_.dispatch[2] == 1
    assert vec4.derive.as_dict()["vec4"] is True


def test_templates_spec_asks_for_the_real_subgroup_feature():
    text = SPEC_FILE.read_text()
    assert 'has(\\"subgroup\\")' in text
    assert "subgroups" not in text


def test_seed_typo_subgroups_is_rejected_at_load(tmp_path):
    doc = json.loads(SEED_TEXT.replace('has(\\"subgroup\\")', 'has(\\"subgroups\\")'))
    err = reject(tmp_path, doc, "variants[1].derive.useSubgroups", "unknown device feature 'subgroups'")
    assert "did you mean 'subgroup'" in err.reason


def test_real_templates_directory_loads():
    reg = load_specs()
    spec = reg.find("", "DynamicQuantizeLinear", 21)
    assert spec is not None and spec.since_version == 11
    assert Path(spec.directory) == templates_dir()
    for v in spec.variants:
        for p in v.passes:
            assert spec.shader_path(p.shader).is_file()


def test_derive_order_in_json_does_not_matter(tmp_path):
    doc = seed()
    items = list(doc["derive"].items())
    random.Random(7).shuffle(items)
    items.reverse()
    doc["derive"] = dict(items)
    spec = load_doc(tmp_path, doc)
    order = spec.derive.names
    pos = {n: i for i, n in enumerate(order)}
    for name, value in spec.derive.items:
        if isinstance(value, Expr):
            for dep in value.free_names:
                assert pos[dep] < pos[name], (dep, name)


def test_derive_cycle_rejected(tmp_path):
    doc = seed()
    doc["derive"]["inputCount"] = "fullPartials + 1"
    err = reject(tmp_path, doc, reason="dependency cycle")
    assert err.field.startswith("derive.")
    assert "inputCount" in err.reason and "fullPartials" in err.reason


def test_self_reference_is_a_cycle(tmp_path):
    doc = seed()
    doc["derive"]["loop"] = "loop + 1"
    reject(tmp_path, doc, "derive.loop", "dependency cycle: loop -> loop")


# ---------------------------------------------------------------- file level

def test_json_syntax_error_names_line(tmp_path):
    text = json.dumps(SEED, indent=1).splitlines()
    text[5] = text[5] + ",,"
    err = reject(tmp_path, "\n".join(text))
    assert err.field.startswith("line 6 column")
    assert "invalid JSON" in err.reason


def test_duplicate_json_key_rejected(tmp_path):
    text = json.dumps(SEED, indent=1).replace('"sinceVersion": 11', '"sinceVersion": 11, "sinceVersion": 12')
    reject(tmp_path, text, reason="duplicate key 'sinceVersion'")


def test_nan_literal_rejected(tmp_path):
    text = json.dumps(SEED, indent=1).replace('"default": 256', '"default": NaN', 1)
    reject(tmp_path, text, reason="NaN")


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "nope.kernel.json")


def test_not_an_object(tmp_path):
    reject(tmp_path, [1, 2], "<top>", "expected an object")


# ---------------------------------------------------------------- extends

def _split_seed(tmp_path: Path, base_name: str = "family.base.json") -> tuple[dict, dict]:
    """The seed spec split into a base (everything shared) and a child naming the op."""
    base = seed()
    child = {k: base.pop(k) for k in ("domain", "name", "sinceVersion", "description") if k in base}
    child["extends"] = base_name
    (tmp_path / base_name).write_text(json.dumps(base, indent=1))
    return base, child


def test_extends_merges_the_base_under_the_child(tmp_path):
    base, child = _split_seed(tmp_path)
    # objects merge key by key: one derived value replaced, one added, the rest the base's
    child["derive"] = {"inputCount": "numel(shapes.x) + 0", "twiceCount": "inputCount * 2"}
    child["typeConstraints"] = {"T": ["float32"]}  # T's array replaced, TQ kept
    spec = load_doc(tmp_path, child)
    whole = load_spec(write_spec(tmp_path, seed(), "whole.kernel.json"))
    assert (spec.name, spec.since_version, spec.domain) == (whole.name, whole.since_version, whole.domain)
    assert [v.id for v in spec.variants] == [v.id for v in whole.variants]
    assert set(spec.derive.names) == set(whole.derive.names) | {"twiceCount"}
    assert spec.derive.as_dict()["inputCount"].text == "numel(shapes.x) + 0"
    assert spec.type_constraints == {"T": ("float32",), "TQ": whole.type_constraints["TQ"]}
    # an array replaces the base's wholesale
    child["variants"] = [variant(seed(), "single_invocation")]
    assert [v.id for v in load_doc(tmp_path, child).variants] == ["single_invocation"]


def test_extends_chains_and_load_specs_skips_bases(tmp_path):
    base, child = _split_seed(tmp_path, "middle.base.json")
    (tmp_path / "middle.base.json").write_text(json.dumps({"extends": "root.base.json", "tunables": base["tunables"]}))
    (tmp_path / "root.base.json").write_text(json.dumps({k: v for k, v in base.items() if k != "tunables"}))
    write_spec(tmp_path, child)
    reg = load_specs(tmp_path)
    assert len(reg) == 1 and [s.name for s in reg] == [SEED["name"]]


@pytest.mark.parametrize("extends, reason", [
    (3, "expected the file name of a base spec, found number"),
    ("", "expected the file name of a base spec"),
    ("../family.base.json", "must name a *.base.json file in the same folder"),
    ("/tmp/family.base.json", "must name a *.base.json file in the same folder"),
    ("sub/family.base.json", "must name a *.base.json file in the same folder"),
    ("other.kernel.json", "must name a *.base.json file in the same folder"),
    ("missing.base.json", "base spec 'missing.base.json' not found"),
])
def test_extends_must_name_a_base_beside_the_spec(tmp_path, extends, reason):
    _, child = _split_seed(tmp_path)
    child["extends"] = extends
    reject(tmp_path, child, "extends", reason)


def test_extends_cycle_and_broken_base_are_spec_errors(tmp_path):
    _, child = _split_seed(tmp_path)
    path = write_spec(tmp_path, child)

    def error_of_base(base: str, field: str, reason: str) -> None:  # named: the file whose field is wrong
        with pytest.raises(SpecError) as info:
            load_spec(path)
        assert (info.value.file, info.value.field) == (str(tmp_path / base), field) and reason in info.value.reason

    (tmp_path / "family.base.json").write_text(json.dumps({"extends": "family.base.json"}))
    error_of_base("family.base.json", "extends", "cycle: k.kernel.json -> family.base.json -> family.base.json")
    (tmp_path / "family.base.json").write_text(json.dumps({"extends": "other.base.json"}))
    (tmp_path / "other.base.json").write_text(json.dumps({"extends": "family.base.json"}))
    error_of_base("other.base.json", "extends",
                  "cycle: k.kernel.json -> family.base.json -> other.base.json -> family.base.json")
    (tmp_path / "family.base.json").write_text("[1, 2]")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.file == str(tmp_path / "family.base.json") and "expected an object" in info.value.reason
    (tmp_path / "family.base.json").write_text("{,}")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.file == str(tmp_path / "family.base.json") and "invalid JSON" in info.value.reason
    # a field the merge leaves wrong is named as in a whole spec
    (tmp_path / "family.base.json").write_text(json.dumps({k: v for k, v in seed().items() if k != "variants"}))
    reject(tmp_path, child, "<top>", "missing required key 'variants'")


def test_shipped_families_share_one_base_each():
    """The templates' op families are one base each, the member specs only what differs; a base
    that other bases complete (axis_rows: Softmax / LogSoftmax and Hardmax) counts them, and a
    branch of a family (a base that extends another, e.g. lstm.base.json: the inputs, output and
    variant LSTM adds to the recurrent family), like a table family's base, may serve one member."""
    d = templates_dir()
    bases = sorted(p.name for p in d.glob("*.base.json"))
    assert bases, "no base specs shipped"
    users = {b: [] for b in bases}
    for p in d.glob("*.kernel.json"):
        doc = json.loads(p.read_text())
        ext = doc.get("extends")
        if ext is not None:
            users[ext].append(p.name)
            if ext != "word_grid.base.json":  # the grid derives every kind of kernel shares, not a family
                assert not {"variants", "tunables", "inputs", "outputs"} & set(doc), f"{p.name} repeats its base"
        for entry in doc.get("versions", {}).values():  # a schema version's own base (Pad-2's, Slice-1's)
            if entry.get("extends") not in (None, ext):
                users[entry["extends"]].append(p.name)
    branches = set()
    for p in d.glob("*.base.json"):
        ext = json.loads(p.read_text()).get("extends")
        if ext is not None:
            users[ext].append(p.name)
            branches.add(p.name)
    for p in d.glob("*.ops.json"):  # a table's entries extend their family's base
        table = json.loads(p.read_text())
        for op, entry in table["ops"].items():
            base = table["families"][entry["family"]]["extends"]
            users[base].append(f"{p.name}[{op}]")
            branches.add(base)  # a table family (TopK's, Where's) may hold one row
    assert all(len(u) >= (1 if b in branches else 2) for b, u in users.items()), users


# ---------------------------------------------------------------- field level

@pytest.mark.parametrize("mutate, field, reason", [
    (lambda d: d.update(varaints=[]), "varaints", "did you mean 'variants'"),
    (lambda d: d.pop("variants"), "<top>", "missing required key 'variants'"),
    (lambda d: d.update(variants=[]), "variants", "must not be empty"),
    (lambda d: d.update(sinceVersion="11"), "sinceVersion", "expected an integer"),
    (lambda d: d.update(sinceVersion=True), "sinceVersion", "expected an integer"),
    (lambda d: d.update(sinceVersion=0), "sinceVersion", "must be >= 1"),
    (lambda d: d["inputs"]["x"].update(dtype="float32"), "inputs.x.dtype", "not a typeConstraints name"),
    (lambda d: d["inputs"]["x"].update(dtpye="T"), "inputs.x.dtpye", "did you mean 'dtype'"),
    (lambda d: d["inputs"]["x"].pop("dtype"), "inputs.x", "missing required key 'dtype'"),
    (lambda d: d["outputs"]["y"].update(rank="ranks.q"), "outputs.y.rank", "unknown input/output 'q'"),
    (lambda d: d["outputs"]["y"].update(rank=True), "outputs.y.rank", "expected"),
    (lambda d: d["outputs"]["y_scale"].update(shape=["x"]), "outputs.y_scale.shape[0]", "unknown name 'x'"),
    (lambda d: d["outputs"].update({"bad name": {"dtype": "T"}}), "outputs.bad name", "not an identifier"),
    (lambda d: d["outputs"].clear(), "outputs", "at least one output"),
    (lambda d: d["typeConstraints"].update(T=["float33"]), "typeConstraints.T[0]", "did you mean 'float32'"),
    (lambda d: d["typeConstraints"].update(T=[]), "typeConstraints.T", "must not be empty"),
    (lambda d: d["typeConstraints"].update(T="float32"), "typeConstraints.T", "expected an array"),
    (lambda d: d["typeConstraints"].update(T=["float32", "float32"]), "typeConstraints.T[1]", "listed twice"),
    (lambda d: d["tunables"]["WORKGROUP_SIZE"].update(default=2.5), "tunables.WORKGROUP_SIZE.default",
     "expected an integer"),
    (lambda d: d["tunables"]["WORKGROUP_SIZE"].update(max=1), "tunables.WORKGROUP_SIZE.max", "unknown key"),
    (lambda d: d["tunables"]["WORKGROUP_SIZE"].update(tune=64), "tunables.WORKGROUP_SIZE.tune", "expected an array"),
    (lambda d: d["tunables"]["WORKGROUP_SIZE"].update(tune=[64, 0]), "tunables.WORKGROUP_SIZE.tune[1]", "must be >= 1"),
    (lambda d: d["derive"].update(inputCount="numel(shapes.x"), "derive.inputCount", "syntax error"),
    (lambda d: d["derive"].update(inputCount="numel(shapes.x) / 2"), "derive.inputCount", "'/' is not supported"),
    (lambda d: d["derive"].update(inputCount="numel(shape.x)"), "derive.inputCount", "attribute access"),
    (lambda d: d["derive"].update(inputCount="tunables.NOPE"), "derive.inputCount", "unknown tunable 'NOPE'"),
    (lambda d: d["derive"].update(deviceWorkgroupCap="device.limits.maxWorkgroups"), "derive.deviceWorkgroupCap",
     "unknown device limit"),
    (lambda d: d["derive"].update(inputCount=None), "derive.inputCount", "found null"),
    (lambda d: d["derive"].update(inputCount=[1]), "derive.inputCount", "found array"),
    (lambda d: d["derive"].update(min="1"), "derive.min", "reserved"),
    (lambda d: d["derive"].update(bindings="1"), "derive.bindings", "reserved"),
    (lambda d: d["derive"].update({"1x": "1"}), "derive.1x", "not an identifier"),
    (lambda d: d["bindings"]["y"].update(elementType="uint8"), "bindings.y.elementType", "not a WGSL"),
    (lambda d: d["bindings"]["y"].update(buffer="storage-rw"), "bindings.y.buffer", "not one of"),
    (lambda d: d["bindings"]["y"].update(buffer="uniform"), "bindings.y.buffer", "needs a 'struct'"),
    (lambda d: d["bindings"]["y_scale"].update(length=0), "bindings.y_scale.length", "must be >= 1"),
    (lambda d: d["bindings"]["params"]["struct"][0].update(type="bool"), "bindings.params.struct[0].type",
     "not a uniform member type"),
    (lambda d: d["bindings"]["params"]["struct"][0].update(value="numel(shapes.q)"),
     "bindings.params.struct[0].value", "unknown input/output 'q'"),
    (lambda d: d["bindings"]["params"]["struct"].append({"name": "count", "type": "u32", "value": 1}),
     "bindings.params.struct[1].name", "duplicate struct member"),
    (lambda d: d["bindings"]["params"].update(elementType="u32"), "bindings.params.elementType",
     "takes no 'elementType'"),
    (lambda d: d["bindings"].update(unused={"struct": [{"name": "a", "type": "u32", "value": "nope"}]}),
     "bindings.unused.struct[0].value", "unknown name 'nope'"),
    (lambda d: d["variants"][1].update(id="single_invocation"), "variants[1].id", "duplicate variant id"),
    (lambda d: d["variants"][1].update(id="a-b"), "variants[1].id", "not an identifier"),
    (lambda d: d["variants"][1].update(priority="11"), "variants[1].priority", "expected an integer"),
    (lambda d: d["variants"][1].update(when="baseContract"), "variants[1].when", "expected an array"),
    (lambda d: d["variants"][1]["when"].append("inputCount >"), "variants[1].when[4]", "syntax error"),
    (lambda d: d["variants"][1]["when"].append(True), "variants[1].when[4]", "expected an expression"),
    # `when` sees top-level derived names only, not the variant's own derive
    (lambda d: d["variants"][1]["when"].append("vec4"), "variants[1].when[4]", "unknown name 'vec4'"),
    (lambda d: d["variants"][1]["derive"].update(inputCount="1"), "variants[1].derive.inputCount",
     "already defined in derive"),
    (lambda d: d["variants"][1]["passes"][1]["derive"].update(vec4=False),
     "variants[1].passes[1].derive.vec4", "already defined in variants[1].derive"),
    (lambda d: d["variants"][1]["passes"][1].update(id="reduce"), "variants[1].passes[1].id", "duplicate pass id"),
    (lambda d: d["variants"][1]["passes"][0].update(shader="missing.wgsl.jinja"), "variants[1].passes[0].shader",
     "not found"),
    (lambda d: d["variants"][1]["passes"][0].update(shader="../k.kernel.json"), "variants[1].passes[0].shader",
     "relative path inside"),
    (lambda d: d["variants"][1]["passes"][0].update(shader="/etc/passwd"), "variants[1].passes[0].shader",
     "relative path inside"),
    (lambda d: d["variants"][1]["passes"][0].update(shader="a" * 5000), "variants[1].passes[0].shader",
     "unusable shader path"),
    (lambda d: d["variants"][1]["passes"][0].update(shader="a\x00b"), "variants[1].passes[0].shader", ""),
    (lambda d: d["variants"][1]["passes"][0]["dispatch"].pop("x"), "variants[1].passes[0].dispatch",
     "missing required key 'x'"),
    (lambda d: d["variants"][1]["passes"][0]["dispatch"].update(w=1), "variants[1].passes[0].dispatch.w",
     "unknown key"),
    (lambda d: d["variants"][1]["passes"][0]["dispatch"].update(y=-1), "variants[1].passes[0].dispatch.y",
     "must be >= 0"),
    (lambda d: d["variants"][1]["passes"][0]["dispatch"].update(z=True), "variants[1].passes[0].dispatch.z",
     "expected an integer"),
    (lambda d: d["variants"][1]["passes"][0]["dispatch"].update(x="nope"), "variants[1].passes[0].dispatch.x",
     "unknown name 'nope'"),
    (lambda d: d["variants"][1]["intermediates"][0].update(dtype="T2"), "variants[1].intermediates[0].dtype",
     "neither an element type"),
    (lambda d: d["variants"][1]["intermediates"][0].update(id="x"), "variants[1].intermediates[0].id",
     "already an input/output"),
    (lambda d: d["variants"][1]["intermediates"][1].update(id="partial_min"), "variants[1].intermediates[1].id",
     "duplicate intermediate"),
    (lambda d: d["variants"][1]["intermediates"][0].update(shape="[nope]"), "variants[1].intermediates[0].shape",
     "unknown name 'nope'"),
    (lambda d: d["variants"][1]["intermediates"][0].pop("shape"), "variants[1].intermediates[0]",
     "missing required key 'shape'"),
])
def test_field_errors(tmp_path, mutate, field, reason):
    doc = seed()
    mutate(doc)
    reject(tmp_path, doc, field, reason)


# ---------------------------------------------------------------- bindings

def test_binding_naming_nothing(tmp_path):
    doc = seed()
    variant(doc, "single_invocation")["passes"][0]["bindings"][1] = "yy"
    reject(tmp_path, doc, "variants[0].passes[0].bindings[1]", "unknown binding 'yy' (did you mean 'y'?)")


def test_binding_to_an_intermediate_of_another_variant(tmp_path):
    doc = seed()
    variant(doc, "single_invocation")["passes"][0]["bindings"].append("partial_min")
    reject(tmp_path, doc, "variants[0].passes[0].bindings[5]", "not an input, output or intermediate of this variant")


def test_inline_arg_naming_nothing(tmp_path):
    doc = seed()
    variant(doc, "single_invocation")["passes"][0]["bindings"][0] = {"arg": "xx", "elementType": "f32"}
    reject(tmp_path, doc, "variants[0].passes[0].bindings[0].arg", "did you mean 'x'")


def test_inline_binding_needs_arg_or_struct(tmp_path):
    doc = seed()
    variant(doc, "single_invocation")["passes"][0]["bindings"][0] = {"elementType": "f32"}
    reject(tmp_path, doc, "variants[0].passes[0].bindings[0]", "needs 'arg'")


def test_binding_entry_wrong_type(tmp_path):
    doc = seed()
    variant(doc, "single_invocation")["passes"][0]["bindings"][0] = 3
    reject(tmp_path, doc, "variants[0].passes[0].bindings[0]", "found number")


def test_direct_io_and_intermediate_names_are_bindings(tmp_path):
    doc = seed()
    p = variant(doc, "parallel_subgroup_reduce")["passes"][0]
    p["bindings"] = [{"arg": "x"}, "partial_min", "partial_max", "params"]
    spec = load_doc(tmp_path, doc)
    b = spec.variant("parallel_subgroup_reduce").passes[0].bindings
    assert [(x.resource, x.role, x.access, x.element_type) for x in b[:3]] == [
        ("x", "input", "read", None), ("partial_min", "intermediate", "read_write", "f32"),
        ("partial_max", "intermediate", "read_write", "f32")]


def test_buffer_bound_twice_in_a_pass(tmp_path):
    doc = seed()
    variant(doc, "parallel_subgroup_reduce")["passes"][2]["bindings"].append({"arg": "y_scale"})
    reject(tmp_path, doc, "variants[2].passes[2].bindings[5]", "already bound at binding 1")


def test_read_and_read_write_of_one_buffer_in_a_pass(tmp_path):
    doc = seed()
    # finalize writes partial_min? no: bind it read (partial_min_f32) and read_write (partial_min)
    variant(doc, "parallel_subgroup_reduce")["passes"][1]["bindings"].append("partial_min")
    err = reject(tmp_path, doc, "variants[2].passes[1].bindings[5]", "already bound")
    assert "read_write" in err.reason or "read" in err.reason


def test_two_uniforms_with_one_variable_name(tmp_path):
    doc = seed()
    variant(doc, "single_invocation")["passes"][0]["bindings"].append(
        {"name": "params", "struct": [{"name": "k", "type": "u32", "value": 1}]})
    reject(tmp_path, doc, "variants[0].passes[0].bindings[5]", "already bound")


def test_input_cannot_be_writable(tmp_path):
    doc = seed()
    doc["bindings"]["x_reduce"]["buffer"] = "storage"
    reject(tmp_path, doc, "variants[1].passes[0].bindings[0]", "inputs are read-only")


def test_dollar_element_type_must_be_derived_in_every_using_variant(tmp_path):
    doc = seed()
    del variant(doc, "grid_stride_reduce")["derive"]["inputElement"]
    err = reject(tmp_path, doc, "variants[4].passes[0].bindings[0]", "'inputElement' is not a derived name")
    assert "bindings.x_reduce.elementType" in err.reason


def test_dollar_element_type_may_come_from_pass_or_top_level_derive(tmp_path):
    doc = seed()
    for v in doc["variants"][1:]:
        del v["derive"]["inputElement"]
        for p in v["passes"]:
            if "x_reduce" in p["bindings"]:
                p.setdefault("derive", {})["inputElement"] = '"vec4<f32>" if vec4 else "f32"'
    load_doc(tmp_path, doc)
    doc2 = seed()
    for v in doc2["variants"][1:]:
        del v["derive"]["inputElement"]
    doc2["derive"]["inputElement"] = '"f32"'
    load_doc(tmp_path / "b", doc2)


def test_dollar_requires_identifier(tmp_path):
    doc = seed()
    doc["bindings"]["x_reduce"]["elementType"] = "$"
    reject(tmp_path, doc, "bindings.x_reduce.elementType", "'$' must be followed")


def test_struct_binding_with_storage_buffer_rejected(tmp_path):
    doc = seed()
    doc["bindings"]["params"]["buffer"] = "storage"
    reject(tmp_path, doc, "bindings.params.buffer", "uniform")


def test_wgsl_type_layout():
    assert wgsl_type_layout("f32") == (4, 4)
    assert wgsl_type_layout("f16") == (2, 2)
    assert wgsl_type_layout("vec2<u32>") == (8, 8)
    assert wgsl_type_layout("vec3<f32>") == (12, 16)
    assert wgsl_type_layout("vec4f") == (16, 16)
    assert wgsl_type_layout("vec3h") == (6, 8)
    assert wgsl_type_layout("atomic<u32>") is None
    assert wgsl_type_layout("atomic<u32>", storage=True) == (4, 4)
    assert wgsl_type_layout("bool") is None
    assert wgsl_type_layout("array<f32>") is None


# ---------------------------------------------------------------- registry

def _versioned(version: int, domain: str | None = None) -> dict:
    doc = seed()
    doc["sinceVersion"] = version
    if domain is not None:
        doc["domain"] = domain
    return doc


def test_registry_find_picks_highest_since_version_not_above(tmp_path):
    write_spec(tmp_path, _versioned(11), "a.kernel.json")
    write_spec(tmp_path, _versioned(19, ""), "b.kernel.json")
    write_spec(tmp_path, _versioned(5, "com.example"), "c.kernel.json")
    (tmp_path / "ignored.json").write_text("{not even json")
    reg = load_specs(tmp_path)
    assert len(reg) == 3
    assert reg.find("ai.onnx", "DynamicQuantizeLinear", 10) is None
    assert reg.find("ai.onnx", "DynamicQuantizeLinear", 11).since_version == 11
    assert reg.find("", "DynamicQuantizeLinear", 18).since_version == 11
    assert reg.find("", "DynamicQuantizeLinear", 19).since_version == 19
    assert reg.find("ai.onnx", "DynamicQuantizeLinear", 28).since_version == 19
    assert reg.find("com.example", "DynamicQuantizeLinear", 6).since_version == 5
    assert reg.find("com.example", "DynamicQuantizeLinear", 4) is None
    assert reg.find("ai.onnx", "QuantizeLinear", 28) is None
    assert ("", "DynamicQuantizeLinear") in reg


def test_registry_rejects_duplicate_versions(tmp_path):
    write_spec(tmp_path, _versioned(11), "a.kernel.json")
    write_spec(tmp_path, _versioned(11, "ai.onnx"), "b.kernel.json")
    with pytest.raises(SpecError, match="also defined"):
        load_specs(tmp_path)


def test_registry_propagates_a_bad_file(tmp_path):
    write_spec(tmp_path, _versioned(11), "a.kernel.json")
    write_spec(tmp_path, "{", "b.kernel.json")
    with pytest.raises(SpecError) as info:
        load_specs(tmp_path)
    assert info.value.file.endswith("b.kernel.json")


def test_registry_manual():
    reg = SpecRegistry()
    assert reg.find("", "X", 1) is None and len(reg) == 0


def test_load_specs_missing_directory(tmp_path):
    with pytest.raises(SpecError, match="not a directory"):
        load_specs(tmp_path / "nope")


# ---------------------------------------------------------------- mutation properties

def _walk(node, path=()):
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, path + (i,))


ALL_PATHS = [p for p, _ in _walk(SEED) if p]
DICT_PATHS = [p for p, v in _walk(SEED) if isinstance(v, dict)]
STRING_PATHS = [p for p, v in _walk(SEED) if isinstance(v, str)]
SCALAR_PATHS = [p for p, v in _walk(SEED) if isinstance(v, (int, float, bool))]
LIST_PATHS = [p for p, v in _walk(SEED) if isinstance(v, list)]
NONEMPTY_CONTAINER_PATHS = [p for p, v in _walk(SEED) if p and isinstance(v, (dict, list))]
KEY_PATHS = [p for p in ALL_PATHS if isinstance(p[-1], str)]


def _is_expression_site(path) -> bool:
    keys = [k for k in path if isinstance(k, str)]
    last = path[-1]
    if "derive" in keys and keys[-1] != "derive" and isinstance(last, str) and keys.index("derive") == len(keys) - 2:
        return True
    if keys and keys[-1] == "when" and isinstance(last, int):
        return True
    if len(keys) >= 2 and keys[-2] == "dispatch":
        return True
    if keys and keys[-1] in ("value", "rank") or (keys and keys[-1] == "shape"):
        return True
    return False


EXPR_PATHS = [p for p in STRING_PATHS if _is_expression_site(p)]
PASS_BINDING_STRING_PATHS = [p for p in STRING_PATHS if len(p) >= 2 and p[-2] == "bindings" and isinstance(p[-1], int)]

REQUIRED = {
    (): ["name", "sinceVersion", "inputs", "outputs", "typeConstraints", "variants"],
}
REQUIRED_PATHS: list[tuple] = [(k,) for k in REQUIRED[()]]
for p, v in _walk(SEED):
    if len(p) == 2 and p[0] in ("inputs", "outputs"):
        REQUIRED_PATHS.append(p + ("dtype",))
    elif len(p) == 2 and p[0] == "tunables":
        REQUIRED_PATHS.append(p + ("default",))
    elif len(p) == 2 and p[0] == "variants":
        REQUIRED_PATHS += [p + ("id",), p + ("passes",)]
    elif len(p) == 4 and p[0] == "variants" and p[2] == "passes":
        REQUIRED_PATHS += [p + (k,) for k in ("id", "shader", "bindings", "dispatch")] + [p + ("dispatch", "x")]
    elif len(p) == 4 and p[0] == "variants" and p[2] == "intermediates":
        REQUIRED_PATHS += [p + (k,) for k in ("id", "dtype", "shape")]
    elif p and p[-2:-1] == ("struct",) and isinstance(p[-1], int):
        REQUIRED_PATHS += [p + (k,) for k in ("name", "type", "value")]

assert len(EXPR_PATHS) > 60 and len(PASS_BINDING_STRING_PATHS) > 30 and len(REQUIRED_PATHS) > 60


def _get(doc, path):
    for k in path:
        doc = doc[k]
    return doc


def _set(doc, path, value):
    _get(doc, path[:-1])[path[-1]] = value


def _drop(doc, path):
    parent = _get(doc, path[:-1])
    if isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent.pop(path[-1])


BAD_EXPRESSIONS = ["inputCount +", "unknown_name_xyz", "inputCount / 2", "__import__('os')",
                   'device.features.has("subgroups")', "tunables.NOPE", "shapes.nope[0]", "lambda: 1",
                   "device.limits.maxNope", "(1, 2)", "", "numel()", "x.y.z"]


def _invalid_mutation():
    return st.one_of(
        st.sampled_from(REQUIRED_PATHS).map(lambda p: ("drop", p, None)),
        st.sampled_from(DICT_PATHS).map(lambda p: ("add", p + ("zz_bogus",), None)),
        st.sampled_from(ALL_PATHS).map(lambda p: ("set", p, None)),
        st.tuples(st.sampled_from(EXPR_PATHS), st.sampled_from(BAD_EXPRESSIONS)).map(lambda t: ("set", t[0], t[1])),
        st.sampled_from(PASS_BINDING_STRING_PATHS).map(lambda p: ("set", p, "no_such_binding")),
        st.sampled_from(STRING_PATHS).map(lambda p: ("set", p, {"zz": 1})),
        st.sampled_from(SCALAR_PATHS).map(lambda p: ("set", p, "zz(")),
        st.sampled_from(LIST_PATHS).map(lambda p: ("set", p, "zz(")),
        st.sampled_from(NONEMPTY_CONTAINER_PATHS).map(lambda p: ("set", p, 7)),
    )


def _apply(doc, mutation):
    kind, path, value = mutation
    if kind == "drop":
        _drop(doc, path)
    else:
        _set(doc, path, value)


@given(st.lists(_invalid_mutation(), min_size=1, max_size=3))
def test_invalid_mutations_are_spec_errors(tmp_path_factory, mutations):
    doc = seed()
    first = mutations[0]
    _apply(doc, first)
    path = write_spec(tmp_path_factory.mktemp("m"), doc)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.file == str(path) and info.value.field and info.value.reason
    # further mutations on top of an invalid spec stay SpecErrors (or earlier ones got overwritten)
    for m in mutations[1:]:
        try:
            _apply(doc, m)
        except (KeyError, IndexError, TypeError, AttributeError):
            break
        path.write_text(json.dumps(doc))
        try:
            load_spec(path)
        except SpecError:
            pass


_ANY_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70000), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12), st.sampled_from(BAD_EXPRESSIONS + ["1", "true", "inputCount", '"f32"', "[]"]),
    st.just([]), st.just({}), st.just([1, 2]), st.just({"arg": "x"}),
)


@given(st.lists(st.one_of(
    st.tuples(st.just("drop"), st.sampled_from(ALL_PATHS), st.none()),
    st.tuples(st.just("set"), st.sampled_from(ALL_PATHS), _ANY_VALUES),
    st.tuples(st.just("key"), st.sampled_from(DICT_PATHS), st.text(max_size=8)),
), min_size=1, max_size=4))
def test_arbitrary_mutations_load_or_raise_spec_error(tmp_path_factory, mutations):
    doc = seed()
    for kind, path, value in mutations:
        try:
            if kind == "drop":
                _drop(doc, path)
            elif kind == "set":
                _set(doc, path, copy.deepcopy(value))
            else:
                _get(doc, path)[value] = 1
        except (KeyError, IndexError, TypeError, AttributeError):
            continue  # the path no longer exists after an earlier mutation
    path = write_spec(tmp_path_factory.mktemp("f"), doc)
    try:
        spec = load_spec(path)
    except SpecError as e:
        assert e.file == str(path) and e.reason
    else:
        assert isinstance(spec, KernelSpec) and spec.variants


# ---------------------------------------------------------------- spec format v2: attributes, optional inputs

def v2_doc() -> dict:
    doc = seed()
    doc["attributes"] = {"axis": {"default": 1}, "saturate": {"default": 1, "description": "float8 only"},
                         "mode": {"default": "x"}, "perm": {"default": [0, 1]}, "req": {"required": True}}
    doc["inputs"]["zp"] = {"dtype": "T", "optional": True}
    doc["derive"]["axisUsed"] = "attrs.axis + (1 if present.zp else 0) + bits(dtypes.x)"
    return doc


def test_v2_attributes_and_optional_input_load(tmp_path):
    spec = load_doc(tmp_path, v2_doc())
    assert spec.attributes["axis"].default == 1 and not spec.attributes["axis"].required
    assert spec.attributes["perm"].default == (0, 1)
    assert spec.attributes["mode"].default == "x"
    assert spec.attributes["req"].required and spec.attributes["req"].default is None
    assert spec.attributes["saturate"].description == "float8 only"
    assert spec.inputs["zp"].optional and not spec.inputs["x"].optional


def test_seed_declares_no_attributes(tmp_path):
    assert load_doc(tmp_path, seed()).attributes == {}


@pytest.mark.parametrize("mutate, field, reason", [
    (lambda d: d["derive"].__setitem__("bad", "attrs.axes"), "derive.bad",
     "unknown attribute 'axes' in attrs.axes (did you mean 'axis'?)"),
    (lambda d: d["derive"].__setitem__("bad", "dtypes.zz"), "derive.bad", "unknown input/output 'zz'"),
    (lambda d: d["derive"].__setitem__("bad", "present.z"), "derive.bad", "unknown input/output 'z'"),
    (lambda d: d.__setitem__("attributes", []), "attributes", "expected an object"),
    (lambda d: d["attributes"].__setitem__("x-y", {"default": 1}), "attributes.x-y", "not an identifier"),
    (lambda d: d["attributes"].__setitem__("a", {}), "attributes.a", "missing required key 'default'"),
    (lambda d: d["attributes"].__setitem__("a", {"default": True}), "attributes.a.default", "booleans"),
    (lambda d: d["attributes"].__setitem__("a", {"default": {}}), "attributes.a.default", "expected a number"),
    (lambda d: d["attributes"].__setitem__("a", {"default": [1, "x"]}), "attributes.a.default[1]", "numbers"),
    (lambda d: d["attributes"].__setitem__("a", {"default": 1, "required": True}), "attributes.a",
     "a required attribute has no 'default'"),
    (lambda d: d["attributes"].__setitem__("a", {"defualt": 1}), "attributes.a.defualt", "did you mean 'default'"),
    (lambda d: d["inputs"]["zp"].__setitem__("optional", 1), "inputs.zp.optional", "expected a boolean"),
    (lambda d: d["outputs"]["y"].__setitem__("optional", "yes"), "outputs.y.optional", "expected a boolean"),
    (lambda d: d["derive"].__setitem__("attrs", 1), "derive.attrs", "reserved"),
    (lambda d: d["derive"].__setitem__("present", 1), "derive.present", "reserved"),
    (lambda d: d["derive"].__setitem__("dtypes", 1), "derive.dtypes", "reserved"),
    (lambda d: d["derive"].__setitem__("bits", 1), "derive.bits", "reserved"),
])
def test_v2_field_errors(tmp_path, mutate, field, reason):
    doc = v2_doc()
    mutate(doc)
    reject(tmp_path, doc, field, reason)


def test_index_and_loop_checks_load(tmp_path):
    doc = seed()
    doc["indexChecks"] = {"x": {"bounds": "[numel(shapes.x)]", "fromZero": True, "ignore": "0"}}
    doc["loopChecks"] = {"x": {"bound": "numel(shapes.x) + 1", "when": "numel(shapes.x) > 0", "item": "roi"}}
    spec = load_doc(tmp_path / "ok", doc)
    (check,), (loop,) = spec.index_checks, spec.loop_checks
    assert (check.input, check.from_zero) == ("x", True) and check.ignore is not None
    assert (loop.input, loop.item) == ("x", "roi") and loop.when is not None
    doc["loopChecks"] = {"x": {"bound": "1"}}
    (loop,) = load_doc(tmp_path / "defaults", doc).loop_checks
    assert (loop.when, loop.item) == (None, "row")


@pytest.mark.parametrize("key, value, field, reason", [
    ("indexChecks", {"nothing": {"bounds": "[1]"}}, "indexChecks.nothing", "unknown key 'nothing'; allowed: x"),
    ("indexChecks", {"x": {"bounds": "[noSuchName]"}}, "indexChecks.x.bounds", "noSuchName"),
    ("indexChecks", {"x": {"bounds": "[1]", "fromZero": 1}}, "indexChecks.x.fromZero", "expected true or false"),
    ("loopChecks", {"nothing": {"bound": "1"}}, "loopChecks.nothing", "unknown key 'nothing'; allowed: x"),
    ("loopChecks", {"x": {"bound": "noSuchName"}}, "loopChecks.x.bound", "noSuchName"),
    ("loopChecks", {"x": {"when": "true"}}, "loopChecks.x", "missing required key 'bound'"),
    ("loopChecks", {"x": {"bound": "1", "item": 3}}, "loopChecks.x.item", "expected a string"),
])
def test_index_and_loop_checks_are_validated_when_loaded(tmp_path, key, value, field, reason):
    doc = seed()
    doc[key] = value
    reject(tmp_path, doc, field, reason)

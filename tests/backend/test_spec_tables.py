"""Operator tables (templates/*.ops.json) expanded into kernel specs, ``passShaders`` and
``untilVersion``. Pure Python: no GPU needed. The oracle for types and versions is onnx.defs
itself, read here directly (not through onnx_quant.opsets, which the expansion uses)."""

from __future__ import annotations

import json
import shutil

import pytest
from onnx import defs, helper

from onnx_quant.backend_wgpu.spec import load_spec, load_specs, templates_dir
from onnx_quant.backend_wgpu.spec_tables import load_table
from onnx_quant.errors import SpecError

TABLE = templates_dir() / "elementwise.ops.json"
ENTRIES = json.loads(TABLE.read_text())["ops"]
SPECS = load_specs()

_NP_NAME = {"float": "float32", "double": "float64"}


def _schema_types(op: str, version: int, io_index: int, output: bool) -> set[str]:
    """Element type names onnx.defs allows for one input/output of the schema in force."""
    s = defs.get_schema(op, version, "")
    formals = s.outputs if output else s.inputs
    variadic = formals[-1].option == defs.OpSchema.FormalParameterOption.Variadic
    formal = formals[min(io_index, len(formals) - 1)] if variadic else formals[io_index]
    allowed = next((tc.allowed_type_strs for tc in s.type_constraints if tc.type_param_str == formal.type_str),
                   [formal.type_str])
    names = set()
    for t in allowed:
        if t.startswith("tensor("):
            name = t[len("tensor("):-1]
            names.add(_NP_NAME.get(name, name))
    return names


def _versions(op: str) -> list[int]:
    return sorted({s.since_version for s in defs.get_all_schemas_with_history() if s.name == op and s.domain == ""})


@pytest.mark.parametrize("op", sorted(ENTRIES))
def test_every_schema_version_gets_the_table_types_onnx_defs_allows(op):
    entry = ENTRIES[op]
    top = max(v for v in _versions(op))
    for version in [v for v in _versions(op) if v >= entry["since"]] + [top + 3]:
        spec = SPECS.find("", op, version)
        assert spec is not None and spec.path.endswith("elementwise.ops.json[%s-%d]" % (op, spec.since_version))
        schema_version = min(version, top)
        for constraint, types in entry["types"].items():
            ios = [(i, out) for out, decls in ((False, spec.inputs), (True, spec.outputs))
                   for i, d in enumerate(decls.values()) if d.dtype == constraint]
            expected = [t for t in types if all(t in _schema_types(op, schema_version, i, out) for i, out in ios)]
            assert list(spec.type_constraints[constraint]) == expected, (op, version, constraint)
    assert SPECS.find("", op, entry["since"] - 1) is None  # before its first version: no kernel


@pytest.mark.parametrize("op", sorted(op for op, e in ENTRIES.items() if e.get("attributes")))
def test_attribute_defaults_are_onnx_defaults(op):
    schema = defs.get_schema(op, 100, "")
    for name, default in ENTRIES[op]["attributes"].items():
        if isinstance(default, dict):  # a required string attribute read as an enumeration
            assert schema.attributes[name].required and default["required"] is True, name
            assert SPECS.find("", op, 100).attributes[name].required
            continue
        onnx_default = helper.get_attribute_value(schema.attributes[name].default_value)
        assert type(default) is type(onnx_default) and default == pytest.approx(onnx_default, rel=1e-7), name
        assert SPECS.find("", op, 100).attributes[name].default == default


def _copy_family(tmp_path, table: dict):
    for name in ("elementwise_unary.base.json", "word_grid.base.json", "elementwise-expr.wgsl.jinja",
                 "elementwise.wgsl.jinja"):
        shutil.copy(templates_dir() / name, tmp_path / name)
    path = tmp_path / "t.ops.json"
    path.write_text(json.dumps(table))
    return path


def _table(**op):
    entry = {"family": "unary", "since": 6, "types": {"T": ["float32", "float16"]}, "expr": "abs(a)", **op}
    return {"families": {"unary": {"extends": "elementwise_unary.base.json", "inputs": {"x": "T"},
                                   "outputs": {"y": "T"}}},
            "ops": {"Abs": entry}}


def test_a_table_entry_is_a_spec_per_version_where_the_types_change(tmp_path):
    specs = load_table(_copy_family(tmp_path, _table(types={"T": ["float32", "int8", "int16"]})))
    # Abs-6 and -13 allow the same of these three, so one spec serves both
    assert [(s.since_version, s.type_constraints["T"]) for s in specs] == [(6, ("float32", "int8", "int16"))]
    assert specs[0].derive.as_dict()["exprs"].text == json.dumps(["*", "abs(a)"])


def test_until_ends_an_entry(tmp_path):
    (spec,) = load_table(_copy_family(tmp_path, _table(until=12)))
    assert spec.until_version == 12
    from onnx_quant.backend_wgpu.spec import SpecRegistry

    reg = SpecRegistry([spec])
    assert reg.find("", "Abs", 12) is spec and reg.find("", "Abs", 13) is None


@pytest.mark.parametrize("change, field, reason", [
    ({"since": 7}, "ops.Abs.since", "Abs has no schema of version 7 in onnx.defs"),
    ({"family": "binary"}, "ops.Abs.family", "unknown family 'binary'"),
    ({"types": {"T": ["float64"], "T1": ["bool"]}}, "ops.Abs.types", "expected the element types of ['T']"),
    ({"types": {"T": ["bool"]}}, "ops.Abs.types.T", "Abs-6 allows none of ['bool']"),
    ({"attributes": {"alpha": 1.0}}, "ops.Abs.attributes.alpha", "Abs-6 has no attribute 'alpha'"),
    ({"expr": {"f128": "a"}}, "ops.Abs.expr.f128", "a WGSL expression"),
])
def test_table_errors_name_the_file_and_the_entry(tmp_path, change, field, reason):
    path = _copy_family(tmp_path, _table(**change))
    with pytest.raises(SpecError) as e:
        load_table(path)
    assert e.value.file == str(path) and e.value.field == field and reason in e.value.reason


def test_a_generated_spec_error_names_the_table_entry(tmp_path):
    table = _table()
    table["families"]["unary"]["outputs"] = {"y": "T", "z": "T"}  # Abs has one output
    with pytest.raises(SpecError, match=r"ops.Abs: Abs-6 has no output 1 for 'z'"):
        load_table(_copy_family(tmp_path, table))
    table = _table(expr="abs(a)", description=3)
    with pytest.raises(SpecError) as e:
        load_table(_copy_family(tmp_path, table))
    assert e.value.file == "t.ops.json[Abs-6]" and e.value.field == "description"


def test_pass_shaders_override_a_base_pass(tmp_path):
    for name in ("elementwise_unary.base.json", "word_grid.base.json", "elementwise-expr.wgsl.jinja",
                 "elementwise.wgsl.jinja"):
        shutil.copy(templates_dir() / name, tmp_path / name)
    member = {"name": "Foo", "sinceVersion": 1, "extends": "elementwise_unary.base.json",
              "typeConstraints": {"T": ["float32"]}, "derive": {"op": "\"Foo\""},
              "passShaders": {"main": "elementwise.wgsl.jinja"}}
    (tmp_path / "foo.kernel.json").write_text(json.dumps(member))
    spec = load_spec(tmp_path / "foo.kernel.json")
    assert {p.shader for v in spec.variants for p in v.passes} == {"elementwise.wgsl.jinja"}
    base = load_spec_from_base(tmp_path)
    assert {p.shader for v in base.variants for p in v.passes} == {"elementwise-expr.wgsl.jinja"}
    member["passShaders"] = {"finalize": "elementwise.wgsl.jinja"}
    (tmp_path / "foo.kernel.json").write_text(json.dumps(member))
    with pytest.raises(SpecError, match="passShaders: no pass with id 'finalize' in any variant"):
        load_spec(tmp_path / "foo.kernel.json")
    member["passShaders"] = {"main": "missing.wgsl.jinja"}
    (tmp_path / "foo.kernel.json").write_text(json.dumps(member))
    with pytest.raises(SpecError, match="missing.wgsl.jinja"):
        load_spec(tmp_path / "foo.kernel.json")


def load_spec_from_base(tmp_path):
    """The base completed without passShaders: its own shader."""
    doc = {"name": "Bar", "sinceVersion": 1, "extends": "elementwise_unary.base.json",
           "typeConstraints": {"T": ["float32"]}, "derive": {"op": "\"Bar\""}}
    (tmp_path / "bar.kernel.json").write_text(json.dumps(doc))
    return load_spec(tmp_path / "bar.kernel.json")


def test_the_shipped_table_covers_ops_that_no_kernel_file_repeats():
    files = {json.loads(p.read_text())["name"] for p in templates_dir().glob("*.kernel.json")}
    assert not files & set(ENTRIES), files & set(ENTRIES)


@pytest.mark.parametrize("change, field, reason", [
    ({"final": 3}, "ops.Abs.final", "expected a WGSL expression"),
    ({"expr": {"f32,x64": "a"}}, "ops.Abs.expr.f32,x64", "a register type"),
])
def test_table_errors_of_integer_rows(tmp_path, change, field, reason):
    path = _copy_family(tmp_path, _table(**change))
    with pytest.raises(SpecError) as e:
        load_table(path)
    assert e.value.field == field and reason in e.value.reason


def _plan(op, version, dtypes, shapes, attributes=None, device=None):
    from onnx_quant.backend_wgpu.device_info import DeviceInfo
    from onnx_quant.backend_wgpu.planner import plan_node

    return plan_node(SPECS.find("", op, version), shapes=shapes, dtypes=dtypes, device=device or DeviceInfo(),
                     attributes=attributes)


def test_operands_without_an_expression_are_declined_by_expr_ok():
    from onnx_quant.errors import KernelRejected

    shapes = {"a": [3], "b": [3], "c": [3]}
    plan = _plan("Pow", 18, {"a": "int64", "b": "uint8", "c": "int64"}, shapes)
    assert "oq_ipow_i64(a, b)" in plan.derived["exprs"]  # the i64,i32 key
    with pytest.raises(KernelRejected, match="'exprOk' is false"):
        _plan("Pow", 18, {"a": "int32", "b": "float32", "c": "int32"}, shapes)


def test_a_string_attribute_is_an_enumeration():
    spec = SPECS.find("", "BitShift", 28)
    assert spec.attributes["direction"].required
    plan = _plan("BitShift", 28, {"a": "int64", "b": "int64", "c": "int64"}, {"a": [2], "b": [2], "c": [2]},
                 {"direction": "LEFT"})
    assert plan.derived["enums"] == (("direction", ("LEFT", "RIGHT")),)
    assert SPECS.find("", "BitShift", 27).type_constraints["T"] == ("uint8", "uint16", "uint32", "uint64")


def test_nary_ops_bind_exactly_their_inputs_and_decline_past_the_binding_limit():
    from onnx_quant.backend_wgpu.device_info import WEBGPU_DEFAULT_LIMITS, DeviceInfo
    from onnx_quant.errors import KernelRejected

    for n in (1, 3, 7):
        shapes = {f"x{k}": [2, 3] for k in range(n)} | {"y": [2, 3]}
        dtypes = {f"x{k}": "uint64" for k in range(n)} | {"y": "uint64"}
        plan = _plan("Max", 13, dtypes, shapes)
        assert plan.variant == f"inputs_{n}"
        storage = [b.var_name for b in plan.passes[0].bindings if b.access != "uniform"]
        assert storage == [f"x{k}" for k in range(n)] + ["y"]
        assert [b.var_name for b in plan.passes[0].bindings if b.access == "uniform"] == ["oq_dims"]  # the sizes
    shapes = {f"x{k}": [4] for k in range(8)} | {"y": [4]}
    dtypes = {f"x{k}": "float32" for k in range(8)} | {"y": "float32"}
    with pytest.raises(KernelRejected, match="9 <= device.limits.maxStorageBuffersPerShaderStage"):
        _plan("Sum", 13, dtypes, shapes)  # WebGPU's default: 8 storage buffers
    big = DeviceInfo(limits=dict(WEBGPU_DEFAULT_LIMITS, maxStorageBuffersPerShaderStage=16))
    assert _plan("Sum", 13, dtypes, shapes, device=big).variant == "inputs_8"


# ----------------------------------------------------------------------------- families with parts

REDUCE = json.loads((templates_dir() / "reduce.ops.json").read_text())


@pytest.mark.parametrize("op", sorted(REDUCE["ops"]))
def test_reduce_table_specs_follow_onnx_defs_inputs_attributes_and_types(op):
    """Each schema version's spec has exactly the inputs and attributes onnx.defs gives it (the
    family's shared ones), and the row's types that version allows."""
    entry = REDUCE["ops"][op]
    family = REDUCE["families"][entry["family"]]
    for version in [v for v in _versions(op) if v >= entry["since"]]:
        spec = SPECS.find("", op, version)
        assert spec is not None, (op, version)
        schema = defs.get_schema(op, version, "")
        assert list(spec.inputs) == list(family["inputs"])[:len(schema.inputs)], (op, version)
        assert set(spec.attributes) == {a for a in family["attributes"] if a in schema.attributes}, (op, version)
        for a in spec.attributes:
            onnx_default = schema.attributes[a].default_value
            if onnx_default.type:  # axes has no default in onnx.defs (empty: all axes)
                assert spec.attributes[a].default == helper.get_attribute_value(onnx_default), (op, version, a)
        expected = [t for t in entry["types"]["T"] if t in _schema_types(op, version, 0, False)]
        assert list(spec.type_constraints["T"]) == expected, (op, version)
    assert SPECS.find("", op, entry["since"] - 1) is None


def test_parts_become_one_derived_list_each_and_an_optional_part_may_be_left_out():
    spec = SPECS.find("", "ReduceSum", 13)
    derived = spec.derive.as_dict()
    assert derived["exprs_combine"].text == json.dumps(["*", "a + b"])
    assert derived["exprs_shift"].text == "[]"
    assert json.loads(SPECS.find("", "ReduceLogSumExp", 18).derive.as_dict()["exprs_shift"].text)[0] == "*"
    assert spec.inputs["axes"].optional and spec.inputs["axes"].constant
    assert spec.type_constraints["Tind"] == ("int64",)
    assert "axes" not in SPECS.find("", "ReduceSum", 12).inputs


def _reduce_table(tmp_path, **op):
    for name in ("reduce.base.json", "reduce.wgsl.jinja"):
        shutil.copy(templates_dir() / name, tmp_path / name)
    fam = dict(REDUCE["families"]["reduce"])
    entry = {"family": "reduce", "since": 1, "types": {"T": ["float32"]},
             "expr": {"init": "0.0", "map": "a", "combine": "a + b", "finalize": "a"}, **op}
    path = tmp_path / "r.ops.json"
    path.write_text(json.dumps({"families": {"reduce": fam}, "ops": {"ReduceSum": entry}}))
    return path


@pytest.mark.parametrize("change, field, reason", [
    ({"expr": {"init": "0.0", "map": "a", "combine": "a + b"}}, "ops.ReduceSum.expr", "missing part 'finalize'"),
    ({"expr": {"init": "0.0", "map": "a", "combine": "a + b", "finalize": "a", "twist": "a"}},
     "ops.ReduceSum.expr.twist", "unknown part"),
    ({"expr": "a + b"}, "ops.ReduceSum.expr", "expected an object part -> expression"),
    ({"types": {"T": ["float32"], "Tind": ["int64"]}}, "ops.ReduceSum.types", "expected the element types of ['T']"),
])
def test_part_errors_name_the_entry(tmp_path, change, field, reason):
    path = _reduce_table(tmp_path, **change)
    with pytest.raises(SpecError) as e:
        load_table(path)
    assert e.value.field == field and reason in e.value.reason, (e.value.field, e.value.reason)


def test_a_table_of_parts_expands_per_version_where_inputs_or_attributes_change(tmp_path):
    specs = load_table(_reduce_table(tmp_path))
    # ReduceSum-1 and -11 take the same; 13 brings the axes input and noop_with_empty_axes
    assert [(s.since_version, list(s.inputs), sorted(s.attributes)) for s in specs] == [
        (1, ["x"], ["axes", "keepdims"]), (13, ["x", "axes"], ["keepdims", "noop_with_empty_axes"])]

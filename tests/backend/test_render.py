"""Rendering: the Jinja environment over the installed templates, strictness, the binding
snippet agreeing with the plan, snippets included (never copied), and every rendered pass
compiling on the devices present."""

from __future__ import annotations

import dataclasses
import re

import pytest

from onnx_quant.backend_wgpu.device_info import WEBGPU_DEFAULT_LIMITS, DeviceInfo
from onnx_quant.backend_wgpu.plan import BindingPlan, PassPlan
from onnx_quant.backend_wgpu.render import environment, render, render_string, templates_dir
from onnx_quant.errors import DeviceError

VARIANTS = ("single_invocation", "parallel_subgroup_reduce_vec4", "parallel_subgroup_reduce",
            "grid_stride_reduce_vec4", "grid_stride_reduce")


@pytest.fixture(scope="module")
def spec():
    from onnx_quant.backend_wgpu.spec import load_specs

    s = load_specs().find("", "DynamicQuantizeLinear", 21)
    assert s is not None
    return s


def _plan(spec, variant, features=("subgroup",), n=None, tunables=None):
    from onnx_quant.backend_wgpu.planner import plan_node

    if n is None:
        n = {"grid_stride_reduce": 262145, "grid_stride_reduce_vec4": 262144}.get(variant, 10000)
    info = DeviceInfo(name="test", backend="test", limits=dict(WEBGPU_DEFAULT_LIMITS), features=frozenset(features))
    tun = dict(tunables or {})
    if variant == "single_invocation":
        tun.setdefault("SERIAL_MAX_ELEMENTS", n)
    return plan_node(spec, shapes={"x": (n,), "y": (n,), "y_scale": (), "y_zero_point": ()},
                     dtypes={"x": "float32", "y": "uint8", "y_scale": "float32", "y_zero_point": "uint8"},
                     device=info, variant=variant, tunables=tun)


def _declared_bindings(source: str) -> list[tuple[int, str, str, str]]:
    found = []
    for m in re.finditer(r"@group\(0\) @binding\((\d+)\) var<([a-z_, ]+)> (\w+): ([^;]+);", source):
        found.append((int(m.group(1)), m.group(2).replace(" ", ""), m.group(3), m.group(4)))
    return found


def test_environment_is_strict_and_over_the_package():
    import jinja2

    env = environment()
    assert env.undefined is jinja2.StrictUndefined
    assert (templates_dir() / "snippets" / "numerics.wgsl.jinja").is_file()
    with pytest.raises(DeviceError, match="undefined"):
        render_string("{{ nothing_here }}")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("features", [("subgroup",), ()], ids=["subgroup", "no-subgroup"])
def test_every_pass_renders_and_declares_the_plans_bindings(spec, variant, features):
    plan = _plan(spec, variant, features)
    assert plan.variant == variant
    for p in plan.passes:
        src = render(p)
        assert src.startswith(f"// onnx-quant kernel {plan.kernel}\n")
        declared = _declared_bindings(src)
        access = {"read": "storage,read", "read_write": "storage,read_write", "uniform": "uniform"}
        expected = []
        for b in p.bindings:
            if b.access == "uniform":
                t = f"OqUniform_{b.var_name}"
            else:
                t = f"array<{b.element_type}, {b.length}>" if b.length else f"array<{b.element_type}>"
            expected.append((b.index, access[b.access], b.var_name, t))
        assert declared == expected
        uses_subgroups = "subgroupMin" in src
        reduces = p.id in ("reduce", "finalize")
        assert uses_subgroups == (reduces and "subgroup" in features), (p.id, features)
        if reduces and "subgroup" not in features:
            assert "workgroupBarrier" in src
        if p.id == "quantize" and "vec4" in variant:
            assert "array<vec4<f32>>" in src


def test_uniform_struct_declared_from_members(spec):
    plan = _plan(spec, "parallel_subgroup_reduce")
    finalize = next(p for p in plan.passes if p.id == "finalize")
    src = render(finalize)
    assert re.search(r"struct OqUniform_params \{\s*numPartials: u32,\s*\};", src)
    reduce = next(p for p in plan.passes if p.id == "reduce")
    assert re.search(r"struct OqUniform_params \{\s*count: u32,\s*\};", render(reduce))


def test_missing_context_value_is_a_clear_error(spec):
    plan = _plan(spec, "parallel_subgroup_reduce")
    reduce = next(p for p in plan.passes if p.id == "reduce")
    ctx = {k: v for k, v in reduce.context.items() if k != "elemsPerThread"}
    broken = dataclasses.replace(reduce, context=ctx)
    with pytest.raises(DeviceError, match="elemsPerThread") as e:
        render(broken)
    assert "variant parallel_subgroup_reduce" in str(e.value) and "pass reduce" in str(e.value)


def test_bindings_disagreeing_with_the_plan_are_refused(spec):
    plan = _plan(spec, "parallel_subgroup_reduce")
    reduce = next(p for p in plan.passes if p.id == "reduce")
    ctx = dict(reduce.context)
    ctx["bindings"] = [dict(b) for b in ctx["bindings"]]
    ctx["bindings"][0]["index"] = 7
    with pytest.raises(DeviceError, match="disagree"):
        render(dataclasses.replace(reduce, context=ctx))


def test_unknown_template_is_a_clear_error():
    p = PassPlan("p", "P", "no-such.wgsl.jinja", {"kernel": "K", "variant": "V", "pass_id": "p",
                                                  "bindings": [], "features": []}, (), (1, 1, 1))
    with pytest.raises(DeviceError, match="no-such.wgsl.jinja"):
        render(p)


def test_bindings_snippet_alone():
    bindings = [
        {"index": 0, "var_name": "a", "access": "read", "element_type": "vec4<f32>", "length": None, "struct": None},
        {"index": 1, "var_name": "b", "access": "read_write", "element_type": "u32", "length": 1, "struct": None},
        {"index": 2, "var_name": "params", "access": "uniform", "element_type": "Params", "length": None,
         "struct": [["count", "u32"], ["scale", "f32"]]},
    ]
    src = render_string('{% include "snippets/bindings.wgsl.jinja" %}', {"bindings": bindings})
    assert "@group(0) @binding(0) var<storage, read> a: array<vec4<f32>>;" in src
    assert "@group(0) @binding(1) var<storage, read_write> b: array<u32, 1>;" in src
    assert "@group(0) @binding(2) var<uniform> params: OqUniform_params;" in src
    assert "count: u32," in src and "scale: f32," in src
    bad = [dict(bindings[0], access="write")]
    with pytest.raises(DeviceError, match="unknown access"):
        render_string('{% include "snippets/bindings.wgsl.jinja" %}', {"bindings": bad})


def test_snippets_are_included_not_copied():
    """No WGSL function with the oq_ prefix is defined in two template files (a snippet may
    define alternatives in {% if %} branches), and the DynamicQuantizeLinear templates define
    no helper of their own: their WGSL functions all come from snippets."""
    definitions: dict[str, set[str]] = {}
    for path in sorted(templates_dir().rglob("*.wgsl.jinja")):
        for name in re.findall(r"^fn (oq_\w+)\(", path.read_text(encoding="utf-8"), flags=re.M):
            definitions.setdefault(name, set()).add(path.relative_to(templates_dir()).as_posix())
    assert {"oq_div_rn", "oq_div_refine", "oq_dql_quantize", "oq_workgroup_min_max"} <= set(definitions)
    for name, files in definitions.items():
        assert len(files) == 1, (name, files)
    for path in templates_dir().glob("dynamic-quantize-linear*.wgsl.jinja"):
        text = path.read_text(encoding="utf-8")
        assert '{% include "snippets/bindings.wgsl.jinja" %}' in text
        assert "@binding(" not in text  # bindings come only from the snippet
        assert set(re.findall(r"^fn (\w+)\(", text, flags=re.M)) == {"main"}, path.name


# ----------------------------------------------------------------------------- compile on device

def _devices():
    from support.gpu import gpu_adapters

    from onnx_quant.backend_wgpu.device import get_device

    adapters = gpu_adapters()
    devs = [get_device(None, limits="default"), get_device(None, limits="default", features=())]
    if any(a.backend == "OpenGL" for a in adapters):
        devs.append(get_device("opengl", limits="default"))
    return devs


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.gpu
def test_rendered_passes_compile(spec, variant):
    from onnx_quant.backend_wgpu.pipelines import layout_key

    for dev in _devices():
        plan = _plan(spec, variant, tuple(dev.info.features))
        for p in plan.passes:
            compiled = dev.compile(render(p), layout_key(p.bindings), kernel=plan.kernel, variant=variant, pass_id=p.id)
            assert compiled.pipeline is not None


def test_template_rendering_has_no_python_logic_leaks(spec):
    # a rendered shader is plain WGSL: no Jinja markers survive
    for variant in VARIANTS:
        for p in _plan(spec, variant).passes:
            src = render(p)
            assert "{{" not in src and "{%" not in src and "{#" not in src


def test_binding_plan_contract_fields():
    b = BindingPlan(0, "x", "x", "read", "f32")
    assert b.length is None and b.struct is None

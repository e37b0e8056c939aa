"""Rendering WGSL from the Jinja templates shipped in the ``templates`` package.

One :class:`jinja2.Environment` over the installed ``templates`` directory, with
``StrictUndefined`` so that a template naming a value the planner did not provide fails at
render time instead of producing broken WGSL. Shared snippets live in
``templates/snippets/`` and are included by the kernel templates, never copied.

The render context is the pass plan's ``context`` (see ``plan.py`` and the contract in
``docs/backend.md``); ``render`` checks that its ``bindings`` list agrees with the pass's
``BindingPlan`` tuple (index, name, access, element type), since the shader declares its
bindings from the former and the executor binds buffers from the latter.

Templates get these globals: ``oq_fail(message)`` (fail the render naming the problem),
``oq_value_lanes(value, dtype)`` (the device lanes of one value of an element type: a constant
a kernel writes, e.g. ConstantOfShape's value, EyeLike's one), ``oq_rounded(value, dtype)`` (a
Python float rounded to an element type, for plan-time arithmetic that must follow a
reference computing in that type), ``oq_saturated_words`` (``resize_taps.py``): a value as
onnx.reference's saturate_cast writes it into an element type (Resize's extrapolation value);
``oq_einsum(equation, ranks)`` (``einsum.py``): an Einsum equation's labels per input, output
and summed labels (the sizes are runtime uniforms: the spec's ``einsumMap``); ``oq_json(text)``: a JSON attribute parsed (FusedElementwise's steps).
``{{ x | u32 }}`` writes a WGSL u32 (``123u``, or the uniform read of a runtime uniform:
backend_wgpu/uniforms.py, whose guards fail a render that uses one at Jinja level);
:func:`pipeline_key` keys a pass's pipeline before rendering.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Mapping

import jinja2

from onnx_quant import cache_dir
from onnx_quant.errors import DeviceError, SpecError

from . import plan_cache, resize_taps, uniforms
from .einsum import einsum_labels
from .plan import BindingPlan, PassPlan
from .spec_loader import templates_dir


class TemplateFailure(jinja2.TemplateError):
    """Raised from inside a template through ``oq_fail(message)``."""


def _fail(message: str) -> None:
    raise TemplateFailure(message)


def _value_lanes(value: float, dtype: str) -> list[int]:
    """The u32 lanes of ``value`` stored as one element of ``dtype`` (a fill constant baked into
    a shader): one lane, zero-extended, for types up to 32 bits; two (low first) for 64-bit."""
    import numpy as np  # noqa: PLC0415

    from .packing import pack_array  # noqa: PLC0415
    from onnx_quant.dtypes import element_type  # noqa: PLC0415

    raw = bytes(pack_array(np.array([value]).astype(element_type(dtype).dtype), dtype))
    words = [int.from_bytes(raw[i:i + 4], "little") for i in range(0, len(raw), 4)]
    return words[:2] if element_type(dtype).bits == 64 else words[:1]


def _rounded(value: float, dtype: str) -> float:
    """``value`` rounded to element type ``dtype`` (numpy's conversion: nearest even), as a
    Python float: what a reference computing in that type holds."""
    import numpy as np  # noqa: PLC0415

    from .packing import etype  # noqa: PLC0415

    return float(np.array([value], np.float64).astype(etype(dtype).dtype)[0])


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Jinja's own on-disk cache of compiled templates (keyed by name and source checksum), under
    the cache root beside the plans; None where the plan cache is off or the folder cannot be made."""
    if not plan_cache.enabled():
        return None
    try:
        return jinja2.FileSystemBytecodeCache(str(cache_dir.folder("jinja")))
    except OSError:
        return None


def search_path(folder: str | None = None) -> tuple[str, ...]:
    """Where a pass's templates are looked up: a user spec folder first (its own shaders), then
    the installed templates (the snippets every shader includes)."""
    installed = str(templates_dir())
    if folder is None:
        return (installed,)
    try:
        same = Path(folder).resolve() == Path(installed).resolve()
    except OSError:
        same = False
    return (installed,) if same else (str(folder), installed)


def environment(folder: str | None = None) -> jinja2.Environment:
    """The Jinja environment over :func:`search_path` (one per search path)."""
    return _environment(search_path(folder))


@functools.lru_cache(maxsize=None)
def _environment(path: tuple[str, ...]) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(list(path)),
        bytecode_cache=_bytecode_cache(),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
    )
    env.globals["oq_fail"] = _fail
    env.globals["oq_value_lanes"] = _value_lanes
    env.globals["oq_rounded"] = _rounded
    env.globals["oq_saturated_words"] = resize_taps.saturated_words
    env.globals["oq_einsum"] = einsum_labels
    env.globals["oq_json"] = json.loads
    uniforms.install(env)
    return env


def _binding_context(b: BindingPlan) -> dict[str, Any]:
    return {
        "index": b.index,
        "var_name": b.var_name,
        "access": b.access,
        "element_type": b.element_type,
        "length": b.length,
        "struct": [list(m) for m in b.struct] if b.struct is not None else None,
    }


def _check_bindings(pass_plan: PassPlan, context: Mapping[str, Any]) -> None:
    declared = context.get("bindings")
    keys = ("index", "var_name", "access", "element_type", "length")
    got = [tuple(dict(d).get(k) for k in keys) for d in declared]
    planned = [tuple(_binding_context(b)[k] for k in keys) for b in pass_plan.bindings]
    if got != planned:
        raise DeviceError(
            f"pass {pass_plan.id}: the context's bindings disagree with the pass plan: "
            f"context {got} vs plan {planned}"
        )


def render_source(template: str, context: Mapping[str, Any], folder: str | None = None) -> str:
    """Render one template file (name relative to ``folder``, then ``templates/``) with a context."""
    env = environment(folder)
    try:
        return env.get_template(template).render(**context)
    except jinja2.TemplateNotFound as e:
        raise DeviceError(f"template {template}: not found in {' or '.join(search_path(folder))}: {e}") from None
    except jinja2.UndefinedError as e:
        raise DeviceError(f"template {template}: {e} (the plan's context does not provide it)") from None
    except jinja2.TemplateError as e:
        raise DeviceError(f"template {template}: {type(e).__name__}: {e}") from None


def render_string(text: str, context: Mapping[str, Any] | None = None) -> str:
    """Render template text (which may include snippets) with a context; for tools and tests."""
    try:
        return environment().from_string(text).render(**dict(context or {}))
    except jinja2.TemplateError as e:
        raise DeviceError(f"template text: {type(e).__name__}: {e}") from None


def _render_context(pass_plan: PassPlan) -> dict[str, Any]:
    context = dict(pass_plan.context)
    context.setdefault("bindings", [_binding_context(b) for b in pass_plan.bindings])
    context.setdefault("binding", {b["var_name"]: b for b in context["bindings"]})
    context.setdefault("pass_id", pass_plan.id)
    return context


def pipeline_key(pass_plan: PassPlan) -> tuple:
    """The pass's pipeline key, computed without rendering (``uniforms.pipeline_key``): the
    template and the values of the context names it reads, runtime uniforms by name and type only."""
    path = search_path(pass_plan.template_dir)
    env = environment(pass_plan.template_dir)
    try:
        # the on-disk reads cache keys on the template's name: a user folder's shaders are read afresh
        reads = _template_reads(pass_plan.shader) if len(path) == 1 else uniforms.template_reads(env, pass_plan.shader)
        key = uniforms.pipeline_key(env, pass_plan.shader, _render_context(pass_plan), reads)
    except jinja2.TemplateNotFound as e:
        raise SpecError(str(Path(path[0]) / pass_plan.shader), "shader",
                        f"template {e.name!r} not found in {' or '.join(path)}") from None
    except jinja2.TemplateSyntaxError as e:
        raise SpecError(str(e.filename or pass_plan.shader), "shader", f"line {e.lineno}: {e.message}") from None
    return key if len(path) == 1 else (path, *key)


_READS = plan_cache.TemplateReads()


def _template_reads(template: str) -> frozenset[str] | None:
    """What ``template`` reads: from the disk (plan_cache.TemplateReads), else found and stored."""
    known, reads = _READS.get(template)
    if not known:
        reads = uniforms.template_reads(environment(), template)
        _READS.put(template, reads)
    return reads


def render(pass_plan: PassPlan) -> str:
    """The WGSL source of one pass: its template rendered with its context."""
    context = _render_context(pass_plan)
    _check_bindings(pass_plan, context)
    try:
        return render_source(pass_plan.shader, context, pass_plan.template_dir)
    except DeviceError as e:
        kernel = context.get("kernel", "?")
        variant = context.get("variant", "?")
        raise DeviceError(f"kernel {kernel} variant {variant} pass {pass_plan.id}: {e}") from None

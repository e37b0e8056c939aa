"""Shape-polymorphic pipelines: derived values passed as runtime uniforms, and pipeline keys
computed before rendering (docs/kernel-spec.md, "Uniforms").

A spec names derived values (``"uniforms"``, per kernel or per pass) that its templates use only
as WGSL values, never at Jinja level. The planner writes them into one uniform struct per pass
(binding ``oq_dims``, written once per plan) and hands the template :class:`UniformScalar`
guards in their place (nested lists of guards for list values): a guard renders as the WGSL
expression that reads the member (``oq_dims.count``; the ``u32`` filter gives a u32 either way,
``123u`` for a plain int), and fails the render loudly (:class:`UniformMisuse`) on any Jinja-level
use (comparison, arithmetic, truth, ``range``, ``int``, ``is number``...), so a value that a
template needs as a constant cannot be declared a uniform for it.

:func:`pipeline_key` is what the pipeline cache keys on: the template, and the value of every
context name the template (and what it includes) reads, found statically with jinja2.meta;
a uniform contributes only its name, WGSL type and list structure (so the rank is in the key,
the sizes are not). A cache hit therefore skips rendering; two plans with the same key render
the same source.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping

import jinja2
import jinja2.meta

#: the WGSL variable of a pass's uniform struct of derived values
UNIFORM_VAR = "oq_dims"


class UniformMisuse(jinja2.TemplateError):
    """A template used a runtime uniform at Jinja level (as if it were a plan-time constant)."""


class UniformScalar:
    """One runtime uniform in a render context: renders as the WGSL expression that reads it;
    every Jinja-level use raises :class:`UniformMisuse`."""

    __slots__ = ("name", "member", "wgsl_type")

    def __init__(self, name: str, member: str, wgsl_type: str) -> None:
        self.name = name          # the derived value (with [i] for an element of a list)
        self.member = member      # the uniform struct's member
        self.wgsl_type = wgsl_type

    def __str__(self) -> str:
        return f"{UNIFORM_VAR}.{self.member}"

    def __repr__(self) -> str:
        return f"UniformScalar({self.name}: {self.wgsl_type})"

    def __hash__(self) -> int:
        return hash((self.member, self.wgsl_type))

    def __format__(self, spec: str) -> str:  # "%s" / "{}" write the WGSL read; "%d" and the like fail
        return str(self) if spec in ("", "s") else self.misuse()

    def misuse(self, *_args: Any, **_kw: Any) -> Any:
        raise UniformMisuse(f"{self.name} is a runtime uniform (declared in the spec's \"uniforms\"): "
                            f"the template uses it at Jinja level (a comparison, arithmetic, a test, a "
                            f"range or a conversion), which needs a plan-time constant; take it out of "
                            f"\"uniforms\" or use it only as a WGSL value")


#: every operation Jinja could apply to a plan-time number: each fails on a guard
for _dunder in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__int__",
                "__float__", "__index__", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__",
                "__rmul__", "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__",
                "__rmod__", "__pow__", "__rpow__", "__neg__", "__pos__", "__abs__", "__round__", "__len__",
                "__iter__", "__getitem__", "__contains__", "__and__", "__or__", "__lshift__", "__rshift__"):
    setattr(UniformScalar, _dunder, UniformScalar.misuse)


def _check_tests(env: jinja2.Environment) -> None:
    """Jinja's value tests (``is number``, ``is even``...) would answer a guard silently."""
    for name in ("number", "integer", "float", "even", "odd", "divisibleby", "eq", "ne", "lt", "le", "gt",
                 "ge", "boolean", "true", "false", "none", "in", "sameas"):
        test = env.tests.get(name)
        if test is None:
            continue

        def guarded(value: Any, *args: Any, _test=test) -> bool:
            for v in (value, *args):
                if isinstance(v, UniformScalar):
                    v.misuse()
            return _test(value, *args)

        env.tests[name] = guarded


def u32_filter(value: Any) -> str:
    """``{{ x | u32 }}``: a WGSL u32 expression: ``123u`` for an int, the member read for a uniform."""
    if isinstance(value, UniformScalar):
        return str(value) if value.wgsl_type == "u32" else f"u32({value})"
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UniformMisuse(f"u32 filter: {value!r} is not a non-negative int")
    return f"{value}u"


def install(env: jinja2.Environment) -> None:
    """The ``u32`` filter, the ``uniform`` test (``x is uniform``: a runtime uniform, whose code
    must be written without its value) and the guarded value tests."""
    _check_tests(env)
    env.filters["u32"] = u32_filter
    env.tests["uniform"] = lambda v: isinstance(v, UniformScalar)


# --------------------------------------------------------------------------- planning side


def _member_type(name: str, v: Any) -> str:
    if isinstance(v, bool):
        raise ValueError(f"uniform {name!r}: a bool ({v!r}) decides code; it cannot be a runtime uniform")
    if isinstance(v, int):
        return "u32" if v >= 0 else "i32"
    if isinstance(v, float) and math.isfinite(v):
        return "f32"
    raise ValueError(f"uniform {name!r}: {type(v).__name__} {v!r} is not an int, a finite float or a list of them")


def uniform_members(name: str, value: Any, members: list[tuple[str, str, Any]]) -> Any:
    """Append (member, wgsl type, value) for ``value`` (a number or nested lists of numbers) to
    ``members``; return the guard structure standing for it in the render context."""

    def walk(v: Any, label: str, member: str) -> Any:
        if isinstance(v, (list, tuple)):
            return [walk(x, f"{label}[{i}]", f"{member}_{i}") for i, x in enumerate(v)]
        wtype = _member_type(label, v)
        members.append((member, wtype, v))
        return UniformScalar(label, member, wtype)

    return walk(value, name, name)


# --------------------------------------------------------------------------- keying


def _freeze(v: Any) -> Any:
    if isinstance(v, UniformScalar):
        return ("uniform", v.member, v.wgsl_type)
    if isinstance(v, Mapping):
        return ("map", tuple(sorted((str(k), _freeze(x)) for k, x in v.items())))
    if isinstance(v, (list, tuple)):
        return ("seq", tuple(_freeze(x) for x in v))
    if isinstance(v, float):
        return ("f", repr(v))  # NaN keys equal to itself; -0.0 apart from 0.0
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, (int, str)) or v is None:
        return v
    if isinstance(v, (set, frozenset)):
        return ("set", tuple(sorted(map(repr, v))))
    return ("repr", type(v).__name__, repr(v))


@functools.lru_cache(maxsize=None)
def file_reads(env: jinja2.Environment, name: str) -> tuple[frozenset[str], tuple[str | None, ...]]:
    """One template file's own reads (undeclared names) and the templates it includes or imports
    (None for one named by a variable): parsed once per process per file, however many kernel
    templates include it."""
    source = env.loader.get_source(env, name)[0]  # type: ignore[union-attr]
    ast = env.parse(source)
    return (frozenset(jinja2.meta.find_undeclared_variables(ast)),
            tuple(jinja2.meta.find_referenced_templates(ast)))


@functools.lru_cache(maxsize=None)
def template_reads(env: jinja2.Environment, template: str) -> frozenset[str] | None:
    """The context names ``template`` and the templates it includes or imports may read (found
    statically), or None when that cannot be known (a template named by a variable)."""
    seen: set[str] = set()
    reads: set[str] = set()
    stack = [template]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        own, refs = file_reads(env, name)
        reads |= own
        for ref in refs:
            if ref is None:
                return None
            stack.append(ref)
    return frozenset(reads - set(env.globals))


def pipeline_key(env: jinja2.Environment, template: str, context: Mapping[str, Any],
                 reads: frozenset[str] | None = None) -> tuple:
    """(template, the frozen value of every context name the template reads): equal keys render
    the same source. Computed without rendering. ``reads``: the template's :func:`template_reads`
    where the caller has them (render.py keeps them on disk), else found here."""
    if reads is None:
        reads = template_reads(env, template)
    names = sorted(context) if reads is None else sorted(n for n in reads if n in context)
    return (template, tuple((n, _freeze(context[n])) for n in names))

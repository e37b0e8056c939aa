"""Loading and validating kernel specs (``templates/*.kernel.json``): a spec file becomes one
KernelSpec per schema version it serves (spec_versions.py), every field checked when loaded.

Everything that can be checked without a tensor is checked here, and a problem raises
:class:`~onnx_quant.errors.SpecError` naming the file, the field (a path such as
``variants[2].passes[0].bindings[1]``) and the reason: unknown or missing keys, wrong JSON types,
expressions that do not parse or name unknown things (including device features —
``"subgroups"`` is rejected with a hint to ``"subgroup"``), dependency cycles in ``derive``,
bindings that name nothing, a buffer bound twice in one pass, and missing shader files. Pure
Python: no wgpu.
"""

from __future__ import annotations

import importlib.resources
import json
import keyword
from pathlib import Path
from typing import Any, Iterable, Mapping

from onnx_quant.dtypes import BY_NAME as DTYPES_BY_NAME
from onnx_quant.errors import ExpressionError, SpecError

from . import spec_versions
from .expr import RESERVED_NAMES, Expr, Scope, Value, parse, suggest
from .spec_model import (
    ACCESS_BY_BUFFER, CONTEXT_KEYS, DEFAULT_DOMAIN, AttributeDecl, BindingDecl, Derive, IndexCheck, Intermediate,
    KernelSpec, LoopCheck,
    Pass, PassBinding, StructMember, TensorDecl, Tunable, Variant, wgsl_type_layout,
)


# --------------------------------------------------------------------------- loading

_TOP_KEYS = {"domain", "name", "sinceVersion", "untilVersion", "inputs", "outputs", "typeConstraints",
             "tunables", "derive", "bindings", "variants", "description", "attributes", "uniforms",
             "indexChecks", "loopChecks"}
_TOP_REQUIRED = {"name", "sinceVersion", "inputs", "outputs", "typeConstraints", "variants"}
_IO_KEYS = {"dtype", "rank", "shape", "optional", "constant"}
_ATTRIBUTE_KEYS = {"default", "required", "description", "fixed"}
_TUNABLE_KEYS = {"default", "description", "tune"}
_BINDING_KEYS = {"name", "elementType", "length", "buffer", "struct"}
_MEMBER_KEYS = {"name", "type", "value"}
_VARIANT_KEYS = {"id", "priority", "when", "derive", "intermediates", "passes", "description"}
_INTERMEDIATE_KEYS = {"id", "dtype", "shape", "data"}
_PASS_KEYS = {"id", "name", "shader", "derive", "bindings", "dispatch", "description", "uniforms"}
_ARG_KEYS = {"arg", "elementType", "length", "buffer"}
_INLINE_STRUCT_KEYS = {"name", "struct", "buffer"}
_DISPATCH_KEYS = ("x", "y", "z")


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def _is_ident(s: Any) -> bool:
    return isinstance(s, str) and s.isidentifier() and not keyword.iskeyword(s)


class _Loader:
    def __init__(self, path: Path, *, label: str | None = None) -> None:
        self.path = path
        self.file = label or str(path)  # what errors name: the file, or a table entry in it
        self.dir = path.parent
        self.used_bindings: set[str] = set()

    # -- small helpers
    def err(self, field: str, reason: str) -> SpecError:
        return SpecError(self.file, field or "<top>", reason)

    def obj(self, v: Any, fld: str, allowed: set[str], required: Iterable[str] = ()) -> dict:
        if not isinstance(v, dict):
            raise self.err(fld, f"expected an object, found {_json_type(v)}")
        for k in v:
            if k not in allowed:
                raise self.err(f"{fld}.{k}" if fld else k,
                               f"unknown key {k!r}{suggest(k, allowed)}; allowed: {', '.join(sorted(allowed))}")
        for k in sorted(required):
            if k not in v:
                raise self.err(fld, f"missing required key {k!r}")
        return v

    def string(self, v: Any, fld: str, *, nonempty: bool = True) -> str:
        if not isinstance(v, str):
            raise self.err(fld, f"expected a string, found {_json_type(v)}")
        if nonempty and not v.strip():
            raise self.err(fld, "must not be empty")
        return v

    def ident(self, v: Any, fld: str, what: str) -> str:
        self.string(v, fld)
        if not _is_ident(v):
            raise self.err(fld, f"{what} {v!r} is not an identifier (letters, digits, '_', not a keyword)")
        return v

    def integer(self, v: Any, fld: str, *, minimum: int | None = None) -> int:
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.err(fld, f"expected an integer, found {_json_type(v)}")
        if minimum is not None and v < minimum:
            raise self.err(fld, f"must be >= {minimum}, found {v}")
        return v

    def array(self, v: Any, fld: str, *, nonempty: bool = False) -> list:
        if not isinstance(v, list):
            raise self.err(fld, f"expected an array, found {_json_type(v)}")
        if nonempty and not v:
            raise self.err(fld, "must not be empty")
        return v

    def expr(self, v: Any, fld: str, scope: Scope | None) -> Expr:
        if not isinstance(v, str):
            raise self.err(fld, f"expected an expression string, found {_json_type(v)}")
        try:
            e = parse(v)  # one parsed Expr per distinct text (10,667 expressions, 1,282 texts)
            if scope is not None:
                e.check(scope)
        except ExpressionError as ex:
            raise self.err(fld, str(ex)) from None
        return e

    def value(self, v: Any, fld: str, scope: Scope | None, *, literals=(bool, int, float)) -> Value:
        """A JSON literal or an expression string."""
        if isinstance(v, str):
            return self.expr(v, fld, scope)
        if isinstance(v, bool) and bool not in literals:
            pass
        elif isinstance(v, literals) and v is not None:
            if isinstance(v, float) and v != v:  # pragma: no cover - NaN rejected by the parser
                raise self.err(fld, "NaN is not allowed")
            return v
        kinds = " or ".join(sorted({_json_type(t()) for t in literals} | {"string"}))
        raise self.err(fld, f"expected {kinds}, found {_json_type(v)}")

    def check_value(self, v: Value, fld: str, scope: Scope) -> None:
        if isinstance(v, Expr):
            try:
                v.check(scope)
            except ExpressionError as ex:
                raise self.err(fld, str(ex)) from None
        elif isinstance(v, tuple):
            for i, x in enumerate(v):
                self.check_value(x, f"{fld}[{i}]", scope)

    def shape_value(self, v: Any, fld: str, scope: Scope) -> Expr | tuple[Value, ...]:
        if isinstance(v, list):
            out = []
            for i, d in enumerate(v):
                if isinstance(d, str):
                    out.append(self.expr(d, f"{fld}[{i}]", scope))
                else:
                    out.append(self.integer(d, f"{fld}[{i}]", minimum=0))
            return tuple(out)
        if isinstance(v, str):
            return self.expr(v, fld, scope)
        raise self.err(fld, f"expected an array or an expression string, found {_json_type(v)}")

    # -- derive blocks
    def derive(self, v: Any, fld: str, scope: Scope, outer: Mapping[str, str]) -> Derive:
        """Parse a derive object; ``outer`` maps names visible from enclosing blocks to
        where they are defined (no shadowing). Returns items in dependency order."""
        if not isinstance(v, dict):
            raise self.err(fld, f"expected an object, found {_json_type(v)}")
        values: dict[str, Value] = {}
        for name, raw in v.items():
            nf = f"{fld}.{name}"
            if not _is_ident(name):
                raise self.err(nf, f"derived name {name!r} is not an identifier")
            if name in RESERVED_NAMES or name in CONTEXT_KEYS:
                raise self.err(nf, f"{name!r} is reserved (expression names: {', '.join(sorted(RESERVED_NAMES))}; "
                                   f"template context keys: {', '.join(sorted(CONTEXT_KEYS))})")
            if name in outer:
                raise self.err(nf, f"{name!r} is already defined in {outer[name]}; derived names may not be redefined")
            values[name] = self.value(raw, nf, None)
        order = self.toposort(values, fld)
        inner = scope.with_names(values)
        for name in order:
            self.check_value(values[name], f"{fld}.{name}", inner)
        return Derive(tuple((n, values[n]) for n in order))

    def toposort(self, values: Mapping[str, Value], fld: str) -> list[str]:
        names = set(values)
        deps = {n: (v.free_names & names) if isinstance(v, Expr) else set() for n, v in values.items()}
        done: list[str] = []
        placed: set[str] = set()
        pending = list(values)
        while pending:
            for n in pending:
                if deps[n] <= placed:
                    done.append(n)
                    placed.add(n)
                    pending.remove(n)
                    break
            else:
                cycle = self.find_cycle({n: deps[n] - placed for n in pending})
                raise self.err(f"{fld}.{cycle[0]}", "dependency cycle: " + " -> ".join(cycle))
        return done

    @staticmethod
    def find_cycle(deps: Mapping[str, set[str]]) -> list[str]:
        start = next(iter(deps))
        path = [start]
        seen = {start: 0}
        node = start
        while True:
            node = sorted(deps[node])[0]
            if node in seen:
                return path[seen[node]:] + [node]
            seen[node] = len(path)
            path.append(node)

    # -- the whole file
    def load(self) -> KernelSpec:
        return self.spec(self.resolve(self.path, ()))

    def load_raw(self, raw: Any) -> KernelSpec:
        """The spec of the file's already-read JSON ``raw``."""
        return self.spec(self.resolve(self.path, (), raw))

    def read_json(self, path: Path) -> Any:
        """The parsed JSON of ``path``; its problems are SpecErrors naming that file."""
        file = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise SpecError(file, "<file>", "no such file") from None
        except (OSError, UnicodeDecodeError) as e:
            raise SpecError(file, "<file>", f"cannot read: {e}") from None
        try:
            return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
        except json.JSONDecodeError as e:
            raise SpecError(file, f"line {e.lineno} column {e.colno}", f"invalid JSON: {e.msg}") from None
        except _DuplicateKey as e:
            raise SpecError(file, "<json>", f"duplicate key {e.args[0]!r} in an object") from None
        except (ValueError, RecursionError) as e:
            raise SpecError(file, "<json>", f"invalid JSON: {e}") from None

    def resolve(self, path: Path, chain: tuple[Path, ...], raw: Any = None) -> Any:
        """``path``'s JSON (or ``raw``, a document standing for it) with its ``extends`` base (a
        ``*.base.json`` beside it, which may extend another) merged under it: objects merge key
        by key, recursively; any other value (arrays included) replaces the base's; then the
        document's ``passShaders`` replace the shader of the passes they name."""
        raw = self.read_json(path) if raw is None else raw
        file = self.file if path == self.path else str(path)
        shaders = raw.pop("passShaders", None) if isinstance(raw, dict) else None
        if isinstance(raw, dict) and "extends" in raw:
            raw = self.merge_base(path, chain, raw, file)
        return raw if shaders is None else self.override_shaders(raw, shaders, file)

    def override_shaders(self, doc: dict, shaders: Any, file: str) -> dict:
        """``doc`` with every pass whose id ``shaders`` names running that shader instead."""
        if not isinstance(shaders, dict) or not all(isinstance(v, str) and v for v in shaders.values()):
            raise SpecError(file, "passShaders", f"expected an object pass id -> shader file, found "
                                                 f"{_json_type(shaders)}")
        found: set[str] = set()
        variants = []
        for v in doc.get("variants", ()):
            if isinstance(v, dict) and isinstance(v.get("passes"), list):
                passes = []
                for p in v["passes"]:
                    if isinstance(p, dict) and p.get("id") in shaders:
                        found.add(p["id"])
                        p = {**p, "shader": shaders[p["id"]]}
                    passes.append(p)
                v = {**v, "passes": passes}
            variants.append(v)
        missing = sorted(set(shaders) - found)
        if missing:
            raise SpecError(file, "passShaders", f"no pass with id {', '.join(map(repr, missing))} in any variant")
        return {**doc, "variants": variants}

    def merge_base(self, path: Path, chain: tuple[Path, ...], raw: dict, file: str) -> dict:
        base_name = raw.pop("extends")
        if not isinstance(base_name, str) or not base_name:
            raise SpecError(file, "extends", f"expected the file name of a base spec, found {_json_type(base_name)}")
        bp = Path(base_name)
        if bp.is_absolute() or ".." in bp.parts or "\\" in base_name or len(bp.parts) != 1 \
                or not base_name.endswith(".base.json"):
            raise SpecError(file, "extends", f"{base_name!r} must name a *.base.json file in the same folder")
        base_path = path.parent / bp
        if base_path in chain or base_path == path:
            cycle = " -> ".join(p.name for p in (*chain, path, base_path))
            raise SpecError(file, "extends", f"bases extend each other in a cycle: {cycle}")
        if not base_path.is_file():
            raise SpecError(file, "extends", f"base spec {base_name!r} not found in {path.parent}")
        base = self.resolve(base_path, (*chain, path))
        if not isinstance(base, dict):
            raise SpecError(str(base_path), "<top>", f"expected an object, found {_json_type(base)}")
        return spec_versions.merged(base, raw)

    def spec(self, raw: Any) -> KernelSpec:
        top = self.obj(raw, "", _TOP_KEYS, _TOP_REQUIRED)
        domain = DEFAULT_DOMAIN
        if "domain" in top:
            domain = self.string(top["domain"], "domain", nonempty=False) or DEFAULT_DOMAIN
        name = self.string(top["name"], "name")
        since = self.integer(top["sinceVersion"], "sinceVersion", minimum=1)
        until = None
        if "untilVersion" in top:
            until = self.integer(top["untilVersion"], "untilVersion", minimum=since)
        description = self.string(top.get("description", ""), "description", nonempty=False)

        # typeConstraints
        tc_raw = top["typeConstraints"]
        if not isinstance(tc_raw, dict):
            raise self.err("typeConstraints", f"expected an object, found {_json_type(tc_raw)}")
        constraints: dict[str, tuple[str, ...]] = {}
        for cname, types in tc_raw.items():
            f = f"typeConstraints.{cname}"
            if not cname.strip():
                raise self.err(f, "a type constraint needs a name")
            lst = self.array(types, f, nonempty=True)
            seen: list[str] = []
            for i, t in enumerate(lst):
                self.string(t, f"{f}[{i}]")
                if t not in DTYPES_BY_NAME:
                    raise self.err(f"{f}[{i}]", f"unknown element type {t!r}{suggest(t, DTYPES_BY_NAME)}")
                if t in seen:
                    raise self.err(f"{f}[{i}]", f"{t!r} listed twice")
                seen.append(t)
            constraints[cname] = tuple(seen)

        # inputs / outputs (names first, shapes checked once derive is known)
        io_raw: dict[str, tuple[str, dict]] = {}
        for section in ("inputs", "outputs"):
            sec = top[section]
            if not isinstance(sec, dict):
                raise self.err(section, f"expected an object, found {_json_type(sec)}")
            if section == "outputs" and not sec:
                raise self.err(section, "a kernel needs at least one output")
            for ioname, decl in sec.items():
                f = f"{section}.{ioname}"
                if not _is_ident(ioname):
                    raise self.err(f, f"{section[:-1]} name {ioname!r} is not an identifier")
                if ioname in io_raw:
                    raise self.err(f, f"{ioname!r} is both an input and an output")
                d = self.obj(decl, f, _IO_KEYS, {"dtype"})
                for flag in ("optional", "constant"):
                    if flag in d and not isinstance(d[flag], bool):
                        raise self.err(f"{f}.{flag}", f"expected a boolean, found {_json_type(d[flag])}")
                if d.get("constant") and section != "inputs":
                    raise self.err(f"{f}.constant", "only an input can be read when the node is planned")
                dt = self.string(d["dtype"], f"{f}.dtype")
                if dt not in constraints:
                    raise self.err(f"{f}.dtype", f"{dt!r} is not a typeConstraints name{suggest(dt, constraints)}; "
                                                 f"declared: {', '.join(constraints) or 'none'}")
                io_raw[ioname] = (section, d)
        io_names = frozenset(io_raw)

        # tunables
        tunables: dict[str, Tunable] = {}
        tun_raw = top.get("tunables", {})
        if not isinstance(tun_raw, dict):
            raise self.err("tunables", f"expected an object, found {_json_type(tun_raw)}")
        for tname, tdecl in tun_raw.items():
            f = f"tunables.{tname}"
            if not _is_ident(tname):
                raise self.err(f, f"tunable name {tname!r} is not an identifier")
            d = self.obj(tdecl, f, _TUNABLE_KEYS, {"default"})
            tune = tuple(self.integer(v, f"{f}.tune[{i}]", minimum=1)
                         for i, v in enumerate(self.array(d.get("tune", []), f"{f}.tune")))
            tunables[tname] = Tunable(tname, self.integer(d["default"], f"{f}.default"),
                                      self.string(d.get("description", ""), f"{f}.description", nonempty=False),
                                      tune)

        attributes = self.attributes(top.get("attributes", {}))
        constants = frozenset(n for n, (section, d) in io_raw.items() if d.get("constant"))
        base = Scope(io=io_names, tunables=frozenset(tunables), attributes=frozenset(attributes),
                     constants=constants)
        top_derive = self.derive(top.get("derive", {}), "derive", base, {})
        top_scope = base.with_names(top_derive.names)
        defined_at = {n: "derive" for n in top_derive.names}

        inputs: dict[str, TensorDecl] = {}
        outputs: dict[str, TensorDecl] = {}
        for ioname, (section, d) in io_raw.items():
            f = f"{section}.{ioname}"
            rank = None
            if "rank" in d:
                rank = self.value(d["rank"], f"{f}.rank", top_scope, literals=(int,))
                if isinstance(rank, int) and rank < 0:
                    raise self.err(f"{f}.rank", f"must be >= 0, found {rank}")
            shape = self.shape_value(d["shape"], f"{f}.shape", top_scope) if "shape" in d else None
            target = inputs if section == "inputs" else outputs
            target[ioname] = TensorDecl(ioname, d["dtype"], len(target), rank, shape, bool(d.get("optional", False)),
                                        bool(d.get("constant", False)))

        # top-level bindings
        bindings: dict[str, BindingDecl] = {}
        b_raw = top.get("bindings", {})
        if not isinstance(b_raw, dict):
            raise self.err("bindings", f"expected an object, found {_json_type(b_raw)}")
        for key, decl in b_raw.items():
            bindings[key] = self.binding_decl(key, decl, f"bindings.{key}")

        # variants
        v_raw = self.array(top["variants"], "variants", nonempty=True)
        variants: list[Variant] = []
        seen_ids: dict[str, int] = {}
        for vi, vdecl in enumerate(v_raw):
            variant = self.variant(vi, vdecl, top_scope, defined_at, io_raw, bindings, constraints)
            if variant.id in seen_ids:
                raise self.err(f"variants[{vi}].id", f"duplicate variant id {variant.id!r} "
                                                     f"(also variants[{seen_ids[variant.id]}])")
            seen_ids[variant.id] = vi
            variants.append(variant)

        # expressions of top-level bindings no pass uses: check against the top-level scope
        for key, decl in bindings.items():
            if key in self.used_bindings:
                continue
            for mi, m in enumerate(decl.struct or ()):
                self.check_value(m.value, f"bindings.{key}.struct[{mi}].value", top_scope)
            if decl.length is not None:
                self.check_value(decl.length, f"bindings.{key}.length", top_scope)

        return KernelSpec(
            domain=domain, name=name, since_version=since, inputs=inputs, outputs=outputs,
            type_constraints=constraints, tunables=tunables, derive=top_derive, bindings=bindings,
            variants=tuple(variants), path=self.file, directory=str(self.dir), description=description,
            attributes=attributes, until_version=until,
            uniforms=self.uniform_names(top.get("uniforms", []), "uniforms"),
            index_checks=self.index_checks(top.get("indexChecks", {}), inputs, top_scope),
            loop_checks=self.loop_checks(top.get("loopChecks", {}), inputs, top_scope),
        )

    def index_checks(self, v: Any, inputs: Mapping[str, Any], scope: Scope) -> tuple[IndexCheck, ...]:
        """``indexChecks``: input -> {bounds, fromZero, ignore} (docs/kernel-spec.md)."""
        d = self.obj(v, "indexChecks", set(inputs))
        out = []
        for name, decl in d.items():
            f = f"indexChecks.{name}"
            c = self.obj(decl, f, {"bounds", "fromZero", "ignore"}, {"bounds"})
            from_zero = c.get("fromZero", False)
            if not isinstance(from_zero, bool):
                raise self.err(f"{f}.fromZero", f"expected true or false, found {_json_type(from_zero)}")
            ignore = self.expr(c["ignore"], f"{f}.ignore", scope) if "ignore" in c else None
            out.append(IndexCheck(name, self.expr(c["bounds"], f"{f}.bounds", scope), from_zero, ignore))
        return tuple(out)

    def loop_checks(self, v: Any, inputs: Mapping[str, Any], scope: Scope) -> tuple[LoopCheck, ...]:
        """``loopChecks``: input -> {bound, when, item} (docs/kernel-spec.md)."""
        out = []
        for name, decl in self.obj(v, "loopChecks", set(inputs)).items():
            f = f"loopChecks.{name}"
            c = self.obj(decl, f, {"bound", "when", "item"}, {"bound"})
            item = self.string(c.get("item", "row"), f"{f}.item")
            when = self.expr(c["when"], f"{f}.when", scope) if "when" in c else None
            out.append(LoopCheck(name, self.expr(c["bound"], f"{f}.bound", scope), when, item))
        return tuple(out)

    def attribute_default(self, v: Any, fld: str) -> Any:
        """A JSON attribute default: int, float, string or a non-empty-or-empty list of numbers."""
        if isinstance(v, bool):
            raise self.err(fld, "booleans are not ONNX attribute values; use 0 or 1")
        if isinstance(v, (int, float, str)):
            return v
        if isinstance(v, list):
            for i, x in enumerate(v):
                if isinstance(x, bool) or not isinstance(x, (int, float)):
                    raise self.err(f"{fld}[{i}]", f"a list default holds numbers, found {_json_type(x)}")
            return tuple(v)
        raise self.err(fld, f"expected a number, string or array of numbers, found {_json_type(v)}")

    def attributes(self, raw: Any) -> dict[str, AttributeDecl]:
        if not isinstance(raw, dict):
            raise self.err("attributes", f"expected an object, found {_json_type(raw)}")
        out: dict[str, AttributeDecl] = {}
        for aname, decl in raw.items():
            f = f"attributes.{aname}"
            if not _is_ident(aname):
                raise self.err(f, f"attribute name {aname!r} is not an identifier")
            d = self.obj(decl, f, _ATTRIBUTE_KEYS)
            required = d.get("required", False)
            if not isinstance(required, bool):
                raise self.err(f"{f}.required", f"expected a boolean, found {_json_type(required)}")
            if required and "default" in d:
                raise self.err(f, "a required attribute has no 'default'")
            if not required and "default" not in d:
                raise self.err(f, "missing required key 'default' (or mark the attribute \"required\": true)")
            default = self.attribute_default(d["default"], f"{f}.default") if "default" in d else None
            fixed = d.get("fixed", False)
            if not isinstance(fixed, bool):
                raise self.err(f"{f}.fixed", f"expected a boolean, found {_json_type(fixed)}")
            if fixed and required:
                raise self.err(f, "a fixed attribute has a 'default' (the value the kernel reads)")
            out[aname] = AttributeDecl(aname, default, required,
                                       self.string(d.get("description", ""), f"{f}.description", nonempty=False),
                                       fixed)
        return out

    def element_type(self, v: Any, fld: str) -> str:
        self.string(v, fld)
        if v.startswith("$"):
            if not _is_ident(v[1:]):
                raise self.err(fld, f"{v!r}: '$' must be followed by a derived name")
            return v
        if wgsl_type_layout(v, storage=True) is None:
            raise self.err(fld, f"{v!r} is not a WGSL storage element type (f32, i32, u32, f16, vecN<T>, "
                                f"vec4f..., atomic<u32>, atomic<i32>) nor '$derivedName'")
        return v

    def struct_members(self, v: Any, fld: str) -> tuple[StructMember, ...]:
        lst = self.array(v, fld, nonempty=True)
        members: list[StructMember] = []
        names: set[str] = set()
        for i, m in enumerate(lst):
            f = f"{fld}[{i}]"
            d = self.obj(m, f, _MEMBER_KEYS, _MEMBER_KEYS)
            mname = self.ident(d["name"], f"{f}.name", "struct member name")
            if mname in names:
                raise self.err(f"{f}.name", f"duplicate struct member {mname!r}")
            names.add(mname)
            mtype = self.string(d["type"], f"{f}.type")
            if wgsl_type_layout(mtype) is None:
                raise self.err(f"{f}.type", f"{mtype!r} is not a uniform member type (f32, i32, u32, f16, vecN<T>)")
            members.append(StructMember(mname, mtype, self.value(d["value"], f"{f}.value", None)))
        return tuple(members)

    def binding_decl(self, key: str, decl: Any, fld: str) -> BindingDecl:
        d = self.obj(decl, fld, _BINDING_KEYS)
        name = self.ident(d.get("name", key), f"{fld}.name" if "name" in d else fld, "binding name")
        buffer = None
        if "buffer" in d:
            buffer = self.string(d["buffer"], f"{fld}.buffer")
            if buffer not in ACCESS_BY_BUFFER:
                raise self.err(f"{fld}.buffer", f"{buffer!r} is not one of {', '.join(ACCESS_BY_BUFFER)}"
                                                f"{suggest(buffer, ACCESS_BY_BUFFER)}")
        if "struct" in d:
            for k in ("elementType", "length"):
                if k in d:
                    raise self.err(f"{fld}.{k}", f"a struct binding takes no {k!r}")
            if buffer not in (None, "uniform"):
                raise self.err(f"{fld}.buffer", "a struct binding is a uniform buffer")
            return BindingDecl(key, name, None, None, "uniform", self.struct_members(d["struct"], f"{fld}.struct"))
        if buffer == "uniform":
            raise self.err(f"{fld}.buffer", "a 'uniform' binding needs a 'struct'")
        et = self.element_type(d["elementType"], f"{fld}.elementType") if "elementType" in d else None
        length = None
        if "length" in d:
            length = self.value(d["length"], f"{fld}.length", None, literals=(int,))
            if isinstance(length, int) and length < 1:
                raise self.err(f"{fld}.length", f"must be >= 1, found {length}")
        return BindingDecl(key, name, et, length, buffer, None)

    def variant(self, vi: int, decl: Any, top_scope: Scope, defined_at: Mapping[str, str],
                io_raw: Mapping[str, tuple[str, dict]], bindings: Mapping[str, BindingDecl],
                constraints: Mapping[str, tuple[str, ...]]) -> Variant:
        fld = f"variants[{vi}]"
        d = self.obj(decl, fld, _VARIANT_KEYS, {"id", "passes"})
        vid = self.ident(d["id"], f"{fld}.id", "variant id")
        priority = self.integer(d["priority"], f"{fld}.priority") if "priority" in d else None
        when = tuple(self.expr(c, f"{fld}.when[{i}]", top_scope)
                     for i, c in enumerate(self.array(d.get("when", []), f"{fld}.when")))
        vderive = self.derive(d.get("derive", {}), f"{fld}.derive", top_scope, defined_at)
        vscope = top_scope.with_names(vderive.names)
        v_defined = {**defined_at, **{n: f"{fld}.derive" for n in vderive.names}}

        intermediates: list[Intermediate] = []
        inter_roles: dict[str, str] = {}
        for ii, idecl in enumerate(self.array(d.get("intermediates", []), f"{fld}.intermediates")):
            f = f"{fld}.intermediates[{ii}]"
            idd = self.obj(idecl, f, _INTERMEDIATE_KEYS, _INTERMEDIATE_KEYS - {"data"})
            iid = self.ident(idd["id"], f"{f}.id", "intermediate id")
            if iid in io_raw:
                raise self.err(f"{f}.id", f"{iid!r} is already an input/output name")
            if iid in inter_roles:
                raise self.err(f"{f}.id", f"duplicate intermediate id {iid!r}")
            dt = self.string(idd["dtype"], f"{f}.dtype")
            if dt not in DTYPES_BY_NAME and dt not in constraints:
                raise self.err(f"{f}.dtype", f"{dt!r} is neither an element type nor a typeConstraints name"
                                             f"{suggest(dt, list(DTYPES_BY_NAME) + list(constraints))}")
            data = self.expr(idd["data"], f"{f}.data", vscope) if "data" in idd else None
            intermediates.append(Intermediate(iid, dt, self.shape_value(idd["shape"], f"{f}.shape", vscope), data))
            inter_roles[iid] = "intermediate"

        roles = {n: ("input" if s == "inputs" else "output") for n, (s, _) in io_raw.items()}
        roles.update(inter_roles)

        passes: list[Pass] = []
        seen: dict[str, int] = {}
        for pi, pdecl in enumerate(self.array(d["passes"], f"{fld}.passes", nonempty=True)):
            p = self.pass_(f"{fld}.passes[{pi}]", pdecl, vscope, v_defined, roles, bindings)
            if p.id in seen:
                raise self.err(f"{fld}.passes[{pi}].id", f"duplicate pass id {p.id!r} in variant {vid!r}")
            seen[p.id] = pi
            passes.append(p)
        return Variant(vid, vi, priority, when, vderive, tuple(intermediates), tuple(passes),
                       self.string(d.get("description", ""), f"{fld}.description", nonempty=False))

    def pass_(self, fld: str, decl: Any, vscope: Scope, v_defined: Mapping[str, str],
              roles: Mapping[str, str], bindings: Mapping[str, BindingDecl]) -> Pass:
        d = self.obj(decl, fld, _PASS_KEYS, {"id", "shader", "bindings", "dispatch"})
        pid = self.ident(d["id"], f"{fld}.id", "pass id")
        shader = self.string(d["shader"], f"{fld}.shader")
        sp = Path(shader)
        if sp.is_absolute() or ".." in sp.parts or "\\" in shader:
            raise self.err(f"{fld}.shader", f"{shader!r} must be a relative path inside the templates folder")
        folders = list(dict.fromkeys([self.dir, templates_dir()]))  # the spec's folder, then the installed one
        try:
            exists = any((d / sp).is_file() for d in folders)
        except (OSError, ValueError) as e:
            raise self.err(f"{fld}.shader", f"unusable shader path: {e.__class__.__name__}") from None
        if not exists:
            raise self.err(f"{fld}.shader", f"shader file {shader!r} not found in {' or '.join(map(str, folders))}")
        pname = self.string(d["name"], f"{fld}.name") if "name" in d else pid
        pderive = self.derive(d.get("derive", {}), f"{fld}.derive", vscope, v_defined)
        pscope = vscope.with_names(pderive.names)

        entries = self.array(d["bindings"], f"{fld}.bindings")
        resolved: list[PassBinding] = []
        by_resource: dict[str, int] = {}
        by_var: dict[str, int] = {}
        for bi, entry in enumerate(entries):
            bf = f"{fld}.bindings[{bi}]"
            b = self.pass_binding(bi, entry, bf, pid, pscope, roles, bindings)
            res_key = f"uniform:{b.var_name}" if b.role == "uniform" else b.resource
            if res_key in by_resource:
                other = resolved[by_resource[res_key]]
                raise self.err(bf, f"{b.resource!r} is already bound at binding {other.index} "
                                   f"({other.access}) of this pass; a buffer may be bound once per pass "
                                   f"(wgpu rejects a buffer bound twice, or read and read_write, in one dispatch)")
            if b.var_name in by_var:
                raise self.err(bf, f"WGSL variable {b.var_name!r} is already declared by binding {by_var[b.var_name]}")
            by_resource[res_key] = bi
            by_var[b.var_name] = bi
            resolved.append(b)

        disp = self.obj(d["dispatch"], f"{fld}.dispatch", set(_DISPATCH_KEYS), {"x"})
        dispatch: list[Value] = []
        for axis in _DISPATCH_KEYS:
            raw = disp.get(axis, 1)
            f = f"{fld}.dispatch.{axis}"
            if isinstance(raw, str):
                dispatch.append(self.expr(raw, f, pscope))
            else:
                dispatch.append(self.integer(raw, f, minimum=0))
        return Pass(pid, pname, shader, pderive, tuple(resolved), tuple(dispatch),  # type: ignore[arg-type]
                    self.string(d.get("description", ""), f"{fld}.description", nonempty=False),
                    self.uniform_names(d.get("uniforms", []), f"{fld}.uniforms"))

    def uniform_names(self, v: Any, fld: str) -> tuple[str, ...]:
        """A ``uniforms`` list: derived names (checked against the derived values when planned)."""
        names = self.array(v, fld)
        out = tuple(self.ident(n, f"{fld}[{i}]", "derived value") for i, n in enumerate(names))
        if len(set(out)) != len(out):
            raise self.err(fld, "a name is listed twice")
        return out

    def pass_binding(self, index: int, entry: Any, fld: str, pass_id: str, scope: Scope,
                     roles: Mapping[str, str], bindings: Mapping[str, BindingDecl]) -> PassBinding:
        if isinstance(entry, str):
            if entry in bindings:
                self.used_bindings.add(entry)
                decl = bindings[entry]
                src = f"bindings.{entry}"
                ref = entry
            elif entry in roles:
                decl = BindingDecl(entry, entry)
                src = fld
                ref = entry
            else:
                known = list(bindings) + list(roles)
                raise self.err(fld, f"unknown binding {entry!r}{suggest(entry, known)}: not a key of the top-level "
                                    f"'bindings' nor an input, output or intermediate of this variant")
        elif isinstance(entry, dict):
            if "arg" in entry:
                d = self.obj(entry, fld, _ARG_KEYS)
                arg = self.string(d["arg"], f"{fld}.arg")
                if arg not in roles:
                    raise self.err(f"{fld}.arg", f"{arg!r} is not an input, output or intermediate of this variant"
                                                 f"{suggest(arg, roles)}")
                decl = self.binding_decl(arg, {k: v for k, v in d.items() if k != "arg"}, fld)
                src = fld
                ref = f"arg:{arg}"
            elif "struct" in entry:
                d = self.obj(entry, fld, _INLINE_STRUCT_KEYS, {"name", "struct"})
                decl = self.binding_decl(str(d.get("name")), d, fld)
                src = fld
                ref = f"struct:{decl.name}"
            else:
                raise self.err(fld, "an inline binding needs 'arg' (an input, output or intermediate) "
                                    "or 'name' and 'struct' (a uniform)")
        else:
            raise self.err(fld, f"expected a binding name or an object, found {_json_type(entry)}")

        if decl.struct is not None:
            for mi, m in enumerate(decl.struct):
                if isinstance(m.value, Expr):
                    try:
                        m.value.check(scope)
                    except ExpressionError as ex:
                        used = "" if src == fld else f" (as used by {fld})"
                        raise self.err(f"{src}.struct[{mi}].value", f"{ex}{used}") from None
            return PassBinding(index, ref, decl.name, decl.name, "uniform", "uniform", None, None, decl.struct, fld)

        resource = decl.name
        if resource not in roles:
            raise self.err(fld, f"binding {ref!r} refers to {resource!r}, which is not an input, output or "
                                f"intermediate of this variant{suggest(resource, roles)}")
        role = roles[resource]
        if decl.buffer is not None:
            access = ACCESS_BY_BUFFER[decl.buffer]
        else:
            access = "read" if role == "input" else "read_write"
        if role == "input" and access == "read_write":
            raise self.err(fld, f"input {resource!r} cannot be bound as writable storage (inputs are read-only)")
        if decl.element_type is not None and decl.element_type.startswith("$"):
            dname = decl.element_type[1:]
            if dname not in scope.names:
                where = f"{src}.elementType"
                raise self.err(fld, f"{where} is {decl.element_type!r}, but {dname!r} is not a derived name "
                                    f"defined for this pass{suggest(dname, scope.names)}")
        if isinstance(decl.length, Expr):
            try:
                decl.length.check(scope)
            except ExpressionError as ex:
                used = "" if src == fld else f" (as used by {fld})"
                raise self.err(f"{src}.length", f"{ex}{used}") from None
        return PassBinding(index, ref, resource, resource, role, access, decl.element_type, decl.length, None, fld)


def load_spec_file(path: str | Path) -> list[KernelSpec]:
    """Load and validate one ``*.kernel.json``: its one spec, or, for a file that states ``since``,
    one per schema version of its operator whose generated document changes
    (backend_wgpu/spec_versions.py), oldest first. Raises SpecError(file, field, reason); the
    errors of a generated spec name ``<file name>[<Op>-<version>]``."""
    path = Path(path)
    raw = _Loader(path).read_json(path)
    if not (isinstance(raw, dict) and any(k in raw for k in spec_versions.VERSION_KEYS)):
        return [_Loader(path).load_raw(raw)]
    docs = spec_versions.expand(raw, str(path), lambda doc: _Loader(path).resolve(path, (), doc))
    return [_Loader(path, label=label).spec(doc) for label, doc in docs]


def load_spec(path: str | Path, *, version: int | None = None) -> KernelSpec:
    """Load and validate one ``*.kernel.json`` and return one spec: a file that generates several
    gives the one serving opset ``version`` (default: its newest). Raises SpecError(file, field,
    reason), and KeyError for a ``version`` the file does not serve."""
    specs = load_spec_file(path)
    if version is None:
        return specs[-1]
    found = next((s for s in reversed(specs) if s.since_version <= version), None)  # as SpecRegistry.find
    if found is not None and found.until_version is not None and version > found.until_version:
        found = None
    if found is None:
        raise KeyError(f"{path}: no spec for opset {version}")
    return found


def load_spec_document(doc: Mapping[str, Any], path: str | Path, label: str) -> KernelSpec:
    """Validate a spec document that a table generated (``extends`` resolved beside ``path``);
    errors name ``label`` (e.g. ``elementwise.ops.json[Abs-6]``) as the file."""
    loader = _Loader(Path(path), label=label)
    return loader.spec(loader.resolve(Path(path), (), json.loads(json.dumps(doc))))


def templates_dir() -> Path:
    """The installed ``templates`` package folder (falls back to the source tree)."""
    try:
        return Path(str(importlib.resources.files("onnx_quant.templates")))
    except (ModuleNotFoundError, TypeError):  # not importable: running from a checkout
        return Path(__file__).resolve().parent.parent / "templates"

"""Kernel specs generated from ``onnx.defs``: one ``*.kernel.json`` for every schema version.

A kernel file that states ``since`` (and ``until``: the last opset version it serves) instead of
``sinceVersion`` is expanded into one spec per schema version of its operator in that range, read
from the installed ``onnx.defs`` (:mod:`onnx_quant.opsets`), never hand-copied:

- **types**: the file's ``typeConstraints`` state what the kernel computes; each generated spec's
  constraint is that list (in its order) less what the schema version does not allow for the inputs
  and outputs bound to it (matched by position; the last formal of a variadic input serves every
  input after it). A constraint bound only to inputs or outputs that schema version does not have
  (a later version's optional input) keeps its types. A version that allows none of a constraint's
  types is an error (start the file later, or end it with ``until``).
- **attributes**: the file names the attributes the kernel understands; each version's default and
  whether it is required come from that schema. A file states a ``default`` (or ``required``) only
  where it differs from ``onnx.defs``: where the schema has none (a kernel's sentinel such as ``[]``)
  or the kernel insists; restating the schema's is an error. An attribute that a schema version does
  not have yet is *fixed* in it: the kernel reads the value it was introduced with (the file's
  default, else the schema default of the first version that has it) and a node of that version may
  not set it (``AttributeDecl.fixed``); one that a version no longer has is left out of it.
- **versions**: ``{"<version>": partial document}`` where the semantics really change between
  versions (Pad-2's attributes against Pad-11's inputs, Softmax-1's 2-D coercion): each entry is
  merged onto the file (objects key by key, like ``extends``; its own ``extends`` replaces the
  file's) for the schema versions from its key to the next key.

A version whose generated document equals the previous version's adds no spec: the previous one
serves it (``SpecRegistry.find`` takes the highest ``sinceVersion`` at or below the model's opset).
Format: docs/kernel-spec.md, "Versions from onnx.defs".
"""

from __future__ import annotations

import copy
import json
from typing import Any, Callable, Iterable, Mapping

from onnx_quant import opsets
from onnx_quant.dtypes import element_type
from onnx_quant.errors import SpecError

__all__ = ["VERSION_KEYS", "expand", "allowed_names", "intersect_types", "generated_attributes"]

#: the keys that make a kernel file a generated one
VERSION_KEYS = ("since", "until", "versions")
#: keys a ``versions`` entry may not change (they say which operator and versions the file is)
_FIXED_KEYS = {"domain", "name", "since", "until", "versions", "sinceVersion", "untilVersion"}


def _domain(domain: Any) -> str:
    return "" if domain in (None, "", "ai.onnx") else domain


def allowed_names(codes: Iterable[int]) -> set[str]:
    """The element type names (``onnx_quant.dtypes``) of TensorProto codes; codes this project has
    no name for (string, complex) are left out."""
    out = set()
    for code in codes:
        try:
            out.add(element_type(code).name)
        except Exception:  # noqa: BLE001 (a type without a device layout: never offered)
            pass
    return out


def intersect_types(facts: opsets.OpFacts, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                    types: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """``types`` (constraint -> element type names, in order) less what the schema ``facts`` allow
    for the inputs and outputs bound to each constraint (``{"dtype": constraint, ...}`` or the
    constraint name itself, matched to the schema's formals by position). Constraints no formal
    backs keep their types; an empty result is the caller's to report."""
    out = {c: list(ts) for c, ts in types.items()}
    for formals, decls in ((facts.input, inputs), (facts.output, outputs)):
        for i, decl in enumerate(decls.values()):
            constraint = decl if isinstance(decl, str) else decl.get("dtype") if isinstance(decl, dict) else None
            formal = formals(i)
            if formal is None or constraint not in out:
                continue
            names = allowed_names(formal.allowed)
            out[constraint] = [t for t in out[constraint] if t in names]
    return out


def _same(a: Any, b: Any) -> bool:
    """Whether a stated default is the schema's (numbers by value, lists item by item)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def _json_default(value: Any) -> Any:
    """A schema default as a spec's JSON default (``None``: not representable, e.g. a tensor or a
    list of strings)."""
    if isinstance(value, tuple):
        return list(value) if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value) else None
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        return value
    return None


def generated_attributes(op: str, domain: str, version: int, declared: Mapping[str, Any], err) -> dict[str, dict]:
    """The attribute declarations of ``op``-``version``'s spec from the file's ``declared`` ones
    (name -> ``{}`` or with ``default`` / ``required`` / ``description``); ``err(field, reason)``
    makes the SpecError."""
    facts = opsets.op_facts(op, version, domain)
    versions = opsets.since_versions(op, domain)
    out: dict[str, dict] = {}
    for name, decl in declared.items():
        fld = f"attributes.{name}"
        if not isinstance(decl, dict):
            raise err(fld, f"expected an object, found {type(decl).__name__}")
        stated = {k: v for k, v in decl.items() if k in ("default", "required")}
        described = {"description": decl["description"]} if "description" in decl else {}
        schema = facts.attributes.get(name)
        if schema is not None:
            if "default" in stated:
                if schema.required:
                    raise err(f"{fld}.default", f"{op}-{version} requires {name!r} (onnx.defs): it has no default")
                if schema.default is not None and _same(stated["default"], schema.default):
                    raise err(f"{fld}.default", f"restates onnx.defs' default of {op}-{version} "
                                                f"({schema.default!r}): leave it out")
                out[name] = {"default": stated["default"], **described}
            elif stated.get("required") is True:
                if schema.required:
                    raise err(f"{fld}.required", f"restates onnx.defs ({op}-{version} requires {name!r}): leave it out")
                out[name] = {"required": True, **described}
            elif schema.required:
                out[name] = {"required": True, **described}
            else:
                value = _json_default(schema.default)
                if value is None:
                    raise err(fld, f"onnx.defs gives {op}-{version}'s {name!r} no default the kernel can read "
                                   f"({schema.default!r}): state one")
                out[name] = {"default": value, **described}
            continue
        later = [v for v in versions if v > version and opsets.op_facts(op, v, domain).has_attr(name)]
        if not later:
            if any(opsets.op_facts(op, v, domain).has_attr(name) for v in versions if v < version):
                continue  # an attribute this version no longer has
            raise err(fld, f"no schema version of {op} in onnx.defs has an attribute {name!r}")
        if "default" in stated:
            value = stated["default"]
        else:
            value = _json_default(opsets.op_facts(op, later[0], domain).attributes[name].default)
            if value is None:
                raise err(fld, f"{op}-{version} has no {name!r} ({op}-{later[0]} adds it without a default): "
                               f"state the value the kernel reads before {op}-{later[0]}")
        out[name] = {"default": value, "fixed": True, **described}
    return out


def _versions_map(raw: Any, op: str, known: list[int], err) -> dict[int, dict]:
    if not isinstance(raw, dict):
        raise err("versions", "expected an object version -> partial document")
    out: dict[int, dict] = {}
    for key, entry in raw.items():
        fld = f"versions.{key}"
        if not (isinstance(key, str) and key.isdigit()) or int(key) not in known:
            raise err(fld, f"not a schema version of {op} in this file's range (onnx.defs: "
                           f"{', '.join(map(str, known))})")
        if not isinstance(entry, dict):
            raise err(fld, "expected an object (the document's fields that change from this version on)")
        bad = sorted(set(entry) & _FIXED_KEYS)
        if bad:
            raise err(f"{fld}.{bad[0]}", "a versions entry cannot change which operator or versions the file is")
        out[int(key)] = entry
    return dict(sorted(out.items()))


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` deep-merged onto ``base`` (``extends``, a ``versions`` entry): objects key by
    key, the rest replaced."""
    out = dict(base)
    for k, v in over.items():
        b = out.get(k)
        out[k] = merged(b, v) if isinstance(b, dict) and isinstance(v, dict) else v
    return out


def expand(raw: dict, file: str, resolve: Callable[[dict], Any]) -> list[tuple[str, dict]]:
    """(label, spec document) per schema version of the kernel file ``raw`` (read from ``file``;
    labels ``<file>[<Op>-<version>]``) whose generated document differs from the previous version's;
    ``resolve(document)`` merges a document's ``extends`` base and ``passShaders`` under it."""
    def err(fld: str, reason: str, label: str = file) -> SpecError:
        return SpecError(label, fld, reason)

    raw = dict(raw)
    if "sinceVersion" in raw or "untilVersion" in raw:
        raise err("since", "a file states 'since'/'until' (versions from onnx.defs) or 'sinceVersion'/"
                           "'untilVersion' (a single spec), not both")
    op = raw.get("name")
    if not isinstance(op, str) or not op:
        raise err("name", "expected the operator's name")
    domain = _domain(raw.get("domain"))
    known = list(opsets.since_versions(op, domain))
    if not known:
        raise err("since", f"onnx.defs has no schema for {domain or 'ai.onnx'}::{op}: state 'sinceVersion'")
    since = raw.pop("since", None)
    until = raw.pop("until", None)
    for key, value in (("since", since), ("until", until)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise err(key, f"expected an opset version (an integer >= 1), found {value!r}")
    if since is None:
        raise err("since", "missing: the first schema version of the operator this kernel serves")
    if since not in known:
        raise err("since", f"{op} has no schema of version {since} in onnx.defs (versions: "
                           f"{', '.join(map(str, known))})")
    if until is not None and until < since:
        raise err("until", f"must be >= since ({since}), found {until}")
    versions = [v for v in known if v >= since and (until is None or v <= until)]
    entries = _versions_map(raw.pop("versions", {}), op, versions, err)

    docs: list[tuple[str, dict]] = []
    previous = None
    for version in versions:
        label = f"{file}[{op}-{version}]"
        keys = [k for k in entries if k <= version]
        doc = copy.deepcopy(merged(raw, entries[keys[-1]]) if keys else raw)
        doc = resolve(doc)
        if not isinstance(doc, dict):
            raise err("<top>", "expected an object", label)
        facts = opsets.op_facts(op, version, domain)
        types = doc.get("typeConstraints", {})
        inputs, outputs = doc.get("inputs", {}), doc.get("outputs", {})
        if isinstance(types, dict) and isinstance(inputs, dict) and isinstance(outputs, dict) \
                and all(isinstance(ts, list) for ts in types.values()):
            stated = types
            types = intersect_types(facts, inputs, outputs, types)
            for c, ts in types.items():
                if not ts and stated[c]:
                    raise err(f"typeConstraints.{c}", f"{op}-{version} allows none of {stated[c]} (onnx.defs): "
                                                      f"start the file later or end it with 'until'", label)
            doc["typeConstraints"] = types
        attributes = doc.get("attributes", {})
        if isinstance(attributes, dict):
            doc["attributes"] = generated_attributes(op, domain, version, attributes,
                                                     lambda f, r: err(f, r, label))
        if json.dumps(doc, sort_keys=True) == previous:
            continue  # the previous version's spec serves this one too
        previous = json.dumps(doc, sort_keys=True)
        docs.append((label, {**doc, "sinceVersion": version}))
    if until is not None:
        docs[-1][1]["untilVersion"] = until
    return docs

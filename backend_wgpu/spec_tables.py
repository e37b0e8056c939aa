"""Operator tables (``templates/*.ops.json``): a family of ops as data, expanded into specs.

An elementwise op is one table entry (its WGSL expression, the element types the kernel
computes, the first and last opset, its attributes with their defaults) instead of a spec
file of its own. Each family of the table names the base spec its members extend, the
constraint each input and output is bound to, and the shader that replaces the base's
(``passShaders``). Expansion reads ``onnx.defs`` (:mod:`onnx_quant.opsets`): every schema
version of the op from ``since`` (to ``until``) gets the table's types intersected with the
types that version allows, and a version whose intersection equals the previous one's is
served by the previous spec. The generated documents are validated like any spec file.

A family may also give its members' expression in named ``parts`` (a reduction's init, map,
combine and finalize), fixed ``types`` for constraints its members share (an axes input's
int64), ``attributes`` every member has where its schema version has them (ONNX defaults),
and inputs as objects ``{"dtype", "optional", "constant"}``: an optional input a schema
version does not have is left out of that version's spec (Reduce*'s axes input from 13/18).
An entry's string attribute may be an enumeration (``{"required": true, "values": [...]}``);
the elementwise families' specs also derive ``operands``, ``operandShapes``, ``enums``,
``final`` and ``exprOk`` (whether an expression key matches the operands' types, which their
variants require).
Format: docs/kernel-spec.md, "Operator tables".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from onnx_quant import opsets
from onnx_quant.errors import SpecError

from .spec_loader import load_spec_document
from .spec_model import KernelSpec
from .spec_versions import intersect_types

_TABLE_KEYS = {"description", "families", "ops"}
_FAMILY_KEYS = {"extends", "passShaders", "inputs", "outputs", "description", "parts", "types", "attributes"}
_IO_KEYS = {"dtype", "optional", "constant"}
_PART_KINDS = {"required", "optional"}
_OP_KEYS = {"family", "since", "until", "types", "expr", "final", "attributes", "description"}
_ATTR_KEYS = {"required", "values"}

#: the register type each element type computes in (the expression keys); mirrors
#: templates/snippets/tensor_io.wgsl.jinja's _REG, with bool its own kind (a WGSL bool)
REGISTERS: dict[str, tuple[str, ...]] = {
    "f32": ("float32", "float16"),
    "i32": ("int32", "int16", "int8", "uint16", "uint8"),
    "u32": ("uint32",),
    "i64": ("int64",),
    "u64": ("uint64",),
    "f64": ("float64",),
    "bool": ("bool",),
}
#: expression keys that match any operands: "*" (values in their registers), "raw" (every
#: operand's bits: u32, or vec2<u32> for a 64-bit type; the result is the output's bits)
_ANY_KEYS = ("*", "raw")


class _Table:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = str(path)

    def err(self, fld: str, reason: str) -> SpecError:
        return SpecError(self.file, fld, reason)

    def obj(self, v: Any, fld: str, allowed: set[str], required: set[str]) -> dict:
        if not isinstance(v, dict):
            raise self.err(fld, f"expected an object, found {type(v).__name__}")
        unknown = sorted(set(v) - allowed)
        if unknown:
            raise self.err(f"{fld}.{unknown[0]}", f"unknown key; allowed: {', '.join(sorted(allowed))}")
        missing = sorted(required - set(v))
        if missing:
            raise self.err(fld, f"missing key {missing[0]!r}")
        return v

    def read(self) -> dict:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise self.err("<file>", f"cannot read the table: {e}") from None
        return self.obj(raw, "<top>", _TABLE_KEYS, {"families", "ops"})

    def expressions(self, v: Any, fld: str) -> list[str]:
        """The flat [key, expression, ...] list the shader picks from (a string: any operands)."""
        exprs = {"*": v} if isinstance(v, str) else v
        if not isinstance(exprs, dict) or not exprs:
            raise self.err(fld, "expected a WGSL expression or an object register type -> expression")
        flat: list[str] = []
        for key, text in exprs.items():
            parts = key.split(",")
            if not (key in _ANY_KEYS or all(k in REGISTERS for k in parts)) or not isinstance(text, str) \
                    or not text.strip():
                raise self.err(f"{fld}.{key}", f"expected a register type ({', '.join(REGISTERS)}), several joined "
                                               f"by ',', or one of {', '.join(_ANY_KEYS)} -> a WGSL expression")
            flat += [key, text]
        return flat

    def attribute(self, name: str, v: Any, fld: str) -> tuple[dict, list[str] | None]:
        """An entry's attribute: its ONNX default, or {"required": true, "values": [strings]}
        (a string attribute the expression reads as an enumeration)."""
        if not isinstance(v, dict):
            return {"default": v}, None
        d = self.obj(v, f"{fld}.attributes.{name}", _ATTR_KEYS, {"required", "values"})
        values = d["values"]
        if d["required"] is not True or not isinstance(values, list) or not values \
                or not all(isinstance(x, str) and x.isidentifier() for x in values):
            raise self.err(f"{fld}.attributes.{name}", "expected {\"required\": true, \"values\": [identifiers]}")
        return {"required": True}, values

    def part_expressions(self, v: Any, family: Mapping[str, Any], fld: str) -> dict[str, str]:
        """Derived values of the expression: ``exprs`` (one expression), or per part of a family
        with ``parts`` ``exprs_<part>`` (an optional part the entry leaves out: ``[]``)."""
        parts = family.get("parts")
        if parts is None:
            return {"exprs": json.dumps(self.expressions(v, f"{fld}.expr"))}
        if not isinstance(v, dict):
            raise self.err(f"{fld}.expr", f"expected an object part -> expression (parts: {', '.join(parts)})")
        unknown = sorted(set(v) - set(parts))
        if unknown:
            raise self.err(f"{fld}.expr.{unknown[0]}", f"unknown part; parts: {', '.join(parts)}")
        out = {}
        for part, kind in parts.items():
            if part not in v and kind == "required":
                raise self.err(f"{fld}.expr", f"missing part {part!r}")
            out[f"exprs_{part}"] = json.dumps(self.expressions(v[part], f"{fld}.expr.{part}") if part in v else [])
        return out

    def versions(self, op: str, fld: str, since: int, until: int | None) -> list[int]:
        known = opsets.since_versions(op)
        if since not in known:
            raise self.err(f"{fld}.since", f"{op} has no schema of version {since} in onnx.defs (versions: "
                                           f"{', '.join(map(str, known)) or 'none'})")
        return [v for v in known if v >= since and (until is None or v <= until)]

    def io_decls(self, op: str, version: int, family: Mapping[str, Any], section: str,
                 fld: str) -> dict[str, dict]:
        """The family's inputs (or outputs) this schema version has, as spec declarations."""
        facts = opsets.op_facts(op, version)
        formals = facts.input if section == "inputs" else facts.output
        out: dict[str, dict] = {}
        for i, (io, decl) in enumerate(family[section].items()):
            decl = {"dtype": decl} if isinstance(decl, str) else dict(decl)
            if formals(i) is None:
                if decl.get("optional"):
                    continue  # a later version's optional input (Reduce*'s axes from 13/18)
                raise self.err(fld, f"{op}-{version} has no {section[:-1]} {i} for {io!r}")
            out[io] = decl
        return out

    def allowed(self, op: str, version: int, family: Mapping[str, Any], types: Mapping[str, list[str]],
                fld: str) -> dict[str, list[str]]:
        """The table's types per constraint, less what this schema version does not allow
        (spec_versions.intersect_types, as a kernel file's)."""
        inputs = self.io_decls(op, version, family, "inputs", fld)
        outputs = self.io_decls(op, version, family, "outputs", fld)
        bound = [d["dtype"] for d in (*inputs.values(), *outputs.values())]
        out = intersect_types(opsets.op_facts(op, version), inputs, outputs, {c: types[c] for c in dict.fromkeys(bound)})
        for c, ts in out.items():
            if not ts:
                raise self.err(f"{fld}.types.{c}", f"{op}-{version} allows none of {types[c]} (end the entry "
                                                   f"with 'until' before that version)")
        return out

    def op_documents(self, op: str, decl: Any, families: Mapping[str, Any]) -> list[tuple[str, dict]]:
        fld = f"ops.{op}"
        d = self.obj(decl, fld, _OP_KEYS, {"family", "since", "types", "expr"})
        family = families.get(d["family"])
        if family is None:
            raise self.err(f"{fld}.family", f"unknown family {d['family']!r}; families: {', '.join(families)}")
        fixed = family.get("types", {})
        constraints = {(v if isinstance(v, str) else v["dtype"])
                       for section in ("inputs", "outputs") for v in family[section].values()} - set(fixed)
        types = d["types"]
        if not isinstance(types, dict) or set(types) != constraints:
            raise self.err(f"{fld}.types", f"expected the element types of {sorted(constraints)}")
        types = {**types, **fixed}
        attributes = d.get("attributes", {})
        if not isinstance(attributes, dict):
            raise self.err(f"{fld}.attributes", "expected an object name -> default")
        derive = dict(self.part_expressions(d["expr"], family, fld))
        declared = {a: self.attribute(a, v, fld) for a, v in attributes.items()}
        final = d.get("final")
        if final is not None and (not isinstance(final, str) or not final.strip()):
            raise self.err(f"{fld}.final", "expected a WGSL expression over a and n")
        if "parts" not in family:  # one expression over the operands (elementwise-expr.wgsl.jinja)
            derive["enums"] = json.dumps([[a, values] for a, (_, values) in declared.items() if values is not None])
            if final is not None:
                derive["final"] = json.dumps(final)
        docs: list[tuple[str, dict]] = []
        previous = None
        versions = self.versions(op, fld, d["since"], d.get("until"))
        for version in versions:
            facts = opsets.op_facts(op, version)
            for a in attributes:
                if not facts.has_attr(a):
                    raise self.err(f"{fld}.attributes.{a}", f"{op}-{version} has no attribute {a!r}")
            attrs = {a: {"default": v} for a, v in family.get("attributes", {}).items() if facts.has_attr(a)}
            attrs.update({a: decl for a, (decl, _) in declared.items()})
            allowed = self.allowed(op, version, family, types, fld)
            inputs = self.io_decls(op, version, family, "inputs", fld)
            outputs = self.io_decls(op, version, family, "outputs", fld)
            accepts = (allowed, inputs, outputs, attrs)
            if accepts == previous:
                continue  # the previous version's spec serves this one too
            previous = accepts
            if "parts" not in family:
                derive = {**derive, "operands": json.dumps(list(inputs)),
                          "operandShapes": "[" + ", ".join(f"shapes.{io}" for io in inputs) + "]",
                          "operandSame": "[" + ", ".join(f"1 if shapes.{io} == shapes.{next(iter(outputs))} else 0"
                                                         for io in inputs) + "]",
                          "exprOk": _expr_ok(json.loads(derive["exprs"]), list(inputs))}
            docs.append((f"{self.path.name}[{op}-{version}]", {
                "name": op, "sinceVersion": version,
                "description": d.get("description", ""),
                "extends": family["extends"], "passShaders": family.get("passShaders", {}),
                "inputs": inputs, "outputs": outputs,
                "typeConstraints": allowed,
                "attributes": attrs,
                "derive": derive,
            }))
        if "until" in d:
            docs[-1][1]["untilVersion"] = d["until"]
        return docs

    def family(self, fam: Any, fld: str) -> None:
        self.obj(fam, fld, _FAMILY_KEYS, {"extends", "inputs", "outputs"})
        for section in ("inputs", "outputs"):
            for io, decl in fam[section].items():
                if not isinstance(decl, str):
                    self.obj(decl, f"{fld}.{section}.{io}", _IO_KEYS, {"dtype"})
        parts = fam.get("parts", {})
        if not isinstance(parts, dict) or any(k not in _PART_KINDS for k in parts.values()):
            raise self.err(f"{fld}.parts", f"expected an object part -> one of {sorted(_PART_KINDS)}")
        for key in ("types", "attributes"):
            if not isinstance(fam.get(key, {}), dict):
                raise self.err(f"{fld}.{key}", "expected an object")

    def load(self) -> list[KernelSpec]:
        table = self.read()
        families = table["families"]
        if not isinstance(families, dict):
            raise self.err("families", "expected an object name -> family")
        for name, fam in families.items():
            self.family(fam, f"families.{name}")
        ops = table["ops"]
        if not isinstance(ops, dict):
            raise self.err("ops", "expected an object op type -> entry")
        specs = []
        for op, decl in ops.items():
            for label, doc in self.op_documents(op, decl, families):
                specs.append(load_spec_document(doc, self.path, label))
        return specs


def _expr_ok(exprs: list[str], operands: list[str]) -> str:
    """An expression over ``dtypes`` that holds when some key of ``exprs`` matches the operands'
    types: the kernel's variants require it, so operands without an expression (an integer
    base with a float exponent) are declined by type, never rendered."""
    keys = exprs[0::2]
    if any(k in _ANY_KEYS for k in keys):
        return "true"
    alternatives = []
    for key in keys:
        terms = []
        for io, reg in zip(operands, key.split(",")):
            terms.append("(" + " or ".join(f'dtypes.{io} == "{t}"' for t in REGISTERS[reg]) + ")")
        alternatives.append("(" + " and ".join(terms) + ")")
    return " or ".join(alternatives)


def load_table(path: str | Path) -> list[KernelSpec]:
    """The kernel specs of one ``*.ops.json`` table. Raises SpecError(file, field, reason)."""
    return _Table(Path(path)).load()

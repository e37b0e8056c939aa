"""Operator tables (``templates/*.ops.json``): a family of ops as data, expanded into specs.

An elementwise op is one table entry (its WGSL expression, the element types the kernel
computes, the first and last opset, its attributes with their defaults) instead of a spec
file of its own. Each family of the table names the base spec its members extend, the
constraint each input and output is bound to, and the shader that replaces the base's
(``passShaders``). Expansion reads ``onnx.defs`` (:mod:`onnx_quant.opsets`): every schema
version of the op from ``since`` (to ``until``) gets the table's types intersected with the
types that version allows, and a version whose intersection equals the previous one's is
served by the previous spec. The generated documents are validated like any spec file.
Format: docs/kernel-spec.md, "Operator tables".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from onnx_quant import opsets
from onnx_quant.backend_wgpu.spec import KernelSpec, load_spec_document
from onnx_quant.dtypes import element_type
from onnx_quant.errors import SpecError

_TABLE_KEYS = {"description", "families", "ops"}
_FAMILY_KEYS = {"extends", "passShaders", "inputs", "outputs", "description"}
_OP_KEYS = {"family", "since", "until", "types", "expr", "final", "attributes", "description"}
_IO_KEYS = {"dtype", "optional"}
_ATTR_KEYS = {"required", "values"}

#: the register type each element type computes in (the expression keys); mirrors
#: templates/snippets/tensor_io.wgsl.jinja's _REG, with bool its own kind (a WGSL bool)
REGISTERS: dict[str, tuple[str, ...]] = {
    "f32": ("float32", "float16"),
    "i32": ("int32", "int16", "int8", "uint16", "uint8"),
    "u32": ("uint32",),
    "i64": ("int64",),
    "u64": ("uint64",),
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

    def io(self, family: Mapping[str, Any], section: str, fld: str) -> dict[str, tuple[str, bool]]:
        """A family's inputs or outputs: name -> (constraint, optional)."""
        out = {}
        for name, v in family[section].items():
            if isinstance(v, str):
                out[name] = (v, False)
            else:
                d = self.obj(v, f"{fld}.{section}.{name}", _IO_KEYS, {"dtype"})
                out[name] = (d["dtype"], bool(d.get("optional", False)))
        return out

    def attribute(self, name: str, v: Any, fld: str) -> tuple[dict, list[str] | None]:
        """A table attribute: its ONNX default, or {"required": true, "values": [strings]}
        (a string attribute the expression reads as an enumeration)."""
        if not isinstance(v, dict):
            return {"default": v}, None
        d = self.obj(v, f"{fld}.attributes.{name}", _ATTR_KEYS, {"required", "values"})
        values = d["values"]
        if d["required"] is not True or not isinstance(values, list) or not values \
                or not all(isinstance(x, str) and x.isidentifier() for x in values):
            raise self.err(f"{fld}.attributes.{name}", "expected {\"required\": true, \"values\": [identifiers]}")
        return {"required": True}, values

    def versions(self, op: str, fld: str, since: int, until: int | None) -> list[int]:
        known = opsets.since_versions(op)
        if since not in known:
            raise self.err(f"{fld}.since", f"{op} has no schema of version {since} in onnx.defs (versions: "
                                           f"{', '.join(map(str, known)) or 'none'})")
        return [v for v in known if v >= since and (until is None or v <= until)]

    def allowed(self, op: str, version: int, family: Mapping[str, Any], types: Mapping[str, list[str]],
                fld: str) -> dict[str, list[str]]:
        """The table's types per constraint, less what this schema version does not allow."""
        facts = opsets.op_facts(op, version)
        out = {c: list(ts) for c, ts in types.items()}
        for section, formals in (("inputs", facts.input), ("outputs", facts.output)):
            for i, (io, (constraint, _)) in enumerate(self.io(family, section, fld).items()):
                formal = formals(i)
                if formal is None:
                    raise self.err(fld, f"{op}-{version} has no {section[:-1]} {i} for {io!r}")
                names = {element_type(c).name for c in formal.allowed if _known(c)}
                out[constraint] = [t for t in out[constraint] if t in names]
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
        inputs = self.io(family, "inputs", f"families.{d['family']}")
        outputs = self.io(family, "outputs", f"families.{d['family']}")
        constraints = {c for c, _ in inputs.values()} | {c for c, _ in outputs.values()}
        types = d["types"]
        if not isinstance(types, dict) or set(types) != constraints:
            raise self.err(f"{fld}.types", f"expected the element types of {sorted(constraints)}")
        attributes = d.get("attributes", {})
        if not isinstance(attributes, dict):
            raise self.err(f"{fld}.attributes", "expected an object name -> default")
        exprs = self.expressions(d["expr"], f"{fld}.expr")
        final = d.get("final")
        if final is not None and (not isinstance(final, str) or not final.strip()):
            raise self.err(f"{fld}.final", "expected a WGSL expression over a and n")
        attrs = {a: self.attribute(a, v, fld) for a, v in attributes.items()}
        enums = [[a, values] for a, (_, values) in attrs.items() if values is not None]
        derive = {"op": json.dumps(op), "exprs": json.dumps(exprs), "operands": json.dumps(list(inputs)),
                  "operandShapes": "[" + ", ".join(f"shapes.{io}" for io in inputs) + "]",
                  "exprOk": _expr_ok(exprs, list(inputs)), "enums": json.dumps(enums)}
        if final is not None:
            derive["final"] = json.dumps(final)
        docs: list[tuple[str, dict]] = []
        previous = None
        versions = self.versions(op, fld, d["since"], d.get("until"))
        for version in versions:
            for a in attributes:
                if not opsets.op_facts(op, version).has_attr(a):
                    raise self.err(f"{fld}.attributes.{a}", f"{op}-{version} has no attribute {a!r}")
            allowed = self.allowed(op, version, family, types, fld)
            if allowed == previous:
                continue  # the previous version's spec serves this one too
            previous = allowed
            docs.append((f"{self.path.name}[{op}-{version}]", {
                "name": op, "sinceVersion": version,
                "description": d.get("description", ""),
                "extends": family["extends"], "passShaders": family.get("passShaders", {}),
                "inputs": {io: {"dtype": c, **({"optional": True} if o else {})} for io, (c, o) in inputs.items()},
                "outputs": {io: {"dtype": c} for io, (c, _) in outputs.items()},
                "typeConstraints": allowed,
                "attributes": {a: decl for a, (decl, _) in attrs.items()},
                "derive": derive,
            }))
        if "until" in d:
            docs[-1][1]["untilVersion"] = d["until"]
        return docs

    def load(self) -> list[KernelSpec]:
        table = self.read()
        families = table["families"]
        if not isinstance(families, dict):
            raise self.err("families", "expected an object name -> family")
        for name, fam in families.items():
            self.obj(fam, f"families.{name}", _FAMILY_KEYS, {"extends", "inputs", "outputs"})
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


def _known(code: int) -> bool:
    try:
        element_type(code)
    except Exception:  # noqa: BLE001 (a type this project has no name for: not offered)
        return False
    return True


def load_table(path: str | Path) -> list[KernelSpec]:
    """The kernel specs of one ``*.ops.json`` table. Raises SpecError(file, field, reason)."""
    return _Table(Path(path)).load()

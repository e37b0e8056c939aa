"""Kernel specs: the registry the planner, the rewrites and the placement look kernels up in
(``SpecRegistry.find`` / ``.verdict``), and the one place that loads every spec of a folder
(``load_specs``: the ``*.kernel.json`` files through spec_loader.py, the ``*.ops.json`` tables
through spec_tables.py). The dataclasses are spec_model.py's; the format is documented in
``docs/kernel-spec.md``.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Iterable, Iterator

from onnx_quant.errors import SpecError

from . import plan_cache
from .spec_loader import load_spec, load_spec_document, load_spec_file, templates_dir
from .spec_model import (
    ACCESS_BY_BUFFER, CONTEXT_KEYS, DEFAULT_DOMAIN, AttributeDecl, BindingDecl, Derive, Intermediate, KernelSpec,
    Pass, PassBinding, StructMember, TensorDecl, Tunable, Variant, wgsl_type_layout,
)
from .spec_tables import load_table
from .verdict import Verdict, kernel_verdict

__all__ = [
    "KernelSpec", "Variant", "Pass", "BindingDecl", "PassBinding", "StructMember", "Intermediate",
    "Tunable", "TensorDecl", "Derive", "AttributeDecl", "SpecRegistry", "load_spec", "load_spec_file", "load_specs",
    "load_spec_document", "templates_dir", "wgsl_type_layout", "CONTEXT_KEYS", "ACCESS_BY_BUFFER", "DEFAULT_DOMAIN",
]


# --------------------------------------------------------------------------- registry


def _norm_domain(domain: str | None) -> str:
    return DEFAULT_DOMAIN if domain in (None, "", "ai.onnx") else domain  # type: ignore[return-value]


class SpecRegistry:
    """Loaded specs by (domain, op type); :meth:`find` picks the one for an opset version."""

    def __init__(self, specs: Iterable[KernelSpec] = ()) -> None:
        self._by_op: dict[tuple[str, str], list[KernelSpec]] = {}
        #: ops read back from a pickle (the disk copy, plan_cache.load_or_store), unpickled on first use
        self._packed: dict[tuple[str, str], bytes] = {}
        for s in specs:
            self.add(s)

    def __getstate__(self) -> dict[str, Any]:
        # one pickle per op: a process unpickles the specs of the ops its model has, not all 300
        self._unpack_all()
        return {"packed": {k: pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL) for k, v in self._by_op.items()}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._by_op, self._packed = {}, dict(state["packed"])

    def _specs_of(self, key: tuple[str, str]) -> list[KernelSpec]:
        specs = self._by_op.get(key)
        if specs is None:
            packed = self._packed.get(key)
            if packed is None:
                return []
            # setdefault: two threads unpickling the same op keep one list (sessions are built in threads)
            specs = self._by_op.setdefault(key, pickle.loads(packed))
        return specs

    def _unpack_all(self) -> None:
        for key in list(self._packed):
            self._specs_of(key)

    def add(self, spec: KernelSpec) -> None:
        key = (_norm_domain(spec.domain), spec.name)
        self._specs_of(key)
        lst = self._by_op.setdefault(key, [])
        for other in lst:
            if other.since_version == spec.since_version:
                raise SpecError(spec.path, "sinceVersion",
                                f"{spec.domain}::{spec.name} sinceVersion {spec.since_version} is also defined "
                                f"in {other.path}")
        lst.append(spec)
        lst.sort(key=lambda s: s.since_version)

    def find(self, domain: str, op_type: str, version: int) -> KernelSpec | None:
        """The spec for ``op_type`` with the highest sinceVersion <= ``version``, or None (also
        when that spec's untilVersion is below ``version``)."""
        best = None
        for s in self._specs_of((_norm_domain(domain), op_type)):
            if s.since_version <= version:
                best = s
        if best is not None and best.until_version is not None and version > best.until_version:
            return None
        return best

    def verdict(self, node: Any, domain: str, version: int, elem_of: Any) -> Verdict:
        """(the spec of ``node``'s op at ``version`` or None, why it cannot take the node whatever
        the shapes or '' if it can), over the static element types ``elem_of(name)`` (0: unknown,
        decided per plan): verdict.kernel_verdict, the one verdict of the rewrites and the placement."""
        return kernel_verdict(self, node, domain, version, elem_of)

    def ops(self) -> list[tuple[str, str]]:
        return sorted({*self._by_op, *self._packed})

    def __iter__(self) -> Iterator[KernelSpec]:
        self._unpack_all()
        for key in sorted(self._by_op):
            yield from self._by_op[key]

    def __len__(self) -> int:
        self._unpack_all()
        return sum(len(v) for v in self._by_op.values())

    def __contains__(self, op: tuple[str, str]) -> bool:
        key = (_norm_domain(op[0]), op[1])
        return key in self._by_op or key in self._packed


def load_specs(directory: str | Path | None = None) -> SpecRegistry:
    """Load every ``*.kernel.json`` of ``directory`` (default: the templates package, whose
    loaded registry is kept on disk beside the plans: plan_cache.load_or_store)."""
    if directory is None:
        return plan_cache.load_or_store("specs", lambda: _load_folder(templates_dir()), SpecRegistry)
    return _load_folder(Path(directory))


def _load_folder(d: Path) -> SpecRegistry:
    if not d.is_dir():
        raise SpecError(str(d), "<directory>", "not a directory")
    files = [s for p in sorted(d.glob("*.kernel.json")) for s in load_spec_file(p)]
    tables = [s for p in sorted(d.glob("*.ops.json")) for s in load_table(p)]
    return SpecRegistry([*files, *tables])

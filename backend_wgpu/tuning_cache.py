"""The on-disk table of variant and tunable choices measured per adapter (``onnx-quant tune``).

One JSON file per adapter under ``cache_dir.folder("tuning")`` (``ONNX_QUANT_CACHE_DIR``, else
``~/.cache/onnx-quant``, then ``tuning/<version>/``), named by :func:`adapter_key`: the adapter's
name and backend plus a digest of the limits and features the device was given, since a choice
measured with one set of limits need not hold under another. Each entry is keyed by
:func:`entry_key`: the kernel, the dtypes of its inputs and outputs and the *shape bucket* of its
inputs (every dim rounded up to a power of two), so one measurement serves the nearby shapes a
new batch size gives. An entry holds the chosen variant, the tunables it was measured with and the
times of every candidate timed (µs), so ``explain`` and the benchmarks can show why.

The compiler reads the table as data (``CompileOptions.tuned``): a choice is used only where the
caller forced nothing, and only when its variant's ``when`` clauses hold at the node's exact
shapes; otherwise the static rules decide, as they do wherever nothing was measured. A file or an
entry that does not parse as this module writes it is ignored (never an error): the cache is an
optimization, and deleting it (``onnx-quant tune --clear``, or removing the folder) only brings
back the static rules.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from onnx_quant import cache_dir

#: the cache_dir kind this module owns
KIND = "tuning"
#: the file format; a file of another format is ignored
FORMAT = 1


@dataclass(frozen=True)
class Choice:
    """What was measured fastest (and exact) for one entry key."""

    variant: str
    tunables: Mapping[str, int] = field(default_factory=dict)
    #: candidate label (:func:`candidate_label`) -> measured µs (summed over the nodes of the key)
    timed_us: Mapping[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"variant": self.variant, "tunables": dict(self.tunables), "timed_us": dict(self.timed_us)}


def candidate_label(variant: str, tunables: Mapping[str, int]) -> str:
    """``variant`` or ``variant[NAME=V,...]``: how a candidate is named in reports and the cache."""
    if not tunables:
        return variant
    return variant + "[" + ",".join(f"{k}={v}" for k, v in sorted(tunables.items())) + "]"


def bucket_dim(d: int) -> int:
    """A dim rounded up to a power of two (0 and 1 stay)."""
    return d if d <= 1 else 1 << (int(d) - 1).bit_length()


def entry_key(kernel: str, shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, str],
              inputs: Iterable[str]) -> str:
    """``kernel|NAME:dtype:d0xd1..;...|NAME:dtype;...``: the kernel, then each present input (by
    name) with its dtype and bucketed shape, then the output dtypes (the variant a shape takes
    depends on its inputs)."""
    inputs = frozenset(inputs)
    parts = []
    for n in sorted(inputs):
        if n in shapes:
            dims = "x".join(str(bucket_dim(d)) for d in shapes[n]) or "scalar"
            parts.append(f"{n}:{dtypes.get(n, '?')}:{dims}")
    outs = [f"{n}:{t}" for n, t in sorted(dtypes.items()) if n not in inputs]
    return f"{kernel}|{';'.join(parts)}|{';'.join(outs)}"


def adapter_key(info: Any) -> str:
    """A file-name-safe key of the adapter and the limits and features the device was given."""
    facts = json.dumps({"limits": dict(sorted(dict(info.limits).items())), "features": sorted(info.features)},
                       sort_keys=True)
    digest = hashlib.sha256(facts.encode()).hexdigest()[:10]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{info.name}-{info.backend}").strip("-")[:80] or "adapter"
    return f"{slug}-{digest}"


def _parse_choice(raw: Any) -> Choice | None:
    """A Choice from its JSON form, or None when anything in it is not as :meth:`Choice.as_json`
    writes it (a corrupt entry is ignored, never trusted)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("variant"), str) or not raw["variant"]:
        return None
    tun, timed = raw.get("tunables", {}), raw.get("timed_us", {})
    if not isinstance(tun, dict) or not all(isinstance(k, str) and type(v) is int for k, v in tun.items()):
        return None
    if not isinstance(timed, dict) or not all(isinstance(k, str) and isinstance(v, (int, float))
                                              and not isinstance(v, bool) for k, v in timed.items()):
        return None
    return Choice(raw["variant"], dict(tun), {k: float(v) for k, v in timed.items()})


class TuningTable:
    """The choices of one adapter: ``entry key -> Choice``, read from and written to one file."""

    def __init__(self, adapter: str, entries: Mapping[str, Choice] | None = None, path: Path | None = None,
                 ignored: int = 0) -> None:
        self.adapter = adapter
        self.entries: dict[str, Choice] = dict(entries or {})
        self.path = path
        #: entries (or a whole file, counted as 1) that did not parse and were ignored
        self.ignored = ignored

    def lookup(self, key: str) -> Choice | None:
        return self.entries.get(key)

    def __len__(self) -> int:
        return len(self.entries)

    def digest(self) -> str:
        """A digest of the choices: what a cache of plans made with this table must be keyed on
        (a plan made before a ``tune`` would otherwise keep the static choice)."""
        doc = json.dumps({k: c.as_json() for k, c in sorted(self.entries.items())}, sort_keys=True)
        return hashlib.sha256(doc.encode()).hexdigest()[:16]

    @classmethod
    def load(cls, info: Any, folder: Path | None = None) -> "TuningTable":
        """The table of the adapter ``info`` describes; empty when no file exists or it is not a
        table of this format."""
        key = adapter_key(info)
        path = (folder if folder is not None else cache_dir.folder(KIND)) / f"{key}.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(key, path=path)
        except (OSError, ValueError):
            return cls(key, path=path, ignored=1)
        if not isinstance(raw, dict) or raw.get("format") != FORMAT or not isinstance(raw.get("entries"), dict):
            return cls(key, path=path, ignored=1)
        entries, ignored = {}, 0
        for k, v in raw["entries"].items():
            choice = _parse_choice(v)
            if choice is None:
                ignored += 1
            else:
                entries[k] = choice
        return cls(key, entries, path, ignored)

    def save(self) -> Path:
        """Write the table (atomically: a reader never sees half a file)."""
        if self.path is None:
            raise ValueError("a tuning table without a path cannot be saved")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"format": FORMAT, "adapter": self.adapter,
               "entries": {k: c.as_json() for k, c in sorted(self.entries.items())}}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.path)
        return self.path


def clear() -> list[Path]:
    """Remove every tuning table (every adapter, every version); returns the folders removed."""
    return cache_dir.clear(KIND)

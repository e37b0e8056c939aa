"""The on-disk cache of graph plans and their rendered WGSL, so that a new process skips planning
and rendering for a model and input shapes some earlier process ran on the same adapter.

One file per plan in ``cache_dir.folder("plans")`` (``~/.cache/onnx-quant/plans/VERSION``; see
onnx_quant/cache_dir.py), named by a SHA-256 over what the plan depends on: the project version and
a digest of the installed code and kernel templates (their sizes and modification times: an
edited checkout never reads what older code wrote), the device facts the compiler reads (adapter
name, backend, limits, features), the model's content hash, the session options the compiler and
the rewrites read, and the plan key (input shapes; a plan keyed on input contents is not stored).
The file holds a pickle of ``graph_plan.Compiled`` (``plan.py``'s frozen data, numpy arrays,
inference's values) and, per pass, its pipeline key and WGSL source. Beside the plans, per code
digest: the loaded registry of the installed kernel specs (:func:`load_or_store`) and what each
template reads (:class:`TemplateReads`).

Pickle runs code from the file it reads: the folder is the user's own (created ``0700``) and
nothing else writes there, the same trust as the user's Python packages. An entry that cannot
be read or unpickled, of another format, or whose stored key differs from the one asked for is
ignored (and removed), never an error: the plan is compiled again and the entry rewritten.
``ONNX_QUANT_PLAN_CACHE=0`` turns the cache off; ``onnx-quant cache clear`` removes it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import pickle
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from onnx_quant import __version__, cache_dir

#: the cache's folder name under the cache root
KIND = "plans"
#: the environment variable that turns the cache off ("0", "off", "false", "no")
ENV = "ONNX_QUANT_PLAN_CACHE"
#: the entries' layout; an entry of another format is ignored
FORMAT = 1
_SUFFIX = ".plan"


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """:func:`tree_digest` of the installed package's Python sources and kernel templates, once
    per process."""
    from . import spec_loader  # noqa: PLC0415 - where the templates are

    here = Path(__file__).resolve().parent
    return tree_digest([here, here.parent / "inference", Path(cache_dir.__file__).resolve().parent,
                        Path(spec_loader.templates_dir())])


def tree_digest(roots: list[Path]) -> str:
    """SHA-256 over the ``.py``, ``.json`` and ``.jinja`` files under ``roots``: each file's path,
    size and modification time (no file is read), with the project version."""
    h = hashlib.sha256(__version__.encode())
    seen: set[Path] = set()
    for root in roots:
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*")):
            if path.suffix not in (".py", ".json", ".jinja") or "__pycache__" in path.parts or path in seen:
                continue
            seen.add(path)
            st = path.stat()  # an edited file changes size or modification time
            h.update(f"{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()


def load_or_store(name: str, build: Callable[[], Any], kind: type) -> Any:
    """What ``build()`` returns, kept on disk as ``NAME-<code digest>.pickle`` beside the plans
    (the installed kernel specs: loading and checking them costs 0.3-1 s a process): read when
    there and of type ``kind``, else built and written. Never fails for the cache's sake."""
    if not enabled():
        return build()
    try:
        path = cache_dir.folder(KIND) / f"{name}-{code_digest()[:24]}.pickle"
    except OSError:
        return build()
    with contextlib.suppress(Exception):  # missing, truncated, from a moved class: built again
        value = pickle.loads(path.read_bytes())
        if isinstance(value, kind):
            return value
    value = build()
    with contextlib.suppress(Exception):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".pickle")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    return value


def model_digest(model: Any) -> str:
    """SHA-256 of a ModelProto's serialized bytes (external data loaded)."""
    return hashlib.sha256(model.SerializeToString()).hexdigest()


def device_facts(info: Any) -> tuple:
    """What of a DeviceInfo the compiler reads, in a stable order."""
    return (info.name, info.backend, tuple(sorted(info.limits.items())), tuple(sorted(info.features)))


def entry_key(*, model: str, device: tuple, options: Mapping[str, Any], plan_key: tuple) -> str:
    """The entry name: a digest over the code, the device, the model, the options and the plan key."""
    material = repr((FORMAT, __version__, code_digest(), device, model, sorted(options.items()), plan_key))
    return hashlib.sha256(material.encode()).hexdigest()


@dataclass
class Entry:
    """What one file holds: the compile result and, per (step index, pass index), the pass's
    pipeline key and rendered WGSL."""

    key: str
    compiled: Any
    shaders: dict[tuple[int, int], tuple[tuple, str]] = field(default_factory=dict)
    format: int = FORMAT


@dataclass
class PlanStore:
    """The plan cache folder, with what this process did with it."""

    folder: Path
    hits: int = 0
    misses: int = 0
    ignored: int = 0       # entries found unreadable, of another format or another key
    writes: int = 0

    @classmethod
    def default(cls) -> "PlanStore | None":
        """The store under the cache root, or None when the cache is off or its folder cannot be made."""
        if not enabled():
            return None
        try:
            folder = cache_dir.folder(KIND)
            os.chmod(folder, 0o700)
        except OSError:
            return None
        return cls(folder)

    def path(self, key: str) -> Path:
        return self.folder / f"{key}{_SUFFIX}"

    def load(self, key: str) -> Entry | None:
        """The entry stored under ``key``, or None (missing, unreadable, corrupt, stale: the last
        three removed)."""
        path = self.path(key)
        try:
            data = path.read_bytes()
        except OSError:
            self.misses += 1
            return None
        try:
            entry = pickle.loads(data)  # the user's own cache folder: see the module's docstring
            ok = isinstance(entry, Entry) and entry.format == FORMAT and entry.key == key
        except Exception:  # a truncated or foreign file, a class that moved: compiled again
            ok = False
        if not ok:
            self.ignored += 1
            self.misses += 1
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        self.hits += 1
        return entry

    def save(self, entry: Entry) -> bool:
        """Write an entry atomically (a temporary file renamed over it); False where it cannot."""
        try:
            data = pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # a plan holding something pickle cannot take: not cached
            return False
        try:
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-", suffix=_SUFFIX)
        except OSError:
            return False
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path(entry.key))
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        self.writes += 1
        return True


class TemplateReads:
    """What each kernel template reads (uniforms.template_reads), kept on disk beside the plans
    in one JSON file per code digest, so that no process after the first parses a template for
    its pipeline keys. Read once per process; a file that cannot be read is ignored."""

    def __init__(self) -> None:
        self._known: dict[str, list[str] | None] | None = None
        self._path: Path | None = None

    def _load(self) -> dict[str, list[str] | None]:
        if self._known is None:
            self._known = {}
            if enabled():
                with contextlib.suppress(OSError):
                    self._path = cache_dir.folder(KIND) / f"template-reads-{code_digest()[:24]}.json"
                with contextlib.suppress(OSError, ValueError):
                    data = json.loads(self._path.read_text()) if self._path is not None else {}
                    if isinstance(data, dict):
                        self._known = {k: v for k, v in data.items()
                                       if v is None or (isinstance(v, list) and all(isinstance(n, str) for n in v))}
        return self._known

    def get(self, template: str) -> tuple[bool, frozenset[str] | None]:
        """(known, reads) of a template."""
        known = self._load()
        if template not in known:
            return False, None
        value = known[template]
        return True, None if value is None else frozenset(value)

    def put(self, template: str, reads: frozenset[str] | None) -> None:
        known = self._load()
        known[template] = None if reads is None else sorted(reads)
        if self._path is None:
            return
        try:
            fd, tmp = tempfile.mkstemp(dir=self._path.parent, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump(known, f)
            os.replace(tmp, self._path)
        except OSError:
            pass

"""``onnx-quant cache info`` and ``onnx-quant cache clear``: what the on-disk caches hold
(onnx_quant/cache_dir.py: plans and rendered WGSL, compiled templates, tuned variants) and their
removal. Never loads wgpu."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import cache_dir


def _size(folder: Path) -> tuple[int, int]:
    files = [p for p in folder.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def cache_info() -> dict[str, Any]:
    """The cache root, and per cache folder (every version of it) its files and bytes."""
    base = cache_dir.root()
    kinds = {}
    if base.is_dir():
        for folder in sorted(p for p in base.iterdir() if p.is_dir() and p.name != "wheels"):
            files, size = _size(folder)
            versions = sorted(p.name for p in folder.iterdir() if p.is_dir())
            kinds[folder.name] = {"files": files, "bytes": size, "versions": versions}
    return {"root": str(base), "env": cache_dir.ENV, "caches": kinds}


def cmd_cache(args) -> int:
    if args.action == "clear":
        removed = cache_dir.clear(args.kind)
        if args.json:
            print(json.dumps({"removed": [str(p) for p in removed]}))
        elif removed:
            for path in removed:
                print(f"removed {path}")
        else:
            print(f"nothing to remove under {cache_dir.root()}" + (f" for {args.kind!r}" if args.kind else ""))
        return 0
    info = cache_info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"cache root: {info['root']} (moved by {info['env']})")
    if not info["caches"]:
        print("  empty")
    for kind, facts in info["caches"].items():
        print(f"  {kind}: {facts['files']} file(s), {facts['bytes'] / 2**20:.2f} MiB "
              f"(versions {', '.join(facts['versions']) or '-'})")
    return 0

"""DynamicQuantizeLinear benchmark: every GPU variant beside numpy and onnxruntime CPU.

A thin wrapper over ``backend_wgpu.commands.bench_dql`` (the code behind ``onnx-quant bench``):

    python benchmarks/bench_dql.py [--sizes 12,16,20,24] [--repeat 5] [--adapter vulkan] [--json]

Figures measured on the development machines are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


from onnx_quant.backend_wgpu.commands import bench_dql, format_bench


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="12,16,20,24", help="comma-separated log2 element counts")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--adapter")
    p.add_argument("--variants", help="comma-separated variant ids (default: all)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    variants = [v for v in (args.variants or "").split(",") if v] or None
    log = None if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    result = bench_dql(sizes, repeat=args.repeat, adapter=args.adapter, variants=variants, log=log)
    print(json.dumps(result, indent=2, default=str) if args.json else format_bench(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

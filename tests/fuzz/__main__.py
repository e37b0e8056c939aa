"""The campaign: ``python -m tests.fuzz --minutes N`` from the repository root.

Fuzz graphs in batches of hypothesis examples (a new seed per batch) on one device (its
pipeline cache shared by every graph) until the time is up; every finding is shrunk and saved
under tests/fuzz/regressions/. Logs graphs/s and outcomes as it goes; writes the summary
(outcomes, findings, coverage by op and by kernel variant, refusal reasons) as JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="onnx-quant-xdg-"))

from onnx_quant.backend_wgpu.device import get_device  # noqa: E402

from .campaign import Stats, fuzz_batch, write_summary  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0, help="first batch's seed (batch k: seed + k)")
    ap.add_argument("--batch", type=int, default=200, help="graphs per hypothesis run")
    ap.add_argument("--max-nodes", type=int, default=30)
    ap.add_argument("--summary", type=Path, default=Path("fuzz-summary.json"))
    ap.add_argument("--no-save", action="store_true", help="do not write regression cases")
    args = ap.parse_args(argv)
    device = get_device(None, limits="default")
    stats = Stats()
    start = time.monotonic()
    end = start + args.minutes * 60
    k = 0
    while time.monotonic() < end:
        found = fuzz_batch(device, stats, examples=args.batch, seed=args.seed + k, max_nodes=args.max_nodes,
                           save=not args.no_save, deadline=end)
        k += 1
        wall = time.monotonic() - start
        print(f"[{wall:7.0f}s] batch {k}: {stats.graphs} graphs ({stats.graphs / wall:.1f}/s wall), "
              f"{dict(stats.outcomes)}" + (f"; finding saved: {found.name}" if found else ""), flush=True)
        write_summary(stats, args.summary, {"seed": args.seed, "batches": k, "wall_s": round(wall, 1),
                                            "device": device.info.name})
    return 0


if __name__ == "__main__":
    sys.exit(main())

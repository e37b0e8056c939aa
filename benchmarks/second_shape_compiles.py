"""Pipelines compiled by a second input shape, per zoo model (issue #11, shape-polymorphic
pipelines): runs each quantized zoo model at its benchmark dims, then at a second batch size /
sequence length, and reports how many pipelines the second run compiled and for which kernels.

    python benchmarks/second_shape_compiles.py [--families cnn mlp transformer] [--formats ...] [--batch-only]
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_models  # noqa: E402 - benchmarks/bench_models.py, beside this script

#: the second shape of each family (the first is bench_models.RUN_DIMS): bench_models.SECOND_DIMS, the
#: batch size alone, with the transformer's sequence length changed too
SECOND_DIMS = {**bench_models.SECOND_DIMS, "transformer": {"B": 2, "S": 24}}
FORMATS = ("qoperator", "qdq", "dynamic")


def second_shape_compiles(family: str, fmt: str, device=None, *, batch_only: bool = False) -> tuple[int, list[str]]:
    """(pipelines compiled by the second shape's first run, 'kernel/variant/pass' of each); with
    ``batch_only`` the second shape changes the batch size alone (bench_models.SECOND_DIMS)."""
    from onnx_quant import model_zoo  # noqa: PLC0415
    from onnx_quant.backend_wgpu.session import Session  # noqa: PLC0415

    logging.getLogger().setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_zoo.quantized(family, fmt, per_channel=True)
    sess = Session(model, device=device, allow_host_fallback=True)
    cache = sess.device.pipelines
    cache.forget()  # each model from a cold cache: another model's pipelines would hide its own
    sess.run(None, model_zoo.random_feeds(model, bench_models.RUN_DIMS[family], seed=1))
    before = set(cache._pipelines)
    second = (bench_models.SECOND_DIMS if batch_only else SECOND_DIMS)[family]
    sess.run(None, model_zoo.random_feeds(model, second, seed=2))
    compiled = sess.last_run_stats["pipelines_compiled"]
    new = [cache._pipelines[k].label.split("/", 1)[-1] for k in set(cache._pipelines) - before]
    return compiled, sorted(new)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", nargs="+", default=list(SECOND_DIMS))
    ap.add_argument("--formats", nargs="+", default=list(FORMATS))
    ap.add_argument("--batch-only", action="store_true", help="change the batch size alone")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    for fam in args.families:
        for fmt in args.formats:
            n, labels = second_shape_compiles(fam, fmt, batch_only=args.batch_only)
            kinds = collections.Counter(lab.split("/")[0] for lab in labels)
            print(f"{fam:12s} {fmt:10s} {n:3d}  {dict(sorted(kinds.items()))}", flush=True)
            if args.verbose:
                for lab in labels:
                    print("    ", lab)


if __name__ == "__main__":
    main()

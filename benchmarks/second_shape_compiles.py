"""Pipelines compiled by a second input shape, per zoo model or exported model (issue #11, shape-polymorphic
pipelines): runs each quantized zoo model at its benchmark dims, then at a second batch size /
sequence length, and reports how many pipelines the second run compiled and for which kernels.

    python benchmarks/second_shape_compiles.py [--families cnn mlp transformer] [--formats ...] [--batch-only] [--batch N]
    python benchmarks/second_shape_compiles.py --exported [MODEL ...] [-v]

``--batch N``: the second run at batch size N (cnn / mlp N, transformer B) instead of the family's second
dims (batch 2 hides a variant that a larger batch selects: the zoo CNN's DynamicQuantizeConv turns
two_pass at batch 8).

``--exported``: the real-architecture models of onnx_quant.exported_models in every form, at a second
batch size and at a new image size / sequence length / audio length (``SHAPE_CHANGES``).
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


def compiles_at(model, first_feeds, second_feeds, device=None) -> tuple[int, list[str]]:
    """(pipelines compiled by a run at ``second_feeds`` after one at ``first_feeds``, from a cold
    pipeline cache, 'kernel/variant/pass' of each)."""
    from onnx_quant.backend_wgpu.session import Session  # noqa: PLC0415

    sess = Session(model, device=device, allow_host_fallback=True)
    cache = sess.device.pipelines
    cache.forget()  # each model from a cold cache: another model's pipelines would hide its own
    sess.run(None, first_feeds)
    before = set(cache._pipelines)
    sess.run(None, second_feeds)
    compiled = sess.last_run_stats["pipelines_compiled"]
    new = [cache._pipelines[k].label.split("/", 1)[-1] for k in set(cache._pipelines) - before]
    sess.close()
    return compiled, sorted(new)


def _quietly(build):
    logging.getLogger().setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build()


def second_shape_compiles(family: str, fmt: str, device=None, *, batch_only: bool = False,
                           batch: int | None = None) -> tuple[int, list[str]]:
    """Zoo model ``family`` in ``fmt``: :func:`compiles_at` its benchmark dims then a second batch size
    and sequence length (with ``batch_only``, the batch size alone: bench_models.SECOND_DIMS; with
    ``batch``, that batch size alone)."""
    from onnx_quant import model_zoo  # noqa: PLC0415

    model = _quietly(lambda: model_zoo.quantized(family, fmt, per_channel=True))
    second = (bench_models.SECOND_DIMS if batch_only or batch else SECOND_DIMS)[family]
    if batch:
        second = {**bench_models.RUN_DIMS[family], ("B" if family == "transformer" else "N"): batch}
    return compiles_at(model, model_zoo.random_feeds(model, bench_models.RUN_DIMS[family], seed=1),
                       model_zoo.random_feeds(model, second, seed=2), device)


def exported_shape_compiles(name: str, form: str, change: str, device=None) -> tuple[int, list[str]]:
    """Exported model ``name`` in ``form``: :func:`compiles_at` its run shapes then the shapes of
    ``exported_models.SHAPE_CHANGES[name][change]`` (``batch`` or ``size``)."""
    from onnx_quant import exported_models as em  # noqa: PLC0415

    model = _quietly(lambda: em.build(name, form))
    return compiles_at(model, em.feeds(model, em.MODELS[name][1], seed=1),
                       em.feeds(model, em.SHAPE_CHANGES[name][change], seed=2), device)


def _report(label: str, n: int, labels: list[str], verbose: bool) -> None:
    kinds = collections.Counter(lab.split("/")[0] for lab in labels)
    print(f"{label:34s} {n:3d}  {dict(sorted(kinds.items()))}", flush=True)
    if verbose:
        for lab in labels:
            print("    ", lab)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", nargs="+", default=list(SECOND_DIMS))
    ap.add_argument("--formats", nargs="+", default=list(FORMATS))
    ap.add_argument("--batch-only", action="store_true", help="change the batch size alone")
    ap.add_argument("--batch", type=int, help="the second run at this batch size alone")
    ap.add_argument("--exported", nargs="*", metavar="MODEL",
                    help="the exported models (all, or those named) instead of the zoo, at a second batch "
                         "size and at a new size (exported_models.SHAPE_CHANGES), in every form")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    if args.exported is not None:
        from onnx_quant import exported_models as em  # noqa: PLC0415

        for name in args.exported or list(em.MODELS):
            for form in em.FORMS:
                for change in ("batch", "size"):
                    n, labels = exported_shape_compiles(name, form, change)
                    _report(f"{name} {form} new {change}", n, labels, args.verbose)
        return
    for fam in args.families:
        for fmt in args.formats:
            n, labels = second_shape_compiles(fam, fmt, batch_only=args.batch_only, batch=args.batch)
            _report(f"{fam} {fmt}", n, labels, args.verbose)


if __name__ == "__main__":
    main()

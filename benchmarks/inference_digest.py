"""What the inference pass answers, as hashes: a before/after check for refactorings of
``inference/`` that must not change one byte of its output.

    python benchmarks/inference_digest.py --cache DIR --out digest.json      # record
    python benchmarks/inference_digest.py --cache DIR --check digest.json    # compare
    python benchmarks/inference_digest.py --cache DIR --time 7 --only timed  # timings only

Models: every exported model (``onnx_quant.exported_models``: MODELS x FORMS), the model zoo
(``onnx_quant.model_zoo``: each family as float and in each quantized format, and the four
benchmark models of ``bench_inference.py`` stamped out to about 2,000 nodes) and every onnx
node test case that has a model; the real-model tier (``onnx_quant.real_models``, value_info
stripped: the models case splitting serves) and the decoders of ``onnx_quant.decoder_models`` at
one layer and two layers, each style and form (``infer_shapes`` only). ``--cache`` keeps the built models as files, so that a
second run (another checkout, another interpreter) hashes the same input bytes without
rebuilding them (quantizing through onnxruntime, collecting onnx's cases).

For each model the digest holds the sha256 of:

- ``infer_shapes(model).SerializeToString()`` (lenient), and in strict mode the same or the
  error it raises;
- for the exported and zoo models, ``infer(model)`` with concrete input shapes (every value's
  element type, shape and folded content, what typed it, each node's record and every
  diagnostic).

``--time N`` times ``infer_shapes`` on the exported and zoo models: process CPU time, min of
``N`` runs per model (after one warm-up), and prints the per-model and total times.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import logging
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx

from onnx_quant import decoder_models, exported_models, inference, model_zoo, real_models

#: the benchmark's zoo models (bench_inference.MODELS), stamped out to this many nodes
SIZED_NODES = 2000
SIZED = {
    "cnn-qdq": ("cnn", "qdq", True, {"channels": 64}),
    "cnn-qoperator": ("cnn", "qoperator", False, {"channels": 64}),
    "mlp-dynamic": ("mlp", "dynamic", False, {"features": 256, "hidden": 256}),
    "transformer-qdq": ("transformer", "qdq", True, {"d_model": 256, "heads": 4, "ffn": 1024}),
}


def _build_timed() -> dict[str, tuple[onnx.ModelProto, dict]]:
    """name -> (model, concrete input shapes) of the exported and zoo models."""
    out = {}
    for name, (_, shapes) in exported_models.MODELS.items():
        for form in exported_models.FORMS:
            out[f"exported:{name}-{form}"] = (exported_models.build(name, form), dict(shapes))
    for family, builder in model_zoo.BUILDERS.items():
        dims = model_zoo.CALIBRATION_DIMS[family]
        fl = builder()
        out[f"zoo:{family}-float"] = (fl, model_zoo.input_shapes(fl, dims))
        for fmt in model_zoo.FORMATS:
            m = model_zoo.quantized(family, fmt)
            out[f"zoo:{family}-{fmt}"] = (m, model_zoo.input_shapes(m, dims))
    for name, (family, fmt, per_channel, kw) in SIZED.items():
        m = model_zoo.sized(family, fmt, SIZED_NODES, per_channel=per_channel, **kw)
        out[f"sized:{name}"] = (m, model_zoo.input_shapes(m, model_zoo.CALIBRATION_DIMS[family]))
    return out


def _build_node_cases() -> dict[str, onnx.ModelProto]:
    from onnx_quant.node_cases import all_node_cases

    out = {f"node:{i:04d}:{c.name}": c.model for i, c in enumerate(all_node_cases()) if c.model is not None}
    for name, form in real_models.CASES:
        model = real_models.load(name, form)
        del model.graph.value_info[:]
        out[f"real:{name}-{form}"] = model
    for style in decoder_models.STYLES:
        for form in decoder_models.FORMS:
            for layers in (1, 2):
                config = decoder_models.DecoderConfig(layers=layers, kv_heads=4 if style == "mha" else 2)
                out[f"decoder:{style}-{form}-{layers}"] = decoder_models.strip_types(
                    decoder_models.build(style, form, config))
    return out


def load_models(cache: Path | None, only: str) -> tuple[dict, dict]:
    """(timed models with their shapes, node-case models), from ``cache`` when it has them."""
    index = cache / "index.json" if cache else None
    if index is not None and index.exists():
        meta = json.loads(index.read_text())
        timed = {n: (onnx.load(cache / f"t{i:03d}.onnx"), {k: tuple(v) for k, v in s.items()})
                 for i, (n, s) in enumerate(meta["timed"])}
        cases = {} if only == "timed" else {n: onnx.load(cache / f"n{i:04d}.onnx") for i, n in enumerate(meta["cases"])}
        return timed, cases
    timed = _build_timed()
    cases = _build_node_cases()
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        for i, (m, _) in enumerate(timed.values()):
            onnx.save(m, cache / f"t{i:03d}.onnx")
        for i, m in enumerate(cases.values()):
            onnx.save(m, cache / f"n{i:04d}.onnx")
        index.write_text(json.dumps({"timed": [(n, {k: list(v) for k, v in s.items()}) for n, (_, s) in timed.items()],
                                     "cases": list(cases)}))
    return timed, ({} if only == "timed" else cases)


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _shapes_digest(model: onnx.ModelProto, strict: bool) -> str:
    try:
        return _sha(inference.infer_shapes(model, strict=strict).SerializeToString())
    except Exception as e:  # strict mode raises the first violation: its text is the answer
        return "raises " + _sha(f"{type(e).__name__}: {e}".encode())


def _value_text(info) -> str:
    v = info.value
    if v is None:
        content = "-"
    elif v.dtype == object:
        content = repr(v.reshape(-1).tolist())
    else:
        content = f"{v.dtype.str}{v.shape}:{_sha(np.ascontiguousarray(v).tobytes())}"
    return f"{info.elem_type} {info.shape_text()} {content}"


def _infer_digest(model: onnx.ModelProto, shapes: dict) -> str:
    r = inference.infer(model, input_shapes=shapes)
    lines = [f"{n} {_value_text(i)}" for n, i in sorted(r.values().items())]
    lines += [f"typed_by {n} {s}" for n, s in sorted(r.typed_by.items())]
    lines += [f"node {x.index} {x.label} {x.describe()}" for x in r.nodes]
    lines += [f"diag {d}" for d in r.diagnostics]
    lines += [f"other {n} {_sha(t.SerializeToString())}" for n, t in sorted(r.other_types.items())]
    for where, values in sorted(r.subgraph_values().items()):
        lines += [f"sub {where} {n} {_value_text(i)}" for n, i in sorted(values.items())]
    return _sha("\n".join(lines).encode())


def digest(timed: dict, cases: dict) -> dict[str, dict[str, str]]:
    out = {}
    for name, (model, shapes) in timed.items():
        out[name] = {"input": _sha(model.SerializeToString()), "infer_shapes": _shapes_digest(model, False),
                     "strict": _shapes_digest(model, True), "infer": _infer_digest(model, shapes)}
    for name, model in cases.items():
        out[name] = {"input": _sha(model.SerializeToString()), "infer_shapes": _shapes_digest(model, False),
                     "strict": _shapes_digest(model, True)}
    return out


def timings(timed: dict, repeat: int) -> dict[str, float]:
    """Model -> seconds of process time of one ``infer_shapes``, min of ``repeat``."""
    out = {}
    for name, (model, _) in timed.items():
        inference.infer_shapes(model)  # warm-up: caches per process (schemas, dispatch facts)
        best = float("inf")
        for _ in range(repeat):
            gc.collect()
            t = time.process_time()
            res = inference.infer_shapes(model)
            best = min(best, time.process_time() - t)
            del res
        out[name] = best
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cache", type=Path, help="folder keeping the built models (built and saved when empty)")
    p.add_argument("--out", type=Path, help="write the digest (and timings) here as JSON")
    p.add_argument("--check", type=Path, help="compare with a digest written by --out; exit 1 on a difference")
    p.add_argument("--time", type=int, default=0, metavar="N", help="time infer_shapes, min of N runs per model")
    p.add_argument("--only", choices=("all", "timed"), default="all", help="timed: skip onnx's node cases")
    p.add_argument("--no-digest", action="store_true", help="timings only")
    args = p.parse_args(argv)
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    timed, cases = load_models(args.cache, args.only)
    result: dict = {}
    if not args.no_digest:
        result["digest"] = digest(timed, cases)
        total = _sha(json.dumps(result["digest"], sort_keys=True).encode())
        result["total"] = total
        print(f"{len(result['digest'])} models, digest {total}")
    if args.time:
        t = timings(timed, args.time)
        result["timings"] = t
        for name, s in t.items():
            print(f"{name:40s} {s * 1e3:9.2f} ms")
        print(f"{'total':40s} {sum(t.values()) * 1e3:9.2f} ms")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    if args.check:
        want = json.loads(args.check.read_text())["digest"]
        got = result.get("digest", {})
        diff = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        for k in diff[:50]:
            print(f"DIFFERS {k}: {want.get(k)} != {got.get(k)}")
        print(f"{len(diff)} of {len(want)} models differ")
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Plan fingerprints: what a refactoring of the graph compiler must leave unchanged.

    python benchmarks/plan_fingerprint.py [-o FILE.json] [--compare BASELINE.json] [--detail DIR]
                                          [--only NAME,...] [--no-exported] [--no-zoo]

For every model of the model zoo (``onnx_quant.model_zoo``: cnn / mlp / transformer in QOperator,
QDQ and dynamic form, per-channel weights, as ``bench_models`` builds them) and every exported model
(``onnx_quant.exported_models``: MODELS x FORMS), one Session on the default adapter with WebGPU's
default limits (the tests' device) runs the model at its run shapes and then at each shape change
(bench_models' SECOND_DIMS / RESIZED_DIMS, exported_models.SHAPE_CHANGES), each twice. Recorded per run:

* the run's ``Session.last_run_stats`` (dispatches, submits, read-backs, host nodes, prologue
  dispatches, pipelines compiled, buffers, bind groups, bytes uploaded / read back);
* the pipeline keys the run asks the device's cache for (``render.pipeline_key`` and the layout,
  as ``bench_models.pipeline_requests`` counts them), as digests;
* every output's dtype, shape and a digest of its bytes;

and per model: a digest of every graph plan the session and its body sessions made (the plan's fields: key,
roots, aliases, the schedule with each GPU step's kernel plan, placement, lifetimes, pooled
buffers, uniform regions, folded values, prologue; never device state), ``explain`` at the run
shapes, ``summary`` and the host nodes with their reasons.

``--compare BASELINE.json`` prints every difference from an earlier run's file and exits 1 when
there is one. ``--detail DIR`` also writes each model's canonical plans as JSON there, for diffing.
Progress goes to stderr. Figures depend on the adapter: compare runs on the same machine.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: GraphPlan fields that make the plan (device state and caches are not compared)
PLAN_FIELDS = ("key", "roots", "alias", "schedule", "placement", "lifetimes", "slot_of", "slot_sizes",
               "uniform_regions", "uniform_size", "folded", "prologue")
#: the fields of the plan's parts compared (device state, such as the dispatch commands a GpuStep
#: held before the compiler/executor split, and fields added since, are not); other dataclasses
#: (KernelPlan, BufferPlan, PassPlan, ...) by every field
PART_FIELDS = {
    "RootValue": ("name", "onnx_type", "shape", "origin", "nbytes", "on_device", "on_host", "producer_pos",
                  "upload_segment", "segment"),
    "GpuStep": ("index", "label", "op_type", "pos", "plan", "buffers", "outputs", "hoisted"),
    "Segment": ("index", "steps", "uploads"),
    "HostStep": ("index", "label", "op_type", "inputs", "outputs", "reason", "device_inputs", "pos"),
    "Lifetime": ("key", "nbytes", "start", "end"),
}
#: last_run_stats entries compared (host_encode_us is a time)
STATS = ("runs", "plans", "pipelines_compiled", "buffers_allocated", "bytes_allocated", "bind_groups_created",
         "submits", "dispatches", "prologue_dispatches", "readbacks", "bytes_uploaded", "bytes_read_back",
         "host_nodes_run")


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def digest(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


def canon(x: Any) -> Any:
    """``x`` as plain JSON data, independent of set order, list-or-tuple and hash seeds: dataclasses
    by field (:data:`PART_FIELDS`), mappings as sorted pairs, arrays and bytes as digests."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        names = PART_FIELDS.get(type(x).__name__) or [f.name for f in dataclasses.fields(x)]
        return {name: canon(getattr(x, name)) for name in names}
    if isinstance(x, Mapping):
        pairs = [[canon(k), canon(v)] for k, v in x.items()]
        return sorted(pairs, key=lambda kv: json.dumps(kv[0], sort_keys=True))
    if isinstance(x, (list, tuple)):
        return [canon(v) for v in x]
    if isinstance(x, (set, frozenset)):
        return sorted((canon(v) for v in x), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(x, np.ndarray):
        return ["ndarray", x.dtype.str, list(x.shape), digest(np.ascontiguousarray(x).tobytes())]
    if isinstance(x, (bytes, bytearray, memoryview)):
        return ["bytes", len(bytes(x)), digest(bytes(x))]
    if isinstance(x, np.generic):
        return [type(x).__name__, canon(x.item())]
    if isinstance(x, float):
        return ["float", repr(x)]
    if x is None or isinstance(x, (str, int, bool)):
        return x
    if hasattr(x, "SerializeToString"):
        return [type(x).__name__, digest(x.SerializeToString(deterministic=True))]
    return ["object", type(x).__name__, repr(x)]


def plan_data(gplan: Any) -> dict[str, Any]:
    """The plan's canonical form: the fields of :data:`PLAN_FIELDS`."""
    return {name: canon(getattr(gplan, name)) for name in PLAN_FIELDS}


def all_plans(session) -> list[Any]:
    """The session's graph plans, then those of its If / Loop / Scan bodies and NonZero regions
    (each body session's own, depth first)."""
    plans = list(session._plans.values())
    for runner in session._control.values():
        for body in runner.body_sessions():
            plans += all_plans(body)
    return plans


def _dumps(x: Any) -> str:
    return json.dumps(x, sort_keys=True, separators=(",", ":"))


@contextlib.contextmanager
def pass_keys(device) -> Iterator[list[str]]:
    """The digests of the pipeline keys the device's cache is asked for while active (in order)."""
    from onnx_quant.backend_wgpu.render import pipeline_key  # noqa: PLC0415

    cache = device.pipelines
    seen: list[str] = []
    real = cache.for_pass

    def for_pass(pass_plan, key, **kw):
        seen.append(digest(_dumps(canon((pipeline_key(pass_plan), key)))))
        return real(pass_plan, key, **kw)

    cache.for_pass = for_pass
    try:
        yield seen
    finally:
        del cache.for_pass


def outputs_data(outs: list[Any]) -> list[Any]:
    data = []
    for v in outs:
        a = np.asarray(v)
        data.append([a.dtype.str, list(a.shape), digest(np.ascontiguousarray(a).tobytes())])
    return data


def fingerprint(name: str, model, feed_sets: list[tuple[str, dict[str, np.ndarray]]], device,
                detail: Path | None = None) -> dict[str, Any]:
    """One model's runs (per shape set, twice), plans, explain, summary and host nodes."""
    from onnx_quant.backend_wgpu.session import Session  # noqa: PLC0415

    out: dict[str, Any] = {"runs": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            session = Session(model, device=device)
        except Exception as e:  # a model the session refuses: that is the fingerprint
            return {"error": f"{type(e).__name__}: {e}"}
        with session:
            for label, feeds in feed_sets:
                for k in range(2):
                    with pass_keys(device) as keys:
                        try:
                            outs = session.run(None, feeds)
                        except Exception as e:
                            out["runs"].append({"shapes": label, "error": f"{type(e).__name__}: {e}"})
                            break
                    stats = session.last_run_stats
                    out["runs"].append({"shapes": label, "repeat": k, "stats": {s: stats.get(s) for s in STATS},
                                        "pipeline_keys": sorted(set(keys)), "pass_requests": len(keys),
                                        "outputs": outputs_data(outs)})
            plans = [plan_data(p) for p in all_plans(session)]
            out["plans"] = [digest(_dumps(p)) for p in plans]
            shapes = {k: tuple(v.shape) for k, v in feed_sets[0][1].items()}
            out["explain"] = digest(_dumps(canon(session.explain(shapes))))
            out["summary"] = canon(session.summary(shapes))
            out["host_nodes"] = canon(session.host_node_reasons)
            if detail is not None:
                detail.mkdir(parents=True, exist_ok=True)
                (detail / f"{name.replace(' ', '_')}.json").write_text(json.dumps(
                    {"plans": plans, "explain": canon(session.explain(shapes))}, indent=1, sort_keys=True))
    out["warnings"] = sorted({f"{w.category.__name__}: {w.message}" for w in caught
                              if "HostFallback" in w.category.__name__})
    return out


def models(zoo: bool, exported: bool, only: set[str] | None):
    """(name, model, [(shapes label, feeds)]) of the zoo and exported models."""
    import bench_models  # noqa: PLC0415

    items = []
    if zoo:
        for fam in ("cnn", "mlp", "transformer"):
            for fmt in ("qoperator", "qdq", "dynamic"):
                name = f"{fam} {fmt}"
                if only and name not in only:
                    continue
                items += [(n, m, [("run", f), *sorted(c.items())])
                          for n, m, f, c in bench_models.quantized_models([fam], [fmt])]
    if exported:
        from onnx_quant import exported_models as em  # noqa: PLC0415

        for mname in em.MODELS:
            for n, m, f, c in bench_models.exported_models([mname]):
                if not only or n in only:
                    items.append((n, m, [("run", f), *sorted(c.items())]))
    return items


def compare(base: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Every difference, as lines naming the model and the field."""
    lines = []
    for name in sorted(set(base) | set(now)):
        if name not in now or name not in base:
            lines.append(f"{name}: only in {'the baseline' if name in base else 'this run'}")
            continue
        a, b = base[name], now[name]
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                if key == "runs" and isinstance(a.get(key), list) and isinstance(b.get(key), list):
                    for i, (ra, rb) in enumerate(zip(a[key], b[key])):
                        for f in sorted(set(ra) | set(rb)):
                            if ra.get(f) != rb.get(f):
                                lines.append(f"{name}: run {i} ({ra.get('shapes')}) {f}: {ra.get(f)} -> {rb.get(f)}")
                    if len(a[key]) != len(b[key]):
                        lines.append(f"{name}: {len(a[key])} runs -> {len(b[key])}")
                else:
                    lines.append(f"{name}: {key}: {a.get(key)} -> {b.get(key)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", help="write the fingerprints here (JSON)")
    ap.add_argument("--compare", help="a baseline file: print the differences, exit 1 on any")
    ap.add_argument("--detail", help="a folder for each model's canonical plans (JSON)")
    ap.add_argument("--only", help="comma-separated model names (as in the output)")
    ap.add_argument("--no-zoo", action="store_true")
    ap.add_argument("--no-exported", action="store_true")
    args = ap.parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)
    from onnx_quant.backend_wgpu.device import get_device  # noqa: PLC0415

    device = get_device(None, limits="default")
    only = set(args.only.split(",")) if args.only else None
    result: dict[str, Any] = {}
    for name, model, feed_sets in models(not args.no_zoo, not args.no_exported, only):
        _say(f"{name} ...")
        result[name] = fingerprint(name, model, feed_sets, device, Path(args.detail) if args.detail else None)
    text = json.dumps(result, indent=1, sort_keys=True)
    if args.output:
        Path(args.output).write_text(text + "\n")
    else:
        print(text)
    if args.compare:
        base = json.loads(Path(args.compare).read_text())
        if only:
            base = {k: v for k, v in base.items() if k in only}
        diffs = compare(base, result)
        for line in diffs:
            print(line, file=sys.stderr)
        _say(f"{len(result)} models, {len(diffs)} differences from {args.compare}")
        return 1 if diffs else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

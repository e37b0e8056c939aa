"""What a change to the kernel specs changes, measured: dumps to compare before and after.

    python benchmarks/spec_equivalence.py registry OUT.json        # (domain, op, version) 1..31 -> the
                                                                   # resolved spec the registry finds
    python benchmarks/spec_equivalence.py suite OUT.json [OPS...]  # conformance --suite all on the GPU:
                                                                   # per case the outcome, the output
                                                                   # bytes' hashes, the WGSL of every pass
    python benchmarks/spec_equivalence.py models OUT.json          # bench_models' zoo and exported models:
                                                                   # output hashes, dispatches, pipelines
                                                                   # (first run, new batch / size), WGSL
    python benchmarks/spec_equivalence.py compare A.json B.json    # what differs

Run it in the tree before the change and in the tree after (or with the package of an earlier
revision first on ``PYTHONPATH``: ``baseline.build(REV)``), then ``compare``. Every pipeline lookup
(``PipelineCache.for_pass``) renders its pass and records the pipeline key: a key that renders two
different sources (a key that is not correct) is reported, beside the counts of distinct keys and
sources. A registry dump holds every field of each spec but its file and description.
"""

from __future__ import annotations

import hashlib
import json
import sys
import warnings
from pathlib import Path

import numpy as np


def _text(v):
    from onnx_quant.backend_wgpu.expr import Expr

    if isinstance(v, Expr):
        return "expr:" + v.text
    if isinstance(v, tuple):
        return [_text(x) for x in v]
    return v


def _derive(d):
    return {n: _text(v) for n, v in d.items}


def summarize(s) -> dict:
    def io(t):
        return {"name": t.name, "dtype": t.dtype, "index": t.index, "rank": _text(t.rank), "shape": _text(t.shape),
                "optional": t.optional, "constant": t.constant}

    def binding(b):
        return {"index": b.index, "resource": b.resource, "var": b.var_name, "role": b.role, "access": b.access,
                "et": b.element_type, "length": _text(b.length),
                "struct": None if b.struct is None else [[m.name, m.type, _text(m.value)] for m in b.struct]}

    def pass_(p):
        return {"id": p.id, "name": p.name, "shader": p.shader, "derive": _derive(p.derive),
                "bindings": [binding(b) for b in p.bindings], "dispatch": [_text(x) for x in p.dispatch],
                "uniforms": list(p.uniforms)}

    return {
        "domain": s.domain, "name": s.name, "since": s.since_version, "until": s.until_version,
        "inputs": [io(t) for t in s.inputs.values()], "outputs": [io(t) for t in s.outputs.values()],
        "typeConstraints": {k: list(v) for k, v in s.type_constraints.items()},
        "attributes": {a.name: {"default": _text(a.default), "required": a.required,
                                **({"fixed": True} if getattr(a, "fixed", False) else {})} for a in s.attributes.values()},
        "tunables": {t.name: t.default for t in s.tunables.values()},
        "derive": _derive(s.derive),
        "uniforms": list(s.uniforms),
        "variants": [{"id": v.id, "priority": v.priority, "when": [_text(w) for w in v.when],
                      "derive": _derive(v.derive),
                      "intermediates": [[i.id, i.dtype, _text(i.shape), _text(i.data)] for i in v.intermediates],
                      "passes": [pass_(p) for p in v.passes]} for v in s.variants],
    }


def registry(out: str) -> None:
    from onnx_quant.backend_wgpu.spec import load_specs

    reg = load_specs()
    dump = {}
    for domain, op in reg.ops():
        for version in range(1, 32):
            s = reg.find(domain, op, version)
            if s is not None:
                dump[f"{domain}::{op}-{version}"] = summarize(s)
    Path(out).write_text(json.dumps(dump, indent=0, sort_keys=True))
    print(f"{len(dump)} (domain, op, version) entries, {len(reg)} specs")


class Recorder:
    def __init__(self) -> None:
        self.key_source: dict[str, str] = {}
        self.conflicts: list[str] = []
        self.current: list = []

    def install(self) -> None:
        from onnx_quant.backend_wgpu import pipelines, render

        rec = self
        real = pipelines.PipelineCache.for_pass

        def for_pass(self, pass_plan, key, *, label="", kernel=None, variant=None):
            pk = repr((render.pipeline_key(pass_plan), key))
            src = hashlib.sha256(render.render(pass_plan).encode()).hexdigest()[:16]
            kh = hashlib.sha256(pk.encode()).hexdigest()[:16]
            old = rec.key_source.setdefault(kh, src)
            if old != src:
                rec.conflicts.append(f"{kernel}/{variant}/{pass_plan.id}: key {kh} renders {old} and {src}")
            rec.current.append([kernel, variant, pass_plan.id, src])
            return real(self, pass_plan, key, label=label, kernel=kernel, variant=variant)

        pipelines.PipelineCache.for_pass = for_pass

    def take(self) -> list:
        out, self.current = self.current, []
        return out

    def summary(self) -> dict:
        return {"distinct_keys": len(self.key_source), "distinct_sources": len(set(self.key_source.values())),
                "conflicts": self.conflicts}


def _hash_outputs(got) -> list:
    out = []
    for g in got:
        a = np.asarray(g)
        out.append([str(a.dtype), list(a.shape), hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]])
    return out


def suite(out: str, ops: list[str]) -> None:
    from onnx_quant.backend_wgpu import conformance
    from onnx_quant.backend_wgpu.suite import outcome, suite_cases

    rec = Recorder()
    rec.install()
    outputs: dict[str, list] = {}
    real_make = conformance.make_session
    current = {"case": None}

    def make_session(*a, **kw):
        s = real_make(*a, **kw)
        run = s.run

        def recording_run(*ra, **rkw):
            got = run(*ra, **rkw)
            outputs[current["case"]] = _hash_outputs(got)
            return got
        s.run = recording_run
        return s
    conformance.make_session = make_session
    from onnx_quant.backend_wgpu.device import get_device

    device = get_device(None)
    cases = suite_cases(ops or None)
    rows = {}
    for i, case in enumerate(cases, 1):
        current["case"] = case.name
        row = conformance.run_case(case, device=device, host_fallback=False)
        rows[case.name] = {"op": row.op_type, "outcome": outcome(row), "error": row.error,
                           "variants": row.variants, "outputs": outputs.get(case.name),
                           "passes": rec.take()}
        if i % 100 == 0:
            print(f"{i}/{len(cases)}", file=sys.stderr, flush=True)
    counts: dict[str, int] = {}
    for r in rows.values():
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    Path(out).write_text(json.dumps({"counts": counts, "pipelines": rec.summary(), "cases": rows}, indent=0,
                                    sort_keys=True))
    print(counts, rec.summary()["distinct_keys"], rec.summary()["distinct_sources"], len(rec.conflicts))


def models(out: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_models as bm  # noqa: PLC0415 (benchmarks/ is no package)
    from onnx_quant import model_zoo
    from onnx_quant import exported_models as em
    from onnx_quant.backend_wgpu.conformance import host_nodes, make_session
    from onnx_quant.backend_wgpu.device import get_device

    rec = Recorder()
    rec.install()
    device = get_device(None)
    items = bm.quantized_models(("cnn", "mlp", "transformer"), model_zoo.FORMATS) + bm.exported_models(list(em.MODELS))
    rows = {}
    for name, model, feeds, changes in items:
        print(name, file=sys.stderr, flush=True)
        row: dict = {}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                session = make_session(model, device=device)
                device.pipelines.forget()
                with bm.pipeline_requests(device) as first:
                    got = session.run(None, feeds)
                row["pipelines_first_run"] = len(first)
                row["outputs"] = _hash_outputs(got)
                d0 = session.stats.dispatches
                session.run(None, feeds)
                row["dispatches_per_run"] = session.stats.dispatches - d0
                row["host_nodes"] = host_nodes(session)
                for change, cf in changes.items():
                    with bm.pipeline_requests(device) as keys:
                        g = session.run(None, cf)
                    row[f"compilations_new_{change}"] = len(keys - first)
                    row[f"outputs_{change}"] = _hash_outputs(g)
                session.close()
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"
        row["passes"] = rec.take()
        rows[name] = row
    Path(out).write_text(json.dumps({"pipelines": rec.summary(), "models": rows}, indent=0, sort_keys=True))
    print(rec.summary()["distinct_keys"], rec.summary()["distinct_sources"], len(rec.conflicts))


def compare(a: str, b: str) -> None:
    A, B = json.loads(Path(a).read_text()), json.loads(Path(b).read_text())
    if "cases" in A or "models" in A:
        key = "cases" if "cases" in A else "models"
        print("pipelines:", A["pipelines"]["distinct_keys"], A["pipelines"]["distinct_sources"],
              len(A["pipelines"]["conflicts"]), "->", B["pipelines"]["distinct_keys"],
              B["pipelines"]["distinct_sources"], len(B["pipelines"]["conflicts"]))
        if "counts" in A:
            print("counts:", A["counts"], "->", B["counts"])
        diff = 0
        for name in sorted(set(A[key]) | set(B[key])):
            ra, rb = A[key].get(name), B[key].get(name)
            if ra != rb:
                diff += 1
                fields = sorted(k for k in set(ra or {}) | set(rb or {}) if (ra or {}).get(k) != (rb or {}).get(k))
                print(f"  {name}: {fields}")
                for f in fields[:3]:
                    print(f"     {f}: {str((ra or {}).get(f))[:300]}\n  -> {str((rb or {}).get(f))[:300]}")
        print(f"{diff} of {len(set(A[key]) | set(B[key]))} differ")
        return
    _compare_registries(A, B)


def _types_delta(a: dict, b: dict) -> str:
    out = []
    for c in sorted(set(a) | set(b)):
        x, y = a.get(c, []), b.get(c, [])
        if x == y:
            continue
        if set(x) == set(y):
            out.append(f"{c}: order")
        else:
            out.append(f"{c}: -{[t for t in x if t not in y]} +{[t for t in y if t not in x]}")
    return "; ".join(out)


def _fields_delta(a: dict, b: dict) -> str:
    return "; ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))


def _variants_delta(a: list, b: list) -> str:
    if [v["id"] for v in a] != [v["id"] for v in b]:
        return f"{[v['id'] for v in a]} -> {[v['id'] for v in b]}"
    out = []
    for va, vb in zip(a, b):
        for k in va:
            if k == "passes" and va[k] != vb[k]:
                out += [f"{va['id']}.{pa['id']}.{pk}: {str(pa[pk])[:80]} -> {str(pb.get(pk))[:80]}"
                        for pa, pb in zip(va[k], vb[k]) for pk in pa if pa[pk] != pb.get(pk)]
            elif va[k] != vb.get(k):
                out.append(f"{va['id']}.{k}: {str(va[k])[:120]} -> {str(vb.get(k))[:120]}")
    return "; ".join(out)


def _compare_registries(A: dict, B: dict) -> None:
    """Per op, the runs of versions whose resolved spec changed and how."""
    print(f"{len(A)} -> {len(B)} (domain, op, version) entries; missing {sorted(set(A) - set(B))}; "
          f"added {sorted(set(B) - set(A))}")
    rows: dict[str, list] = {}
    for key in sorted(set(A) & set(B), key=lambda k: (k.rsplit("-", 1)[0], int(k.rsplit("-", 1)[1]))):
        a, b = A[key], B[key]
        if a == b:
            continue
        parts = []
        for f in sorted(set(a) | set(b)):
            if a.get(f) == b.get(f):
                continue
            delta = {"typeConstraints": _types_delta, "attributes": _fields_delta, "derive": _fields_delta,
                     "variants": _variants_delta}.get(f)
            parts.append(f"{f} " + (delta(a[f], b[f]) if delta else f"{a.get(f)} -> {b.get(f)}"))
        op, version = key.rsplit("-", 1)
        rows.setdefault(op, []).append((int(version), " | ".join(parts)))
    changed = 0
    for op, versions in rows.items():
        runs: list[list] = []
        for v, text in versions:
            if runs and runs[-1][2] == text and runs[-1][1] == v - 1:
                runs[-1][1] = v
            else:
                runs.append([v, v, text])
        for first, last, text in runs:
            changed += 1
            print(f"{op}-{first}" + (f"..{last}" if last != first else "") + f": {text}")
    print(f"{changed} runs of versions changed")


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"registry": lambda: registry(args[0]), "suite": lambda: suite(args[0], args[1:]),
     "models": lambda: models(args[0]), "compare": lambda: compare(*args)}[cmd]()

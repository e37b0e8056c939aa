"""The one-shot device benchmark: every model tier through this project and its peers, checked
against the oracle, plus the roofline, within one time budget (benchmarks/device_check.sh runs
it; docs/benchmarks.md, "Device check", says how and what it writes).

    python benchmarks/device_check.py [--smoke] [--out DIR] [--budget SECONDS]

Parts, each in its own process with its own share of the budget (a part past its share is
killed; what it wrote so far is kept, so a slow part cannot eat the rest):

1. ``prepare``: the cases — the model zoo (onnx_quant/model_zoo.py: cnn, mlp, transformer; float
   and the qoperator / qdq / dynamic forms), the exported models (exported_models.py, every form)
   and the real-model tier (real_models.py, every form, where its files are here) at batch 1 and
   32 (``--smoke``: a few small models at batch 1 and 2) — written as .onnx files with their feeds
   and the oracle's outputs (onnx_quant/oracles.py: ``choose_oracle`` / ``run_oracle``, exact for
   u8s8 integer GEMMs on any CPU; an onnxruntime oracle also with ``ORT_DISABLE_ALL``, the graph
   as written: a runner agrees when it agrees with either, as tests/backend/test_real_models_gpu.py
   holds, since onnxruntime's own fusions change results by themselves);
2. one part per runner (benchmarks/device_runners.py): this project (the adapter wgpu picks),
   onnxruntime CPU, onnxruntime's WebGPU EP (``onnxruntime-webgpu``, from ``DEVICE_CHECK_ORTWEB``:
   its own import path, since its module is also called ``onnxruntime``), tinygrad (its default
   device: CUDA on the H200) and torch (CUDA, float models through onnx2torch). A runner whose
   module is missing is skipped with a note;
3. ``roofline``: benchmarks/roofline.py when present (``--short`` in smoke), its table and JSON;
4. the report: ``device_check.json`` (every row), ``device_check.md`` (a table per batch size:
   each runner's steady ms, throughput and verdict) and PNG bar charts (benchmarks/plots.py,
   where matplotlib is installed) under ``--out`` (default ``$OUT``, else out/device_check).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from device_runners import NEEDS, RUNNERS, timed_case  # noqa: E402

#: share of the budget per part (the rest is the report's); parts run one after the other
SHARES = {"prepare": 0.22, "onnx-quant": 0.26, "onnxruntime-cpu": 0.07, "onnxruntime-webgpu": 0.12,
          "tinygrad": 0.12, "torch": 0.08, "roofline": 0.10}
FULL_BATCHES, SMOKE_BATCHES = (1, 32), (1, 2)
#: per case: steady runs at most, and seconds of them at most
FULL_RUNS, SMOKE_RUNS = (20, 1.0), (3, 0.3)


# ----------------------------------------------------------------------------- the cases


def _zoo_cases(smoke: bool):
    from onnx_quant import model_zoo  # noqa: PLC0415

    batch_dim = {"cnn": "N", "mlp": "N", "transformer": "B"}
    families = ("mlp",) if smoke else tuple(model_zoo.BUILDERS)
    forms = ("dynamic", "qdq") if smoke else ("float",) + model_zoo.FORMATS
    for family in families:
        for form in forms:
            def build(family=family, form=form):
                return model_zoo.BUILDERS[family]() if form == "float" else model_zoo.quantized(family, form)

            def feeds(model, batch, family=family):
                dims = {**model_zoo.CALIBRATION_DIMS[family], batch_dim[family]: batch}
                return model_zoo.random_feeds(model, dims, seed=batch)
            yield "zoo", family, form, build, feeds


def _exported_cases(smoke: bool):
    from onnx_quant import exported_models as em  # noqa: PLC0415

    names = ("vad_state",) if smoke else tuple(em.MODELS)
    forms = ("float",) if smoke else em.FORMS
    for name in names:
        base = em.MODELS[name][1]
        moved = em.SHAPE_CHANGES[name]["batch"]
        for form in forms:
            def feeds(model, batch, name=name, base=base, moved=moved):
                shapes = {k: tuple(batch if moved[k][i] != d else d for i, d in enumerate(s)) for k, s in base.items()}
                return em.feeds(model, shapes, seed=batch)
            yield "exported", name, form, (lambda name=name, form=form: em.build(name, form)), feeds


def _real_cases(smoke: bool):
    """The real-model tier where its files are here (never downloaded: the device cannot fetch)."""
    from onnx_quant import real_models as rm  # noqa: PLC0415

    if smoke:
        return
    for name, m in rm.MODELS.items():
        folder = rm.cache_dir() / rm.WHEELS[m.wheel].folder
        if not (folder / ".sha256").is_file() or not (folder / m.member).is_file():
            continue  # not fetched here, or left out of the carried files (scripts/fetch-device-carry)
        for form in m.forms:
            def feeds(model, batch, name=name):
                base = rm.feeds(name)
                if batch == 1:
                    return base
                if len(base) != 1 or not model.graph.input[0].type.tensor_type.shape.dim[0].dim_param:
                    return None  # a batch only for one input whose first dim is free (not silero's state)
                (k, v), = base.items()
                return {k: np.concatenate([v] * batch, axis=0)}
            yield "real", name, form, (lambda name=name, form=form: rm.load(name, form)), feeds


def prepare(work: Path, smoke: bool, deadline: float) -> None:
    """Write every case's model, feeds and oracle outputs; one manifest line per case done."""
    import logging  # noqa: PLC0415

    import onnx  # noqa: PLC0415

    from onnx_quant.oracles import choose_oracle, exact_onnxruntime_run, onnxruntime_run, run_oracle  # noqa: PLC0415

    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime's quantizer warns once per model otherwise

    batches = SMOKE_BATCHES if smoke else FULL_BATCHES
    (work / "cases").mkdir(parents=True, exist_ok=True)
    manifest = work / "manifest.jsonl"
    for gen in (_zoo_cases, _exported_cases, _real_cases):
        for tier, model_name, form, build, make_feeds in gen(smoke):
            if time.time() > deadline:
                print(f"prepare: budget spent before {tier}/{model_name}/{form}", flush=True)
                return
            try:
                model = build()
                path = work / "cases" / f"{tier}-{model_name}-{form}.onnx"
                onnx.save(model, path)
                oracle = choose_oracle(model)
                for batch in batches:
                    feeds = make_feeds(model, batch)
                    if feeds is None:
                        continue
                    case = f"{tier}-{model_name}-{form}-b{batch}"
                    np.savez(work / "cases" / f"{case}.feeds.npz", **feeds)
                    np.savez(work / "cases" / f"{case}.oracle.npz", *run_oracle(oracle, model, feeds))
                    if oracle.name.startswith("onnxruntime"):  # the graph as written, too (see verdict)
                        run = exact_onnxruntime_run if oracle.name == "onnxruntime-u8u8" else onnxruntime_run
                        np.savez(work / "cases" / f"{case}.oracle-as-written.npz",
                                 *run(model, feeds, level="ORT_DISABLE_ALL"))
                    with open(manifest, "a") as f:
                        f.write(json.dumps({"case": case, "tier": tier, "model": model_name, "form": form,
                                            "batch": batch, "path": str(path), "oracle": oracle.name}) + "\n")
            except Exception as e:  # noqa: BLE001 - a case that cannot be built is a note, not the end
                print(f"prepare: {tier}/{model_name}/{form}: {type(e).__name__}: {e}", flush=True)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_part(runner: str, work: Path, smoke: bool, deadline: float) -> None:
    """One runner over every case (batch 1 of every model first), a result line per case."""
    cases = sorted(_read_jsonl(work / "manifest.jsonl"), key=lambda c: c["batch"])
    max_runs, cap = SMOKE_RUNS if smoke else FULL_RUNS
    out = work / f"{runner}.jsonl"
    for case in cases:
        if time.time() > deadline:
            print(f"{runner}: budget spent; {case['case']} and later not run", flush=True)
            return
        with np.load(work / "cases" / f"{case['case']}.feeds.npz") as z:
            feeds = {k: z[k] for k in z.files}
        expected = []
        for kind in ("oracle", "oracle-as-written"):
            path = work / "cases" / f"{case['case']}.{kind}.npz"
            if path.is_file():
                with np.load(path) as z:
                    expected.append([z[f"arr_{i}"] for i in range(len(z.files))])
        row = timed_case(runner, case, feeds, expected, cap, max_runs)
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{runner}: {case['case']}: {row['status']}"
              + (f" {row['steady_s'] * 1e3:.3f} ms" if "steady_s" in row else f" ({row.get('error', '')})"), flush=True)


# ----------------------------------------------------------------------------- orchestration


def adapter_lines() -> list[str]:
    """The adapters wgpu finds and the one this project's Session picks."""
    try:
        from onnx_quant.backend_wgpu.device import get_device, list_adapters  # noqa: PLC0415

        lines = [f"adapter {i}: {a.summary}" for i, a in enumerate(list_adapters())]
        info = get_device().info
        return lines + [f"picked: {info.name} ({info.backend}); features: {', '.join(sorted(info.features))}"]
    except Exception as e:  # noqa: BLE001
        return [f"no wgpu adapter: {type(e).__name__}: {e}"]


def _missing(runner: str) -> str | None:
    """Why a part cannot run here, or None."""
    if runner == "prepare":
        return None
    if runner == "roofline":
        return None if (HERE / "roofline.py").is_file() else "benchmarks/roofline.py is not in this tree"
    if runner == "onnxruntime-webgpu" and not os.environ.get("DEVICE_CHECK_ORTWEB"):
        return "onnxruntime-webgpu not unpacked (DEVICE_CHECK_ORTWEB unset: scripts/fetch-device-carry)"
    env_path = os.environ.get("DEVICE_CHECK_ORTWEB") if runner == "onnxruntime-webgpu" else None
    if env_path:
        return None if (Path(env_path) / "onnxruntime").is_dir() else f"no onnxruntime under {env_path}"
    return None if importlib.util.find_spec(NEEDS[runner]) else f"{NEEDS[runner]} is not installed"


def _child(args: list[str], timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a part; its output streams to ours; killed at ``timeout`` seconds."""
    t0 = time.time()
    try:
        done = subprocess.run([sys.executable, *args], timeout=max(1.0, timeout), env=env)
        return {"rc": done.returncode, "s": round(time.time() - t0, 2)}
    except subprocess.TimeoutExpired:
        return {"rc": "killed at its budget", "s": round(time.time() - t0, 2)}


def run_all(out: Path, smoke: bool, budget: float) -> dict[str, Any]:
    start = time.time()
    work = out / "work" if os.environ.get("DEVICE_CHECK_KEEP") else Path(os.environ.get("TMPDIR", "/tmp")) / f"device-check-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    me = str(Path(__file__).resolve())
    common = ["--work", str(work)] + (["--smoke"] if smoke else [])
    report: dict[str, Any] = {"smoke": smoke, "budget_s": budget, "adapter": adapter_lines(), "parts": {}}
    print("\n".join(report["adapter"]), flush=True)
    skipped = {part: why for part in SHARES if (why := _missing(part))}
    for part, why in skipped.items():
        report["parts"][part] = {"skipped": why}
        print(f"{part}: skipped: {why}", flush=True)
    active = {part: share for part, share in SHARES.items() if part not in skipped}
    scale = sum(SHARES.values()) / sum(active.values())  # what a skipped part would have had goes to the others
    t = start
    for part, share in active.items():
        t += share * scale * budget  # a part may also use what the ones before it left
        if part == "roofline":
            report["parts"][part] = roofline(out, smoke, t - time.time())
            continue
        env = dict(os.environ)
        if part == "onnxruntime-webgpu":
            env["PYTHONPATH"] = os.pathsep.join([os.environ["DEVICE_CHECK_ORTWEB"], env.get("PYTHONPATH", "")])
        report["parts"][part] = _child([me, "--part", part, "--deadline", str(t - 2.0), *common],
                                       t - time.time() + 5.0, env)
    report["cases"] = _read_jsonl(work / "manifest.jsonl")
    report["rows"] = [r for name in RUNNERS for r in _read_jsonl(work / f"{name}.jsonl")]
    report["elapsed_s"] = round(time.time() - start, 1)
    write_report(out, report)
    if not os.environ.get("DEVICE_CHECK_KEEP"):
        shutil.rmtree(work, ignore_errors=True)
    return report


def roofline(out: Path, smoke: bool, timeout: float) -> dict[str, Any]:
    script = HERE / "roofline.py"
    args = [str(script), "--json", str(out / "roofline.json")] + (["--short"] if smoke else [])
    t0 = time.time()
    try:
        with open(out / "roofline.txt", "w") as f:
            done = subprocess.run([sys.executable, *args], stdout=f, stderr=subprocess.STDOUT, timeout=max(1.0, timeout))
        return {"rc": done.returncode, "s": round(time.time() - t0, 2), "table": "roofline.txt"}
    except subprocess.TimeoutExpired:
        return {"rc": "killed at its budget", "s": round(time.time() - t0, 2)}


# ----------------------------------------------------------------------------- the report


def markdown(report: dict[str, Any]) -> str:
    runners = [r for r in RUNNERS if any(row["runner"] == r for row in report["rows"])]
    lines = ["# Device check" + (" (smoke)" if report["smoke"] else ""), ""]
    lines += [f"- {a}" for a in report["adapter"]]
    for part, p in report["parts"].items():
        lines.append(f"- {part}: " + (f"skipped ({p['skipped']})" if "skipped" in p else f"rc {p['rc']}, {p['s']} s"))
    by = {(r["case"], r["runner"]): r for r in report["rows"]}
    for batch in sorted({c["batch"] for c in report["cases"]}):
        lines += ["", f"## batch {batch}: steady ms per run (verdict against the oracle; throughput = batch / steady)", "",
                  "| case | oracle | " + " | ".join(runners) + " |", "|---|---|" + "---|" * len(runners)]
        for c in (c for c in report["cases"] if c["batch"] == batch):
            cells = []
            for r in runners:
                row = by.get((c["case"], r))
                if row is None:
                    cells.append("not run")
                elif row["status"] == "n/a":
                    cells.append("n/a")
                elif row["status"] == "error":
                    cells.append("error: " + row["error"][:60].replace("|", "/"))
                else:
                    cells.append(f"{row['steady_s'] * 1e3:.3f} ({row['status']}"
                                 + (f", {row['throughput']:.0f}/s" if batch > 1 else "") + ")")
            lines.append(f"| {c['tier']} {c['model']} {c['form']} | {c['oracle']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plots(out: Path, report: dict[str, Any]) -> list[str]:
    if importlib.util.find_spec("matplotlib") is None:
        return []
    import plots as plot_lib  # noqa: PLC0415 - benchmarks/plots.py

    made = []
    runners = [r for r in RUNNERS if any(row["runner"] == r for row in report["rows"])]
    by = {(r["case"], r["runner"]): r for r in report["rows"] if "steady_s" in r}
    for batch, key, scale, label, name in ((min(FULL_BATCHES), "steady_s", 1e3, "ms per run (log)", "latency"),
                                           (None, "throughput", 1.0, "inferences / s (log)", "throughput")):
        batch = batch if batch is not None else max(c["batch"] for c in report["cases"])
        cases = [c for c in report["cases"] if c["batch"] == batch]
        if not cases:
            continue
        series = {r: [by[(c["case"], r)][key] * scale if (c["case"], r) in by else None for c in cases] for r in runners}
        series = {r: v for r, v in series.items() if any(x for x in v)}
        if series:
            made.append(plot_lib.grouped_bars(out / f"device_check_{name}.png", f"{name}, batch {batch}",
                                              [f"{c['model']} {c['form']}" for c in cases], series, label, log=True))
    return made


def write_report(out: Path, report: dict[str, Any]) -> None:
    (out / "device_check.md").write_text(markdown(report))
    try:
        report["plots"] = [Path(p).name for p in plots(out, report)] or "matplotlib not installed: no PNG"
    except Exception as e:  # noqa: BLE001 - a plot is never worth the JSON
        report["plots"] = f"plots failed: {type(e).__name__}: {e}"
    (out / "device_check.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {out / 'device_check.json'}, {out / 'device_check.md'}, plots: {report['plots']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a few small models at batch 1 and 2 (CI)")
    p.add_argument("--out", help="where the report goes (default $OUT, else out/device_check)")
    p.add_argument("--budget", type=float, help="seconds for everything (default 450; 150 with --smoke)")
    p.add_argument("--part", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.part:
        work = Path(args.work)
        if importlib.util.find_spec("onnxruntime"):  # its per-run shape warnings would drown the log
            import onnxruntime  # noqa: PLC0415

            onnxruntime.set_default_logger_severity(3)
        if args.part == "prepare":
            prepare(work, args.smoke, args.deadline)
        else:
            run_part(args.part, work, args.smoke, args.deadline)
        return 0
    out = Path(args.out or os.environ.get("OUT") or "out/device_check")
    out.mkdir(parents=True, exist_ok=True)
    report = run_all(out, args.smoke, args.budget or (150.0 if args.smoke else 450.0))
    bad = [r for r in report["rows"] if r["runner"] == "onnx-quant" and r["status"] != "agrees"]
    ran = [r for r in report["rows"] if r["runner"] == "onnx-quant"]
    print(f"onnx-quant: {len(ran) - len(bad)} of {len(ran)} cases agree with their oracle", flush=True)
    return 0 if ran and not bad else 1


if __name__ == "__main__":
    sys.exit(main())

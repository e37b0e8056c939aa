"""ONNX's whole node suite on the GPU: every case of ``collect_testcases()`` (1884 in onnx
1.23.2), each run through Session with no host fallback, beside onnxruntime's CPU provider on the
same cases, summarised per op type (``onnx-quant conformance --suite all``).

Each case gets one outcome:

- ``pass``: outputs agree with the case's expected outputs (the comparison of
  :func:`conformance.compare_outputs`: integers and bools exact, floats within the case's
  rtol/atol) and every node ran on the GPU (or was folded, a view or a Constant);
- ``wrong``: the GPU ran the model and an output differs: a bug, the one outcome that must stay 0;
- ``no kernel``: some node's op type has no GPU kernel at the model's opset;
- ``host-only``: some node's op is host-only by nature (strings, image decoding, tree ensembles,
  training steps: :data:`verdict.HOST_ONLY_OPS`), declined by name;
- ``declined``: a kernel exists but declines the node (a type, attribute or shape outside what it
  computes exactly: ``KernelRejected``), or the case has values the GPU backend does not take
  (strings, alone or in a sequence);
- ``error``: an internal error or a shader the device refuses to compile: a bug too, reported,
  never a crash of the run.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from onnx_quant.node_cases import all_node_cases

from .conformance import CaseResult, case_op_type, run_conformance
from .verdict import HOST_ONLY

OUTCOMES = ("pass", "wrong", "declined", "no kernel", "host-only", "error")


def suite_cases(ops: Iterable[str] | None = None) -> list[Any]:
    """Every node case of the installed onnx with a model, or those whose op type (the
    expanded cases count as their op) is one of ``ops`` (case-insensitive)."""
    wanted = None if ops is None else {o.strip().lower() for o in ops if o.strip()}
    out = []
    for case in all_node_cases():
        if case.model is None:
            continue
        if wanted is not None and case_op_type(case).split(" ")[0].lower() not in wanted:
            continue
        out.append(case)
    return out


def outcome(row: CaseResult) -> str:
    """The row's outcome (one of :data:`OUTCOMES`)."""
    if row.passed:
        return "pass"
    if row.max_error is not None and not row.outputs_match:
        return "wrong"
    error = row.error or ""
    if f" {HOST_ONLY}: " in error:
        return "host-only"
    if "no GPU kernel for" in error:
        return "no kernel"
    if error.startswith("internal error") or "compiling the shader failed" in error:
        return "error"  # a bug of ours (a shader the device rejects), never a decline
    return "declined"


@dataclass
class OpSummary:
    op_type: str
    cases: int = 0
    passed: int = 0
    wrong: int = 0
    declined: int = 0
    no_kernel: int = 0
    host_only: int = 0
    errors: int = 0
    onnxruntime: int | None = None  # cases onnxruntime CPU passes (None: not run)

    def add(self, row: CaseResult) -> None:
        self.cases += 1
        kind = outcome(row)
        attr = {"pass": "passed", "no kernel": "no_kernel", "host-only": "host_only", "error": "errors"}.get(kind, kind)
        setattr(self, attr, getattr(self, attr) + 1)


def summarise(rows: Sequence[CaseResult], ort_rows: Sequence[CaseResult] | None = None) -> list[OpSummary]:
    """One :class:`OpSummary` per op type, in first-seen order, then an ``all`` row."""
    by_op: dict[str, OpSummary] = collections.OrderedDict()
    total = OpSummary("all")
    ort_pass = {r.case for r in ort_rows or () if r.passed}
    for r in rows:
        s = by_op.setdefault(r.op_type, OpSummary(r.op_type, onnxruntime=0 if ort_rows is not None else None))
        for target in (s, total):
            target.add(r)
            if ort_rows is not None:
                target.onnxruntime = (target.onnxruntime or 0) + (r.case in ort_pass)
    return [*by_op.values(), total]


def run_suite(ops: Iterable[str] | None = None, *, device: Any = None, adapter: Any = None,
              onnxruntime: bool = True, progress: Callable[[str, int, int, CaseResult], None] | None = None,
              ) -> tuple[list[CaseResult], list[CaseResult] | None]:
    """(GPU rows with no host fallback, onnxruntime CPU rows or None) over :func:`suite_cases`;
    ``progress(engine, i, n, row)`` after each case."""
    cases = suite_cases(ops)

    def report(engine: str):
        return None if progress is None else (lambda i, n, row: progress(engine, i, n, row))

    gpu = run_conformance(device=device, adapter=adapter, cases=cases, host_fallback=False, progress=report("gpu"))
    if not onnxruntime:
        return gpu, None
    return gpu, run_conformance(engine="onnxruntime", cases=cases, progress=report("onnxruntime"))


def format_summary(summary: Sequence[OpSummary]) -> str:
    """The per-op table as text (the CLI's output; docs/conformance.md writes it as markdown)."""
    width = max(len(s.op_type) for s in summary)
    head = f"{'op':<{width}}  {'cases':>5}  {'pass':>5}  {'wrong':>5}  {'declined':>8}  {'no kernel':>9}  {'host-only':>9}  {'error':>5}"
    with_ort = summary[-1].onnxruntime is not None
    lines = [head + ("  onnxruntime-cpu" if with_ort else "")]
    for s in summary:
        line = (f"{s.op_type:<{width}}  {s.cases:>5}  {s.passed:>5}  {s.wrong:>5}  {s.declined:>8}  "
                f"{s.no_kernel:>9}  {s.host_only:>9}  {s.errors:>5}")
        lines.append(line + (f"  {s.onnxruntime:>15}" if with_ort else ""))
    return "\n".join(lines)

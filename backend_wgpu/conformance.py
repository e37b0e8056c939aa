"""Conformance: ONNX's own node test cases for the quantization family, run on the GPU.

``onnx.backend.test.case.node.collect_testcases()`` builds every node test case of the
installed onnx in memory (model + input arrays + expected outputs; no data files needed).
This module keeps the ones whose model has a node of the family (:data:`FAMILY_OPS`: 45 cases
at opset 28 with onnx 1.23), runs each through :class:`backend_wgpu.Session` and compares with
the expected outputs:

- integer, bool and narrow-float (float8 x5, float4, float6) outputs **bit for bit** (any NaN
  equals any NaN: NaN payloads are not compared);
- float16/bfloat16/float32/float64 outputs with the tolerance onnx's own backend harness uses
  (``rtol`` / ``atol`` of the case: 1e-3 / 1e-7 for all of these), NaN equal to NaN;
- dtype and shape exactly.

Every row reports the largest absolute error (in the output's own units; 0.0 when exact),
the kernel variant each node ran with, and whether any node ran on the host (the graph
executor's fallback through onnx's reference evaluator). **A case that ran any node on the
host does not pass on the GPU**, whatever its values.

The same cases can be run through onnxruntime's CPU provider (:func:`run_case_onnxruntime`)
for comparison; ``benchmarks/gen_conformance_doc.py`` writes both into docs/conformance.md.
"""

from __future__ import annotations

import functools
import re
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from onnx_quant.errors import ExecutionError, QuantError
from onnx_quant.node_cases import all_node_cases
from onnx_quant.oracles import not_an_oracle

from .reporting import host_nodes, make_session
from .sequence_steps import value_shape

#: the op types whose node cases make up the conformance set
FAMILY_OPS: tuple[str, ...] = (
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
    "QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger",
)

#: the tolerance onnx's backend test harness uses for node cases (``TestCase.rtol/atol``)
DEFAULT_RTOL, DEFAULT_ATOL = 1e-3, 1e-7

#: float types compared with a tolerance; every other type is compared bit for bit
_WIDE_FLOATS = ("float16", "bfloat16", "float32", "float64")

# ------------------------------------------------------------------------------------ cases


def case_ops(case: Any) -> list[str]:
    return [n.op_type for n in case.model.graph.node]


def family_cases(ops: Iterable[str] | None = None) -> list[Any]:
    """The family's node cases in onnx's order; ``ops`` restricts them to some op types
    (case-insensitive; the expanded DynamicQuantizeLinear cases count as that op)."""
    wanted = None
    if ops is not None:
        given = [o.strip() for o in ops if o.strip()]
        wanted = {o.lower() for o in given}
        known = {o.lower() for o in FAMILY_OPS}
        unknown = [o for o in given if o.lower() not in known]
        if unknown:
            raise ExecutionError(f"--ops {', '.join(unknown)}: not in the quantization family "
                                 f"({', '.join(FAMILY_OPS)})")
    out = []
    for case in all_node_cases():
        if case.model is None or not any(op in FAMILY_OPS for op in case_ops(case)):
            continue
        if wanted is not None and case_op_type(case).split(" ")[0].lower() not in wanted:
            continue
        out.append(case)
    return out


def case_names(ops: Iterable[str] | None = None) -> list[str]:
    return [c.name for c in family_cases(ops)]


def case_op_type(case: Any) -> str:
    """The op a case tests: its single node's op, or ``<op> (expanded)`` for a case whose model
    is the function expansion of an op (``test_*_expanded``, ``test_*_expanded_ver18``)."""
    ops = case_ops(case)
    if len(ops) == 1:
        return ops[0]
    m = re.fullmatch(r"(.*)_expanded(_ver\d+)?", case.name)
    if m:
        op = _single_op_cases().get(m.group(1))
        if op is not None:
            return f"{op} (expanded)"
    fam = [op for op in ops if op in FAMILY_OPS]
    if fam:
        return "+".join(dict.fromkeys(fam))
    distinct = list(dict.fromkeys(ops))
    return "+".join(distinct[:3]) + ("+..." if len(distinct) > 3 else "")


@functools.lru_cache(maxsize=1)
def _single_op_cases() -> dict[str, str]:
    """Case name -> op type of every one-node case (what an expanded case expands)."""
    return {c.name: c.model.graph.node[0].op_type for c in all_node_cases()
            if c.model is not None and len(c.model.graph.node) == 1}


def _as_array(value: Any) -> Any:
    """A tensor as an array; a sequence stays a list (of arrays), an empty optional None."""
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list):
        return [_as_array(v) for v in value]
    if value is None:
        return None
    return np.asarray(value)


def case_io(case: Any, data_set: int = 0) -> tuple[dict[str, np.ndarray], list[str], list[np.ndarray]]:
    """(feeds by graph input name, output names, expected outputs) of one data set."""
    inputs, expected = case.data_sets[data_set]
    inits = {t.name for t in case.model.graph.initializer}
    names = [vi.name for vi in case.model.graph.input if vi.name not in inits]
    feeds = {name: _as_array(a) for name, a in zip(names, inputs)}
    outs = [vi.name for vi in case.model.graph.output]
    return feeds, outs, [_as_array(e) for e in expected]


# ------------------------------------------------------------------------------ comparison


def _type_name(dtype: np.dtype) -> str:
    from onnx_quant.dtypes import element_type  # noqa: PLC0415

    try:
        return element_type(dtype).name
    except QuantError:
        return str(dtype)


@dataclass
class Comparison:
    passed: bool
    exact: bool
    max_error: float
    detail: str  # empty when passed


def compare_outputs(got: Sequence[Any], expected: Sequence[np.ndarray], names: Sequence[str], *,
                    rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL) -> Comparison:
    """Compare a run's outputs with the expected ones (see the module docstring for the rules)."""
    if len(got) != len(expected):
        return Comparison(False, False, float("nan"), f"{len(got)} outputs, expected {len(expected)}")
    passed, exact, max_err, problems = True, True, 0.0, []
    for name, g, e in zip(names, got, expected):
        if isinstance(e, list) or e is None:  # a sequence or an optional: element by element
            items = e or []
            sub = (compare_outputs(list(g), items, [f"{name}[{i}]" for i in range(len(items))], rtol=rtol, atol=atol)
                   if isinstance(g, list) else Comparison(g is None and e is None, g is None and e is None, 0.0,
                                                          f"{name}: a {type(g).__name__}, expected {e!r:.40}"))
            passed, exact, max_err = passed and sub.passed, exact and sub.exact, max(max_err, sub.max_error)
            if sub.detail:
                problems.append(sub.detail)
            continue
        g = np.asarray(g)
        e = np.asarray(e)
        if g.dtype != e.dtype:
            passed = exact = False
            problems.append(f"{name}: dtype {_type_name(g.dtype)}, expected {_type_name(e.dtype)}")
            continue
        if g.shape != e.shape:
            passed = exact = False
            problems.append(f"{name}: shape {list(g.shape)}, expected {list(e.shape)}")
            continue
        if g.size == 0:
            continue
        tname = _type_name(e.dtype)
        is_float = e.dtype.kind == "f" or tname.startswith("float") or tname == "bfloat16"
        if is_float:
            gf = g.astype(np.float64)
            ef = e.astype(np.float64)
            nan_g, nan_e = np.isnan(gf), np.isnan(ef)
            nan_bad = int(np.count_nonzero(nan_g != nan_e))
            both = ~nan_g & ~nan_e
            with np.errstate(all="ignore"):
                diff = np.where(both & (gf == ef), 0.0, np.abs(gf - ef))  # inf == inf -> 0
            diff = np.where(both, diff, 0.0)
            err = float(np.max(diff)) if diff.size else 0.0
            if nan_bad:
                err = float("inf")
            max_err = max(max_err, err)
            if tname in _WIDE_FLOATS:
                bits_equal = nan_bad == 0 and bool(np.all(np.where(both, gf == ef, True)))
                with np.errstate(all="ignore"):
                    close = np.where(both, (diff <= atol + rtol * np.abs(ef)), True)
                bad = int(np.count_nonzero(~close)) + nan_bad
                exact &= bits_equal
                if bad:
                    passed = False
                    problems.append(f"{name}: {bad} of {e.size} elements beyond rtol={rtol:g} atol={atol:g} "
                                    f"(max |diff| {err:.6g})")
            else:  # narrow floats: bit for bit, NaN payloads aside
                gb = g.view(np.uint8) if g.dtype.itemsize == 1 else g.view(f"u{g.dtype.itemsize}")
                eb = e.view(np.uint8) if e.dtype.itemsize == 1 else e.view(f"u{e.dtype.itemsize}")
                same = (gb == eb) | (nan_g & nan_e)
                bad = int(np.count_nonzero(~same))
                if bad:
                    passed = exact = False
                    problems.append(f"{name}: {bad} of {e.size} {tname} elements differ bit for bit "
                                    f"(max |diff| {err:.6g})")
        else:
            gi = g.astype(np.int64) if tname not in ("uint64",) else g.astype(np.float64)
            ei = e.astype(np.int64) if tname not in ("uint64",) else e.astype(np.float64)
            d = np.abs(gi - ei)
            bad = int(np.count_nonzero(d))
            if bad:
                err = float(np.max(d))
                max_err = max(max_err, err)
                passed = exact = False
                problems.append(f"{name}: {bad} of {e.size} {tname} elements differ (max |diff| {err:g})")
    return Comparison(passed, exact and passed, max_err, "; ".join(problems))


# ---------------------------------------------------------------------------------- rows


@dataclass
class CaseResult:
    """One row of the conformance table."""

    case: str
    op_type: str
    passed: bool = False  # values agree AND no node ran on the host
    outputs_match: bool = False  # values agree (whatever ran them)
    exact: bool = False  # bit-identical outputs
    max_error: float | None = None  # largest |got - expected| over all outputs; None if nothing ran
    variants: list[str] = field(default_factory=list)  # "kernel/variant" per node run on the GPU
    host_fallback: list[str] = field(default_factory=list)  # op types of nodes run on the host
    error: str | None = None
    seconds: float = 0.0
    engine: str = "gpu"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["max_error"] is not None and not np.isfinite(d["max_error"]):
            d["max_error"] = str(d["max_error"])  # JSON has no inf/nan
        return d


def _first_line(e: BaseException) -> str:
    """One line for a row: a QuantError's own message, else the exception type and message."""
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    if isinstance(e, QuantError):
        return first or type(e).__name__
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def kernel_variants(session: Any, feeds: Mapping[str, np.ndarray]) -> list[str]:
    """``kernel/variant`` of each node the session planned for these feeds' shapes."""
    try:
        entries = session.explain({k: value_shape(v) for k, v in feeds.items()})
    except Exception:
        return []
    out = []
    for e in entries:
        kernel, variant = e.get("kernel"), e.get("variant")
        placement = e.get("placement", "gpu")  # the graph executor says where each node ran
        if placement == "gpu" and kernel and variant:
            out.append(f"{kernel}/{variant}")
    return out


def run_case(case: Any, *, device: Any = None, adapter: Any = None, host_fallback: bool = True) -> CaseResult:
    """Run one node case on the GPU through Session and compare with its expected outputs."""
    row = CaseResult(case=case.name, op_type=case_op_type(case))
    t0 = time.perf_counter()
    session = None
    try:
        feeds, names, expected = case_io(case)
        session = make_session(case.model, device=device, adapter=adapter, host_fallback=host_fallback)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = session.run(None, feeds)
        cmp = compare_outputs(got, expected, names, rtol=case.rtol or DEFAULT_RTOL, atol=case.atol or DEFAULT_ATOL)
        row.max_error = cmp.max_error
        row.outputs_match = cmp.passed
        row.exact = cmp.exact
        row.host_fallback = host_nodes(session)
        row.variants = kernel_variants(session, feeds)
        row.passed = cmp.passed and not row.host_fallback
        if not cmp.passed:
            row.error = cmp.detail
        elif row.host_fallback:
            row.error = f"ran on the host: {', '.join(row.host_fallback)}"
    except QuantError as e:
        row.error = _first_line(e)
    except Exception as e:  # a bug somewhere below: reported per case, never a crash of the run
        row.error = f"internal error: {_first_line(e)}"
    finally:
        if session is not None:
            try:
                session.close()
            except Exception:  # pragma: no cover
                pass
    row.seconds = time.perf_counter() - t0
    return row


def run_case_onnxruntime(case: Any) -> CaseResult:
    """Run one node case with onnxruntime's CPU provider and compare it the same way."""
    row = CaseResult(case=case.name, op_type=case_op_type(case), engine="onnxruntime-cpu")
    t0 = time.perf_counter()
    try:
        import onnxruntime as ort  # noqa: PLC0415

        feeds, names, expected = case_io(case)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        with not_an_oracle():  # a peer column: onnxruntime's own verdict on the case, whatever its CPU
            sess = ort.InferenceSession(case.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            got = sess.run(None, feeds)
        cmp = compare_outputs(got, expected, names, rtol=case.rtol or DEFAULT_RTOL, atol=case.atol or DEFAULT_ATOL)
        row.max_error = cmp.max_error
        row.outputs_match = row.passed = cmp.passed
        row.exact = cmp.exact
        row.error = cmp.detail or None
    except ImportError:
        row.error = "onnxruntime is not installed"
    except Exception as e:
        text = str(e).strip().splitlines()
        msg = text[0] if text else type(e).__name__
        # onnxruntime prefixes "[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : "
        row.error = msg.split(" : ", 3)[-1] if msg.startswith("[ONNXRuntimeError]") else f"{type(e).__name__}: {msg}"
    row.seconds = time.perf_counter() - t0
    return row


Progress = Callable[[int, int, CaseResult], None]


def run_conformance(ops: Iterable[str] | None = None, *, adapter: Any = None, device: Any = None,
                    engine: str = "gpu", progress: Progress | None = None, cases: Sequence[Any] | None = None,
                    host_fallback: bool = True) -> list[CaseResult]:
    """Every family case (``ops`` restricts the op types), or the given ``cases``, on ``engine``
    ("gpu", with or without ``host_fallback``, or "onnxruntime"); ``progress(i, n, row)`` is called
    after each case."""
    cases = family_cases(ops) if cases is None else list(cases)
    if engine == "gpu" and device is None:
        from .device import get_device  # noqa: PLC0415

        device = get_device(adapter)
    rows = []
    for i, case in enumerate(cases, 1):
        row = (run_case(case, device=device, host_fallback=host_fallback) if engine == "gpu"
               else run_case_onnxruntime(case))
        rows.append(row)
        if progress is not None:
            progress(i, len(cases), row)
    return rows


# ------------------------------------------------------------------------------ formatting


def fmt_error(v: float | None) -> str:
    if v is None:
        return "-"
    if v == 0:
        return "0"
    if not np.isfinite(v):
        return str(v)
    return f"{v:.3g}"


def status(row: CaseResult) -> str:
    if row.passed:
        return "PASS"
    if row.outputs_match and row.host_fallback:
        return "HOST"  # right values, but not (all) on the GPU
    return "FAIL" if row.max_error is not None else "ERROR"


def totals(rows: Sequence[CaseResult]) -> dict[str, int]:
    return {
        "cases": len(rows),
        "passed": sum(r.passed for r in rows),
        "failed": sum(not r.passed for r in rows),
        "host_fallback": sum(bool(r.host_fallback) for r in rows),
        "errors": sum(r.max_error is None for r in rows),
    }


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def format_table(rows: Sequence[CaseResult], device_name: str = "", *, error_width: int = 140) -> str:
    width = max([len(r.case) for r in rows] + [4])
    opw = max([len(r.op_type) for r in rows] + [7])
    lines = [f"{'case':<{width}}  {'op_type':<{opw}}  {'result':<6}  {'max err':>8}  {'host':<4}  variants / error"]
    for r in rows:
        tail = ", ".join(dict.fromkeys(r.variants)) if r.passed else _clip(r.error or "", error_width)
        host = "yes" if r.host_fallback else ("no" if r.max_error is not None else "-")
        lines.append(f"{r.case:<{width}}  {r.op_type:<{opw}}  {status(r):<6}  {fmt_error(r.max_error):>8}  "
                     f"{host:<4}  {tail}")
    t = totals(rows)
    where = f" on {device_name}" if device_name else ""
    lines.append(f"{t['passed']}/{t['cases']} passed{where} ({t['failed']} not passing: "
                 f"{t['host_fallback']} with host fallback, {t['errors']} errors)")
    return "\n".join(lines)

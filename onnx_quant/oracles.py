"""Oracles whose verdict does not depend on the host CPU.

onnxruntime's CPU kernels for uint8 x int8 integer GEMMs (QLinearConv, QLinearMatMul,
MatMulInteger, ConvInteger, QGemm, DynamicQuantizeMatMul, MatMulIntegerToFloat,
DynamicQuantizeLSTM) use VPMADDUBSW on x86 hosts with AVX2 but no VNNI: each pair of
uint8 x int8 products is summed into an int16 with saturation, so a sum beyond 32767 is
clamped (onnxruntime's quantization guide says so and names U8U8 as the format without the
issue). On such a host onnxruntime is not an exact oracle for u8s8 models.

The exact oracle here is onnxruntime itself on the model *widened* to U8U8: every int8 weight
side ``w`` (zero point ``z``) of a uint8 x int8 GEMM becomes the uint8 ``w + 128`` with zero
point ``z + 128``. ``(w + 128) - (z + 128) == w - z``, so every integer sum, and everything
onnxruntime computes from it (its requantization, its QDQ fusions, its lookup tables), is what
onnxruntime computes on a VNNI host, on every CPU. :func:`exact_onnxruntime_run` is that oracle;
:func:`choose_oracle` says which one a comparison of a model should use on this host and why.

The second, independent oracle is ``onnx.reference`` with the com.microsoft ops and Q/DQ of
every opset (:mod:`onnx_quant.reference_ops`): exact integer sums, float64 where onnx.reference
computes in float64.

The int32 accumulators of the U8U8 path hold ``sum(a * b)`` before the zero-point corrections:
exact while K * 255 * 255 < 2^31 (K < 33,025 per output), which every GEMM of a real model meets.
Only the main graph is widened (an integer GEMM inside an If/Loop body keeps its int8 weights).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: (domain, op_type) -> (activation input index or None when the op quantizes a float input
#: itself to uint8, ((weight input, weight zero-point input), ...), activation zero-point index)
INTEGER_GEMMS: dict[tuple[str, str], tuple[int | None, tuple[tuple[int, int], ...], int | None]] = {
    ("", "QLinearConv"): (0, ((3, 5),), 2),
    ("", "QLinearMatMul"): (0, ((3, 5),), 2),
    ("", "MatMulInteger"): (0, ((1, 3),), 2),
    ("", "ConvInteger"): (0, ((1, 3),), 2),
    ("com.microsoft", "QGemm"): (0, ((3, 5),), 2),
    ("com.microsoft", "MatMulIntegerToFloat"): (0, ((1, 5),), 4),
    ("com.microsoft", "DynamicQuantizeMatMul"): (None, ((1, 3),), None),
    ("com.microsoft", "DynamicQuantizeLSTM"): (None, ((1, 9), (2, 11)), None),
}

#: float ops whose input 1 is the weight side onnxruntime's QDQ fusion turns into an integer GEMM
QDQ_WEIGHT_CONSUMERS = {"Conv": 1, "MatMul": 1, "Gemm": 1}

#: CPU flags (as /proc/cpuinfo names them) with which MLAS sums u8s8 products exactly
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


# --------------------------------------------------------------------------- the host


def cpu_flags() -> frozenset[str]:
    """The host CPU's feature flags as /proc/cpuinfo lists them (empty where it has none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def u8s8_exact_on(flags: Iterable[str], machine: str | None = None) -> bool:
    """Whether onnxruntime's u8s8 integer GEMMs sum exactly on a CPU with these flags: not on
    x86 without a VNNI form (VPMADDUBSW saturates product pairs at int16), else yes (VNNI's
    VPDPBUSD and AMX accumulate in int32; Arm's kernels widen to 16-bit products first)."""
    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return True
    return bool(VNNI_FLAGS & set(flags))


#: set while onnxruntime runs for something other than an oracle's values (the probe below, a
#: count of its optimized nodes): the test suite's guard against comparisons with a saturating
#: oracle lets such sessions be made
_NOT_AN_ORACLE = contextvars.ContextVar("onnxruntime_not_an_oracle", default=False)


@contextlib.contextmanager
def not_an_oracle():
    """Marks onnxruntime sessions made inside as not used as a value oracle."""
    token = _NOT_AN_ORACLE.set(True)
    try:
        yield
    finally:
        _NOT_AN_ORACLE.reset(token)


def in_non_oracle_use() -> bool:
    """Whether the caller is inside :func:`not_an_oracle`."""
    return _NOT_AN_ORACLE.get()


def avx2_fma_on(flags: Iterable[str], machine: str | None = None) -> bool:
    """Whether onnxruntime runs its x86 AVX2 / FMA3 MLAS kernels (QLinearAdd's fused
    multiply-adds, the FMA3 logistic) on a CPU with these flags: the kernels the project's
    numerics and reference ops reproduce bit for bit; elsewhere they differ by a step."""
    machine = (machine or platform.machine()).lower()
    return machine in ("x86_64", "amd64") and {"avx2", "fma"} <= set(flags)


def probe_u8s8_exact() -> bool:
    """Whether onnxruntime sums u8s8 exactly here, measured: MatMulInteger of [255, 255] by
    [127, 127] is 64,770 exactly, 32,767 where the pair saturates."""
    import onnxruntime as ort  # noqa: PLC0415 - an optional (test) dependency

    a = helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 2])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])
    b = numpy_helper.from_array(np.full((2, 1), 127, np.int8), "b")
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "probe", [a], [y], [b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    with not_an_oracle():
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        (out,) = sess.run(None, {"a": np.full((1, 2), 255, np.uint8)})
    return int(out.reshape(-1)[0]) == 2 * 255 * 127


@functools.lru_cache(maxsize=None)
def host_u8s8_exact() -> bool:
    """This host's answer: the probe where onnxruntime is installed, the CPU flags otherwise."""
    try:
        return probe_u8s8_exact()
    except ImportError:
        return u8s8_exact_on(cpu_flags())


# --------------------------------------------------------------------------- the model


class _Types:
    """Element types of a graph's values, as far as the graph states or its Q/DQ nodes imply:
    enough to tell a GEMM's activation side is uint8 without running any inference."""

    _PASS_THROUGH = {"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "MaxPool",
                     "Concat", "Slice", "Gather", "Split", "Expand", "Tile", "Pad", "Resize", "DepthToSpace",
                     "SpaceToDepth"}

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.known: dict[str, int] = {}
        for v in list(graph.input) + list(graph.value_info) + list(graph.output):
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
                self.known[v.name] = v.type.tensor_type.elem_type
        for t in graph.initializer:
            self.known[t.name] = t.data_type
        self.producer = {o: n for n in graph.node for o in n.output if o}

    def of(self, name: str, depth: int = 0) -> int | None:
        if not name:
            return None
        if name in self.known:
            return self.known[name]
        node = self.producer.get(name)
        if node is None or depth > 64:
            return None
        op = node.op_type
        if op == "DynamicQuantizeLinear":
            return TensorProto.UINT8 if name == node.output[0] else None
        if op == "QuantizeLinear":
            to = next((a.i for a in node.attribute if a.name == "output_dtype" and a.i), None)
            zp = self.of(node.input[2], depth + 1) if len(node.input) > 2 and node.input[2] else None
            return to or zp or TensorProto.UINT8
        if node.domain == "com.microsoft" and op.startswith("QLinear"):
            return self.of(node.input[-1], depth + 1)  # y_zero_point: the output's type
        if op in ("QLinearConv", "QLinearMatMul"):
            return self.of(node.input[7], depth + 1)
        if op in self._PASS_THROUGH and node.input:
            return self.of(node.input[0], depth + 1)
        return None

    def quantized_source(self, name: str) -> int | None:
        """The integer type behind a float value made by a DequantizeLinear."""
        node = self.producer.get(name)
        if node is None or node.op_type != "DequantizeLinear":
            return None
        return self.of(node.input[0])


@dataclass(frozen=True)
class Widened:
    """A model widened to U8U8 and the nodes whose weight sides moved (names, or op types for
    unnamed nodes)."""

    model: onnx.ModelProto
    nodes: tuple[str, ...]


def _label(node: onnx.NodeProto) -> str:
    return node.name or f"{node.op_type}({node.output[0] if node.output else ''})"


def _gemm_facts(node: onnx.NodeProto):
    """``node``'s INTEGER_GEMMS entry, or None where it is no integer GEMM."""
    return INTEGER_GEMMS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))


def _u8s8_gemm_nodes(graph: onnx.GraphProto, types: _Types) -> list[onnx.NodeProto]:
    out = []
    for node in graph.node:
        facts = _gemm_facts(node)
        if facts is None:
            continue
        act, weights, _ = facts
        if act is not None and types.of(node.input[act]) != TensorProto.UINT8:
            continue
        if any(w < len(node.input) and types.of(node.input[w]) == TensorProto.INT8 for w, _ in weights):
            out.append(node)
    return out


def _qdq_weight_dqs(graph: onnx.GraphProto, types: _Types) -> list[onnx.NodeProto]:
    """DequantizeLinear nodes of int8 initializers read only at the weight input of a Conv /
    MatMul / Gemm whose activation is a DequantizeLinear of uint8: the weights onnxruntime's QDQ
    fusion hands to a u8s8 integer GEMM."""
    inits = {t.name for t in graph.initializer}
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, i))
    out = []
    for node in graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] not in inits:
            continue
        if types.of(node.input[0]) != TensorProto.INT8:
            continue
        uses = consumers.get(node.output[0], [])
        if uses and all(QDQ_WEIGHT_CONSUMERS.get(c.op_type) == i and
                        types.quantized_source(c.input[0]) == TensorProto.UINT8 for c, i in uses):
            out.append(node)
    return out


#: int8 weights within this bound cannot saturate a VPMADDUBSW pair (2 x 255 x 64 = 32,640)
UNSATURABLE_WEIGHT = 64


def _bounded(inits: Mapping[str, onnx.TensorProto], name: str) -> bool:
    """Whether ``name`` is an initializer whose values all lie within +-UNSATURABLE_WEIGHT."""
    init = inits.get(name)
    if init is None:
        return False
    w = numpy_helper.to_array(init)
    return w.size == 0 or int(np.max(np.abs(w.astype(np.int16)))) <= UNSATURABLE_WEIGHT


def u8s8_nodes(model: onnx.ModelProto, *, saturable_only: bool = False) -> list[str]:
    """The nodes of ``model`` where onnxruntime computes a uint8 x int8 integer GEMM (as written,
    or after its QDQ fusion): where its result can saturate on an AVX2 host without VNNI. With
    ``saturable_only``, those whose int8 weights are constants within +-64 are left out: no pair
    of their products can pass int16."""
    graph = model.graph
    types = _Types(graph)
    inits = {t.name: t for t in graph.initializer} if saturable_only else {}
    found = []
    for n in _u8s8_gemm_nodes(graph, types):
        _, weights, _ = _gemm_facts(n)
        sides = [n.input[w] for w, _ in weights if w < len(n.input) and types.of(n.input[w]) == TensorProto.INT8]
        if not (saturable_only and all(_bounded(inits, s) for s in sides)):
            found.append(_label(n))
    for n in _qdq_weight_dqs(graph, types):
        if not (saturable_only and _bounded(inits, n.input[0])):
            found.append(_label(n))
    return found


class _Widener:
    """Rewrites one graph's int8 weight sides to uint8 (+128), adding new initializers and, for
    weights computed at run time, Cast -> Add(128) -> Cast nodes."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.inits = {t.name: t for t in graph.initializer}
        self.taken = {n for node in graph.node for n in list(node.input) + list(node.output)} | set(self.inits)
        self.made: dict[str, str] = {}
        self.prologue: list[onnx.NodeProto] = []

    def _fresh(self, base: str) -> str:
        name, k = f"{base}__u8", 0
        while name in self.taken:
            k += 1
            name = f"{base}__u8_{k}"
        self.taken.add(name)
        return name

    def shifted(self, name: str) -> str:
        """The name of ``name`` + 128 as uint8 (``name`` an int8 value; empty: a zero point 0)."""
        if name in self.made:
            return self.made[name]
        new = self._fresh(name or "zero_point")
        if not name:
            self.graph.initializer.append(numpy_helper.from_array(np.array(128, np.uint8), new))
        elif name in self.inits:
            w = numpy_helper.to_array(self.inits[name]).astype(np.int16) + 128
            self.graph.initializer.append(numpy_helper.from_array(w.astype(np.uint8), new))
        else:
            wide, plus, k128 = self._fresh(f"{name}_i32"), self._fresh(f"{name}_p128"), self._fresh("k128")
            self.graph.initializer.append(numpy_helper.from_array(np.array(128, np.int32), k128))
            self.prologue += [helper.make_node("Cast", [name], [wide], to=TensorProto.INT32),
                              helper.make_node("Add", [wide, k128], [plus]),
                              helper.make_node("Cast", [plus], [new], to=TensorProto.UINT8)]
        self.made[name] = new
        return new


def widen_u8s8(model: onnx.ModelProto) -> Widened:
    """A copy of ``model`` in which onnxruntime's uint8 x int8 integer GEMMs are uint8 x uint8:
    the same integers, summed exactly on every CPU (see the module doc)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    types = _Types(graph)
    gemms, dqs = _u8s8_gemm_nodes(graph, types), _qdq_weight_dqs(graph, types)
    if not gemms and not dqs:
        return Widened(out, ())
    w = _Widener(graph)
    for node in gemms:
        _, weights, _ = _gemm_facts(node)
        for wi, zi in weights:
            while len(node.input) <= zi:
                node.input.append("")
            node.input[wi] = w.shifted(node.input[wi])
            node.input[zi] = w.shifted(node.input[zi])
    for node in dqs:
        while len(node.input) < 3:
            node.input.append("")
        node.input[0] = w.shifted(node.input[0])
        node.input[2] = w.shifted(node.input[2])
    if w.prologue:
        nodes = list(w.prologue) + list(graph.node)
        del graph.node[:]
        graph.node.extend(_topological(nodes))
    _drop_unread(graph, set(w.made) & set(w.inits))
    return Widened(out, tuple(_label(n) for n in gemms + dqs))


def _drop_unread(graph: onnx.GraphProto, names: set[str]) -> None:
    """Removes the initializers among ``names`` that nothing reads any more (subgraphs included)."""
    read = {o.name for o in graph.output}

    def visit(g: onnx.GraphProto) -> None:
        for node in g.node:
            read.update(node.input)
            for a in node.attribute:
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    visit(sub)

    visit(graph)
    keep = [t for t in graph.initializer if t.name not in names or t.name in read]
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)


def _topological(nodes: Sequence[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """``nodes`` in an order where each comes after the producers of its inputs (stable)."""
    made = {o for n in nodes for o in n.output}
    ready: set[str] = set()
    pending, order = list(nodes), []
    while pending:
        rest = []
        for n in pending:
            if all(not i or i not in made or i in ready for i in n.input):
                order.append(n)
                ready.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):  # a cycle or a subgraph's outer reference: keep as written
            return order + rest
        pending = rest
    return order


# --------------------------------------------------------------------------- running


def onnxruntime_run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *, level: str = "ORT_ENABLE_ALL",
                    threads: int | None = None, names: Sequence[str] | None = None) -> list[np.ndarray]:
    """onnxruntime CPU's outputs for ``model`` as written. ``level``: a GraphOptimizationLevel
    name (``ORT_DISABLE_ALL`` runs the graph as written); ``threads``: intra_op_num_threads."""
    import onnxruntime as ort  # noqa: PLC0415 - an optional (test) dependency

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    if threads is not None:
        so.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(list(names) if names else None, dict(feeds))


def exact_onnxruntime_run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *,
                          level: str = "ORT_ENABLE_ALL", threads: int | None = None,
                          names: Sequence[str] | None = None) -> list[np.ndarray]:
    """onnxruntime CPU's outputs for ``model`` with every uint8 x int8 integer GEMM summed
    exactly, on any host: onnxruntime on :func:`widen_u8s8` of the model."""
    return onnxruntime_run(widen_u8s8(model).model, feeds, level=level, threads=threads, names=names)


@dataclass(frozen=True)
class OracleChoice:
    """Which oracle a comparison uses: ``name`` one of "onnxruntime", "onnxruntime-u8u8"
    (:func:`exact_onnxruntime_run`), "reference" (onnx.reference with :mod:`reference_ops`);
    ``reason`` one line saying why."""

    name: str
    reason: str


def choose_oracle(model: onnx.ModelProto, requested: str = "auto", *, host_exact: bool | None = None) -> OracleChoice:
    """The oracle to compare ``model``'s outputs with. ``requested``: "auto" (onnxruntime; for a
    model with uint8 x int8 integer GEMMs, onnxruntime on its U8U8-widened model, which equals
    onnxruntime on a VNNI host and is exact on every host, so the verdict never depends on the
    CPU), "onnxruntime" (as written, whatever the host) or "reference". ``host_exact``: whether
    this host sums u8s8 exactly (default: :func:`host_u8s8_exact`), stated in the reason."""
    if requested == "reference":
        return OracleChoice("reference", "onnx.reference with the com.microsoft ops (exact integer sums)")
    if requested == "onnxruntime":
        return OracleChoice("onnxruntime", "onnxruntime CPU on the model as given")
    if requested != "auto":
        raise ValueError(f"unknown oracle {requested!r}: expected auto, onnxruntime or reference")
    nodes = u8s8_nodes(model)
    if not nodes:
        return OracleChoice("onnxruntime", "onnxruntime CPU (the model has no uint8 x int8 integer GEMM)")
    exact = host_u8s8_exact() if host_exact is None else host_exact
    host = ("this CPU sums them exactly (VNNI), the widened model gives the same on every CPU" if exact else
            "onnxruntime saturates their sums at int16 on this CPU (AVX2 without VNNI)")
    return OracleChoice("onnxruntime-u8u8", f"onnxruntime CPU with the int8 weight sides of the model's "
                                            f"{len(nodes)} uint8 x int8 GEMM(s) widened to uint8, which is exact: "
                                            f"{host}")


def run_oracle(choice: OracleChoice, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
               names: Sequence[str] | None = None) -> list[np.ndarray]:
    """``choice``'s outputs for ``model`` (onnxruntime at its default optimization level)."""
    if choice.name == "onnxruntime":
        return onnxruntime_run(model, feeds, names=names)
    if choice.name == "onnxruntime-u8u8":
        return exact_onnxruntime_run(model, feeds, names=names)
    from onnx_quant.reference_ops import reference_evaluator  # noqa: PLC0415 - loads onnx.reference only here

    return reference_evaluator(model).run(list(names) if names else None, dict(feeds))

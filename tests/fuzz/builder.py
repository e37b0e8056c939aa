"""The graph under construction: values with concrete shapes, nodes, initializers, inputs.

A fuzz graph is built forward: each op generator (ops_float.py, ops_quant.py) picks operands
among the values made so far (or makes a graph input / initializer for one), appends its
node(s) and registers their outputs with the shapes and element types ONNX's rules give them.
Shapes are concrete; a graph input whose first dim is the batch declares it as the symbol
``N`` (bound by the feeds), so inference sees symbolic dims. Feeds are not part of the graph:
they come from the model's ``fuzz_seed`` metadata (``feeds_for``), so that a saved ``.onnx``
replays alone.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: element types the generators make values of, by TensorProto code
NP_OF = {
    TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.INT32: np.int32,
    TensorProto.INT64: np.int64, TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8,
    TensorProto.BOOL: np.bool_,
}
TYPE_STR = {code: f"tensor({helper.tensor_dtype_to_string(code)[len('TensorProto.'):].lower()})"
            for code in NP_OF}
FLOAT, INT32, INT64, INT8, UINT8, BOOL, FLOAT16 = (TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64,
                                                   TensorProto.INT8, TensorProto.UINT8, TensorProto.BOOL,
                                                   TensorProto.FLOAT16)
BATCH = "N"
SEED_KEY = "fuzz_seed"
BATCH_KEY = "fuzz_batch"


@dataclass
class Val:
    """A value of the graph: its name, element type and concrete shape; ``quant`` holds
    (scale, zero point) for a uint8/int8 value made by a QuantizeLinear (what a QDQ unit reads)."""

    name: str
    dtype: int
    shape: tuple[int, ...]
    quant: tuple[float, int] | None = None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass
class Builder:
    opset: int
    batch: int = 1
    symbolic: bool = True
    values: list[Val] = field(default_factory=list)
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    inputs: list[Val] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    domains: set[str] = field(default_factory=set)
    _count: int = 0

    def fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def input(self, dtype: int, shape) -> Val:
        v = Val(self.fresh("in"), dtype, tuple(int(d) for d in shape))
        self.inputs.append(v)
        self.values.append(v)
        return v

    def const(self, array, *, node: bool = False, prefix: str = "c") -> Val:
        """An initializer (or, with ``node``, a Constant node) holding ``array``; not offered as
        an operand to other ops."""
        array = np.asarray(array)
        name = self.fresh(prefix)
        tensor = numpy_helper.from_array(array, name)
        if node:
            self.nodes.append(helper.make_node("Constant", [], [name], value=tensor, name=self.fresh("n")))
        else:
            self.inits.append(tensor)
        return Val(name, helper.np_dtype_to_tensor_dtype(array.dtype), tuple(array.shape))

    def add(self, op: str, inputs, outs, *, domain: str = "", offer: bool = True, **attrs) -> list[Val]:
        """Append a node; ``outs``: (dtype, shape) per output. The outputs are offered as operands
        to later ops unless ``offer`` is False."""
        names = [i.name if isinstance(i, Val) else i for i in inputs]
        vals = [Val(self.fresh("v"), dt, tuple(int(d) for d in shape)) for dt, shape in outs]
        self.nodes.append(helper.make_node(op, names, [v.name for v in vals], name=self.fresh("n"),
                                           domain=domain or None, **attrs))
        self.ops.append(op if not domain else f"{domain}:{op}")
        if domain:
            self.domains.add(domain)
        if offer:
            self.values.extend(vals)
        return vals

    def of(self, dtypes) -> list[Val]:
        return [v for v in self.values if v.dtype in dtypes]

    def model(self, seed: int, outputs: list[Val]) -> onnx.ModelProto:
        def info(v: Val, symbolic: bool):
            shape = list(v.shape)
            if symbolic and shape and shape[0] == self.batch:
                shape[0] = BATCH
            return helper.make_tensor_value_info(v.name, v.dtype, shape)

        graph = helper.make_graph(
            self.nodes, "fuzz", [info(v, self.symbolic) for v in self.inputs],
            # outputs: rank declared, every dim left to inference
            [helper.make_tensor_value_info(v.name, v.dtype, [None] * v.rank) for v in outputs], self.inits)
        imports = [helper.make_opsetid("", self.opset)] + [helper.make_opsetid(d, 1) for d in sorted(self.domains)]
        model = helper.make_model(graph, opset_imports=imports, ir_version=min(10, onnx.IR_VERSION))
        helper.set_model_props(model, {SEED_KEY: str(seed), BATCH_KEY: str(self.batch)})
        return model


def feeds_for(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The feeds of a fuzz model, from its ``fuzz_seed`` and ``fuzz_batch`` metadata: floats on a
    grid of eighths in [-4, 4] (exact in float32 sums), ints small, uint8/int8 over their range."""
    props = {p.key: p.value for p in model.metadata_props}
    seed = int(props.get(SEED_KEY, 0))
    batch = int(props.get(BATCH_KEY, 1))
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        t = vi.type.tensor_type
        shape = [batch if d.dim_param == BATCH else d.dim_value for d in t.shape.dim]
        # one generator per input (seeded by its name): dropping an input leaves the others' values
        rng = np.random.default_rng([seed, zlib.crc32(vi.name.encode())])
        feeds[vi.name] = random_array(rng, t.elem_type, shape)
    return feeds


def random_array(rng: np.random.Generator, dtype: int, shape, *, low=None, high=None) -> np.ndarray:
    return np.asarray(_random_values(rng, dtype, shape, low, high))


def _random_values(rng: np.random.Generator, dtype: int, shape, low, high):
    np_type = NP_OF[dtype]
    if dtype in (FLOAT, FLOAT16):
        lo, hi = (-32, 32) if low is None else (int(low * 8), int(high * 8))
        return (rng.integers(lo, hi + 1, size=shape) / 8).astype(np_type)
    if dtype == BOOL:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype in (UINT8, INT8):
        info = np.iinfo(np_type)
        lo, hi = (info.min, info.max) if low is None else (low, high)
        return rng.integers(lo, hi + 1, size=shape).astype(np_type)
    lo, hi = (-9, 9) if low is None else (low, high)
    return rng.integers(lo, hi + 1, size=shape).astype(np_type)


def _type_proto(v: Val) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(v.dtype, list(v.shape))


def _checker_context(opset: int, domains) -> onnx.checker.C.CheckerContext:
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = min(10, onnx.IR_VERSION)
    ctx.opset_imports = {"": opset, **{d: 1 for d in domains}}
    return ctx


def infer_outputs(b: Builder, op: str, inputs, n_out: int, attrs: dict, data: dict | None = None):
    """ONNX's own rule for ``op``'s outputs at these input types (onnx.defs schema, the checker,
    then shape inference with ``data``: the constant inputs), as (dtype, shape) per output; None
    where the node is invalid or an output's shape is not fully known and non-negative."""
    try:
        schema = onnx.defs.get_schema(op, b.opset, "")
    except onnx.defs.SchemaError:
        return None
    names = [i.name if isinstance(i, Val) else i for i in inputs]
    outs = [f"out{i}" for i in range(n_out)]
    try:
        node = helper.make_node(op, names, outs, **attrs)
        onnx.checker.check_node(node, _checker_context(b.opset, ()))
        types = {i.name: _type_proto(i) for i in inputs if isinstance(i, Val) and i.name}
        got = onnx.shape_inference.infer_node_outputs(
            schema, node, types, input_data=data or {},
            opset_imports=[helper.make_opsetid("", b.opset)])
    except Exception:  # noqa: BLE001 - any complaint of onnx's means: not a valid node
        return None
    result = []
    for o in outs:
        if o not in got:
            return None
        t = got[o].tensor_type
        if not t.HasField("shape") or any(not d.HasField("dim_value") or d.dim_value < 0 for d in t.shape.dim):
            return None
        result.append((t.elem_type, tuple(d.dim_value for d in t.shape.dim)))
    return result

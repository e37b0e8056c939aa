"""Realistic float models built with ``onnx.helper``, and their onnxruntime-quantized forms.

Tests (inference against onnx and onnxruntime, later the GPU backend) and benchmarks
(``benchmarks/bench_inference.py``) share these builders. Three families, each with a
symbolic batch and repeatable blocks so that size is a parameter:

- :func:`cnn`: a ResNet-like CNN (stem conv with folded batch-norm, max pool, residual
  blocks conv/relu/conv/add/relu, global average pool, flatten, gemm) on ``[N, C, H, W]``
  with symbolic ``N``, ``H`` and ``W``;
- :func:`mlp`: MatMul/Add/Relu layers on ``[N, features]``;
- :func:`transformer`: pre-norm encoder blocks (LayerNormalization, Q/K/V MatMul+Add,
  Reshape/Transpose to heads, scaled MatMul, Softmax, output projection, residual Add, Gelu MLP)
  on ``[B, S, D]`` with symbolic ``B`` and ``S``.

:func:`quantize` runs ``onnxruntime.quantization`` on one of them: ``quantize_static`` in
QOperator or QDQ format (per tensor or per channel) with a small random calibration set, or
``quantize_dynamic``. Calibration needs concrete shapes, so the model is quantized with
fixed dims and the quantized model then gets the float model's symbolic graph inputs and
outputs back, with its ``value_info`` stripped: what a user holds after quantizing an
exported model with dynamic axes.

Everything is deterministic (weights and calibration data come from fixed seeds).
"""

from __future__ import annotations

import os
import tempfile
from typing import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: opset of the float models: LayerNormalization (17) and Gelu (20) are plain ai.onnx ops
OPSET = 21
IR_VERSION = 10
F = TensorProto.FLOAT

#: quantization formats :func:`quantize` accepts
FORMATS = ("qoperator", "qdq", "dynamic")
#: names inside repeated block ``i`` start with ``BLOCK_TAG + str(i) + "."``
BLOCK_TAG = "blk"


# ------------------------------------------------------------------ building blocks
class _Builder:
    """Collects nodes and initializers with unique names.

    Names made inside ``block(i)`` start with ``blk<i>.`` and count from 1 in each block, so
    the same position in two blocks differs only in the block tag (what :func:`repeat`
    relies on to stamp out more blocks of a quantized model)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.scope = ""
        self._counts: dict[str, int] = {}

    def block(self, i: int | None) -> None:
        self.scope = "" if i is None else f"{BLOCK_TAG}{i}."

    def name(self, base: str) -> str:
        count = self._counts[self.scope] = self._counts.get(self.scope, 0) + 1
        return f"{self.scope}{base}_{count}"

    def const(self, base: str, array: np.ndarray) -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, base: str, shape: Sequence[int], fan_in: int) -> str:
        w = self.rng.standard_normal(shape).astype(np.float32) * np.float32(1.0 / np.sqrt(fan_in))
        return self.const(base, w)

    def node(self, op: str, inputs: Sequence[str], n_out: int = 1, **attrs) -> str | list[str]:
        base = self.name(op.lower())
        outs = [f"{base}_out{i}" if n_out > 1 else base for i in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=base, **attrs))
        return outs if n_out > 1 else outs[0]

    def model(self, name: str, inputs, outputs, doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                                 producer_name="onnx-quant", producer_version="model_zoo", doc_string=doc)


def _conv_bn(b: _Builder, x: str, c_in: int, c_out: int, *, kernel: int = 3, stride: int = 1) -> str:
    """Conv with batch-norm folded into its weights and bias (what exporters emit)."""
    w = b.rng.standard_normal((c_out, c_in, kernel, kernel)).astype(np.float32) / np.sqrt(c_in * kernel * kernel)
    gamma = b.rng.uniform(0.5, 1.5, c_out).astype(np.float32)
    beta = b.rng.uniform(-0.1, 0.1, c_out).astype(np.float32)
    mean = b.rng.uniform(-0.1, 0.1, c_out).astype(np.float32)
    var = b.rng.uniform(0.5, 1.5, c_out).astype(np.float32)
    scale = gamma / np.sqrt(var + 1e-5)
    w_folded = (w * scale[:, None, None, None]).astype(np.float32)
    bias = (beta - mean * scale).astype(np.float32)
    pad = kernel // 2
    return b.node("Conv", [x, b.const("conv_w", w_folded), b.const("conv_b", bias)],
                  kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4)


# ------------------------------------------------------------------ float models
def cnn(blocks: int = 2, *, channels: int = 8, in_channels: int = 3, classes: int = 10, seed: int = 0,
        batch: str | int = "N", height: str | int = "H", width: str | int = "W") -> onnx.ModelProto:
    """A ResNet-like CNN: ``image [N, in_channels, H, W] -> logits [N, classes]``.

    Stem: conv 3x3 stride 2 (folded batch-norm) -> Relu -> MaxPool 3x3 stride 2 pad 1.
    Each block: conv -> Relu -> conv -> Add(residual) -> Relu (7 nodes with the weights as
    initializers: 5 nodes). Head: GlobalAveragePool -> Flatten -> Gemm.
    Float nodes: ``5 * blocks + 6``.
    """
    b = _Builder(seed)
    x = b.node("Relu", [_conv_bn(b, "image", in_channels, channels, stride=2)])
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for i in range(blocks):
        b.block(i)
        y = b.node("Relu", [_conv_bn(b, x, channels, channels)])
        y = _conv_bn(b, y, channels, channels)
        x = b.node("Relu", [b.node("Add", [y, x])])
    b.block(None)
    x = b.node("GlobalAveragePool", [x])
    x = b.node("Flatten", [x], axis=1)
    fc = b.weight("fc_w", (classes, channels), channels)
    fc_b = b.const("fc_b", b.rng.uniform(-0.1, 0.1, classes).astype(np.float32))
    b.nodes.append(helper.make_node("Gemm", [x, fc, fc_b], ["logits"], name="fc", transB=1))
    return b.model(
        "cnn", [helper.make_tensor_value_info("image", F, [batch, in_channels, height, width])],
        [helper.make_tensor_value_info("logits", F, [batch, classes])],
        f"onnx-quant model zoo: ResNet-like CNN, {blocks} residual blocks")


def mlp(layers: int = 3, *, features: int = 32, hidden: int = 64, classes: int = 10, seed: int = 0,
        batch: str | int = "N") -> onnx.ModelProto:
    """``x [N, features] -> (MatMul, Add, Relu) * layers -> MatMul, Add, Softmax -> probs [N, classes]``.

    Float nodes: ``3 * layers + 3``.
    """
    b = _Builder(seed)
    x, width = "x", features
    for i in range(layers):
        b.block(i)
        x = b.node("MatMul", [x, b.weight("w", (width, hidden), width)])
        x = b.node("Add", [x, b.const("b", b.rng.uniform(-0.1, 0.1, hidden).astype(np.float32))])
        x = b.node("Relu", [x])
        width = hidden
    b.block(None)
    x = b.node("MatMul", [x, b.weight("w_out", (width, classes), width)])
    x = b.node("Add", [x, b.const("b_out", np.zeros(classes, np.float32))])
    b.nodes.append(helper.make_node("Softmax", [x], ["probs"], name="softmax", axis=-1))
    return b.model("mlp", [helper.make_tensor_value_info("x", F, [batch, features])],
                   [helper.make_tensor_value_info("probs", F, [batch, classes])],
                   f"onnx-quant model zoo: MLP, {layers} hidden layers")


def _layer_norm(b: _Builder, x: str, d: int) -> str:
    gamma = b.const("ln_gamma", b.rng.uniform(0.8, 1.2, d).astype(np.float32))
    beta = b.const("ln_beta", b.rng.uniform(-0.1, 0.1, d).astype(np.float32))
    return b.node("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-5)


def _linear(b: _Builder, x: str, d_in: int, d_out: int) -> str:
    y = b.node("MatMul", [x, b.weight("w", (d_in, d_out), d_in)])
    return b.node("Add", [y, b.const("b", b.rng.uniform(-0.05, 0.05, d_out).astype(np.float32))])


def transformer(blocks: int = 1, *, d_model: int = 32, heads: int = 4, ffn: int = 64, seed: int = 0,
                batch: str | int = "B", seq: str | int = "S") -> onnx.ModelProto:
    """Pre-norm encoder blocks: ``x [B, S, d_model] -> y [B, S, d_model]``.

    Each block: LayerNorm; Q, K, V = MatMul+Add, Reshape to ``[B, S, heads, d_head]``
    (``0, 0`` copy the symbolic dims), Transpose to heads-first (K to ``[B, h, dh, S]``);
    scores = MatMul(Q, K) * 1/sqrt(dh); Softmax; MatMul with V; Transpose back; Reshape to
    ``[B, S, d_model]``; output projection; residual Add; LayerNorm; MatMul+Add, Gelu,
    MatMul+Add; residual Add. 28 nodes per block.
    """
    if d_model % heads:
        raise ValueError(f"d_model {d_model} is not a multiple of heads {heads}")
    dh = d_model // heads
    b = _Builder(seed)
    split = b.const("heads_shape", np.array([0, 0, heads, dh], np.int64))
    merge = b.const("model_shape", np.array([0, 0, d_model], np.int64))
    scale = b.const("scale", np.array(1.0 / np.sqrt(dh), np.float32))
    x = "x"
    for i in range(blocks):
        b.block(i)
        h = _layer_norm(b, x, d_model)
        q = b.node("Transpose", [b.node("Reshape", [_linear(b, h, d_model, d_model), split])], perm=[0, 2, 1, 3])
        k = b.node("Transpose", [b.node("Reshape", [_linear(b, h, d_model, d_model), split])], perm=[0, 2, 3, 1])
        v = b.node("Transpose", [b.node("Reshape", [_linear(b, h, d_model, d_model), split])], perm=[0, 2, 1, 3])
        scores = b.node("Mul", [b.node("MatMul", [q, k]), scale])
        probs = b.node("Softmax", [scores], axis=-1)
        ctx = b.node("Transpose", [b.node("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        ctx = b.node("Reshape", [ctx, merge])
        x = b.node("Add", [x, _linear(b, ctx, d_model, d_model)])
        h = _layer_norm(b, x, d_model)
        h = b.node("Gelu", [_linear(b, h, d_model, ffn)])
        x = b.node("Add", [x, _linear(b, h, ffn, d_model)])
    b.block(None)
    b.nodes.append(helper.make_node("Identity", [x], ["y"], name="output"))
    return b.model("transformer", [helper.make_tensor_value_info("x", F, [batch, seq, d_model])],
                   [helper.make_tensor_value_info("y", F, [batch, seq, d_model])],
                   f"onnx-quant model zoo: transformer encoder, {blocks} blocks")


#: the builders by family name, and default concrete shapes used to calibrate them
BUILDERS = {"cnn": cnn, "mlp": mlp, "transformer": transformer}
CALIBRATION_DIMS: dict[str, dict[str, int]] = {
    "cnn": {"N": 1, "H": 16, "W": 16},
    "mlp": {"N": 2},
    "transformer": {"B": 1, "S": 8},
}


# ------------------------------------------------------------------ shapes
def fix_dims(model: onnx.ModelProto, bindings: Mapping[str, int]) -> onnx.ModelProto:
    """A copy with every graph input/output ``dim_param`` in ``bindings`` set to its int."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for v in list(out.graph.input) + list(out.graph.output):
        if not v.type.HasField("tensor_type"):
            continue
        for d in v.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in bindings:
                d.dim_value = int(bindings[d.dim_param])
    return out


def restore_interface(quantized: onnx.ModelProto, float_model: onnx.ModelProto) -> onnx.ModelProto:
    """Give ``quantized`` the float model's graph input/output types (symbolic dims) by name,
    and strip its ``value_info`` (the quantizer's, computed for the calibration shapes)."""
    declared = {v.name: v.type for v in list(float_model.graph.input) + list(float_model.graph.output)}
    for v in list(quantized.graph.input) + list(quantized.graph.output):
        if v.name in declared:
            v.type.CopyFrom(declared[v.name])
    del quantized.graph.value_info[:]
    return quantized


def input_shapes(model: onnx.ModelProto, bindings: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """Concrete shape of every (non-initializer) graph input with its symbols bound."""
    inits = {t.name for t in model.graph.initializer}
    shapes = {}
    for v in model.graph.input:
        if v.name in inits:
            continue
        dims = []
        for d in v.type.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif d.dim_param in bindings:
                dims.append(int(bindings[d.dim_param]))
            else:
                raise ValueError(f"input {v.name!r}: dim {d.dim_param or '?'} has no binding")
        shapes[v.name] = tuple(dims)
    return shapes


def random_feeds(model: onnx.ModelProto, bindings: Mapping[str, int], *, seed: int = 0) -> dict[str, np.ndarray]:
    """Float32 normal inputs of the shapes ``bindings`` gives."""
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in input_shapes(model, bindings).items()}


# ------------------------------------------------------------------ quantization
def _reader(feeds: Iterable[dict[str, np.ndarray]]):
    from onnxruntime.quantization import CalibrationDataReader

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(list(feeds))

        def get_next(self):
            return next(self._it, None)

    return _Reader()


def quantize(model: onnx.ModelProto, fmt: str, *, per_channel: bool = False,
             bindings: Mapping[str, int] | None = None, samples: int = 2, seed: int = 0) -> onnx.ModelProto:
    """Quantize a float model with ``onnxruntime.quantization``.

    ``fmt`` is ``"qoperator"`` or ``"qdq"`` (``quantize_static``: uint8 activations, int8
    weights, MinMax calibration on ``samples`` random inputs) or ``"dynamic"``
    (``quantize_dynamic``: int8 weights, activations quantized at run time by
    DynamicQuantizeLinear). ``bindings`` are the concrete dims used to calibrate (symbol ->
    int; every symbolic input dim needs one). The result has the float model's symbolic
    graph inputs and outputs and no ``value_info``.
    """
    bindings = dict(bindings or {})
    calibration = [] if fmt == "dynamic" else [random_feeds(model, bindings, seed=seed + i) for i in range(samples)]
    return run_quantizer(model, fix_dims(model, bindings), calibration, fmt, per_channel=per_channel)


def run_quantizer(model: onnx.ModelProto, fixed: onnx.ModelProto, calibration: Sequence[dict[str, np.ndarray]],
                  fmt: str, *, per_channel: bool = False) -> onnx.ModelProto:
    """The one call into ``onnxruntime.quantization`` (this module's models and
    :mod:`onnx_quant.exported_models`'): ``fixed`` is ``model`` with concrete input dims, what
    static calibration on the ``calibration`` feeds needs; ``quantize_dynamic`` takes ``model``
    itself. The result gets ``model``'s graph inputs and outputs back (:func:`restore_interface`)."""
    from onnxruntime.quantization import (QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)

    if fmt not in FORMATS:
        raise ValueError(f"unknown quantization format {fmt!r}: expected one of {', '.join(FORMATS)}")
    with tempfile.TemporaryDirectory(prefix="onnx-quant-zoo-") as tmp:
        src, dst = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "quant.onnx")
        if fmt == "dynamic":
            onnx.save(model, src)
            quantize_dynamic(src, dst, per_channel=per_channel, weight_type=QuantType.QInt8)
        else:
            onnx.save(fixed, src)
            quantize_static(
                src, dst, _reader(calibration),
                quant_format=QuantFormat.QOperator if fmt == "qoperator" else QuantFormat.QDQ,
                per_channel=per_channel, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                calibration_providers=["CPUExecutionProvider"],
            )
        quantized = onnx.load(dst)
    return restore_interface(quantized, model)


#: the builder argument that counts a family's repeated blocks
BLOCKS_ARG = {"cnn": "blocks", "mlp": "layers", "transformer": "blocks"}


def quantized(family: str, fmt: str, *, per_channel: bool = False, stamp: bool = False, **kw) -> onnx.ModelProto:
    """``quantize(BUILDERS[family](**kw), fmt, ...)`` calibrated on ``CALIBRATION_DIMS[family]``.

    With ``stamp=True`` a model of many blocks is made by quantizing the same model with three
    blocks and stamping out the middle one (:func:`repeat`): the graph onnxruntime gives,
    in seconds instead of minutes (onnxruntime's QOperator quantizer is quadratic in the node
    count)."""
    arg = BLOCKS_ARG[family]
    blocks = kw.get(arg, 2 if family != "transformer" else 1)
    if stamp and blocks > 3:
        small = quantize(BUILDERS[family](**{**kw, arg: 3}), fmt, per_channel=per_channel,
                         bindings=CALIBRATION_DIMS[family])
        return repeat(small, blocks)
    return quantize(BUILDERS[family](**kw), fmt, per_channel=per_channel, bindings=CALIBRATION_DIMS[family])


def repeat(model: onnx.ModelProto, blocks: int) -> onnx.ModelProto:
    """A copy of a (quantized) zoo model built with three blocks, with ``blocks`` blocks.

    Names carry their block's tag (``blk0.``, ``blk1.``, ``blk2.``), the quantizer's names
    too (it derives them from the float names), and what joins two blocks (a
    QuantizeLinear of a block's output ...) carries the tag of the block that produces it.
    The middle block (every node, value and initializer tagged ``blk1.``) is copied for
    blocks 2 .. ``blocks - 2`` with the tags shifted (``blk1.`` -> ``blk<j>.``, ``blk0.`` ->
    ``blk<j-1>.``: each copy reads the previous block); the last block and what follows
    the blocks are renamed to read the last copy; the nodes are sorted topologically again."""
    if blocks < 3:
        raise ValueError(f"repeat makes at least 3 blocks, got {blocks}")
    tags = [f"{BLOCK_TAG}{i}." for i in range(3)]
    graph = model.graph

    def tagged(node: onnx.NodeProto, tag: str) -> bool:
        return tag in node.name or any(tag in o for o in node.output)

    if not any(tagged(n, tags[2]) for n in graph.node):
        raise ValueError(f"model has no block tagged {tags[2]!r}: build it with the zoo and three blocks")

    def shift(j: int):
        def rename(name: str) -> str:
            if tags[1] in name:
                return name.replace(tags[1], f"{BLOCK_TAG}{j}.")
            if tags[0] in name:
                return name.replace(tags[0], f"{BLOCK_TAG}{j - 1}.")
            return name
        return rename

    def tail(name: str) -> str:  # the last block and the head
        if tags[2] in name:
            return name.replace(tags[2], f"{BLOCK_TAG}{blocks - 1}.")
        if tags[1] in name:
            return name.replace(tags[1], f"{BLOCK_TAG}{blocks - 2}.")
        return name

    def copy_node(node: onnx.NodeProto, rename) -> onnx.NodeProto:
        c = onnx.NodeProto()
        c.CopyFrom(node)
        c.name = rename(c.name)
        c.input[:] = [rename(x) for x in c.input]
        c.output[:] = [rename(x) for x in c.output]
        return c

    def copy_init(t: onnx.TensorProto, rename) -> onnx.TensorProto:
        c = onnx.TensorProto()
        c.CopyFrom(t)
        c.name = rename(t.name)
        return c

    middle = [n for n in graph.node if tagged(n, tags[1])]
    early = {id(n) for n in graph.node if tagged(n, tags[0]) or tagged(n, tags[1])}
    nodes = [n if id(n) in early else copy_node(n, tail) for n in graph.node]
    inits = [t if tags[2] not in t.name else copy_init(t, tail) for t in graph.initializer]
    middle_inits = [t for t in graph.initializer if tags[1] in t.name]
    for j in range(2, blocks - 1):
        rename = shift(j)
        nodes += [copy_node(n, rename) for n in middle]
        inits += [copy_init(t, rename) for t in middle_inits]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:], out.graph.initializer[:], out.graph.value_info[:]
    out.graph.node.extend(_toposort(nodes, {v.name for v in graph.input} | {t.name for t in inits}))
    out.graph.initializer.extend(inits)
    for v in out.graph.output:
        v.name = tail(v.name)
    return out


def _toposort(nodes: list[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """Kahn's algorithm, keeping the given order among ready nodes."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    waiting = [0] * len(nodes)
    users: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        deps = {producer[x] for x in n.input if x and x not in available and x in producer}
        waiting[i] = len(deps)
        for d in deps:
            users.setdefault(d, []).append(i)
    import heapq

    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for u in users.get(i, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        raise ValueError("the stamped graph has a cycle (block names were not what repeat expects)")
    return order


_TEMPLATES: dict[tuple, onnx.ModelProto] = {}


def sized(family: str, fmt: str, nodes: int, *, per_channel: bool = False, **kw) -> onnx.ModelProto:
    """A quantized model of about ``nodes`` nodes: the three-block quantized model (built once
    per process and arguments) stamped out to as many blocks as it takes (:func:`repeat`)."""
    key = (family, fmt, per_channel, tuple(sorted(kw.items())))
    template = _TEMPLATES.get(key)
    if template is None:
        arg = BLOCKS_ARG[family]
        template = _TEMPLATES[key] = quantize(BUILDERS[family](**{**kw, arg: 3}), fmt, per_channel=per_channel,
                                              bindings=CALIBRATION_DIMS[family])
    four = len(repeat(template, 4).graph.node)
    per_block = four - len(template.graph.node)
    base = len(template.graph.node) - 3 * per_block
    blocks = max(3, round((nodes - base) / per_block))
    return template if blocks == 3 else repeat(template, blocks)


def with_nodes(family: str, target: int) -> dict:
    """Builder arguments giving a *float* model of about ``target`` nodes (blocks repeated)."""
    if family == "cnn":
        return {"blocks": max(1, round((target - 6) / 5))}
    if family == "mlp":
        return {"layers": max(1, round((target - 3) / 3))}
    if family == "transformer":
        return {"blocks": max(1, round((target - 1) / 28))}
    raise ValueError(f"unknown model family {family!r}: expected one of {', '.join(BUILDERS)}")

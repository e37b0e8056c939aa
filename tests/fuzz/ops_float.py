"""Op generators for the float, integer and shape ops real models use.

Each generator is ``gen(draw, b) -> bool``: it picks operands among ``b``'s values (or makes a
graph input / initializer), draws attributes within the op's domain and adds the node. Element
types come from the op's onnx.defs schema at the graph's opset (``schema_types``); output types
and shapes from ONNX's own inference (``builder.infer_outputs``), which also rejects a node the
checker or the shape rules refuse (the generator then returns False and another op is drawn).
Indices (Gather, Slice bounds, Split sizes) are always in range.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import numpy_helper

from .builder import (BOOL, FLOAT, FLOAT16, INT8, INT32, INT64, NP_OF, TYPE_STR, UINT8, Builder, Val,
                      infer_outputs, random_array)

FLOATS = (FLOAT,)
INTS = (INT32, INT64)
NUMERIC = (FLOAT, INT32, INT64)
#: the largest tensor a generator makes (small tensors: many graphs per second)
MAX_ELEMENTS = 4096


@lru_cache(maxsize=None)
def schema_types(op: str, opset: int, index: int = 0) -> tuple[int, ...]:
    """The element types (of those the generators make) input ``index`` of ``op`` takes at ``opset``."""
    try:
        schema = onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return ()
    formal = schema.inputs[min(index, len(schema.inputs) - 1)]
    allowed = next((set(c.allowed_type_strs) for c in schema.type_constraints if c.type_param_str == formal.type_str),
                   {formal.type_str})
    return tuple(code for code, text in TYPE_STR.items() if text in allowed)


def dims(max_rank=4, min_rank=0, max_dim=5):
    return st.lists(st.integers(1, max_dim), min_size=min_rank, max_size=max_rank).map(tuple)


def operand(draw, b: Builder, dtypes, *, min_rank=0, max_rank=4, pred=None, fresh_shape=None) -> Val | None:
    """An existing value of one of ``dtypes`` (rank and ``pred`` permitting) or a new graph input."""
    dtypes = tuple(dtypes)
    if not dtypes:
        return None
    have = [v for v in b.of(dtypes) if min_rank <= v.rank <= max_rank and (pred is None or pred(v))]
    if have and draw(st.integers(0, 3)) > 0:
        return draw(st.sampled_from(have))
    shape = draw(fresh_shape if fresh_shape is not None else dims(max_rank, min_rank))
    if shape and b.symbolic and draw(st.booleans()):
        shape = (b.batch,) + tuple(shape[1:])
    return b.input(draw(st.sampled_from(dtypes)), shape)


def broadcast_shape(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with ``shape``: a suffix of it, some dims set to 1."""
    k = draw(st.integers(0, len(shape)))
    tail = list(shape[len(shape) - k:])
    return tuple(1 if d > 1 and draw(st.integers(0, 3)) == 0 else d for d in tail)


def second_operand(draw, b: Builder, x: Val, dtype: int, *, nonzero=False) -> Val:
    """The other side of a binary op: an existing value of the same shape, or a broadcast partner
    (graph input or initializer), or, with ``nonzero``, an initializer without zeros."""
    same = [v for v in b.of((dtype,)) if v.shape == x.shape and v is not x]
    if same and not nonzero and draw(st.booleans()):
        return draw(st.sampled_from(same))
    shape = broadcast_shape(draw, x.shape)
    if nonzero or draw(st.booleans()):
        seed = draw(st.integers(0, 2**16))
        arr = random_array(np.random.default_rng(seed), dtype, shape)
        if nonzero:
            arr = np.where(arr == 0, np.ones_like(arr), arr)
        return b.const(arr, node=draw(st.integers(0, 4)) == 0)
    return b.input(dtype, shape)


def emit(b: Builder, op: str, inputs, attrs=None, *, n_out=1, data=None, offer=True) -> list[Val] | None:
    outs = infer_outputs(b, op, inputs, n_out, attrs or {}, data)
    if outs is None or any(int(np.prod(shape)) > MAX_ELEMENTS for _, shape in outs):
        return None
    return b.add(op, inputs, outs, offer=offer, **(attrs or {}))


def const_data(*vals: Val, arrays) -> dict:
    return {v.name: numpy_helper.from_array(a, v.name) for v, a in zip(vals, arrays)}


# ----------------------------------------------------------------------------- elementwise

UNARY = {
    "Abs": {}, "Neg": {}, "Relu": {}, "Sigmoid": {}, "Tanh": {}, "Exp": {}, "Log": {}, "Sqrt": {},
    "Ceil": {}, "Floor": {}, "Round": {}, "Sin": {}, "Cos": {}, "Erf": {}, "Reciprocal": {}, "Softplus": {},
    "Softsign": {}, "Sign": {}, "HardSwish": {}, "Mish": {}, "Atan": {}, "Sinh": {}, "Asinh": {},
    "Identity": {}, "Not": {},
    "HardSigmoid": {"alpha": st.sampled_from([0.2, 0.5]), "beta": st.sampled_from([0.5, 0.25])},
    "LeakyRelu": {"alpha": st.sampled_from([0.01, 0.1, 0.5])},
    "Elu": {"alpha": st.sampled_from([1.0, 0.5])},
    "Celu": {"alpha": st.sampled_from([1.0, 2.0])},
    "Selu": {},
    "ThresholdedRelu": {"alpha": st.sampled_from([1.0, 0.5])},
    "Gelu": {"approximate": st.sampled_from(["none", "tanh"])},
}
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Mod", "Equal", "Less", "Greater", "LessOrEqual",
          "GreaterOrEqual", "And", "Or", "Xor", "PRelu", "Sum", "Mean", "BitwiseAnd", "BitwiseOr", "BitwiseXor"]


def gen_unary(draw, b: Builder) -> bool:
    op = draw(st.sampled_from(sorted(UNARY)))
    dtypes = [t for t in schema_types(op, b.opset) if t != FLOAT16 or draw(st.booleans())]
    x = operand(draw, b, dtypes)
    if x is None:
        return False
    attrs = {k: draw(s) for k, s in UNARY[op].items() if draw(st.booleans())}
    return emit(b, op, [x], attrs) is not None


def gen_binary(draw, b: Builder) -> bool:
    op = draw(st.sampled_from(BINARY))
    dtypes = schema_types(op, b.opset)
    if op in ("Mod", "Div", "Pow"):
        dtypes = tuple(t for t in dtypes if t in (FLOAT, INT32, INT64))
    x = operand(draw, b, dtypes, min_rank=0)
    if x is None:
        return False
    nonzero = op in ("Div", "Mod") and x.dtype != FLOAT
    y = second_operand(draw, b, x, x.dtype, nonzero=nonzero)
    a, c = (x, y) if op in ("PRelu", "Div", "Mod") or draw(st.booleans()) else (y, x)
    attrs = {}
    if op == "Mod":
        attrs["fmod"] = 1 if x.dtype == FLOAT else draw(st.integers(0, 1))
    ins = [a, c]
    if op in ("Sum", "Mean", "Max", "Min") and draw(st.booleans()):
        ins.append(second_operand(draw, b, x, x.dtype))
    return emit(b, op, ins, attrs) is not None


def gen_where(draw, b: Builder) -> bool:
    x = operand(draw, b, NUMERIC)
    if x is None:
        return False
    cond = next((v for v in b.of((BOOL,)) if len(v.shape) <= len(x.shape)
                 and all(d in (1, e) for d, e in zip(v.shape[::-1], x.shape[::-1]))), None)
    if cond is None or draw(st.booleans()):
        cond = b.input(BOOL, broadcast_shape(draw, x.shape))
    y = second_operand(draw, b, x, x.dtype)
    return emit(b, "Where", [cond, x, y]) is not None


def gen_clip(draw, b: Builder) -> bool:
    x = operand(draw, b, [t for t in schema_types("Clip", b.opset) if t in NUMERIC])
    lo = draw(st.integers(-16, 8)) / 4
    hi = lo + draw(st.integers(0, 16)) / 4
    np_type = NP_OF[x.dtype]
    ins = [x, b.const(np.array(lo, np_type)) if draw(st.booleans()) else ""]
    if draw(st.booleans()):
        ins.append(b.const(np.array(hi, np_type)))
    while ins and ins[-1] == "":
        ins.pop()
    return emit(b, "Clip", ins) is not None


def gen_cast(draw, b: Builder) -> bool:
    # float -> int is undefined out of range (NaN, inf): only from graph inputs, whose range is known
    src = operand(draw, b, (FLOAT, INT32, INT64, INT8, UINT8, BOOL, FLOAT16),
                  pred=lambda v: v.dtype not in (FLOAT, FLOAT16) or v in b.inputs)
    to = draw(st.sampled_from([FLOAT, INT32, INT64, BOOL, FLOAT16] + ([INT8, UINT8] if src.dtype not in (FLOAT, FLOAT16) else [])))
    if draw(st.integers(0, 3)) == 0 and b.opset >= 15:
        like = b.const(np.zeros((1,), NP_OF[to]))
        return emit(b, "CastLike", [src, like]) is not None
    return emit(b, "Cast", [src], {"to": to}) is not None


# ----------------------------------------------------------------------------- linear algebra

def weights(draw, b: Builder, shape, dtype=FLOAT) -> Val:
    seed = draw(st.integers(0, 2**16))
    arr = random_array(np.random.default_rng(seed), dtype, shape, low=-1, high=1) if dtype == FLOAT else \
        random_array(np.random.default_rng(seed), dtype, shape)
    return b.const(arr)


def gen_matmul(draw, b: Builder) -> bool:
    a = operand(draw, b, FLOATS, min_rank=1)
    k = a.shape[-1]
    n = draw(st.integers(1, 6))
    if a.rank == 1 or draw(st.booleans()):
        w_shape = (k, n) if draw(st.integers(0, 4)) else (k,)
    else:
        batch = broadcast_shape(draw, a.shape[:-2])
        w_shape = batch + (k, n)
    w = weights(draw, b, w_shape) if draw(st.integers(0, 3)) else b.input(FLOAT, w_shape)
    return emit(b, "MatMul", [a, w]) is not None


def gen_gemm(draw, b: Builder) -> bool:
    a = operand(draw, b, FLOATS, min_rank=2, max_rank=2)
    trans_a, trans_b = draw(st.integers(0, 1)), draw(st.integers(0, 1))
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    n = draw(st.integers(1, 6))
    w = weights(draw, b, (n, k) if trans_b else (k, n))
    ins = [a, w]
    if draw(st.booleans()):
        ins.append(weights(draw, b, draw(st.sampled_from([(n,), (1, n), (m, 1), (m, n), ()]))))
    attrs = {"transA": trans_a, "transB": trans_b}
    if draw(st.booleans()):
        attrs["alpha"] = draw(st.sampled_from([0.5, 2.0]))
    if len(ins) == 3 and draw(st.booleans()):
        attrs["beta"] = draw(st.sampled_from([0.5, 2.0]))
    return emit(b, "Gemm", ins, attrs) is not None


def spatial_input(draw, b: Builder, dtypes=FLOATS) -> Val:
    return operand(draw, b, dtypes, min_rank=3, max_rank=4,
                   fresh_shape=st.tuples(st.integers(1, 2), st.integers(1, 4)).flatmap(
                       lambda nc: st.lists(st.integers(1, 7), min_size=1, max_size=2).map(lambda s: nc + tuple(s))))


def window_attrs(draw, spatial: int, kernel, *, dilations=True):
    attrs = {}
    if draw(st.booleans()):
        attrs["strides"] = [draw(st.integers(1, 2)) for _ in range(spatial)]
    if draw(st.booleans()):
        attrs["pads"] = [draw(st.integers(0, k - 1)) for k in kernel] * 2
    elif draw(st.integers(0, 4)) == 0 and all(s <= k for s, k in zip(attrs.get("strides", [1] * spatial), kernel)):
        # SAME with a stride beyond the kernel asks for negative pads: onnxruntime refuses them,
        # onnx.reference shifts the windows (ONNX leaves it open)
        attrs["auto_pad"] = draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    if dilations and "auto_pad" not in attrs and draw(st.integers(0, 3)) == 0:  # onnxruntime: no SAME + dilations
        attrs["dilations"] = [draw(st.integers(1, 2)) for _ in range(spatial)]
    return attrs


def gen_conv(draw, b: Builder) -> bool:
    x = spatial_input(draw, b)
    c = x.shape[1]
    group = draw(st.sampled_from([g for g in (1, 2, c) if c % g == 0]))
    m = group * draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, min(3, d))) for d in x.shape[2:]]
    w = weights(draw, b, (m, c // group, *kernel))
    ins = [x, w] + ([weights(draw, b, (m,))] if draw(st.booleans()) else [])
    attrs = window_attrs(draw, len(kernel), kernel)
    if group > 1:
        attrs["group"] = group
    if draw(st.booleans()):
        attrs["kernel_shape"] = kernel
    return emit(b, "Conv", ins, attrs) is not None


def gen_pool(draw, b: Builder) -> bool:
    op = draw(st.sampled_from(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"]))
    x = spatial_input(draw, b)
    if op.startswith("Global"):
        return emit(b, op, [x]) is not None
    kernel = [draw(st.integers(1, min(3, d))) for d in x.shape[2:]]
    attrs = {"kernel_shape": kernel, **window_attrs(draw, len(kernel), kernel,
                                                   dilations=op == "MaxPool" or b.opset >= 19)}
    if draw(st.integers(0, 3)) == 0 and "auto_pad" not in attrs:
        attrs["ceil_mode"] = 1
    if op == "AveragePool" and draw(st.booleans()):
        attrs["count_include_pad"] = 1
    return emit(b, op, [x], attrs) is not None


REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
          "ReduceSumSquare", "ReduceLogSumExp", "ArgMax", "ArgMin"]


def axes_of(draw, rank: int, *, unique=True) -> list[int]:
    picked = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=unique))
    return [a - rank if draw(st.booleans()) else a for a in picked]


def gen_reduce(draw, b: Builder) -> bool:
    op = draw(st.sampled_from(REDUCE))
    x = operand(draw, b, [t for t in schema_types(op, b.opset) if t in NUMERIC], min_rank=1)
    if x is None:
        return False
    attrs = {"keepdims": draw(st.integers(0, 1))}
    if op.startswith("Arg"):
        attrs["axis"] = draw(st.integers(-x.rank, x.rank - 1))
        if draw(st.booleans()):
            attrs["select_last_index"] = 1
        return emit(b, op, [x], attrs) is not None
    ins = [x]
    if draw(st.integers(0, 3)):
        axes = axes_of(draw, x.rank)
        as_input = b.opset >= 18 or (op == "ReduceSum" and b.opset >= 13)
        if as_input:
            av = b.const(np.array(axes, np.int64))
            ins.append(av)
            return emit(b, op, ins, attrs, data=const_data(av, arrays=[np.array(axes, np.int64)])) is not None
        attrs["axes"] = axes
    return emit(b, op, ins, attrs) is not None


def gen_softmax(draw, b: Builder) -> bool:
    op = draw(st.sampled_from(["Softmax", "LogSoftmax", "Hardmax"]))
    x = operand(draw, b, FLOATS, min_rank=1)
    return emit(b, op, [x], {"axis": draw(st.integers(-x.rank, x.rank - 1))}) is not None


def gen_norm(draw, b: Builder) -> bool:
    op = draw(st.sampled_from(["LayerNormalization", "BatchNormalization", "InstanceNormalization"]))
    if op == "LayerNormalization":
        x = operand(draw, b, FLOATS, min_rank=1)
        axis = draw(st.integers(-x.rank, x.rank - 1))
        norm = x.shape[axis:]
        ins = [x, weights(draw, b, norm)] + ([weights(draw, b, norm)] if draw(st.booleans()) else [])
        return emit(b, op, ins, {"axis": axis, "epsilon": 1e-5}) is not None
    x = spatial_input(draw, b)
    c = x.shape[1]
    if op == "InstanceNormalization":
        return emit(b, op, [x, weights(draw, b, (c,)), weights(draw, b, (c,))]) is not None
    var = b.const(np.abs(random_array(np.random.default_rng(draw(st.integers(0, 99))), FLOAT, (c,))) + 0.5)
    return emit(b, op, [x, weights(draw, b, (c,)), weights(draw, b, (c,)), weights(draw, b, (c,)), var]) is not None


# ----------------------------------------------------------------------------- data movement

def gen_transpose(draw, b: Builder) -> bool:
    x = operand(draw, b, NUMERIC + (BOOL,), min_rank=1)
    perm = draw(st.permutations(range(x.rank)))
    return emit(b, "Transpose", [x], {"perm": list(perm)} if draw(st.integers(0, 4)) else {}) is not None


def gen_reshape(draw, b: Builder) -> bool:
    x = operand(draw, b, NUMERIC + (BOOL,))
    size = x.size
    factors = [d for d in range(1, size + 1) if size % d == 0]
    shape, rest = [], size
    for _ in range(draw(st.integers(0, 3))):
        d = draw(st.sampled_from([f for f in factors if rest % f == 0]))
        shape.append(d)
        rest //= d
    shape.append(rest)
    if draw(st.booleans()):
        shape[draw(st.integers(0, len(shape) - 1))] = -1
    op = draw(st.sampled_from(["Reshape", "Reshape", "Flatten"]))
    if op == "Flatten":
        return emit(b, "Flatten", [x], {"axis": draw(st.integers(-x.rank, x.rank))} if x.rank else {}) is not None
    s = np.array(shape, np.int64)
    sv = b.const(s, node=draw(st.integers(0, 3)) == 0)
    return emit(b, "Reshape", [x, sv], data=const_data(sv, arrays=[s])) is not None


def gen_shape_reshape(draw, b: Builder) -> bool:
    """The exporters' int64 shape subgraph: Shape -> Gather (kept dims) -> Concat(-1) -> Reshape."""
    x = operand(draw, b, NUMERIC, min_rank=2)
    keep = draw(st.integers(1, x.rank - 1))
    shape = b.add("Shape", [x], [(INT64, (x.rank,))], offer=False)[0]
    idx = b.const(np.arange(keep, dtype=np.int64), node=draw(st.booleans()))
    dims_kept = b.add("Gather", [shape, idx], [(INT64, (keep,))], offer=False, axis=0)[0]
    minus = b.const(np.array([-1], np.int64))
    new_shape = b.add("Concat", [dims_kept, minus], [(INT64, (keep + 1,))], offer=False, axis=0)[0]
    out = x.shape[:keep] + (int(np.prod(x.shape[keep:])),)
    b.add("Reshape", [x, new_shape], [(x.dtype, out)])
    return True


def gen_concat(draw, b: Builder) -> bool:
    x = operand(draw, b, NUMERIC + (BOOL,), min_rank=1)
    axis = draw(st.integers(-x.rank, x.rank - 1))
    parts = [x]
    for _ in range(draw(st.integers(1, 3))):
        shape = list(x.shape)
        shape[axis] = draw(st.integers(1, 4))
        same = [v for v in b.of((x.dtype,)) if v.rank == x.rank and
                all(d == e for i, (d, e) in enumerate(zip(v.shape, x.shape)) if i != axis % x.rank)]
        parts.append(draw(st.sampled_from(same)) if same and draw(st.booleans()) else b.input(x.dtype, shape))
    return emit(b, "Concat", parts, {"axis": axis}) is not None


def gen_slice(draw, b: Builder) -> bool:
    x = operand(draw, b, NUMERIC, min_rank=1)
    axes = axes_of(draw, x.rank)
    starts, ends, steps = [], [], []
    for a in axes:
        d = x.shape[a]
        step = draw(st.sampled_from([1, 1, 2, -1, -2]))
        lo, hi = draw(st.integers(0, d - 1)), draw(st.integers(0, d))
        if step > 0:
            start, end = min(lo, hi), max(lo, hi) + (1 if lo == hi else 0)
        else:
            start, end = max(lo, hi - 1), min(lo, hi - 1) if min(lo, hi - 1) < max(lo, hi - 1) else -d - 1
        start = start - d if draw(st.integers(0, 3)) == 0 and start < d else start
        starts.append(start)
        ends.append(end if not (end >= d and draw(st.booleans())) else 2**31)
        steps.append(step)
    arrs = [np.array(v, np.int64) for v in (starts, ends, axes, steps)]
    n = 4 if any(s != 1 for s in steps) or draw(st.booleans()) else 3
    consts = [b.const(a) for a in arrs[:n]]
    return emit(b, "Slice", [x] + consts, data=const_data(*consts, arrays=arrs[:n])) is not None


def gen_gather(draw, b: Builder) -> bool:
    x = operand(draw, b, NUMERIC, min_rank=1)
    axis = draw(st.integers(-x.rank, x.rank - 1))
    d = x.shape[axis]
    shape = draw(dims(2, 0, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    idx = rng.integers(-d, d, size=shape).astype(draw(st.sampled_from([np.int64, np.int32])))
    iv = b.const(idx, node=draw(st.integers(0, 3)) == 0)
    return emit(b, "Gather", [x, iv], {"axis": axis}) is not None


def gen_squeeze(draw, b: Builder) -> bool:
    x = operand(draw, b, NUMERIC, max_rank=3)
    if draw(st.booleans()):
        rank = x.rank + 1
        axes = sorted(set(axes_of(draw, rank)), key=lambda a: a % rank)
        rank = x.rank + len(axes)
        axes = [a % rank for a in axes]
        av = np.array(axes, np.int64)
        c = b.const(av)
        return emit(b, "Unsqueeze", [x, c], data=const_data(c, arrays=[av])) is not None
    ones = [i for i, d in enumerate(x.shape) if d == 1]
    if not ones:
        return False
    av = np.array(draw(st.lists(st.sampled_from(ones), min_size=1, unique=True)), np.int64)
    c = b.const(av)
    return emit(b, "Squeeze", [x, c], data=const_data(c, arrays=[av])) is not None


def gen_expand_tile(draw, b: Builder) -> bool:
    x = operand(draw, b, NUMERIC, max_rank=3)
    if draw(st.booleans()):
        reps = np.array([draw(st.integers(1, 3)) for _ in x.shape], np.int64)
        c = b.const(reps)
        return x.rank > 0 and emit(b, "Tile", [x, c], data=const_data(c, arrays=[reps])) is not None
    shape = [d if d != 1 or not draw(st.booleans()) else draw(st.integers(1, 4)) for d in x.shape]
    shape = [draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, 1)))] + shape
    s = np.array(shape, np.int64)
    c = b.const(s)
    return emit(b, "Expand", [x, c], data=const_data(c, arrays=[s])) is not None


def gen_pad(draw, b: Builder) -> bool:
    x = operand(draw, b, NUMERIC, min_rank=1)
    mode = draw(st.sampled_from(["constant", "reflect", "edge"]))
    limit = (lambda d: d - 1) if mode == "reflect" else (lambda d: 2)
    pads = [draw(st.integers(0, limit(d))) for d in x.shape] + [draw(st.integers(0, limit(d))) for d in x.shape]
    p = np.array(pads, np.int64)
    c = b.const(p)
    ins = [x, c]
    if mode == "constant" and draw(st.booleans()):
        ins.append(b.const(np.array(draw(st.integers(-3, 3)), NP_OF[x.dtype])))
    return emit(b, "Pad", ins, {"mode": mode}, data=const_data(c, arrays=[p])) is not None


def gen_split(draw, b: Builder) -> bool:
    x = operand(draw, b, NUMERIC, min_rank=1, pred=lambda v: max(v.shape) > 1)
    axis = draw(st.sampled_from([a for a, d in enumerate(x.shape) if d > 1] or [0]))
    d = x.shape[axis]
    cut = sorted(draw(st.lists(st.integers(1, d - 1), min_size=1, max_size=min(3, d - 1), unique=True))) if d > 1 else []
    sizes = np.diff([0, *cut, d]).astype(np.int64)
    c = b.const(sizes)
    return emit(b, "Split", [x, c], {"axis": axis}, n_out=len(sizes), data=const_data(c, arrays=[sizes])) is not None


def gen_resize(draw, b: Builder) -> bool:
    x = spatial_input(draw, b)
    mode = draw(st.sampled_from(["nearest", "linear"]))
    scale = [1.0, 1.0] + [draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])) for _ in x.shape[2:]]
    scale = [s if x.shape[i] * s >= 1 else 1.0 for i, s in enumerate(scale)]
    sv = np.array(scale, np.float32)
    c = b.const(sv)
    attrs = {"mode": mode}
    if draw(st.booleans()):
        attrs["coordinate_transformation_mode"] = draw(st.sampled_from(
            ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"]))
    if mode == "nearest" and draw(st.booleans()):
        attrs["nearest_mode"] = draw(st.sampled_from(["round_prefer_floor", "floor", "ceil"]))
    return emit(b, "Resize", [x, "", c], attrs, data=const_data(c, arrays=[sv])) is not None


def gen_depth_space(draw, b: Builder) -> bool:
    x = operand(draw, b, FLOATS, min_rank=4, max_rank=4,
                fresh_shape=st.tuples(st.just(1), st.sampled_from([4, 8]), st.integers(1, 4), st.integers(1, 4)))
    bs = 2
    if draw(st.booleans()):
        return x.shape[1] % 4 == 0 and emit(b, "DepthToSpace", [x], {
            "blocksize": bs, "mode": draw(st.sampled_from(["DCR", "CRD"]))}) is not None
    return x.shape[2] % bs == 0 and x.shape[3] % bs == 0 and emit(b, "SpaceToDepth", [x], {"blocksize": bs}) is not None


def gen_cumsum_trilu(draw, b: Builder) -> bool:
    x = operand(draw, b, (FLOAT, INT32, INT64), min_rank=1)
    if draw(st.booleans()) and x.rank >= 2:
        k = b.const(np.array(draw(st.integers(-2, 2)), np.int64))
        return emit(b, "Trilu", [x, k], {"upper": draw(st.integers(0, 1))}) is not None
    axis = b.const(np.array(draw(st.integers(-x.rank, x.rank - 1)), np.int64))
    return emit(b, "CumSum", [x, axis], {"exclusive": draw(st.integers(0, 1)), "reverse": draw(st.integers(0, 1))}) is not None


FLOAT_OPS = {
    "unary": (gen_unary, 6), "binary": (gen_binary, 6), "where": (gen_where, 1), "clip": (gen_clip, 1),
    "cast": (gen_cast, 1), "matmul": (gen_matmul, 2), "gemm": (gen_gemm, 1), "conv": (gen_conv, 2),
    "pool": (gen_pool, 1), "reduce": (gen_reduce, 2), "softmax": (gen_softmax, 1), "norm": (gen_norm, 1),
    "transpose": (gen_transpose, 1), "reshape": (gen_reshape, 1), "shape_reshape": (gen_shape_reshape, 1),
    "concat": (gen_concat, 1), "slice": (gen_slice, 1), "gather": (gen_gather, 1), "squeeze": (gen_squeeze, 1),
    "expand_tile": (gen_expand_tile, 1), "pad": (gen_pad, 1), "split": (gen_split, 1), "resize": (gen_resize, 1),
    "depth_space": (gen_depth_space, 1), "cumsum_trilu": (gen_cumsum_trilu, 1),
}

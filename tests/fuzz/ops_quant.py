"""Op generators for the quantized forms, written as onnxruntime's quantizer writes them.

- QDQ: a float activation goes through QuantizeLinear -> DequantizeLinear (uint8, asymmetric),
  weights are int8 initializers (symmetric, per-tensor or per-channel) behind a DequantizeLinear,
  a bias an int32 initializer at scale x_scale * w_scale; the float op's output is quantized and
  dequantized again (the node unit onnxruntime's QDQ selectors fuse).
- QOperator: QLinearConv, QLinearMatMul and com.microsoft's QLinearAdd / QLinearMul /
  QLinearSigmoid / QLinearLeakyRelu / QLinearAveragePool / QLinearGlobalAveragePool /
  QLinearConcat / QLinearSoftmax on uint8 values a QuantizeLinear made.
- dynamic: DynamicQuantizeLinear -> MatMulInteger / ConvInteger -> Cast -> Mul [-> Add].
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from .builder import FLOAT, INT8, INT32, UINT8, Builder, Val, infer_outputs, random_array
from .ops_float import FLOATS, emit, operand, spatial_input, window_attrs

MS = "com.microsoft"
SCALES = [0.0078125, 0.015625, 0.03125, 0.0625, 0.125]


def qparams(draw, b: Builder, dtype=UINT8):
    scale = draw(st.sampled_from(SCALES))
    zp = draw(st.integers(96, 160)) if dtype == UINT8 else 0
    np_type = np.uint8 if dtype == UINT8 else np.int8
    return scale, zp, b.const(np.array(scale, np.float32)), b.const(np.array(zp, np_type))


def quantize(draw, b: Builder, x: Val, *, offer: bool = False) -> Val:
    """x -> QuantizeLinear (uint8, a drawn scale and zero point): the uint8 value, its params kept."""
    scale, zp, s, z = qparams(draw, b)
    q = b.add("QuantizeLinear", [x, s, z], [(UINT8, x.shape)], offer=offer)[0]
    q.quant = (scale, zp)
    return q


def dequantize(b: Builder, q: Val, *, offer=True) -> Val:
    scale, zp = q.quant
    s, z = b.const(np.array(scale, np.float32)), b.const(np.array(zp, q_np(q)))
    return b.add("DequantizeLinear", [q, s, z], [(FLOAT, q.shape)], offer=offer)[0]


def q_np(q: Val):
    return np.uint8 if q.dtype == UINT8 else np.int8


def quantized_operand(draw, b: Builder, **kw) -> Val:
    """A uint8 value with known params: an existing one, or QuantizeLinear of a float value."""
    have = [v for v in b.values if v.quant is not None and kw.get("min_rank", 0) <= v.rank <= kw.get("max_rank", 4)]
    if have and draw(st.booleans()):
        return draw(st.sampled_from(have))
    x = spatial_input(draw, b) if kw.get("spatial") else operand(draw, b, FLOATS, min_rank=kw.get("min_rank", 0),
                                                                 max_rank=kw.get("max_rank", 4))
    return quantize(draw, b, x)


def int8_weights(draw, b: Builder, shape, axis=None):
    """int8 weights (initializer) and their per-tensor or per-channel scale (zero point 0)."""
    w = random_array(np.random.default_rng(draw(st.integers(0, 2**16))), INT8, shape, low=-127, high=127)
    if axis is not None and draw(st.booleans()):
        scales = np.array([draw(st.sampled_from(SCALES)) for _ in range(shape[axis])], np.float32)
    else:
        scales = np.array(draw(st.sampled_from(SCALES)), np.float32)
    return b.const(w), scales


def gen_qdq_unit(draw, b: Builder) -> bool:
    """A QDQ node unit: Q -> DQ on the activation(s), DQ on int8 weights / int32 bias, the float op,
    then Q -> DQ on its output."""
    op = draw(st.sampled_from(["Conv", "MatMul", "Gemm", "Add", "Mul", "Relu", "AveragePool", "MaxPool",
                               "GlobalAveragePool", "Sigmoid", "Concat", "Transpose", "Softmax", "LeakyRelu"]))
    spatial = op in ("Conv", "AveragePool", "MaxPool", "GlobalAveragePool")
    q = quantized_operand(draw, b, spatial=spatial, min_rank=2 if op == "Gemm" else (1 if op == "MatMul" else 0),
                          max_rank=2 if op == "Gemm" else 4)
    if spatial and q.rank < 3:
        return False
    x = dequantize(b, q, offer=False)
    xs = q.quant[0]
    attrs, ins = {}, [x]
    if op in ("Conv", "MatMul", "Gemm"):
        if op == "Conv":
            c = q.shape[1]
            m = draw(st.integers(1, 4))
            kernel = [draw(st.integers(1, min(3, d))) for d in q.shape[2:]]
            wshape, axis, n = (m, c, *kernel), 0, m
            attrs = window_attrs(draw, len(kernel), kernel)
        elif op == "MatMul":
            n = draw(st.integers(1, 6))
            wshape, axis = (q.shape[-1], n), 1
        else:
            n = draw(st.integers(1, 6))
            attrs["transB"] = draw(st.integers(0, 1))
            wshape, axis = ((n, q.shape[1]) if attrs["transB"] else (q.shape[1], n)), 0 if attrs["transB"] else 1
        w, ws = int8_weights(draw, b, wshape, axis)
        wdq_attrs = {"axis": axis} if ws.ndim else {}
        wz = b.const(np.zeros(ws.shape, np.int8))
        wf = b.add("DequantizeLinear", [w, b.const(ws), wz], [(FLOAT, wshape)], offer=False, **wdq_attrs)[0]
        ins.append(wf)
        if op != "MatMul" and draw(st.booleans()):
            bias = np.random.default_rng(draw(st.integers(0, 99))).integers(-500, 500, size=(n,)).astype(np.int32)
            bs = (xs * ws).astype(np.float32) if ws.ndim else np.array(xs * ws, np.float32)
            bq = b.add("DequantizeLinear", [b.const(bias), b.const(bs)], [(FLOAT, (n,))], offer=False,
                       **({"axis": 0} if ws.ndim else {}))[0]
            ins.append(bq)
    elif op in ("Add", "Mul", "Concat"):
        other = quantized_operand(draw, b, min_rank=q.rank, max_rank=q.rank)
        if op == "Concat":
            if other.rank != q.rank or q.rank == 0:
                return False
            attrs["axis"] = draw(st.integers(0, q.rank - 1))
        ins.append(dequantize(b, other, offer=False))
    elif op in ("AveragePool", "MaxPool"):
        kernel = [draw(st.integers(1, min(3, d))) for d in q.shape[2:]]
        attrs = {"kernel_shape": kernel, **window_attrs(draw, len(kernel), kernel, dilations=False)}
    elif op == "Transpose":
        if q.rank == 0:
            return False
        attrs["perm"] = list(draw(st.permutations(range(q.rank))))
    elif op == "Softmax":
        if q.rank == 0:
            return False
        attrs["axis"] = -1
    elif op == "LeakyRelu":
        attrs["alpha"] = draw(st.sampled_from([0.1, 0.2]))
    y = emit(b, op, ins, attrs, offer=False)
    if y is None:
        return False
    out = quantize(draw, b, y[0], offer=draw(st.integers(0, 3)) == 0)
    dequantize(b, out)
    return True


def gen_qoperator(draw, b: Builder) -> bool:
    op = draw(st.sampled_from(["QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearSigmoid",
                               "QLinearLeakyRelu", "QLinearAveragePool", "QLinearGlobalAveragePool",
                               "QLinearConcat", "QLinearSoftmax"]))
    spatial = op in ("QLinearConv", "QLinearAveragePool", "QLinearGlobalAveragePool")
    q = quantized_operand(draw, b, spatial=spatial, min_rank=1 if op in ("QLinearMatMul", "QLinearSoftmax",
                                                                         "QLinearConcat") else 0)
    if spatial and q.rank < 3:
        return False
    xs, xz = q.quant
    ys, yz, ysv, yzv = qparams(draw, b)
    xsv, xzv = b.const(np.array(xs, np.float32)), b.const(np.array(xz, np.uint8))
    domain, attrs = MS, {}
    if op in ("QLinearConv", "QLinearMatMul"):
        domain = ""
        if op == "QLinearConv":
            c, m = q.shape[1], draw(st.integers(1, 4))
            kernel = [draw(st.integers(1, min(3, d))) for d in q.shape[2:]]
            wshape, axis, n = (m, c, *kernel), 0, m
            attrs = window_attrs(draw, len(kernel), kernel)
        else:
            n = draw(st.integers(1, 6))
            wshape, axis = (q.shape[-1], n), None
        w, ws = int8_weights(draw, b, wshape, axis)
        ins = [q, xsv, xzv, w, b.const(ws), b.const(np.zeros(ws.shape, np.int8)), ysv, yzv]
        if op == "QLinearConv" and draw(st.booleans()):
            ins.append(b.const(np.random.default_rng(7).integers(-500, 500, size=(n,)).astype(np.int32)))
        shape_op, shape_ins = ("Conv", [Val(q.name, FLOAT, q.shape), Val(w.name, FLOAT, wshape)]) \
            if op == "QLinearConv" else ("MatMul", [Val(q.name, FLOAT, q.shape), Val(w.name, FLOAT, wshape)])
    elif op in ("QLinearAdd", "QLinearMul"):
        other = quantized_operand(draw, b, min_rank=0, max_rank=q.rank)
        ins = [q, xsv, xzv, other, b.const(np.array(other.quant[0], np.float32)),
               b.const(np.array(other.quant[1], np.uint8)), ysv, yzv]
        shape_op, shape_ins = "Add", [Val(q.name, FLOAT, q.shape), Val(other.name, FLOAT, other.shape)]
    elif op in ("QLinearSigmoid", "QLinearLeakyRelu"):
        ins = [q, xsv, xzv, ysv, yzv]
        if op == "QLinearLeakyRelu":
            attrs["alpha"] = draw(st.sampled_from([0.1, 0.2]))
        shape_op, shape_ins = "Relu", [Val(q.name, FLOAT, q.shape)]
    elif op == "QLinearAveragePool":
        kernel = [draw(st.integers(1, min(3, d))) for d in q.shape[2:]]
        attrs = {"kernel_shape": kernel, **window_attrs(draw, len(kernel), kernel, dilations=False)}
        ins = [q, xsv, xzv, ysv, yzv]
        shape_op, shape_ins = "AveragePool", [Val(q.name, FLOAT, q.shape)]
    elif op == "QLinearGlobalAveragePool":
        ins = [q, xsv, xzv, ysv, yzv]
        shape_op, shape_ins = "GlobalAveragePool", [Val(q.name, FLOAT, q.shape)]
    elif op == "QLinearConcat":
        other = quantized_operand(draw, b, min_rank=q.rank, max_rank=q.rank)
        if other.rank != q.rank:
            return False
        attrs["axis"] = draw(st.integers(0, q.rank - 1))
        ins = [ysv, yzv, q, xsv, xzv, other, b.const(np.array(other.quant[0], np.float32)),
               b.const(np.array(other.quant[1], np.uint8))]
        shape_op, shape_ins = "Concat", [Val(q.name, FLOAT, q.shape), Val(other.name, FLOAT, other.shape)]
    else:  # QLinearSoftmax: onnxruntime's contract is a last-axis softmax at opset 13
        attrs = {"axis": -1, "opset": 13}
        ys, yz = 1 / 256, 0
        ysv, yzv = b.const(np.array(ys, np.float32)), b.const(np.array(yz, np.uint8))
        ins = [q, xsv, xzv, ysv, yzv]
        shape_op, shape_ins = "Relu", [Val(q.name, FLOAT, q.shape)]
    shape_attrs = {k: v for k, v in attrs.items() if k not in ("opset",) and not (shape_op == "Relu" and k == "alpha")}
    if shape_op == "Relu":
        shape_attrs = {}
    got = infer_outputs(b, shape_op, shape_ins, 1, shape_attrs)
    if got is None:
        return False
    out = b.add(op, ins, [(UINT8, got[0][1])], domain=domain, **attrs)[0]
    out.quant = (ys, yz)
    if draw(st.booleans()):
        dequantize(b, out)
    return True


def gen_dynamic(draw, b: Builder) -> bool:
    """DynamicQuantizeLinear -> MatMulInteger / ConvInteger (int8 or uint8 weights) -> Cast -> Mul
    [-> Add bias], as onnxruntime's dynamic quantizer writes it."""
    conv = draw(st.booleans())
    x = spatial_input(draw, b) if conv else operand(draw, b, FLOATS, min_rank=1)
    if conv and x.rank < 3:
        return False
    xq, xs, xz = b.add("DynamicQuantizeLinear", [x], [(UINT8, x.shape), (FLOAT, ()), (UINT8, ())], offer=False)
    wtype = draw(st.sampled_from([INT8, UINT8])) if not conv else UINT8
    if conv:
        c, m = x.shape[1], draw(st.integers(1, 4))
        kernel = [draw(st.integers(1, min(3, d))) for d in x.shape[2:]]
        wshape = (m, c, *kernel)
        attrs = window_attrs(draw, len(kernel), kernel)
        attrs.pop("auto_pad", None)
    else:
        m = draw(st.integers(1, 6))
        wshape, attrs = (x.shape[-1], m), {}
    w = b.const(random_array(np.random.default_rng(draw(st.integers(0, 2**16))), wtype, wshape))
    wz = b.const(np.array(0 if wtype == INT8 else draw(st.integers(100, 150)), np.int8 if wtype == INT8 else np.uint8))
    op = "ConvInteger" if conv else "MatMulInteger"
    shape_op = "Conv" if conv else "MatMul"
    got = infer_outputs(b, shape_op, [Val(x.name, FLOAT, x.shape), Val(w.name, FLOAT, wshape)], 1, attrs)
    if got is None:
        return False
    shape = got[0][1]
    acc = b.add(op, [xq, w, xz, wz], [(INT32, shape)], offer=False, **attrs)[0]
    accf = b.add("Cast", [acc], [(FLOAT, shape)], offer=False, to=FLOAT)[0]
    ws = b.const(np.array(draw(st.sampled_from(SCALES)), np.float32))
    scale = b.add("Mul", [xs, ws], [(FLOAT, ())], offer=False)[0]
    y = b.add("Mul", [accf, scale], [(FLOAT, shape)])[0]
    if not conv and draw(st.booleans()):
        bias = b.const(random_array(np.random.default_rng(3), FLOAT, (m,), low=-1, high=1))
        b.add("Add", [y, bias], [(FLOAT, shape)])
    return True


QUANT_OPS = {"qdq": (gen_qdq_unit, 3), "qoperator": (gen_qoperator, 3), "dynamic": (gen_dynamic, 2)}

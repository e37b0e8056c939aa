"""Float models in the shapes torch.onnx (opset 17) and paddle2onnx write, and their
onnxruntime-quantized forms: the test and benchmark stand-ins for real exported models.

Unlike :mod:`onnx_quant.model_zoo` (stacks of identical blocks), each model here is one
architecture with the idioms exporters emit, every shape computation in int64 ``Constant``
nodes and ``Shape`` arithmetic as written by the exporter, not folded:

- :func:`yolo_head`: a two-scale YOLO-style detection head: ``Shape -> Gather -> Unsqueeze ->
  Concat -> Reshape``, grids from ``Range(0, Cast(Div(W, stride)), 1)`` and ``Expand``,
  ``Split`` into xy / wh / scores, ``Resize`` with sizes computed in the graph and with
  ``Constant`` scales, ``Softmax`` over classes, ``TopK`` with ``K = Min(boxes, 8)`` and a
  ``NonZero`` over the confidences (a data-dependent dim);
- :func:`yolo_anchors`: an anchor-free (YOLOv8-style) head whose anchor grids are float:
  ``Range(0.0, Cast<float>(Gather(Shape(x), 3)), 1.0) + 0.5``, ``Expand``, ``Concat``,
  ``Reshape``, ``Transpose``, strides by ``Expand``, a level resized to ``int(h / 4)`` and
  ``int(w / 4)`` computed in float, boxes decoded by ``Sub``/``Add``/``Div``/``Mul``;
- :func:`mobilenet_v3`: paddle2onnx style: every unknown dim is ``?``, ``BatchNormalization``
  not folded, ``HardSwish`` and a squeeze-excite with ``HardSigmoid``, ``Reshape(x, [0, -1])``;
- :func:`transformer`: a torch encoder block over token ids: ``Gather`` embeddings, position ids
  from ``Range(0, Gather(Shape(ids), 1), 1)``, layer norm decomposed into ReduceMean, Sub,
  Pow, Sqrt, Div, heads split and merged with shapes ``Concat``-ed from ``Shape``, GELU as Erf;
- :func:`crnn`: a text recogniser: convolutions to height 1, ``Squeeze``, bidirectional
  ``LSTM`` whose initial states come from ``ConstantOfShape`` of a computed shape,
  ``LogSoftmax`` over ``[T, N, classes]``;
- :func:`dbnet`: a paddle2onnx DBNet text detector: a strided backbone, an FPN neck whose
  top-down path and level fusion upsample with ``Resize`` (nearest, asymmetric, ``Constant``
  scales, an empty ``roi``), ``Concat`` of the levels, and a head that upsamples back to the
  input's size with two ``ConvTranspose`` (BatchNormalization not folded, ``?`` dims);
- :func:`vad_state`: an LSTM-state voice-activity model (silero-vad-like): an ``If`` whose
  condition folds (the state's leading dim), a ``Loop`` over frames whose trip count is a
  ``Shape`` value, carrying a state and scanning out per-frame probabilities.

:func:`quantize` gives the QDQ and QOperator forms (``quantize_static`` with a small
calibration reader) and the dynamic form (``quantize_dynamic``; the LSTMs become
``com.microsoft.DynamicQuantizeLSTM``). Everything is deterministic.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_quant import model_zoo

#: torch.onnx's default export opset of the models here
OPSET = 17
IR_VERSION = 8
F, I64 = TensorProto.FLOAT, TensorProto.INT64


class _Builder(model_zoo._Builder):
    """The zoo's builder, with shape constants as ``Constant`` nodes (what exporters write)."""

    def constant(self, base: str, array) -> str:
        name = self.name(base)
        self.nodes.append(helper.make_node("Constant", [], [name], name=name,
                                           value=numpy_helper.from_array(np.asarray(array), name)))
        return name

    def ints(self, *values: int) -> str:
        return self.constant("const", np.array(values, np.int64))

    def scalar(self, value: int) -> str:
        return self.constant("const", np.array(value, np.int64))

    def shape_item(self, x: str, axis: int) -> str:
        """``Gather(Shape(x), axis)``: a 0-d int64 (torch's ``x.size(axis)``)."""
        return self.node("Gather", [self.node("Shape", [x]), self.scalar(axis)], axis=0)

    def unsqueeze0(self, x: str) -> str:
        return self.node("Unsqueeze", [x, self.ints(0)])

    def conv(self, x: str, c_in: int, c_out: int, kernel: int | Sequence[int], stride=1, pad=0,
             group: int = 1, bias: bool = True) -> str:
        k = [kernel, kernel] if isinstance(kernel, int) else list(kernel)
        s = [stride, stride] if isinstance(stride, int) else list(stride)
        p = [pad] * 4 if isinstance(pad, int) else list(pad)
        w = self.weight("conv_w", (c_out, c_in // group, *k), c_in // group * k[0] * k[1])
        inputs = [x, w] + ([self.const("conv_b", self.rng.uniform(-0.1, 0.1, c_out).astype(np.float32))] if bias else [])
        return self.node("Conv", inputs, kernel_shape=k, strides=s, pads=p, group=group)

    def batch_norm(self, x: str, c: int) -> str:
        params = [self.rng.uniform(0.5, 1.5, c), self.rng.uniform(-0.1, 0.1, c),
                  self.rng.uniform(-0.1, 0.1, c), self.rng.uniform(0.5, 1.5, c)]
        names = [self.const(n, p.astype(np.float32)) for n, p in zip(("bn_scale", "bn_bias", "bn_mean", "bn_var"), params)]
        return self.node("BatchNormalization", [x, *names], epsilon=1e-5)

    def model(self, name: str, inputs, outputs, doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                                 producer_name="onnx-quant", producer_version="exported_models", doc_string=doc)


# ------------------------------------------------------------------ YOLO-style head
def _decode(b: _Builder, feat: str, c: int, classes: int, anchors: int, stride: int, grid_hw: tuple[str, str]) -> str:
    """One detection scale: ``[N, c, ny, nx] -> [N, anchors * ny * nx, 5 + classes]``."""
    no = 5 + classes
    p = b.conv(feat, c, anchors * no, 1)
    n, ny, nx = (b.shape_item(p, a) for a in (0, 2, 3))
    shape = b.node("Concat", [b.unsqueeze0(n), b.ints(anchors), b.ints(no), b.unsqueeze0(ny), b.unsqueeze0(nx)], axis=0)
    p = b.node("Transpose", [b.node("Reshape", [p, shape])], perm=[0, 1, 3, 4, 2])
    gy_n, gx_n = grid_hw
    one, zero = b.scalar(1), b.scalar(0)
    ys = b.node("Range", [zero, gy_n, one])
    xs = b.node("Range", [zero, gx_n, one])
    yx = b.node("Concat", [b.unsqueeze0(gy_n), b.unsqueeze0(gx_n)], axis=0)
    gy = b.node("Expand", [b.node("Unsqueeze", [ys, b.ints(1)]), yx])
    gx = b.node("Expand", [b.node("Unsqueeze", [xs, b.ints(0)]), yx])
    grid = b.node("Concat", [b.node("Unsqueeze", [gx, b.ints(2)]), b.node("Unsqueeze", [gy, b.ints(2)])], axis=2)
    grid = b.node("Cast", [grid], to=F)
    xy, wh, rest = b.node("Split", [b.node("Sigmoid", [p]), b.ints(2, 2, 1 + classes)], n_out=3, axis=4)
    xy = b.node("Mul", [b.node("Add", [b.node("Mul", [xy, b.const("two", np.float32(2))]), grid]),
                        b.const("stride", np.float32(stride))])
    anchor = b.const("anchor_grid", b.rng.uniform(4, 32, (1, anchors, 1, 1, 2)).astype(np.float32))
    wh = b.node("Mul", [b.node("Pow", [b.node("Mul", [wh, b.const("two", np.float32(2))]), b.const("two", np.float32(2))]), anchor])
    out = b.node("Concat", [xy, wh, rest], axis=4)
    return b.node("Reshape", [out, b.node("Concat", [b.unsqueeze0(n), b.ints(-1), b.ints(no)], axis=0)])


def yolo_head(*, classes: int = 3, anchors: int = 2, channels: int = 8, seed: int = 0) -> onnx.ModelProto:
    """``images [batch, 3, height, width] -> dets [batch, boxes, 5 + classes]``, ``scores`` /
    ``top`` (TopK, K = min(boxes, 8)) and ``keep`` (NonZero of conf > 0.5: ``[2, k]``)."""
    b = _Builder(seed)
    f = b.conv("images", 3, channels, 2, stride=2)  # [N, C, H/2, W/2] (floor)
    f = b.node("Mul", [f, b.node("Sigmoid", [f])])  # SiLU as torch writes it
    # grid sizes as YOLO computes them: from the image size and the stride
    h_img, w_img = b.shape_item("images", 2), b.shape_item("images", 3)
    two = b.scalar(2)
    grid1 = tuple(b.node("Cast", [b.node("Div", [d, two])], to=I64) for d in (h_img, w_img))
    dets1 = _decode(b, f, channels, classes, anchors, 2, grid1)
    # scale 2: upsampled x2 with sizes computed from the feature's shape, then a Constant-scales Resize back
    shp = b.node("Shape", [f])
    hw = b.node("Slice", [shp, b.ints(2), b.ints(4)])
    sizes = b.node("Concat", [b.node("Slice", [shp, b.ints(0), b.ints(2)]), b.node("Mul", [hw, b.ints(2)])], axis=0)
    up = b.node("Resize", [f, "", "", sizes], mode="nearest")
    up = b.node("Resize", [up, "", b.constant("scales", np.array([1, 1, 0.5, 0.5], np.float32))], mode="nearest")
    grid2 = (b.shape_item(up, 2), b.shape_item(up, 3))
    dets2 = _decode(b, up, channels, classes, anchors, 2, grid2)
    dets = b.node("Concat", [dets1, dets2], axis=1)
    boxes, cls = b.node("Split", [dets, b.ints(5, classes)], n_out=2, axis=2)
    b.nodes.append(helper.make_node("Softmax", [cls], ["scores"], name="scores", axis=-1))
    b.nodes.append(helper.make_node("Concat", [boxes, "scores"], ["dets"], name="dets", axis=2))
    conf = b.node("Squeeze", [b.node("Slice", [boxes, b.ints(4), b.ints(5), b.ints(2)]), b.ints(2)])  # [N, boxes]
    k = b.node("Min", [b.unsqueeze0(b.shape_item(conf, 1)), b.ints(8)])
    b.nodes.append(helper.make_node("TopK", [conf, k], ["top_values", "top_indices"], name="top", axis=1))
    keep = b.node("Greater", [conf, b.const("threshold", np.float32(0.5))])
    b.nodes.append(helper.make_node("NonZero", [keep], ["keep"], name="keep"))
    return b.model(
        "yolo_head", [helper.make_tensor_value_info("images", F, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("dets", F, ["batch", "boxes", 5 + classes]),
         helper.make_tensor_value_info("top_values", F, ["batch", "k"]),
         helper.make_tensor_value_info("top_indices", I64, ["batch", "k"]),
         helper.make_tensor_value_info("keep", I64, [2, "kept"])],
        "onnx-quant exported models: YOLO-style two-scale detection head (torch.onnx opset 17 idioms)")


# ------------------------------------------------------------------ anchor-free YOLO head (float grids)
def _anchor_grid(b: _Builder, ny: str, nx: str) -> str:
    """YOLOv8's ``make_anchors`` for one level as torch exports it: ``arange(n, dtype=float) +
    0.5`` is ``Add(Range(0.0, Cast<float>(n), 1.0), 0.5)``, ``meshgrid`` is ``Expand`` of the
    unsqueezed ranges to ``[ny, nx]``, ``stack(..., -1).view(-1, 2)`` -> ``[ny * nx, 2]``."""
    zero, one = b.constant("zero", np.float32(0.0)), b.constant("one", np.float32(1.0))
    half = b.constant("offset", np.float32(0.5))
    sy, sx = (b.node("Add", [b.node("Range", [zero, b.node("Cast", [d], to=F), one]), half]) for d in (ny, nx))
    yx = b.node("Concat", [b.unsqueeze0(ny), b.unsqueeze0(nx)], axis=0)
    gy = b.node("Expand", [b.node("Unsqueeze", [sy, b.ints(1)]), yx])
    gx = b.node("Expand", [b.node("Unsqueeze", [sx, b.ints(0)]), yx])
    xy = b.node("Concat", [b.node("Unsqueeze", [gx, b.ints(-1)]), b.node("Unsqueeze", [gy, b.ints(-1)])], axis=-1)
    return b.node("Reshape", [xy, b.ints(-1, 2)])


def yolo_anchors(*, classes: int = 3, channels: int = 8, seed: int = 0) -> onnx.ModelProto:
    """``images [batch, 3, height, width] -> y [batch, 4 + classes, anchors]``: an anchor-free
    (YOLOv8-style) head over two levels whose grids and strides are float tensors computed
    from the feature shapes (:func:`_anchor_grid`); the second level is resized to sizes from
    float arithmetic on the image size, ``int(h / 4)`` (``Cast<int64>(Div(Cast<float>(h),
    4.0))``) and ``int(w / 4)``, and the boxes are decoded from distances
    (``dist2bbox``: Sub, Add, Div by 2, Concat, Mul by the strides)."""
    b = _Builder(seed)
    f1 = b.conv("images", 3, channels, 2, stride=2)  # [N, C, floor(H / 2), floor(W / 2)]
    f1 = b.node("Mul", [f1, b.node("Sigmoid", [f1])])
    h_img, w_img = (b.node("Cast", [b.shape_item("images", a)], to=F) for a in (2, 3))
    four = b.constant("four", np.float32(4.0))
    h2, w2 = (b.node("Cast", [b.node("Div", [d, four])], to=I64) for d in (h_img, w_img))  # int(h / 4)
    nc = b.node("Slice", [b.node("Shape", [f1]), b.ints(0), b.ints(2)])
    f2 = b.node("Resize", [f1, "", "", b.node("Concat", [nc, b.unsqueeze0(h2), b.unsqueeze0(w2)], axis=0)],
                mode="nearest")
    no = 4 + classes
    preds, grids, strides = [], [], []
    for feat, stride in ((f1, 2.0), (f2, 4.0)):
        p = b.conv(feat, channels, no, 1)
        n, ny, nx = (b.shape_item(p, a) for a in (0, 2, 3))
        preds.append(b.node("Reshape", [p, b.node("Concat", [b.unsqueeze0(n), b.ints(no), b.ints(-1)], axis=0)]))
        grids.append(_anchor_grid(b, ny, nx))
        cells = b.node("Concat", [b.unsqueeze0(b.node("Mul", [ny, nx])), b.ints(1)], axis=0)
        strides.append(b.node("Expand", [b.constant("stride", np.float32(stride)), cells]))  # torch.full((h * w, 1), s)
    x = b.node("Concat", preds, axis=2)  # [N, 4 + classes, anchors]
    anchors = b.node("Transpose", [b.node("Concat", grids, axis=0)], perm=[1, 0])  # [2, anchors]
    stride_t = b.node("Transpose", [b.node("Concat", strides, axis=0)], perm=[1, 0])  # [1, anchors]
    box, cls = b.node("Split", [x, b.ints(4, classes)], n_out=2, axis=1)
    lt, rb = b.node("Split", [box, b.ints(2, 2)], n_out=2, axis=1)
    x1y1 = b.node("Sub", [b.node("Unsqueeze", [anchors, b.ints(0)]), lt])
    x2y2 = b.node("Add", [b.node("Unsqueeze", [anchors, b.ints(0)]), rb])
    c_xy = b.node("Div", [b.node("Add", [x1y1, x2y2]), b.constant("two", np.float32(2.0))])
    wh = b.node("Sub", [x2y2, x1y1])
    dbox = b.node("Mul", [b.node("Concat", [c_xy, wh], axis=1), stride_t])
    b.nodes.append(helper.make_node("Concat", [dbox, b.node("Sigmoid", [cls])], ["y"], name="y", axis=1))
    return b.model(
        "yolo_anchors", [helper.make_tensor_value_info("images", F, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("y", F, ["batch", 4 + classes, "anchors"])],
        "onnx-quant exported models: anchor-free YOLO head with float anchor grids (torch.onnx opset 17 idioms)")


# ------------------------------------------------------------------ MobileNetV3 (paddle2onnx)
def mobilenet_v3(*, channels: int = 8, classes: int = 5, seed: int = 0) -> onnx.ModelProto:
    """``x [?, 3, ?, ?] -> probs [?, classes]``: stem conv + BN + HardSwish, an inverted residual
    block with a HardSigmoid squeeze-excite, global pool, ``Reshape(x, [0, -1])``, Gemm, Softmax."""
    b = _Builder(seed)
    x = b.node("HardSwish", [b.batch_norm(b.conv("x", 3, channels, 3, stride=2, pad=1, bias=False), channels)])
    wide = 2 * channels
    y = b.node("HardSwish", [b.batch_norm(b.conv(x, channels, wide, 1, bias=False), wide)])
    y = b.node("Relu", [b.batch_norm(b.conv(y, wide, wide, 3, pad=1, group=wide, bias=False), wide)])
    se = b.node("GlobalAveragePool", [y])
    se = b.node("Relu", [b.conv(se, wide, channels, 1)])
    se = b.node("HardSigmoid", [b.conv(se, channels, wide, 1)], alpha=1.0 / 6, beta=0.5)
    y = b.node("Mul", [y, se])
    y = b.batch_norm(b.conv(y, wide, channels, 1, bias=False), channels)
    x = b.node("Add", [x, y])
    x = b.node("GlobalAveragePool", [x])
    x = b.node("Reshape", [x, b.ints(0, -1)])
    fc = b.weight("fc_w", (channels, classes), channels)
    x = b.node("Gemm", [x, fc, b.const("fc_b", np.zeros(classes, np.float32))])
    b.nodes.append(helper.make_node("Softmax", [x], ["probs"], name="softmax", axis=1))
    return b.model("mobilenet_v3", [helper.make_tensor_value_info("x", F, ["?", 3, "?", "?"])],
                   [helper.make_tensor_value_info("probs", F, ["?", classes])],
                   "onnx-quant exported models: MobileNetV3 block (paddle2onnx idioms)")


# ------------------------------------------------------------------ DBNet (paddle2onnx)
def dbnet(*, channels: int = 8, seed: int = 0) -> onnx.ModelProto:
    """``x [?, 3, ?, ?] -> maps [?, 1, ?, ?]`` (height and width multiples of 16): backbone stages
    at 1/2 .. 1/16, FPN laterals added top-down through nearest ``Resize`` x2, the levels brought to
    1/4 (``Resize`` x4, x2) and concatenated, then conv + BN + Relu and two ``ConvTranspose``
    (2x2, stride 2) back to full size, ``Sigmoid``."""
    b = _Builder(seed)
    c = channels

    def stage(x: str, c_in: int, c_out: int) -> str:
        return b.node("Relu", [b.batch_norm(b.conv(x, c_in, c_out, 3, stride=2, pad=1, bias=False), c_out)])

    def up(x: str, scale: int) -> str:
        roi = b.constant("roi", np.zeros(0, np.float32))
        scales = b.constant("scales", np.array([1, 1, scale, scale], np.float32))
        return b.node("Resize", [x, roi, scales], mode="nearest", coordinate_transformation_mode="asymmetric",
                      nearest_mode="floor")

    def deconv(x: str, c_in: int, c_out: int) -> str:
        w = b.weight("deconv_w", (c_in, c_out, 2, 2), c_in * 4)
        return b.node("ConvTranspose", [x, w, b.const("deconv_b", np.zeros(c_out, np.float32))],
                      kernel_shape=[2, 2], strides=[2, 2])

    c1 = stage("x", 3, c)
    c2 = stage(c1, c, 2 * c)
    c3 = stage(c2, 2 * c, 4 * c)
    c4 = stage(c3, 4 * c, 4 * c)
    in2, in3, in4 = b.conv(c2, 2 * c, c, 1), b.conv(c3, 4 * c, c, 1), b.conv(c4, 4 * c, c, 1)
    out3 = b.node("Add", [in3, up(in4, 2)])
    out2 = b.node("Add", [in2, up(out3, 2)])
    p4 = up(b.conv(in4, c, c // 2, 3, pad=1), 4)
    p3 = up(b.conv(out3, c, c // 2, 3, pad=1), 2)
    p2 = b.conv(out2, c, c // 2, 3, pad=1)
    fuse = b.node("Concat", [p4, p3, p2], axis=1)
    h = b.node("Relu", [b.batch_norm(b.conv(fuse, 3 * (c // 2), c, 3, pad=1, bias=False), c)])
    h = b.node("Relu", [b.batch_norm(deconv(h, c, c), c)])
    b.nodes.append(helper.make_node("Sigmoid", [deconv(h, c, 1)], ["maps"], name="sigmoid"))
    return b.model("dbnet", [helper.make_tensor_value_info("x", F, ["?", 3, "?", "?"])],
                   [helper.make_tensor_value_info("maps", F, ["?", 1, "?", "?"])],
                   "onnx-quant exported models: DBNet text detector (paddle2onnx idioms)")


# ------------------------------------------------------------------ transformer (torch)
def _layer_norm(b: _Builder, x: str, d: int) -> str:
    """torch's decomposed layer norm: (x - mean) / sqrt(var + eps) * gamma + beta."""
    mean = b.node("ReduceMean", [x], axes=[-1], keepdims=1)
    centred = b.node("Sub", [x, mean])
    var = b.node("ReduceMean", [b.node("Pow", [centred, b.const("two", np.float32(2))])], axes=[-1], keepdims=1)
    norm = b.node("Div", [centred, b.node("Sqrt", [b.node("Add", [var, b.const("eps", np.float32(1e-5))])])])
    gamma = b.const("ln_gamma", b.rng.uniform(0.8, 1.2, d).astype(np.float32))
    return b.node("Add", [b.node("Mul", [norm, gamma]), b.const("ln_beta", b.rng.uniform(-0.1, 0.1, d).astype(np.float32))])


def _linear(b: _Builder, x: str, d_in: int, d_out: int) -> str:
    y = b.node("MatMul", [x, b.weight("w", (d_in, d_out), d_in)])
    return b.node("Add", [b.const("b", b.rng.uniform(-0.05, 0.05, d_out).astype(np.float32)), y])


def transformer(*, vocab: int = 50, max_len: int = 64, d_model: int = 16, heads: int = 2, ffn: int = 32,
                seed: int = 0) -> onnx.ModelProto:
    """``input_ids [batch, sequence] (int64) -> logits [batch, sequence, vocab]``: one encoder block."""
    dh = d_model // heads
    b = _Builder(seed)
    emb = b.weight("tok_emb", (vocab, d_model), 1)
    pos = b.weight("pos_emb", (max_len, d_model), 1)
    batch, seq = b.shape_item("input_ids", 0), b.shape_item("input_ids", 1)
    pos_ids = b.node("Unsqueeze", [b.node("Range", [b.scalar(0), seq, b.scalar(1)]), b.ints(0)])
    x = b.node("Add", [b.node("Gather", [emb, "input_ids"], axis=0), b.node("Gather", [pos, pos_ids], axis=0)])
    h = _layer_norm(b, x, d_model)
    split = b.node("Concat", [b.unsqueeze0(batch), b.unsqueeze0(seq), b.ints(heads), b.ints(dh)], axis=0)
    q, k, v = (b.node("Transpose", [b.node("Reshape", [_linear(b, h, d_model, d_model), split])], perm=perm)
               for perm in ([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3]))
    scores = b.node("Div", [b.node("MatMul", [q, k]), b.const("sqrt_dh", np.float32(np.sqrt(dh)))])
    ctx = b.node("Transpose", [b.node("MatMul", [b.node("Softmax", [scores], axis=-1), v])], perm=[0, 2, 1, 3])
    merge = b.node("Concat", [b.unsqueeze0(batch), b.unsqueeze0(seq), b.ints(d_model)], axis=0)
    x = b.node("Add", [x, _linear(b, b.node("Reshape", [ctx, merge]), d_model, d_model)])
    h = _linear(b, _layer_norm(b, x, d_model), d_model, ffn)
    gelu = b.node("Mul", [b.node("Mul", [h, b.node("Add", [b.node("Erf", [b.node("Div", [h, b.const("sqrt2", np.float32(np.sqrt(2)))])]),
                                                          b.const("one", np.float32(1))])]),
                          b.const("half", np.float32(0.5))])
    x = b.node("Add", [x, _linear(b, gelu, ffn, d_model)])
    out = b.node("MatMul", [_layer_norm(b, x, d_model), b.weight("lm_head", (d_model, vocab), d_model)])
    b.nodes.append(helper.make_node("Identity", [out], ["logits"], name="logits"))
    return b.model("transformer", [helper.make_tensor_value_info("input_ids", I64, ["batch", "sequence"])],
                   [helper.make_tensor_value_info("logits", F, ["batch", "sequence", vocab])],
                   "onnx-quant exported models: transformer encoder block (torch.onnx opset 17 idioms)")


# ------------------------------------------------------------------ CRNN
def crnn(*, channels: int = 8, hidden: int = 8, classes: int = 11, seed: int = 0) -> onnx.ModelProto:
    """``image [batch, 1, 16, width] -> log_probs [T, batch, classes]`` with ``T = floor(width / 4)``."""
    b = _Builder(seed)
    x = b.node("Relu", [b.conv("image", 1, channels, 3, pad=1)])
    x = b.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])            # [N, C, 8, W/2]
    x = b.node("Relu", [b.conv(x, channels, channels, 3, pad=1)])
    x = b.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])            # [N, C, 4, W/4]
    x = b.node("Relu", [b.conv(x, channels, channels, (4, 1))])                 # [N, C, 1, W/4]
    x = b.node("Transpose", [b.node("Squeeze", [x, b.ints(2)])], perm=[2, 0, 1])  # [T, N, C]
    n = b.shape_item(x, 1)
    state_shape = b.node("Concat", [b.ints(2), b.unsqueeze0(n), b.ints(hidden)], axis=0)
    zeros = helper.make_tensor("zero", F, [1], [0.0])
    h0 = b.node("ConstantOfShape", [state_shape], value=zeros)
    c0 = b.node("ConstantOfShape", [state_shape], value=zeros)
    w = b.weight("lstm_w", (2, 4 * hidden, channels), channels)
    r = b.weight("lstm_r", (2, 4 * hidden, hidden), hidden)
    bias = b.const("lstm_b", np.zeros((2, 8 * hidden), np.float32))
    y, _, _ = b.node("LSTM", [x, w, r, bias, "", h0, c0], n_out=3, hidden_size=hidden, direction="bidirectional")
    y = b.node("Transpose", [y], perm=[0, 2, 1, 3])                             # [T, N, 2, hidden]
    y = b.node("Reshape", [y, b.ints(0, 0, -1)])
    logits = b.node("MatMul", [y, b.weight("fc_w", (2 * hidden, classes), 2 * hidden)])
    b.nodes.append(helper.make_node("LogSoftmax", [logits], ["log_probs"], name="log_probs", axis=2))
    return b.model("crnn", [helper.make_tensor_value_info("image", F, ["batch", 1, 16, "width"])],
                   [helper.make_tensor_value_info("log_probs", F, ["T", "batch", classes])],
                   "onnx-quant exported models: CRNN text recogniser with a bidirectional LSTM")


# ------------------------------------------------------------------ If / Loop state model
def vad_state(*, frame: int = 16, hidden: int = 8, seed: int = 0) -> onnx.ModelProto:
    """``audio [batch, samples], state [2, batch, hidden] -> probs [frames, batch, 1], state_out``.

    An ``If`` on ``state.shape[0] == 2`` (folds when the state's leading dim is known) picks the
    frame size (the else branch's half-size frames would not fit the weights); a ``Loop`` with ``M = frames`` runs a tanh cell per frame, carrying the state."""
    b = _Builder(seed)
    batch = b.shape_item("audio", 0)
    cond = b.node("Equal", [b.shape_item("state", 0), b.scalar(2)])

    def branch(name: str, size: int) -> onnx.GraphProto:
        """Frames of ``size`` samples: ``[frames, batch, size]``."""
        out = f"{name}_frames"
        frames_shape = b.node("Concat", [b.unsqueeze0(batch), b.ints(-1), b.ints(size)], axis=0)
        nodes = [helper.make_node("Reshape", ["audio", frames_shape], [f"{name}_r"], name=f"{name}_reshape"),
                 helper.make_node("Transpose", [f"{name}_r"], [out], name=f"{name}_transpose", perm=[1, 0, 2])]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, F, None)])

    # the else branch (a state of another layout) frames differently: only a folded condition
    # tells which shape the Loop sees
    frames = b.node("If", [cond], then_branch=branch("then", frame), else_branch=branch("else", frame // 2))
    trips = b.node("Gather", [b.node("Shape", [frames]), b.scalar(0)], axis=0)   # frames count
    w_in = b.weight("w_in", (frame, hidden), frame)
    w_state = b.weight("w_state", (hidden, hidden), hidden)
    w_out = b.weight("w_out", (hidden, 1), hidden)
    zero, axis0 = b.scalar(0), b.ints(0)
    body = helper.make_graph(
        [helper.make_node("Gather", [frames, "i"], ["x_t"], name="frame_at", axis=0),
         helper.make_node("Gather", ["h_in", zero], ["h0"], name="layer0", axis=0),
         helper.make_node("MatMul", ["x_t", w_in], ["xw"], name="xw"),
         helper.make_node("MatMul", ["h0", w_state], ["hw"], name="hw"),
         helper.make_node("Add", ["xw", "hw"], ["pre"], name="pre"),
         helper.make_node("Tanh", ["pre"], ["h_new"], name="cell"),
         helper.make_node("Unsqueeze", ["h_new", axis0], ["h_new0"], name="h_new0"),
         helper.make_node("Concat", ["h_new0", "h_new0"], ["h_out"], name="state_next", axis=0),
         helper.make_node("MatMul", ["h_new", w_out], ["logit"], name="logit"),
         helper.make_node("Sigmoid", ["logit"], ["p"], name="prob"),
         helper.make_node("Constant", [], ["cond_out"], name="keep_going",
                          value=helper.make_tensor("keep_going", TensorProto.BOOL, [], [True]))],
        "frame_body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", F, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("h_out", F, None),
         helper.make_tensor_value_info("p", F, None)])
    go = b.constant("go", np.array(True))
    b.nodes.append(helper.make_node("Loop", [trips, go, "state"], ["state_out", "probs"], name="frames_loop", body=body))
    return b.model(
        "vad_state", [helper.make_tensor_value_info("audio", F, ["batch", "samples"]),
                      helper.make_tensor_value_info("state", F, [2, "batch", hidden])],
        [helper.make_tensor_value_info("probs", F, ["frames", "batch", 1]),
         helper.make_tensor_value_info("state_out", F, [2, "batch", hidden])],
        "onnx-quant exported models: LSTM-state voice-activity model with If and Loop")


# ------------------------------------------------------------------ the table
#: name -> (builder, concrete input shapes for calibration and runs)
MODELS: dict[str, tuple[Callable[[], onnx.ModelProto], dict[str, tuple[int, ...]]]] = {
    "yolo_head": (yolo_head, {"images": (1, 3, 24, 40)}),
    "yolo_anchors": (yolo_anchors, {"images": (1, 3, 26, 42)}),
    "mobilenet_v3": (mobilenet_v3, {"x": (2, 3, 12, 20)}),
    "dbnet": (dbnet, {"x": (1, 3, 32, 48)}),
    "transformer": (transformer, {"input_ids": (2, 7)}),
    "crnn": (crnn, {"image": (2, 1, 16, 24)}),
    "vad_state": (vad_state, {"audio": (2, 64), "state": (2, 2, 8)}),
}
#: the float model and the quantized forms of :func:`quantize`
FORMS = ("float",) + model_zoo.FORMATS
#: name -> other input shapes a deployed model meets after the first (:data:`MODELS`): ``batch``
#: changes the batch size alone; ``size`` the image size (a multiple of the model's strides), the
#: sequence length or the audio length, at the first batch size
SHAPE_CHANGES: dict[str, dict[str, dict[str, tuple[int, ...]]]] = {
    "yolo_head": {"batch": {"images": (2, 3, 24, 40)}, "size": {"images": (1, 3, 32, 48)}},
    "yolo_anchors": {"batch": {"images": (2, 3, 26, 42)}, "size": {"images": (1, 3, 34, 50)}},
    "mobilenet_v3": {"batch": {"x": (3, 3, 12, 20)}, "size": {"x": (2, 3, 16, 24)}},
    "dbnet": {"batch": {"x": (2, 3, 32, 48)}, "size": {"x": (1, 3, 48, 64)}},
    "transformer": {"batch": {"input_ids": (3, 7)}, "size": {"input_ids": (2, 11)}},
    "crnn": {"batch": {"image": (3, 1, 16, 24)}, "size": {"image": (2, 1, 16, 32)}},
    "vad_state": {"batch": {"audio": (3, 64), "state": (2, 3, 8)}, "size": {"audio": (2, 96), "state": (2, 2, 8)}},
}


def feeds(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], *, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of the given shapes: normal floats, token ids in ``[0, 10)`` for int64 inputs."""
    rng = np.random.default_rng(seed)
    out = {}
    for v in model.graph.input:
        shape = tuple(shapes[v.name])
        if v.type.tensor_type.elem_type == I64:
            out[v.name] = rng.integers(0, 10, shape).astype(np.int64)
        else:
            out[v.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def fix_inputs(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """A copy whose graph inputs have the given concrete shapes (outputs left untyped), for
    calibration: every dim, named, ``?`` or anonymous, gets its value by position."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for v in out.graph.input:
        if v.name in shapes:
            for d, size in zip(v.type.tensor_type.shape.dim, shapes[v.name]):
                d.dim_value = int(size)
    for v in out.graph.output:
        v.type.tensor_type.ClearField("shape")
    return out


def build(name: str, form: str = "float") -> onnx.ModelProto:
    """Model ``name`` of :data:`MODELS` in ``form`` (one of :data:`FORMS`)."""
    builder, shapes = MODELS[name]
    model = builder()
    if form == "float":
        return model
    return quantize(model, form, shapes)


def quantize(model: onnx.ModelProto, fmt: str, shapes: Mapping[str, Sequence[int]], *, samples: int = 2) -> onnx.ModelProto:
    """``model_zoo.run_quantizer`` with calibration inputs of ``shapes``; the result has the float
    model's graph inputs and outputs (``?`` dims included) and no ``value_info``."""
    calibration = [feeds(model, shapes, seed=i) for i in range(samples)]
    return model_zoo.run_quantizer(model, fix_inputs(model, shapes), calibration, fmt)

"""Recurrent layers: RNN, GRU, LSTM (ai.onnx) and com.microsoft DynamicQuantizeLSTM.

One shape computation serves all four. With ``D`` directions (2 for ``bidirectional``), ``G``
gates (RNN 1, GRU 3, LSTM 4) and hidden size ``H`` (the attribute, else read from R):

==========  ===============================  ===============================
layout      Y                                Y_h, Y_c
0           ``[seq, D, batch, H]``            ``[D, batch, H]``
1 (14+)     ``[batch, seq, D, H]``            ``[batch, D, H]``
==========  ===============================  ===============================

ai.onnx weights are ``W [D, G*H, input]``, ``R [D, G*H, H]``; DynamicQuantizeLSTM (what
``onnxruntime.quantization.quantize_dynamic`` makes of an LSTM; onnxruntime's contrib schema:
``X, W, R, B?, sequence_lens?, initial_h?, initial_c?, P?, W_scale, W_zero_point, R_scale,
R_zero_point``) stores them transposed and quantized: ``W [D, input, 4*H]``, ``R [D, H, 4*H]``
(int8/uint8), scales and zero points ``[D]`` or, per channel, ``[D, 4*H]``.
"""

from __future__ import annotations

from onnx import TensorProto

from ..context import TensorInfo
from ..registry import register
from ._wm_common import need, shape_text, type_text
from .shape_math import provably_different

DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4, "DynamicQuantizeLSTM": 4}
_QUANT_WEIGHTS = (TensorProto.INT8, TensorProto.UINT8)


def _check_dim(n, rule: str, info: TensorInfo, name: str, axis: int, expected, what: str) -> None:
    if info.shape is None or len(info.shape) <= axis or expected is None:
        return
    found = info.shape[axis]
    if provably_different(found, expected):
        n.fail(f"{rule}.shape", f"{name} dim {axis} must be {what}", subject=f"input {name}",
               expected=str(expected), found=f"{found} ({name} shape {shape_text(info.shape)})")


def _weights(n, rule: str, w: TensorInfo, r: TensorInfo, d: int, g: int, quantized: bool):
    """Hidden size and input size from the weights (checking them against D and G)."""
    for name, info in (("W", w), ("R", r)):
        if info.shape is not None and len(info.shape) != 3:
            n.fail(f"{rule}.shape", f"{name} must be 3-D", subject=f"input {name}", expected="rank 3",
                   found=f"rank {len(info.shape)} {shape_text(info.shape)}")
        _check_dim(n, rule, info, name, 0, d, "the number of directions")
    hidden = n.attr("hidden_size")
    gate_axis, other_axis = (2, 1) if quantized else (1, 2)
    if hidden is None and r.shape is not None:
        hidden = r.shape[other_axis]
    if hidden is not None:
        hidden = int(hidden) if isinstance(hidden, int) else hidden
        gh = g * hidden if isinstance(hidden, int) else None
        for name, info in (("W", w), ("R", r)):
            _check_dim(n, rule, info, name, gate_axis, gh, f"{g} * hidden_size")
        _check_dim(n, rule, r, "R", other_axis, hidden, "hidden_size")
    input_size = w.shape[other_axis] if w.shape is not None else None
    return hidden, input_size


def _state_batch(n, layout: int):
    """The batch size an initial state (``initial_h``, ``initial_c``) or ``sequence_lens`` gives."""
    for i, axis in ((5, 0 if layout else 1), (6, 0 if layout else 1), (4, 0)):
        info = n.input(i) if n.has_input(i) else None
        if info is not None and info.shape is not None and len(info.shape) > axis and info.shape[axis] is not None:
            return info.shape[axis]
    return None


def recurrent(ctx, n) -> None:
    rule = n.node.op_type
    quantized = rule == "DynamicQuantizeLSTM"
    x, w, r = need(n, rule, "X", "W", "R")
    direction = n.attr("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    d = DIRECTIONS.get(direction)
    if d is None:
        n.fail(f"{rule}.direction", "unknown direction", subject="attribute direction",
               expected="forward, reverse or bidirectional", found=repr(direction))
    if quantized:
        for name, info in (("W", w), ("R", r)):
            if info.elem_type and info.elem_type not in _QUANT_WEIGHTS:
                n.fail(f"{rule}.weight-type", f"{name} must be quantized", subject=f"input {name}",
                       expected="int8 or uint8", found=type_text(info.elem_type))
    hidden, input_size = _weights(n, rule, w, r, d, GATES[rule], quantized)
    layout = int(n.attr("layout", 0)) if n.version >= 14 and not quantized else 0
    if x.shape is not None and len(x.shape) != 3:
        n.fail(f"{rule}.shape", "X must be 3-D", subject="input X", expected="rank 3 [seq, batch, input]",
               found=f"rank {len(x.shape)} {shape_text(x.shape)}")
    if x.shape is not None:
        seq, batch = (x.shape[1], x.shape[0]) if layout else (x.shape[0], x.shape[1])
        _check_dim(n, rule, x, "X", 2, input_size, "the input size of W")
    else:
        # X of unknown rank (behind an If whose branches differ in rank): the outputs' ranks are
        # the op's; the batch is the initial state's, the sequence length some size of its own
        seq, batch = n.fresh_dim(0, 1 if layout else 0), _state_batch(n, layout)
        if batch is None:
            batch = n.fresh_dim(0, 0 if layout else 2)
    et = x.elem_type
    if layout:
        y, state = (batch, seq, d, hidden), (batch, d, hidden)
    else:
        y, state = (seq, d, batch, hidden), (d, batch, hidden)
    n.set_output(0, TensorInfo(et, y))
    n.set_output(1, TensorInfo(et, state))
    if rule in ("LSTM", "DynamicQuantizeLSTM"):
        n.set_output(2, TensorInfo(et, state))


register("RNN", 1, 7, 14, 22)(recurrent)
register("GRU", 1, 3, 7, 14, 22)(recurrent)
register("LSTM", 1, 7, 14, 22)(recurrent)
register("DynamicQuantizeLSTM", 1, domain="com.microsoft")(recurrent)

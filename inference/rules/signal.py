"""Signal operators: STFT's output shape.

onnx's own STFT inference reads an absent ``onesided`` as 0 where the schema's default is 1 (onnx
1.23: a [.., frame_length, 2] output for what onnx.reference and the specification make
[.., frame_length // 2 + 1, 2]), so this rule types it instead of the fallback."""

from __future__ import annotations

from ..context import TensorInfo
from ..registry import register
from ._wm_common import ints_of, need


@register("STFT", 17)
def stft(ctx, n) -> None:
    signal, step = need(n, "STFT", "signal", "frame_step")
    window, length = n.input(2), n.input(3)
    if signal.shape is None or len(signal.shape) != 3:
        n.set_output(0, TensorInfo(signal.elem_type, None if signal.shape is None else (None,) * 4))
        return
    steps = ints_of(step)
    lengths = ints_of(length) if length is not None else None
    if lengths:
        frame = lengths[0]
    elif window is not None and window.shape is not None and len(window.shape) == 1:
        frame = window.shape[0]
    elif length is None and window is None:
        frame = signal.shape[1]
    else:
        frame = None
    frames = None
    if steps and isinstance(frame, int) and isinstance(signal.shape[1], int) and steps[0] >= 1:
        frames = 1 + (signal.shape[1] - frame) // steps[0]
    bins = None if not isinstance(frame, int) else (frame // 2 + 1 if n.attr("onesided", 1) else frame)
    n.set_output(0, TensorInfo(signal.elem_type, (signal.shape[0], frames, bins, 2)))

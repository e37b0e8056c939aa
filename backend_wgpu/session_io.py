"""A Session's inputs and outputs as onnxruntime shows them (``NodeArg``) and the feeds a run
takes, checked before anything touches the device: names, element types, ranks, fixed dims and
the symbols they bind; a DeviceValue must live on the session's device; a sequence or optional
input takes a list or None (sequences.check_feed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from onnx_quant.dim_text import is_anonymous
from onnx_quant.dtypes import ort_type
from onnx_quant.errors import ExecutionError

from ..inference.dims import to_text as dim_text
from .device_value import DeviceValue, stand_in
from .sequence_steps import check_feed, check_feed_dtype, feed_type
from .sequences import is_tensor_type, type_string


@dataclass(frozen=True)
class NodeArg:
    """What ``get_inputs()``/``get_outputs()`` return, as onnxruntime's NodeArg: ``type`` is
    onnxruntime's string (``"tensor(float)"``, ``"seq(tensor(float))"``), ``shape`` has ints,
    symbols as strings and None for unknown dims (``[]`` for unknown rank, as onnxruntime)."""

    name: str
    type: str
    shape: list[Any]
    elem_type: int = 0   # the TensorProto code behind ``type`` (not in onnxruntime's NodeArg)


def info_shape(info: Any) -> list[Any] | None:
    """An inferred TensorInfo's shape as NodeArg dims (symbolic dims as their dim_param text)."""
    if info is None or info.shape is None:
        return None
    return [d if isinstance(d, int) else (None if d is None else dim_text(d)) for d in info.shape]


def value_info_shape(vi: onnx.ValueInfoProto) -> list[Any] | None:
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    dims: list[Any] = []
    for d in t.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dims


def input_args(inputs: Sequence[onnx.ValueInfoProto]) -> list[NodeArg]:
    return [NodeArg(vi.name, type_string(vi.type), value_info_shape(vi) or [], vi.type.tensor_type.elem_type)
            for vi in inputs]


def output_args(outputs: Sequence[onnx.ValueInfoProto], static_values: Mapping[str, Any]) -> list[NodeArg]:
    """Declared output types and shapes, completed by inference where the model leaves them out
    (as onnxruntime reports what its own inference found)."""
    out = []
    for vi in outputs:
        info = static_values.get(vi.name)
        other = getattr(info, "type_proto", None)
        if not is_tensor_type(vi.type) or other is not None:  # a sequence, optional or map
            out.append(NodeArg(vi.name, type_string(vi.type if not is_tensor_type(vi.type) else other), []))
            continue
        code = vi.type.tensor_type.elem_type or (info.elem_type if info is not None else 0)
        declared, inferred = value_info_shape(vi), info_shape(info)
        if declared is None:
            shape = inferred or []
        elif inferred is not None and len(inferred) == len(declared):
            shape = [d if d is not None else i for d, i in zip(declared, inferred)]
        else:
            shape = declared
        out.append(NodeArg(vi.name, ort_type(code), shape, code))
    return out


def feed_stand_in(device: Any, name: str, value: DeviceValue) -> np.ndarray:
    """A DeviceValue feed's zero-stride stand-in for the checks, refused on another device or
    once released."""
    if value.device is not device:
        raise ExecutionError(f"input {name!r}: the device value lives on {value.device.info.name!r}, this "
                             f"session runs on {device.info.name!r} (a different device object)")
    try:
        return stand_in(value)
    except ExecutionError as e:
        raise ExecutionError(f"input {name!r}: {e}") from None


def check_feeds(device: Any, inputs: Sequence[onnx.ValueInfoProto], initializers: Mapping[str, Any],
                feeds: Mapping[str, Any]) -> dict[str, Any]:
    """The feeds as a run takes them (arrays, DeviceValues, lists, None), every one checked."""
    if not isinstance(feeds, Mapping):
        raise ExecutionError(f"feeds must be a dict of input name -> array, found {type(feeds).__name__}")
    expected = {vi.name: vi for vi in inputs}
    unknown = sorted(set(feeds) - set(expected))
    if unknown:
        inits = [n for n in unknown if n in initializers]
        extra = f"; {inits} are initializers, which this backend does not let feeds override" if inits else ""
        raise ExecutionError(f"feeds {unknown}: not inputs of the model (inputs: {sorted(expected)}){extra}")
    arrays: dict[str, Any] = {}
    symbols: dict[str, tuple[int, str, int]] = {}
    for name, vi in expected.items():
        if name not in feeds:
            raise ExecutionError(f"input {name!r} is missing from the feeds")
        value = feeds[name]
        if not is_tensor_type(vi.type):
            arrays[name] = check_feed(name, vi.type, value, lambda n, v: feed_stand_in(device, n, v))
            continue
        arr = feed_stand_in(device, name, value) if isinstance(value, DeviceValue) else \
            value if isinstance(value, np.ndarray) else np.asarray(value)
        check_feed_dtype(name, feed_type(name, vi.type.tensor_type.elem_type), arr.dtype)
        dims = value_info_shape(vi)
        if dims is not None:
            if arr.ndim != len(dims):
                raise ExecutionError(f"input {name!r}: expected rank {len(dims)} {dims}, found rank {arr.ndim} "
                                     f"{list(arr.shape)}")
            for axis, (d, n) in enumerate(zip(dims, arr.shape)):
                # a declared -1 and an anonymous dim_param ('?', '-1', 'None') are free, each on its own
                if isinstance(d, int) and d >= 0 and d != n:
                    raise ExecutionError(f"input {name!r}: dim {axis} must be {d}, found {n} "
                                         f"(shape {list(arr.shape)})")
                if isinstance(d, str) and not is_anonymous(d):
                    seen = symbols.get(d)
                    if seen is not None and seen[0] != n:
                        where = (f"input {seen[1]!r} dim {seen[2]}" if seen[1] != name else f"dim {seen[2]}")
                        raise ExecutionError(f"input {name!r}: dim {axis} is {d!r} = {n}, but {where} binds "
                                             f"{d!r} = {seen[0]} (shape {list(arr.shape)})")
                    symbols.setdefault(d, (n, name, axis))
        arrays[name] = value if isinstance(value, DeviceValue) else arr
    return arrays

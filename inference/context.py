"""ShapesContext: what the pass knows about every value of a graph."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import onnx

from onnx_quant.dtypes import type_name

from . import dims
from .dims import DimLike


@dataclass(frozen=True)
class TensorInfo:
    """Element type and shape of one value.

    ``elem_type`` is a TensorProto code (0 when unknown). ``shape`` is a tuple of dims
    (int, symbolic ``Dim`` or ``None`` for an unknown dim) or ``None`` for unknown rank.
    ``value`` holds the constant content when the value is an initializer or a small
    constant the pass could fold (used by rules that need data, e.g. scales, Reshape).
    """

    elem_type: int = 0
    shape: tuple[DimLike, ...] | None = None
    value: np.ndarray | None = field(default=None, compare=False, repr=False)

    def __init__(self, elem_type: int = 0, shape: tuple[DimLike, ...] | None = None,
                 value: np.ndarray | None = None) -> None:
        # what the frozen dataclass's own __init__ does, without its three object.__setattr__
        # calls: the pass makes a TensorInfo for nearly every value (half the cost of making one)
        d = self.__dict__
        d["elem_type"] = elem_type
        d["shape"] = shape
        d["value"] = value

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_fully_known(self) -> bool:
        return self.elem_type != 0 and self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @property
    def is_typed(self) -> bool:
        """Element type and rank known (dims may be symbolic or unknown)."""
        return self.elem_type != 0 and self.shape is not None

    def numel(self) -> DimLike:
        if self.shape is None:
            return None
        out: DimLike = 1
        for d in self.shape:
            out = dims.mul(out, d)
        return out

    def shape_text(self) -> str:
        if self.shape is None:
            return "?"
        return "[" + ", ".join(dims.to_text(d) for d in self.shape) + "]"

    @staticmethod
    def from_type_proto(tp: onnx.TypeProto) -> "TensorInfo":
        if not tp.HasField("tensor_type"):
            return TensorInfo()
        tt = tp.tensor_type
        shape = None
        if tt.HasField("shape"):
            shape = tuple(dims.from_proto(d) for d in tt.shape.dim)
        return TensorInfo(tt.elem_type, shape)

    @staticmethod
    def from_array(array: np.ndarray, elem_type: int) -> "TensorInfo":
        return TensorInfo(elem_type, tuple(int(s) for s in array.shape), array)

    def to_type_proto(self) -> onnx.TypeProto:
        tp = onnx.TypeProto()
        tt = tp.tensor_type
        tt.elem_type = self.elem_type
        if self.shape is not None:
            tt.shape.SetInParent()
            for d in self.shape:
                dims.to_proto(d, tt.shape.dim.add())
        return tp


class SequenceInfo(TensorInfo):
    """A sequence or optional value (maps too): to every rule that reads tensors a value of
    unknown type and rank. ``type_proto`` is its ONNX type (the scope's ``other`` entry, what
    onnx's inference and the write-back read); ``items`` what the pass knows of its contents
    (inference/sequences.py): per element a ``TensorInfo`` in order, for an optional ``()`` when
    it is empty and one item, its value (a ``SequenceInfo`` for an optional sequence), when it
    holds one; None where the pass does not know them."""

    def __init__(self, type_proto: onnx.TypeProto, items: tuple | None = None) -> None:
        super().__init__()
        self.__dict__["type_proto"] = type_proto
        self.__dict__["items"] = items

    @property
    def kind(self) -> str:
        """``"sequence"``, ``"optional"`` or ``"map"``."""
        return {"sequence_type": "sequence", "optional_type": "optional"}.get(
            self.type_proto.WhichOneof("value") or "", "map")

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, SequenceInfo) and self.type_proto == other.type_proto
                                 and self.items == other.items)

    __hash__ = TensorInfo.__hash__

    def __repr__(self) -> str:
        items = "?" if self.items is None else f"{len(self.items)} known"
        return f"SequenceInfo({self.kind}, items={items})"


class ShapesContext:
    """Value name -> TensorInfo, plus the opset imports the rules are selected by.

    Rules read their inputs with ``ctx[name]`` (``KeyError`` never escapes: a missing name
    reads as unknown) and write outputs with ``ctx.set(name, info)``. ``strict`` tells rules
    whether a violation raises or is recorded as a diagnostic. ``runtime``: the pass types what a
    runtime computes where onnx's inference and the runtimes disagree (a ceil-mode pool's last
    window starting in the end padding: onnx's inference keeps it before opset 22, onnx.reference
    and onnxruntime drop it at every opset), instead of what onnx's inference answers.
    """

    def __init__(self, opsets: dict[str, int], *, strict: bool = False, runtime: bool = False) -> None:
        self.opsets = dict(opsets)
        self.strict = strict
        self.runtime = runtime
        self._values: dict[str, TensorInfo] = {}
        self.diagnostics: list = []

    def opset(self, domain: str) -> int | None:
        if domain in ("", "ai.onnx"):
            return self.opsets.get("", self.opsets.get("ai.onnx"))
        return self.opsets.get(domain)

    def __contains__(self, name: str) -> bool:
        return name in self._values

    def __getitem__(self, name: str) -> TensorInfo:
        return self._values.get(name, TensorInfo())

    def get(self, name: str) -> TensorInfo | None:
        return self._values.get(name)

    def set(self, name: str, info: TensorInfo) -> None:
        if name:
            self._values[name] = info

    def items(self) -> Iterator[tuple[str, TensorInfo]]:
        return iter(self._values.items())

    def names(self) -> list[str]:
        return list(self._values)


def merge_info(declared: TensorInfo, inferred: TensorInfo, *,
               prefer_declared_symbols: bool = False) -> tuple[TensorInfo, str | None]:
    """Combine a declared and an inferred type; the second item names a contradiction.

    Known ints win over symbols and unknowns; between two symbols the declared one is kept
    when ``prefer_declared_symbols`` (a graph output's names are the model's contract).
    """
    d_et, i_et = declared.elem_type, inferred.elem_type
    if d_et and i_et and d_et != i_et:
        return inferred, "element type"
    elem_type = i_et or d_et
    d_shape, i_shape = declared.shape, inferred.shape
    if d_shape is not None and d_shape == i_shape:  # the common case (value_info onnx wrote): what the loop gives
        return TensorInfo(elem_type, d_shape if prefer_declared_symbols else i_shape, inferred.value), None
    if declared.shape is None or inferred.shape is None:
        shape = inferred.shape if inferred.shape is not None else declared.shape
        return TensorInfo(elem_type, shape, inferred.value), None
    if len(declared.shape) != len(inferred.shape):
        return inferred, "rank"
    shape: list[DimLike] = []
    for i, (d, f) in enumerate(zip(declared.shape, inferred.shape)):
        if isinstance(d, int) and isinstance(f, int):
            if d != f:
                return inferred, f"dim {i}"
            shape.append(d)
        elif isinstance(d, int) or isinstance(f, int):
            shape.append(d if isinstance(d, int) else f)
        elif d is not None and (f is None or prefer_declared_symbols):
            shape.append(d)
        else:
            shape.append(f)
    return TensorInfo(elem_type, tuple(shape), inferred.value), None


def info_text(info: TensorInfo) -> str:
    """``float[N, 3]``: element type and shape, as diagnostics write a type."""
    et = type_name(info.elem_type) if info.elem_type else "?"
    return f"{et}{info.shape_text()}"

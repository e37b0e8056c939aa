"""What a graph holds before its first node: initializers, inputs, declared types.

For the main graph also what a caller tells the pass about its inputs: their shapes
(``infer(..., input_shapes=...)``) and contents (``input_values``); the dims the model leaves
anonymous get names of their own (``<input>_dim<axis>``)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import onnx

from onnx_quant.errors import InferenceError
from onnx_quant.model_io import check_external_location

from . import dims
from .api import SOURCE_INITIALIZER, SOURCE_INPUT
from .context import TensorInfo
from .diagnostics import MODEL_NODE
from .dims import DimLike
from .memo import Keys
from .scope import Bookkeeping, Graph, LazyConstant
from .sequences import input_items


def seed_main(g: Graph, keys: Keys, label: str, input_shapes: Mapping[str, Iterable[Any]] | None) -> None:
    """The main graph's initializers (stored unread, see ``Scope.add_initializers``), sparse
    initializers, inputs (``input_shapes`` overriding theirs) and declared types. ``label``
    names the model when external data points outside its folder."""
    graph = g.proto
    scope = g.scope
    define = scope.define
    typed_by = g.typed_by
    input_names = {v.name for v in graph.input}
    names = dict.fromkeys(scope.add_initializers(graph.initializer, keys.key_ids, label), SOURCE_INITIALIZER)
    typed_by.update(names)
    for name in input_names.intersection(names):  # only a default the caller may override: not a constant
        info = scope[name]
        define(name, TensorInfo(info.elem_type, info.shape))
    g.initializer_names = names
    kids = scope.kids
    for name in input_names:
        kids.pop(name, None)
    for st in graph.sparse_initializer:
        for t in (st.values, st.indices):
            if t.data_location == onnx.TensorProto.EXTERNAL:
                check_external_location(t, label)
        name = st.values.name
        define(name, TensorInfo(int(st.values.data_type), tuple(int(d) for d in st.dims)))
        typed_by[name] = SOURCE_INITIALIZER
    for v in graph.input:
        if v.type.WhichOneof("value") not in (None, "tensor_type"):
            scope.define_other(v.name, v.type)
            typed_by[v.name] = SOURCE_INPUT
            continue
        declared = keys.from_type_proto(v.type)
        if scope.local(v.name) is not None and typed_by.get(v.name) == SOURCE_INITIALIZER:
            if not declared.is_typed:
                continue  # keep what the initializer says
        elif declared.shape is not None and None in declared.shape:
            declared = TensorInfo(declared.elem_type, named_dims(v.name, declared.shape))
        define(v.name, declared)
        typed_by[v.name] = SOURCE_INPUT
    if input_shapes:
        override_inputs(g, input_shapes, input_names)
    seed_declared(g, keys)


def seed_declared(g: Graph, keys: Keys) -> None:
    """The types ``value_info`` and the graph outputs declare (merged as each is produced)."""
    g.declared.update(keys.declared_types(g.proto))


def seed_body(g: Graph, inputs: list, keys: Keys, owner: Bookkeeping, label: str) -> None:
    """Initializers, inputs (``inputs[i]``, already merged with the declaration; a
    ``TypeProto`` for a sequence, optional or map value; ``None`` keeps the declared type) and
    declared types of a subgraph body."""
    graph = g.proto
    scope = g.scope
    for t in graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            check_external_location(t, label)
        scope.define(t.name, LazyConstant(t, owner))
        g.typed_by[t.name] = SOURCE_INITIALIZER
    for st in graph.sparse_initializer:
        scope.define(st.values.name, TensorInfo(int(st.values.data_type), tuple(int(d) for d in st.dims)))
    for i, v in enumerate(graph.input):
        info = inputs[i] if i < len(inputs) else None
        if isinstance(info, onnx.TypeProto):  # a sequence, optional or map value
            scope.define_other(v.name, info)
        elif info is None and v.type.WhichOneof("value") not in (None, "tensor_type"):
            scope.define_other(v.name, v.type)
        else:
            scope.define(v.name, keys.from_type_proto(v.type) if info is None else info)
        g.typed_by[v.name] = SOURCE_INPUT
    seed_declared(g, keys)


def named_dims(input_name: str, shape: tuple) -> tuple:
    """A graph input's shape with each anonymous dim (no value, ``?``, ``-1``) a fresh symbol
    ``<input>_dim<axis>``: distinct dims stay distinct, and the name says where each comes from."""
    return tuple(dims.named_symbol(input_name, f"dim{axis}") if d is None else d for axis, d in enumerate(shape))


def seed_input_values(g: Graph, input_values: Mapping[str, np.ndarray]) -> None:
    """Graph inputs with known contents; each value's shape must be its input's."""
    scope = g.scope
    for name, arr in input_values.items():
        info = scope.get(name)
        if info is None or g.typed_by.get(name) != SOURCE_INPUT:
            raise InferenceError("input-values", MODEL_NODE, f"{name!r} is not a graph input",
                                 expected="a graph input", found=repr(name))
        a = np.asarray(arr)
        if info.shape is not None and tuple(info.shape) != tuple(a.shape):
            raise InferenceError("input-values", MODEL_NODE, f"input {name!r}: the value's shape differs",
                                 expected=info.shape_text(), found=str(list(a.shape)))
        scope.define(name, TensorInfo(info.elem_type, tuple(int(d) for d in a.shape), a))


def override_inputs(g: Graph, input_shapes: Mapping[str, Iterable[Any]], input_names: set[str]) -> None:
    """Graph inputs with the caller's shapes (dims as ints, symbol names or None); a symbol
    bound to an int is substituted in the other graph inputs too."""
    scope = g.scope
    bindings: dict[str, int] = {}
    for name, shape in input_shapes.items():
        if name not in input_names:
            raise InferenceError("input-shapes", MODEL_NODE, f"{name!r} is not a graph input",
                                 expected=f"one of {sorted(input_names)}", found=repr(name))
        if name in scope.other:  # a sequence or optional input: its elements' shapes (sequences.Elements)
            try:
                info = input_items(scope.other[name], shape, name)
            except ValueError as e:
                raise InferenceError("input-shapes", MODEL_NODE, str(e), found=repr(shape)) from None
            scope.define_other(name, info.type_proto, info.items)
            continue
        new = tuple(_dim_arg(d, name) for d in shape)
        declared = scope[name]
        if declared.shape is not None:
            if len(declared.shape) != len(new):
                raise InferenceError("input-shapes", MODEL_NODE, f"input {name!r}: rank differs from the model's",
                                     expected=declared.shape_text(), found=_shape_text(new))
            for old, given in zip(declared.shape, new):
                if isinstance(old, int) and isinstance(given, int) and old != given:
                    raise InferenceError("input-shapes", MODEL_NODE, f"input {name!r}: a fixed dim differs",
                                         expected=declared.shape_text(), found=_shape_text(new))
                if isinstance(old, dims.Dim) and isinstance(given, int) and len(old.symbols) == 1 \
                        and old == dims.Dim.symbol(next(iter(old.symbols))):
                    sym = next(iter(old.symbols))
                    if bindings.setdefault(sym, given) != given:
                        raise InferenceError("input-shapes", MODEL_NODE, f"symbol {sym!r} bound twice",
                                             expected=str(bindings[sym]), found=str(given))
        scope.define(name, TensorInfo(declared.elem_type, new))
        g.typed_by[name] = SOURCE_INPUT
    if not bindings:
        return
    for name in input_names - set(input_shapes):
        info = scope.get(name)
        if info is None or info.shape is None or g.typed_by.get(name) != SOURCE_INPUT:
            continue
        bound = tuple(_bind(d, bindings) for d in info.shape)
        scope.define(name, TensorInfo(info.elem_type, bound, info.value))


def _shape_text(shape: tuple) -> str:
    return "[" + ", ".join(dims.to_text(d) for d in shape) + "]"


def _dim_arg(d: Any, input_name: str) -> DimLike:
    if d is None or isinstance(d, dims.Dim):
        return d
    if isinstance(d, (int, np.integer)) and not isinstance(d, bool):
        if d < 0:
            raise InferenceError("input-shapes", MODEL_NODE, f"input {input_name!r}: negative dim", found=str(d))
        return int(d)
    if isinstance(d, str):
        return dims.parse(d)
    raise InferenceError("input-shapes", MODEL_NODE, f"input {input_name!r}: a dim must be an int, a symbol name or None",
                         found=repr(d))


def _bind(d: DimLike, bindings: dict[str, int]) -> DimLike:
    if isinstance(d, dims.Dim) and d.symbols <= bindings.keys():
        return dims.evaluate(d, bindings)
    return d

"""Input shapes and feeds given on the command line; ``run``, ``profile`` and ``explain`` share them.

Each graph input's shape is bound, in this order, by:

1. the array of ``--input NAME=FILE.npy`` (run, profile);
2. ``--shape NAME=D0,D1,...`` (every dim of that input);
3. ``--dim SYMBOL=V``: a symbolic dim (``dim_param``) takes V wherever it appears; a symbol an
   input's array or ``--shape`` binds takes that value in every other input too;
4. the defaults, for every dim no option binds: :data:`DEFAULT_BATCH` (1) where a symbol first
   appears on an input's first axis (the batch), :data:`DEFAULT_DIM` (32) elsewhere: small enough
   for a CPU adapter (lavapipe), a multiple of the strides detectors need (8, 16, 32).

``--random`` draws the inputs no file gives: integers uniformly from ``[LO, HI)``
(:data:`DEFAULT_INT_RANGE`, ``--int-range LO,HI`` changes it) within the dtype's range, so an
index or a byte input gets valid values; floats from a normal distribution of standard deviation
:data:`FLOAT_STD`; bools 0 or 1. The seed is fixed: the same arguments give the same feeds.

Everything here reads the ModelProto's graph inputs only (no Session, no wgpu): a feed, a shape or
a dim that does not fit the model is an :class:`~onnx_quant.errors.ArgumentError` (the CLI exits 2)
before any session is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from onnx_quant.dim_text import is_anonymous
from onnx_quant.errors import ArgumentError, ExecutionError, QuantError

#: the value of a symbolic dim first seen on an input's first axis that no option binds
DEFAULT_BATCH = 1
#: the value of every other dim no option binds
DEFAULT_DIM = 32
#: ``--random`` integers: ``[LO, HI)``, clipped to the dtype's range
DEFAULT_INT_RANGE = (0, 16)
#: ``--random`` floats: normal, mean 0, this standard deviation
FLOAT_STD = 4.0
#: the seed of ``--random``
SEED = 0

#: how the defaults read in the ``dims:`` line
DEFAULTS_SHORT = f"{DEFAULT_BATCH} on an input's first axis, {DEFAULT_DIM} elsewhere"
#: how the defaults read in ``--help``
DEFAULTS_TEXT = (f"dims no option binds are {DEFAULT_BATCH} where a symbol first appears on an input's "
                 f"first axis, {DEFAULT_DIM} elsewhere")


# --------------------------------------------------------------------------- the model's inputs


@dataclass(frozen=True)
class GraphInput:
    """A graph input as declared: ``dims`` holds ints (fixed), strings (symbols) and None (a dim
    with no name: no ``dim_value``/``dim_param``, an anonymous text such as ``?``, or -1); None
    for an input of unknown rank."""

    name: str
    elem_type: int
    dims: tuple[Any, ...] | None

    def describe(self) -> str:
        """``float32 ['N', 3, 'H', 'W']``: the dtype and declared dims, as messages show them."""
        from onnx_quant.dtypes import type_name  # noqa: PLC0415

        return f"{type_name(self.elem_type)} {list(self.dims) if self.dims is not None else 'of unknown rank'}"


def _declared_dim(d: Any) -> Any:
    """One ``TensorShapeProto.Dimension`` as a GraphInput dim."""
    if d.HasField("dim_value"):
        return None if d.dim_value == -1 else int(d.dim_value)
    if d.HasField("dim_param") and not is_anonymous(d.dim_param):
        return d.dim_param
    return None


def graph_inputs(model: Any) -> list[GraphInput]:
    """The inputs a run must feed (graph inputs that are not initializers), in graph order."""
    graph = model.graph
    inits = {t.name for t in graph.initializer} | {t.name for t in graph.sparse_initializer}
    out = []
    for vi in graph.input:
        if vi.name in inits:
            continue
        t = vi.type.tensor_type
        dims = tuple(_declared_dim(d) for d in t.shape.dim) if t.HasField("shape") else None
        out.append(GraphInput(vi.name, t.elem_type, dims))
    return out


def _input_names(inputs: Sequence[GraphInput]) -> str:
    return ", ".join(i.name for i in inputs) or "none"


def _find(inputs: Sequence[GraphInput], name: str, option: str) -> GraphInput:
    for i in inputs:
        if i.name == name:
            return i
    raise ArgumentError(f"{option}: the model has no input {name!r} (inputs: {_input_names(inputs)})")


# --------------------------------------------------------------------------- parsing options


def parse_shapes(items: Iterable[str] | None) -> dict[str, tuple[int, ...]]:
    """``--shape NAME=D0,D1,...`` items -> {name: dims}; ``NAME=`` is a scalar (rank 0)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items or ():
        name, sep, text = item.rpartition("=")
        if not sep or not name:
            raise ArgumentError(f"--shape {item!r}: expected NAME=D0,D1,... (e.g. images=1,3,640,640)")
        dims = [d.strip() for d in text.split(",")] if text.strip() else []
        if not all(d.isdigit() for d in dims):
            raise ArgumentError(f"--shape {item!r}: each dim must be an integer >= 0")
        if name in shapes and shapes[name] != tuple(int(d) for d in dims):
            raise ArgumentError(f"--shape {name}: given twice, as {list(shapes[name])} and {[int(d) for d in dims]}")
        shapes[name] = tuple(int(d) for d in dims)
    return shapes


def parse_dims(items: Iterable[str] | None) -> dict[str, int]:
    """``--dim SYMBOL=V`` items -> {symbol: value}."""
    dims: dict[str, int] = {}
    for item in items or ():
        name, sep, text = item.rpartition("=")
        if not sep or not name.strip() or not text.strip().isdigit():
            raise ArgumentError(f"--dim {item!r}: expected SYMBOL=V with V an integer >= 0 (e.g. N=1)")
        value = int(text)
        if dims.get(name, value) != value:
            raise ArgumentError(f"--dim {name}: given twice, as {dims[name]} and {value}")
        dims[name] = value
    return dims


def parse_int_range(text: str | None) -> tuple[int, int]:
    """``--int-range LO,HI`` -> (LO, HI), the half-open range ``[LO, HI)``; None: the default."""
    if text is None:
        return DEFAULT_INT_RANGE
    parts = [p.strip() for p in str(text).split(",")]
    try:
        lo, hi = (int(p) for p in parts)
    except ValueError:
        raise ArgumentError(f"--int-range {text!r}: expected LO,HI (integers, HI excluded; e.g. 0,256)") from None
    if lo >= hi:
        raise ArgumentError(f"--int-range {text!r}: expected LO < HI (the range is [LO, HI))")
    return lo, hi


def parse_input_items(items: Iterable[str] | None) -> dict[str, str]:
    """``--input NAME=FILE.npy`` items -> {name: path} (the name is what precedes the first ``=``)."""
    paths: dict[str, str] = {}
    for item in items or ():
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ArgumentError(f"--input {item!r}: expected NAME=FILE.npy")
        if name in paths and paths[name] != path:
            raise ArgumentError(f"--input {name}: given twice ({paths[name]} and {path})")
        paths[name] = path
    return paths


# --------------------------------------------------------------------------- binding shapes


@dataclass
class Binding:
    """Every graph input's concrete shape and where each free dim's value came from."""

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: symbol or ``input[axis]`` (a dim with no name) -> value, in the order they first appear
    values: dict[str, int] = field(default_factory=dict)
    #: of ``values``: those no option bound (the defaults)
    defaulted: list[str] = field(default_factory=list)

    def dims_text(self) -> str | None:
        """``dims: N=1, H=640, W=640 (defaults: N; ...)``; None when every dim is fixed."""
        if not self.values:
            return None
        text = "dims: " + ", ".join(f"{k}={v}" for k, v in self.values.items())
        if len(self.defaulted) == len(self.values):
            return text + f" (all defaults: {DEFAULTS_SHORT}; set them with --dim SYMBOL=V or --shape)"
        if self.defaulted:
            return text + f" (defaults: {', '.join(self.defaulted)}; set them with --dim SYMBOL=V or --shape)"
        return text

    def shape_template(self, name: str, dims: Sequence[Any]) -> str:
        """``--shape images=N,3,H,W``: the input's dims with every defaulted one as its name."""
        parts = []
        for axis, (d, n) in enumerate(zip(dims, self.shapes[name])):
            key = d if isinstance(d, str) else f"{name}[{axis}]"
            parts.append((d if isinstance(d, str) else "?") if key in self.defaulted else str(n))
        return f"--shape {name}={','.join(parts)}"


class _Binder:
    """The running state of :func:`bind_shapes`: symbol values and who bound them."""

    def __init__(self, dims: Mapping[str, int]) -> None:
        self.symbols: dict[str, int] = dict(dims)
        self.source: dict[str, str] = {k: f"--dim {k}={v}" for k, v in dims.items()}

    def bind(self, gi: GraphInput, shape: tuple[int, ...], source: str) -> None:
        """Check a given shape against the declared dims and bind its symbols."""
        if gi.dims is None:
            return
        if len(shape) != len(gi.dims):
            raise ArgumentError(f"{source}: input {gi.name!r}: expected rank {len(gi.dims)} {list(gi.dims)}, "
                                f"found rank {len(shape)} {list(shape)}")
        for axis, (d, n) in enumerate(zip(gi.dims, shape)):
            if isinstance(d, int) and d >= 0 and d != n:
                raise ArgumentError(f"{source}: input {gi.name!r}: dim {axis} must be {d}, found {n} "
                                    f"(shape {list(shape)})")
            if isinstance(d, str):
                seen = self.symbols.get(d)
                if seen is not None and seen != n:
                    raise ArgumentError(f"{source}: input {gi.name!r}: dim {axis} is {d!r} = {n}, but "
                                        f"{self.source[d]} binds {d!r} = {seen} (shape {list(shape)})")
                self.symbols[d] = n
                self.source.setdefault(d, f"{source} (input {gi.name!r} dim {axis})")


def _first_axes(inputs: Sequence[GraphInput]) -> dict[str, int]:
    """Symbol -> the axis where it first appears (inputs in graph order): what its default is."""
    first: dict[str, int] = {}
    for gi in inputs:
        for axis, d in enumerate(gi.dims or ()):
            if isinstance(d, str):
                first.setdefault(d, axis)
    return first


def _default(axis: int) -> int:
    return DEFAULT_BATCH if axis == 0 else DEFAULT_DIM


def bind_shapes(inputs: Sequence[GraphInput], given: Mapping[str, tuple[tuple[int, ...], str]] | None = None,
                dims: Mapping[str, int] | None = None) -> Binding:
    """Every input's shape: ``given`` {name: (shape, the option that gave it)} first, then
    ``dims`` (``--dim``) and the symbols the given shapes bind, then the defaults (module doc)."""
    given = dict(given or {})
    dims = dict(dims or {})
    first = _first_axes(inputs)
    unknown = sorted(set(dims) - set(first))
    if unknown:
        known = ", ".join(first) or "none"
        raise ArgumentError(f"--dim {unknown[0]}={dims[unknown[0]]}: no input of the model has a symbolic dim "
                            f"{unknown[0]!r} (symbolic dims: {known})")
    binder = _Binder(dims)
    for name, (shape, source) in given.items():
        binder.bind(_find(inputs, name, source), tuple(shape), source)
    out = Binding()
    for gi in inputs:
        if gi.name in given:
            out.shapes[gi.name] = tuple(given[gi.name][0])
        elif gi.dims is None:
            raise ArgumentError(f"input {gi.name!r} has no declared shape: give it with --shape {gi.name}=D0,D1,...")
        else:
            out.shapes[gi.name] = tuple(_bound_dim(gi, axis, d, binder, first) for axis, d in enumerate(gi.dims))
        _note_values(out, gi, binder, given)
    return out


def _bound_dim(gi: GraphInput, axis: int, d: Any, binder: _Binder, first: Mapping[str, int]) -> int:
    """One dim of an input no option gives whole: fixed, bound, or its default."""
    if isinstance(d, int):
        return d
    if isinstance(d, str):
        return binder.symbols.get(d, _default(first[d]))
    return _default(axis)


def _note_values(out: Binding, gi: GraphInput, binder: _Binder, given: Mapping[str, Any]) -> None:
    """Record the free dims of one input (symbols once, dims with no name per input and axis)."""
    for axis, (d, n) in enumerate(zip(gi.dims or (), out.shapes[gi.name])):
        if isinstance(d, int):
            continue
        key = d if isinstance(d, str) else f"{gi.name}[{axis}]"
        if key in out.values:
            continue
        out.values[key] = n
        bound = (d in binder.symbols) if isinstance(d, str) else (gi.name in given)
        if not bound:
            out.defaulted.append(key)


# --------------------------------------------------------------------------- feeds


def read_input_files(inputs: Sequence[GraphInput], items: Iterable[str] | None) -> dict[str, np.ndarray]:
    """The arrays of ``--input NAME=FILE.npy`` items: each name an input of the model, each file a
    readable ``.npy`` of the input's dtype (rank and dims are checked by :func:`bind_shapes`)."""
    arrays: dict[str, np.ndarray] = {}
    for name, path in parse_input_items(items).items():
        gi = _find(inputs, name, f"--input {name}")
        try:
            arr = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise ArgumentError(f"--input {name}: cannot read {path}: {e}") from None
        if not isinstance(arr, np.ndarray):  # an .npz archive
            raise ArgumentError(f"--input {name}: {path} holds several arrays (.npz): give one .npy file")
        want = _dtype_of(gi)
        if arr.dtype != want.dtype:
            raise ArgumentError(f"input {name!r}: expected {want.name}, found {arr.dtype} (--input {name}={path})")
        arrays[name] = arr
    return arrays


def _dtype_of(gi: GraphInput):
    from onnx_quant.dtypes import element_type, type_name  # noqa: PLC0415

    try:
        return element_type(gi.elem_type)
    except QuantError:
        raise ExecutionError(f"input {gi.name!r}: element type {type_name(gi.elem_type)} is not supported") from None


def random_array(name: str, elem_type: int, shape: Sequence[int], rng: np.random.Generator,
                 int_range: tuple[int, int] = DEFAULT_INT_RANGE) -> np.ndarray:
    """One ``--random`` input (module doc); the memory budget is checked before numpy allocates."""
    from onnx_quant.budget import resolve  # noqa: PLC0415

    et = _dtype_of(GraphInput(name, elem_type, None))
    shape = tuple(shape)
    resolve().check_array(shape, max(8, et.bits), f"--random input {name!r}")
    if et.is_float:
        return (rng.standard_normal(shape) * FLOAT_STD).astype(np.float32).astype(et.dtype)
    if et.is_integer:
        lo, hi = _clipped_range(name, et, int_range)
        return rng.integers(lo, hi, size=shape).astype(np.int64).astype(et.dtype)
    return rng.integers(0, 2, size=shape).astype(et.dtype)


def _clipped_range(name: str, et: Any, int_range: tuple[int, int]) -> tuple[int, int]:
    """``int_range`` within the dtype's range (half-open); an empty one is an ArgumentError."""
    tmin, tmax = et.int_range
    lo, hi = max(int_range[0], tmin), min(int_range[1], tmax + 1)
    if lo >= hi:
        raise ArgumentError(f"--int-range {int_range[0]},{int_range[1]}: input {name!r} is {et.name}, which holds "
                            f"{tmin}..{tmax}: no value of the range fits")
    return lo, hi


@dataclass
class Feeds:
    """What :func:`make_feeds` built: the arrays, the shapes' binding, which inputs are random."""

    arrays: dict[str, np.ndarray]
    binding: Binding
    random: list[str] = field(default_factory=list)


def make_feeds(model: Any, *, inputs: Iterable[str] | None = (), shapes: Iterable[str] | None = (),
               dims: Iterable[str] | None = (), random: bool = False, int_range: str | None = None,
               seed: int = SEED) -> Feeds:
    """Feeds from the options of ``run``/``profile``: ``--input`` files, the rest random with
    ``random`` at the shapes ``--shape``/``--dim``/the defaults bind; every check (names, dtype,
    rank, fixed dims, symbols consistent across inputs) is made here, before any session."""
    declared = graph_inputs(model)
    shape_items, dim_items, lo_hi = parse_shapes(shapes), parse_dims(dims), parse_int_range(int_range)
    arrays = read_input_files(declared, inputs)
    missing = [gi for gi in declared if gi.name not in arrays]
    if missing and not random:
        gi = missing[0]
        raise ArgumentError(f"input {gi.name!r} ({gi.describe()}) is missing: give --input {gi.name}=FILE.npy "
                            f"or --random")
    given = {n: (tuple(a.shape), f"--input {n}") for n, a in arrays.items()}
    for name, shape in shape_items.items():
        if name in given and given[name][0] != shape:
            raise ArgumentError(f"--shape {name}={','.join(map(str, shape))}: the file of --input {name} holds "
                                f"shape {list(given[name][0])}")
        given.setdefault(name, (shape, f"--shape {name}"))
    binding = bind_shapes(declared, given, dim_items)
    rng = np.random.default_rng(seed)
    for gi in missing:
        arrays[gi.name] = random_array(gi.name, gi.elem_type, binding.shapes[gi.name], rng, lo_hi)
    ordered = {gi.name: arrays[gi.name] for gi in declared}
    return Feeds(ordered, binding, [gi.name for gi in missing])


def bind_model_shapes(model: Any, *, shapes: Iterable[str] | None = (), dims: Iterable[str] | None = ()) -> Binding:
    """The input shapes ``explain`` plans at: ``--shape``, ``--dim``, then the defaults."""
    declared = graph_inputs(model)
    given = {n: (s, f"--shape {n}") for n, s in parse_shapes(shapes).items()}
    return bind_shapes(declared, given, parse_dims(dims))

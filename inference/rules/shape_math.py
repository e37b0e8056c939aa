"""Shape computations shared by rule families (convolution, pooling, matmul).

Everything here works on ``DimLike`` (int, symbolic ``Dim`` or ``None``): a symbolic input
dim gives a symbolic output dim (``floor((H + 2 - 3) / 2) + 1`` in the canonical form of
:mod:`inference.dims`), an unknown one gives ``None``.

Problems are returned (``*_problems``) or raised (``*_output_shape``) as
:class:`ShapeProblem`: a plain record with a rule id, the attribute or input at fault and
expected/found. It is *not* an error the project raises to users: rules turn it into an
``InferenceError`` with ``NodeContext.report``/``fail`` so that the node is named. A problem
is only reported when it is certain: two known dims that differ, or symbolic dims whose
difference folds to a non-zero constant.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from .. import dims
from ..dims import DimLike

Shape = tuple  # tuple[DimLike, ...]

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(eq=False)
class ShapeProblem(Exception):
    """A certain violation found by a shape computation (converted to InferenceError by rules)."""

    rule: str
    subject: str
    message: str
    expected: object = None
    found: object = None

    def __str__(self) -> str:  # pragma: no cover - debugging aid
        return f"{self.rule}: {self.subject}: {self.message}: expected {self.expected}, found {self.found}"


# ---------------------------------------------------------------- dim comparisons
def provably_different(a: DimLike, b: DimLike) -> bool:
    """True when ``a != b`` holds for every binding of the symbols (unknowns never differ)."""
    if a is None or b is None:
        return False
    diff = dims.sub(a, b)
    return isinstance(diff, int) and diff != 0


def provably_equal(a: DimLike, b: DimLike) -> bool:
    if a is None or b is None:
        return False
    return dims.sub(a, b) == 0


def shape_text(shape: Sequence[DimLike] | None) -> str:
    if shape is None:
        return "?"
    return "[" + ", ".join(dims.to_text(d) for d in shape) + "]"


def _ints(v) -> list[int] | None:
    return None if v is None else [int(x) for x in v]


def _text(v) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


# ---------------------------------------------------------------- convolution
@lru_cache(maxsize=4096)  # a pure function of hashable dims; symbolic arithmetic is the cost of a conv
def conv_spatial_dim(in_dim: DimLike, kernel: DimLike, *, auto_pad: str = "NOTSET", pad_begin: int = 0,
                     pad_end: int = 0, stride: int = 1, dilation: int = 1) -> DimLike:
    """Output size of one spatial axis of a convolution (or floor-mode pooling).

    SAME_UPPER / SAME_LOWER: ``ceil(in / stride)``; VALID: ``floor((in - ((k-1)*d+1)) / s) + 1``;
    NOTSET: ``floor((in + pad_begin + pad_end - ((k-1)*d+1)) / s) + 1``.
    """
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return dims.ceildiv(in_dim, stride)
    effective_kernel = dims.add(dims.mul(dims.sub(kernel, 1), dilation), 1)
    padded = in_dim if auto_pad == "VALID" else dims.add(in_dim, pad_begin + pad_end)
    return dims.add(dims.floordiv(dims.sub(padded, effective_kernel), stride), 1)


def _conv_spatial_count(x_shape, w_shape, kernel_shape) -> int | None:
    for s in (x_shape, w_shape):
        if s is not None and len(s) >= 3:
            return len(s) - 2
    if kernel_shape is not None:
        return len(kernel_shape)
    return None


def conv_problems(x_shape: Shape | None, w_shape: Shape | None, *, auto_pad="NOTSET", pads=None, strides=None,
                  dilations=None, group: int = 1, kernel_shape=None) -> list[ShapeProblem]:
    """Every certain problem of a convolution's shapes and attributes (empty when valid)."""
    out: list[ShapeProblem] = []
    auto_pad = _text(auto_pad)
    pads, strides, dilations, kernel_shape = _ints(pads), _ints(strides), _ints(dilations), _ints(kernel_shape)
    if auto_pad not in AUTO_PADS:
        out.append(ShapeProblem("conv.auto-pad", "attribute auto_pad", "not a valid padding mode",
                                "one of " + ", ".join(AUTO_PADS), repr(auto_pad)))
    if x_shape is not None and len(x_shape) < 3:
        out.append(ShapeProblem("conv.rank", "input x", "a convolution input needs rank >= 3 (N, C, spatial...)",
                                ">= 3", f"rank {len(x_shape)} {shape_text(x_shape)}"))
    if w_shape is not None and len(w_shape) < 3:
        out.append(ShapeProblem("conv.rank", "input w", "a convolution weight needs rank >= 3 (M, C/group, kernel...)",
                                ">= 3", f"rank {len(w_shape)} {shape_text(w_shape)}"))
    if x_shape is not None and w_shape is not None and len(x_shape) != len(w_shape) and min(len(x_shape), len(w_shape)) >= 3:
        out.append(ShapeProblem("conv.rank", "input w", "the weight must have the rank of the input",
                                f"rank {len(x_shape)}", f"rank {len(w_shape)} {shape_text(w_shape)}"))
    if not isinstance(group, int) or group < 1:
        out.append(ShapeProblem("conv.group", "attribute group", "group must be a positive integer", ">= 1", group))
        group_ok = False
    else:
        group_ok = True
    n = _conv_spatial_count(x_shape, w_shape, kernel_shape)
    if group_ok and x_shape is not None and w_shape is not None and len(x_shape) >= 3 and len(w_shape) >= 3:
        c, wc = x_shape[1], w_shape[1]
        expected = dims.mul(wc, group)
        if provably_different(c, expected):
            out.append(ShapeProblem(
                "conv.channels", "input x",
                f"input channels must equal w.shape[1] * group = {dims.to_text(wc)} * {group}",
                dims.to_text(expected), f"{dims.to_text(c)} (x shape {shape_text(x_shape)})"))
    if group_ok and w_shape is not None and len(w_shape) >= 1:
        m = w_shape[0]
        if isinstance(m, int) and m % group != 0:
            out.append(ShapeProblem("conv.group", "input w",
                                    f"output channels M = w.shape[0] must be a multiple of group {group}",
                                    f"a multiple of {group}", m))
    if n is not None:
        if kernel_shape is not None:
            if len(kernel_shape) != n:
                out.append(ShapeProblem("conv.kernel-shape", "attribute kernel_shape",
                                        "one entry per spatial axis", f"{n} entries", f"{len(kernel_shape)} {kernel_shape}"))
            elif any(k < 1 for k in kernel_shape):
                out.append(ShapeProblem("conv.kernel-shape", "attribute kernel_shape", "entries must be positive",
                                        ">= 1 each", kernel_shape))
            elif w_shape is not None and len(w_shape) == n + 2:
                spatial = tuple(w_shape[2:])
                if any(provably_different(k, d) for k, d in zip(kernel_shape, spatial)):
                    out.append(ShapeProblem("conv.kernel-shape", "attribute kernel_shape",
                                            "must equal the spatial dims of w", shape_text(spatial), kernel_shape))
        if pads is not None:
            if len(pads) != 2 * n:
                out.append(ShapeProblem("conv.pads", "attribute pads", "two entries (begin, end) per spatial axis",
                                        f"{2 * n} entries", f"{len(pads)} {pads}"))
            elif any(p < 0 for p in pads):
                out.append(ShapeProblem("conv.pads", "attribute pads", "pads must not be negative", ">= 0 each", pads))
            elif auto_pad in ("SAME_UPPER", "SAME_LOWER", "VALID") and any(pads):
                out.append(ShapeProblem("conv.pads", "attribute pads",
                                        f"explicit pads cannot be used together with auto_pad={auto_pad}",
                                        "no pads (or all zero)", pads))
        for name, vals in (("strides", strides), ("dilations", dilations)):
            if vals is None:
                continue
            if len(vals) != n:
                out.append(ShapeProblem(f"conv.{name}", f"attribute {name}", "one entry per spatial axis",
                                        f"{n} entries", f"{len(vals)} {vals}"))
            elif any(v < 1 for v in vals):
                out.append(ShapeProblem(f"conv.{name}", f"attribute {name}", f"{name} must be positive",
                                        ">= 1 each", vals))
    if not out and n is not None and x_shape is not None and len(x_shape) == n + 2 and auto_pad in ("NOTSET", "VALID"):
        kernel = _kernel(w_shape, kernel_shape, n)
        p = pads if (pads is not None and auto_pad == "NOTSET") else [0] * (2 * n)
        d = dilations or [1] * n
        for i in range(n):
            in_dim, k = x_shape[2 + i], kernel[i]
            if not (isinstance(in_dim, int) and isinstance(k, int)):
                continue
            padded = in_dim + p[i] + p[i + n]
            eff = (k - 1) * d[i] + 1
            if 0 < padded < eff:
                out.append(ShapeProblem(
                    "conv.output-size", f"input x (spatial axis {i})",
                    "the (dilated) kernel does not fit in the padded input",
                    f"padded size >= {eff}", f"{padded} (size {in_dim} + pads {p[i]}, {p[i + n]})"))
    return out


def _kernel(w_shape, kernel_shape, n: int) -> list[DimLike]:
    if kernel_shape is not None and len(kernel_shape) == n:
        return list(kernel_shape)
    if w_shape is not None and len(w_shape) == n + 2:
        return list(w_shape[2:])
    return [None] * n


def conv_output_shape(x_shape: Shape | None, w_shape: Shape | None, *, auto_pad="NOTSET", pads=None, strides=None,
                      dilations=None, group: int = 1, kernel_shape=None) -> Shape | None:
    """Output shape ``(N, M, out_1, ..., out_n)`` of a convolution; ``None`` for unknown rank.

    Raises the first :class:`ShapeProblem` of :func:`conv_problems` when there is one.
    """
    problems = conv_problems(x_shape, w_shape, auto_pad=auto_pad, pads=pads, strides=strides,
                             dilations=dilations, group=group, kernel_shape=kernel_shape)
    if problems:
        raise problems[0]
    return checked_conv_output_shape(x_shape, w_shape, auto_pad=auto_pad, pads=pads, strides=strides,
                                     dilations=dilations, kernel_shape=kernel_shape)


def checked_conv_output_shape(x_shape: Shape | None, w_shape: Shape | None, *, auto_pad="NOTSET", pads=None,
                              strides=None, dilations=None, group: int = 1, kernel_shape=None) -> Shape | None:
    """:func:`conv_output_shape` for arguments :func:`conv_problems` has found no problem with
    (a caller that reports every problem itself need not have them found twice)."""
    auto_pad = _text(auto_pad)
    n = _conv_spatial_count(x_shape, w_shape, kernel_shape)
    if n is None:
        return None
    pads = _ints(pads) or [0] * (2 * n)
    strides = _ints(strides) or [1] * n
    dilations = _ints(dilations) or [1] * n
    kernel = _kernel(w_shape, _ints(kernel_shape), n)
    batch = x_shape[0] if x_shape is not None else None
    m = w_shape[0] if w_shape is not None else None
    spatial = []
    for i in range(n):
        in_dim = x_shape[2 + i] if x_shape is not None else None
        spatial.append(conv_spatial_dim(in_dim, kernel[i], auto_pad=auto_pad, pad_begin=pads[i],
                                        pad_end=pads[i + n], stride=strides[i], dilation=dilations[i]))
    return (batch, m, *spatial)


# ---------------------------------------------------------------- matmul
def matmul_problems(a_shape: Shape | None, b_shape: Shape | None) -> list[ShapeProblem]:
    """Certain problems of ``numpy.matmul(a, b)`` shapes (empty when valid or unknowable)."""
    out: list[ShapeProblem] = []
    for name, s in (("A", a_shape), ("B", b_shape)):
        if s is not None and len(s) == 0:
            out.append(ShapeProblem("matmul.rank", f"input {name}", "matmul operands need rank >= 1",
                                    ">= 1", "rank 0 (a scalar)"))
    if out or a_shape is None or b_shape is None:
        return out
    k_a = a_shape[-1]
    k_b = b_shape[-2] if len(b_shape) >= 2 else b_shape[-1]
    if provably_different(k_a, k_b):
        out.append(ShapeProblem("matmul.inner-dim", "input B",
                                "inner dimensions differ (a.shape[-1] must equal b.shape[-2])",
                                dims.to_text(k_a), f"{dims.to_text(k_b)} (A {shape_text(a_shape)}, B {shape_text(b_shape)})"))
    try:
        _broadcast(tuple(a_shape[:-2]), tuple(b_shape[:-2]))
    except ValueError:
        out.append(ShapeProblem("matmul.batch-broadcast", "input B", "batch dimensions do not broadcast",
                                f"broadcastable with {shape_text(a_shape[:-2])}", shape_text(b_shape[:-2])))
    return out


def _broadcast(a: Shape, b: Shape) -> Shape:
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    return tuple(dims.broadcast(x, y) for x, y in zip(a, b))


def matmul_output_shape(a_shape: Shape | None, b_shape: Shape | None) -> Shape | None:
    """Shape of ``numpy.matmul(a, b)``: 1-D operands are promoted and the added axis dropped,
    batch dims broadcast (symbols too, through ``dims.broadcast``). ``None`` when a rank is
    unknown. Raises the first :class:`ShapeProblem` of :func:`matmul_problems`."""
    problems = matmul_problems(a_shape, b_shape)
    if problems:
        raise problems[0]
    if a_shape is None or b_shape is None:
        return None
    a = tuple(a_shape)
    b = tuple(b_shape)
    a_vec = len(a) == 1
    b_vec = len(b) == 1
    if a_vec:
        a = (1,) + a
    if b_vec:
        b = b + (1,)
    batch = _broadcast(a[:-2], b[:-2])
    out = batch + (a[-2], b[-1])
    if a_vec:
        out = out[:-2] + out[-1:]
    if b_vec:
        out = out[:-1]
    return out

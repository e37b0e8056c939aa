"""Reductions and contractions: Einsum, TopK, ArgMax, the Reduce* family."""

from __future__ import annotations

from ..dims import DimLike
from ..registry import register
from ._wm_common import (
    INT64, broadcast_shapes, check_same_type, entries, merge_dim, need, norm_axes, norm_axis, shape_text, set_info,
    rank_only, scalar,
)


# ---------------------------------------------------------------- Einsum
def _einsum_terms(n, equation: str):
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    return lhs.split(","), (rhs if arrow else None)


@register("Einsum", 12, 28)
def einsum(ctx, n) -> None:
    infos = need(n, "Einsum", *[f"#{i}" for i in range(max(1, len(n.node.input)))])
    t = check_same_type(n, "Einsum", infos)
    eq = n.attr("equation")
    if eq is None:
        n.fail("Einsum", "attribute equation is required", subject="attribute equation", expected="an equation",
               found="none")
    eq = eq.decode() if isinstance(eq, bytes) else str(eq)
    terms, rhs = _einsum_terms(n, eq)
    if len(terms) != len(infos):
        n.fail("Einsum", "one equation term per input", subject="attribute equation",
               expected=f"{len(infos)} terms", found=f"{len(terms)} in {eq!r}")
    if any(i.shape is None for i in infos):
        set_info(n, 0, t, None)
        return
    labels: dict[str, DimLike] = {}
    counts: dict[str, int] = {}
    ellipsis: tuple | None = None
    for i, (term, info) in enumerate(zip(terms, infos)):
        shape = info.shape
        letters = term.replace("...", "")
        has_ell = "..." in term
        if (len(letters) > len(shape)) or (not has_ell and len(letters) != len(shape)):
            n.fail("Einsum", f"term {term!r} does not match the rank of input #{i}", subject=f"input #{i}",
                   expected=f"rank {len(letters)}{'+' if has_ell else ''}", found=f"rank {len(shape)}")
        ell_rank = len(shape) - len(letters)
        pos = 0
        for ch in term.replace("...", "."):
            if ch == ".":
                ell_dims = tuple(shape[pos:pos + ell_rank])
                try:
                    ellipsis = ell_dims if ellipsis is None else broadcast_shapes([ellipsis, ell_dims])
                except ValueError:
                    n.fail("Einsum", "ellipsis dims do not broadcast", subject=f"input #{i}",
                           expected=shape_text(ellipsis), found=shape_text(ell_dims))
                pos += ell_rank
                continue
            d = shape[pos]
            pos += 1
            counts[ch] = counts.get(ch, 0) + 1
            if ch in labels:
                prev = labels[ch]
                if isinstance(prev, int) and isinstance(d, int) and prev != d and 1 not in (prev, d):
                    n.fail("Einsum", f"label {ch!r} has two sizes", subject=f"input #{i}", expected=prev, found=d)
                labels[ch] = d if prev == 1 else merge_dim(prev, d)
            else:
                labels[ch] = d
    if rhs is None:
        out_letters = "".join(sorted(c for c, k in counts.items() if k == 1))
        out = list(ellipsis or ()) + [labels[c] for c in out_letters]
    else:
        out = []
        for part in rhs.replace("...", "."):
            if part == ".":
                out.extend(ellipsis or ())
            elif part in labels:
                out.append(labels[part])
            else:
                n.fail("Einsum", f"output label {part!r} is not in any input term", subject="attribute equation",
                       expected="labels of the inputs", found=eq)
    set_info(n, 0, t, out)


# ---------------------------------------------------------------- TopK / ArgMax
@register("TopK", 1, 10, 11, 24)
def topk(ctx, n) -> None:
    x, = need(n, "TopK", "X")
    if n.version < 10:
        k = n.attr("k")
    else:
        kin, = need(n, "TopK", "K", at=(1,))
        if kin.shape is not None and kin.shape not in ((1,), ()):
            n.fail("TopK", "K must be a 1-element tensor", subject="input K", expected="shape [1]",
                   found=shape_text(kin.shape))
        k = scalar(kin)
    if x.shape is None:
        set_info(n, 0, x.elem_type, None)
        set_info(n, 1, INT64, None)
        return
    r = len(x.shape)
    axis = norm_axis(n, "TopK", int(n.attr("axis", -1)), r)
    if isinstance(k, int):
        if k < 0:
            n.fail("TopK", "K must not be negative", subject="input K", expected=">= 0", found=k)
        d = x.shape[axis]
        if isinstance(d, int) and k > d:
            n.fail("TopK", "K exceeds the axis size", subject="input K", expected=f"<= {d}", found=k)
    out = list(x.shape)
    # K computed from data (not a shape value) is known only at run time: a fresh symbol
    out[axis] = n.fresh_dim(0, axis) if k is None or isinstance(k, float) else k
    set_info(n, 0, x.elem_type, out)
    set_info(n, 1, INT64, out)


def _reduced(shape, axes, keepdims: bool):
    return [1 if i in axes else d for i, d in enumerate(shape)] if keepdims else \
        [d for i, d in enumerate(shape) if i not in axes]


@register("ArgMax", 1, 11, 12, 13)
def argmax(ctx, n) -> None:
    x, = need(n, "ArgMax", "data")
    keepdims = bool(n.attr("keepdims", 1))
    if x.shape is None:
        set_info(n, 0, INT64, None)
        return
    axis = norm_axis(n, "ArgMax", int(n.attr("axis", 0)), len(x.shape))
    set_info(n, 0, INT64, _reduced(x.shape, {axis}, keepdims))


# ---------------------------------------------------------------- reductions
_AXES_INPUT_SINCE = {"ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18, "ReduceMin": 18}


def reduce_rule(ctx, n) -> None:
    rule = n.node.op_type
    x, = need(n, rule, "data")
    t = x.elem_type
    keepdims = bool(n.attr("keepdims", 1))
    from_input = n.version >= _AXES_INPUT_SINCE[rule]
    noop = from_input and bool(n.attr("noop_with_empty_axes", 0))
    known = True
    if from_input:
        if n.has_input(1):
            axes = entries(n.input(1))
            if axes is None or not all(isinstance(a, int) for a in axes):
                known = False
        else:
            axes = []
    else:
        a = n.attr("axes")
        axes = [] if a is None else [int(v) for v in a]
    if x.shape is None:
        set_info(n, 0, t, None)
        return
    r = len(x.shape)
    if not known:
        if keepdims:
            set_info(n, 0, t, (None,) * r)
        else:
            k = rank_only(n.input(1))
            set_info(n, 0, t, None if k is None else (None,) * (r - k))
        return
    if not axes:
        if noop:
            set_info(n, 0, t, x.shape, x.value)
            return
        axes_set = set(range(r))
    else:
        axes_set = set(norm_axes(n, rule, axes, r, "axes"))
    set_info(n, 0, t, _reduced(x.shape, axes_set, keepdims))


register("ReduceMean", 1, 11, 13, 18)(reduce_rule)
register("ReduceSum", 1, 11, 13)(reduce_rule)
register("ReduceMax", 1, 11, 12, 13, 18, 20)(reduce_rule)
register("ReduceMin", 1, 11, 12, 13, 18, 20)(reduce_rule)

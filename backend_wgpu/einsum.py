"""Einsum equations read for the Einsum kernel (the render global ``oq_einsum`` and the spec function ``einsumMap``).

An equation names each input dim with a letter; ``...`` stands for the dims not named (the same
count of leading, right-aligned dims in every term, broadcast numpy-style). Without ``->`` the
output is the ellipsis dims, then the letters that appear once, in alphabetical order (numpy's
implicit mode). :func:`einsum_labels` gives, for the template, from the inputs' ranks alone: each
input's labels (ellipsis dims as ``"0"``, ``"1"``, ... from the left of the broadcast ellipsis),
the output's labels and the summed labels (in first-appearance order); :func:`einsum_map` (the
spec expression ``einsumMap``) the sizes and strides the kernel reads as runtime uniforms, and
:func:`einsum_plan` every label's size and per input dim whether it broadcasts (size 1 against a
larger label), checking that the shapes fit the equation.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass

LETTERS = frozenset(string.ascii_letters)


class EinsumError(ValueError):
    pass


@dataclass(frozen=True)
class EinsumLabels:
    inputs: tuple[tuple[str, ...], ...]
    output: tuple[str, ...]
    summed: tuple[str, ...]
    labels: tuple[str, ...]  # every label, in first-appearance order over the inputs
    position: dict  # label -> its index in labels (einsum_map's sizes)


@dataclass(frozen=True)
class EinsumPlan:
    inputs: tuple[tuple[str, ...], ...]
    broadcast: tuple[tuple[bool, ...], ...]
    output: tuple[str, ...]
    sizes: dict
    summed: tuple[str, ...]


def _terms(equation: str, n_inputs: int) -> tuple[list[str], str | None]:
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != n_inputs:
        raise EinsumError(f"equation {equation!r} has {len(terms)} input terms, the node {n_inputs} inputs")
    for t in terms + ([rhs] if arrow else []):
        body = t.replace("...", "")
        if "." in body or not set(body) <= LETTERS:
            raise EinsumError(f"equation {equation!r}: term {t!r} is not letters and one '...'")
    return terms, (rhs if arrow else None)


def einsum_labels(equation: str, ranks) -> EinsumLabels:
    """The equation's labels for inputs of these ranks: what the kernel's index math is made of
    (the sizes are runtime values: :func:`einsum_map`)."""
    ranks = [int(r) for r in ranks]
    terms, rhs = _terms(equation, len(ranks))
    ell = 0
    for t, r in zip(terms, ranks):
        named = len(t.replace("...", ""))
        if "..." in t:
            ell = max(ell, r - named)
        elif r != named:
            raise EinsumError(f"equation {equation!r}: term {t!r} names {named} dims, the input has {r}")
    ell_labels = [str(k) for k in range(ell)]
    inputs = []
    for t, r in zip(terms, ranks):
        head, _, tail = t.partition("...")
        k = r - len(head) - len(tail) if "..." in t else 0
        labels = list(head) + ell_labels[ell - k:] + list(tail)
        if len(labels) != r:
            raise EinsumError(f"equation {equation!r}: term {t!r} does not fit a rank-{r} input")
        inputs.append(tuple(labels))
    every = tuple(dict.fromkeys(lab for labels in inputs for lab in labels))
    if rhs is None:
        counts: dict[str, int] = {}
        for labels in inputs:
            for label in labels:
                counts[label] = counts.get(label, 0) + 1
        output = ell_labels + sorted(lab for lab, c in counts.items() if c == 1 and lab in LETTERS)
    else:
        head, _, tail = rhs.partition("...")
        output = list(head) + (ell_labels if "..." in rhs else []) + list(tail)
        if any(lab not in every for lab in output) or len(set(output)) != len(output):
            raise EinsumError(f"equation {equation!r}: output labels {rhs!r} repeat or name no input dim")
    summed = tuple(lab for lab in every if lab not in output)
    return EinsumLabels(tuple(inputs), tuple(output), summed, every, {lab: k for k, lab in enumerate(every)})


def einsum_plan(equation: str, shapes) -> EinsumPlan:
    shapes = [tuple(int(d) for d in s) for s in shapes]
    lab = einsum_labels(equation, [len(s) for s in shapes])
    sizes: dict[str, int] = {}
    for labels, s in zip(lab.inputs, shapes):
        for label, d in zip(labels, s):
            prev = sizes.get(label)
            if prev is None or prev == 1:
                sizes[label] = d
            elif d not in (1, prev):
                raise EinsumError(f"equation {equation!r}: label {label!r} is {prev} and {d}")
    broadcast = tuple(tuple(d == 1 and sizes[x] > 1 for x, d in zip(labels, s)) for labels, s in zip(lab.inputs, shapes))
    return EinsumPlan(lab.inputs, broadcast, lab.output, sizes, lab.summed)


def einsum_map(equation: str, shapes: tuple) -> tuple:
    """``einsumMap(equation, shapes)`` (a spec expression): ``[ok, sizes, strides]``: every label's
    size in :func:`einsum_labels`' order (``labels``) and each input's row-major strides, 0 where
    its dim is 1 (a broadcast reads coordinate 0); ``ok`` false (the rest empty) when the shapes do
    not fit the equation."""
    if not (isinstance(equation, str) and isinstance(shapes, tuple)
            and all(isinstance(s, tuple) and all(type(d) is int for d in s) for s in shapes)):
        raise ValueError("needs an equation and a list of shapes")
    try:
        p = einsum_plan(equation, shapes)
    except EinsumError:
        return (False, (), ())
    order = einsum_labels(equation, [len(s) for s in shapes]).labels
    strides = tuple(tuple(0 if d == 1 else math.prod(s[k + 1:]) for k, d in enumerate(s)) for s in shapes)
    return (True, tuple(p.sizes[lab] for lab in order), strides)

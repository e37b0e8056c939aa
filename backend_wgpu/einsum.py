"""Einsum equations read for the Einsum kernel's template (a render global, ``oq_einsum``).

An equation names each input dim with a letter; ``...`` stands for the dims not named (the same
count of leading, right-aligned dims in every term, broadcast numpy-style). Without ``->`` the
output is the ellipsis dims, then the letters that appear once, in alphabetical order (numpy's
implicit mode). :func:`einsum_plan` gives, for the template: each input's labels (ellipsis dims
as ``"0"``, ``"1"``, ... from the left of the broadcast ellipsis), the output's labels, every
label's size, the summed labels (in first-appearance order), and per input dim whether it
broadcasts (size 1 against a larger label).
"""

from __future__ import annotations

import string
from dataclasses import dataclass

LETTERS = frozenset(string.ascii_letters)


class EinsumError(ValueError):
    pass


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


def einsum_plan(equation: str, shapes) -> EinsumPlan:
    shapes = [tuple(int(d) for d in s) for s in shapes]
    terms, rhs = _terms(equation, len(shapes))
    ell = 0
    for t, s in zip(terms, shapes):
        named = len(t.replace("...", ""))
        if "..." in t:
            ell = max(ell, len(s) - named)
        elif len(s) != named:
            raise EinsumError(f"equation {equation!r}: term {t!r} names {named} dims, the input has {len(s)}")
    ell_labels = [str(k) for k in range(ell)]
    inputs, sizes = [], {}
    for t, s in zip(terms, shapes):
        head, _, tail = t.partition("...")
        k = len(s) - len(head) - len(tail) if "..." in t else 0
        labels = list(head) + ell_labels[ell - k:] + list(tail)
        if len(labels) != len(s):
            raise EinsumError(f"equation {equation!r}: term {t!r} does not fit a rank-{len(s)} input")
        for label, d in zip(labels, s):
            prev = sizes.get(label)
            if prev is None or prev == 1:
                sizes[label] = d
            elif d not in (1, prev):
                raise EinsumError(f"equation {equation!r}: label {label!r} is {prev} and {d}")
        inputs.append(tuple(labels))
    if rhs is None:
        counts: dict[str, int] = {}
        for labels in inputs:
            for label in labels:
                counts[label] = counts.get(label, 0) + 1
        output = ell_labels + sorted(lab for lab, c in counts.items() if c == 1 and lab in LETTERS)
    else:
        head, _, tail = rhs.partition("...")
        output = list(head) + (ell_labels if "..." in rhs else []) + list(tail)
        unknown = [lab for lab in output if lab not in sizes]
        if unknown or len(set(output)) != len(output):
            raise EinsumError(f"equation {equation!r}: output labels {rhs!r} repeat or name no input dim")
    seen: list[str] = []
    for labels in inputs:
        for label in labels:
            if label not in output and label not in seen:
                seen.append(label)
    broadcast = tuple(tuple(d == 1 and sizes[lab] > 1 for lab, d in zip(labels, s)) for labels, s in zip(inputs, shapes))
    return EinsumPlan(tuple(inputs), broadcast, tuple(output), sizes, tuple(seen))

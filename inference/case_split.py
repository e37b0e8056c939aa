"""Case splitting on an ``If`` whose branches give its outputs different ranks.

torch writes ``x.squeeze(-1)`` of a dim it cannot see as ``If(Equal(Shape(x)[-1], 1), then:
Squeeze, else: Identity)``: the output's rank depends on the data, so merging the branches
leaves it unknown, and with it everything computed from it (silero-vad's decoder: its LSTM asks
for the input's rank with ``Size(Shape(x))`` and branches on it again).

The pass then runs again once per case: each run fixes the branch of the split ``If`` nodes
(``Pass.forced``: (graph path, node index) -> branch), so what follows sees one rank and folds
the conditions built on it. Every execution of the model takes one of the cases. A case whose
run finds a certain violation (rules report nothing else) is one in which the model cannot run,
and is left out: in silero-vad the rank-3 branch (a decoder input whose last dim is not 1, at
1024 samples) gives the LSTM a rank-4 input, which onnxruntime refuses as well; the model runs
where that dim is 1. A value's type is then the merge of its types in the cases that run
(``union``: equal dims stay, different ones become ``<name>_dim<i>`` symbols, different ranks
stay unknown); it replaces the first run's type only where that was not full. Diagnostics are
the first run's (a stale declaration, ``output-type``/``value-info``, is no violation of the
graph and rules no case out).

The cases grow one split at a time, the first ``If`` met first: each case that runs is run
with the next split's two branches, up to :data:`MAX_SPLITS` splits and :data:`MAX_RUNS` runs.
A model pays for this only where such an ``If`` leaves a value of its main graph without a
full type (silero-vad's opset-15 and half exports: 2 more runs, 3x the pass); an ambiguity
confined to bodies is left as it is (the spox export: 4 more runs would type its last 50 body
values, at 6x the pass), and models without such an ``If`` pay nothing.
"""

from __future__ import annotations

from functools import reduce
from typing import Callable

from .context import TensorInfo, merge_info
from .scope import Graph
from .subgraphs import union

#: how many rank-splitting If nodes the pass splits on at most, and how many runs it makes for them
MAX_SPLITS = 4
MAX_RUNS = 12


#: findings that say a declaration is stale, not that the graph cannot run
_DECLARATION_RULES = frozenset(("output-type", "value-info"))


def _fails(result) -> bool:
    """Whether a case's run found a certain violation (rules report only those): every execution
    that takes those branches fails, so the case says nothing of the values of one that runs."""
    return any(e.rule not in _DECLARATION_RULES for e in result.errors)


def _full(info) -> bool:
    return isinstance(info, TensorInfo) and bool(info.elem_type) and info.shape is not None \
        and all(d is not None for d in info.shape)


def main_partial(g: Graph) -> bool:
    """Whether a node output of the main graph ``g`` is left without a full type (only then is
    splitting worth its runs: an ambiguity inside bodies alone is left as it is)."""
    local = g.scope.local
    return any(name and not _full(local(name)) for name in g.produced)


class FirstBodies:
    """The first run's bodies as a case run sees them: a branch that never runs in the case
    (``quiet``: its If's condition is constant, or fixed by the case) need not be walked again
    where the first run typed it fully, bodies nested in it included, and the case fixes no If
    inside it: the merge keeps a full type as it is, and the If reads only the taken branch's
    types (and every branch's non-tensor output types, so a branch with one is walked)."""

    def __init__(self, subgraphs: dict, forced: dict) -> None:
        self.subgraphs = subgraphs
        self.forced_where = [where for where, _ in forced]
        self._settled: dict[tuple, Graph | None] = {}

    def settled(self, key: tuple) -> Graph | None:
        """The first run's body at ``key`` (parent path, step) if a case may reuse it, else None."""
        if key in self._settled:
            return self._settled[key]
        g = self.subgraphs.get(key)
        if g is not None:
            inside = g.where + "/"
            if any(w == g.where or w.startswith(inside) for w in self.forced_where) or not _fully_typed(g):
                g = None
        self._settled[key] = g
        return g


def _fully_typed(g: Graph) -> bool:
    """Every node output of ``g`` and of the bodies nested in it has a full tensor type, and no
    output of ``g`` has a non-tensor type."""
    if main_partial(g) or any(g.scope.other_type(vo.name) is not None for vo in g.proto.output):
        return False
    return all(_fully_typed(c) for c in g.children.values())


def _better(new: TensorInfo, old) -> bool:
    if not isinstance(old, TensorInfo) or old.shape is None:
        return new.shape is not None or (bool(new.elem_type) and not getattr(old, "elem_type", 0))
    return new.shape is not None and len(new.shape) == len(old.shape) and \
        sum(d is None for d in new.shape) < sum(d is None for d in old.shape)


def split_cases(first: Graph, subgraphs: dict, splits: list, run_forced: Callable[[dict], tuple]) -> None:
    """Run the cases of the split ``If`` nodes and merge their types into the first run's
    graphs (``first``: its main graph; ``subgraphs``: its bodies by path). ``run_forced(forced)``
    runs the pass with those branches fixed and returns (its result, the splits it met).

    The cases grow one split at a time, the first met first: each surviving case (one whose run
    found no certain violation) is run with the next split's two branches."""
    chosen: list = []
    cases: list[dict] = [{}]
    results: list = []
    candidates = list(splits)
    runs_left = MAX_RUNS
    while candidates and len(chosen) < MAX_SPLITS and runs_left >= 2 * len(cases):
        key = candidates[0]
        chosen.append(key)
        survivors, found_results, met = [], [], {}
        for case in cases:
            for branch in (True, False):
                forced = {**case, key: branch}
                result, found = run_forced(forced)
                runs_left -= 1
                if not _fails(result):
                    survivors.append(forced)
                    found_results.append(result)
                    met.update(dict.fromkeys(found))
        if not survivors:  # every case fails: the model cannot run past this If at all
            break
        cases, results = survivors, found_results
        candidates = [k for k in met if k not in chosen]
    if not results:
        return
    _merge_graph(first, [r.main for r in results])
    for key, g in subgraphs.items():
        _merge_graph(g, [r.subgraphs.get(key) for r in results])


def _merge_graph(g: Graph, cases: list) -> None:
    if any(c is None for c in cases):
        return
    scope = g.scope
    for name in g.produced:
        if not name:
            continue
        old = scope.local(name)
        if _full(old):
            continue
        infos = [c.scope.local(name) for c in cases]
        if not all(isinstance(i, TensorInfo) for i in infos):
            continue
        merged = reduce(lambda a, b: union(a, b, name), infos)
        if not _better(merged, old):
            continue
        if name in g.final_outputs:
            declared, is_output = g.declared[name]
            merged, conflict = merge_info(declared, merged, prefer_declared_symbols=is_output and g.top)
            if conflict:
                continue
            g.final_outputs[name] = merged
        scope.define(name, merged)
        scope.kids.pop(name, None)

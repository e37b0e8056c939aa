"""The inference pass: one walk over a graph's nodes typing every value.

Each node is typed by, in order of preference (``inference.dispatch``):

1. ``Constant`` directly; ``If``, ``Loop`` and ``Scan`` by the engine itself, inferring their
   bodies (``inference.subgraphs``);
2. its own rule (``inference.registry``, selected by the model's opset for the node's domain);
3. onnx's per-node inference for the schema ``onnx.defs`` selects (``inference.fallback``);
4. a model-local function, inlined per call (``inference.functions``);
5. nothing: an op of a domain with none of these leaves its outputs unknown (strict mode raises).

A node missing a required input (``onnx.defs``: a single, non-optional formal parameter, or
fewer values than a variadic one's minimum) is reported (``schema.required-input``) and its
rule is not called.

Constants (``Constant`` nodes, initializers) carry their value, read from the proto only when
a rule asks for it (``inference.scope``), and a few cheap operators on small integer tensors
(``Shape``, ``Gather``, ``Concat``, ...) are folded so that ``Shape -> Gather -> Concat ->
Reshape`` stays known (``inference.folding``).

Speed: a node's result is a function of its op, opset, attributes, input types and the
constant inputs its rule reads, so the pass memoizes it on exactly that (``inference.memo``;
a rule that reads a large constant is simply not memoized). Repeated blocks of a model are
typed once. Types are serialized once per distinct value (for onnx's fallback and for the
write-back, ``inference.writeback``, which builds ``value_info`` as bytes).

``infer`` runs the pass once; ``infer_shapes`` (a model with ``value_info``), ``infer_values``
(name -> ``TensorInfo``) and ``check_model`` (a list of ``Diagnostic``) are views of it
(``inference.api``: ``InferenceResult``).
"""

from __future__ import annotations

import contextlib
import gc
import os
from typing import Any, Iterable, Mapping

import numpy as np
import onnx

from onnx_quant.budget import resolve as resolve_budget
from onnx_quant.errors import InferenceError, QuantError
from onnx_quant.model_io import EXAMPLE_NAME, ModelSource, check_external_files, load_model

from . import registry, rules  # noqa: F401  (rules: registers every rule module)
from .api import (
    SOURCE_CONSTANT, SOURCE_DECLARED, SOURCE_FAILED, SOURCE_FUNCTION, SOURCE_RULE, SOURCE_UNKNOWN, TYPED_SOURCES,
    InferenceResult, NodeRecord, describe,
)
from .case_split import FirstBodies, main_partial, split_cases
from .context import TensorInfo, info_text, merge_info
from .diagnostics import MODEL_NODE, Diagnostic, one_line
from .dispatch import (
    K_CONSTANT, K_FALLBACK, K_FUNCTION, K_NO_OPSET, K_RULE, K_UNKNOWN, Entry, new_entry, required_present,
    schema_for, unknown_op,
)
from .fallback import Fallback
from .folding import fold
from .functions import Functions
from .memo import NEVER, Dep, Keys
from .model_facts import model_facts
from .registry import NodeContext, normalize_domain
from .scope import UNKNOWN, Bookkeeping, Graph, NodeCtx, NoLog, Scope, constant_info
from .seeding import seed_body, seed_input_values, seed_main
from .structure import check_depth
from .writeback import write_back, write_type

__all__ = [
    "InferenceResult", "NodeRecord", "Pass", "check", "check_model", "infer", "infer_shapes", "infer_values",
    "merge_info", "write_back", "write_type",
]


@contextlib.contextmanager
def cyclic_gc_paused():
    """The cyclic garbage collector off while the pass walks (as it was again after). The pass
    makes no reference cycles, so the collector finds nothing, but it allocates an object or
    more per value and each full collection scans every live one: 14 of them in a pass over a
    100k-node decoder, about 12% of its time (docs/benchmarks.md, "Decoder graphs")."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# ------------------------------------------------------------------ public API
def infer(model: ModelSource, *, strict: bool = False,
          input_shapes: Mapping[str, Iterable[Any]] | None = None,
          input_values: Mapping[str, np.ndarray] | None = None,
          declared_outputs_win: bool = True, runtime: bool = False) -> InferenceResult:
    """Run the pass over ``model`` (a ModelProto, path or bytes; not modified).

    ``input_shapes`` overrides graph input shapes (dims as ints, symbol names or ``None``);
    symbols it binds to ints are substituted in the other graph inputs too. ``input_values``
    gives graph inputs known contents (a Session planning for the values of small integer
    inputs that decide shapes); their shapes must agree with ``input_shapes``. Where a graph
    output's declared type contradicts the inferred one, lenient mode keeps the declared one
    (the model's contract) unless ``declared_outputs_win`` is False (a runtime allocating what
    the model computes, as onnxruntime does after its warning). Lenient mode
    records every violation in the result; ``strict=True`` raises the first
    ``InferenceError``. ``runtime=True`` (a runtime planning what it will compute): where onnx's
    shape inference and the runtimes (onnx.reference, onnxruntime) disagree on what a node
    computes, the runtimes' answer (``ShapesContext.runtime``).
    """
    proto = load_model(model, check_external=False)  # the pass checks external data as it seeds
    return Pass(proto, strict=strict, label=_source_label(model), declared_outputs_win=declared_outputs_win,
                runtime=runtime).run(input_shapes, input_values)


def infer_shapes(model: ModelSource, *, strict: bool = False) -> onnx.ModelProto:
    """A copy of ``model`` with ``value_info`` for every typed intermediate and typed outputs.

    A drop-in for ``onnx.shape_inference.infer_shapes``. Declared graph-output dims that are
    known are kept; a declared output type that contradicts the inferred one raises in strict
    mode and is kept (with a diagnostic) in lenient mode. Subgraph bodies get ``value_info``
    too.
    """
    proto = load_model(model, check_external=False)  # the pass checks external data as it seeds
    with cyclic_gc_paused():  # the write-back too: an entry or more per value
        result = Pass(proto, strict=strict, label=_source_label(model)).run(None)
        # a model parsed here from a path or bytes is nobody else's: typed in place, its weights
        # are not copied (for a big model the copy, fresh pages, costs more than the pass)
        return write_back(proto, result, copy=isinstance(model, onnx.ModelProto))


def infer_values(model: ModelSource, input_shapes: Mapping[str, Iterable[Any]] | None = None, *,
                 strict: bool = False, input_values: Mapping[str, np.ndarray] | None = None,
                 declared_outputs_win: bool = True, runtime: bool = False) -> dict[str, TensorInfo]:
    """Name -> ``TensorInfo`` for every value: graph inputs, initializers, intermediates, outputs.

    With concrete ``input_shapes`` every shape that follows from them is a tuple of ints;
    ``input_values`` (see ``infer``) lets the values computed from those inputs fold too.
    """
    return infer(model, strict=strict, input_shapes=input_shapes, input_values=input_values,
                 declared_outputs_win=declared_outputs_win, runtime=runtime).values()


def _source_label(model: ModelSource) -> str:
    """How errors about the model as a whole name it (as ``load_model`` does)."""
    if isinstance(model, onnx.ModelProto):
        return "<ModelProto>"
    if isinstance(model, (bytes, bytearray, memoryview)):
        return "<bytes>"
    return str(model)


def check(model: ModelSource, *, base_dir: str | os.PathLike | None = None) -> tuple[list[Diagnostic], InferenceResult]:
    """``check_model``'s diagnostics together with the pass result they came from (None when
    subgraphs nest too deep to walk: the ``graph-depth`` diagnostic says so)."""
    proto = load_model(model)
    found: list[Diagnostic] = []
    # given a path, the checker resolves external data beside the model, not in the cwd
    is_file = isinstance(model, (str, os.PathLike)) and model != EXAMPLE_NAME
    try:
        onnx.checker.check_model(os.fspath(model) if is_file else _checker_view(proto, base_dir, _source_label(model)))
    except QuantError:
        raise
    except Exception as e:  # onnx raises ValidationError, but also C++ errors of other kinds
        found.append(Diagnostic(MODEL_NODE, "onnx.checker", one_line(e)))
    found.extend(model_facts(proto))
    try:
        result = Pass(proto, strict=False).run(None)
    except InferenceError as e:  # graph-depth: the pass cannot walk the model at all
        found.append(Diagnostic.from_error(e))
        return found, None
    found.extend(result.diagnostics)
    return found, result


def check_model(model: ModelSource, *, base_dir: str | os.PathLike | None = None) -> list[Diagnostic]:
    """Every problem of ``model``: onnx's checker first, then each violation the pass finds.

    Empty when the model is valid. External data of a model given as bytes or a ModelProto is
    looked for in ``base_dir`` only (refused without it: ``ModelLoadError`` naming the tensor).
    """
    return check(model, base_dir=base_dir)[0]


def _checker_view(proto: onnx.ModelProto, base_dir, label: str) -> onnx.ModelProto:
    """What onnx's checker may see of an in-memory model: the checker looks for external data
    in the current directory, so external tensors are checked here against ``base_dir``
    (:func:`check_external_files`) and handed to the checker as graph inputs of their type."""
    if check_external_files(proto, base_dir, label, resolve_budget()) is None:
        return proto
    view = onnx.ModelProto()
    view.CopyFrom(proto)
    graph = view.graph
    keep = [t for t in graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    moved = [t for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    inputs = {i.name for i in graph.input}
    graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                       for t in moved if t.name not in inputs)
    del graph.initializer[:]
    graph.initializer.extend(keep)
    return view


# ------------------------------------------------------------------ the pass
class Pass:
    """State of one walk; nothing outlives ``run`` but the result (which holds the scopes and
    the serialized types, never the pass). Its helpers see it as an
    ``inference.protocol.InferencePass``."""

    def __init__(self, model: onnx.ModelProto, *, strict: bool, label: str = "<model>",
                 declared_outputs_win: bool = True, runtime: bool = False, forced: dict | None = None,
                 shared: "Pass | None" = None) -> None:
        self.model = model
        self.strict = strict
        self.runtime = runtime
        #: If nodes whose branch this run fixes, and those met whose branches differ in rank
        self.forced = forced or {}
        self.splits: list[tuple] = []
        self.label = label
        #: on a conflict, keep a graph output's declared type (the model's contract, for typing)
        #: or what the model computes (what a runtime must allocate, as onnxruntime does)
        self.declared_outputs_win = declared_outputs_win
        opsets: dict[str, int] = {}
        for o in model.opset_import:
            opsets[normalize_domain(o.domain)] = int(o.version)
        if not model.opset_import:  # IR < 3 models imply ai.onnx opset 1
            opsets[""] = 1
        self.opsets = opsets
        self.diagnostics: list = []
        # what constants and scopes report to: no reference back to the pass, so that dropping
        # the result frees everything at once (no cycles left for the garbage collector)
        # a case of case_split shares the first run's bookkeeping, memo and tables (every memo
        # entry is a function of what it is keyed on, whichever run made it); _forced_run points
        # the bookkeeping at this run's diagnostics while it runs
        self.owner = Bookkeeping(strict, self.diagnostics) if shared is None else shared.owner
        scope = Scope(opsets, strict, self.diagnostics, owner=self.owner)
        scope.runtime = runtime
        self.ctx = scope
        if shared is None:
            self.keys = keys = Keys()
            self.fallback = Fallback(model, keys, self.owner)  # it reports through the bookkeeping: no cycle
            self._dispatch_tables: dict[tuple, dict] = {}
            self.functions = Functions(model)
        else:
            self.keys = keys = shared.keys
            self.fallback = shared.fallback
            self._dispatch_tables, self.functions = shared._dispatch_tables, shared.functions
        #: a case's view of the first run's bodies: the never-run branches it need not walk again
        self.first_bodies = None if shared is None else FirstBodies(shared.result.subgraphs, self.forced)
        self.main = top = Graph(model.graph, scope, self.dispatch_table(opsets), top=True)
        self.result = InferenceResult(scope, typed_by=top.typed_by, other_types=scope.other, records=top.records,
                                      main=top, types=keys)

    # -- driver
    def run(self, input_shapes: Mapping[str, Iterable[Any]] | None,
            input_values: Mapping[str, np.ndarray] | None = None) -> InferenceResult:
        if not self.forced:  # a case run's model is the first run's, checked already
            check_depth(self.model.graph, self.model.functions)  # before any recursive walk
        g = self.main
        with cyclic_gc_paused():
            seed_main(g, self.keys, self.label, input_shapes)
            if input_values:
                seed_input_values(g, input_values)
            self.walk(g)
            self._check_outputs_defined(g)
            if self.splits and not self.forced and main_partial(g):
                split_cases(g, self.result.subgraphs, self.splits,
                            lambda forced: self._forced_run(forced, input_shapes, input_values))
        self.owner.log = NoLog()  # values read after the pass need no bookkeeping
        result, self.result = self.result, None  # the result refers to the pass's types, not the other way
        return result

    def walk(self, g: Graph) -> None:
        """Type every node of ``g`` in order. The loop is the memo's hit path: build the node's
        key, and on a hit set the cached outputs; everything else is ``_slow_node``. Reading
        a node's fields from protobuf is most of a hit's cost, so each is read once, and
        single-output nodes (most of them) skip the general output loop."""
        dispatch = g.dispatch
        scope = g.scope
        kids = scope.kids
        kids_get = kids.get
        kid_of = self.keys.kid_of
        bind = scope.bind
        contains = g.defined
        typed_by = g.typed_by
        declared = g.declared
        produced = g.produced
        add_produced = produced.append
        records = g.records
        record = records.append if records is not None else None
        has_functions = bool(self.functions)
        slow = self._slow_node
        typed_constant = self._typed_constant
        content_key = self.keys.content_key
        index = -1
        for node in g.nodes:
            index += 1
            dkey = (node.domain, node.op_type, node.overload) if has_functions else (node.domain, node.op_type)
            entry = dispatch.get(dkey)
            if entry is None:
                entry = self._entry(g, node, dkey)
            memo = entry.memo
            if memo is None:  # constants, control flow, functions, unknown ops: never memoized
                if entry.kind is not K_CONSTANT or not typed_constant(g, index, node, entry):
                    slow(g, index, node, entry, None)
                continue
            inputs = node.input[:]
            key: list | None = list(map(kids_get, inputs))  # kids[""] is 0: an absent optional input
            if None in key:
                for i, name in enumerate(inputs):
                    if key[i] is None:
                        kid = kid_of(scope, name)
                        if kid is None:  # not defined (yet): reported on the slow path
                            key = None
                            break
                        key[i] = kid
                if key is None:
                    slow(g, index, node, entry, None)
                    continue
            attrs = node.attribute
            if attrs:
                for a in attrs:
                    t = a.type
                    if t == 5 or t == 10:  # GRAPH, GRAPHS: bodies read outer-scope values
                        key = None
                        break
                    key.append(a.SerializeToString())
                if key is None:
                    slow(g, index, node, entry, None)
                    continue
            outputs = node.output[:]
            single = len(outputs) == 1 and outputs[0]
            key.append(len(outputs))
            if not single and "" in outputs:
                key.append(tuple(map(bool, outputs)))
            key = tuple(key)
            cached = memo.get(key)
            if cached is not None and type(cached) is Dep:  # the rule read constants: key them by content
                if cached is NEVER:  # ... big ones: not memoized at all
                    slow(g, index, node, entry, None)
                    continue
                cached = memo.get(content_key(scope, inputs, key, cached.indices))
            if cached is None:
                slow(g, index, node, entry, key, inputs, outputs)
                continue
            if single:
                if contains(single):
                    self._redefined(g, index, node, single)
                out = cached[0]
                bind(single, out)
                typed_by[single] = entry.described
                if single in declared:
                    self._merge_declared(g, self.node_ctx(g, index, node, entry), single, out[0])
                add_produced(single)
            else:
                described = entry.described
                for name, out in zip(outputs, cached):
                    if name:
                        if contains(name):
                            self._redefined(g, index, node, name)
                        bind(name, out)
                        typed_by[name] = described
                        if name in declared:
                            self._merge_declared(g, self.node_ctx(g, index, node, entry), name, out[0])
                produced.extend(outputs)
            if record is not None:
                record(entry)  # a hit: the entry says how (see InferenceResult.nodes)

    def _forced_run(self, forced: dict, input_shapes, input_values) -> tuple:
        """A lenient run with the branches of ``forced`` fixed: (its result, the splits it met)."""
        other = Pass(self.model, strict=False, label=self.label, declared_outputs_win=self.declared_outputs_win,
                     runtime=self.runtime, forced=forced, shared=self)
        owner = self.owner
        saved = owner.strict, owner.diagnostics, owner.log
        owner.strict, owner.diagnostics, owner.log = False, other.diagnostics, []
        try:
            return other.run(input_shapes, input_values), list(other.splits)
        finally:
            owner.strict, owner.diagnostics, owner.log = saved

    def note_rank_split(self, key: tuple) -> None:
        if key not in self.splits:
            self.splits.append(key)

    def raise_or_record(self, err: InferenceError) -> None:
        if self.strict:
            raise err
        self.diagnostics.append(err)

    def dispatch_table(self, opsets: dict[str, int]) -> dict:
        key = tuple(sorted(opsets.items()))
        table = self._dispatch_tables.get(key)
        if table is None:
            table = self._dispatch_tables[key] = {}
        return table

    def from_type_proto(self, tp: onnx.TypeProto) -> TensorInfo:
        """``TensorInfo.from_type_proto`` with dim_param texts parsed once per pass."""
        return self.keys.from_type_proto(tp)

    # -- one node
    def _entry(self, g: Graph, node: onnx.NodeProto, key: tuple) -> Entry:
        domain = normalize_domain(node.domain)
        op = node.op_type
        function = self.functions.get((domain, op, node.overload)) if self.functions else None
        e = g.dispatch[key] = new_entry(domain, op, g.scope.opset(domain), function)
        return e

    def node_ctx(self, g: Graph, index: int, node, entry: Entry, inputs: list | None = None,
                 outputs: list | None = None) -> NodeCtx:
        n = NodeCtx(node, index, g.scope, entry.version or 0, entry.opset or 0)
        n.prefix = g.prefix
        n.inputs = node.input[:] if inputs is None else inputs
        n.outputs = node.output[:] if outputs is None else outputs
        return n

    def _redefined(self, g: Graph, index: int, node, name: str) -> None:
        n = NodeCtx(node, index, g.scope, 0, 0)
        n.prefix = g.prefix
        self.raise_or_record(n.error(
            "single-assignment", f"output {name!r} is already defined ({g.typed_by.get(name, 'earlier')})"))

    def _typed_constant(self, g: Graph, index: int, node, entry: Entry) -> bool:
        """A well-formed ``Constant`` (one value attribute, one new output, no inputs) typed from
        its attribute with no ``NodeContext``: torch writes every shape constant as one, a third
        of an exported model's nodes. False leaves the node to :meth:`_slow_node`, which types
        it the same way and reports whatever is wrong with it."""
        outputs = node.output
        if len(outputs) != 1 or node.input:
            return False
        name = outputs[0]
        scope = g.scope
        if not name or g.defined(name):
            return False
        info = constant_info(node.attribute, self.owner, self.label)
        if info is None:
            return False
        scope.define(name, info)
        keys = self.keys
        rec = keys.interned.get(id(info)) or keys.intern(info)
        scope.kids[name] = rec[1]
        g.typed_by[name] = entry.described
        if name in g.declared:
            self._merge_declared(g, self.node_ctx(g, index, node, entry), name, info)
        g.produced.append(name)
        if g.records is not None:
            g.records.append((SOURCE_CONSTANT, entry.version))
        return True

    def _slow_node(self, g: Graph, index: int, node, entry: Entry, key: tuple | None,
                   inputs: list | None = None, outputs: list | None = None) -> None:
        """Type one node the memo could not: its rule, onnx's fallback, a body, a function.
        ``key`` (with the ``inputs`` and ``outputs`` the walk read) when the memo may keep the
        result; without one the inputs are checked to be defined first."""
        n = self.node_ctx(g, index, node, entry, inputs, outputs)
        outputs = n.outputs
        scope = g.scope
        if key is None:  # with a key every input was found already
            self._check_inputs_defined(g, n)
        contains = g.defined
        for name in outputs:
            if name and contains(name):
                self._redefined(g, index, node, name)
        kind = entry.kind
        diag_mark = len(self.diagnostics)
        log = self.owner.log
        log.clear()
        source = SOURCE_UNKNOWN
        report = self.raise_or_record
        if kind is K_RULE:  # the common case first
            if required_present(n, entry, report):
                source = SOURCE_RULE if self._run_rule(entry.rule, n) else SOURCE_FAILED
            else:
                source = SOURCE_FAILED
        elif kind is K_NO_OPSET:
            report(n.error("opset-import", f"domain {entry.domain or 'ai.onnx'!r} is not in the model's opset_import"))
        elif kind is K_CONSTANT:
            source = self._constant(n, entry)
        elif kind is K_FUNCTION:
            source = SOURCE_FUNCTION if self.functions.call(self, g, n, entry.function) else SOURCE_FAILED
        elif kind is K_UNKNOWN:
            unknown_op(n, entry, report, self.strict)
        elif not required_present(n, entry, report):
            source = SOURCE_FAILED
        elif kind is K_FALLBACK:
            source = self.fallback.run(entry.schema, n)
        else:  # K_CONTROL
            source = SOURCE_RULE if entry.handler(self, g, n) else SOURCE_FAILED
        ok = source in TYPED_SOURCES
        if ok and entry.folder is not None:
            fold(n, entry.folder)
        local = scope.local
        define = scope.define
        described = entry.described if source == entry.source else \
            describe(source, entry.domain, entry.op, entry.version) if source != SOURCE_UNKNOWN else SOURCE_UNKNOWN
        outs = []
        kids = scope.kids
        keys = self.keys
        interned = keys.interned
        typed_by = g.typed_by
        for name in outputs:
            if not name:
                outs.append(None)
                continue
            info = local(name)
            if info is None or not ok:
                info = UNKNOWN  # a failed node's outputs are unknown, whatever it set
                define(name, info)
            rec = interned.get(id(info)) or keys.intern(info)
            kids[name] = rec[1]
            outs.append((info, rec[1]))
            typed_by[name] = described
        # memoize a clean result (no diagnostics, tensor outputs only) on what the rule read
        if key is not None and ok and len(self.diagnostics) == diag_mark and not n.fresh \
                and not (scope.other and any(name and name in scope.other for name in outputs)):
            keys.memoize(scope, n.inputs, entry.memo, key, tuple(outs), log)
        log.clear()
        if g.declared:
            for name in outputs:
                if name and name in g.declared:
                    self._merge_declared(g, n, name, local(name))
        g.produced.extend(outputs)
        if g.records is not None:
            g.records.append((source, entry.version if source != SOURCE_UNKNOWN else None))

    def _check_inputs_defined(self, g: Graph, n: NodeContext) -> None:
        scope = g.scope
        for name in n.node.input:
            if name and name not in scope:
                later = next((j for j in range(n.index + 1, len(g.nodes)) if name in g.nodes[j].output), None)
                where = (f"it is produced later by node #{later} ({g.nodes[later].op_type}): "
                         "the graph is not topologically sorted") if later is not None else \
                    "no node, graph input or initializer produces it"
                self.raise_or_record(n.error("graph-order", f"input {name!r} is not defined before this node: {where}"))

    def _run_rule(self, rule, n: NodeContext) -> bool:
        try:
            rule(n.ctx, n)
            return True
        except InferenceError as e:
            if self.strict:
                raise
            self.diagnostics.append(e)
        except Exception as e:  # a bug in a rule must not take the whole pass down
            err = n.error("internal", f"rule for {n.node.op_type} v{n.version} crashed: {type(e).__name__}: {one_line(e)}")
            if self.strict:
                raise err from e
            self.diagnostics.append(err)
        return False

    def _constant(self, n: NodeCtx, entry: Entry) -> str:
        """Type (and value) of a Constant node; a malformed one goes to the Constant rule or onnx."""
        if len(n.node.output) == 1:
            info = constant_info(n.node.attribute, self.owner, self.label)
            if info is not None:
                n.ctx.set(n.node.output[0], info)
                return SOURCE_CONSTANT
        found = registry.lookup("", "Constant", entry.opset)
        schema = schema_for("", "Constant", entry.opset)
        if found is not None:
            n.version = found[1]
            return SOURCE_RULE if self._run_rule(found[0], n) else SOURCE_FAILED
        if schema is not None:
            return self.fallback.run(schema, n)
        return SOURCE_UNKNOWN

    # -- declared types
    def _merge_declared(self, g: Graph, n: NodeContext, name: str, inferred: TensorInfo) -> None:
        declared, is_output = g.declared[name]
        # only the main graph's output names are the model's contract; a body output's declared
        # symbols are usually another pass's placeholders (onnx's unk__N), the expression wins
        merged, conflict = merge_info(declared, inferred, prefer_declared_symbols=is_output and g.top)
        if conflict:
            kind = "graph output" if is_output else "value_info"
            err = n.error("output-type" if is_output else "value-info",
                          f"{kind} {name!r}: the declared type contradicts what the graph computes "
                          f"(the {conflict} differs)",
                          expected=f"{info_text(inferred)} (inferred)", found=f"{info_text(declared)} (declared)")
            self.raise_or_record(err)
            # the model's declared output type is its contract; a value_info is only a note
            keep = is_output and self.declared_outputs_win
            merged = TensorInfo(declared.elem_type, declared.shape, inferred.value) if keep else inferred
        if is_output:
            g.final_outputs[name] = merged
        if merged != inferred:
            g.scope.define(name, merged)
            g.scope.kids.pop(name, None)
            if not inferred.elem_type and merged.elem_type:
                g.typed_by[name] = SOURCE_DECLARED

    def _check_outputs_defined(self, g: Graph) -> None:
        for vo in g.proto.output:
            if vo.name not in g.scope:
                self.raise_or_record(InferenceError(
                    "graph-output", MODEL_NODE, f"graph output {vo.name!r} is not produced by any node, graph input or initializer"))

    # -- bodies (used by inference.subgraphs and inference.functions)
    def infer_body(self, proto: onnx.GraphProto, parent: Graph, inputs: list[TensorInfo | None], *,
                   label: str, attr: str, step: tuple | None, quiet: bool = False) -> Graph:
        """Infer a subgraph body that sees ``parent``'s values; ``step`` (node index,
        attribute, graph index) records it for the write-back. A ``quiet`` body (a branch
        that never runs) is typed but its problems are neither raised nor recorded; in a case
        run (``inference.case_split``) one the first run typed fully is that run's, not walked
        again (nothing of it could be merged, and the If reads no type of a branch not taken)."""
        if quiet and step is not None and self.first_bodies is not None:
            reused = self.first_bodies.settled((parent.where, step))
            if reused is not None:
                return reused
        strict = self.strict and not quiet
        scope = Scope(parent.scope.opsets, strict, self.diagnostics, parent.scope)
        where = f"{parent.where}/{label}/{attr}" if parent.where else f"{label}/{attr}"
        g = Graph(proto, scope, parent.dispatch, prefix=f"{parent.prefix}{label}/{attr}/", where=where)
        mark, split_mark = len(self.diagnostics), len(self.splits)
        saved, self.strict = self.strict, strict
        self.owner.strict = strict
        try:
            seed_body(g, inputs, self.keys, self.owner, self.label)
            self.walk(g)
        finally:
            self.strict = self.owner.strict = saved
            if quiet:  # a branch that never runs: neither its problems nor its Ifs are the model's
                del self.diagnostics[mark:]
                del self.splits[split_mark:]
        if step is not None:  # a later attempt (Loop state types widened) replaces an earlier one
            parent.children[step] = g
            self.result.subgraphs[(parent.where, step)] = g
        return g

    def body_outputs(self, g: Graph) -> list[tuple[TensorInfo, onnx.TypeProto | None]]:
        """Each body output's type: what the pass inferred, merged with the declaration."""
        out = []
        for vo in g.proto.output:
            info = g.final_outputs.get(vo.name) or g.scope.get(vo.name) or UNKNOWN
            other = g.scope.other_type(vo.name)
            out.append((info, other))
        return out

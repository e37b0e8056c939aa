"""Error classes: every error onnx-quant raises on purpose derives from QuantError.

Messages follow one shape so users and tools can read them alike:
``<rule>: node <node>: <subject>: expected <expected>, found <found>``.
"""

from __future__ import annotations


class QuantError(Exception):
    """Base of every error the project raises on purpose."""


class ModelLoadError(QuantError):
    """The input is not a readable ONNX model (missing path, not protobuf, truncated)."""


class InferenceError(QuantError):
    """A node violates a type/shape rule or a quantization-parameter rule.

    Attributes name the node, the rule and the input or attribute at fault so that
    diagnostics can be listed one per line.
    """

    def __init__(
        self,
        rule: str,
        node: str,
        message: str,
        *,
        subject: str | None = None,
        expected: str | None = None,
        found: str | None = None,
    ) -> None:
        self.rule = rule
        self.node = node
        self.subject = subject
        self.expected = expected
        self.found = found
        self.detail = message
        parts = [f"{rule}: node {node}"]
        if subject:
            parts.append(subject)
        text = message
        if expected is not None or found is not None:
            text = f"{message}: expected {expected}, found {found}" if message else f"expected {expected}, found {found}"
        parts.append(text)
        super().__init__(": ".join(p for p in parts if p))


class SpecError(QuantError):
    """A kernel spec is malformed: names the file, the field and the reason."""

    def __init__(self, file: str, field: str, reason: str) -> None:
        self.file = file
        self.field = field
        self.reason = reason
        super().__init__(f"{file}: {field}: {reason}")


class ExpressionError(QuantError):
    """A spec expression does not parse, names something unknown, or fails to evaluate."""


class DeviceError(QuantError):
    """No usable adapter, or wgpu rejected something; names kernel, variant and pass when known."""


class ExecutionError(QuantError):
    """A run cannot proceed: bad feeds, a tensor beyond device limits, an unsupported node."""


class ArgumentError(ExecutionError):
    """A command-line argument the model cannot take: malformed (``--input`` without ``=``, a
    ``--shape`` dim that is no integer), naming what the model does not have (an input, a
    symbolic dim), a file that cannot be read, or a feed or shape that contradicts the model
    (dtype, rank, fixed dims) or another argument. Found before any session is built; the CLI
    exits 2 (bad arguments)."""


class KernelRejected(ExecutionError):
    """A kernel (or every variant of it) declines a node: its dtypes, ranks, shapes or
    attributes are outside what the spec covers, or no variant's ``when`` holds. The session
    sends such a node to the host (or refuses it without fallback); a device limit exceeded
    by a variant that was chosen is a plain ExecutionError instead, never a rejection.

    ``node`` is the node's label, ``kernel`` the spec's name, ``clause`` the rule that
    declined it (a spec clause or a constraint, in words)."""

    def __init__(self, node: str, kernel: str, clause: str, *, where: str | None = None) -> None:
        self.node = node
        self.kernel = kernel
        self.clause = clause
        prefix = where if where is not None else (f"node {node!r}: kernel {kernel}" if node else f"kernel {kernel}")
        super().__init__(f"{prefix}: {clause}")

    @property
    def reason(self) -> str:
        """The message without the node's name (read beside it in fallback reports)."""
        text = str(self)
        prefix = f"node {self.node!r}: "
        return text[len(prefix):] if self.node and text.startswith(prefix) else text


class BudgetError(ExecutionError):
    """A host allocation (or upload) the model asks for is beyond the memory budget, or a size
    that cannot be an allocation (a negative dim): names the node or tensor, bytes and budget."""


class IndexRangeError(ExecutionError, IndexError):
    """A runtime index (a Gather / GatherElements / GatherND / Scatter* index, a label, a
    position id) outside the range its input allows, which ONNX makes an error: found by the
    kernel on the device (its per-run error buffer, read back with the outputs) or by the host
    run, before any output is returned. Also a builtin ``IndexError`` (``except IndexError``
    catches it). ``node``, ``input`` (the node's input, as named in the model), ``index`` and
    ``bound`` (the axis length: the range is [-bound, bound)) are set when the device found it;
    the CLI exits 2 (bad input)."""

    def __init__(self, message: str, *, node: str | None = None, input: str | None = None,
                 index: int | None = None, bound: int | None = None) -> None:
        self.node, self.input, self.index, self.bound = node, input, index, bound
        super().__init__(message)


class LoopLimitError(ExecutionError):
    """A kernel's loops would run past the adapter's per-invocation bound (llvmpipe stops an
    invocation after 65535 loop iterations; the specs' MAX_LOOP_ITERATIONS) for a runtime value
    no plan could see: RoiAlign's adaptive sampling grid (sampling_ratio 0), ceil(roi size /
    output size) a side, comes from the rois' values. Found by the kernel on the device (the
    run's error buffer, read back with the outputs: docs/backend.md "Index checks"), which skips
    the loops; the run returns no output. ``node``, ``input`` (as named in the model), ``index``
    (the input's row: the roi), ``grid`` (its loop grid, (h, w)), ``steps`` (the loop steps of an
    element: the grid's and its exit tests) and ``bound`` (the most an element may take). The
    CLI exits 1: the input is valid ONNX, the device cannot run it (the host can)."""

    def __init__(self, message: str, *, node: str | None = None, input: str | None = None,
                 index: int | None = None, grid: tuple[int, int] | None = None, steps: int | None = None,
                 bound: int | None = None) -> None:
        self.node, self.input, self.index, self.grid, self.steps, self.bound = node, input, index, grid, steps, bound
        super().__init__(message)


def in_context(cause: QuantError, text: str) -> ExecutionError:
    """``text`` (the cause's message with the outer node named) as an error of the cause's
    bad-input class where it has one (IndexRangeError, BudgetError: the CLI's exit 2), a
    LoopLimitError as one, else a plain ExecutionError: how a body session's (If / Loop / Scan,
    NonZero's region) error leaves it."""
    if isinstance(cause, IndexRangeError):
        return IndexRangeError(text, node=cause.node, input=cause.input, index=cause.index, bound=cause.bound)
    if isinstance(cause, LoopLimitError):
        return LoopLimitError(text, node=cause.node, input=cause.input, index=cause.index, grid=cause.grid,
                              steps=cause.steps, bound=cause.bound)
    return BudgetError(text) if isinstance(cause, BudgetError) else ExecutionError(text)


class QuantWarning(UserWarning):
    """Base of every warning onnx-quant issues on purpose."""


class HostFallbackWarning(QuantWarning):
    """Nodes of a model run on the host (onnx.reference) because no GPU kernel covers them."""

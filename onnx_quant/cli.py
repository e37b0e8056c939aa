"""The ``onnx-quant`` command line.

This module only parses arguments and turns errors into one line and an exit code;
each subcommand lives beside the code it drives (``inference.commands``,
``backend_wgpu.commands``) and is imported lazily so that ``infer``/``check`` never load wgpu.

Exit codes: 0 success; 1 the model has problems (``check``) or a run/conformance failed;
2 unusable input (missing file, not ONNX, bad arguments -- ``ArgumentError``: a malformed option,
a feed or shape the model cannot take --, beyond the memory budget, an index out of range).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from typing import Callable, Sequence

from onnx_quant.errors import (ArgumentError, BudgetError, HostFallbackWarning, IndexRangeError, ModelLoadError,
                               QuantError)

EXIT_OK, EXIT_PROBLEMS, EXIT_UNUSABLE = 0, 1, 2

# subcommand -> (module, function, help); the function takes the parsed args, returns an exit code
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "infer": ("onnx_quant.inference.commands", "cmd_infer", "infer dtype and shape of every value"),
    "check": ("onnx_quant.inference.commands", "cmd_check", "validate a model against the opset it claims"),
    "example": ("onnx_quant.inference.commands", "cmd_example", "write the built-in example model"),
    "devices": ("onnx_quant.backend_wgpu.commands", "cmd_devices", "list GPU adapters, features and limits"),
    "explain": ("onnx_quant.backend_wgpu.commands", "cmd_explain", "show the kernel, variant and passes per node"),
    "run": ("onnx_quant.backend_wgpu.commands", "cmd_run", "run a model on the GPU"),
    "bench": ("onnx_quant.backend_wgpu.commands", "cmd_bench", "benchmark kernels against numpy and onnxruntime"),
    "conformance": ("onnx_quant.backend_wgpu.commands", "cmd_conformance", "run ONNX node test cases on the GPU"),
    "demo": ("onnx_quant.backend_wgpu.commands", "cmd_demo", "build, infer and run a small quantized model"),
    "profile": ("onnx_quant.backend_wgpu.commands", "cmd_profile", "per-node device times of a model's runs, Chrome trace"),
    "tune": ("onnx_quant.backend_wgpu.commands", "cmd_tune",
             "time the variants and tunables each node may take, cache the fastest exact per adapter"),
    "cache": ("onnx_quant.cache_commands", "cmd_cache", "show or clear the on-disk caches (plans, WGSL, templates, tuning)"),
}

_ADAPTER_HELP = "adapter index or a substring of its name or backend (default: ONNX_QUANT_ADAPTER, else the best)"

# subcommand -> function adding its arguments; filled by _arguments below
_ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {}


def _arguments(name: str):
    def deco(fn):
        _ARGUMENTS[name] = fn
        return fn
    return deco


@_arguments("infer")
def _infer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="path to an .onnx file, or 'example' for the built-in example")
    p.add_argument("-o", "--output", help="write the model with inferred value_info here")
    p.add_argument("--strict", action="store_true", help="stop at the first violation")
    p.add_argument("--runtime", action="store_true",
                   help="type the graph outputs as the graph computes them, where a declaration contradicts it "
                        "(what a runtime allocates), instead of keeping the declared type")


@_arguments("check")
def _check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="path to an .onnx file, or 'example'")


@_arguments("example")
def _example_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", default="example.onnx", help="where to write the model")


@_arguments("devices")
def _devices_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")


def _model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="path to an .onnx file, or 'example' for the built-in example")


def _shape_args(p: argparse.ArgumentParser) -> None:
    """--shape and --dim: the input shapes of explain, run and profile (onnx_quant/feeds.py)."""
    from onnx_quant.feeds import DEFAULTS_TEXT  # noqa: PLC0415

    p.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="an input's whole shape, e.g. images=1,3,640,640 (repeatable); the symbolic dims "
                        "it binds take these values in every input")
    p.add_argument("--dim", action="append", default=[], metavar="SYMBOL=V",
                   help=f"a symbolic dim's value wherever it appears, e.g. N=1 (repeatable); {DEFAULTS_TEXT}")


def _feed_args(p: argparse.ArgumentParser, *, random_flag: bool) -> None:
    """--input, --random (run only: profile always feeds the rest at random) and --int-range."""
    from onnx_quant.feeds import DEFAULT_INT_RANGE, FLOAT_STD  # noqa: PLC0415

    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="feed this input from a .npy file of its dtype (repeatable)"
                        + ("" if random_flag else "; inputs without one are random"))
    if random_flag:
        p.add_argument("--random", action="store_true",
                       help=f"feed every input no --input gives at random: integers from [LO, HI) "
                            f"(--int-range), floats normal with std {FLOAT_STD:g}, bools 0/1; fixed seed")
    lo, hi = DEFAULT_INT_RANGE
    p.add_argument("--int-range", metavar="LO,HI",
                   help=f"random integers are drawn from [LO, HI), within the dtype's range (default {lo},{hi})")


@_arguments("explain")
def _explain_args(p: argparse.ArgumentParser) -> None:
    _model_arg(p)
    p.add_argument("--json", action="store_true")
    _shape_args(p)
    p.add_argument("--adapter", help=_ADAPTER_HELP)


@_arguments("run")
def _run_args(p: argparse.ArgumentParser) -> None:
    _model_arg(p)
    _feed_args(p, random_flag=True)
    _shape_args(p)
    p.add_argument("-o", "--output-dir", help="write outputs as .npy files here")
    p.add_argument("--compare", nargs="?", const="auto", choices=["auto", "onnxruntime", "reference"],
                   help="compare the outputs with an oracle run on the model as given: auto (the default "
                        "when no value is given) is onnxruntime CPU, with its int8 weights widened to uint8 "
                        "on CPUs where its uint8 x int8 sums saturate (AVX2 without VNNI); onnxruntime as "
                        "written; reference: onnx.reference with the com.microsoft ops")
    p.add_argument("--rtol", type=float, default=1e-3,
                   help="with --compare: float outputs agree within this fraction of the largest expected "
                        "magnitude (integer outputs must be identical; default 1e-3)")
    p.add_argument("--adapter")


@_arguments("profile")
def _profile_args(p: argparse.ArgumentParser) -> None:
    _model_arg(p)
    p.add_argument("--runs", type=int, default=3, help="profiled runs after one warm-up run (default 3)")
    p.add_argument("--trace", metavar="FILE.json", help="write a Chrome-trace / Perfetto JSON file (full node names)")
    _feed_args(p, random_flag=False)
    _shape_args(p)
    p.add_argument("--clock", choices=["auto", "device", "host-wall"], default="auto",
                   help="device timestamps (timestamp-query) or host wall clock per node")
    p.add_argument("--top", type=int, help="show only the N slowest nodes (a line counts the others)")
    p.add_argument("--json", action="store_true", help="print the table as JSON (full node names)")
    p.add_argument("--adapter", help=_ADAPTER_HELP)


@_arguments("tune")
def _tune_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help="path to an .onnx file, or 'example' (not needed with --clear)")
    _feed_args(p, random_flag=False)
    _shape_args(p)
    p.add_argument("--repeats", type=int, default=4, help="profiled runs per candidate and pass (default 4)")
    p.add_argument("--passes", type=int, default=3,
                   help="passes over every candidate in turn; each candidate keeps its fastest (default 3)")
    p.add_argument("--force", action="store_true", help="measure again what the cache already holds")
    p.add_argument("--clear", action="store_true", help="remove every adapter's tuning table, then exit")
    p.add_argument("--json", action="store_true")
    p.add_argument("--adapter")


@_arguments("bench")
def _bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default="12,16,20,24", help="comma-separated log2 element counts")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.add_argument("--adapter")


@_arguments("conformance")
def _conformance_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")
    p.add_argument("--adapter")
    p.add_argument("--ops", metavar="OP[,OP...]", help="only the cases of these op types (e.g. QuantizeLinear,QLinearConv)")
    p.add_argument("--suite", choices=("family", "all"), default="family",
                   help="family: the quantization family's cases, one row each (default); all: ONNX's whole "
                        "node suite, a table per op (pass / wrong / declined / no kernel) beside onnxruntime CPU")
    p.add_argument("--no-onnxruntime", action="store_true", help="--suite all: skip the onnxruntime CPU column")


@_arguments("demo")
def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--adapter")


@_arguments("cache")
def _cache_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["info", "clear"], help="info: where the caches are and what they hold; "
                   "clear: remove them (every version; the downloaded model wheels stay)")
    p.add_argument("--kind", help="clear only this cache (a folder name 'cache info' lists: plans, jinja, ...)")
    p.add_argument("--json", action="store_true")


#: options many subcommands share: the help an option gets where its subcommand gives none
_COMMON_HELP = {
    "adapter": _ADAPTER_HELP,
    "json": "print JSON instead of text",
    "model": "path to an .onnx file, or 'example' for the built-in example",
}


def _fill_common_help(p: argparse.ArgumentParser) -> None:
    """Give the shared options of ``p`` that have no help their common one (``p._actions`` is
    argparse's list of a parser's options; it has no public accessor)."""
    for action in p._actions:
        if action.help is None and action.dest in _COMMON_HELP:
            action.help = _COMMON_HELP[action.dest]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onnx-quant", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, _, help_text) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        _ARGUMENTS.get(name, lambda _p: None)(p)
        _fill_common_help(p)
    return parser


#: subcommands whose warnings print as one line each on stderr (``onnx-quant CMD: warning: ...``)
#: once the command is done, never as Python's two-line form; the categories given are left out
#: because the command's own output already says the same (explain lists host nodes with why)
_ONE_LINE_WARNINGS: dict[str, tuple[type[Warning], ...]] = {
    "explain": (HostFallbackWarning,), "run": (), "profile": (), "tune": (),
}


def _print_warnings(command: str, caught: Sequence[warnings.WarningMessage]) -> None:
    """One line per distinct warning, in the order they came."""
    skip = _ONE_LINE_WARNINGS.get(command, ()) + (DeprecationWarning, PendingDeprecationWarning)  # for developers
    seen: set[str] = set()
    for w in caught:
        if issubclass(w.category, skip):
            continue
        text = " ".join(str(w.message).split())
        if text not in seen:
            seen.add(text)
            print(f"onnx-quant {command}: warning: {text}", file=sys.stderr)


def _call(command: str, handler: Callable, args: argparse.Namespace) -> int:
    """Run a subcommand; for those in ``_ONE_LINE_WARNINGS`` its warnings are caught and printed
    as one line each once it returns (dropped when it fails: its error is the one line then)."""
    if command not in _ONE_LINE_WARNINGS:
        return int(handler(args) or 0)
    with warnings.catch_warnings(record=True) as caught:  # the filters in force decide what is recorded
        code = int(handler(args) or 0)
    _print_warnings(command, caught)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    module_name, func_name, _ = _COMMANDS[args.command]
    try:
        handler = getattr(importlib.import_module(module_name), func_name)
        return _call(args.command, handler, args)
    except (ModelLoadError, BudgetError, ArgumentError, IndexRangeError) as e:  # input unusable, beyond the
        # memory budget, bad arguments, a feed whose index is out of range
        if debug:
            raise
        print(f"onnx-quant {args.command}: error: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    except QuantError as e:
        if debug:
            raise
        print(f"onnx-quant {args.command}: error: {e}", file=sys.stderr)
        return EXIT_PROBLEMS
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # never a bare traceback
        if debug:
            raise
        print(f"onnx-quant {args.command}: internal error: {type(e).__name__}: {e} (rerun with --debug for a traceback)", file=sys.stderr)
        return 3

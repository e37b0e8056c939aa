"""Loading a model, with one clear line for every way the input can be unusable."""

from __future__ import annotations

import os
import stat
from pathlib import Path, PureWindowsPath
from typing import Any, Union

import onnx
from google.protobuf.message import DecodeError

from onnx_quant.errors import BudgetError, ModelLoadError, QuantError

#: The model argument that names the built-in example instead of a file.
EXAMPLE_NAME = "example"

ModelSource = Union[str, os.PathLike, bytes, bytearray, memoryview, onnx.ModelProto]


#: protobuf cannot parse a message over 2 GiB: a bigger file is refused before it is read
MAX_MODEL_FILE_BYTES = 2**31


def load_model(source: ModelSource, *, load_external_data: bool = False, check_external: bool = True,
               base_dir: str | os.PathLike | None = None, budget: Any = None) -> onnx.ModelProto:
    """Read an ONNX model from a path, serialized bytes or a ModelProto.

    The name ``"example"`` gives the built-in example model. Raises ``ModelLoadError`` (one
    line naming the input) for a missing path, anything but a regular file (a directory, a
    FIFO, a device), a file beyond ``MAX_MODEL_FILE_BYTES`` or the memory budget (checked
    before reading), an unreadable file or folder, an empty file, a file that is not an ONNX
    protobuf (text, truncated), or a model without a graph or opset imports.
    A ``ModelProto`` is returned as is (not copied) once it passes the same checks.

    External data is never read unless ``load_external_data``; either way a tensor whose
    external ``location`` escapes the model's folder (an absolute path, or ``..`` leading
    out) is refused (``ModelLoadError`` naming the tensor): see :func:`check_external_data`.
    The folder is the model file's; for bytes or a ModelProto it is ``base_dir``, and without
    one, loading external data is refused naming the tensor (never the current directory).
    ``check_external=False`` leaves the location check to the caller (the inference pass makes
    it while it reads the initializers anyway).
    """
    from onnx_quant.budget import resolve  # noqa: PLC0415

    # the default budget reads /proc/meminfo: only a file or external data needs it, not the
    # ModelProto that every inference pass is handed (an argument is still checked at once)
    budget = None if budget is None else resolve(budget)
    if isinstance(source, onnx.ModelProto):
        model, label, folder = source, "<ModelProto>", base_dir
        _check_parsed(model, label)
    elif isinstance(source, (bytes, bytearray, memoryview)):
        model, label, folder = _parse(bytes(source), "<bytes>"), "<bytes>", base_dir
    elif not isinstance(source, (str, os.PathLike)):
        raise ModelLoadError(f"cannot load a model from a {type(source).__name__}: expected a path, bytes or onnx.ModelProto")
    elif isinstance(source, str) and source == EXAMPLE_NAME:
        from onnx_quant.examples import example_model

        return example_model()
    else:
        label = str(source)
        model = _parse(_read_regular_file(Path(source), label, min(MAX_MODEL_FILE_BYTES, (budget or resolve()).limit)), label)
        folder = Path(source).parent
    if check_external or load_external_data:
        check_external_data(model, label)
    if load_external_data and external_tensors(model):
        if model is source:  # the caller's proto stays as given
            model = onnx.ModelProto()
            model.CopyFrom(source)
        load_external(model, folder, label, budget or resolve())
    return model


def _read_regular_file(path: Path, label: str, cap: int) -> bytes:
    """The bytes of a regular file of at most ``cap`` bytes; opened without blocking (a FIFO
    swapped in after the check cannot hang the open) and checked again once open."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ModelLoadError(f"{label}: no such file") from None
    except OSError as e:
        raise ModelLoadError(f"{label}: cannot access: {e.strerror or e}") from None
    _require_regular(st.st_mode, label, "an .onnx file")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise ModelLoadError(f"{label}: cannot read: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        _require_regular(st.st_mode, label, "an .onnx file")
        if st.st_size > cap:
            raise ModelLoadError(f"{label}: file of {st.st_size} bytes: expected at most {cap} bytes "
                                 f"(protobuf's 2 GiB limit or the memory budget)")
        try:
            return f.read(cap + 1)[:cap]
        except OSError as e:
            raise ModelLoadError(f"{label}: cannot read: {e.strerror or e}") from None


def _require_regular(mode: int, label: str, expected: str) -> None:
    if stat.S_ISREG(mode):
        return
    kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
    raise ModelLoadError(f"{label}: is {kind}: expected {expected} (a regular file)")


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The main graph's tensors whose data lives in external files."""
    found = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    for st in model.graph.sparse_initializer:
        found += [t for t in (st.values, st.indices) if t.data_location == onnx.TensorProto.EXTERNAL]
    return found


def load_external(model: onnx.ModelProto, folder: str | os.PathLike | None, label: str, budget: Any) -> None:
    """Read every external tensor's data from ``folder`` into the model, once
    :func:`check_external_files` accepts them."""
    root = check_external_files(model, folder, label, budget)
    if root is None:
        return
    try:
        onnx.external_data_helper.load_external_data_for_model(model, root)
    except MemoryError:  # the budget allowed it, the machine did not (a limit the budget could not see)
        total = sum(int(next((e.value for e in t.external_data if e.key == "length"), 0) or 0)
                    for t in external_tensors(model))
        raise BudgetError(f"{label}: external data of tensor(s) {', '.join(repr(t.name) for t in external_tensors(model))}: "
                          f"{total} bytes could not be allocated (memory budget {budget.limit} bytes; set "
                          f"ONNX_QUANT_MEMORY_BUDGET lower)") from None
    except (OSError, ValueError, onnx.checker.ValidationError) as e:
        raise ModelLoadError(f"{label}: cannot load external data: {_first_line(e)}") from None


def check_external_files(model: onnx.ModelProto, folder: str | os.PathLike | None, label: str,
                         budget: Any) -> str | None:
    """Check, without opening them, the files of every external tensor: inside ``folder`` once
    symlinks are resolved, a regular file holding the bytes the tensor names, the total within
    ``budget``. ``folder`` None (a model given in memory without ``base_dir``): refused, naming
    the tensor. Returns the resolved folder (None when no tensor is external)."""
    tensors = external_tensors(model)
    if not tensors:
        return None
    if folder is None:
        raise ModelLoadError(f"{label}: external data of tensor {tensors[0].name!r}: the model was given in memory, "
                             f"so its folder is unknown: expected base_dir= naming the folder that holds "
                             f"{_location(tensors[0])!r}, found none (the current directory is never used)")
    root = os.path.realpath(folder)
    total = 0
    for t in tensors:
        what = f"{label}: external data of tensor {t.name!r}"
        target = os.path.realpath(os.path.join(root, _location(t)))
        if os.path.commonpath([root, target]) != root:
            raise ModelLoadError(f"{what} points outside the model's folder: expected a file inside {root}, "
                                 f"found a link to {target}")
        try:
            st = os.stat(target)
        except OSError as e:
            raise ModelLoadError(f"{what}: cannot access {_location(t)!r}: {e.strerror or e}") from None
        _require_regular(st.st_mode, what, f"a data file {_location(t)!r}")
        entries = {e.key: e.value for e in t.external_data}
        try:
            offset = int(entries.get("offset", 0))
            length = int(entries["length"]) if "length" in entries else st.st_size - offset
        except ValueError:
            raise ModelLoadError(f"{what}: offset/length are not integers: found {entries}") from None
        if offset < 0 or length < 0 or offset + length > st.st_size:
            raise ModelLoadError(f"{what}: expected bytes {offset}..{offset + length} of {_location(t)!r}, "
                                 f"found a file of {st.st_size} bytes")
        total += length
        budget.check(total, f"{what} (with the tensors before it)")
    return root


def _location(t: onnx.TensorProto) -> str:
    return next((e.value for e in t.external_data if e.key == "location"), "")


def initializer_arrays(model: onnx.ModelProto, budget: Any) -> dict[str, Any]:
    """Name -> numpy array of every main-graph initializer, each checked against ``budget``
    before it is decoded; data that does not fill its dims is an error naming the tensor."""
    from onnx import numpy_helper  # noqa: PLC0415

    from onnx_quant.dtypes import element_type  # noqa: PLC0415

    arrays = {}
    for t in model.graph.initializer:
        what = f"initializer {t.name!r}"
        try:
            bits = element_type(t.data_type).bits
        except QuantError:
            bits = 64  # a type without a table entry (string): decoding reports it below
        budget.check_array(t.dims, max(8, bits), what)
        try:
            arrays[t.name] = numpy_helper.to_array(t)
        except MemoryError:
            raise BudgetError(f"{what} (shape {list(t.dims)}): could not be allocated (memory budget "
                              f"{budget.limit} bytes; set ONNX_QUANT_MEMORY_BUDGET lower)") from None
        except Exception as e:  # numpy's reshape error does not say which tensor
            raise ModelLoadError(f"{what}: its data does not fill dims {list(t.dims)}: {_first_line(e)}") from None
    return arrays


def check_external_data(model: onnx.ModelProto, label: str = "<model>") -> None:
    """Refuse initializers whose external data would be read from outside the model's folder.

    Only the main graph's initializers are scanned here (cheap: one field per tensor); the
    inference pass applies :func:`check_external_location` to the tensors it meets inside
    subgraphs and ``Constant`` nodes."""
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            check_external_location(t, label)
    for st in model.graph.sparse_initializer:
        for t in (st.values, st.indices):
            if t.data_location == onnx.TensorProto.EXTERNAL:
                check_external_location(t, label)


def check_external_location(tensor: onnx.TensorProto, label: str = "<model>") -> None:
    """``ModelLoadError`` unless ``tensor``'s external ``location`` is a relative path that
    stays inside the model's folder."""
    entries = {e.key: e.value for e in tensor.external_data}
    location = entries.get("location")
    what = f"{label}: external data of tensor {tensor.name!r}"
    if not location:
        raise ModelLoadError(f"{what} has no location: expected a file name relative to the model, found none")
    unified = location.replace("\\", "/")
    if unified.startswith("/") or PureWindowsPath(location).drive or PureWindowsPath(location).root:
        raise ModelLoadError(f"{what} points outside the model's folder: expected a relative path, "
                             f"found the absolute path {location!r}")
    depth = 0
    for part in unified.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                raise ModelLoadError(f"{what} points outside the model's folder: expected a path inside it, "
                                     f"found {location!r}")
        elif part not in ("", "."):
            depth += 1


def _parse(data: bytes, label: str) -> onnx.ModelProto:
    if not data:
        raise ModelLoadError(f"{label}: empty file, not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError:
        if _looks_like_text(data):
            raise ModelLoadError(f"{label}: not an ONNX model (looks like a text file, expected a binary protobuf)") from None
        raise ModelLoadError(f"{label}: not an ONNX model (protobuf does not parse: truncated, corrupt, or nested deeper than protobuf's 100-level limit)") from None
    _check_parsed(model, label)
    return model


def _check_parsed(model: onnx.ModelProto, label: str) -> None:
    # protobuf happily parses a prefix cut at a field boundary; these catch what it lets through
    if not model.HasField("graph"):
        raise ModelLoadError(f"{label}: not an ONNX model (no graph)")
    if model.ir_version >= 3 and not model.opset_import:
        raise ModelLoadError(f"{label}: ONNX model declares no opset_import (truncated file?)")


def _looks_like_text(data: bytes) -> bool:
    head = data[:512]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 3:  # only a character cut by the 512-byte window is forgiven
            return False
        text = head[: e.start].decode("utf-8")
    return all(ch.isprintable() or ch in "\r\n\t" for ch in text)


def _first_line(e: BaseException) -> str:
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    return lines[0] if lines else type(e).__name__

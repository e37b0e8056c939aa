"""Loading a model, with one clear line for every way the input can be unusable."""

from __future__ import annotations

import os
from pathlib import Path, PureWindowsPath
from typing import Union

import onnx
from google.protobuf.message import DecodeError

from onnx_quant.errors import ModelLoadError

#: The model argument that names the built-in example instead of a file.
EXAMPLE_NAME = "example"

ModelSource = Union[str, os.PathLike, bytes, bytearray, memoryview, onnx.ModelProto]


def load_model(source: ModelSource, *, load_external_data: bool = False,
               check_external: bool = True) -> onnx.ModelProto:
    """Read an ONNX model from a path, serialized bytes or a ModelProto.

    The name ``"example"`` gives the built-in example model. Raises ``ModelLoadError`` (one
    line naming the input) for a missing path, a directory, an empty file, a file that is not
    an ONNX protobuf (text, truncated), or a model without a graph or opset imports.
    A ``ModelProto`` is returned as is (not copied) once it passes the same checks.

    External data is never read unless ``load_external_data``; either way a tensor whose
    external ``location`` escapes the model's folder (an absolute path, or ``..`` leading
    out) is refused (``ModelLoadError`` naming the tensor): see :func:`check_external_data`.
    ``check_external=False`` leaves that check to the caller (the inference pass makes it
    while it reads the initializers anyway).
    """
    if isinstance(source, onnx.ModelProto):
        _check_parsed(source, "<ModelProto>")
        if check_external:
            check_external_data(source, "<ModelProto>")
        return source
    if isinstance(source, (bytes, bytearray, memoryview)):
        model = _parse(bytes(source), "<bytes>")
        if check_external:
            check_external_data(model, "<bytes>")
        return model
    if not isinstance(source, (str, os.PathLike)):
        raise ModelLoadError(f"cannot load a model from a {type(source).__name__}: expected a path, bytes or onnx.ModelProto")
    if isinstance(source, str) and source == EXAMPLE_NAME:
        from onnx_quant.examples import example_model

        return example_model()
    path = Path(source)
    label = str(source)
    if not path.exists():
        raise ModelLoadError(f"{label}: no such file")
    if path.is_dir():
        raise ModelLoadError(f"{label}: is a directory, not an .onnx file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModelLoadError(f"{label}: cannot read: {e.strerror or e}") from None
    model = _parse(data, label)
    if check_external or load_external_data:
        check_external_data(model, label)
    if load_external_data:
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
        except (OSError, ValueError, onnx.checker.ValidationError) as e:
            raise ModelLoadError(f"{label}: cannot load external data: {_first_line(e)}") from None
    return model


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
        raise ModelLoadError(f"{label}: not an ONNX model (protobuf does not parse: truncated or corrupt)") from None
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

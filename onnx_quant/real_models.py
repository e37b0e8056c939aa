"""Real exported models from pinned PyPI wheels, and their onnxruntime-quantized forms.

Two wheels ship ONNX models their packages run: ``silero-vad`` (``silero_vad/data/*.onnx``:
LSTM voice-activity models exported by torch.onnx and spox, opsets 15-18, If-heavy state
handling, one "half" export) and ``ddddocr`` (a CRNN captcha recogniser with an LSTM, an older
copy of it that its authors quantized dynamically, and a YOLOX-style detector).

:func:`fetch_wheel` runs ``pip download --no-deps --only-binary=:all: <name>==<version>`` into
a cache folder (``~/.cache/onnx-quant/wheels``; ``ONNX_QUANT_MODEL_CACHE`` moves it), checks
the wheel's size and sha256 against the pins below, and extracts its ``.onnx`` members beside
it. Later calls read the cache and never start pip. :func:`load` gives a model in a form:
``float`` (as shipped), or quantized by ``onnxruntime.quantization`` (``dynamic``, and ``qdq``
/ ``qoperator`` calibrated on :func:`feeds`), each cached as a file keyed by the onnxruntime
version that made it.

This module ships in the package (like :mod:`model_zoo` and :mod:`exported_models`) so the
benchmarks and users can reach the same models; it needs pip to fetch and onnxruntime to
quantize, both test dependencies, imported only when called.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np
import onnx

from onnx_quant.errors import QuantError

#: above this a wheel is not worth a test tier's download (the brief's bound, checked on the file)
MAX_WHEEL_BYTES = 100 * 1024 * 1024


class ModelFetchError(QuantError):
    """A pinned wheel could not be downloaded, or is not the pinned file (size, sha256, members)."""


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel: ``pip download`` name and version, the file's sha256 and size."""

    name: str
    version: str
    sha256: str
    size: int
    filename: str

    @property
    def folder(self) -> str:
        """The cache folder its members are extracted to."""
        return f"{self.name}-{self.version}"


WHEELS = {
    "silero-vad": Wheel("silero-vad", "6.2.3", "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
                        11317527, "silero_vad-6.2.3-py3-none-any.whl"),
    "ddddocr": Wheel("ddddocr", "1.6.1", "c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935",
                     75983593, "ddddocr-1.6.1-py3-none-any.whl"),
}


@dataclass(frozen=True)
class RealModel:
    """A model inside a wheel: where it is, the input shapes it runs at, the forms under test.

    ``shapes``: concrete input shapes (the sizes the package feeds it: silero-vad 512 samples of
    16 kHz audio plus its 64-sample context, ddddocr a 64-pixel-high grey image).
    ``forms``: ``float`` is the model as shipped; the rest are made by :func:`quantize`.
    ``gpu``: whether the test tier runs it on the GPU (the 416x416 detector takes ~25 s on a
    CPU Vulkan adapter, so only its float form does)."""

    wheel: str
    member: str
    shapes: Mapping[str, tuple[int, ...]]
    forms: tuple[str, ...] = ("float",)
    gpu_forms: tuple[str, ...] = field(default=None)  # type: ignore[assignment]

    def runs_on_gpu(self, form: str) -> bool:
        return form in (self.forms if self.gpu_forms is None else self.gpu_forms)


_VAD = {"input": (1, 576), "state": (2, 1, 128), "sr": ()}
_VAD_NO_SR = {"input": (1, 576), "state": (2, 1, 128)}
_OCR = {"input1": (1, 1, 64, 64)}
MODELS: dict[str, RealModel] = {
    # spox export, opset 16: the whole model is one If on sr (16 kHz / 8 kHz branches)
    "silero_vad": RealModel("silero-vad", "silero_vad/data/silero_vad.onnx", _VAD, ("float", "dynamic")),
    "silero_vad_op15": RealModel("silero-vad", "silero_vad/data/silero_vad_16k_op15.onnx", _VAD,
                                 ("float", "dynamic", "qdq", "qoperator")),
    "silero_vad_half": RealModel("silero-vad", "silero_vad/data/silero_vad_half.onnx", _VAD_NO_SR),
    "silero_vad_ifless": RealModel("silero-vad", "silero_vad/data/silero_vad_op18_ifless.onnx", _VAD,
                                   ("float", "dynamic")),
    "silero_vad_sequence": RealModel("silero-vad", "silero_vad/data/silero_vad_16k_sequence.onnx",
                                     {"input": (3, 576), "h": (1, 1, 128), "c": (1, 1, 128)},
                                     ("float", "dynamic", "qdq", "qoperator")),
    "silero_vad_openvino": RealModel("silero-vad", "silero_vad/data/silero_vad_openvino_16k.onnx", _VAD_NO_SR),
    "ddddocr_ocr": RealModel("ddddocr", "ddddocr/common.onnx", _OCR, ("float", "dynamic", "qdq", "qoperator")),
    # shipped already quantized by its authors (onnx.quantize 0.1.0: ConvInteger, DynamicQuantizeLSTM)
    "ddddocr_ocr_old": RealModel("ddddocr", "ddddocr/common_old.onnx", _OCR),
    "ddddocr_det": RealModel("ddddocr", "ddddocr/common_det.onnx", {"images": (1, 3, 416, 416)},
                             ("float", "dynamic", "qdq"), gpu_forms=("float",)),
}
#: every (model, form) of the tier
CASES = [(name, form) for name, m in MODELS.items() for form in m.forms]


def cache_dir() -> Path:
    """``ONNX_QUANT_MODEL_CACHE`` or ``~/.cache/onnx-quant/wheels``."""
    return Path(os.environ.get("ONNX_QUANT_MODEL_CACHE") or Path.home() / ".cache" / "onnx-quant" / "wheels")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _pip_download(wheel: Wheel, dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
           "--disable-pip-version-check", f"{wheel.name}=={wheel.version}", "-d", str(dest)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ModelFetchError(f"pip download {wheel.name}=={wheel.version}: {e}") from e
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise ModelFetchError(f"pip download {wheel.name}=={wheel.version} failed (exit {done.returncode}): {tail}")


def _verify(wheel: Wheel, path: Path) -> None:
    """The file is the pinned wheel, or it is removed and the error says what it was."""
    size = path.stat().st_size
    digest = _sha256(path) if size == wheel.size else None
    if size != wheel.size or digest != wheel.sha256:
        path.unlink()
        raise ModelFetchError(
            f"{path.name}: not the pinned {wheel.name}=={wheel.version}: expected {wheel.size} bytes, "
            f"sha256 {wheel.sha256}, found {size} bytes" + (f", sha256 {digest}" if digest else "") + " (removed)")


def fetch_wheel(wheel: Wheel | str, cache: str | os.PathLike | None = None) -> Path:
    """The folder holding ``wheel``'s extracted ``.onnx`` members, downloading and verifying
    the wheel first if the cache does not hold it yet."""
    wheel = WHEELS[wheel] if isinstance(wheel, str) else wheel
    root = Path(cache) if cache is not None else cache_dir()
    return _fetched(wheel, root.resolve())


@functools.lru_cache(maxsize=None)
def _fetched(wheel: Wheel, root: Path) -> Path:
    out = root / wheel.folder
    stamp = out / ".sha256"
    if stamp.is_file() and stamp.read_text().strip() == wheel.sha256:
        return out  # extracted from the verified wheel by an earlier call
    root.mkdir(parents=True, exist_ok=True)
    path = root / wheel.filename
    if not path.is_file():
        _pip_download(wheel, root)
        if not path.is_file():
            raise ModelFetchError(f"pip download {wheel.name}=={wheel.version} did not write {wheel.filename} "
                                  f"into {root}")
    if wheel.size > MAX_WHEEL_BYTES:
        raise ModelFetchError(f"{wheel.filename}: {wheel.size} bytes, over the {MAX_WHEEL_BYTES} byte bound")
    _verify(wheel, path)
    with zipfile.ZipFile(path) as z:
        members = [m for m in z.namelist() if m.endswith(".onnx")]
        if not members:
            raise ModelFetchError(f"{wheel.filename}: no .onnx members")
        for m in members:
            if m.startswith("/") or ".." in Path(m).parts:
                raise ModelFetchError(f"{wheel.filename}: member {m!r} leaves the extraction folder")
            z.extract(m, out)
    stamp.write_text(wheel.sha256 + "\n")
    return out


def path_of(name: str, cache: str | os.PathLike | None = None) -> Path:
    """The shipped file of model ``name`` (fetched if needed)."""
    m = MODELS[name]
    return fetch_wheel(m.wheel, cache) / m.member


def feeds(name: str, *, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs model ``name`` accepts at its :attr:`RealModel.shapes`: audio as quiet noise
    (amplitude ~0.1) with a small random LSTM state and ``sr`` = 16000 for silero-vad; an image
    normalised to [-1, 1] as ddddocr feeds it (``(x / 255 - 0.5) / 0.5``)."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for key, shape in MODELS[name].shapes.items():
        if key == "sr":
            out[key] = np.array(16000, dtype=np.int64)
        elif key == "input":
            out[key] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif key in ("state", "h", "c"):
            out[key] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[key] = rng.uniform(-1.0, 1.0, shape).astype(np.float32)
    return out


def quantize(name: str, form: str, cache: str | os.PathLike | None = None) -> Path:
    """The file of model ``name`` quantized by ``onnxruntime.quantization`` in ``form``
    (``model_zoo.run_quantizer``: int8 weights, uint8 activations; static forms calibrated
    on two :func:`feeds`), made once per onnxruntime version and cached beside the wheel's members."""
    import onnxruntime  # noqa: PLC0415

    from onnx_quant import model_zoo  # noqa: PLC0415
    from onnx_quant.exported_models import fix_inputs  # noqa: PLC0415

    src = path_of(name, cache)
    dst = fetch_wheel(MODELS[name].wheel, cache) / "quantized" / f"{name}-{form}-ort{onnxruntime.__version__}.onnx"
    if dst.is_file():
        return dst
    model = onnx.load(src)
    calibration = [] if form == "dynamic" else [feeds(name, seed=100 + i) for i in range(2)]
    quantized = model_zoo.run_quantizer(model, fix_inputs(model, MODELS[name].shapes), calibration, form)
    sort_nodes(quantized.graph)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(".tmp")
    onnx.save(quantized, tmp)
    os.replace(tmp, dst)  # a crash mid-write never leaves a truncated model in the cache
    return dst


def _reads(node: onnx.NodeProto) -> set[str]:
    """Every name ``node`` reads, its subgraphs' outer-scope references included."""
    names = {i for i in node.input if i}
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            local = {i.name for i in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                names |= _reads(n) - local
                local |= set(n.output)
    return names


def sort_nodes(graph: onnx.GraphProto) -> None:
    """Order ``graph``'s nodes so every value is made before it is read, counting what If/Loop
    bodies read from the enclosing graph. onnxruntime's quantizer (1.32) sorts by explicit
    inputs only and moves silero-vad's ``If_1`` before the ``If`` whose output its branches
    read, a model onnx's checker rejects; the order is otherwise kept."""
    nodes = list(graph.node)
    made = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    produced = {o for n in nodes for o in n.output}
    reads = [_reads(n) & produced for n in nodes]
    ordered: list[onnx.NodeProto] = []
    waiting = list(range(len(nodes)))
    while waiting:
        first = next((i for i in waiting if reads[i] <= made), None)  # the earliest ready node
        if first is None:
            raise ModelFetchError(f"graph {graph.name!r}: a cycle among {len(waiting)} nodes")
        ordered.append(nodes[first])
        made |= set(nodes[first].output)
        waiting.remove(first)
    del graph.node[:]
    graph.node.extend(ordered)


def load(name: str, form: str = "float", cache: str | os.PathLike | None = None) -> onnx.ModelProto:
    """Model ``name`` in ``form`` (``float``: as shipped)."""
    if form not in MODELS[name].forms:
        raise ValueError(f"{name}: form {form!r} is not one of {', '.join(MODELS[name].forms)}")
    return onnx.load(path_of(name, cache) if form == "float" else quantize(name, form, cache))

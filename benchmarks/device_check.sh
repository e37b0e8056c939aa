#!/usr/bin/env bash
# The one-shot device benchmark (docs/benchmarks.md, "Device check"): unpacks what the device
# machine lacks from .device-carry/ (made here by scripts/fetch-device-carry), prints the adapter
# wgpu picks, then runs benchmarks/device_check.py: every model tier through this project,
# onnxruntime CPU, onnxruntime's WebGPU EP, tinygrad and torch, each checked against its oracle,
# plus the roofline; JSON + markdown + PNG under $OUT (else out/device_check).
#
#   benchmarks/device_check.sh [--smoke] [--budget SECONDS] [--out DIR]
#
# --smoke: the same code on a few small models at batch 1 and 2, on whatever adapter is here
# (lavapipe in CI), with the peers that are installed; about 30 s (150 s at most). Without it the parts share
# 450 s, so the whole command ends inside 8 minutes. Exit 0 when every case this project ran
# agrees with its oracle.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${DEVICE_CHECK_PYTHON:-python3}"  # not PYTHON: tinygrad reads that as a device flag
CARRY="${DEVICE_CARRY:-.device-carry}"
TMP="${TMPDIR:-/tmp}"
smoke=0
for a in "$@"; do [ "$a" = "--smoke" ] && smoke=1; done

pip_target() {  # pip_target DIR WHEEL...: unpack wheels, no index, no dependencies resolved
  local dir="$1"; shift
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$dir" "$@"
}

# 1. where the interpreter has no wgpu: wgpu and its cffi / pycparser / rendercanvas, tinygrad, onnx2torch
if ! "$PY" -c "import wgpu" >/dev/null 2>&1 && ls "$CARRY"/wheels/*.whl >/dev/null 2>&1; then
  echo "device_check: unpacking $(ls "$CARRY"/wheels/*.whl | wc -l) wheels into $TMP/device-check-site"
  pip_target "$TMP/device-check-site" "$CARRY"/wheels/*.whl || echo "device_check: wheel install failed"
  export PYTHONPATH="$TMP/device-check-site${PYTHONPATH:+:$PYTHONPATH}"
fi
# 2. onnxruntime-webgpu: its module is also called onnxruntime, so it gets a folder of its own
if ls "$CARRY"/ortweb/*.whl >/dev/null 2>&1; then
  pip_target "$TMP/device-check-ortweb" "$CARRY"/ortweb/*.whl && export DEVICE_CHECK_ORTWEB="$TMP/device-check-ortweb"
fi
# 3. the Vulkan loader, where the image has none (the device README's recipe; root only)
if ! ldconfig -p 2>/dev/null | grep -q libvulkan; then
  if [ "$(id -u)" = 0 ] && ls "$CARRY"/gl/*.deb >/dev/null 2>&1; then
    for f in "$CARRY"/gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
  else
    echo "device_check: no libvulkan on this machine and no loader packages in $CARRY/gl"
  fi
fi
# 4. the NVIDIA driver's Vulkan ICD, where the loader's search paths hold none
nv_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ "$smoke" = 0 ] && [ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$nv_icd" ] \
    && ! ls /usr/share/vulkan/icd.d/ /etc/vulkan/icd.d/ 2>/dev/null | grep -qi nvidia; then
  export VK_DRIVER_FILES="$nv_icd"
  export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
fi
# 5. tinygrad on CUDA (its nvrtc may live in a pip nvidia package) where a GPU is
if [ "$smoke" = 0 ] && command -v nvidia-smi >/dev/null 2>&1; then
  export DEV="${DEV:-CUDA}" DEVICE_CHECK_REQUIRE_CUDA=1
  nvrtc=$("$PY" -c 'import glob, os, site
print(next(iter(sorted(p for s in site.getsitepackages() for p in glob.glob(os.path.join(s, "nvidia", "**", "libnvrtc.so*"), recursive=True))), ""))' 2>/dev/null)
  if [ -z "${NVRTC_PATH:-}" ] && [ -n "$nvrtc" ]; then  # tinygrad's own search misses pip's nvidia folders
    export NVRTC_PATH="$nvrtc" LD_LIBRARY_PATH="$(dirname "$nvrtc")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fi
# 6. this project: installed, or the tree mapped as pyproject.toml's package-dir maps it
if ! "$PY" -c "import onnx_quant.inference" >/dev/null 2>&1; then
  overlay="$TMP/device-check-overlay"
  rm -rf "$overlay" && mkdir -p "$overlay/onnx_quant"
  for f in onnx_quant/*; do ln -s "$PWD/$f" "$overlay/onnx_quant/"; done
  for d in inference backend_wgpu templates; do ln -s "$PWD/$d" "$overlay/onnx_quant/$d"; done
  export PYTHONPATH="$overlay${PYTHONPATH:+:$PYTHONPATH}"
fi
# 7. the real-model tier's files (never downloaded there), copied where quantized forms may be written
if [ "$smoke" = 0 ] && [ -d "$CARRY/models" ]; then
  rm -rf "$TMP/device-check-models" && cp -r "$CARRY/models" "$TMP/device-check-models"
  export ONNX_QUANT_MODEL_CACHE="$TMP/device-check-models"
fi
export PYTHONUNBUFFERED=1
"$PY" -c 'import sys; print("python", sys.version.split()[0])'
exec "$PY" benchmarks/device_check.py "$@"

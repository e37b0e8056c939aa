"""The C types wgpu-py parses, parsed in one go before it asks for them one by one.

wgpu-py builds every descriptor through cffi with a type string (``ffi.new("WGPUBufferDescriptor *")``,
``ffi.new("WGPUBindGroupEntry[]", n)``, ``ffi.callback("void(WGPUMapAsyncStatus, ...)")``). cffi parses
each new string once per process with pycparser, and every parse re-reads a declaration of each of
wgpu.h's ~450 typedef names: 10-15 ms a string, 47 strings on the way to a first run, 0.5-1 s of a
new process on lavapipe (the cost is cffi's as wgpu-py uses it, not this project's). :func:`prime`
parses them all as the parameters of ONE function pointer type (cffi's public ``ffi.typeof``; arrays and
function types written as pointers to them so that no parameter decays) and stores each parameter's
ctype under its string in cffi's per-FFI parse cache, ``ffi._parsed_types`` (the one private name
used: what ``ffi.typeof(string)`` would have stored there itself, the same ctype objects; the
suite checks each against a fresh parse). Where the cache is not there or one string is not a type
of this wgpu build, nothing is primed and cffi parses as before.
"""

from __future__ import annotations

from typing import Any

#: the type strings wgpu-py 0.32 parses from adapter enumeration to a profiled first run and a
#: read-back (Vulkan and OpenGL adapters alike), as wgpu-py spells them
WGPU_TYPE_STRINGS: tuple[str, ...] = (
    "void(WGPULogLevel, WGPUStringView, void *)", "WGPUStringView *", "WGPUInstanceDescriptor *",
    "WGPUAdapter[]", "WGPUAdapterInfo *", "WGPUChainedStruct *", "WGPUNativeLimits *", "WGPULimits *",
    "char []", "WGPUQueueDescriptor *", "WGPUDeviceExtras *", "WGPUChainedStruct * ",
    "void(WGPUDevice const *, WGPUDeviceLostReason, WGPUStringView, void *, void *)",
    "WGPUDeviceLostCallbackInfo *",
    "void(WGPUDevice const *, WGPUErrorType, WGPUStringView, void *, void *)",
    "WGPUUncapturedErrorCallbackInfo *", "WGPUFeatureName[]", "WGPUDeviceDescriptor *",
    "void(WGPURequestDeviceStatus, WGPUDevice, WGPUStringView, void *, void *)",
    "WGPURequestDeviceCallbackInfo *", "WGPUBufferDescriptor *", "uint8_t []", "uintptr_t", "uint8_t *",
    "WGPUBufferBindingLayout *", "WGPUBindGroupLayoutEntry *", "WGPUBindGroupLayoutEntry[]",
    "WGPUBindGroupLayoutDescriptor *", "WGPUBindGroupLayout[]", "WGPUPipelineLayoutDescriptor *",
    "WGPUShaderSourceWGSL *", "WGPUShaderModuleDescriptor *", "WGPUComputeState *",
    "WGPUComputePipelineDescriptor *", "WGPUBindGroupEntry *", "WGPUBindGroupEntry[]",
    "WGPUBindGroupDescriptor *", "WGPUCommandEncoderDescriptor *", "WGPUComputePassDescriptor *",
    "WGPUCommandBufferDescriptor *", "WGPUCommandBuffer[]", "WGPUQuerySetDescriptor *",
    "WGPUPassTimestampWrites *", "uint32_t []",
    "void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)", "WGPUBufferMapCallbackInfo *",
    "intptr_t",
)


def _parameter(text: str) -> tuple[str, str]:
    """(the parameter declaring ``text``'s type without decaying, how to get the type back from it):
    ``T[]`` -> ``T (*)[]`` (its ``item``), ``R(A, ...)`` -> ``R (*)(A, ...)`` (the function pointer
    cffi's ``typeof`` gives a function type), anything else as written."""
    stripped = text.strip()
    if stripped.endswith("[]"):
        return f"{stripped[:-2].strip()} (*)[]", "item"
    if stripped.endswith(")") and "(" in stripped:
        head, _, args = stripped.partition("(")
        return f"{head.strip()} (*)({args}", "function"
    return stripped, "itself"


def prime(ffi: Any, strings: tuple[str, ...] = WGPU_TYPE_STRINGS) -> int:
    """Parse ``strings`` at once into ``ffi``'s parse cache; returns how many were added (0 where
    nothing could be primed)."""
    cache = getattr(ffi, "_parsed_types", None)
    if not isinstance(cache, dict):
        return 0
    todo = [s for s in dict.fromkeys(strings) if s not in cache]
    if not todo:
        return 0
    params = [_parameter(s) for s in todo]
    try:
        args = ffi.typeof("void (*)(" + ", ".join(p for p, _ in params) + ")").args
    except Exception:  # a type this wgpu build does not declare: leave cffi to parse as it goes
        return 0
    if len(args) != len(todo):  # pragma: no cover - a parameter list cffi read otherwise
        return 0
    for text, (_, how), ctype in zip(todo, params, args):
        if how == "item":
            cache[text] = (ctype.item, False)
        elif how == "function":
            cache[text] = (ctype, True)  # what cffi stores for a function type: its pointer, flagged
        else:
            cache[text] = (ctype, False)
    return len(todo)


def prime_wgpu() -> int:
    """:func:`prime` wgpu-native's FFI (0 where this wgpu has no wgpu-native backend)."""
    try:
        from wgpu.backends.wgpu_native._ffi import ffi  # noqa: PLC0415 - wgpu loads on first use
    except (ImportError, AttributeError):  # pragma: no cover - another wgpu backend
        return 0
    return prime(ffi)

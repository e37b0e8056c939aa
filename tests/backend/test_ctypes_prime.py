"""ctypes_prime.py: the C types wgpu-py parses, primed at once, are the ctypes cffi's own parse of
each string gives (the same objects), and a string that is not a type primes nothing."""

from __future__ import annotations

from wgpu.backends.wgpu_native._ffi import ffi  # wgpu is a dependency: never skipped

from onnx_quant.backend_wgpu import ctypes_prime


def test_primed_ctypes_are_cffis_own():
    ctypes_prime.prime_wgpu()
    cache = ffi._parsed_types
    for text in ctypes_prime.WGPU_TYPE_STRINGS:
        primed = cache.pop(text)
        with ffi._lock:
            fresh = ffi._typeof_locked(text)  # cffi's parse of this one string, stored again
        assert fresh[1] == primed[1], text
        assert fresh[0] is primed[0], f"{text}: primed {primed[0]} vs parsed {fresh[0]}"


def test_priming_stores_every_string_and_is_idempotent():
    for text in ctypes_prime.WGPU_TYPE_STRINGS:
        ffi._parsed_types.pop(text, None)
    assert ctypes_prime.prime(ffi) == len(set(ctypes_prime.WGPU_TYPE_STRINGS))
    assert all(t in ffi._parsed_types for t in ctypes_prime.WGPU_TYPE_STRINGS)
    assert ctypes_prime.prime(ffi) == 0


def test_an_unknown_type_primes_nothing():
    strings = ("WGPUBufferDescriptor *", "NotAWgpuType *")
    ffi._parsed_types.pop("WGPUBufferDescriptor *", None)
    assert ctypes_prime.prime(ffi, strings) == 0
    assert "WGPUBufferDescriptor *" not in ffi._parsed_types
    assert "NotAWgpuType *" not in ffi._parsed_types
    assert ffi.typeof("WGPUBufferDescriptor *").kind == "pointer"  # cffi still parses it itself

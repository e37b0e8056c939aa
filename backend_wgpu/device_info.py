"""What planning needs to know about a device, without importing wgpu.

Limits use the WebGPU camelCase names the specs use (``maxComputeWorkgroupsPerDimension``);
features use wgpu's real feature names (``subgroup``, ``shader-f16``, ``timestamp-query``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: WebGPU's default limits (the spec's "default" column): what a device gets when it
#: asks for nothing, and what portable kernels must fit.
WEBGPU_DEFAULT_LIMITS: dict[str, int] = {
    "maxBufferSize": 268435456,
    "maxStorageBufferBindingSize": 134217728,
    "maxUniformBufferBindingSize": 65536,
    "maxStorageBuffersPerShaderStage": 8,
    "maxUniformBuffersPerShaderStage": 12,
    "maxBindGroups": 4,
    "maxBindingsPerBindGroup": 1000,
    "maxComputeWorkgroupStorageSize": 16384,
    "maxComputeInvocationsPerWorkgroup": 256,
    "maxComputeWorkgroupSizeX": 256,
    "maxComputeWorkgroupSizeY": 256,
    "maxComputeWorkgroupSizeZ": 64,
    "maxComputeWorkgroupsPerDimension": 65535,
    "minStorageBufferOffsetAlignment": 256,
    "minUniformBufferOffsetAlignment": 256,
}

#: Feature names kernels may ask about with ``device.features.has(...)``.
KNOWN_FEATURES: frozenset[str] = frozenset({
    "subgroup", "shader-f16", "timestamp-query", "timestamp-query-inside-passes",
    "shader-float32-atomic", "immediates", "float32-filterable",
})


@dataclass(frozen=True)
class DeviceInfo:
    """Adapter description, limits and enabled features of one device."""

    name: str = "webgpu-defaults"
    backend: str = "none"
    limits: dict[str, int] = field(default_factory=lambda: dict(WEBGPU_DEFAULT_LIMITS))
    features: frozenset[str] = frozenset()

    def has(self, feature: str) -> bool:
        return feature in self.features

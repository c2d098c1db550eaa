"""A fake of the ``pynvml`` module surface, driven by scripted traces.

The sampler takes a pynvml-like module object; in production that is the real
``pynvml`` (nvidia-ml-py), in tests and the demo it is a :class:`FakeNvml`.
The fake exposes the same function names and signatures, returns the real
pynvml ctypes structures (``c_nvmlMemory_t``, ``c_nvmlMemory_v2_t``,
``c_nvmlUtilization_t``) and friendly process objects built from
``c_nvmlProcessInfo_t``, and raises the real ``pynvml.NVMLError_*`` classes
with their real codes, so the sampler's code path is the one that runs
against a GPU.

Faults are scripted with :meth:`FakeNvml.fail`: any function can raise any
NVML error code (or the library-mismatch error) for some number of calls.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml as _real

MiB = 2**20
GiB = 2**30

# Re-export the real constants and error classes: codes must match exactly.
for _name in dir(_real):
    if _name.startswith(("NVML_", "NVMLError", "nvmlMemory_v")) or _name == "NVMLLibraryMismatchError":
        globals()[_name] = getattr(_real, _name)
NVMLError = _real.NVMLError
NVMLLibraryMismatchError = _real.NVMLLibraryMismatchError

#: A memory trace: seconds since the fake started -> bytes.
Trace = Callable[[float], float]


def linear_leak(base: float, rate_bytes_per_s: float, start_s: float = 0.0, noise: float = 0.0,
                seed: int = 0) -> Trace:
    """A trace at ``base`` bytes that grows by ``rate_bytes_per_s`` after ``start_s``."""
    rng = random.Random(seed)

    def f(t: float) -> float:
        v = base + rate_bytes_per_s * max(0.0, t - start_s)
        if noise:
            v += rng.gauss(0.0, noise)
        # The caching allocator hands out 2 MiB granules.
        return max(0.0, math.floor(v / (2 * MiB)) * 2 * MiB)

    return f


@dataclass
class FakeProcess:
    """A process on a fake device."""

    pid: int
    used: Trace
    gpu_instance_id: int = 0xFFFFFFFF
    compute_instance_id: int = 0xFFFFFFFF


@dataclass
class FakeDevice:
    """A scripted GPU (or MIG device when ``parent`` is set)."""

    total: int = 80 * GiB
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    processes: list[FakeProcess] = field(default_factory=list)
    #: Memory used by the driver and contexts outside the listed processes.
    overhead: int = 512 * MiB
    #: Reserved by the driver (v2 memory info only).
    reserved: int = 256 * MiB
    utilization: tuple[int, int] = (35, 20)
    temperature: int = 48
    power_mw: int = 210_000
    mig: list[FakeDevice] = field(default_factory=list)
    index: int = 0


@dataclass
class _Handle:
    dev: FakeDevice
    mig_of: _Handle | None = None


class FakeNvml:
    """A pynvml-compatible module object.

    Args:
        devices: the scripted devices.
        clock: seconds since start (traces are evaluated at ``clock()``).
        driver_version: what ``nvmlSystemGetDriverVersion`` returns.
        memory_v2: whether ``nvmlDeviceGetMemoryInfo(version=nvmlMemory_v2)`` works
            (False models an old driver: the call raises FunctionNotFound).
    """

    def __init__(self, devices: list[FakeDevice], clock: Callable[[], float], driver_version: str = "550.54.15",
                 nvml_version: str = "12.550.54.15", memory_v2: bool = True) -> None:
        self.devices = devices
        for i, d in enumerate(devices):
            d.index = i
            d.uuid = d.uuid or f"GPU-{i:08x}-fake-0000-0000-{i:012x}"
            for j, m in enumerate(d.mig):
                m.index = j
                m.uuid = m.uuid or f"MIG-{i:04x}{j:04x}-fake-0000-0000-{j:012x}"
        self.clock = clock
        self.driver_version = driver_version
        self.nvml_version = nvml_version
        self.memory_v2 = memory_v2
        self.initialised = False
        self.calls: dict[str, int] = {}
        self._faults: dict[str, list[list[Any]]] = {}

    def __getattr__(self, name: str) -> Any:
        # Constants and error classes come from the real module.
        return getattr(_real, name)

    # -- scripting ---------------------------------------------------------
    def fail(self, fn: str, code: int | None, times: int = -1, device: int | None = None) -> None:
        """Make ``fn`` raise ``NVMLError(code)`` (``code=None``: NVMLLibraryMismatchError).

        Args:
            fn: the pynvml function name.
            code: an ``NVML_ERROR_*`` code.
            times: how many calls fail (-1: until ``heal``).
            device: only calls about this device index.
        """
        self._faults.setdefault(fn, []).append([code, times, device])

    def heal(self, fn: str | None = None) -> None:
        """Remove scripted faults (of ``fn`` or all)."""
        if fn is None:
            self._faults.clear()
        else:
            self._faults.pop(fn, None)

    def _check(self, fn: str, handle: _Handle | None = None) -> None:
        self.calls[fn] = self.calls.get(fn, 0) + 1
        for f in self._faults.get(fn, []):
            code, times, device = f
            if times == 0:
                continue
            if device is not None and (handle is None or (handle.mig_of or handle).dev.index != device):
                continue
            if times > 0:
                f[1] -= 1
            if code is None:
                raise _real.NVMLLibraryMismatchError(
                    "Unversioned function called and the pyNVML version does not match the NVML lib version.")
            raise _real.NVMLError(code)
        if fn not in ("nvmlInit", "nvmlInitWithFlags") and not self.initialised:
            raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)

    def _used(self, d: FakeDevice, t: float) -> int:
        if d.mig:
            return sum(self._used(m, t) for m in d.mig)
        return int(min(d.total, d.overhead + sum(p.used(t) for p in d.processes)))

    # -- the pynvml surface --------------------------------------------------
    def nvmlInit(self) -> None:
        self._check("nvmlInit")
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._check("nvmlSystemGetNVMLVersion")
        return self.nvml_version

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.devices):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(self.devices[index])

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetIndex", handle)
        return handle.dev.index

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._check("nvmlDeviceGetName", handle)
        return handle.dev.name

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._check("nvmlDeviceGetUUID", handle)
        return handle.dev.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        self._check("nvmlDeviceGetMemoryInfo", handle)
        d = handle.dev
        used = self._used(d, self.clock())
        if not version:
            m = _real.c_nvmlMemory_t()
            m.total, m.used, m.free = d.total, used, d.total - used
            return m
        if not self.memory_v2:
            raise _real.NVMLError(_real.NVML_ERROR_FUNCTION_NOT_FOUND)
        if version != _real.nvmlMemory_v2:
            raise _real.NVMLError(_real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        m2 = _real.c_nvmlMemory_v2_t()
        m2.version = version
        # v2 reports driver-reserved memory separately and leaves it out of "used".
        m2.total, m2.reserved, m2.used = d.total, d.reserved, used
        m2.free = d.total - d.reserved - used
        return m2

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> Any:
        self._check("nvmlDeviceGetUtilizationRates", handle)
        u = _real.c_nvmlUtilization_t()
        u.gpu, u.memory = handle.dev.utilization
        return u

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        self._check("nvmlDeviceGetTemperature", handle)
        if sensor != _real.NVML_TEMPERATURE_GPU:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return handle.dev.temperature

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetPowerUsage", handle)
        return handle.dev.power_mw

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        self._check("nvmlDeviceGetComputeRunningProcesses", handle)
        t = self.clock()
        devs = handle.dev.mig if handle.dev.mig else [handle.dev]
        out = []
        for d in devs:
            for p in d.processes:
                s = _real.c_nvmlProcessInfo_t()
                s.pid, s.usedGpuMemory = p.pid, int(p.used(t))
                s.gpuInstanceId, s.computeInstanceId = p.gpu_instance_id, p.compute_instance_id
                out.append(_real.nvmlStructToFriendlyObject(s))
        return out

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self._check("nvmlDeviceGetMigMode", handle)
        if handle.mig_of is not None:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        mode = _real.NVML_DEVICE_MIG_ENABLE if handle.dev.mig else _real.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetMaxMigDeviceCount", handle)
        return 7 if handle.dev.mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        self._check("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if index >= len(handle.dev.mig):
            raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
        return _Handle(handle.dev.mig[index], mig_of=handle)

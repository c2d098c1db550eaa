"""GPU sampling behind one interface: real NVML, the fake, and nvidia-smi replay.

:class:`NvmlSampler` drives a pynvml-like module object (the real ``pynvml``
or :class:`~inferwatch_sidecar.components.gpu.fake_nvml.FakeNvml`) and turns every NVML
fault into a counted, explained :class:`Fault` instead of an exception. The
replay sampler yields the rows of recorded nvidia-smi logs as the same
:class:`Snapshot` objects.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Fault reasons (the ``error`` label of the collector error counter) and what to do about each.
FIX: dict[str, str] = {
    "library_missing": 'the nvidia-ml-py package is not installed: pip install "inferwatch[sidecar]"',
    "library_not_found": (
        "libnvidia-ml.so.1 was not found: the container cannot see the GPU driver. Run the sidecar with the "
        "NVIDIA container runtime (--gpus all / runtimeClassName: nvidia) and NVIDIA_VISIBLE_DEVICES set"
    ),
    "driver_not_loaded": "the NVIDIA kernel driver is not loaded on this host: check nvidia-smi on the node",
    "gpu_is_lost": "the GPU fell off the bus (Xid 79): drain the node and reset or replace the GPU",
    "not_supported": "this GPU or driver does not support the query; the value is left out",
    "no_permission": (
        "NVML denied the query: per-process memory needs the host PID namespace (hostPID: true / --pid=host) "
        "and the sidecar must run with access to /dev/nvidia*"
    ),
    "version_mismatch": (
        "nvidia-ml-py and the driver's NVML do not agree on a function or struct version: upgrade nvidia-ml-py "
        "or the driver so they match (the sidecar falls back to older calls where it can)"
    ),
    "driver_mismatch": "the NVML library and the kernel driver versions differ (driver upgraded without reboot): "
    "reboot the node or reload the driver",
    "uninitialized": "NVML is not initialised; the sidecar retries nvmlInit",
    "timeout": "NVML timed out; the GPU may be hung",
    "unknown": "NVML returned an unexpected error; see the message",
    "unexpected": "the sampler raised an unexpected exception; this is a bug, please report it with the message",
}

_CODE_REASON = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "library_not_found",
    "NVML_ERROR_DRIVER_NOT_LOADED": "driver_not_loaded",
    "NVML_ERROR_GPU_IS_LOST": "gpu_is_lost",
    "NVML_ERROR_NOT_SUPPORTED": "not_supported",
    "NVML_ERROR_NO_PERMISSION": "no_permission",
    "NVML_ERROR_FUNCTION_NOT_FOUND": "version_mismatch",
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH": "version_mismatch",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "driver_mismatch",
    "NVML_ERROR_UNINITIALIZED": "uninitialized",
    "NVML_ERROR_TIMEOUT": "timeout",
}

#: Operations (the ``op`` label), a fixed set.
OPS = ("init", "device", "memory", "utilization", "temperature", "power", "processes", "mig", "replay")


@dataclass
class ProcessSample:
    """One process on one device."""

    pid: int
    used_bytes: int | None


@dataclass
class DeviceSample:
    """One device (or MIG device) at one instant.

    ``gpu`` is the label value: the NVML index ("0"), a MIG device as "0/mig1",
    or whatever a replayed log identifies the GPU by.
    """

    gpu: str
    uuid: str = ""
    name: str = ""
    total: int | None = None
    used: int | None = None
    free: int | None = None
    reserved: int | None = None
    util_gpu: float | None = None
    util_memory: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    parent: str | None = None
    processes: list[ProcessSample] | None = None


@dataclass
class Fault:
    """A classified sampling error."""

    reason: str
    op: str
    message: str
    gpu: str | None = None

    @property
    def fix(self) -> str:
        return FIX.get(self.reason, FIX["unknown"])


@dataclass
class Snapshot:
    """Everything one sampling pass saw."""

    t: float
    devices: list[DeviceSample] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    #: False when the pass produced no device data at all.
    ok: bool = True


def classify(module: Any, exc: BaseException) -> str:
    """Map an NVML exception to a fault reason."""
    if type(exc).__name__ == "NVMLLibraryMismatchError":
        return "version_mismatch"
    code = getattr(exc, "value", None)
    if code is None:
        return "unexpected"
    for name, reason in _CODE_REASON.items():
        if getattr(module, name, None) == code:
            return reason
    return "unknown"


class NvmlSampler:
    """Samples every device through a pynvml-like module.

    Args:
        load: returns the module (``import pynvml``); raising ImportError means the
            library is missing. Injected so tests pass a FakeNvml.
        clock: wall-clock seconds for the snapshot timestamps.
        reinit_s: how often a failed ``nvmlInit`` is retried.
        monotonic: monotonic seconds for the retry schedule.
    """

    def __init__(self, load: Callable[[], Any], clock: Callable[[], float] = time.time, reinit_s: float = 30.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._load = load
        self.clock = clock
        self.monotonic = monotonic
        self.reinit_s = reinit_s
        self.nvml: Any = None
        self.initialised = False
        self.init_fault: Fault | None = None
        self._next_init = 0.0
        self.driver_version: str | None = None
        self.nvml_version: str | None = None
        #: "v2" or "v1": which nvmlDeviceGetMemoryInfo struct the driver answered with.
        self.memory_info_version: str | None = None
        #: (gpu, op) pairs that answered NotSupported once: not asked again.
        self._unsupported: set[tuple[str, str]] = set()

    def _fault(self, exc: BaseException, op: str, gpu: str | None = None) -> Fault:
        reason = classify(self.nvml, exc)
        return Fault(reason, op, f"{type(exc).__name__}: {exc}", gpu)

    def init(self) -> Fault | None:
        """Load and initialise NVML; return the fault on failure."""
        self._next_init = self.monotonic() + self.reinit_s
        try:
            self.nvml = self._load()
        except ImportError as e:
            self.init_fault = Fault("library_missing", "init", f"import pynvml failed: {e}")
            return self.init_fault
        try:
            self.nvml.nvmlInit()
        except Exception as e:  # noqa: BLE001 - every NVML failure is a reported fault
            self.init_fault = self._fault(e, "init")
            return self.init_fault
        self.initialised = True
        self.init_fault = None
        for attr, fn in (("driver_version", "nvmlSystemGetDriverVersion"), ("nvml_version", "nvmlSystemGetNVMLVersion")):
            try:
                v = getattr(self.nvml, fn)()
                setattr(self, attr, v.decode() if isinstance(v, bytes) else str(v))
            except Exception:  # noqa: BLE001 - versions are informational
                pass
        return None

    def shutdown(self) -> None:
        if self.initialised:
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass
            self.initialised = False

    def sample(self) -> Snapshot:
        """One pass over every device; never raises."""
        snap = Snapshot(self.clock())
        if not self.initialised:
            if self.monotonic() < self._next_init:
                snap.ok = False
                if self.init_fault:
                    snap.faults.append(self.init_fault)
                return snap
            f = self.init()
            if f is not None:
                snap.ok = False
                snap.faults.append(f)
                return snap
        nv = self.nvml
        try:
            count = nv.nvmlDeviceGetCount()
        except Exception as e:  # noqa: BLE001
            f = self._fault(e, "device")
            snap.faults.append(f)
            snap.ok = False
            if f.reason in ("uninitialized", "driver_not_loaded", "driver_mismatch"):
                self.initialised = False
            return snap
        good = 0
        for i in range(count):
            gpu = str(i)
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
            except Exception as e:  # noqa: BLE001
                snap.faults.append(self._fault(e, "device", gpu))
                continue
            dev = self._device(h, gpu, None, snap)
            if dev is None:
                continue
            good += 1
            snap.devices.append(dev)
            snap.devices.extend(self._mig(h, gpu, snap))
        snap.ok = good > 0 or count == 0
        return snap

    def _call(self, snap: Snapshot, gpu: str, op: str, fn: Callable[[], Any]) -> Any:
        """Run an optional query; NotSupported is remembered and not asked again."""
        if (gpu, op) in self._unsupported:
            return None
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            f = self._fault(e, op, gpu)
            if f.reason == "not_supported":
                self._unsupported.add((gpu, op))
            snap.faults.append(f)
            return None

    def _memory(self, h: Any) -> tuple[int, int, int, int | None]:
        nv = self.nvml
        if self.memory_info_version != "v1":
            ver = getattr(nv, "nvmlMemory_v2", None)
            if ver is not None:
                try:
                    m = nv.nvmlDeviceGetMemoryInfo(h, version=ver)
                    self.memory_info_version = "v2"
                    return int(m.total), int(m.used), int(m.free), int(m.reserved)
                except Exception as e:  # noqa: BLE001
                    # Old drivers lack nvmlDeviceGetMemoryInfo_v2 or the struct version:
                    # fall back to v1 for good; anything else is a real fault.
                    if classify(nv, e) not in ("version_mismatch", "not_supported"):
                        raise
            self.memory_info_version = "v1"
        m = nv.nvmlDeviceGetMemoryInfo(h)
        return int(m.total), int(m.used), int(m.free), None

    def _device(self, h: Any, gpu: str, parent: str | None, snap: Snapshot) -> DeviceSample | None:
        nv = self.nvml
        dev = DeviceSample(gpu, parent=parent)
        try:
            dev.total, dev.used, dev.free, dev.reserved = self._memory(h)
        except Exception as e:  # noqa: BLE001 - memory is the one query a device cannot do without
            snap.faults.append(self._fault(e, "memory", gpu))
            return None
        for attr, fn in (("uuid", nv.nvmlDeviceGetUUID), ("name", nv.nvmlDeviceGetName)):
            try:
                v = fn(h)
                setattr(dev, attr, v.decode() if isinstance(v, bytes) else str(v))
            except Exception:  # noqa: BLE001 - informational
                pass
        u = self._call(snap, gpu, "utilization", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        if u is not None:
            dev.util_gpu, dev.util_memory = u.gpu / 100.0, u.memory / 100.0
        temp = self._call(snap, gpu, "temperature", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        if temp is not None:
            dev.temperature_c = float(temp)
        p = self._call(snap, gpu, "power", lambda: nv.nvmlDeviceGetPowerUsage(h))
        if p is not None:
            dev.power_w = p / 1000.0
        procs = self._call(snap, gpu, "processes", lambda: nv.nvmlDeviceGetComputeRunningProcesses(h))
        if procs is not None:
            dev.processes = [ProcessSample(int(x.pid), None if x.usedGpuMemory is None else int(x.usedGpuMemory))
                             for x in procs]
        return dev

    def _mig(self, h: Any, gpu: str, snap: Snapshot) -> list[DeviceSample]:
        nv = self.nvml
        mode = self._call(snap, gpu, "mig", lambda: nv.nvmlDeviceGetMigMode(h))
        if not mode or mode[0] != nv.NVML_DEVICE_MIG_ENABLE:
            return []
        out = []
        n = self._call(snap, gpu, "mig", lambda: nv.nvmlDeviceGetMaxMigDeviceCount(h)) or 0
        for j in range(n):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except Exception as e:  # noqa: BLE001
                if classify(nv, e) != "unknown" and getattr(e, "value", None) == nv.NVML_ERROR_NOT_FOUND:
                    continue  # an empty MIG slot
                snap.faults.append(self._fault(e, "mig", gpu))
                continue
            d = self._device(mh, f"{gpu}/mig{j}", gpu, snap)
            if d is not None:
                out.append(d)
        return out


# -- container / pod hints ----------------------------------------------------
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER = re.compile(r"([0-9a-f]{64})")


def container_hint(pid: int, proc_root: str = "/proc") -> str | None:
    """A short container / pod hint for ``pid`` from its cgroup path, or None.

    Kubernetes cgroup paths carry the pod UID (``kubepods-burstable-pod<uid>.slice``)
    and runtimes the 64-hex container id; we return ``pod:<uid>`` or the first 12
    hex digits of the container id (what ``docker ps`` shows).
    """
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup"), encoding="utf-8", errors="replace") as f:
            text = f.read(8192)
    except OSError:
        return None
    m = _POD.search(text)
    if m:
        return "pod:" + m.group(1).replace("_", "-")
    m = _CONTAINER.search(text)
    if m:
        return m.group(1)[:12]
    return None

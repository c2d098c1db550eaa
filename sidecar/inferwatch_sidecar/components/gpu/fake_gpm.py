"""GPM, health and XIDs on the fake NVML, with physically consistent numbers.

A device runs a :data:`Workload`: at each instant the share of time a kernel runs
(``busy``) and, of that time, the share spent in prefill (``prefill``). The two LLM
phases load different parts of the chip (the roofline: prefill's GEMMs reuse each
weight across every prompt token, decode reads every weight once per generated token):

=====================  =======  =======
per second of kernels  prefill  decode
=====================  =======  =======
SM utilization          0.95     0.55
SM occupancy            0.50     0.18
tensor-pipe activity    0.78     0.10
DRAM bandwidth          0.30     0.88
=====================  =======  =======

so a decode-heavy load shows nvidia-smi's "utilization" (``busy``) near 1 with low
SM occupancy and DRAM bandwidth near its ceiling, and a prefill-heavy one the reverse.
GPM values are averages over the interval between the two samples (the trace is
integrated), as the hardware counters are. Samples are the real
``c_nvmlGpmSample_t`` pointers and ``nvmlGpmMetricsGet`` fills the real
``c_nvmlGpmMetricsGet_t``, so :class:`~inferwatch_sidecar.components.gpu.gpm.GpmSampler`
runs its GPU code path.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml as _real

from inferwatch_sidecar.components.gpu.fake_nvml import FakeDevice, FakeNvml, _Handle


@dataclass(frozen=True)
class Phase:
    """What a device does at one instant: kernel-busy share, prefill share of it, PCIe MiB/s."""

    busy: float
    prefill: float
    pcie_mib_s: float = 200.0


#: seconds since start -> Phase
Workload = Callable[[float], Phase]

#: Counter levels per second of prefill and of decode kernels (see the module docstring).
PREFILL = {"sm_util": 0.95, "sm_occupancy": 0.50, "tensor": 0.78, "dram": 0.30}
DECODE = {"sm_util": 0.55, "sm_occupancy": 0.18, "tensor": 0.10, "dram": 0.88}

_IDS = {
    _real.NVML_GPM_METRIC_SM_UTIL: "sm_util",
    _real.NVML_GPM_METRIC_SM_OCCUPANCY: "sm_occupancy",
    _real.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor",
    _real.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram",
}


def counters(p: Phase) -> dict[str, float]:
    """Instantaneous counter levels (0..1) of a phase."""
    b, f = min(1.0, max(0.0, p.busy)), min(1.0, max(0.0, p.prefill))
    out = {k: b * (f * PREFILL[k] + (1 - f) * DECODE[k]) for k in PREFILL}
    out["busy"] = b
    return out


def steady(busy: float, prefill: float) -> Workload:
    """A constant workload."""
    ph = Phase(busy, prefill)
    return lambda t: ph


class FakeGpmNvml(FakeNvml):
    """:class:`FakeNvml` plus GPM, utilization from the workload, clocks, throttle reasons, ECC and XIDs.

    Args:
        workloads: device index -> workload (devices without one idle).
        gpm: whether the devices support GPM (False models a pre-Hopper GPU: only coarse counters).
    """

    def __init__(self, devices: list[FakeDevice], clock: Callable[[], float],
                 workloads: dict[int, Workload] | None = None, gpm: bool = True, **kw: Any) -> None:
        super().__init__(devices, clock, **kw)
        self.workloads = workloads or {}
        self.gpm = gpm
        self.throttle: dict[int, int] = {}
        self.ecc: dict[int, tuple[int, int]] = {}
        self.sm_clock_mhz, self.mem_clock_mhz = 1980, 2619
        self._samples: dict[int, tuple[int, int | None, float]] = {}
        self._keep: list[Any] = []
        self._events: list[Any] = []

    def _workload(self, h: _Handle) -> Workload:
        root = h.mig_of or h
        return self.workloads.get(root.dev.index, steady(0.0, 0.0))

    def _mean(self, w: Workload, t1: float, t2: float) -> dict[str, float]:
        n = 16
        acc: dict[str, float] = {}
        for i in range(n):
            c = counters(w(t1 + (t2 - t1) * (i + 0.5) / n))
            for k, v in c.items():
                acc[k] = acc.get(k, 0.0) + v / n
        acc["pcie"] = sum(w(t1 + (t2 - t1) * (i + 0.5) / n).pcie_mib_s for i in range(n)) / n
        return acc

    # -- scripting ---------------------------------------------------------
    def xid(self, device: int, code: int) -> None:
        """Queue an XID event on ``device``."""
        ev = _real.c_nvmlEventData_t()
        ev.eventType, ev.eventData = _real.nvmlEventTypeXidCriticalError, code
        self._events.append((device, ev))

    # -- utilization, clocks, health ------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> Any:
        self._check("nvmlDeviceGetUtilizationRates", handle)
        if handle.mig_of is not None:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        t = self.clock()
        c = self._mean(self._workload(handle), max(0.0, t - 1.0), t)  # NVML's own ~1 s window
        u = _real.c_nvmlUtilization_t()
        u.gpu, u.memory = round(100 * c["busy"]), round(100 * c["dram"])
        return u

    def nvmlDeviceGetClockInfo(self, handle: _Handle, kind: int) -> int:
        self._check("nvmlDeviceGetClockInfo", handle)
        slowed = self.throttle.get((handle.mig_of or handle).dev.index, 0) & ~1
        base = self.sm_clock_mhz if kind == _real.NVML_CLOCK_SM else self.mem_clock_mhz
        return int(base * (0.7 if slowed and kind == _real.NVML_CLOCK_SM else 1.0))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return self.throttle.get((handle.mig_of or handle).dev.index, 0)

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter_type: int) -> int:
        self._check("nvmlDeviceGetTotalEccErrors", handle)
        c, u = self.ecc.get((handle.mig_of or handle).dev.index, (0, 0))
        return u if error_type == _real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else c

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetGpuInstanceId", handle)
        if handle.mig_of is None:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return handle.dev.index + 1

    def nvmlEventSetCreate(self) -> Any:
        self._check("nvmlEventSetCreate")
        return object()

    def nvmlDeviceRegisterEvents(self, handle: _Handle, types: int, event_set: Any) -> None:
        self._check("nvmlDeviceRegisterEvents", handle)

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        self._check("nvmlEventSetWait")
        if not self._events:
            raise _real.NVMLError(_real.NVML_ERROR_TIMEOUT)
        device, ev = self._events.pop(0)
        ev.device = None
        out = _real.nvmlStructToFriendlyObject(ev)
        out.device = _Handle(self.devices[device])
        return out

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._check("nvmlEventSetFree")

    # -- GPM -----------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, handle: _Handle) -> Any:
        self._check("nvmlGpmQueryDeviceSupport", handle)
        s = _real.c_nvmlGpmSupport_t()
        s.version, s.isSupportedDevice = _real.NVML_GPM_SUPPORT_VERSION, int(self.gpm)
        return s

    def nvmlGpmSampleAlloc(self) -> Any:
        self._check("nvmlGpmSampleAlloc")
        obj = ctypes.create_string_buffer(8)  # a real, distinct address behind the opaque pointer
        self._keep.append(obj)
        return ctypes.cast(obj, _real.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._check("nvmlGpmSampleFree")

    def _take(self, handle: _Handle, gi: int | None, sample: Any) -> Any:
        if not self.gpm:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        self._samples[ctypes.cast(sample, ctypes.c_void_p).value or 0] = (handle.dev.index, gi, self.clock())
        return sample

    def nvmlGpmSampleGet(self, handle: _Handle, sample: Any) -> Any:
        self._check("nvmlGpmSampleGet", handle)
        return self._take(handle, None, sample)

    def nvmlGpmMigSampleGet(self, handle: _Handle, gpu_instance_id: int, sample: Any) -> Any:
        self._check("nvmlGpmMigSampleGet", handle)
        return self._take(handle, gpu_instance_id, sample)

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        self._check("nvmlGpmMetricsGet")
        if mg.version != _real.NVML_GPM_METRICS_GET_VERSION:
            raise _real.NVMLError(_real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        s1 = self._samples.get(ctypes.cast(mg.sample1, ctypes.c_void_p).value or 0)
        s2 = self._samples.get(ctypes.cast(mg.sample2, ctypes.c_void_p).value or 0)
        if s1 is None or s2 is None or s1[:2] != s2[:2] or not s2[2] > s1[2]:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        w = self.workloads.get(s1[0], steady(0.0, 0.0))
        mean = self._mean(w, s1[2], s2[2])
        for i in range(mg.numMetrics):
            m = mg.metrics[i]
            key = _IDS.get(m.metricId)
            if key is not None:
                m.value, m.nvmlReturn = 100.0 * mean[key], 0
            elif m.metricId in (_real.NVML_GPM_METRIC_PCIE_TX_PER_SEC, _real.NVML_GPM_METRIC_PCIE_RX_PER_SEC):
                m.value, m.nvmlReturn = mean["pcie"] * (0.25 if m.metricId == _real.NVML_GPM_METRIC_PCIE_TX_PER_SEC
                                                        else 1.0), 0
            else:
                m.nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED
        return mg

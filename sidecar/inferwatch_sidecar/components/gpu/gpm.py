"""GPU activity that is not a lie: NVML GPM counters, with NVML's coarse counters where GPM is missing.

``nvidia-smi``'s utilization is the share of time *any* kernel ran: LLM decode, bound by memory
bandwidth, reads 90-100% while most SMs idle. GPM (Hopper and newer, ``nvmlGpmSampleGet`` /
``nvmlGpmMetricsGet``) reports what the hardware did between two samples: SM utilization (share of
SMs busy), SM occupancy (resident warps over the maximum), tensor-pipe activity, DRAM bandwidth
utilization and PCIe traffic, all as averages over the interval between the two samples.

:class:`GpmSampler` drives a pynvml-like module (the real ``pynvml`` on a GPU, or
:class:`~inferwatch_sidecar.components.gpu.fake_gpm.FakeGpmNvml`), one GPM sample buffer pair per
device or MIG instance, samples at least :data:`MIN_INTERVAL_S` apart (NVML's own floor is 100 ms).
A device without GPM falls back to ``nvmlDeviceGetUtilizationRates`` (``fidelity="coarse"``). The
health reading beside it: clock event (throttle) reasons, SM and memory clocks, volatile ECC counts
and XID events. Every NVML fault is counted by reason, never raised.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inferwatch_sidecar.components.gpu.sampler import classify

#: GPM refuses (or averages nonsense over) samples closer than 100 ms; keep a margin.
MIN_INTERVAL_S = 0.12

#: The GPM metrics read, by the Activity attribute they fill; values are 0-100 (%) or MiB/s.
GPM_FIELDS = (
    ("sm_util", "NVML_GPM_METRIC_SM_UTIL"),
    ("sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor_active", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("dram_bw_util", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
    ("pcie_tx_bytes_per_s", "NVML_GPM_METRIC_PCIE_TX_PER_SEC"),
    ("pcie_rx_bytes_per_s", "NVML_GPM_METRIC_PCIE_RX_PER_SEC"),
)
_MIB = 1 << 20

#: Clock event reasons exported (the ``reason`` label), by pynvml constant suffix.
THROTTLE_REASONS = (
    ("sw_power_cap", "SwPowerCap"), ("hw_slowdown", "HwSlowdown"), ("sw_thermal", "SwThermalSlowdown"),
    ("hw_thermal", "HwThermalSlowdown"), ("hw_power_brake", "HwPowerBrakeSlowdown"), ("sync_boost", "SyncBoost"),
    ("idle", "GpuIdle"), ("applications_clocks", "ApplicationsClocksSetting"),
)
#: XIDs kept as their own label value; any other is counted as "other" (the label stays bounded).
KNOWN_XIDS = frozenset({13, 31, 32, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 140})


@dataclass
class Activity:
    """One device's activity over ``[t0, t1]``: ratios in [0, 1], PCIe in bytes/s; None where unknown."""

    gpu: str
    fidelity: str  # "gpm" or "coarse"
    t0: float
    t1: float
    sm_util: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_bw_util: float | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    #: NVML's "a kernel ran" share, the number nvidia-smi shows (always read, for the dashboard's comparison).
    kernel_active: float | None = None


@dataclass
class Health:
    """One device's health reading."""

    gpu: str
    throttle: dict[str, bool] = field(default_factory=dict)
    sm_clock_hz: float | None = None
    mem_clock_hz: float | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None


@dataclass
class _Unit:
    """A device or MIG instance being sampled."""

    gpu: str
    handle: Any
    parent: Any = None
    gi_id: int | None = None
    gpm: bool = False
    bufs: list[Any] = field(default_factory=list)
    prev: Any = None
    prev_t: float = 0.0


class GpmSampler:
    """Samples GPM (or the coarse fallback) and health for every device.

    Args:
        nvml: a pynvml-like module, already initialised by the caller (``init`` does it otherwise).
        monotonic: seconds, for the interval bounds and the init retries.
        reinit_s: how long after a failed ``nvmlInit`` it is tried again (no GPU: one try per 30 s, not per pass).
    """

    def __init__(self, nvml: Any, monotonic: Callable[[], float] = time.monotonic, reinit_s: float = 30.0) -> None:
        self.nv = nvml
        self.monotonic = monotonic
        self.reinit_s = reinit_s
        self._next_init = -float("inf")
        self.units: list[_Unit] | None = None
        self.faults: dict[tuple[str, str], int] = {}
        self.last_fault: str = ""
        self.xids: dict[tuple[str, str], int] = {}
        self._events: Any = None
        self._event_gpu: dict[int, str] = {}
        self._unsupported: set[tuple[str, str]] = set()
        self.initialised = False

    # -- setup -------------------------------------------------------------
    def _fault(self, op: str, e: BaseException) -> str:
        reason = classify(self.nv, e)
        self.faults[(op, reason)] = self.faults.get((op, reason), 0) + 1
        self.last_fault = f"{op}: {type(e).__name__}: {e}"
        return reason

    def init(self) -> bool:
        """nvmlInit and discover devices; False (counted) on failure, retried ``reinit_s`` later."""
        now = self.monotonic()
        if now < self._next_init:
            return False
        self._next_init = now + self.reinit_s
        try:
            self.nv.nvmlInit()
        except Exception as e:  # noqa: BLE001 - counted
            self._fault("init", e)
            return False
        self.initialised = True
        self.units = self._discover()
        self._register_events()
        return True

    def _discover(self) -> list[_Unit]:
        nv = self.nv
        units: list[_Unit] = []
        try:
            count = nv.nvmlDeviceGetCount()
        except Exception as e:  # noqa: BLE001
            self._fault("device", e)
            return units
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
            except Exception as e:  # noqa: BLE001
                self._fault("device", e)
                continue
            u = _Unit(str(i), h, gpm=self._supports_gpm(h))
            units.append(u)
            units.extend(self._mig_units(u))
        for u in units:
            if u.gpm:
                try:
                    u.bufs = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
                except Exception as e:  # noqa: BLE001
                    self._fault("gpm_alloc", e)
                    u.gpm = False
        return units

    def _supports_gpm(self, h: Any) -> bool:
        try:
            return bool(self.nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
        except Exception as e:  # noqa: BLE001 - old drivers lack the function: coarse it is
            self._fault("gpm_support", e)
            return False

    def _mig_units(self, parent: _Unit) -> list[_Unit]:
        nv = self.nv
        try:
            mode = nv.nvmlDeviceGetMigMode(parent.handle)
        except Exception:  # noqa: BLE001 - no MIG on this device
            return []
        if not mode or mode[0] != nv.NVML_DEVICE_MIG_ENABLE:
            return []
        out = []
        try:
            n = nv.nvmlDeviceGetMaxMigDeviceCount(parent.handle)
        except Exception as e:  # noqa: BLE001
            self._fault("mig", e)
            return []
        for j in range(n):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent.handle, j)
                gi = int(nv.nvmlDeviceGetGpuInstanceId(mh))
            except Exception:  # noqa: BLE001 - an empty MIG slot
                continue
            # GPM per MIG instance is sampled through the parent with the GPU instance id.
            out.append(_Unit(f"{parent.gpu}/mig{j}", mh, parent=parent.handle, gi_id=gi, gpm=parent.gpm))
        return out

    def _register_events(self) -> None:
        nv = self.nv
        try:
            self._events = nv.nvmlEventSetCreate()
        except Exception as e:  # noqa: BLE001
            self._fault("events", e)
            return
        for u in self.units or []:
            if u.parent is not None:
                continue
            try:
                nv.nvmlDeviceRegisterEvents(u.handle, nv.nvmlEventTypeXidCriticalError, self._events)
                self._event_gpu[int(nv.nvmlDeviceGetIndex(u.handle))] = u.gpu
            except Exception as e:  # noqa: BLE001
                self._fault("events", e)

    def shutdown(self) -> None:
        nv = self.nv
        for u in self.units or []:
            for b in u.bufs:
                try:
                    nv.nvmlGpmSampleFree(b)
                except Exception:  # noqa: BLE001 - best effort
                    pass
        if self._events is not None:
            try:
                nv.nvmlEventSetFree(self._events)
            except Exception:  # noqa: BLE001
                pass
        if self.initialised:
            try:
                nv.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self.initialised = False

    # -- sampling ------------------------------------------------------------
    def sample(self) -> tuple[list[Activity], list[Health]]:
        """One pass: interval activity of every unit (none on the first pass of a GPM unit) and health."""
        if not self.initialised and not self.init():
            return [], []
        acts: list[Activity] = []
        healths: list[Health] = []
        for u in self.units or []:
            a = self._activity(u)
            if a is not None:
                acts.append(a)
            if u.parent is None:
                healths.append(self._health(u))
        self._poll_xids()
        return acts, healths

    def _gpm_sample(self, u: _Unit, buf: Any) -> None:
        if u.parent is not None and u.gi_id is not None:
            self.nv.nvmlGpmMigSampleGet(u.parent, u.gi_id, buf)
        else:
            self.nv.nvmlGpmSampleGet(u.handle, buf)

    def _activity(self, u: _Unit) -> Activity | None:
        nv = self.nv
        now = self.monotonic()
        kernel = mem_ctl = None
        # MIG devices answer NotSupported: asked once, then left out.
        r = self._opt(u, "utilization", lambda: nv.nvmlDeviceGetUtilizationRates(u.handle))
        if r is not None:
            kernel, mem_ctl = r.gpu / 100.0, r.memory / 100.0
        if not u.gpm:
            if kernel is None:
                return None
            # Coarse: "a kernel ran" and "memory was read or written" shares, no SM or bandwidth truth.
            return Activity(u.gpu, "coarse", now, now, sm_util=kernel, dram_bw_util=mem_ctl, kernel_active=kernel)
        if u.prev is not None and now - u.prev_t < MIN_INTERVAL_S:
            return None
        cur = u.bufs[1] if u.prev is u.bufs[0] else u.bufs[0]
        try:
            self._gpm_sample(u, cur)
        except Exception as e:  # noqa: BLE001
            self._fault("gpm_sample", e)
            u.prev = None
            return None
        prev, prev_t = u.prev, u.prev_t
        u.prev, u.prev_t = cur, now
        if prev is None:
            return None
        act = Activity(u.gpu, "gpm", prev_t, now, kernel_active=kernel)
        try:
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(GPM_FIELDS)
            mg.sample1, mg.sample2 = prev, cur
            for i, (_, const) in enumerate(GPM_FIELDS):
                mg.metrics[i].metricId = getattr(nv, const)
            nv.nvmlGpmMetricsGet(mg)
        except Exception as e:  # noqa: BLE001
            self._fault("gpm_metrics", e)
            return None
        for i, (attr, _) in enumerate(GPM_FIELDS):
            m = mg.metrics[i]
            if m.nvmlReturn != 0:
                continue
            v = float(m.value)
            setattr(act, attr, v * _MIB if attr.startswith("pcie") else min(1.0, max(0.0, v / 100.0)))
        return act

    def _health(self, u: _Unit) -> Health:
        nv = self.nv
        h = Health(u.gpu)
        reasons = self._opt(u, "throttle", lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(u.handle))
        if reasons is None:
            reasons = self._opt(u, "throttle_legacy", lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(u.handle))
        if reasons is not None:
            for label, suffix in THROTTLE_REASONS:
                bit = getattr(nv, "nvmlClocksEventReason" + suffix, None)
                if bit is None:
                    bit = getattr(nv, "nvmlClocksThrottleReason" + suffix, 0)
                h.throttle[label] = bool(int(reasons) & int(bit or 0))
        sm = self._opt(u, "clock", lambda: nv.nvmlDeviceGetClockInfo(u.handle, nv.NVML_CLOCK_SM))
        mem = self._opt(u, "clock", lambda: nv.nvmlDeviceGetClockInfo(u.handle, nv.NVML_CLOCK_MEM))
        h.sm_clock_hz = None if sm is None else float(sm) * 1e6
        h.mem_clock_hz = None if mem is None else float(mem) * 1e6
        for attr, kind in (("ecc_corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                           ("ecc_uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED")):
            def ecc(k: str = kind) -> Any:
                return nv.nvmlDeviceGetTotalEccErrors(u.handle, getattr(nv, k), nv.NVML_VOLATILE_ECC)

            v = self._opt(u, "ecc", ecc)
            if v is not None:
                setattr(h, attr, int(v))
        return h

    def _opt(self, u: _Unit, op: str, fn: Callable[[], Any]) -> Any:
        if (u.gpu, op) in self._unsupported:
            return None
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            if self._fault(op, e) == "not_supported":
                self._unsupported.add((u.gpu, op))
            return None

    def _poll_xids(self) -> None:
        nv = self.nv
        if self._events is None:
            return
        for _ in range(64):  # a storm is drained over several passes, never in one unbounded loop
            try:
                ev = nv.nvmlEventSetWait(self._events, 0)
            except Exception as e:  # noqa: BLE001 - NVML_ERROR_TIMEOUT: no event pending
                if getattr(e, "value", None) != getattr(nv, "NVML_ERROR_TIMEOUT", -1):
                    self._fault("events", e)
                return
            try:
                gpu = self._event_gpu.get(int(nv.nvmlDeviceGetIndex(ev.device)), "unknown")
            except Exception:  # noqa: BLE001
                gpu = "unknown"
            xid = int(ev.eventData)
            key = (gpu, str(xid) if xid in KNOWN_XIDS else "other")
            self.xids[key] = self.xids.get(key, 0) + 1

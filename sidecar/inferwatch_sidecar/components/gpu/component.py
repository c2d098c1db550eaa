"""The gpu component: sampling thread, allocator ingest, leak detectors, export.

Threads: ``handle`` runs on the daemon's ingest thread and only stores the
latest allocator record per (pid, device) (a dict assignment) and queues the
second stage's allocation sites (a bounded deque, folded in under the lock by
the sampler thread or a status read); the sampler
thread samples NVML every ``interval_s``, feeds every detector and prunes dead
PIDs; ``collect`` and ``status`` read a consistent state under one lock.
"""

from __future__ import annotations

import importlib
import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from inferwatch.wire import EV_ALLOC, EV_ALLOC_SITE
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.gpu import report
from inferwatch_sidecar.components.gpu.config import GpuConfig
from inferwatch_sidecar.components.gpu.detector import LeakDetector
from inferwatch_sidecar.components.gpu.duplicates import Copies, FlatTracker, find_copies

# The status section's builders moved to report.py (issue 23); these names stay importable from here.
from inferwatch_sidecar.components.gpu.report import (
    EPISODE_HISTORY,
    _device_time_to_oom,
    _episode_dict,
    cause_of,
)
from inferwatch_sidecar.components.gpu.sampler import DeviceSample, Fault, NvmlSampler, Snapshot, container_hint
from inferwatch_sidecar.components.gpu.sites import MAX_KEYS, MAX_SITES, SiteCaptures, site_of
from inferwatch_sidecar.components.periodic import PeriodicComponent
from inferwatch_sidecar.metrics import gpu as gm
from inferwatch_sidecar.metrics.gpu import METRICS
from inferwatch_sidecar.metrics.samples import Samples

__all__ = ["EPISODE_HISTORY", "KINDS", "GpuComponent", "build", "cause_of"]
#: Modules this component imports only where it first computes (scipy: 26-72 MiB that an idle sidecar need not
#: hold); start-up checks that they are installed (daemon/wiring.py), so a missing one is named at start.
LAZY_IMPORTS = ("scipy",)

KINDS = ("tensor", "cache_fragmentation", "native", "unknown")


def _load_pynvml() -> Any:
    return importlib.import_module("pynvml")


@dataclass
class _Proc:
    gpu: str
    pid: int
    container: str | None
    det: LeakDetector
    flat: FlatTracker
    used: int | None = None
    last_seen: float = 0.0
    kind: str | None = None


@dataclass
class _Alloc:
    pid: int
    device: int
    det_allocated: LeakDetector
    det_reserved: LeakDetector
    det_split: LeakDetector
    rec: tuple[Any, ...] | None = None
    last_seen: float = 0.0
    fed_t: float = -math.inf
    retries: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=256))
    frag_warning: bool = False
    frag_reason: str = ""


@dataclass
class _FaultStat:
    count: int = 0
    message: str = ""
    gpu: str | None = None
    last: float = 0.0


def _fake_sampler(cfg: GpuConfig, ctx: ComponentContext) -> NvmlSampler:
    from inferwatch_sidecar.components.gpu import fake_nvml as fk

    start = ctx.monotonic()
    fc = cfg.fake
    devices = []
    for i in range(fc.devices):
        procs = [
            fk.FakeProcess(p.pid, fk.linear_leak(p.base_gib * fk.GiB, p.leak_mib_per_s * fk.MiB, p.leak_start_s,
                                                 p.noise_mib * fk.MiB, seed=fc.seed + i * 1000 + p.pid))
            for p in fc.processes
        ]
        devices.append(fk.FakeDevice(total=int(fc.total_gib * fk.GiB), processes=procs))
    fake = fk.FakeNvml(devices, clock=lambda: ctx.monotonic() - start)
    return NvmlSampler(lambda: fake, clock=ctx.clock, reinit_s=cfg.reinit_s, monotonic=ctx.monotonic)


class GpuComponent(PeriodicComponent):
    """GPU memory monitor (see the module docstring).

    Args:
        config: the validated ``gpu:`` section.
        ctx: the daemon's context (clock, label limiters, logger).
        sampler: an NvmlSampler or ReplaySampler; injected by tests.
        backend: the name reported in status.
    """

    name = "gpu"
    record_types = frozenset({EV_ALLOC, EV_ALLOC_SITE})
    metrics = METRICS
    export_empty = True  # every family's HELP and TYPE, sampled or not
    immediate = True  # the first sample is taken at once
    thread_name = "inferwatch-gpu-sampler"
    drop_reasons = ()

    def __init__(self, config: GpuConfig, ctx: ComponentContext, sampler: Any, backend: str) -> None:
        # The state is read and written under ``self._lock`` (collect builds its samples at scrape time).
        super().__init__(ctx, interval_s=config.interval_s, log=ctx.logger)
        self.cfg = config
        self.sampler = sampler
        self.backend = backend
        self._gpu_lim = ctx.limiter("gpu")
        self._pid_lim = ctx.limiter("pid")
        self._ctr_lim = ctx.limiter("container")
        self.devices: dict[str, DeviceSample] = {}
        self.dev_det: dict[str, LeakDetector] = {}
        self.procs: dict[tuple[str, int], _Proc] = {}
        self.allocs: dict[tuple[int, int], _Alloc] = {}
        self._latest: dict[tuple[int, int], tuple[tuple[Any, ...], float]] = {}
        self.errors: dict[tuple[str, str], _FaultStat] = {}
        self.alloc_drops: dict[str, int] = {}
        #: Allocation sites of the probe's second stage (sites.py), and those the ingest thread queued.
        self.sites = SiteCaptures()
        self._site_inbox: deque[tuple[int, int, int, dict[str, Any]]] = deque()
        self.samples = 0
        self.cpu_s = 0.0
        self.up = False
        self.last_good: float | None = None
        self.last_t: float | None = None
        self.absent_reason: Fault | None = None
        self._labelled_pids: set[str] = set()
        #: Episodes of process series that were removed (the process exited), newest last.
        self.past_episodes: deque[dict[str, Any]] = deque(maxlen=EPISODE_HISTORY)
        #: Duplicated model copies per GPU, with the time the same set of PIDs was first seen.
        self.copies: dict[str, tuple[Copies, float]] = {}
        warning = config.detector.scale_warning()
        if warning is not None:
            self.log.warning("%s", warning)

    # -- lifecycle ---------------------------------------------------------------
    def on_stop(self) -> None:
        try:
            self.sampler.shutdown()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass

    def tick(self) -> bool:
        """One pass of the sampler thread; True once a replay has run out."""
        self.sample()
        return bool(getattr(self.sampler, "finished", False))

    def tick_failed(self, e: Exception) -> None:
        self.ctx.logger.exception("gpu sampler pass failed", exc_info=e)
        with self._lock:
            self._count_fault(Fault("unexpected", "device", repr(e)))

    # -- ingest --------------------------------------------------------------------
    def handle(self, pid: int, producer_id: int, records: list[tuple[Any, ...]]) -> None:
        """Keep the latest allocator record per (pid, device) and queue allocation sites; never raises."""
        now = self.ctx.monotonic()
        for r in records:
            try:
                if len(r) == 8 and r[0] == EV_ALLOC_SITE:
                    t_ns, dev, site = site_of(r)
                    if len(self._site_inbox) >= MAX_KEYS * MAX_SITES:
                        raise ValueError("sites_full")  # the sampler thread has not folded them in
                    self._site_inbox.append((int(pid), t_ns, dev, site))
                    continue
                if len(r) != 10 or r[0] != EV_ALLOC:
                    raise ValueError("bad_layout")
                dev = int(r[2])
                if any(not isinstance(x, int) or x < 0 for x in r[3:9]) or dev < 0:
                    raise ValueError("bad_value")
                self._latest[(int(pid), dev)] = (r, now)
            except (ValueError, TypeError) as e:
                reason = str(e) if str(e) in ("bad_layout", "bad_value", "sites_full") else "bad_value"
                self.alloc_drops[reason] = self.alloc_drops.get(reason, 0) + 1

    # -- sampling --------------------------------------------------------------------
    def _count_fault(self, f: Fault) -> None:
        st = self.errors.setdefault((f.reason, f.op), _FaultStat())
        st.count += 1
        st.message = f.message
        st.gpu = f.gpu
        st.last = self.ctx.monotonic()

    def sample(self) -> None:
        """One sampling pass: sample, feed the detectors, prune dead PIDs."""
        c0 = time.thread_time()
        snap: Snapshot = self.sampler.sample()
        with self._lock:
            self.samples += 1
            for f in snap.faults:
                self._count_fault(f)
            self.up = snap.ok and bool(snap.devices)
            if self.backend == "auto" and not getattr(self.sampler, "initialised", True):
                self.absent_reason = getattr(self.sampler, "init_fault", None)
            if self.up:
                self.last_good = self.ctx.monotonic()
                self.absent_reason = None
                self._ingest(snap)
            else:
                self.copies.clear()  # no device was sampled: none is known to hold copies now
            self._feed_allocator()
            self.fold_sites()
            self._prune(snap.t)
        self.cpu_s += time.thread_time() - c0

    def fold_sites(self) -> None:
        """Take the queued allocation sites into :attr:`sites` (``_lock`` held)."""
        inbox = self._site_inbox
        while inbox:
            pid, t_ns, dev, site = inbox.popleft()
            self.sites.add(pid, t_ns, dev, site)

    def _ingest(self, snap: Snapshot) -> None:
        t = snap.t
        self.last_t = t
        seen_devs = set()
        for d in snap.devices:
            seen_devs.add(d.gpu)
            self.devices[d.gpu] = d
            det = self.dev_det.get(d.gpu)
            if det is None:
                det = self.dev_det[d.gpu] = LeakDetector(self.cfg.detector)
            if d.used is not None:
                # The device's own detector judges what no listed process accounts for (driver,
                # contexts, processes NVML cannot attribute): each process has its own, and the sum of
                # several processes' sawtooths never returns to one floor.
                known = sum(p.used_bytes for p in d.processes or () if p.used_bytes is not None)
                det.update(t, float(d.used - known))
            for p in d.processes or ():
                key = (d.gpu, p.pid)
                st = self.procs.get(key)
                if st is None:
                    hint = container_hint(p.pid, self.cfg.proc_root) if self.cfg.resolve_containers else None
                    st = self.procs[key] = _Proc(d.gpu, p.pid, hint, LeakDetector(self.cfg.detector),
                                                 FlatTracker(self.cfg.duplicates.flat_s))
                st.last_seen = t
                st.used = p.used_bytes
                if p.used_bytes is not None:
                    st.det.update(t, float(p.used_bytes))
                    st.flat.update(t, float(p.used_bytes))
            if d.processes is not None:
                self._find_copies(d.gpu, t)
            else:
                self.copies.pop(d.gpu, None)  # the processes could not be listed: nothing to judge them on
        for gpu in [g for g in self.copies if g not in seen_devs]:
            del self.copies[gpu]  # the device was not sampled this pass

    def _find_copies(self, gpu: str, t: float) -> None:
        """Duplicated model copies among the processes this pass listed on ``gpu``."""
        levels = {}
        for st in self.procs.values():
            if st.gpu == gpu and st.last_seen == t:
                v = st.flat.flat_level(t, self.cfg.duplicates)
                if v is not None:
                    levels[st.pid] = v
        found = find_copies(levels, self.cfg.duplicates)
        if found is None:
            self.copies.pop(gpu, None)
            return
        old = self.copies.get(gpu)
        self.copies[gpu] = (found, old[1] if old is not None and old[0].pids == found.pids else t)

    def _feed_allocator(self) -> None:
        for key, (rec, seen) in list(self._latest.items()):
            a = self.allocs.get(key)
            if a is None:
                dc = self.cfg.detector
                a = self.allocs[key] = _Alloc(key[0], key[1], LeakDetector(dc), LeakDetector(dc), LeakDetector(dc))
            a.last_seen = seen
            t = rec[1] / 1e9
            if t <= a.fed_t:
                continue
            a.fed_t = t
            a.rec = rec
            allocated, reserved, split, retries = rec[3], rec[4], rec[6], rec[7]
            a.det_allocated.update(t, float(allocated))
            a.det_reserved.update(t, float(reserved))
            a.det_split.update(t, float(split))
            a.retries.append((t, retries))
            while a.retries and t - a.retries[0][0] > 60.0:
                a.retries.popleft()
            old_t, old_r = a.retries[0]
            rate = (retries - old_r) / (t - old_t) if t > old_t else 0.0
            ratio = split / reserved if reserved else 0.0
            a.frag_warning = rate > self.cfg.frag_retry_rate_per_s or ratio > self.cfg.frag_inactive_split_ratio
            a.frag_reason = (
                f"alloc retries {rate:.3f}/s" if rate > self.cfg.frag_retry_rate_per_s
                else f"inactive-split ratio {ratio:.2f}" if a.frag_warning else ""
            )

    def _prune(self, t: float) -> None:
        ttl = self.cfg.pid_ttl_s
        now = self.ctx.monotonic()
        for key, st in list(self.procs.items()):
            if t - st.last_seen > ttl:
                for e in st.det.episodes:
                    d = {"gpu": st.gpu, "pid": st.pid, "kind": st.kind, **_episode_dict(e)}
                    if d["cleared_at"] is None:  # leaking until the process went away
                        d["cleared_at"], d["end"] = st.last_seen, "process_exited"
                    d["sites"] = report.episode_sites(self, st.gpu, st.pid, e.onset_estimate, d["cleared_at"])
                    self.past_episodes.append(d)
                del self.procs[key]
        for key, a in list(self.allocs.items()):
            if now - a.last_seen > ttl and not any(p.pid == key[0] for p in self.procs.values()):
                del self.allocs[key]
                self._latest.pop(key, None)
        # Release the label slots of dead PIDs, so the PID label stays bounded by the live
        # processes. Only slots this component took are released (the limiter is shared).
        live = {str(p.pid) for p in self.procs.values()} | {str(a.pid) for a in self.allocs.values()}
        self.sites.keep(int(p) for p in live)
        for pid in list(self._labelled_pids - live):
            self._pid_lim.forget(pid)
            self._labelled_pids.discard(pid)

    # -- classification -------------------------------------------------------------
    def _alloc_for(self, gpu: str, pid: int) -> _Alloc | None:
        cands = [a for a in self.allocs.values() if a.pid == pid and a.rec is not None]
        if not cands:
            return None
        if len(cands) == 1 and sum(1 for p in self.procs.values() if p.pid == pid) <= 1:
            return cands[0]
        for a in cands:
            if str(a.device) == gpu:
                return a
        return None

    def classify(self, rate: float | None, a: _Alloc | None, nvml: bool) -> str:
        """Kind of growth of a leaking process, from the allocator trends."""
        if a is None or not rate or rate <= 0:
            return "unknown"
        ra = a.det_allocated.trend_rate() or 0.0
        rr = a.det_reserved.trend_rate() or 0.0
        if ra >= 0.5 * rate:
            return "tensor"
        if rr >= 0.5 * rate and ra < 0.25 * rate:
            return "cache_fragmentation"
        if nvml and rr < 0.25 * rate:
            return "native"
        return "unknown"

    def _process_view(self) -> Iterator[tuple[str, int, str | None, LeakDetector, str | None, _Alloc | None]]:
        """(gpu, pid, container, detector, kind, alloc) for every process series."""
        done = set()
        for (gpu, pid), st in self.procs.items():
            a = self._alloc_for(gpu, pid)
            kind = self.classify(st.det.rate, a, True) if st.det.verdict == "leak" else None
            if kind is not None and a is not None:
                st.kind = kind
            done.add((pid, a.device) if a else None)
            yield gpu, pid, st.container, st.det, kind, a
        # Processes NVML does not list (no host PID namespace): judge the allocator's reserved bytes.
        for key, a in self.allocs.items():
            if key in done or a.rec is None or any(p.pid == a.pid for p in self.procs.values()):
                continue
            det = a.det_reserved
            kind = self.classify(det.rate, a, False) if det.verdict == "leak" else None
            yield str(a.device), a.pid, None, det, kind, a

    def _growing(self) -> dict[str, float]:
        """GPU -> the summed leak rate of everything leaking on it: its processes and its unattributed memory."""
        growing: dict[str, float] = {}
        for gpu, _p, _c, det, _k, _a in self._process_view():
            if det.verdict == "leak" and det.rate and det.rate > 0:
                growing[gpu] = growing.get(gpu, 0.0) + det.rate
        for gpu, det in self.dev_det.items():
            if det.verdict == "leak" and det.rate and det.rate > 0:
                growing[gpu] = growing.get(gpu, 0.0) + det.rate
        return growing

    def _headroom(self, gpu: str) -> float | None:
        d = self.devices.get(gpu)
        if d is None:
            return None
        if d.free is not None:
            return float(d.free)
        if d.total is not None and d.used is not None:
            return float(d.total - d.used)
        return None

    # -- export ----------------------------------------------------------------------
    def live_samples(self) -> Samples:
        """Everything, built at scrape time from the state (several PIDs may share the overflow label: their
        amounts add up, flags, rates and ratios keep the worst)."""
        out = Samples()
        put = out.combine

        G = self._gpu_lim.get

        def P(pid: str) -> str:
            self._labelled_pids.add(pid)
            return self._pid_lim.get(pid)

        with self._lock:
            for gpu, d in self.devices.items():
                g = (G(gpu),)
                out.put_info(gm.GPU_DEVICE, {"gpu": g[0], "uuid": d.uuid, "name": d.name, "parent": d.parent or ""})
                put(gm.GPU_MEMORY_TOTAL_BYTES, g, d.total)
                put(gm.GPU_MEMORY_USED_BYTES, g, d.used)
                put(gm.GPU_MEMORY_FREE_BYTES, g, d.free)
                put(gm.GPU_MEMORY_RESERVED_BYTES, g, d.reserved)
                put(gm.GPU_UTILIZATION_RATIO, g, d.util_gpu)
                put(gm.GPU_MEMORY_UTILIZATION_RATIO, g, d.util_memory)
                put(gm.GPU_TEMPERATURE_CELSIUS, g, d.temperature_c)
                put(gm.GPU_POWER_WATTS, g, d.power_w)
                det = self.dev_det.get(gpu)
                if det is not None:
                    self._put_leak(put, (g[0], ""), det, self._headroom(gpu), None)
                if d.processes is not None:
                    cp = self.copies.get(gpu)
                    put(gm.GPU_DUPLICATE_MODEL_COPIES, g, cp[0].copies if cp else 0)
                    put(gm.GPU_DUPLICATE_MODEL_EXTRA_BYTES, g, cp[0].extra_bytes if cp else 0)
            for st in self.procs.values():
                put(gm.GPU_PROCESS_MEMORY_USED_BYTES,
                    (G(st.gpu), P(str(st.pid)), self._ctr_lim.get(st.container or "")), st.used)
            for a in self.allocs.values():
                if a.rec is None:
                    continue
                lab = (G(str(a.device)), P(str(a.pid)))
                _, _, _, allocated, reserved, _active, split, retries, ooms, _exp = a.rec
                put(gm.GPU_ALLOCATOR_ALLOCATED_BYTES, lab, allocated)
                put(gm.GPU_ALLOCATOR_RESERVED_BYTES, lab, reserved)
                put(gm.GPU_ALLOCATOR_INACTIVE_SPLIT_BYTES, lab, split)
                put(gm.GPU_ALLOCATOR_FRAGMENTATION_RATIO, lab, split / reserved if reserved else 0.0)
                put(gm.GPU_ALLOCATOR_ALLOC_RETRIES_TOTAL, lab, retries)
                put(gm.GPU_ALLOCATOR_OOMS_TOTAL, lab, ooms)
                put(gm.GPU_FRAGMENTATION_WARNING, lab, 1.0 if a.frag_warning else 0.0)
                used = [p.used for p in self.procs.values() if p.pid == a.pid and p.used is not None
                        and self._alloc_for(p.gpu, p.pid) is a]
                if used:
                    put(gm.GPU_PROCESS_NON_ALLOCATOR_MEMORY_BYTES, lab, used[0] - reserved)
            for gpu, pid, _c, det, kind, _a in self._process_view():
                self._put_leak(put, (G(gpu), P(str(pid))), det, self._headroom(gpu), kind)
            for gpu, rate in self._growing().items():
                put(gm.GPU_DEVICE_TIME_TO_OOM_SECONDS, (G(gpu),), _device_time_to_oom(self._headroom(gpu), rate))
            put(gm.GPU_COLLECTOR_UP, (), 1.0 if self.up else 0.0)
            for (reason, op), st in self.errors.items():
                put(gm.GPU_COLLECTOR_ERRORS_TOTAL, (reason, op), st.count)
            put(gm.GPU_COLLECTOR_LAST_SUCCESS_AGE_SECONDS, (),
                self.ctx.monotonic() - self.last_good if self.last_good is not None else -1.0)
            put(gm.GPU_COLLECTOR_SAMPLES_TOTAL, (), self.samples)
            put(gm.GPU_COLLECTOR_CPU_SECONDS_TOTAL, (), self.cpu_s)
            for reason, n in self.alloc_drops.items():
                put(gm.GPU_ALLOCATOR_RECORDS_DROPPED_TOTAL, (reason,), n)
        return out

    @staticmethod
    def _put_leak(put: Callable[[Any, tuple[str, ...], float | None], None], lab: tuple[str, str], det: LeakDetector, headroom: float | None,
                  kind: str | None) -> None:
        if det.verdict == "insufficient_data":
            put(gm.GPU_LEAK_DETECTED, lab, 0.0)
            return
        put(gm.GPU_LEAK_DETECTED, lab, 1.0 if det.verdict == "leak" else 0.0)
        put(gm.GPU_LEAK_RATE_BYTES_PER_SECOND, lab, det.rate)
        if det.ci:
            put(gm.GPU_LEAK_RATE_LOWER_BYTES_PER_SECOND, lab, det.ci[0])
            put(gm.GPU_LEAK_RATE_UPPER_BYTES_PER_SECOND, lab, det.ci[1])
        put(gm.GPU_LEAK_TIME_TO_OOM_SECONDS, lab, det.time_to_oom(headroom))
        put(gm.GPU_LEAK_DETECTED_TIMESTAMP_SECONDS, lab, det.detected_at)
        eps = det.episodes
        if det.verdict == "leak" and eps:
            put(gm.GPU_LEAK_ONSET_TIMESTAMP_SECONDS, lab, eps[-1].onset_estimate)
        if kind is not None and lab[1]:
            for k in KINDS:
                put(gm.GPU_LEAK_KIND, (*lab, k), 1.0 if k == kind else 0.0)

    def status(self) -> dict[str, Any]:
        """JSON-able state for /v1/status: backend, versions, devices, processes, leaks, faults (gpu/report.py)."""
        now = self.ctx.monotonic()
        with self._lock:
            self.fold_sites()
            return report.status(self, now)


def build(config: GpuConfig, ctx: ComponentContext, sampler: Any = None) -> GpuComponent:
    """Build the gpu component from its config section (called by the daemon).

    Args:
        config: the ``gpu:`` section.
        ctx: the daemon's context.
        sampler: override the sampler (tests).

    Raises:
        ValueError: a replay file cannot be read or parsed (start-up stops with the message).
    """
    backend = config.backend
    if sampler is None:
        if backend == "fake":
            sampler = _fake_sampler(config, ctx)
        elif backend == "replay":
            from inferwatch_sidecar.components.gpu.replay import LogError, ReplaySampler, parse_log

            try:
                logs = [parse_log(p) for p in config.replay.files]
            except LogError as e:
                raise ValueError(f"gpu.replay.files: {e}") from e
            sampler = ReplaySampler(logs, loop=config.replay.loop)
        else:
            sampler = NvmlSampler(_load_pynvml, clock=ctx.clock, reinit_s=config.reinit_s, monotonic=ctx.monotonic)
            if backend == "auto" and sampler.init() is not None:
                ctx.logger.warning("gpu: NVML unavailable (%s); GPU monitoring is absent. %s",
                                   sampler.init_fault.message if sampler.init_fault else "",
                                   sampler.init_fault.fix if sampler.init_fault else "")
    comp = GpuComponent(config, ctx, sampler, backend)
    if backend == "auto" and getattr(sampler, "init_fault", None) is not None:
        comp.absent_reason = sampler.init_fault
    return comp

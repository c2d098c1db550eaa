"""The gpu component's ``/v1/status`` section, built from its state (the component's lock held).

Split out of ``component.py`` (issue 23): one function per part of the section
(faults, processes and leaks, devices, episodes, allocator, overall state).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferwatch_sidecar.components.gpu.detector import Episode, LeakDetector
from inferwatch_sidecar.components.gpu.duplicates import FIX as DUPLICATES_FIX
from inferwatch_sidecar.components.gpu.duplicates import Copies
from inferwatch_sidecar.components.gpu.sampler import FIX
from inferwatch_sidecar.components.gpu.sites import in_episode

if TYPE_CHECKING:
    from inferwatch_sidecar.components.gpu.component import GpuComponent, _Alloc

#: Leak episodes kept in ``/v1/status`` per component (live series and series of processes that exited).
EPISODE_HISTORY = 32


#: ``inferwatch_gpu_leak_kind``'s values (kept for the alerts that read them) as the causes ``gpu analyze``
#: names (``allocator_log.CAUSES``); cache growth is fragmentation while the fragmentation warning holds.
def cause_of(kind: str | None, a: _Alloc | None) -> str | None:
    """The cause name of a live kind: tensor, allocator_cache, fragmentation, outside_allocator or unknown."""
    if kind is None:
        return None
    if kind == "cache_fragmentation":
        return "fragmentation" if a is not None and a.frag_warning else "allocator_cache"
    return {"tensor": "tensor", "native": "outside_allocator"}.get(kind, "unknown")


def _episode_dict(e: Episode) -> dict[str, Any]:
    return {"onset_estimate": e.onset_estimate, "detected_at": e.detected_at, "cleared_at": e.cleared_at,
            "end": e.end, "rate_bytes_per_s": e.rate, "rate_ci_bytes_per_s": list(e.rate_ci)}


def _sites_device(comp: GpuComponent, gpu: str, pid: int) -> int | None:
    """The CUDA device whose captures belong to the process series on ``gpu`` (None: any of the process's)."""
    a = comp._alloc_for(gpu, pid)
    return a.device if a is not None else None


def episode_sites(comp: GpuComponent, gpu: str, pid: int | None, onset: float,
                  cleared: float | None) -> dict[str, Any] | None:
    """The allocation sites the probe's second stage captured during an episode of ``pid`` on ``gpu`` (None:
    no capture then, or a device series)."""
    if pid is None:
        return None
    return in_episode(comp.sites.of(pid, _sites_device(comp, gpu, pid)), onset, cleared)


def _leak_dict(det: LeakDetector, headroom: float | None) -> dict[str, Any]:
    eps = det.episodes
    return {
        "verdict": det.verdict,
        "rate_bytes_per_s": det.rate,
        "rate_ci_bytes_per_s": list(det.ci) if det.ci else None,
        "time_to_oom_s": det.time_to_oom(headroom),
        "detected_at": det.detected_at,
        "onset_estimate": eps[-1].onset_estimate if eps and eps[-1].cleared_at is None else None,
        "episodes": [_episode_dict(e) for e in eps],
    }


def _device_time_to_oom(headroom: float | None, growing_rate: float | None) -> float | None:
    """Seconds until the device is full when its growing processes keep their summed rate, or None."""
    if headroom is None or not growing_rate or growing_rate <= 0:
        return None
    return max(0.0, headroom) / growing_rate


def _copies_dict(cp: Copies) -> dict[str, Any]:
    return {"copies": cp.copies, "pids": list(cp.pids), "used_bytes": list(cp.sizes),
            "copy_bytes": cp.copy_bytes, "extra_bytes": cp.extra_bytes}


def status(comp: GpuComponent, now: float) -> dict[str, Any]:
    """JSON-able state for /v1/status: backend, versions, devices, processes, leaks, faults (lock held)."""
    absent = comp.backend == "auto" and comp.last_good is None and comp.absent_reason is not None
    faults = _faults(comp, now)
    growing = comp._growing()
    procs_by_gpu, leaks = _processes(comp, growing)
    copies = [{"gpu": gpu, **_copies_dict(cp), "since": since, "fix": DUPLICATES_FIX}
              for gpu, (cp, since) in sorted(comp.copies.items())]
    devices = _devices(comp, procs_by_gpu, leaks, copies, growing)
    episodes = _episodes(comp)
    allocator = _allocator(comp)
    state = "absent" if absent else ("ok" if comp.up and not any(
        f["last_seen_s_ago"] < 3 * comp.cfg.interval_s for f in faults) else ("degraded" if comp.up else
                                                                              "failing"))
    if comp.samples == 0:
        state = "starting"
    sampler = comp.sampler
    out: dict[str, Any] = {
        "backend": "absent" if absent else comp.backend,
        "state": state,
        "driver_version": getattr(sampler, "driver_version", None),
        "nvml_version": getattr(sampler, "nvml_version", None),
        "memory_info_version": getattr(sampler, "memory_info_version", None),
        "interval_s": comp.cfg.interval_s,
        "samples": comp.samples,
        "sampler_cpu_s": round(comp.cpu_s, 6),
        "last_good_sample_age_s": None if comp.last_good is None else round(now - comp.last_good, 3),
        "devices": devices,
        "allocator": allocator,
        "leaks": leaks,
        "duplicate_model_copies": copies,
        "episodes": episodes[-EPISODE_HISTORY:],
        "faults": faults,
        "allocator_records_dropped": dict(comp.alloc_drops),
    }
    if absent and comp.absent_reason is not None:
        out["message"] = f"no GPU monitoring: {comp.absent_reason.message}. Fix: {comp.absent_reason.fix}"
    return out


def _faults(comp: GpuComponent, now: float) -> list[dict[str, Any]]:
    return [
        {"error": reason, "op": op, "gpu": st.gpu, "count": st.count, "message": st.message,
         "fix": FIX.get(reason, FIX["unknown"]), "last_seen_s_ago": round(now - st.last, 3)}
        for (reason, op), st in sorted(comp.errors.items())
    ]


def _processes(comp: GpuComponent, growing: dict[str, float]
               ) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Every process series by GPU, and the leaks among them."""
    procs_by_gpu: dict[str, list[dict[str, Any]]] = {}
    leaks = []
    for gpu, pid, cont, det, kind, a in comp._process_view():
        entry: dict[str, Any] = {"pid": pid, "container": cont, **_leak_dict(det, comp._headroom(gpu))}
        entry["device_time_to_oom_s"] = _device_time_to_oom(comp._headroom(gpu), growing.get(gpu))
        st = comp.procs.get((gpu, pid))
        entry["used_bytes"] = st.used if st else None
        entry["series"] = "nvml" if st else "allocator_reserved"
        entry["sites"] = comp.sites.latest(pid, _sites_device(comp, gpu, pid))
        if det.verdict == "leak":
            entry["kind"] = kind
            entry["cause"] = cause_of(kind, a)
            ep = det.episodes[-1] if det.episodes else None
            leaks.append({"gpu": gpu, "pid": pid, "kind": kind, "cause": entry["cause"],
                          "rate_bytes_per_s": det.rate,
                          "time_to_oom_s": entry["time_to_oom_s"], "detected_at": det.detected_at,
                          "sites": episode_sites(comp, gpu, pid, ep.onset_estimate, ep.cleared_at) if ep else None})
        procs_by_gpu.setdefault(gpu, []).append(entry)
    return procs_by_gpu, leaks


def _devices(comp: GpuComponent, procs_by_gpu: dict[str, list[dict[str, Any]]], leaks: list[dict[str, Any]],
             copies: list[dict[str, Any]], growing: dict[str, float]) -> list[dict[str, Any]]:
    """Every device with its own leak judgement and its processes; its leak, if any, appended to ``leaks``."""
    devices = []
    for gpu, d in comp.devices.items():
        det = comp.dev_det[gpu]
        leak = _leak_dict(det, comp._headroom(gpu))
        if det.verdict == "leak":
            leaks.append({"gpu": gpu, "pid": None, "kind": None, "sites": None, "rate_bytes_per_s": det.rate,
                          "time_to_oom_s": leak["time_to_oom_s"], "detected_at": det.detected_at})
        devices.append({
            "gpu": gpu, "uuid": d.uuid, "name": d.name, "parent": d.parent, "total_bytes": d.total,
            "used_bytes": d.used, "free_bytes": d.free, "reserved_bytes": d.reserved,
            "utilization": d.util_gpu, "temperature_c": d.temperature_c, "power_w": d.power_w,
            "per_process_memory": d.processes is not None,
            "leak": leak, "processes": procs_by_gpu.get(gpu, []),
            "device_time_to_oom_s": _device_time_to_oom(comp._headroom(gpu), growing.get(gpu)),
            "duplicate_model_copies": next((c for c in copies if c["gpu"] == gpu), None),
        })
    return devices


def _episodes(comp: GpuComponent) -> list[dict[str, Any]]:
    """Past and live leak episodes, oldest detection first."""
    episodes = list(comp.past_episodes)
    for gpu, pid, _c, det, kind, a in comp._process_view():
        st = comp.procs.get((gpu, pid))
        k = kind or (st.kind if st is not None else None)
        episodes += [{"gpu": gpu, "pid": pid, "kind": k if a is not None else None, **_episode_dict(e),
                      "sites": episode_sites(comp, gpu, pid, e.onset_estimate, e.cleared_at)}
                     for e in det.episodes]
    for gpu, det in comp.dev_det.items():
        episodes += [{"gpu": gpu, "pid": None, "kind": None, **_episode_dict(e), "sites": None} for e in det.episodes]
    episodes.sort(key=lambda e: e["detected_at"])
    return episodes


def _allocator(comp: GpuComponent) -> list[dict[str, Any]]:
    """The latest allocator record of every (pid, device) that sent one."""
    allocator = []
    for a in comp.allocs.values():
        if a.rec is None:
            continue
        allocator.append({
            "pid": a.pid, "device": a.device, "allocated_bytes": a.rec[3], "reserved_bytes": a.rec[4],
            "inactive_split_bytes": a.rec[6], "alloc_retries": a.rec[7], "ooms": a.rec[8],
            "fragmentation_ratio": a.rec[6] / a.rec[4] if a.rec[4] else 0.0,
            "fragmentation_warning": a.frag_warning, "fragmentation_reason": a.frag_reason or None,
            "sites": comp.sites.latest(a.pid, a.device),
        })
    return allocator

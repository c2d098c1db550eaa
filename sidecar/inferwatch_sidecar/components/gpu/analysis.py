"""Offline analysis: the live leak detector run over recorded nvidia-smi logs."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from inferwatch_sidecar.components.gpu.allocator_log import (
    AllocLog,
    AllocRow,
    is_allocator_log,
    name_cause,
    parse_allocator_log,
)
from inferwatch_sidecar.components.gpu.config import DetectorConfig, DuplicatesConfig
from inferwatch_sidecar.components.gpu.detector import Episode, LeakDetector
from inferwatch_sidecar.components.gpu.duplicates import BINS, Copies, FlatTracker, find_copies
from inferwatch_sidecar.components.gpu.duplicates import FIX as DUPLICATES_FIX
from inferwatch_sidecar.components.gpu.replay import ParsedLog, Row, file_size, parse_log
from inferwatch_sidecar.components.gpu.sites import in_episode


@dataclass
class Series:
    """One analysed series, kept for the plot.

    Attributes:
        label: ``GPU 0 (NVIDIA H100 80GB HBM3)``, plus `` pid 4242`` for a process.
        t: sample times, seconds.
        v: used bytes.
        det: the detector after the whole series.
        result: the series' entry of ``results``.
        headroom: free device memory at the end of the log, bytes (None when unknown).
    """

    label: str
    t: list[float]
    v: list[float]
    det: LeakDetector
    result: dict[str, Any]
    headroom: float | None


@dataclass
class Analysis:
    """What :func:`run` found: the JSON-able result and the series behind it."""

    result: dict[str, Any]
    series: list[Series] = field(default_factory=list)


def analyze(paths: list[str], cfg: DetectorConfig | None = None,
            progress: Callable[[int], None] | None = None,
            duplicates: DuplicatesConfig | None = None) -> dict[str, Any]:
    """Run one detector per device and per (device, pid) series; see :func:`run`.

    Returns:
        ``{"results": [...], "duplicate_model_copies": [...], "files": [...]}``; each result has
        ``device`` (the device index, or the UUID when no GPU log names the device), ``uuid``, ``name``
        (the product name when a log has it), ``pid`` (None for a device), ``verdict`` (at the end of the
        log; a process that left the log keeps its last episode's), ``ended`` (for a process that left
        the log before its end: the time of its last row, else None), ``leak_rate_bytes_per_s``,
        ``time_to_oom_s`` (the series' own: free memory over its own rate; None once a process left the
        log), ``device_time_to_oom_s`` (when the device runs out at the summed rate of everything on it
        still leaking at the end of the log: its processes and its unattributed memory), ``detected_at`` (the log's timestamp of the first
        detection of any episode, or None), the rate's interval, the sample count and ``episodes``:
        every leak episode with ``onset_estimate``, ``detected_at``, ``cleared_at`` (None while still
        leaking at the end of the log), ``end``, ``rate_bytes_per_s``, ``rate_ci_bytes_per_s`` and
        ``kind``: the cause (``allocator_log.CAUSES``) where an allocator file covers the process, else
        None, and (for a process) ``sites``: the newest capture of the torch probe's second stage taken
        during the episode (``{"captured_at", "sites": [{"file", "line", "function", "bytes", "count"}]}``,
        from an allocator file's site lines), else None. ``series`` is ``nvml`` (what nvidia-smi reported), ``nvml_unattributed`` (a device whose
        processes are logged too: its used memory minus what they hold, as the live sidecar judges it) or
        ``allocator_allocated`` (a process's allocated floor from an allocator file: allocator first). ``duplicate_model_copies`` lists, per
        device, the largest set of duplicated model copies seen (``components.gpu.duplicates``).

    Raises:
        LogError: a file cannot be read or parsed.
    """
    return run(paths, cfg, progress, duplicates).result


def run(paths: list[str], cfg: DetectorConfig | None = None, progress: Callable[[int], None] | None = None,
        duplicates: DuplicatesConfig | None = None, keep_series: bool = False) -> Analysis:
    """Read the logs and analyse every series.

    Args:
        paths: nvidia-smi CSV logs and allocator files (``allocator_log``; told apart by content).
        cfg: detector settings.
        progress: called with the total bytes read so far.
        duplicates: duplicated-copies thresholds.
        keep_series: keep every series' samples in ``Analysis.series`` (for the plot).

    Raises:
        LogError: a file cannot be read or parsed.
    """
    cfg = cfg or DetectorConfig()
    dcfg = duplicates or DuplicatesConfig()
    logs = _Logs.read(paths, progress)
    out = Analysis({})
    results = []
    for (dev, pid), rows in sorted(logs.series.items(),
                                   key=lambda kv: (kv[0][0], kv[0][1] is not None, kv[0][1] or 0)):
        res, found = _judge_series(logs, dev, pid, rows, cfg, keep_series)
        results.append(res)
        if found is not None:
            out.series.append(found)
    results.extend(_allocator_results(logs, cfg))
    _device_time_to_oom(results)
    out.result = {
        "results": results,
        "duplicate_model_copies": _duplicates(logs, dcfg),
        "files": [{"path": lg.path, "kind": lg.kind, "rows": len(lg.rows), "skipped_rows": dict(lg.bad_rows)}
                  for lg in [*logs.logs, *logs.alloc_logs]],
    }
    return out


@dataclass
class _Logs:
    """The logs read, and the series and device identities :func:`run` finds in them."""

    logs: list[ParsedLog]
    alloc_logs: list[AllocLog]
    #: the allocator files that hold captures of the second stage (their sites, by pid and device)
    sites: list[AllocLog] = field(default_factory=list)
    #: (pid, device) -> the allocator rows of that process
    alloc: dict[tuple[int, int], list[AllocRow]] = field(default_factory=dict)
    #: (device, pid or None) -> the nvidia-smi rows of that series
    series: dict[tuple[str, int | None], list[Row]] = field(default_factory=dict)
    #: Device identity by UUID (GPU logs give the index and maybe the name; compute-apps logs only the UUID
    #: and maybe the name), and free memory over time, for the time to OOM.
    index_of: dict[str, str] = field(default_factory=dict)
    name_of: dict[str, str] = field(default_factory=dict)
    free_by_uuid: dict[str, list[Row]] = field(default_factory=dict)
    log_end: float = 0.0

    @classmethod
    def read(cls, paths: list[str], progress: Callable[[int], None] | None) -> _Logs:
        logs = []
        alloc_logs: list[AllocLog] = []
        base = 0
        for p in paths:
            off = base
            if is_allocator_log(p):
                alloc_logs.append(parse_allocator_log(p))
                if progress is not None:
                    progress(off + file_size(p))
            else:
                logs.append(parse_log(p, None if progress is None else (lambda n, off=off: progress(off + n))))
            base += file_size(p)
        out = cls(logs, alloc_logs, [lg for lg in alloc_logs if lg.captures])
        for alog in alloc_logs:
            for ar in alog.rows:
                out.alloc.setdefault((ar.pid, ar.device), []).append(ar)
        for log in logs:
            for r in log.rows:
                out.series.setdefault((r.device, r.pid), []).append(r)
        for log in logs:
            for r in log.rows:
                if r.uuid and r.pid is None:
                    out.index_of[r.uuid] = r.device
                    out.free_by_uuid.setdefault(r.uuid, []).append(r)
                if r.uuid and r.name:
                    out.name_of.setdefault(r.uuid, r.name)
        out.log_end = max([r.t for log in logs for r in log.rows] + [a.t for lg in alloc_logs for a in lg.rows]
                          or [0.0])
        return out


def _headroom(logs: _Logs, dev: str, pid: int | None, rows: list[Row]) -> float | None:
    """Free device memory at the end of the series (a device's own rows, or its device's for a process)."""
    headroom = None
    if pid is None:
        last = rows[-1]
        if last.free is not None:
            headroom = float(last.free)
        elif last.total is not None and last.used is not None:
            headroom = float(last.total - last.used)
    else:
        dev_rows = logs.free_by_uuid.get(dev)
        if dev_rows:
            last = max(dev_rows, key=lambda r: r.t)
            headroom = None if last.free is None else float(last.free)
    return headroom


def _judge_series(logs: _Logs, dev: str, pid: int | None, rows: list[Row], cfg: DetectorConfig, keep: bool
                  ) -> tuple[dict[str, Any], Series | None]:
    """One series through a fresh detector: its entry of ``results`` and, with ``keep``, its samples (the plot)."""
    rows.sort(key=lambda r: r.t)
    det = LeakDetector(cfg)
    # A device whose processes are logged too is judged, as the live sidecar judges it, on the memory no
    # process accounts for: a process's leak is then reported once (in its own row), not twice.
    tv = _unattributed(rows, logs.series, rows[-1].uuid) if pid is None else None
    kind_of_series = "nvml" if tv is None else "nvml_unattributed"
    if tv is None:
        tv = [(r.t, float(r.used)) for r in rows if r.used is not None]
    for t, v in tv:
        det.update(t, v)
    headroom = _headroom(logs, dev, pid, rows)
    # A process that leaked until it vanished from the log (a restart, an exit): its episode ended there,
    # its verdict is its last episode's (with ``ended``), and it has no time to OOM.
    ended = rows[-1].t < logs.log_end - PASS_S
    leak = det.verdict == "leak" and not ended
    eps = [_episode(e, rows[-1].t if ended else None) for e in det.episodes]
    uuid = rows[-1].uuid
    index = dev if pid is None else logs.index_of.get(dev, dev)
    arows = None if pid is None else _alloc_rows(logs.alloc, pid, index)
    if pid is not None:
        for e, d in zip(det.episodes, eps, strict=True):
            end_t = e.cleared_at if e.cleared_at is not None else (rows[-1].t if ended else logs.log_end)
            d["sites"] = _episode_sites(logs, pid, index, e.onset_estimate, end_t)
    if arows is not None:
        nt = np.array([r.t for r in rows if r.used is not None])
        nv = np.array([float(r.used) for r in rows if r.used is not None])
        for e, d in zip(det.episodes, eps, strict=True):
            end_t = e.cleared_at if e.cleared_at is not None else (rows[-1].t if ended else logs.log_end)
            d["kind"] = name_cause(nt, nv, arows, e.onset_estimate, end_t)
    name = logs.name_of.get(uuid) or None
    res = {
        "device": index,
        "uuid": uuid or None,
        "name": name,
        "pid": pid,
        "series": kind_of_series,
        "verdict": det.verdict,
        "ended": stamp(rows[-1].t) if ended and pid is not None else None,
        "leak_rate_bytes_per_s": det.rate if det.verdict != "insufficient_data" else None,
        "leak_rate_ci_bytes_per_s": list(det.ci) if det.ci and det.verdict != "insufficient_data" else None,
        "time_to_oom_s": det.time_to_oom(headroom) if leak else None,
        "device_time_to_oom_s": None,
        "detected_at": eps[0]["detected_at"] if eps else None,
        "samples": det.samples,
        "episodes": eps,
        "_growing": leak and bool(det.rate) and (det.rate or 0.0) > 0,
        "_headroom": headroom,
    }
    if not keep:
        return res, None
    label = f"GPU {index}" + (f" ({name})" if name else "") + ("" if pid is None else f" pid {pid}")
    return res, Series(label, [t for t, _ in tv], [v for _, v in tv], det, res, headroom)


def _device_time_to_oom(results: list[dict[str, Any]]) -> None:
    """Several processes growing together: the device runs out at their summed rate (and the helper keys go)."""
    rate_by_uuid: dict[str, float] = {}
    for res in results:
        if res["_growing"] and res["uuid"] and res["series"] in ("nvml", "nvml_unattributed"):
            rate_by_uuid[res["uuid"]] = rate_by_uuid.get(res["uuid"], 0.0) + res["leak_rate_bytes_per_s"]
    for res in results:
        rate = rate_by_uuid.get(res["uuid"] or "")
        headroom = res.pop("_headroom")
        res.pop("_growing")
        if rate and headroom is not None:
            res["device_time_to_oom_s"] = max(0.0, headroom) / rate


def _duplicates(logs: _Logs, dcfg: DuplicatesConfig) -> list[dict[str, Any]]:
    """Per device, the largest set of duplicated model copies its processes' logs show."""
    copies = []
    procs_by_uuid: dict[str, dict[int, list[Row]]] = {}
    for (dev, pid), rows in logs.series.items():
        if pid is not None:
            procs_by_uuid.setdefault(dev, {})[pid] = rows
    for uuid, procs in sorted(procs_by_uuid.items()):
        found = _copies(procs, dcfg, logs.log_end)
        if found is not None:
            copies.append({"device": logs.index_of.get(uuid, uuid), "uuid": uuid or None,
                           "name": logs.name_of.get(uuid), **found, "fix": DUPLICATES_FIX})
    return copies


def _unattributed(rows: list[Row], series: dict[tuple[str, int | None], list[Row]],
                  uuid: str | None) -> list[tuple[float, float]] | None:
    """``(t, used minus what the processes listed at t hold)`` for a device's rows, or None (no process log).

    Each device row is matched with the latest nvidia-smi pass of its processes (:func:`passes`) stamped
    at most :data:`PASS_S` after it; a row whose latest pass is older than three pass intervals has no
    known attribution and is left out.
    """
    if not uuid:
        return None
    events = sorted((r.t, pid, float(r.used)) for (d, pid), prow in series.items()
                    if d == uuid and pid is not None for r in prow if r.used is not None)
    if not events:
        return None
    groups = passes(events)
    pt = np.array([g[0][0] for g in groups])
    ps = np.array([sum(v for _, _, v in g) for g in groups])
    stale = max(3.0 * float(np.median(np.diff(pt))) if len(pt) > 1 else 0.0, 2 * PASS_S)
    out = []
    for r in rows:
        if r.used is None:
            continue
        k = int(np.searchsorted(pt, r.t + PASS_S, side="right")) - 1
        if k >= 0 and r.t - pt[k] <= stale:
            out.append((r.t, float(r.used) - float(ps[k])))
    return out


#: Rows of one nvidia-smi pass carry their own stamps, a few milliseconds apart; rows within this many seconds
#: of the pass's first row belong to it (a PID listed again starts the next pass, for sub-second sampling).
PASS_S = 1.0


def passes(events: list[tuple[float, int, float]]) -> list[list[tuple[float, int, float]]]:
    """Sorted ``(t, pid, used)`` rows of one device, grouped into nvidia-smi passes.

    A pass starts at a row more than :data:`PASS_S` after the pass's first row, or at a PID the pass has
    already listed.
    """
    out: list[list[tuple[float, int, float]]] = []
    seen: set[int] = set()
    for ev in events:
        if not out or ev[0] - out[-1][0][0] > PASS_S or ev[1] in seen:
            out.append([])
            seen = set()
        out[-1].append(ev)
        seen.add(ev[1])
    return out


def _copies(procs: dict[int, list[Row]], dcfg: DuplicatesConfig, log_end: float) -> dict[str, Any] | None:
    """The set of duplicated model copies with the most extra bytes seen on one device, over the log.

    Rows are grouped into nvidia-smi passes (:func:`passes`); a process missing from a pass has exited
    or restarted, and its history is dropped.
    """
    events = sorted((r.t, pid, float(r.used)) for pid, rows in procs.items() for r in rows if r.used is not None)
    tol = dcfg.flat_s / BINS
    trackers: dict[int, FlatTracker] = {}
    best: tuple[Copies, float] | None = None
    first = last = None
    judged = -math.inf
    groups = passes(events)
    for k, group in enumerate(groups):
        for t, pid, used in group:
            trackers.setdefault(pid, FlatTracker(dcfg.flat_s)).update(t, used)
        listed = {pid for _, pid, _ in group}
        for pid in [p for p in trackers if p not in listed]:
            del trackers[pid]
        t = group[-1][0]
        # Judged four times per tracker bin (and at the end), so a week of 1 s samples costs little.
        if t - judged < tol / 4 and k < len(groups) - 1:
            continue
        judged = t
        levels = {}
        for pid, tr in trackers.items():
            v = tr.flat_level(t, dcfg)
            if v is not None:
                levels[pid] = v
        found = find_copies(levels, dcfg)
        if found is None:
            continue
        first = t if first is None else first
        last = t
        if best is None or found.extra_bytes > best[0].extra_bytes:
            best = (found, t)
    if best is None or first is None or last is None:
        return None
    cp = best[0]
    return {"copies": cp.copies, "pids": list(cp.pids), "used_bytes": list(cp.sizes), "copy_bytes": cp.copy_bytes,
            "extra_bytes": cp.extra_bytes, "at": stamp(best[1]), "first_seen": stamp(first),
            "last_seen": stamp(last), "at_end": last >= log_end - tol}


def _episode_sites(logs: _Logs, pid: int, device: str, onset: float, end: float) -> dict[str, Any] | None:
    """The newest capture of ``pid``'s allocation sites taken during an episode (onset to ``end``), by the
    device's index (a process with captures on one device alone: those), or None."""
    best = None
    for lg in logs.sites:
        devs = lg.sites.devices(pid)
        dev = int(device) if device.isdigit() and int(device) in devs else devs[0] if len(devs) == 1 else None
        got = in_episode(lg.sites.of(pid, dev), onset, end) if dev is not None else None
        if got is not None and (best is None or got["captured_at"] > best["captured_at"]):
            best = got
    return best


def _alloc_rows(alloc: dict[tuple[int, int], list[AllocRow]], pid: int, device: str) -> list[AllocRow] | None:
    """The allocator samples of a process on one device (by index; a process on one device alone: that one)."""
    cands = {d: rows for (p, d), rows in alloc.items() if p == pid}
    if not cands:
        return None
    if device.isdigit() and int(device) in cands:
        return cands[int(device)]
    return next(iter(cands.values())) if len(cands) == 1 else None


def _allocator_results(logs: _Logs, cfg: DetectorConfig) -> list[dict[str, Any]]:
    """Allocator first: the same detector on each process's allocated floor (live tensors: no cache sawtooth).

    Each episode of that series is a tensor leak by construction; its ``kind`` still comes from
    :func:`name_cause` over the allocator's own counters.
    """
    out = []
    log_end = logs.log_end
    for (pid, dev), rows in sorted(logs.alloc.items()):
        rows.sort(key=lambda r: r.t)
        det = LeakDetector(cfg)
        for r in rows:
            det.update(r.t, r.allocated)
        ended = rows[-1].t < log_end - PASS_S
        eps = [_episode(e, rows[-1].t if ended else None) for e in det.episodes]
        for e, d in zip(det.episodes, eps, strict=True):
            end_t = e.cleared_at if e.cleared_at is not None else rows[-1].t
            d["kind"] = name_cause(np.zeros(0), np.zeros(0), rows, e.onset_estimate, end_t)
            d["sites"] = _episode_sites(logs, pid, str(dev), e.onset_estimate, end_t)
        out.append({
            "device": str(dev), "uuid": None, "name": None, "pid": pid, "series": "allocator_allocated",
            "verdict": det.verdict,
            "leak_rate_bytes_per_s": det.rate if det.verdict != "insufficient_data" else None,
            "leak_rate_ci_bytes_per_s": list(det.ci) if det.ci and det.verdict != "insufficient_data" else None,
            "time_to_oom_s": None, "device_time_to_oom_s": None, "ended": stamp(rows[-1].t) if ended else None,
            "detected_at": eps[0]["detected_at"] if eps else None, "samples": det.samples, "episodes": eps,
            "_growing": False, "_headroom": None,
        })
    return out


def stamp(t: float) -> str:
    """Seconds since the epoch as an nvidia-smi timestamp (``2024/01/31 12:00:00.123``, UTC as read)."""
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


def _episode(e: Episode, series_end: float | None) -> dict[str, Any]:
    cleared, end = e.cleared_at, e.end
    if cleared is None and series_end is not None:
        cleared, end = series_end, "series_ended"
    return {
        "onset_estimate": stamp(e.onset_estimate),
        "detected_at": stamp(e.detected_at),
        "cleared_at": None if cleared is None else stamp(cleared),
        "end": end,
        "rate_bytes_per_s": e.rate,
        "rate_ci_bytes_per_s": list(e.rate_ci),
        "kind": None,
    }

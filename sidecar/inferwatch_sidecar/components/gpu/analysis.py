"""Offline analysis: the live leak detector run over recorded nvidia-smi logs."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from inferwatch_sidecar.components.gpu.config import DetectorConfig
from inferwatch_sidecar.components.gpu.detector import Episode, LeakDetector
from inferwatch_sidecar.components.gpu.replay import Row, file_size, parse_log


def analyze(paths: list[str], cfg: DetectorConfig | None = None,
            progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Run one detector per device and per (device, pid) series.

    Args:
        paths: nvidia-smi CSV logs.
        cfg: detector settings.
        progress: called with the total bytes read so far.

    Returns:
        ``{"results": [...], "files": [...]}``; each result has ``device``, ``pid``
        (None for a device), ``verdict`` (at the end of the log), ``leak_rate_bytes_per_s``,
        ``time_to_oom_s``, ``detected_at`` (the log's timestamp of the first detection of
        any episode, or None), the rate's interval, the sample count and ``episodes``:
        every leak episode with ``onset_estimate``, ``detected_at``, ``cleared_at`` (None
        while still leaking at the end of the log), ``end``, ``rate_bytes_per_s``,
        ``rate_ci_bytes_per_s`` and ``kind`` (None: nvidia-smi logs carry no allocator data).

    Raises:
        LogError: a file cannot be read or parsed.
    """
    cfg = cfg or DetectorConfig()
    logs = []
    base = 0
    for p in paths:
        off = base
        logs.append(parse_log(p, None if progress is None else (lambda n, off=off: progress(off + n))))
        base += file_size(p)
    series: dict[tuple[str, int | None], list[Row]] = {}
    for log in logs:
        for r in log.rows:
            series.setdefault((r.device, r.pid), []).append(r)
    # Device free memory over time, for the per-process time to OOM (joined by UUID).
    free_by_uuid: dict[str, list[Row]] = {}
    for (_dev, pid), rows in series.items():
        if pid is None:
            for r in rows:
                if r.uuid:
                    free_by_uuid.setdefault(r.uuid, []).append(r)
    log_end = max((r.t for log in logs for r in log.rows), default=0.0)
    results = []
    for (dev, pid), rows in sorted(series.items(), key=lambda kv: (kv[0][0], kv[0][1] is not None, kv[0][1] or 0)):
        rows.sort(key=lambda r: r.t)
        det = LeakDetector(cfg)
        for r in rows:
            if r.used is not None:
                det.update(r.t, float(r.used))
        headroom = None
        if pid is None:
            last = rows[-1]
            if last.free is not None:
                headroom = float(last.free)
            elif last.total is not None and last.used is not None:
                headroom = float(last.total - last.used)
        else:
            dev_rows = free_by_uuid.get(dev)
            if dev_rows:
                last = max(dev_rows, key=lambda r: r.t)
                headroom = None if last.free is None else float(last.free)
        leak = det.verdict == "leak"
        # A process that leaked until it vanished from the log (a restart, an exit): its episode ended there.
        ended = rows[-1].t < log_end
        eps = [_episode(e, rows[-1].t if ended else None) for e in det.episodes]
        results.append({
            "device": dev,  # as the log gives it: the index in GPU logs, the UUID in compute-apps logs
            "pid": pid,
            "verdict": det.verdict,
            "leak_rate_bytes_per_s": det.rate if det.verdict != "insufficient_data" else None,
            "leak_rate_ci_bytes_per_s": list(det.ci) if det.ci and det.verdict != "insufficient_data" else None,
            "time_to_oom_s": det.time_to_oom(headroom) if leak else None,
            "detected_at": eps[0]["detected_at"] if eps else None,
            "samples": det.samples,
            "episodes": eps,
        })
    return {
        "results": results,
        "files": [{"path": lg.path, "kind": lg.kind, "rows": len(lg.rows), "skipped_rows": dict(lg.bad_rows)}
                  for lg in logs],
    }


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

"""Offline analysis: the live leak detector run over recorded nvidia-smi logs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inferwatch_sidecar.components.gpu.config import DetectorConfig
from inferwatch_sidecar.components.gpu.detector import LeakDetector
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
        (None for a device), ``verdict``, ``leak_rate_bytes_per_s``, ``time_to_oom_s``
        and ``detected_at`` (the log's timestamp of the first sample at which the
        leak verdict held, or None), plus the rate's interval and sample count.

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
    results = []
    for (dev, pid), rows in sorted(series.items(), key=lambda kv: (kv[0][0], kv[0][1] is not None, kv[0][1] or 0)):
        rows.sort(key=lambda r: r.t)
        det = LeakDetector(cfg)
        stamp_at: str | None = None
        for r in rows:
            if r.used is None:
                continue
            before = det.detected_at
            det.update(r.t, float(r.used))
            if det.detected_at is not None and det.detected_at != before:
                stamp_at = r.stamp
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
        results.append({
            "device": dev,  # as the log gives it: the index in GPU logs, the UUID in compute-apps logs
            "pid": pid,
            "verdict": det.verdict,
            "leak_rate_bytes_per_s": det.rate if det.verdict != "insufficient_data" else None,
            "leak_rate_ci_bytes_per_s": list(det.ci) if det.ci and det.verdict != "insufficient_data" else None,
            "time_to_oom_s": det.time_to_oom(headroom) if leak else None,
            "detected_at": stamp_at if leak else None,
            "samples": det.samples,
        })
    return {
        "results": results,
        "files": [{"path": lg.path, "kind": lg.kind, "rows": len(lg.rows), "skipped_rows": dict(lg.bad_rows)}
                  for lg in logs],
    }

"""The GPU monitor's bad-now rows for the status summary (``export/summary.py``), from its ``/v1/status`` section.

Declared in ``components/registry.py``; thresholds are those of the alerts that page for the same thing
(``tests/export/test_status_summary.py`` checks them against ``alerts/source.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from inferwatch_sidecar.export.summary import bytes_rate, duration, num, pct, verdict

#: InferwatchGPUMemoryFillingUp's and ...Soon's (free share of the device, seconds to out of memory).
FILLING_UP = (0.25, 86400.0)
FILLING_UP_SOON = (0.10, 14400.0)


def verdicts(g: Mapping[str, Any], now: float) -> Iterator[dict[str, Any]]:
    """Devices filling up, leaks (since detected), duplicated model copies (since seen), allocator trouble."""
    for dev in g.get("devices") or []:
        total, free = num(dev.get("total_bytes")), num(dev.get("free_bytes"))
        tto = num(dev.get("device_time_to_oom_s"))
        if not total or free is None or tto is None:
            continue
        share = free / total
        for (ratio, horizon), severity, alert in ((FILLING_UP_SOON, "bad", "InferwatchGPUMemoryFillingUpSoon"),
                                                  (FILLING_UP, "warn", "InferwatchGPUMemoryFillingUp")):
            if share < ratio and tto < horizon:
                yield verdict("gpu", f"GPU {dev.get('gpu')}", "memory filling up", severity,
                              f"{pct(share)} free, out of memory in {duration(tto)} at the growth of every "
                              "process", alert)
                break
    for leak in g.get("leaks") or []:
        pid = leak.get("pid")
        subject = f"GPU {leak.get('gpu')}" + (f" pid {pid}" if pid is not None else " (device)")
        kind = f" ({leak['kind']})" if leak.get("kind") else ""
        yield verdict("gpu", subject, "leak", "bad",
                      f"growing {bytes_rate(leak.get('rate_bytes_per_s'))}{kind}, out of memory in "
                      f"{duration(leak.get('time_to_oom_s'))}", "InferwatchGPUMemoryLeak", leak.get("detected_at"))
    for c in g.get("duplicate_model_copies") or []:
        pids = ", ".join(str(p) for p in c.get("pids") or [])
        extra = num(c.get("extra_bytes"))
        yield verdict("gpu", f"GPU {c.get('gpu')} pids {pids}", "duplicate model copies", "warn",
                      f"{extra / 2**30:.2f} GiB beyond one copy" if extra is not None else "several copies of a model",
                      "InferwatchGPUDuplicateModelCopies", c.get("since"))
    for a in g.get("allocator") or []:
        if a.get("fragmentation_warning"):
            yield verdict("gpu", f"pid {a.get('pid')} device {a.get('device')}", "fragmented", "warn",
                          a.get("fragmentation_reason") or f"{pct(num(a.get('fragmentation_ratio')) or 0.0)} of "
                          "reserved memory is inactive split blocks", "InferwatchGPUAllocatorFragmented")
        if (num(a.get("alloc_retries")) or 0) > 0:
            yield verdict("gpu", f"pid {a.get('pid')} device {a.get('device')}", "allocation retries", "warn",
                          f"{a.get('alloc_retries'):.0f} cudaMalloc retries (the allocator freed its cache to fit)",
                          "InferwatchGPUAllocRetries")
    if g.get("state") in ("failing", "degraded"):
        yield verdict("gpu", "NVML", str(g.get("state")), "bad" if g.get("state") == "failing" else "warn",
                      "; ".join(f"{f.get('error')}: {f.get('fix')}" for f in g.get("faults") or []) or "no samples",
                      "InferwatchGPUCollectorDown")

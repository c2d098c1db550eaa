"""What is wrong now: the verdicts that are bad in a ``/v1/status`` document, each since when, with its runbook.

:func:`verdicts` reads one status document (every component's section) and
returns what on-call must look at first, one entry per subject: a leaking
GPU process, a drifted model version, an accuracy estimate below its
reference, a failing canary, a high error rate, a component that does not
run. The thresholds are those of the alert that pages for the same thing
(``tests/sidecar/test_status_summary.py`` checks them against
``alerts/source.py``), so the summary and the alerts agree. The labelled
accuracy, which no alert reads, is a verdict too once 50 labels arrived: when
it is more than the estimate's drop below the reference accuracy and its 95%
Wilson interval lies below it (the labels see a changed model's own errors,
which a label-free estimate cannot).

:class:`SinceTracker` remembers when each verdict was first seen bad (the
daemon feeds it every few seconds), for verdicts whose component gives no
time of its own; the status page, ``inferwatch top`` and the demo read the
``summary`` section the daemon adds to ``/v1/status``, and compute it with
:func:`verdicts` from an older sidecar's status that has none.

A component (or a later version of one) may also list its own bad-now
verdicts in its status as ``verdicts``: rows with ``subject``, ``verdict``,
``severity`` (``bad`` or ``warn``), ``detail`` and optionally
``since_unix`` and ``alert``; they are passed through.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from statistics import NormalDist
from typing import Any

#: Where each verdict's runbook section lives (alerts/source.py's RUNBOOK_BASE_URL; the anchor is the alert name).
RUNBOOK_BASE_URL = "https://github.com/inferwatch/inferwatch/blob/main/docs/runbooks.md"
#: InferwatchHighErrorRate's error_ratio.
ERROR_RATIO = 0.05
#: InferwatchEstimatedAccuracyDrop's drop.
ACCURACY_DROP = 0.05
#: InferwatchEstimatedAccuracyLow's accuracy.
ACCURACY_FLOOR = 0.7
#: InferwatchGPUMemoryFillingUp's and ...Soon's (free share of the device, seconds to out of memory).
FILLING_UP = (0.25, 86400.0)
FILLING_UP_SOON = (0.10, 14400.0)
#: Fewest labels before the labelled accuracy is a verdict.
MIN_LABELS = 50
#: Fewest requests in the window before an error rate is a verdict (a single failed request of two is not).
MIN_REQUESTS = 20
#: Outcomes that are the client's doing or the server's choice, shown as rates but not an error verdict.
NON_ERROR_OUTCOMES = ("ok", "cancelled")


def wilson(p: float, n: float, level: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``p`` of ``n`` trials, at ``level``."""
    z = NormalDist().inv_cdf(0.5 + level / 2)
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, centre - half), min(1.0, centre + half)


def runbook_url(alert: str) -> str:
    """The runbook section of ``alert`` (GitHub's anchor: the heading lower-cased)."""
    return f"{RUNBOOK_BASE_URL}#{alert.lower()}"


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def _bytes_rate(v: Any) -> str:
    x = _num(v)
    if x is None:
        return "-"
    mib_h = x * 3600 / 2**20
    return f"{mib_h / 1024:.1f} GiB/h" if abs(mib_h) >= 1024 else f"{mib_h:.0f} MiB/h"


def _duration(v: Any) -> str:
    x = _num(v)
    if x is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if x >= 2 * size:
            return f"{x / size:.1f} {unit}"
    return f"{x:.0f} s"


def _verdict(component: str, subject: str, verdict: str, severity: str, detail: str, alert: str,
             since: Any = None) -> dict[str, Any]:
    return {"component": component, "subject": subject, "verdict": verdict, "severity": severity,
            "detail": detail, "since_unix": _num(since), "alert": alert, "runbook_url": runbook_url(alert)}


def _gpu(g: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for dev in g.get("devices") or []:
        total, free = _num(dev.get("total_bytes")), _num(dev.get("free_bytes"))
        tto = _num(dev.get("device_time_to_oom_s"))
        if not total or free is None or tto is None:
            continue
        share = free / total
        for (ratio, horizon), severity, alert in ((FILLING_UP_SOON, "bad", "InferwatchGPUMemoryFillingUpSoon"),
                                                  (FILLING_UP, "warn", "InferwatchGPUMemoryFillingUp")):
            if share < ratio and tto < horizon:
                yield _verdict("gpu", f"GPU {dev.get('gpu')}", "memory filling up", severity,
                               f"{_pct(share)} free, out of memory in {_duration(tto)} at the growth of every "
                               "process", alert)
                break
    for leak in g.get("leaks") or []:
        pid = leak.get("pid")
        subject = f"GPU {leak.get('gpu')}" + (f" pid {pid}" if pid is not None else " (device)")
        kind = f" ({leak['kind']})" if leak.get("kind") else ""
        yield _verdict("gpu", subject, "leak", "bad",
                       f"growing {_bytes_rate(leak.get('rate_bytes_per_s'))}{kind}, out of memory in "
                       f"{_duration(leak.get('time_to_oom_s'))}", "InferwatchGPUMemoryLeak", leak.get("detected_at"))
    for c in g.get("duplicate_model_copies") or []:
        pids = ", ".join(str(p) for p in c.get("pids") or [])
        extra = _num(c.get("extra_bytes"))
        yield _verdict("gpu", f"GPU {c.get('gpu')} pids {pids}", "duplicate model copies", "warn",
                       f"{extra / 2**30:.2f} GiB beyond one copy" if extra is not None else "several copies of a model",
                       "InferwatchGPUDuplicateModelCopies", c.get("since"))
    for a in g.get("allocator") or []:
        if a.get("fragmentation_warning"):
            yield _verdict("gpu", f"pid {a.get('pid')} device {a.get('device')}", "fragmented", "warn",
                           a.get("fragmentation_reason") or f"{_pct(_num(a.get('fragmentation_ratio')) or 0.0)} of "
                           "reserved memory is inactive split blocks", "InferwatchGPUAllocatorFragmented")
        if (_num(a.get("alloc_retries")) or 0) > 0:
            yield _verdict("gpu", f"pid {a.get('pid')} device {a.get('device')}", "allocation retries", "warn",
                           f"{a.get('alloc_retries'):.0f} cudaMalloc retries (the allocator freed its cache to fit)",
                           "InferwatchGPUAllocRetries")
    if g.get("state") in ("failing", "degraded"):
        yield _verdict("gpu", "NVML", str(g.get("state")), "bad" if g.get("state") == "failing" else "warn",
                       "; ".join(f"{f.get('error')}: {f.get('fix')}" for f in g.get("faults") or []) or "no samples",
                       "InferwatchGPUCollectorDown")


def _drift(d: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for m in d.get("models") or []:
        subject = f"{m.get('model')} {m.get('version')}"
        feats = m.get("features") or []
        drifted = [f.get("feature") for f in feats if f.get("drifted") and f.get("role") not in ("prediction",
                                                                                                   "confidence")]
        if m.get("dataset_drift"):
            share = _num(m.get("share_drifted")) or 0.0
            yield _verdict("drift", subject, "drifted", "warn",
                           f"{share:.0%} of columns drifted: {', '.join(str(x) for x in drifted[:6]) or '-'}"
                           + (f" and {len(drifted) - 6} more" if len(drifted) > 6 else ""), "InferwatchFeatureDrift")
        elif (m.get("multivariate") or {}).get("drifted"):
            yield _verdict("drift", subject, "joint drift", "warn",
                           "the inputs' joint distribution moved while no single column did", "InferwatchJointDrift")
        if any(f.get("drifted") and f.get("role") == "prediction" for f in feats):
            yield _verdict("drift", subject, "prediction drift", "warn", "the mix of predicted classes moved",
                           "InferwatchPredictionDrift")
        p = m.get("performance") or {}
        est, ref = _num(p.get("estimated_accuracy")), _num(p.get("reference_accuracy"))
        iv = p.get("estimated_accuracy_interval") or [None, None]
        upper = _num(iv[1]) if len(iv) > 1 else None
        dropped = bool(p.get("calibrated") and est is not None and ref is not None and ref - est > ACCURACY_DROP
                       and (upper is None or upper < ref))
        if dropped and est is not None and ref is not None:  # dropped implies both (for mypy)
            yield _verdict("accuracy", subject, "accuracy estimate dropped", "bad",
                           f"estimated {_pct(est)}"
                           + (f" [{_pct(_num(iv[0]) or 0.0)}-{_pct(upper)}]" if upper is not None else "")
                           + f" against {_pct(ref)} on the reference", "InferwatchEstimatedAccuracyDrop")
        # The labels see what the estimate cannot (a changed model's own errors): no alert of their own yet.
        lab = m.get("labelled") or {}
        acc, n = _num(lab.get("accuracy")), _num(lab.get("events")) or 0
        if acc is not None and ref is not None and n >= MIN_LABELS:
            lo, hi = wilson(acc, n)
            if ref - acc > ACCURACY_DROP and hi < ref:
                yield _verdict("accuracy", subject, "labelled accuracy dropped", "bad",
                               f"{_pct(acc)} [{_pct(lo)}-{_pct(hi)}] of {n:.0f} labelled predictions correct against "
                               f"{_pct(ref)} on the reference", "InferwatchEstimatedAccuracyDrop")
        if not dropped and p.get("calibrated") and est is not None and est < ACCURACY_FLOOR:
            yield _verdict("accuracy", subject, "accuracy estimate low", "warn",
                           f"estimated {_pct(est)}, below {_pct(ACCURACY_FLOOR)}", "InferwatchEstimatedAccuracyLow")


def _canary(c: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for j in c.get("judgements") or []:
        v = j.get("verdict")
        if v not in ("fail", "marginal"):
            continue
        failed = [m.get("name", "?") + (f"[{m['stage']}]" if m.get("stage") else "")
                  for m in j.get("metrics") or [] if m.get("result") == "fail"]
        yield _verdict("canary", f"{j.get('model')} {j.get('canary_version')} vs {j.get('baseline_version')}", v,
                       "bad" if v == "fail" else "warn",
                       f"score {(_num(j.get('score')) or 0):.0f}/100; failing: {', '.join(failed) or '-'}",
                       "InferwatchCanaryFailing")


def _errors(latency: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for m in latency.get("models") or []:
        out = m.get("outcomes") or {}
        n = sum(v for v in out.values() if isinstance(v, int))
        errors = out.get("error", 0)
        if n >= MIN_REQUESTS and errors / n > ERROR_RATIO:
            yield _verdict("requests", f"{m.get('service')} {m.get('model')} {m.get('model_version')}",
                           "high error rate", "bad",
                           f"{_pct(errors / n)} of {n} requests failed over the last {_duration(latency.get('window_s'))}"
                           f" (threshold {_pct(ERROR_RATIO)})", "InferwatchHighErrorRate")


def verdicts(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The bad-now verdicts in ``status`` (a ``/v1/status`` document), the bad ones first.

    Each: ``component``, ``subject``, ``verdict``, ``severity`` (``bad`` or ``warn``), ``detail``,
    ``since_unix`` (the component's own time, or None), ``alert`` and ``runbook_url``.
    """
    comps = status.get("components") or {}
    out: list[dict[str, Any]] = []
    readers = {"gpu": _gpu, "drift": _drift, "canary": _canary}
    for name, c in comps.items():
        if not isinstance(c, Mapping):
            continue
        if c.get("state") == "failed" or c.get("status_error"):
            # No alert of its own: inferwatch_component_up == 0; the collector's runbook covers the GPU monitor.
            out.append(_verdict(name, name, "failed", "bad", str(c.get("reason") or c.get("status_error")),
                                "InferwatchGPUCollectorDown" if name == "gpu" else "InferwatchSidecarDown"))
            continue
        try:
            if name in readers:
                out.extend(readers[name](c))
            for v in c.get("verdicts") or []:
                out.append({**_verdict(name, str(v.get("subject", name)), str(v.get("verdict")),
                                       "bad" if v.get("severity") == "bad" else "warn", str(v.get("detail", "")),
                                       str(v.get("alert") or ""), v.get("since_unix")),
                            **({} if v.get("alert") else {"runbook_url": None})})
        except (TypeError, ValueError, AttributeError, KeyError) as e:  # a section of another shape
            out.append(_verdict(name, name, "unreadable", "warn", f"cannot read its status: {e}", "InferwatchSidecarDown"))
    out.extend(_errors(status.get("latency") or {}))
    ingest = status.get("ingest") or {}
    drops = sum(v for v in (ingest.get("sdk_dropped") or {}).values() if isinstance(v, int))
    if drops:
        out.append(_verdict("ingest", "SDK", "dropping events", "warn",
                            f"producers dropped {drops} events before sending", "InferwatchSDKDroppingEvents"))
    refused = sum(v for v in (ingest.get("dropped") or {}).values() if isinstance(v, int))
    if refused:
        out.append(_verdict("ingest", "sidecar", "refusing events", "warn", f"{refused} events refused",
                            "InferwatchIngestDropping"))
    out.sort(key=lambda v: (v["severity"] != "bad", v["component"], v["subject"]))
    return out


class SinceTracker:
    """When each verdict was first seen bad, for those whose component gives no time.

    A verdict that is no longer bad is forgotten: seen bad again later, it starts a new ``since``.
    """

    def __init__(self) -> None:
        self._first: dict[tuple[str, str, str], float] = {}

    def update(self, found: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
        """``found`` with ``since_unix`` filled (the component's, else the first time seen) and ``since_source``."""
        keys = set()
        for v in found:
            key = (v["component"], v["subject"], v["verdict"])
            keys.add(key)
            first = self._first.setdefault(key, now)
            if v.get("since_unix") is None:
                v["since_unix"] = round(first, 3)
                v["since_source"] = "first seen"
            else:
                v["since_source"] = v["component"]
        for key in [k for k in self._first if k not in keys]:
            del self._first[key]
        return found

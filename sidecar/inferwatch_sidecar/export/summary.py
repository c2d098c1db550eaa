"""What is wrong now: the verdicts that are bad in a ``/v1/status`` document, each since when, with its runbook.

:func:`verdicts` reads one status document and returns what on-call must look
at first, one entry per subject. Where the rows come from:

- **each component's section**, read by the reader its registry entry declares
  (``components/registry.py``, ``ComponentSpec.verdicts``: the GPU monitor's
  leaks and filling devices, the drift engine's drifted versions and accuracy,
  the canary judge's failing canaries), handed in as ``readers``; a component
  without one may list its own rows in its status as ``verdicts`` (``subject``,
  ``verdict``, ``severity`` ``bad`` or ``warn``, ``detail``, and optionally
  ``since_unix`` and ``alert``), which pass through (saturation, headroom).
  A new component's verdicts appear either way without editing this module;
- **the daemon's own sections**: per model version over the status window
  (``latency``), a high error rate, load shedding, a retry storm and a
  timeout mismatch; and the ingest drops.

Every threshold is that of the alert that pages for the same thing, named after
it (``tests/export/test_status_summary.py`` checks them against
``alerts/source.py``), so the summary and the alerts agree; the summary judges
the status window (the last minute) where the alert waits its ``for:``.

What is a verdict of its own and what is only a rate (the page and ``top``
show every outcome's share): ``error`` (5xx, an exception) is the service
failing its callers; ``shed`` (429 or 503 the server itself returned) is the
service turning work away for lack of room, a capacity problem with its own
alert and runbook (InferwatchLoadShedding), not a bug. ``cancelled`` is the
client's choice: on its own it cannot tell a user who navigated away from a
client timeout shorter than the work, so it is read together with the server's
latency and the retries (InferwatchTimeoutMismatch, InferwatchRetryStorm)
rather than as a rate. ``client_error`` (4xx) is the caller's request: shown,
never a verdict of the service.

Since when (``since_unix`` and ``since_source``): ``component`` where the
component gives the time of its own change (a leak detected, copies seen, a
canary verdict turned, a resource bound since); ``window`` where it gives the
start of the window that first showed the verdict (drift: the drift began in
that window, no earlier); otherwise ``first seen``, the first time this
sidecar's status found it bad (:class:`SinceTracker`, fed every few seconds by
the daemon; it starts over when the sidecar restarts).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from statistics import NormalDist
from typing import Any

#: A component's reader: its ``/v1/status`` section and the status's time (Unix s) -> its bad-now rows.
Reader = Callable[[Mapping[str, Any], float], Iterable[dict[str, Any]]]

#: Where each verdict's runbook section lives (alerts/source.py's RUNBOOK_BASE_URL; the anchor is the alert name).
RUNBOOK_BASE_URL = "https://github.com/inferwatch/inferwatch/blob/main/docs/runbooks.md"
#: InferwatchHighErrorRate's error_ratio.
ERROR_RATIO = 0.05
#: InferwatchLoadShedding's shed_ratio.
SHED_RATIO = 0.05
#: InferwatchRetryStorm's amplification and giveup_ratio.
RETRY_STORM = (1.5, 0.05)
#: InferwatchTimeoutMismatch's wait_share and giveup_ratio.
TIMEOUT_MISMATCH = (1.0, 0.01)
#: Fewest requests in the window before a rate is a verdict (a single failed request of two is not).
MIN_REQUESTS = 20
#: Where ``since_unix`` comes from (see the module docstring).
SINCE_SOURCES = ("component", "window", "first seen")


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


def num(v: Any) -> float | None:
    """``v`` as a finite float; None for anything else (a bool, None, NaN, a string)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def bytes_rate(v: Any) -> str:
    """Bytes per second as MiB/h or GiB/h (how a leak reads)."""
    x = num(v)
    if x is None:
        return "-"
    mib_h = x * 3600 / 2**20
    return f"{mib_h / 1024:.1f} GiB/h" if abs(mib_h) >= 1024 else f"{mib_h:.0f} MiB/h"


def duration(v: Any) -> str:
    x = num(v)
    if x is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if x >= 2 * size:
            return f"{x / size:.1f} {unit}"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.1f}".rstrip("0").rstrip(".") + " s"


def verdict(component: str, subject: str, what: str, severity: str, detail: str, alert: str, since: Any = None,
            since_source: str | None = None) -> dict[str, Any]:
    """One bad-now row. ``since``: the component's own time (Unix s), with where it comes from (``component``
    unless said otherwise); without one the :class:`SinceTracker` fills the first time seen."""
    s = num(since)
    return {"component": component, "subject": subject, "verdict": what, "severity": severity, "detail": detail,
            "since_unix": s, "since_source": (since_source or "component") if s is not None else None,
            "alert": alert, "runbook_url": runbook_url(alert) if alert else None}


def listed(c: Mapping[str, Any], name: str) -> Iterator[dict[str, Any]]:
    """The rows a component lists itself under ``verdicts`` in its status section ``c``."""
    for v in c.get("verdicts") or []:
        yield verdict(name, str(v.get("subject", name)), str(v.get("verdict")),
                      "bad" if v.get("severity") == "bad" else "warn", str(v.get("detail", "")),
                      str(v.get("alert") or ""), v.get("since_unix"), v.get("since_source"))


def _requests(latency: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Per model version over the status window: errors, shedding, a retry storm, a timeout mismatch."""
    window = f"the last {duration(latency.get('window_s'))}"
    for m in latency.get("models") or []:
        subject = f"{m.get('service')} {m.get('model')} {m.get('model_version')}"
        out = m.get("outcomes") or {}
        n = sum(v for v in out.values() if isinstance(v, int))
        if n >= MIN_REQUESTS:
            errors, shed = out.get("error", 0), out.get("shed", 0)
            if errors / n > ERROR_RATIO:
                yield verdict("requests", subject, "high error rate", "bad",
                              f"{pct(errors / n)} of {n} requests failed over {window} (threshold {pct(ERROR_RATIO)})",
                              "InferwatchHighErrorRate")
            if shed / n > SHED_RATIO:
                yield verdict("requests", subject, "shedding load", "warn",
                              f"{pct(shed / n)} of {n} requests shed (429/503 the server returned) over {window} "
                              f"(threshold {pct(SHED_RATIO)}): it turns work away", "InferwatchLoadShedding")
        yield from _overload(subject, m, window)


def _overload(subject: str, m: Mapping[str, Any], window: str) -> Iterator[dict[str, Any]]:
    """InferwatchRetryStorm and InferwatchTimeoutMismatch on the window's HTTP counts."""
    h = m.get("http") or {}
    att, ret, gave = (num(h.get(k)) or 0.0 for k in ("attempts", "retries", "giveups"))
    if att < MIN_REQUESTS:
        return
    share = gave / att
    amp = att / (att - ret) if att > ret else math.inf
    amplification, storm_giveups = RETRY_STORM
    if amp > amplification and share > storm_giveups:
        yield verdict("requests", subject, "retry storm", "bad",
                      f"{amp:.2f} attempts per unique request (threshold {amplification:g}) while {pct(share)} of "
                      f"{att:.0f} attempts lost their client (threshold {pct(storm_giveups)}) over {window}: retries "
                      "and give-ups feed each other", "InferwatchRetryStorm")
    wait, server = num(h.get("giveup_wait_p50_s")), num((m.get("request") or {}).get("p50_s"))
    wait_share, mismatch_giveups = TIMEOUT_MISMATCH
    if wait is not None and server is not None and wait < wait_share * server and share > mismatch_giveups:
        yield verdict("requests", subject, "timeout mismatch", "warn",
                      f"clients gave up after {duration(wait)} (median) while the server's median is "
                      f"{duration(server)}; {pct(share)} of {att:.0f} attempts given up over {window}",
                      "InferwatchTimeoutMismatch")


def verdicts(status: Mapping[str, Any], readers: Mapping[str, Reader] | None = None,
             now: float | None = None) -> list[dict[str, Any]]:
    """The bad-now verdicts in ``status`` (a ``/v1/status`` document), the bad ones first.

    Args:
        status: the document.
        readers: component name -> its reader (``components.registry.verdict_readers()``); a component
            without one contributes the rows it lists under ``verdicts``.
        now: the document's time (Unix s); default: its ``started_unix`` plus ``uptime_s``.

    Each: ``component``, ``subject``, ``verdict``, ``severity`` (``bad`` or ``warn``), ``detail``,
    ``since_unix`` and ``since_source`` (the component's own time, or None), ``alert`` and ``runbook_url``.
    """
    readers = readers or {}
    if now is None:
        now = (num(status.get("started_unix")) or 0.0) + (num(status.get("uptime_s")) or 0.0)
    out: list[dict[str, Any]] = []
    for name, c in (status.get("components") or {}).items():
        if not isinstance(c, Mapping):
            continue
        if c.get("state") == "failed" or c.get("status_error"):
            # No alert of its own: inferwatch_component_up == 0; the collector's runbook covers the GPU monitor.
            out.append(verdict(name, name, "failed", "bad", str(c.get("reason") or c.get("status_error")),
                               "InferwatchGPUCollectorDown" if name == "gpu" else "InferwatchSidecarDown"))
            continue
        try:
            reader = readers.get(name)
            out.extend(reader(c, now) if reader is not None else ())
            out.extend(listed(c, name))
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:  # a section of another shape
            out.append(verdict(name, name, "unreadable", "warn", f"cannot read its status: {e}", "InferwatchSidecarDown"))
    out.extend(_requests(status.get("latency") or {}))
    ingest = status.get("ingest") or {}
    drops = sum(v for v in (ingest.get("sdk_dropped") or {}).values() if isinstance(v, int))
    if drops:
        out.append(verdict("ingest", "SDK", "dropping events", "warn",
                           f"producers dropped {drops} events before sending", "InferwatchSDKDroppingEvents"))
    refused = sum(v for v in (ingest.get("dropped") or {}).values() if isinstance(v, int))
    if refused:
        out.append(verdict("ingest", "sidecar", "refusing events", "warn", f"{refused} events refused",
                           "InferwatchIngestDropping"))
    out.sort(key=lambda v: (v["severity"] != "bad", v["component"], v["subject"]))
    return out


class SinceTracker:
    """Since when each verdict has been bad, where its component gives no time of its own, or a window's start.

    A verdict with no ``since_unix`` gets the first time it was seen bad (``first seen``). One whose
    ``since_source`` is ``window`` keeps the earliest window start seen while it stays bad (the window slides
    on; the drift began in the first window that showed it). A verdict that is no longer bad is forgotten:
    seen bad again later, it starts a new ``since``.
    """

    def __init__(self) -> None:
        self._first: dict[tuple[str, str, str], float] = {}

    def update(self, found: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
        """``found`` with ``since_unix`` and ``since_source`` filled."""
        keys = set()
        for v in found:
            key = (v["component"], v["subject"], v["verdict"])
            keys.add(key)
            own = v.get("since_unix")
            if own is None:
                v["since_unix"] = round(self._first.setdefault(key, now), 3)
                v["since_source"] = "first seen"
            elif v.get("since_source") == "window":
                v["since_unix"] = self._first[key] = min(self._first.get(key, own), own)
            else:
                self._first.setdefault(key, now)
                v["since_source"] = v.get("since_source") or "component"
        for key in [k for k in self._first if k not in keys]:
            del self._first[key]
        return found

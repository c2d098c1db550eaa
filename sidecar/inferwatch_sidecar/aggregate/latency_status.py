"""Request and stage latency quantiles for ``/v1/status``, over a sliding window of aggregator copies.

Split out of ``aggregator.py`` (issue 23), which re-exports the public names.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from inferwatch.wire import OUTCOMES
from inferwatch_sidecar.aggregate.histograms import histogram_quantile
from inferwatch_sidecar.metrics.core import REQUEST_DURATION_SECONDS

if TYPE_CHECKING:
    from inferwatch_sidecar.aggregate.aggregator import Aggregator


#: The quantiles ``/v1/status`` shows per latency series.
STATUS_QUANTILES = (0.5, 0.9, 0.99)
#: A latency series in the status: (service, model, model_version, stage or None for the end-to-end request).
_SeriesKey = tuple[str, str, str, str | None]
_Snapshot = dict[_SeriesKey, tuple[list[int], float, tuple[float, ...]]]
#: Requests by outcome code, per label set (the status's error, 4xx and cancelled rates come from these).
_Outcomes = dict[tuple[str, str, str], list[int]]
#: HTTP counters per label set: attempts, retries, give-ups, then the give-up wait histogram's counts
#: (the status summary's retry-storm and timeout-mismatch verdicts come from these).
_Http = dict[tuple[str, str, str], list[int]]


class LatencyStatus:
    """Request and stage latency quantiles for ``/v1/status``, over about the last ``window_s``.

    :meth:`sample` (the daemon's main loop calls it) keeps a copy of the
    latency histograms every ``every_s``, and only the copies that one at
    least ``window_s`` old needs; :meth:`status` subtracts the oldest copy
    from the current counts. Until the sidecar has run ``window_s``, that is
    the empty copy taken at construction: the numbers are since start, and
    ``window_s`` in the answer says so.

    Args:
        agg: the aggregator whose latency histograms are read.
        window_s: the window the quantiles cover (up to ``every_s`` more).
        every_s: the time between two copies.
        max_label_sets: label sets shown, the busiest first (the section stays small
            whatever ``labels.max_label_sets`` allows).
        monotonic: seconds, for the copies' ages.
    """

    def __init__(
        self, agg: Aggregator, window_s: float = 60.0, every_s: float = 10.0, max_label_sets: int = 50,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.agg = agg
        self.window_s = window_s
        self.every_s = every_s
        self.max_label_sets = max_label_sets
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._copies: deque[tuple[float, _Snapshot]] = deque([(monotonic(), {})])
        #: The outcome counts taken with each copy, by the copy's time.
        self._outcomes: dict[float, _Outcomes] = {self._copies[0][0]: {}}
        self._http: dict[float, _Http] = {self._copies[0][0]: {}}

    def _snapshot(self) -> _Snapshot:
        return self._take()[0]

    def _take(self) -> tuple[_Snapshot, _Outcomes, _Http]:
        out: _Snapshot = {}
        outcomes: _Outcomes = {}
        with self.agg.lock:
            http: _Http = {lab: [s.attempts, s.retries, s.giveups, *s.wait]
                           for lab, s in self.agg.overload.series.items() if s.attempts}
            req = self.agg.layouts[REQUEST_DURATION_SECONDS.name]
            for lab, b in self.agg.bundles.items():
                key = (*lab, None)  # a name, not out[(*lab, None)]: mypy's 3.10 target misreads that as PEP 646
                out[key] = (req.classic_counts(b.e2e.counts), b.e2e.sum, req.classic)
                outcomes[lab] = list(b.requests)
                for name, st in b.stages.items():
                    stage_key = (*lab, name)
                    out[stage_key] = (st.layout.classic_counts(st.hist.counts), st.hist.sum, st.layout.classic)
        return out, outcomes, http

    def sample(self) -> None:
        """Keep a copy when ``every_s`` has passed since the last one; forget those the window no longer needs."""
        now = self.monotonic()
        with self._lock:
            if now - self._copies[-1][0] < self.every_s:
                return
        snap, outcomes, http = self._take()
        with self._lock:
            copies = self._copies
            copies.append((now, snap))
            self._outcomes[now] = outcomes
            self._http[now] = http
            while len(copies) > 1 and now - copies[1][0] >= self.window_s:
                gone = copies.popleft()[0]
                self._outcomes.pop(gone, None)
                self._http.pop(gone, None)

    def status(self) -> dict[str, Any]:
        """The ``latency`` section: per label set, the request's and each stage's calls, mean and quantiles.

        ``count``, ``mean_s`` and the quantiles are over the window; ``total``
        counts the calls since start. Series without a call since start are left out.
        ``outcomes`` counts the window's requests by outcome (``ok``, ``error``, ``cancelled``, and any
        outcome the wire format adds), ``outcomes_total`` since start. ``http`` (label sets with HTTP events)
        counts the window's attempts, retries and client give-ups, with the give-up wait's median.
        """
        now = self.monotonic()
        snap, outcomes, http = self._take()
        with self._lock:
            base_t, base = self._copies[0]
            base_outcomes = self._outcomes.get(base_t, {})
            base_http = self._http.get(base_t, {})
        by_set: dict[tuple[str, str, str], dict[str, Any]] = {}
        for key, (counts, total, bounds) in snap.items():
            since_start = sum(counts)
            if not since_start:
                continue  # a label set that only sent records has no request latency
            old_counts, old_total, _ = base.get(key, (None, 0.0, bounds))
            if old_counts is not None:
                counts = [a - b for a, b in zip(counts, old_counts, strict=True)]
                total -= old_total
            n = sum(counts)
            row: dict[str, Any] = {"count": n, "total": since_start, "mean_s": total / n if n else None}
            for q in STATUS_QUANTILES:
                row[f"p{q * 100:g}_s"] = histogram_quantile(q, bounds, counts)
            entry = by_set.setdefault(key[:3], {"service": key[0], "model": key[1], "model_version": key[2],
                                                "request": None, "stages": {}})
            if key[3] is None:
                entry["request"] = row
                now_o, old_o = outcomes.get(key[:3], []), base_outcomes.get(key[:3], [])
                names = [OUTCOMES[i] if i < len(OUTCOMES) else f"outcome_{i}" for i in range(len(now_o))]
                entry["outcomes"] = {n: c - (old_o[i] if i < len(old_o) else 0) for i, (n, c) in
                                     enumerate(zip(names, now_o, strict=True))}
                entry["outcomes_total"] = dict(zip(names, now_o, strict=True))
            else:
                entry["stages"][key[3]] = row
        for lab, entry in by_set.items():
            if lab in http:
                entry["http"] = self._http_row(http[lab], base_http.get(lab))
        sets = sorted(by_set.values(), key=lambda e: (-_observed(e), e["service"], e["model"], e["model_version"]))
        return {
            "window_s": round(now - base_t, 3),
            "quantiles": list(STATUS_QUANTILES),
            "label_sets": len(sets),
            "models": sets[: self.max_label_sets],
        }

    def _http_row(self, now: list[int], old: list[int] | None) -> dict[str, Any]:
        """The window's HTTP attempts, retries and give-ups, and the give-up wait's median (None without one)."""
        d = [a - b for a, b in zip(now, old, strict=True)] if old is not None else now
        return {"attempts": d[0], "retries": d[1], "giveups": d[2],
                "giveup_wait_p50_s": histogram_quantile(0.5, self.agg.overload.bounds, d[3:])}


def _observed(entry: dict[str, Any]) -> int:
    rows = [entry["request"], *entry["stages"].values()]
    return sum(r["count"] for r in rows if r is not None)


def finite_or_none(x: Any) -> float | None:
    """``x`` as a finite float, or None."""
    try:
        f = float(x)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None

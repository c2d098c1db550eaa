"""The canary judge's per-version sliding window: a ring of sub-window histograms, bounded whatever the traffic.

Per (service, model, version) and sub-window it keeps outcome counts, the
end-to-end latency histogram, one latency histogram per stage (at most
``max_stages``), a confidence histogram with its sum, and the count of each
predicted class (at most ``max_classes``, the rest under ``__other__``). The
latency bins are 20 per decade from 1 us to 10^4 s: fine enough for a rank test
and for quantiles within 12% (one bin), far finer than the exported histogram's
buckets, and the same for both versions, so the judge compares like with like.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from inferwatch.wire import OUTCOME_SHED, OUTCOMES
from inferwatch_sidecar.stats.quantiles import binned_quantile

#: Upper bounds of the latency bins in seconds (``le`` semantics), plus an overflow bin above the last.
LATENCY_EDGES = 10.0 ** (np.arange(-6 * 20, 4 * 20 + 1) / 20.0)
N_LATENCY = LATENCY_EDGES.size + 1
#: Upper bounds of the confidence bins: 100 bins over [0, 1] (values outside fall in the end bins).
CONFIDENCE_EDGES = np.arange(1, 100) / 100.0
N_CONFIDENCE = CONFIDENCE_EDGES.size + 1
#: Outcome codes counted per sub-window (ok, error, cancelled, client_error, shed).
N_OUTCOMES = len(OUTCOMES)
#: The class that collects predictions beyond ``max_classes``.
OTHER_CLASS = "__other__"


def latency_bins(seconds: np.ndarray) -> np.ndarray:
    """Bin index of each latency (seconds) on :data:`LATENCY_EDGES`."""
    return np.searchsorted(LATENCY_EDGES, seconds, side="left")


def quantile(counts: np.ndarray, q: float) -> float | None:
    """The ``q`` quantile of a latency histogram, interpolated geometrically inside its bin; None when empty."""
    return binned_quantile(counts, LATENCY_EDGES, q)


@dataclass
class Summary:
    """One version's window, summed over its sub-windows: what the judge compares."""

    requests: int
    errors: int
    cancelled: int
    e2e: np.ndarray
    stages: dict[str, np.ndarray]
    confidence: np.ndarray
    confidence_sum: float
    classes: dict[str, int] = field(default_factory=dict)
    #: Requests the server shed (429/503).
    shed: int = 0
    #: Time to first token and inter-token gaps of streamed stages (latency bins), when there were streams.
    ttft: np.ndarray | None = None
    itl: np.ndarray | None = None
    #: Requests that met every SLO of ``canary.slo`` (None: no SLO set).
    good: int | None = None

    @property
    def confidence_n(self) -> int:
        return int(self.confidence.sum())


class VersionWindow:
    """The ring of one (service, model, version) (see the module docstring).

    Args:
        key: the capped (service, model, version) labels.
        subwindows: sub-windows in the ring.
        max_stages: stage histograms kept.
        max_classes: prediction classes kept.
    """

    __slots__ = ("key", "S", "max_stages", "max_classes", "outcomes", "e2e", "stages", "conf", "conf_sum",
                 "classes", "dropped_stages", "ttft", "itl", "good")

    def __init__(self, key: tuple[str, str, str], subwindows: int, max_stages: int, max_classes: int) -> None:
        self.key = key
        self.S = subwindows
        self.max_stages = max_stages
        self.max_classes = max_classes
        self.outcomes = np.zeros((subwindows, N_OUTCOMES), dtype=np.int64)
        self.e2e = np.zeros((subwindows, N_LATENCY), dtype=np.int64)
        self.stages: dict[str, np.ndarray] = {}
        self.conf = np.zeros((subwindows, N_CONFIDENCE), dtype=np.int64)
        self.conf_sum = np.zeros(subwindows, dtype=np.float64)
        self.classes: dict[str, np.ndarray] = {}
        #: Stage observations refused because ``max_stages`` stages were already tracked.
        self.dropped_stages = 0
        #: Streamed stages' TTFT and inter-token gaps, and requests meeting the SLOs (made on first use).
        self.ttft: np.ndarray | None = None
        self.itl: np.ndarray | None = None
        self.good: np.ndarray | None = None

    def add_streams(self, slot: int, ttft_s: list[float], itl_s: list[float]) -> None:
        """Add streamed stages' times to first token and inter-token gaps (seconds) to sub-window ``slot``."""
        if self.ttft is None:
            self.ttft = np.zeros((self.S, N_LATENCY), dtype=np.int64)
            self.itl = np.zeros((self.S, N_LATENCY), dtype=np.int64)
        assert self.itl is not None
        if ttft_s:
            self.ttft[slot] += np.bincount(latency_bins(np.asarray(ttft_s)), minlength=N_LATENCY)
        if itl_s:
            self.itl[slot] += np.bincount(latency_bins(np.asarray(itl_s)), minlength=N_LATENCY)

    def add_good(self, slot: int, n: int) -> None:
        """Count ``n`` requests that met every SLO in sub-window ``slot``."""
        if self.good is None:
            self.good = np.zeros(self.S, dtype=np.int64)
        self.good[slot] += n

    def add_requests(self, slot: int, outcomes: list[int], e2e_s: list[float], stages: dict[str, list[float]]) -> None:
        """Add requests to sub-window ``slot``: outcome codes, latencies and per-stage durations in seconds."""
        if outcomes:
            self.outcomes[slot] += np.bincount(np.asarray(outcomes, dtype=np.intp), minlength=N_OUTCOMES)[:N_OUTCOMES]
            self.e2e[slot] += np.bincount(latency_bins(np.asarray(e2e_s)), minlength=N_LATENCY)
        for name, vals in stages.items():
            h = self.stages.get(name)
            if h is None:
                if len(self.stages) >= self.max_stages:
                    self.dropped_stages += len(vals)
                    continue
                h = self.stages[name] = np.zeros((self.S, N_LATENCY), dtype=np.int64)
            h[slot] += np.bincount(latency_bins(np.asarray(vals)), minlength=N_LATENCY)

    def add_records(self, slot: int, confidences: list[float], predictions: list[str]) -> None:
        """Add recorded confidences (finite floats) and predictions (canonical strings) to sub-window ``slot``."""
        if confidences:
            c = np.asarray(confidences)
            self.conf[slot] += np.bincount(np.searchsorted(CONFIDENCE_EDGES, c, side="left"), minlength=N_CONFIDENCE)
            self.conf_sum[slot] += float(c.sum())
        # Counted first (in C), then one numpy add per class: a numpy scalar add per record was most of this.
        # The counts keep first-seen order, so classes past the cap go to OTHER_CLASS as they did one by one.
        for p, n in Counter(predictions).items():
            h = self.classes.get(p)
            if h is None:
                if len(self.classes) >= self.max_classes - 1:
                    p = OTHER_CLASS
                    h = self.classes.get(p)
                if h is None:
                    h = self.classes[p] = np.zeros(self.S, dtype=np.int64)
            h[slot] += n

    def clear(self, slot: int) -> None:
        """Empty sub-window ``slot`` (the ring moved on to it)."""
        self.outcomes[slot] = 0
        self.e2e[slot] = 0
        for h in self.stages.values():
            h[slot] = 0
        self.conf[slot] = 0
        self.conf_sum[slot] = 0.0
        for c in self.classes.values():
            c[slot] = 0
        for g in (self.ttft, self.itl, self.good):
            if g is not None:
                g[slot] = 0

    @property
    def requests(self) -> int:
        return int(self.outcomes.sum())

    @property
    def nbytes(self) -> int:
        return int(self.outcomes.nbytes + self.e2e.nbytes + sum(h.nbytes for h in self.stages.values())
                   + self.conf.nbytes + self.conf_sum.nbytes + sum(c.nbytes for c in self.classes.values())
                   + sum(h.nbytes for h in (self.ttft, self.itl, self.good) if h is not None))

    def summary(self) -> Summary:
        """The window summed over its sub-windows."""
        o = self.outcomes.sum(axis=0)
        return Summary(
            requests=int(o.sum()), errors=int(o[1]), cancelled=int(o[2]), e2e=self.e2e.sum(axis=0),
            stages={n: h.sum(axis=0) for n, h in self.stages.items()}, confidence=self.conf.sum(axis=0),
            confidence_sum=float(self.conf_sum.sum()),
            classes={c: int(h.sum()) for c, h in self.classes.items() if h.any()},
            shed=int(o[OUTCOME_SHED]),
            ttft=None if self.ttft is None else self.ttft.sum(axis=0),
            itl=None if self.itl is None else self.itl.sum(axis=0),
            good=None if self.good is None else int(self.good.sum()),
        )

"""Histogram state: per-bucket counts with exemplars, the per-label-set bundles, and their scrape-time folding.

:class:`Histogram` is what the ingest thread writes (plain lists, found with
``bisect``); :class:`StageSeries` and :class:`Bundle` group the histograms and
counters of one stage and one ``(service, model, model_version)`` label set.
At scrape time :func:`_fold` turns a copied histogram's cells into classic
buckets (choosing each bucket's exemplar with :func:`pick_exemplar`) and
:func:`_add_hist` adds it to a metric family. Split out of ``aggregator.py``
(issue 23), which re-exports the public names.
"""

from __future__ import annotations

import functools
import time
from bisect import bisect_left
from typing import Any

from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.samples import Exemplar

from inferwatch.wire import OUTCOMES
from inferwatch_sidecar.metrics import families
from inferwatch_sidecar.metrics.entry import Metric
from inferwatch_sidecar.metrics.native import Layout, NativeHistogramFamily

#: Exemplar label sets are limited to 128 UTF-8 characters by OpenMetrics: the request ID gets
#: what its label name and, on a traced request, ``trace_id`` and its 32 hex digits leave.
_EXEMPLAR_RID_MAX = 128 - len("request_id")
_EXEMPLAR_TRACED_RID_MAX = _EXEMPLAR_RID_MAX - len("trace_id") - 32
#: A traced request's exemplar stays in its bucket against newer untraced ones for this long
#: (ns, on the events' end times): long enough for several scrapes to pick it up and for
#: someone to follow the link, short enough that a bucket never shows an hour-old request.
TRACED_EXEMPLAR_HOLD_NS = 60 * 10**9
#: A traced exemplar ending further than this past the wall clock does not hold its bucket.
MAX_FUTURE_NS = 24 * 3600 * 10**9


def _buckets(m: Metric) -> tuple[float, ...]:
    assert m.buckets is not None  # a histogram entry (checked by Metric)
    return m.buckets



class Histogram:
    """Per-bucket (non-cumulative) counts, sum, and exemplars per bucket.

    Each bucket keeps two exemplars: the latest untraced request's in ``ex``
    and the latest traced request's in ``tex``, so recording one stays a list
    store and the choice between them is made at scrape time
    (:func:`pick_exemplar`).
    """

    __slots__ = ("counts", "sum", "ex", "exv", "tex", "texv")

    def __init__(self, n_bounds: int) -> None:
        self.counts = [0] * (n_bounds + 1)  # last slot is +Inf
        self.sum = 0.0
        #: Per bucket: the exemplar's (request_id, trace_id, end_unix_ns), shared by the request's
        #: e2e and stage histograms so recording one allocates nothing per stage...
        self.ex: list[Any] | None = None
        #: ...and the observed value that goes with it; the same two for traced requests.
        self.exv: list[float] | None = None
        self.tex: list[Any] | None = None
        self.texv: list[float] | None = None


def pick_exemplar(untraced: Any, traced: Any, now_ns: int | None = None) -> Any:
    """The exemplar a bucket exports: its traced one unless an untraced one is ``TRACED_EXEMPLAR_HOLD_NS`` newer.

    So a trace link survives the untraced traffic that follows it in the same
    bucket, and is replaced by a newer traced request at once. A traced one
    that claims to end more than :data:`MAX_FUTURE_NS` past the wall clock
    (a span ending at 2**64-1 ns) holds nothing: it would win forever.
    """
    if traced is None:
        return untraced
    if untraced is None:
        return traced
    if traced[2] > (time.time_ns() if now_ns is None else now_ns) + MAX_FUTURE_NS:
        return untraced
    if untraced[2] - traced[2] < TRACED_EXEMPLAR_HOLD_NS:
        return traced
    return untraced


class HistogramSet:
    """All series of one histogram family, keyed by capped label tuple."""

    __slots__ = ("metric", "bounds", "series", "n")

    def __init__(self, metric: Metric) -> None:
        self.metric = metric
        self.bounds = _buckets(metric)
        self.n = len(self.bounds)
        self.series: dict[tuple[str, ...], Histogram] = {}

    def get(self, key: tuple[str, ...]) -> Histogram:
        h = self.series.get(key)
        if h is None:
            h = self.series[key] = Histogram(self.n)
        return h

    def observe(self, key: tuple[str, ...], v: float) -> None:
        h = self.series.get(key)
        if h is None:
            h = self.series[key] = Histogram(self.n)
        h.counts[bisect_left(self.bounds, v)] += 1
        h.sum += v

    def snapshot(self) -> list[tuple[tuple[str, ...], list[int], float, list[Any] | None]]:
        return [(k, list(h.counts), h.sum, None) for k, h in self.series.items()]  # no exemplars here


def _exemplar(ex: Any) -> Exemplar | None:
    rid, trace, end_ns, value = ex
    labels: dict[str, str] = {}
    tid = trace.hex() if trace else ""
    if tid:
        labels["trace_id"] = tid
    if rid and rid != tid:  # a request whose ID is its trace ID (traceparent alone, OTLP spans) needs it once
        labels["request_id"] = rid[:_EXEMPLAR_TRACED_RID_MAX if tid else _EXEMPLAR_RID_MAX]
    if not labels:
        return None
    return Exemplar(labels, value, end_ns / 1e9 if end_ns else None)


def histogram_family(m: Metric, snap: list[Any]) -> HistogramMetricFamily:
    """Build the family of entry ``m`` from a :meth:`HistogramSet.snapshot`."""
    fam = families.histogram(m)
    les = families.bucket_les(m)
    for key, counts, total, exs in snap:
        _add_hist(fam, list(key), (counts, total, exs), les)
    return fam


class StageSeries:
    """The series of one (service, model, version, stage); ``bounds`` are its duration histogram's cells.

    ``layout`` folds the cells into the classic buckets and the native histogram; without one
    ``bounds`` are the classic buckets themselves.
    """

    __slots__ = ("key", "bounds", "layout", "ns", "hist", "ttft", "itl", "length", "tokens", "cancelled",
                 "undelivered")

    def __init__(self, key: tuple[str, ...], bounds: tuple[float, ...], layout: Layout | None = None) -> None:
        self.key = key
        self.layout = layout or Layout(bounds)
        self.bounds = self.layout.edges
        #: The cells by bit length of a duration in integer ns (metrics/native.py ``int_table``).
        self.ns = self.layout.table(1e-9)
        self.hist = Histogram(len(bounds))
        self.ttft: Histogram | None = None
        self.itl: Histogram | None = None
        self.length: Histogram | None = None
        self.tokens = 0
        #: Streams cancelled, and the items they produced after their client left.
        self.cancelled = 0
        self.undelivered = 0


class Bundle:
    """Every series of one capped (service, model, model_version) label set.

    The ingest loop finds the bundle with one dict lookup on the raw ``ctx``
    tuple and then only indexes lists: no label tuples are built per event.
    """

    __slots__ = ("lab", "requests", "errors", "e2e", "stages", "stage_cache", "records", "queue", "batch", "depth")

    def __init__(self, lab: tuple[str, str, str], n_latency: int) -> None:
        self.lab = lab
        self.requests = [0] * len(OUTCOMES)  # by outcome code
        self.errors: dict[str, int] = {}
        self.e2e = Histogram(n_latency)
        self.stages: dict[str, StageSeries] = {}  # capped stage name -> series
        #: raw stage name -> (its series, whether it also feeds the queue-wait histogram)
        self.stage_cache: dict[Any, tuple[StageSeries, bool]] = {}
        self.records = 0
        self.queue: Histogram | None = None
        self.batch: Histogram | None = None
        self.depth: float | None = None



def _fold(snap: Any, layout: Layout) -> tuple[list[int], float, list[Any] | None]:
    """A :meth:`Aggregator._snap` copy as classic per-bucket counts, sum and exemplars (``_add_hist``'s input)."""
    counts, total, ex, exv, tex, texv = snap
    classic = layout.classic_counts(counts)
    if ex is None and tex is None:
        return classic, total, None
    u, uv = layout.classic_exemplars(ex, exv)
    t, tv = layout.classic_exemplars(tex, texv)
    out: list[Any] = []
    for i, (a, b) in enumerate(zip(u, t, strict=True)):
        r = pick_exemplar(a, b)
        out.append(None if r is None else (*r, uv[i] if r is a else tv[i]))
    return classic, total, out


def _native_exemplars(exs: list[Any] | None) -> list[Exemplar]:
    """The classic buckets' exemplars, for the native histogram of the same series."""
    return [e for e in (_exemplar(x) for x in exs or () if x is not None) if e is not None]


def _add_hist(fam: HistogramMetricFamily, labels: list[str], raw: Any, les: list[str],
              layout: Layout | None = None) -> None:
    if layout is None:  # already classic (histogram_family)
        counts, total, exs = raw
    else:
        counts, total, exs = _fold(raw, layout)
        if layout.schema is not None and isinstance(fam, NativeHistogramFamily):
            fam.add_native(labels, layout, raw[0], total, functools.partial(_native_exemplars, exs))
    acc = 0
    buckets: list[Any] = []
    for i, c in enumerate(counts):
        acc += c
        e = _exemplar(exs[i]) if exs and exs[i] is not None else None
        buckets.append((les[i], acc, e) if e is not None else (les[i], acc))
    fam.add_metric(labels, buckets, total)


def histogram_quantile(q: float, bounds: tuple[float, ...], counts: list[int]) -> float | None:
    """Prometheus's ``histogram_quantile`` over per-bucket counts (the last one is ``+Inf``); None when empty.

    The rank is found by linear interpolation inside its bucket (the first
    bucket starts at 0); a rank in the ``+Inf`` bucket gives the largest
    finite bound, as Prometheus does.
    """
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    acc = 0
    for i, c in enumerate(counts):
        if c and acc + c >= rank:
            if i == len(bounds):
                return bounds[-1]
            lo = bounds[i - 1] if i else 0.0
            return lo + (bounds[i] - lo) * (rank - acc) / c
        acc += c
    return bounds[-1]

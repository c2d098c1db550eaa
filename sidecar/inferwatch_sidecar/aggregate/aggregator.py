"""Aggregation: decoded events in, Prometheus metric families out.

Why not prometheus_client's ``Histogram.labels(...).observe``: it costs about
1.6 us per call, takes a lock per observation and keeps no exemplar per
bucket across labels cheaply. At 100k events/s with several observations
per event that alone would use a core. Instead the ingest thread keeps plain
Python structures (bucket-count lists found with ``bisect``, dicts of
counters keyed by capped label tuples) and a custom collector turns them into
metric families at scrape time (STYLE.md 8).

Thread model: the ingest thread and the HTTP JSON endpoint call
:meth:`Aggregator.process` holding :attr:`Aggregator.lock`; the scrape thread
takes the same lock only to copy the numbers, so neither stalls the other
for longer than a copy.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.metrics_core import Metric as PromMetric
from prometheus_client.samples import Exemplar

from inferwatch.wire import (
    DROP_REASONS,
    EV_BATCH,
    EV_DROPS,
    EV_HELLO,
    EV_QUEUE,
    EV_RECORD,
    EV_REQUEST,
    EV_STAGE,
    OUTCOMES,
)
from inferwatch_sidecar import __version__
from inferwatch_sidecar.aggregate.labels import OVERFLOW, LabelLimiter
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.metrics import families
from inferwatch_sidecar.metrics.core import (
    BATCH_SIZE,
    GENERATED_TOKENS_TOTAL,
    GENERATION_LENGTH_TOKENS,
    INTER_TOKEN_LATENCY_SECONDS,
    LABELS_RECEIVED_TOTAL,
    QUEUE_DEPTH,
    QUEUE_WAIT_SECONDS,
    RECORDS_TOTAL,
    REQUEST_DURATION_SECONDS,
    REQUEST_ERRORS_TOTAL,
    REQUESTS_TOTAL,
    SDK_DROPPED_EVENTS_TOTAL,
    SIDECAR,
    STAGE_DURATION_SECONDS,
    TIME_TO_FIRST_TOKEN_SECONDS,
)
from inferwatch_sidecar.metrics.entry import Metric

#: The histograms :meth:`Aggregator.collect` exports, in the order it yields them.
_HISTOGRAMS = (
    REQUEST_DURATION_SECONDS, STAGE_DURATION_SECONDS, QUEUE_WAIT_SECONDS, BATCH_SIZE, TIME_TO_FIRST_TOKEN_SECONDS,
    INTER_TOKEN_LATENCY_SECONDS, GENERATION_LENGTH_TOKENS,
)
#: Every catalog entry :meth:`Aggregator.collect` exports, in the order it yields them.
METRICS: tuple[Metric, ...] = (
    REQUESTS_TOTAL, REQUEST_ERRORS_TOTAL, GENERATED_TOKENS_TOTAL, RECORDS_TOTAL, LABELS_RECEIVED_TOTAL, QUEUE_DEPTH,
    *_HISTOGRAMS,
    SDK_DROPPED_EVENTS_TOTAL, SIDECAR,
)

#: Raw-label caches are cleared when they reach this size, so hostile label
#: values cannot grow memory (the limiters already cap the exported series).
_CACHE_LIMIT = 20000
#: Exemplar label sets are limited to 128 UTF-8 characters by OpenMetrics.
_EXEMPLAR_RID_MAX = 128 - len("request_id")
#: "No context seen yet" in :meth:`Aggregator.process` (a ctx can be anything, even None).
_NO_CTX = object()


def _buckets(m: Metric) -> tuple[float, ...]:
    assert m.buckets is not None  # a histogram entry (checked by Metric)
    return m.buckets


def _shared_buckets(*ms: Metric) -> tuple[float, ...]:
    """The bounds of histograms that :meth:`Aggregator.process` bisects with one bounds tuple."""
    first = _buckets(ms[0])
    for m in ms[1:]:
        if _buckets(m) != first:
            raise ValueError(f"metric {m.name!r}: the aggregator needs the buckets of {ms[0].name!r}")
    return first


#: One bisect serves the request's end-to-end, stage and queue-wait histograms.
_LATENCY_BOUNDS = _shared_buckets(REQUEST_DURATION_SECONDS, STAGE_DURATION_SECONDS, QUEUE_WAIT_SECONDS)


class Histogram:
    """Per-bucket (non-cumulative) counts, sum, and the latest exemplar per bucket."""

    __slots__ = ("counts", "sum", "ex", "exv")

    def __init__(self, n_bounds: int) -> None:
        self.counts = [0] * (n_bounds + 1)  # last slot is +Inf
        self.sum = 0.0
        #: Per bucket: the latest exemplar's (request_id, trace_id, end_unix_ns), shared by the
        #: request's e2e and stage histograms so recording one allocates nothing per stage...
        self.ex: list[Any] | None = None
        #: ...and the observed value that goes with it.
        self.exv: list[float] | None = None


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
    if trace:
        labels["trace_id"] = trace.hex()
    elif rid:
        labels["request_id"] = rid[:_EXEMPLAR_RID_MAX]
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
    """The series of one (service, model, version, stage)."""

    __slots__ = ("key", "hist", "ttft", "itl", "length", "tokens")

    def __init__(self, key: tuple[str, ...], n_latency: int) -> None:
        self.key = key
        self.hist = Histogram(n_latency)
        self.ttft: Histogram | None = None
        self.itl: Histogram | None = None
        self.length: Histogram | None = None
        self.tokens = 0


class Bundle:
    """Every series of one capped (service, model, model_version) label set.

    The ingest loop finds the bundle with one dict lookup on the raw ``ctx``
    tuple and then only indexes lists: no label tuples are built per event.
    """

    __slots__ = ("lab", "requests", "errors", "e2e", "stages", "stage_cache", "records", "queue", "batch", "depth")

    def __init__(self, lab: tuple[str, str, str], n_latency: int) -> None:
        self.lab = lab
        self.requests = [0, 0, 0]  # by outcome code
        self.errors: dict[str, int] = {}
        self.e2e = Histogram(n_latency)
        self.stages: dict[str, StageSeries] = {}  # capped stage name -> series
        #: raw stage name -> (its series, whether it also feeds the queue-wait histogram)
        self.stage_cache: dict[Any, tuple[StageSeries, bool]] = {}
        self.records = 0
        self.queue: Histogram | None = None
        self.batch: Histogram | None = None
        self.depth: float | None = None


class Aggregator:
    """Turns decoded event tuples into counters and histograms.

    Args:
        ctx: the component context; its limiters cap every label.
        queue_stages: stage names that also feed the queue-wait histogram.
    """

    def __init__(
        self, ctx: ComponentContext, queue_stages: frozenset[str] = frozenset({"queue"}), max_label_sets: int = 1000
    ) -> None:
        self.lock = threading.Lock()
        self.max_label_sets = max_label_sets
        #: Counts label sets refused because max_label_sets was reached (exported as label="label_set").
        self.label_set_overflow = LabelLimiter("label_set", 1)
        self.ctx = ctx
        self.queue_stages = queue_stages
        self.lat_bounds = _LATENCY_BOUNDS
        self.n_lat = len(self.lat_bounds)
        self.ttft_bounds = _buckets(TIME_TO_FIRST_TOKEN_SECONDS)
        self.itl_bounds = _buckets(INTER_TOKEN_LATENCY_SECONDS)
        self.token_bounds = _buckets(GENERATION_LENGTH_TOKENS)
        self.batch_bounds = _buckets(BATCH_SIZE)
        self.bundles: dict[tuple[str, str, str], Bundle] = {}
        self.sdk_drops: dict[str, int] = {}
        #: Label-only records (a label for an earlier prediction), which belong to no label set.
        self.labels_received = 0
        self._ctx_cache: dict[Any, Bundle] = {}
        self._lim_service = ctx.limiter("service")
        self._lim_model = ctx.limiter("model")
        self._lim_version = ctx.limiter("model_version")
        self._lim_stage = ctx.limiter("stage")
        self._lim_error = ctx.limiter("error_type")

    # -- labels ----------------------------------------------------------------

    def bundle(self, ctx: Any) -> Bundle:
        """The bundle for a raw ``(service, model, model_version)`` tuple (lock held)."""
        b = self._ctx_cache.get(ctx)
        if b is None:
            if len(self._ctx_cache) >= _CACHE_LIMIT:
                self._ctx_cache.clear()
            try:
                svc, model, ver = ctx
            except (TypeError, ValueError):
                svc = model = ver = None
            lab = (self._lim_service.get(svc), self._lim_model.get(model), self._lim_version.get(ver))
            b = self.bundles.get(lab)
            if b is None:
                # Per-label budgets multiply; this caps the combinations too, so the series count is bounded.
                if len(self.bundles) >= self.max_label_sets:
                    self.label_set_overflow.overflowed += 1
                    lab = (OVERFLOW, OVERFLOW, OVERFLOW)
                    b = self.bundles.get(lab)
                if b is None:
                    b = self.bundles[lab] = Bundle(lab, self.n_lat)
            self._ctx_cache[ctx] = b
        return b

    def _stage_series(self, b: Bundle, name: Any) -> tuple[StageSeries, bool]:
        if len(b.stage_cache) >= _CACHE_LIMIT:
            b.stage_cache.clear()
        capped = self._lim_stage.get(name)
        s = b.stages.get(capped)
        if s is None:
            s = b.stages[capped] = StageSeries((*b.lab, capped), self.n_lat)
        try:
            queue = name in self.queue_stages
        except TypeError:  # an unhashable name from a hand-made tuple
            queue = False
        entry = b.stage_cache[name] = (s, queue)
        return entry

    # -- events ----------------------------------------------------------------

    def process(
        self,
        records: list[tuple[Any, ...]],
        counts: list[int],
        producer: Any = None,
        record_sink: list[tuple[Any, ...]] | None = None,
    ) -> None:
        """Aggregate a list of event tuples. Call with :attr:`lock` held.

        Args:
            records: decoded event tuples (``inferwatch.wire`` layouts).
            counts: per-event-type counters (indexed by ``EV_*``), incremented here.
            producer: the sender's ``Producer`` entry (HELLO and DROPS update it), or None.
            record_sink: when given, every RECORD event is also appended to it (the pipeline
                hands them to components without a second pass over the frame).
        """
        # Measured choices (bench/ingest.py): every event of a frame carries the same ctx
        # tuple object, so the bundle is looked up again only when the object changes; the
        # stage cache also says whether a stage feeds the queue-wait histogram.
        ctx_cache = self._ctx_cache
        bounds = self.lat_bounds
        nb = self.n_lat + 1
        last_ctx: Any = _NO_CTX
        b: Any = None
        scache: dict[Any, tuple[StageSeries, bool]] = {}
        for ev in records:
            t = ev[0]
            counts[t] += 1
            if t == EV_REQUEST:
                _, ctx, end_ns, dur, outcome, err, rid, trace, stages = ev
                if ctx is not last_ctx:
                    b = ctx_cache.get(ctx) or self.bundle(ctx)
                    last_ctx = ctx
                    scache = b.stage_cache
                b.requests[outcome] += 1
                if outcome == 1:
                    el = self._lim_error.get(err)
                    b.errors[el] = b.errors.get(el, 0) + 1
                v = dur * 1e-9
                h = b.e2e
                i = bisect_left(bounds, v)
                h.counts[i] += 1
                h.sum += v
                ref = (rid, trace, end_ns) if rid is not None or trace is not None else None
                if ref is not None:
                    if h.ex is None:
                        h.ex = [None] * nb
                        h.exv = [0.0] * nb
                    h.ex[i] = ref
                    h.exv[i] = v  # type: ignore[index]
                for name, sdur, stream in stages:
                    s, queue = scache.get(name) or self._stage_series(b, name)
                    v = sdur * 1e-9
                    h = s.hist
                    i = bisect_left(bounds, v)
                    h.counts[i] += 1
                    h.sum += v
                    if ref is not None:
                        if h.ex is None:
                            h.ex = [None] * nb
                            h.exv = [0.0] * nb
                        h.ex[i] = ref
                        h.exv[i] = v  # type: ignore[index]
                    if queue:
                        self._queue(b, v)
                    if stream is not None:
                        self._stream(s, stream)
            elif t == EV_RECORD:
                if ev[4] is None and ev[7] is None and ev[6] is not None:
                    # A label alone: its model is the prediction's, known only once the drift engine
                    # joins them, so it is counted without labels rather than under the context it carries.
                    self.labels_received += 1
                    if record_sink is not None:
                        record_sink.append(ev)
                    continue
                ctx = ev[1]
                if ctx is not last_ctx:
                    b = ctx_cache.get(ctx) or self.bundle(ctx)
                    last_ctx = ctx
                    scache = b.stage_cache
                b.records += 1
                if record_sink is not None:
                    record_sink.append(ev)
            elif t == EV_STAGE:
                _, ctx, end_ns, rid, st = ev
                if ctx is not last_ctx:
                    b = ctx_cache.get(ctx) or self.bundle(ctx)
                    last_ctx = ctx
                    scache = b.stage_cache
                name, sdur, stream = st
                s, queue = scache.get(name) or self._stage_series(b, name)
                v = sdur * 1e-9
                h = s.hist
                i = bisect_left(bounds, v)
                h.counts[i] += 1
                h.sum += v
                if rid is not None:
                    if h.ex is None:
                        h.ex = [None] * nb
                        h.exv = [0.0] * nb
                    h.ex[i] = (rid, None, end_ns)
                    h.exv[i] = v  # type: ignore[index]
                if queue:
                    self._queue(b, v)
                if stream is not None:
                    self._stream(s, stream)
            elif t == EV_BATCH:
                bb = ctx_cache.get(ev[1]) or self.bundle(ev[1])
                if bb.batch is None:
                    bb.batch = Histogram(len(self.batch_bounds))
                h = bb.batch
                h.counts[bisect_left(self.batch_bounds, ev[2])] += 1
                h.sum += ev[2]
            elif t == EV_QUEUE:
                bq = ctx_cache.get(ev[1]) or self.bundle(ev[1])
                bq.depth = float(ev[2])
            elif t == EV_DROPS:
                if producer is not None:
                    self.add_sdk_drops(producer.drop_deltas(ev[1]))
                else:
                    self.add_sdk_drops(ev[1])
            elif t == EV_HELLO and producer is not None:
                producer.hello = {"sdk_version": ev[1], "language": ev[2], "hostname": ev[3], "start_unix_ns": ev[4]}

    def _queue(self, b: Bundle, v: float) -> None:
        if b.queue is None:
            b.queue = Histogram(self.n_lat)
        h = b.queue
        h.counts[bisect_left(self.lat_bounds, v)] += 1
        h.sum += v

    def _stream(self, s: StageSeries, stream: Any) -> None:
        ttft, items, gaps = stream
        if s.ttft is None:
            s.ttft = Histogram(len(self.ttft_bounds))
            s.itl = Histogram(len(self.itl_bounds))
            s.length = Histogram(len(self.token_bounds))
        assert s.itl is not None and s.length is not None
        v = ttft * 1e-9
        s.ttft.counts[bisect_left(self.ttft_bounds, v)] += 1
        s.ttft.sum += v
        s.tokens += items
        s.length.counts[bisect_left(self.token_bounds, items)] += 1
        s.length.sum += items
        if gaps:
            c = s.itl.counts
            bounds = self.itl_bounds
            for g in gaps:
                c[bisect_left(bounds, g * 1e-6)] += 1
            s.itl.sum += sum(gaps) * 1e-6

    def add_sdk_drops(self, deltas: dict[str, int]) -> None:
        """Add per-reason drop deltas reported by a producer (lock held)."""
        for reason, n in deltas.items():
            if n > 0:
                self.sdk_drops[reason] = self.sdk_drops.get(reason, 0) + n

    # -- scrape ----------------------------------------------------------------

    @staticmethod
    def _snap(h: Histogram | None) -> tuple[list[int], float, list[Any] | None] | None:
        if h is None:
            return None
        if h.ex is None or h.exv is None:
            return (list(h.counts), h.sum, None)
        return (list(h.counts), h.sum, [None if r is None else (*r, v) for r, v in zip(h.ex, h.exv, strict=True)])

    def collect(self) -> Iterator[PromMetric]:
        """Metric families for everything aggregated so far."""
        snap = self._snap
        with self.lock:
            rows = []
            for lab, b in self.bundles.items():
                stages = [
                    (s.key, snap(s.hist), snap(s.ttft), snap(s.itl), snap(s.length), s.tokens)
                    for s in b.stages.values()
                ]
                rows.append((lab, list(b.requests), dict(b.errors), snap(b.e2e), stages, b.records,
                             snap(b.queue), snap(b.batch), b.depth))
            drops = dict(self.sdk_drops)
            labels_received = self.labels_received
        requests = families.counter(REQUESTS_TOTAL)
        errors = families.counter(REQUEST_ERRORS_TOTAL)
        tokens = families.counter(GENERATED_TOKENS_TOTAL)
        records = families.counter(RECORDS_TOTAL)
        depth = families.gauge(QUEUE_DEPTH)
        hists = [families.histogram(m) for m in _HISTOGRAMS]
        e2e_fam, stage_fam, queue_fam, batch_fam, ttft_fam, itl_fam, length_fam = hists
        lat_les = families.bucket_les(REQUEST_DURATION_SECONDS)  # the stage and queue-wait buckets too
        batch_les = families.bucket_les(BATCH_SIZE)
        ttft_les = families.bucket_les(TIME_TO_FIRST_TOKEN_SECONDS)
        itl_les = families.bucket_les(INTER_TOKEN_LATENCY_SECONDS)
        length_les = families.bucket_les(GENERATION_LENGTH_TOKENS)
        for lab, reqs, errs, e2e, stages, nrec, queue, batch, dep in rows:
            labels = list(lab)
            for code, n in enumerate(reqs):
                if n:
                    requests.add_metric([*labels, OUTCOMES[code]], n)
            for et, n in errs.items():
                errors.add_metric([*labels, et], n)
            if nrec:
                records.add_metric(labels, nrec)
            if dep is not None:
                depth.add_metric(labels, dep)
            if e2e is not None and any(e2e[0]):
                _add_hist(e2e_fam, labels, e2e, lat_les)
            if queue is not None:
                _add_hist(queue_fam, labels, queue, lat_les)
            if batch is not None:
                _add_hist(batch_fam, labels, batch, batch_les)
            for key, hist, ttft, itl, length, ntok in stages:
                sl = list(key)
                _add_hist(stage_fam, sl, hist, lat_les)
                if ttft is not None:
                    _add_hist(ttft_fam, sl, ttft, ttft_les)
                    _add_hist(itl_fam, sl, itl, itl_les)
                    _add_hist(length_fam, sl, length, length_les)
                    tokens.add_metric(sl, ntok)
        yield requests
        yield errors
        yield tokens
        yield records
        fam = families.counter(LABELS_RECEIVED_TOTAL)
        fam.add_metric([], labels_received)
        yield fam
        yield depth
        yield from hists
        fam = families.counter(SDK_DROPPED_EVENTS_TOTAL)
        # Every reason the wire format defines is exported from the start (at 0), so
        # dashboards and rate() see the series before the first drop.
        drops = {**dict.fromkeys(DROP_REASONS.values(), 0), **drops}
        for reason, n in sorted(drops.items()):
            fam.add_metric([reason], n)
        yield fam
        info = families.info(SIDECAR)
        info.add_metric([], {"version": __version__, "python": sys.version.split()[0]})
        yield info


def _add_hist(fam: HistogramMetricFamily, labels: list[str], snap: Any, les: list[str]) -> None:
    counts, total, exs = snap
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


#: The quantiles ``/v1/status`` shows per latency series.
STATUS_QUANTILES = (0.5, 0.9, 0.99)
#: A latency series in the status: (service, model, model_version, stage or None for the end-to-end request).
_SeriesKey = tuple[str, str, str, str | None]
_Snapshot = dict[_SeriesKey, tuple[list[int], float]]


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

    def _snapshot(self) -> _Snapshot:
        out: _Snapshot = {}
        with self.agg.lock:
            for lab, b in self.agg.bundles.items():
                out[(*lab, None)] = (list(b.e2e.counts), b.e2e.sum)
                for name, st in b.stages.items():
                    out[(*lab, name)] = (list(st.hist.counts), st.hist.sum)
        return out

    def sample(self) -> None:
        """Keep a copy when ``every_s`` has passed since the last one; forget those the window no longer needs."""
        now = self.monotonic()
        with self._lock:
            if now - self._copies[-1][0] < self.every_s:
                return
        snap = self._snapshot()
        with self._lock:
            copies = self._copies
            copies.append((now, snap))
            while len(copies) > 1 and now - copies[1][0] >= self.window_s:
                copies.popleft()

    def status(self) -> dict[str, Any]:
        """The ``latency`` section: per label set, the request's and each stage's calls, mean and quantiles.

        ``count``, ``mean_s`` and the quantiles are over the window; ``total``
        counts the calls since start. Series without a call since start are left out.
        """
        now = self.monotonic()
        snap = self._snapshot()
        with self._lock:
            base_t, base = self._copies[0]
        bounds = self.agg.lat_bounds
        by_set: dict[tuple[str, str, str], dict[str, Any]] = {}
        for key, (counts, total) in snap.items():
            since_start = sum(counts)
            if not since_start:
                continue  # a label set that only sent records has no request latency
            old_counts, old_total = base.get(key, (None, 0.0))
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
            else:
                entry["stages"][key[3]] = row
        sets = sorted(by_set.values(), key=lambda e: (-_observed(e), e["service"], e["model"], e["model_version"]))
        return {
            "window_s": round(now - base_t, 3),
            "quantiles": list(STATUS_QUANTILES),
            "label_sets": len(sets),
            "models": sets[: self.max_label_sets],
        }


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


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

import functools
import math
import sys
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.metrics_core import Metric as PromMetric
from prometheus_client.samples import Exemplar

from inferwatch.wire import (
    DROP_REASONS,
    EV_BATCH,
    EV_DROPS,
    EV_HELLO,
    EV_HTTP,
    EV_QUEUE,
    EV_RECORD,
    EV_REQUEST,
    EV_STAGE,
    OUTCOMES,
)
from inferwatch_sidecar import __version__
from inferwatch_sidecar.aggregate.context import ComponentContext
from inferwatch_sidecar.aggregate.labels import OVERFLOW, LabelLimiter
from inferwatch_sidecar.aggregate.overload import OVERLOAD_METRICS, Overload
from inferwatch_sidecar.metrics import families
from inferwatch_sidecar.metrics.core import (
    ALERT_BUCKET_BOUNDS,
    BATCH_SIZE,
    CANCELLED_STREAMS_TOTAL,
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
    UNDELIVERED_TOKENS_TOTAL,
)
from inferwatch_sidecar.metrics.entry import Metric
from inferwatch_sidecar.metrics.native import DEFAULT_SCHEMA, Layout, NativeHistogramFamily

#: The histograms :meth:`Aggregator.collect` exports, in the order it yields them.
_HISTOGRAMS = (
    REQUEST_DURATION_SECONDS, STAGE_DURATION_SECONDS, QUEUE_WAIT_SECONDS, BATCH_SIZE, TIME_TO_FIRST_TOKEN_SECONDS,
    INTER_TOKEN_LATENCY_SECONDS, GENERATION_LENGTH_TOKENS,
)
#: Every catalog entry :meth:`Aggregator.collect` exports, in the order it yields them.
METRICS: tuple[Metric, ...] = (
    REQUESTS_TOTAL, REQUEST_ERRORS_TOTAL, GENERATED_TOKENS_TOTAL, CANCELLED_STREAMS_TOTAL, UNDELIVERED_TOKENS_TOTAL,
    RECORDS_TOTAL, LABELS_RECEIVED_TOTAL, QUEUE_DEPTH,
    *_HISTOGRAMS,
    SDK_DROPPED_EVENTS_TOTAL, SIDECAR, *OVERLOAD_METRICS,
)

#: Raw-label caches are cleared when they reach this size, so hostile label
#: values cannot grow memory (the limiters already cap the exported series).
_CACHE_LIMIT = 20000
#: Exemplar label sets are limited to 128 UTF-8 characters by OpenMetrics: the request ID gets
#: what its label name and, on a traced request, ``trace_id`` and its 32 hex digits leave.
_EXEMPLAR_RID_MAX = 128 - len("request_id")
_EXEMPLAR_TRACED_RID_MAX = _EXEMPLAR_RID_MAX - len("trace_id") - 32
#: A traced request's exemplar stays in its bucket against newer untraced ones for this long
#: (ns, on the events' end times): long enough for several scrapes to pick it up and for
#: someone to follow the link, short enough that a bucket never shows an hour-old request.
TRACED_EXEMPLAR_HOLD_NS = 60 * 10**9
_OVERFLOW_LAB = (OVERFLOW, OVERFLOW, OVERFLOW)
#: A traced exemplar ending further than this past the wall clock does not hold its bucket.
MAX_FUTURE_NS = 24 * 3600 * 10**9
#: "No context seen yet" in :meth:`Aggregator.process` (a ctx can be anything, even None).
_NO_CTX = object()


def _buckets(m: Metric) -> tuple[float, ...]:
    assert m.buckets is not None  # a histogram entry (checked by Metric)
    return m.buckets


#: The histogram families whose buckets ``aggregate.buckets.families`` may replace.
CONFIGURABLE_HISTOGRAMS: tuple[str, ...] = tuple(m.name for m in _HISTOGRAMS)


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


class Aggregator:
    """Turns decoded event tuples into counters and histograms.

    Args:
        ctx: the component context; its limiters cap every label.
        queue_stages: stage names that also feed the queue-wait histogram.
        max_label_sets: distinct (service, model, model_version) sets kept before __overflow__.
        buckets: histogram family name -> bucket bounds replacing the catalog entry's
            (``aggregate.buckets.families``, validated by the config).
        stage_buckets: stage name -> bounds of that stage's duration histogram
            (``aggregate.buckets.stages``); other stages use the family's.
        native_schema: the schema of the native histograms kept alongside the classic buckets
            (``aggregate.native.schema``), or None for classic buckets alone.
        native_classic: families whose classic buckets the protobuf exposition also carries
            (``aggregate.native.classic_families``); text and OpenMetrics always carry them.
        max_series: exposition lines (samples) all label sets, stages, error types and stream
            histograms together may create (``labels.max_series``). Per-label budgets multiply
            (1,000 label sets x 51 stages x 33 bucket lines); this one does not: once it is spent,
            a new label set, stage, error type or stream histogram is aggregated into the one
            ``__overflow__`` label set (stage and error type ``__overflow__``), counted as
            ``label="series"`` in ``inferwatch_label_overflow_total``, which the cardinality alert watches.
        max_family_series: the same, per family (``labels.max_family_series``): the lines one
            family may hold, so the aggregator never keeps series the exposition budget would
            leave out of every scrape (export/budget.py), nor builds them at each scrape.
    """

    def __init__(
        self, ctx: ComponentContext, queue_stages: frozenset[str] = frozenset({"queue"}), max_label_sets: int = 1000,
        buckets: Mapping[str, Sequence[float]] | None = None,
        stage_buckets: Mapping[str, Sequence[float]] | None = None,
        native_schema: int | None = DEFAULT_SCHEMA, native_classic: Sequence[str] = (),
        max_series: int = 50000, max_family_series: int | None = None,
    ) -> None:
        self.lock = threading.Lock()
        self.max_label_sets = max_label_sets
        self.max_series = max_series
        self.max_family_series = max_family_series
        #: Lines spent per family (the largest family a new series adds to), against max_family_series.
        self.family_series: dict[str, int] = {}
        #: Exposition lines created so far (the budget above counts them).
        self.series = 0
        #: Counts what the series budget sent to __overflow__ (exported as label="series").
        self.series_overflow = LabelLimiter("series", 1)
        #: Counts label sets refused because max_label_sets was reached (exported as label="label_set").
        self.label_set_overflow = LabelLimiter("label_set", 1)
        self.ctx = ctx
        self.queue_stages = queue_stages
        conf = dict(buckets or {})
        unknown = sorted(set(conf) - set(CONFIGURABLE_HISTOGRAMS))
        if unknown:
            raise ValueError(f"buckets for unknown histogram families {unknown}; known: {list(CONFIGURABLE_HISTOGRAMS)}")
        #: Family name -> the bounds in use (configured, or the catalog entry's).
        self.bounds: dict[str, tuple[float, ...]] = {
            m.name: tuple(float(b) for b in conf[m.name]) if m.name in conf else _buckets(m) for m in _HISTOGRAMS
        }
        #: Stage name -> the bounds of its duration histogram, where configured.
        self.stage_bounds: dict[str, tuple[float, ...]] = {
            k: tuple(float(b) for b in v) for k, v in (stage_buckets or {}).items()
        }
        unknown = sorted(set(native_classic) - set(CONFIGURABLE_HISTOGRAMS))
        if unknown:
            raise ValueError(f"classic buckets for unknown histogram families {unknown}")
        self.native_schema = native_schema
        self.native_classic = frozenset(native_classic)
        #: Family name -> its cells (classic and native bounds together; metrics/native.py).
        self.layouts: dict[str, Layout] = {
            m.name: Layout(self.bounds[m.name], native_schema, m.unit) for m in _HISTOGRAMS
        }
        self.stage_layouts: dict[str, Layout] = {
            k: Layout(v, native_schema, STAGE_DURATION_SECONDS.unit) for k, v in self.stage_bounds.items()
        }
        # What process() bisects: the cells' bounds.
        self.request_bounds = self.layouts[REQUEST_DURATION_SECONDS.name].edges
        self.queue_bounds = self.layouts[QUEUE_WAIT_SECONDS.name].edges
        self.ttft_bounds = self.layouts[TIME_TO_FIRST_TOKEN_SECONDS.name].edges
        self.itl_bounds = self.layouts[INTER_TOKEN_LATENCY_SECONDS.name].edges
        self.token_bounds = self.layouts[GENERATION_LENGTH_TOKENS.name].edges
        self.batch_bounds = self.layouts[BATCH_SIZE.name].edges
        # Integer-input lookups: durations in ns, inter-token gaps in us (one short bisect per observation).
        self.request_ns = self.layouts[REQUEST_DURATION_SECONDS.name].table(1e-9)
        self.queue_ns = self.layouts[QUEUE_WAIT_SECONDS.name].table(1e-9)
        self.ttft_ns = self.layouts[TIME_TO_FIRST_TOKEN_SECONDS.name].table(1e-9)
        self.itl_us = self.layouts[INTER_TOKEN_LATENCY_SECONDS.name].table(1e-6)
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
        #: HTTP events: routes, status outcomes, retries and give-ups (aggregate/overload.py).
        self.overload = Overload(lambda c: self.bundle(c).lab, ctx.limiter("route"))

    def alert_bound_problems(self) -> list[str]:
        """One sentence per generated alert that counts a bucket bound the configured buckets leave out.

        The daemon logs them at start-up: such an alert's ``le`` matcher selects no series,
        so it can never fire for the histograms concerned.
        """
        out: list[str] = []
        for family, needed in ALERT_BUCKET_BOUNDS.items():
            sets = [(family, self.bounds[family])]
            if family == STAGE_DURATION_SECONDS.name:
                sets += [(f"{family} of stage {k!r}", v) for k, v in sorted(self.stage_bounds.items())]
            for where, bounds in sets:
                for bound, alert in needed.items():
                    if bound not in bounds:
                        out.append(f"alert {alert} counts the bucket le=\"{bound!r}\" of {where}, which "
                                   f"aggregate.buckets leaves out, so it cannot fire there; add {bound!r} to "
                                   "those bounds")
        return out

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
                    b = self._overflow_bundle()
                elif not self._spend(self._bundle_lines, REQUEST_DURATION_SECONDS.name,
                                     len(self.bounds[REQUEST_DURATION_SECONDS.name]) + 3):
                    b = self._overflow_bundle()
                else:
                    b = self.bundles[lab] = Bundle(lab, len(self.request_bounds))
            self._ctx_cache[ctx] = b
        return b

    @property
    def _bundle_lines(self) -> int:
        # requests_total by outcome, records_total, and the request-duration histogram's buckets, sum, count.
        # (Classic buckets: the lines a text scrape shows, whatever cells the native histograms add.)
        return 3 + 1 + len(self.bounds[REQUEST_DURATION_SECONDS.name]) + 3

    def _spend(self, lines: int, family: str = "", family_lines: int = 0) -> bool:
        """Take ``lines`` from the series budget, ``family_lines`` of them from ``family``'s; False (and
        counted) when they do not fit."""
        fam = self.family_series.get(family, 0) + family_lines
        # Room is left in each family for the __overflow__ label set's own series (outside the budget).
        if self.series + lines > self.max_series or (
                self.max_family_series is not None and fam > self.max_family_series - family_lines):
            self.series_overflow.overflowed += 1
            return False
        self.series += lines
        if family:
            self.family_series[family] = fam
        return True

    def _overflow_bundle(self) -> Bundle:
        """The one label set everything past a budget is aggregated into (outside the series budget)."""
        b = self.bundles.get(_OVERFLOW_LAB)
        if b is None:
            b = self.bundles[_OVERFLOW_LAB] = Bundle(_OVERFLOW_LAB, len(self.request_bounds))
        return b

    def _overflow_stage(self) -> StageSeries:
        b = self._overflow_bundle()
        s = b.stages.get(OVERFLOW)
        if s is None:
            lay = self.layouts[STAGE_DURATION_SECONDS.name]
            s = b.stages[OVERFLOW] = StageSeries((*b.lab, OVERFLOW), lay.edges, lay)
        return s

    def _new_error(self, b: Bundle, el: str) -> None:
        """Count the first error of type ``el`` in ``b``: a new series, if the budget allows."""
        if (el == OVERFLOW and b.lab == _OVERFLOW_LAB) or self._spend(1, REQUEST_ERRORS_TOTAL.name, 1):
            b.errors[el] = 1
        else:
            ob = self._overflow_bundle()
            ob.errors[OVERFLOW] = ob.errors.get(OVERFLOW, 0) + 1

    def _stage_series(self, b: Bundle, name: Any) -> tuple[StageSeries, bool]:
        if len(b.stage_cache) >= _CACHE_LIMIT:
            b.stage_cache.clear()
        capped = self._lim_stage.get(name)
        s = b.stages.get(capped)
        if s is None:
            lay = self.stage_layouts.get(capped) or self.layouts[STAGE_DURATION_SECONDS.name]
            n = len(self.stage_bounds.get(capped) or self.bounds[STAGE_DURATION_SECONDS.name]) + 3
            if (b.lab == _OVERFLOW_LAB and capped == OVERFLOW) or self._spend(n, STAGE_DURATION_SECONDS.name, n):
                s = b.stages[capped] = StageSeries((*b.lab, capped), lay.edges, lay)
            else:
                s = self._overflow_stage()
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
        # Measured choices (bench/ingest.py, bench/aggregate_callgrind.py): every event of a
        # frame carries the same ctx tuple object, so the bundle is looked up again only when
        # the object changes; the stage cache also says whether a stage feeds the queue-wait
        # histogram; each stage series carries its own bounds, so configured buckets cost one
        # attribute read per stage. A histogram counts per cell of its classic and native bounds
        # together (metrics/native.py); the cell of an integer duration is found in the few cells
        # of its power of two (``bit_length``), as cheap as one bisect over the classic bounds was.
        ctx_cache = self._ctx_cache
        req_ns = self.request_ns
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
                    n = b.errors.get(el)
                    if n is None:
                        self._new_error(b, el)
                    else:
                        b.errors[el] = n + 1
                v = dur * 1e-9
                h = b.e2e
                off, tab = req_ns[dur.bit_length()]
                i = off + bisect_left(tab, dur)
                h.counts[i] += 1
                h.sum += v
                ref = (rid, trace, end_ns) if rid is not None or trace is not None else None
                if ref is not None:
                    if trace is None:
                        if h.ex is None:
                            h.ex = [None] * len(h.counts)
                            h.exv = [0.0] * len(h.counts)
                        h.ex[i] = ref
                        h.exv[i] = v  # type: ignore[index]
                    else:
                        if h.tex is None:
                            h.tex = [None] * len(h.counts)
                            h.texv = [0.0] * len(h.counts)
                        h.tex[i] = ref
                        h.texv[i] = v  # type: ignore[index]
                for name, sdur, stream in stages:
                    s, queue = scache.get(name) or self._stage_series(b, name)
                    v = sdur * 1e-9
                    h = s.hist
                    off, tab = s.ns[sdur.bit_length()]
                    i = off + bisect_left(tab, sdur)
                    h.counts[i] += 1
                    h.sum += v
                    if ref is not None:
                        if trace is None:
                            if h.ex is None:
                                h.ex = [None] * len(h.counts)
                                h.exv = [0.0] * len(h.counts)
                            h.ex[i] = ref
                            h.exv[i] = v  # type: ignore[index]
                        else:
                            if h.tex is None:
                                h.tex = [None] * len(h.counts)
                                h.texv = [0.0] * len(h.counts)
                            h.tex[i] = ref
                            h.texv[i] = v  # type: ignore[index]
                    if queue:
                        self._queue(b, v, sdur)
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
                off, tab = s.ns[sdur.bit_length()]
                i = off + bisect_left(tab, sdur)
                h.counts[i] += 1
                h.sum += v
                if rid is not None:
                    if h.ex is None:
                        h.ex = [None] * len(h.counts)
                        h.exv = [0.0] * len(h.counts)
                    h.ex[i] = (rid, None, end_ns)
                    h.exv[i] = v  # type: ignore[index]
                if queue:
                    self._queue(b, v, sdur)
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
                self.add_sdk_drops(ev[1] if producer is None else producer.plausible_drops(ev[1]))
            elif t == EV_HTTP:
                self.overload.process(ev)
            elif t == EV_HELLO and producer is not None:
                producer.hello = {"sdk_version": ev[1], "language": ev[2], "hostname": ev[3], "start_unix_ns": ev[4]}

    def _queue(self, b: Bundle, v: float, ns: int) -> None:
        if b.queue is None:
            b.queue = Histogram(len(self.queue_bounds))
        h = b.queue
        off, tab = self.queue_ns[ns.bit_length()]
        h.counts[off + bisect_left(tab, ns)] += 1
        h.sum += v

    def _stream(self, s: StageSeries, stream: Any) -> None:
        # A completed stream is (ttft, items, gaps); a cancelled one adds its undelivered count.
        ttft, items, gaps = stream[0], stream[1], stream[2]
        classic = self.bounds
        if s.ttft is None and not self._spend(len(classic[TIME_TO_FIRST_TOKEN_SECONDS.name])
                                               + len(classic[INTER_TOKEN_LATENCY_SECONDS.name])
                                               + len(classic[GENERATION_LENGTH_TOKENS.name]) + 9 + 2,
                                               INTER_TOKEN_LATENCY_SECONDS.name,
                                               len(classic[INTER_TOKEN_LATENCY_SECONDS.name]) + 3):
            s = self._overflow_stage()
        if s.ttft is None:
            s.ttft = Histogram(len(self.ttft_bounds))
            s.itl = Histogram(len(self.itl_bounds))
            s.length = Histogram(len(self.token_bounds))
        assert s.itl is not None and s.length is not None
        s.tokens += items
        if len(stream) > 3:
            # Its length is not a generation's length, and with no item it had no first token.
            s.cancelled += 1
            s.undelivered += min(stream[3], items)
        else:
            s.length.counts[bisect_left(self.token_bounds, items)] += 1
            s.length.sum += items
        if items or len(stream) == 3:
            v = ttft * 1e-9
            off, tab = self.ttft_ns[ttft.bit_length()]
            s.ttft.counts[off + bisect_left(tab, ttft)] += 1
            s.ttft.sum += v
        if gaps:
            c = s.itl.counts
            itl_us = self.itl_us
            for g in gaps:
                off, tab = itl_us[g.bit_length()]
                c[off + bisect_left(tab, g)] += 1
            s.itl.sum += sum(gaps) * 1e-6

    def add_sdk_drops(self, deltas: dict[str, int]) -> None:
        """Add per-reason drop deltas reported by a producer (lock held)."""
        for reason, n in deltas.items():
            if n > 0:
                self.sdk_drops[reason] = self.sdk_drops.get(reason, 0) + n

    # -- scrape ----------------------------------------------------------------

    @staticmethod
    def _snap(h: Histogram | None) -> tuple[Any, ...] | None:
        """A copy of ``h``'s cells, sum and exemplars (lock held; :func:`_fold` works on it after)."""
        if h is None:
            return None
        if h.ex is None and h.tex is None:
            return (list(h.counts), h.sum, None, None, None, None)
        return (list(h.counts), h.sum, h.ex and list(h.ex), h.exv and list(h.exv), h.tex and list(h.tex),
                h.texv and list(h.texv))

    def collect(self) -> Iterator[PromMetric]:
        """Metric families for everything aggregated so far."""
        snap = self._snap
        lay = self.layouts
        with self.lock:
            rows = []
            for lab, b in self.bundles.items():
                stages = [
                    (s.key, s.layout, snap(s.hist), snap(s.ttft), snap(s.itl), snap(s.length), s.tokens,
                     s.cancelled, s.undelivered)
                    for s in b.stages.values()
                ]
                rows.append((lab, list(b.requests), dict(b.errors), snap(b.e2e), stages, b.records,
                             snap(b.queue), snap(b.batch), b.depth))
            drops = dict(self.sdk_drops)
            labels_received = self.labels_received
        requests = families.counter(REQUESTS_TOTAL)
        errors = families.counter(REQUEST_ERRORS_TOTAL)
        tokens = families.counter(GENERATED_TOKENS_TOTAL)
        cancelled = families.counter(CANCELLED_STREAMS_TOTAL)
        undelivered = families.counter(UNDELIVERED_TOKENS_TOTAL)
        records = families.counter(RECORDS_TOTAL)
        depth = families.gauge(QUEUE_DEPTH)
        hists = [NativeHistogramFamily(families.histogram(m), m.name in self.native_classic) for m in _HISTOGRAMS]
        e2e_fam, stage_fam, queue_fam, batch_fam, ttft_fam, itl_fam, length_fam = hists
        les = {m.name: families.bucket_les(m, self.bounds[m.name]) for m in _HISTOGRAMS}
        req_les = les[REQUEST_DURATION_SECONDS.name]
        queue_les = les[QUEUE_WAIT_SECONDS.name]
        batch_les = les[BATCH_SIZE.name]
        ttft_les = les[TIME_TO_FIRST_TOKEN_SECONDS.name]
        itl_les = les[INTER_TOKEN_LATENCY_SECONDS.name]
        length_les = les[GENERATION_LENGTH_TOKENS.name]
        #: A stage series' bounds object -> its le values (one list per distinct configuration).
        stage_les: dict[int, list[str]] = {id(lay[STAGE_DURATION_SECONDS.name].classic):
                                           les[STAGE_DURATION_SECONDS.name]}
        e2e_lay, queue_lay, batch_lay = (lay[REQUEST_DURATION_SECONDS.name], lay[QUEUE_WAIT_SECONDS.name],
                                         lay[BATCH_SIZE.name])
        ttft_lay, itl_lay, length_lay = (lay[TIME_TO_FIRST_TOKEN_SECONDS.name], lay[INTER_TOKEN_LATENCY_SECONDS.name],
                                         lay[GENERATION_LENGTH_TOKENS.name])
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
                _add_hist(e2e_fam, labels, e2e, req_les, e2e_lay)
            if queue is not None:
                _add_hist(queue_fam, labels, queue, queue_les, queue_lay)
            if batch is not None:
                _add_hist(batch_fam, labels, batch, batch_les, batch_lay)
            for key, slay, hist, ttft, itl, length, ntok, ncancel, nlost in stages:
                sl = list(key)
                sles = stage_les.get(id(slay.classic))
                if sles is None:
                    sles = stage_les[id(slay.classic)] = families.bucket_les(STAGE_DURATION_SECONDS, slay.classic)
                _add_hist(stage_fam, sl, hist, sles, slay)
                if ttft is not None:
                    _add_hist(ttft_fam, sl, ttft, ttft_les, ttft_lay)
                    _add_hist(itl_fam, sl, itl, itl_les, itl_lay)
                    _add_hist(length_fam, sl, length, length_les, length_lay)
                    tokens.add_metric(sl, ntok)
                    # From a series' first stream on, so rate() sees them before the first cancel.
                    cancelled.add_metric(sl, ncancel)
                    undelivered.add_metric(sl, nlost)
        yield requests
        yield errors
        yield tokens
        yield cancelled
        yield undelivered
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
        with self.lock:
            overload = list(self.overload.collect())
        yield from overload


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


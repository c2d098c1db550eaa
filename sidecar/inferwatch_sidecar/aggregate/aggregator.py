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

import sys
import threading
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.metrics_core import Metric as PromMetric

from inferwatch.wire import (
    EV_BATCH,
    EV_DROPS,
    EV_HELLO,
    EV_HTTP,
    EV_QUEUE,
    EV_RECORD,
    EV_REQUEST,
    EV_STAGE,
)
from inferwatch_sidecar import __version__
from inferwatch_sidecar.aggregate.context import ComponentContext

# The histogram state and the status quantiles live in modules of their own (issue 23); their public
# names stay importable from here, where every caller found them.
from inferwatch_sidecar.aggregate.histograms import (
    MAX_FUTURE_NS,
    TRACED_EXEMPLAR_HOLD_NS,
    Bundle,
    Histogram,
    HistogramSet,
    StageSeries,
    _buckets,
    histogram_family,
    histogram_quantile,
    pick_exemplar,
)
from inferwatch_sidecar.aggregate.labels import OVERFLOW, LabelLimiter
from inferwatch_sidecar.aggregate.latency_status import STATUS_QUANTILES, LatencyStatus, finite_or_none
from inferwatch_sidecar.aggregate.overload import OVERLOAD_METRICS, Overload
from inferwatch_sidecar.aggregate.scrape import ScrapeFamilies, sdk_drops_family
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
from inferwatch_sidecar.metrics.native import DEFAULT_SCHEMA, Layout

__all__ = [
    "CONFIGURABLE_HISTOGRAMS",
    "MAX_FUTURE_NS",
    "METRICS",
    "STATUS_QUANTILES",
    "TRACED_EXEMPLAR_HOLD_NS",
    "Aggregator",
    "Bundle",
    "Histogram",
    "HistogramSet",
    "LatencyStatus",
    "StageSeries",
    "finite_or_none",
    "histogram_family",
    "histogram_quantile",
    "pick_exemplar",
]

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
#: A real deployment sends a few dozen label sets and stage names, so 4,096 hits
#: as often as more would; under the soak's series attack (unique labels every
#: post) 20,000 held 3.4 MB of raw label tuples after 10 minutes (issue 28).
_CACHE_LIMIT = 4096
#: The same for each label set's raw stage names, which the stage budget (``labels.max_values.stage``, 50 by
#: default) caps at far fewer: a cache per label set, so 256 names each (or twice a larger budget) bound them
#: over 1,000 label sets. At 20,000 the __overflow__ label set's cache of hostile names was most of the
#: aggregator's 10 MB in the soak.
_STAGE_CACHE_LIMIT = 256
_OVERFLOW_LAB = (OVERFLOW, OVERFLOW, OVERFLOW)
#: "No context seen yet" in :meth:`Aggregator.process` (a ctx can be anything, even None).
_NO_CTX = object()


#: The histogram families whose buckets ``aggregate.buckets.families`` may replace.
CONFIGURABLE_HISTOGRAMS: tuple[str, ...] = tuple(m.name for m in _HISTOGRAMS)


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
        #: A label set's raw stage names cached: twice the stage budget, at least :data:`_STAGE_CACHE_LIMIT`.
        self._stage_cache_limit = max(_STAGE_CACHE_LIMIT, 2 * self._lim_stage.max_values)
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
        if len(b.stage_cache) >= self._stage_cache_limit:
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

    def _rows(self) -> list[tuple[Any, ...]]:
        """A copy of every bundle's numbers, one row per label set (lock held; :class:`ScrapeFamilies` reads it)."""
        snap = self._snap
        rows = []
        for lab, b in self.bundles.items():
            stages = [
                (s.key, s.layout, snap(s.hist), snap(s.ttft), snap(s.itl), snap(s.length), s.tokens,
                 s.cancelled, s.undelivered)
                for s in b.stages.values()
            ]
            rows.append((lab, list(b.requests), dict(b.errors), snap(b.e2e), stages, b.records,
                         snap(b.queue), snap(b.batch), b.depth))
        return rows

    def collect(self) -> Iterator[PromMetric]:
        """Metric families for everything aggregated so far."""
        with self.lock:
            rows = self._rows()
            drops = dict(self.sdk_drops)
            labels_received = self.labels_received
        fams = ScrapeFamilies(_HISTOGRAMS, self.bounds, self.layouts, self.native_classic)
        for row in rows:
            fams.add(row)
        yield from fams.counters()
        fam = families.counter(LABELS_RECEIVED_TOTAL)
        fam.add_metric([], labels_received)
        yield fam
        yield fams.depth
        yield from fams.hists
        yield sdk_drops_family(drops)
        info = families.info(SIDECAR)
        info.add_metric([], {"version": __version__, "python": sys.version.split()[0]})
        yield info
        with self.lock:
            overload = list(self.overload.collect())
        yield from overload

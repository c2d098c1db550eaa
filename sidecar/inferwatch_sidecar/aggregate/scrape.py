"""The families one scrape of the aggregator fills, from the copies :meth:`Aggregator.collect` takes under its lock.

Split out of ``Aggregator.collect`` (issue 23): the copy is taken with the lock
held, the families are built here after it is released, so the ingest thread
never waits for more than the copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client.metrics_core import Metric as PromMetric

from inferwatch.wire import DROP_REASONS, OUTCOMES
from inferwatch_sidecar.aggregate.histograms import _add_hist
from inferwatch_sidecar.metrics import families
from inferwatch_sidecar.metrics.core import (
    BATCH_SIZE,
    CANCELLED_STREAMS_TOTAL,
    GENERATED_TOKENS_TOTAL,
    GENERATION_LENGTH_TOKENS,
    INTER_TOKEN_LATENCY_SECONDS,
    QUEUE_DEPTH,
    QUEUE_WAIT_SECONDS,
    RECORDS_TOTAL,
    REQUEST_DURATION_SECONDS,
    REQUEST_ERRORS_TOTAL,
    REQUESTS_TOTAL,
    SDK_DROPPED_EVENTS_TOTAL,
    STAGE_DURATION_SECONDS,
    TIME_TO_FIRST_TOKEN_SECONDS,
    UNDELIVERED_TOKENS_TOTAL,
)
from inferwatch_sidecar.metrics.entry import Metric
from inferwatch_sidecar.metrics.native import Layout, NativeHistogramFamily


class ScrapeFamilies:
    """The per-label-set families of one scrape; :meth:`add` takes one bundle's copy (``Aggregator._rows``).

    Args:
        histograms: the histogram entries, in the order they are yielded.
        bounds: family name -> the bounds in use.
        layouts: family name -> its cells.
        native_classic: families whose classic buckets the protobuf exposition also carries.
    """

    def __init__(self, histograms: tuple[Metric, ...], bounds: Mapping[str, tuple[float, ...]],
                 layouts: Mapping[str, Layout], native_classic: frozenset[str]) -> None:
        self.requests = families.counter(REQUESTS_TOTAL)
        self.errors = families.counter(REQUEST_ERRORS_TOTAL)
        self.tokens = families.counter(GENERATED_TOKENS_TOTAL)
        self.cancelled = families.counter(CANCELLED_STREAMS_TOTAL)
        self.undelivered = families.counter(UNDELIVERED_TOKENS_TOTAL)
        self.records = families.counter(RECORDS_TOTAL)
        self.depth = families.gauge(QUEUE_DEPTH)
        self.hists = [NativeHistogramFamily(families.histogram(m), m.name in native_classic) for m in histograms]
        by_name = {m.name: fam for m, fam in zip(histograms, self.hists, strict=True)}
        self.les = {m.name: families.bucket_les(m, bounds[m.name]) for m in histograms}
        #: Family name -> (its family, le values, layout), for the label set's own histograms.
        self.parts = {name: (by_name[name], self.les[name], layouts[name]) for name in by_name}
        #: A stage series' bounds object -> its le values (one list per distinct configuration).
        self.stage_les: dict[int, list[str]] = {id(layouts[STAGE_DURATION_SECONDS.name].classic):
                                                self.les[STAGE_DURATION_SECONDS.name]}

    def counters(self) -> list[PromMetric]:
        """The counter families :meth:`add` fills, in the order they are yielded."""
        return [self.requests, self.errors, self.tokens, self.cancelled, self.undelivered, self.records]

    def add(self, row: tuple[Any, ...]) -> None:
        """One label set's copy: its counters, request/queue/batch histograms and stages."""
        lab, reqs, errs, e2e, stages, nrec, queue, batch, dep = row
        labels = list(lab)
        for code, n in enumerate(reqs):
            if n:
                self.requests.add_metric([*labels, OUTCOMES[code]], n)
        for et, n in errs.items():
            self.errors.add_metric([*labels, et], n)
        if nrec:
            self.records.add_metric(labels, nrec)
        if dep is not None:
            self.depth.add_metric(labels, dep)
        parts = self.parts
        if e2e is not None and any(e2e[0]):
            fam, les, lay = parts[REQUEST_DURATION_SECONDS.name]
            _add_hist(fam, labels, e2e, les, lay)
        if queue is not None:
            fam, les, lay = parts[QUEUE_WAIT_SECONDS.name]
            _add_hist(fam, labels, queue, les, lay)
        if batch is not None:
            fam, les, lay = parts[BATCH_SIZE.name]
            _add_hist(fam, labels, batch, les, lay)
        self._add_stages(stages)

    def _add_stages(self, stages: list[tuple[Any, ...]]) -> None:
        stage_fam = self.parts[STAGE_DURATION_SECONDS.name][0]
        ttft_fam, ttft_les, ttft_lay = self.parts[TIME_TO_FIRST_TOKEN_SECONDS.name]
        itl_fam, itl_les, itl_lay = self.parts[INTER_TOKEN_LATENCY_SECONDS.name]
        length_fam, length_les, length_lay = self.parts[GENERATION_LENGTH_TOKENS.name]
        stage_les = self.stage_les
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
                self.tokens.add_metric(sl, ntok)
                # From a series' first stream on, so rate() sees them before the first cancel.
                self.cancelled.add_metric(sl, ncancel)
                self.undelivered.add_metric(sl, nlost)


def sdk_drops_family(drops: Mapping[str, int]) -> PromMetric:
    """``inferwatch_sdk_dropped_events_total`` by reason, every reason the wire format defines from 0."""
    fam = families.counter(SDK_DROPPED_EVENTS_TOTAL)
    # Every reason the wire format defines is exported from the start (at 0), so
    # dashboards and rate() see the series before the first drop.
    merged = {**dict.fromkeys(DROP_REASONS.values(), 0), **drops}
    for reason, n in sorted(merged.items()):
        fam.add_metric([reason], n)
    return fam

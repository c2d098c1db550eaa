"""Native histograms kept as cells, and the protobuf exposition, checked against independent computations.

- The cells fold into exactly the classic buckets ``bisect`` finds and the native buckets that
  ``ceil(log2(v) * 2^schema)`` gives, for random observations over eight decades and every schema.
- Google's protobuf runtime (tests/metrics/promproto.py) decodes what the encoder writes.
- Text and OpenMetrics are byte for byte what the classic-only aggregator renders.
- Quantiles over native buckets are closer to the exact quantiles than the classic buckets'.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from inferwatch.wire import EV_REQUEST
from inferwatch_sidecar.aggregate.aggregator import Aggregator, histogram_quantile
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.http.routes import scrape_registry
from inferwatch_sidecar.metrics import core as core_metrics
from inferwatch_sidecar.metrics import protobuf
from inferwatch_sidecar.metrics.families import CatalogCollector
from inferwatch_sidecar.metrics.native import Layout, NativeHistogram, native_edge, native_quantile
from tests.metrics.promproto import native_buckets, parse_delimited

STAGE = "inferwatch_stage_duration_seconds"
E2E = "inferwatch_request_duration_seconds"
PROM_242_ACCEPT = (
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,"
    "application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
PROM_CLASSIC_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def native_index(v: float, schema: int) -> int:
    """Prometheus' bucket for v > 0: the smallest i with v <= 2^(i * 2^-schema), from log2 and a boundary check."""
    i = math.ceil(math.log2(v) * 2.0 ** schema)
    while native_edge(schema, i - 1) >= v:
        i -= 1
    while native_edge(schema, i) < v:
        i += 1
    return i


@pytest.mark.parametrize("schema", [-2, 0, 1, 3, 5])
def test_cells_fold_into_the_classic_and_the_native_buckets_exactly(schema: int) -> None:
    rnd = random.Random(schema + 10)
    classic = core_metrics.LATENCY_BUCKETS
    lay = Layout(classic, schema, "seconds")
    values = [10 ** rnd.uniform(-7, 4) for _ in range(5000)] + [0.0, classic[3], 1.0, 2.0 ** -20]
    cells = [0] * (len(lay.edges) + 1)
    for v in values:
        cells[bisect_left(lay.edges, v)] += 1
    want_classic = [0] * (len(classic) + 1)
    for v in values:
        want_classic[bisect_left(classic, v)] += 1
    assert lay.classic_counts(cells) == want_classic
    h = lay.native(cells, sum(values), [])
    zt = 2.0 ** -20
    want_native: dict[int, int] = {}
    for v in values:
        if v > zt:
            i = native_index(v, schema)
            want_native[i] = want_native.get(i, 0) + 1
    assert h.zero_threshold == zt
    assert h.zero_count == sum(v <= zt for v in values)
    got = {h.start + k: c for k, c in enumerate(h.counts) if c}
    assert got == want_native
    assert h.count == len(values) and h.counts[0] and h.counts[-1]


def events(n: int, seed: int, ctx: tuple[str, str, str] = ("svc", "m", "v1")) -> list[tuple[Any, ...]]:
    """Requests with two stages (log-normal, medians 2 ms and 40 us), request IDs, every 3rd traced, a stream."""
    rnd = random.Random(seed)
    out = []
    for k in range(n):
        pre = int(rnd.lognormvariate(math.log(40_000), 0.8))
        inf = int(rnd.lognormvariate(math.log(2_000_000), 0.6))
        stream = (int(rnd.lognormvariate(math.log(50e6), 0.5)), 20, [rnd.randint(5_000, 40_000) for _ in range(19)])
        trace = rnd.randbytes(16) if k % 3 == 0 else None
        out.append((EV_REQUEST, ctx, 1_700_000_000_000_000_000 + k * 1000, pre + inf + 1000, 0, None, f"r{k}",
                    trace, [("preprocess", pre, None), ("inference", inf, stream if k % 2 else None)]))
    return out


def registry(agg: Aggregator) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(CatalogCollector(agg.collect, ()))
    return reg


def test_text_and_openmetrics_are_unchanged_by_native_histograms() -> None:
    evs = events(3000, 1)
    native, classic = Aggregator(ComponentContext()), Aggregator(ComponentContext(), native_schema=None)
    for agg in (native, classic):
        agg.process(evs, [0] * 16)
    a, b = registry(native), registry(classic)
    assert generate_latest(a) == generate_latest(b)
    assert generate_openmetrics(a) == generate_openmetrics(b)
    assert b",trace_id=\"" in generate_openmetrics(a)  # exemplars, traced ones held


def test_accept_negotiation() -> None:
    assert protobuf.wants_protobuf(PROM_242_ACCEPT)
    assert not protobuf.wants_protobuf(PROM_CLASSIC_ACCEPT)
    assert not protobuf.wants_protobuf("")
    assert not protobuf.wants_protobuf("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily")
    assert not protobuf.wants_protobuf(
        "text/plain;version=0.0.4,application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
        "encoding=delimited;q=0.9")
    assert protobuf.wants_protobuf(
        "text/plain;q=0.4,application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited")
    reg = registry(Aggregator(ComponentContext()))
    assert scrape_registry(reg, PROM_242_ACCEPT)[1] == protobuf.CONTENT_TYPE
    assert scrape_registry(reg, PROM_242_ACCEPT, protobuf=False)[1].startswith("application/openmetrics-text")
    assert scrape_registry(reg, "text/plain")[1].startswith("text/plain")


def _series(fams: list[Any], name: str) -> dict[tuple[tuple[str, str], ...], Any]:
    fam = next(f for f in fams if f.name == name)
    return {tuple((lp.name, lp.value) for lp in m.label): m for m in fam.metric}


@pytest.mark.parametrize("schema", [0, 3, 5])
def test_protobuf_exposition_decodes_to_the_observations(schema: int) -> None:
    evs = events(2000, schema) + events(500, schema + 1, ("svc", "m", "v2"))
    agg = Aggregator(ComponentContext(), native_schema=schema, native_classic=[E2E])
    agg.process(evs, [0] * 16)
    fams = parse_delimited(protobuf.encode(registry(agg)))
    names = [f.name for f in fams]
    assert len(names) == len(set(names))
    assert "inferwatch_requests_total" in names and "inferwatch_sidecar_info" in names
    reqs = _series(fams, "inferwatch_requests_total")
    key = (("service", "svc"), ("model", "m"), ("model_version", "v1"), ("outcome", "ok"))
    assert reqs[key].counter.value == 2000
    stages = _series(fams, STAGE)
    pre = [e for e in evs if e[1][2] == "v1"]
    for stage, pos in (("preprocess", 0), ("inference", 1)):
        h = stages[(("service", "svc"), ("model", "m"), ("model_version", "v1"), ("stage", stage))].histogram
        vals = [e[8][pos][1] * 1e-9 for e in pre]
        assert h.sample_count == len(vals) and h.sample_sum == pytest.approx(sum(vals))
        assert h.schema == schema and h.zero_threshold == 2.0 ** -20
        want: dict[int, int] = {}
        for v in vals:
            i = native_index(v, schema)
            want[i] = want.get(i, 0) + 1
        assert native_buckets(h) == want
        assert len(h.bucket) == 0  # classic buckets only where configured
        assert all(ex.HasField("timestamp") for ex in h.exemplars) and len(h.exemplars) >= 3
    e2e = _series(fams, E2E)[(("service", "svc"), ("model", "m"), ("model_version", "v1"))].histogram
    bounds = core_metrics.LATENCY_BUCKETS
    vals = [e[3] * 1e-9 for e in pre]
    assert [b.upper_bound for b in e2e.bucket] == list(bounds)
    assert [b.cumulative_count for b in e2e.bucket] == [sum(v <= b for v in vals) for b in bounds]
    traced = [b.exemplar for b in e2e.bucket if any(lp.name == "trace_id" for lp in b.exemplar.label)]
    assert traced and all(len(dict((lp.name, lp.value) for lp in ex.label)["trace_id"]) == 32 for ex in traced)
    ttft = _series(fams, "inferwatch_time_to_first_token_seconds")
    assert ttft[(("service", "svc"), ("model", "m"), ("model_version", "v1"), ("stage", "inference"))] \
        .histogram.sample_count == sum(1 for e in pre if e[8][1][2] is not None)


def test_classic_only_schema_sends_classic_histograms_on_protobuf() -> None:
    agg = Aggregator(ComponentContext(), native_schema=None)
    agg.process(events(300, 5), [0] * 16)
    fams = parse_delimited(protobuf.encode(registry(agg)))
    h = next(iter(_series(fams, STAGE).values())).histogram
    assert h.zero_threshold == 0 and not h.positive_span and len(h.bucket) == len(core_metrics.LATENCY_BUCKETS)


def _errors(vals: np.ndarray, qs: tuple[float, ...], schema: int) -> tuple[list[float], list[float]]:
    classic = core_metrics.LATENCY_BUCKETS
    lay = Layout(classic, schema, "seconds")
    cells = np.bincount(np.searchsorted(np.asarray(lay.edges), vals, side="left"),
                        minlength=len(lay.edges) + 1).tolist()
    ccounts = lay.classic_counts(cells)
    nh: NativeHistogram = lay.native(cells, float(vals.sum()), [])
    ce, ne = [], []
    for q in qs:
        exact = float(np.quantile(vals, q, method="inverted_cdf"))
        c = histogram_quantile(q, classic, ccounts)
        n = native_quantile(q, nh)
        assert c is not None and n is not None
        ce.append(abs(c - exact) / exact)
        ne.append(abs(n - exact) / exact)
    return ce, ne


def test_native_quantiles_are_closer_to_the_exact_ones_than_classic_buckets() -> None:
    """Families of log-normal, bimodal and Pareto latencies; P50, P90, P99, P99.9 against numpy's exact ones."""
    rng = np.random.default_rng(31)
    qs = (0.5, 0.9, 0.99, 0.999)
    width = 2 ** (1 / 8) - 1  # a schema-3 bucket's relative width
    all_c, all_n = [], []
    for k in range(24):
        median = 10 ** rng.uniform(-5, 1)
        kind = k % 3
        if kind == 0:
            vals = rng.lognormal(math.log(median), rng.uniform(0.2, 1.5), 20_000)
        elif kind == 1:
            vals = np.concatenate([rng.lognormal(math.log(median), 0.3, 15_000),
                                   rng.lognormal(math.log(median * 20), 0.3, 5_000)])
        else:
            vals = median * (1 + rng.pareto(2.5, 20_000))
        ce, ne = _errors(vals, qs, 3)
        for c, n in zip(ce, ne, strict=True):
            assert n <= max(c, width) + 1e-9
        all_c += ce
        all_n += ne
    assert max(all_n) <= width
    assert float(np.mean(all_n)) * 5 < float(np.mean(all_c))

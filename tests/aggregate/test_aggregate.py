"""Aggregation and accounting in-process: exact buckets, exemplars, caps, SDK drop deltas, producers."""

from __future__ import annotations

import math
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as om_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families

from inferwatch.wire import EV_BATCH, EV_DROPS, EV_QUEUE, EV_RECORD, EV_REQUEST, EV_STAGE, Encoder
from inferwatch_sidecar.aggregate import aggregator
from inferwatch_sidecar.aggregate.aggregator import _CACHE_LIMIT, _STAGE_CACHE_LIMIT, Aggregator
from inferwatch_sidecar.aggregate.labels import LabelLimiter
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.ingest.pipeline import Pipeline
from inferwatch_sidecar.metrics import core as core_metrics
from inferwatch_sidecar.metrics.families import CatalogCollector
from tests.helpers.sidecar import parse_metrics, sample

CTX = ("svc", "m", "v1")
LAB = {"service": "svc", "model": "m", "model_version": "v1"}


def scrape(agg: Aggregator, openmetrics: bool = False) -> str:
    reg = CollectorRegistry()
    reg.register(CatalogCollector(agg.collect, aggregator.METRICS))
    return (om_latest if openmetrics else generate_latest)(reg).decode()


def req(dur_s: float, outcome: int = 0, err: str | None = None, rid: str | None = None, trace: bytes | None = None,
        stages: list[Any] | None = None, ctx: Any = CTX) -> tuple[Any, ...]:
    return (EV_REQUEST, ctx, 1_700_000_000_000_000_000, int(dur_s * 1e9), outcome, err, rid, trace, stages or [])


def test_buckets_counts_and_sums_are_exact() -> None:
    agg = Aggregator(ComponentContext())
    counts = [0] * 16
    durations = [0.0004, 0.001, 0.0011, 0.3, 45.0, 5000.0]
    agg.process([req(d) for d in durations], counts)
    s = parse_metrics(scrape(agg))
    # le is inclusive: 0.001 falls in the 0.001 bucket.
    expect = {"0.0005": 1, "0.001": 2, "0.0025": 3, "0.25": 3, "0.5": 4, "40.0": 4, "80.0": 5, "1280.0": 5, "+Inf": 6}
    for le, n in expect.items():
        assert sample(s, "inferwatch_request_duration_seconds_bucket", **LAB, le=le) == n, le
    assert math.isclose(sample(s, "inferwatch_request_duration_seconds_sum", **LAB), sum(durations), rel_tol=1e-9)
    assert sample(s, "inferwatch_requests_total", **LAB, outcome="ok") == 6
    assert counts[EV_REQUEST] == 6


def test_stream_stage_feeds_ttft_itl_tokens_and_queue_wait() -> None:
    agg = Aggregator(ComponentContext(), queue_stages=frozenset({"queue"}))
    st = [("queue", 250_000_000, None), ("generate", 4_000_000_000, (150_000_000, 4, (20_000, 30_000, 1_000_000)))]
    agg.process([req(4.3, stages=st), (EV_STAGE, CTX, 1, "rid-9", ("generate", 1_000_000_000, (50_000_000, 2, (10_000,)))),
                 (EV_BATCH, CTX, 12), (EV_QUEUE, CTX, 7), (EV_QUEUE, CTX, 2)], [0] * 16)
    s = parse_metrics(scrape(agg))
    g = {**LAB, "stage": "generate"}
    assert sample(s, "inferwatch_generated_tokens_total", **g) == 6
    assert sample(s, "inferwatch_time_to_first_token_seconds_bucket", **g, le="0.06") == 1
    assert sample(s, "inferwatch_time_to_first_token_seconds_bucket", **g, le="0.25") == 2
    assert sample(s, "inferwatch_inter_token_latency_seconds_count", **g) == 4
    assert sample(s, "inferwatch_inter_token_latency_seconds_bucket", **g, le="0.025") == 2
    assert sample(s, "inferwatch_inter_token_latency_seconds_bucket", **g, le="1.0") == 4
    assert math.isclose(sample(s, "inferwatch_inter_token_latency_seconds_sum", **g), 1.06)
    assert sample(s, "inferwatch_generation_length_tokens_bucket", **g, le="4.0") == 2
    assert sample(s, "inferwatch_queue_wait_seconds_bucket", **LAB, le="0.25") == 1
    assert sample(s, "inferwatch_batch_size_bucket", **LAB, le="8.0") == 0
    assert sample(s, "inferwatch_batch_size_bucket", **LAB, le="16.0") == 1
    assert sample(s, "inferwatch_queue_depth", **LAB) == 2  # the latest value wins


def test_exemplars_carry_trace_id_beside_request_id_and_are_bounded() -> None:
    agg = Aggregator(ComponentContext())
    trace = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
    long_rid = "x" * 128
    agg.process([req(0.003, rid="abc", trace=trace, stages=[("inference", 2_000_000, None)]),
                 req(0.3, rid=long_rid)], [0] * 16)
    text = scrape(agg, openmetrics=True)
    found = {}
    for fam in om_families(text):
        for smp in fam.samples:
            if smp.exemplar is not None:
                found[(smp.name, smp.labels.get("stage"), smp.labels["le"])] = smp.exemplar
    e = found[("inferwatch_request_duration_seconds_bucket", None, "0.005")]
    assert e.labels == {"trace_id": trace.hex(), "request_id": "abc"} and math.isclose(e.value, 0.003)
    assert found[("inferwatch_stage_duration_seconds_bucket", "inference", "0.0025")].labels == {
        "trace_id": trace.hex(), "request_id": "abc"}
    long = found[("inferwatch_request_duration_seconds_bucket", None, "0.5")]
    rid = long.labels["request_id"]
    assert len("request_id") + len(rid) <= 128 and long_rid.startswith(rid)


def test_label_caps_overflow_and_raw_caches_stay_bounded() -> None:
    ctx = ComponentContext()
    ctx.limiters["model"] = LabelLimiter("model", 2)
    ctx.limiters["stage"] = LabelLimiter("stage", 1)
    agg = Aggregator(ctx)
    evs = [req(0.01, ctx=("s", f"model-{i}", "v"), stages=[(f"stage-{i}", 1000, None)]) for i in range(_CACHE_LIMIT + 50)]
    agg.process(evs, [0] * 16)
    s = parse_metrics(scrape(agg))
    models = {dict(k[1]).get("model") for k in s if k[0] == "inferwatch_requests_total"}
    assert models == {"model-0", "model-1", "__overflow__"}
    stages = {dict(k[1]).get("stage") for k in s if k[0] == "inferwatch_stage_duration_seconds_count"}
    assert stages == {"stage-0", "__overflow__"}
    assert sample(s, "inferwatch_requests_total", service="s", model="__overflow__", model_version="v", outcome="ok") == _CACHE_LIMIT + 48
    assert len(agg._ctx_cache) <= _CACHE_LIMIT and len(agg.bundles) == 3
    assert all(len(b.stage_cache) <= _STAGE_CACHE_LIMIT for b in agg.bundles.values())


def test_hostile_stage_names_in_every_label_set_hold_a_bounded_cache_and_count_exactly() -> None:
    """Issue 28: each label set caches its raw stage names. New names sent to many label sets (the soak's series
    attack sends 160 per post) must not hold ``label sets x names``: at 20,000 names a set, 1,000 sets could
    hold 2.6 GB; the __overflow__ set's cache alone was most of the aggregator's 10 MB in the soak."""
    import random

    rng = random.Random(7)
    ctx = ComponentContext()
    agg = Aggregator(ctx)
    budget = ctx.limiter("stage").max_values
    sets = [("s", f"m{i}", "v") for i in range(20)]
    per_set: dict[Any, int] = {}
    sent = 0
    for _ in range(60):  # ~500 new names per label set: past the cache's bound, far under the old 20,000
        evs = []
        for c in rng.sample(sets, 8):
            names = [(f"st-{rng.randrange(1 << 40)}", 1000, None) for _ in range(rng.randrange(1, 40))]
            evs.append(req(0.01, ctx=c, stages=names))
            per_set[c] = per_set.get(c, 0) + len(names)
            sent += len(names)
        agg.process(evs, [0] * 16)
        assert all(len(b.stage_cache) <= max(_STAGE_CACHE_LIMIT, 2 * budget) for b in agg.bundles.values())
    s = parse_metrics(scrape(agg))
    counted = sum(v for k, v in s.items() if k[0] == "inferwatch_stage_duration_seconds_count")
    assert counted == sent  # every stage observed once, in its own series or __overflow__
    for c, n in per_set.items():
        got = sum(v for k, v in s.items() if k[0] == "inferwatch_stage_duration_seconds_count"
                  and dict(k[1])["model"] == c[1])
        assert got == n, c
    stages = {dict(k[1])["stage"] for k in s if k[0] == "inferwatch_stage_duration_seconds_count"}
    assert len(stages - {"__overflow__"}) == budget


def test_a_larger_stage_budget_gets_a_cache_that_holds_it() -> None:
    ctx = ComponentContext()
    ctx.limiters["stage"] = LabelLimiter("stage", 400)
    agg = Aggregator(ctx)
    agg.process([req(0.01, stages=[(f"stage-{i}", 1000, None) for i in range(400)])], [0] * 16)
    (b,) = agg.bundles.values()
    assert len(b.stage_cache) == 400  # every budgeted name stays cached: no clear-and-refill on each request


def test_sdk_drop_counts_add_up_across_producers() -> None:
    agg = Aggregator(ComponentContext())
    p = Pipeline(agg)
    enc_a, enc_b = Encoder(1, 0xA), Encoder(2, 0xB)
    for f in enc_a.encode([], [(EV_DROPS, {"buffer_full": 5})]):
        p.datagram(f, "unix")
    for f in enc_a.encode([], [(EV_DROPS, {"buffer_full": 3, "send_failed": 1})]):  # counts since the last report
        p.datagram(f, "unix")
    for f in enc_b.encode([], [(EV_DROPS, {"buffer_full": 2})]):
        p.datagram(f, "unix")
    for f in enc_a.encode([], [(EV_DROPS, {"buffer_full": 1})]):
        p.datagram(f, "unix")
    assert agg.sdk_drops == {"buffer_full": 11, "send_failed": 1}
    assert p.totals()["frames"] == 4 and p.totals()["frames_decoded"] == 4


def test_producers_table_is_bounded() -> None:
    p = Pipeline(Aggregator(ComponentContext()), max_producers=5)
    for i in range(20):
        for f in Encoder(i, 1000 + i).encode([(EV_RECORD, CTX, 1, None, "a", None, None, None)]):
            p.datagram(f, "unix")
    assert len(p.producers) == 5
    assert [x.producer_id for x in p.producers.values()] == list(range(1015, 1020))


def test_every_catalog_family_is_exposed_with_catalog_types() -> None:
    agg = Aggregator(ComponentContext())
    agg.process([req(0.1)], [0] * 16)
    reg = CollectorRegistry()
    reg.register(CatalogCollector(agg.collect, aggregator.METRICS))
    fams = {f.name: f for f in reg.collect()}
    # The rest of the core catalog is exposed by the pipeline, the trace receiver and the daemon
    # (tests/metrics/test_daemon_collectors.py checks that the collectors together cover it).
    assert set(aggregator.METRICS) <= set(core_metrics.METRICS)
    for m in aggregator.METRICS:
        fam = fams[m.family if m.type != "info" else m.name]
        assert fam.type == m.type, m.name
        assert fam.documentation == m.help


def test_label_set_combinations_are_capped_too() -> None:
    agg = Aggregator(ComponentContext(), max_label_sets=4)
    agg.process([req(0.01, ctx=(f"s{i}", f"m{i}", "v")) for i in range(10)], [0] * 16)
    assert len(agg.bundles) == 5  # four kept, one overflow set
    s = parse_metrics(scrape(agg))
    assert sample(s, "inferwatch_requests_total", service="__overflow__", model="__overflow__",
                  model_version="__overflow__", outcome="ok") == 6
    assert agg.label_set_overflow.overflowed == 6

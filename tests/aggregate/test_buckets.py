"""Histogram buckets from microseconds to minutes: defaults, per-family and per-stage configuration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from alerts import source as alert_source
from inferwatch.wire import EV_REQUEST, EV_STAGE
from inferwatch_sidecar.aggregate import aggregator
from inferwatch_sidecar.aggregate.aggregator import Aggregator, LatencyStatus, histogram_quantile
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.config import MAX_BUCKET_BOUNDS, ConfigError, load_config
from inferwatch_sidecar.export.otlp.convert import families_to_request
from inferwatch_sidecar.metrics import core as core_metrics
from inferwatch_sidecar.metrics.families import CatalogCollector
from tests.helpers.sidecar import parse_metrics, sample

CTX = ("svc", "m", "v1")
LAB = {"service": "svc", "model": "m", "model_version": "v1"}
T0 = 1_700_000_000_000_000_000
STAGE = "inferwatch_stage_duration_seconds"


def req(dur_ns: int, stages: list[tuple[str, int]]) -> tuple[Any, ...]:
    return (EV_REQUEST, CTX, T0, dur_ns, 0, None, None, None, [(n, d, None) for n, d in stages])


def families(agg: Aggregator) -> list[Any]:
    return list(agg.collect())


def scrape(agg: Aggregator) -> dict[Any, float]:
    reg = CollectorRegistry()
    reg.register(CatalogCollector(agg.collect, aggregator.METRICS))
    return parse_metrics(generate_latest(reg).decode())


def les(samples: dict[Any, float], name: str, **labels: str) -> list[str]:
    out = []
    for (n, labs), _ in samples.items():
        d = dict(labs)
        if n == name + "_bucket" and all(d.get(k) == v for k, v in labels.items()):
            out.append(d["le"])
    return out


def test_a_3_8_us_stage_reads_within_a_factor_of_2_with_the_default_buckets() -> None:
    agg = Aggregator(ComponentContext())
    agg.process([req(20_000, [("preprocess", 3_800)]) for _ in range(1000)], [0] * 16)
    counts = agg.layouts[STAGE].classic_counts(agg.bundles[CTX].stages["preprocess"].hist.counts)
    p50 = histogram_quantile(0.5, agg.bounds[STAGE], counts)
    p99 = histogram_quantile(0.99, agg.bounds[STAGE], counts)
    assert p50 is not None and p99 is not None
    # All 1000 in the first bucket, [0, 5 us]: Prometheus interpolates 2.5 us and 4.95 us.
    assert (round(p50 * 1e9), round(p99 * 1e9)) == (2500, 4950)
    assert 0.5 < p50 / 3.8e-6 < 2 and 0.5 < p99 / 3.8e-6 < 2
    # The buckets that started at 0.5 ms read the same stage 65x too high.
    old = core_metrics.LATENCY_BUCKETS[core_metrics.LATENCY_BUCKETS.index(0.0005):]
    old_counts = [1000] + [0] * len(old)
    assert histogram_quantile(0.5, old, old_counts) == pytest.approx(250e-6)
    status = LatencyStatus(agg).status()["models"][0]["stages"]["preprocess"]
    assert round(status["p50_s"] * 1e9) == 2500


def test_default_stage_buckets_start_at_10_us_or_below_and_reach_minutes() -> None:
    b = core_metrics.STAGE_DURATION_SECONDS.buckets
    assert b is not None and b[0] <= 10e-6 and b[-1] >= 600
    assert core_metrics.REQUEST_DURATION_SECONDS.buckets == b == core_metrics.QUEUE_WAIT_SECONDS.buckets


def _config(tmp_path: Path, text: str) -> Any:
    p = tmp_path / "sidecar.yaml"
    p.write_text(text)
    return load_config(p, environ={})


CONFIGURED = """
aggregate:
  buckets:
    families:
      inferwatch_stage_duration_seconds: [0.001, 0.01, 0.1, 1.0, 2.5, 10]
      inferwatch_request_duration_seconds: [0.01, 1.0, 60]
    stages:
      preprocess: [0.000001, 0.000002, 0.000004, 0.000008, 1.0, 2.5]
"""


def test_configured_buckets_per_family_and_per_stage_are_what_is_exported(tmp_path: Path) -> None:
    cfg = _config(tmp_path, CONFIGURED)
    b = cfg.aggregate.buckets
    agg = Aggregator(ComponentContext(), buckets=b.families, stage_buckets=b.stages)
    agg.process([req(5_000_000, [("preprocess", 3_800), ("inference", 4_000_000)]),
                 (EV_STAGE, CTX, T0, None, ("preprocess", 1_500, None))], [0] * 16)
    s = scrape(agg)
    assert les(s, STAGE, stage="preprocess") == ["1e-06", "2e-06", "4e-06", "8e-06", "1.0", "2.5", "+Inf"]
    assert les(s, STAGE, stage="inference") == ["0.001", "0.01", "0.1", "1.0", "2.5", "10.0", "+Inf"]
    assert les(s, "inferwatch_request_duration_seconds") == ["0.01", "1.0", "60.0", "+Inf"]
    # Families left alone keep the catalog's buckets.
    assert agg.bounds["inferwatch_queue_wait_seconds"] == core_metrics.LATENCY_BUCKETS
    pre = dict(stage="preprocess", **LAB)
    assert sample(s, STAGE + "_bucket", le="1e-06", **pre) == 0
    assert sample(s, STAGE + "_bucket", le="2e-06", **pre) == 1  # the 1.5 us STAGE event
    assert sample(s, STAGE + "_bucket", le="4e-06", **pre) == 2
    assert sample(s, STAGE + "_bucket", le="0.01", stage="inference", **LAB) == 1
    assert sample(s, STAGE + "_bucket", le="0.001", stage="inference", **LAB) == 0
    status = LatencyStatus(agg).status()["models"][0]
    assert round(status["stages"]["preprocess"]["p50_s"] * 1e9) == 2000  # rank 1 of 2 ends the (1, 2] us bucket
    # The OTLP push carries the same explicit bounds.
    otlp, _ = families_to_request(families(agg), {"service.name": "t"}, now_s=1.0, start_time_s=0.0)
    points = {}
    for rm in otlp.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == STAGE:
                    for p in m.histogram.data_points:
                        stage = next(a.value.string_value for a in p.attributes if a.key == "stage")
                        points[stage] = (list(p.explicit_bounds), list(p.bucket_counts))
    assert points["preprocess"] == ([1e-06, 2e-06, 4e-06, 8e-06, 1.0, 2.5], [0, 1, 1, 0, 0, 0, 0])
    assert points["inference"] == ([0.001, 0.01, 0.1, 1.0, 2.5, 10.0], [0, 1, 0, 0, 0, 0, 0])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("families: {inferwatch_nope_seconds: [1]}", "'inferwatch_nope_seconds' is not a histogram the aggregator keeps"),
        ("families: {inferwatch_batch_size: [4, 2]}", "bucket bounds must be strictly increasing (4.0 then 2.0)"),
        ("families: {inferwatch_batch_size: [1, 1]}", "bucket bounds must be strictly increasing (1.0 then 1.0)"),
        ("stages: {preprocess: [.inf]}", "stage 'preprocess': bucket bound inf is not a finite number > 0"),
        ("stages: {preprocess: [.nan]}", "stage 'preprocess': bucket bound nan is not a finite number > 0"),
        ("stages: {preprocess: [0, 1]}", "stage 'preprocess': bucket bound 0.0 is not a finite number > 0"),
        ("stages: {preprocess: []}", f"stage 'preprocess': 1 to {MAX_BUCKET_BOUNDS} bucket bounds, got 0"),
        ("stages: {'bad stage': [1]}", "stage 'bad stage': invalid stage name"),
    ],
)
def test_bad_bucket_config_is_refused_with_the_reason(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        _config(tmp_path, "aggregate:\n  buckets:\n    " + text + "\n")
    assert message in str(e.value)


def test_too_many_bounds_are_refused(tmp_path: Path) -> None:
    bounds = ", ".join(str(i + 1) for i in range(MAX_BUCKET_BOUNDS + 1))
    with pytest.raises(ConfigError) as e:
        _config(tmp_path, f"aggregate:\n  buckets:\n    families: {{inferwatch_batch_size: [{bounds}]}}\n")
    assert f"1 to {MAX_BUCKET_BOUNDS} bucket bounds, got {MAX_BUCKET_BOUNDS + 1}" in str(e.value)


def test_alert_bucket_bounds_match_the_generated_rules() -> None:
    used: dict[str, dict[float, str]] = {}
    catalog_names = {m.name for m in aggregator.METRICS}
    for a in alert_source.ALERTS:
        for t in a.thresholds:
            if t.bucket_of in catalog_names:
                used.setdefault(t.bucket_of, {})[float(t.value)] = a.name
    assert used == core_metrics.ALERT_BUCKET_BOUNDS


def test_buckets_that_drop_an_alert_bound_are_reported_naming_the_alert(tmp_path: Path) -> None:
    assert Aggregator(ComponentContext()).alert_bound_problems() == []
    cfg = _config(tmp_path, CONFIGURED)
    b = cfg.aggregate.buckets
    assert Aggregator(ComponentContext(), buckets=b.families, stage_buckets=b.stages).alert_bound_problems() == []
    agg = Aggregator(ComponentContext(), buckets={STAGE: [0.001, 1.0]}, stage_buckets={"tokenize": [1e-6, 1e-5]})
    assert agg.alert_bound_problems() == [
        f'alert InferwatchStageLatencyP999BudgetBurn counts the bucket le="2.5" of {STAGE}, which aggregate.buckets '
        "leaves out, so it cannot fire there; add 2.5 to those bounds",
        f"alert InferwatchStageLatencyP99BudgetBurn counts the bucket le=\"1.0\" of {STAGE} of stage 'tokenize', "
        "which aggregate.buckets leaves out, so it cannot fire there; add 1.0 to those bounds",
        f"alert InferwatchStageLatencyP999BudgetBurn counts the bucket le=\"2.5\" of {STAGE} of stage 'tokenize', "
        "which aggregate.buckets leaves out, so it cannot fire there; add 2.5 to those bounds",
    ]


def test_unknown_family_passed_to_the_aggregator_directly_is_refused() -> None:
    with pytest.raises(ValueError, match="buckets for unknown histogram families \\['inferwatch_x'\\]"):
        Aggregator(ComponentContext(), buckets={"inferwatch_x": [1.0]})


def test_live_sidecar_exports_configured_buckets_and_warns_about_a_dropped_alert_bound(
    sidecar_factory: Any, tmp_path: Path,
) -> None:
    cfg = tmp_path / "buckets.yaml"
    cfg.write_text("aggregate:\n  buckets:\n    stages:\n      tokenize: [0.000001, 0.000002, 0.000004, 0.00001]\n")
    sc = sidecar_factory("--config", str(cfg))
    body = json.dumps({"service": "svc", "model": "m", "model_version": "v1", "events": [
        {"type": "stage", "stage": "tokenize", "duration_s": 3.8e-6},
        {"type": "stage", "stage": "inference", "duration_s": 3.8e-6},
    ]}).encode()
    assert sc.post("/v1/events", body)[0] == 200
    s = parse_metrics(sc.metrics())
    assert les(s, STAGE, stage="tokenize") == ["1e-06", "2e-06", "4e-06", "1e-05", "+Inf"]
    assert les(s, STAGE, stage="inference") == [repr(b) for b in core_metrics.LATENCY_BUCKETS] + ["+Inf"]
    assert sample(s, STAGE + "_bucket", le="4e-06", stage="tokenize", **LAB) == 1
    assert sample(s, STAGE + "_bucket", le="5e-06", stage="inference", **LAB) == 1
    stages = sc.status()["latency"]["models"][0]["stages"]
    assert round(stages["tokenize"]["p50_s"] * 1e9) == 3000 and round(stages["inference"]["p50_s"] * 1e9) == 2500
    sc.stop()
    log = sc.log
    for alert, bound in (("InferwatchStageLatencyP99BudgetBurn", "1.0"), ("InferwatchStageLatencyP999BudgetBurn", "2.5")):
        assert (f"alert {alert} counts the bucket le=\"{bound}\" of {STAGE} of stage 'tokenize', which "
                "aggregate.buckets leaves out") in log

"""Prometheus families -> OTLP, checked on what a real OTLP/HTTP receiver decodes."""

from __future__ import annotations

import math

import pytest
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram, Info, Summary
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar

from inferwatch_sidecar.export.otlp import (
    OtlpMetricsPusher,
    families_to_request,
    parse_key_value_list,
    prometheus_unit_to_ucum,
)
from tests.export.otlp.conftest import OtlpReceiver, attrs, metrics_by_name, points_by_attrs

CUMULATIVE = pb.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
NOW = 1_700_000_100.0
START = 1_700_000_000.0


def _families() -> list[Metric]:
    c = CounterMetricFamily(
        "inferwatch_requests", "Requests handled.", labels=["service", "model", "outcome"]
    )
    c.add_metric(["api", "xgb", "ok"], 1234.0, created=1_700_000_050.0)
    c.add_metric(["api", "xgb", "error"], 7.0)
    g = GaugeMetricFamily("inferwatch_queue_depth", "Requests waiting.", labels=["service"])
    g.add_metric(["api"], 3.0)
    g.add_metric(["batch"], 0.0)
    h = HistogramMetricFamily(
        "inferwatch_request_duration_seconds",
        "End-to-end latency.",
        labels=["service", "model"],
        unit="seconds",
    )
    h.add_metric(
        ["api", "xgb"],
        [
            ("0.005", 2.0),
            ("0.01", 5.0, Exemplar({"trace_id": TRACE, "span_id": SPAN}, 0.0071, 1_700_000_090.5)),
            ("0.1", 9.0, Exemplar({"request_id": "req-42"}, 0.05)),
            ("+Inf", 10.0),
        ],
        sum_value=1.25,
    )
    return [c, g, h]


def _push(receiver: OtlpReceiver, families: list[Metric], **kw: object) -> object:
    pusher = OtlpMetricsPusher(
        lambda: families,
        endpoint=receiver.base_url + "/v1/metrics",
        resource={"service.name": "fraud-api", "inferwatch.model": "xgb"},
        start_time_s=START,
        clock=lambda: NOW,
        **kw,  # type: ignore[arg-type]
    )
    assert pusher.push_once() is True
    return receiver.wait_for(1)[0]


def test_counter_gauge_histogram_arrive_with_exact_values(receiver: OtlpReceiver) -> None:
    got = _push(receiver, _families(), headers={"Authorization": "Bearer s3cret", "X-Scope-OrgID": "team-a"})
    assert got.path == "/v1/metrics"
    assert got.headers["content-type"] == "application/x-protobuf"
    assert got.headers["authorization"] == "Bearer s3cret"
    assert got.headers["x-scope-orgid"] == "team-a"

    rm = got.request.resource_metrics[0]
    assert attrs(rm.resource.attributes) == {"service.name": "fraud-api", "inferwatch.model": "xgb"}
    assert rm.scope_metrics[0].scope.name == "inferwatch_sidecar"
    m = metrics_by_name(got.request)
    assert set(m) == {"inferwatch_requests", "inferwatch_queue_depth", "inferwatch_request_duration_seconds"}

    # Counter: the family name, without _total; a cumulative monotonic Sum.
    req = m["inferwatch_requests"]
    assert req.WhichOneof("data") == "sum"
    assert req.description == "Requests handled."
    assert attrs(req.metadata) == {"prometheus.type": "counter"}
    assert req.sum.is_monotonic is True
    assert req.sum.aggregation_temporality == CUMULATIVE
    pts = points_by_attrs(req.sum.data_points)
    ok = pts[(("model", "xgb"), ("outcome", "ok"), ("service", "api"))]
    err = pts[(("model", "xgb"), ("outcome", "error"), ("service", "api"))]
    assert ok.as_double == 1234.0 and err.as_double == 7.0
    assert ok.start_time_unix_nano == 1_700_000_050 * 10**9  # from _created
    assert err.start_time_unix_nano == int(START) * 10**9  # no _created: the pusher's start time
    assert ok.time_unix_nano == int(NOW) * 10**9

    # Gauge.
    q = m["inferwatch_queue_depth"]
    assert q.WhichOneof("data") == "gauge"
    assert {k: p.as_double for k, p in points_by_attrs(q.gauge.data_points).items()} == {
        (("service", "api"),): 3.0,
        (("service", "batch"),): 0.0,
    }

    # Histogram: explicit bounds, per-bucket (not cumulative) counts, sum, count, exemplars.
    h = m["inferwatch_request_duration_seconds"]
    assert h.unit == "s"
    assert h.histogram.aggregation_temporality == CUMULATIVE
    (p,) = h.histogram.data_points
    assert attrs(p.attributes) == {"service": "api", "model": "xgb"}  # no "le"
    assert list(p.explicit_bounds) == [0.005, 0.01, 0.1]
    assert list(p.bucket_counts) == [2, 3, 4, 1]
    assert p.count == 10 and p.sum == 1.25
    assert p.start_time_unix_nano == int(START) * 10**9
    ex_trace, ex_req = p.exemplars
    assert ex_trace.trace_id == bytes.fromhex(TRACE) and ex_trace.span_id == bytes.fromhex(SPAN)
    assert ex_trace.as_double == 0.0071 and list(ex_trace.filtered_attributes) == []
    assert ex_trace.time_unix_nano == 1_700_000_090_500_000_000
    assert ex_req.trace_id == b"" and attrs(ex_req.filtered_attributes) == {"request_id": "req-42"}
    assert ex_req.as_double == 0.05
    assert ex_req.time_unix_nano == int(NOW) * 10**9  # no exemplar timestamp: collection time


def test_gzip_compression_is_sent_and_decodes_to_the_same_request(receiver: OtlpReceiver) -> None:
    got = _push(receiver, _families(), compression="gzip")
    assert got.headers["content-encoding"] == "gzip"
    assert got.raw[:2] == b"\x1f\x8b"
    plain, _ = families_to_request(
        _families(),
        {"service.name": "fraud-api", "inferwatch.model": "xgb"},
        now_s=NOW,
        start_time_s=START,
    )
    assert got.request == plain


class _AppCollector(Collector):
    """A custom collector, as the daemon's aggregator is one."""

    def collect(self):  # type: ignore[no-untyped-def]
        g = GaugeMetricFamily("inferwatch_producers", "Connected producers.", labels=["service"])
        g.add_metric(["api"], 4)
        yield g


def test_real_registry_samples_convert_with_created_times_and_exemplars(receiver: OtlpReceiver) -> None:
    reg = CollectorRegistry()
    reg.register(_AppCollector())
    c = Counter("inferwatch_events", "Events.", ["kind"], registry=reg)
    c.labels("stage").inc(41)
    c.labels("stage").inc()
    g = Gauge("inferwatch_lag_seconds", "Lag.", registry=reg)
    g.set(0.25)
    h = Histogram("inferwatch_batch_size", "Batch size.", buckets=(1, 4, 16), registry=reg)
    for v in (1, 1, 3, 5, 20):
        h.observe(v)
    h.observe(8, exemplar={"trace_id": TRACE})
    i = Info("inferwatch_build", "Build.", registry=reg)
    i.info({"version": "0.1.0", "python": "3.11"})
    e = Enum("inferwatch_engine_state", "State.", states=["idle", "running"], registry=reg)
    e.state("running")
    s = Summary("inferwatch_flush_seconds", "Flush time.", registry=reg)
    s.observe(0.5)
    s.observe(1.5)

    created = {
        f.name: next(x.value for x in f.samples if x.name.endswith("_created"))
        for f in reg.collect()
        if f.type in ("counter", "histogram", "summary")
    }
    pusher = OtlpMetricsPusher(
        reg.collect, endpoint=receiver.base_url + "/v1/metrics", resource={"service.name": "api"}
    )
    assert pusher.push_once()
    got = receiver.wait_for(1)[0]
    m = metrics_by_name(got.request)

    assert m["inferwatch_producers"].gauge.data_points[0].as_double == 4.0
    ev = m["inferwatch_events"]
    assert ev.sum.is_monotonic and ev.sum.data_points[0].as_double == 42.0
    assert attrs(ev.sum.data_points[0].attributes) == {"kind": "stage"}
    assert ev.sum.data_points[0].start_time_unix_nano == round(created["inferwatch_events"] * 1e9)
    assert m["inferwatch_lag_seconds"].gauge.data_points[0].as_double == 0.25

    (hp,) = m["inferwatch_batch_size"].histogram.data_points
    assert list(hp.explicit_bounds) == [1.0, 4.0, 16.0]
    assert list(hp.bucket_counts) == [2, 1, 2, 1]  # (1,1) (3) (5,8) (20)
    assert hp.count == 6 and hp.sum == 38.0
    assert hp.start_time_unix_nano == round(created["inferwatch_batch_size"] * 1e9)
    (ex,) = hp.exemplars
    assert ex.trace_id == bytes.fromhex(TRACE) and ex.as_double == 8.0

    info = m["inferwatch_build_info"]
    assert info.WhichOneof("data") == "sum" and not info.sum.is_monotonic
    assert attrs(info.sum.data_points[0].attributes) == {"version": "0.1.0", "python": "3.11"}
    assert info.sum.data_points[0].as_double == 1.0

    st = m["inferwatch_engine_state"]
    assert not st.sum.is_monotonic
    assert {attrs(p.attributes)["inferwatch_engine_state"]: p.as_double for p in st.sum.data_points} == {
        "idle": 0.0,
        "running": 1.0,
    }

    sm = m["inferwatch_flush_seconds"]
    (sp,) = sm.summary.data_points
    assert sp.count == 2 and sp.sum == 2.0
    assert sm.unit == "s"  # no unit on the family: taken from the name's unit suffix
    assert m["inferwatch_events"].unit == ""  # and nothing invented for a unitless name


def test_catalog_units_fill_in_for_families_without_a_unit() -> None:
    g = GaugeMetricFamily("inferwatch_mem_usage", "Memory.", value=5.0)
    req, _ = families_to_request(
        [g], {}, now_s=NOW, start_time_s=START, units={"inferwatch_mem_usage": "bytes"}
    )
    assert req.resource_metrics[0].scope_metrics[0].metrics[0].unit == "By"


def test_info_families_keep_the_exposed_sample_name() -> None:
    a = InfoMetricFamily("inferwatch_build", "Build.", value={"version": "1"})
    b = Metric("inferwatch_sidecar_info", "Hand-built info.", "info")
    b.add_sample("inferwatch_sidecar_info", {"version": "2"}, 1.0)
    req, _ = families_to_request([a, b], {}, now_s=NOW, start_time_s=START)
    m = metrics_by_name(req)
    assert set(m) == {"inferwatch_build_info", "inferwatch_sidecar_info"}
    assert attrs(m["inferwatch_sidecar_info"].sum.data_points[0].attributes) == {"version": "2"}


@pytest.mark.parametrize(
    ("prom", "ucum"),
    [("seconds", "s"), ("bytes", "By"), ("ratio", "1"), ("", ""), ("bytes_per_second", "By/s"), ("events", "events")],
)
def test_prometheus_units_translate_to_ucum(prom: str, ucum: str) -> None:
    assert prometheus_unit_to_ucum(prom) == ucum


def test_malformed_and_unsupported_families_are_dropped_and_counted_not_fatal() -> None:
    bad = HistogramMetricFamily("inferwatch_bad", "Decreasing buckets.", labels=["service"])
    bad.add_metric(["a"], [("1", 5.0), ("2", 3.0), ("+Inf", 6.0)], sum_value=1.0)
    bad.add_metric(["b"], [("1", 1.0), ("2", 3.0), ("+Inf", 3.0)], sum_value=2.0)
    gh = GaugeHistogramMetricFamily("inferwatch_gh", "A gauge histogram.", buckets=[("1", 1.0), ("+Inf", 2.0)], gsum_value=3.0)
    no_count = Metric("inferwatch_s", "Summary without _count.", "summary")
    no_count.add_sample("inferwatch_s_sum", {}, 1.0)
    s = SummaryMetricFamily("inferwatch_s2", "Summary.", count_value=4, sum_value=2.0)
    g = GaugeMetricFamily("inferwatch_ok", "Fine.", labels=["model", "version"])
    g.add_metric(["m", ""], 1.0)  # an empty label value is "no label" in Prometheus
    req, stats = families_to_request([bad, gh, no_count, s, g], {}, now_s=NOW, start_time_s=START)
    m = metrics_by_name(req)
    assert set(m) == {"inferwatch_bad", "inferwatch_ok", "inferwatch_s2"}
    assert m["inferwatch_s2"].summary.data_points[0].count == 4
    (p,) = m["inferwatch_bad"].histogram.data_points
    assert attrs(p.attributes) == {"service": "b"} and list(p.bucket_counts) == [1, 2, 0]
    assert attrs(m["inferwatch_ok"].gauge.data_points[0].attributes) == {"model": "m"}
    assert stats.dropped == {"histogram_decreasing_buckets": 1, "type_gaugehistogram": 1, "summary_no_count": 1}
    assert stats.metrics == 3 and stats.data_points == 3


def test_histogram_without_inf_bucket_uses_count_and_nonfinite_values_pass_through() -> None:
    h = Metric("inferwatch_h_seconds", "Hand-built.", "histogram")
    h.add_sample("inferwatch_h_seconds_bucket", {"le": "0.5"}, 2.0)
    h.add_sample("inferwatch_h_seconds_count", {}, 5.0)
    g = GaugeMetricFamily("inferwatch_g", "NaN gauge.", value=math.nan)
    req, _ = families_to_request([h, g], {}, now_s=NOW, start_time_s=START)
    m = metrics_by_name(req)
    (p,) = m["inferwatch_h_seconds"].histogram.data_points
    assert list(p.explicit_bounds) == [0.5] and list(p.bucket_counts) == [2, 3] and p.count == 5
    assert not p.HasField("sum")  # no _sum sample: sum unset, as the spec says
    assert math.isnan(m["inferwatch_g"].gauge.data_points[0].as_double)


def test_exemplar_ids_that_are_not_w3c_ids_stay_attributes() -> None:
    c = CounterMetricFamily("inferwatch_c", "C.", labels=[])
    c.add_metric([], 3.0, exemplar=Exemplar({"trace_id": "not-hex", "span_id": "0" * 16}, 1.0, 5.0))
    req, _ = families_to_request([c], {}, now_s=NOW, start_time_s=START)
    (ex,) = metrics_by_name(req)["inferwatch_c"].sum.data_points[0].exemplars
    assert ex.trace_id == b"" and ex.span_id == b""
    assert attrs(ex.filtered_attributes) == {"trace_id": "not-hex", "span_id": "0" * 16}
    assert ex.time_unix_nano == 5 * 10**9


def test_key_value_lists_are_percent_decoded() -> None:
    assert parse_key_value_list("a=1, b = x%20y ,c=k%3Dv", "X") == {"a": "1", "b": "x y", "c": "k=v"}


class _Broken:
    name = "inferwatch_broken"
    type = "counter"
    documentation = "Raises on conversion."
    unit = ""
    samples = None


def test_a_family_that_cannot_be_converted_costs_only_itself(receiver: OtlpReceiver) -> None:
    fams = [_Broken(), GaugeMetricFamily("inferwatch_fine", "Fine.", value=2.0)]
    pusher = OtlpMetricsPusher(lambda: fams, endpoint=receiver.base_url + "/v1/metrics")
    assert pusher.push_once() is True
    assert set(metrics_by_name(receiver.wait_for(1)[0].request)) == {"inferwatch_fine"}
    assert pusher.status()["dropped_points"] == {"family_error": 1}

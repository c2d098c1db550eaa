"""OTLP base-2 exponential histograms from the aggregator's native histograms (the OTel env var selects them)."""

from __future__ import annotations

import pytest

from inferwatch_sidecar.aggregate.aggregator import Aggregator
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.export.otlp.convert import families_to_request
from inferwatch_sidecar.export.otlp.env import OtlpConfigError, settings_from_env
from inferwatch_sidecar.metrics.native import native_edge
from tests.metrics.test_native import events, native_index

ENV = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"
BASE = {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:4318/v1/metrics"}


def test_env_var_selects_exponential_histograms() -> None:
    on = settings_from_env({**BASE, ENV: "base2_exponential_bucket_histogram"}, {})
    off = settings_from_env({**BASE, ENV: "explicit_bucket_histogram"}, {})
    assert on is not None and on["exponential_histograms"] is True
    assert off is not None and off["exponential_histograms"] is False
    with pytest.raises(OtlpConfigError, match="base2_exponential_bucket_histogram"):
        settings_from_env({**BASE, ENV: "exponential"}, {})


@pytest.mark.parametrize("schema", [0, 3])
def test_exponential_points_hold_the_observations(schema: int) -> None:
    evs = events(1500, 7 + schema)
    agg = Aggregator(ComponentContext(), native_schema=schema)
    agg.process(evs, [0] * 16)
    fams = list(agg.collect())
    req, stats = families_to_request(fams, {"service.name": "t"}, now_s=2e9, start_time_s=1.9e9, exponential=True)
    metrics = {m.name: m for m in req.resource_metrics[0].scope_metrics[0].metrics}
    m = metrics["inferwatch_stage_duration_seconds"]
    assert m.WhichOneof("data") == "exponential_histogram"
    points = {dict((a.key, a.value.string_value) for a in p.attributes)["stage"]: p
              for p in m.exponential_histogram.data_points}
    vals = [e[8][0][1] * 1e-9 for e in evs]
    p = points["preprocess"]
    assert p.scale == schema and p.count == len(vals) and p.sum == pytest.approx(sum(vals))
    want: dict[int, int] = {}
    for v in vals:
        want[native_index(v, schema) - 1] = want.get(native_index(v, schema) - 1, 0) + 1  # OTLP: (base^i, base^(i+1)]
    got = {p.positive.offset + k: c for k, c in enumerate(p.positive.bucket_counts) if c}
    assert got == want
    # OTLP's bucket i is (base^i, base^(i+1)]: every value lies in its bucket.
    lo_i = min(got)
    assert native_edge(schema, lo_i) < min(vals) <= native_edge(schema, lo_i + 1)
    assert any(ex.trace_id for ex in p.exemplars)
    # Without the switch, the same families go as explicit-bucket histograms.
    req2, _ = families_to_request(fams, {"service.name": "t"}, now_s=2e9, start_time_s=1.9e9)
    m2 = {x.name: x for x in req2.resource_metrics[0].scope_metrics[0].metrics}["inferwatch_stage_duration_seconds"]
    assert m2.WhichOneof("data") == "histogram"

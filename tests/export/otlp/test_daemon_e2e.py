"""The real sidecar, configured only through OTEL_* variables, pushes what it aggregated."""

from __future__ import annotations

import json
import signal
from typing import Any

from tests.export.otlp.conftest import OtlpReceiver, attrs, metrics_by_name
from tests.helpers.sidecar import SidecarProc, wait_until

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
N_OK, N_ERR = 25, 5


def _requests_total(r: Any) -> dict[str, float]:
    m = metrics_by_name(r.request).get("inferwatch_requests")
    if m is None:
        return {}
    out: dict[str, float] = {}
    for p in m.sum.data_points:
        a = attrs(p.attributes)
        out[a["outcome"]] = out.get(a["outcome"], 0.0) + p.as_double
    return out


def _events() -> list[dict[str, Any]]:
    return [
        {"type": "request", "service": "fraud-api", "model": "xgb", "duration_s": 0.02,
         "request_id": f"r{i}", **({"trace_id": TRACE} if i == N_OK - 1 else {})}
        for i in range(N_OK)
    ] + [
        {"type": "request", "service": "fraud-api", "model": "xgb", "duration_s": 0.5, "outcome": "error",
         "error_type": "timeout", "request_id": f"e{i}"}
        for i in range(N_ERR)
    ]


def _run_sidecar(sidecar_factory: Any, receiver: OtlpReceiver, interval_ms: int) -> SidecarProc:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base_url,
        "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=team-a",
        "OTEL_METRIC_EXPORT_INTERVAL": str(interval_ms),
        "OTEL_SERVICE_NAME": "fraud-api",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
    }
    sc: SidecarProc = sidecar_factory(env=env)
    code, body = sc.post("/v1/events", json.dumps({"events": _events()}).encode())
    assert code in (200, 202), body
    return sc


def test_sidecar_pushes_exact_counts_every_interval(sidecar_factory: Any, receiver: OtlpReceiver) -> None:
    sc = _run_sidecar(sidecar_factory, receiver, interval_ms=200)
    wait_until(
        lambda: receiver.received and _requests_total(receiver.received[-1]) == {"ok": N_OK, "error": N_ERR},
        timeout=10, what="an OTLP push with every request counted",
    )
    st = sc.status()["otlp"]
    assert st["state"] == "running" and st["pushes_ok"] >= 1 and st["pushes_failed"] == 0
    assert st["endpoint"] == receiver.base_url + "/v1/metrics"
    assert sc.stop(signal.SIGTERM) == 0, sc.log
    last = receiver.received[-1]
    assert last.headers["x-tenant"] == "team-a"
    res = attrs(last.request.resource_metrics[0].resource.attributes)
    assert res["service.name"] == "fraud-api" and res["deployment.environment"] == "test"
    m = metrics_by_name(last.request)
    (h,) = [p for p in m["inferwatch_request_duration_seconds"].histogram.data_points
            if attrs(p.attributes).get("model") == "xgb"]
    assert m["inferwatch_request_duration_seconds"].unit == "s"
    assert h.count == N_OK + N_ERR
    assert abs(h.sum - (N_OK * 0.02 + N_ERR * 0.5)) < 1e-6
    # Per-bucket counts: 25 requests at 20 ms, 5 at 500 ms, whatever the catalog's bounds are.
    bounds = [*h.explicit_bounds, float("inf")]
    filled = {b: n for b, n in zip(bounds, h.bucket_counts, strict=True) if n}
    assert list(filled.values()) == [N_OK, N_ERR]
    lo, hi = filled
    assert bounds[bounds.index(lo) - 1] < 0.02 <= lo and bounds[bounds.index(hi) - 1] < 0.5 <= hi
    # Exemplars: the traced request's trace ID in binary, a request ID as a filtered attribute.
    by_value = {e.as_double: e for e in h.exemplars}
    assert by_value[0.02].trace_id == bytes.fromhex(TRACE)
    assert attrs(by_value[0.5].filtered_attributes) == {"request_id": f"e{N_ERR - 1}"}


def test_sigterm_makes_a_final_push_with_every_counted_event(sidecar_factory: Any, receiver: OtlpReceiver) -> None:
    sc = _run_sidecar(sidecar_factory, receiver, interval_ms=600_000)  # no periodic push during the test
    st = sc.status()["otlp"]
    assert st["state"] == "running" and st["pushes_ok"] == 0
    assert sc.stop(signal.SIGTERM) == 0, sc.log
    (only,) = receiver.received
    assert _requests_total(only) == {"ok": N_OK, "error": N_ERR}

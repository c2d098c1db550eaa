"""Issue 27 on the OTLP path: server spans' route, status code and http.request.resend_count."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest

from inferwatch_sidecar.config import load_config
from inferwatch_sidecar.daemon import Sidecar
from tests.helpers.sidecar import parse_metrics, sample, total
from tests.ingest.otlp_traces.spans import export, span

PB = "application/x-protobuf"
SERVER = 2


def _server(trace: int, route: str | None, status: int, resend: int = 0, path: str | None = None,
            xrid: str | None = None) -> Any:
    attrs: dict[str, Any] = {"http.request.method": "POST", "http.response.status_code": status,
                             "url.path": path or (route or "/nowhere")}
    if route is not None:
        attrs["http.route"] = route
    if resend:
        attrs["http.request.resend_count"] = resend
    if xrid is not None:
        attrs["http.request.header.x-request-id"] = [xrid]
    return span(trace, 1, f"POST {route}", 0.0, 20.0, kind=SERVER, attrs=attrs)


def test_server_spans_give_routes_outcomes_and_retries() -> None:
    s = Sidecar(load_config(environ={}, overrides={"gpu": {"enabled": False}, "drift": {"enabled": False}}))
    spans = (
        [_server(100 + i, "/v1/chat/{model}", 200, path=f"/v1/chat/m{i}") for i in range(6)]
        + [_server(200 + i, "/v1/chat/{model}", 200, resend=i + 1) for i in range(2)]  # OTel resend_count
        + [_server(300, "/v1/chat/{model}", 200, xrid="client-7"), _server(301, "/v1/chat/{model}", 200, xrid="client-7")]
        + [_server(400 + i, "/v1/chat/{model}", 422) for i in range(3)]
        + [_server(500 + i, "/v1/chat/{model}", 429) for i in range(4)]
        + [_server(600, "/v1/chat/{model}", 503), _server(601, "/v1/chat/{model}", 500)]
        + [_server(700 + i, None, 200, path="/healthz") for i in range(5)]
    )
    assert s.traces.handle(export(spans), PB, None)[0] == 200
    m = parse_metrics(generate_latest(s.registry).decode())
    reqs = {o: total(m, "inferwatch_requests_total", outcome=o) for o in ("ok", "client_error", "shed", "error")}
    assert reqs == {"ok": 10, "client_error": 3, "shed": 5, "error": 1}  # the probes are not requests

    def http(route: str, outcome: str) -> float:
        return total(m, "inferwatch_http_requests_total", route=route, outcome=outcome)

    assert http("/v1/chat/{model}", "ok") == 10 and http("/v1/chat/{model}", "shed") == 5
    assert http("/v1/chat/{model}", "client_error") == 3 and http("/healthz", "ok") == 5
    assert total(m, "inferwatch_request_attempts_total") == 19
    # Two spans say they are resends; the second span with the client's ID is a retry too.
    assert total(m, "inferwatch_request_retries_total") == 3
    assert total(m, "inferwatch_load_amplification_ratio") == 19 / 16
    assert total(m, "inferwatch_request_errors_total", error_type="http_500") == 1
    assert sample(m, "inferwatch_otlp_spans_total", result="accepted", reason="request") == len(spans)

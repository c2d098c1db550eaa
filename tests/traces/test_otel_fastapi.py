"""A FastAPI app under uvicorn, instrumented with OpenTelemetry, exporting OTLP/HTTP to a real sidecar."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Response
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from tests.helpers.net import free_port
from tests.helpers.sidecar import parse_metrics, sample, total, wait_until

N_OK = 15
N_FAIL = 5


@pytest.fixture
def app_server(sidecar_factory: Any) -> Iterator[tuple[Any, str, TracerProvider]]:
    sc = sidecar_factory("--set", "traces.stages={tokenize: preprocess}")
    provider = TracerProvider(resource=Resource.create({"service.name": "otel-app", "service.version": "3"}))
    provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(endpoint=sc.url + "/v1/traces"), schedule_delay_millis=100))
    tracer = provider.get_tracer("app")
    app = FastAPI()

    @app.get("/ok")
    def ok() -> dict[str, int]:
        with tracer.start_as_current_span("tokenize"):
            time.sleep(0.002)
        return {"ok": 1}

    @app.get("/fail")
    def fail() -> Response:
        return Response(status_code=500)

    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, timeout=10, what="uvicorn started")
    try:
        yield sc, f"http://127.0.0.1:{port}", provider
    finally:
        server.should_exit = True
        thread.join(10)
        provider.shutdown()


def test_instrumented_fastapi_requests_arrive_as_exact_counts(app_server: Any) -> None:
    sc, url, provider = app_server
    with httpx.Client(base_url=url, timeout=10) as client:
        for _ in range(N_OK):
            assert client.get("/ok").status_code == 200
        for _ in range(N_FAIL):
            assert client.get("/fail").status_code == 500
    assert provider.force_flush(10_000)

    lab = {"service": "otel-app", "model": "", "model_version": ""}

    def counted() -> dict[Any, float] | None:
        # Spans are counted as the receiver takes them, requests once aggregation has them: wait for both.
        m = parse_metrics(sc.metrics())
        done = (total(m, "inferwatch_otlp_spans_total", result="accepted", reason="request") >= N_OK + N_FAIL
                and total(m, "inferwatch_requests_total", **lab) >= N_OK + N_FAIL)
        return m if done else None

    m = wait_until(counted, timeout=15, what="spans counted")
    assert sample(m, "inferwatch_requests_total", **lab, outcome="ok") == N_OK
    assert sample(m, "inferwatch_requests_total", **lab, outcome="error") == N_FAIL
    assert sample(m, "inferwatch_request_errors_total", **lab, error_type="http_500") == N_FAIL
    assert sample(m, "inferwatch_stage_duration_seconds_count", **lab, stage="preprocess") == N_OK
    assert sample(m, "inferwatch_stage_duration_seconds_sum", **lab, stage="preprocess") >= N_OK * 0.002
    accepted = total(m, "inferwatch_otlp_spans_total", result="accepted")
    assert total(m, "inferwatch_otlp_spans_total", result="rejected") == 0
    assert total(m, "inferwatch_otlp_spans_total", result="dropped") == 0
    assert sample(m, "inferwatch_otlp_spans_total", result="accepted", reason="stage") == N_OK
    # The rest are the instrumentation's own ASGI send/receive spans, which map to nothing.
    assert accepted == N_OK + N_FAIL + N_OK + sample(m, "inferwatch_otlp_spans_total", result="accepted",
                                                     reason="unused")
    assert sample(m, "inferwatch_otlp_spans_total", result="accepted", reason="unused") >= N_OK + N_FAIL

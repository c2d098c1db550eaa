"""Catalog entries for HTTP truth and overload: routes, status outcomes, retries and client give-ups.

They come from the SDK's HTTP events (one per HTTP request the ASGI middleware sees) and from
OTLP server spans (``http.route``, ``http.response.status_code``, ``http.request.resend_count``).
docs/overload.md explains how they are read together.
"""

from __future__ import annotations

from inferwatch_sidecar.metrics.core import LATENCY_BUCKETS
from inferwatch_sidecar.metrics.entry import Metric

_CTX = ("service", "model", "model_version")

HTTP_REQUESTS_TOTAL = Metric(
    name="inferwatch_http_requests_total", type="counter", labels=(*_CTX, "route", "outcome"), component="core",
    help="HTTP requests by route template (capped; __overflow__ past the cap, _unmatched for no route, the path "
    "for probes and docs) and outcome (ok, client_error, error, cancelled, shed); probes included.",
)
REQUEST_ATTEMPTS_TOTAL = Metric(
    name="inferwatch_request_attempts_total", type="counter", labels=_CTX, component="core",
    help="HTTP requests to the model's routes (probes and docs left out), first attempts and retries alike.",
)
REQUEST_RETRIES_TOTAL = Metric(
    name="inferwatch_request_retries_total", type="counter", labels=_CTX, component="core",
    help="HTTP requests that were retries: a resend count in their headers or span "
    "(http.request.resend_count), or a client request ID already seen within the retry window.",
)
LOAD_AMPLIFICATION_RATIO = Metric(
    name="inferwatch_load_amplification_ratio", type="gauge", unit="ratio", labels=_CTX, component="core",
    help="Attempts per unique request over the last 60 s (1 = no retries; 2 = every request sent twice).",
)
CLIENT_GIVEUPS_TOTAL = Metric(
    name="inferwatch_client_giveups_total", type="counter", labels=_CTX, component="core",
    help="HTTP requests whose client disconnected before the response was complete.",
)
CLIENT_GIVEUP_WAIT_SECONDS = Metric(
    name="inferwatch_client_giveup_wait_seconds", type="histogram", unit="seconds", labels=_CTX,
    buckets=LATENCY_BUCKETS, component="core",
    help="How long clients that gave up had waited: compare with inferwatch_request_duration_seconds.",
)

METRICS: tuple[Metric, ...] = (
    HTTP_REQUESTS_TOTAL, REQUEST_ATTEMPTS_TOTAL, REQUEST_RETRIES_TOTAL, LOAD_AMPLIFICATION_RATIO,
    CLIENT_GIVEUPS_TOTAL, CLIENT_GIVEUP_WAIT_SECONDS,
)

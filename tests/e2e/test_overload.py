"""Issue 27, end to end: a real uvicorn app with the SDK -> a real sidecar -> exact counts on /metrics.

Known numbers of unique requests, retries (the same X-Request-ID again, and retry-count headers), client
give-ups (a plain handler whose client hangs up), probes, 4xx and 429/503 responses are read back exactly.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.apps import SdkApp
from tests.helpers.sidecar import parse_metrics, sample, total, wait_until

LAB = {"service": "shop", "model": "ranker", "model_version": "v3"}


def test_routes_outcomes_retries_and_giveups_are_counted_exactly(sidecar_factory: Any) -> None:
    httpx = pytest.importorskip("httpx")
    sc = sidecar_factory()
    app = SdkApp("tests.e2e.overload_app:app", sc.sock, LAB, probe="/healthz")
    base = app.base
    try:
        app.start()
        n_unique, n_same_id, n_header, n_envoy_first = 20, 5, 3, 2
        n_422, n_404, n_429, n_503, n_giveups, n_docs = 4, 2, 3, 2, 2, 1
        with httpx.Client(timeout=10) as c:
            for i in range(n_unique):
                assert c.get(f"{base}/items/{i}", headers={"X-Request-ID": f"u-{i}"}).status_code == 200
            for i in range(n_same_id):  # the client sends the same request again: a retry
                assert c.get(f"{base}/items/{i}", headers={"X-Request-ID": f"u-{i}"}).status_code == 200
            for i in range(n_header):  # a new ID, but the client says it is a resend
                r = c.get(f"{base}/items/{i}", headers={"X-Request-ID": f"h-{i}", "X-Retry-Count": "1"})
                assert r.status_code == 200
            for i in range(n_envoy_first):  # Envoy counts the first attempt as 1: not a retry
                r = c.get(f"{base}/items/{i}", headers={"X-Request-ID": f"e-{i}", "X-Envoy-Attempt-Count": "1"})
                assert r.status_code == 200
            for i in range(n_422):
                assert c.get(f"{base}/items/not-a-number-{i}").status_code == 422
            for _ in range(n_404):
                assert c.get(f"{base}/no/such/route").status_code == 404
            for _ in range(n_429):
                assert c.get(f"{base}/shed").status_code == 429
            for _ in range(n_503):
                assert c.get(f"{base}/busy").status_code == 503
            for _ in range(n_docs):
                assert c.get(f"{base}/docs").status_code == 200
            for _ in range(3):
                assert c.get(f"{base}/healthz").status_code == 200
                app.probes += 1
        for _ in range(n_giveups):  # the client gives up after 0.3 s; the handler answers after 3 s
            with httpx.Client(timeout=0.3) as c, pytest.raises(httpx.ReadTimeout):
                c.get(f"{base}/slow")
        n_ok = n_unique + n_same_id + n_header + n_envoy_first
        n_attempts = n_ok + n_422 + n_404 + n_429 + n_503 + n_giveups

        def counted() -> Any:
            m = parse_metrics(sc.metrics())
            done = (sample(m, "inferwatch_request_attempts_total", **LAB) >= n_attempts
                    and sample(m, "inferwatch_http_requests_total", **LAB, route="/healthz", outcome="ok") >= app.probes)
            return m if done else None

        s = wait_until(counted, timeout=30, what="every request counted")
        req = {o: sample(s, "inferwatch_requests_total", **LAB, outcome=o)
               for o in ("ok", "client_error", "error", "shed", "cancelled")}
        # Probes and /docs are not model requests; 4xx, 429/503 and give-ups are told apart.
        assert req == {"ok": n_ok, "client_error": n_422 + n_404, "error": 0, "shed": n_429 + n_503,
                       "cancelled": n_giveups}
        assert sample(s, "inferwatch_request_duration_seconds_count", **LAB) == n_attempts

        def http(route: str, outcome: str) -> float:
            return sample(s, "inferwatch_http_requests_total", **LAB, route=route, outcome=outcome)

        assert http("/items/{item_id}", "ok") == n_ok  # the route template, never the raw path
        assert http("/items/{item_id}", "client_error") == n_422
        assert http("_unmatched", "client_error") == n_404
        assert http("/shed", "shed") == n_429 and http("/busy", "shed") == n_503
        assert http("/slow", "cancelled") == n_giveups
        assert http("/healthz", "ok") == app.probes and http("/docs", "ok") == n_docs
        assert total(s, "inferwatch_http_requests_total", **LAB) == n_attempts + app.probes + n_docs
        assert not any("/items/1" in dict(labs).get("route", "") for (_, labs) in s)

        assert sample(s, "inferwatch_request_attempts_total", **LAB) == n_attempts
        assert sample(s, "inferwatch_request_retries_total", **LAB) == n_same_id + n_header
        amp = sample(s, "inferwatch_load_amplification_ratio", **LAB)
        assert amp == pytest.approx(n_attempts / (n_attempts - n_same_id - n_header))

        assert sample(s, "inferwatch_client_giveups_total", **LAB) == n_giveups
        # Each client waited at least its 0.3 s timeout and left long before the 3 s handler finished.
        assert sample(s, "inferwatch_client_giveup_wait_seconds_count", **LAB) == n_giveups
        assert sample(s, "inferwatch_client_giveup_wait_seconds_bucket", **LAB, le="0.25") == 0
        assert sample(s, "inferwatch_client_giveup_wait_seconds_bucket", **LAB, le="2.5") == n_giveups
        # ... while the server took its 3 s: the give-ups are shorter than the server's latency.
        slow_server = (sample(s, "inferwatch_request_duration_seconds_bucket", **LAB, le="+Inf")
                       - sample(s, "inferwatch_request_duration_seconds_bucket", **LAB, le="2.5"))
        assert slow_server == n_giveups
        assert total(s, "inferwatch_ingest_decode_errors_total") == 0
    finally:
        app.stop()

"""The fast rule profile in a real Prometheus: the rules load, evaluate, and fire in seconds.

This is the loading path the end-to-end test uses (``alerts.generate.write_rule_files``), exercised
against a tiny synthetic exporter so that a broken fast profile shows up here, not in a 3-minute test.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from alerts import generate
from tests.e2e.promserver import PrometheusServer
from tests.helpers.net import free_port

pytestmark = pytest.mark.prometheus

_T0 = time.monotonic()


def _exposition() -> bytes:
    """Half the requests fail, the queue never drains and the GPU collector is down."""
    n = int((time.monotonic() - _T0) * 20)
    lines = [
        "# TYPE inferwatch_requests_total counter",
        f'inferwatch_requests_total{{service="svc",model="m",model_version="v1",outcome="ok"}} {n}',
        f'inferwatch_requests_total{{service="svc",model="m",model_version="v1",outcome="error"}} {n}',
        "# TYPE inferwatch_queue_depth gauge",
        'inferwatch_queue_depth{service="svc",model="m",model_version="v1"} 3',
        "# TYPE inferwatch_gpu_collector_up gauge",
        "inferwatch_gpu_collector_up 0",
        "# TYPE inferwatch_gpu_collector_last_success_age_seconds gauge",
        "inferwatch_gpu_collector_last_success_age_seconds 42",
        "",
    ]
    return "\n".join(lines).encode()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = _exposition()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass


def test_fast_rules_fire_within_seconds_in_a_real_prometheus(prometheus_bin, tmp_path):
    port = free_port()
    httpd = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        rule_files = generate.write_rule_files(tmp_path / "rules")
        with PrometheusServer(prometheus_bin, [f"127.0.0.1:{port}"], rule_files, interval="1s") as prom:
            deadline = time.monotonic() + 45
            want = {"InferwatchHighErrorRate", "InferwatchGPUCollectorDown"}
            states: dict[str, str] = {}
            while time.monotonic() < deadline:
                states = prom.alert_states()
                if all(states.get(a) == "firing" for a in want):
                    break
                time.sleep(0.5)
            assert all(states.get(a) == "firing" for a in want), f"{states}\n{prom.log()}"
            # Healthy signals stay quiet: scrapes succeed and the queue (depth 3) drains. One scrape missed
            # on a loaded machine can make SidecarDown pending for a second; it must never fire.
            assert states.get("InferwatchSidecarDown") != "firing" and "InferwatchQueueBacklog" not in states, states
            groups = prom.api("rules")["groups"]
            bad = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r["health"] == "err"]
            assert not bad, bad
            loaded = {r["name"] for g in groups for r in g["rules"]}
            assert {a.name for a in generate.source.ALERTS} <= loaded
            ratio = prom.query("service_model_version:inferwatch_request_errors:ratio_rate5m")
            assert ratio and abs(float(ratio[0]["value"][1]) - 0.5) < 0.01, ratio
    finally:
        httpd.shutdown()
        httpd.server_close()

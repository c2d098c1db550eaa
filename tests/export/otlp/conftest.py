"""An in-process OTLP/HTTP receiver that decodes what the pusher sends.

It is a real HTTP server on 127.0.0.1 (stdlib ``http.server``) that decodes
each body with opentelemetry-proto's ``ExportMetricsServiceRequest``, gunzips
when asked to, and can answer with any status, headers, body or delay.
"""

from __future__ import annotations

import gzip
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

_PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    raw: bytes
    request: ExportMetricsServiceRequest


@dataclass
class Answer:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    delay_s: float = 0.0


class OtlpReceiver:
    """Records every POST; ``answer`` decides the reply."""

    def __init__(self, port: int = 0, tls: ssl.SSLContext | None = None) -> None:
        self.received: list[Received] = []
        self.answer = Answer()
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                body = gzip.decompress(raw) if self.headers.get("Content-Encoding") == "gzip" else raw
                req = ExportMetricsServiceRequest.FromString(body)
                ans = receiver.answer
                with receiver._cond:  # recorded on arrival, before any answer delay
                    receiver.received.append(
                        Received(self.path, {k.lower(): v for k, v in self.headers.items()}, raw, req)
                    )
                    receiver._cond.notify_all()
                if ans.delay_s:
                    time.sleep(ans.delay_s)
                try:
                    self.send_response(ans.status)
                    for k, v in ans.headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(ans.body)))
                    self.end_headers()
                    self.wfile.write(ans.body)
                except OSError:  # the client gave up (timeout tests)
                    pass

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.scheme = "http"
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def wait_for(self, n: int, timeout_s: float = 5.0) -> list[Received]:
        """Poll until ``n`` requests arrived (or fail at the deadline)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self.received) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"expected {n} OTLP requests, got {len(self.received)}")
                self._cond.wait(left)
            return list(self.received)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # urllib honours *_PROXY; the receiver is on loopback and must be reached directly.
    for var in _PROXY_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    try:
        yield r
    finally:
        r.close()


def attrs(kvs: Any) -> dict[str, str]:
    """OTLP KeyValue list -> {key: string value}."""
    return {kv.key: kv.value.string_value for kv in kvs}


def metrics_by_name(req: ExportMetricsServiceRequest) -> dict[str, Any]:
    """Every metric of a request by name (one resource, one scope expected)."""
    assert len(req.resource_metrics) == 1
    assert len(req.resource_metrics[0].scope_metrics) == 1
    out = {m.name: m for m in req.resource_metrics[0].scope_metrics[0].metrics}
    assert len(out) == len(req.resource_metrics[0].scope_metrics[0].metrics), "duplicate metric names"
    return out


def points_by_attrs(points: Any) -> dict[tuple[tuple[str, str], ...], Any]:
    """Data points keyed by their sorted attributes."""
    return {tuple(sorted(attrs(p.attributes).items())): p for p in points}

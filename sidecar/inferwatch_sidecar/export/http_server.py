"""The sidecar's HTTP server.

Why the standard library's ``ThreadingHTTPServer`` and not uvicorn: it binds
and serves in milliseconds (start-up must stay under 2 s), adds no event
loop to a process whose hot loop is a blocking socket reader, and gives each
scrape its own thread, so a slow scraper never holds up ingest or another
scrape. The endpoints are few and small; nothing here needs ASGI.

Routes:
    GET  /metrics          Prometheus text, or OpenMetrics (with exemplars) when the Accept header asks.
    GET  /healthz          200 while the process runs (never touches GPU or drift).
    GET  /readyz           200 once started and not shutting down, else 503.
    GET  /v1/status        JSON status.
    POST /v1/events        JSON events (docs/wire-format.md).
    POST /v1/labels        JSON ground-truth labels for earlier predictions.
    ANY  /admin/<component>/<path>   component admin routes; Bearer token required.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from prometheus_client.exposition import choose_encoder

from inferwatch_sidecar.ingest.http_json import BadEvent

if TYPE_CHECKING:
    from inferwatch_sidecar.daemon import Sidecar

log = logging.getLogger("inferwatch.sidecar.http")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    sidecar: Sidecar


class Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "inferwatch-sidecar"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s " + format, self.address_string(), *args)

    # -- helpers ---------------------------------------------------------------

    def _send(self, status: int, body: bytes, ctype: str = "text/plain; charset=utf-8", extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj, indent=1, default=str).encode() + b"\n", "application/json")

    # -- routing ---------------------------------------------------------------

    def do_GET(self) -> None:
        sc = self.server.sidecar
        url = urlsplit(self.path)
        path = url.path
        if path == "/metrics":
            encoder, ctype = choose_encoder(self.headers.get("Accept", ""))
            try:
                body = encoder(sc.registry)
            except Exception as e:  # a broken family must not kill the endpoint silently
                log.exception("scrape failed")
                self._send(500, f"scrape failed: {e}\n".encode())
                return
            self._send(200, body, ctype)
        elif path == "/healthz":
            self._send(200, b"ok\n")
        elif path == "/readyz":
            if sc.ready:
                self._send(200, b"ready\n")
            else:
                self._send(503, b"not ready\n")
        elif path == "/v1/status":
            self._json(200, sc.status())
        elif path.startswith("/admin/"):
            self._admin(url)
        elif path == "/":
            self._send(200, b"inferwatch sidecar: /metrics /healthz /readyz /v1/status /v1/events /v1/labels\n")
        else:
            self._send(404, b"not found\n")

    do_HEAD = do_GET

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        if url.path in ("/v1/events", "/v1/labels"):
            self._post_events(url.path)
        elif url.path.startswith("/admin/"):
            self._admin(url)
        else:
            self._send(404, b"not found\n")

    def _read_body(self, limit: int) -> bytes | None:
        try:
            n = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._send(411, b"Content-Length required\n")
            return None
        if n < 0 or n > limit:
            # Discard what we can without buffering it, then refuse.
            self.close_connection = True
            self._send(413, f"body larger than {limit} bytes (ingest.max_json_body_bytes)\n".encode())
            return None
        return self.rfile.read(n)

    def _post_events(self, path: str) -> None:
        sc = self.server.sidecar
        body = self._read_body(sc.cfg.ingest.max_json_body_bytes)
        if body is None:
            sc.pipeline.count_drop("body_too_large")
            return
        sc.pipeline.add_bytes("http", len(body))
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            sc.pipeline.count_error("json", "bad_json")
            self._json(400, {"error": f"body is not JSON: {e}"})
            return
        try:
            if path == "/v1/labels":
                records, errors, extra = sc.json_decoder.labels(doc)
            else:
                records, errors, extra = sc.json_decoder.events(doc)
        except BadEvent as e:
            sc.pipeline.count_error("json", e.reason)
            self._json(400, {"error": e.detail})
            return
        for reason, n in errors.items():
            sc.pipeline.count_error("json", reason, n)
        if extra:
            sc.pipeline.count_drop("too_many_events", extra)
            errors["too_many_events"] = extra
        sc.pipeline.events(records, "http")
        self._json(200, {"accepted": len(records), "rejected": sum(errors.values()), "errors": errors})

    def _admin(self, url: Any) -> None:
        sc = self.server.sidecar
        token = sc.cfg.http.admin_token
        if token is None:
            self._send(404, b"admin routes are disabled: set http.admin_token or INFERWATCH_ADMIN_TOKEN\n")
            return
        auth = self.headers.get("Authorization", "")
        expected = "Bearer " + token.get_secret_value()
        if not hmac.compare_digest(auth.encode(), expected.encode()):
            self._send(401, b"missing or wrong bearer token\n", extra={"WWW-Authenticate": "Bearer"})
            return
        parts = url.path.split("/", 3)  # ['', 'admin', component, rest]
        if len(parts) < 3 or not parts[2]:
            self._json(200, {"routes": sc.admin_routes_index()})
            return
        rest = parts[3] if len(parts) > 3 else ""
        handler: Callable[[dict[str, str]], tuple[int, str, bytes]] | None = sc.admin_route(parts[2], rest)
        if handler is None:
            self._send(404, b"no such admin route\n")
            return
        query = dict(parse_qsl(url.query))
        if self.command == "POST":
            body = self._read_body(sc.cfg.ingest.max_json_body_bytes)
            if body is None:
                return
            if body:
                query["body"] = body.decode("utf-8", "replace")
        try:
            status, ctype, out = handler(query)
        except Exception as e:
            sc.pipeline.count_component_error(parts[2], "admin")
            self._send(500, f"admin route failed: {e}\n".encode())
            return
        self._send(status, out, ctype)


class HttpServer:
    """The HTTP server on its own threads."""

    def __init__(self, sidecar: Sidecar, host: str, port: int) -> None:
        try:
            self._server = _Server((host, port), Handler)
        except OSError as e:
            from inferwatch_sidecar.ingest.sockets import IngestError

            raise IngestError(f"http.port: cannot listen on {host}:{port}: {e.strerror}") from None
        self._server.sidecar = sidecar
        self.port = int(self._server.server_address[1])
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="inferwatch-http", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout)

"""The standard-library HTTP server that serves the sidecar's route table (:mod:`.routes`).

Why the standard library's ``ThreadingHTTPServer`` and not uvicorn: it binds
and serves in milliseconds (start-up must stay under 2 s), adds no event
loop to a process whose hot loop is a blocking socket reader, and gives each
scrape its own thread, so a slow scraper never holds up ingest or another
scrape. The endpoints are few and small; nothing here needs ASGI.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from inferwatch_sidecar.export.routes import HttpError, Request, Response, Route, resolve

log = logging.getLogger("inferwatch.sidecar.http")

_NOT_FOUND = Response(404, b"not found\n")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    routes: Mapping[str, Route]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "inferwatch-sidecar"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s " + format, self.address_string(), *args)

    def _read_body(self, limit: int) -> bytes:
        try:
            n = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise HttpError(411, "Content-Length required") from None
        if n < 0 or n > limit:
            # Refuse without reading it, and close: the unread body must not be taken for the next request.
            raise HttpError(413, f"body larger than {limit} bytes (ingest.max_json_body_bytes)", close=True)
        return self.rfile.read(n)

    def _serve(self) -> None:
        url = urlsplit(self.path)
        # HEAD is answered as GET without the body.
        method = "GET" if self.command == "HEAD" else self.command
        handler = resolve(self.server.routes, method, url.path)
        req = Request(self.command, url.path, url.query, self.headers, self._read_body)
        try:
            resp = _NOT_FOUND if handler is None else handler(req)
        except HttpError as e:
            resp = Response(e.status, f"{e}\n".encode(), close=e.close)
        self._send(resp)

    do_GET = do_HEAD = do_POST = _serve

    def _send(self, resp: Response) -> None:
        if resp.close:
            self.close_connection = True
        self.send_response(resp.status)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Content-Length", str(len(resp.body)))
        for k, v in resp.headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(resp.body)


class HttpServer:
    """Serves a route table on its own threads.

    Args:
        routes: path -> :class:`~inferwatch_sidecar.export.routes.Route`
            (see :func:`~inferwatch_sidecar.export.routes.sidecar_routes`).
        host: the bind address.
        port: the port; 0 picks a free one (read it back from ``port``).

    Raises:
        OSError: the address cannot be bound.
    """

    def __init__(self, routes: Mapping[str, Route], host: str, port: int) -> None:
        self._server = _Server((host, port), _Handler)
        self._server.routes = routes
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

"""The HTTP server that serves the sidecar's route table (:mod:`.routes`): uvicorn on h11, with guards.

Why uvicorn: a maintained HTTP/1.1 implementation with strict request parsing,
keep-alive handling, a real listen backlog and a bounded graceful shutdown,
serving every connection on one event loop thread, so a thousand slow clients
cost a thousand sockets and no threads.

Why h11 and not httptools: h11 caps the request line and headers
(``h11_max_incomplete_event_size``; past it the request is answered 400),
while httptools accepts headers of any size; h11 is pure Python, so no
compiled wheel is needed; and its few thousand requests a second are far more
than a metrics endpoint sees. Both reject ``Content-Length: +N`` and differing
duplicate lengths; h11 lets chunked win over a Content-Length sent with it, so
:class:`_App` refuses that pair itself.

What uvicorn lacks, added here:

- a connection cap (``http.max_connections``): the connection past it is
  answered 503 and closed at once, never queued (uvicorn's
  ``limit_concurrency`` would answer every request 503 while idle connections
  fill it, so it is not used);
- a header-read deadline (``http.header_timeout_s``) from connecting, and from
  the first byte after a keep-alive pause: then 408 and close (slowloris);
- a body cap (the route's ``max_body``) checked on Content-Length before
  reading and on the bytes while streaming (413), and a body-read deadline
  (``http.body_timeout_s``, 408); a response the client does not take off the
  socket within the same time drops the connection;
- ``connection: close`` on every answer that leaves a request body unread
  (401, 404, 413, a body on a GET), so those bytes never become a request;
- handlers off the event loop: all but ``inline`` routes run on a small
  dedicated thread pool, so /healthz answers during a slow scrape, and
  ``/metrics`` on its own two threads, so it never waits behind ingest bodies; socket
  ingest has its own thread and never waits for either;
- browser safety: a request whose ``Origin`` is not the sidecar's own (nor in
  ``http.allowed_origins``) is answered 403, and, when the server is bound
  to loopback (or ``http.allowed_hosts`` is set), one whose ``Host`` names
  another host is answered 421: a page on another site, or one that rebinds
  its own name to 127.0.0.1, can neither post events nor read ``/metrics``;
- quiet logs: a disconnect logs nothing, and each refusal is counted in
  ``inferwatch_http_refused_total{reason}`` with at most one log line a
  minute per reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import socket
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import uvicorn
from prometheus_client.metrics_core import CounterMetricFamily
from uvicorn.protocols.http.h11_impl import H11Protocol

from inferwatch_sidecar.config import HttpConfig
from inferwatch_sidecar.http.routes import Request, Response, Route, resolve
from inferwatch_sidecar.metrics import families
from inferwatch_sidecar.metrics.core import HTTP_REFUSED_TOTAL

log = logging.getLogger("inferwatch.sidecar.http")
#: uvicorn's per-connection logger, replaced: what it logs at WARNING is a refusal we count and log ourselves.
_CONN_LOG = logging.getLogger("inferwatch.sidecar.http.connection")
_CONN_LOG.addFilter(lambda record: record.levelno >= logging.ERROR)

_THREAD_NAME = "inferwatch-http"
#: Pending connections the kernel queues for accept (it caps this at net.core.somaxconn).
BACKLOG = 1024
#: Threads running the handlers that are not inline (JSON ingest, OTLP, status, admin).
HANDLER_THREADS = 4
#: Threads running the scrape routes (``Route.scrape``), apart, so ingest bodies never queue ahead of a scrape.
SCRAPE_THREADS = 2
#: The largest request line plus headers (h11 answers 400 past it).
MAX_HEADER_BYTES = 16 * 1024
#: Idle time allowed between requests on a keep-alive connection.
KEEP_ALIVE_S = 5
#: How long start() waits for the server to listen.
START_TIMEOUT_S = 5.0
#: At most one log line per refusal reason in this many seconds.
LOG_EVERY_S = 60.0
#: Why a connection or request was refused: the ``reason`` values of inferwatch_http_refused_total.
REASONS = (
    "too_many_connections", "header_timeout", "body_timeout", "body_too_large", "invalid_request", "write_timeout",
    "foreign_host", "foreign_origin",
)
#: Host names always accepted by the Host check (with any port).
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def host_name(value: str) -> str:
    """The host part of a Host header (``[::1]:9464`` -> ``::1``), lower case."""
    v = value.strip().lower()
    if v.startswith("["):
        return v[1:v.find("]")] if "]" in v else v
    return v.rsplit(":", 1)[0] if v.count(":") == 1 else v

_NOT_FOUND = Response(404, b"not found\n")


class _QuietLifecycle(logging.Filter):
    """Drops uvicorn's start and stop INFO lines logged from this server's thread (the daemon logs its own)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or record.threadName != _THREAD_NAME


logging.getLogger("uvicorn.error").addFilter(_QuietLifecycle())


def _raw_response(status: int, phrase: str, body: bytes) -> bytes:
    """A complete closing response, for the moments h11 has no request to answer (before or between requests)."""
    head = (
        f"HTTP/1.1 {status} {phrase}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


_BUSY = _raw_response(503, "Service Unavailable", b"too many connections (http.max_connections)\n")
_HEADERS_LATE = _raw_response(408, "Request Timeout", b"request headers not received in time (http.header_timeout_s)\n")


class Refusals:
    """Connections and requests refused, by reason (one of :data:`REASONS`).

    Counted on the event loop thread and read by scrapes; the keys are fixed,
    so a scrape copying the dict never sees it change size.
    """

    def __init__(self) -> None:
        self.counts = dict.fromkeys(REASONS, 0)
        self._logged_at = dict.fromkeys(REASONS, -math.inf)

    def count(self, reason: str, detail: str) -> None:
        self.counts[reason] += 1
        now = time.monotonic()
        if now - self._logged_at[reason] >= LOG_EVERY_S:
            self._logged_at[reason] = now
            log.warning(
                "HTTP request refused (%s): %s; %d so far, counted in inferwatch_http_refused_total "
                "(this line repeats at most every %.0f s)", reason, detail, self.counts[reason], LOG_EVERY_S,
            )


def refused_family(refusals: Refusals | None) -> CounterMetricFamily:
    """``inferwatch_http_refused_total``, every reason from zero (all zero before a server exists)."""
    counts = dict.fromkeys(REASONS, 0) if refusals is None else dict(refusals.counts)
    fam = families.counter(HTTP_REFUSED_TOTAL)
    for reason, n in counts.items():
        fam.add_metric([reason], float(n))
    return fam


class _Protocol(H11Protocol):
    """uvicorn's h11 protocol plus the connection cap, the header-read deadline and the response-write deadline.

    One timer per connection: armed for the headers at connect and at the
    first byte after a keep-alive pause, cancelled when the headers are
    complete, armed again for writing when a response is still buffered.
    Between requests uvicorn's own keep-alive timer closes an idle connection.
    A subclass per server sets the class attributes.
    """

    limits: ClassVar[HttpConfig]
    refusals: ClassVar[Refusals]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logger = _CONN_LOG
        self._deadline: asyncio.TimerHandle | None = None
        self._awaiting_headers = True
        self._seen_cycle: object = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # A response goes out in two writes (headers, body): with Nagle on, the second waits
            # for the client's delayed ACK, about 40 ms on every keep-alive request.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if len(self.connections) > self.limits.max_connections:
            self.refusals.count("too_many_connections", f"{len(self.connections) - 1} connections are open")
            transport.write(_BUSY)
            transport.close()
            return
        self._arm(self.limits.header_timeout_s)

    def data_received(self, data: bytes) -> None:
        if self.cycle is None or self.cycle.response_complete:
            # These bytes start (or continue) the next request's line and headers.
            self._awaiting_headers = True
            if self._deadline is None:
                self._arm(self.limits.header_timeout_s)
        super().data_received(data)
        self._note_new_request()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request already buffered
        self._awaiting_headers = False
        self._note_new_request()
        if self.transport.get_write_buffer_size() > 0:
            self._arm(self.limits.body_timeout_s)

    def send_400_response(self, msg: str) -> None:
        self.refusals.count("invalid_request", "the request line or headers do not parse as HTTP/1.1")
        super().send_400_response(msg)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _note_new_request(self) -> None:
        if self.cycle is not self._seen_cycle:  # uvicorn made a cycle: a request's headers are complete
            self._seen_cycle = self.cycle
            self._awaiting_headers = False
            self._disarm()

    def _arm(self, delay: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(delay, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        transport = self.transport
        if transport.get_write_buffer_size() > 0:
            self.refusals.count("write_timeout", "a response was not read within http.body_timeout_s")
            transport.abort()
        elif self._awaiting_headers and not transport.is_closing():
            self.refusals.count("header_timeout", "headers not complete within http.header_timeout_s")
            transport.write(_HEADERS_LATE)
            transport.close()


class _Headers:
    """Request headers by lower-case name; repeated ones joined with ", " (what ``Request.headers`` promises)."""

    __slots__ = ("_h",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        h: dict[str, str] = {}
        for k, v in raw:
            name, value = k.decode("latin-1").lower(), v.decode("latin-1")
            h[name] = f"{h[name]}, {value}" if name in h else value
        self._h = h

    def get(self, name: str, default: str, /) -> str:
        return self._h.get(name.lower(), default)


class _TooLarge(Exception):
    pass


class _Gone(Exception):
    """The client disconnected before the request was complete: nothing to answer, nothing to log."""


async def _read_body(receive: Any, limit: int) -> bytes:
    buf = bytearray()
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise _Gone
        buf += msg.get("body", b"")
        if len(buf) > limit:
            raise _TooLarge
        if not msg.get("more_body", False):
            return bytes(buf)


def _run(route: Route, req: Request) -> Response:
    try:
        return route.handler(req)
    except Exception as e:  # a handler bug answers 500 and leaves the server serving
        log.exception("HTTP handler for %s %s failed", req.method, req.path)
        return Response(500, f"handler failed: {type(e).__name__}\n".encode())


class _App:
    """The ASGI application: framing checks, body reading under the limits, then the route's handler."""

    def __init__(
        self, routes: Mapping[str, Route], limits: HttpConfig, refusals: Refusals, executor: ThreadPoolExecutor,
        scrape_executor: ThreadPoolExecutor | None = None,
    ) -> None:
        self.routes = routes
        self.limits = limits
        self.refusals = refusals
        self.executor = executor
        self.scrape_executor = scrape_executor or executor
        extra = {host_name(h) for h in limits.allowed_hosts}
        #: Host names accepted, or None when the Host header is not checked.
        self.hosts: frozenset[str] | None = (
            frozenset(LOOPBACK_NAMES) | extra if extra or _is_loopback(limits.host) else None)
        self.origins = frozenset(o.strip().rstrip("/").lower() for o in limits.allowed_origins)

    def _foreign(self, headers: _Headers) -> Response | None:
        """421 for a Host the allowlist lacks, 403 for a foreign Origin; None when the request may go on."""
        host = headers.get("host", "")
        if self.hosts is not None and host and host_name(host) not in self.hosts:
            self.refusals.count("foreign_host", f"Host {host[:100]!r} is not in http.allowed_hosts")
            return Response(421, b"this Host is not served here; add it to http.allowed_hosts\n", close=True)
        origin = headers.get("origin", "")
        if origin:
            o = origin.strip().rstrip("/").lower()
            if o not in self.origins and o != "http://" + host.strip().lower():
                self.refusals.count("foreign_origin", f"Origin {origin[:100]!r} is not this sidecar's")
                return Response(403, b"cross-origin requests are refused; add the Origin to http.allowed_origins\n",
                                close=True)
        return None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        route = resolve(self.routes, "GET" if scope["method"] == "HEAD" else scope["method"], scope["path"])
        if route is None or route.priority is None:
            await self._serve(scope, receive, send, route)
            return
        # Held until the answer is written: uvicorn writes a last body without waiting for the client.
        with route.priority():
            await self._serve(scope, receive, send, route)

    async def _serve(self, scope: Any, receive: Any, send: Any, route: Route | None) -> None:
        try:
            resp, body_unread = await self._answer(scope, receive, route)
        except _Gone:
            return
        except asyncio.CancelledError:
            # uvicorn cancels requests still running when its graceful shutdown time is up; the
            # connection is closing, so there is no one to answer and nothing worth a traceback.
            return
        # Names in their usual case (h11 sends them as given): some clients read headers case-sensitively.
        headers = [
            (b"Content-Type", resp.content_type.encode("latin-1")),
            (b"Content-Length", str(len(resp.body)).encode("ascii")),
            *((k.encode("latin-1"), v.encode("latin-1")) for k, v in resp.headers.items()),
        ]
        if body_unread or resp.close:
            headers.append((b"Connection", b"close"))
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        await send({"type": "http.response.body", "body": resp.body})

    async def _answer(self, scope: Any, receive: Any, route: Route | None) -> tuple[Response, bool]:
        """The response, and whether a request body is left unread (then the connection must close)."""
        raw: list[tuple[bytes, bytes]] = scope["headers"]
        names = {k for k, _ in raw}
        if b"content-length" in names and b"transfer-encoding" in names:
            # h11 would let chunked win; a proxy in front may have used the length: refuse the ambiguity.
            self.refusals.count("invalid_request", "Content-Length together with Transfer-Encoding")
            return Response(400, b"Content-Length together with Transfer-Encoding\n", close=True), True
        headers = _Headers(raw)
        length = headers.get("content-length", "")  # h11 has checked it is digits, one value
        has_body = b"transfer-encoding" in names or length not in ("", "0")
        method, path = scope["method"], scope["path"]
        req = Request(method, path, scope["query_string"].decode("latin-1"), headers)
        if route is None:
            return _NOT_FOUND, has_body
        foreign = self._foreign(headers)
        if foreign is not None:
            return foreign, has_body
        if route.admit is not None:
            refused = route.admit(req)
            if refused is not None:
                return refused, has_body
        if has_body and route.max_body > 0:
            try:
                if length and int(length) > route.max_body:
                    raise _TooLarge
                body = await asyncio.wait_for(_read_body(receive, route.max_body), self.limits.body_timeout_s)
            except _TooLarge:
                self.refusals.count("body_too_large", f"a body over {route.max_body} bytes to {path}")
                if route.on_too_large is not None:
                    route.on_too_large()
                return Response(413, f"body larger than {route.max_body} bytes\n".encode(), close=True), True
            except asyncio.TimeoutError:
                self.refusals.count("body_timeout", f"a body to {path} not complete within http.body_timeout_s")
                return Response(408, b"request body not received in time (http.body_timeout_s)\n", close=True), True
            req = dataclasses.replace(req, body=body)
            has_body = False
        if route.inline:
            return _run(route, req), has_body
        if route.ready is not None:
            try:
                answer = route.ready(req)
            except Exception:  # the handler, on its thread, answers instead (and logs its own failure)
                log.exception("HTTP ready answer for %s %s failed", req.method, req.path)
                answer = None
            if answer is not None:
                return answer, has_body
        loop = asyncio.get_running_loop()
        pool = self.scrape_executor if route.scrape else self.executor
        return await loop.run_in_executor(pool, _run, route, req), has_body


class HttpServer:
    """Serves a route table with uvicorn on its own thread; the socket is bound (and the port known) at construction.

    Args:
        routes: path -> :class:`~inferwatch_sidecar.http.routes.Route`
            (see :func:`~inferwatch_sidecar.http.routes.sidecar_routes`).
        config: the ``http`` config section: address and limits.

    Raises:
        OSError: the address cannot be bound.
    """

    def __init__(self, routes: Mapping[str, Route], config: HttpConfig) -> None:
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        self._sock = socket.create_server((config.host, config.port), family=family, backlog=BACKLOG)
        self.port = int(self._sock.getsockname()[1])
        self.refusals = Refusals()
        self._executor = ThreadPoolExecutor(HANDLER_THREADS, thread_name_prefix="inferwatch-http-handler")
        self._scrape_executor = ThreadPoolExecutor(SCRAPE_THREADS, thread_name_prefix="inferwatch-http-scrape")
        protocol = type("_ServerProtocol", (_Protocol,), {"limits": config, "refusals": self.refusals})
        self._server = uvicorn.Server(
            uvicorn.Config(
                _App(routes, config, self.refusals, self._executor, self._scrape_executor),
                http=protocol, ws="none", lifespan="off", interface="asgi3", loop="asyncio",
                # Never log_level= (it sets uvicorn's logger levels process-wide) nor uvicorn's logging config.
                log_config=None, access_log=False, proxy_headers=False, server_header=False,
                backlog=BACKLOG, timeout_keep_alive=KEEP_ALIVE_S, h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                timeout_graceful_shutdown=1,
            )
        )
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start serving; returns once the server listens.

        Raises:
            RuntimeError: the server did not start within ``START_TIMEOUT_S``.
        """
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name=_THREAD_NAME, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP server on port {self.port} did not start")
            time.sleep(0.002)

    def stop(self, timeout: float) -> None:
        """Stop within about ``timeout`` seconds: stop accepting, finish what runs, then cancel it."""
        if self._thread is None:
            self._sock.close()
        else:
            # uvicorn reads this when its shutdown begins; its loop notices should_exit within 0.1 s and
            # waits another 0.1 s before the graceful period starts. Seconds as a float (asyncio.wait_for
            # takes one): rounded down, a stop of under 1.3 s had no graceful period at all, and uvicorn
            # logged an error for an idle keep-alive connection.
            self._server.config.timeout_graceful_shutdown = max(0.0, timeout - 0.3)  # type: ignore[assignment]
            self._server.should_exit = True
            self._thread.join(timeout)
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._scrape_executor.shutdown(wait=False, cancel_futures=True)

"""A pure ASGI middleware: request scope, request ID and ingress timing.

It speaks only the ASGI protocol, so it needs neither FastAPI nor Starlette
installed, and it avoids ``BaseHTTPMiddleware``, whose per-request task and
stream plumbing costs a trivial endpoint a large share of its throughput.
The per-request path is budgeted in CPU instructions: see ``InferwatchMiddleware.__call__``.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from operator import itemgetter
from typing import Any

from inferwatch import _core, _scope
from inferwatch._core import _NO_STAGE, _inflight, _push, _req_reset, _req_set, check_stage_name, request
from inferwatch.wire import (
    EV_HTTP,
    OUTCOME_CANCELLED,
    OUTCOME_ERROR,
    OUTCOME_OK,
    SHED_STATUSES,
    outcome_of_status,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_new = object.__new__
_first = itemgetter(0)

# W3C trace context: version-traceid-parentid-flags, lowercase hex.
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
# A request ID we accept from a client: printable ASCII without spaces, bounded.
_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")
_ZERO_TRACE = b"0" * 32
_ZERO_SPAN = b"0" * 16
#: The headers that state how many times a request was sent before, and what to subtract from each
#: value to get that count (Envoy counts the first attempt as 1; the others count resends).
RESEND_HEADERS: dict[bytes, int] = {
    b"x-retry-count": 0,
    b"x-retry-attempt": 0,
    b"x-stainless-retry-count": 0,  # the OpenAI and Anthropic Python and Node SDKs
    b"grpc-previous-rpc-attempts": 0,
    b"x-envoy-attempt-count": 1,
}
#: Largest resend count taken from a header (a bigger or unparsable value is ignored).
MAX_RESEND = 1000
#: The header names that carry a request ID (ASGI servers lowercase header names).
_ID_HEADERS = frozenset((b"traceparent", b"x-request-id"))
#: The header names the middleware reads: one scan in C decides whether any is present.
_SCAN_HEADERS = _ID_HEADERS | frozenset(RESEND_HEADERS)
#: Paths left out of the request metrics by default: orchestrator probes, metrics scrapes and the API
#: docs. They are still counted, by path, in ``inferwatch_http_requests_total``.
DEFAULT_EXCLUDED_PATHS: frozenset[str] = frozenset((
    "/health", "/healthz", "/livez", "/readyz", "/ready", "/ping", "/metrics", "/docs", "/docs/oauth2-redirect",
    "/redoc", "/openapi.json", "/favicon.ico",
))
#: Exceptions that mean the client went away, by class name (Starlette's, uvicorn's), so that
#: neither needs importing.
_DISCONNECT_ERRORS = frozenset(("ClientDisconnect", "ClientDisconnected"))


def scan_headers(headers: Any) -> tuple[str, bytes | None, str | None, int]:
    """Request ID, trace ID, the client's own request ID (or None) and the resend count of a request.

    The resend count is the first valid value of :data:`RESEND_HEADERS` (0 when none): how many times
    the client says it sent this request before.
    """
    rid, trace = request_id_from_headers(headers)
    client = None
    resend = 0
    for name, value in headers:
        if name == b"x-request-id" and client is None and _REQUEST_ID.fullmatch(value.strip()):
            client = rid
        elif not resend:
            off = RESEND_HEADERS.get(name)
            if off is not None:
                try:
                    n = int(value) - off
                except ValueError:
                    continue
                if 0 < n <= MAX_RESEND:
                    resend = n
    return rid, trace, client, resend


def request_id_from_headers(headers: Any) -> tuple[str, bytes | None]:
    """Pick the request ID and the trace ID for an incoming request.

    The request ID is the client's valid ``X-Request-ID`` (printable ASCII,
    at most 128 characters), else the trace ID of a valid ``traceparent``,
    else a fresh generated ID. The trace ID comes from ``traceparent``
    whichever ID the request is known by, so a request with both keeps the
    client's ID (echoed and logged) and records the trace beside it. Of
    repeated headers the first valid one wins.

    Args:
        headers: ASGI headers, an iterable of ``(lowercase name, value)`` bytes pairs.

    Returns:
        ``(request_id, trace_id_bytes_or_None)``.
    """
    xrid: bytes | None = None
    tid: bytes | None = None
    for name, value in headers:
        if tid is None and name == b"traceparent":
            m = _TRACEPARENT.fullmatch(value.strip())
            if m is not None and m.group(1) != b"ff" and m.group(2) != _ZERO_TRACE and m.group(3) != _ZERO_SPAN:
                tid = m.group(2)
        elif xrid is None and name == b"x-request-id":
            v = value.strip()
            if _REQUEST_ID.fullmatch(v):
                xrid = v
    trace = None if tid is None else bytes.fromhex(tid.decode("ascii"))
    if xrid is not None:
        return xrid.decode("ascii"), trace
    if tid is not None:
        return tid.decode("ascii"), trace
    return next(_scope._rid_iter), None


class _HTTPRequest(request):
    """The request scope of one HTTP request, and the ``send`` and ``receive`` the app gets.

    One object per request carries them, so the middleware allocates no
    closure and no coroutine per ``send``: :meth:`send` is a plain function
    that returns the server's own awaitable.
    """

    __slots__ = (
        "_asgi_send", "_asgi_receive", "_resp_start", "_resp_done", "_body_done", "_listening", "_watch", "_held",
        "_headers", "_echo", "_status", "_cycle",
    )
    _asgi_send: Send
    _asgi_receive: Receive
    _resp_start: int
    _resp_done: bool
    # _body_done and _listening are left unset until ``receive`` first sets them (two stores fewer on every
    # request); only _start_watch reads them, with a default.
    #: The request body has been read to its end.
    _body_done: bool
    #: The app is waiting in ``receive`` (Starlette's disconnect listener): it will see the disconnect.
    _listening: bool
    #: The disconnect watcher's task: None before a streamed response, False when there is none.
    _watch: Any
    #: What the watcher read (an asyncio.Queue), in order, for the app: the empty body of a GET, the disconnect.
    _held: Any
    _headers: Any
    _echo: bool
    #: The response status (0 until the response starts).
    _status: int
    #: The server's request cycle when it has ``disconnected`` (uvicorn), else None.
    _cycle: Any

    async def _receive(self) -> Message:
        # An ``http.disconnect`` before the response is complete means the client left: the
        # request ends cancelled, and a stream still running counts what it produces from now on.
        message = await self._asgi_receive()
        t = message["type"]
        if t == "http.disconnect":
            if not self._resp_done and not self.gone:
                self.gone = self._rt.clock()  # type: ignore[union-attr]
        elif t == "http.request" and not message.get("more_body", False):
            self._body_done = True
        return message

    async def _watch_receive(self) -> None:
        while True:
            message = await self._receive()
            self._held.put_nowait(message)
            if message["type"] == "http.disconnect":
                return

    async def receive(self) -> Message:
        w = self._watch
        if not w:
            # _receive, inlined: one coroutine per receive rather than two (the common path).
            self._listening = True
            try:
                message = await self._asgi_receive()
            finally:
                self._listening = False
            t = message["type"]
            if t == "http.request":
                if not message.get("more_body", False):
                    self._body_done = True
            elif t == "http.disconnect" and not self._resp_done and not self.gone:
                self.gone = self._rt.clock()  # type: ignore[union-attr]
            return message
        held = self._held
        if w.done() and held.empty():  # the watcher saw the disconnect and the app has it: ask the server
            return await self._asgi_receive()
        # The watcher is the one reader of the server's receive; the app gets what it read, in order.
        got: Message = await held.get()
        return got

    def _stop_watch(self) -> None:
        w = self._watch
        if w:
            w.cancel()
            self._watch = False

    def _start_watch(self) -> None:
        """Watch for the client leaving while a streamed response is sent.

        An app that streams without calling ``receive`` (a raw ASGI app, a generator fed by an
        engine) would never learn of a disconnect, and neither would we: so once the request body
        is read and the response streams, a task waits on ``receive`` for ``http.disconnect``.
        Not when the app is already waiting in ``receive`` (it will see the disconnect, and so will
        we), and only under asyncio; elsewhere the middleware sees what the app receives.
        """
        if getattr(self, "_listening", False):
            # The app listens for the disconnect itself: a second reader of receive could take
            # the message from it (servers with a message queue hand each message out once).
            self._watch = False
            return
        if not getattr(self, "_body_done", False):
            for name, value in self._headers or ():
                if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
                    self._watch = False
                    return  # a body the app has not read: its messages are the app's to take
        aio = sys.modules.get("asyncio")
        if aio is None:
            self._watch = False
            return
        try:
            self._held = aio.Queue()
            self._watch = aio.get_running_loop().create_task(self._watch_receive())
        except RuntimeError:  # not an asyncio event loop
            self._watch = False

    def send(self, message: Message) -> Awaitable[None]:
        if self._resp_start:
            # After http.response.start every message is the body (or its trailers): the one without
            # more_body completes the response, the first with it starts a stream.
            if not message.get("more_body", False):
                c = self._cycle
                if c is not None and c.disconnected is True and not self.gone:
                    self.gone = self._rt.clock()  # type: ignore[union-attr]  # the server drops this body
                self._resp_done = True
            elif self._watch is None:
                self._start_watch()
        elif message["type"] == "http.response.start":
            self._resp_start = self._rt.clock()  # type: ignore[union-attr]
            status = message.get("status", 200)
            if type(status) is int:
                self._status = status
                if status >= 500 and status not in SHED_STATUSES:
                    self.status_error = f"http_{status}" if status < 600 else "http_5xx"
            if self._echo:
                headers = message.get("headers")
                if headers is None:
                    message["headers"] = [(b"x-request-id", self.rid.encode())]
                # The app's own X-Request-ID wins (ASGI response header names are lowercase).
                elif b"x-request-id" not in map(_first, headers):
                    if type(headers) is not list:
                        headers = message["headers"] = list(headers)
                    headers.append((b"x-request-id", self.rid.encode()))
        return self._asgi_send(message)


class _Probe:
    """The ``send`` of a request on an excluded path: it only notes the status."""

    __slots__ = ("send_", "status")

    def __init__(self, send: Send) -> None:
        self.send_ = send
        self.status = 0

    def send(self, message: Message) -> Awaitable[None]:
        if message["type"] == "http.response.start":
            st = message.get("status", 200)
            if type(st) is int:
                self.status = st
        return self.send_(message)


def _paths(value: Iterable[str] | str | None, env: str, default: frozenset[str]) -> frozenset[str]:
    if value is None:
        raw = os.environ.get(env)
        if raw is None:
            return default
        value = raw
    if isinstance(value, str):
        value = [p for p in (x.strip() for x in value.split(",")) if p]
    out = frozenset(value)
    bad = sorted(p for p in out if type(p) is not str or not p.startswith("/"))
    if bad:
        raise ValueError(f"{env.lower().removeprefix('inferwatch_')}: paths must be strings starting with '/', "
                         f"not {bad!r}")
    return out


class InferwatchMiddleware:
    """ASGI middleware that opens a request scope per HTTP request.

    For each HTTP request it picks the request ID (the client's
    ``X-Request-ID``, then the ``traceparent`` trace ID, then a generated one)
    and the trace ID (:func:`request_id_from_headers`), echoes the request ID in the
    ``X-Request-ID`` response header, stores it in ``scope["state"]
    ["request_id"]``, opens :class:`inferwatch.request` around the app and
    records the ingress stage: the time from the request reaching this
    middleware until the first stage of the handler starts (routing, body
    parsing and validation), or until the response starts when the handler
    has no stages.

    The outcome comes from the status code (:func:`outcome_of_status`): ``ok``,
    ``client_error`` for a 4xx, ``shed`` for a 429 or 503, ``error`` for another
    5xx (``error_type`` ``http_500`` style) or an exception (its class name).
    Each request also sends an HTTP event: its route template (Starlette's
    ``scope["route"].path``, never the raw path), status, outcome, the resend
    count its retry headers state (:data:`RESEND_HEADERS`), how long a client
    that left had waited, and the request ID the client sent, from which the
    sidecar counts retries, give-ups and load amplification.

    Requests to excluded paths (:data:`DEFAULT_EXCLUDED_PATHS`: probes, docs,
    metrics) or routes send only the HTTP event, so probes neither dilute the
    latency percentiles nor the request rate.

    A client that disconnects before the response is complete ends the
    request as ``cancelled``. The middleware sees the ``http.disconnect``
    message when the app (or Starlette's ``StreamingResponse``) calls
    ``receive``, or a disconnect error raised through the app (Starlette's
    ``ClientDisconnect``, uvicorn's ``ClientDisconnected``); under uvicorn the
    SDK's sender thread looks at every request in flight on each wake-up
    (50 ms by default) and stamps the moment its client left, so a plain
    handler whose client hung up is seen too, with no task per request; and
    while a response streams under asyncio, once the request body is read, a
    watcher task reads ``receive`` itself (and hands what it read to the app),
    so an app that never listens is seen under any server. A streamed stage
    still running then counts the items it produces after that moment as
    undelivered.

    Before ``configure()`` it passes every request straight through.

    Args:
        app: the ASGI application to wrap.
        ingress_stage: the name of the ingress stage.
        echo_request_id: add ``X-Request-ID`` to responses.
        exclude_paths: paths or route templates left out of the request metrics (default
            :data:`DEFAULT_EXCLUDED_PATHS`, or the comma-separated ``INFERWATCH_HTTP_EXCLUDE``).
        include_paths: paths taken back out of ``exclude_paths`` (``INFERWATCH_HTTP_INCLUDE``),
            for example ``["/metrics"]`` for a service whose model is its metrics endpoint.
        model: the model this app's requests (and what they record) count under, over ``configure()``'s:
            for a server whose apps serve different models (one middleware per app).
        model_version: likewise for the model version.

    Raises:
        ValueError: a path that does not start with ``/``, or an empty or non-string model or version.
    """

    def __init__(
        self, app: ASGIApp, ingress_stage: str = "ingress", echo_request_id: bool = True,
        exclude_paths: Iterable[str] | None = None, include_paths: Iterable[str] | None = None,
        model: str | None = None, model_version: str | None = None,
    ) -> None:
        self.app = app
        self.ingress_stage = check_stage_name(ingress_stage)
        self.echo = echo_request_id
        self.excluded = (_paths(exclude_paths, "INFERWATCH_HTTP_EXCLUDE", DEFAULT_EXCLUDED_PATHS)
                         - _paths(include_paths, "INFERWATCH_HTTP_INCLUDE", frozenset()))
        for name, v in (("model", model), ("model_version", model_version)):
            if v is not None and (type(v) is not str or not v):
                raise ValueError(f"InferwatchMiddleware: {name} must be a non-empty string, got {v!r}")
        #: (model, version) over configure()'s, or None; the label set built from them, per configured one.
        self._names = None if model is None and model_version is None else (model, model_version)
        self._base: Any = None
        self._ctx: Any = None

    def _ctx_for(self, base: Any) -> Any:
        """The label set of this app's requests: the configured one with this middleware's model and version."""
        if base is not self._base:
            model, version = self._names  # type: ignore[misc]
            self._ctx = (base[0], base[1] if model is None else model, base[2] if version is None else version)
            self._base = base
        return self._ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rt = _core._rt
        if rt is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("path") in self.excluded:
            await self._excluded(rt, scope, receive, send)
            return
        # This runs for every HTTP request and its cost is measured in instructions
        # (bench/fastapi_overhead.py): one object holds the request scope and the send
        # wrapper, the header scan runs in C unless an ID or retry header is present, the scope is
        # opened inline, and it is closed through request._close, the one place that
        # resets the contextvar and emits the REQUEST event (splitting over 255 stages).
        clock = rt.clock
        req = _new(_HTTPRequest)
        req.t0 = clock()
        try:
            headers = scope.get("headers")
            client = None
            resend = 0
            if headers and not _SCAN_HEADERS.isdisjoint(map(_first, headers)):
                rid, trace, client, resend = scan_headers(headers)
            else:
                rid, trace = next(_scope._rid_iter), None
            state = scope.get("state")
            if state is None:
                scope["state"] = {"request_id": rid}
            elif type(state) is dict:
                state["request_id"] = rid
            req.rid = rid
            req.trace = trace
            req.ctx = rt.ctx if self._names is None else self._ctx_for(rt.ctx)
            req.stages = []
            req.first = _NO_STAGE
            req.open = True
            req.status_error = None
            req.gone = 0
            req.attrs = None
            req._rt = rt
            req._asgi_send = send
            req._asgi_receive = receive
            req._resp_start = 0
            req._resp_done = False
            req._watch = None
            req._headers = headers
            req._echo = self.echo
            req._status = 0
            cyc = getattr(receive, "__self__", None)
            if getattr(cyc, "disconnected", None) is not None:
                req._cycle = cyc
                _inflight.add(req)
            else:
                req._cycle = None
            req._token = _req_set(req)
        except Exception:  # never let the SDK fail a request
            rt.internal_errors += 1
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, req.receive, req.send)
        except BaseException as e:
            req._stop_watch()
            _inflight.discard(req)
            if not req.gone and type(e).__name__ in _DISCONNECT_ERRORS:
                req.gone = clock()
            self._ingress(req)
            req.__exit__(type(e), e, e.__traceback__)
            try:
                self._http(rt, req, scope, OUTCOME_CANCELLED if req.gone else OUTCOME_ERROR, client, resend)
            except Exception:
                rt.internal_errors += 1
            raise
        try:
            if req._watch:
                req._stop_watch()
            c = req._cycle
            if c is not None:
                _inflight.discard(req)
                if not req.gone and not req._resp_done and c.disconnected is True:
                    req.gone = clock()
            self._ingress(req)
            if req.gone:
                outcome = OUTCOME_CANCELLED
            else:
                st = req._status
                outcome = OUTCOME_OK if st < 400 else outcome_of_status(st)
            self._http(rt, req, scope, outcome, client, resend)
        except Exception:
            rt.internal_errors += 1

    def _http(self, rt: Any, req: _HTTPRequest, scope: Scope, outcome: int, client: str | None, resend: int) -> None:
        """Close the request scope (unless its route is excluded) and send its HTTP event."""
        r = scope.get("route")
        route = getattr(r, "path", None) if r is not None else None
        if type(route) is not str:
            route = None
        t1 = rt.clock()
        excluded = route is not None and route in self.excluded
        if req.open:
            if excluded:
                req.open = False
                try:
                    _req_reset(req._token)
                except ValueError:
                    pass
            else:
                req._close(rt, t1, outcome, req.status_error if outcome == OUTCOME_ERROR else None)
        gone = req.gone
        _push(rt, (EV_HTTP, req.ctx, t1 + rt.offset, route, req._status, outcome, resend,
                   gone - req.t0 if gone > req.t0 else 0, excluded, client))

    async def _excluded(self, rt: Any, scope: Scope, receive: Receive, send: Send) -> None:
        """Run a request to an excluded path: only its HTTP event is sent (route = the path)."""
        probe = _Probe(send)
        try:
            await self.app(scope, receive, probe.send)
        except BaseException:
            self._probe_event(rt, scope, probe.status, OUTCOME_ERROR)
            raise
        self._probe_event(rt, scope, probe.status, outcome_of_status(probe.status) if probe.status else OUTCOME_ERROR)

    @staticmethod
    def _probe_event(rt: Any, scope: Scope, status: int, outcome: int) -> None:
        try:
            _push(rt, (EV_HTTP, rt.ctx, rt.clock() + rt.offset, scope.get("path"), status, outcome, 0, 0, True, None))
        except Exception:
            rt.internal_errors += 1

    def _ingress(self, req: _HTTPRequest) -> None:
        """Put the ingress stage first: it ends where the handler's first stage or the response starts."""
        end = req.first
        resp_start = req._resp_start
        if resp_start and resp_start < end:
            end = resp_start
        if end == _NO_STAGE:
            end = req._rt.clock()  # type: ignore[union-attr]
        d = end - req.t0
        req.stages.insert(0, (self.ingress_stage, d if d > 0 else 0, None))


def instrument_fastapi(app: Any, **options: Any) -> Any:
    """Add :class:`InferwatchMiddleware` to a FastAPI or Starlette app as its outermost middleware.

    Args:
        app: the application (anything with Starlette's ``add_middleware``).
        **options: passed to :class:`InferwatchMiddleware`.

    Returns:
        The same app, for chaining.
    """
    check_stage_name(options.get("ingress_stage", "ingress"))
    app.add_middleware(InferwatchMiddleware, **options)
    return app

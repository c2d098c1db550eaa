"""A pure ASGI middleware: request scope, request ID and ingress timing.

It speaks only the ASGI protocol, so it needs neither FastAPI nor Starlette
installed, and it avoids ``BaseHTTPMiddleware``, whose per-request task and
stream plumbing costs a trivial endpoint a large share of its throughput.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from inferwatch import _core
from inferwatch._core import _NO_STAGE, check_stage_name, request

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_new_request = object.__new__

# W3C trace context: version-traceid-parentid-flags, lowercase hex.
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
# A request ID we accept from a client: printable ASCII without spaces, bounded.
_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")
_ZERO_TRACE = b"0" * 32
_ZERO_SPAN = b"0" * 16


def request_id_from_headers(headers: Any) -> tuple[str, bytes | None]:
    """Pick the request ID for an incoming request.

    Precedence: the trace ID of a valid ``traceparent``, then a valid
    ``X-Request-ID`` (printable ASCII, at most 128 characters), then a fresh
    generated ID.

    Args:
        headers: ASGI headers, an iterable of ``(lowercase name, value)`` bytes pairs.

    Returns:
        ``(request_id, trace_id_bytes_or_None)``.
    """
    xrid: bytes | None = None
    for name, value in headers:
        # Most requests carry neither header: one length test rejects nearly every
        # other name before any byte comparison (both names are 11 and 12 bytes).
        n = len(name)
        if n == 11:
            if name == b"traceparent":
                m = _TRACEPARENT.fullmatch(value.strip())
                if m is not None and m.group(1) != b"ff" and m.group(2) != _ZERO_TRACE and m.group(3) != _ZERO_SPAN:
                    tid = m.group(2).decode("ascii")
                    return tid, bytes.fromhex(tid)
        elif n == 12 and xrid is None and name == b"x-request-id":
            v = value.strip()
            if _REQUEST_ID.fullmatch(v):
                xrid = v
    if xrid is not None:
        return xrid.decode("ascii"), None
    return f"{_core._rid_prefix}{next(_core._rid_counter):x}", None


class InferwatchMiddleware:
    """ASGI middleware that opens a request scope per HTTP request.

    For each HTTP request it picks the request ID (``traceparent`` trace ID,
    then ``X-Request-ID``, then a generated one), echoes it in the
    ``X-Request-ID`` response header, stores it in ``scope["state"]
    ["request_id"]``, opens :class:`inferwatch.request` around the app and
    records the ingress stage: the time from the request reaching this
    middleware until the first stage of the handler starts (routing, body
    parsing and validation), or until the response starts when the handler
    has no stages. A 5xx response is an error with ``error_type`` ``http_5xx``
    style (``http_503``); an exception is an error with its class name.

    Before ``configure()`` it passes every request straight through.

    Args:
        app: the ASGI application to wrap.
        ingress_stage: the name of the ingress stage.
        echo_request_id: add ``X-Request-ID`` to responses.
    """

    def __init__(self, app: ASGIApp, ingress_stage: str = "ingress", echo_request_id: bool = True) -> None:
        self.app = app
        self.ingress_stage = check_stage_name(ingress_stage)
        self.echo = echo_request_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rt = _core._rt
        if rt is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # This runs for every HTTP request, so it is written for speed: receive is passed
        # through untouched, send gets one small closure, no copies of the response
        # headers, and the request scope is opened and closed inline.
        rid, trace = request_id_from_headers(scope.get("headers") or ())
        state = scope.get("state")
        if state is None:
            scope["state"] = {"request_id": rid}
        elif isinstance(state, dict):
            state["request_id"] = rid
        req = _new_request(request)
        req.attrs = {}  # what __init__ would set; skipping __init__ saves its keyword handling
        if not req._open(rt, rid, trace):
            await self.app(scope, receive, send)
            return
        clock = rt.clock
        resp_start = 0
        echo = self.echo

        async def send_wrapper(message: Message) -> None:
            nonlocal resp_start
            if not resp_start and message["type"] == "http.response.start":
                resp_start = clock()
                status = message.get("status", 200)
                if type(status) is int and status >= 500:
                    req.status_error = f"http_{status}" if status < 600 else "http_5xx"
                if echo:
                    headers = message.get("headers")
                    if headers is None:
                        message["headers"] = [(b"x-request-id", rid.encode())]
                    else:
                        for k, _ in headers:
                            if len(k) == 12 and k.lower() == b"x-request-id":
                                break
                        else:
                            if type(headers) is not list:
                                headers = message["headers"] = list(headers)
                            headers.append((b"x-request-id", rid.encode()))
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except BaseException as e:
            self._ingress(req, clock, resp_start)
            req.__exit__(type(e), e, e.__traceback__)
            raise
        # Ingress ends where the handler's first stage starts, or where the response starts.
        end = req.first
        if resp_start and resp_start < end:
            end = resp_start
        if end == _NO_STAGE:
            end = clock()
        d = end - req.t0
        req.stages.insert(0, (self.ingress_stage, d if d > 0 else 0, None))
        req.__exit__(None, None, None)

    def _ingress(self, req: request, clock: Callable[[], int], resp_start: int) -> None:
        # The same as the inline code at the end of __call__, for the exception path.
        end = req.first
        if resp_start and resp_start < end:
            end = resp_start
        if end == _NO_STAGE:
            end = clock()
        req.stages.insert(0, (self.ingress_stage, max(end - req.t0, 0), None))


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

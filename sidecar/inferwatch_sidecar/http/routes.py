"""The sidecar's HTTP endpoints as a route table, independent of the server that serves it.

:func:`sidecar_routes` maps each path to a :class:`Route`: its methods, a
handler from :class:`Request` to :class:`Response`, how large a body it reads
and whether it may refuse a request before the body is read. The handlers
reach the rest of the sidecar only through the callables in
:class:`Endpoints`, so any server that can build a ``Request`` and send a
``Response`` can serve them; :mod:`.server` serves them on uvicorn.

Routes:
    GET  /metrics          Prometheus text, or OpenMetrics (with exemplars) when the Accept header asks, or the
                           protobuf exposition with native histograms when it prefers that (docs/scale.md);
                           gzipped when Accept-Encoding takes gzip, as Prometheus's scrapes do.
    GET  /healthz          200 while the process runs (never touches GPU or drift).
    GET  /readyz           200 once started and not shutting down, else 503.
    GET  /v1/status        JSON status.
    GET  /                 the status page: one HTML file that reads /v1/status (no token; docs/sidecar.md),
                           with its script and style at /status.js and /status.css.
    POST /v1/events        JSON events (docs/wire-format.md).
    POST /v1/labels        JSON ground-truth labels for earlier predictions.
    POST /v1/skew          JSON offline feature values for recent request IDs (docs/skew.md).
    POST /v1/traces        OTLP/HTTP traces, protobuf or JSON (docs/otlp-traces.md); when traces are enabled.
    ANY  /admin/<component>/<path>   component admin routes; Bearer token required.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Protocol
from urllib.parse import parse_qsl

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from inferwatch_sidecar.export import htmlsafe
from inferwatch_sidecar.metrics import protobuf as protobuf_exposition
from inferwatch_sidecar.metrics.protobuf import wants_protobuf

log = logging.getLogger("inferwatch.sidecar.http")

TEXT = "text/plain; charset=utf-8"
#: A component's admin handler: query parameters (and ``body`` for a POST) -> (status, content type, body).
AdminHandler = Callable[[dict[str, str]], tuple[int, str, bytes]]


class Headers(Protocol):
    """Request headers: ``get`` ignores the name's case (``email.message.Message`` does)."""

    def get(self, name: str, default: str, /) -> str: ...


@dataclass(frozen=True)
class Request:
    """One HTTP request, as the server hands it to a handler.

    Attributes:
        method: ``GET``, ``HEAD`` or ``POST``.
        path: the URL path, without the query.
        query: the raw query string.
        headers: request headers.
        body: the request body, read in full before the handler runs
            (empty when the route reads none, see :attr:`Route.max_body`).
    """

    method: str
    path: str
    query: str
    headers: Headers
    body: bytes = b""


@dataclass(frozen=True)
class Response:
    """What a handler answers; the server adds Content-Length and drops the body for HEAD."""

    status: int
    body: bytes
    content_type: str = TEXT
    headers: Mapping[str, str] = field(default_factory=dict)
    close: bool = False


Handler = Callable[[Request], Response]


@dataclass(frozen=True)
class Route:
    """A handler and the methods it answers (others get 404, as an unknown path does).

    Attributes:
        methods: the methods answered.
        handler: builds the response; runs on the server's handler threads
            unless ``inline``.
        max_body: the largest body read for the handler; a larger one is
            answered 413 and ``on_too_large`` is called. 0: the route reads no
            body (one sent anyway is not read, and the connection is closed).
        admit: runs before the body is read; a Response it returns is the
            answer (401, 404), sent without reading the body.
        on_too_large: counts a body refused for its length.
        inline: the handler is cheap and never blocks: it runs on the event
            loop, so it answers while every handler thread is busy.
        scrape: the handler runs on the server's scrape threads (``/metrics``): four
            OTLP or JSON bodies waiting to be decoded must not hold a scrape back.
        priority: entered from the moment the request is routed until its answer is written
            (export/priority.py: the sidecar's busy loops step aside meanwhile); None: not.
        ready: an answer made on the event loop when one is at hand without waiting (a body rendered
            ahead), tried before the handler; None (or its None) sends the request to the handler.
    """

    methods: frozenset[str]
    handler: Handler
    max_body: int = 0
    admit: Callable[[Request], Response | None] | None = None
    on_too_large: Callable[[], None] | None = None
    inline: bool = False
    #: runs on the server's scrape threads, never queued behind the handler threads' ingest bodies.
    scrape: bool = False
    priority: Callable[[], AbstractContextManager[Any]] | None = None
    ready: Callable[[Request], Response | None] | None = None


@dataclass(frozen=True, kw_only=True)
class Endpoints:
    """Everything the routes need from the sidecar, passed in at construction.

    Attributes:
        scrape: the ``Accept`` header -> (exposition body, content type); see :func:`scrape_registry`.
        ready: whether the daemon has started and is not shutting down.
        status: the JSON-able ``/v1/status`` document.
        ingest_json: (``"events"`` or ``"labels"``, body bytes) -> (HTTP status, JSON answer).
        reject_body: counts a JSON body refused for its length.
        admin_route: (component, path) -> its admin handler, or None.
        admin_index: admin paths by component.
        admin_token: the Bearer token for ``/admin/``; None disables those routes.
        max_body_bytes: the largest POST body read.
        ingest_traces: (body, Content-Type, Content-Encoding or None) -> (HTTP status, content type, body)
            for ``POST /v1/traces``; None leaves the route out.
        traces_max_body_bytes: the largest ``/v1/traces`` body read (before decompression).
    """

    scrape: Callable[[str], tuple[bytes, str]]
    ready: Callable[[], bool]
    status: Callable[[], Mapping[str, Any]]
    ingest_json: Callable[[str, bytes], tuple[int, Mapping[str, Any]]]
    reject_body: Callable[[], None]
    admin_route: Callable[[str, str], AdminHandler | None]
    admin_index: Callable[[], Mapping[str, list[str]]]
    admin_token: str | None
    max_body_bytes: int
    ingest_traces: Callable[[bytes, str, str | None], tuple[int, str, bytes]] | None = None
    traces_max_body_bytes: int = 0
    #: body bytes -> (HTTP status, JSON answer) for ``POST /v1/skew`` (offline values, docs/skew.md); None: 404.
    ingest_skew: Callable[[bytes], tuple[int, Mapping[str, Any]]] | None = None
    #: as ``scrape``, the body gzipped: answers a scrape whose ``Accept-Encoding`` takes gzip (as Prometheus's do);
    #: None: bodies are sent as they are.
    scrape_gzip: Callable[[str], tuple[bytes, str]] | None = None
    #: entered around each ``/metrics`` request, routing to written answer (:attr:`Route.priority`); None: not.
    scrape_priority: Callable[[], AbstractContextManager[Any]] | None = None
    #: (``Accept``, gzip) -> the body a scrape would take at once, or None; called on the server's event loop,
    #: so it never waits (:attr:`Route.ready`). None: every scrape goes to a scrape thread.
    scrape_ready: Callable[[str, bool], tuple[bytes, str] | None] | None = None


def scrape_registry(registry: Collector, accept: str, protobuf: bool = True) -> tuple[bytes, str]:
    """Render ``registry`` in the exposition format the ``Accept`` header asks for.

    The delimited protobuf exposition (native histograms, metrics/protobuf.py) when ``protobuf``
    and the header prefers it; otherwise prometheus_client's choice of OpenMetrics or text.
    """
    if protobuf and wants_protobuf(accept):
        return protobuf_exposition.encode(registry), protobuf_exposition.CONTENT_TYPE
    encoder, ctype = choose_encoder(accept)
    return encoder(registry), ctype


def json_response(status: int, obj: Any) -> Response:
    return Response(status, json.dumps(obj, indent=1, default=str).encode() + b"\n", "application/json")


def resolve(routes: Mapping[str, Route], method: str, path: str) -> Route | None:
    """The route for ``method path``: an exact key, else the longest ``<prefix>/*`` key that matches."""
    route = routes.get(path)
    if route is None:
        prefixes = [k[:-1] for k in routes if k.endswith("/*") and path.startswith(k[:-1])]
        route = routes[max(prefixes, key=len) + "*"] if prefixes else None
    if route is None or method not in route.methods:
        return None
    return route


_GET = frozenset({"GET", "HEAD"})
_POST = frozenset({"POST"})
_ANY = frozenset({"GET", "HEAD", "POST"})


#: The status page's files (package data): path -> (file, content type).
STATUS_FILES = {
    "/": ("status.html", "text/html; charset=utf-8"),
    "/status.js": ("status.js", "text/javascript; charset=utf-8"),
    "/status.css": ("status.css", "text/css; charset=utf-8"),
}
#: The page runs only its own same-origin script and style (no inline code at all) and fetches from this origin.
STATUS_PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def status_page(path: str = "/") -> Response:
    """``GET /`` (and its script and style): the status page shipped as package data, under a strict policy.

    The page holds no inline ``<script>`` or ``<style>``: its code and style are
    the same-origin files ``/status.js`` and ``/status.css``, so the
    Content-Security-Policy allows ``'self'`` only, and even a string from the
    traffic that reached the DOM unescaped could not run.
    """
    name, ctype = STATUS_FILES[path]
    body = resources.files("inferwatch_sidecar.export").joinpath("static/" + name).read_bytes()
    if name.endswith(".html") and re.search(rb"<script>|<style>|\sstyle=|\son[a-z]+=", body):
        raise ValueError("static/status.html: inline script or style would be blocked by its policy")
    headers = {"Content-Security-Policy": STATUS_PAGE_POLICY, "X-Content-Type-Options": "nosniff",
               "Cache-Control": "no-cache"}
    return Response(200, body, ctype, headers)


def _constant(resp: Response) -> Handler:
    """A handler that answers ``resp`` whatever the request (a status page file, read once at start)."""

    def handler(req: Request) -> Response:
        return resp

    return handler


def accepts_gzip(header: str) -> bool:
    """Whether an ``Accept-Encoding`` header takes gzip (RFC 9110 12.5.3: ``gzip``, ``x-gzip`` or ``*``, q above 0)."""
    star = False
    for item in header.split(","):
        coding, _, params = item.partition(";")
        coding = coding.strip().lower()
        q = 1.0
        for p in params.split(";"):
            k, _, v = p.partition("=")
            if k.strip().lower() == "q":
                try:
                    q = float(v.strip())
                except ValueError:
                    q = 0.0
        if coding in ("gzip", "x-gzip"):
            return q > 0
        if coding == "*":
            star = q > 0
    return star


def refuse_non_json(req: Request) -> Response | None:
    """415 for a JSON ingest body not sent as ``application/json``, else None.

    A web page can post ``text/plain`` (or a form) cross-origin without a preflight, so a sidecar on a
    developer's laptop would take events from any page they open; ``application/json`` it cannot send
    that way. Every JSON ingest route (``/v1/events``, ``/v1/labels``, ``/v1/skew``) goes through this.
    """
    ctype = req.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    if ctype == "application/json":
        return None
    return json_response(415, {"error": f"Content-Type {ctype or 'missing'!r} is not accepted; "
                                        "send application/json"})


def metrics_route(ep: Endpoints) -> Route:
    """``GET /metrics``: on a scrape thread, with the scrape priority, answered on the event loop when a body
    rendered ahead is at hand; gzipped for a scraper that takes it."""

    def metrics_answer(body: bytes, ctype: str, gz: bool) -> Response:
        if ep.scrape_gzip is None:
            return Response(200, body, ctype)
        headers = {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"} if gz else {"Vary": "Accept-Encoding"}
        return Response(200, body, ctype, headers)

    def metrics(req: Request) -> Response:
        gz = ep.scrape_gzip is not None and accepts_gzip(req.headers.get("Accept-Encoding", ""))
        try:
            scrape = ep.scrape_gzip if gz and ep.scrape_gzip is not None else ep.scrape
            body, ctype = scrape(req.headers.get("Accept", ""))
        except Exception as e:  # a broken family must not kill the endpoint silently
            log.exception("scrape failed")
            return Response(500, f"scrape failed: {e}\n".encode())
        return metrics_answer(body, ctype, gz)

    def metrics_ready(req: Request) -> Response | None:
        if ep.scrape_ready is None:
            return None
        gz = ep.scrape_gzip is not None and accepts_gzip(req.headers.get("Accept-Encoding", ""))
        got = ep.scrape_ready(req.headers.get("Accept", ""), gz)
        return None if got is None else metrics_answer(*got, gz)

    return Route(_GET, metrics, scrape=True, priority=ep.scrape_priority, ready=metrics_ready)


def sidecar_routes(ep: Endpoints) -> dict[str, Route]:
    """The sidecar's route table, path -> :class:`Route` (``/admin/*`` matches every path below it)."""

    def readyz(req: Request) -> Response:
        return Response(200, b"ready\n") if ep.ready() else Response(503, b"not ready\n")

    def post_json(ingest_body: Callable[[bytes], tuple[int, Mapping[str, Any]]]) -> Route:
        def ingest(req: Request) -> Response:
            refused = refuse_non_json(req)
            return refused if refused is not None else json_response(*ingest_body(req.body))

        return Route(_POST, ingest, max_body=ep.max_body_bytes, on_too_large=ep.reject_body)

    def admin_admit(req: Request) -> Response | None:
        if ep.admin_token is None:
            return Response(404, b"admin routes are disabled: set http.admin_token or INFERWATCH_ADMIN_TOKEN\n")
        scheme, _, cred = req.headers.get("Authorization", "").strip().partition(" ")
        # The scheme is case-insensitive (RFC 9110 11.1): "bearer x" is the same credential.
        if scheme.lower() != "bearer" or not hmac.compare_digest(cred.strip().encode(), ep.admin_token.encode()):
            return Response(401, b"missing or wrong bearer token\n", headers={"WWW-Authenticate": "Bearer"})
        return None

    def admin(req: Request) -> Response:
        parts = req.path.split("/", 3)  # ['', 'admin', component, rest]
        if len(parts) < 3 or not parts[2]:
            return json_response(200, {"routes": ep.admin_index()})
        handler = ep.admin_route(parts[2], parts[3] if len(parts) > 3 else "")
        if handler is None:
            return Response(404, b"no such admin route\n")
        query = dict(parse_qsl(req.query))
        if req.method == "POST" and req.body:
            query["body"] = req.body.decode("utf-8", "replace")
        try:
            status, ctype, out = handler(query)
        except Exception as e:
            return Response(500, f"admin route failed: {e}\n".encode())
        if ctype.startswith("text/html"):
            # Every HTML page served gets a policy that runs only its own inline scripts.
            try:
                return Response(status, out, ctype, htmlsafe.headers(htmlsafe.policy(out)))
            except htmlsafe.UnsafeHTML as e:
                return Response(500, f"admin route produced unsafe HTML: {e}\n".encode())
        return Response(status, out, ctype)

    pages = {path: status_page(path) for path in STATUS_FILES}
    routes = {
        "/metrics": metrics_route(ep),
        "/healthz": Route(_GET, lambda req: Response(200, b"ok\n"), inline=True),
        "/readyz": Route(_GET, readyz, inline=True),
        "/v1/status": Route(_GET, lambda req: json_response(200, ep.status())),
        "/v1/events": post_json(lambda body: ep.ingest_json("events", body)),
        "/v1/labels": post_json(lambda body: ep.ingest_json("labels", body)),
        "/admin/*": Route(_ANY, admin, max_body=ep.max_body_bytes, admit=admin_admit),
        **{path: Route(_GET, _constant(page), inline=True) for path, page in pages.items()},
    }
    ingest_skew = ep.ingest_skew
    if ingest_skew is not None:
        routes["/v1/skew"] = post_json(ingest_skew)
    ingest_traces = ep.ingest_traces
    if ingest_traces is not None:

        def traces(req: Request) -> Response:
            encoding = req.headers.get("Content-Encoding", "") or None
            status, ctype, body = ingest_traces(req.body, req.headers.get("Content-Type", ""), encoding)
            return Response(status, body, ctype)

        routes["/v1/traces"] = Route(_POST, traces, max_body=ep.traces_max_body_bytes, on_too_large=ep.reject_body)
    return routes

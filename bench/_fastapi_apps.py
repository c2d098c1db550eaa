"""The variants fastapi_overhead.py compares: one FastAPI app per variant, all served by one process.

``VARIANTS`` names each variant, the path it answers on and what it gives its user; ``build_server``
serves every variant from one process, dispatched by path (why: see fastapi_overhead.py's docstring).
The peers come from the ``bench`` extra: ``pip install -e ".[bench]"``.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any


@dataclasses.dataclass(frozen=True)
class Variant:
    """One variant: the path it answers on, what it gives the user, and whether the wall-clock rounds load it."""

    path: str
    gives: str
    loaded: bool = True


#: Every path has the same length, so the request bytes differ in content only.
VARIANTS = {
    "plain": Variant("/plain", "nothing (the reference)"),
    "inferwatch": Variant(
        "/instr",
        "metrics by model, version, stage and outcome; request and stage latency histograms with "
        "request-ID exemplars; X-Request-ID echoed; events for drift",
    ),
    "instrumentator": Variant(
        "/pfinx",
        "metrics by handler, method and status: request count, two latency histograms, request and "
        "response sizes; no exemplars, no request ID",
    ),
    "starlette-exporter": Variant(
        "/stexp",
        "metrics by method, path and status: request count, a latency histogram, requests in progress; "
        "exemplars only if configured (off by default), no request ID",
    ),
    "otel-api": Variant(
        "/otapi",
        "nothing recorded (no SDK): what the instrumentation costs before a provider is installed",
    ),
    "otel-sdk": Variant(
        "/otsdk",
        "traces: a server span and two send spans per request, with a trace ID (not echoed); no metrics "
        "without an SDK MeterProvider",
    ),
    "floor": Variant("/floor", "a measuring stick (see build_floor_app), counted by --instructions only", False),
}
#: What the benchmark's server serves besides the variants: the default registry, for the Prometheus peers.
METRICS_PATH = "/metrics"


def build_app(variant: str) -> Any:
    """One variant's FastAPI app (not ``floor``: see ``build_floor_app``)."""
    from fastapi import FastAPI

    app = FastAPI()
    path = VARIANTS[variant].path
    if variant == "inferwatch":
        import inferwatch

        inferwatch.configure(service="bench", model="m", model_version="v1")  # INFERWATCH_SIDECAR from env
        inferwatch.instrument_fastapi(app)

        @app.get(path)
        async def predict_instrumented() -> dict[str, bool]:
            with inferwatch.stage("inference"):
                pass
            return {"ok": True}

        return app
    if variant == "instrumentator":
        from prometheus_fastapi_instrumentator import Instrumentator

        Instrumentator().instrument(app)
    elif variant == "starlette-exporter":
        from starlette_exporter import PrometheusMiddleware

        app.add_middleware(PrometheusMiddleware)
    elif variant == "otel-api":
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        FastAPIInstrumentor.instrument_app(app)
    elif variant == "otel-sdk":
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        FastAPIInstrumentor.instrument_app(app, tracer_provider=otel_sdk_provider())
    elif variant != "plain":
        raise ValueError(f"unknown variant {variant!r}")

    @app.get(path)
    async def predict() -> dict[str, bool]:
        return {"ok": True}

    return app


def otel_sdk_provider() -> Any:
    """An SDK tracer provider whose BatchSpanProcessor hands every batch to an exporter that counts and discards.

    The count goes to ``bench_otel_exported_spans_total{kind}`` in the default registry,
    once per kind per batch, so the export thread's own cost stays the SDK's.
    """
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from prometheus_client import Counter

    exported = Counter(
        "bench_otel_exported_spans", "Spans the otel-sdk variant's exporter received (and discarded).", ["kind"]
    )

    class CountingExporter(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            for kind, n in collections.Counter(s.kind.name for s in spans).items():
                exported.labels(kind).inc(n)
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            return None

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(CountingExporter()))
    return provider


def build_floor_app() -> Any:
    """The least a pure-Python middleware and stage can do for what the SDK is asked to do.

    Not a product, a measuring stick for ``--instructions``. Per request it wraps
    ``send`` to echo an ``X-Request-ID`` header and read the status, takes an ID
    from a C-level counter, sets and resets a contextvar, reads the clock twice
    and appends one tuple to a bounded deque; its stage reads the clock twice
    and appends one tuple to the request. It leaves out everything else the SDK
    does: incoming ID headers, validation, the ingress stage, ``scope["state"]``,
    5xx and exception outcomes, never raising into the app, and above all
    encoding and sending the events (nothing ever reads the deque).
    """

    import contextvars
    import itertools

    from fastapi import FastAPI

    current: contextvars.ContextVar[Any] = contextvars.ContextVar("floor_request", default=None)
    ids = map("0123456789ab-%x".__mod__, itertools.count(1))
    events: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=10_000)
    clock = time.perf_counter_ns

    class Request:
        __slots__ = ("asgi_send", "rid", "status", "stages")

        def send(self, message: Any) -> Any:
            if message["type"] == "http.response.start":
                self.status = message["status"]
                message["headers"].append((b"x-request-id", self.rid.encode()))
            return self.asgi_send(message)

    class Middleware:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            t0 = clock()
            req = Request()
            req.asgi_send, req.rid, req.status, req.stages = send, next(ids), 0, []
            token = current.set(req)
            try:
                await self.app(scope, receive, req.send)
            finally:
                current.reset(token)
            events.append((t0, clock() - t0, req.rid, req.status, req.stages))

    class stage:
        __slots__ = ("name", "t0")

        def __init__(self, name: str) -> None:
            self.name = name

        def __enter__(self) -> None:
            self.t0 = clock()

        def __exit__(self, *exc: object) -> None:
            req = current.get()
            if req is not None:
                req.stages.append((self.name, clock() - self.t0))

    app = FastAPI()
    app.add_middleware(Middleware)

    @app.get(VARIANTS["floor"].path)
    async def predict_floor() -> dict[str, bool]:
        with stage("inference"):
            pass
        return {"ok": True}

    return app



def build_server(variants: tuple[str, ...] = tuple(VARIANTS)) -> Any:
    """Every variant in one process, dispatched by path, plus the default registry at ``METRICS_PATH``.

    Comparing variants in the same process cancels the per-process speed bias (see the
    module docstring). The dispatcher returns the chosen app's coroutine, so it adds no
    await layer, and its one dict lookup costs every variant the same.
    """
    from prometheus_client import make_asgi_app

    apps = {VARIANTS[v].path: build_floor_app() if v == "floor" else build_app(v) for v in variants}
    apps[METRICS_PATH] = make_asgi_app()
    plain = apps[VARIANTS["plain"].path]
    route = apps.get

    def app(scope: Any, receive: Any, send: Any) -> Any:
        return route(scope.get("path"), plain)(scope, receive, send)

    return app


def serve(port: int, variants: tuple[str, ...]) -> None:
    import uvicorn

    # interface="asgi3": the dispatcher is a plain function returning a coroutine, which
    # uvicorn would otherwise take for an ASGI2 app.
    uvicorn.run(
        build_server(variants), host="127.0.0.1", port=port, log_level="warning", access_log=False,
        lifespan="off", interface="asgi3",
    )

"""Issue 28: /metrics runs on its own threads, so ingest bodies that hold every handler thread never delay it.

Under the soak's hostile mix the four handler threads were often all busy with OTLP and JSON bodies
(a large one waits its turn to be decoded), and a scrape queued behind them: p50 about 1 s while
rendering took a few hundred ms. The route table marks /metrics ``scrape=True``; the server runs
such routes on a pool of their own.
"""

from __future__ import annotations

import socket
import threading
import time

from inferwatch_sidecar.config import HttpConfig
from inferwatch_sidecar.http.routes import Request, Response, Route, sidecar_routes
from inferwatch_sidecar.http.server import HANDLER_THREADS, HttpServer
from tests.http.test_http_hardening import _GET, _POST, exchange, statuses


def test_metrics_answers_while_every_handler_thread_holds_an_ingest_body() -> None:
    gate = threading.Event()
    entered = threading.Semaphore(0)

    def slow_ingest(req: Request) -> Response:
        entered.release()
        gate.wait(15)
        return Response(200, b"ok\n")

    routes = {
        "/metrics": Route(_GET, lambda req: Response(200, b"# metrics\n"), scrape=True),
        "/v1/events": Route(_POST, slow_ingest, max_body=1024),
    }
    srv = HttpServer(routes, HttpConfig(port=0))
    srv.start()
    posts = []
    try:
        for _ in range(HANDLER_THREADS + 2):  # every handler thread busy, two more queued
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall(b"POST /v1/events HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 2\r\n\r\n{}")
            posts.append(s)
        for _ in range(HANDLER_THREADS):
            assert entered.acquire(timeout=10)
        t0 = time.monotonic()
        out, _ = exchange(srv.port, b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
                          timeout=10)
        # Queued behind the handler pool it would wait for the gate (15 s) and time out.
        assert statuses(out) == [200] and time.monotonic() - t0 < 5.0
    finally:
        gate.set()
        for s in posts:
            s.close()
        srv.stop(2.0)


def test_the_sidecar_marks_metrics_as_its_scrape_route() -> None:
    from inferwatch_sidecar.http.routes import Endpoints

    routes = sidecar_routes(Endpoints(
        scrape=lambda a: (b"", "text/plain"), ready=lambda: True, status=dict, ingest_json=lambda k, b: (200, {}),
        reject_body=lambda: None, admin_route=lambda c, p: None, admin_index=dict, admin_token=None,
        max_body_bytes=1 << 20, ingest_traces=lambda b, c, e: (200, "application/json", b"{}"),
        traces_max_body_bytes=1 << 20))
    assert [p for p, r in routes.items() if r.scrape] == ["/metrics"]


def test_a_route_with_a_priority_holds_it_from_routing_until_its_answer_is_written() -> None:
    """/metrics holds the scrape priority (export/priority.py) for the whole request; other routes never do."""
    from inferwatch_sidecar.export.priority import ScrapePriority

    prio = ScrapePriority()
    seen: dict[str, int] = {}

    def handler(name: str) -> Route:
        def h(req: Request) -> Response:
            seen[name] = prio.active
            return Response(200, b"x" * 300_000)

        return Route(_GET, h, scrape=name == "metrics", priority=prio.request if name == "metrics" else None)

    srv = HttpServer({"/metrics": handler("metrics"), "/v1/status": handler("status")}, HttpConfig(port=0))
    srv.start()
    try:
        for path in ("/metrics", "/v1/status"):
            out, _ = exchange(srv.port, f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
                              .encode(), timeout=10)
            assert statuses(out) == [200] and len(out) > 300_000
        assert seen == {"metrics": 1, "status": 0}
        assert prio.active == 0  # released once the answer was written
    finally:
        srv.stop(2.0)


def test_the_sidecar_gives_metrics_the_scrape_priority() -> None:
    from inferwatch_sidecar.config import load_config
    from inferwatch_sidecar.daemon import Sidecar
    from inferwatch_sidecar.export.priority import PRIORITY

    s = Sidecar(load_config(environ={}, overrides={"gpu": {"enabled": False}, "http": {"port": 0}}), environ={})
    routes = s._routes()
    assert routes["/metrics"].priority == PRIORITY.request
    assert [p for p, r in routes.items() if r.priority is not None] == ["/metrics"]

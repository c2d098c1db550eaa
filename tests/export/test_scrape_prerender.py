"""Issue 28: /metrics is rendered off the request path, so a scrape under ingest never waits for a render.

A render here is made slow on purpose (a collector that sleeps), standing for the 3 MB exposition
of the hostile soak on two busy cores. While events keep arriving, a scrape answers at once with
the render made ahead of it; without ingest under way it waits for a render that started after it
arrived, so what was ingested before a scrape is in it.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.metrics_core import GaugeMetricFamily

from inferwatch_sidecar.config import load_config
from inferwatch_sidecar.daemon import Sidecar
from inferwatch_sidecar.export.prerender import ScrapeRenderer
from inferwatch_sidecar.http.routes import Request, Response, accepts_gzip
from tests.helpers.sidecar import parse_metrics

RENDER_S = 0.8


class _Slow:
    """A collector whose collect takes RENDER_S (a render's cost under load)."""

    def __init__(self) -> None:
        self.delay = 0.0

    def collect(self) -> Iterator[Any]:
        time.sleep(self.delay)
        yield GaugeMetricFamily("test_slow_render", "a collector that takes its time", value=1.0)

    def describe(self) -> list[Any]:
        return []


@pytest.fixture
def slow_sidecar(tmp_path: Any) -> Iterator[tuple[Sidecar, _Slow]]:
    s = Sidecar(load_config(environ={}, overrides={
        "gpu": {"enabled": False}, "drift": {"enabled": False}, "tail": {"enabled": False},
        "http": {"port": 0, "metrics_wait_s": 0.05}, "ingest": {"socket": str(tmp_path / "s.sock")},
    }), environ={})
    slow = _Slow()
    s.registry.register(slow)  # type: ignore[arg-type]
    s.startup()
    try:
        yield s, slow
    finally:
        s.shutdown()


def _scrape(s: Sidecar) -> tuple[float, float]:
    """(seconds the scrape took, inferwatch_requests_total in its body)."""
    assert s.http is not None
    t0 = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{s.http.port}/metrics", timeout=30) as r:
        body = r.read().decode()
    took = time.monotonic() - t0
    n = sum(v for (name, _), v in parse_metrics(body).items() if name == "inferwatch_requests_total")
    return took, n


def _events(n: int) -> bytes:
    return json.dumps({"events": [{"type": "request", "duration_s": 0.01}] * n}).encode()


def test_a_scrape_under_ingest_takes_the_last_render_instead_of_waiting(slow_sidecar: Any) -> None:
    s, slow = slow_sidecar
    s.json_ingest.post("events", _events(5))
    slow.delay = RENDER_S
    stop = threading.Event()

    def ingest() -> None:
        while not stop.is_set():
            s.json_ingest.post("events", _events(1))
            time.sleep(0.005)

    feeder = threading.Thread(target=ingest, daemon=True)
    feeder.start()
    try:
        took, first = _scrape(s)  # the first scrape of a format has no render to fall back on: it waits
        assert took >= RENDER_S * 0.9 and first >= 5
        seen = [first]
        times = []
        for _ in range(12):  # 2 s: renders of RENDER_S made ahead of the scrapes land meanwhile
            took, n = _scrape(s)
            times.append(took)
            seen.append(n)
            time.sleep(0.15)
    finally:
        stop.set()
        feeder.join(5)
    # Rendering on the request path, every scrape took at least RENDER_S.
    assert max(times) < RENDER_S / 2, times
    assert seen == sorted(seen) and seen[-1] > first, seen  # a little old, never going back, and moving
    assert s.scrapes.ahead >= 12 and s.scrapes.renders_ahead >= 1


def test_without_ingest_a_scrape_waits_for_a_render_that_includes_what_came_before(slow_sidecar: Any) -> None:
    s, slow = slow_sidecar
    s.json_ingest.post("events", _events(3))
    assert _scrape(s)[1] == 3
    slow.delay = RENDER_S
    s.json_ingest.post("events", _events(4))
    took, n = _scrape(s)  # the render takes longer than metrics_wait_s, but nothing arrives meanwhile
    assert n == 7 and took >= RENDER_S * 0.9
    st = s.status()["scrape"]
    assert st["ahead"] == 0 and st["fresh"] == 2


def test_renderer_errors_reach_the_scrape_and_the_thread_survives() -> None:
    calls: list[str] = []

    def render(accept: str) -> tuple[bytes, str]:
        calls.append(accept)
        if accept == "boom":
            raise ValueError("broken family")
        return accept.encode(), "text/plain"

    r = ScrapeRenderer(render, key=lambda a: a, activity=lambda: 0, wait_s=0.01)
    try:
        with pytest.raises(ValueError, match="broken family"):
            r.scrape("boom")
        assert r.scrape("ok") == (b"ok", "text/plain")
        assert r.scrape("ok") == (b"ok", "text/plain")  # a fresh render each time: nothing arrived between
        assert calls == ["boom", "ok", "ok"]
    finally:
        r.stop()
    assert r.scrape("after") == (b"after", "text/plain")  # stopped: rendered on the caller's thread


def test_formats_are_rendered_and_kept_apart() -> None:
    r = ScrapeRenderer(lambda a: (a.encode(), "ct/" + a.split(";")[0]), key=lambda a: a.split(";")[0],
                       activity=lambda: 0,
                       wait_s=0.01)
    try:
        out = {}
        threads = [threading.Thread(target=lambda a=a: out.__setitem__(a, r.scrape(a))) for a in ("x", "y", "x;q=1")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert out["y"] == (b"y", "ct/y") and out["x"][1] == "ct/x" and out["x;q=1"][1] == "ct/x"
    finally:
        r.stop()


def test_bodies_are_rendered_ahead_of_regular_scrapes_and_never_too_old() -> None:
    ticks = iter(range(10**9))
    renders: list[float] = []

    def render(accept: str) -> tuple[bytes, str]:
        renders.append(time.monotonic())
        time.sleep(0.05)
        return str(len(renders)).encode(), "text/plain"

    r = ScrapeRenderer(render, key=lambda a: a, activity=lambda: next(ticks), wait_s=0.01, max_age_s=5.0)
    try:
        took, bodies = [], []
        for _ in range(8):  # every 0.3 s, events arriving all along
            t0 = time.monotonic()
            bodies.append(int(r.scrape("")[0]))
            took.append(time.monotonic() - t0)
            time.sleep(0.3)
        assert r.renders_ahead >= 5 and r.ahead >= 5, (r.renders_ahead, r.ahead)
        assert max(took[2:]) < 0.04, took  # the body was there: no render waited for
        assert bodies == sorted(bodies) and bodies[-1] >= 6, bodies
        time.sleep(1.2)  # scrapes stopped for more than 3 intervals: nothing more is rendered ahead
        n = len(renders)
        time.sleep(0.7)
        assert len(renders) == n
    finally:
        r.stop()
    old = ScrapeRenderer(render, key=lambda a: a, activity=lambda: next(ticks), wait_s=0.01, max_age_s=0.001)
    try:
        old.scrape("")
        time.sleep(0.01)
        old.scrape("")  # events arrive, but the last body is older than max_age_s: a fresh one is waited for
        assert old.fresh == 2 and old.ahead == 0
    finally:
        old.stop()


def test_a_body_made_ahead_while_busy_is_taken_even_if_ingest_stalls_during_the_scrape() -> None:
    """A starved ingest thread shows no event for a while; the body made ahead while events arrived still serves."""
    act = [0]

    def render(accept: str) -> tuple[bytes, str]:
        time.sleep(0.03)
        return str(act[0]).encode(), "text/plain"

    r = ScrapeRenderer(render, key=lambda a: a, activity=lambda: act[0], wait_s=0.15, max_age_s=5.0)
    try:
        took = []
        start = time.monotonic()
        for k in range(8):  # a scrape every 0.5 s, as Prometheus keeps its interval
            act[0] += 1  # events arrive between scrapes, none while a scrape looks
            time.sleep(max(0.0, start + 0.5 * (k + 1) - time.monotonic()))
            t0 = time.monotonic()
            body = int(r.scrape("")[0])
            took.append(time.monotonic() - t0)
        assert r.ahead >= 4 and max(took[3:]) < 0.1, (r.ahead, took)
        assert body == act[0]  # made after the last events: counters a render old at most
    finally:
        r.stop()


def test_gzipped_bodies_are_the_render_compressed_and_made_on_the_render_thread() -> None:
    """A scraper that takes gzip gets the render gzipped; renders ahead of its scrapes are compressed by the thread."""
    ticks = iter(range(10**9))
    threads: list[str] = []
    body = b"inferwatch_requests_total 1\n" * 2000

    def render(accept: str) -> tuple[bytes, str]:
        return body, "text/plain"

    import inferwatch_sidecar.export.prerender as pre

    real = pre.gzip_body

    def spy(b: bytes) -> bytes:
        threads.append(threading.current_thread().name)
        return real(b)

    r = ScrapeRenderer(render, key=lambda a: a, activity=lambda: next(ticks), wait_s=0.01, max_age_s=5.0)
    pre.gzip_body = spy  # type: ignore[assignment]
    try:
        gz, ctype = r.scrape("", gzip=True)
        assert gz[:2] == b"\x1f\x8b" and zlib.decompress(gz, wbits=31) == body and ctype == "text/plain"
        assert len(gz) < len(body) / 20
        assert r.scrape("") == (body, "text/plain")  # the same format, asked without gzip
        for _ in range(6):  # regular gzip scrapes while events arrive: the thread compresses ahead of them
            assert zlib.decompress(r.scrape("", gzip=True)[0], wbits=31) == body
            time.sleep(0.1)
        assert r.renders_ahead >= 3 and "inferwatch-metrics-render" in threads, threads
    finally:
        pre.gzip_body = real  # type: ignore[assignment]
        r.stop()
    assert zlib.decompress(r.scrape("", gzip=True)[0], wbits=31) == body  # stopped: compressed on the caller's thread


@pytest.mark.parametrize(("header", "takes"), [
    ("gzip", True), ("GZIP", True), ("x-gzip", True), ("deflate, gzip;q=0.5", True), ("*", True),
    ("gzip, deflate, br", True), ("", False), ("identity", False), ("deflate", False), ("gzip;q=0", False),
    ("gzip;q=0.000", False), ("*;q=0", False), ("*, gzip;q=0", False), ("gzip;q=bogus", False), ("br, *;q=0.1", True),
])
def test_accept_encoding_is_read_as_rfc_9110_says(header: str, takes: bool) -> None:
    assert accepts_gzip(header) is takes


def test_a_served_scrape_is_gzipped_only_when_asked(slow_sidecar: Any) -> None:
    s, _ = slow_sidecar
    s.json_ingest.post("events", _events(3))
    assert s.http is not None
    url = f"http://127.0.0.1:{s.http.port}/metrics"
    bodies = {}
    for enc in ("gzip", "identity"):
        req = urllib.request.Request(url, headers={"Accept-Encoding": enc})
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            assert r.headers["Vary"] == "Accept-Encoding"
            assert int(r.headers["Content-Length"]) == len(raw)
            if enc == "gzip":
                assert r.headers["Content-Encoding"] == "gzip"
                raw = zlib.decompress(raw, wbits=31)
            else:
                assert r.headers["Content-Encoding"] is None
        bodies[enc] = raw.decode()
    for text in bodies.values():
        assert sum(v for (name, _), v in parse_metrics(text).items() if name == "inferwatch_requests_total") == 3
        assert "test_slow_render 1.0" in text


def test_a_scrape_takes_the_recent_body_while_ingest_is_held_back_for_it() -> None:
    """Ingest stepping aside for a scrape moves no byte count; ``held`` is what shows the events are arriving."""
    renders = []
    held = [False]

    def render(accept: str) -> tuple[bytes, str]:
        renders.append(accept)
        time.sleep(0.2)
        return str(len(renders)).encode(), "text/plain"

    r = ScrapeRenderer(render, key=lambda a: a, activity=lambda: 0, wait_s=0.05, max_age_s=5.0,
                       held=lambda: held[0])
    try:
        assert r.scrape("") == (b"1", "text/plain")
        assert r.scrape("") == (b"2", "text/plain")  # nothing arriving, nothing held: a fresh render
        held[0] = True
        t0 = time.monotonic()
        assert r.scrape("") == (b"2", "text/plain")  # ingest held back: the recent body, no render waited for
        assert time.monotonic() - t0 < 0.15 and r.ahead == 1 and len(renders) == 2
    finally:
        r.stop()


def test_ready_answers_only_what_scrape_would_take_at_once() -> None:
    """``ready`` (called on the HTTP event loop) never waits, renders or compresses: None sends the scrape on."""
    ticks = iter(range(10**9))
    renders = []

    def render(accept: str) -> tuple[bytes, str]:
        renders.append(accept)
        return f"body {len(renders)}".encode(), "text/plain"

    r = ScrapeRenderer(render, key=lambda a: a, activity=lambda: next(ticks), wait_s=0.01, max_age_s=5.0)
    try:
        assert r.ready("") is None  # nothing rendered yet
        assert r.scrape("") == (b"body 1", "text/plain")
        assert r.ready("") is None  # one scrape: no interval known, no render made ahead
        time.sleep(0.3)
        r.scrape("")
        deadline = time.monotonic() + 5
        while r.renders_ahead == 0 and time.monotonic() < deadline:  # made ahead of the scrape due in ~0.3 s
            time.sleep(0.01)
        time.sleep(0.05)
        n = len(renders)
        ahead = r.ahead
        got = r.ready("")
        assert got == (f"body {n}".encode(), "text/plain") and r.ahead == ahead + 1 and len(renders) == n
        assert r.ready("", gzip=True) is None  # not compressed yet: the scrape thread does it
        assert r.ready("other") is None  # a format never scraped
    finally:
        r.stop()
    assert r.ready("") is None  # stopped


def test_a_route_answered_when_ready_never_reaches_its_handler() -> None:
    calls = []
    answer: list[Response | None] = [Response(200, b"ready\n")]

    def handler(req: Request) -> Response:
        calls.append(req.path)
        return Response(200, b"handler\n")

    def ready(req: Request) -> Response | None:
        if answer[0] is None:
            raise RuntimeError("a bug on the event loop")
        return answer[0]

    from inferwatch_sidecar.config import HttpConfig
    from inferwatch_sidecar.http.routes import Route
    from inferwatch_sidecar.http.server import HttpServer
    from tests.http.test_http_hardening import exchange, statuses

    srv = HttpServer({"/metrics": Route(frozenset({"GET"}), handler, scrape=True, ready=ready)}, HttpConfig(port=0))
    srv.start()
    try:
        get = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        out, _ = exchange(srv.port, get, timeout=10)
        assert statuses(out) == [200] and out.endswith(b"ready\n") and calls == []
        answer[0] = None  # ready fails: the handler answers
        out, _ = exchange(srv.port, get, timeout=10)
        assert statuses(out) == [200] and out.endswith(b"handler\n") and calls == ["/metrics"]
    finally:
        srv.stop(2.0)

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
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.metrics_core import GaugeMetricFamily

from inferwatch_sidecar.config import load_config
from inferwatch_sidecar.daemon import Sidecar
from inferwatch_sidecar.export.prerender import ScrapeRenderer
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

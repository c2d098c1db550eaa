"""Issue 28: the whole exposition has a series budget at collection, and the scrape goes first."""

from __future__ import annotations

import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

from inferwatch_sidecar.config import load_config
from inferwatch_sidecar.daemon import Sidecar
from inferwatch_sidecar.export.budget import ExpositionBudget
from inferwatch_sidecar.export.priority import ScrapePriority
from tests.helpers.sidecar import parse_metrics, sample


class Wide:
    """Families whose size the traffic decides (as drift's per-bin families do)."""

    def __init__(self, gauges: int, hists: int) -> None:
        self.gauges, self.hists = gauges, hists

    def collect(self) -> Any:
        g = GaugeMetricFamily("wide_bins", "bins", labels=["feature", "bin"])
        for i in range(self.gauges):
            g.add_metric([f"f{i // 20}", str(i % 20)], i)
        yield g
        h = HistogramMetricFamily("wide_seconds", "h", labels=["feature"])
        for i in range(self.hists):
            h.add_metric([f"f{i}"], [("0.1", 1), ("1", 2), ("+Inf", 3)], 1.5)
        yield h


def test_families_are_cut_at_whole_label_sets_and_counted() -> None:
    reg = CollectorRegistry()
    reg.register(Wide(30_000, 4000))  # type: ignore[arg-type]
    view = ExpositionBudget(reg, max_series=12_000, max_family_series=5000)
    text = generate_latest(view).decode()  # type: ignore[arg-type]
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    bins = [ln for ln in lines if ln.startswith("wide_bins")]
    assert len(bins) == 5000
    hist = [ln for ln in lines if ln.startswith("wide_seconds")]
    # 4000 histograms of 5 samples (3 buckets, sum, count): 1000 fit in the family budget, each whole.
    assert len(hist) == 5000 and len(lines) <= 12_000
    m = parse_metrics(text)
    for i in range(1000):
        assert sample(m, "wide_seconds_count", feature=f"f{i}") == 3
    assert view.overflow.overflowed == 2 and view.last_dropped == 30_000 - 5000 + 20_000 - 5000
    # Families that fit pass through untouched.
    small = CollectorRegistry()
    small.register(Wide(100, 10))  # type: ignore[arg-type]
    v2 = ExpositionBudget(small, 12_000, 5000)
    assert generate_latest(v2) == generate_latest(small) and v2.overflow.overflowed == 0  # type: ignore[arg-type]


def test_the_sidecar_scrape_goes_through_the_budget_and_counts_it() -> None:
    s = Sidecar(load_config(environ={}, overrides={"gpu": {"enabled": False}, "drift": {"enabled": False},
                                                  "labels": {"max_family_series": 500}}))
    s.registry.register(Wide(3000, 0))  # type: ignore[arg-type]
    body, _ = s._scrape("")
    assert sum(1 for ln in body.decode().splitlines() if ln.startswith("wide_bins")) == 500
    m = parse_metrics(generate_latest(s.exposition).decode())  # type: ignore[arg-type]
    assert sample(m, "inferwatch_label_overflow_total", label="exposition") >= 1


def test_pause_waits_for_the_scrape_and_only_then() -> None:
    p = ScrapePriority()
    p.pause(5)  # no scrape: returns at once
    done = threading.Event()
    with p:
        t = threading.Thread(target=lambda: (p.pause(5), done.set()))
        t.start()
        assert not done.wait(0.1)  # held while the scrape renders
    assert done.wait(5)
    t.join()
    with p:
        p.pause(0.01)  # bounded: a stream of scrapes cannot stop ingest
    assert p.paused_s > 0.1


def test_the_collector_waits_while_a_scrape_is_answered_and_only_if_it_was_on() -> None:
    import gc

    p = ScrapePriority()
    assert gc.isenabled()
    try:
        with p:
            assert not gc.isenabled()
            with p:  # a second scrape at once
                assert not gc.isenabled()
            assert not gc.isenabled()  # the first is still answered
        assert gc.isenabled()
        gc.disable()  # someone else turned it off: the scrape leaves it off
        with p:
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_an_ingest_loop_stepping_aside_counts_as_events_arriving() -> None:
    """A scrape holding the priority looks for arriving events (export/prerender.py); ingest held back by it
    must still show, or the scrape takes an idle sidecar's path and waits for a whole fresh render."""
    p = ScrapePriority()
    p.pause(1, ingest=True)  # no scrape: nothing waited, nothing counted
    assert p.ingest_waits == 0
    with p:
        p.pause(0.001)  # a worker pass: not an event
        assert p.ingest_waits == 0
        p.pause(0.001, ingest=True)
        assert p.ingest_waits == 1 and p.ingest_held == 0
        held = []
        t = threading.Thread(target=lambda: p.pause(5, ingest=True))
        t.start()
        deadline = time.monotonic() + 5
        while not p.ingest_held and time.monotonic() < deadline:
            time.sleep(0.001)
        held.append(p.ingest_held)
    t.join(5)
    assert held == [1] and p.ingest_held == 0 and p.ingest_waits == 2


def test_scrape_requests_get_the_priority_at_most_grants_per_s_a_second() -> None:
    """A client that sends GET /metrics in a loop cannot keep ingest paused: past the grants it gets none."""
    from inferwatch_sidecar.export.priority import GRANTS_PER_S

    now = [100.0]
    p = ScrapePriority(clock=lambda: now[0])
    got = [p.request() is p for _ in range(int(GRANTS_PER_S) + 3)]
    assert got == [True] * int(GRANTS_PER_S) + [False] * 3 and p.denied == 3
    with p.request():  # a denied grant is a no-op context: nothing is held
        assert p.active == 0
    now[0] += 1.0 / GRANTS_PER_S  # one grant back per 1 / GRANTS_PER_S seconds
    held = p.request()
    assert held is p and p.request() is not p
    with held:
        assert p.active == 1
    assert p.active == 0
    now[0] += 60.0  # refilled up to the burst, no further
    assert sum(p.request() is p for _ in range(int(GRANTS_PER_S) + 5)) == int(GRANTS_PER_S)


def test_a_drift_snapshot_keeps_only_what_the_family_budget_shows_and_the_scrape_is_the_same() -> None:
    """Issue 28's soak: 16 versions x 64 categorical features made a drift snapshot of 68k bin samples (14 MiB)
    that the per-family budget cut to 5,000 at every scrape. Built within the budget, it gives the same body."""
    import random

    from inferwatch_sidecar.components.drift.component import build as build_drift
    from inferwatch_sidecar.components.drift.config import DriftConfig
    from tests.components.drift.helpers import context, rec, schema

    sch = schema((), tuple(f"c{j}" for j in range(64)), sid=5)
    rng = random.Random(7)
    recs = [rec("m", f"v{i % 16}", sch, cats=tuple(f"{j}-{rng.randrange(60)}" for j in range(64)))
            for i in range(16 * 150)]
    bodies, rows, views = [], [], []
    for budget in (None, 500):
        ctx = context()
        ctx.max_family_series = budget
        comp = build_drift(DriftConfig(warmup_events=100, window_events=200), ctx)
        for i in range(0, len(recs), 100):  # frame by frame, drained as the stage's wake would
            comp.handle(1, 1, recs[i:i + 100])
            comp.drain()
        assert comp.dropped["staging_full"] == 0
        comp.evaluate()
        rows.append(max(len(v) for v in comp._snapshot._rows.values()))
        reg = CollectorRegistry()
        reg.register(comp)  # type: ignore[arg-type]
        view = ExpositionBudget(reg, max_series=40_000, max_family_series=500)
        body = generate_latest(view)  # type: ignore[arg-type]
        bodies.append(b"\n".join(ln for ln in body.splitlines() if b"evaluation_duration_seconds " not in ln))
        views.append(view)
    assert rows[0] > 10_000 and rows[1] == 501  # 16 x 64 x 33 bins before; one over the budget after
    assert bodies[0] == bodies[1] and bodies[1].count(b"inferwatch_drift_bin_events_total{") == 500
    assert views[0].last_dropped == views[1].last_dropped > 20_000
    assert views[0].overflow.overflowed == views[1].overflow.overflowed > 0

"""Goodput against per-model objectives: exact good/bad counts from REQUEST events with streamed stages."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pydantic import ValidationError

from inferwatch.wire import EV_REQUEST, OUTCOME_CANCELLED, OUTCOME_ERROR, OUTCOME_OK, OUTCOME_SHED
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.capacity.component import build
from inferwatch_sidecar.components.capacity.config import CapacityConfig


def ev(model: str, outcome: int, dur_s: float, ttft_s: float | None, gap_ms: float) -> tuple[object, ...]:
    stages = [("decode", int(dur_s * 1e9), None if ttft_s is None else (int(ttft_s * 1e9), 5, [int(gap_ms * 1e3)] * 4))]
    return (EV_REQUEST, ("svc", model, "v1"), 10**18, int(dur_s * 1e9), outcome, None, None, None, stages)


def test_goodput_counts_every_objective() -> None:
    cfg = CapacityConfig(slo=[{"model": "m", "ttft_seconds": 0.5, "itl_seconds": 0.05, "e2e_seconds": 2.0,
                               "objective": 0.95}])
    comp = build(cfg, ComponentContext())
    rng = random.Random(3)
    batch, good = [], 0
    for _ in range(500):
        outcome = rng.choice([OUTCOME_OK] * 6 + [OUTCOME_ERROR, OUTCOME_SHED, OUTCOME_CANCELLED])
        dur, ttft, gap = rng.uniform(0.1, 3.0), rng.choice([None, rng.uniform(0.05, 1.0)]), rng.uniform(5, 80)
        batch.append(ev("m", outcome, dur, ttft, gap))
        batch.append(ev("other", OUTCOME_OK, 9.0, None, 0))  # no objective for this model: not counted
        if outcome == OUTCOME_OK and dur <= 2.0 and (ttft is None or (ttft <= 0.5 and gap <= 50)):
            good += 1
    cancelled = sum(1 for e in batch if e[4] == OUTCOME_CANCELLED)
    comp.absorb(batch, 0.0)
    comp.evaluate(now=100.0)
    fams = {f.name: f for f in comp.collect()}
    req = {s.labels["result"]: s.value for s in fams["inferwatch_slo_requests"].samples if s.name.endswith("_total")}
    assert req == {"good": good, "bad": 500 - cancelled - good}
    (ratio,) = fams["inferwatch_slo_goodput_ratio"].samples
    assert ratio.value == pytest.approx(good / (500 - cancelled)) and ratio.labels["model"] == "m"
    (obj,) = fams["inferwatch_slo_objective_ratio"].samples
    assert obj.value == 0.95


def test_an_objective_needs_a_threshold_and_models_are_unique() -> None:
    with pytest.raises(ValidationError, match="at least one of"):
        CapacityConfig(slo=[{"model": "m"}])
    with pytest.raises(ValidationError, match="more than one objective"):
        CapacityConfig(slo=[{"model": "m", "e2e_seconds": 1}, {"model": "m", "ttft_seconds": 1}])


def test_cold_start_per_new_process() -> None:
    from inferwatch.wire import EV_HELLO

    comp = build(CapacityConfig(), ComponentContext())
    start = 10**18
    hello = (EV_HELLO, "0.1.0", "python", "host", start)
    # the process serves its first request 30 s after it started; the first 10 take 1 s, later ones 0.1 s
    t = start + 30 * 10**9
    reqs: list[tuple[Any, ...]] = []
    for i in range(300):
        dur = 10**9 if i < 10 else 10**8
        t += dur
        reqs.append((EV_REQUEST, ("svc", "m", "v1"), t, dur, OUTCOME_OK, None, None, None, []))
    comp.handle(7, 1, [hello, *reqs[:5]])
    comp.handle(7, 1, reqs[5:])
    comp.handle(8, 1, [hello])  # a second process that has not served yet changes nothing
    comp.evaluate(now=t / 1e9)
    fams = {f.name: f for f in comp.collect()}
    (ttf,) = fams["inferwatch_capacity_cold_start_seconds"].samples
    (ratio,) = fams["inferwatch_capacity_cold_latency_ratio"].samples
    assert ttf.value == pytest.approx(30.0) and ratio.value == pytest.approx(10.0)
    assert comp.cold.producers[(7, 1)].done


def test_a_version_at_its_knee_is_a_bad_now_row_of_the_status_summary_at_the_alerts_threshold() -> None:
    from alerts import source
    from inferwatch_sidecar.components.capacity.component import HEADROOM_LOW, headroom_verdicts
    from inferwatch_sidecar.export.summary import verdicts

    alert = next(a for a in source.ALERTS if a.name == "InferwatchCapacityHeadroomLow")
    assert {t.name: t.value for t in alert.thresholds}["headroom"] == HEADROOM_LOW
    report = {"svc/m/v1": {"in_flight": 19.0, "knee": 20.0, "headroom": 0.05},
              "svc/m/v2": {"in_flight": 10.0, "knee": 20.0, "headroom": 0.5},
              "svc/m/v3": {"in_flight": 3.0, "knee": None}}
    rows = headroom_verdicts(report)
    assert [r["subject"] for r in rows] == ["svc/m/v1"]
    assert "19.0 in flight against a live knee of 20.0 (headroom 5%" in rows[0]["detail"]
    summary = verdicts({"components": {"capacity": {"state": "running", "verdicts": rows}}})
    (row,) = [v for v in summary if v["component"] == "capacity"]
    assert row["verdict"] == "at its knee" and row["runbook_url"].endswith("#inferwatchcapacityheadroomlow")


def _mixed_events(rng: random.Random, n: int) -> list[object]:
    """Runs of events sharing a context tuple (as a decoded frame's do), equal tuples that are other objects,
    every outcome, durations at and around 0.3 s, windows crossed, and malformed events."""
    ctxs = [("svc", m, v) for m in ("m", "other", "third") for v in ("v1", "v2")]
    out: list[object] = []
    t = 10**18
    while len(out) < n:
        ctx = tuple(rng.choice(ctxs))  # a new tuple object per run
        for _ in range(rng.randint(1, 40)):
            t += rng.randint(0, 40_000_000)
            dur = rng.choice([300_000_000, 299_999_999, 300_000_001, rng.randint(1, 600_000_000)])
            outcome = rng.choice([OUTCOME_OK] * 8 + [OUTCOME_ERROR, OUTCOME_SHED, OUTCOME_CANCELLED])
            stream = (rng.randint(1, 400_000_000), 5, [rng.randint(1000, 90_000)] * 3)
            out.append((EV_REQUEST, ctx, t, dur, outcome, None, None, None, [("decode", dur, stream)]))
        odd = rng.random()
        if odd < 0.05:
            out.append((EV_REQUEST, ctx, t, 1, OUTCOME_OK, None, None, None, [], "extra"))  # longer: counted
        elif odd < 0.10:
            out.append((EV_REQUEST, ctx, t, 1, OUTCOME_OK))  # shorter: skipped
        elif odd < 0.13:
            out.append(rng.choice([None, (EV_REQUEST, [1], t, 1, OUTCOME_OK, None, None, None, []),
                                   (EV_REQUEST, ctx, t, "x", OUTCOME_OK, None, None, None, []),
                                   (EV_REQUEST, ctx, "x", 1, OUTCOME_OK, None, None, None, []),
                                   (EV_REQUEST, ctx, t, 400_000_000, OUTCOME_OK, None, None, None, 5)]))
        elif odd < 0.15:
            out.append((0, ctx))  # another record type
    return out


def _state(comp: Any) -> tuple[Any, ...]:
    table = comp.table
    series = {k: (s.win, s.next_ns, s.dur, s.count, s.last_n, s.last_win, s.windows,
                  {b: (c.w, c.n, c.x, c.x2) for b, c in s.cells.items()}) for k, s in table.series.items()}
    good = {k: tuple(v) for k, v in comp.goodput.totals.items()}
    return series, good, dict(comp.dropped), comp._last_end


@pytest.mark.parametrize("slo", [[], [{"model": "*", "e2e_seconds": 0.3}],
                                 [{"model": "m", "e2e_seconds": 0.3, "ttft_seconds": 0.2},
                                  {"model": "other", "e2e_seconds": 0.25}]])
def test_the_inline_path_counts_what_the_general_path_counts(slo: list[dict[str, float]]) -> None:
    """absorb's runs (sums kept in locals, flushed when a run ends) leave the windows, the goodput counts and
    the drops exactly as the general path does event by event."""
    events = _mixed_events(random.Random(7), 6000)
    cfg = CapacityConfig(window_seconds=0.5, slo=slo, max_models=5)
    fast, slow = build(cfg, ComponentContext()), build(cfg, ComponentContext())
    general = fast._general
    calls = []

    def counted(*a: Any) -> tuple[int, int]:
        calls.append(1)
        return general(*a)

    fast._general = counted  # type: ignore[method-assign,assignment]
    for i in range(0, len(events), 700):
        fast.absorb(events[i:i + 700], 0.0)  # type: ignore[arg-type]
    sl = slow.goodput.observe if slow.goodput.objectives else None
    last = slow._last_end
    refused = 0
    for e in events:
        r, last = slow._general(e, sl, last)
        refused += r
    slow._last_end = last
    if refused:
        slow.count_drop("too_many_models", refused)
    a, b = _state(fast), _state(slow)
    assert a == b
    assert sum(s[6] for s in a[0].values()) > 100  # the windows saw the traffic
    assert len(calls) < len(events) / 2  # the rest (a fifth of the events failed) took the inline path
    assert a[2].get("error", 0) > 0 and a[2].get("too_many_models", 0) > 0
    if slo:
        assert all(g > 0 and bad > 0 for g, bad in a[1].values() if g + bad > 50)

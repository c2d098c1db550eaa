"""Goodput against per-model objectives: exact good/bad counts from REQUEST events with streamed stages."""

from __future__ import annotations

import random

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
    reqs = []
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

"""Issue 28: one series budget for the whole request/stage exposition, with __overflow__, counted."""

from __future__ import annotations

import random
from typing import Any

from prometheus_client import generate_latest

from inferwatch.wire import EV_REQUEST
from inferwatch_sidecar.config import load_config
from inferwatch_sidecar.daemon import Sidecar
from tests.helpers.sidecar import parse_metrics, sample, total

_FAMILIES = ("inferwatch_requests_total", "inferwatch_request_errors_total", "inferwatch_request_duration_seconds",
             "inferwatch_stage_duration_seconds", "inferwatch_time_to_first_token_seconds",
             "inferwatch_inter_token_latency_seconds", "inferwatch_generation_length_tokens",
             "inferwatch_records_total")


def make(**labels: Any) -> Sidecar:
    return Sidecar(load_config(environ={}, overrides={"gpu": {"enabled": False}, "drift": {"enabled": False},
                                                     "labels": labels}))


def lines(text: str) -> int:
    return sum(1 for ln in text.splitlines() if ln.startswith(_FAMILIES))


def attack(s: Sidecar, rng: random.Random, n_sets: int, n_stages: int) -> int:
    """Requests across label sets x stages x error types, with streams; returns how many were sent."""
    sent = 0
    for i in range(n_sets):
        ctx = (f"svc{i % 7}", f"model{i}", f"v{rng.randrange(3)}")
        evs = []
        for j in range(n_stages):
            stages = [(f"stage{j}", rng.randrange(1, 10**8), (10**6, 5, (1000, 2000)))]
            evs.append((EV_REQUEST, ctx, 10**18 + sent, rng.randrange(1, 10**9), 1, f"err{j}", None, None, stages))
            sent += 1
        s.pipeline.events(evs, "http")
    return sent


def test_series_budget_holds_the_whole_exposition_and_counts_the_overflow() -> None:
    rng = random.Random(28)
    s = make(max_series=3000, max_label_sets=1000, max_values={"stage": 60, "error_type": 60, "model": 1000})
    sent = attack(s, rng, 200, 40)  # per-label budgets alone would allow ~200 x 40 x (33 + 60) lines
    text = generate_latest(s.registry).decode()
    m = parse_metrics(text)
    # Within the budget plus the one __overflow__ label set (its stage and error type series).
    assert lines(text) <= 3000 + 200, lines(text)
    assert sample(m, "inferwatch_label_overflow_total", label="series") > 0
    # Nothing is lost, only merged: every request is still counted, errors and stage observations too.
    assert total(m, "inferwatch_requests_total") == sent
    assert total(m, "inferwatch_request_errors_total") == sent
    assert total(m, "inferwatch_stage_duration_seconds_count") == sent
    assert sample(m, "inferwatch_stage_duration_seconds_count", service="__overflow__", model="__overflow__",
                  model_version="__overflow__", stage="__overflow__") > 0
    assert s.aggregator.series <= 3000


def test_default_budget_keeps_scrapes_small() -> None:
    assert load_config(environ={}).labels.max_series == 50000
    s = make()
    attack(s, random.Random(1), 150, 51)
    text = generate_latest(s.registry).decode()
    assert lines(text) <= 50000 + 300
    assert len(text) < 8 << 20


def test_family_budget_holds_each_aggregator_family_so_the_exposition_never_cuts_them() -> None:
    # The exposition leaves out what passes labels.max_family_series in one family; the aggregator kept
    # those series anyway (memory) and built them at every scrape (CPU), to be cut. It now overflows first.
    rng = random.Random(31)
    s = make(max_family_series=1000, max_label_sets=1000, max_values={"stage": 60, "error_type": 60, "model": 1000})
    sent = attack(s, rng, 120, 30)
    body, _ = s._scrape("")
    m = parse_metrics(body.decode())
    per_family: dict[str, int] = {}
    for fam in s.aggregator.collect():
        per_family[fam.name] = len(fam.samples)
    for name in ("inferwatch_stage_duration_seconds", "inferwatch_request_duration_seconds",
                 "inferwatch_inter_token_latency_seconds", "inferwatch_request_errors"):
        # Within the family budget, plus the __overflow__ label set's own series.
        assert per_family[name] <= 1000 + 33 + 3, (name, per_family[name])
    assert s.exposition.last_dropped == 0 and s.exposition.overflow.overflowed == 0
    assert sample(m, "inferwatch_label_overflow_total", label="series") > 0
    assert total(m, "inferwatch_requests_total") == sent
    assert total(m, "inferwatch_stage_duration_seconds_count") == sent

"""Tail attribution: which stage and which inputs make the slowest requests slow, in bounded memory."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from inferwatch.wire import EV_RECORD, EV_REQUEST, Schema
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.tail.component import TailComponent
from inferwatch_sidecar.components.tail.config import TailConfig

SCHEMA = Schema(1, ("input_tokens", "temperature"), ("tenant",), struct.Struct("<2d"), struct.Struct("<H"))
CTX = ("svc", "m", "v1")


def traffic(seed: int, n: int, slow_share: float = 0.004, *, record_first: bool = True) -> list[tuple[Any, ...]]:
    """Requests whose slow few have long inputs that wait in the queue behind a batch (the seed's incident)."""
    rng = np.random.default_rng(seed)
    slow = rng.random(n) < slow_share
    out: list[tuple[Any, ...]] = []
    for i in range(n):
        toks = float(rng.integers(2000, 4000)) if slow[i] else float(rng.integers(50, 500))
        queue = rng.exponential(0.3) + 0.2 if slow[i] else rng.exponential(0.002)
        inference = 0.005 + toks * 1e-5
        total = queue + 0.001 + inference + 0.0005
        rid = f"r{i}"
        rec = (EV_RECORD, CTX, 0, rid, "cat", 0.9, None,
               (SCHEMA, (toks, float(rng.random())), (str(rng.choice(["a", "b"])),)))
        req = (EV_REQUEST, CTX, 0, int(total * 1e9), 0, None, rid, None,
               (("queue", int(queue * 1e9), None), ("preprocess", 1_000_000, None),
                ("inference", int(inference * 1e9), None)))
        out += [rec, req] if record_first else [req, rec]
    return out


def feed(c: TailComponent, events: list[tuple[Any, ...]], now: float, frame: int = 1000) -> None:
    """Hand ``events`` over as ingest does, a frame at a time, each drained as the stage's wake would."""
    for i in range(0, len(events), frame):
        c.handle(0, 0, events[i:i + frame])
        c.drain(now)
    assert c.dropped["staging_full"] == 0


def run(events: list[tuple[Any, ...]], cfg: TailConfig | None = None) -> TailComponent:
    c = TailComponent(cfg or TailConfig(window_seconds=60), ComponentContext(clock=lambda: 1000.0))
    feed(c, events, 1000.0)  # inside the window [960, 1020)
    assert c.reports == {}
    c.drain(1020.0)  # the window ends: analysed
    return c


def test_slow_requests_with_long_inputs_are_attributed_to_queue_and_input_length() -> None:
    c = run(traffic(7, 40_000))
    (rep,) = c.status()["models"]
    assert (rep["requests"], rep["joined_ratio"]) == (40_000, 1.0)
    p99, p999 = rep["tails"]["p99"], rep["tails"]["p999"]
    assert (p99["status"], p99["requests"], p999["status"], p999["requests"]) == ("ok", 400, "ok", 40)
    assert p999["culprit"] == "queue" and p99["culprit"] == "queue"
    q = next(s for s in p999["stages"] if s["stage"] == "queue")
    # Growth and ratios are against the median of the window's seeded uniform sample (Algorithm L's draws).
    assert (round(q["share"], 3), round(q["excess_share"], 3), round(q["growth"], 1)) == (0.961, 0.971, 668.2)
    pre = next(s for s in p999["stages"] if s["stage"] == "preprocess")
    assert (pre["growth"], pre["excess_share"]) == (pytest.approx(1.0), pytest.approx(0.0, abs=1e-12))
    top = p999["features"][0]
    assert (top["feature"], top["distinguishes"], round(top["ratio"], 2)) == ("input_tokens", True, 10.67)
    assert [f["feature"] for f in p999["features"] if f["distinguishes"]] == ["input_tokens"]
    assert p999["summary"] == "queue is 96% of the slowest 0.1%; slow requests have input_tokens 10.7x the median"
    assert p99["summary"] == "queue is 91% of the slowest 1%; slow requests have input_tokens 1.6x the median"
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in c.collect() for s in fam.samples}
    lab = (("model", "m"), ("model_version", "v1"), ("service", "svc"))
    assert round(samples[("inferwatch_tail_stage_share_ratio", (*lab, ("stage", "queue"), ("tail", "p999")))], 3) \
        == 0.961
    assert samples[("inferwatch_tail_feature_distinguishes", (("feature", "input_tokens"), *lab, ("tail", "p999")))] \
        == 1.0
    assert samples[("inferwatch_tail_requests", (*lab, ("tail", "p999")))] == 40.0
    assert samples[("inferwatch_tail_window_requests", lab)] == 40_000.0


def test_a_record_arriving_after_its_request_is_joined_too() -> None:
    c = run(traffic(7, 40_000, record_first=False))
    (rep,) = c.status()["models"]
    assert rep["joined_ratio"] == 1.0
    assert rep["tails"]["p999"]["summary"] == \
        "queue is 96% of the slowest 0.1%; slow requests have input_tokens 10.7x the median"


def test_features_unrelated_to_latency_are_not_flagged() -> None:
    # temperature and tenant are drawn independently of latency (input_tokens still drives inference time)
    flagged = 0
    tested = 0
    for seed in range(6):
        c = run(traffic(seed, 10_000, slow_share=0.0))
        (rep,) = c.status()["models"]
        for t in rep["tails"].values():
            unrelated = [f for f in t.get("features", []) if f["feature"] in ("temperature", "tenant")]
            tested += len(unrelated)
            flagged += sum(f["distinguishes"] for f in unrelated)
    assert (tested, flagged) == (12, 0)


def test_too_few_requests_for_the_far_tail_say_how_many_are_needed() -> None:
    c = run(traffic(3, 5000))
    (rep,) = c.status()["models"]
    assert rep["tails"]["p99"]["status"] == "ok"
    assert rep["tails"]["p999"] == {"share": 0.001, "requests": 5, "truncated": False, "needed_requests": 20000,
                                    "status": "insufficient_data"}


def test_memory_is_bounded_whatever_the_traffic() -> None:
    cfg = TailConfig(window_seconds=60, max_tail=64, reservoir=128, max_pending=200)
    c = TailComponent(cfg, ComponentContext(clock=lambda: 1000.0))
    events = traffic(1, 30_000, slow_share=0.01)
    # records whose requests never come fill the pending table only up to its bound
    orphans = [(EV_RECORD, CTX, 0, f"x{i}", "cat", 0.9, None, (SCHEMA, (1.0, 0.5), ("a",))) for i in range(1000)]
    feed(c, events + orphans, 1000.0)
    (w,) = c.windows.values()
    assert (w.n, len(w.sample), len(w.top)) == (30_000, 128, 64)
    assert len(c._pending) == 200 and len(c._awaiting) == 0
    assert c.dropped["unmatched_record"] == 800
    c.drain(1020.0)
    (rep,) = c.status()["models"]
    # 1% of 30000 is 300 requests, more than the 64 kept: the group is cut to the slowest 64
    assert (rep["tails"]["p99"]["requests"], rep["tails"]["p99"]["truncated"]) == (64, True)


def test_staging_is_bounded_and_counts_what_it_drops() -> None:
    c = TailComponent(TailConfig(max_staged=1000), ComponentContext(clock=lambda: 1000.0))
    c.handle(0, 0, traffic(1, 600))  # 1200 events
    assert c.dropped["staging_full"] == 200
    samples = {tuple(s.labels.values()): s.value for fam in c.collect() for s in fam.samples
               if s.name == "inferwatch_tail_dropped_events_total"}
    assert samples[("staging_full",)] == 200.0


def test_the_sample_is_uniform_over_the_window_whatever_its_size() -> None:
    """Algorithm L keeps each of n requests with probability reservoir / n: checked against the binomial
    over many seeded windows, for the first, middle and last requests and the whole sample's mean rank."""
    from scipy import stats

    from inferwatch_sidecar.components.tail.window import TailWindow

    size, n, windows = 32, 2000, 400
    kept = np.zeros(n)
    for seed in range(windows):
        w = TailWindow(("s", "m", str(seed)), 1, size, seed)
        for i in range(n):
            w.offer(float(i == 0), ((f"{i}", 1, None),))  # request 0 is the slowest: the top heap keeps it
        assert len(w.sample) == size and w.n == n
        for row in w.sample:
            kept[int(row.stages[0][0])] += 1
    assert kept.sum() == size * windows
    p = size / n
    for part in (kept[:200], kept[900:1100], kept[-200:]):  # 200 requests x 400 windows, each kept with p
        got = part.sum()
        assert stats.binomtest(int(got), 200 * windows, p).pvalue > 1e-3, (got, 200 * windows * p)
    ranks = np.repeat(np.arange(n), kept.astype(int))
    assert abs(ranks.mean() - (n - 1) / 2) < 4 * n / np.sqrt(12 * size * windows)


def test_records_join_their_requests_in_any_order_and_any_batch_split() -> None:
    """A record before or after its request, in the same batch or a later one: every kept request gets its
    record's features. What still waits is only records whose request came in an earlier batch and was not
    kept (the component does not remember requests it did not keep); none was dropped."""
    import random

    for seed in range(12):
        rng = random.Random(seed)
        events = traffic(seed, 600)
        pairs = [events[i:i + 2] for i in range(0, len(events), 2)]
        out: list[tuple[Any, ...]] = []
        held: list[tuple[Any, ...]] = []  # records sent up to a few requests late
        for rec, req in pairs:
            if rng.random() < 0.3:
                held.append(rec)
                out.append(req)
            else:
                out += [rec, req]
            if held and rng.random() < 0.5:
                out.append(held.pop(0))
        out += held
        c = TailComponent(TailConfig(window_seconds=60, max_tail=32, reservoir=100),
                          ComponentContext(clock=lambda: 1000.0))
        i = 0
        while i < len(out):  # batches of random sizes
            k = rng.randint(1, 150)
            c.handle(0, 0, out[i:i + k])
            c.drain(1000.0)
            i += k
        (w,) = c.windows.values()
        rows = {id(r): r for r in w.sample} | {id(t[2]): t[2] for t in w.top}
        assert rows and all(r.feats is not None for r in rows.values()), seed
        assert (c.dropped["unmatched_record"], len(c._awaiting)) == (0, 0)
        kept_lat = {r.latency for r in rows.values()}
        by_rid = {e[6]: e[3] * 1e-9 for e in events if e[0] == EV_REQUEST}
        assert not {rid for rid in c._pending if by_rid[rid] in kept_lat}, seed
        assert len(c._pending) < 0.05 * len(pairs) and c.pending_bytes == sum(nb for _, nb in c._pending.values())


def test_records_without_requests_wait_within_their_bound_and_are_counted_when_dropped() -> None:
    recs = [(EV_RECORD, CTX, 0, f"lone{i}", "cat", 0.9, None, (SCHEMA, (1.0, 2.0), ("a",))) for i in range(500)]
    c = TailComponent(TailConfig(window_seconds=60, max_pending=200), ComponentContext(clock=lambda: 1000.0))
    feed(c, recs, 1000.0, frame=70)
    assert len(c._pending) == 200 and c.dropped["unmatched_record"] == 300
    assert list(c._pending)[0] == "lone300"  # the oldest went first
    late = (EV_REQUEST, CTX, 0, 5_000_000, 0, None, "lone499", None, (("inference", 5_000_000, None),))
    feed(c, [late], 1000.0)
    assert "lone499" not in c._pending and c.pending_bytes == sum(nb for _, nb in c._pending.values())

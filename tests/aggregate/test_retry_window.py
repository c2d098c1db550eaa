"""The retry window (aggregate/overload.py): a bounded seen-ID table, its window, and what the aggregator counts."""

from __future__ import annotations

import random

import pytest

from inferwatch.wire import EV_HTTP, OUTCOME_CANCELLED, OUTCOME_OK
from inferwatch_sidecar.aggregate.aggregator import Aggregator
from inferwatch_sidecar.aggregate.overload import SeenIds
from inferwatch_sidecar.components.base import ComponentContext

CTX = ("svc", "m", "v1")
T0 = 1_700_000_000


def http(rid: str | None, sec: float, resend: int = 0, outcome: int = OUTCOME_OK, wait_s: float = 0.0) -> tuple:
    return (EV_HTTP, CTX, int(sec * 1e9), "/predict", 200, outcome, resend, int(wait_s * 1e9), False, rid)


def test_an_id_seen_again_within_the_window_is_a_repeat_and_not_after_it() -> None:
    w = SeenIds(capacity=1000, window_s=120)
    s = 10**9
    t0 = T0 * s
    assert not w.seen("a", t0)
    assert w.seen("a", t0 + 5 * s)
    assert w.seen("a", t0 + 65 * s)  # remembered for at least half a window...
    assert not w.seen("a", t0 + 400 * s)  # ...and forgotten after a window
    assert not w.seen("b", t0 + 401 * s) and w.seen("a", t0 + 402 * s)
    for bad in ({"capacity": 0}, {"window_s": 1}):
        with pytest.raises(ValueError, match="retry window"):
            SeenIds(**bad)


def test_memory_is_bounded_and_unique_ids_are_never_retries() -> None:
    w = SeenIds(capacity=20_000)
    rnd = random.Random(1)
    false = 0
    for i in range(200_000):  # ten times the capacity, within one window
        false += w.seen(f"{rnd.getrandbits(96):024x}", T0 * 10**9 + i * 10**5)
        assert len(w.cur) <= w.capacity and len(w.prev) <= w.capacity
    assert false == 0
    # The last `capacity` IDs are always remembered, even past the capacity.
    rnd = random.Random(1)
    ids = [f"{rnd.getrandbits(96):024x}" for _ in range(200_000)]
    assert all(w.seen(x, T0 * 10**9 + 200_000 * 10**5) for x in ids[-w.capacity // 2:])


def test_the_aggregator_counts_retries_by_id_and_header_and_give_ups() -> None:
    agg = Aggregator(ComponentContext())
    evs = [http(f"u{i}", T0 + i * 0.01) for i in range(50)]
    evs += [http(f"u{i}", T0 + 1 + i * 0.01) for i in range(10)]  # the same IDs again: retries
    evs += [http(None, T0 + 2, resend=1) for _ in range(4)]  # resend headers, generated IDs
    evs += [http(f"g{i}", T0 + 3, outcome=OUTCOME_CANCELLED, wait_s=5.0) for i in range(6)]
    agg.process(evs, [0] * 16)
    s = agg.overload.series[CTX]
    assert (s.attempts, s.retries, s.giveups) == (70, 14, 6)
    assert agg.overload.amplification(s, (T0 + 3) * 10**9) == pytest.approx(70 / 56)
    assert s.wait_sum == pytest.approx(30.0)

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
    w = SeenIds(slots=1 << 10, window_s=120)
    assert not w.seen("a", T0)
    assert w.seen("a", T0 + 5)
    assert w.seen("a", T0 + 125)  # 120 s after its last sighting at +5
    assert not w.seen("a", T0 + 400)
    assert w.nbytes == 8 << 10
    for bad in (0, 3, 1000):
        with pytest.raises(ValueError, match="power of two"):
            SeenIds(slots=bad)


def test_memory_is_constant_and_unique_ids_are_never_retries() -> None:
    w = SeenIds()
    before = w.nbytes
    rnd = random.Random(1)
    false = sum(w.seen(f"{rnd.getrandbits(96):024x}", T0 + i // 1000) for i in range(200_000))
    assert false == 0 and w.nbytes == before == 2 << 20


def test_the_aggregator_counts_retries_by_id_and_header_and_give_ups() -> None:
    agg = Aggregator(ComponentContext())
    evs = [http(f"u{i}", T0 + i * 0.01) for i in range(50)]
    evs += [http(f"u{i}", T0 + 1 + i * 0.01) for i in range(10)]  # the same IDs again: retries
    evs += [http(None, T0 + 2, resend=1) for _ in range(4)]  # resend headers, generated IDs
    evs += [http(f"g{i}", T0 + 3, outcome=OUTCOME_CANCELLED, wait_s=5.0) for i in range(6)]
    agg.process(evs, [0] * 16)
    s = agg.overload.series[CTX]
    assert (s.attempts, s.retries, s.giveups) == (70, 14, 6)
    assert agg.overload.amplification(s, T0 + 3) == pytest.approx(70 / 56)
    assert s.wait_sum == pytest.approx(30.0)

"""A FIFO server with ``slots`` slots and lognormal service times under open-loop traffic of varying rate.

It yields the REQUEST events the SDK would send (end time, duration) for a traffic that moves between light
load and overload, so the live table visits levels on both sides of the knee (which is ``slots``). Used by
tests/components/capacity/test_live.py (small) and bench/capacity_knee.py (the family of random draws).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator

from inferwatch.wire import EV_REQUEST, OUTCOME_OK

CTX = ("svc", "m", "v1")


def requests(slots: int, service: float, cv: float, loads: list[float], phase_s: float,
             rng: random.Random, t0: float = 1000.0) -> Iterator[tuple[float, float]]:
    """(end time s, duration s) of each request, in end-time order, for phases at ``loads`` x capacity."""
    free = [t0] * slots
    heapq.heapify(free)
    s2 = math.log1p(cv * cv)
    mu = math.log(service) - s2 / 2
    cap = slots / service
    out: list[tuple[float, float]] = []
    t = t0
    for i, load in enumerate(loads):
        end_phase = t0 + (i + 1) * phase_s
        rate = load * cap
        while True:
            t += rng.expovariate(rate)
            if t >= end_phase:
                t = end_phase
                break
            start = max(t, heapq.heappop(free))
            d = rng.lognormvariate(mu, math.sqrt(s2)) if cv > 0 else service
            heapq.heappush(free, start + d)
            out.append((start + d, start + d - t))
    out.sort()
    yield from out


def events(reqs: Iterator[tuple[float, float]]) -> Iterator[tuple[object, ...]]:
    for end, dur in reqs:
        yield (EV_REQUEST, CTX, int(end * 1e9), int(dur * 1e9), OUTCOME_OK, None, None, None, [])


def ramp(rng: random.Random, n: int = 24) -> list[float]:
    """Loads (x capacity) for ``n`` phases: light, near the knee, and overload that then drains."""
    base = [0.1, 0.2, 0.3, 0.45, 0.6, 0.75, 0.9, 1.1, 1.3, 0.5]
    return [rng.choice(base) for _ in range(n)]

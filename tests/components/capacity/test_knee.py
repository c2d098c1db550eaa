"""The knee fit on levels drawn from servers of known capacity, and what it refuses to say."""

from __future__ import annotations

import random

import pytest

from inferwatch_sidecar.components.capacity.knee import Level, fit


def closed_levels(slots: int, service: float, levels: list[int], noise: float, rng: random.Random) -> list[Level]:
    """A closed loop of c clients on ``slots`` servers of mean ``service`` s: X = min(c, slots) / S, L = c / X."""
    out = []
    for c in levels:
        x = min(c, slots) / service
        x_obs = x * (1 + rng.gauss(0, noise))
        out.append(Level(c, x_obs, x * noise, c / x))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_the_knee_of_a_slot_server_is_its_slot_count(seed: int) -> None:
    rng = random.Random(seed)
    slots = rng.randint(2, 100)
    service = rng.uniform(0.001, 0.5)
    levels = [2 ** i for i in range(10) if 2 ** i <= 4 * slots] + [4 * slots]
    k = fit(closed_levels(slots, service, sorted(set(levels)), 0.02, rng), seed=seed)
    assert k is not None and k.reached
    assert abs(k.concurrency - slots) / slots < 0.15, (slots, k)
    assert abs(k.throughput_rps - slots / service) / (slots / service) < 0.05
    assert k.low <= k.concurrency <= k.high


def test_still_rising_is_not_a_knee() -> None:
    k = fit(closed_levels(64, 0.01, [1, 2, 4, 8, 16], 0.01, random.Random(1)))
    assert k is not None and not k.reached


def test_flat_latency_is_not_a_knee_even_when_throughput_bends() -> None:
    # Throughput flat but latency flat too (a client-side limit, not the server's): no knee.
    levels = [Level(c, min(c, 4) * 100.0, 1.0, 0.01) for c in (1, 2, 4, 8, 16)]
    k = fit(levels)
    assert k is not None and not k.reached


def test_too_few_levels() -> None:
    assert fit([Level(1, 10, 0.1, 0.1), Level(2, 20, 0.1, 0.1)]) is None
    assert fit([Level(1, 10, 0.1, 0.1), Level(2, 0, 0, 0.1), Level(4, 40, 0.1, 0.1)]) is None

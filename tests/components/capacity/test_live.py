"""The live knee: the capacity component fed the REQUEST events of a server of known capacity."""

from __future__ import annotations

import random

import pytest

from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.capacity.component import build
from inferwatch_sidecar.components.capacity.config import CapacityConfig
from inferwatch_sidecar.components.capacity.table import LiveTable, bucket
from tests.components.capacity import sim


def family(prom: list, name: str) -> dict[tuple[str, ...], float]:
    for f in prom:
        if f.name == name:
            return {tuple(s.labels[k] for k in ("service", "model", "model_version")): s.value for s in f.samples}
    return {}


@pytest.mark.parametrize("seed", range(2))
def test_live_knee_of_a_slot_server(seed: int) -> None:
    rng = random.Random(seed)
    slots, service = rng.randint(4, 40), rng.uniform(0.01, 0.1)
    comp = build(CapacityConfig(window_seconds=1.0, evaluate_interval_s=1), ComponentContext())
    evs = list(sim.events(sim.requests(slots, service, 0.3, sim.ramp(rng, 30), 10.0, rng)))
    for i in range(0, len(evs), 5000):
        comp.absorb(evs[i:i + 5000], 0.0)
    last_end = evs[-1][2] / 1e9
    caps = comp.evaluate(now=last_end)
    (cap,) = caps.values()
    assert cap.knee is not None and cap.knee.reached, cap
    assert abs(cap.knee.concurrency - slots) / slots < 0.25, (slots, cap.knee)
    assert abs(cap.knee.throughput_rps - slots / service) / (slots / service) < 0.25
    prom = comp.collect()
    knee = family(prom, "inferwatch_capacity_knee_concurrency")
    assert knee == {sim.CTX: pytest.approx(cap.knee.concurrency)}
    assert family(prom, "inferwatch_capacity_max_throughput_rps")[sim.CTX] == pytest.approx(cap.knee.throughput_rps)
    head = family(prom, "inferwatch_capacity_headroom_ratio")[sim.CTX]
    assert head == pytest.approx(1 - cap.in_flight / cap.knee.concurrency)
    st = comp.status()
    assert st["models"]["svc/m/v1"]["knee"] == pytest.approx(cap.knee.concurrency)


def test_light_traffic_gives_no_knee() -> None:
    rng = random.Random(5)
    comp = build(CapacityConfig(window_seconds=1.0), ComponentContext())
    evs = list(sim.events(sim.requests(16, 0.02, 0.3, [0.1, 0.2, 0.3, 0.2], 20.0, rng)))
    comp.absorb(evs, 0.0)
    comp.evaluate(now=evs[-1][2] / 1e9)
    prom = comp.collect()
    assert family(prom, "inferwatch_capacity_knee_concurrency") == {}
    assert family(prom, "inferwatch_capacity_headroom_ratio") == {}
    assert family(prom, "inferwatch_capacity_in_flight")[sim.CTX] > 0


def test_the_table_is_bounded() -> None:
    t = LiveTable(window_s=1.0, max_keys=2)
    assert t.observe("a", 1, 10) and t.observe("b", 1, 10)
    assert not t.observe("c", 1, 10)
    for i in range(1, 20000):
        t.observe("a", i * 10**9, (i % 5000) * 10**9)  # in-flight from 0 to 5000 and beyond
    assert len(t.series["a"].cells) <= 161
    assert bucket(1e9) == bucket(65536) and bucket(0) == bucket(1e-9)


def test_a_level_seen_in_min_windows_windows_counts_until_a_half_life_has_passed() -> None:
    # The count of windows is what makes a level, the decayed weight only how long it stays: a level seen in
    # exactly min_windows windows once fell out at the first decay, a second after it was seen (the demo's
    # live knee then missed the levels below it and was never reached).
    t = LiveTable(window_s=1.0, half_life_s=100.0, min_windows=2)
    for w in range(2):
        for i in range(10):
            t.observe("k", (w * 10**9) + i * 10**8, 20 * 10**6)
    t.close_idle(10 * 10**9)
    t.decay(0.0)
    t.decay(1.0)  # 2 windows weigh 1.986 now
    (lv,) = t.levels("k")
    assert lv.concurrency == pytest.approx(0.2) and lv.throughput == pytest.approx(10.0)
    t.decay(99.0)
    assert len(t.levels("k")) == 1  # 1.001 of 2: within one half-life
    t.decay(101.0)
    assert t.levels("k") == []  # past it


def test_windows_follow_littles_law() -> None:
    t = LiveTable(window_s=1.0, min_windows=1)
    # 3 windows of 100 requests of 50 ms each: 5 in flight, 100 req/s
    for w in range(3):
        for i in range(100):
            t.observe("k", (w * 10**9) + i * 10**7, 50 * 10**6)
    t.close_idle(10 * 10**9)
    (lv,) = t.levels("k")
    assert lv.concurrency == pytest.approx(5.0) and lv.throughput == pytest.approx(100.0)
    assert lv.latency == pytest.approx(0.05)

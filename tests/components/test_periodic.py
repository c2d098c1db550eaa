"""The periodic skeleton: its pass bookkeeping (what a pass published, how many passes, their thread CPU time),
and a stage past half its budget waking the worker before the tick."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from inferwatch.wire import EV_REQUEST
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.periodic import PeriodicComponent, StagedComponent
from inferwatch_sidecar.components.staging import EVENT_BYTES
from inferwatch_sidecar.metrics.core import COMPONENT_UP
from inferwatch_sidecar.metrics.samples import Samples


class _Busy(PeriodicComponent):
    name = "busy"
    metrics = (COMPONENT_UP,)

    def __init__(self, spin_s: float) -> None:
        super().__init__(ComponentContext(), interval_s=3600)
        self.spin_s = spin_s

    def tick(self) -> bool | None:
        c0 = time.thread_time()
        while time.thread_time() - c0 < self.spin_s:  # CPU, not sleep: thread time counts only this
            pass
        out = Samples()
        out.put(COMPONENT_UP, ("busy",), float(self.passes + 1))
        self.publish_pass(out, c0)
        return None

    def status(self) -> dict[str, Any]:
        return {"passes": self.passes}


def test_publish_pass_publishes_and_counts_each_pass_and_its_cpu_time() -> None:
    comp = _Busy(spin_s=0.02)
    assert (comp.passes, comp.cpu_s) == (0, 0.0)
    for n in (1, 2, 3):
        comp.tick()
        (fam,) = comp.collect()
        assert [(s.labels, s.value) for s in fam.samples] == [({"component": "busy"}, float(n))]
        assert comp.passes == n
    assert 0.06 <= comp.cpu_s < 0.06 + 0.5  # three spins of 20 ms thread time, plus the bookkeeping


class _Staged(StagedComponent):
    name = "staged"
    metrics = (COMPONENT_UP,)

    def __init__(self, max_staged: int, max_staged_bytes: int) -> None:
        # An hour between ticks: any drain within the test is one the stage asked for.
        super().__init__(ComponentContext(), interval_s=3600, max_staged=max_staged, max_staged_bytes=max_staged_bytes)
        self.batches: list[int] = []
        self.drained = threading.Event()

    def absorb(self, batch: list[tuple[Any, ...]], now: float) -> None:
        self.batches.append(len(batch))
        if batch:
            self.drained.set()

    def status(self) -> dict[str, Any]:
        return {}


def _events(n: int) -> list[tuple[Any, ...]]:
    return [(EV_REQUEST, i) for i in range(n)]


@pytest.mark.parametrize(("limit", "max_bytes", "below", "past"), [
    (10, 1 << 20, 5, 6),                    # half the events: 5 of 10 waits, 6 wakes
    (1000, 10 * EVENT_BYTES, 5, 6),         # half the bytes: 5 x 200 of 2,000 waits, 6 x 200 wakes
])
def test_a_stage_past_half_its_budget_is_drained_before_the_tick(limit: int, max_bytes: int, below: int,
                                                                  past: int) -> None:
    comp = _Staged(limit, max_bytes)
    comp.start()
    try:
        comp.handle(0, 0, _events(below))
        assert not comp.drained.wait(0.3), "a stage at half its budget waits for the tick"
        assert comp.staged() == below
        comp.handle(0, 0, _events(past - below))
        assert comp.drained.wait(5.0), "a stage past half its budget was not drained before the hour's tick"
        assert comp.batches == [past] and comp.staged() == 0
        assert comp.dropped["staging_full"] == 0
    finally:
        comp.stop(5.0)


def test_a_woken_worker_still_stops() -> None:
    comp = _Staged(10, 1 << 20)
    comp.start()
    comp.handle(0, 0, _events(8))
    assert comp.drained.wait(5.0)
    t0 = time.monotonic()
    comp.stop(5.0)
    assert time.monotonic() - t0 < 1.0
    assert comp._worker is None

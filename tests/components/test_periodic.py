"""The periodic skeleton's pass bookkeeping: what a pass published, how many passes, their thread CPU time."""

from __future__ import annotations

import time
from typing import Any

from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.periodic import PeriodicComponent
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

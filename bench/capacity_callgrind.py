"""The live knee's cost per REQUEST event in CPU instructions: ``CapacityComponent.absorb`` under callgrind.

Wall-clock figures are noisy on a shared machine; instruction counts are not. The script runs itself twice
under ``valgrind --tool=callgrind``: both runs build the same component and the same simulated events (a
server of 8 slots and 20 ms service time under a ramp of loads, ``tests/components/capacity/sim.py``); one of them
also absorbs them, in batches of 2,000 as the component's worker drains its stage. The difference divided
by the events is the cost of one event (interpreter start-up and the event building cancel out). With
``--slo`` the component has an objective for the model, so each event also feeds the goodput counts. The
knee's fit (once per ``evaluate_interval_s``, not per event) is outside the figure.

Callgrind counts the interpreter's instructions, which under valgrind are many per bytecode: as a yardstick,
``--yardstick`` also counts a loop that only reads each event's type and length (``if ev[0] != 2 or len(ev) <
9``), the least any per-event work costs. ``--wall`` adds the wall-clock nanoseconds per event without valgrind
(median of 7 passes; noisy on a shared machine).

Usage::

    PYTHONPATH=sdk:sidecar:. python bench/capacity_callgrind.py [--events 20000] [--slo] [--yardstick] [--wall]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import STABLE_HASH_ENV, callgrind_instructions  # noqa: E402  (bench/ is a folder of scripts)


def _events(n: int) -> list[tuple[object, ...]]:
    from tests.components.capacity import sim

    rng = random.Random(3)
    evs = []
    for ev in sim.events(sim.requests(8, 0.02, 0.3, sim.ramp(rng, 40), 10.0, rng)):
        evs.append(ev)
        if len(evs) == n:
            break
    assert len(evs) == n, f"the simulation gave {len(evs)} events, fewer than {n}"
    return evs


def _component(slo: bool) -> Any:
    from inferwatch_sidecar.components.base import ComponentContext
    from inferwatch_sidecar.components.capacity.component import build
    from inferwatch_sidecar.components.capacity.config import CapacityConfig, Objective

    return build(CapacityConfig(window_seconds=1.0, slo=[Objective(model="*", e2e_seconds=0.5)] if slo else []),
                 ComponentContext())


def _absorb(comp: Any, evs: list[Any]) -> None:
    for i in range(0, len(evs), 2000):
        comp.absorb(evs[i:i + 2000], 0.0)


def child(n: int, absorb: bool, slo: bool) -> None:
    comp = _component(slo)
    evs = _events(n)
    if absorb:
        _absorb(comp, evs)
        assert comp.table.series, "no event was absorbed"


def yardstick_child(n: int, loop: bool) -> None:
    evs = _events(n)
    k = 0
    if loop:
        for ev in evs:
            if ev[0] != 2 or len(ev) < 9:
                k += 1


def wall_ns(n: int, slo: bool) -> float:
    evs = _events(n)
    runs = []
    for _ in range(7):
        comp = _component(slo)
        t = time.perf_counter()
        _absorb(comp, evs)
        runs.append((time.perf_counter() - t) / n * 1e9)
    return statistics.median(runs)


def per_event(n: int, slo: bool) -> float:
    def run(absorb: bool) -> int:
        return callgrind_instructions([sys.executable, __file__, "--child", str(n), str(int(absorb)), str(int(slo))],
                                      env=STABLE_HASH_ENV)

    return (run(True) - run(False)) / n


def yardstick(n: int) -> float:
    def run(loop: bool) -> int:
        return callgrind_instructions([sys.executable, __file__, "--yardstick-child", str(n), str(int(loop))],
                                      env=STABLE_HASH_ENV)

    return (run(True) - run(False)) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=40_000, help="REQUEST events absorbed (default 40,000)")
    ap.add_argument("--slo", action="store_true", help="also with an objective for the model (goodput counts)")
    ap.add_argument("--yardstick", action="store_true", help="also the cost of a loop that only reads each event")
    ap.add_argument("--wall", action="store_true", help="also wall-clock ns per event without valgrind")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--yardstick-child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(int(a.child[0]), a.child[1] == "1", a.child[2] == "1")
        return 0
    if a.yardstick_child:
        yardstick_child(int(a.yardstick_child[0]), a.yardstick_child[1] == "1")
        return 0
    variants = [("no objective", False)] + ([("with an objective", True)] if a.slo else [])
    print(f"CapacityComponent.absorb per REQUEST event ({a.events} events): callgrind instructions"
          + (", wall-clock ns (median of 7)" if a.wall else ""))
    for label, slo in variants:
        print(f"  {label:<20} {per_event(a.events, slo):8.0f} instructions"
              + (f"  {wall_ns(a.events, slo):6.0f} ns" if a.wall else ""))
    if a.yardstick:
        print(f"  {'yardstick loop':<20} {yardstick(a.events):8.0f} instructions (reads each event's type and length)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

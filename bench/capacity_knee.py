"""The knee from ``inferwatch loadtest`` and from live traffic against servers of known capacity.

Each draw is a server with ``slots`` slots and a lognormal service time (mean ``service``, coefficient of
variation ``cv``), drawn at random; its true knee is ``slots`` requests in flight and its capacity
``slots / service``. Two estimates per draw:

- loadtest: the slot server in a child process, a default doubling sweep by ``inferwatch loadtest``'s
  runner (closed loop, --duration per step), its knee;
- live: the capacity component fed the REQUEST events of open-loop traffic that moves between light load
  and overload (tests/components/capacity/sim.py), its knee.

Reports the share of draws within 25% of the true knee (the bar: at least 95%) and the median error.

    PYTHONPATH=sdk:sidecar:. flock /tmp/bench.lock .venv/bin/python bench/capacity_knee.py --draws 40 --live-draws 200
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import sys

from tests.components.capacity import sim

from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.capacity.component import build
from inferwatch_sidecar.components.capacity.config import CapacityConfig
from inferwatch_sidecar.loadtest.client import build_request
from inferwatch_sidecar.loadtest.payloads import Prepared
from inferwatch_sidecar.loadtest.runner import Objectives, Target
from inferwatch_sidecar.loadtest.sweep import Plan, doubling, run


def draw(rng: random.Random, max_rps: float) -> tuple[int, float, float]:
    while True:
        slots, service, cv = rng.randint(2, 48), rng.uniform(0.005, 0.05), rng.uniform(0.0, 0.5)
        if slots / service <= max_rps:
            return slots, service, cv


def loadtest_knee(slots: int, service: float, cv: float, duration: float) -> float | None:
    srv = subprocess.Popen([sys.executable, "-m", "inferwatch_sidecar.loadtest.slotserver", str(slots), str(service),
                            str(cv)], stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout is not None
        port = int(srv.stdout.readline())
        raw = build_request("POST", f"127.0.0.1:{port}", "/", b"{}", {"Content-Type": "application/json"})
        t = Target("127.0.0.1", port, "json", False, [Prepared(raw, 0)], 30.0)
        plan = Plan("concurrency", doubling(256), duration, 10**6, 600.0, Objectives())
        out = asyncio.run(run(t, plan))
        return out.knee.concurrency if out.knee is not None and out.knee.reached else None
    finally:
        srv.terminate()
        srv.wait()


def live_knee(slots: int, service: float, cv: float, rng: random.Random) -> float | None:
    comp = build(CapacityConfig(window_seconds=1.0), ComponentContext())
    evs = list(sim.events(sim.requests(slots, service, cv, sim.ramp(rng, 40), 10.0, rng)))
    for i in range(0, len(evs), 20000):
        comp.absorb(evs[i:i + 20000], 0.0)
    caps = comp.evaluate(now=evs[-1][2] / 1e9)
    (cap,) = caps.values()
    return cap.knee.concurrency if cap.knee is not None and cap.knee.reached else None


def summary(name: str, errs: list[float | None]) -> None:
    ok = [e for e in errs if e is not None and e <= 0.25]
    found = [e for e in errs if e is not None]
    print(f"{name}: {len(ok)}/{len(errs)} draws within 25% of the true knee ({len(ok) / len(errs):.1%}); "
          f"median |error| {statistics.median(found) if found else float('nan'):.1%}; "
          f"{len(errs) - len(found)} without a knee")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=40)
    ap.add_argument("--live-draws", type=int, default=200)
    ap.add_argument("--duration", type=float, default=1.0, help="seconds per loadtest step")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    errs: list[float | None] = []
    for i in range(a.draws):
        slots, service, cv = draw(rng, 2500)
        k = loadtest_knee(slots, service, cv, a.duration)
        errs.append(None if k is None else abs(k - slots) / slots)
        print(f"  loadtest draw {i}: slots {slots}, service {service * 1e3:.1f} ms, cv {cv:.2f}: knee "
              f"{k if k is None else round(k, 2)}", flush=True)
    if errs:
        summary("loadtest", errs)
    lerrs: list[float | None] = []
    for _ in range(a.live_draws):
        slots, service, cv = draw(rng, 5000)
        k = live_knee(slots, service, cv, rng)
        lerrs.append(None if k is None else abs(k - slots) / slots)
    if lerrs:
        summary("live", lerrs)


if __name__ == "__main__":
    main()

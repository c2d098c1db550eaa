"""How many non-streaming requests per second ``inferwatch loadtest`` drives from one core.

A trivial server (``slotserver`` with no service time: it answers at once) runs in a child process; the
generator runs a closed-loop step at concurrency 64 in this process. The figure is requests per second of
the generator's own CPU time (``time.process_time``), so a shared machine where the server steals the other
core does not flatter or hide it; the wall-clock rate is printed beside it. Median of --runs runs.

    flock /tmp/bench.lock .venv/bin/python bench/loadtest_speed.py [--runs 5] [--duration 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys

from inferwatch_sidecar.loadtest.client import build_request
from inferwatch_sidecar.loadtest.payloads import Prepared
from inferwatch_sidecar.loadtest.runner import Objectives, Target, closed_step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--concurrency", type=int, default=64)
    a = ap.parse_args()
    srv = subprocess.Popen([sys.executable, "-m", "inferwatch_sidecar.loadtest.slotserver", "1", "0"],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout is not None
        port = int(srv.stdout.readline())
        raw = build_request("POST", f"127.0.0.1:{port}", "/", b'{"x": 1}', {"Content-Type": "application/json"})
        t = Target("127.0.0.1", port, "json", False, [Prepared(raw, 0)], 10.0)
        per_cpu, wall = [], []
        for _ in range(a.runs):
            s = asyncio.run(closed_step(t, a.concurrency, a.duration, 10**9, Objectives()))
            assert s.errors.total() == 0, s.errors
            per_cpu.append(s.requests / (s.cpu_share * s.duration_s))
            wall.append(s.requests / s.duration_s)
        print(f"requests per second of generator CPU: median {statistics.median(per_cpu):,.0f} "
              f"(runs: {', '.join(f'{x:,.0f}' for x in per_cpu)})")
        print(f"wall-clock requests per second (server on the other core): median {statistics.median(wall):,.0f}")
    finally:
        srv.terminate()
        srv.wait()


if __name__ == "__main__":
    main()

"""The retry window (``aggregate/overload.py``): cost per request under callgrind, and its error rates.

Cost: the script runs itself under ``valgrind --tool=callgrind`` with and without ``--loops`` passes
over the same events and reports the difference per event, for (a) ``SeenIds.seen`` alone and (b) the
whole HTTP event (``Overload.process``: route, outcome, retry, amplification, give-up). Instructions
become microseconds at the machine's own rate, measured by timing the same loop without valgrind
(median of 5 runs), so the figure is the instruction count, not a noisy timing.

Errors: ``--unique N`` unique client request IDs (random, as clients make them) go through a window of
the default size at ``--rate`` requests per second; every repeat it reports is a false retry. Then
the same traffic with each of a fraction of requests retried after ``--delay`` seconds gives the
share of retries the window misses (first attempts already forgotten).

Usage::

    flock /tmp/bench.lock python bench/retry_window.py
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
from _harness import REPO, callgrind_instructions  # noqa: E402  (bench/ is a folder of scripts, not a package)

sys.path[:0] = [str(REPO / "sdk"), str(REPO / "sidecar")]


def http_events(n: int) -> list[tuple[Any, ...]]:
    from inferwatch.wire import EV_HTTP

    rnd = random.Random(3)
    ctx = ("bench", "m", "v1")
    t0 = 1_700_000_000_000_000_000
    out = []
    for i in range(n):
        rid = f"{rnd.getrandbits(64):016x}-{i}" if i % 10 else f"{rnd.getrandbits(64):016x}-{i - 1}"
        out.append((EV_HTTP, ctx, t0 + i * 1_000_000, "/v1/predict", 200, 0, 0, 0, False, rid))
    return out


def make_overload() -> Any:
    from inferwatch_sidecar.aggregate.aggregator import Aggregator
    from inferwatch_sidecar.components.base import ComponentContext

    return Aggregator(ComponentContext()).overload


def work(kind: str, loops: int, n: int) -> None:
    evs = http_events(n)
    ov = make_overload()
    if kind == "seen":
        seen = ov.seen.seen
        keys = [(e[9], e[2]) for e in evs]
        for _ in range(loops):
            for rid, sec in keys:
                seen(rid, sec)
    else:
        process = ov.process
        for _ in range(loops):
            for e in evs:
                process(e)


def instructions(kind: str, loops: int, n: int) -> int:
    return callgrind_instructions([sys.executable, __file__, "--child", kind, str(loops), str(n)])


def seconds(kind: str, loops: int, n: int) -> float:
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        work(kind, loops, n)
        t_loop = time.perf_counter() - t
        t = time.perf_counter()
        work(kind, 0, n)
        runs.append(t_loop - (time.perf_counter() - t))
    return statistics.median(runs)


def error_rates(unique: int, rate: float, delay: float, retried: float) -> tuple[int, int, int]:
    """(false retries among ``unique`` IDs, retries sent, retries missed)."""
    from inferwatch_sidecar.aggregate.overload import SeenIds

    rnd = random.Random(11)
    w = SeenIds()
    false = 0
    for i in range(unique):
        false += w.seen(f"{rnd.getrandbits(64):016x}{rnd.getrandbits(32):08x}", int(i / rate * 1e9))
    w = SeenIds()
    pending: list[tuple[float, str]] = []
    sent = missed = 0
    for i in range(unique):
        now = i / rate
        while pending and pending[0][0] <= now:
            _, rid = pending.pop(0)
            sent += 1
            missed += not w.seen(rid, int(now * 1e9))
        rid = f"{rnd.getrandbits(64):016x}"
        w.seen(rid, int(now * 1e9))
        if rnd.random() < retried:
            pending.append((now + delay, rid))
    return false, sent, missed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loops", type=int, default=5)
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--unique", type=int, default=2_000_000, help="unique IDs for the false-retry rate")
    ap.add_argument("--rate", type=float, default=1000.0, help="requests per second")
    ap.add_argument("--delay", type=float, default=5.0, help="seconds before a retry")
    ap.add_argument("--retried", type=float, default=0.2, help="share of requests retried once")
    ap.add_argument("--no-callgrind", action="store_true", help="timings and error rates only (no valgrind)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        work(a.child[0], int(a.child[1]), int(a.child[2]))
        return 0
    from inferwatch_sidecar.aggregate.overload import SeenIds

    full = SeenIds()
    for i in range(2 * full.capacity):  # both generations full: the most it ever holds
        full.seen(f"id-{i}", 0)
    print(f"retry window: at most {full.nbytes / 2**20:.1f} MiB ({len(full.cur) + len(full.prev)} IDs in two "
          f"generations of {full.capacity}), whatever the traffic")
    for kind, what in (("seen", "SeenIds.seen"), ("process", "Overload.process (whole HTTP event)")):
        us = seconds(kind, a.loops, a.events) / (a.loops * a.events) * 1e6
        if a.no_callgrind:
            print(f"  {what:<38} {us:6.3f} us/request (median of 5)")
            continue
        ir = (instructions(kind, a.loops, a.events) - instructions(kind, 0, a.events)) / (a.loops * a.events)
        ns_per_ir = us * 1000 / ir
        print(f"  {what:<38} {ir:8.0f} instructions/request  {us:6.3f} us/request (median of 5; "
              f"{ns_per_ir:.3f} ns/instruction here)")
    false, sent, missed = error_rates(a.unique, a.rate, a.delay, a.retried)
    from inferwatch_sidecar.aggregate.overload import DEFAULT_CAPACITY

    bound = 2 * DEFAULT_CAPACITY / 2**64
    print(f"false retries: {false} of {a.unique} unique IDs ({false / a.unique:.2e}; bound 2 * capacity / 2**64 = "
          f"{bound:.1e} per request)")
    print(f"missed retries at {a.rate:.0f}/s retried after {a.delay:.0f} s: {missed} of {sent} "
          f"({missed / max(sent, 1):.2%}; none expected while rate * delay < capacity)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Aggregation cost per event in CPU instructions: ``Aggregator.process`` under callgrind.

Wall-clock timings are noisy on a shared machine; instruction counts are not.
The script runs itself twice under ``valgrind --tool=callgrind``, once with
the setup only and once with the setup plus ``--loops`` passes over the same
decoded events, and reports the difference per event, so interpreter start-up
and event building cancel out. With ``--baseline REV`` it does the same for
the aggregator as it was at ``REV`` (``git show``) and prints both side by side.

The events: REQUEST events with 3 stages (log-normal latencies, medians 50 us,
2 ms, 10 us) and a request ID; every fourth one also carries a trace ID, so
the exemplar rule sees both kinds.

Usage::

    python bench/aggregate_callgrind.py                      # this tree
    python bench/aggregate_callgrind.py --baseline HEAD      # this tree and HEAD side by side
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import REPO, callgrind_instructions  # noqa: E402  (bench/ is a folder of scripts, not a package)

AGG_PATH = "sidecar/inferwatch_sidecar/aggregate/aggregator.py"


def events(n: int) -> list[tuple[Any, ...]]:
    from inferwatch.wire import EV_REQUEST

    rnd = random.Random(7)
    ctx = ("bench", "m", "v1")
    now = 1_700_000_000_000_000_000
    out: list[tuple[Any, ...]] = []
    for i in range(n):
        d1, d2, d3 = (int(rnd.lognormvariate(mu, 1.0)) for mu in (10.8, 14.5, 9.2))
        trace = rnd.randbytes(16) if i % 4 == 0 else None
        out.append((EV_REQUEST, ctx, now + i * 1000, d1 + d2 + d3 + 20_000, 0, None, f"req-{i:08d}", trace,
                    [("preprocess", d1, None), ("inference", d2, None), ("postprocess", d3, None)]))
    return out


def load_aggregator(path: str | None) -> Any:
    if path is None:
        from inferwatch_sidecar.aggregate import aggregator

        return aggregator
    spec = importlib.util.spec_from_file_location("_iw_baseline_aggregator", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def child(loops: int, n: int, path: str | None) -> None:
    from inferwatch_sidecar.components.base import ComponentContext

    mod = load_aggregator(path)
    evs = events(n)
    frames = [evs[i:i + 64] for i in range(0, n, 64)]  # one decoded frame is about 64 events
    agg = mod.Aggregator(ComponentContext())
    counts = [0] * 16
    for _ in range(loops):
        for f in frames:
            agg.process(f, counts)
    assert sum(counts) == loops * n


def instructions(loops: int, n: int, path: str | None) -> int:
    return callgrind_instructions([sys.executable, __file__, "--child", str(loops), str(n), *([path] if path else [])])


def per_event(loops: int, n: int, path: str | None) -> float:
    return (instructions(loops, n, path) - instructions(0, n, path)) / (loops * n)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loops", type=int, default=5, help="passes over the events (default 5)")
    ap.add_argument("--events", type=int, default=4000, help="REQUEST events per pass (default 4000)")
    ap.add_argument("--baseline", metavar="REV", help="also measure the aggregator at this git revision")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(int(a.child[0]), int(a.child[1]), a.child[2] if len(a.child) > 2 else None)
        return 0
    rows = [("this tree", per_event(a.loops, a.events, None))]
    if a.baseline:
        src = subprocess.run(["git", "show", f"{a.baseline}:{AGG_PATH}"], cwd=REPO, capture_output=True,
                             check=True).stdout
        with tempfile.TemporaryDirectory() as tmp:
            p = os.path.join(tmp, "aggregator_baseline.py")
            Path(p).write_bytes(src)
            rows.append((f"baseline {a.baseline}", per_event(a.loops, a.events, p)))
    print(f"Aggregator.process, REQUEST event with 3 stages: instructions per event "
          f"({a.loops} x {a.events} events, callgrind)")
    for label, ir in rows:
        print(f"  {label:<20} {ir:10.0f}")
    if len(rows) == 2:
        print(f"  ratio this/baseline  {rows[0][1] / rows[1][1]:10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

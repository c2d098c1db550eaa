"""The saturation verdict on a big random family of traces per resource (the tests run a small one).

For each resource (compute, memory_bandwidth, kv_cache, queue, host_cpu) and ``none``,
``--traces`` random traces of ``--minutes`` minutes (``components/saturation/traces.py``:
random baselines under the thresholds, onset, ramp, saturated level and noise; GPU
counters from the fake GPM's roofline model) are judged by a fresh verdict each, and
``--steady`` traces per resource of ``--hours`` simulated hours of steady load (saturated
from the start, or all under the thresholds for ``none``) count flaps: changes of the
bound resource after the first minute. Printed per resource: share named right, traces
where another resource was ever named, the detection delay from onset (median, p95,
max; the bar is 30 s), and flaps (the bar is 0 over 24 h).

Usage::

    python bench/saturation_family.py                     # 50 traces x 10 min, 2 x 24 h steady per resource
    python bench/saturation_family.py --traces 10 --steady 1 --hours 2
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "sdk"), str(REPO / "sidecar"), str(REPO)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=int, default=50)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--steady", type=int, default=2)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--seed", type=int, default=2025)
    args = ap.parse_args()

    from inferwatch_sidecar.components.saturation import traces
    from inferwatch_sidecar.components.saturation.rules import RESOURCES

    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    print(f"{args.traces} traces x {args.minutes:g} min and {args.steady} x {args.hours:g} h steady per resource "
          f"(seed {args.seed})")
    print(f"{'resource':18s} {'right':>7s} {'wrong':>6s} {'delay p50':>10s} {'p95':>6s} {'max':>6s} {'flaps':>6s}")
    ok = True
    for r in (*RESOURCES, "none"):
        outs = [traces.judge_trace(traces.draw(rng, r, args.minutes * 60)) for _ in range(args.traces)]
        right = sum(o.named == r for o in outs)
        wrong = sum(o.named_wrong for o in outs)
        delays = sorted(o.delay_s for o in outs if o.delay_s is not None)
        flaps = sum(traces.judge_trace(traces.draw(rng, r, args.hours * 3600, steady=True)).flaps
                    for _ in range(args.steady))
        if delays:
            p95 = delays[min(len(delays) - 1, int(0.95 * len(delays)))]
            d = f"{statistics.median(delays):9.1f}s {p95:5.1f}s {delays[-1]:5.1f}s"
        else:
            d = f"{'-':>10s} {'-':>6s} {'-':>6s}"
        print(f"{r:18s} {right:3d}/{len(outs):<3d} {wrong:6d} {d} {flaps:6d}")
        ok &= right == len(outs) and wrong == 0 and flaps == 0 and (not delays or delays[-1] <= 30.0)
    print(f"bars (right resource within 30 s, 0 flaps, none below thresholds): {'met' if ok else 'NOT met'}"
          f"  [{time.perf_counter() - t0:.0f} s]")


if __name__ == "__main__":
    main()

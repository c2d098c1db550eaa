"""Drift scoring speed: inferwatch's engine vs scipy per-feature KS vs Evidently's DataDriftPreset.

The same 20k-row x 50-feature reference and current data are scored three
ways, side by side in one run:

- ours: ``engine.compare_columns`` against a profile built once from the
  reference (binning the 1M current values plus every test, BH and the
  decision); and the sidecar's periodic evaluation of a window that is
  already binned (what runs every few seconds);
- scipy: ``scipy.stats.ks_2samp`` on each feature's raw samples;
- Evidently 0.7 ``Report([DataDriftPreset()]).run(...)`` (no HTML rendering).

It also measures the drift state bytes per feature of the streaming
component and checks they do not grow with traffic.

Targets (docs/drift.md): ours <= 50 ms and >= 100x faster than Evidently;
<= 16 KB of state per feature.

Usage: python bench/drift_speed.py [--quick] [--rows 20000] [--features 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np


def timeit(fn: Callable[[], Any], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def state_bytes(features: int) -> dict[str, Any]:
    from inferwatch.wire import EV_RECORD, Schema
    from inferwatch_sidecar.components.base import ComponentContext
    from inferwatch_sidecar.components.drift import profile as prof
    from inferwatch_sidecar.components.drift.component import DriftComponent
    from inferwatch_sidecar.components.drift.config import DriftConfig

    rng = np.random.default_rng(1)
    n = 5000
    p = prof.build({f"x{i}": rng.normal(size=n) for i in range(features)},
                   {"c": [f"cat{k}" for k in rng.integers(0, 40, n)]})
    comp = DriftComponent(DriftConfig(window_events=10_000), ComponentContext(), p)
    import struct

    names = tuple(f"x{i}" for i in range(features))
    sch = Schema(1, names, ("c",), struct.Struct(f"<{features}d"), struct.Struct("<H"))
    sizes = []
    for rounds in (1, 10):
        for _ in range(rounds):
            vals = rng.normal(size=(2000, features))
            cats = rng.integers(0, 60, 2000)
            recs = [(EV_RECORD, ("s", "m", "v"), 0, None, None, None, None,
                     (sch, tuple(vals[i].tolist()), (f"cat{cats[i]}",))) for i in range(2000)]
            comp.handle(1, 1, recs)
            comp.drain()
        mon = comp.monitors[("m", "v")]
        sizes.append({n_: cw.nbytes for n_, cw in mon.columns.items()})
    num = [v for k, v in sizes[-1].items() if k != "c"]
    return {"numeric_bytes": max(num), "categorical_bytes": sizes[-1]["c"], "stable": sizes[0] == sizes[-1],
            "events_seen": comp.monitors[("m", "v")].window_rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (< 60 s)")
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--features", type=int, default=50)
    args = ap.parse_args(argv)
    reps_fast = 5 if args.quick else 21
    reps_slow = 1 if args.quick else 3

    from scipy import stats as sps

    from inferwatch_sidecar.components.drift import engine
    from inferwatch_sidecar.components.drift import profile as prof

    rng = np.random.default_rng(0)
    n, k = args.rows, args.features
    ref = rng.normal(size=(n, k))
    cur = rng.normal(size=(n, k))
    cur[:, : k // 10] += 0.2  # a tenth of the features shift by 0.2 sigma
    names = [f"f{i}" for i in range(k)]
    ref_cols = {nm: ref[:, i] for i, nm in enumerate(names)}
    cur_cols = {nm: np.ascontiguousarray(cur[:, i]) for i, nm in enumerate(names)}
    settings = engine.Settings()

    t0 = time.perf_counter()
    p = prof.build(ref_cols, {})
    build_s = time.perf_counter() - t0
    ours = timeit(lambda: engine.compare_columns(p, cur_cols, {}, settings), reps_fast)
    sums = {nm: engine.summarize_numeric(p.columns[nm], cur_cols[nm]) for nm in names}
    ours_eval = timeit(lambda: engine.evaluate(p, sums, settings), reps_fast)
    ev = engine.compare_columns(p, cur_cols, {}, settings)
    scipy_t = timeit(lambda: [sps.ks_2samp(ref[:, i], cur[:, i]) for i in range(k)], max(reps_slow, 3))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pandas as pd
        from evidently import Report
        from evidently.presets import DataDriftPreset

        ref_df, cur_df = pd.DataFrame(ref, columns=names), pd.DataFrame(cur, columns=names)
        evid = timeit(lambda: Report([DataDriftPreset()]).run(cur_df, ref_df), reps_slow)

    med = statistics.median
    sb = state_bytes(k)
    print(f"drift scoring, {k} features x {n} rows (medians; profile build once: {build_s * 1e3:.0f} ms)")
    print(f"  {'method':<44} {'median':>10} {'vs ours':>9}")
    rows = [
        ("inferwatch engine (bin + test + BH + decide)", med(ours)),
        ("inferwatch window evaluation (already binned)", med(ours_eval)),
        ("scipy ks_2samp per feature (raw samples)", med(scipy_t)),
        ("Evidently 0.7 DataDriftPreset run()", med(evid)),
    ]
    for name, t in rows:
        print(f"  {name:<44} {t * 1e3:>8.1f}ms {t / med(ours):>8.1f}x")
    print(f"  drifted features found by ours: {ev.n_drifted} of {k} (expected {k // 10})")
    print(f"state per feature: numeric {sb['numeric_bytes']} B, categorical (40 categories) "
          f"{sb['categorical_bytes']} B, unchanged after 10x traffic: {sb['stable']}")
    ok_abs = med(ours) <= 0.050
    ok_ratio = med(evid) / med(ours) >= 100
    ok_mem = max(sb["numeric_bytes"], sb["categorical_bytes"]) <= 16 * 1024 and sb["stable"]
    print(f"targets: ours <= 50 ms: {'PASS' if ok_abs else 'FAIL'}; >= 100x Evidently: "
          f"{'PASS' if ok_ratio else 'FAIL'} ({med(evid) / med(ours):.0f}x); <= 16 KB/feature: "
          f"{'PASS' if ok_mem else 'FAIL'}")
    return 0 if (ok_abs and ok_ratio and ok_mem) else 1


if __name__ == "__main__":
    sys.exit(main())

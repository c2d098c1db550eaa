"""Render time of /metrics: text (prometheus_client, today's format) against the protobuf exposition.

One aggregator holds the reference workload scaled until its text exposition has about
``--series`` series (default 10,000; docs/scale.md): label sets of 5 stages, one streaming.
Both renders run side by side, alternating, ``--runs`` times; medians are printed. The
protobuf render includes the collection (as a scrape does), so the two are like for like:
the same families, one written as text with classic buckets, the other as protobuf with
native histograms (and, with ``--classic``, classic buckets alongside).

Usage::

    python bench/exposition.py                 # 10,000 text series
    python bench/exposition.py --series 2000 --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "sdk"), str(REPO / "sidecar"), str(REPO)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=int, default=10_000, help="text series to reach (default 10000)")
    ap.add_argument("--runs", type=int, default=9, help="renders of each format (default 9)")
    ap.add_argument("--classic", action="store_true", help="protobuf carries classic buckets too")
    args = ap.parse_args()

    from prometheus_client import CollectorRegistry, generate_latest
    from tests.scale.test_series_budget import reference_events

    from inferwatch_sidecar.aggregate.aggregator import CONFIGURABLE_HISTOGRAMS, Aggregator
    from inferwatch_sidecar.components.base import ComponentContext
    from inferwatch_sidecar.metrics import protobuf
    from inferwatch_sidecar.metrics.budget import Workload, aggregator_series
    from inferwatch_sidecar.metrics.families import CatalogCollector

    per_set = sum(aggregator_series(Workload(models=1, versions=1), native=False).values())
    versions = max(1, round(args.series / per_set))
    w = Workload(models=1, versions=versions)
    ctx = ComponentContext(default_label_budget=100_000)
    agg = Aggregator(ctx, frozenset({"queue"}), max_label_sets=100_000,
                     native_classic=CONFIGURABLE_HISTOGRAMS if args.classic else ())
    evs = reference_events(w, 20, 1)
    agg.process(evs, [0] * 16)
    reg = CollectorRegistry()
    reg.register(CatalogCollector(agg.collect, ()))
    # "Today": the same traffic in an aggregator that keeps classic buckets alone (no cells to fold).
    old = Aggregator(ctx, frozenset({"queue"}), max_label_sets=100_000, native_schema=None)
    old.process(evs, [0] * 16)
    old_reg = CollectorRegistry()
    old_reg.register(CatalogCollector(old.collect, ()))
    assert generate_latest(old_reg) == generate_latest(reg)
    text, pb = generate_latest(reg), protobuf.encode(reg)
    n_text = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    t_old, t_text, t_pb = [], [], []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        generate_latest(old_reg)
        t1 = time.perf_counter()
        generate_latest(reg)
        t2 = time.perf_counter()
        protobuf.encode(reg)
        t3 = time.perf_counter()
        t_old.append(t1 - t0)
        t_text.append(t2 - t1)
        t_pb.append(t3 - t2)
    mo, mt, mp = statistics.median(t_old), statistics.median(t_text), statistics.median(t_pb)
    print(f"label sets: {versions} ({per_set} text series each); text series: {n_text}; "
          f"native series: {sum(aggregator_series(w, native=True).values())}")
    print(f"text, classic-only aggregator (today): {mo * 1e3:8.1f} ms  {len(text) / 1e6:6.2f} MB  "
          f"(medians of {args.runs})")
    print(f"text, with native cells:               {mt * 1e3:8.1f} ms  ratio to today {mt / mo:.2f}")
    print(f"protobuf:                              {mp * 1e3:8.1f} ms  {len(pb) / 1e6:6.2f} MB  "
          f"ratio to today's text {mp / mo:.2f}" + ("  (classic buckets alongside)" if args.classic else ""))


if __name__ == "__main__":
    main()

"""Parse time of an engine /metrics body with 5,000 series: inferwatch's parser against prometheus_client's.

The body is a real vLLM exposition (``tests/fixtures/vllm_metrics.txt``) repeated under
distinct ``model_name`` values until it holds ``--series`` sample lines, so every series
is one the engines component reads or skips in a real scrape (histogram buckets,
counters, process metrics). Three parses run side by side, alternating, ``--runs`` times;
medians are printed: prometheus_client's ``text_string_to_metric_families`` (all
series), ours without a filter (all series) and ours as the component runs it (the
engines filter, then the neutral extraction). The target: under 20 ms for 5,000 series.

Usage::

    python bench/engine_parse.py                # 5,000 series, 15 runs
    python bench/engine_parse.py --series 20000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "sdk"), str(REPO / "sidecar"), str(REPO)]


def body(series: int) -> tuple[str, int]:
    base = [ln for ln in (REPO / "tests/fixtures/vllm_metrics.txt").read_text().splitlines()]
    samples = [ln for ln in base if ln and not ln.startswith("#") and 'model_name="tiny-llama"' in ln]
    out, n, i = [], 0, 0
    while n < series:
        for ln in samples:
            out.append(ln.replace('model_name="tiny-llama"', f'model_name="model-{i}"'))
            n += 1
            if n >= series:
                break
        i += 1
    return "\n".join(out) + "\n", n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()

    from prometheus_client.parser import text_string_to_metric_families

    from inferwatch_sidecar.components.engines import kinds, promtext

    text, n = body(args.series)

    def theirs() -> int:
        return sum(len(f.samples) for f in text_string_to_metric_families(text))

    def ours_all() -> int:
        return len(promtext.parse(text).series)

    def ours_component() -> int:
        p = promtext.parse(text, kinds.wanted)
        return len(kinds.extract("vllm", p.series).models)

    fns = {"prometheus_client": theirs, "inferwatch (all series)": ours_all,
           "inferwatch (engines filter + extract)": ours_component}
    times: dict[str, list[float]] = {k: [] for k in fns}
    counts = {k: f() for k, f in fns.items()}
    for _ in range(args.runs):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    print(f"{n} series, {len(text)} bytes, {args.runs} runs (medians)")
    ref = statistics.median(times["prometheus_client"])
    for k in fns:
        med = statistics.median(times[k])
        print(f"  {k:40s} {1e3 * med:8.2f} ms  ({ref / med:5.1f}x prometheus_client; result {counts[k]})")
    best = statistics.median(times["inferwatch (engines filter + extract)"])
    print(f"target 20 ms for 5,000 series: {'met' if best * 5000 / n < 0.020 else 'NOT met'}")


if __name__ == "__main__":
    main()

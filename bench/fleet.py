"""The fleet, measured: N simulated sidecars scraped by a real Prometheus with the fleet rules loaded.

Each simulated sidecar is a real :class:`Aggregator` for one replica: the fleet's replicas serve
3 models in 2 versions (replica ``i`` serves model ``i % 3``, version ``i // 3 % 2``), every request
has 5 stages (``queue``, ``preprocess``, ``inference``, ``postprocess``, and a streaming ``generate``),
and each replica has its own latency scale and request rate, so the fleet's traffic differs
replica by replica. One HTTP server serves every replica's ``/metrics`` through the sidecar's own
content negotiation (``scrape_registry``) at ``/r/<i>/metrics``; Prometheus scrapes each as its
own target (``instance=replica-<i>``) and loads ``alerts/inferwatch.rules.yml``.

For each N and each mode (``classic``: Prometheus without native histograms, so it scrapes
OpenMetrics; ``native``: ``--enable-feature=native-histograms``, so it scrapes protobuf), traffic
runs for ``--seconds``, then stops; after two more scrapes the script reads from Prometheus:

- head series (``prometheus_tsdb_head_series``), resident memory and Go heap in use;
- scrape duration per target (median and max of ``scrape_duration_seconds``; it includes the
  simulated sidecars' render on this machine) and samples per scrape;
- rule evaluation: the sum of ``prometheus_rule_group_last_duration_seconds`` over the groups;
- the fleet check: P50/P99 by (model, model_version, stage) over every replica, from Prometheus,
  against one big aggregator that received every replica's events (what one sidecar would report),
  native against its native histogram, classic against its classic buckets: the worst relative
  difference (0 up to float rounding: summing histograms is merging them).

Usage (wrap in ``flock /tmp/bench.lock``; docs/scale.md quotes its output)::

    python bench/fleet.py                         # N = 10, 100, 500; 60 s of traffic each, 500: 120 s
    python bench/fleet.py --n 10 --seconds 20     # a quick look
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "sdk"), str(REPO / "sidecar"), str(REPO)]

STAGES = ("queue", "preprocess", "inference", "postprocess", "generate")
#: Median latency per stage, seconds, before a replica's own scale.
MEDIANS = {"queue": 2e-3, "preprocess": 80e-6, "inference": 25e-3, "postprocess": 40e-6, "generate": 0.4}


class Replica:
    """One simulated sidecar: an aggregator, its registry and its traffic generator."""

    def __init__(self, i: int, seed: int) -> None:
        from prometheus_client import CollectorRegistry

        from inferwatch_sidecar.aggregate.aggregator import Aggregator
        from inferwatch_sidecar.components.base import ComponentContext
        from inferwatch_sidecar.metrics.families import CatalogCollector

        self.i = i
        self.rnd = random.Random(seed * 100_003 + i)
        self.ctx = ("svc", f"model{i % 3}", f"v{i // 3 % 2}")
        self.scale = math.exp(self.rnd.gauss(0, 0.3))  # this replica's hardware / load
        self.rate = self.rnd.uniform(2, 8)  # requests per second (the series, not the load, are measured)
        self.agg = Aggregator(ComponentContext(), frozenset({"queue"}))
        self.registry = CollectorRegistry()
        self.registry.register(CatalogCollector(self.agg.collect, ()))
        self.lock = threading.Lock()

    def events(self, seconds: float) -> list[tuple[Any, ...]]:
        from inferwatch.wire import EV_REQUEST

        rnd, out = self.rnd, []
        now = time.time_ns()
        for k in range(max(1, int(self.rate * seconds))):
            stages = []
            for name in STAGES:
                d = rnd.lognormvariate(math.log(MEDIANS[name] * self.scale), 0.6)
                stream = None
                if name == "generate":
                    n = rnd.randint(16, 256)
                    stream = (int(d * 0.1e9), n, [int(d * 0.9e6 / n)] * (n - 1))
                stages.append((name, int(d * 1e9), stream))
            outcome = 1 if rnd.random() < 0.01 else 0
            out.append((EV_REQUEST, self.ctx, now, sum(s[1] for s in stages), outcome,
                        "Timeout" if outcome else None, f"{self.i}-{k}", None, stages))
        return out


class FleetServer:
    """Serves every replica's /metrics at /r/<i>/metrics."""

    def __init__(self, replicas: list[Replica]) -> None:
        from inferwatch_sidecar.http.routes import scrape_registry

        fleet = replicas

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = self.path.split("/")
                try:
                    r = fleet[int(parts[2])]
                except (IndexError, ValueError):
                    self.send_error(404)
                    return
                with r.lock:
                    body, ctype = scrape_registry(r.registry, self.headers.get("Accept", ""))
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # Prometheus gave up (scrape timeout)
                    pass

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def big_sidecar_quantiles(agg: Any, q: float) -> dict[tuple[str, str, str], tuple[float, float]]:
    """P(q) by (model, version, stage) of the one aggregator that received every event: (native, classic).

    Both computed as Prometheus 2.42 does (linear interpolation in the rank's bucket).
    """
    from inferwatch_sidecar.aggregate.aggregator import histogram_quantile
    from inferwatch_sidecar.metrics.native import native_quantile

    out = {}
    for lab, b in agg.bundles.items():
        for name, s in b.stages.items():
            h = s.layout.native(list(s.hist.counts), s.hist.sum, [])
            v = native_quantile(q, h)
            c = histogram_quantile(q, s.layout.classic, s.layout.classic_counts(s.hist.counts))
            if v is not None and c is not None:
                out[(lab[1], lab[2], name)] = (v, c)
    return out


def run(n: int, native: bool, seconds: float, interval: float, seed: int) -> dict[str, Any]:
    from tests.scale.promproc import Prom

    from inferwatch_sidecar.aggregate.aggregator import Aggregator
    from inferwatch_sidecar.components.base import ComponentContext

    replicas = [Replica(i, seed) for i in range(n)]
    srv = FleetServer(replicas)
    scrape = [{
        "job_name": "inferwatch", "scrape_interval": f"{interval:g}s", "scrape_timeout": f"{interval:g}s",
        "static_configs": [{"targets": [srv.address], "labels": {"__metrics_path__": f"/r/{i}/metrics",
                                                                 "instance": f"replica-{i}"}} for i in range(n)],
    }]
    big = Aggregator(ComponentContext(), frozenset({"queue"}))  # one sidecar receiving the whole fleet's events
    n_events = 0
    for r in replicas:  # a first batch, so the first scrape already sees every series
        evs = r.events(interval)
        r.agg.process(evs, [0] * 16)
        big.process(evs, [0] * 16)
        n_events += len(evs)
    try:
        with Prom("prometheus", scrape, native=native, rule_files=[REPO / "alerts" / "inferwatch.rules.yml"],
                  interval=f"{interval:g}s") as prom:
            t_end = time.monotonic() + seconds
            while time.monotonic() < t_end:
                t0 = time.monotonic()
                for r in replicas:
                    evs = r.events(interval)
                    with r.lock:
                        r.agg.process(evs, [0] * 16)
                    big.process(evs, [0] * 16)
                    n_events += len(evs)
                time.sleep(max(0.0, interval - (time.monotonic() - t0)))
            time.sleep(2.5 * interval)  # traffic stopped: two more scrapes and a rule evaluation see it all
            out: dict[str, Any] = {"n": n, "mode": "native" if native else "classic"}
            out["head_series"] = prom.metric("prometheus_tsdb_head_series")
            out["rss_mb"] = prom.metric("process_resident_memory_bytes") / 2**20
            out["heap_inuse_mb"] = prom.metric("go_memstats_heap_inuse_bytes") / 2**20
            durs = [float(x["value"][1]) for x in prom.query("scrape_duration_seconds")]
            samples = [float(x["value"][1]) for x in prom.query("scrape_samples_scraped")]
            up = sum(float(x["value"][1]) for x in prom.query("up"))
            out["targets_up"] = f"{up:g}/{n}"
            out["scrape_ms_median"] = statistics.median(durs) * 1e3
            out["scrape_ms_max"] = max(durs) * 1e3
            out["samples_per_scrape"] = statistics.median(samples)
            out["rule_eval_ms"] = prom.metric("prometheus_rule_group_last_duration_seconds") * 1e3
            # The fleet check: instant P50/P99 over all replicas against one big sidecar.
            checks, worst = 0, 0.0
            for q in (0.5, 0.99):
                want = big_sidecar_quantiles(big, q)
                expr = (f"histogram_quantile({q}, sum by (model, model_version, stage) "
                        "(inferwatch_stage_duration_seconds))" if native else
                        f"histogram_quantile({q}, sum by (model, model_version, stage, le) "
                        "(inferwatch_stage_duration_seconds_bucket))")
                for x in prom.query(expr):
                    key = (x["metric"]["model"], x["metric"]["model_version"], x["metric"]["stage"])
                    got, exp = float(x["value"][1]), want[key][0 if native else 1]
                    checks += 1
                    worst = max(worst, abs(got - exp) / exp)
            out["fleet_checks"] = checks
            out["fleet_worst"] = worst
            out["events"] = n_events
            return out
    finally:
        srv.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, nargs="+", default=[10, 100, 500], help="fleet sizes (default 10 100 500)")
    ap.add_argument("--seconds", type=float, default=60.0, help="traffic per run; N >= 500 runs twice as long")
    ap.add_argument("--interval", type=float, default=10.0, help="scrape and rule interval, seconds (default 10)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args()
    rows = []
    for n in args.n:
        for native in (False, True):
            secs = args.seconds * (2 if n >= 500 else 1)
            row = run(n, native, secs, args.interval, seed=1)
            print(json.dumps(row), flush=True)
            rows.append(row)
    print()
    print("| N | mode | head series | RSS MiB | heap MiB | scrape ms (median / max) | samples/scrape | rule eval ms |"
          " fleet check |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        check = f"{r['fleet_checks']} quantiles, worst {r['fleet_worst']:.1e}"
        print(f"| {r['n']} | {r['mode']} | {r['head_series']:.0f} | {r['rss_mb']:.0f} | {r['heap_inuse_mb']:.0f} | "
              f"{r['scrape_ms_median']:.1f} / {r['scrape_ms_max']:.1f} | {r['samples_per_scrape']:.0f} | "
              f"{r['rule_eval_ms']:.1f} | {check} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

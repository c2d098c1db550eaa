"""The fleet drift rules against one big sidecar, on a real Prometheus (issue 31, item 5).

N simulated replicas, each a real drift component (``DriftComponent``, the same reference profile
file, as alerts/drift.rules.yml requires) with its own traffic: replica ``i`` serves model version
``v1`` or ``v2`` (``i % 2``); ``v2`` is drifted (a shifted numeric feature and a changed category
mix), and every replica has its own scale of that shift and its own rate. Each replica's
``/metrics`` is served through the sidecar's own exposition to a real Prometheus scraping every
``--interval`` seconds with alerts/drift.rules.yml loaded (rule evaluation at the same interval).
One more drift component, the *big sidecar*, receives every replica's events after the start.

After ``--seconds`` of traffic and a pause of 3 intervals, it reads from Prometheus:

- **counts**: ``sum by (model, model_version, feature, bin) (inferwatch_drift_bin_events_total)``
  minus the same sum at the start, per bin, against the big sidecar's bin counts: the export,
  binning and fleet sum (must agree exactly);
- **rules**: the recorded ``model_feature:inferwatch_drift_psi:10m`` and
  ``model_feature:inferwatch_drift_chi2:10m`` against the engine's ``stats.psi`` and
  ``stats.chi2_goodness_of_fit`` on the big sidecar's counts: the worst relative difference. The
  rules use ``increase(...[10m])``, which extrapolates each replica's counters to the window's
  edges by up to about a scrape interval, so they agree with the big sidecar to within that
  extrapolation (PSI, a function of proportions, much more closely than chi-square, which grows
  with the count); the run prints both and the per-replica extrapolation factor's range;
- **arithmetic**: the engine's formulas on the rules' own ``...:increase10m`` bins against the
  recorded PSI and chi-square: the rules' arithmetic alone (float rounding);
- **share drifted**: ``model_feature:inferwatch_drift_feature_drifted:avg`` per version (the share
  of replicas whose own engine flags the feature), next to the big sidecar's verdict.

Usage (wrap in ``flock /tmp/bench.lock``; docs/scale.md quotes its output)::

    python bench/fleet_drift.py                   # N = 20, 40 s of traffic, 1 s scrapes
    python bench/fleet_drift.py --n 50 --seconds 60
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "sdk"), str(REPO / "sidecar"), str(REPO)]

COLORS = ["red", "green", "blue", "yellow"]


def _profile(path: Path) -> str:
    from inferwatch_sidecar.components.drift import profile as prof

    rng = np.random.default_rng(0)
    n = 20_000
    p = prof.build({"latency_ms": rng.lognormal(3, 0.5, n), "tokens": rng.normal(200, 40, n)},
                   {"color": list(rng.choice(COLORS, size=n, p=[0.4, 0.3, 0.2, 0.1]))}, source="bench")
    p.save(str(path))
    return str(path)


class Replica:
    """One simulated sidecar: a drift component, its registry, its traffic."""

    def __init__(self, i: int, ref: str, seed: int) -> None:
        from prometheus_client import CollectorRegistry

        from inferwatch.wire import Schema
        from inferwatch_sidecar.components.base import ComponentContext
        from inferwatch_sidecar.components.drift.component import build
        from inferwatch_sidecar.components.drift.config import DriftConfig
        from inferwatch_sidecar.export.budget import ExpositionBudget
        from inferwatch_sidecar.metrics.families import CatalogCollector

        self.i = i
        self.rng = np.random.default_rng(seed * 1000 + i)
        self.version = f"v{1 + i % 2}"
        self.shift = 0.0 if self.version == "v1" else float(self.rng.uniform(0.1, 0.6))
        self.rate = int(self.rng.integers(20, 80))  # records per second
        self.comp = build(DriftConfig(reference=ref, window_events=2_000_000), ComponentContext())
        self.registry = CollectorRegistry()
        self.registry.register(CatalogCollector(self.comp.collect, ()))
        self.view = ExpositionBudget(self.registry, 40_000, 5000)
        self.lock = threading.Lock()
        import struct

        self.schema = Schema(1, ("latency_ms", "tokens"), ("color",), struct.Struct("<2d"), struct.Struct("<1H"))

    def records(self, n: int) -> list[tuple[Any, ...]]:
        from inferwatch.wire import EV_RECORD

        r = self.rng
        lat = r.lognormal(3 + self.shift, 0.5, n)
        tok = r.normal(200, 40, n)
        p = [0.4 - self.shift / 2, 0.3, 0.2, 0.1 + self.shift / 2]
        col = r.choice(COLORS, size=n, p=p)
        return [(EV_RECORD, ("svc", "m", self.version), 0, None, None, None, None,
                 (self.schema, (float(lat[k]), float(tok[k])), (str(col[k]),))) for k in range(n)]


def feed(comp: Any, recs: list[tuple[Any, ...]]) -> None:
    comp.handle(1, 1, recs)
    comp.drain()


class Server:
    def __init__(self, replicas: list[Replica]) -> None:
        fleet = replicas

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                try:
                    r = fleet[int(self.path.split("/")[2])]
                except (IndexError, ValueError):
                    self.send_error(404)
                    return
                with r.lock:
                    body, ctype = r.view.render(self.headers.get("Accept", ""))
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _counts(snapshot_rows: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[int, float]]:
    out: dict[tuple[str, str, str], dict[int, float]] = {}
    for x in snapshot_rows:
        m = x["metric"]
        out.setdefault((m["model"], m["model_version"], m["feature"]), {})[int(m["bin"])] = float(x["value"][1])
    return out


def _big_counts(comp: Any) -> tuple[dict[Any, dict[int, float]], dict[Any, dict[int, float]]]:
    counts: dict[Any, dict[int, float]] = {}
    refs: dict[Any, dict[int, float]] = {}
    for fam in comp.collect():
        for s in fam.samples:
            if s.name == "inferwatch_drift_bin_events_total":
                target = counts
            elif s.name == "inferwatch_drift_reference_bin_ratio":
                target = refs
            else:
                continue
            lab = s.labels
            target.setdefault((lab["model"], lab["model_version"], lab["feature"]), {})[int(lab["bin"])] = s.value
    return counts, refs


@dataclasses.dataclass
class Observed:
    """What Prometheus recorded over the run: the fleet's bin counts, the rules' outputs, each replica's totals."""

    events: int
    start: dict[tuple[str, str, str], dict[int, float]]
    end: dict[tuple[str, str, str], dict[int, float]]
    psi_rule: dict[tuple[str, str, str], float]
    chi_rule: dict[tuple[str, str, str], float]
    share: dict[tuple[str, str, str], float]
    increase: dict[tuple[str, str, str], dict[int, float]]
    per_instance: list[dict[str, Any]]
    inst0: dict[str, float]
    inst1: dict[str, float]


def run(n: int, seconds: float, interval: float, seed: int) -> dict[str, Any]:
    from inferwatch_sidecar.components.base import ComponentContext
    from inferwatch_sidecar.components.drift.component import build
    from inferwatch_sidecar.components.drift.config import DriftConfig

    ref = _profile(Path(tempfile.mkdtemp(prefix="iw-fleet-drift-")) / "profile.json")
    replicas = [Replica(i, ref, seed) for i in range(n)]
    big = build(DriftConfig(reference=ref, window_events=50_000_000), ComponentContext())
    for r in replicas:  # one record each, so every series exists before the traffic (the big sidecar skips it)
        feed(r.comp, r.records(1))
        r.comp.evaluate()
    srv = Server(replicas)
    try:
        obs = _observe(replicas, big, srv, seconds, interval)
    finally:
        srv.server.shutdown()
    big.evaluate()
    out = _compare(big, obs)
    factors = [float(x["value"][1]) / (obs.inst1[i] - obs.inst0[i]) for x in obs.per_instance
               for i in [x["metric"]["instance"]] if obs.inst1.get(i, 0) > obs.inst0.get(i, 0)]
    return {"n": n, "seconds": seconds, "interval_s": interval, "events": obs.events, **out,
            "increase_factor_min": min(factors, default=math.nan),
            "increase_factor_max": max(factors, default=math.nan)}


def _by_key(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str], float]:
    return {(x["metric"]["model"], x["metric"]["model_version"], x["metric"]["feature"]): float(x["value"][1])
            for x in rows}


def _observe(replicas: list[Replica], big: Any, srv: Server, seconds: float, interval: float) -> Observed:
    """Feed every replica and the big sidecar for ``seconds`` while a real Prometheus scrapes the replicas."""
    from tests.scale.promproc import Prom

    n = len(replicas)
    scrape = [{"job_name": "inferwatch", "scrape_interval": f"{interval:g}s", "scrape_timeout": f"{interval:g}s",
               "static_configs": [{"targets": [srv.address], "labels": {"__metrics_path__": f"/r/{i}/metrics",
                                                                        "instance": f"replica-{i}"}}
                                  for i in range(n)]}]
    fleet_sum = "sum by (model, model_version, feature, bin) (inferwatch_drift_bin_events_total)"
    with Prom("prometheus", scrape, native=False, rule_files=[REPO / "alerts" / "drift.rules.yml"],
              interval=f"{interval:g}s") as prom:
        by_inst = "sum by (instance) (inferwatch_drift_bin_events_total)"
        deadline = time.monotonic() + 60
        while len(prom.query(by_inst)) < n and time.monotonic() < deadline:  # every replica scraped once
            time.sleep(interval / 2)
        time.sleep(2 * interval)
        start = _counts(prom.query(fleet_sum))
        inst0 = {x["metric"]["instance"]: float(x["value"][1]) for x in prom.query(by_inst)}
        t_end = time.monotonic() + seconds
        events = 0
        while time.monotonic() < t_end:
            t0 = time.monotonic()
            for r in replicas:
                recs = r.records(max(1, int(r.rate * interval)))
                with r.lock:
                    feed(r.comp, recs)
                    r.comp.evaluate()
                feed(big, recs)
                events += len(recs)
            time.sleep(max(0.0, interval - (time.monotonic() - t0)))
        time.sleep(3 * interval)
        return Observed(
            events=events, start=start, end=_counts(prom.query(fleet_sum)),
            psi_rule=_by_key(prom.query("model_feature:inferwatch_drift_psi:10m")),
            chi_rule=_by_key(prom.query("model_feature:inferwatch_drift_chi2:10m")),
            share=_by_key(prom.query("model_feature:inferwatch_drift_feature_drifted:avg")),
            increase=_counts(prom.query("model_feature_bin:inferwatch_drift_bin_events:increase10m")),
            # Each replica's extrapolation: increase() over its own total against the true difference.
            per_instance=prom.query("sum by (instance) (increase(inferwatch_drift_bin_events_total[10m]))"),
            inst0=inst0, inst1={x["metric"]["instance"]: float(x["value"][1]) for x in prom.query(by_inst)},
        )


def _compare(big: Any, obs: Observed) -> dict[str, Any]:
    """The fleet's counts and rules against the big sidecar's counts and the engine's formulas."""
    from inferwatch_sidecar.stats import hypothesis as stats

    bc, br = _big_counts(big)
    count_diff, rows = 0.0, []
    worst_psi = worst_chi = arith = 0.0
    for key in sorted(bc):
        bins = sorted(br[key])
        want = np.array([bc[key].get(b, 0.0) for b in bins])
        got = np.array([obs.end.get(key, {}).get(b, 0.0) - obs.start.get(key, {}).get(b, 0.0) for b in bins])
        count_diff = max(count_diff, float(np.max(np.abs(got - want))))
        refp = np.array([br[key][b] for b in bins])
        psi = stats.psi(refp, stats.proportions(want))
        chi = stats.chi2_goodness_of_fit(want, refp)
        rp, rc = obs.psi_rule.get(key, math.nan), obs.chi_rule.get(key, math.nan)
        worst_psi = max(worst_psi, abs(rp - psi) / psi)
        worst_chi = max(worst_chi, abs(rc - chi) / chi)
        # The rules' arithmetic alone: the engine's formulas on the rules' own increase10m bins.
        ib = np.array([obs.increase.get(key, {}).get(b, 0.0) for b in bins])
        arith = max(arith, abs(rp - stats.psi(refp, stats.proportions(ib))) / max(rp, 1e-12),
                    abs(rc - stats.chi2_goodness_of_fit(ib, refp)) / max(rc, 1e-12))
        verdicts = {r.feature: r.drifted for r in (big.monitors[(key[0], key[1])].last.results)}
        rows.append({"model_version": key[1], "feature": key[2], "events": int(want.sum()),
                     "psi_big": psi, "psi_rule": rp, "chi2_big": chi, "chi2_rule": rc,
                     "share_drifted": obs.share.get(key), "big_drifted": verdicts.get(key[2])})
    return {"rows": rows, "count_max_abs_diff": count_diff, "psi_worst_rel": worst_psi,
            "rule_arithmetic_worst_rel": arith, "chi2_worst_rel": worst_chi}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20, help="replicas (default 20)")
    ap.add_argument("--seconds", type=float, default=40.0, help="seconds of traffic (default 40)")
    ap.add_argument("--interval", type=float, default=1.0, help="scrape and rule interval, seconds (default 1)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    args = ap.parse_args()
    out = run(args.n, args.seconds, args.interval, args.seed)
    print(f"N = {out['n']} replicas, {out['events']} records in {out['seconds']:g} s, scrape/rules every "
          f"{out['interval_s']:g} s")
    print(f"fleet bin counts (Prometheus sum of every replica) vs the big sidecar: max |diff| = "
          f"{out['count_max_abs_diff']:g} events")
    print("| version | feature | events | PSI big sidecar | PSI fleet rule | chi2 big sidecar | chi2 fleet rule |"
          " replicas drifted | big sidecar drifted |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in out["rows"]:
        print(f"| {r['model_version']} | {r['feature']} | {r['events']} | {r['psi_big']:.5f} | {r['psi_rule']:.5f} | "
              f"{r['chi2_big']:.1f} | {r['chi2_rule']:.1f} | {r['share_drifted']} | {r['big_drifted']} |")
    print(f"rules' arithmetic (engine formulas on the rules' own increase10m bins): worst relative difference "
          f"{out['rule_arithmetic_worst_rel']:.1e}")
    print(f"increase()[10m] / true increase per replica: {out['increase_factor_min']:.4f} to "
          f"{out['increase_factor_max']:.4f}")
    print(f"worst relative difference, rule vs big sidecar: PSI {out['psi_worst_rel']:.2e}, "
          f"chi2 {out['chi2_worst_rel']:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

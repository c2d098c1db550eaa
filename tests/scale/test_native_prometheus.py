"""A real Prometheus 2.42 scrapes the sidecar's /metrics with native histograms on, another with them off.

One aggregator, served through the sidecar's own content negotiation (``scrape_registry``):
the native Prometheus asks for protobuf first and stores one native series per histogram; the
classic one asks for OpenMetrics and stores the buckets. Traffic comes in three batches, each
scraped by both before the next, so both hold the same increases. Then:

- ``histogram_quantile`` over the native series agrees with the classic one within the classic
  bucket that holds the quantile, and with numpy's exact quantile within a native bucket's width;
- the generated recording rules (classic ``or`` native) give both Prometheus the same P50/P99/P999
  within that error, and the SLO ratio rules the same share of slow calls;
- the native Prometheus holds no ``_bucket`` series of the native families.
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from inferwatch_sidecar.aggregate.aggregator import Aggregator
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.http.routes import scrape_registry
from inferwatch_sidecar.metrics import core as core_metrics
from inferwatch_sidecar.metrics.families import CatalogCollector
from inferwatch_sidecar.metrics.protobuf import CONTENT_TYPE
from tests.scale.promproc import Prom

pytestmark = pytest.mark.prometheus
REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "alerts" / "inferwatch.rules.yml"
STAGE = "inferwatch_stage_duration_seconds"
BOUNDS = core_metrics.LATENCY_BUCKETS
WIDTH = 2 ** (1 / 8) - 1  # schema 3


class Sidecar:
    """An aggregator behind /metrics, counting the scrapes of each kind."""

    def __init__(self) -> None:
        self.agg = Aggregator(ComponentContext())
        self.registry = CollectorRegistry()
        self.registry.register(CatalogCollector(self.agg.collect, ()))
        self.scrapes = {"protobuf": 0, "text": 0}
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body, ctype = scrape_registry(outer.registry, self.headers.get("Accept", ""))
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                with outer.lock:
                    outer.scrapes["protobuf" if ctype == CONTENT_TYPE else "text"] += 1

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.scrapes["protobuf"], self.scrapes["text"]

    def wait_both_scraped(self, timeout: float = 30.0) -> None:
        """Until each Prometheus has scraped twice more (once may have started before the last batch)."""
        p0, t0 = self.counts()
        deadline = time.monotonic() + timeout
        while True:
            p, t = self.counts()
            if p >= p0 + 2 and t >= t0 + 2:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"scrapes did not come: protobuf {p0}->{p}, text {t0}->{t}")
            time.sleep(0.1)


def batch(rng: np.random.Generator, n: int) -> tuple[list[tuple[Any, ...]], dict[str, np.ndarray]]:
    """Requests of two models, each with a tokenize stage (~50 us) and an inference stage (~30 ms, some > 1 s)."""
    from inferwatch.wire import EV_REQUEST

    evs: list[tuple[Any, ...]] = []
    vals: dict[str, list[float]] = {"tokenize": [], "inference": []}
    for model, scale in (("a", 1.0), ("b", 3.0)):
        tok = rng.lognormal(math.log(50e-6 * scale), 0.5, n)
        inf = np.concatenate([rng.lognormal(math.log(30e-3 * scale), 0.7, n - n // 50),
                              rng.lognormal(math.log(1.5), 0.3, n // 50)])
        for k in range(n):
            t_ns, i_ns = int(tok[k] * 1e9), int(inf[k] * 1e9)
            evs.append((EV_REQUEST, ("svc", model, "v1"), time.time_ns(), t_ns + i_ns, 0, None, f"{model}{k}", None,
                        [("tokenize", t_ns, None), ("inference", i_ns, None)]))
            if model == "a":
                vals["tokenize"].append(t_ns * 1e-9)
                vals["inference"].append(i_ns * 1e-9)
    return evs, {k: np.asarray(v) for k, v in vals.items()}


def by_label(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in result}


def classic_bucket(v: float) -> tuple[float, float]:
    i = bisect_left(BOUNDS, v)
    return (BOUNDS[i - 1] if i else 0.0), BOUNDS[min(i, len(BOUNDS) - 1)]


def test_native_and_classic_prometheus_agree_on_quantiles_and_rules(prometheus_bin: str) -> None:
    sc = Sidecar()
    try:
        _check(sc, prometheus_bin)
    finally:
        sc.server.shutdown()
        sc.server.server_close()


def _check(sc: Sidecar, prometheus_bin: str) -> None:
    rng = np.random.default_rng(42)
    first, _ = batch(rng, 300)
    sc.agg.process(first, [0] * 16)  # what both see at their first scrape: rate() counts what follows
    scrape = [{"job_name": "inferwatch", "static_configs": [{"targets": [sc.target]}]}]
    later: dict[str, list[np.ndarray]] = {"tokenize": [], "inference": []}
    with Prom(prometheus_bin, scrape, native=True, rule_files=[RULES]) as native, \
            Prom(prometheus_bin, scrape, native=False, rule_files=[RULES]) as classic:
        sc.wait_both_scraped()
        for _ in range(2):
            evs, vals = batch(rng, 1500)
            sc.agg.process(evs, [0] * 16)
            for k, v in vals.items():
                later[k].append(v)
            sc.wait_both_scraped()
        time.sleep(2.5)  # a rule evaluation after the last scrape
        sel = f'{STAGE}{{model="a"}}'
        # Everything since start (instant), and the rate-based recording rules, on both.
        for q, qname in ((0.5, "p50"), (0.99, "p99"), (0.999, "p999")):
            nat = by_label(native.query(f"histogram_quantile({q}, {sel})"), "stage")
            cla = by_label(classic.query(f"histogram_quantile({q}, {STAGE}_bucket{{model=\"a\"}})"), "stage")
            assert set(nat) == set(cla) == {"tokenize", "inference"}, (nat, cla, native.log())
            rec = f'service_model_version_stage:inferwatch_stage_duration_seconds:{qname}_5m{{model="a"}}'
            rn, rc = by_label(native.query(rec), "stage"), by_label(classic.query(rec), "stage")
            for stage in ("tokenize", "inference"):
                lo, hi = classic_bucket(cla[stage])
                assert abs(nat[stage] - cla[stage]) <= hi - lo, (q, stage, nat[stage], cla[stage])
                lo, hi = classic_bucket(rc[stage])
                assert abs(rn[stage] - rc[stage]) <= hi - lo, (q, stage, rn[stage], rc[stage])
                # The exact quantile of the increases: the k-th smallest value, or anything up to the next one
                # when the rank q * n is a whole number k (2997 of 3000 for P99.9).
                xs = np.sort(np.concatenate(later[stage]))
                k = math.ceil(q * len(xs) - 1e-9)
                lo_x, hi_x = xs[k - 1], xs[min(k, len(xs) - 1)]
                assert lo_x * (1 - WIDTH) <= rn[stage] <= hi_x * (1 + WIDTH), (q, stage, rn[stage], lo_x, hi_x)
        # The SLO ratio: share of calls over 1 s (a bucket bound, and a native one: exact on both).
        slow = 'service_model_version_stage:inferwatch_stage_slow_p99:ratio_rate5m{model="a",stage="inference"}'
        sn, sc_ = by_label(native.query(slow), "stage"), by_label(classic.query(slow), "stage")
        want = float(np.mean(np.concatenate(later["inference"]) > 1.0))
        # Classic: rate() extrapolates each bucket series on its own (capped where it would cross zero), so
        # the bucket's and the count's rates differ a little; a native histogram is extrapolated as one.
        assert sn["inference"] == pytest.approx(want, abs=1e-9)
        assert sc_["inference"] == pytest.approx(want, rel=0.02)
        # One native series per stage histogram, no buckets; the classic Prometheus holds 31 per series.
        assert native.query(f'count({STAGE}_bucket)') == []
        assert by_label(native.query(f"count({STAGE})"), "")[""] == 4
        assert by_label(classic.query(f"count({STAGE}_bucket)"), "")[""] == 4 * (len(BOUNDS) + 1)
        # Counts agree exactly.
        nc = by_label(native.query(f"histogram_count({sel})"), "stage")
        cc = by_label(classic.query(f"{STAGE}_count{{model=\"a\"}}"), "stage")
        assert nc == cc == {"tokenize": 3300.0, "inference": 3300.0}

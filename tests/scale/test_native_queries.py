"""Every dashboard panel, dashboard variable and rule that reads one of the aggregator's histograms works when
the sidecars expose them as native histograms only (``aggregate.native.classic_families: []``, the default).

A Prometheus that ingests a native histogram keeps one series of it: no ``_bucket``, ``_sum`` or ``_count``.
A query that reads those alone is empty on such a Prometheus, so each must read the native histogram as well
(``classic or native``, as the recording rules do).

- statically: every query and rule expression naming ``<family>_bucket``, ``_sum`` or ``_count`` of a family
  the aggregator may serve natively names the family itself too;
- live: one aggregator with traffic in every such family (and give-ups shorter than the server's median), served
  through the sidecar's own content negotiation to a real Prometheus 2.42 with native histograms on and to one
  without, both loading the rules (second-scale windows): each panel query, variable and recording rule that
  reads such a family answers on both, for the same label sets, and ``InferwatchTimeoutMismatch`` fires on both.
"""

from __future__ import annotations

import json
import math
import random
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts import generate as rules_gen
from alerts import promql, source
from dashboards import generate as dash
from inferwatch.wire import EV_BATCH, EV_HTTP, EV_REQUEST, OUTCOME_CANCELLED, OUTCOME_OK
from inferwatch_sidecar.aggregate.aggregator import CONFIGURABLE_HISTOGRAMS
from inferwatch_sidecar.metrics.budget import Workload
from tests.scale.promproc import Prom
from tests.scale.test_native_prometheus import Sidecar
from tests.scale.test_series_budget import reference_events

REPO = Path(__file__).resolve().parents[2]
#: Rule windows at 1/100 of production (15m -> 9s, for: 10m -> 6s), never under 4 s of 1 s scrapes.
PROFILE = source.Profile(name="native-test", scale=1 / 100, min_seconds=4.0)
#: ``$__rate_interval`` for the panel queries: several scrapes of the traffic.
RATE = "8s"
#: Parts of a histogram family that a Prometheus ingesting it natively does not keep.
_CLASSIC_PARTS = ("_bucket", "_sum", "_count")


def classic_only(expr: str) -> list[str]:
    """The native-capable families ``expr`` reads only through their classic series."""
    names = promql.series_names(expr)
    # A {__name__=~"family(_count)?"} selector reads both.
    names |= {m for fam in CONFIGURABLE_HISTOGRAMS for m in (fam, fam + "_count")
              if re.search(r'__name__\s*=~\s*"' + re.escape(fam) + r"\(_count\)\?\"", expr)}
    return [fam for fam in CONFIGURABLE_HISTOGRAMS
            if any(fam + part in names for part in _CLASSIC_PARTS) and fam not in names]


def _reads_native_family(expr: str) -> bool:
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr))
    return any(fam + part in words for fam in CONFIGURABLE_HISTOGRAMS for part in ("", *_CLASSIC_PARTS))


def _rules() -> list[dict[str, Any]]:
    out = []
    for f in source.RULE_FILES:
        for g in yaml.safe_load(rules_gen.rule_file_yaml(f, source.PRODUCTION))["groups"]:
            out += g["rules"]
    return out


def _variables() -> list[tuple[str, str, str]]:
    """(dashboard uid, variable, label_values query) of every dashboard."""
    out = []
    for path in sorted((REPO / "dashboards").glob("*.json")):
        b = json.loads(path.read_text())
        for v in b["templating"]["list"]:
            q = v.get("query")
            if v["type"] == "query" and isinstance(q, dict):
                out.append((b["uid"], v["name"], q["query"]))
    return out


def test_every_histogram_query_and_rule_reads_the_native_histogram_too() -> None:
    bad = [f"panel {q.dashboard} / {q.panel}: {fams}" for q in dash.panel_queries()
           if (fams := classic_only(q.expr))]
    bad += [f"rule {r.get('alert') or r.get('record')}: {fams}" for r in _rules() if (fams := classic_only(r["expr"]))]
    bad += [f"variable {uid} ${name}: {fams}" for uid, name, q in _variables() if (fams := classic_only(q))]
    assert not bad, "\n".join(bad)
    # The check itself: a classic-only quantile is caught, the classic-or-native one is not.
    b = "histogram_quantile(0.5, sum by (le) (rate(inferwatch_request_duration_seconds_bucket[5m])))"
    assert classic_only(b) == ["inferwatch_request_duration_seconds"]
    assert classic_only(b + " or histogram_quantile(0.5, sum(rate(inferwatch_request_duration_seconds[5m])))") == []


# -- live ---------------------------------------------------------------------------------------------------------

#: A model whose server takes about 12 s while its clients give up after about 4 s (InferwatchTimeoutMismatch).
SLOW = ("svc", "chat", "v1")


def _events(rnd: random.Random, tick: int) -> list[tuple[Any, ...]]:
    """One tick of traffic: the reference workload's requests (5 stages, a queue, a stream), batches, and the
    slow model's requests and HTTP events (a fifth of them given up at about 4 s)."""
    evs = reference_events(Workload(models=1, versions=1), 30, tick)
    ctx = ("svc", "model0", "v0")
    evs += [(EV_BATCH, ctx, rnd.choice((1, 2, 4, 8))) for _ in range(10)]
    now = time.time_ns()
    for k in range(20):
        lat = rnd.lognormvariate(math.log(12.0), 0.2)
        evs.append((EV_REQUEST, SLOW, now, int(lat * 1e9), OUTCOME_OK, None, None, None, []))
        gave_up = k % 5 == 0
        evs.append((EV_HTTP, SLOW, now, "/generate", 499 if gave_up else 200,
                    OUTCOME_CANCELLED if gave_up else OUTCOME_OK, 0,
                    int(rnd.uniform(3.5, 4.5) * 1e9) if gave_up else 0, False, f"t{tick}-{k}"))
    return evs


def _series(result: list[dict[str, Any]]) -> set[tuple[tuple[str, str], ...]]:
    return {tuple(sorted((k, v) for k, v in r["metric"].items() if k != "le")) for r in result}


def test_native_only_prometheus_fills_every_histogram_panel_variable_and_rule(prometheus_bin: str,
                                                                              tmp_path: Path) -> None:
    sc = Sidecar()
    stop = threading.Event()
    rnd = random.Random(5)

    def feed() -> None:
        tick = 0
        while not stop.is_set():
            evs = _events(rnd, tick)
            with sc.agg.lock:
                sc.agg.process(evs, [0] * 16)
            tick += 1
            stop.wait(0.5)

    feeder = threading.Thread(target=feed, daemon=True)
    rule_files = rules_gen.write_rule_files(tmp_path / "rules", PROFILE)
    scrape = [{"job_name": "inferwatch", "static_configs": [{"targets": [sc.target]}]}]
    try:
        with Prom(prometheus_bin, scrape, native=True, rule_files=rule_files) as native, \
                Prom(prometheus_bin, scrape, native=False, rule_files=rule_files) as classic:
            feeder.start()
            _check(native, classic)
    finally:
        stop.set()
        feeder.join(timeout=10)
        sc.server.shutdown()
        sc.server.server_close()


def _firing(prom: Prom) -> set[str]:
    return {a["labels"]["alertname"] for a in prom.api("alerts")["alerts"] if a["state"] == "firing"}


def _check(native: Prom, classic: Prom) -> None:
    # The alerts that read a native-capable histogram fire on both (this traffic is built to fire them).
    alerts = {r["alert"] for r in _rules() if "alert" in r and _reads_native_family(r["expr"])}
    assert alerts == {"InferwatchTimeoutMismatch"}, alerts
    deadline = time.monotonic() + 60
    while not (alerts <= _firing(native) and alerts <= _firing(classic)):
        assert time.monotonic() < deadline, (_firing(native), _firing(classic), native.log())
        time.sleep(0.5)
    # The native Prometheus holds no classic series of the native families (so the check below means something).
    for fam in CONFIGURABLE_HISTOGRAMS:
        assert native.query(f"count({{__name__=~\"{fam}_(bucket|sum|count)\"}})") == [], fam
        assert native.query(f"count({fam})"), fam

    problems = []
    for q in dash.panel_queries():
        if not _reads_native_family(q.expr):
            continue
        expr = dash.substitute(q.expr, rate_interval=RATE, range_="30s")
        n, c = native.query(expr), classic.query(expr)
        if not c:
            problems.append(f"{q.dashboard} / {q.panel} [{q.ref}]: empty on the classic Prometheus too")
        elif not n:
            problems.append(f"{q.dashboard} / {q.panel} [{q.ref}]: empty with native histograms")
        elif "le" not in (c[0]["metric"]) and _series(n) != _series(c):
            problems.append(f"{q.dashboard} / {q.panel} [{q.ref}]: {_series(n)} against {_series(c)}")
    for uid, name, query in _variables():
        m = re.fullmatch(r"label_values\((.*), *(\w+)\)", query)
        if not m or not _reads_native_family(m.group(1)):
            continue
        sel = dash.substitute(m.group(1))
        got = [native.api(f"label/{m.group(2)}/values", **{"match[]": sel}),
               classic.api(f"label/{m.group(2)}/values", **{"match[]": sel})]
        if not got[0] or got[0] != got[1]:
            problems.append(f"variable {uid} ${name}: {got[0]} against {got[1]}")
    for r in _rules():
        if "record" in r and _reads_native_family(r["expr"]):
            n, c = native.query(r["record"]), classic.query(r["record"])
            if not n or _series(n) != _series(c):
                problems.append(f"rule {r['record']}: {_series(n)} against {_series(c)}")
    assert not problems, "\n".join(problems)


pytestmark = pytest.mark.prometheus

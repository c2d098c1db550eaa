"""The status page at ``GET /``: the latency section it reads, its safety, and the page itself in headless Chromium.

The browser test runs a live sidecar (fake NVML with a leaking process and two
copies of one model, the drift engine on a warm-up reference), sends it traffic over the JSON
endpoint and from the real SDK, loads the page in Debian's ``chromium`` and
checks the values in its DOM against the traffic and ``/v1/status``; it also
saves a screenshot under the test's tmp dir.
"""

from __future__ import annotations

import html
import json
import random
import re
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from inferwatch.wire import EV_REQUEST
from inferwatch_sidecar.aggregate.aggregator import Aggregator, LatencyStatus, histogram_quantile
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.metrics.core import STAGE_DURATION_SECONDS
from tests.helpers.browser import Dom, SummaryBand, chromium, run_chromium
from tests.helpers.net import free_port
from tests.helpers.sidecar import REPO, wait_until

BOUNDS = STAGE_DURATION_SECONDS.buckets
assert BOUNDS is not None
#: A model name that would run script, or add an element, if the page inserted it as markup.
EVIL = '<script>document.title="pwned"</script><img src=x onerror="document.title=\'pwned\'">'


# -- quantiles ---------------------------------------------------------------------------------------------------


def test_histogram_quantile_agrees_with_prometheus(promtool: str, tmp_path: Path) -> None:
    bounds = (0.01, 0.05, 0.1, 0.5)
    cases = {"spread": [3, 0, 7, 12, 1], "one_bucket": [0, 0, 9, 0, 0], "tail": [1, 0, 0, 0, 4]}
    qs = (0.25, 0.5, 0.9, 0.99)
    series, tests = [], []
    for name, counts in cases.items():
        acc = 0
        for le, c in zip([*map(str, bounds), "+Inf"], counts, strict=True):
            acc += c
            series.append({"series": f'h_bucket{{case="{name}",le="{le}"}}', "values": f"{acc}"})
        for q in qs:
            ours = histogram_quantile(q, bounds, counts)
            tests.append({"expr": f'histogram_quantile({q}, h_bucket{{case="{name}"}})', "eval_time": "0m",
                          "exp_samples": [{"labels": f'{{case="{name}"}}', "value": ours}]})
    (tmp_path / "rules.yml").write_text("groups: []\n")
    (tmp_path / "q.test.yml").write_text(json.dumps({
        "rule_files": ["rules.yml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}],
    }))
    out = subprocess.run([promtool, "test", "rules", "q.test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert histogram_quantile(0.5, bounds, [0, 0, 0, 0, 0]) is None


def _requests(agg: Aggregator, n: int, seconds: float, stage_s: float) -> None:
    ns, stage_ns = int(seconds * 1e9), int(stage_s * 1e9)
    ev = (EV_REQUEST, ("svc", "m", "v1"), 0, ns, 0, None, None, None, [("inference", stage_ns, None)])
    with agg.lock:
        agg.process([ev] * n, [0] * 16)


def test_latency_status_covers_the_last_minute_and_counts_since_start() -> None:
    now = [1000.0]
    agg = Aggregator(ComponentContext(default_label_budget=100))
    lat = LatencyStatus(agg, window_s=60.0, every_s=10.0, monotonic=lambda: now[0])
    _requests(agg, 10, 0.003, 0.002)  # in (0.0025, 0.005] and (0.001, 0.0025]
    first = lat.status()
    assert first["window_s"] == 0.0 and first["label_sets"] == 1
    (m,) = first["models"]
    assert m["request"]["count"] == m["request"]["total"] == 10
    assert m["request"]["p50_s"] == pytest.approx(0.0025 + 0.0025 * 0.5, rel=1e-12)
    for t in range(1010, 1071, 10):  # the main loop samples every 10 s
        now[0] = float(t)
        lat.sample()
        if t == 1050:
            _requests(agg, 20, 0.03, 0.02)  # in (0.025, 0.05] and (0.01, 0.025]
    now[0] = 1075.0
    st = lat.status()
    # The oldest copy kept is the newest one at least 60 s old: t=1010, before the second burst only.
    assert st["window_s"] == 65.0
    (m,) = st["models"]
    req, inf = m["request"], m["stages"]["inference"]
    assert (req["count"], req["total"], inf["count"], inf["total"]) == (20, 30, 20, 30)
    for q, key in ((0.5, "p50_s"), (0.9, "p90_s"), (0.99, "p99_s")):
        assert req[key] == pytest.approx(0.025 + 0.025 * q, rel=1e-12)
        assert inf[key] == pytest.approx(0.01 + 0.015 * q, rel=1e-12)
    assert req["mean_s"] == pytest.approx(0.03, rel=1e-9)
    # Once the burst is older than the window, no call is left in it; the totals stay.
    for t in range(1080, 1131, 10):
        now[0] = float(t)
        lat.sample()
    (m,) = lat.status()["models"]
    assert m["request"] == {"count": 0, "total": 30, "mean_s": None, "p50_s": None, "p90_s": None, "p99_s": None}


def test_latency_status_shows_the_busiest_label_sets_first_within_its_cap() -> None:
    agg = Aggregator(ComponentContext(default_label_budget=100))
    lat = LatencyStatus(agg, max_label_sets=2)
    for i, n in enumerate((5, 50, 20)):
        ev = (EV_REQUEST, ("svc", f"m{i}", "v1"), 0, 1_000_000, 0, None, None, None, [])
        with agg.lock:
            agg.process([ev] * n, [0] * 16)
    with agg.lock:  # records alone make a label set without latency: it is left out
        agg.bundle(("svc", "records-only", "v1"))
    st = lat.status()
    assert st["label_sets"] == 3
    assert [(m["model"], m["request"]["total"]) for m in st["models"]] == [("m1", 50), ("m2", 20)]


# -- what the page may show --------------------------------------------------------------------------------------


def test_status_and_page_hold_no_credentials_and_need_no_token(sidecar_factory: Any) -> None:
    secret, token = "s3cr3t-value-1234", "admin-token-0123456789"
    collector = free_port()
    sc = sidecar_factory("--set", f"http.admin_token={token}", env={
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"http://user:{secret}@127.0.0.1:{collector}/v1/metrics?key={secret}",
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer {secret}",
        "OTEL_METRIC_EXPORT_INTERVAL": "100",
    })
    wait_until(lambda: sc.status()["otlp"].get("pushes_failed", 0) >= 1, what="a failed OTLP push")
    code, _, body = sc.get("/v1/status")
    assert code == 200
    assert secret not in body.decode() and token not in body.decode()
    st = json.loads(body)
    assert st["otlp"]["endpoint"] == f"http://127.0.0.1:{collector}/v1/metrics"
    assert st["otlp"]["headers"] == ["authorization"]
    code, headers, page = sc.get("/")
    assert code == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert secret not in page.decode() and token not in page.decode()
    assert b"/admin" not in page
    csp = headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "'unsafe-inline'" not in csp
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert sc.get("/admin/")[0] == 401  # the admin routes keep their token


# -- the page in a real browser ----------------------------------------------------------------------------------


def _post(sc: Any, model: str, events: list[dict[str, Any]]) -> None:
    code, answer = sc.post("/v1/events", json.dumps({"service": "json", "model": model, "model_version": "v1",
                                                     "events": events}).encode())
    assert code == 200 and answer["rejected"] == 0, answer


def test_status_page_in_chromium_shows_the_live_status(sidecar_factory: Any, tmp_path: Path, sock_path: str) -> None:
    browser = chromium()
    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text(textwrap.dedent("""\
        gpu:
          backend: fake
          interval_s: 0.05
          detector: {scales: [[2.0, 0.1]], warmup_s: 0, confirm_s: 0.2, clear_s: 30, tau_max_s: 0.3}
          duplicates: {flat_s: 0.5}
          fake: {processes: [{pid: 4242, base_gib: 4, leak_mib_per_s: 256}, {pid: 4343, base_gib: 2},
                             {pid: 4444, base_gib: 2}]}
        drift: {warmup_events: 100, window_events: 200, min_samples: 50, evaluate_interval_s: 0.2}
        """))
    sc = sidecar_factory("--config", str(cfg), "--set", "gpu.enabled=true", "--set", "drift.enabled=true",
                         sock=sock_path)

    # 40 requests whose latencies sit inside one bucket each: every quantile is lo + (hi - lo) * q.
    _post(sc, EVIL, [{"type": "request", "duration_s": 0.03, "outcome": "ok",
                      "stages": {"ingress": 0.0008, "inference": 0.02}}] * 40)
    buckets = {"(request)": (0.025, 0.05), "ingress": (0.0005, 0.001), "inference": (0.01, 0.025)}
    # Drift: a warm-up reference, then a window where x moved by 3 sigma and y did not.
    rng = random.Random(7)
    records = [{"type": "record", "prediction": "cat", "confidence": 0.9,
                "features": {"x": rng.gauss(0, 1) + (3.0 if i >= 100 else 0.0), "y": rng.gauss(0, 1)}}
               for i in range(300)]
    _post(sc, "ranker", records[:100])
    wait_until(lambda: any(m["reference"]["events"] == 100 for m in sc.status()["components"]["drift"]["models"]),
               what="the warm-up reference")
    _post(sc, "ranker", records[100:])
    # SDK traffic with a buffer too small for it: the producer reports its drops, the page shows them.
    prod = subprocess.run([sys.executable, "-m", "tests.helpers.sdk_producer", sock_path, "sdk", "2000",
                           "--buffer-size", "64"], capture_output=True, text=True, cwd=REPO, timeout=60, check=True)
    sdk = json.loads(prod.stdout)
    assert sdk["drops"]["buffer_full"] > 0

    def settled() -> dict[str, Any] | None:
        st = sc.status()
        drift = st["components"]["drift"]["models"]
        feats = {f["feature"]: f for m in drift for f in m.get("features", [])}
        leaking = {p["pid"] for p in st["components"]["gpu"]["leaks"]}
        ok = (st["ingest"]["sdk_dropped"].get("buffer_full") == sdk["drops"]["buffer_full"]
              and feats.get("x", {}).get("n_current") == 200 and 4242 in leaking
              and st["components"]["gpu"]["duplicate_model_copies"])
        return st if ok else None

    wait_until(settled, timeout=30, interval=0.1, what="drops, a drift evaluation and a GPU leak in the status")

    # One fetch of /v1/status (the page refreshes every 3 s of virtual time), then the DOM.
    out = run_chromium(browser, tmp_path / "profile", "--virtual-time-budget=2000", "--dump-dom", sc.url + "/")
    assert out.returncode == 0, out.stderr[-3000:]
    (tmp_path / "status-page.dom.html").write_text(out.stdout)
    st = sc.status()
    dom = Dom()
    dom.feed(out.stdout)
    assert 'data-loaded="true"' in out.stdout, out.stdout[-2000:]

    # Escaping: the name is text, in full; it added no element and ran nothing.
    assert dom.title == "inferwatch sidecar"
    assert dom.tags.count("script") == 1 and "img" not in dom.tags
    assert dom.ids["h-ready"] == "yes" and dom.ids["h-version"] == st["version"]

    lat = {(r["model"][1], r["stage"][1]): r for r in dom.tables["latency"]}
    for stage, (lo, hi) in buckets.items():
        row = lat[(EVIL, stage)]
        assert row["model"] == (EVIL, EVIL)
        assert row["count"][0] == row["total"][0] == "40"
        for q, key in ((0.5, "p50_s"), (0.9, "p90_s"), (0.99, "p99_s")):
            assert float(row[key][0] or "nan") == pytest.approx(lo + (hi - lo) * q, rel=1e-12)
    (sdk_set,) = [m for m in st["latency"]["models"] if m["service"] == "sdk"]
    for stage, want in {"(request)": sdk_set["request"], **sdk_set["stages"]}.items():
        row = lat[("m1", stage)]
        assert int(row["total"][0] or -1) == want["total"] > 0
        assert float(row["p99_s"][0] or "nan") == want["p99_s"]
    assert lat[("m1", "inference")]["p50_s"][1].endswith(("µs", "ms"))

    feats = {r["feature"][1]: r for r in dom.tables["drift"]}
    want_feats = {f["feature"]: f for f in st["components"]["drift"]["models"][0]["features"]}
    assert feats["x"]["drifted"][1] == "drifted" and feats["y"]["drifted"][1] == "ok"
    for name in ("x", "y"):
        assert float(feats[name]["statistic"][0] or "nan") == want_feats[name]["statistic"]
        assert feats[name]["n_current"][0] == "200"

    procs = {r["pid"][0]: r for r in dom.tables["gpu-process"]}
    assert procs["4242"]["verdict"][1] == "leak" and procs["4343"]["verdict"][1] != "leak"
    assert procs["4242"]["rate_bytes_per_s"][1].endswith(("GiB/h", "MiB/h"))
    episodes = dom.tables["gpu-episode"]
    assert "4242" in {r["pid"][0] for r in episodes}
    assert all(r["detected_at"][1].endswith(" UTC") for r in episodes)
    # The two flat 2 GiB workers are one model loaded twice; the leaking 4 GiB one is no copy of it.
    (dup,) = dom.tables["gpu-duplicates"]
    (want_dup,) = st["components"]["gpu"]["duplicate_model_copies"]
    assert dup["gpu"] == ("0", "0") and dup["pids"][1] == "4343, 4444" and want_dup["pids"] == [4343, 4444]
    assert dup["used_bytes"][1] == "2.00 GiB, 2.00 GiB"
    assert float(dup["copy_bytes"][0] or "nan") == float(dup["extra_bytes"][0] or "nan") == 2 * 2**30
    assert dup["copy_bytes"][1] == dup["extra_bytes"][1] == "2.00 GiB"
    assert float(dup["since"][0] or "nan") == want_dup["since"] and dup["since"][1].endswith(" UTC")
    fixes = re.findall(r'<p class="note" data-fix="duplicates">Fix: ([^<]*)</p>', out.stdout)
    assert [html.unescape(f) for f in fixes] == [want_dup["fix"]] and "--preload" in fixes[0]

    drops = {r["key"][1]: r["value"][0] for r in dom.tables["sdk-drops"]}
    assert drops["buffer_full"] == str(sdk["drops"]["buffer_full"])
    (ingest,) = dom.tables["ingest"]
    assert ingest["events"][0] == str(st["ingest"]["events"]) and ingest["lost_frames"][0] == "0"
    assert str(sdk["pid"]) in {r["pid"][0] for r in dom.tables["producers"]}
    # The summary band, first: the leaking process since its detection, with the leak runbook; the drift.
    band = SummaryBand()
    band.feed(out.stdout)
    by = {(v["attrs"]["data-component"], v["attrs"]["data-verdict"]): v for v in band.verdicts}
    (leak,) = [v for v in st["summary"]["verdicts"] if v["verdict"] == "leak" and "4242" in v["subject"]]
    assert leak["since_unix"] == next(x["detected_at"] for x in st["components"]["gpu"]["leaks"] if x["pid"] == 4242)
    assert by[("gpu", "leak")]["runbook"].endswith("#inferwatchgpumemoryleak")
    assert "GPU 0 pid 4242" in by[("gpu", "leak")]["text"]
    assert ("drift", "drifted") in by and ("ingest", "dropping events") in by
    states = {r["name"][1]: r["state"][1] for r in dom.tables["components"]}
    assert states["drift"] == "running" and states["gpu"] == st["components"]["gpu"]["state"]

    shot = tmp_path / "status-page.png"
    out = run_chromium(browser, tmp_path / "profile", "--virtual-time-budget=2000", "--hide-scrollbars",
                        "--window-size=1400,2200", f"--screenshot={shot}", sc.url + "/")
    assert out.returncode == 0, out.stderr[-3000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (1400, 2200)
    assert len(png) > 50_000  # a rendered page, not a blank one


# -- the first screen, at a laptop's and a phone's width ----------------------------------------------------------

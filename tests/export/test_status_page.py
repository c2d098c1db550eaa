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
import shutil
import struct
import subprocess
import sys
import textwrap
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from inferwatch.wire import EV_REQUEST
from inferwatch_sidecar.aggregate.aggregator import Aggregator, LatencyStatus, histogram_quantile
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.metrics.core import STAGE_DURATION_SECONDS
from tests.conftest import IN_CI
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


def _chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        msg = "chromium is not on PATH (install Debian's 'chromium' package; scripts/test does)"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return path


class _Dom(HTMLParser):
    """The page's tables (``data-table``) as rows of ``{field: (raw, text)}``, and every element's tag."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[dict[str, tuple[str | None, str]]]] = {}
        self.tags: list[str] = []
        self.ids: dict[str, str] = {}
        self.title = ""
        self._table: str | None = None
        self._cell: tuple[str, str | None] | None = None
        self._text: list[str] = []
        self._id: str | None = None
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "title":
            self._in_title = True
        if tag == "table" and a.get("data-table"):
            self._table = a["data-table"]
            self.tables.setdefault(self._table, [])
        elif tag == "tr" and self._table and a.get("data-row"):
            self.tables[self._table].append({})
        elif tag == "td" and self._table and a.get("data-field"):
            self._cell = (a["data-field"] or "", a.get("data-raw"))
            self._text = []
        if a.get("id", "").startswith("h-"):
            self._id, self._text = a["id"], []

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if tag == "td" and self._cell is not None and self._table:
            field, raw = self._cell
            self.tables[self._table][-1][field] = (raw, "".join(self._text))
            self._cell = None
        elif tag == "table":
            self._table = None
        elif tag == "b" and self._id:
            self.ids[self._id] = "".join(self._text)
            self._id = None

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        self._text.append(data)


def _run_chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage",
         f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=120,
    )


def _post(sc: Any, model: str, events: list[dict[str, Any]]) -> None:
    code, answer = sc.post("/v1/events", json.dumps({"service": "json", "model": model, "model_version": "v1",
                                                     "events": events}).encode())
    assert code == 200 and answer["rejected"] == 0, answer


def test_status_page_in_chromium_shows_the_live_status(sidecar_factory: Any, tmp_path: Path, sock_path: str) -> None:
    chromium = _chromium()
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
    out = _run_chromium(chromium, tmp_path / "profile", "--virtual-time-budget=2000", "--dump-dom", sc.url + "/")
    assert out.returncode == 0, out.stderr[-3000:]
    (tmp_path / "status-page.dom.html").write_text(out.stdout)
    st = sc.status()
    dom = _Dom()
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
    band = _Summary()
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
    out = _run_chromium(chromium, tmp_path / "profile", "--virtual-time-budget=2000", "--hide-scrollbars",
                        "--window-size=1400,2200", f"--screenshot={shot}", sc.url + "/")
    assert out.returncode == 0, out.stderr[-3000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (1400, 2200)
    assert len(png) > 50_000  # a rendered page, not a blank one


# -- the first screen, at a laptop's and a phone's width ----------------------------------------------------------

#: Loaded after the page's own script (same origin, so its policy allows it): once the page has drawn the status,
#: it writes what a reader would see cut or overflowing into a <pre id="probe">, which --dump-dom then shows.
_PROBE = """
"use strict";
function probe() {
  if (document.body.dataset.loaded !== "true") { setTimeout(probe, 50); return; }
  const vw = document.documentElement.clientWidth;
  const cut = [...document.querySelectorAll("td, th, .verdict > *, h3, .note")]
    .filter(e => e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX !== "visible")
    .map(e => e.textContent.slice(0, 60));
  const sections = {};
  for (const s of document.querySelectorAll("main > section")) {
    sections[s.id] = { scroll: s.scrollWidth, client: s.clientWidth, right: s.getBoundingClientRect().right };
  }
  const found = JSON.stringify({ viewport: vw, page: document.documentElement.scrollWidth, cut, sections });
  if (window.parent !== window) { window.parent.postMessage(found, "*"); return; }
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = found;
  document.body.append(out);
}
probe();
"""
#: Headless Chromium's window is at least 500 px wide: a phone's 390 px is a frame of that width, whose
#: page posts its probe up to this one.
PHONE_PX = 390
_PHONE = f"""<!doctype html><html><head><meta charset="utf-8"><style>body {{ margin: 0; background: #f6f7f9; }}
iframe {{ border: 0; display: block; }}</style></head><body>
<iframe src="/" width="{PHONE_PX}" height="1600"></iframe>
<script>window.addEventListener("message", e => {{ const p = document.createElement("pre"); p.id = "probe";
p.textContent = e.data; document.body.append(p); }});</script></body></html>"""


class _PageServer:
    """The status page's files exactly as the sidecar serves them (same headers), and a given /v1/status."""

    def __init__(self, doc: dict[str, Any], probe: bool, phone: bool = False) -> None:
        import http.server
        import threading

        from inferwatch_sidecar.http.routes import STATUS_FILES, status_page

        files = {p: status_page(p) for p in STATUS_FILES}
        body = json.dumps(doc).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                path = self.path.split("?")[0]
                if path == "/v1/status":
                    self._send(200, body, "application/json", {})
                elif path == "/probe.js" and probe:
                    self._send(200, _PROBE.encode(), "text/javascript", {})
                elif path == "/phone.html" and phone:
                    self._send(200, _PHONE.encode(), "text/html", {})
                elif path in files:
                    r = files[path]
                    out = r.body
                    headers = dict(r.headers)
                    if path == "/" and probe:
                        out = out.replace(b"</head>", b'<script src="probe.js" defer></script>\n</head>')
                    if phone:  # framed by /phone.html, from this origin
                        headers["Content-Security-Policy"] = headers["Content-Security-Policy"].replace(
                            "frame-ancestors 'none'", "frame-ancestors 'self'")
                    self._send(r.status, out, r.content_type, headers)
                else:
                    self._send(404, b"no\n", "text/plain", {})

            def _send(self, code: int, data: bytes, ctype: str, headers: dict[str, str]) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _PageServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Summary(HTMLParser):
    """The summary band's verdicts (their data attributes, text and runbook link) and the stats line."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.verdicts: list[dict[str, Any]] = []
        self.stats: dict[str, str] = {}
        self.probe = ""
        self._stat: str | None = None
        self._in_probe = False
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "li" and "verdict" in (a.get("class") or "").split():
            self.verdicts.append({"attrs": a, "text": "", "runbook": None, "since": None, "since_source": None})
            self._depth = 1
        elif self._depth:
            self._depth += 1
            if tag == "a":
                self.verdicts[-1]["runbook"] = a.get("href")
            if a.get("data-since"):
                self.verdicts[-1]["since"] = a["data-since"]
                self.verdicts[-1]["since_source"] = a.get("data-since-source")
        if tag == "li" and a.get("data-stat"):
            self._stat = a["data-stat"]
            self.stats[self._stat] = ""
        if tag == "pre" and a.get("id") == "probe":
            self._in_probe = True

    def handle_endtag(self, tag: str) -> None:
        if self._depth:
            self._depth -= 1
        if tag == "li":
            self._stat = None
        if tag == "pre":
            self._in_probe = False

    def handle_data(self, data: str) -> None:
        if self._depth:
            self.verdicts[-1]["text"] += data
        if self._stat:
            self.stats[self._stat] += data
        if self._in_probe:
            self.probe += data


def _png_pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the unfiltered rows of an 8-bit RGB or RGBA PNG (what Chromium writes)."""
    import zlib

    w, h, depth, ctype = struct.unpack(">IIBB", png[16:26])
    assert depth == 8 and ctype in (2, 6), (depth, ctype)
    bpp = 3 if ctype == 2 else 4
    data, pos = b"", 8
    while pos < len(png):
        n, kind = struct.unpack(">I4s", png[pos:pos + 8])
        if kind == b"IDAT":
            data += png[pos + 8:pos + 8 + n]
        pos += 12 + n
    raw = zlib.decompress(data)
    stride = w * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line if bpp == 3 else bytes(x for j, x in enumerate(line) if j % 4 != 3)))
        prev = line
    return w, h, rows


@pytest.mark.parametrize("width", [1280, PHONE_PX])
def test_first_screen_shows_what_is_bad_since_when_with_runbooks_and_nothing_is_cut(tmp_path: Path,
                                                                                     width: int) -> None:
    import sys as _sys

    _sys.path.insert(0, str(REPO))
    from alerts.source import ALERTS

    from inferwatch_sidecar.export.summary import ERROR_RATIO
    from tests.export import status_fixture

    chromium = _chromium()
    doc = status_fixture.status()
    runbooks = {a.name: a.runbook_url for a in ALERTS}
    phone = width == PHONE_PX
    window = 500 if phone else width
    with _PageServer(doc, probe=True, phone=phone) as srv:
        out = _run_chromium(chromium, tmp_path / "profile", "--virtual-time-budget=3000",
                            f"--window-size={width},2400", "--dump-dom", srv.url + "/")
        assert out.returncode == 0, out.stderr[-3000:]
        probed = out
        if phone:
            probed = _run_chromium(chromium, tmp_path / "profile", "--virtual-time-budget=3000",
                                   f"--window-size={window},1700", "--dump-dom", srv.url + "/phone.html")
            assert probed.returncode == 0, probed.stderr[-3000:]
        shot = tmp_path / f"first-screen-{width}.png"
        shot_out = _run_chromium(chromium, tmp_path / "profile", "--virtual-time-budget=3000", "--hide-scrollbars",
                                 f"--window-size={window},1600", f"--screenshot={shot}",
                                 srv.url + ("/phone.html" if phone else "/"))
        assert shot_out.returncode == 0, shot_out.stderr[-3000:]
    (tmp_path / f"first-screen-{width}.dom.html").write_text(out.stdout)
    page = _Summary()
    page.feed(out.stdout)
    probe_page = _Summary()
    probe_page.feed(probed.stdout)

    # Every bad-now verdict of the status is on the band, in its order, with since-when and its runbook section.
    want = doc["summary"]["verdicts"]
    assert [(v["attrs"]["data-component"], v["attrs"]["data-verdict"]) for v in page.verdicts] == \
        [(v["component"], v["verdict"]) for v in want]
    assert {v["component"] for v in want} >= {"gpu", "drift", "accuracy", "canary", "requests", "ingest", "saturation",
                                              "capacity"}
    notes = {"component": "component's own time", "window": "window that first showed it",
             "first seen": "first seen by this sidecar"}
    for got, w in zip(page.verdicts, want, strict=True):
        assert got["runbook"] == runbooks[w["alert"]], w
        assert float(got["since"]) == w["since_unix"] and " UTC" in got["text"]
        assert w["subject"] in got["text"] and w["detail"] in got["text"]
        assert got["since_source"] == w["since_source"] and notes[w["since_source"]] in got["text"], (got, w)
    # Saturation and the canary since their component's own onset, drift since its window's start, headroom and
    # the retry storm since first seen; each row names its alert.
    by = {(v["attrs"]["data-component"], v["attrs"]["data-verdict"]): v for v in page.verdicts}
    for key, alert, source, ago in (
            (("saturation", "kv_cache-bound"), "InferwatchSaturated", "component", status_fixture.SATURATED_FOR_S),
            (("canary", "fail"), "InferwatchCanaryFailing", "component", status_fixture.CANARY_FAILING_FOR_S),
            (("drift", "drifted"), "InferwatchFeatureDrift", "window", status_fixture.DRIFT_WINDOW_S + 30),
            (("capacity", "at its knee"), "InferwatchCapacityHeadroomLow", "first seen", 60),
            (("requests", "retry storm"), "InferwatchRetryStorm", "first seen", 60),
            (("requests", "timeout mismatch"), "InferwatchTimeoutMismatch", "first seen", 60)):
        assert by[key]["runbook"] == runbooks[alert] and by[key]["since_source"] == source, key
        assert float(by[key]["since"]) == status_fixture.NOW - ago, key
    assert "2.00 attempts per unique request" in by[("requests", "retry storm")]["text"]
    assert "clients gave up after 25 ms (median) while the server's median is 40 ms" in \
        by[("requests", "timeout mismatch")]["text"]
    leak = next(v for v in page.verdicts if v["attrs"]["data-verdict"] == "leak")
    import datetime as dt

    detected = dt.datetime.fromtimestamp(status_fixture.NOW - 420, dt.timezone.utc)
    assert f"since {detected:%Y-%m-%d %H:%M:%S} UTC" in leak["text"]
    assert float(leak["since"]) == status_fixture.NOW - 420
    # The canary names each failing stage, and the estimate stands with its interval.
    canary = next(v for v in page.verdicts if v["attrs"]["data-component"] == "canary")
    assert "stage_latency[queue], stage_latency[inference]" in canary["text"]

    # Rates from the outcomes: error, 4xx (client_error), cancelled and shed over every label set.
    n = sum(sum(o.values()) for o in status_fixture.OUTCOMES.values()) + 40
    tot = {k: sum(o.get(k, 0) for o in status_fixture.OUTCOMES.values()) for k in ("error", "client_error",
                                                                                    "cancelled", "shed")}
    for key, label in (("error", "error rate"), ("client_error", "4xx rate"), ("cancelled", "cancelled rate"),
                       ("shed", "shed rate")):
        assert page.stats[key] == f"{label} {100 * tot[key] / n:.2f}%", page.stats
    assert tot["error"] / n > ERROR_RATIO
    assert page.stats["accuracy ranker v1"] == "accuracy ranker v1 64.0% [58.0%–70.0%]"
    assert page.stats["accuracy ranker v2"] == "accuracy ranker v2 90.0% [87.0%–93.0%]"

    dom = _Dom()
    dom.feed(out.stdout)
    reqs = {r["model"][1]: r for r in dom.tables["requests"]}
    # HTTP: v1's 2000 attempts with 1000 retries are 2 attempts per unique request; its clients waited 25 ms.
    http = {r["model"][1]: r for r in dom.tables["requests-http"]}
    assert (http["svc ranker v1"]["amplification"][1], http["svc ranker v1"]["giveups"][1],
            http["svc ranker v1"]["giveup_wait_p50_s"][1]) == ("2.00", "15.0%", "25.0 ms")
    assert http["svc ranker v2"]["amplification"][1] == f"{200 / 190:.2f}" and len(http) == 2
    v1 = status_fixture.OUTCOMES[("ranker", "v1")]
    assert reqs["svc ranker v1"]["requests"][0] == str(sum(v1.values()))
    assert reqs["svc ranker v1"]["client_error"][1] == f"{100 * v1['client_error'] / sum(v1.values()):.2f}%"
    assert reqs["all"]["requests"][0] == str(n)
    acc = {r["version"][1]: r for r in dom.tables["accuracy"]}
    assert acc["ranker v1"]["estimated_accuracy"][1] == "64.0% [58.0%–70.0%]"
    assert acc["ranker v1"]["labelled_accuracy"][1] == "36.3% of 400"
    assert acc["ranker v2"]["labelled_accuracy"][1] == "no labels yet"
    assert "cannot see that version's own errors" in out.stdout
    assert f"warning: {status_fixture.CANARY_WARNING}" in html.unescape(out.stdout)
    assert {r["metric"][1]: (r["statistic"][1], r["unit"][1]) for r in dom.tables["canary-metrics"]}["latency"] == (
        "Mann-Whitney U", "s (median)")
    metrics = [r["metric"][1] for r in dom.tables["canary-metrics"]]
    assert "stage_latency [queue]" in metrics and "stage_latency [inference]" in metrics
    assert {r["metric"][1]: r["result"][1] for r in dom.tables["canary-metrics"]}["error_rate"] == "pass"
    stages = [r["stage"][1] for r in dom.tables["tail-stages"]]
    assert stages == ["queue", "inference"]
    assert "queue is 94% of the slowest 1%" in out.stdout

    # Nothing cut, nothing past the viewport; at 1280 px no section needs a horizontal scroll either.
    probe = json.loads(probe_page.probe)
    vw = probe["viewport"]  # the window less a scrollbar
    assert width - 20 <= vw <= width and probe["page"] <= vw, probe
    assert probe["cut"] == [], probe["cut"]
    for name, s in probe["sections"].items():
        assert s["right"] <= vw, (name, s)
        # On a phone the wide tables (latency, drift, GPU, a canary's metrics) scroll inside their section.
        if width >= 1280 or name in ("summary", "requests", "accuracy", "tail"):
            assert s["scroll"] <= s["client"], (name, s)

    # The screenshot: the page's right margin is background colour all the way down (no card runs off it).
    w, h, rows = _png_pixels(shot.read_bytes())
    assert (w, h) == (window, 1600)
    w = width  # the phone's frame is the left 390 px
    bg = bytes((0xF6, 0xF7, 0xF9))
    body = [row for row in rows if row[:12] == bg * 4]  # below the header, which spans the whole width
    assert len(body) > h // 2
    assert all(row[(w - 4) * 3:w * 3] == bg * 4 for row in body), "something reaches the right edge of the screenshot"
    assert len({row[3 * (w // 2):3 * (w // 2) + 3] for row in rows}) > 3  # a drawn page, not a blank one

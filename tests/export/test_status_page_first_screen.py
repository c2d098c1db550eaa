"""The status page's first screen in headless Chromium, at a desktop and a phone width: what is bad, since when,
with runbooks, and nothing cut or overflowing (split from test_status_page.py, which holds the live page's values).
"""

from __future__ import annotations

import html
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.browser import Dom, SummaryBand, chromium, run_chromium
from tests.helpers.sidecar import REPO

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

    browser = chromium()
    doc = status_fixture.status()
    runbooks = {a.name: a.runbook_url for a in ALERTS}
    phone = width == PHONE_PX
    window = 500 if phone else width
    with _PageServer(doc, probe=True, phone=phone) as srv:
        out = run_chromium(browser, tmp_path / "profile", "--virtual-time-budget=3000",
                            f"--window-size={width},2400", "--dump-dom", srv.url + "/")
        assert out.returncode == 0, out.stderr[-3000:]
        probed = out
        if phone:
            probed = run_chromium(browser, tmp_path / "profile", "--virtual-time-budget=3000",
                                   f"--window-size={window},1700", "--dump-dom", srv.url + "/phone.html")
            assert probed.returncode == 0, probed.stderr[-3000:]
        shot = tmp_path / f"first-screen-{width}.png"
        shot_out = run_chromium(browser, tmp_path / "profile", "--virtual-time-budget=3000", "--hide-scrollbars",
                                 f"--window-size={window},1600", f"--screenshot={shot}",
                                 srv.url + ("/phone.html" if phone else "/"))
        assert shot_out.returncode == 0, shot_out.stderr[-3000:]
    (tmp_path / f"first-screen-{width}.dom.html").write_text(out.stdout)
    page = SummaryBand()
    page.feed(out.stdout)
    probe_page = SummaryBand()
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

    dom = Dom()
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

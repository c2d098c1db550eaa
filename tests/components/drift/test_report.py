"""The Evidently deep-dive report: from two files, from a sidecar window (admin route), and without the extra."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from inferwatch_sidecar.cli import main
from inferwatch_sidecar.components.drift import report
from inferwatch_sidecar.components.drift.component import build
from inferwatch_sidecar.components.drift.config import DriftConfig
from tests.cli.test_drift import data, to_csv
from tests.components.drift.helpers import context
from tests.components.drift.test_component import make_profile, traffic
from tests.helpers.imports import quiet_import


def test_report_of_two_files_is_evidently_html(tmp_path, capsys) -> None:
    quiet_import("evidently")
    to_csv(tmp_path / "ref.csv", data(300, 1))
    to_csv(tmp_path / "cur.csv", data(300, 2, shift=1.0))
    out = tmp_path / "r.html"
    assert main(["report", "--reference", str(tmp_path / "ref.csv"), "--current", str(tmp_path / "cur.csv"),
                 "-o", str(out)]) == 0
    html = out.read_text()
    assert html.lstrip().lower().startswith("<!doctype html") or "<html" in html[:500].lower()
    assert "Drifted" in html and '"grade"' in html  # Evidently's drift widgets, for our columns


def test_admin_route_serves_the_window_report(tmp_path) -> None:
    quiet_import("evidently")
    comp = build(DriftConfig(reference=make_profile(tmp_path), window_events=5000), context())
    comp.handle(1, 1, traffic(500, 3, shift=0.5)[0])
    comp.drain()
    routes = comp.admin_routes()
    status, ctype, body = routes["report"]({"model": "m", "model_version": "v1"})
    assert status == 200 and ctype.startswith("text/html")
    assert b"Drifted" in body and b'"color"' in body
    status, _, body = routes["report"]({"model": "nope"})
    assert status == 404 and b"no model version" in body
    # model_version (the metrics' label) filters; the older version parameter still does too.
    for q in ({"model_version": "v9"}, {"version": "v9"}):
        status, _, body = routes["report"]({"model": "m", **q})
        assert status == 404 and b"no model version" in body, q
    status, _, body = routes["report"]({"model": "m", "model_version": "v1", "version": "v2"})
    assert status == 400 and b"disagree" in body


def test_reconstruction_from_bins_keeps_the_window_shares() -> None:
    from inferwatch_sidecar.components.drift import profile as prof

    col = prof.categorical_column("c", ["a"] * 70 + ["b"] * 30)
    vals = report._reconstruct(col, np.array([7.0, 2.0, 1.0]), None, 100)
    assert (vals.count("a"), vals.count("b"), vals.count("__other__")) == (70, 20, 10)


def test_missing_extra_says_what_to_install(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "evidently", None)
    to_csv(tmp_path / "ref.csv", data(50, 1))
    assert main(["report", "--reference", str(tmp_path / "ref.csv"), "--current", str(tmp_path / "ref.csv"),
                 "-o", str(tmp_path / "r.html")]) == 2
    assert 'pip install "inferwatch[report]"' in capsys.readouterr().err
    comp = build(DriftConfig(reference=make_profile(tmp_path)), context())
    comp.handle(1, 1, traffic(10, 4)[0])
    comp.drain()
    status, _, body = comp.admin_routes()["report"]({})
    assert status == 501 and b"inferwatch[report]" in body


def test_sidecar_report_needs_a_token(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("INFERWATCH_ADMIN_TOKEN", raising=False)
    assert main(["report", "--sidecar", "http://127.0.0.1:9", "-o", str(tmp_path / "r.html")]) == 2
    assert "needs a token" in capsys.readouterr().err


def test_a_constant_confidence_gets_a_report_not_an_error(tmp_path) -> None:
    """Issue 28 listed a constant confidence as giving HTTP 500 from ``/admin/drift/report``. Not reproduced (a
    constant in the reference, in the window, or in both; from a file or a warm-up; served or in process); this
    pins the answer for the two ends: a reference file with spread confidences and a window at exactly 1.0, and a
    warm-up reference and window both at 1.0."""
    from inferwatch_sidecar.components.drift import profile as prof
    from tests.components.drift.helpers import records
    from tests.components.drift.test_component import COLORS, SCH

    quiet_import("evidently")
    rng = np.random.default_rng(5)
    n = 2000
    p = prof.build({"a": rng.normal(size=n), "b": rng.normal(5, 2, size=n), "conf": rng.uniform(0.5, 1, size=n)},
                   {"color": list(rng.choice(COLORS, size=n)), "cls": [str(x) for x in rng.integers(0, 3, n)]},
                   prediction="cls", confidence="conf", source="test")
    p.save(str(tmp_path / "p.json"))

    def window(m: int, start: int) -> list[Any]:
        return records("m", "v1", SCH, rng.normal(size=m), rng.normal(5, 2, size=m),
                       list(rng.choice(COLORS, size=m)), [int(x) for x in rng.integers(0, 3, m)], np.ones(m), start)

    for cfg, batches in ((DriftConfig(reference=str(tmp_path / "p.json"), window_events=1000), [window(400, 0)]),
                         (DriftConfig(warmup_events=300, window_events=1000), [window(300, 0), window(300, 300)])):
        comp = build(cfg, context())
        for b in batches:
            comp.handle(1, 1, b)
            comp.drain()
        comp.evaluate()
        status, ctype, body = comp.admin_routes()["report"]({"model": "m", "model_version": "v1"})
        assert (status, ctype) == (200, "text/html; charset=utf-8"), body[:300]
        assert b"inferwatch-verdicts" in body and b"Drifted" in body

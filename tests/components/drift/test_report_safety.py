"""Issue 28: the drift report cannot be broken out of, and every HTML served or written has a strict policy."""

from __future__ import annotations

import base64
import hashlib
import re
from html.parser import HTMLParser

import numpy as np

from inferwatch_sidecar.cli import main
from inferwatch_sidecar.components.drift.component import build
from inferwatch_sidecar.components.drift.config import DriftConfig
from inferwatch_sidecar.export import htmlsafe
from inferwatch_sidecar.http.routes import Endpoints, Request, sidecar_routes
from tests.components.drift.helpers import context
from tests.components.drift.test_component import COLORS, SCH, make_profile, records
from tests.helpers.imports import quiet_import

PAYLOAD = "c</script><script>window.pwned=1//<!--"


class Scripts(HTMLParser):
    """The inline scripts as a browser's tokenizer splits them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.scripts: list[str] = []
        self.csp: list[str] = []
        self._in = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script":
            self._in = True
            self.scripts.append("")
        if tag == "meta" and (a.get("http-equiv") or "").lower() == "content-security-policy":
            self.csp.append(a.get("content") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in = False

    def handle_data(self, data: str) -> None:
        if self._in:
            self.scripts[-1] += data


def check_page(page: bytes, csp_header: str | None = None) -> None:
    p = Scripts()
    p.feed(page.decode("utf-8"))
    assert p.csp, "no Content-Security-Policy meta"
    policy = csp_header or p.csp[0]
    assert "'unsafe-inline'" not in policy.split("script-src")[1].split(";")[0]
    assert "unsafe-eval" not in policy and "default-src 'none'" in policy
    for body in p.scripts:
        assert not body.lstrip().startswith("window.pwned"), "the payload became a script"
        digest = "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
        assert digest in policy, "an inline script the policy does not name"


def test_script_json_keeps_values_inside_the_script() -> None:
    rng = np.random.default_rng(5)
    for _ in range(200):
        s = "".join(rng.choice(list("<>/&'\"\u2028sScriptRIPT!- \\"), size=int(rng.integers(1, 30))))
        out = htmlsafe.script_json({"v": s})
        assert not re.search(r"</script|<!--|[<>&\u2028]", out, re.I)
        import json
        assert json.loads(out) == {"v": s}


def test_report_of_files_escapes_category_values_and_has_a_policy(tmp_path) -> None:
    quiet_import("evidently")
    rng = np.random.default_rng(0)
    for name, shift in (("ref.csv", 0.0), ("cur.csv", 1.0)):
        rows = ["x,cat"] + [f"{rng.normal(shift):.4f},{rng.choice(['a', 'b', PAYLOAD]) if shift else 'a'}"
                            for _ in range(200)]
        (tmp_path / name).write_text("\n".join(rows) + "\n")
    out = tmp_path / "r.html"
    assert main(["report", "--reference", str(tmp_path / "ref.csv"), "--current", str(tmp_path / "cur.csv"),
                 "--categorical", "cat", "-o", str(out)]) == 0
    page = out.read_bytes()
    assert b"window.pwned" in page  # the value is in the page, as data
    check_page(page)


def test_admin_report_from_traffic_is_served_with_a_policy(tmp_path) -> None:
    quiet_import("evidently")
    comp = build(DriftConfig(reference=make_profile(tmp_path), window_events=5000), context())
    rng = np.random.default_rng(3)
    n = 400
    colors = [PAYLOAD if i % 3 == 0 else str(rng.choice(COLORS)) for i in range(n)]
    comp.handle(1, 1, records("m", "v1", SCH, rng.normal(size=n), rng.normal(5, 2, size=n), colors,
                              [int(x) for x in rng.integers(0, 3, n)], rng.uniform(0.5, 1, size=n), 0))
    comp.drain()
    handler = comp.admin_routes()["report"]
    routes = sidecar_routes(Endpoints(
        scrape=lambda a: (b"", "text/plain"), ready=lambda: True, status=dict, ingest_json=lambda k, b: (200, {}),
        reject_body=lambda: None, admin_route=lambda c, p: handler if (c, p) == ("drift", "report") else None,
        admin_index=dict, admin_token="s3cret", max_body_bytes=1 << 20))
    route = routes["/admin/*"]
    req = Request("GET", "/admin/drift/report", "model=m&model_version=v1", {"Authorization": "bearer s3cret"})
    assert route.admit is not None and route.admit(req) is None  # the scheme is case-insensitive
    resp = route.handler(req)
    assert resp.status == 200 and resp.content_type.startswith("text/html")
    csp = resp.headers["Content-Security-Policy"]
    check_page(resp.body, csp)
    assert resp.headers["X-Content-Type-Options"] == "nosniff"


def test_report_token_can_come_from_a_file(tmp_path, capsys) -> None:
    tf = tmp_path / "token"
    tf.write_text("")
    assert main(["report", "--sidecar", "http://127.0.0.1:9", "--token-file", str(tf), "-o",
                 str(tmp_path / "r.html")]) == 2
    assert "is empty" in capsys.readouterr().err
    tf.write_text("abc\n")
    assert main(["report", "--sidecar", "http://127.0.0.1:9", "--token-file", str(tf), "-o",
                 str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "needs a token" not in err and "127.0.0.1:9" in err

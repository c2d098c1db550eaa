"""Issue 28: a web page cannot post events to a sidecar on the developer's laptop, nor read it by DNS rebinding."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from inferwatch_sidecar.config import load_config
from inferwatch_sidecar.daemon import Sidecar
from tests.helpers.sidecar import parse_metrics, sample


@pytest.fixture
def sidecar(tmp_path: Any) -> Iterator[Sidecar]:
    s = Sidecar(load_config(environ={}, overrides={
        "gpu": {"enabled": False}, "drift": {"enabled": False},
        "http": {"port": 0, "allowed_origins": ["http://grafana.internal:3000"]},
        "ingest": {"socket": str(tmp_path / "s.sock")},
    }), environ={})
    s.startup()
    try:
        yield s
    finally:
        s.shutdown()


def call(s: Sidecar, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> tuple[int, bytes]:
    assert s.http is not None
    c = http.client.HTTPConnection("127.0.0.1", s.http.port, timeout=10)
    c.putrequest(method, path, skip_host=True)
    for k, v in headers.items():
        c.putheader(k, v)
    if body is not None:
        c.putheader("Content-Length", str(len(body)))
    c.endheaders(body)
    r = c.getresponse()
    out = r.read()
    c.close()
    return r.status, out


EVENTS = json.dumps({"events": [{"type": "request", "duration_s": 0.1}]}).encode()


def requests(s: Sidecar) -> float:
    from prometheus_client import generate_latest
    return sum(v for (n, _), v in parse_metrics(generate_latest(s.registry).decode()).items()
               if n == "inferwatch_requests_total")


def test_json_ingest_needs_application_json(sidecar: Sidecar) -> None:
    port = sidecar.http.port  # type: ignore[union-attr]
    host = {"Host": f"127.0.0.1:{port}"}
    # What fetch(url, {mode: "no-cors", body}) sends: text/plain, no preflight.
    for ctype in ("text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; b=x", ""):
        hdrs = {**host, "Content-Type": ctype} if ctype else host
        code, out = call(sidecar, "POST", "/v1/events", hdrs, EVENTS)
        assert code == 415, (ctype, out)
        assert call(sidecar, "POST", "/v1/labels", hdrs, b'{"labels": []}')[0] == 415
    assert requests(sidecar) == 0
    assert call(sidecar, "POST", "/v1/events", {**host, "Content-Type": "application/json; charset=utf-8"},
                EVENTS)[0] == 200
    assert requests(sidecar) == 1


@pytest.mark.parametrize(("headers", "status"), [
    ({"Host": "127.0.0.1:{port}"}, 200),
    ({"Host": "localhost:{port}"}, 200),
    ({"Host": "[::1]:{port}"}, 200),
    ({"Host": "attacker.example:{port}"}, 421),  # DNS rebinding: the page's own name
    ({"Host": "127.0.0.1.nip.io:{port}"}, 421),
    ({"Host": "127.0.0.1:{port}", "Origin": "http://127.0.0.1:{port}"}, 200),  # the status page itself
    ({"Host": "127.0.0.1:{port}", "Origin": "http://grafana.internal:3000"}, 200),  # allowed
    ({"Host": "127.0.0.1:{port}", "Origin": "https://evil.example"}, 403),
    ({"Host": "127.0.0.1:{port}", "Origin": "null"}, 403),  # a sandboxed frame or a file:// page
])
def test_foreign_hosts_and_origins_are_refused(sidecar: Sidecar, headers: dict[str, str], status: int) -> None:
    port = sidecar.http.port  # type: ignore[union-attr]
    hdrs = {k: v.format(port=port) for k, v in headers.items()}
    for path in ("/v1/status", "/metrics"):
        assert call(sidecar, "GET", path, hdrs)[0] == status, path
    code, _ = call(sidecar, "POST", "/v1/events", {**hdrs, "Content-Type": "application/json"}, EVENTS)
    assert code == status
    assert requests(sidecar) == (1 if status == 200 else 0)
    from prometheus_client import generate_latest
    m = parse_metrics(generate_latest(sidecar.registry).decode())
    reason = {421: "foreign_host", 403: "foreign_origin"}.get(status)
    if reason:
        assert sample(m, "inferwatch_http_refused_total", reason=reason) == 3


def test_host_check_follows_the_bind_address() -> None:
    from inferwatch_sidecar.config import HttpConfig
    from inferwatch_sidecar.http.server import Refusals, _App

    def hosts(**kw: Any) -> Any:
        return _App({}, HttpConfig(**kw), Refusals(), None).hosts  # type: ignore[arg-type]

    assert hosts(host="127.0.0.1") is not None and "localhost" in hosts(host="127.0.0.1")
    assert hosts(host="0.0.0.0") is None  # a pod scraped by its IP: no Host check unless configured
    assert "sidecar.ns.svc" in hosts(host="0.0.0.0", allowed_hosts=["Sidecar.ns.svc:9464"])


def test_every_json_ingest_route_needs_application_json() -> None:
    """``/v1/skew`` takes JSON too: a page posting text/plain offline values must not reach the live join."""
    from inferwatch_sidecar.http.routes import Endpoints, Request, sidecar_routes

    taken: list[tuple[str, bytes]] = []
    routes = sidecar_routes(Endpoints(
        scrape=lambda a: (b"", "text/plain"), ready=lambda: True, status=dict,
        ingest_json=lambda kind, body: (taken.append((kind, body)), (200, {}))[1],
        reject_body=lambda: None, admin_route=lambda c, p: None, admin_index=dict, admin_token=None,
        max_body_bytes=1 << 20, ingest_skew=lambda body: (taken.append(("skew", body)), (200, {}))[1]))
    body = b'{"rows": [{"request_id": "a", "features": {"x": 1}}]}'
    for path in ("/v1/events", "/v1/labels", "/v1/skew"):
        for ctype in ("text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; b=x",
                      None):
            headers = {} if ctype is None else {"Content-Type": ctype}
            resp = routes[path].handler(Request("POST", path, "", headers, body))
            assert resp.status == 415 and b"application/json" in resp.body, (path, ctype)
        assert not taken, path
        resp = routes[path].handler(Request("POST", path, "", {"Content-Type": "Application/JSON; charset=utf-8"},
                                            body))
        assert resp.status == 200 and taken.pop()[1] == body, path

"""``inferwatch sidecar`` logs one ready line with the URLs it serves, and each of them works as printed."""

from __future__ import annotations

import json
import os
import re
import selectors
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.sidecar import REPO, wait_until

_SEND = """
import inferwatch
inferwatch.configure(service="ready-line", model="m", model_version="v1")
for _ in range(3):
    with inferwatch.request():
        with inferwatch.stage("inference"):
            pass
assert inferwatch.flush(timeout=5.0)
inferwatch.shutdown(timeout=5.0)
"""


def _ready_line(proc: subprocess.Popen[str], timeout: float = 20.0) -> tuple[str, list[str]]:
    """The ready line from the sidecar's stderr, and every line it wrote up to it."""
    assert proc.stderr is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
            break
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if " ready: " in line:
            return line, lines
    raise AssertionError("no ready line:\n" + "".join(lines))


def _get(url: str) -> tuple[int, str, bytes]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read()


def test_ready_line_lists_the_urls_served_with_the_ports_bound(sock_path: str) -> None:
    # Port 0 everywhere: the line must give the ports the kernel picked, not the configured 0.
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferwatch_sidecar.cli", "sidecar", "--socket", sock_path, "--http-port", "0",
         "--udp-port", "0", "--no-gpu", "--no-drift"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "OTEL_"))},
    )
    try:
        line, before = _ready_line(proc)
        assert [ln for ln in before if " ready: " in ln] == [line]
        m = re.search(r"inferwatch sidecar \S+ ready: (.*); components (\S+)$", line.strip())
        assert m, line
        served = [tuple(part.rsplit(" ", 1)) for part in m.group(1).split(", ")]
        http = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/metrics", served[0][1])
        assert http, served
        port = int(http.group(1))
        assert port != 0
        base = f"http://127.0.0.1:{port}"
        udp_port = int(re.fullmatch(r"udp://127\.0\.0\.1:(\d+)", served[4][1]).group(1))  # type: ignore[union-attr]
        assert udp_port != 0
        assert served == [
            ("metrics", base + "/metrics"), ("status page", base + "/"), ("status JSON", base + "/v1/status"),
            ("events", "unix://" + sock_path), ("events", f"udp://127.0.0.1:{udp_port}"),
            ("JSON events", base + "/v1/events"), ("OTLP traces", base + "/v1/traces"),
        ]
        assert m.group(2) == "gpu:disabled,drift:disabled" or m.group(2).startswith("gpu:disabled,drift:disabled,")

        urls = dict(served[:3])
        code, ctype, body = _get(urls["metrics"])
        assert code == 200 and ctype.startswith("text/plain") and b"inferwatch_sidecar_info" in body
        code, ctype, body = _get(urls["status page"])
        assert code == 200 and ctype == "text/html; charset=utf-8" and b"<title>inferwatch sidecar</title>" in body
        code, ctype, body = _get(urls["status JSON"])
        assert code == 200 and json.loads(body)["listen"]["http"] == f"127.0.0.1:{port}"

        # Both events URLs, exactly as printed, are what INFERWATCH_SIDECAR takes.
        for url in ("unix://" + sock_path, f"udp://127.0.0.1:{udp_port}"):
            env = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
            subprocess.run([sys.executable, "-c", _SEND], env={**env, "INFERWATCH_SIDECAR": url}, cwd=REPO,
                           check=True, timeout=60)

        def requests_by_transport() -> dict[str, int] | None:
            st = json.loads(_get(urls["status JSON"])[2])
            by = st["ingest"]["frames_by_transport"]
            done = st["latency"]["models"] and st["latency"]["models"][0]["request"]["total"] == 6
            return by if done and by.get("unix") and by.get("udp") else None

        by = wait_until(requests_by_transport, timeout=10, what="the SDK's requests over both transports")
        assert by.get("http", 0) == 0  # everything so far came in on the two events URLs

        req = urllib.request.Request(
            dict(served)["JSON events"], method="POST", headers={"Content-Type": "application/json"},
            data=b'{"model": "m", "events": [{"type": "request", "duration_s": 0.01}]}',
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.loads(r.read()) == {"accepted": 1, "rejected": 0, "errors": {}}
    finally:
        proc.terminate()
        proc.wait(15)
        assert proc.stderr is not None
        proc.stderr.close()


def test_ready_line_brackets_an_ipv6_bind_address(tmp_path: Path) -> None:
    from inferwatch_sidecar.config import load_config
    from inferwatch_sidecar.daemon import Sidecar

    cfg = load_config(None, overrides={"http": {"host": "::1", "port": 0}, "ingest": {"socket": ""},
                                       "gpu": {"enabled": False}, "drift": {"enabled": False},
                                       "traces": {"enabled": False}})
    sc = Sidecar(cfg, environ={})
    try:
        sc.startup()
    except Exception as e:  # a machine without IPv6 loopback cannot bind ::1
        if "::1" in str(e):
            pytest.skip(f"no IPv6 loopback here: {e}")
        raise
    try:
        assert sc.http is not None
        base = f"http://[::1]:{sc.http.port}"
        assert sc.urls() == [("metrics", base + "/metrics"), ("status page", base + "/"),
                             ("status JSON", base + "/v1/status"), ("JSON events", base + "/v1/events")]
        assert _get(base + "/metrics")[0] == 200
    finally:
        sc.shutdown()

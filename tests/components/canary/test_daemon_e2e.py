"""The tail and canary components inside the real daemon: UDP ingest, /metrics, /v1/status and `inferwatch canary`."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import numpy as np

from inferwatch.wire import EV_RECORD, Encoder
from inferwatch_sidecar.cli import main
from tests.components.canary.helpers import traffic


def _wire(events: list[tuple]) -> list[tuple]:
    """The decoded tuples as the encoder takes them (features as a mapping)."""
    out = []
    for e in events:
        if e[0] == EV_RECORD:
            out.append((*e[:7], {"input_tokens": 100.0}))
        else:
            out.append(e)
    return out


def test_canary_and_tail_through_the_daemon(capsys) -> None:
    from inferwatch_sidecar.config import SidecarConfig
    from inferwatch_sidecar.daemon import Sidecar

    cfg = SidecarConfig.model_validate({
        "ingest": {"socket": None, "udp_port": 0}, "http": {"port": 0},
        "gpu": {"enabled": False}, "drift": {"enabled": False},
        # A window that does not end during the test: the test closes it once every event is in
        # (a 2 s window, cut on the wall clock, could split the traffic between two windows).
        "tail": {"window_seconds": 86400.0},
        # A fail is reported after 0.5 s of failing re-judgements (the production hold is a minute).
        "canary": {"evaluate_interval_s": 0.2, "min_requests": 200, "fail_after_s": 0.5},
    })
    sc = Sidecar(cfg)
    sc.startup()
    try:
        base = f"http://127.0.0.1:{sc.http.port}"
        rng = np.random.default_rng(2)
        events = _wire(traffic(rng, "v1", 2000) + traffic(rng, "v2", 400, tail_factor=3.0))
        now = time.time_ns()
        events = [(e[0], e[1], now, *e[3:]) for e in events]
        enc = Encoder(pid=1, producer_id=2)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for i, frame in enumerate(enc.encode(events)):
                s.sendto(frame, ("127.0.0.1", sc.ingest.udp_port))
                if i % 20 == 19:
                    time.sleep(0.002)  # a loopback socket buffer holds a few hundred frames
        want = {
            'inferwatch_canary_verdict{baseline_version="v1",model="m",model_version="v2",service="svc",'
            'verdict="fail"} 1.0',
            'inferwatch_canary_window_requests{model="m",model_version="v1",service="svc"} 2000.0',
        }

        def fetch_state() -> tuple[set[str], dict[str, int]]:
            with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
                lines = set(r.read().decode().splitlines())
            with urllib.request.urlopen(f"{base}/v1/status", timeout=10) as r:
                current = json.load(r)["components"]["tail"]["current_window"]
            return lines, {w["version"]: w["requests"] for w in current}

        deadline = time.monotonic() + 30
        lines, current = fetch_state()
        while time.monotonic() < deadline and not (want <= lines and current == {"v1": 2000, "v2": 400}):
            time.sleep(0.2)
            lines, current = fetch_state()
        assert want <= lines, sorted(x for x in lines if "canary" in x)
        assert current == {"v1": 2000, "v2": 400}
        # Every request is in the tail's open window: close it, as its end would.
        (tail_comp,) = (s.component for s in sc.slots if s.name == "tail")
        tail_comp.drain(now=tail_comp.window_end)
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
            assert 'inferwatch_tail_window_requests{model="m",model_version="v1",service="svc"} 2000.0' in (
                r.read().decode().splitlines())
        with urllib.request.urlopen(f"{base}/v1/status", timeout=10) as r:
            comps = json.load(r)["components"]
        (j,) = comps["canary"]["judgements"]
        assert (j["verdict"], j["canary_version"], j["baseline_version"]) == ("fail", "v2", "v1")
        assert j["failing_since_unix"] <= j["verdict_since_unix"] - 0.5
        tail = {m["version"]: m for m in comps["tail"]["models"]}
        assert tail["v1"]["tails"]["p99"]["status"] == "ok" and tail["v1"]["joined_ratio"] == 1.0
        assert main(["canary", "--sidecar", base]) == 1
        out = capsys.readouterr().out
        assert out.startswith("m (svc): v2 against stable v1: FAIL, score ")
        assert "latency_p99 *" in out and "why: latency_p99: ratio " in out
        rows = {ln.split()[0]: ln for ln in out.splitlines()[2:] if ln.startswith("  ") and not ln.strip().startswith(
            ("why:", "warning:"))}
        assert "Fisher exact, share above P99" in rows["latency_p99"] and "s (P99)" in rows["latency_p99"]
        assert "Fisher exact" in rows["error_rate"] and "Mann-Whitney U" in rows["latency"]
        assert "warning:" not in out  # one producer sent both versions: one replica each, the same load
    finally:
        sc.shutdown()
    assert main(["canary", "--sidecar", base, "--timeout", "1"]) == 2
    assert "cannot read" in capsys.readouterr().err

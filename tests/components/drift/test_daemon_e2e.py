"""The drift component inside the real sidecar daemon: UDP ingest, POST /v1/labels, /metrics, /v1/status."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from inferwatch.wire import EV_RECORD, Encoder
from inferwatch_sidecar.components.drift import profile as prof


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_drift_through_the_daemon(tmp_path) -> None:
    from inferwatch_sidecar.config import SidecarConfig
    from inferwatch_sidecar.daemon import Sidecar

    rng = np.random.default_rng(0)
    ref = tmp_path / "p.json"
    prof.build({"a": rng.normal(size=3000)}, {"c": list(rng.choice(["x", "y"], 3000))}).save(str(ref))
    cfg = SidecarConfig.model_validate({
        "ingest": {"socket": None, "udp_port": 0}, "http": {"port": 0, "admin_token": "s3cret-token-123456"},
        "gpu": {"enabled": False},
        "drift": {"enabled": True, "reference": str(ref), "evaluate_interval_s": 0.1, "window_events": 5000},
    })
    sc = Sidecar(cfg)
    sc.startup()
    try:
        base = f"http://127.0.0.1:{sc.http.port}"
        enc = Encoder(pid=1, producer_id=2)
        events = [(EV_RECORD, ("svc", "m", "v1"), time.time_ns(), f"r{i}", 1, 0.9, None,
                   {"a": float(rng.normal(1.0)), "c": "x"}) for i in range(500)]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for frame in enc.encode(events):
                s.sendto(frame, ("127.0.0.1", sc.ingest.udp_port))

        def metric_lines() -> set[str]:
            return set(_get(f"{base}/metrics")[1].decode().splitlines())

        # The labels go in only once every record is in the window: a label that came first would
        # find no prediction and count as unmatched (the HTTP thread can beat the ingest thread).
        in_window = 'inferwatch_drift_window_events{model="m",model_version="v1"} 500.0'
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and in_window not in metric_lines():
            time.sleep(0.1)
        assert in_window in metric_lines()
        body = json.dumps({"labels": [{"request_id": f"r{i}", "label": i % 2, "model": "m", "model_version": "v1"}
                                      for i in range(10)]}).encode()
        req = urllib.request.Request(f"{base}/v1/labels", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
        want = {
            'inferwatch_drift_window_events{model="m",model_version="v1"} 500.0',
            'inferwatch_drift_feature_drifted{feature="a",model="m",model_version="v1"} 1.0',
            'inferwatch_drift_labels_total{model="m",model_version="v1",result="joined"} 10.0',
            'inferwatch_drift_accuracy_ratio{model="m",model_version="v1"} 0.5',
        }
        deadline = time.monotonic() + 20
        lines: set[str] = set()
        while time.monotonic() < deadline and not want <= lines:
            lines = metric_lines()
            time.sleep(0.1)
        assert want <= lines, sorted(x for x in lines if x.startswith("inferwatch_drift"))
        st = json.loads(_get(f"{base}/v1/status")[1])["components"]["drift"]
        assert st["reference"] == {"source": "file", "path": str(ref), "warmup_events": 5000, "mode": "file",
                                "rolling_period_s": None}
        assert st["models"][0]["window"]["events"] == 500
        assert {f["feature"] for f in st["models"][0]["features"] if f["drifted"]} == {"a", "c"}
        code, _ = _get(f"{base}/admin/drift/report?model=m", token="wrong-token-000000")
        assert code in (401, 403)
    finally:
        sc.shutdown()


def test_bad_profile_stops_daemon_start_up(tmp_path) -> None:
    from inferwatch_sidecar.config import SidecarConfig
    from inferwatch_sidecar.daemon import Sidecar, StartupError

    bad = tmp_path / "p.json"
    bad.write_text('{"format": "inferwatch-drift-profile", "version": 1, "columns": [{"name": "a"}]}')
    cfg = SidecarConfig.model_validate({"ingest": {"socket": None, "udp_port": 0}, "http": {"port": 0},
                                        "gpu": {"enabled": False}, "drift": {"reference": str(bad)}})
    with pytest.raises(StartupError, match=r"drift: reference profile .*p.json: column 'a': missing field 'kind'"):
        Sidecar(cfg).startup()

"""The live join: served RECORD events joined with offline values by request ID, bounded, and the served sample."""

from __future__ import annotations

import json
import os
import socket
import struct
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

import inferwatch
from inferwatch.wire import EV_RECORD, Encoder, Schema
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.skew.component import SkewComponent, sampled
from inferwatch_sidecar.components.skew.config import SkewConfig
from inferwatch_sidecar.components.skew.tables import read_table
from inferwatch_sidecar.components.skew.writer import ServedWriter

SCHEMA = Schema(1, ("price", "price_mean3"), ("city",), struct.Struct("<2d"), struct.Struct("<H"))
CTX = ("svc", "m", "v1")
NOW = 1_000_000.0


def _served(n: int, seed: int = 0, t: float = NOW) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]]:
    """RECORD events as the decoder hands them, and the offline rows the pipeline computes for them."""
    rng = np.random.default_rng(seed)
    price = rng.normal(100, 10, n + 1)
    events, offline = [], []
    for i in range(n):
        city = str(rng.choice(["a", "b"]))
        mean_served = float(price[i])  # one point late: served uses the previous row
        events.append((EV_RECORD, CTX, int(t * 1e9), f"r{i}", None, None, None,
                       (SCHEMA, (float(price[i + 1]), mean_served), (city,))))
        offline.append({"request_id": f"r{i}", "features": {"price": float(price[i + 1]),
                                                           "price_mean3": float(price[i + 1]), "city": city}})
    return events, offline


class _Fams(Collector):
    def __init__(self, comp: SkewComponent) -> None:
        self.comp = comp

    def collect(self) -> Any:
        return self.comp.collect()


def _registry(comp: SkewComponent) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(_Fams(comp))
    return reg


def test_offline_rows_join_served_ones_and_give_the_match_ratio_per_feature() -> None:
    c = SkewComponent(SkewConfig(enabled=True, evaluate_seconds=1), ComponentContext(clock=lambda: NOW))
    events, offline = _served(300)
    c.handle(0, 0, events)
    c.drain(NOW)
    status, ans = c.post_offline(json.dumps({"rows": offline[:200]}).encode())
    assert (status, ans) == (200, {"accepted": 200, "joined": 200, "waiting": 0, "duplicate": 0, "bad": 0})
    c.evaluate()
    reg = _registry(c)
    lab = {"service": "svc", "model": "m", "model_version": "v1"}
    assert reg.get_sample_value("inferwatch_skew_match_ratio", {**lab, "feature": "price"}) == 1.0
    assert reg.get_sample_value("inferwatch_skew_match_ratio", {**lab, "feature": "city"}) == 1.0
    assert reg.get_sample_value("inferwatch_skew_match_ratio", {**lab, "feature": "price_mean3"}) == 0.0
    assert reg.get_sample_value("inferwatch_skew_joined_rows_total", lab) == 200
    assert reg.get_sample_value("inferwatch_skew_pending_rows", {"side": "served"}) == 100
    (m,) = c.status()["models"]
    assert m["features"]["price_mean3"]["kind"] == "mismatch"  # no entity order live: `inferwatch skew` names lag
    assert m["features"]["price"]["kind"] == "match"


def test_offline_rows_that_come_first_wait_and_every_bound_holds() -> None:
    cfg = SkewConfig(enabled=True, max_ids=50, max_offline_rows_per_post=100, max_age_seconds=60)
    c = SkewComponent(cfg, ComponentContext(clock=lambda: NOW))
    events, offline = _served(120)
    status, ans = c.post_offline(json.dumps({"rows": offline[:80]}).encode())
    assert ans["waiting"] == 80 and c.status()["pending"]["offline"] == 50  # the oldest 30 went
    assert c.offline_rows["unmatched"] == 30
    c.handle(0, 0, events)
    c.drain(NOW)
    st = c.status()
    assert c.offline_rows["joined"] == 50  # r30..r79 were waiting
    assert st["pending"] == {"served": 50, "offline": 0}  # 70 served rows, the oldest 20 evicted
    assert st["expired"]["max_ids"] == 20
    c.drain(NOW + 61)
    assert c.status()["pending"]["served"] == 0 and c.expired["max_age"] == 50
    # bad rows are counted and named, never a crash; a too-large post is refused whole
    bad = [{"request_id": ""}, {"request_id": "x", "features": {"a": [1]}}, 3, {"request_id": "y", "features": {}}]
    status, ans = c.post_offline(json.dumps({"rows": bad + offline[100:101]}).encode())
    assert status == 200 and ans["bad"] == 4 and ans["accepted"] == 1 and len(ans["errors"]) == 4
    assert c.post_offline(b"{not json")[0] == 400
    assert c.post_offline(b'{"rows": 3}')[0] == 400
    assert c.post_offline(json.dumps({"rows": offline[:101]}).encode())[0] == 413
    assert c.post_offline(json.dumps({"rows": offline[100:101]}).encode())[1]["duplicate"] == 1


def test_records_without_an_id_are_counted_and_staging_is_bounded() -> None:
    c = SkewComponent(SkewConfig(enabled=True, max_staged=1000), ComponentContext(clock=lambda: NOW))
    events, _ = _served(1500)
    c.handle(0, 0, events)
    assert c.dropped["staging_full"] == 500
    c.drain(NOW)
    c.handle(0, 0, [(EV_RECORD, CTX, 0, None, None, None, None, (SCHEMA, (1.0, 1.0), ("a",)))])
    c.drain(NOW)
    assert c.dropped["no_request_id"] == 1 and c.status()["pending"]["served"] == 1000


def test_sampling_is_a_deterministic_bounded_share_of_request_ids() -> None:
    ids = [f"req-{i}" for i in range(20000)]
    share = np.mean([sampled(i, 0.05) for i in ids])
    assert 0.04 < share < 0.06
    assert [sampled(i, 0.05) for i in ids[:100]] == [sampled(i, 0.05) for i in ids[:100]]
    assert not any(sampled(i, 0.0) for i in ids)
    # the SDK's helper picks the same IDs, clamps its share to 0.1, is off by default and never raises
    assert [inferwatch.skew_sampled(i, 0.05) for i in ids[:2000]] == [sampled(i, 0.05) for i in ids[:2000]]
    assert [inferwatch.skew_sampled(i, 0.9) for i in ids[:2000]] == [sampled(i, 0.1) for i in ids[:2000]]
    assert not inferwatch.skew_sampled("req-1") and not inferwatch.skew_sampled(None, 0.1)
    assert inferwatch.skew_sampled(object(), "x") is False  # type: ignore[arg-type]
    # a smaller share's IDs are a subset of a larger one's: an SDK sampling 1% feeds a sidecar keeping 5%
    assert all(sampled(i, 0.05) for i in ids if sampled(i, 0.01))
    with pytest.raises(ValueError, match="above skew.max_sample_ratio"):
        SkewConfig(sample_ratio=0.5, served_dir="/tmp/x")
    with pytest.raises(ValueError, match="needs skew.served_dir"):
        SkewConfig(sample_ratio=0.01)


def test_served_sample_rotates_under_its_size_cap_and_reads_back(tmp_path: Path) -> None:
    clock = [NOW]
    w = ServedWriter(str(tmp_path), file_max_bytes=8192, rotate_seconds=300, max_bytes=40000, clock=lambda: clock[0])
    rows = [(f"r{i}", int(NOW * 1e9) + i, CTX, {"price": float(i), "city": "abc"[i % 3]}) for i in range(4000)]
    for k in range(0, 4000, 200):
        assert w.write(rows[k:k + 200]) == 200
    w.close()
    files = sorted(os.listdir(tmp_path))
    assert files and all(f.startswith("served-") and f.endswith(".parquet") for f in files)
    assert w.bytes <= 40000 and w.bytes == sum(os.path.getsize(tmp_path / f) for f in files)
    table = read_table(str(tmp_path))
    assert table.num_rows + w.dropped_size_cap == 4000 == w.written
    assert w.dropped_size_cap > 0  # the cap deleted the oldest files
    assert table.column_names == ["request_id", "time", "service", "model", "model_version", "city", "price"]
    kept = sorted(int(r[1:]) for r in table.column("request_id").to_pylist())
    assert kept == list(range(4000 - table.num_rows, 4000))  # the newest rows survive
    # a restarted writer counts the files already there toward the cap, and removes unfinished ones
    (tmp_path / "served-x.parquet.tmp").write_bytes(b"partial")
    w2 = ServedWriter(str(tmp_path), file_max_bytes=8192, rotate_seconds=300, max_bytes=40000, clock=lambda: clock[0])
    assert w2.bytes == w.bytes and not (tmp_path / "served-x.parquet.tmp").exists()
    # age rotation: a quiet writer's file becomes readable
    before = w2.bytes
    w2.write(rows[:5])
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".tmp")]) == 1
    w2.rotate_if_due()
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".tmp")]) == 1  # not yet rotate_seconds old
    clock[0] += 300
    w2.rotate_if_due()
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []
    assert read_table(str(tmp_path)).num_rows == table.num_rows + 5 - w2.dropped_size_cap
    assert w2.bytes <= 40000 and (w2.bytes > before or w2.dropped_size_cap > 0)


def test_daemon_joins_sdk_records_with_record_offline_and_writes_the_sample(tmp_path: Path) -> None:
    from inferwatch_sidecar.config import SidecarConfig
    from inferwatch_sidecar.daemon import Sidecar

    cfg = SidecarConfig.model_validate({
        "ingest": {"socket": None, "udp_port": 0}, "http": {"port": 0},
        "gpu": {"enabled": False}, "drift": {"enabled": False}, "tail": {"enabled": False},
        "canary": {"enabled": False},
        "skew": {"enabled": True, "evaluate_seconds": 0.2, "served_dir": str(tmp_path / "served"),
                 "sample_ratio": 0.1, "rotate_seconds": 0.5},
    })
    sc = Sidecar(cfg)
    sc.startup()
    try:
        base = f"http://127.0.0.1:{sc.http.port}"
        n = 400
        rng = np.random.default_rng(4)
        x = rng.normal(0, 1, n)
        events = [(EV_RECORD, CTX, time.time_ns(), f"q{i}", None, None, None,
                   {"x": float(x[i] * 2 + 1), "city": "ab"[i % 2]}) for i in range(n)]
        enc = Encoder(pid=1, producer_id=2)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for i, frame in enumerate(enc.encode(events)):
                s.sendto(frame, ("127.0.0.1", sc.ingest.udp_port))
                if i % 20 == 19:
                    time.sleep(0.002)
        (comp,) = (s.component for s in sc.slots if s.name == "skew")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and comp.status()["pending"]["served"] < n:
            time.sleep(0.1)
        assert comp.status()["pending"]["served"] == n
        totals = inferwatch.record_offline(
            [(f"q{i}", {"x": float(x[i]), "city": "ab"[i % 2]}) for i in range(n)] + [("q-none", {"x": 1.0})],
            url=base, batch_size=150)
        assert totals == {"accepted": n + 1, "joined": n, "waiting": 1, "duplicate": 0, "bad": 0, "failed": 0}
        want = {'inferwatch_skew_match_ratio{feature="x",model="m",model_version="v1",service="svc"} 0.0',
                'inferwatch_skew_match_ratio{feature="city",model="m",model_version="v1",service="svc"} 1.0',
                'inferwatch_skew_explained_ratio{feature="x",kind="affine",model="m",model_version="v1",'
                'service="svc"} 1.0'}
        lines: set[str] = set()
        while time.monotonic() < deadline and not want <= lines:
            time.sleep(0.2)
            with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
                lines = set(r.read().decode().splitlines())
        assert want <= lines, sorted(x for x in lines if "skew" in x)
        with urllib.request.urlopen(f"{base}/v1/status", timeout=10) as r:
            st = json.load(r)["components"]["skew"]
        assert st["models"][0]["features"]["x"]["kind"] == "affine"
        # POST /v1/skew answers bad input with 400 and a reason
        req = urllib.request.Request(f"{base}/v1/skew", data=b"[", method="POST",
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 400 and "not JSON" in e.value.read().decode()
    finally:
        sc.shutdown()
    expected = sorted(f"q{i}" for i in range(n) if sampled(f"q{i}", 0.1))
    table = read_table(str(tmp_path / "served"))
    assert sorted(table.column("request_id").to_pylist()) == expected
    assert table.column("x").to_pylist()[0] is not None


def test_record_offline_never_raises_when_the_sidecar_is_away() -> None:
    from tests.helpers.net import free_port

    totals = inferwatch.record_offline([("a", {"x": 1.0}), {"request_id": "b", "features": {"x": float("nan")}},
                                        object()], url=f"http://127.0.0.1:{free_port()}", timeout=2)
    assert totals["failed"] == 2 and totals["bad"] == 1

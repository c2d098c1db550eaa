"""The daemon in-process: JSON ingest, components that misbehave, admin routes, status."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics_core import GaugeMetricFamily

from inferwatch.wire import EV_HELLO, EV_RECORD, EV_REQUEST, Encoder
from inferwatch_sidecar.config import load_config
from inferwatch_sidecar.daemon import HANDLED_SIGNALS, ComponentSlot, Sidecar
from tests.helpers.sidecar import parse_metrics, sample, total, wait_until

TOKEN = "test-token-0123456789"


class FakeComponent:
    """A component that records what it gets and can be told to fail."""

    name = "fake"
    record_types = frozenset({EV_RECORD})

    def __init__(self) -> None:
        self.records: list[tuple[Any, ...]] = []
        self.fail = False

    def start(self) -> None: ...

    def stop(self, timeout: float) -> None: ...

    def handle(self, pid: int, producer_id: int, records: list[tuple[Any, ...]]) -> None:
        if self.fail:
            raise RuntimeError("handle exploded")
        self.records.extend(records)

    def collect(self) -> Any:
        if self.fail:
            raise RuntimeError("collect exploded")
        g = GaugeMetricFamily("inferwatch_fake_records", "records seen by the fake component")
        g.add_metric([], len(self.records))
        yield g

    def status(self) -> dict[str, Any]:
        if self.fail:
            raise RuntimeError("status exploded")
        return {"records": len(self.records)}

    def admin_routes(self) -> dict[str, Any]:
        return {"count": lambda q: (200, "application/json", json.dumps({"n": len(self.records), "q": q}).encode())}


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Sidecar, FakeComponent]]:
    tree = {
        "ingest": {"socket": str(tmp_path / "s.sock"), "max_json_body_bytes": 4096, "max_json_events": 50},
        "http": {"port": 0, "admin_token": TOKEN}, "gpu": {"enabled": False}, "drift": {"enabled": False},
    }
    sc = Sidecar(load_config(environ={}, overrides=tree), environ={})
    sc.startup()
    fake = FakeComponent()
    sc.slots.append(ComponentSlot("fake", "running", fake))  # type: ignore[arg-type]
    sc.pipeline.dispatch.append(("fake", fake.record_types, fake.handle))
    yield sc, fake
    sc.shutdown()


def call(sc: Sidecar, path: str, body: Any = None, headers: dict[str, str] | None = None,
         raw: bytes | None = None) -> tuple[int, Any]:
    assert sc.http is not None
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    hdrs = {"Content-Type": "application/json"} if data is not None else {}
    req = urllib.request.Request(f"http://127.0.0.1:{sc.http.port}{path}", data=data, headers={**hdrs, **(headers or {})},
                                 method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            out, code = r.read(), r.status
    except urllib.error.HTTPError as e:
        out, code = e.read(), e.code
    try:
        return code, json.loads(out)
    except ValueError:
        return code, out.decode()


def metrics(sc: Sidecar) -> dict[Any, float]:
    code, text = call(sc, "/metrics")
    assert code == 200
    return parse_metrics(text)


def test_json_events_every_type_and_bad_ones_counted(daemon: tuple[Sidecar, FakeComponent]) -> None:
    sc, fake = daemon
    body = {
        "service": "ranker", "model": "resnet50", "model_version": "v3",
        "events": [
            {"type": "request", "request_id": "abc", "duration_s": 0.031, "outcome": "ok",
             "stages": {"preprocess": 0.002, "inference": 0.025}},
            {"type": "request", "duration_s": 1.5, "outcome": "error", "error_type": "Timeout",
             "trace_id": "0af7651916cd43dd8448eb211c80319c", "stages": [{"stage": "queue", "duration_s": 0.7}]},
            {"type": "stage", "stage": "generate", "duration_s": 3.0, "ttft_s": 0.1, "items": 40, "gaps_s": [0.02, 0.021]},
            {"type": "record", "request_id": "abc", "prediction": "cat", "confidence": 0.93,
             "features": {"age": 31, "country": "DE"}},
            {"type": "label", "request_id": "abc", "label": "dog"},
            {"type": "batch", "size": 8},
            {"type": "queue", "depth": 3},
            {"type": "request"},  # missing duration
            {"type": "record", "confidence": "high"},  # bad value
            {"type": "teleport"},  # unknown type
            "not an object",
        ],
    }
    code, resp = call(sc, "/v1/events", body)
    assert code == 200
    assert resp == {"accepted": 7, "rejected": 4,
                    "errors": {"missing_field": 1, "bad_value": 1, "unknown_type": 1, "not_an_object": 1}}
    s = metrics(sc)
    lab = {"service": "ranker", "model": "resnet50", "model_version": "v3"}
    assert sample(s, "inferwatch_requests_total", **lab, outcome="ok") == 1
    assert sample(s, "inferwatch_request_errors_total", **lab, error_type="Timeout") == 1
    assert sample(s, "inferwatch_stage_duration_seconds_bucket", **lab, stage="inference", le="0.025") == 1
    assert sample(s, "inferwatch_queue_wait_seconds_count", **lab) == 1
    assert sample(s, "inferwatch_queue_wait_seconds_bucket", **lab, le="0.5") == 0
    assert sample(s, "inferwatch_generated_tokens_total", **lab, stage="generate") == 40
    assert sample(s, "inferwatch_inter_token_latency_seconds_count", **lab, stage="generate") == 2
    assert sample(s, "inferwatch_time_to_first_token_seconds_bucket", **lab, stage="generate", le="0.1") == 1
    assert sample(s, "inferwatch_batch_size_bucket", **lab, le="8.0") == 1
    assert sample(s, "inferwatch_queue_depth", **lab) == 3
    assert sample(s, "inferwatch_records_total", **lab) == 1  # the prediction; the label alone is not a record
    assert sample(s, "inferwatch_labels_received_total") == 1
    assert sample(s, "inferwatch_ingest_decode_errors_total", scope="json", reason="bad_value") == 1
    assert sample(s, "inferwatch_ingest_events_total", transport="http", type="request") == 2
    # The drift-style component got the record in decoded form and the label as a record with only the label.
    rec, lab_ev = fake.records
    schema, nums, cats = rec[7]
    assert schema.numeric == ("age",) and schema.categorical == ("country",) and nums == (31.0,) and cats == ("DE",)
    assert schema.num_struct.size == 8 and schema.cat_struct.size == 2
    assert lab_ev[0] == EV_RECORD and lab_ev[3] == "abc" and lab_ev[6] == "dog" and lab_ev[4] is None
    # The same feature names reuse one cached Schema object.
    call(sc, "/v1/events", {"events": [{"type": "record", "features": {"age": 1, "country": "FR"}}]})
    assert fake.records[-1][7][0] is schema


def test_labels_endpoint_and_body_errors(daemon: tuple[Sidecar, FakeComponent]) -> None:
    sc, fake = daemon
    code, resp = call(sc, "/v1/labels", {"model": "m", "labels": [{"request_id": "r1", "label": 1}, {"label": "x"}]})
    assert code == 200 and resp == {"accepted": 1, "rejected": 1, "errors": {"missing_field": 1}}
    assert fake.records[0][3] == "r1" and fake.records[0][6] == 1.0 and fake.records[0][1] == (None, "m", None)
    assert call(sc, "/v1/events", raw=b"{not json")[0] == 400
    assert call(sc, "/v1/events", {"nothing": []})[0] == 400
    assert call(sc, "/v1/events", raw=b"x" * 5000)[0] == 413
    code, resp = call(sc, "/v1/events", {"events": [{"type": "queue", "depth": 1}] * 60})
    assert code == 200 and resp["accepted"] == 50 and resp["errors"] == {"too_many_events": 10}
    s = metrics(sc)
    assert sample(s, "inferwatch_ingest_decode_errors_total", scope="json", reason="bad_json") == 1
    assert sample(s, "inferwatch_ingest_decode_errors_total", scope="json", reason="bad_body") == 1
    assert sample(s, "inferwatch_ingest_dropped_total", reason="body_too_large") == 1
    assert sample(s, "inferwatch_ingest_dropped_total", reason="too_many_events") == 10


def test_failing_component_never_takes_the_daemon_down(daemon: tuple[Sidecar, FakeComponent], tmp_path: Path) -> None:
    sc, fake = daemon
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    enc = Encoder(1, 99)

    def send(n: int) -> None:
        evs: list[Any] = []
        for i in range(n):
            evs.append((EV_REQUEST, ("s", "m", "v"), time.time_ns(), 1_000_000, 0, None, f"r{i}", None, []))
            evs.append((EV_RECORD, ("s", "m", "v"), time.time_ns(), f"r{i}", "a", 0.5, None, {"x": 1.0}))
        for f in enc.encode(evs):
            sender.sendto(f, str(tmp_path / "s.sock"))

    send(10)
    wait_until(lambda: len(fake.records) == 10, what="component got records")
    assert sample(metrics(sc), "inferwatch_fake_records") == 10
    fake.fail = True
    send(10)
    s = wait_until(lambda: (m := metrics(sc)) and sample(m, "inferwatch_requests_total", service="s", model="m",
                                                         model_version="v", outcome="ok") == 20 and m,
                   what="ingest continues")
    assert sample(s, "inferwatch_component_errors_total", component="fake", method="handle") >= 1
    # That scrape's collect failure shows from the next scrape on.
    s = metrics(sc)
    assert sample(s, "inferwatch_component_errors_total", component="fake", method="collect") >= 1
    assert ("inferwatch_fake_records", ()) not in s
    code, st = call(sc, "/v1/status")
    assert code == 200 and "status exploded" in st["components"]["fake"]["status_error"]
    assert call(sc, "/healthz")[0] == 200
    sender.close()


def test_admin_routes_need_the_bearer_token(daemon: tuple[Sidecar, FakeComponent]) -> None:
    sc, _ = daemon
    assert call(sc, "/admin/fake/count")[0] == 401
    assert call(sc, "/admin/fake/count", headers={"Authorization": "Bearer wrong-token-000000"})[0] == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    code, resp = call(sc, "/admin/fake/count?x=1", headers=auth)
    assert code == 200 and resp == {"n": 0, "q": {"x": "1"}}
    assert call(sc, "/admin/fake/nope", headers=auth)[0] == 404
    assert call(sc, "/admin/", headers=auth)[1] == {"routes": {"fake": ["count"]}}


def test_admin_routes_are_off_without_a_token(tmp_path: Path) -> None:
    tree = {"ingest": {"socket": str(tmp_path / "a.sock")}, "http": {"port": 0},
            "gpu": {"enabled": False}, "drift": {"enabled": False}}
    sc = Sidecar(load_config(environ={}, overrides=tree), environ={})
    sc.startup()
    try:
        code, body = call(sc, "/admin/anything", headers={"Authorization": "Bearer x"})
        assert code == 404 and "disabled" in body
    finally:
        sc.shutdown()


def test_status_reports_versions_producers_components(daemon: tuple[Sidecar, FakeComponent], tmp_path: Path) -> None:
    sc, _ = daemon
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    enc = Encoder(4321, 0xFEED)
    for f in enc.encode([(EV_REQUEST, ("s", "m", "v"), time.time_ns(), 1, 0, None, None, None, [])],
                        [(1, "9.9", "python", "podhost", time.time_ns())]):
        sender.sendto(f, str(tmp_path / "s.sock"))
    sender.close()
    st = wait_until(lambda: (x := call(sc, "/v1/status")[1]) and x["producers"]["known"] == 1 and x, what="producer")
    assert st["version"] and st["python"] and st["ready"] is True and st["uptime_s"] >= 0
    p = st["producers"]["table"][0]
    assert p["pid"] == 4321 and p["producer_id"] == "000000000000feed" and p["hello"]["hostname"] == "podhost"
    assert st["components"]["gpu"] == {"state": "disabled"} and st["components"]["fake"]["state"] == "running"
    assert st["otlp"]["state"] in ("disabled", "unavailable")
    assert call(sc, "/readyz")[0] == 200


def test_lost_frames_counted_from_sequence_gaps(daemon: tuple[Sidecar, FakeComponent], tmp_path: Path) -> None:
    sc, _ = daemon
    enc = Encoder(5, 0xBEEF)
    hello = [(EV_HELLO, "0.0.0", "python", "host", 0)]  # the SDK's first frame says HELLO; gaps count from it
    frames = [enc.encode([(EV_REQUEST, ("g", "m", "v"), 1, 1, 0, None, None, None, [])], hello if i == 0 else None)[0]
              for i in range(10)]
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    for i, f in enumerate(frames):
        if i not in (3, 4, 7):  # three frames "lost on the way"
            sender.sendto(f, str(tmp_path / "s.sock"))
    sender.close()
    s = wait_until(lambda: (m := metrics(sc)) and total(m, "inferwatch_requests_total", service="g") == 7 and m,
                   what="frames")
    assert sample(s, "inferwatch_ingest_lost_frames_total") == 3


class SlowStop(FakeComponent):
    """A component whose stop() takes its whole time limit unless released."""

    def __init__(self) -> None:
        super().__init__()
        self.stopping = threading.Event()
        self.release = threading.Event()

    def stop(self, timeout: float) -> None:
        self.stopping.set()
        self.release.wait(timeout)


def _lifecycle_daemon(tmp_path: Path, component: FakeComponent | None = None) -> Sidecar:
    tree = {"ingest": {"socket": str(tmp_path / "l.sock")}, "http": {"port": 0}, "shutdown_timeout_s": 30,
            "gpu": {"enabled": False}, "drift": {"enabled": False}}
    sc = Sidecar(load_config(environ={}, overrides=tree), environ={})
    if component is not None:
        sc.slots.append(ComponentSlot("slow", "built", component))  # type: ignore[arg-type]
    return sc


def _handlers() -> dict[int, Any]:
    return {sig: signal.getsignal(sig) for sig in HANDLED_SIGNALS}


def test_run_restores_the_signal_handlers_it_replaced(tmp_path: Path) -> None:
    sc = _lifecycle_daemon(tmp_path)
    before = _handlers()
    during: dict[int, Any] = {}

    def stop_when_ready() -> None:
        wait_until(lambda: sc.ready, what="daemon ready")
        during.update(_handlers())
        os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=stop_when_ready)
    t.start()
    assert sc.run() == 0
    t.join()
    assert during == dict.fromkeys(HANDLED_SIGNALS, sc.handle_exit)
    assert _handlers() == before


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_cuts_a_slow_shutdown_short(tmp_path: Path, second: signal.Signals) -> None:
    slow = SlowStop()
    sc = _lifecycle_daemon(tmp_path, slow)
    before = _handlers()
    sent_at: list[float] = []

    def signal_twice() -> None:
        wait_until(lambda: sc.ready, what="daemon ready")
        os.kill(os.getpid(), signal.SIGTERM)
        assert slow.stopping.wait(10), "shutdown never reached the slow component"
        sent_at.append(time.monotonic())
        os.kill(os.getpid(), second)

    t = threading.Thread(target=signal_twice)
    t.start()
    try:
        rc = sc.run()
        returned_at = time.monotonic()
    finally:
        slow.release.set()
        t.join()
    assert rc == 128 + second
    assert sc.force_exit
    # shutdown_timeout_s is 30 s and the component would use all of it: the second signal ends the wait.
    assert returned_at - sent_at[0] < 10.0
    assert _handlers() == before

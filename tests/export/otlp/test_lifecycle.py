"""The background pusher: intervals, final flush, failures, recovery and time limits."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsPartialSuccess,
    ExportMetricsServiceResponse,
)
from prometheus_client import CollectorRegistry, Counter

from inferwatch_sidecar.export.otlp import OtlpMetricsPusher
from tests.export.otlp.conftest import Answer, OtlpReceiver, metrics_by_name
from tests.helpers.net import free_port


def _counter_value(r: object) -> float:
    return float(metrics_by_name(r.request)["inferwatch_events"].sum.data_points[0].as_double)  # type: ignore[attr-defined]


def _registry() -> tuple[CollectorRegistry, Counter]:
    reg = CollectorRegistry()
    return reg, Counter("inferwatch_events", "Events.", registry=reg)


def _pusher(url: str, collect: Callable[[], Iterable[object]], **kw: object) -> OtlpMetricsPusher:
    return OtlpMetricsPusher(collect, endpoint=url, resource={"service.name": "api"}, **kw)  # type: ignore[arg-type]


def _wait_until(pred: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        time.sleep(0.01)


def test_pushes_every_interval_with_the_latest_values(receiver: OtlpReceiver) -> None:
    reg, c = _registry()
    p = _pusher(receiver.base_url + "/v1/metrics", reg.collect, interval_s=0.1)
    c.inc(3)
    p.start()
    try:
        receiver.wait_for(1)
        c.inc(4)
        got = receiver.wait_for(len(receiver.received) + 2)
    finally:
        p.stop(2.0)
    assert _counter_value(got[0]) == 3.0
    assert _counter_value(got[-1]) == 7.0
    st = p.status()
    assert st["pushes_ok"] == len(receiver.received) and st["pushes_failed"] == 0
    assert st["last_push_data_points"] == 1 and st["last_push_bytes"] > 0
    assert st["running"] is False


def test_stop_does_a_final_flush_within_the_time_limit(receiver: OtlpReceiver) -> None:
    reg, c = _registry()
    p = _pusher(receiver.base_url + "/v1/metrics", reg.collect, interval_s=3600)
    p.start()
    c.inc(11)  # after start, long before the first interval: only the final flush can carry it
    t0 = time.monotonic()
    p.stop(2.0)
    assert time.monotonic() - t0 < 3.0  # its 2 s budget, and room for a loaded machine
    (got,) = receiver.wait_for(1)
    assert _counter_value(got) == 11.0
    assert p.status()["final_flush"] == "ok"
    p.stop(2.0)  # idempotent: no second flush
    assert len(receiver.received) == 1


def test_stop_without_start_still_flushes(receiver: OtlpReceiver) -> None:
    reg, c = _registry()
    c.inc(2)
    p = _pusher(receiver.base_url + "/v1/metrics", reg.collect)
    p.stop(2.0)
    assert _counter_value(receiver.wait_for(1)[0]) == 2.0


def test_stop_returns_on_time_when_the_receiver_hangs(receiver: OtlpReceiver) -> None:
    receiver.answer = Answer(delay_s=6.0)
    reg, _ = _registry()
    p = _pusher(receiver.base_url + "/v1/metrics", reg.collect, interval_s=3600, timeout_s=10.0)
    p.start()
    t0 = time.monotonic()
    p.stop(0.5)
    assert time.monotonic() - t0 < 3.0  # far under the 6 s it would wait for the answer
    assert p.status()["final_flush"] in ("failed", "timed_out")


def test_receiver_down_is_counted_without_raising_then_recovers() -> None:
    port = free_port()
    reg, c = _registry()
    c.inc(5)
    p = _pusher(f"http://127.0.0.1:{port}/v1/metrics", reg.collect, timeout_s=1.0)
    assert p.push_once() is False
    st = p.status()
    assert st["failures"] == {"connect": 1} and st["pushes_failed"] == 1 and st["pushes_ok"] == 0
    assert str(port) in st["last_error"] and st["last_success_age_s"] is None

    up = OtlpReceiver(port)
    try:
        c.inc(1)
        assert p.push_once() is True
        assert _counter_value(up.wait_for(1)[0]) == 6.0  # nothing was queued: just the latest total
    finally:
        up.close()
    st = p.status()
    assert st["pushes_ok"] == 1 and st["pushes_failed"] == 1
    assert 0 <= st["last_success_age_s"] < 5


def test_background_thread_keeps_retrying_while_down_and_delivers_once_up() -> None:
    port = free_port()
    reg, c = _registry()
    c.inc(9)
    p = _pusher(f"http://127.0.0.1:{port}/v1/metrics", reg.collect, interval_s=0.05, timeout_s=0.5)
    p.start()
    up = None
    try:
        _wait_until(lambda: p.status()["failures"].get("connect", 0) >= 2)
        up = OtlpReceiver(port)
        assert _counter_value(up.wait_for(1)[0]) == 9.0
    finally:
        p.stop(2.0)
        if up is not None:
            up.close()
    assert p.status()["pushes_ok"] >= 1


def test_4xx_answer_is_counted_with_its_message(receiver: OtlpReceiver) -> None:
    receiver.answer = Answer(status=400, body=b"metric name invalid", headers={"Content-Type": "text/plain"})
    reg, _ = _registry()
    p = _pusher(receiver.base_url + "/v1/metrics", reg.collect)
    assert p.push_once() is False
    receiver.answer = Answer(status=401)
    assert p.push_once() is False
    st = p.status()
    assert st["failures"] == {"http_4xx": 2}
    assert "401" in st["last_error"]
    receiver.answer = Answer(status=400, body=b"metric name invalid")
    p.push_once()
    assert "400" in p.status()["last_error"] and "metric name invalid" in p.status()["last_error"]


def test_5xx_and_429_with_retry_after_postpone_the_next_push(receiver: OtlpReceiver) -> None:
    receiver.answer = Answer(status=503, headers={"Retry-After": "2"})
    reg, _ = _registry()
    p = _pusher(receiver.base_url + "/v1/metrics", reg.collect, interval_s=0.05)
    p.start()
    try:
        receiver.wait_for(1)
        _wait_until(lambda: p.status()["skipped_retry_after"] >= 3)
        # Inside the Retry-After time no further request was sent.
        assert len(receiver.received) == 1
        receiver.answer = Answer(status=200)
        receiver.wait_for(2, timeout_s=6.0)
    finally:
        p.stop(2.0)
    st = p.status()
    assert st["failures"]["http_5xx"] == 1 and st["pushes_ok"] >= 1

    receiver.answer = Answer(status=429)
    q = _pusher(receiver.base_url + "/v1/metrics", reg.collect)
    assert q.push_once() is False
    assert q.status()["failures"] == {"http_429": 1}


def test_partial_success_counts_rejected_points(receiver: OtlpReceiver) -> None:
    resp = ExportMetricsServiceResponse(
        partial_success=ExportMetricsPartialSuccess(rejected_data_points=3, error_message="too old")
    )
    receiver.answer = Answer(body=resp.SerializeToString(), headers={"Content-Type": "application/x-protobuf"})
    reg, _ = _registry()
    p = _pusher(receiver.base_url + "/v1/metrics", reg.collect)
    assert p.push_once() is True
    st = p.status()
    assert st["rejected_data_points"] == 3 and "too old" in st["last_error"]


def test_slow_receiver_is_a_timeout_failure(receiver: OtlpReceiver) -> None:
    receiver.answer = Answer(delay_s=6.0)
    reg, _ = _registry()
    p = _pusher(receiver.base_url + "/v1/metrics", reg.collect, timeout_s=0.2)
    t0 = time.monotonic()
    assert p.push_once() is False
    assert time.monotonic() - t0 < 3.0  # far under the 6 s answer
    assert p.status()["failures"] == {"timeout": 1}


def test_a_collect_that_raises_is_counted_and_the_thread_survives(receiver: OtlpReceiver) -> None:
    calls = {"n": 0}
    reg, c = _registry()

    def flaky() -> Iterable[object]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("aggregator busy")
        return reg.collect()

    p = _pusher(receiver.base_url + "/v1/metrics", flaky, interval_s=0.05)
    p.start()
    try:
        receiver.wait_for(1)
    finally:
        p.stop(2.0)
    st = p.status()
    assert st["failures"] == {"collect": 1}
    assert st["pushes_ok"] >= 1


def test_concurrent_push_once_calls_are_serialised(receiver: OtlpReceiver) -> None:
    receiver.answer = Answer(delay_s=0.05)
    reg, _ = _registry()
    p = _pusher(receiver.base_url + "/v1/metrics", reg.collect)
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(p.push_once())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert results == [True] * 4 and p.status()["pushes_ok"] == 4


def test_stop_during_an_inflight_push_returns_on_time(receiver: OtlpReceiver) -> None:
    receiver.answer = Answer(delay_s=6.0)
    reg, _ = _registry()
    p = _pusher(receiver.base_url + "/v1/metrics", reg.collect, interval_s=0.05, timeout_s=10.0)
    p.start()
    receiver.wait_for(1)  # the first push is now waiting for its (slow) answer
    t0 = time.monotonic()
    p.stop(0.3)
    assert time.monotonic() - t0 < 3.0  # far under the 6 s answer
    assert p.status()["final_flush"] == "timed_out"

"""The hand-off to the sidecar over a real Unix datagram socket (and UDP), and fork()."""

from __future__ import annotations

import os
import socket
import warnings
from typing import Any

import inferwatch
from inferwatch import _core
from inferwatch.wire import EV_DROPS, EV_HELLO, EV_RECORD, EV_REQUEST, Decoder
from tests.helpers.net import held_port
from tests.sdk.conftest import Receiver, wait_for


def _traffic(n: int, tag: str) -> None:
    for i in range(n):
        with inferwatch.request(f"{tag}-{i}"):
            with inferwatch.stage("inference"):
                pass
            inferwatch.record(prediction="cat", confidence=0.5, features={"age": float(i), "country": "DE"})


def _by_type(records: list[tuple[Any, ...]], t: int) -> list[tuple[Any, ...]]:
    return [r for r in records if r[0] == t]


def test_receiver_absent_then_present_then_restarted(receiver: Receiver) -> None:
    receiver.stop()  # nobody listening yet
    assert inferwatch.configure(
        service="svc", sidecar=f"unix://{receiver.path}", flush_interval_ms=10_000, schema_repeat_s=2.0
    )
    # 1. Absent: every event is dropped and counted, nothing raises.
    _traffic(10, "absent")
    assert inferwatch.flush() is False
    assert inferwatch.stats()["drops"] == {"socket_absent": 20}

    # 2. Present: the next frame carries HELLO, the drops so far, the schema and the events.
    receiver.start()
    _traffic(5, "present")
    assert inferwatch.flush() is True
    recs = receiver.records()
    assert [f.errors for f in receiver.frames] == [[]]
    assert len(_by_type(recs, EV_HELLO)) == 1
    assert _by_type(recs, EV_DROPS) == [(EV_DROPS, {"socket_absent": 20})]
    reqs = _by_type(recs, EV_REQUEST)
    assert [r[6] for r in reqs] == [f"present-{i}" for i in range(5)]
    rows = _by_type(recs, EV_RECORD)
    assert [r[7][1] for r in rows] == [(float(i),) for i in range(5)]
    assert [r[7][2] for r in rows] == [("DE",)] * 5

    # 3a. Restarted while events were being sent: the failed send makes the SDK
    # re-announce HELLO and schemas, so the new receiver decodes everything at once.
    receiver.stop()
    _traffic(3, "down")
    assert inferwatch.flush() is False
    receiver.decoder = Decoder()  # a restarted sidecar knows no schemas
    receiver.start()
    _traffic(4, "back")
    assert inferwatch.flush() is True
    recs = receiver.records()
    assert all(not f.errors for f in receiver.frames)
    assert len(_by_type(recs, EV_RECORD)) == 4
    assert _by_type(recs, EV_DROPS) == [(EV_DROPS, {"socket_absent": 6})]  # only the drops since the last report
    assert len(_by_type(recs, EV_HELLO)) == 1

    # 3b. Restarted between two sends (no failure seen): records that use a schema
    # the new receiver has not seen are rejected until the schema is repeated.
    receiver.stop()
    receiver.decoder = Decoder()
    receiver.frames.clear()
    receiver.start()
    _traffic(2, "quick")
    assert inferwatch.flush() is True
    first = receiver.poll()
    assert [e for f in first for e in f.errors] == ["unknown_schema", "unknown_schema"]
    # Let schema_repeat_s pass. It is 2 s, not less, so that a stalled machine does not repeat the
    # schema before the "quick" records above.
    assert wait_for(lambda: False, timeout=2.05) is False
    _traffic(3, "recovered")
    assert inferwatch.flush() is True
    recs = receiver.records()
    assert len(_by_type(recs, EV_RECORD)) == 3 and all(not f.errors for f in receiver.frames[-1:])
    assert inferwatch.stats()["sent_events"] == 5 * 2 + 4 * 2 + 2 * 2 + 3 * 2


def test_background_thread_sends_without_flush(receiver: Receiver) -> None:
    assert inferwatch.configure(service="svc", sidecar=receiver.path, flush_interval_ms=5)
    _traffic(3, "bg")
    got: list[tuple[Any, ...]] = []

    def arrived() -> bool:
        got.extend(receiver.records(timeout=0.01))
        return len(_by_type(got, EV_REQUEST)) == 3

    assert wait_for(arrived, timeout=5)
    assert len(_by_type(got, EV_RECORD)) == 3


def test_buffer_full_drops_are_counted_exactly(receiver: Receiver) -> None:
    assert inferwatch.configure(service="svc", sidecar=receiver.path, buffer_size=16, flush_interval_ms=10_000)
    rt = _core._rt
    assert rt is not None
    with rt.sender.lock:  # keep the sender thread from draining while we fill the buffer
        for i in range(20):
            inferwatch.observe_batch(i)
    assert inferwatch.flush() is True
    recs = receiver.records()
    assert [r[2] for r in recs if r[0] == 6] == list(range(16))
    assert _by_type(recs, EV_DROPS) == [(EV_DROPS, {"buffer_full": 4})]


def test_udp_transport(receiver: Receiver) -> None:
    with held_port(socket.SOCK_DGRAM) as (rx, port):
        rx.settimeout(2)
        assert inferwatch.configure(service="svc", sidecar=f"udp://127.0.0.1:{port}", flush_interval_ms=10_000)
        _traffic(2, "udp")
        assert inferwatch.flush() is True
        frame = Decoder().decode(rx.recv(70000))
        assert [r[6] for r in frame.records if r[0] == EV_REQUEST] == ["udp-0", "udp-1"]
        assert frame.pid == os.getpid()


def test_sidecar_down_never_raises_and_send_failures_are_counted(receiver: Receiver) -> None:
    # A path in a directory that does not exist: every send fails, nothing raises.
    assert inferwatch.configure(service="svc", sidecar="/nonexistent-dir/x.sock", flush_interval_ms=1)
    _traffic(5, "x")
    assert wait_for(lambda: inferwatch.stats()["drops"].get("socket_absent", 0) == 10, timeout=5)


def test_fork_gives_the_child_its_own_sender(receiver: Receiver) -> None:
    assert inferwatch.configure(service="svc", sidecar=receiver.path, flush_interval_ms=10_000)
    _traffic(1, "parent-before")
    assert inferwatch.flush()
    parent_id = inferwatch.stats()["producer_id"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+ warns about fork with threads
        pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            st = inferwatch.stats()
            if st["pid"] == os.getpid() and st["producer_id"] != parent_id and st["buffered"] == 0:
                _traffic(2, "child")
                with inferwatch.request() as r:
                    rid = r.request_id or ""
                inferwatch.record(prediction=rid)
                code = 0 if inferwatch.flush() else 2
        finally:
            os._exit(code)
    _traffic(1, "parent-after")
    assert inferwatch.flush()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    frames = receiver.poll()
    by_producer: dict[int, list[tuple[Any, ...]]] = {}
    pids = {}
    for f in frames:
        by_producer.setdefault(f.producer_id, []).extend(f.records)
        pids[f.producer_id] = f.pid
    assert len(by_producer) == 2
    child_id = next(k for k in by_producer if k != parent_id)
    assert pids[child_id] == pid and pids[parent_id] == os.getpid()
    child_reqs = [r[6] for r in by_producer[child_id] if r[0] == EV_REQUEST]
    parent_reqs = [r[6] for r in by_producer[parent_id] if r[0] == EV_REQUEST]
    assert child_reqs[:2] == ["child-0", "child-1"] and len(child_reqs) == 3
    assert parent_reqs == ["parent-before-0", "parent-after-0"]
    assert len(_by_type(by_producer[child_id], EV_HELLO)) == 1
    # The child generated its own request-ID prefix, not a copy of the parent's.
    with inferwatch.request() as r:
        parent_rid = r.request_id or ""
    assert child_reqs[2].split("-")[0] != parent_rid.split("-")[0]

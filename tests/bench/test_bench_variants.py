"""The benchmarks' variants still build, answer, and record what their tables say they do.

The benchmarks are not part of the suite; this keeps them from rotting when a peer
library (the ``bench`` extra) or the SDK changes under them. Each test runs the bench
code itself: the FastAPI server in its ``--serve`` mode on loopback, the SDK variants
in process and in their ``--count`` child mode.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import inferwatch
from inferwatch.wire import EV_RECORD, EV_REQUEST, Decoder
from tests.helpers.imports import load_file
from tests.helpers.net import free_port
from tests.helpers.paths import BENCH


def load_bench(name: str) -> ModuleType:
    return load_file(BENCH / f"{name}.py", f"bench_{name}")


@pytest.fixture
def datagram_sink(sock_path: str) -> Iterator[tuple[str, socket.socket]]:
    """A real Unix datagram socket for the SDK to send to, read by the test."""
    path = sock_path
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    yield path, s
    s.close()


def records_until(sock: socket.socket, want: int, kinds: set[int], timeout: float) -> list[tuple[Any, ...]]:
    """Decoded records of the given kinds, read until ``want`` of them arrived or ``timeout`` passed."""
    dec = Decoder()
    got: list[tuple[Any, ...]] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            frame = dec.decode(sock.recv(70000))
        except TimeoutError:
            break
        got.extend(r for r in frame.records if r[0] in kinds)
    return got


def get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def samples(port: int, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """The server's /metrics samples named ``name``, by label set."""
    status, _, body = get(port, "/metrics")
    assert status == 200
    return {
        frozenset(s.labels.items()): s.value
        for fam in text_string_to_metric_families(body.decode())
        for s in fam.samples
        if s.name == name
    }


@pytest.mark.slow
def test_every_fastapi_variant_answers_and_records_what_its_row_says(
    datagram_sink: tuple[str, socket.socket],
) -> None:
    fo = load_bench("fastapi_overhead")
    sink_path, sink = datagram_sink
    port = free_port()
    env = {**os.environ, "INFERWATCH_SIDECAR": f"unix://{sink_path}", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    srv = subprocess.Popen([sys.executable, str(BENCH / "fastapi_overhead.py"), "--serve", "--port", str(port)],
                           env=env, stderr=subprocess.PIPE, text=True)
    try:
        fo.wait_port(port, 60)
    except SystemExit:
        srv.kill()
        pytest.fail(f"the bench server did not start:\n{srv.communicate(timeout=15)[1][-2000:]}")
    try:
        rids = {}
        for name, variant in fo.VARIANTS.items():
            status, headers, body = get(port, variant.path)
            assert (status, body) == (200, b'{"ok":true}'), name
            assert ("x-request-id" in headers) == (name in ("inferwatch", "floor")), name
            rids[name] = headers.get("x-request-id")

        # inferwatch: one request event with its ingress and inference stages, under the echoed ID.
        (req,) = records_until(sink, 1, {EV_REQUEST}, 10)
        assert req[6] == rids["inferwatch"]
        assert [s[0] for s in req[8]] == ["ingress", "inference"]
        # The Prometheus peers: one request each, on their own app only.
        assert samples(port, "http_requests_total") == {
            frozenset({("handler", "/pfinx"), ("method", "GET"), ("status", "2xx")}): 1.0
        }
        assert samples(port, "starlette_requests_total") == {
            frozenset({("app_name", "starlette"), ("method", "GET"), ("path", "/stexp"), ("status_code", "200")}): 1.0
        }
        # OpenTelemetry: the SDK variant exports a server span and two send spans; the API-only one nothing.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(spans := samples(port, "bench_otel_exported_spans_total")) < 2:
            time.sleep(0.05)
        assert spans == {frozenset({("kind", "SERVER")}): 1.0, frozenset({("kind", "INTERNAL")}): 2.0}
    finally:
        srv.terminate()
        err = srv.communicate(timeout=15)[1]
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it.
    assert (srv.returncode, "Traceback" in err) == (-signal.SIGTERM, False), err[-2000:]


def test_prometheus_client_equivalent_records_what_the_sdk_variant_records(
    datagram_sink: tuple[str, socket.socket],
) -> None:
    so = load_bench("sdk_overhead")
    fn, reg = so.make_prom_equivalent()
    for _ in range(3):
        assert fn() == so.bare()
    for stage in so.STAGES:
        assert reg.get_sample_value("stage_seconds_count", {"stage": stage}) == 3
    for name, value in so.FEATURES.items():
        assert reg.get_sample_value("feature_value_count", {"feature": name}) == 3
        assert reg.get_sample_value("feature_value_sum", {"feature": name}) == 3 * value
    assert reg.get_sample_value("predictions_total", {"prediction": "cat"}) == 3
    assert reg.get_sample_value("confidence_count") == 3

    # The SDK variant (b) records the same: five stages, the prediction, the confidence and twenty features.
    sink_path, sink = datagram_sink
    inferwatch.configure(service="bench", model="m", model_version="v1", sidecar=sink_path)
    try:
        assert so.sdk() == so.bare()
        assert inferwatch.flush(timeout=5)
    finally:
        inferwatch.shutdown(timeout=5)
    req, rec = sorted(records_until(sink, 2, {EV_REQUEST, EV_RECORD}, 10), key=lambda r: r[0] != EV_REQUEST)
    assert [s[0] for s in req[8]] == list(so.STAGES)
    schema, numeric, _ = rec[7]
    assert (rec[4], rec[5], dict(zip(schema.numeric, numeric, strict=True))) == ("cat", 0.93, so.FEATURES)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["a", "b", "c", "d", "f"])
def test_sdk_bench_count_child_runs_each_counted_variant(variant: str, sock_path: str) -> None:
    so = load_bench("sdk_overhead")
    path = sock_path
    rx = subprocess.Popen([sys.executable, "-c", so.RECEIVER, path], stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
        proc = subprocess.run(
            [sys.executable, str(BENCH / "sdk_overhead.py"), "--count", variant, "--calls", "400", "--sidecar", path],
            capture_output=True, text=True, timeout=120,
        )
    finally:
        rx.kill()
        rx.wait()
        assert rx.stdout is not None
        rx.stdout.close()
    # (b) exits non-zero when the SDK dropped any event, so a clean exit means every event was sent.
    assert proc.returncode == 0, proc.stderr[-2000:]

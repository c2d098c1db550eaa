"""Streams that end early, counted truthfully: real uvicorn, real clients that abort, real datagrams.

The issue's case: 3 streams of 50 tokens whose client reads a few and disconnects must not raise
``outcome="ok"``; they are ``cancelled``, and their lengths are not generation lengths.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from prometheus_client import CollectorRegistry, generate_latest

import inferwatch
from inferwatch.wire import EV_REQUEST, EV_STAGE, OUTCOME_CANCELLED
from inferwatch_sidecar.aggregate import aggregator
from inferwatch_sidecar.aggregate.aggregator import Aggregator
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.ingest.http_json import BadEvent, JsonDecoder
from inferwatch_sidecar.ingest.pipeline import Pipeline
from inferwatch_sidecar.metrics.families import CatalogCollector
from tests.helpers.net import free_port
from tests.helpers.sidecar import parse_metrics, sample

CTX = ("svc", "m", "v1")
LAB = {"service": "svc", "model": "m", "model_version": "v1"}
TOKENS = 50
#: Seconds between tokens on the server: the bounds below allow up to 3 more tokens per stream after the
#: client left, so a client or server thread stalled up to about 90 ms on a loaded machine still fits.
TOKEN_GAP = 0.03
MS = 1_000_000


def scrape(agg: Aggregator) -> dict[Any, float]:
    reg = CollectorRegistry()
    reg.register(CatalogCollector(agg.collect, aggregator.METRICS))
    return parse_metrics(generate_latest(reg).decode())


# -- aggregation ----------------------------------------------------------------------------------

def test_cancelled_streams_are_not_generation_lengths_and_count_their_waste() -> None:
    agg = Aggregator(ComponentContext())
    stages_ok = [("generate", 2_000 * MS, (100 * MS, 50, (20_000,) * 49))]
    stages_cut = [("generate", 300 * MS, (100 * MS, 12, (20_000,) * 11, 4))]
    stages_none = [("generate", 50 * MS, (50 * MS, 0, (), 0))]  # cancelled before its first token
    agg.process([
        (EV_REQUEST, CTX, 1, 2_100 * MS, 0, None, None, None, stages_ok),
        (EV_REQUEST, CTX, 1, 400 * MS, OUTCOME_CANCELLED, None, None, None, stages_cut),
        (EV_STAGE, CTX, 1, "r3", stages_none[0]),
    ], [0] * 16)
    s = scrape(agg)
    g = {**LAB, "stage": "generate"}
    assert sample(s, "inferwatch_requests_total", **LAB, outcome="ok") == 1
    assert sample(s, "inferwatch_requests_total", **LAB, outcome="cancelled") == 1
    assert sample(s, "inferwatch_generation_length_tokens_count", **g) == 1  # the completed stream only
    assert sample(s, "inferwatch_generation_length_tokens_sum", **g) == 50
    assert sample(s, "inferwatch_cancelled_streams_total", **g) == 2
    assert sample(s, "inferwatch_undelivered_tokens_total", **g) == 4
    assert sample(s, "inferwatch_generated_tokens_total", **g) == 62
    # Time to first token: the two streams that had one; inter-token gaps: all 60 of them.
    assert sample(s, "inferwatch_time_to_first_token_seconds_count", **g) == 2
    assert sample(s, "inferwatch_inter_token_latency_seconds_count", **g) == 60


def test_json_request_stage_carries_ttft_gaps_and_cancellation() -> None:
    dec = JsonDecoder(clock_ns=lambda: 1_700_000_000 * 10**9)
    body = {"service": "svc", "model": "m", "model_version": "v1", "events": [
        {"type": "request", "duration_s": 1.84, "outcome": "ok",
         "stages": {"queue": 0.012, "decode": {"duration_s": 1.6, "ttft_s": 0.22, "items": 4,
                                                "gaps_s": [0.024, 0.025, 0.023]}}},
        {"type": "request", "duration_s": 0.5, "outcome": "cancelled",
         "stages": [{"stage": "decode", "duration_s": 0.45, "ttft_s": 0.2, "items": 9, "gaps_s": [0.03] * 8,
                     "cancelled": True, "undelivered": 2}]},
        {"type": "stage", "stage": "decode", "duration_s": 1, "items": 3, "undelivered": 1},
        {"type": "stage", "stage": "decode", "duration_s": 1, "items": 3, "cancelled": True, "undelivered": 4},
        {"type": "stage", "stage": "decode", "duration_s": 1, "items": 3, "cancelled": "yes"},
    ]}
    events, errors, extra = dec.events(body)
    assert (errors, extra, len(events)) == ({"bad_value": 3}, 0, 2)
    assert events[0][8] == [("queue", 12_000_000, None),
                            ("decode", 1_600_000_000, (220_000_000, 4, (24_000, 25_000, 23_000)))]
    assert events[1][8] == [("decode", 450_000_000, (200_000_000, 9, (30_000,) * 8, 2))]
    agg = Aggregator(ComponentContext())
    agg.process(events, [0] * 16)
    s = scrape(agg)
    d = {**LAB, "stage": "decode"}
    # Each stage counted once: the docs' example no longer adds a separate stage event for it.
    assert sample(s, "inferwatch_stage_duration_seconds_count", **d) == 2
    assert sample(s, "inferwatch_time_to_first_token_seconds_count", **d) == 2
    assert sample(s, "inferwatch_inter_token_latency_seconds_count", **d) == 11
    assert sample(s, "inferwatch_generation_length_tokens_count", **d) == 1
    assert (sample(s, "inferwatch_cancelled_streams_total", **d), sample(s, "inferwatch_undelivered_tokens_total", **d)) \
        == (1, 2)
    with pytest.raises(BadEvent):
        dec.events({"events": "nope"})


# -- a real server and clients that leave -------------------------------------------------------

@inferwatch.stage("generate")
async def _tokens() -> AsyncIterator[bytes]:
    for i in range(TOKENS):
        await asyncio.sleep(TOKEN_GAP)
        yield b"tok%d\n" % i


def _fastapi_app() -> Any:
    app = FastAPI()

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        return StreamingResponse(_tokens(), media_type="text/plain")

    return app


@inferwatch.stage("engine")
async def _engine() -> AsyncIterator[bytes]:
    for i in range(TOKENS):
        await asyncio.sleep(TOKEN_GAP)
        yield b"tok%d\n" % i


async def _raw_app(scope: Any, receive: Any, send: Any) -> None:
    """A raw ASGI streamer that never calls ``receive``: it cannot know the client left."""
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    async for chunk in _engine():
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


class Server:
    """uvicorn on loopback with the middleware outermost, and the SDK sending to a datagram socket
    whose frames go through the sidecar's real pipeline into an aggregator."""

    def __init__(self, asgi: Any) -> None:
        self.dir = tempfile.mkdtemp(prefix="iw", dir="/tmp")
        self.path = os.path.join(self.dir, "ingest.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.02)
        self.agg = Aggregator(ComponentContext())
        self.pipeline = Pipeline(self.agg)
        inferwatch.shutdown(timeout=1.0)
        assert inferwatch.configure(service="svc", model="m", model_version="v1", sidecar=f"unix://{self.path}",
                                    flush_interval_ms=5)
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(inferwatch.InferwatchMiddleware(asgi), host="127.0.0.1",
                                                    port=self.port, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)

    def pump(self, requests: int, timeout: float = 10.0) -> dict[Any, float]:
        """Feed datagrams to the pipeline until ``requests`` REQUEST events arrived; return the scrape."""
        deadline = time.monotonic() + timeout
        counts = self.pipeline.counts["unix"]
        while counts[EV_REQUEST] < requests:
            assert time.monotonic() < deadline, f"{counts[EV_REQUEST]} of {requests} requests arrived"
            try:
                self.pipeline.datagram(self.sock.recv(70000), "unix")
            except TimeoutError:
                pass
        time.sleep(0.2)  # a stage finalised after its request (a dropped generator) comes next
        try:
            while True:
                self.pipeline.datagram(self.sock.recv(70000), "unix")
        except TimeoutError:
            pass
        return scrape(self.agg)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        inferwatch.shutdown(timeout=1.0)
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _read_then_abort(port: int, path: str, keep: int) -> bytes:
    """GET ``path``, read until ``keep`` tokens arrived, then reset the connection (a client that leaves)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    buf = b""
    want = b"tok%d\n" % (keep - 1)
    while want not in buf:
        chunk = s.recv(4096)
        assert chunk, "server closed first"
        buf += chunk
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
    s.close()
    return buf


def _read_all(port: int, path: str) -> bytes:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    buf = b""
    while chunk := s.recv(4096):
        buf += chunk
    s.close()
    return buf


@pytest.fixture
def fastapi_server() -> Iterator[Server]:
    srv = Server(_fastapi_app())
    yield srv
    srv.close()


@pytest.fixture
def raw_server() -> Iterator[Server]:
    srv = Server(_raw_app)
    yield srv
    srv.close()


def test_three_aborted_fastapi_streams_are_cancelled_not_ok(fastapi_server: Server) -> None:
    for _ in range(3):
        _read_then_abort(fastapi_server.port, "/stream", keep=5)
    s = fastapi_server.pump(requests=3)
    g = {**LAB, "stage": "generate"}
    assert sample(s, "inferwatch_requests_total", **LAB, outcome="ok") == 0
    assert sample(s, "inferwatch_requests_total", **LAB, outcome="cancelled") == 3
    assert sample(s, "inferwatch_generation_length_tokens_count", **g) == 0
    assert sample(s, "inferwatch_cancelled_streams_total", **g) == 3
    # Starlette stops the generator at the disconnect: 5 tokens read each, a couple more in flight at most.
    generated = sample(s, "inferwatch_generated_tokens_total", **g)
    assert 15 <= generated <= 3 * 8
    assert sample(s, "inferwatch_undelivered_tokens_total", **g) <= 3 * 2
    # A stream read to its end is still a completed generation of 50 tokens, outcome ok.
    assert _read_all(fastapi_server.port, "/stream").count(b"tok") == TOKENS
    s = fastapi_server.pump(requests=4)
    assert sample(s, "inferwatch_requests_total", **LAB, outcome="ok") == 1
    assert sample(s, "inferwatch_generation_length_tokens_count", **g) == 1
    assert sample(s, "inferwatch_generation_length_tokens_sum", **g) == TOKENS
    assert sample(s, "inferwatch_cancelled_streams_total", **g) == 3


def test_a_streamer_that_never_listens_is_seen_to_waste_what_it_generates(raw_server: Server) -> None:
    for _ in range(3):
        _read_then_abort(raw_server.port, "/raw", keep=5)
    s = raw_server.pump(requests=3)
    e = {**LAB, "stage": "engine"}
    assert sample(s, "inferwatch_requests_total", **LAB, outcome="ok") == 0
    assert sample(s, "inferwatch_requests_total", **LAB, outcome="cancelled") == 3
    # The app ran every stream to its end: 150 tokens generated, of which at least 5 per stream reached the
    # client and all but a few in flight at the disconnect were produced after it.
    assert sample(s, "inferwatch_generated_tokens_total", **e) == 3 * TOKENS
    assert sample(s, "inferwatch_cancelled_streams_total", **e) == 3
    assert sample(s, "inferwatch_generation_length_tokens_count", **e) == 0
    undelivered = sample(s, "inferwatch_undelivered_tokens_total", **e)
    assert 3 * (TOKENS - 5 - 3) <= undelivered <= 3 * (TOKENS - 5), undelivered
    assert math.isclose(sample(s, "inferwatch_requests_total", **LAB, outcome="cancelled"), 3)

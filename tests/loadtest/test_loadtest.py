"""``inferwatch loadtest`` against servers of known capacity, in process, bounded to a few seconds each.

The slot server (``inferwatch_sidecar.loadtest.slotserver``) runs on its own event loop in a thread: its knee
is exactly its slot count. The demo's FastAPI server runs under uvicorn in a child process with a real
sidecar, for the ``--sidecar`` join.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from inferwatch_sidecar.cli import main
from inferwatch_sidecar.loadtest import slotserver
from inferwatch_sidecar.loadtest.runner import parse_sse
from tests.helpers.net import free_port


@contextmanager
def slot_server(**kw: Any) -> Iterator[tuple[int, slotserver.Slots]]:
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        box["server"], box["state"], box["port"] = loop.run_until_complete(slotserver.start(**kw))
        started.set()
        loop.run_forever()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    assert started.wait(10)
    try:
        yield box["port"], box["state"]
    finally:
        async def stop() -> None:
            box["server"].close()
            box["state"].close_all()
            await asyncio.sleep(0.05)
            loop.stop()

        asyncio.run_coroutine_threadsafe(stop(), loop)
        th.join(10)
        loop.close()


def loadtest(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any] | None, str]:
    rc = main(["loadtest", *args, "--no-progress"])
    out, err = capsys.readouterr()
    doc = json.loads(out) if "--json" in args and rc in (0, 1) and out.strip() else None
    return rc, doc, err


JSON_KEYS = {"concurrency", "throughput_rps", "latency_p50_s", "latency_p99_s", "ttft_p99_s", "errors",
             "goodput_ratio"}


@pytest.mark.parametrize(("slots", "service"), [(3, 0.02), (6, 0.01)])
def test_sweep_finds_the_slot_count(capsys: pytest.CaptureFixture[str], slots: int, service: float) -> None:
    with slot_server(slots=slots, service=service, cv=0.3, seed=slots) as (port, state):
        rc, doc, err = loadtest(capsys, f"http://127.0.0.1:{port}/predict", "--body", '{"x": 1}',
                                "--concurrency", "1,2,4,8,16,32", "--duration", "0.4", "--json")
    assert rc == 0, err
    assert doc is not None and set(doc) == {"steps", "knee"}
    assert all(set(s) == JSON_KEYS for s in doc["steps"])
    assert sum(s["errors"] for s in doc["steps"]) == 0
    assert set(doc["knee"]) == {"concurrency", "throughput_rps"}
    assert abs(doc["knee"]["concurrency"] - slots) / slots < 0.25, doc
    # the answers counted in the steps' 0.4 s windows, plus the preflight one, are at most what the server sent
    assert state.served >= round(sum(s["throughput_rps"] * 0.4 for s in doc["steps"])) + 1
    lat = [s["latency_p50_s"] for s in doc["steps"]]
    assert lat[-1] > 2 * lat[0]  # latency climbed past the knee
    assert "knee: concurrency" in err and "conc" in err  # the table goes to stderr with --json


def test_streaming_ttft_and_itl_are_the_servers(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with slot_server(slots=4, service=0.05, tokens=5, itl=0.02) as (port, _):
        rc, doc, err = loadtest(capsys, f"http://127.0.0.1:{port}", "--api", "completions", "--stream",
                                "--concurrency", "1,2", "--duration", "0.5", "--json", "--slo", "ttft=0.5",
                                "--plot", str(tmp_path / "k.html"))
    assert rc == 0, err
    assert doc is not None
    for s in doc["steps"]:
        assert 0.05 <= s["ttft_p99_s"] < 0.2
        assert s["latency_p50_s"] >= 0.05 + 4 * 0.02
        assert s["goodput_ratio"] == 1.0
    assert "itl p50" in err
    assert "<svg" in (tmp_path / "k.html").read_text()


def test_rate_mode_sends_the_rate(capsys: pytest.CaptureFixture[str]) -> None:
    with slot_server(slots=100, service=0.005) as (port, state):
        rc, doc, err = loadtest(capsys, f"http://127.0.0.1:{port}", "--body", "{}", "--rate", "200",
                                "--burstiness", "0.5", "--duration", "1.5", "--json")
    assert rc == 0, err
    assert doc is not None
    (s,) = doc["steps"]
    assert 120 < s["throughput_rps"] < 280  # gamma arrivals with shape 0.5 over 1.5 s
    assert s["concurrency"] > 0


class _Busy(BaseHTTPRequestHandler):
    """Answers 503 when more than 4 requests are in flight, and text/html on /html."""

    protocol_version = "HTTP/1.1"
    inflight = 0
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802
        n = int(self.headers.get("Content-Length", 0))
        self.rfile.read(n)
        if self.path == "/html":
            body, code, ctype = b"<html>hello</html>", 200, "text/html"
        else:
            with _Busy.lock:
                _Busy.inflight += 1
                over = _Busy.inflight > 4
            import time

            time.sleep(0.01)
            with _Busy.lock:
                _Busy.inflight -= 1
            body, code, ctype = (b'{"error": "overloaded"}', 503, "application/json") if over else (b"{}", 200,
                                                                                                        "application/json")
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: Any) -> None:
        pass


@contextmanager
def busy_server() -> Iterator[int]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Busy)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def test_until_failure_recommends_thirty_percent_below(capsys: pytest.CaptureFixture[str]) -> None:
    with busy_server() as port:
        rc, doc, err = loadtest(capsys, f"http://127.0.0.1:{port}/", "--body", "{}", "--until-failure",
                                "--duration", "0.4", "--max-concurrency", "64", "--json")
    assert rc == 0, err
    assert doc is not None
    last = doc["steps"][-1]
    assert last["errors"] > 0 and last["concurrency"] >= 8
    assert all(s["errors"] == 0 for s in doc["steps"] if s["concurrency"] <= 2)
    assert f"recommended limit: {int(0.7 * last['concurrency'])} in flight" in err


def test_clear_errors(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    rc, _, err = loadtest(capsys, f"http://127.0.0.1:{port}/", "--body", "{}", "--duration", "0.2")
    assert rc == 2 and f"cannot reach http://127.0.0.1:{port}" in err
    with busy_server() as port:
        rc, _, err = loadtest(capsys, f"http://127.0.0.1:{port}/html", "--body", "{}", "--duration", "0.2")
    assert rc == 2 and "not JSON" in err and "<html>" in err
    rc, _, err = loadtest(capsys, "https://127.0.0.1:1/", "--duration", "0.2")
    assert rc == 2 and "https is not supported" in err
    rc, _, err = loadtest(capsys, "http://127.0.0.1:1/", "--body", "{oops", "--duration", "0.2")
    assert rc == 2 and "--body: not JSON" in err
    rc, _, err = loadtest(capsys, "http://127.0.0.1:1/", "--rate", "5", "--until-failure")
    assert rc == 2 and "choose one of" in err
    rc, _, err = loadtest(capsys, "http://127.0.0.1:1/", "--plot", "x.svg")
    assert rc == 2 and ".png or .html" in err


def test_sse_parse_counts_content_events_split_across_chunks() -> None:
    ev = b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'
    chunks = [(1.0, ev[:10]), (2.0, ev[10:] + ev), (3.0, b'data: {"choices": [], "usage": {"completion_tokens": 7}}'
                                                         b"\n\ndata: [DONE]\n\n")]
    times, usage = parse_sse(chunks)
    assert times == [2.0, 2.0] and usage == 7

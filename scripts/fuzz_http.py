"""Fuzz the sidecar's HTTP framing with raw request bytes over real sockets.

Seeded inputs (valid requests, requests mutated byte by byte and header by
header, request-smuggling shapes, truncations, pipelines and random bytes) go
to a real ``inferwatch sidecar`` subprocess on loopback, many connections at
a time, while another thread scrapes ``/metrics``. Every connection must get
an answer (a status line) or be closed by the server within the server's
header and body deadlines plus a margin; the sidecar must stay up; every
scrape must answer 200.

Usage:
    .venv/bin/python scripts/fuzz_http.py --count 100000 [--seed 1] [--concurrency 64]

Prints the inputs tried, crashes (the sidecar exited, or a scrape failed),
unanswered connections, the p99 of ``/metrics`` during the attack, the
sidecar's RSS before and after and what it refused by reason; exits 1 unless
crashes and unanswered are both 0. The test suite runs a bounded count
against an in-process daemon (``tests/http/test_http_hardening.py``).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import random
import selectors
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the checkout's tests.helpers holds the one sidecar starter
    sys.path.append(str(REPO))

from tests.helpers.sidecar import SidecarProc  # noqa: E402

#: Server deadlines the attack runs under (short, so that unfinished requests resolve quickly).
HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
#: How long past both deadlines a connection may wait for its answer or close.
MARGIN_S = 3.0

_EVENTS = json.dumps({"events": [{"type": "batch", "size": 2}, {"type": "queue", "depth": 1}]}).encode()
_LABELS = json.dumps({"labels": [{"request_id": "r1", "label": 1}]}).encode()


def _post(path: str, body: bytes, extra: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + extra + "\r\n").encode() + body


def _chunked(path: str, body: bytes) -> bytes:
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 7]), body[i:i + 7]) for i in range(0, len(body), 7))
    return f"POST {path} HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n".encode() + chunks + b"0\r\n\r\n"


#: Valid requests; the mutations start from these.
SEEDS: list[bytes] = [
    b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n",
    b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\r\n",
    b"HEAD /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n",
    b"GET /readyz HTTP/1.0\r\n\r\n",
    b"GET /v1/status HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    b"GET /admin/ HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer wrong\r\n\r\n",
    _post("/v1/events", _EVENTS),
    _post("/v1/labels", _LABELS),
    _chunked("/v1/events", _EVENTS),
    _post("/v1/events", _EVENTS) + b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n",
    _post("/nope", b"GET /smuggled HTTP/1.1\r\nHost: localhost\r\n\r\n"),
]
#: Header lines that probe framing and smuggling.
NASTY_HEADERS: list[bytes] = [
    b"Content-Length: 5\r\nTransfer-Encoding: chunked", b"Transfer-Encoding: chunked\r\nContent-Length: 5",
    b"Content-Length: +5", b"Content-Length: -1", b"Content-Length: 5, 6", b"Content-Length: 5\r\nContent-Length: 6",
    b"Content-Length: 99999999999999999999", b"Content-Length: 0x10", b"Transfer-Encoding: xchunked",
    b"Transfer-Encoding: chunked, identity", b"Transfer-Encoding : chunked", b"Transfer-Encoding:\tchunked",
    b"X-Fold: a\r\n b", b"Expect: 100-continue", b"Connection: upgrade\r\nUpgrade: websocket", b"Host: a\r\nHost: b",
    b"X-Big: " + b"A" * 20000, b"X-Nul: a\x00b", b"X-Bad\x7f: 1", b": empty-name", b"X-Latin: \xe9\xff",
]
_JUNK = [b"\r\n", b"\n", b"\r", b"\x00", b" ", b":", b"\t", b"\xff", b"0\r\n\r\n", b"HTTP/1.1", b"%00", b"?", b"#"]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        pos = rng.randrange(len(b) + 1)
        if op == 0 and b:  # flip a byte
            b[min(pos, len(b) - 1)] = rng.randrange(256)
        elif op == 1:  # insert a delimiter
            b[pos:pos] = rng.choice(_JUNK)
        elif op == 2 and b:  # delete a run
            del b[pos:pos + rng.randint(1, 8)]
        elif op == 3:  # truncate
            del b[pos:]
        elif op == 4:  # insert a nasty header after the request line
            line_end = b.find(b"\r\n")
            if line_end >= 0:
                b[line_end + 2:line_end + 2] = rng.choice(NASTY_HEADERS) + b"\r\n"
        elif op == 5:  # duplicate a run (repeated headers, pipelines)
            end = min(len(b), pos + rng.randint(1, 64))
            b[pos:pos] = b[pos:end]
        else:  # change the case of a run
            b[pos:pos + 8] = bytes(b[pos:pos + 8]).swapcase()
    return bytes(b)


def inputs(seed: int, count: int) -> Iterator[bytes]:
    """``count`` seeded inputs: mutated seeds mostly, then nasty headers on valid requests, then random bytes."""
    rng = random.Random(seed)
    for _ in range(count):
        r = rng.random()
        base = rng.choice(SEEDS)
        if r < 0.6:
            yield _mutate(rng, base)
        elif r < 0.8:
            line_end = base.find(b"\r\n") + 2
            yield base[:line_end] + rng.choice(NASTY_HEADERS) + b"\r\n" + base[line_end:]
        elif r < 0.9:
            yield base[: rng.randrange(len(base))]
        else:
            yield rng.randbytes(rng.randint(0, 300))


@dataclass
class Outcome:
    """What the attack saw."""

    tried: int = 0
    answered: int = 0
    closed: int = 0
    unanswered: list[bytes] = field(default_factory=list)


class _Conn:
    __slots__ = ("data", "deadline", "got", "sent", "sock")

    def __init__(self, sock: socket.socket, data: bytes, deadline: float) -> None:
        self.sock, self.data, self.deadline = sock, data, deadline
        self.sent = 0
        self.got = b""


def attack(port: int, items: Iterator[bytes], concurrency: int = 64,
           wait_s: float = HEADER_TIMEOUT_S + BODY_TIMEOUT_S + MARGIN_S) -> Outcome:
    """Send each input on its own connection, ``concurrency`` at a time, and classify what comes back.

    A connection is done when the server sends a status line (answered) or
    closes or resets it (closed); one still open after ``wait_s`` is unanswered.
    """
    out = Outcome()
    sel = selectors.DefaultSelector()
    live: dict[int, _Conn] = {}
    pending = iter(items)
    exhausted = False

    def finish(c: _Conn, answered: bool | None) -> None:
        sel.unregister(c.sock)
        del live[c.sock.fileno()]
        c.sock.close()
        if answered is None:
            out.unanswered.append(c.data)
        elif answered:
            out.answered += 1
        else:
            out.closed += 1

    while True:
        while not exhausted and len(live) < concurrency:
            data = next(pending, None)
            if data is None:
                exhausted = True
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            err = s.connect_ex(("127.0.0.1", port))
            if err not in (0, errno.EINPROGRESS):
                s.close()
                out.tried += 1
                out.closed += 1  # refused at connect: the server closed it
                continue
            c = _Conn(s, data, time.monotonic() + wait_s)
            live[s.fileno()] = c
            sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, c)
            out.tried += 1
        if not live:
            return out
        for key, ev in sel.select(timeout=0.05):
            c = key.data
            if ev & selectors.EVENT_WRITE:
                try:
                    c.sent += c.sock.send(c.data[c.sent:])
                except BlockingIOError:
                    pass
                except OSError:
                    finish(c, b"HTTP/1." in c.got[:8])
                    continue
                if c.sent >= len(c.data):
                    sel.modify(c.sock, selectors.EVENT_READ, c)
            if ev & selectors.EVENT_READ:
                try:
                    chunk = c.sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    finish(c, c.got.startswith(b"HTTP/1."))
                    continue
                c.got += chunk
                if c.got.startswith(b"HTTP/1.") and b"\r\n" in c.got:
                    finish(c, True)
                elif not chunk:
                    finish(c, False)
        now = time.monotonic()
        for c in [c for c in live.values() if now > c.deadline]:
            finish(c, None)


class Scraper(threading.Thread):
    """Scrapes ``/metrics`` every ``interval_s`` until stopped; keeps each latency and each failure."""

    def __init__(self, port: int, interval_s: float = 0.05) -> None:
        super().__init__(name="fuzz-scraper", daemon=True)
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.interval_s = interval_s
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    r.read()
                    if r.status != 200:
                        self.failures.append(f"status {r.status}")
            except (urllib.error.URLError, OSError) as e:
                self.failures.append(repr(e))
            self.latencies.append(time.perf_counter() - t0)

    def p99_s(self) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(0.99 * len(xs)))] if xs else float("nan")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def run_sidecar(tmp: str) -> SidecarProc:
    """Start ``inferwatch sidecar`` on loopback with short deadlines and wait until it is ready."""
    return SidecarProc(Path(tmp), ["--set", f"http.header_timeout_s={HEADER_TIMEOUT_S}", "--set",
                                   f"http.body_timeout_s={BODY_TIMEOUT_S}"], sock=os.path.join(tmp, "s.sock"),
                       ready_timeout=20).start()


def refused(port: int) -> dict[str, float]:
    """``inferwatch_http_refused_total`` by reason, read from ``/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("inferwatch_http_refused_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('"')[1]] = float(value)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=100_000, help="inputs, one connection each")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=64, help="connections open at once")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        proc = run_sidecar(tmp)
        port = proc.port
        try:
            rss0 = _rss_kib(proc.pid)
            scraper = Scraper(port)
            scraper.start()
            t0 = time.monotonic()
            out = attack(port, inputs(args.seed, args.count), args.concurrency)
            elapsed = time.monotonic() - t0
            scraper.stopped.set()
            scraper.join()
            alive = proc.proc is not None and proc.proc.poll() is None
            rss1 = _rss_kib(proc.pid) if alive else -1
            by_reason = refused(port) if alive else {}
        finally:
            proc.stop(timeout=10)
    crashes = (0 if alive else 1) + len(scraper.failures)
    print(f"inputs tried:      {out.tried} in {elapsed:.0f} s ({out.tried / elapsed:.0f}/s, seed {args.seed})")
    print(f"answered:          {out.answered}")
    print(f"closed by server:  {out.closed}")
    print(f"unanswered:        {len(out.unanswered)}")
    print(f"crashes:           {crashes} (sidecar {'up' if alive else 'EXITED'}, "
          f"{len(scraper.failures)} failed scrapes of {len(scraper.latencies)})")
    print(f"/metrics p99:      {scraper.p99_s() * 1000:.1f} ms during the attack")
    print(f"sidecar RSS:       {rss0 / 1024:.1f} MiB before, {rss1 / 1024:.1f} MiB after")
    print(f"refused by reason: {json.dumps(by_reason, sort_keys=True)}")
    for data in out.unanswered[:5]:
        print(f"  unanswered input: {data[:200]!r}")
    return 0 if crashes == 0 and not out.unanswered else 1


if __name__ == "__main__":
    sys.exit(main())

"""A server of known capacity: ``slots`` requests served at once, each for ``service`` seconds (with noise).

Its knee is exactly ``slots`` and its capacity ``slots / mean service time``, which is what the load test's
and the live table's knee are checked against (tests/components/capacity, bench/capacity_knee.py). Requests beyond the
slots wait in FIFO order. ``service=0`` answers at once: the trivial server for the generator's own speed.
With ``tokens > 0`` it answers like an OpenAI streaming endpoint: the first token after the service time,
then one SSE event every ``itl`` seconds. Standard library only; HTTP/1.1 keep-alive, Content-Length bodies.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
from collections import deque
from typing import Any

_OK = b'{"ok":true,"usage":{"completion_tokens":1}}'
_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
_STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class Slots:
    """The shared state: free slots, the FIFO of waiting requests and the service-time draw."""

    def __init__(self, slots: int, service: float, cv: float, tokens: int, itl: float, seed: int) -> None:
        self.free = slots
        self.waiting: deque[Any] = deque()
        self.service = service
        self.cv = cv
        self.tokens = tokens
        self.itl = itl
        self.rng = random.Random(seed)
        self.served = 0
        self.conns: set[_Proto] = set()

    def close_all(self) -> None:
        """Close every open connection (before the loop stops)."""
        for p in list(self.conns):
            if p.t is not None:
                p.t.close()

    def draw(self) -> float:
        if self.service <= 0:
            return 0.0
        if self.cv <= 0:
            return self.service
        s2 = math.log1p(self.cv * self.cv)
        return self.rng.lognormvariate(math.log(self.service) - s2 / 2, math.sqrt(s2))


class _Proto(asyncio.Protocol):
    def __init__(self, state: Slots) -> None:
        self.s = state
        self.buf = bytearray()
        self.t: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.t = transport
        self.s.conns.add(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def _next(self) -> None:
        if self.busy:
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buf[:end]).lower()
        i = head.find(b"content-length:")
        n = int(head[i + 15:head.find(b"\r\n", i) if head.find(b"\r\n", i) > 0 else None]) if i >= 0 else 0
        if len(self.buf) < end + 4 + n:
            return
        del self.buf[:end + 4 + n]
        self.busy = True
        s = self.s
        if s.service <= 0 and s.tokens == 0:
            self._reply()
            return
        if s.free > 0:
            s.free -= 1
            self._serve()
        else:
            s.waiting.append(self)

    def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(self.s.draw(), self._first)

    def _first(self) -> None:
        s = self.s
        if s.tokens == 0:
            self._release()
            self._reply()
            return
        if self.t is not None:
            self.t.write(_STREAM_HEAD)
        self._token(0)

    def _token(self, i: int) -> None:
        s = self.s
        if self.t is None or self.t.is_closing():
            self._release()
            return
        if i < s.tokens:
            ev = b"data: " + json.dumps({"choices": [{"index": 0, "text": "tok"}]}).encode() + b"\n\n"
            self.t.write(b"%x\r\n%s\r\n" % (len(ev), ev))
            asyncio.get_running_loop().call_later(s.itl, self._token, i + 1)
            return
        last = (b"data: " + json.dumps({"choices": [], "usage": {"completion_tokens": s.tokens}}).encode()
                + b"\n\ndata: [DONE]\n\n")
        self.t.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(last), last))
        self._release()
        self.busy = False
        self.s.served += 1
        self._next()

    def _release(self) -> None:
        s = self.s
        if s.waiting:
            nxt = s.waiting.popleft()
            nxt._serve()
        else:
            s.free += 1

    def _reply(self) -> None:
        if self.t is not None and not self.t.is_closing():
            self.t.write(_HEAD % len(_OK) + _OK)
        self.busy = False
        self.s.served += 1
        self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        self.t = None
        self.s.conns.discard(self)


async def start(slots: int = 1, service: float = 0.0, cv: float = 0.0, tokens: int = 0, itl: float = 0.0,
                seed: int = 0, port: int = 0) -> tuple[asyncio.Server, Slots, int]:
    """Start serving on 127.0.0.1 (``port`` 0: a free one); returns the server, its state and its port."""
    state = Slots(slots, service, cv, tokens, itl, seed)
    server = await asyncio.get_running_loop().create_server(lambda: _Proto(state), "127.0.0.1", port, backlog=1024)
    return server, state, server.sockets[0].getsockname()[1]


def main(argv: list[str]) -> None:
    """``python -m inferwatch_sidecar.loadtest.slotserver SLOTS SERVICE_S [CV [PORT]]``: serve until killed."""
    slots, service = int(argv[0]), float(argv[1])
    cv = float(argv[2]) if len(argv) > 2 else 0.0
    port = int(argv[3]) if len(argv) > 3 else 0

    async def serve() -> None:
        server, _, p = await start(slots, service, cv, port=port)
        print(p, flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main(sys.argv[1:])

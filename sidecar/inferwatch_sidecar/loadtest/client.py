"""A lean HTTP/1.1 keep-alive client on asyncio transports, driven by callbacks.

One :class:`Connection` carries one request at a time (HTTP/1.1 without pipelining). ``send`` writes
prebuilt request bytes and calls ``on_done`` once the response is complete (or failed); the response is
parsed straight from ``data_received`` (Content-Length, chunked, or until close), with no task, stream
reader or header object per request. For a streamed answer it keeps each chunk's arrival time, which is
what time to first token and inter-token latency are measured from.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import cast

#: Longest response head accepted (bytes).
MAX_HEAD = 64 * 1024
#: Longest response body kept (bytes); a longer body is read and counted but not kept.
MAX_BODY = 8 * 1024 * 1024

clock = time.perf_counter


class Result:
    """What one request got back.

    Attributes:
        status: the HTTP status (0 when there was no answer).
        body: the body bytes (a streamed body's chunks joined).
        error: None, or the failure kind: "connect", "timeout", "closed", "protocol".
        chunks: for a streamed answer, (arrival time, chunk bytes) per chunk received.
    """

    __slots__ = ("status", "body", "error", "chunks", "detail")

    def __init__(self, status: int, body: bytes, error: str | None, chunks: list[tuple[float, bytes]] | None,
                 detail: str = "") -> None:
        self.status = status
        self.body = body
        self.error = error
        self.chunks = chunks
        self.detail = detail


Done = Callable[["Connection", Result], None]


class Connection(asyncio.Protocol):
    """One keep-alive connection; ``send`` one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.on_done: Done | None = None
        self.sent_at = 0.0
        self.closed = False
        self._stream = False
        self._reset()

    def _reset(self) -> None:
        self._head = True
        self._status = 0
        self._length = -1
        self._chunked = False
        self._to_close = False
        self._body = bytearray()
        self._chunks: list[tuple[float, bytes]] | None = None
        self._chunk_left = -1

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.on_done is not None:
            if not self._head and self._length < 0 and not self._chunked:
                self._finish(None)  # a body delimited by the close
            else:
                self._fail("closed", str(exc) if exc else "the server closed the connection")

    def data_received(self, data: bytes) -> None:
        if self.on_done is None:
            return
        self.buf += data
        try:
            self._parse()
        except ValueError as e:
            self._fail("protocol", str(e))
            self.abort()

    # the client side
    @property
    def busy(self) -> bool:
        return self.on_done is not None

    def send(self, raw: bytes, on_done: Done, stream: bool = False) -> None:
        """Write ``raw`` (a whole HTTP/1.1 request) and call ``on_done`` when its answer is complete."""
        self.on_done = on_done
        self._stream = stream
        self._reset()
        if stream:
            self._chunks = []
        self.sent_at = clock()
        if self.closed or self.transport is None:
            self._fail("closed", "the connection is closed")
            return
        self.transport.write(raw)

    def timeout(self) -> None:
        """Give up on the request in flight: the connection is closed."""
        if self.on_done is not None:
            self._fail("timeout", "no complete answer in time")
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, kind: str, detail: str) -> None:
        cb = self.on_done
        self.on_done = None
        if cb is not None:
            cb(self, Result(self._status, bytes(self._body), kind, self._chunks, detail))

    def _finish(self, leftover: bytes | None) -> None:
        cb = self.on_done
        self.on_done = None
        body = bytes(self._body)
        if self._to_close:
            self.abort()
        if cb is not None:
            cb(self, Result(self._status, body, None, self._chunks))

    def _parse(self) -> None:
        buf = self.buf
        if self._head:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    raise ValueError("response head too long")
                return
            head = bytes(buf[:end]).lower()
            del buf[:end + 4]
            line_end = head.find(b"\r\n")
            status_line = head if line_end < 0 else head[:line_end]
            parts = status_line.split(None, 2)
            if len(parts) < 2 or not parts[0].startswith(b"http/"):
                raise ValueError(f"not an HTTP response: {status_line[:80]!r}")
            self._status = int(parts[1])
            self._head = False
            i = head.find(b"\r\ncontent-length:")
            if i >= 0:
                j = head.find(b"\r\n", i + 17)
                self._length = int(head[i + 17: j if j >= 0 else None])
            elif b"\r\ntransfer-encoding:" in head and b"chunked" in head:
                self._chunked = True
            if b"\r\nconnection: close" in head:
                self._to_close = True
            if self._status in (204, 304) or 100 <= self._status < 200:
                self._length = 0
        if self._chunked:
            self._parse_chunks()
            return
        n = self._length
        if n >= 0:
            if len(buf) >= n:
                self._take(buf[:n])
                del buf[:n]
                self._finish(None)
            return
        # until close
        if buf:
            self._take(buf[:])
            del buf[:]

    def _take(self, data: bytes | bytearray) -> None:
        if self._chunks is not None and data:
            self._chunks.append((clock(), bytes(data)))
        if len(self._body) < MAX_BODY:
            self._body += data

    def _parse_chunks(self) -> None:
        buf = self.buf
        while True:
            if self._chunk_left < 0:
                j = buf.find(b"\r\n")
                if j < 0:
                    return
                size_s = bytes(buf[:j]).split(b";", 1)[0].strip()
                del buf[:j + 2]
                size = int(size_s, 16)
                if size == 0:
                    self._chunk_left = -2  # trailers until an empty line
                else:
                    self._chunk_left = size
            if self._chunk_left == -2:
                j = buf.find(b"\r\n")
                if j < 0:
                    return
                line = buf[:j]
                del buf[:j + 2]
                if not line:
                    self._finish(None)
                    return
                continue
            need = self._chunk_left
            if len(buf) < need + 2:
                return
            self._take(buf[:need])
            del buf[:need + 2]
            self._chunk_left = -1


async def connect(host: str, port: int) -> Connection:
    """A new connection to ``host:port`` (raises OSError when it cannot be opened)."""
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(Connection, host, port)
    return proto


def build_request(method: str, host: str, path: str, body: bytes | None, headers: dict[str, str] | None = None) -> bytes:
    """The bytes of one HTTP/1.1 request with a keep-alive connection."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + (body or b"")


async def fetch(host: str, port: int, raw: bytes, timeout: float, stream: bool = False) -> Result:
    """One request on a new connection, awaited (the preflight check and tests)."""
    loop = asyncio.get_running_loop()
    try:
        conn = await asyncio.wait_for(connect(host, port), timeout)
    except (OSError, asyncio.TimeoutError) as e:
        return Result(0, b"", "connect", None, str(e) or type(e).__name__)
    fut: asyncio.Future[Result] = loop.create_future()

    def done(_: Connection, r: Result) -> None:
        if not fut.done():
            fut.set_result(r)

    conn.send(raw, done, stream)
    try:
        return await asyncio.wait_for(fut, timeout)
    except asyncio.TimeoutError:
        conn.timeout()
        return Result(0, b"", "timeout", None, f"no answer in {timeout:g} s")
    finally:
        conn.abort()

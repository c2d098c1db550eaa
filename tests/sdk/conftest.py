"""Fixtures for the SDK tests: a real Unix datagram receiver and a configured SDK."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

import inferwatch
from inferwatch import _core
from inferwatch.wire import Decoder, Frame


class FakeClock:
    """A controlled monotonic clock in nanoseconds."""

    def __init__(self, start: int = 1_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns


class Receiver:
    """A real Unix datagram socket that decodes what it receives with the reference Decoder."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.decoder = Decoder()
        self.sock: socket.socket | None = None
        self.frames: list[Frame] = []

    def start(self) -> None:
        if os.path.exists(self.path):
            os.unlink(self.path)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(self.path)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock = s

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if os.path.exists(self.path):
            os.unlink(self.path)

    def poll(self, timeout: float = 0.05) -> list[Frame]:
        """Receive and decode every datagram that arrives within ``timeout`` of the last one."""
        assert self.sock is not None
        got: list[Frame] = []
        self.sock.settimeout(timeout)
        while True:
            try:
                data = self.sock.recv(70000)
            except TimeoutError:
                break
            f = self.decoder.decode(data)
            got.append(f)
        self.frames.extend(got)
        return got

    def records(self, timeout: float = 0.05) -> list[tuple[Any, ...]]:
        return [r for f in self.poll(timeout) for r in f.records]


@pytest.fixture
def receiver(sock_path: str) -> Iterator[Receiver]:
    r = Receiver(sock_path)
    r.start()
    yield r
    r.stop()


@pytest.fixture(autouse=True)
def _sdk_off() -> Iterator[None]:
    """Every test starts and ends with the SDK unconfigured."""
    inferwatch.shutdown(timeout=1.0)
    yield
    inferwatch.shutdown(timeout=1.0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sdk(receiver: Receiver, clock: FakeClock) -> Iterator[Receiver]:
    """The SDK configured against ``receiver`` with a fake clock; the sender only sends on flush()."""
    assert inferwatch.configure(
        service="svc",
        model="m",
        model_version="v1",
        sidecar=f"unix://{receiver.path}",
        flush_interval_ms=10_000,
        clock=clock,
    )
    yield receiver
    inferwatch.shutdown(timeout=1.0)


def buffered() -> list[tuple[Any, ...]]:
    """Take the events buffered by the hot path (before the sender encodes them)."""
    rt = _core._rt
    assert rt is not None
    out = list(rt.buf)
    rt.buf.clear()
    return out


def wait_for(pred: Any, timeout: float = 5.0, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return bool(pred())

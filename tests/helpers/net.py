"""Loopback ports for tests: one that was free a moment ago, or one held bound for the test's length."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["free_port", "held_port"]


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port on 127.0.0.1 that was free a moment ago (TCP, or UDP with ``socket.SOCK_DGRAM``).

    Nothing listens on it once this returns, so it also serves as a port that refuses connections.
    """
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def held_port(kind: int = socket.SOCK_STREAM, *, listen: bool = False) -> Iterator[tuple[socket.socket, int]]:
    """A socket bound to a free port on 127.0.0.1, and the port, until the block ends.

    Args:
        kind: ``socket.SOCK_STREAM`` (TCP) or ``socket.SOCK_DGRAM`` (UDP).
        listen: listen on it (TCP): the port is taken, as by another server.
    """
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        if listen:
            s.listen()
        yield s, int(s.getsockname()[1])

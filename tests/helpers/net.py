"""Loopback ports for tests: one that was free a moment ago, or one held bound for the test's length.

:func:`free_port` is the checkout's one free-port finder (``inferwatch_sidecar.demo.supervise``, which the demo
needs at run time); it is imported here so that tests take it by the name they always have.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

from inferwatch_sidecar.demo.supervise import free_port

__all__ = ["free_port", "held_port"]


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

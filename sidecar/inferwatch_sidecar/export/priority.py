"""The scrape goes first: while ``/metrics`` renders, the sidecar's own busy threads step aside.

Python runs one thread at a time. Under load the socket ingest thread, four HTTP handler
threads decoding JSON and OTLP bodies, and the components' workers all want the interpreter,
and a scrape got one share of it: ``/metrics`` p99 was 1.1 s under a hostile mix (issue 28),
while the same scrape alone takes milliseconds. So the scrape marks itself active
(:meth:`ScrapePriority.__enter__`), and each of those loops calls :meth:`ScrapePriority.pause`
at its batch boundary (per datagram, per HTTP ingest body, per worker pass): a cheap attribute
read when no scrape runs, else a sleep until the scrape is done, at most :data:`MAX_PAUSE_S` per
call so a stream of scrapes cannot stop ingest. Datagrams wait in the kernel's socket queue
meanwhile (``ingest.rcvbuf_bytes``).
"""

from __future__ import annotations

import threading
import time

#: The longest one pause() waits for a scrape to finish.
MAX_PAUSE_S = 0.05


class ScrapePriority:
    """Counts the scrapes in progress; :meth:`pause` waits (bounded) while there is one."""

    __slots__ = ("active", "_lock", "_idle", "paused_s")

    def __init__(self) -> None:
        #: Scrapes rendering now (read without the lock on the hot path).
        self.active = 0
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        #: Seconds the callers of pause() spent waiting, in all.
        self.paused_s = 0.0

    def __enter__(self) -> ScrapePriority:
        with self._lock:
            self.active += 1
            self._idle.clear()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.active -= 1
            if self.active <= 0:
                self.active = 0
                self._idle.set()

    def pause(self, max_s: float = MAX_PAUSE_S) -> None:
        """Wait until no scrape runs, at most ``max_s``; returns at once when none does."""
        if not self.active:
            return
        t0 = time.monotonic()
        self._idle.wait(max_s)
        self.paused_s += time.monotonic() - t0


#: The sidecar's one instance: the scrape route enters it, the ingest and worker loops pause on it.
PRIORITY = ScrapePriority()

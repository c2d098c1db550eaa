"""The scrape goes first: while ``/metrics`` renders, the sidecar's own busy threads step aside.

Python runs one thread at a time. Under load the socket ingest thread, four HTTP handler
threads decoding JSON and OTLP bodies, and the components' workers all want the interpreter,
and a scrape got one share of it: ``/metrics`` p99 was 1.1 s under a hostile mix (issue 28),
while the same scrape alone takes milliseconds. So the scrape marks itself active
(:meth:`ScrapePriority.__enter__`), and each of those loops calls :meth:`ScrapePriority.pause`
at its batch boundary (per datagram, per HTTP ingest body, per worker pass): a cheap attribute
read when no scrape runs, else a sleep until the scrape is done, at most :data:`MAX_PAUSE_S` per
call so a stream of scrapes cannot stop ingest. Datagrams wait in the kernel's socket queue
meanwhile (``ingest.rcvbuf_bytes``). The cyclic garbage collector is off meanwhile too (a
collection holds the interpreter, under the hostile mix 10-40 ms for a young one and up to 90 ms
for a middle one); the collections put off run once the last scrape is answered.

The HTTP server holds it around a whole ``/metrics`` request (:meth:`ScrapePriority.request`), from
routing to the written answer, so a scrape that takes a body rendered ahead is not queued for the
interpreter behind ingest either. Those holds are granted at most :data:`GRANTS_PER_S` a second
(a burst of as many): Prometheus scrapes every few seconds at most, and a client that sends
``GET /metrics`` in a loop gets its answers without the priority, so it cannot pause ingest.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

#: The longest one pause() waits for a scrape to finish.
MAX_PAUSE_S = 0.05
#: Scrape requests given the priority per second (and the burst), :meth:`ScrapePriority.request`.
GRANTS_PER_S = 5.0


class ScrapePriority:
    """Counts the scrapes in progress; :meth:`pause` waits (bounded) while there is one."""

    __slots__ = ("active", "_lock", "_idle", "paused_s", "_tokens", "_refilled", "denied", "_clock", "ingest_waits",
                 "ingest_held", "_gc_off")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        #: Scrapes rendering now (read without the lock on the hot path).
        self.active = 0
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        #: Seconds the callers of pause() spent waiting, in all.
        self.paused_s = 0.0
        self._clock = clock
        self._tokens = GRANTS_PER_S
        self._refilled = clock()
        #: Scrape requests answered without the priority, past GRANTS_PER_S.
        self.denied = 0
        #: Times an ingest loop holding events stepped aside (pause(ingest=True)), and how many do now.
        self.ingest_waits = 0
        self.ingest_held = 0
        #: the collector was on when the first scrape came in, and this turned it off until the last one ends
        self._gc_off = False

    def request(self) -> AbstractContextManager[Any]:
        """This instance for a scrape request while grants are left (:data:`GRANTS_PER_S`), else a no-op context."""
        with self._lock:
            now = self._clock()
            self._tokens = min(GRANTS_PER_S, self._tokens + (now - self._refilled) * GRANTS_PER_S)
            self._refilled = now
            if self._tokens < 1.0:
                self.denied += 1
                return contextlib.nullcontext()
            self._tokens -= 1.0
        return self

    def __enter__(self) -> ScrapePriority:
        with self._lock:
            self.active += 1
            self._idle.clear()
            if self.active == 1 and gc.isenabled():
                # A young collection holds the interpreter 10-40 ms under load (a middle one up to 90): put
                # them off until the scrape is answered (the allocations meanwhile are counted all the same).
                gc.disable()
                self._gc_off = True
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.active -= 1
            if self.active <= 0:
                self.active = 0
                self._idle.set()
                if self._gc_off:
                    self._gc_off = False
                    gc.enable()

    def pause(self, max_s: float = MAX_PAUSE_S, ingest: bool = False) -> None:
        """Wait until no scrape runs, at most ``max_s``; returns at once when none does.

        ``ingest``: the caller holds events it took in (a datagram, a body), so its waiting counts as
        events arriving (:attr:`ingest_waits`, :attr:`ingest_held`): a scrape that looks for arriving
        events while ingest steps aside for it must still see them (export/prerender.py).
        """
        if not self.active:
            return
        t0 = time.monotonic()
        if not ingest:
            self._idle.wait(max_s)
        else:
            with self._lock:
                self.ingest_waits += 1
                self.ingest_held += 1
            try:
                self._idle.wait(max_s)
            finally:
                with self._lock:
                    self.ingest_held -= 1
        self.paused_s += time.monotonic() - t0


#: The sidecar's one instance: the scrape route enters it, the ingest and worker loops pause on it.
PRIORITY = ScrapePriority()

"""Cold starts: what a new process costs before it serves well, per model version.

Per producer (SDK process), from its HELLO (the process's start time) and its first REQUESTs: the time from
process start to the start of its first request, and the mean latency of its first :data:`FIRST` requests over
the median of its requests :data:`STEADY_FROM` to :data:`STEADY_TO` (the steady state). It runs on the ingest
thread only until a producer has shown its steady state; after that a frame costs one dictionary lookup.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable
from typing import Any

from inferwatch.wire import EV_HELLO, EV_REQUEST, OUTCOME_OK

FIRST = 10
STEADY_FROM, STEADY_TO = 50, 250
#: Producers tracked at once (the oldest finished ones are forgotten first).
MAX_PRODUCERS = 256


class _Producer:
    __slots__ = ("start_ns", "first_ns", "key", "lat", "done")

    def __init__(self) -> None:
        self.start_ns: int | None = None
        self.first_ns: int | None = None
        self.key: Any | None = None
        self.lat: list[int] = []
        self.done = False


class ColdStarts:
    def __init__(self, key_of: Callable[[Any], Any]) -> None:
        self.key_of = key_of
        self.producers: dict[tuple[int, int], _Producer] = {}
        self.lock = threading.Lock()
        #: key -> (time to first request s or None, first/steady latency ratio or None), the latest producer's
        self.latest: dict[Any, tuple[float | None, float | None]] = {}

    def frame(self, pid: int, producer_id: int, records: list[tuple[Any, ...]]) -> None:
        p = self.producers.get((pid, producer_id))
        if p is not None and p.done:
            return
        with self.lock:
            if p is None:
                if len(self.producers) >= MAX_PRODUCERS:
                    old = next((k for k, v in self.producers.items() if v.done), next(iter(self.producers)))
                    del self.producers[old]
                p = self.producers[(pid, producer_id)] = _Producer()
            for r in records:
                t = r[0]
                if t == EV_HELLO:
                    p.start_ns = r[4]
                elif t == EV_REQUEST and r[4] == OUTCOME_OK:
                    start = r[2] - r[3]
                    if p.first_ns is None or start < p.first_ns:
                        p.first_ns = start
                    if p.key is None:
                        p.key = self.key_of(r[1])
                    p.lat.append(r[3])
            self._update(p)

    def _update(self, p: _Producer) -> None:
        if p.key is None:
            return
        ttf = (p.first_ns - p.start_ns) / 1e9 if p.start_ns and p.first_ns is not None else None
        ratio = None
        if len(p.lat) >= STEADY_TO:
            steady = statistics.median(p.lat[STEADY_FROM:STEADY_TO])
            if steady > 0:
                ratio = statistics.fmean(p.lat[:FIRST]) / steady
            p.done = True
            p.lat = []
        prev = self.latest.get(p.key, (None, None))
        self.latest[p.key] = (ttf if ttf is not None and ttf >= 0 else prev[0], ratio if ratio is not None else prev[1])

    def snapshot(self) -> dict[Any, tuple[float | None, float | None]]:
        with self.lock:
            return dict(self.latest)

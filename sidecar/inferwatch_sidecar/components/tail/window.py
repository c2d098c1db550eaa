"""One model version's tail-attribution window: the slowest requests and a uniform sample, nothing more.

A :class:`TailWindow` keeps, for the requests of one window:

- the ``max_tail`` slowest requests by end-to-end latency (a min-heap), which
  hold every tail group the analysis needs: the slowest 1% exactly while the
  window has at most ``100 * max_tail`` requests, the slowest 0.1% up to
  ``1000 * max_tail``;
- a uniform sample of all requests (reservoir sampling, seeded), which gives the
  median requests and "the rest" the tail is compared with. Algorithm L (Li,
  1994): the sample is Algorithm R's in distribution, but once it is full the
  number of requests to pass over before the next one enters is drawn at once
  (geometric), so a busy window makes O(k log(n/k)) draws, not one per request;
- the request count.

Each kept request is a :class:`Row` that references the decoded event's own
stage tuple and what the component keeps of the record's features (its trimmed
copy: numeric values as an array of doubles), so keeping one allocates a single
small object besides them. Memory is bounded by ``max_tail + reservoir`` rows whatever the
traffic, and :attr:`TailWindow.bytes` is the estimated bytes of the features the
kept rows hold (a row's ``nbytes``, counted while the sample or the slowest hold
it), which the component holds under ``tail.max_window_bytes`` over all windows.
"""

from __future__ import annotations

import heapq
import math
import random
from typing import Any


class Row:
    """One kept request: latency (seconds), the event's stages, and the joined record's features (or None)."""

    __slots__ = ("latency", "stages", "feats", "nbytes", "held")

    def __init__(self, latency: float, stages: Any, feats: Any) -> None:
        self.latency = latency
        #: The REQUEST event's ``((name, duration_ns, stream), ...)``.
        self.stages = stages
        #: The RECORD event's decoded ``(schema, numeric_values, categorical_values)``, once joined.
        self.feats = feats
        #: Estimated bytes of ``feats``, as counted in its window's ``bytes`` (set by :meth:`TailWindow.attach`).
        self.nbytes = 0
        #: How many of the window's two lists (the sample, the slowest) hold the row: 0 once it left both.
        self.held = 0


class TailWindow:
    """The slowest requests and a uniform sample of one model version's window (see the module docstring).

    Args:
        key: the capped (service, model, version) labels.
        max_tail: slowest requests kept.
        reservoir: size of the uniform sample.
        seed: seed of the sampling.
    """

    __slots__ = ("key", "n", "max_tail", "size", "sample", "top", "_rng", "_randbelow", "_seq", "bytes", "_w",
                 "_next")

    def __init__(self, key: tuple[str, str, str], max_tail: int, reservoir: int, seed: int) -> None:
        self.key = key
        self.n = 0
        self.max_tail = max_tail
        self.size = reservoir
        self.sample: list[Row] = []
        #: (latency, arrival number, row): the number breaks ties without comparing rows.
        self.top: list[tuple[float, int, Row]] = []
        self._rng = random.Random(f"{seed}/{'/'.join(key)}")
        #: ``randrange(n)`` without its argument checks: the draw it makes for one ``n > 0`` (the same stream).
        self._randbelow = self._rng._randbelow  # type: ignore[attr-defined]
        self._seq = 0
        #: Estimated bytes of the features the kept rows hold.
        self.bytes = 0
        #: Algorithm L's running weight, and the request count at which the next request enters the full sample.
        self._w = 1.0
        self._next = 0

    def _skip(self) -> None:
        """Draw how many requests pass before the next one enters the full sample (Algorithm L's geometric gap)."""
        rnd = self._rng.random
        self._w *= math.exp(math.log(1.0 - rnd()) / self.size)
        w = self._w
        gap = 0 if w >= 1.0 else math.floor(math.log(1.0 - rnd()) / math.log1p(-w))
        self._next = self.n + gap + 1

    def _slot(self) -> int:
        """The sample index of the ``n``-th request: the end while the sample fills, a random index when the
        drawn gap ends on it, else ``size`` (not sampled)."""
        j = len(self.sample)
        if j < self.size:
            if j + 1 == self.size:
                self._skip()
            return j
        if self.n == self._next:
            j = self._randbelow(self.size)
            self._skip()
            return j
        return self.size

    def _release(self, row: Row) -> None:
        row.held -= 1
        if row.held == 0 and row.nbytes:
            self.bytes -= row.nbytes

    def add(self, row: Row) -> bool:
        """Count a request; return whether it was kept (in the sample, the slowest, or both).

        A row is added without features; :meth:`attach` gives it them, so their bytes are counted.
        """
        self.n += 1
        j = self._slot()
        self._seq += 1
        top = self.top
        if j >= self.size and len(top) >= self.max_tail and not row.latency > top[0][0]:
            return False
        self._place(row, j)
        return True

    def offer(self, latency: float, stages: Any) -> Row | None:
        """:meth:`add` a request of ``latency`` seconds and ``stages``, making its :class:`Row` only when it is
        kept (most requests of a busy window are not): the kept row, or None. The same draws and the same rows
        kept as :meth:`add`."""
        self.n += 1
        # Past the fill, most requests are neither drawn nor among the slowest: two comparisons each.
        j = self.size if self.n != self._next and len(self.sample) >= self.size else self._slot()
        self._seq += 1
        top = self.top
        if j >= self.size and len(top) >= self.max_tail and not latency > top[0][0]:
            return None
        row = Row(latency, stages, None)
        self._place(row, j)
        return row

    def _place(self, row: Row, j: int) -> None:
        """Keep ``row``: at sample index ``j`` (appended at the end, replacing past it, or not there when
        ``j >= size``) and among the slowest when it is one of them."""
        sample = self.sample
        if j < self.size:
            if j == len(sample):
                sample.append(row)
                row.held += 1
            else:
                old = sample[j]
                sample[j] = row
                row.held += 1
                self._release(old)
        top = self.top
        if len(top) < self.max_tail:
            heapq.heappush(top, (row.latency, self._seq, row))
            row.held += 1
        elif row.latency > top[0][0]:
            row.held += 1
            self._release(heapq.heapreplace(top, (row.latency, self._seq, row))[2])

    def attach(self, row: Row, feats: Any, nbytes: int) -> None:
        """Give a kept row its (trimmed) features of ``nbytes`` estimated bytes; a row no longer kept takes none."""
        if row.held <= 0:
            return
        if row.nbytes:
            self.bytes -= row.nbytes
        row.feats, row.nbytes = feats, nbytes
        self.bytes += nbytes

    def slowest(self) -> list[Row]:
        """The kept slowest requests, slowest first (ties: the earlier first)."""
        return [r for _, _, r in sorted(self.top, key=lambda t: (-t[0], t[1]))]

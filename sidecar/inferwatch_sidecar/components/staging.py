"""The hand-over from the ingest thread to a component's own thread.

A component's ``handle`` runs on the ingest thread for every frame, so it
only stages records; the component's worker takes them in batches. The stage
is bounded: what does not fit is refused and the caller counts it, so a slow
component costs records it says it lost, never memory or ingest time.
"""

from __future__ import annotations

import threading
from typing import Any

from inferwatch.wire import EV_RECORD

#: Bytes charged for a staged event without features (the tuple and its small fields).
EVENT_BYTES = 200
#: Bytes charged per categorical value of a staged record: the most a wire string (255 characters) costs.
CAT_BYTES = 304


def record_bytes(r: tuple[Any, ...]) -> int:
    """An upper bound of what a staged event holds, in O(1): the feature tuples' lengths, not their strings."""
    if r[0] == EV_RECORD and len(r) > 7 and r[7] is not None:
        try:
            _, nums, cats = r[7]
            return EVENT_BYTES + 8 * len(nums) + CAT_BYTES * len(cats)
        except (TypeError, ValueError):
            return EVENT_BYTES
    return EVENT_BYTES


def feature_bytes(records: list[tuple[Any, ...]]) -> int:
    """What the RECORD events of ``records`` add to :data:`EVENT_BYTES` each (their features; see
    :func:`record_bytes`), summed in one pass without a call per record. The pipeline sums a frame once
    and hands the total to every component it stages for (``Staging.put``'s ``nbytes``)."""
    total = 0
    rec, cat_bytes = EV_RECORD, CAT_BYTES
    for r in records:
        if r[0] == rec:
            try:
                f = r[7]
                if f is not None:
                    _, nums, cats = f
                    total += 8 * len(nums) + cat_bytes * len(cats)
            except (TypeError, ValueError, IndexError):
                pass
    return total


class Staging:
    """A bounded list of records, filled by one thread and emptied by another.

    Bounded twice: ``limit`` events, and ``max_bytes`` by :func:`record_bytes` (64 categorical
    features of 255 characters make one record about 20 KB, so a count alone allowed gigabytes).
    """

    __slots__ = ("_items", "_lock", "limit", "max_bytes", "nbytes")

    def __init__(self, limit: int, max_bytes: int = 64 << 20) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._lock = threading.Lock()
        self._items: list[tuple[Any, ...]] = []

    def put(self, records: list[tuple[Any, ...]], nbytes: int | None = None) -> int:
        """Stage as many of ``records`` as fit; return how many did not.

        ``nbytes``: what :func:`record_bytes` sums to over ``records``, when the caller knows it (the
        pipeline sums a frame once for every component); None: summed here.
        """
        with self._lock:
            room = self.limit - len(self._items)
            take = records if room >= len(records) else records[:max(room, 0)]
            budget = self.max_bytes - self.nbytes
            # The whole batch at its floor (EVENT_BYTES each) plus the features of its RECORD events (the
            # sum is what record_bytes would give). Only a batch that does not fit in full is walked again,
            # record by record, to find where the budget ends: the records staged and refused are the same
            # as one record_bytes per record.
            total = nbytes if nbytes is not None and take is records else EVENT_BYTES * len(take) + feature_bytes(take)
            if total <= budget:
                self.nbytes += total
                self._items.extend(take)
                return len(records) - len(take)
            n = 0
            for r in take:
                b = record_bytes(r)
                if b > budget:
                    break
                budget -= b
                n += 1
            self.nbytes = self.max_bytes - budget
            self._items.extend(take[:n])
            return len(records) - n

    def past_half(self) -> bool:
        """Whether the stage holds more than half its events or bytes (time to drain before the tick)."""
        return 2 * self.nbytes > self.max_bytes or 2 * len(self._items) > self.limit

    def take(self) -> list[tuple[Any, ...]]:
        """Everything staged so far, oldest first; the stage is empty afterwards."""
        with self._lock:
            batch, self._items = self._items, []
            self.nbytes = 0
        return batch

    def __len__(self) -> int:
        return len(self._items)

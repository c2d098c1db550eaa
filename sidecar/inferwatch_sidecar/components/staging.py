"""The hand-over from the ingest thread to a component's own thread.

A component's ``handle`` runs on the ingest thread for every frame, so it
only stages records; the component's worker takes them in batches. The stage
is bounded: what does not fit is refused and the caller counts it, so a slow
component costs records it says it lost, never memory or ingest time.
"""

from __future__ import annotations

import threading
from typing import Any


class Staging:
    """A bounded list of records, filled by one thread and emptied by another."""

    __slots__ = ("_items", "_lock", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._items: list[tuple[Any, ...]] = []

    def put(self, records: list[tuple[Any, ...]]) -> int:
        """Stage as many of ``records`` as fit; return how many did not."""
        with self._lock:
            room = self.limit - len(self._items)
            if room >= len(records):
                self._items.extend(records)
                return 0
            if room > 0:
                self._items.extend(records[:room])
            return len(records) - max(room, 0)

    def take(self) -> list[tuple[Any, ...]]:
        """Everything staged so far, oldest first; the stage is empty afterwards."""
        with self._lock:
            batch, self._items = self._items, []
        return batch

    def __len__(self) -> int:
        return len(self._items)

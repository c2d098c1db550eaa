"""Label cardinality caps.

Label values come from traffic (model names, versions, stages, error types,
feature names, PIDs). Each label gets a budget of distinct values; once it is
spent, new values map to ``OVERFLOW`` and the overflow is counted, so a
misbehaving client cannot blow up the series count.
"""

from __future__ import annotations

import threading

OVERFLOW = "__overflow__"
NONE = ""


class LabelLimiter:
    """Caps the distinct values of one label.

    Args:
        label: the label name, for the overflow counter.
        max_values: distinct values admitted before overflowing.
        max_length: longer values are truncated.

    ``get`` is on the ingest path: a dict lookup in the common case.
    """

    __slots__ = ("label", "max_values", "max_length", "_seen", "_lock", "overflowed")

    def __init__(self, label: str, max_values: int, max_length: int = 128) -> None:
        if max_values < 1:
            raise ValueError(f"label {label!r}: max_values must be >= 1")
        self.label = label
        self.max_values = max_values
        self.max_length = max_length
        self._seen: dict[str | None, str] = {}
        self._lock = threading.Lock()
        #: How many times a value was mapped to OVERFLOW.
        self.overflowed = 0

    def get(self, value: str | None) -> str:
        """Return the exported label value for ``value``."""
        v = self._seen.get(value)
        if v is not None:
            return v
        with self._lock:
            v = self._seen.get(value)
            if v is not None:
                return v
            if len(self._seen) >= self.max_values:
                self.overflowed += 1
                return OVERFLOW
            v = NONE if value is None else str(value)[: self.max_length]
            self._seen[value] = v
            return v

    def forget(self, value: str | None) -> None:
        """Release a value's slot (for example a dead PID)."""
        with self._lock:
            self._seen.pop(value, None)

    def __len__(self) -> int:
        return len(self._seen)

"""One series budget for the whole exposition, applied where families are collected (not rendered).

The aggregator's own budget (``labels.max_series``) keeps the request, stage and error families
bounded with ``__overflow__`` label sets. Other families grow with what traffic declares too (the
drift bins: versions x features x bins), so the scrape goes through :class:`ExpositionBudget`: a
view of the registry that passes families through untouched while they fit, and past
``labels.max_family_series`` samples in one family, or ``labels.max_exposition_series`` in all,
keeps whole label sets (a histogram's buckets stay together) in collection order and leaves
the rest out. Every family cut is counted as ``label="exposition"`` in
``inferwatch_label_overflow_total``, which the cardinality alert watches, and the number of
samples left out of the last scrape is in ``/v1/status``. Any renderer (text, OpenMetrics,
protobuf) sits on top of the view.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.metrics_core import Metric

from inferwatch_sidecar.aggregate.labels import LabelLimiter

_GROUP_SKIP = frozenset(("le", "quantile"))


class ExpositionBudget:
    """A collector view of ``registry`` within a series budget (see the module docstring)."""

    def __init__(self, registry: Any, max_series: int, max_family_series: int) -> None:
        self.registry = registry
        self.max_series = max_series
        self.max_family_series = max_family_series
        #: families cut, counted as label="exposition" of inferwatch_label_overflow_total
        self.overflow = LabelLimiter("exposition", 1)
        #: samples left out of the last scrape
        self.last_dropped = 0
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        left = self.max_series
        dropped = 0
        for fam in self.registry.collect():
            n = len(fam.samples)
            allow = min(left, self.max_family_series)
            if n <= allow:
                left -= n
                yield fam
                continue
            kept = self._cut(fam, allow)
            left -= len(kept.samples)
            dropped += n - len(kept.samples)
            with self._lock:
                self.overflow.overflowed += 1
            yield kept
        self.last_dropped = dropped

    @staticmethod
    def _cut(fam: Metric, allow: int) -> Metric:
        out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
        admitted: set[tuple[tuple[str, str], ...]] = set()
        samples: list[Any] = []
        for s in fam.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k not in _GROUP_SKIP))
            if key not in admitted:
                if len(samples) >= allow:
                    continue
                admitted.add(key)
            samples.append(s)
        out.samples = samples
        return out

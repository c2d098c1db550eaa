"""Reading the sidecar's ``/metrics``: samples by name, and histogram quantiles over a time window.

The quantile follows Prometheus's ``histogram_quantile``: find the bucket
where the rank falls and interpolate linearly inside it; a rank in the
``+Inf`` bucket returns the largest finite bound.
"""

from __future__ import annotations

import json
import math
import urllib.request
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


class Scrape:
    """One parsed exposition: ``samples[name]`` -> list of (labels dict, value)."""

    def __init__(self, text: str, t: float) -> None:
        self.t = t
        self.samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                self.samples[s.name].append((dict(s.labels), float(s.value)))

    def get(self, name: str, **match: str) -> list[tuple[dict[str, str], float]]:
        return [(lab, v) for lab, v in self.samples.get(name, []) if all(lab.get(k) == w for k, w in match.items())]

    def value(self, name: str, default: float | None = None, **match: str) -> float | None:
        """The sum of the matching samples of ``name``; ``default`` when there are none."""
        vals = [v for _, v in self.get(name, **match)]
        return sum(vals) if vals else default

    def buckets(self, name: str, by: str, **match: str) -> dict[str, dict[float, float]]:
        """Cumulative bucket counts of histogram ``name`` summed per value of label ``by``."""
        out: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
        for lab, v in self.get(name + "_bucket", **match):
            out[lab.get(by, "")][float(lab["le"])] += v
        return out


def fetch(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


def fetch_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def delta(new: dict[float, float], old: dict[float, float] | None) -> dict[float, float]:
    """Bucket counts gained between two scrapes (a reset counts from zero)."""
    if not old:
        return dict(new)
    d = {le: v - old.get(le, 0.0) for le, v in new.items()}
    if any(v < 0 for v in d.values()):
        return dict(new)
    return d


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus's histogram_quantile over cumulative ``{le: count}``; None without observations."""
    if not buckets:
        return None
    les = sorted(buckets)
    counts = [buckets[le] for le in les]
    total = counts[-1]
    if total <= 0 or not math.isinf(les[-1]):
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in zip(les, counts, strict=True):
        if c >= rank:
            if math.isinf(le):
                return prev_le if len(les) > 1 else None
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return les[-2] if len(les) > 1 else None


def quantiles(buckets: dict[float, float], qs: Iterable[float] = (0.5, 0.99, 0.999)) -> dict[float, float | None]:
    return {q: quantile(q, buckets) for q in qs}

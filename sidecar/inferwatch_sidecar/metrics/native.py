"""Native (sparse exponential) histograms kept alongside the classic buckets at no cost per observation.

Prometheus' native histograms (``schema`` s, base ``2^(2^-s)``) put an
observation ``v > zero_threshold`` in bucket ``i`` when
``base^(i-1) < v <= base^i``; observations at or below the zero threshold go
to the zero bucket. Both that and the classic ``le`` buckets are intervals
closed on the right, so the sorted union of the two sets of bounds cuts the
axis into *cells* that each lie inside exactly one classic and one native
bucket. The aggregator counts observations per cell with the same single
``bisect`` it used for the classic buckets (the list is longer, which costs
a few more comparisons and nothing else), and a scrape folds the cells into
either representation exactly (:meth:`Layout.classic_counts`,
:meth:`Layout.native`).

The native range is fixed per unit (:data:`NATIVE_RANGE`): seconds from
``2^-20`` (about 1 us, the zero threshold) to ``2^16`` (18 hours), counts
(tokens, batch sizes) from ``2^-1`` to ``2^24``. Observations above the top
are counted in the bucket just above it, the one bucket whose upper bound
understates them (the classic ``+Inf`` bucket says as little about them).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from itertools import accumulate
from typing import Any, NamedTuple

from prometheus_client.metrics_core import HistogramMetricFamily

__all__ = [
    "DEFAULT_SCHEMA", "NATIVE_RANGE", "SCHEMAS", "Layout", "NativeHistogram", "NativeHistogramFamily", "native_edge",
    "int_table", "native_quantile",
]

#: Schemas this sidecar offers: Prometheus accepts -4..8; above 6 a series would keep thousands of cells.
SCHEMAS = range(-4, 7)
#: Prometheus' own default bucket factor (1.1) rounds to schema 3: 8 buckets per power of two, a bucket's
#: upper bound 9 % above its lower, so an interpolated quantile is off by at most about 4.4 %.
DEFAULT_SCHEMA = 3
#: Unit -> (lowest, highest) power of two of the native range; the lowest is the zero threshold.
NATIVE_RANGE: dict[str, tuple[int, int]] = {"seconds": (-20, 16)}
#: The range of every other unit (token counts, batch sizes: integers, so 0 and nothing else is below 1/2).
COUNT_RANGE = (-1, 24)


def native_edge(schema: int, index: int) -> float:
    """The upper bound of native bucket ``index`` under ``schema``: ``2^(index * 2^-schema)``."""
    if schema <= 0:
        return math.ldexp(1.0, index << -schema)
    q, r = divmod(index, 1 << schema)
    return math.ldexp(2.0 ** (r / (1 << schema)), q)


class NativeHistogram(NamedTuple):
    """One series' native histogram as a scrape exposes it.

    Attributes:
        count: observations in all (the zero bucket's included).
        sum: sum of the observations.
        schema: the bucket schema.
        zero_threshold: observations at or below it are in the zero bucket.
        zero_count: observations in the zero bucket.
        start: the native index of ``counts[0]``.
        counts: absolute counts of consecutive buckets from ``start``, first and last non-zero
            (empty when every observation is in the zero bucket).
        exemplars: prometheus_client ``Exemplar`` s of a few observations (the classic buckets' ones).
    """

    count: int  # type: ignore[assignment]  # the field shadows tuple.count, on purpose
    sum: float
    schema: int
    zero_threshold: float
    zero_count: int
    start: int
    counts: list[int]
    exemplars: list[Any]


class Layout:
    """The cells of one histogram: the union of its classic bounds and, when ``schema`` is set, native bounds.

    Args:
        classic: the classic bucket bounds (finite, increasing; ``+Inf`` is implied).
        schema: the native schema, or None to keep the classic buckets alone.
        unit: the family's unit, which picks the native range (:data:`NATIVE_RANGE`).

    Attributes:
        edges: the cells' upper bounds, what the aggregator bisects; cell ``len(edges)`` is above them all.
    """

    __slots__ = ("classic", "schema", "edges", "classic_ends", "zero_threshold", "zero_end", "first_index",
                 "native_ends", "cell_classic", "_tables")

    def __init__(self, classic: tuple[float, ...], schema: int | None = None, unit: str = "seconds") -> None:
        self.classic = classic
        self.schema = schema
        self._tables: dict[float, tuple[tuple[int, tuple[int, ...]], ...]] = {}
        if schema is None:
            self.edges = classic
            self.classic_ends: list[int] = list(range(len(classic) + 1))
            self.zero_threshold = 0.0
            self.zero_end = -1
            self.first_index = 0
            self.native_ends: list[int] = []
            self.cell_classic: list[int] = list(range(len(classic) + 1))
            return
        if schema not in SCHEMAS:
            raise ValueError(f"native histogram schema {schema!r} is not one of {SCHEMAS.start}..{SCHEMAS.stop - 1}")
        lo, hi = NATIVE_RANGE.get(unit, COUNT_RANGE)
        # Index range: 2^lo and 2^hi are bucket bounds under every schema (for negative ones, rounded outward).
        if schema >= 0:
            i_lo, i_hi = lo << schema, hi << schema
        else:
            i_lo, i_hi = math.floor(lo / (1 << -schema)), math.ceil(hi / (1 << -schema))
        native = [native_edge(schema, i) for i in range(i_lo, i_hi + 1)]
        self.edges = tuple(sorted(set(classic) | set(native)))
        pos = {e: k for k, e in enumerate(self.edges)}
        n = len(self.edges)
        self.classic_ends = [pos[b] for b in classic] + [n]
        self.zero_threshold = native[0]
        self.zero_end = pos[native[0]]
        #: Native index of the first bucket above the zero threshold; ``native_ends[k]`` is the last cell of
        #: bucket ``first_index + k`` (the last one also takes the cell above the range).
        self.first_index = i_lo + 1
        self.native_ends = [pos[e] for e in native[1:]] + [n]
        #: Cell -> the classic bucket it lies in.
        self.cell_classic = [bisect_left(classic, e) for e in self.edges] + [len(classic)]

    def table(self, mult: float) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """:func:`int_table` of the cells for integers in units of ``mult`` (cached)."""
        t = self._tables.get(mult)
        if t is None:
            t = self._tables[mult] = int_table(self.edges, mult)
        return t

    def classic_counts(self, counts: list[int]) -> list[int]:
        """Per-bucket (not cumulative) classic counts, ``+Inf`` last, from per-cell counts."""
        if self.schema is None:
            return list(counts)
        cum = list(accumulate(counts))
        ends = [cum[j] for j in self.classic_ends]
        return [b - a for a, b in zip([0, *ends], ends)]  # noqa: B905 - one shorter on purpose

    def classic_exemplars(self, ex: list[Any] | None, exv: list[float] | None) -> tuple[list[Any], list[float]]:
        """Per classic bucket, the newest of its cells' exemplars (by end time) and its value."""
        nb = len(self.classic_ends)
        if ex is None or exv is None:
            return [None] * nb, [0.0] * nb
        if self.schema is None:
            return list(ex), list(exv)
        out: list[Any] = [None] * nb
        vals = [0.0] * nb
        cc = self.cell_classic
        for j in [j for j, e in enumerate(ex) if e is not None]:
            e, k = ex[j], cc[j]
            if out[k] is None or e[2] >= out[k][2]:
                out[k] = e
                vals[k] = exv[j]
        return out, vals

    def native(self, counts: list[int], total: float,
               exemplars: list[Any]) -> NativeHistogram:
        """The native histogram of per-cell ``counts`` (schema set)."""
        assert self.schema is not None
        cum = list(accumulate(counts))
        zero = cum[self.zero_end]
        ends = [cum[j] for j in self.native_ends]
        buckets = [b - a for a, b in zip([zero, *ends], ends)]  # noqa: B905 - one shorter on purpose
        first = next((k for k, c in enumerate(buckets) if c), None)
        if first is None:
            return NativeHistogram(cum[-1], total, self.schema, self.zero_threshold, zero, 0, [], exemplars)
        last = len(buckets) - next(k for k, c in enumerate(reversed(buckets)) if c)
        return NativeHistogram(cum[-1], total, self.schema, self.zero_threshold, zero, self.first_index + first,
                               buckets[first:last], exemplars)


def native_quantile(q: float, h: NativeHistogram) -> float | None:
    """``histogram_quantile`` over a native histogram as Prometheus 2.42 computes it; None when empty.

    The rank's bucket ``(lo, hi]`` is interpolated linearly (2.42 does; later releases interpolate
    exponentially), the zero bucket linearly from 0.
    """
    if h.count <= 0:
        return None
    rank = q * h.count
    acc = h.zero_count
    if rank <= acc and h.zero_count:
        return h.zero_threshold * rank / h.zero_count
    for k, c in enumerate(h.counts):
        if c and acc + c >= rank:
            i = h.start + k
            lo, hi = native_edge(h.schema, i - 1), native_edge(h.schema, i)
            return lo + (hi - lo) * (rank - acc) / c
        acc += c
    return native_edge(h.schema, h.start + len(h.counts) - 1)


class NativeHistogramFamily(HistogramMetricFamily):
    """A classic histogram family that also carries each series' native histogram.

    The text and OpenMetrics encoders read ``samples`` only, so they render
    the classic buckets exactly as before; the protobuf exposition
    (:mod:`.protobuf`) and the OTLP converter read :attr:`native`.

    Attributes:
        native: ``(label values, NativeHistogram)`` per series that has one, built on first
            access from what :meth:`add_native` was given (a text scrape never builds them).
        classic: whether the protobuf exposition carries the classic buckets as well.
    """

    def __init__(self, base: HistogramMetricFamily, classic: bool = False) -> None:
        super().__init__(base.name, base.documentation, labels=base._labelnames, unit=base.unit)
        self._pending: list[tuple[list[str], Layout, list[int], float, Callable[[], list[Any]]]] = []
        self._native: list[tuple[list[str], NativeHistogram]] | None = None
        self.classic = classic

    def add_native(self, labels: list[str], layout: Layout, counts: list[int], total: float,
                   exemplars: Callable[[], list[Any]]) -> None:
        """A series' cells, to become its native histogram when :attr:`native` is read."""
        self._pending.append((labels, layout, counts, total, exemplars))
        self._native = None

    @property
    def native(self) -> list[tuple[list[str], NativeHistogram]]:
        if self._native is None:
            self._native = [(lab, lay.native(counts, total, ex())) for lab, lay, counts, total, ex in self._pending]
        return self._native


#: Entries of :meth:`Layout.int_table`: integers up to 2^129 - 1 (inputs are u64 at most).
_INT_BITS = 130


def _threshold(edge: float, mult: float) -> int:
    """The largest integer x with ``x * mult <= edge`` (as floats multiply: monotonic)."""
    n = math.floor(edge / mult)
    while (n + 1) * mult <= edge:
        n += 1
    while n * mult > edge:
        n -= 1
    return n


def int_table(edges: tuple[float, ...], mult: float) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Per bit length of a non-negative integer ``x``: ``(offset, thresholds)`` such that
    ``offset + bisect_left(thresholds, x) == bisect_left(edges, x * mult)``.

    The aggregator receives durations as integer nanoseconds (gaps as microseconds): with
    ``x.bit_length()`` picking the power of two ``x`` lies in, a bisect over the few cells of that
    octave (about 2^schema + 2) finds its cell, where one over every cell would take 3 more float
    comparisons per observation. Exact: each threshold is the largest integer the float
    ``x * mult`` maps at or below its edge.
    """
    t = [_threshold(e, mult) for e in edges]
    out = []
    for b in range(_INT_BITS):
        lo, hi = ((1 << (b - 1)) if b else 0), 1 << b
        i0 = bisect_left(t, lo)
        out.append((i0, tuple(x for x in t[i0:] if x < hi)))
    return tuple(out)

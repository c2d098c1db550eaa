"""Reference columns: the bounded summaries of one numeric or categorical column.

A numeric column keeps reference-percentile bins (inner ``edges`` plus one edge
at the minimum and one just above the maximum), their ``counts`` and
``bin_means``, coarser ``psi_edges`` for PSI and Jensen-Shannon, and the
moments; a categorical column keeps its top-K ``categories`` with their counts
and one "other" count. Both keep ``count`` and ``missing``. Everything is
bounded by ``bins`` and ``top_k``, not by the reference size. The drift
profile (:mod:`inferwatch_sidecar.components.drift.profile`), the models built on
the columns (the drift package's ``multivariate`` and ``performance``), the
per-column comparison (:mod:`.compare`), tail attribution and the canary judge
(:func:`canon`, one category spelling everywhere) import this module, never the
other way round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DEFAULT_BINS = 100
DEFAULT_PSI_BINS = 10
DEFAULT_TOP_K = 32
MAX_BINS = 256
MAX_TOP_K = 256
ROLES = ("feature", "prediction", "confidence")


class ProfileError(ValueError):
    """A reference profile that cannot be used; the message says what to fix."""


def canon(value: Any) -> str | None:
    """Canonical string of a categorical value, identical offline and in the sidecar.

    Integral floats lose their ``.0`` so that a class ``1`` sent as ``1.0`` by
    the wire format and read as ``"1"`` from a CSV file are the same category.
    NaN and None are missing.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        f = float(value)
        if not math.isfinite(f):
            return None
        if f.is_integer() and abs(f) < 2**53:
            return str(int(f))
        return repr(f)
    return str(value)


def to_float(value: Any) -> float:
    """A numeric value as a float, identical offline and in the sidecar: None, or a value ``float()``
    rejects, is NaN (missing)."""
    if type(value) is float:
        return value
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


@dataclass
class NumericColumn:
    """Reference summary of a numeric column (see the module docstring)."""

    name: str
    role: str
    count: int
    missing: int
    mean: float
    std: float
    min: float
    max: float
    edges: np.ndarray
    counts: np.ndarray
    bin_means: np.ndarray
    psi_edges: np.ndarray
    kind: str = field(default="numeric", init=False)
    #: fine bin index -> PSI (coarse) bin index
    psi_map: np.ndarray = field(init=False, repr=False)

    _lut: Any = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        self.psi_map = psi_map(self.edges, self.psi_edges)
        self._lut = _BinLookup.make(self.edges)

    @property
    def n_bins(self) -> int:
        return int(self.counts.size)

    @property
    def n_psi_bins(self) -> int:
        return int(self.psi_edges.size + 1)

    def bin(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """Bin finite values; return ``(counts, sums, missing)``. NaN and inf count as missing."""
        v = np.asarray(values, dtype=np.float64)
        ok = np.isfinite(v)
        miss = int(v.size - np.count_nonzero(ok))
        if miss:
            v = v[ok]
        idx = self._lut.index(v) if self._lut is not None else np.searchsorted(self.edges, v, side="right")
        counts = np.bincount(idx, minlength=self.n_bins)
        sums = np.bincount(idx, weights=v, minlength=self.n_bins)
        return counts, sums, miss

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "kind": "numeric", "role": self.role, "count": self.count, "missing": self.missing,
            "mean": self.mean, "std": self.std, "min": self.min, "max": self.max,
            "edges": self.edges.tolist(), "counts": self.counts.astype(int).tolist(),
            "bin_means": self.bin_means.tolist(), "psi_edges": self.psi_edges.tolist(),
        }


@dataclass
class CategoricalColumn:
    """Reference summary of a categorical column: top-K categories plus "other"."""

    name: str
    role: str
    count: int
    missing: int
    categories: list[str]
    #: one count per category, then the "other" count
    counts: np.ndarray
    kind: str = field(default="categorical", init=False)
    index: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.index = {c: i for i, c in enumerate(self.categories)}

    @property
    def n_bins(self) -> int:
        return len(self.categories) + 1

    @property
    def other_bin(self) -> int:
        return len(self.categories)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "kind": "categorical", "role": self.role, "count": self.count,
            "missing": self.missing, "categories": list(self.categories),
            "counts": self.counts.astype(int).tolist(),
        }


Column = NumericColumn | CategoricalColumn


class _BinLookup:
    """Bin index lookup that equals ``np.searchsorted(edges, v, side="right")``, faster.

    A binary search over 100 edges costs ~50 ns per value (branch misses).
    Instead, a uniform grid of cells over the edge range gives each value a
    lower bound of its bin index, then a few vectorized steps
    ``idx += v >= edges[idx]`` finish the count. Only used when every pair of
    adjacent cells holds few edges (otherwise ``make`` returns None and the
    caller uses searchsorted): heavy tails concentrate edges in few cells.
    """

    CELLS = 2048
    MAX_STEPS = 6

    __slots__ = ("lo", "scale", "lut", "padded", "steps")

    def __init__(self, lo: float, scale: float, lut: np.ndarray, padded: np.ndarray, steps: int) -> None:
        self.lo, self.scale, self.lut, self.padded, self.steps = lo, scale, lut, padded, steps

    @classmethod
    def make(cls, edges: np.ndarray) -> _BinLookup | None:
        if edges.size < 2:
            return None
        lo, hi = float(edges[0]), float(edges[-1])
        if not (math.isfinite(lo) and math.isfinite(hi)) or hi - lo <= 0:
            return None
        scale = cls.CELLS / (hi - lo)
        if not math.isfinite(scale):
            return None
        bounds = lo + np.arange(cls.CELLS + 2) / scale
        # lut[c] = edges <= the left boundary of cell c - 1: a lower bound even when rounding
        # puts a value one cell too high.
        lut = np.searchsorted(edges, np.concatenate([[-np.inf, -np.inf], bounds[:-1]]), side="right")
        steps = int(np.max(lut[2:] - lut[:-2])) + 1
        if steps > cls.MAX_STEPS:
            return None
        padded = np.concatenate([edges, [np.inf]])
        return cls(lo, scale, lut.astype(np.intp), padded, steps)

    def index(self, v: np.ndarray) -> np.ndarray:
        cell = (v - self.lo) * self.scale
        np.clip(cell, -1.0, self.CELLS + 0.5, out=cell)
        idx = self.lut[(cell + 1.0).astype(np.intp)]
        padded = self.padded
        for _ in range(self.steps):
            idx += v >= padded[idx]
        return idx


def psi_map(edges: np.ndarray, psi_edges: np.ndarray) -> np.ndarray:
    """Map each fine bin to the coarse (PSI) bin that contains it.

    The PSI edges are a subset of the fine edges (deciles among percentiles),
    so each fine bin lies inside one coarse bin: the one holding its lower edge.
    """
    lower = np.concatenate([[-np.inf], np.asarray(edges, dtype=np.float64)])
    return np.searchsorted(np.asarray(psi_edges, dtype=np.float64), lower, side="right").astype(np.intp)


def _quantile_edges(v: np.ndarray, n: int) -> np.ndarray:
    # Inner edges at the k/n quantiles. Duplicates (ties, discrete data) merge bins.
    # Two more edges, at the minimum and just above the maximum, give values outside the
    # reference range bins of their own (reference count 0): a shift beyond the range, or a
    # constant feature that changes value, is then visible to KS instead of hiding in an outer bin.
    if v.size == 0:
        return np.empty(0)
    lo, hi = float(v.min()), float(np.nextafter(v.max(), np.inf))
    return np.unique(np.concatenate([[lo], np.quantile(v, np.arange(1, n) / n), [hi]]))


def numeric_column(name: str, values: np.ndarray, role: str = "feature", bins: int = DEFAULT_BINS,
                   psi_bins: int = DEFAULT_PSI_BINS) -> NumericColumn:
    """Summarize a numeric reference sample (NaN/inf are missing).

    Args:
        name: column name.
        values: the reference values.
        role: feature, prediction or confidence.
        bins: number of percentile bins (at most ``MAX_BINS``); ``psi_bins`` must divide it.
        psi_bins: number of coarse bins for PSI and Jensen-Shannon.
    """
    if not (2 <= bins <= MAX_BINS) or psi_bins < 2 or bins % psi_bins:
        raise ProfileError(f"bins must be in [2, {MAX_BINS}] and a multiple of psi_bins, got {bins}/{psi_bins}")
    v = np.asarray(values, dtype=np.float64)
    ok = v[np.isfinite(v)]
    missing = int(v.size - ok.size)
    edges = _quantile_edges(ok, bins)
    # The coarse edges are taken from the same quantile evaluation so they are exactly a subset of `edges`.
    if ok.size:
        q = np.quantile(ok, np.arange(1, bins) / bins)
        psi_edges = np.unique(q[(bins // psi_bins) * np.arange(1, psi_bins) - 1])
    else:
        psi_edges = np.empty(0)
    idx = np.searchsorted(edges, ok, side="right")
    counts = np.bincount(idx, minlength=edges.size + 1).astype(np.float64)
    sums = np.bincount(idx, weights=ok, minlength=edges.size + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.where(counts > 0, counts, 1), 0.0)
    return NumericColumn(
        name=name, role=role, count=int(ok.size), missing=missing,
        mean=float(ok.mean()) if ok.size else 0.0, std=float(ok.std()) if ok.size else 0.0,
        min=float(ok.min()) if ok.size else 0.0, max=float(ok.max()) if ok.size else 0.0,
        edges=edges, counts=counts, bin_means=means, psi_edges=psi_edges,
    )


def categorical_column(name: str, values: Any, role: str = "feature", top_k: int = DEFAULT_TOP_K) -> CategoricalColumn:
    """Summarize a categorical reference sample: top-K categories by frequency plus "other".

    Ties in frequency are broken by the category string so the profile is deterministic.
    """
    if not (1 <= top_k <= MAX_TOP_K):
        raise ProfileError(f"top_k must be in [1, {MAX_TOP_K}], got {top_k}")
    freq: dict[str, int] = {}
    missing = 0
    for raw in values:
        c = canon(raw)
        if c is None:
            missing += 1
        else:
            freq[c] = freq.get(c, 0) + 1
    ranked = sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))
    top = ranked[:top_k]
    other = sum(n for _, n in ranked[top_k:])
    return CategoricalColumn(
        name=name, role=role, count=sum(freq.values()), missing=missing,
        categories=[c for c, _ in top], counts=np.array([n for _, n in top] + [other], dtype=np.float64),
    )


# -- loading and validation -------------------------------------------------------------------------------------------


def need_key(d: dict[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise ProfileError(f"{where}: missing field {key!r}")
    return d[key]


def _floats(d: dict[str, Any], key: str, where: str, size: int | None = None) -> np.ndarray:
    raw = need_key(d, key, where)
    if not isinstance(raw, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in raw):
        raise ProfileError(f"{where}: {key!r} must be a list of numbers")
    a = np.array(raw, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        raise ProfileError(f"{where}: {key!r} contains NaN or infinity")
    if size is not None and a.size != size:
        raise ProfileError(f"{where}: {key!r} has {a.size} entries, expected {size}")
    return a


def _number(d: dict[str, Any], key: str, where: str) -> float:
    v = need_key(d, key, where)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise ProfileError(f"{where}: {key!r} must be a finite number, got {v!r}")
    return float(v)


def column_from_json(d: Any, where: str = "column") -> Column:
    """Validate one column entry (``Column.to_json()``) and build the column; ``where`` names it in errors."""
    if not isinstance(d, dict):
        raise ProfileError(f"{where}: must be an object")
    name = need_key(d, "name", where)
    if not isinstance(name, str) or not name:
        raise ProfileError(f"{where}: 'name' must be a non-empty string")
    where = f"column {name!r}"
    role = d.get("role", "feature")
    if role not in ROLES:
        raise ProfileError(f"{where}: role must be one of {ROLES}, got {role!r}")
    kind = need_key(d, "kind", where)
    count = int(_number(d, "count", where))
    missing = int(_number(d, "missing", where))
    if count < 0 or missing < 0:
        raise ProfileError(f"{where}: count and missing must be >= 0")
    if kind == "numeric":
        edges = _floats(d, "edges", where)
        if edges.size > MAX_BINS - 1 or np.any(np.diff(edges) <= 0):
            raise ProfileError(f"{where}: 'edges' must be strictly increasing, at most {MAX_BINS - 1} of them")
        counts = _floats(d, "counts", where, edges.size + 1)
        if np.any(counts < 0) or abs(counts.sum() - count) > 0.5:
            raise ProfileError(f"{where}: 'counts' must be >= 0 and sum to 'count' ({count})")
        psi_edges = _floats(d, "psi_edges", where)
        if np.any(np.diff(psi_edges) <= 0) or not np.all(np.isin(psi_edges, edges)):
            raise ProfileError(f"{where}: 'psi_edges' must be increasing and a subset of 'edges'")
        return NumericColumn(
            name=name, role=role, count=count, missing=missing, mean=_number(d, "mean", where),
            std=_number(d, "std", where), min=_number(d, "min", where), max=_number(d, "max", where),
            edges=edges, counts=counts, bin_means=_floats(d, "bin_means", where, edges.size + 1), psi_edges=psi_edges,
        )
    if kind == "categorical":
        cats = need_key(d, "categories", where)
        if not isinstance(cats, list) or not all(isinstance(c, str) for c in cats) or len(set(cats)) != len(cats):
            raise ProfileError(f"{where}: 'categories' must be a list of distinct strings")
        if len(cats) > MAX_TOP_K:
            raise ProfileError(f"{where}: at most {MAX_TOP_K} categories")
        counts = _floats(d, "counts", where, len(cats) + 1)
        if np.any(counts < 0) or abs(counts.sum() - count) > 0.5:
            raise ProfileError(f"{where}: 'counts' (one per category plus 'other') must be >= 0 and sum to 'count'")
        return CategoricalColumn(name=name, role=role, count=count, missing=missing, categories=cats, counts=counts)
    raise ProfileError(f"{where}: kind must be 'numeric' or 'categorical', got {kind!r}")

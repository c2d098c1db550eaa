"""The streaming window of one column against its reference: the per-column drift detector.

A :class:`ColumnWindow` is a ring of ``subwindows`` sub-window summaries of one
column, binned on its reference bins: counts (int32) per bin, per-bin sums of
the values (float32, numeric columns only, for the Wasserstein distance) and
missing counts per sub-window, plus cumulative counts per exported bin (PSI
bins or categories) and the categories outside the reference's top-K seen
since the ring last wrapped (at most ``MAX_UNSEEN``). Its size depends on the
reference's bins, never on the traffic. ``score`` runs the column's test
against the reference (:func:`engine.score`).

It meets the detector contract (:mod:`inferwatch_sidecar.components.detector`):
``update``, read-only results, and a JSON state that carries its reference, so
``ColumnWindow.from_state(w.to_state())`` continues exactly where ``w`` was.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from inferwatch_sidecar.components.drift import engine
from inferwatch_sidecar.components.drift.state import state_array
from inferwatch_sidecar.stats.columns import Column, NumericColumn, canon, column_from_json, to_float

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is 3.11+; annotations only

#: Unseen categories kept per column (the first ones seen since the ring wrapped).
MAX_UNSEEN = 16


def _read_only(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


class ColumnWindow:
    """A ring of sub-window summaries for one column against its reference bins (see the module docstring).

    Args:
        ref: the column's reference.
        subwindows: sub-windows in the ring.
    """

    __slots__ = ("_ref", "_counts", "_sums", "_missing", "_cum", "_unseen", "_slot")

    RESULTS = ("summary", "cum", "unseen")

    def __init__(self, ref: Column, subwindows: int) -> None:
        self._ref = ref
        nb = ref.n_bins
        self._counts = np.zeros((subwindows, nb), dtype=np.int32)
        self._sums = np.zeros((subwindows, nb), dtype=np.float32) if isinstance(ref, NumericColumn) else None
        self._missing = np.zeros(subwindows, dtype=np.int64)
        n_export = ref.n_psi_bins if isinstance(ref, NumericColumn) else nb
        self._cum = np.zeros(n_export, dtype=np.int64)
        self._unseen: dict[str, int] = {}
        self._slot = 0

    # -- feeding ------------------------------------------------------------------------------------------------------

    def update(self, values: np.ndarray | Sequence[Any]) -> None:
        """Add one batch of the column's values to the current sub-window.

        An array is taken as numbers, a sequence as raw values (categories, or
        numbers of any type); either is converted when the reference is of the
        other kind. NaN, inf and None count as missing.
        """
        numeric = isinstance(self._ref, NumericColumn)
        if isinstance(values, np.ndarray):
            if numeric:
                self._add_numbers(values)
            else:
                self._add_categories([canon(v) for v in values.tolist()])
        elif numeric:
            self._add_numbers(np.array([to_float(v) for v in values], dtype=np.float64))
        else:
            self._add_categories(values)

    def add_missing(self, n: int) -> None:
        """Count ``n`` records that lack the column."""
        self._missing[self._slot] += n

    def rotate(self) -> None:
        """Start the next sub-window, forgetting the oldest one."""
        self._slot = s = (self._slot + 1) % len(self._missing)
        self._counts[s] = 0
        if self._sums is not None:
            self._sums[s] = 0
        self._missing[s] = 0
        if s == 0:
            self._unseen.clear()

    def _add_numbers(self, values: np.ndarray) -> None:
        ref = self._ref
        assert isinstance(ref, NumericColumn) and self._sums is not None
        counts, sums, miss = ref.bin(values)
        self._counts[self._slot] += counts.astype(np.int32)
        self._sums[self._slot] += sums.astype(np.float32)
        self._missing[self._slot] += miss
        self._cum += np.bincount(ref.psi_map, weights=counts, minlength=self._cum.size).astype(np.int64)

    def _add_categories(self, values: Sequence[Any]) -> None:
        ref = self._ref
        assert not isinstance(ref, NumericColumn)
        s = engine.summarize_categorical(ref, values, max_unseen=MAX_UNSEEN)
        c = s.counts.astype(np.int64)
        self._counts[self._slot] += c.astype(np.int32)
        self._missing[self._slot] += s.missing
        self._cum += c
        for k, n in s.unseen.items():
            k = k[:64]  # as kept: a longer value's later counts add to it, not replace it
            if k in self._unseen:
                self._unseen[k] += n
            elif len(self._unseen) < MAX_UNSEEN:
                self._unseen[k] = n

    # -- results ------------------------------------------------------------------------------------------------------

    @property
    def summary(self) -> engine.Summary:
        """The whole window reduced against the reference bins (a fresh copy)."""
        counts = self._counts.sum(axis=0, dtype=np.int64).astype(np.float64)
        sums = self._sums.sum(axis=0, dtype=np.float64) if self._sums is not None else None
        return engine.Summary(counts=counts, sums=sums, missing=int(self._missing.sum()), unseen=dict(self._unseen))

    @property
    def cum(self) -> np.ndarray:
        """Counts per exported bin (PSI bins, or categories then "other") since the window was created."""
        return _read_only(self._cum)

    @property
    def unseen(self) -> MappingProxyType[str, int]:
        """Categories outside the reference seen since the ring last wrapped, with their counts."""
        return MappingProxyType(self._unseen)

    @property
    def ref(self) -> Column:
        """The column's reference."""
        return self._ref

    @property
    def counts(self) -> np.ndarray:
        """Counts per sub-window and reference bin."""
        return _read_only(self._counts)

    @property
    def sums(self) -> np.ndarray | None:
        """Sums of the values per sub-window and reference bin (numeric columns; None otherwise)."""
        return _read_only(self._sums) if self._sums is not None else None

    @property
    def missing(self) -> np.ndarray:
        """Missing values per sub-window."""
        return _read_only(self._missing)

    @property
    def slot(self) -> int:
        """Position of the current sub-window in the ring."""
        return self._slot

    @property
    def subwindows(self) -> int:
        """Sub-windows in the ring."""
        return len(self._missing)

    @property
    def nbytes(self) -> int:
        """Bytes held for this column, its reference included."""
        n = self._counts.nbytes + self._missing.nbytes + self._cum.nbytes
        if self._sums is not None:
            n += self._sums.nbytes
        ref = self._ref
        if isinstance(ref, NumericColumn):
            n += ref.edges.nbytes + ref.counts.nbytes + ref.bin_means.nbytes + ref.psi_edges.nbytes + ref.psi_map.nbytes
        else:
            n += ref.counts.nbytes + sum(len(c) + 8 for c in ref.categories)
        n += sum(len(k) + 8 for k in self._unseen)
        return n

    def score(self, settings: engine.Settings) -> engine.Result:
        """The column's raw (uncorrected) test of the window against the reference."""
        return engine.score(self._ref, self.summary, settings)

    # -- state --------------------------------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """Plain-JSON state, the reference included; ``from_state`` rebuilds the window."""
        return {
            "reference": self._ref.to_json(), "slot": self._slot, "counts": self._counts.tolist(),
            "sums": None if self._sums is None else self._sums.tolist(), "missing": self._missing.tolist(),
            "cum": self._cum.tolist(), "unseen": dict(self._unseen),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Self:
        """Rebuild a window from ``to_state()``.

        Raises:
            ValueError: a field is missing, has the wrong shape or holds invalid values
                (``ProfileError`` for the reference).
        """
        ref = column_from_json(state.get("reference"), "checkpointed reference column")
        rows = state.get("missing")
        subwindows = len(rows) if isinstance(rows, list) else 0
        if subwindows < 1:
            raise ValueError("array missing must list one count per sub-window")
        win = cls(ref, subwindows)
        win._counts = state_array(state, "counts", np.int32, win._counts.shape)
        if win._sums is not None:
            win._sums = state_array(state, "sums", np.float32, win._sums.shape)
        win._missing = state_array(state, "missing", np.int64, win._missing.shape)
        win._cum = state_array(state, "cum", np.int64, win._cum.shape)
        slot = state.get("slot")
        if not isinstance(slot, int) or not 0 <= slot < subwindows:
            raise ValueError("ring position out of range")
        win._slot = slot
        unseen = state.get("unseen")
        if not isinstance(unseen, dict) or len(unseen) > MAX_UNSEEN:
            raise ValueError(f"unseen categories must be a mapping of at most {MAX_UNSEEN}")
        win._unseen = {str(k): int(v) for k, v in unseen.items()}
        return win

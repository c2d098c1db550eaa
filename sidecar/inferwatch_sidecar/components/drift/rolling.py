"""A rolling reference: the window compared with the same bins one period earlier (``reference_mode: rolling``).

Seasonal traffic (day and night, weekdays and weekends) drifts against any
fixed reference every day. In rolling mode each column's window is compared
with the same column one period (``rolling_period_s``, a day by default)
earlier, so a pattern that repeats every period does not read as drift, while
a change that is new since the last period does.

:class:`RollingColumn` keeps that history in bounded memory: a ring of
``rolling_slots`` history slots of ``period / slots`` seconds each (40 min
with the defaults; plus the slots one window spans and the one being filled),
holding the column's counts on its profile's coarse bins
(the deciles of a numeric column, with the per-bin sums for the Wasserstein
distance; the top-K categories plus "other" of a categorical one) and its
missing count. Each finished sub-window of the column's window is added to the
slot that holds its start time, so the history costs nothing per record. The
past reference of a window is the sum of the history slots that cover the
window one period earlier (:meth:`RollingColumn.reference`), a profile column
of its own, which the engine's tests use as it uses any reference.

The cost of that bound: the rolling comparison of a numeric column runs on
its 10 deciles, not its 100 percentile bins, so it sees slightly less, and the
past reference spans whole history slots (40 to 80 min for a 10 min window),
not exactly the window's length. Every column's test then uses the past
reference's sample size, so its effect floor is larger than against a big
reference file. And a change that lasts a full period becomes the reference:
rolling mode flags a change for one period after it starts, then accepts it.

It meets the detector contract (:mod:`inferwatch_sidecar.components.detector`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from inferwatch_sidecar.components.drift import engine, multivariate
from inferwatch_sidecar.components.drift.state import state_array
from inferwatch_sidecar.components.drift.window import ColumnWindow
from inferwatch_sidecar.stats.columns import CategoricalColumn, Column, NumericColumn, column_from_json

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is 3.11+; annotations only

    from inferwatch_sidecar.components.drift.multivariate_window import JointWindow

#: Status of a column (and of the joint test) while the history does not yet reach one period back.
NO_HISTORY = "no_history"


def _read_only(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


class RollingColumn:
    """The history of one column on its coarse bins, in a ring of slots (see the module docstring).

    Args:
        ref: the column's profile column (its bins).
        slots: history slots in the ring.
        slot_seconds: seconds each slot covers.
    """

    __slots__ = ("_ref", "_seconds", "_ids", "_counts", "_sums", "_missing")

    RESULTS = ("slot_ids", "counts", "missing")

    def __init__(self, ref: Column, slots: int, slot_seconds: float) -> None:
        if slots < 1 or not slot_seconds > 0:
            raise ValueError("a rolling history needs at least one slot of a positive length")
        self._ref = ref
        self._seconds = float(slot_seconds)
        nb = ref.n_psi_bins if isinstance(ref, NumericColumn) else ref.n_bins
        self._ids = np.full(slots, -1, dtype=np.int64)
        self._counts = np.zeros((slots, nb), dtype=np.int32)
        self._sums = np.zeros((slots, nb), dtype=np.float32) if isinstance(ref, NumericColumn) else None
        self._missing = np.zeros(slots, dtype=np.int64)

    # -- feeding --------------------------------------------------------------------------------------------------

    def update(self, start: float, counts: np.ndarray, sums: np.ndarray | None, missing: int) -> None:
        """Add one finished sub-window that started at Unix time ``start``.

        Args:
            start: when the sub-window started.
            counts: its counts on the profile column's bins.
            sums: its per-bin sums of the values (numeric columns).
            missing: its missing values.
        """
        hid = int(start // self._seconds)
        i = hid % self._ids.size
        if self._ids[i] != hid:
            if hid < self._ids[i]:
                return  # older than what the slot holds now: its period is gone
            self._ids[i] = hid
            self._counts[i] = 0
            self._missing[i] = 0
            if self._sums is not None:
                self._sums[i] = 0.0
        ref = self._ref
        c = np.asarray(counts, dtype=np.float64)
        if isinstance(ref, NumericColumn):
            assert self._sums is not None
            k = ref.n_psi_bins
            self._counts[i] += np.bincount(ref.psi_map, weights=c, minlength=k).astype(np.int32)
            if sums is not None:
                w = np.asarray(sums, dtype=np.float64)
                self._sums[i] += np.bincount(ref.psi_map, weights=w, minlength=k).astype(np.float32)
        else:
            self._counts[i] += c.astype(np.int32)
        self._missing[i] += int(missing)

    # -- results --------------------------------------------------------------------------------------------------

    @property
    def slot_ids(self) -> np.ndarray:
        """Which history slot (``floor(time / slot_seconds)``) each ring position holds; -1 when empty."""
        return _read_only(self._ids)

    @property
    def counts(self) -> np.ndarray:
        """Counts per ring position and coarse bin."""
        return _read_only(self._counts)

    @property
    def missing(self) -> np.ndarray:
        """Missing values per ring position."""
        return _read_only(self._missing)

    @property
    def ref(self) -> Column:
        """The profile column whose bins the history uses."""
        return self._ref

    @property
    def slot_seconds(self) -> float:
        return self._seconds

    @property
    def slots(self) -> int:
        return int(self._ids.size)

    @property
    def nbytes(self) -> int:
        n = self._ids.nbytes + self._counts.nbytes + self._missing.nbytes
        return n + (self._sums.nbytes if self._sums is not None else 0)

    def coarse(self, s: engine.Summary) -> engine.Summary:
        """A window's summary on the profile column's bins, reduced to the history's coarse bins."""
        ref = self._ref
        if not isinstance(ref, NumericColumn):
            return s
        k = ref.n_psi_bins
        sums = np.bincount(ref.psi_map, weights=s.sums, minlength=k) if s.sums is not None else None
        return engine.Summary(counts=np.bincount(ref.psi_map, weights=s.counts, minlength=k), sums=sums,
                              missing=s.missing, unseen=dict(s.unseen))

    def reference(self, start: float, end: float) -> Column | None:
        """The past reference: the history slots covering ``[start, end)``, or None when one is not held."""
        first, last = int(start // self._seconds), int(math.ceil(end / self._seconds)) - 1
        if last < first or last - first >= self._ids.size:
            return None
        idx = [h % self._ids.size for h in range(first, last + 1)]
        if any(self._ids[i] != h for i, h in zip(idx, range(first, last + 1), strict=True)):
            return None
        counts = self._counts[idx].sum(axis=0, dtype=np.int64).astype(np.float64)
        missing = int(self._missing[idx].sum())
        ref = self._ref
        name = f"{ref.name} (one period earlier)"
        if isinstance(ref, NumericColumn):
            assert self._sums is not None
            sums = self._sums[idx].sum(axis=0, dtype=np.float64)
            with np.errstate(invalid="ignore", divide="ignore"):
                means = np.where(counts > 0, sums / np.where(counts > 0, counts, 1.0), 0.0)
            total = counts.sum()
            return NumericColumn(
                name=name, role=ref.role, count=int(total), missing=missing,
                mean=float(sums.sum() / total) if total else ref.mean,
                # The effect's unit stays the profile's spread, as against the profile.
                std=ref.std, min=ref.min, max=ref.max, edges=ref.psi_edges, counts=counts, bin_means=means,
                psi_edges=ref.psi_edges,
            )
        return CategoricalColumn(name=name, role=ref.role, count=int(counts.sum()), missing=missing,
                                 categories=list(ref.categories), counts=counts)

    # -- state ----------------------------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """Plain-JSON state, the profile column included; ``from_state`` rebuilds the history."""
        return {
            "reference": self._ref.to_json(), "slot_seconds": self._seconds, "slot_ids": self._ids.tolist(),
            "counts": self._counts.tolist(), "sums": None if self._sums is None else self._sums.tolist(),
            "missing": self._missing.tolist(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Self:
        """Rebuild a history from ``to_state()``.

        Raises:
            ValueError: a field is missing, has the wrong shape or holds invalid values.
        """
        ref = column_from_json(state.get("reference"), "checkpointed rolling reference column")
        ids = state.get("slot_ids")
        seconds = state.get("slot_seconds")
        if not isinstance(ids, list) or not ids or not isinstance(seconds, (int, float)) or not seconds > 0:
            raise ValueError("a rolling history needs its slot ids and a positive slot length")
        h = cls(ref, len(ids), float(seconds))
        raw = np.asarray(ids)
        if raw.dtype.kind not in "iu" or np.any(raw < -1):
            raise ValueError("array slot_ids holds invalid values")
        h._ids = raw.astype(np.int64)
        h._counts = state_array(state, "counts", np.int32, h._counts.shape)
        if h._sums is not None:
            h._sums = state_array(state, "sums", np.float32, h._sums.shape)
        h._missing = state_array(state, "missing", np.int64, h._missing.shape)
        return h


class History:
    """The rolling histories of one model version: one :class:`RollingColumn` per window, the joint one included.

    Args:
        windows: the model version's column windows, by column name.
        joint: its joint window, if any.
        period: seconds between a window and the one it is compared with.
        slots: history slots per period.
        window: the window's length in seconds. The ring holds one period plus one window (and the slot
            being filled), so the window one period back is still there.
    """

    def __init__(self, windows: Mapping[str, ColumnWindow], joint: JointWindow | None, period: float,
                 slots: int, window: float) -> None:
        self.period = float(period)
        length = period / slots
        ring = slots + math.ceil(window / length) + 1
        self.columns = {n: RollingColumn(w.ref, ring, length) for n, w in windows.items()}
        self.joint = RollingColumn(joint.window.ref, ring, length) if joint is not None else None

    @property
    def nbytes(self) -> int:
        return sum(h.nbytes for h in self.columns.values()) + (self.joint.nbytes if self.joint is not None else 0)

    def fold(self, start: float, windows: Mapping[str, ColumnWindow], joint: JointWindow | None, slot: int) -> None:
        """Add sub-window ``slot`` of every window, which started at ``start``, to the history."""
        for name, h in self.columns.items():
            w = windows[name]
            h.update(start, w.counts[slot], w.sums[slot] if w.sums is not None else None, int(w.missing[slot]))
        if self.joint is not None and joint is not None:
            w = joint.window
            self.joint.update(start, w.counts[slot], w.sums[slot] if w.sums is not None else None,
                              int(w.missing[slot]))

    def evaluate(self, windows: Mapping[str, ColumnWindow], joint: JointWindow | None, start: float, end: float,
                 settings: engine.Settings) -> engine.Evaluation:
        """Test the window ``[start, end)`` against the history one period earlier, then decide.

        A column whose past window is not held, or holds fewer than ``min_samples`` values, is scored
        against its profile for information, with status ``no_history`` and no test.
        """
        a, b = start - self.period, end - self.period
        results = []
        for name, w in windows.items():
            h = self.columns[name]
            past = h.reference(a, b)
            if past is None or past.count < settings.min_samples:
                res = engine.score(w.ref, w.summary, settings)
                res.status, res.p_value, res.missing_p_value = NO_HISTORY, None, None
            else:
                res = engine.score(past, h.coarse(w.summary), settings)
                res.feature = name
            results.append(res)
        jres = None
        if joint is not None and self.joint is not None:
            past = self.joint.reference(a, b)
            if past is None or not isinstance(past, NumericColumn) or past.count < settings.min_samples:
                jres = multivariate.score(joint.model, joint.model.errors, joint.summary, settings, status=NO_HISTORY)
            else:
                jres = joint.score(settings, past, self.joint.coarse(joint.summary))
        return engine.decide(results, settings, jres)

    def to_state(self) -> dict[str, Any]:
        return {"period": self.period, "columns": {n: h.to_state() for n, h in self.columns.items()},
                "joint": self.joint.to_state() if self.joint is not None else None}

    def restore(self, state: dict[str, Any]) -> None:
        """Take the saved histories of ``to_state()`` that fit this one (same columns, bins and slots).

        Raises:
            ValueError: the state does not fit (another period, other slots or other bins).
        """
        if state.get("period") != self.period:
            raise ValueError("the rolling period changed")
        saved = state.get("columns")
        if not isinstance(saved, dict) or set(saved) != set(self.columns):
            raise ValueError("the rolling history holds other columns")
        cols = {n: RollingColumn.from_state(saved[n]) for n in self.columns}
        joint = RollingColumn.from_state(state["joint"]) if state.get("joint") is not None else None
        for n, h in cols.items():
            if not _fits(h, self.columns[n]):
                raise ValueError(f"the rolling history of {n!r} has other bins or slots")
        if (joint is None) != (self.joint is None) or (joint is not None and self.joint is not None
                                                        and not _fits(joint, self.joint)):
            raise ValueError("the rolling history of the joint test does not fit")
        self.columns, self.joint = cols, joint


def _fits(a: RollingColumn, b: RollingColumn) -> bool:
    return (a.slots, a.slot_seconds, a.counts.shape) == (b.slots, b.slot_seconds, b.counts.shape) and \
        a.ref.to_json() == b.ref.to_json()


__all__ = ["RollingColumn", "History", "NO_HISTORY"]

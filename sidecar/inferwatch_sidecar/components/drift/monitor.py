"""The windows of one (model, version): a ring of sub-windows shared by its columns, and label accuracy.

A :class:`Monitor` owns one :class:`~inferwatch_sidecar.components.drift.window.ColumnWindow`
per reference column, rotates them together (by event count or by time), routes
each record's features, prediction and confidence to them, counts rows and
label results per sub-window, keeps the calibrated accuracy estimate when the
reference had labels (:mod:`.performance`), and scores the window with the engine. Without a
configured reference it first fills a :class:`~inferwatch_sidecar.components.drift.warmup.Warmup`.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from inferwatch_sidecar.components.drift import engine
from inferwatch_sidecar.components.drift.config import DriftConfig
from inferwatch_sidecar.components.drift.multivariate_window import JointWindow
from inferwatch_sidecar.components.drift.performance import PerformanceWindow
from inferwatch_sidecar.components.drift.profile import Profile
from inferwatch_sidecar.components.drift.rolling import History
from inferwatch_sidecar.components.drift.state import state_array
from inferwatch_sidecar.components.drift.warmup import Warmup
from inferwatch_sidecar.components.drift.window import ColumnWindow
from inferwatch_sidecar.stats.columns import to_float
from inferwatch_sidecar.stats.rows import float_rows

#: How a label reached its prediction (the ``result`` label of ``inferwatch_drift_labels_total``).
LABEL_RESULTS = ("joined", "inline", "unmatched", "expired")

log = logging.getLogger("inferwatch.sidecar.drift")


class ReferenceChanged(ValueError):
    """Saved windows were built against another reference profile than the configured one."""


class Monitor:
    """Windows, warm-up and label statistics of one (model, version).

    Args:
        key: (model, version).
        cfg: the drift config.
        profile: the reference, or None to build one from a warm-up.
        source: where the reference comes from: "file", "warmup", or "warming_up" while it is built.
    """

    def __init__(self, key: tuple[str, str], cfg: DriftConfig, profile: Profile | None, source: str) -> None:
        self.key = key
        self.cfg = cfg
        self.S = cfg.subwindows
        self.profile: Profile | None = None
        self.source = source
        self.columns: dict[str, ColumnWindow] = {}
        self.pred_col: str | None = None
        self.conf_col: str | None = None
        #: the calibrated accuracy estimate, when the reference had labels
        self.perf: PerformanceWindow | None = None
        self._rows = np.zeros(self.S, dtype=np.int64)
        self._labeled = np.zeros(self.S, dtype=np.int64)
        self._correct = np.zeros(self.S, dtype=np.int64)
        self._slot = 0
        self._slot_id = -1
        self.label_counts = dict.fromkeys(LABEL_RESULTS, 0)
        self.last: engine.Evaluation | None = None
        #: the comparison with the model's most-used version, set by :mod:`.canary`
        self.canary: dict[str, Any] | None = None
        self._warmup: Warmup | None = None
        self._warmup_cut = False
        #: the joint (multivariate) drift window, when the profile has a joint model
        self.joint: JointWindow | None = None
        #: in rolling mode, the history one period back (:mod:`.rolling`)
        self.history: History | None = None
        if profile is not None:
            self._set_profile(profile, source)
        else:
            self._warmup = Warmup(key, cfg)

    def _set_profile(self, p: Profile, source: str) -> None:
        self.profile = p
        self.source = source
        self.columns = {n: ColumnWindow(c, self.S) for n, c in p.columns.items()}
        self.pred_col = p.prediction.name if p.prediction is not None else None
        self.conf_col = p.confidence.name if p.confidence is not None else None
        self.perf = PerformanceWindow(p.performance, self.S) if p.performance is not None else None
        self.joint = JointWindow(p.multivariate, self.S) if p.multivariate is not None and self.cfg.multivariate \
            else None
        self.history = History(self.columns, self.joint, self.cfg.rolling_period_s, self.cfg.rolling_slots,
                              self.cfg.window_seconds) \
            if self.cfg.reference_mode == "rolling" else None
        self._warmup = None

    # -- windows --------------------------------------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        cfg = self.cfg
        if cfg.window_events is not None:
            per = max(1, cfg.window_events // self.S)
            if self._rows[self._slot] >= per:
                self._rotate(1)
            return
        sid = int(now // (cfg.window_seconds / self.S))
        if self._slot_id < 0:
            self._slot_id = sid
        elif sid > self._slot_id:
            if self.history is not None:
                self.history.fold(self._slot_id * (cfg.window_seconds / self.S), self.columns, self.joint, self._slot)
            self._rotate(min(sid - self._slot_id, self.S))
            self._slot_id = sid

    def _rotate(self, steps: int) -> None:
        for _ in range(steps):
            self._slot = (self._slot + 1) % self.S
            for c in self.columns.values():
                c.rotate()
            if self.perf is not None:
                self.perf.rotate()
            if self.joint is not None:
                self.joint.rotate()
            self._rows[self._slot] = 0
            self._labeled[self._slot] = 0
            self._correct[self._slot] = 0

    def ingest(self, recs: list[tuple[Any, ...]], now: float) -> None:
        """Add feature/prediction records (label-only ones are handled by the component)."""
        if self._warmup is not None:
            recs = self._warmup.feed(recs)
            if not self._warmup.done:
                return
            rows = self._warmup.rows
            self._warmup_cut = self._warmup.cut
            p = self._warmup.build()
            self._set_profile(p, "warmup")
            log.info("drift: warm-up reference built for model %r version %r from %d events (%d columns)%s",
                     self.key[0], self.key[1], rows, len(p.columns),
                     "; ended early on drift.max_warmup_bytes" if self._warmup_cut else "")
            if not recs:
                return
        if self.cfg.window_events is not None:
            # Count-based windows rotate between chunks so a sub-window holds about window_events / S rows.
            per = max(1, self.cfg.window_events // self.S)
            i = 0
            while i < len(recs):
                self._advance(now)
                room = max(1, per - int(self._rows[self._slot]))
                self._ingest_slot(recs[i:i + room])
                i += room
        else:
            self._advance(now)
            self._ingest_slot(recs)

    def _ingest_slot(self, recs: list[tuple[Any, ...]]) -> None:
        cols = self.columns
        self._rows[self._slot] += len(recs)
        groups: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[list[Any], list[Any]]] = {}
        preds: list[Any] = []
        confs: list[float] = []
        # Records of one schema object (nearly every batch) share its group: looked up again when it changes.
        last_schema: Any = None
        g_nums: list[Any] = []
        g_cats: list[Any] = []
        for r in recs:
            pred, conf = r[4], r[5]
            if pred is not None or conf is not None:
                # Feature-only records say nothing about the prediction's missing rate.
                preds.append(pred)
                confs.append(conf if conf.__class__ is float else to_float(conf))
            feats = r[7]
            if feats is not None:
                schema = feats[0]
                if schema is not last_schema:
                    g = groups.get((schema.numeric, schema.categorical))
                    if g is None:
                        g = groups[(schema.numeric, schema.categorical)] = ([], [])
                    g_nums, g_cats = g
                    last_schema = schema
                g_nums.append(feats[1])
                g_cats.append(feats[2])
        special = {self.pred_col, self.conf_col}
        for (num_names, cat_names), (nums, cats) in groups.items():
            n = len(nums)
            seen: set[str] = set()
            if num_names:
                mat = float_rows(nums, len(num_names))
                for j, name in enumerate(num_names):
                    cw = cols.get(name)
                    if cw is not None and name not in special and name not in seen:
                        cw.update(mat[:, j])
                        seen.add(name)
            for j, name in enumerate(cat_names):
                cw = cols.get(name)
                if cw is not None and name not in special and name not in seen:
                    cw.update([c[j] for c in cats])
                    seen.add(name)
            for name, cw in cols.items():
                if name not in seen and name not in special:
                    cw.add_missing(n)
            if self.joint is not None:
                self.joint.update(num_names, mat if num_names else None, cat_names, cats)
        if self.pred_col is not None and preds:
            cols[self.pred_col].update(preds)
        conf_arr = np.array(confs, dtype=np.float64)
        if self.conf_col is not None and confs:
            cols[self.conf_col].update(conf_arr)
        if self.perf is not None and preds:
            self.perf.update(preds, conf_arr)

    # -- labels ---------------------------------------------------------------------------------------------------

    def count_label(self, result: str, correct: bool | None = None) -> None:
        """Count a label by how it reached its prediction; a label that was scored adds to the accuracy."""
        self.label_counts[result] += 1
        if correct is not None:
            self._labeled[self._slot] += 1
            self._correct[self._slot] += int(correct)

    # -- results --------------------------------------------------------------------------------------------------

    @property
    def warmup_cut(self) -> bool:
        """Whether the warm-up ended on its byte share before ``warmup_events`` rows (see :mod:`.warmup`)."""
        return self._warmup_cut

    @property
    def reference_rows(self) -> int:
        """Events in the reference, or taken so far by the warm-up."""
        if self.profile is not None:
            return self.profile.rows
        return self._warmup.rows if self._warmup is not None else 0

    @property
    def window_rows(self) -> int:
        return int(self._rows.sum())

    @property
    def labeled_rows(self) -> int:
        """Events in the window whose label was scored."""
        return int(self._labeled.sum())

    @property
    def correct_rows(self) -> int:
        """Of those, the ones whose prediction was right."""
        return int(self._correct.sum())

    @property
    def nbytes(self) -> int:
        perf = self.perf.nbytes if self.perf is not None else 0
        extra = (self.joint.nbytes if self.joint is not None else 0) + (
            self.history.nbytes if self.history is not None else 0)
        return sum(c.nbytes for c in self.columns.values()) + 3 * self._rows.nbytes + perf + extra

    def evaluate(self, settings: engine.Settings) -> engine.Evaluation | None:
        if self.profile is None:
            return None
        if self.history is not None:
            end = (self._slot_id + 1) * (self.cfg.window_seconds / self.S)
            self.last = self.history.evaluate(self.columns, self.joint, end - self.cfg.window_seconds, end, settings)
        else:
            joint = self.joint.score(settings) if self.joint is not None else None
            self.last = engine.decide([c.score(settings) for c in self.columns.values()], settings, joint)
        return self.last

    # -- state ----------------------------------------------------------------------------------------------------

    def _restore_joint_and_history(self, state: dict[str, Any]) -> None:
        """Resume the joint window and the rolling history saved in ``state`` where they fit this monitor."""
        saved = state.get("joint")
        if self.joint is not None and saved is not None:
            joint = JointWindow.from_state(saved)
            if joint.model.to_json() == self.joint.model.to_json() and joint.window.slot == self._slot \
                    and joint.window.subwindows == self.S:
                self.joint = joint
            else:
                log.warning("drift: %s/%s: the saved joint window does not fit the reference; it starts over",
                            *self.key)
        hist = state.get("rolling")
        if self.history is not None:
            self.history = History(self.columns, self.joint, self.cfg.rolling_period_s, self.cfg.rolling_slots,
                              self.cfg.window_seconds)
            if hist is not None:
                try:
                    self.history.restore(hist)
                except ValueError as e:
                    log.warning("drift: %s/%s: %s; the rolling history starts over", self.key[0], self.key[1], e)

    def to_state(self) -> dict[str, Any]:
        """Plain-JSON state of a monitor whose reference is built (a warm-up in progress is not kept)."""
        if self.profile is None:
            raise ValueError(f"{self.key}: the warm-up reference is not built yet")
        return {
            "model": self.key[0], "version": self.key[1], "source": self.source, "slot": self._slot,
            "slot_id": self._slot_id, "rows": self._rows.tolist(), "labeled": self._labeled.tolist(),
            "correct": self._correct.tolist(), "labels": dict(self.label_counts),
            "reference_rows": self.profile.rows, "reference_created_unix": self.profile.created_unix,
            "columns": [c.to_state() for c in self.columns.values()],
            "performance": self.perf.to_state() if self.perf is not None else None,
            "joint": self.joint.to_state() if self.joint is not None else None,
            "rolling": self.history.to_state() if self.history is not None else None,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], cfg: DriftConfig, reference: Profile | None) -> Monitor:
        """Rebuild a monitor from ``to_state()``.

        Args:
            state: the saved state.
            cfg: the drift config (its window settings must be those the state was saved with).
            reference: the configured reference profile, if any. A monitor built against a file
                profile resumes only against the same columns, and then shares that profile.

        Raises:
            ReferenceChanged: the state was built against another file profile.
            ValueError: the state is malformed or does not fit ``cfg``.
        """
        key = (str(state["model"]), str(state["version"]))
        columns = [ColumnWindow.from_state(c) for c in state["columns"]]
        names = [c.ref.name for c in columns]
        if len(set(names)) != len(names):
            raise ValueError(f"columns of {key} appear twice")
        source = state["source"]
        if source == "file":
            if reference is None or [c.to_json() for c in reference.columns.values()] != [
                    c.ref.to_json() for c in columns]:
                raise ReferenceChanged(f"the saved windows of {key[0]}/{key[1]} were built against another reference")
            profile = reference
        elif source == "warmup":
            saved_joint = JointWindow.from_state(state["joint"]) if state.get("joint") is not None else None
            profile = Profile(columns={c.ref.name: c.ref for c in columns}, rows=int(state["reference_rows"]),
                              source=f"warm-up of {key[0]}/{key[1]} (checkpoint)",
                              created_unix=float(state["reference_created_unix"]),
                              multivariate=saved_joint.model if saved_joint is not None else None)
        else:
            raise ValueError(f"unknown reference source {source!r}")
        mon = cls(key, cfg, profile, source)
        mon._rows = state_array(state, "rows", np.int64, (mon.S,))
        mon._labeled = state_array(state, "labeled", np.int64, (mon.S,))
        mon._correct = state_array(state, "correct", np.int64, (mon.S,))
        mon._slot, mon._slot_id = int(state["slot"]), int(state["slot_id"])
        if not 0 <= mon._slot < mon.S or any((c.slot, c.subwindows) != (mon._slot, mon.S) for c in columns):
            raise ValueError("ring position out of range")
        mon.columns = dict(zip(names, columns, strict=True))
        mon.label_counts.update({k: int(v) for k, v in state["labels"].items() if k in mon.label_counts})
        mon._restore_joint_and_history(state)
        saved = state.get("performance")
        if mon.perf is not None and saved is not None:
            try:
                mon.perf = PerformanceWindow.from_state(saved, mon.perf.performance)
            except ValueError as e:
                # The columns match but the calibration was refitted: the estimate restarts, the drift windows stay.
                log.warning("drift: %s/%s: %s; the accuracy estimate starts over", key[0], key[1], e)
        return mon

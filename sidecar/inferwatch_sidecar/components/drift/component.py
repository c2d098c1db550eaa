"""The sidecar's drift component: streaming windows per model version, evaluated off the ingest path.

Data flow:

1. ``handle`` (ingest thread) appends the decoded EV_RECORD tuples to a
   bounded staging list under a lock held for one ``list.extend``. Nothing
   else happens there, so it costs well under a microsecond per record.
2. The component's own thread drains the staging list every
   ``evaluate_interval_s / 5`` seconds (at most 1 s): records are grouped by
   model version and feature schema, values are binned with numpy against
   the reference bins and added to the current sub-window of a fixed-size
   ring. Labels are joined to their predictions here.
3. Every ``evaluate_interval_s`` the thread scores every window with the
   engine (:mod:`inferwatch_sidecar.components.drift.engine`), then builds a snapshot
   of metric samples. ``collect`` only turns that snapshot into metric
   families, so a scrape never waits for statistics.

State per feature is a ring of ``subwindows`` x ``bins`` counts (int32) and
sums (float32) plus the reference summary: about 11 KB with the defaults,
whatever the traffic. A warm-up reference holds its first
``warmup_events`` raw values transiently until the profile is built.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np

from inferwatch._wire import EV_RECORD
from inferwatch_sidecar.components.base import AdminHandler, ComponentContext
from inferwatch_sidecar.components.drift import engine
from inferwatch_sidecar.components.drift import profile as prof
from inferwatch_sidecar.components.drift.config import DriftConfig
from inferwatch_sidecar.components.drift.profile import CategoricalColumn, Column, NumericColumn, Profile, canon

PRED = "__prediction__"
CONF = "__confidence__"
MAX_UNSEEN = 16
#: Distinct predicted values at most this many (and integral) make a warm-up prediction categorical.
MAX_WARMUP_CLASSES = 32

log = logging.getLogger("inferwatch.sidecar.drift")


def _f(v: Any) -> float:
    if v is None:
        return math.nan
    if type(v) is float:
        return v
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


class ColumnWindow:
    """A ring of sub-window summaries for one column against its reference bins."""

    __slots__ = ("ref", "counts", "sums", "missing", "cum", "unseen")

    def __init__(self, ref: Column, subwindows: int) -> None:
        self.ref = ref
        nb = ref.n_bins
        self.counts = np.zeros((subwindows, nb), dtype=np.int32)
        self.sums = np.zeros((subwindows, nb), dtype=np.float32) if isinstance(ref, NumericColumn) else None
        self.missing = np.zeros(subwindows, dtype=np.int64)
        n_export = ref.n_psi_bins if isinstance(ref, NumericColumn) else nb
        #: cumulative counts per exported bin (PSI bins / categories), for the fleet-wide recording rules
        self.cum = np.zeros(n_export, dtype=np.int64)
        #: categories outside the reference's top-K seen since the ring last wrapped (bounded)
        self.unseen: dict[str, int] = {}

    def clear_slot(self, s: int) -> None:
        self.counts[s] = 0
        if self.sums is not None:
            self.sums[s] = 0
        self.missing[s] = 0

    def add_numeric(self, slot: int, values: np.ndarray) -> None:
        ref = self.ref
        if isinstance(ref, NumericColumn):
            counts, sums, miss = ref.bin(values)
            self.counts[slot] += counts.astype(np.int32)
            assert self.sums is not None
            self.sums[slot] += sums.astype(np.float32)
            self.missing[slot] += miss
            self.cum += np.bincount(ref.psi_map, weights=counts, minlength=self.cum.size).astype(np.int64)
        else:
            self.add_categorical(slot, [canon(v) for v in values.tolist()])

    def add_categorical(self, slot: int, values: list[Any]) -> None:
        ref = self.ref
        if isinstance(ref, NumericColumn):
            self.add_numeric(slot, np.array([_f(v) for v in values], dtype=np.float64))
            return
        s = engine.summarize_categorical(ref, values, max_unseen=MAX_UNSEEN)
        c = s.counts.astype(np.int64)
        self.counts[slot] += c.astype(np.int32)
        self.missing[slot] += s.missing
        self.cum += c
        for k, n in s.unseen.items():
            if k in self.unseen:
                self.unseen[k] += n
            elif len(self.unseen) < MAX_UNSEEN:
                self.unseen[k[:64]] = n

    def add_missing(self, slot: int, n: int) -> None:
        self.missing[slot] += n

    def summary(self, slots: Any = None) -> engine.Summary:
        counts = self.counts.sum(axis=0, dtype=np.int64).astype(np.float64)
        sums = self.sums.sum(axis=0, dtype=np.float64) if self.sums is not None else None
        return engine.Summary(counts=counts, sums=sums, missing=int(self.missing.sum()), unseen=dict(self.unseen))

    @property
    def nbytes(self) -> int:
        n = self.counts.nbytes + self.missing.nbytes + self.cum.nbytes
        if self.sums is not None:
            n += self.sums.nbytes
        ref = self.ref
        if isinstance(ref, NumericColumn):
            n += ref.edges.nbytes + ref.counts.nbytes + ref.bin_means.nbytes + ref.psi_edges.nbytes + ref.psi_map.nbytes
        else:
            n += ref.counts.nbytes + sum(len(c) + 8 for c in ref.categories)
        n += sum(len(k) + 8 for k in self.unseen)
        return n


class Monitor:
    """Windows, warm-up and label statistics of one (model, version)."""

    def __init__(self, key: tuple[str, str], cfg: DriftConfig, profile: Profile | None, source: str) -> None:
        self.key = key
        self.cfg = cfg
        self.S = cfg.subwindows
        self.profile: Profile | None = None
        self.source = source
        self.columns: dict[str, ColumnWindow] = {}
        self.pred_col: str | None = None
        self.conf_col: str | None = None
        self.rows = np.zeros(self.S, dtype=np.int64)
        self.labeled = np.zeros(self.S, dtype=np.int64)
        self.correct = np.zeros(self.S, dtype=np.int64)
        self.slot = 0
        self.slot_id = -1
        self.label_counts = {"joined": 0, "inline": 0, "unmatched": 0, "expired": 0}
        self.last: engine.Evaluation | None = None
        self.canary: dict[str, Any] | None = None
        # warm-up buffers: name -> list of raw values
        self.warm_rows = 0
        self.warm_num: dict[str, list[float]] = {}
        self.warm_cat: dict[str, list[Any]] = {}
        self.warm_pred: list[Any] = []
        self.warm_conf: list[float] = []
        if profile is not None:
            self.set_profile(profile, source)

    # -- reference --------------------------------------------------------------------------------------------------

    def set_profile(self, p: Profile, source: str) -> None:
        self.profile = p
        self.source = source
        self.columns = {n: ColumnWindow(c, self.S) for n, c in p.columns.items()}
        self.pred_col = p.prediction.name if p.prediction is not None else None
        self.conf_col = p.confidence.name if p.confidence is not None else None
        self.warm_num, self.warm_cat, self.warm_pred, self.warm_conf = {}, {}, [], []

    def _warm(self, recs: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """Feed warm-up buffers; return the records left over once the reference is built."""
        cfg = self.cfg
        need = cfg.warmup_events - self.warm_rows
        take, rest = recs[:need], recs[need:]
        for r in take:
            n = self.warm_rows
            feats = r[7]
            if feats is not None:
                schema, nums, cats = feats
                for name, v in zip(schema.numeric, nums, strict=False):
                    col = self.warm_num.get(name)
                    if col is None:
                        if name in self.warm_cat or len(self.warm_num) + len(self.warm_cat) >= cfg.max_features:
                            continue
                        col = self.warm_num[name] = [math.nan] * n
                    col.append(v)
                for name, v in zip(schema.categorical, cats, strict=False):
                    ccol = self.warm_cat.get(name)
                    if ccol is None:
                        if name in self.warm_num or len(self.warm_num) + len(self.warm_cat) >= cfg.max_features:
                            continue
                        ccol = self.warm_cat[name] = [None] * n
                    ccol.append(v)
            self.warm_pred.append(r[4])
            self.warm_conf.append(_f(r[5]))
            self.warm_rows = n + 1
            # Features absent from this record are missing in it.
            for col in self.warm_num.values():
                if len(col) < self.warm_rows:
                    col.append(math.nan)
            for ccol in self.warm_cat.values():
                if len(ccol) < self.warm_rows:
                    ccol.append(None)
        if self.warm_rows >= cfg.warmup_events:
            self._build_warmup()
            return rest
        return []

    def _build_warmup(self) -> None:
        cfg = self.cfg
        numeric = {k: np.array(v, dtype=np.float64) for k, v in self.warm_num.items()}
        categorical: dict[str, list[Any]] = dict(self.warm_cat)
        preds = [p for p in self.warm_pred if p is not None]
        pred_name = conf_name = None
        if preds:
            pred_name = PRED
            fl = [p for p in preds if type(p) is float]
            if len(fl) == len(preds) and not (
                all(math.isfinite(x) and x.is_integer() for x in fl) and len(set(fl)) <= MAX_WARMUP_CLASSES
            ):
                numeric[PRED] = np.array([_f(p) for p in self.warm_pred], dtype=np.float64)
            else:
                categorical[PRED] = [canon(p) for p in self.warm_pred]
        conf = np.array(self.warm_conf, dtype=np.float64)
        if np.isfinite(conf).any():
            conf_name = CONF
            numeric[CONF] = conf
        order = [*self.warm_num, *self.warm_cat, *[n for n in (PRED, CONF) if n in numeric or n in categorical]]
        p = prof.build(numeric, categorical, prediction=pred_name, confidence=conf_name, bins=cfg.bins,
                       top_k=cfg.top_k, source=f"warm-up of {self.key[0]}/{self.key[1]}", order=order)
        self.set_profile(p, "warmup")
        log.info("drift: warm-up reference built for model %r version %r from %d events (%d columns)",
                 self.key[0], self.key[1], self.warm_rows, len(p.columns))

    # -- windows --------------------------------------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        cfg = self.cfg
        if cfg.window_events is not None:
            per = max(1, cfg.window_events // self.S)
            if self.rows[self.slot] >= per:
                self._rotate(1)
            return
        sid = int(now // (cfg.window_seconds / self.S))
        if self.slot_id < 0:
            self.slot_id = sid
        elif sid > self.slot_id:
            self._rotate(min(sid - self.slot_id, self.S))
            self.slot_id = sid

    def _rotate(self, steps: int) -> None:
        for _ in range(steps):
            self.slot = (self.slot + 1) % self.S
            for c in self.columns.values():
                c.clear_slot(self.slot)
            self.rows[self.slot] = 0
            self.labeled[self.slot] = 0
            self.correct[self.slot] = 0
            if self.slot == 0:
                for c in self.columns.values():
                    c.unseen.clear()

    def ingest(self, recs: list[tuple[Any, ...]], now: float) -> None:
        """Add feature/prediction records (label-only ones are handled by the component)."""
        if self.profile is None:
            recs = self._warm(recs)
            if not recs:
                return
        if self.cfg.window_events is not None:
            # Count-based windows rotate between chunks so a sub-window holds about window_events / S rows.
            per = max(1, self.cfg.window_events // self.S)
            i = 0
            while i < len(recs):
                self._advance(now)
                room = max(1, per - int(self.rows[self.slot]))
                self._ingest_slot(recs[i:i + room])
                i += room
        else:
            self._advance(now)
            self._ingest_slot(recs)

    def _ingest_slot(self, recs: list[tuple[Any, ...]]) -> None:
        slot = self.slot
        cols = self.columns
        self.rows[slot] += len(recs)
        groups: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[list[Any], list[Any]]] = {}
        preds: list[Any] = []
        confs: list[float] = []
        for r in recs:
            if r[4] is not None or r[5] is not None:
                # Feature-only records say nothing about the prediction's missing rate.
                preds.append(r[4])
                confs.append(_f(r[5]))
            feats = r[7]
            if feats is not None:
                schema = feats[0]
                g = groups.get((schema.numeric, schema.categorical))
                if g is None:
                    g = groups[(schema.numeric, schema.categorical)] = ([], [])
                g[0].append(feats[1])
                g[1].append(feats[2])
        special = {self.pred_col, self.conf_col}
        for (num_names, cat_names), (nums, cats) in groups.items():
            n = len(nums)
            seen: set[str] = set()
            if num_names:
                mat = np.array(nums, dtype=np.float64).reshape(n, len(num_names))
                for j, name in enumerate(num_names):
                    cw = cols.get(name)
                    if cw is not None and name not in special and name not in seen:
                        cw.add_numeric(slot, mat[:, j])
                        seen.add(name)
            for j, name in enumerate(cat_names):
                cw = cols.get(name)
                if cw is not None and name not in special and name not in seen:
                    cw.add_categorical(slot, [c[j] for c in cats])
                    seen.add(name)
            for name, cw in cols.items():
                if name not in seen and name not in special:
                    cw.add_missing(slot, n)
        if self.pred_col is not None and preds:
            pc = cols[self.pred_col]
            if isinstance(pc.ref, NumericColumn):
                pc.add_numeric(slot, np.array([_f(p) for p in preds], dtype=np.float64))
            else:
                pc.add_categorical(slot, preds)
        if self.conf_col is not None and confs:
            cols[self.conf_col].add_numeric(slot, np.array(confs, dtype=np.float64))

    def add_label_result(self, correct: bool) -> None:
        self.labeled[self.slot] += 1
        self.correct[self.slot] += int(correct)

    @property
    def window_rows(self) -> int:
        return int(self.rows.sum())

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.columns.values()) + 3 * self.rows.nbytes

    def evaluate(self, settings: engine.Settings) -> engine.Evaluation | None:
        if self.profile is None:
            return None
        sums = {n: c.summary() for n, c in self.columns.items()}
        self.last = engine.evaluate(self.profile, sums, settings)
        return self.last


def _pseudo_reference(cw: ColumnWindow) -> Column:
    """A window's bins as a reference column (for canary comparisons between versions)."""
    ref = cw.ref
    s = cw.summary()
    if isinstance(ref, NumericColumn):
        assert s.sums is not None
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(s.counts > 0, s.sums / np.where(s.counts > 0, s.counts, 1), 0.0)
        return NumericColumn(name=ref.name, role=ref.role, count=int(s.counts.sum()), missing=s.missing,
                             mean=ref.mean, std=ref.std, min=ref.min, max=ref.max, edges=ref.edges,
                             counts=s.counts, bin_means=means, psi_edges=ref.psi_edges)
    return CategoricalColumn(name=ref.name, role=ref.role, count=int(s.counts.sum()), missing=s.missing,
                             categories=ref.categories, counts=s.counts)


class DriftComponent:
    """The ``drift`` sidecar component (see the module docstring)."""

    name = "drift"
    record_types = frozenset({EV_RECORD})

    def __init__(self, config: DriftConfig, ctx: ComponentContext, profile: Profile | None = None) -> None:
        self.cfg = config
        self.ctx = ctx
        self.profile = profile
        self.settings = engine.Settings(
            alpha=config.alpha, numeric_effect_floor=config.numeric_effect_floor,
            categorical_effect_floor=config.categorical_effect_floor, missing_floor=config.missing_floor,
            min_samples=config.min_samples, drift_share=config.drift_share, correction=config.correction,
        )
        self._lock = threading.Lock()
        self._staged: list[tuple[Any, ...]] = []
        self._state_lock = threading.Lock()
        self.monitors: dict[tuple[str, str], Monitor] = {}
        self._pending: OrderedDict[str, tuple[tuple[str, str], str | None, float]] = OrderedDict()
        self.dropped: dict[str, int] = {"staging_full": 0, "too_many_models": 0, "error": 0}
        self._snapshot: dict[str, list[tuple[tuple[str, ...], float]]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_eval_unix: float | None = None
        self.last_eval_seconds = 0.0
        self.last_checkpoint_unix: float | None = None
        self.restored_from: str | None = None

    # -- ingest thread --------------------------------------------------------------------------------------------

    def handle(self, pid: int, producer_id: int, records: list[tuple[Any, ...]]) -> None:
        """Stage records for the evaluator thread. Cheap, bounded, never raises."""
        try:
            with self._lock:
                room = self.cfg.max_staged - len(self._staged)
                if room >= len(records):
                    self._staged.extend(records)
                else:
                    if room > 0:
                        self._staged.extend(records[:room])
                    self.dropped["staging_full"] += len(records) - max(room, 0)
        except Exception:  # pragma: no cover - defensive: the ingest thread must survive
            self.dropped["error"] += 1

    # -- evaluator thread -------------------------------------------------------------------------------------------

    def drain(self, now: float | None = None) -> int:
        """Move staged records into the windows; returns how many were processed."""
        with self._lock:
            batch, self._staged = self._staged, []
        if not batch:
            self._expire_labels()
            return 0
        now = self.ctx.clock() if now is None else now
        by_key: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
        labels: list[tuple[Any, ...]] = []
        new_keys = 0
        with self._state_lock:
            for r in batch:
                try:
                    if r[0] != EV_RECORD:
                        continue
                    ctx = r[1]
                    key = (ctx[1] or "", ctx[2] or "")
                    if r[4] is None and r[7] is None:
                        if r[6] is not None:
                            labels.append(r)
                        continue
                    lst = by_key.get(key)
                    if lst is None:
                        if key not in self.monitors:
                            if new_keys >= self.cfg.max_models - len(self.monitors):
                                self.dropped["too_many_models"] += 1
                                continue
                            new_keys += 1
                        lst = by_key[key] = []
                    lst.append(r)
                except Exception:
                    self.dropped["error"] += 1
            for key, recs in by_key.items():
                mon = self.monitors.get(key)
                if mon is None:
                    mon = self.monitors[key] = Monitor(key, self.cfg, self.profile,
                                                       "file" if self.profile is not None else "warming_up")
                try:
                    mon.ingest(recs, now)
                    self._track_predictions(mon, recs)
                except Exception:
                    log.exception("drift: failed to ingest %d records for %s", len(recs), key)
                    self.dropped["error"] += len(recs)
            for r in labels:
                self._join_label(r)
            self._expire_labels()
        return len(batch)

    def _track_predictions(self, mon: Monitor, recs: list[tuple[Any, ...]]) -> None:
        cap = self.cfg.max_pending_labels
        mono = self.ctx.monotonic()
        for r in recs:
            pred, rid, label = r[4], r[3], r[6]
            if pred is None:
                continue
            if label is not None:
                mon.label_counts["inline"] += 1
                mon.add_label_result(canon(pred) == canon(label))
            elif rid is not None and cap > 0:
                self._pending[rid] = (mon.key, canon(pred), mono)
                self._pending.move_to_end(rid)
                if len(self._pending) > cap:
                    _, (k, _, _) = self._pending.popitem(last=False)
                    m = self.monitors.get(k)
                    if m is not None:
                        m.label_counts["expired"] += 1

    def _join_label(self, r: tuple[Any, ...]) -> None:
        rid = r[3]
        ctx = r[1]
        key = (ctx[1] or "", ctx[2] or "")
        got = self._pending.pop(rid, None) if rid is not None else None
        if got is None:
            mon = self.monitors.get(key)
            if mon is None:
                # A label for a model version we never saw: count it against the first matching model.
                mon = next((m for k, m in self.monitors.items() if k[0] == key[0]), None)
            if mon is not None:
                mon.label_counts["unmatched"] += 1
            else:
                self.dropped["unmatched_label"] = self.dropped.get("unmatched_label", 0) + 1
            return
        mkey, pred, _ = got
        mon = self.monitors.get(mkey)
        if mon is not None:
            mon.label_counts["joined"] += 1
            mon.add_label_result(pred == canon(r[6]))

    def _expire_labels(self) -> None:
        if not self._pending:
            return
        limit = self.ctx.monotonic() - self.cfg.label_ttl_s
        while self._pending:
            rid, (k, _, t) = next(iter(self._pending.items()))
            if t > limit:
                break
            self._pending.popitem(last=False)
            m = self.monitors.get(k)
            if m is not None:
                m.label_counts["expired"] += 1

    def evaluate(self) -> None:
        """Score every window, compare canaries, and publish a metrics snapshot."""
        t0 = time.perf_counter()
        with self._state_lock:
            for mon in self.monitors.values():
                try:
                    mon.evaluate(self.settings)
                except Exception:
                    log.exception("drift: evaluation failed for %s", mon.key)
            self._compare_canaries()
            snap = self._build_snapshot()
        self.last_eval_seconds = time.perf_counter() - t0
        self.last_eval_unix = self.ctx.clock()
        snap["inferwatch_drift_evaluation_duration_seconds"] = [((), self.last_eval_seconds)]
        snap["inferwatch_drift_last_evaluation_timestamp_seconds"] = [((), self.last_eval_unix)]
        with self._lock:
            self._snapshot = snap

    def _compare_canaries(self) -> None:
        by_model: dict[str, list[Monitor]] = {}
        for mon in self.monitors.values():
            mon.canary = None
            if mon.profile is not None and mon.window_rows >= self.settings.min_samples:
                by_model.setdefault(mon.key[0], []).append(mon)
        for mons in by_model.values():
            if len(mons) < 2:
                continue
            base = max(mons, key=lambda m: (m.window_rows, m.key[1]))
            for mon in mons:
                # Versions share bins only when they share a reference (the configured profile).
                if mon is base or mon.profile is not base.profile:
                    continue
                results = [engine.score(_pseudo_reference(base.columns[n]), mon.columns[n].summary(), self.settings)
                           for n in mon.columns]
                ev = engine.decide(results, self.settings)
                # A canary's predictions and confidence matter as much as its inputs: its share counts
                # every column (exported with the feature label like the inputs).
                ev.n_features = len(results)
                ev.n_drifted = sum(r.drifted for r in results)
                ev.share_drifted = ev.n_drifted / ev.n_features if results else 0.0
                mon.canary = {"baseline_version": base.key[1], "evaluation": ev}

    # -- export -----------------------------------------------------------------------------------------------------

    def _build_snapshot(self) -> dict[str, list[tuple[tuple[str, ...], float]]]:
        # The core metrics' limiter names, so a model version counts once against one budget.
        lim_m, lim_v = self.ctx.limiter("model"), self.ctx.limiter("model_version")
        lim_f = self.ctx.limiter("feature")
        out: dict[str, list[tuple[tuple[str, ...], float]]] = {}

        def put(name: str, labels: tuple[str, ...], value: float | None) -> None:
            if value is None or not math.isfinite(value):
                return
            out.setdefault(name, []).append((labels, float(value)))

        for name, n in self.dropped.items():
            put("inferwatch_drift_dropped_records_total", (name,), n)
        for mon in self.monitors.values():
            mv = (lim_m.get(mon.key[0]), lim_v.get(mon.key[1]))
            ref_n = mon.profile.rows if mon.profile is not None else mon.warm_rows
            put("inferwatch_drift_reference_events", (*mv, mon.source), ref_n)
            put("inferwatch_drift_window_events", mv, mon.window_rows)
            put("inferwatch_drift_state_bytes", mv, mon.nbytes)
            for res, n in mon.label_counts.items():
                put("inferwatch_drift_labels_total", (*mv, res), n)
            labeled = int(mon.labeled.sum())
            put("inferwatch_drift_labeled_events", mv, labeled)
            if labeled:
                put("inferwatch_drift_accuracy_ratio", mv, mon.correct.sum() / labeled)
            for cname, cw in mon.columns.items():
                fl = (*mv, lim_f.get(cname))
                for b, n in enumerate(cw.cum.tolist()):
                    put("inferwatch_drift_bin_events_total", (*fl, str(b)), n)
                ref = cw.ref
                rc = np.bincount(ref.psi_map, weights=ref.counts, minlength=ref.n_psi_bins) \
                    if isinstance(ref, NumericColumn) else ref.counts
                tot = rc.sum()
                for b, n in enumerate(rc.tolist()):
                    put("inferwatch_drift_reference_bin_ratio", (*fl, str(b)), n / tot if tot else 0.0)
            ev = mon.last
            if ev is not None:
                put("inferwatch_drift_dataset_drifted_ratio", mv, ev.share_drifted)
                put("inferwatch_drift_dataset_drifted", mv, float(ev.dataset_drift))
                for r in ev.results:
                    fl = (*mv, lim_f.get(r.feature))
                    put("inferwatch_drift_feature_statistic", (*fl, r.test), r.statistic)
                    put("inferwatch_drift_feature_p_value", fl, r.p_value)
                    put("inferwatch_drift_feature_adjusted_p_value", fl, r.p_adjusted)
                    put("inferwatch_drift_feature_score", (*fl, r.effect_name), r.effect)
                    if r.effect_name != "psi":
                        put("inferwatch_drift_feature_score", (*fl, "psi"), r.psi)
                    put("inferwatch_drift_feature_score", (*fl, "jensen_shannon"), r.jensen_shannon)
                    put("inferwatch_drift_feature_drifted", fl, float(r.drifted))
                    put("inferwatch_drift_feature_missing_ratio", (*fl, "current"), r.missing_current)
                    put("inferwatch_drift_feature_missing_ratio", (*fl, "reference"), r.missing_reference)
                    if r.kind == "categorical":
                        put("inferwatch_drift_feature_unseen_categories", fl, len(r.unseen))
                    if r.role == "confidence":
                        put("inferwatch_drift_confidence_mean", (*mv, "current"), r.mean_current)
                        put("inferwatch_drift_confidence_mean", (*mv, "reference"), r.mean_reference)
                        # CBPE: with calibrated confidences, E[accuracy] = E[confidence of the predicted class].
                        put("inferwatch_drift_estimated_accuracy_ratio", mv, r.mean_current)
            if mon.pred_col is not None:
                cw = mon.columns[mon.pred_col]
                if isinstance(cw.ref, CategoricalColumn):
                    s = cw.summary()
                    tot = s.counts.sum()
                    if tot:
                        lim_c = self.ctx.limiter("class")
                        for i, cat in enumerate([*cw.ref.categories, "__other__"]):
                            put("inferwatch_drift_prediction_class_ratio", (*mv, lim_c.get(cat)), s.counts[i] / tot)
            if mon.canary is not None:
                bv = lim_v.get(mon.canary["baseline_version"])
                cev: engine.Evaluation = mon.canary["evaluation"]
                put("inferwatch_drift_canary_drifted_ratio", (*mv, bv), cev.share_drifted)
                for r in cev.results:
                    put("inferwatch_drift_canary_feature_drifted", (*mv, lim_f.get(r.feature), bv), float(r.drifted))
        return out

    def collect(self) -> Iterable[Any]:
        """Metric families from the last evaluation's snapshot (cheap; no statistics at scrape time)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from inferwatch_sidecar.metrics.drift import METRICS

        with self._lock:
            snap = self._snapshot
        for m in METRICS:
            samples = snap.get(m.name)
            if not samples:
                continue
            if m.type == "counter":
                fam: Any = CounterMetricFamily(m.family, m.help, labels=m.labels)
            else:
                fam = GaugeMetricFamily(m.name, m.help, labels=m.labels)
            for labels, v in samples:
                fam.add_metric(list(labels), v)
            yield fam

    # -- status -------------------------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        cfg = self.cfg
        models = []
        with self._state_lock:
            for mon in self.monitors.values():
                d: dict[str, Any] = {
                    "model": mon.key[0], "version": mon.key[1],
                    "reference": {"source": mon.source,
                                  "path": cfg.reference if mon.source == "file" else None,
                                  "events": mon.profile.rows if mon.profile is not None else mon.warm_rows,
                                  "warmup_target": cfg.warmup_events if mon.source != "file" else None},
                    "window": {"events": mon.window_rows, "subwindows": mon.S,
                               "seconds": None if cfg.window_events else cfg.window_seconds,
                               "max_events": cfg.window_events, "state_bytes": mon.nbytes},
                    "labels": dict(mon.label_counts),
                }
                if mon.last is not None:
                    ev = mon.last
                    d["dataset_drift"] = ev.dataset_drift
                    d["share_drifted"] = ev.share_drifted
                    d["features"] = [
                        {k: r.to_json()[k] for k in ("feature", "role", "test", "statistic", "p_value", "p_adjusted",
                                                     "effect_name", "effect", "drifted", "status", "n_current",
                                                     "missing_current", "unseen")}
                        for r in ev.results
                    ]
                if mon.canary is not None:
                    d["canary"] = {"baseline_version": mon.canary["baseline_version"],
                                   "share_drifted": mon.canary["evaluation"].share_drifted,
                                   "drifted": [r.feature for r in mon.canary["evaluation"].results if r.drifted]}
                models.append(d)
        return {
            "reference": {"source": "file" if self.profile is not None else "warm-up",
                          "path": cfg.reference, "warmup_events": cfg.warmup_events},
            "evaluate_interval_s": cfg.evaluate_interval_s,
            "last_evaluation_unix": self.last_eval_unix,
            "last_evaluation_seconds": self.last_eval_seconds,
            "last_checkpoint_unix": self.last_checkpoint_unix,
            "restored_from_checkpoint": self.restored_from,
            "staged": len(self._staged),
            "pending_labels": len(self._pending),
            "dropped": dict(self.dropped),
            "models": models,
        }

    # -- lifecycle ----------------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self.cfg.checkpoint_path:
            from inferwatch_sidecar.components.drift import checkpoint

            checkpoint.restore(self, self.cfg.checkpoint_path)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="inferwatch-drift", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        cfg = self.cfg
        tick = min(1.0, cfg.evaluate_interval_s / 5)
        next_eval = time.monotonic() + cfg.evaluate_interval_s
        next_ckpt = time.monotonic() + cfg.checkpoint_interval_s
        while not self._stop.wait(tick):
            try:
                self.drain()
                now = time.monotonic()
                if now >= next_eval:
                    next_eval = now + cfg.evaluate_interval_s
                    self.evaluate()
                if cfg.checkpoint_path and now >= next_ckpt:
                    next_ckpt = now + cfg.checkpoint_interval_s
                    self.checkpoint()
            except Exception:
                log.exception("drift: evaluator loop error")

    def checkpoint(self) -> None:
        if not self.cfg.checkpoint_path:
            return
        from inferwatch_sidecar.components.drift import checkpoint

        try:
            with self._state_lock:
                checkpoint.save(self, self.cfg.checkpoint_path)
            self.last_checkpoint_unix = self.ctx.clock()
        except OSError as e:
            log.warning("drift: cannot write checkpoint %s: %s", self.cfg.checkpoint_path, e)

    def stop(self, timeout: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        try:
            self.drain()
            self.checkpoint()
        except Exception:
            log.exception("drift: final drain/checkpoint failed")

    def admin_routes(self) -> dict[str, AdminHandler]:
        from inferwatch_sidecar.components.drift import report

        return {"report": lambda q: report.admin_report(self, q)}


def build(config: DriftConfig, ctx: ComponentContext) -> DriftComponent:
    """Build the drift component. A bad reference profile raises ``ProfileError`` with what to fix."""
    profile = None
    if config.reference:
        profile = prof.load(config.reference)
        if not profile.features and profile.prediction is None and profile.confidence is None:
            raise prof.ProfileError(f"reference profile {config.reference}: it has no columns to monitor")
    return DriftComponent(config, ctx, profile)


__all__ = ["DriftComponent", "build", "PRED", "CONF"]

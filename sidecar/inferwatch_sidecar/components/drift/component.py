"""The sidecar's drift component: streaming windows per model version, evaluated off the ingest path.

Data flow:

1. ``handle`` (ingest thread) appends the decoded EV_RECORD tuples to a
   bounded staging list under a lock held for one ``list.extend``. Nothing
   else happens there, so it costs well under a microsecond per record.
2. The component's own thread (a :class:`~inferwatch_sidecar.components.worker.PeriodicWorker`)
   drains the staging list every ``evaluate_interval_s / 5`` seconds (at most
   1 s): records are grouped by model version into its
   :class:`~inferwatch_sidecar.components.drift.monitor.Monitor`, which bins
   them into its column windows (:mod:`.window`), after a warm-up
   (:mod:`.warmup`) when no reference profile is configured. Labels are joined
   to their predictions here (:mod:`.labels`).
3. Every ``evaluate_interval_s`` the thread scores every window with the
   engine (:mod:`inferwatch_sidecar.components.drift.engine`), compares canary
   versions (:mod:`.canary`), then builds a snapshot of metric samples
   (:mod:`.snapshot`). ``collect`` only turns that snapshot into metric
   families, so a scrape never waits for statistics.
4. Every ``checkpoint_interval_s`` and at shutdown the windows are saved
   (:mod:`.checkpoint`); ``start`` resumes from them. A checkpoint that cannot
   be written or read back is counted by reason, and exported at once by
   ``collect``, not with the next snapshot.

State per feature is a ring of ``subwindows`` x ``bins`` counts (int32) and
sums (float32) plus the reference summary: about 11 KB with the defaults,
whatever the traffic. A warm-up reference holds its first
``warmup_events`` raw values transiently until the profile is built.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from inferwatch.wire import EV_RECORD, Schema
from inferwatch_sidecar.components.base import AdminHandler, ComponentContext
from inferwatch_sidecar.components.drift import checkpoint, engine, performance, report
from inferwatch_sidecar.components.drift import profile as prof
from inferwatch_sidecar.components.drift.canary import compare_canaries
from inferwatch_sidecar.components.drift.config import DriftConfig
from inferwatch_sidecar.components.drift.labels import LabelJoiner
from inferwatch_sidecar.components.drift.monitor import Monitor
from inferwatch_sidecar.components.drift.profile import Profile
from inferwatch_sidecar.components.drift.snapshot import build_snapshot
from inferwatch_sidecar.components.drift.warmup import CONF, PRED
from inferwatch_sidecar.components.periodic import REAL_TIME, StagedComponent
from inferwatch_sidecar.metrics.drift import (
    DRIFT_CHECKPOINT_FAILURES_TOTAL,
    DRIFT_ESTIMATED_ACCURACY_RATIO,
    DRIFT_EVALUATION_DURATION_SECONDS,
    DRIFT_LAST_EVALUATION_TIMESTAMP_SECONDS,
    METRICS,
)
from inferwatch_sidecar.metrics.samples import Samples

log = logging.getLogger("inferwatch.sidecar.drift")
#: Modules this component imports only where it first computes (scipy: 26-72 MiB that an idle sidecar need not
#: hold); start-up checks that they are installed (daemon/wiring.py), so a missing one is named at start.
LAZY_IMPORTS = ("scipy",)
#: No event's ctx (the identity check's start value in :meth:`DriftComponent.absorb`).
_NO_CTX = object()


class DriftComponent(StagedComponent):
    """The ``drift`` sidecar component (see the module docstring)."""

    name = "drift"
    record_types = frozenset({EV_RECORD})
    metrics = METRICS
    drop_reasons = ("staging_full", "too_many_models", "error")

    def __init__(self, config: DriftConfig, ctx: ComponentContext, profile: Profile | None = None) -> None:
        # Evaluations and checkpoints follow real time, even under a test's frozen ctx.monotonic.
        super().__init__(ctx, interval_s=min(1.0, config.evaluate_interval_s / 5), max_staged=config.max_staged,
                         max_staged_bytes=config.max_staged_bytes, evaluate_interval_s=config.evaluate_interval_s,
                         log=log, schedule=REAL_TIME)
        self.cfg = config
        self.profile = profile
        self.settings = engine.Settings(
            alpha=config.alpha, numeric_effect_floor=config.numeric_effect_floor,
            categorical_effect_floor=config.categorical_effect_floor, missing_floor=config.missing_floor,
            min_samples=config.min_samples, drift_share=config.drift_share, correction=config.correction,
            multivariate_effect_floor=config.multivariate_effect_floor,
        )
        self.monitors: dict[tuple[str, str], Monitor] = {}
        self._labels = LabelJoiner(config.max_pending_labels, config.label_ttl_s, ctx.monotonic)
        self._accuracy: dict[tuple[str, str], float] = {}
        self._next_ckpt = 0.0
        self.last_eval_unix: float | None = None
        self.last_eval_seconds = 0.0
        self.last_checkpoint_unix: float | None = None
        self.checkpoint_failures = checkpoint.Failures()
        self.restored_from: str | None = None

    # -- evaluator thread -------------------------------------------------------------------------------------------

    def absorb(self, batch: list[tuple[Any, ...]], now: float) -> None:
        """Move staged records into the windows (the state lock held)."""
        if not batch:
            self._labels.expire(self.monitors)
            return
        by_key: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
        labels: list[tuple[Any, ...]] = []
        new_keys = 0
        # The events of a frame share one ctx tuple object: its key and list are looked up again only when
        # the object changes (``lst`` None: not looked up yet, or the version was refused).
        last_ctx: Any = _NO_CTX
        key: tuple[str, str] = ("", "")
        lst: list[tuple[Any, ...]] | None = None
        for r in batch:
            try:
                if r[0] != EV_RECORD:
                    continue
                ctx = r[1]
                if ctx is not last_ctx:
                    key = (ctx[1] or "", ctx[2] or "")
                    last_ctx, lst = ctx, None
                feats = r[7]
                if r[4] is None and feats is None:
                    if r[6] is not None:
                        labels.append(r)
                    continue
                if feats is not None:
                    # A schema with one value per feature (what ``Monitor.ingest`` reads): _well_formed inline.
                    sc = feats[0]
                    if not (isinstance(sc, Schema) and len(feats[1]) == len(sc.numeric)
                            and len(feats[2]) == len(sc.categorical)):
                        # One record the windows cannot read is dropped alone, never its batch.
                        self.dropped["bad_record"] = self.dropped.get("bad_record", 0) + 1
                        continue
                if lst is None:
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
                self._labels.track(mon, recs, self.monitors)
            except Exception:
                log.exception("drift: failed to ingest %d records for %s", len(recs), key)
                self.dropped["error"] += len(recs)
        for r in labels:
            if not self._labels.join(r, self.monitors):
                self.dropped["unmatched_label"] = self.dropped.get("unmatched_label", 0) + 1
        self._labels.expire(self.monitors)

    def evaluate(self, now: float | None = None) -> None:
        """Score every window, compare canaries, and publish a metrics snapshot."""
        t0 = time.perf_counter()
        with self._state_lock:
            for mon in self.monitors.values():
                try:
                    mon.evaluate(self.settings)
                except Exception:
                    log.exception("drift: evaluation failed for %s", mon.key)
            compare_canaries(self.monitors.values(), self.settings, self.ctx.baselines)
            snap = build_snapshot(self.monitors.values(), self.dropped, self.ctx.limiter,
                                  getattr(self.ctx, "max_family_series", None))
        self.last_eval_seconds = time.perf_counter() - t0
        self.last_eval_unix = self.ctx.clock()
        snap.put(DRIFT_EVALUATION_DURATION_SECONDS, (), self.last_eval_seconds)
        snap.put(DRIFT_LAST_EVALUATION_TIMESTAMP_SECONDS, (), self.last_eval_unix)
        accuracy = {(lab[0], lab[1]): v for lab, v in snap.get(DRIFT_ESTIMATED_ACCURACY_RATIO)}
        with self._lock:
            self._snapshot = snap
            self._accuracy = accuracy

    # -- export -----------------------------------------------------------------------------------------------------

    def estimated_accuracy(self) -> Mapping[tuple[str, str], float]:
        """The last evaluation's estimated accuracy per (model, version) as capped label values (for canary)."""
        with self._lock:
            return dict(self._accuracy)

    def live_samples(self) -> Samples | None:
        """The checkpoint failures, counted at once (not with the next evaluation)."""
        if not self.cfg.checkpoint_path:
            return None
        out = Samples()
        out.set(DRIFT_CHECKPOINT_FAILURES_TOTAL, list(self.checkpoint_failures.counts.items()))
        return out

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
                                  "events": mon.reference_rows,
                                  "warmup_target": cfg.warmup_events if mon.source != "file" else None,
                                  "warmup_cut_by_bytes": mon.warmup_cut},
                    "window": {"events": mon.window_rows, "subwindows": mon.S,
                               "seconds": None if cfg.window_events else cfg.window_seconds,
                               "max_events": cfg.window_events, "state_bytes": mon.nbytes},
                    "labels": dict(mon.label_counts),
                }
                # The realized accuracy of the predictions that got a label (inferwatch_drift_accuracy_ratio).
                labeled = mon.labeled_rows
                d["labelled"] = {"events": labeled, "accuracy": mon.correct_rows / labeled if labeled else None}
                conf = next((r for r in mon.last.results if r.role == "confidence"), None) if mon.last else None
                d["performance"] = performance.report(mon.perf, conf.mean_current if conf else None,
                                                      conf.n_current if conf else 0)
                if mon.last is not None:
                    ev = mon.last
                    d["dataset_drift"] = ev.dataset_drift
                    d["share_drifted"] = ev.share_drifted
                    d["multivariate"] = ev.multivariate.to_json() if ev.multivariate is not None else None
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
            pending = len(self._labels.pending)
        return {
            "reference": {"source": "file" if self.profile is not None else "warm-up",
                          "path": cfg.reference, "warmup_events": cfg.warmup_events, "mode": cfg.reference_mode,
                          "rolling_period_s": cfg.rolling_period_s if cfg.reference_mode == "rolling" else None},
            "evaluate_interval_s": cfg.evaluate_interval_s,
            "last_evaluation_unix": self.last_eval_unix,
            "last_evaluation_seconds": self.last_eval_seconds,
            "last_checkpoint_unix": self.last_checkpoint_unix,
            "restored_from_checkpoint": self.restored_from,
            "checkpoint_failures": {f"{op}/{reason}": n for (op, reason), n in self.checkpoint_failures.counts.items()
                                    if n},
            "staged": self.staged(),
            "pending_labels": pending,
            "dropped": dict(self.dropped),
            "models": models,
        }

    # -- lifecycle ----------------------------------------------------------------------------------------------------

    def on_start(self) -> None:
        """Resume from the checkpoint, if any, before the evaluator thread starts."""
        cfg = self.cfg
        if cfg.checkpoint_path:
            restored = checkpoint.restore(cfg.checkpoint_path, cfg, self.profile, self.checkpoint_failures,
                                          self.ctx.clock())
            if restored is not None:
                with self._state_lock:
                    self.monitors = restored
                self.restored_from = cfg.checkpoint_path
        super().on_start()
        self._next_ckpt = self._schedule() + cfg.checkpoint_interval_s

    def after_tick(self, now: float) -> None:
        """Checkpoint when it is due."""
        cfg = self.cfg
        if cfg.checkpoint_path and now >= self._next_ckpt:
            self._next_ckpt = now + cfg.checkpoint_interval_s
            self.checkpoint()

    def checkpoint(self) -> None:
        """Save the windows to ``checkpoint_path`` (if set); a failure is logged and counted, not raised."""
        path = self.cfg.checkpoint_path
        if not path:
            return
        try:
            with self._state_lock:
                doc = checkpoint.document(self.monitors.values(), self.cfg)
            checkpoint.write(doc, path)
            self.last_checkpoint_unix = self.ctx.clock()
        except OSError as e:
            self.checkpoint_failures.add("write", checkpoint.os_reason(e))
            log.error("drift: cannot write checkpoint %s: %s; the windows will not survive a restart", path, e)
        except Exception:
            self.checkpoint_failures.add("write", "error")
            log.exception("drift: cannot write checkpoint %s; the windows will not survive a restart", path)

    def on_stop(self) -> None:
        """The final drain and checkpoint."""
        try:
            self.drain()
            self.checkpoint()
        except Exception:
            log.exception("drift: final drain/checkpoint failed")

    def admin_routes(self) -> dict[str, AdminHandler]:
        return {"report": lambda q: report.admin_report(q, self._window_report)}

    def _window_report(self, model: str | None, version: str | None) -> bytes:
        with self._state_lock:
            return report.window_report(self.monitors.values(), model, version)


def build(config: DriftConfig, ctx: ComponentContext) -> DriftComponent:
    """Build the drift component. A bad reference profile raises ``ProfileError`` with what to fix."""
    profile = None
    if config.reference:
        profile = prof.load(config.reference)
        if not profile.features and profile.prediction is None and profile.confidence is None:
            raise prof.ProfileError(f"reference profile {config.reference}: it has no columns to monitor")
    return DriftComponent(config, ctx, profile)


__all__ = ["DriftComponent", "build", "PRED", "CONF"]


def _well_formed(feats: Any) -> bool:
    """Whether a RECORD's features are a schema with one value per feature (what ``Monitor.ingest`` reads)."""
    schema = feats[0]
    return (
        isinstance(schema, Schema)
        and len(feats[1]) == len(schema.numeric)
        and len(feats[2]) == len(schema.categorical)
    )

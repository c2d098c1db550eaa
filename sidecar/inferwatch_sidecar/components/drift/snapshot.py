"""The metric samples of one evaluation, built on the evaluator thread so a scrape only copies them.

:func:`build_snapshot` turns every model version's windows, last evaluation,
label counts and canary comparison into :class:`~inferwatch_sidecar.metrics.samples.Samples`
of the entries of :mod:`inferwatch_sidecar.metrics.drift`, with
label values passed through the daemon's shared cardinality limiters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from inferwatch_sidecar.aggregate.labels import LabelLimiter
from inferwatch_sidecar.components.drift import engine, performance
from inferwatch_sidecar.components.drift.monitor import Monitor
from inferwatch_sidecar.metrics import drift as dm
from inferwatch_sidecar.metrics.samples import Samples, Snapshot
from inferwatch_sidecar.stats.columns import CategoricalColumn, NumericColumn

__all__ = ["Snapshot", "build_snapshot"]


def build_snapshot(monitors: Iterable[Monitor], dropped: Mapping[str, int],
                   limiter: Callable[[str], LabelLimiter], max_family_series: int | None = None) -> Snapshot:
    """Samples of every drift metric (non-finite values are left out).

    Args:
        monitors: the model versions.
        dropped: dropped records by reason.
        limiter: the shared limiter of a label name.
        max_family_series: the exposition's per-family budget; the snapshot keeps one sample more per
            family and counts the rest (16 versions x 64 features x 33 bins were 68k bin samples, 14 MiB,
            of which a scrape showed 5,000).
    """
    # The core metrics' limiter names, so a model version counts once against one budget.
    lim_m, lim_v = limiter("model"), limiter("model_version")
    lim_f = limiter("feature")
    out = Samples(None if max_family_series is None else max_family_series + 1)
    for name, n in dropped.items():
        out.put(dm.DRIFT_DROPPED_RECORDS_TOTAL, (name,), n)
    for mon in monitors:
        mv = (lim_m.get(mon.key[0]), lim_v.get(mon.key[1]))
        _put_window(out, mon, mv, lim_f)
        if mon.last is not None:
            _put_evaluation(out, mon, mon.last, mv, lim_f)
        if mon.perf is not None:
            performance.export(mon.perf, out, mv)
        if mon.pred_col is not None:
            _put_prediction_mix(out, mon, mon.pred_col, mv, limiter)
        if mon.canary is not None:
            _put_canary(out, mon.canary, mv, lim_v, lim_f)
    return out


def _put_window(out: Samples, mon: Monitor, mv: tuple[str, str], lim_f: LabelLimiter) -> None:
    """What the window holds: its size, its labels, and each column's bins beside the reference's."""
    put = out.put
    put(dm.DRIFT_REFERENCE_EVENTS, (*mv, mon.source), mon.reference_rows)
    put(dm.DRIFT_WINDOW_EVENTS, mv, mon.window_rows)
    put(dm.DRIFT_STATE_BYTES, mv, mon.nbytes)
    for res, n in mon.label_counts.items():
        put(dm.DRIFT_LABELS_TOTAL, (*mv, res), n)
    labeled = mon.labeled_rows
    put(dm.DRIFT_LABELED_EVENTS, mv, labeled)
    if labeled:
        put(dm.DRIFT_ACCURACY_RATIO, mv, mon.correct_rows / labeled)
    for cname, cw in mon.columns.items():
        fl = (*mv, lim_f.get(cname))
        for b, n in enumerate(cw.cum.tolist()):
            put(dm.DRIFT_BIN_EVENTS_TOTAL, (*fl, str(b)), n)
        ref = cw.ref
        rc = np.bincount(ref.psi_map, weights=ref.counts, minlength=ref.n_psi_bins) \
            if isinstance(ref, NumericColumn) else ref.counts
        tot = rc.sum()
        for b, n in enumerate(rc.tolist()):
            put(dm.DRIFT_REFERENCE_BIN_RATIO, (*fl, str(b)), n / tot if tot else 0.0)


def _put_evaluation(out: Samples, mon: Monitor, ev: engine.Evaluation, mv: tuple[str, str],
                    lim_f: LabelLimiter) -> None:
    """The last evaluation: the dataset's verdict, the joint test's, and every feature's test."""
    put = out.put
    put(dm.DRIFT_DATASET_DRIFTED_RATIO, mv, ev.share_drifted)
    put(dm.DRIFT_DATASET_DRIFTED, mv, float(ev.dataset_drift))
    j = ev.multivariate
    if j is not None:
        put(dm.DRIFT_MULTIVARIATE_DRIFTED, mv, float(j.drifted))
        put(dm.DRIFT_MULTIVARIATE_STATISTIC, mv, j.statistic)
        put(dm.DRIFT_MULTIVARIATE_THRESHOLD, mv, j.threshold)
        put(dm.DRIFT_MULTIVARIATE_ADJUSTED_P_VALUE, mv, j.p_adjusted)
        put(dm.DRIFT_MULTIVARIATE_RECONSTRUCTION_ERROR, (*mv, "current"), j.error_mean_current)
        put(dm.DRIFT_MULTIVARIATE_RECONSTRUCTION_ERROR, (*mv, "reference"), j.error_mean_reference)
    for r in ev.results:
        fl = (*mv, lim_f.get(r.feature))
        put(dm.DRIFT_FEATURE_STATISTIC, (*fl, r.test), r.statistic)
        put(dm.DRIFT_FEATURE_P_VALUE, fl, r.p_value)
        put(dm.DRIFT_FEATURE_ADJUSTED_P_VALUE, fl, r.p_adjusted)
        put(dm.DRIFT_FEATURE_SCORE, (*fl, r.effect_name), r.effect)
        if r.effect_name != "psi":
            put(dm.DRIFT_FEATURE_SCORE, (*fl, "psi"), r.psi)
        put(dm.DRIFT_FEATURE_SCORE, (*fl, "jensen_shannon"), r.jensen_shannon)
        put(dm.DRIFT_FEATURE_DRIFTED, fl, float(r.drifted))
        put(dm.DRIFT_FEATURE_MISSING_RATIO, (*fl, "current"), r.missing_current)
        put(dm.DRIFT_FEATURE_MISSING_RATIO, (*fl, "reference"), r.missing_reference)
        if r.kind == "categorical":
            put(dm.DRIFT_FEATURE_UNSEEN_CATEGORIES, fl, len(r.unseen))
        if r.role == "confidence":
            put(dm.DRIFT_CONFIDENCE_MEAN, (*mv, "current"), r.mean_current)
            put(dm.DRIFT_CONFIDENCE_MEAN, (*mv, "reference"), r.mean_reference)
            if mon.perf is None:
                # Uncalibrated fallback: E[accuracy] = E[confidence] only if the model is calibrated.
                put(dm.DRIFT_ESTIMATED_ACCURACY_RATIO, mv, r.mean_current)
                put(dm.DRIFT_ESTIMATED_ACCURACY_CALIBRATED, mv, 0.0)


def _put_prediction_mix(out: Samples, mon: Monitor, pred_col: str, mv: tuple[str, str],
                        limiter: Callable[[str], LabelLimiter]) -> None:
    """The window's share of each predicted class (categorical predictions only)."""
    cw = mon.columns[pred_col]
    if not isinstance(cw.ref, CategoricalColumn):
        return
    s = cw.summary
    tot = s.counts.sum()
    if tot:
        lim_c = limiter("class")
        for i, cat in enumerate([*cw.ref.categories, "__other__"]):
            out.put(dm.DRIFT_PREDICTION_CLASS_RATIO, (*mv, lim_c.get(cat)), s.counts[i] / tot)


def _put_canary(out: Samples, canary: Mapping[str, Any], mv: tuple[str, str], lim_v: LabelLimiter,
                lim_f: LabelLimiter) -> None:
    """The version's drift against its baseline version (a canary compared with the stable one)."""
    bv = lim_v.get(canary["baseline_version"])
    cev: engine.Evaluation = canary["evaluation"]
    out.put(dm.DRIFT_CANARY_DRIFTED_RATIO, (*mv, bv), cev.share_drifted)
    for r in cev.results:
        out.put(dm.DRIFT_CANARY_FEATURE_DRIFTED, (*mv, lim_f.get(r.feature), bv), float(r.drifted))

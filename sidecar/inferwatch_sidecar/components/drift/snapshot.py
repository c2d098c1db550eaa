"""The metric samples of one evaluation, built on the evaluator thread so a scrape only copies them.

:func:`build_snapshot` turns every model version's windows, last evaluation,
label counts and canary comparison into ``{metric name: [(label values,
value)]}`` for the families of :mod:`inferwatch_sidecar.metrics.drift`, with
label values passed through the daemon's shared cardinality limiters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from inferwatch_sidecar.aggregate.labels import LabelLimiter
from inferwatch_sidecar.components.drift import engine, performance
from inferwatch_sidecar.components.drift.columns import CategoricalColumn, NumericColumn
from inferwatch_sidecar.components.drift.monitor import Monitor

#: metric name -> samples of (label values, value)
Snapshot = dict[str, list[tuple[tuple[str, ...], float]]]


def build_snapshot(monitors: Iterable[Monitor], dropped: Mapping[str, int],
                   limiter: Callable[[str], LabelLimiter]) -> Snapshot:
    """Samples of every drift metric (non-finite values are left out).

    Args:
        monitors: the model versions.
        dropped: dropped records by reason.
        limiter: the shared limiter of a label name.
    """
    # The core metrics' limiter names, so a model version counts once against one budget.
    lim_m, lim_v = limiter("model"), limiter("model_version")
    lim_f = limiter("feature")
    out: Snapshot = {}

    def put(name: str, labels: tuple[str, ...], value: float | None) -> None:
        if value is None or not math.isfinite(value):
            return
        out.setdefault(name, []).append((labels, float(value)))

    for name, n in dropped.items():
        put("inferwatch_drift_dropped_records_total", (name,), n)
    for mon in monitors:
        mv = (lim_m.get(mon.key[0]), lim_v.get(mon.key[1]))
        put("inferwatch_drift_reference_events", (*mv, mon.source), mon.reference_rows)
        put("inferwatch_drift_window_events", mv, mon.window_rows)
        put("inferwatch_drift_state_bytes", mv, mon.nbytes)
        for res, n in mon.label_counts.items():
            put("inferwatch_drift_labels_total", (*mv, res), n)
        labeled = mon.labeled_rows
        put("inferwatch_drift_labeled_events", mv, labeled)
        if labeled:
            put("inferwatch_drift_accuracy_ratio", mv, mon.correct_rows / labeled)
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
            j = ev.multivariate
            if j is not None:
                put("inferwatch_drift_multivariate_drifted", mv, float(j.drifted))
                put("inferwatch_drift_multivariate_statistic", mv, j.statistic)
                put("inferwatch_drift_multivariate_threshold", mv, j.threshold)
                put("inferwatch_drift_multivariate_adjusted_p_value", mv, j.p_adjusted)
                put("inferwatch_drift_multivariate_reconstruction_error", (*mv, "current"), j.error_mean_current)
                put("inferwatch_drift_multivariate_reconstruction_error", (*mv, "reference"), j.error_mean_reference)
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
                    if mon.perf is None:
                        # Uncalibrated fallback: E[accuracy] = E[confidence] only if the model is calibrated.
                        put("inferwatch_drift_estimated_accuracy_ratio", mv, r.mean_current)
                        put("inferwatch_drift_estimated_accuracy_calibrated", mv, 0.0)
        if mon.perf is not None:
            performance.export(mon.perf, put, mv)
        if mon.pred_col is not None:
            cw = mon.columns[mon.pred_col]
            if isinstance(cw.ref, CategoricalColumn):
                s = cw.summary
                tot = s.counts.sum()
                if tot:
                    lim_c = limiter("class")
                    for i, cat in enumerate([*cw.ref.categories, "__other__"]):
                        put("inferwatch_drift_prediction_class_ratio", (*mv, lim_c.get(cat)), s.counts[i] / tot)
        if mon.canary is not None:
            bv = lim_v.get(mon.canary["baseline_version"])
            cev: engine.Evaluation = mon.canary["evaluation"]
            put("inferwatch_drift_canary_drifted_ratio", (*mv, bv), cev.share_drifted)
            for r in cev.results:
                put("inferwatch_drift_canary_feature_drifted", (*mv, lim_f.get(r.feature), bv), float(r.drifted))
    return out

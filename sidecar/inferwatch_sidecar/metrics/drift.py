"""Catalog entries for the drift component.

Label values: ``model`` and ``model_version`` come from traffic (the same
label names as the core request metrics, so drift and latency series join), ``feature`` from the
profile (or from traffic during a warm-up), ``bin`` and ``class`` from the
profile; all are capped by the daemon's label limiters. Columns for the
prediction and the confidence appear as features named after their profile
column (``__prediction__`` / ``__confidence__`` for warm-up references).
"""

from __future__ import annotations

from inferwatch_sidecar.metrics.entry import Metric

_MV = ("model", "model_version")
_F = ("model", "model_version", "feature")

METRICS: tuple[Metric, ...] = (
    Metric("inferwatch_drift_feature_statistic", "gauge", "",
           "Test statistic of the window against the reference: KS distance (numeric) or chi-square (categorical).",
           (*_F, "test"), "drift"),
    Metric("inferwatch_drift_feature_p_value", "gauge", "",
           "Raw p-value of the feature's drift test (absent while the window has too few values).", _F, "drift"),
    Metric("inferwatch_drift_feature_adjusted_p_value", "gauge", "",
           "Benjamini-Hochberg adjusted p-value across all tests of the model version's window.", _F, "drift"),
    Metric("inferwatch_drift_feature_score", "gauge", "",
           "Drift score (effect size): normalized Wasserstein, PSI or Jensen-Shannon distance.",
           (*_F, "measure"), "drift"),
    Metric("inferwatch_drift_feature_drifted", "gauge", "",
           "1 when the feature drifted: adjusted p-value <= alpha and effect size >= its floor.", _F, "drift"),
    Metric("inferwatch_drift_feature_missing_ratio", "gauge", "ratio",
           "Share of missing values, in the current window or the reference.", (*_F, "window"), "drift"),
    Metric("inferwatch_drift_feature_unseen_categories", "gauge", "",
           "Distinct categories in the current window that the reference's top-K list does not have (capped).",
           _F, "drift"),
    Metric("inferwatch_drift_dataset_drifted_ratio", "gauge", "ratio",
           "Share of input features that drifted in the model version's window.", _MV, "drift"),
    Metric("inferwatch_drift_dataset_drifted", "gauge", "",
           "1 when the share of drifted features reaches the configured drift_share.", _MV, "drift"),
    Metric("inferwatch_drift_window_events", "gauge", "",
           "Events in the current sliding window.", _MV, "drift"),
    Metric("inferwatch_drift_reference_events", "gauge", "",
           "Events in the reference; source is file, warmup or warming_up (still collecting).",
           (*_MV, "source"), "drift"),
    Metric("inferwatch_drift_confidence_mean", "gauge", "",
           "Mean confidence in the current window or the reference.", (*_MV, "window"), "drift"),
    Metric("inferwatch_drift_prediction_class_ratio", "gauge", "ratio",
           "Share of each predicted class in the current window (reference classes plus __other__).",
           (*_MV, "class"), "drift"),
    Metric("inferwatch_drift_estimated_accuracy_ratio", "gauge", "ratio",
           "Label-free accuracy estimate (CBPE): mean confidence of the predicted class, assuming calibration.",
           _MV, "drift"),
    Metric("inferwatch_drift_accuracy_ratio", "gauge", "ratio",
           "Accuracy over the window's predictions whose labels arrived (joined by request ID).", _MV, "drift"),
    Metric("inferwatch_drift_labeled_events", "gauge", "",
           "Predictions in the window with a joined label.", _MV, "drift"),
    Metric("inferwatch_drift_labels_total", "counter", "",
           "Labels by outcome: joined (by request ID), inline (sent with the prediction), unmatched, expired.",
           (*_MV, "result"), "drift"),
    Metric("inferwatch_drift_bin_events_total", "counter", "",
           "Values per reference bin (numeric: PSI bins; categorical: category index, last = other), since start.",
           (*_F, "bin"), "drift"),
    Metric("inferwatch_drift_reference_bin_ratio", "gauge", "ratio",
           "Reference proportion of each bin of inferwatch_drift_bin_events_total.", (*_F, "bin"), "drift"),
    Metric("inferwatch_drift_canary_feature_drifted", "gauge", "",
           "1 when the feature's window differs between a version and the model's stable (busiest) version.",
           (*_F, "baseline_version"), "drift"),
    Metric("inferwatch_drift_canary_drifted_ratio", "gauge", "ratio",
           "Share of features that differ between a version and the model's stable (busiest) version.",
           (*_MV, "baseline_version"), "drift"),
    Metric("inferwatch_drift_dropped_records_total", "counter", "",
           "Records the drift engine dropped, by reason.", ("reason",), "drift"),
    Metric("inferwatch_drift_state_bytes", "gauge", "bytes",
           "Memory held by the model version's windows and reference summaries.", _MV, "drift"),
    Metric("inferwatch_drift_evaluation_duration_seconds", "gauge", "seconds",
           "Wall time of the last evaluation of every window.", (), "drift"),
    Metric("inferwatch_drift_last_evaluation_timestamp_seconds", "gauge", "seconds",
           "Unix time of the last evaluation.", (), "drift"),
)

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

DRIFT_FEATURE_STATISTIC = Metric(
    name="inferwatch_drift_feature_statistic", type="gauge", labels=(*_F, "test"), component="drift",
    help="Test statistic of the window against the reference: KS distance (numeric) or chi-square (categorical).",
)
DRIFT_FEATURE_P_VALUE = Metric(
    name="inferwatch_drift_feature_p_value", type="gauge", labels=_F, component="drift",
    help="Raw p-value of the feature's drift test (absent while the window has too few values).",
)
DRIFT_FEATURE_ADJUSTED_P_VALUE = Metric(
    name="inferwatch_drift_feature_adjusted_p_value", type="gauge", labels=_F, component="drift",
    help="Benjamini-Hochberg adjusted p-value across all tests of the model version's window.",
)
DRIFT_FEATURE_SCORE = Metric(
    name="inferwatch_drift_feature_score", type="gauge", labels=(*_F, "measure"), component="drift",
    help="Drift score (effect size): normalized Wasserstein, PSI or Jensen-Shannon distance.",
)
DRIFT_FEATURE_DRIFTED = Metric(
    name="inferwatch_drift_feature_drifted", type="gauge", labels=_F, component="drift",
    help="1 when the feature drifted: adjusted p-value <= alpha and effect size >= its floor.",
)
DRIFT_FEATURE_MISSING_RATIO = Metric(
    name="inferwatch_drift_feature_missing_ratio", type="gauge", unit="ratio", labels=(*_F, "window"),
    component="drift",
    help="Share of missing values, in the current window or the reference.",
)
DRIFT_FEATURE_UNSEEN_CATEGORIES = Metric(
    name="inferwatch_drift_feature_unseen_categories", type="gauge", labels=_F, component="drift",
    help="Distinct categories in the current window that the reference's top-K list does not have (capped).",
)
DRIFT_DATASET_DRIFTED_RATIO = Metric(
    name="inferwatch_drift_dataset_drifted_ratio", type="gauge", unit="ratio", labels=_MV, component="drift",
    help="Share of input features that drifted in the model version's window.",
)
DRIFT_DATASET_DRIFTED = Metric(
    name="inferwatch_drift_dataset_drifted", type="gauge", labels=_MV, component="drift",
    help="1 when the share of drifted features reaches the configured drift_share, or the joint test drifted.",
)
DRIFT_MULTIVARIATE_DRIFTED = Metric(
    name="inferwatch_drift_multivariate_drifted", type="gauge", labels=_MV, component="drift",
    help="1 when the joint test drifted: relations between features changed (adjusted p <= alpha, AUC >= threshold).",
)
DRIFT_MULTIVARIATE_STATISTIC = Metric(
    name="inferwatch_drift_multivariate_statistic", type="gauge", labels=_MV, component="drift",
    help="Joint test: AUC of the window's PCA reconstruction errors against the reference's (0.5: no change).",
)
DRIFT_MULTIVARIATE_THRESHOLD = Metric(
    name="inferwatch_drift_multivariate_threshold", type="gauge", labels=_MV, component="drift",
    help="The AUC the joint test must reach at this window size: 0.5 plus its effect floor.",
)
DRIFT_MULTIVARIATE_ADJUSTED_P_VALUE = Metric(
    name="inferwatch_drift_multivariate_adjusted_p_value", type="gauge", labels=_MV, component="drift",
    help="Benjamini-Hochberg adjusted p-value of the joint test, in the same family as the features' tests.",
)
DRIFT_MULTIVARIATE_RECONSTRUCTION_ERROR = Metric(
    name="inferwatch_drift_multivariate_reconstruction_error", type="gauge", labels=(*_MV, "window"),
    component="drift",
    help="Mean whitened PCA reconstruction error of the features, in the current window or the reference.",
)
DRIFT_WINDOW_EVENTS = Metric(
    name="inferwatch_drift_window_events", type="gauge", labels=_MV, component="drift",
    help="Events in the current sliding window.",
)
DRIFT_REFERENCE_EVENTS = Metric(
    name="inferwatch_drift_reference_events", type="gauge", labels=(*_MV, "source"), component="drift",
    help="Events in the reference; source is file, warmup or warming_up (still collecting).",
)
DRIFT_CONFIDENCE_MEAN = Metric(
    name="inferwatch_drift_confidence_mean", type="gauge", labels=(*_MV, "window"), component="drift",
    help="Mean confidence in the current window or the reference.",
)
DRIFT_PREDICTION_CLASS_RATIO = Metric(
    name="inferwatch_drift_prediction_class_ratio", type="gauge", unit="ratio", labels=(*_MV, "class"),
    component="drift",
    help="Share of each predicted class in the current window (reference classes plus __other__).",
)
DRIFT_ESTIMATED_ACCURACY_RATIO = Metric(
    name="inferwatch_drift_estimated_accuracy_ratio", type="gauge", unit="ratio", labels=_MV, component="drift",
    help="Label-free accuracy estimate (CBPE): calibrated on the labelled reference when the profile has labels "
         "(inferwatch_drift_estimated_accuracy_calibrated 1), else the mean confidence (0).",
)
DRIFT_ESTIMATED_ACCURACY_CALIBRATED = Metric(
    name="inferwatch_drift_estimated_accuracy_calibrated", type="gauge", labels=_MV, component="drift",
    help="1 when the accuracy estimate uses a calibration fitted on a labelled reference, 0 for mean confidence.",
)
DRIFT_ESTIMATED_ACCURACY_BOUND_RATIO = Metric(
    name="inferwatch_drift_estimated_accuracy_bound_ratio", type="gauge", unit="ratio", labels=(*_MV, "bound"),
    component="drift",
    help="Lower or upper bound of the 95% interval of the calibrated accuracy estimate (window size and calibration).",
)
DRIFT_REFERENCE_ACCURACY_RATIO = Metric(
    name="inferwatch_drift_reference_accuracy_ratio", type="gauge", unit="ratio", labels=_MV, component="drift",
    help="Realized accuracy of the labelled reference the calibration was fitted on.",
)
DRIFT_ESTIMATED_BINARY_METRIC_RATIO = Metric(
    name="inferwatch_drift_estimated_binary_metric_ratio", type="gauge", unit="ratio", labels=(*_MV, "metric"),
    component="drift",
    help="Label-free estimate of a binary model's precision, recall, f1 or roc_auc (CBPE expected confusion matrix).",
)
DRIFT_REFERENCE_BINARY_METRIC_RATIO = Metric(
    name="inferwatch_drift_reference_binary_metric_ratio", type="gauge", unit="ratio", labels=(*_MV, "metric"),
    component="drift",
    help="Realized precision, recall, f1 or roc_auc of a binary model on the labelled reference.",
)
DRIFT_ACCURACY_RATIO = Metric(
    name="inferwatch_drift_accuracy_ratio", type="gauge", unit="ratio", labels=_MV, component="drift",
    help="Accuracy over the window's predictions whose labels arrived (joined by request ID).",
)
DRIFT_LABELED_EVENTS = Metric(
    name="inferwatch_drift_labeled_events", type="gauge", labels=_MV, component="drift",
    help="Predictions in the window with a joined label.",
)
DRIFT_LABELS_TOTAL = Metric(
    name="inferwatch_drift_labels_total", type="counter", labels=(*_MV, "result"), component="drift",
    help="Labels by outcome: joined (by request ID), inline (sent with the prediction), unmatched, expired.",
)
DRIFT_BIN_EVENTS_TOTAL = Metric(
    name="inferwatch_drift_bin_events_total", type="counter", labels=(*_F, "bin"), component="drift",
    help="Values per reference bin (numeric: PSI bins; categorical: category index, last = other), since start.",
)
DRIFT_REFERENCE_BIN_RATIO = Metric(
    name="inferwatch_drift_reference_bin_ratio", type="gauge", unit="ratio", labels=(*_F, "bin"), component="drift",
    help="Reference proportion of each bin of inferwatch_drift_bin_events_total.",
)
DRIFT_CANARY_FEATURE_DRIFTED = Metric(
    name="inferwatch_drift_canary_feature_drifted", type="gauge", labels=(*_F, "baseline_version"), component="drift",
    help="1 when the feature's window differs between a version and the model's stable (busiest) version.",
)
DRIFT_CANARY_DRIFTED_RATIO = Metric(
    name="inferwatch_drift_canary_drifted_ratio", type="gauge", unit="ratio", labels=(*_MV, "baseline_version"),
    component="drift",
    help="Share of features that differ between a version and the model's stable (busiest) version.",
)
DRIFT_DROPPED_RECORDS_TOTAL = Metric(
    name="inferwatch_drift_dropped_records_total", type="counter", labels=("reason",), component="drift",
    help="Records the drift engine dropped, by reason.",
)
DRIFT_CHECKPOINT_FAILURES_TOTAL = Metric(
    name="inferwatch_drift_checkpoint_failures_total", type="counter", labels=("op", "reason"), component="drift",
    help="Checkpoints of the drift windows that failed, by op (write, read, set_aside: moving a corrupt one "
         "aside) and reason (no_space, permission, io, corrupt, incompatible, error).",
)
DRIFT_STATE_BYTES = Metric(
    name="inferwatch_drift_state_bytes", type="gauge", unit="bytes", labels=_MV, component="drift",
    help="Memory held by the model version's windows and reference summaries.",
)
DRIFT_EVALUATION_DURATION_SECONDS = Metric(
    name="inferwatch_drift_evaluation_duration_seconds", type="gauge", unit="seconds", component="drift",
    help="Wall time of the last evaluation of every window.",
)
DRIFT_LAST_EVALUATION_TIMESTAMP_SECONDS = Metric(
    name="inferwatch_drift_last_evaluation_timestamp_seconds", type="gauge", unit="seconds", component="drift",
    help="Unix time of the last evaluation.",
)

#: Every entry of this component, in catalog order.
METRICS: tuple[Metric, ...] = (
    DRIFT_FEATURE_STATISTIC, DRIFT_FEATURE_P_VALUE, DRIFT_FEATURE_ADJUSTED_P_VALUE, DRIFT_FEATURE_SCORE,
    DRIFT_FEATURE_DRIFTED, DRIFT_FEATURE_MISSING_RATIO, DRIFT_FEATURE_UNSEEN_CATEGORIES, DRIFT_DATASET_DRIFTED_RATIO,
    DRIFT_DATASET_DRIFTED, DRIFT_MULTIVARIATE_DRIFTED, DRIFT_MULTIVARIATE_STATISTIC, DRIFT_MULTIVARIATE_THRESHOLD,
    DRIFT_MULTIVARIATE_ADJUSTED_P_VALUE, DRIFT_MULTIVARIATE_RECONSTRUCTION_ERROR, DRIFT_WINDOW_EVENTS,
    DRIFT_REFERENCE_EVENTS, DRIFT_CONFIDENCE_MEAN,
    DRIFT_PREDICTION_CLASS_RATIO, DRIFT_ESTIMATED_ACCURACY_RATIO, DRIFT_ESTIMATED_ACCURACY_CALIBRATED,
    DRIFT_ESTIMATED_ACCURACY_BOUND_RATIO, DRIFT_REFERENCE_ACCURACY_RATIO, DRIFT_ESTIMATED_BINARY_METRIC_RATIO,
    DRIFT_REFERENCE_BINARY_METRIC_RATIO, DRIFT_ACCURACY_RATIO, DRIFT_LABELED_EVENTS,
    DRIFT_LABELS_TOTAL, DRIFT_BIN_EVENTS_TOTAL, DRIFT_REFERENCE_BIN_RATIO, DRIFT_CANARY_FEATURE_DRIFTED,
    DRIFT_CANARY_DRIFTED_RATIO, DRIFT_DROPPED_RECORDS_TOTAL, DRIFT_CHECKPOINT_FAILURES_TOTAL, DRIFT_STATE_BYTES,
    DRIFT_EVALUATION_DURATION_SECONDS, DRIFT_LAST_EVALUATION_TIMESTAMP_SECONDS,
)

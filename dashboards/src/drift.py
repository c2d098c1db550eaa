"""Drift: per-feature and joint drift, prediction mix, confidence, estimated vs real accuracy, canary vs stable,
training-serving skew."""

from __future__ import annotations

from grafana_foundation_sdk.builders.heatmap import RowsHeatmapOptions, YAxisConfig
from grafana_foundation_sdk.models.common import AxisPlacement, HeatmapCellLayout
from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.src.common import (
    CONFIDENCE_FEATURES,
    DRIFT,
    RATE,
    Item,
    Row,
    bargauge,
    dashboard,
    datasource_var,
    heatmap,
    query_var,
    stat,
    state_timeline,
    target,
    threshold,
    timeseries,
)

UID = "inferwatch-drift"


def build() -> Dashboard:
    variables = [
        datasource_var(),
        query_var("model", "Model", "label_values(inferwatch_drift_window_events, model)"),
        query_var("version", "Version", 'label_values(inferwatch_drift_window_events{model=~"$model"}, model_version)'),
        query_var("measure", "Score", 'label_values(inferwatch_drift_feature_score{model=~"$model"}, measure)',
                  multi=False, current="jensen_shannon"),
    ]
    return dashboard(
        uid=UID, title="inferwatch / Drift",
        description="Per-feature and joint drift, prediction mix, confidence, estimated vs real accuracy, canary vs stable.",
        variables=variables,
        items=[*_features(), *_predictions(), *_canary(), *_skew(), *_windows()],
    )


def _features() -> list[Item]:
    """Per-feature and joint drift."""
    return [
        Row("Features"),
        heatmap(title="Drift score by feature over time", w=24, h=10,
                description="The chosen drift score (effect size) of each feature, one row per feature.",
                targets=[target(f'max by (feature) (inferwatch_drift_feature_score{{{DRIFT}, measure=~"$measure"}})',
                                "{{feature}}")])
        .y_axis(YAxisConfig().unit("short").axis_placement(AxisPlacement.LEFT))
        .rows_frame(RowsHeatmapOptions().layout(HeatmapCellLayout.AUTO)),
        timeseries(title="Fleet-wide PSI by feature (all replicas, 10m)", w=24, minimum=0,
                   thresholds=[(0.1, "yellow"), (0.25, "red")],
                   description="PSI of the whole fleet's last 10 minutes against the reference, from the recording "
                               "rules of alerts/drift.rules.yml (needs every replica on the same reference file). "
                               "0.1 / 0.25 are the usual 'moderate' / 'major' shift marks.",
                   targets=[target(f"max by (feature) (model_feature:inferwatch_drift_psi:10m{{{DRIFT}}})",
                                   "{{feature}}")]),
        timeseries(title="Share of features drifted", unit="percentunit", minimum=0, maximum=1, w=8,
                   description="Share of input features whose adjusted p-value and effect size cross their limits.",
                   targets=[target(f"inferwatch_drift_dataset_drifted_ratio{{{DRIFT}}}",
                                   "{{model}} {{model_version}}")]),
        stat(title="Drifted features", w=8, thresholds=[(1, "red")],
             description="Features flagged as drifted in the current window.",
             targets=[target(f"sum by (model, model_version) (inferwatch_drift_feature_drifted{{{DRIFT}}})",
                             "{{model}} {{model_version}}")]),
        timeseries(title="Adjusted p-value by feature", w=8, log_scale=True, thresholds=[(0.05, "green")],
                   description="Benjamini-Hochberg adjusted p-values (log scale); low means different from "
                               "reference.",
                   targets=[target(f"min by (feature) (inferwatch_drift_feature_adjusted_p_value{{{DRIFT}}})",
                                   "{{feature}}")]),
        timeseries(title="Joint drift: reconstruction-error AUC vs threshold", w=8, minimum=0, maximum=1,
                   description="The joint (multivariate) test, for relations between features that no per-column "
                               "test sees (a join that attaches values to the wrong rows): the AUC of the "
                               "window's PCA reconstruction errors against the reference's (0.5: no change) and "
                               "the AUC it must reach at this window size. It drifts when the AUC reaches the "
                               "threshold and its adjusted p-value is at most alpha.",
                   targets=[target(f"inferwatch_drift_multivariate_statistic{{{DRIFT}}}", "{{model_version}} AUC"),
                            target(f"inferwatch_drift_multivariate_threshold{{{DRIFT}}}",
                                   "{{model_version}} threshold")]),
        timeseries(title="Joint drift: adjusted p-value", w=8, log_scale=True, thresholds=[(0.05, "green")],
                   description="Benjamini-Hochberg adjusted p-value of the joint test, corrected in the same "
                               "family as the per-feature tests (log scale).",
                   targets=[target(f"inferwatch_drift_multivariate_adjusted_p_value{{{DRIFT}}}",
                                   "{{model_version}}")]),
        stat(title="Dataset drifted: per-column share or joint test", w=8, thresholds=[(1, "red")],
             description="1 when the model version's window drifted, and 1 on the joint line when the joint "
                         "test fired it: with the joint line at 1 and no drifted feature, only the relations "
                         "between features changed (InferwatchJointDrift rather than InferwatchFeatureDrift).",
             targets=[target(f"max by (model, model_version) (inferwatch_drift_dataset_drifted{{{DRIFT}}})",
                             "{{model_version}} dataset"),
                      target(f"max by (model, model_version) (inferwatch_drift_multivariate_drifted{{{DRIFT}}})",
                             "{{model_version}} joint test")]),
    ]


def _predictions() -> list[Item]:
    """Predictions, confidence and the accuracy estimate."""
    acc = threshold("InferwatchEstimatedAccuracyLow", "accuracy")
    drop = threshold("InferwatchConfidenceDrop", "drop")
    acc_drop = threshold("InferwatchEstimatedAccuracyDrop", "drop")
    conf = f'{DRIFT}, feature=~"{CONFIDENCE_FEATURES}"'
    return [
        Row("Predictions and confidence"),
        timeseries(title="Prediction mix", unit="percentunit", stack=True, minimum=0, maximum=1, w=8,
                   description="Share of each predicted class in the current window.",
                   targets=[target(f"inferwatch_drift_prediction_class_ratio{{{DRIFT}}}",
                                   "{{model_version}} {{class}}")]),
        bargauge(title="Confidence distribution (current vs reference)", unit="percentunit", w=8, minimum=0,
                 maximum=1,
                 description="Share of confidences per reference bin over the dashboard's time range, next to "
                             "the reference's share.",
                 targets=[
                     target(f"sum by (bin) (increase(inferwatch_drift_bin_events_total{{{conf}}}[$__range]))\n"
                            "/ ignoring (bin) group_left\n"
                            f"sum(increase(inferwatch_drift_bin_events_total{{{conf}}}[$__range]))",
                            "current bin {{bin}}", instant=True),
                     target(f"avg by (bin) (inferwatch_drift_reference_bin_ratio{{{conf}}})", "reference bin {{bin}}",
                            instant=True),
                 ]),
        timeseries(title="Mean confidence", w=8, minimum=0, maximum=1,
                   description=f"Mean confidence of the current window and of the reference; "
                               f"InferwatchConfidenceDrop fires when it is {drop:g} below the reference.",
                   targets=[target(f"inferwatch_drift_confidence_mean{{{DRIFT}}}", "{{model_version}} {{window}}")]),
        timeseries(title="Estimated vs real accuracy", unit="percentunit", minimum=0, maximum=1,
                   thresholds=[(acc, "green")],
                   description="Label-free estimate (calibrated on the labelled reference, or the mean confidence "
                               "when the reference has no labels: see 'Estimate calibrated') with its 95% "
                               "interval, the reference's realized accuracy, and the accuracy over predictions "
                               f"whose labels arrived. InferwatchEstimatedAccuracyDrop fires {acc_drop:g} below "
                               "the reference; the estimate's absolute alert floor is drawn.",
                   targets=[target(f"inferwatch_drift_estimated_accuracy_ratio{{{DRIFT}}}",
                                   "{{model_version}} estimated (CBPE)"),
                            target(f"inferwatch_drift_estimated_accuracy_bound_ratio{{{DRIFT}}}",
                                   "{{model_version}} estimate {{bound}} 95%"),
                            target(f"inferwatch_drift_reference_accuracy_ratio{{{DRIFT}}}",
                                   "{{model_version}} reference"),
                            target(f"inferwatch_drift_accuracy_ratio{{{DRIFT}}}", "{{model_version}} real (labeled)")]),
        stat(title="Estimate calibrated", w=4, thresholds=[(1, "green")],
             description="1: the accuracy estimate uses the calibration of a labelled reference; 0: it is the "
                         "mean confidence (build the reference with --label to calibrate it).",
             targets=[target(f"inferwatch_drift_estimated_accuracy_calibrated{{{DRIFT}}}", "{{model_version}}")]),
        timeseries(title="Estimated binary metrics", unit="percentunit", minimum=0, maximum=1, w=8,
                   description="A binary model's precision, recall, F1 and ROC AUC estimated from the expected "
                               "confusion matrix (CBPE), next to the reference's realized values.",
                   targets=[target(f"inferwatch_drift_estimated_binary_metric_ratio{{{DRIFT}}}",
                                   "{{model_version}} {{metric}} estimated"),
                            target(f"inferwatch_drift_reference_binary_metric_ratio{{{DRIFT}}}",
                                   "{{model_version}} {{metric}} reference")]),
        timeseries(title="Labels joined", minimum=0,
                   description="How many predictions have ground truth, and how labels arrive.",
                   targets=[
                       target(f"inferwatch_drift_labeled_events{{{DRIFT}}}", "{{model_version}} labeled in window"),
                       target(f"sum by (model_version, result) (rate(inferwatch_drift_labels_total{{{DRIFT}}}"
                              f"[{RATE}]))", "{{model_version}} {{result}}/s"),
                   ]),
    ]


def _canary() -> list[Item]:
    """A version against the stable one."""
    return [
        Row("Canary vs stable"),
        timeseries(title="Columns differing from the stable version", unit="percentunit", minimum=0, maximum=1,
                   thresholds=[(0.0001, "red")],
                   description="Share of columns whose window differs between a version and the busiest version.",
                   targets=[target(f"inferwatch_drift_canary_drifted_ratio{{{DRIFT}}}",
                                   "{{model_version}} vs {{baseline_version}}")]),
        timeseries(title="Prediction mix by version", unit="percentunit", minimum=0, maximum=1,
                   description="Each version's class mix side by side (not filtered by the version variable).",
                   targets=[target('inferwatch_drift_prediction_class_ratio{model=~"$model"}',
                                   "{{model_version}} {{class}}")]),
        state_timeline(title="Canary columns that differ", w=24, h=6, thresholds=[(1, "red")],
                       description="Per column: 1 when the canary's window differs from the stable version's.",
                       targets=[target("max by (model_version, feature) "
                                       f"(inferwatch_drift_canary_feature_drifted{{{DRIFT}}})",
                                       "{{model_version}} {{feature}}")]),
    ]


def _skew() -> list[Item]:
    """Served values against the offline pipeline's (docs/skew.md)."""
    return [
        Row("Training-serving skew"),
        timeseries(title="Served values matching the offline pipeline", unit="percentunit", minimum=0, maximum=1,
                   w=16,
                   description="Per feature: share of the last joined requests whose served value equals what the "
                               "training pipeline computes for the same request ID (POST /v1/skew, docs/skew.md). "
                               "Below the line fires InferwatchTrainingServingSkew.",
                   targets=[target(f"min by (model_version, feature) (inferwatch_skew_match_ratio{{{DRIFT}}})",
                                   "{{model_version}} {{feature}}")]),
        bargauge(title="Kind of skew per feature", unit="percentunit", w=8,
                 description="The diagnosed kind (offset, scale, affine, lag, swapped, mapping, default_filled, "
                             "missing_in_served, mismatch) and the share of rows it explains; match is left out.",
                 targets=[target(f'max by (model_version, feature, kind) (inferwatch_skew_explained_ratio{{{DRIFT}, '
                                 'kind!="match"})', "{{model_version}} {{feature}}: {{kind}}")]),
    ]


def _windows() -> list[Item]:
    """The windows, the reference and the engine's own cost."""
    return [
        Row("Windows and engine"),
        timeseries(title="Window and reference events", minimum=0, w=8,
                   description="Events in the sliding window and in the reference.",
                   targets=[target(f"inferwatch_drift_window_events{{{DRIFT}}}", "{{model_version}} window"),
                            target(f"inferwatch_drift_reference_events{{{DRIFT}}}",
                                   "{{model_version}} reference ({{source}})")]),
        timeseries(title="Drift state memory", unit="bytes", minimum=0, w=8,
                   description="Memory held by windows and reference summaries.",
                   targets=[target(f"inferwatch_drift_state_bytes{{{DRIFT}}}", "{{model}} {{model_version}}")]),
        timeseries(title="Evaluation time", unit="s", minimum=0, w=8,
                   description="Wall time of the last evaluation of every window.",
                   targets=[target("inferwatch_drift_evaluation_duration_seconds", "{{instance}}")]),
    ]

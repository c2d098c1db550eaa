"""Drift rules: the fleet-wide drift recordings (alerts/drift.rules.yml) and the drift alerts.
promtool: tests/alerts/drift.test.yml (with the sidecar's checkpoint alert) and tests/components/drift/test_rules.py.
"""

from __future__ import annotations

from alerts.domains.common import _MV, _version_query
from alerts.model import Alert, Recording, Threshold

# Fleet-wide drift computed by Prometheus from every replica's sidecar.
#
# Each sidecar exports, per model version and feature:
#   inferwatch_drift_bin_events_total{model,model_version,feature,bin}   values per reference bin (counter)
#   inferwatch_drift_reference_bin_ratio{model,model_version,feature,bin} the reference proportion of that bin
# (numeric features: the reference's 10 decile bins; categorical: top-K categories, last bin = "other").
# Summing the counters' increases over all replicas gives the fleet's window; these rules turn it into PSI and a
# chi-square statistic, exactly as the sidecar's engine does for one replica
# (inferwatch_sidecar/components/drift/stats.py: psi, chi2_goodness_of_fit), with zero proportions replaced by 1e-4.
# The window is a literal 10 minutes in every profile: the record names say so, and tests/components/drift/test_rules.py
# checks these rules with promtool against values computed by the engine.
FLEET_DRIFT_DOC = """\
Fleet-wide drift (PSI and chi-square per feature) from the bin counters of every replica, over the last
10 minutes, as the sidecar's engine computes it for one replica. This only makes sense when every replica
uses the same reference profile file (drift.reference): warm-up references differ per replica."""

_FLEET = "inferwatch-drift-fleet"
_BINS = "model_feature_bin:inferwatch_drift_bin_events:increase10m"
_TOTALS = "model_feature:inferwatch_drift_bin_events:increase10m"
_RATIO = "model_feature_bin:inferwatch_drift_bin:ratio10m"
_REF = "model_feature_bin:inferwatch_drift_reference_bin:ratio"


def _fleet_recordings() -> list[Recording]:
    return [
        # Values per bin over the whole fleet in the last 10 minutes.
        Recording(record=_BINS, group=_FLEET,
                  expr="sum by (model, model_version, feature, bin) (increase(inferwatch_drift_bin_events_total[10m]))"),
        # Values per feature over the whole fleet (only features that had traffic).
        Recording(record=_TOTALS, group=_FLEET, expr=f"sum by (model, model_version, feature) ({_BINS}) > 0"),
        # Fleet proportion per bin, zeros replaced by 1e-4 (as in the engine's PSI).
        Recording(record=_RATIO, group=_FLEET, expr=(
            "(\n"
            f"  ({_BINS}\n    / ignoring(bin) group_left {_TOTALS}) > 0\n"
            ")\n"
            "or\n"
            "(\n"
            f"  {_BINS}\n    / ignoring(bin) group_left {_TOTALS}\n"
            ") * 0 + 0.0001\n")),
        # Reference proportion per bin (identical on every replica with the same profile), zeros -> 1e-4.
        Recording(record=_REF, group=_FLEET, expr=(
            "(max by (model, model_version, feature, bin) (inferwatch_drift_reference_bin_ratio) > 0)\n"
            "or\n"
            "(max by (model, model_version, feature, bin) (inferwatch_drift_reference_bin_ratio) * 0 + 0.0001)\n")),
        # Fleet-wide population stability index per feature.
        Recording(record="model_feature:inferwatch_drift_psi:10m", group=_FLEET, expr=(
            "sum by (model, model_version, feature) (\n"
            f"  ({_RATIO} - {_REF})\n"
            f"  * ln({_RATIO} / {_REF})\n"
            ")\n")),
        # Fleet-wide chi-square goodness-of-fit statistic per feature: sum (observed - expected)^2 / expected.
        Recording(record="model_feature:inferwatch_drift_chi2:10m", group=_FLEET, expr=(
            "sum by (model, model_version, feature) (\n"
            "  (\n"
            f"    {_BINS}\n"
            f"    - {_REF}\n"
            f"      * ignoring(bin) group_left {_TOTALS}\n"
            "  ) ^ 2\n"
            "  / (\n"
            f"    {_REF}\n"
            f"      * ignoring(bin) group_left {_TOTALS}\n"
            "  )\n"
            ")\n")),
        # Share of replicas whose own engine flags the feature as drifted right now.
        Recording(record="model_feature:inferwatch_drift_feature_drifted:avg", group=_FLEET,
                  expr="avg by (model, model_version, feature) (inferwatch_drift_feature_drifted)"),
    ]


#: Regex (RE2, fully anchored) of the profile column names that hold the prediction. The drift
#: metrics carry no role label, so the prediction column is found by name; ``__prediction__`` is
#: the column name of warm-up references; ``.*pred.*`` catches the usual names of a profile's prediction
#: column (prediction, predicted_class, y_pred, label_pred). Narrow it if an input feature matches.
PREDICTION_FEATURES = "__prediction__|.*pred.*"


def _input_drift_alerts() -> list[Alert]:
    """Drift of the inputs (per feature, joint) and of the predictions."""
    return [
        Alert(
            # The dataset verdict with at least one drifted column; without one, only the joint test can have
            # made the verdict, and InferwatchJointDrift fires instead.
            name="InferwatchFeatureDrift", group="inferwatch-drift", severity="warning", for_s=900,
            expr="inferwatch_drift_dataset_drifted_ratio > 0\nand on (model, model_version)\n"
                 "(inferwatch_drift_dataset_drifted == 1)",
            summary="The inputs of " + _MV + " drifted from the reference.",
            description="{value:humanizePercentage} of the input features of " + _MV + " differ significantly "
                        "from the reference profile (after multiple-testing correction and effect-size floors) for "
                        "{window:15m}."
                        "{{{{ with " + _version_query("inferwatch_drift_multivariate_drifted", " == 1") + " }}}}"
                        " The joint test fired too: the relations between the features changed as well."
                        "{{{{ end }}}}",
        ),
        Alert(
            # Joint-only drift: every column keeps its distribution (a join that attaches values to the wrong rows).
            name="InferwatchJointDrift", group="inferwatch-drift", severity="warning", for_s=900,
            expr="inferwatch_drift_multivariate_statistic\nand on (model, model_version)\n"
                 "(inferwatch_drift_multivariate_drifted == 1)\nunless on (model, model_version)\n"
                 "(inferwatch_drift_dataset_drifted_ratio > 0)",
            summary="The relations between the inputs of " + _MV + " changed, though no single input drifted.",
            description="No input feature of " + _MV + " drifted on its own, but the joint test did for "
                        "{window:15m}: the window's rows reconstruct worse from the reference's principal components "
                        '(AUC {value:printf "%.3f"}'
                        "{{{{ with " + _version_query("inferwatch_drift_multivariate_threshold") + " }}}}"
                        ' against a threshold of {{{{ . | first | value | printf "%.3f" }}}}{{{{ end }}}}'
                        "{{{{ with " + _version_query("inferwatch_drift_multivariate_adjusted_p_value") + " }}}}"
                        ', adjusted p {{{{ . | first | value | printf "%.2g" }}}}{{{{ end }}}}). '
                        "Each column keeps its distribution while the relations between columns broke, as when a "
                        "join or a pipeline attaches values to the wrong rows.",
        ),
        Alert(
            name="InferwatchPredictionDrift", group="inferwatch-drift", severity="warning", for_s=900,
            expr='inferwatch_drift_feature_drifted{{feature=~"{feature_regex}"}} == 1',
            summary="The predictions of " + _MV + " drifted from the reference.",
            description="The distribution of the predicted classes of " + _MV + " (column {labels.feature}) "
                        "differs significantly from the reference profile for {window:15m}.",
            thresholds=(Threshold(name="feature_regex", value=PREDICTION_FEATURES,
                                  doc="regex of the prediction column names (the drift metrics have no role label)"),),
        ),
    ]


def _output_drift_alerts() -> list[Alert]:
    """Confidence, the canary's divergence and the estimated accuracy."""
    return [
        Alert(
            name="InferwatchConfidenceDrop", group="inferwatch-drift", severity="warning", for_s=1800,
            expr='inferwatch_drift_confidence_mean{{window="reference"}}\n- ignoring (window)\n'
                 'inferwatch_drift_confidence_mean{{window="current"}}\n> {drop}',
            summary="The mean confidence of " + _MV + " dropped.",
            description="The mean confidence of " + _MV + ' is {value:printf "%.2f"} below the reference\'s '
                        "(threshold {drop}) for {window:30m}.",
            thresholds=(Threshold(name="drop", value=0.1,
                                  doc="absolute drop of the window's mean confidence below the reference's"),),
        ),
        Alert(
            name="InferwatchCanaryDiverging", group="inferwatch-drift", severity="warning", for_s=900,
            expr="inferwatch_drift_canary_drifted_ratio > {drifted_ratio}",
            summary="Version {labels.model_version} of {labels.model} behaves differently from "
                    "{labels.baseline_version}.",
            description="{value:humanizePercentage} of the columns (inputs, predictions, confidence) of " + _MV +
                        " differ significantly from the stable version {labels.baseline_version} for {window:15m}.",
            thresholds=(Threshold(name="drifted_ratio", value=0,
                                  doc="share of columns that differ (0: any column; the test already corrects for "
                                      "multiple testing)"),),
        ),
        Alert(
            name="InferwatchEstimatedAccuracyLow", group="inferwatch-drift", severity="warning", for_s=1800,
            expr="inferwatch_drift_estimated_accuracy_ratio < {accuracy}",
            summary="The estimated accuracy of " + _MV + " is low.",
            description="The label-free accuracy estimate (CBPE) of " + _MV + " is {value:humanizePercentage}, "
                        "below {accuracy}, for {window:30m}.",
            thresholds=(Threshold(name="accuracy", value=0.7, doc="floor of the estimated accuracy"),),
        ),
        Alert(
            # Only calibrated estimates have a reference accuracy; the upper bound of the 95% interval must
            # be below the reference too, so a small window's noise does not fire it.
            name="InferwatchEstimatedAccuracyDrop", group="inferwatch-drift", severity="warning", for_s=1800,
            expr="inferwatch_drift_reference_accuracy_ratio - inferwatch_drift_estimated_accuracy_ratio > {drop}\n"
                 "and on (model, model_version)\n"
                 '(inferwatch_drift_estimated_accuracy_bound_ratio{{bound="upper"}} < ignoring (bound)\n'
                 " inferwatch_drift_reference_accuracy_ratio)",
            summary="The calibrated accuracy estimate of " + _MV + " dropped below the reference's.",
            description="The label-free accuracy estimate of " + _MV + ", calibrated on the labelled reference, is "
                        '{value:printf "%.3f"} below the reference accuracy (threshold {drop}, and the whole 95% '
                        "interval is below it) for {window:30m}.",
            thresholds=(Threshold(name="drop", value=0.05,
                                  doc="absolute drop of the calibrated estimate below the reference accuracy"),),
        ),
    ]


def _drift_alerts() -> list[Alert]:
    """Every drift alert, in file order."""
    return [*_input_drift_alerts(), *_output_drift_alerts()]

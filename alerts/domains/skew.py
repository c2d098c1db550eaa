"""Training-serving skew (docs/skew.md). promtool: tests/alerts/skew.test.yml."""

from __future__ import annotations

from alerts.domains.common import _MV
from alerts.model import Alert, Threshold


def _skew_alerts() -> list[Alert]:
    """Training-serving skew (docs/skew.md): served feature values that differ from the offline pipeline's."""
    kind = ('{{{{ with printf "inferwatch_skew_explained_ratio{{service=\'%s\',model=\'%s\',model_version=\'%s\','
            'feature=\'%s\'}}" $labels.service $labels.model $labels.model_version $labels.feature | query }}}}'
            ' Diagnosis: {{{{ . | first | label "kind" }}}}, explaining {{{{ . | first | value | humanizePercentage }}}}'
            " of the rows.{{{{ end }}}}")
    return [
        Alert(
            name="InferwatchTrainingServingSkew", group="inferwatch-drift", severity="warning", for_s=900,
            expr="inferwatch_skew_match_ratio < {match_ratio}",
            summary="Feature {labels.feature} of " + _MV + " is served differently from training.",
            description="Only {value:humanizePercentage} of the last joined requests of " + _MV + " (" +
                        "{labels.service}) were served the value of {labels.feature} that the offline pipeline "
                        "computes for them (threshold {match_ratio}) for {window:15m}." + kind +
                        " Run `inferwatch skew` on the served sample for the whole diagnosis.",
            thresholds=(Threshold(name="match_ratio", value=0.99,
                                  doc="share of joined rows whose served value matches the offline value"),),
        ),
    ]

"""Streaming generation: tokens generated for clients that left. promtool: tests/alerts/streaming.test.yml."""

from __future__ import annotations

from alerts.domains.common import _WHERE
from alerts.model import SERVING, Alert, Threshold


def _streaming_alerts() -> list[Alert]:
    return [
        Alert(
            name="InferwatchWastedGeneration", group="inferwatch-serving", severity="warning", for_s=600,
            expr="sum by (" + SERVING + ") (rate(inferwatch_undelivered_tokens_total[{window:10m}]))\n/\n"
                 "sum by (" + SERVING + ") (rate(inferwatch_generated_tokens_total[{window:10m}]))\n"
                 "> {wasted_ratio}",
            summary="{labels.model} {labels.model_version} keeps generating for clients that have left.",
            description="{value:humanizePercentage} of the tokens that " + _WHERE + " generated over the last "
                        "{window:10m} were produced after their client had disconnected (threshold {wasted_ratio}): "
                        "generation is not cancelled on disconnect, so the GPU works for nobody. Cancel it when "
                        "the client leaves (see the runbook).",
            thresholds=(Threshold(name="wasted_ratio", value=0.05,
                                  doc="share of generated tokens produced after the client disconnected"),),
        ),
    ]

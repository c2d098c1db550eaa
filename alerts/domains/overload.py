"""Overload: retry storms, load shedding and client timeouts (docs/overload.md). promtool:
tests/alerts/overload.test.yml."""

from __future__ import annotations

from alerts.domains.common import _WHERE
from alerts.model import SERVING, Alert, Threshold


def _rate(metric: str, window: str) -> str:
    return f"sum by ({SERVING}) (rate({metric}[{{window:{window}}}]))"


def _overload_alerts() -> list[Alert]:
    """Issue 27: retries, shed requests and client give-ups that feed an overload (docs/overload.md)."""
    att5, ret5 = _rate("inferwatch_request_attempts_total", "5m"), _rate("inferwatch_request_retries_total", "5m")
    att15 = _rate("inferwatch_request_attempts_total", "15m")
    return [
        Alert(
            name="InferwatchRetryStorm", group="inferwatch-serving", severity="critical", for_s=300,
            expr=f"(\n  {att5}\n  /\n  ({att5} - {ret5})\n) > {{amplification}}\nand\n"
                 f"(\n  {_rate('inferwatch_client_giveups_total', '5m')}\n  /\n  {att5}\n) > {{giveup_ratio}}",
            summary="{labels.model} {labels.model_version} is in a retry storm: retries and client give-ups "
                    "feed each other.",
            description="Clients of " + _WHERE + " sent {value:humanize} attempts per unique request over the "
                        "last {window:5m} (threshold {amplification}) while more than {giveup_ratio} of the "
                        "requests lost their client before the answer: clients time out, retry at once and add "
                        "load to a service that is already too slow. Budget the retries and shed load (see the "
                        "runbook).",
            thresholds=(
                Threshold(name="amplification", value=1.5, doc="attempts per unique request (retries included)"),
                Threshold(name="giveup_ratio", value=0.05,
                          doc="share of requests whose client disconnected before the response was complete"),
            ),
        ),
        Alert(
            name="InferwatchLoadShedding", group="inferwatch-serving", severity="warning", for_s=300,
            expr="sum by (" + SERVING + ') (rate(inferwatch_requests_total{{outcome="shed"}}[{window:5m}]))\n/\n'
                 "sum by (" + SERVING + ") (rate(inferwatch_requests_total[{window:5m}]))\n> {shed_ratio}",
            summary="{labels.model} {labels.model_version} sheds requests: the server turns work away.",
            description="{value:humanizePercentage} of the requests to " + _WHERE + " over the last {window:5m} "
                        "were shed (429 or 503 the server itself returned; threshold {shed_ratio}): it refuses work "
                        "it has no room for. Find what binds it and add capacity, and make sure clients back off "
                        "instead of retrying at once (see the runbook).",
            thresholds=(Threshold(name="shed_ratio", value=0.05,
                                  doc='share of requests ending in outcome="shed" (429/503 the server returned)'),),
        ),
        Alert(
            name="InferwatchTimeoutMismatch", group="inferwatch-serving", severity="warning", for_s=600,
            # The server's median from the classic buckets where a replica exports them, else from its native
            # histogram (Prometheus with native histograms on; docs/scale.md). The give-up wait is classic on
            # every exposition (the aggregator keeps no native layout for it).
            expr="histogram_quantile(0.5, sum by (" + SERVING + ", le) "
                 "(rate(inferwatch_client_giveup_wait_seconds_bucket[{window:15m}])))\n<\n"
                 "{wait_share} * (\n  histogram_quantile(0.5, sum by (" + SERVING + ", le) "
                 "(rate(inferwatch_request_duration_seconds_bucket[{window:15m}])))\n  or\n"
                 "  histogram_quantile(0.5, sum by (" + SERVING + ") "
                 "(rate(inferwatch_request_duration_seconds[{window:15m}])))\n)\n"
                 "and\n(\n  " + _rate("inferwatch_client_giveups_total", "15m") + f"\n  /\n  {att15}\n"
                 ") > {giveup_ratio}",
            summary="Clients of {labels.model} {labels.model_version} give up before the server typically "
                    "answers.",
            description="Clients that gave up on " + _WHERE + " over the last {window:15m} had waited "
                        "{value:humanizeDuration} (median), less than {wait_share} of the server's median "
                        "latency, and more than {giveup_ratio} of the requests ended so: the client timeout is "
                        "shorter than the work, so the work is wasted and usually retried. Align the timeouts "
                        "(see the runbook).",
            thresholds=(
                Threshold(name="wait_share", value=1.0,
                          doc="the median give-up wait below this share of the median server latency fires"),
                Threshold(name="giveup_ratio", value=0.01,
                          doc="share of requests whose client disconnected before the response was complete"),
            ),
        ),
    ]

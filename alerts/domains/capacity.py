"""Capacity (docs/capacity.md): the live knee's headroom and goodput burn rates. promtool:
tests/alerts/capacity.test.yml."""

from __future__ import annotations

from alerts.domains.common import _WHERE
from alerts.model import Alert, Recording, Threshold

# Capacity (docs/capacity.md): the live knee's headroom, and goodput against capacity.slo objectives in the
# SRE workbook's multi-window, multi-burn-rate style (a fast pair of windows pages, a slow pair tickets).
_GOODPUT_WINDOWS = ("5m", "30m", "1h", "6h")
_BUDGET = "(1 - max by ({by_version}) (inferwatch_slo_objective_ratio))"


def _capacity_recordings() -> list[Recording]:
    return [Recording(
        record=f"service_model_version:inferwatch_slo_bad:ratio_rate{w}", group="inferwatch-capacity",
        expr=f'sum by ({{by_version}}) (rate(inferwatch_slo_requests_total{{{{result="bad"}}}}[{{window:{w}}}]))\n'
             f"/\nsum by ({{by_version}}) (rate(inferwatch_slo_requests_total[{{window:{w}}}]))")
        for w in _GOODPUT_WINDOWS]


def _goodput_burn(name: str, severity: str, long: str, short: str, burn: float) -> Alert:
    rec = "service_model_version:inferwatch_slo_bad:ratio_rate"
    return Alert(
        name=name, group="inferwatch-capacity", severity=severity, for_s=120,
        expr=f"{rec}{long} > on ({{by_version}}) ({{burn_rate}} * {_BUDGET})\n"
             f"and\n{rec}{short} > on ({{by_version}}) ({{burn_rate}} * {_BUDGET})",
        summary="{labels.model} {labels.model_version} is burning its goodput budget.",
        description="{value:humanizePercentage} of the requests to " + _WHERE + f" over the last {{window:{long}}} "
                    "missed a capacity.slo objective (TTFT, inter-token latency or end-to-end), failed or were "
                    "shed: more than {burn_rate}x the error budget the objective allows "
                    f"(also true over the last {{window:{short}}}).",
        thresholds=(Threshold(name="burn_rate", value=burn,
                              doc=f"times faster than sustainable the budget burns, over both {long} and {short}"),),
    )


def _capacity_alerts() -> list[Alert]:
    return [
        _goodput_burn("InferwatchGoodputBudgetBurnFast", "critical", "1h", "5m", 14.4),
        _goodput_burn("InferwatchGoodputBudgetBurnSlow", "warning", "6h", "30m", 6.0),
        Alert(
            name="InferwatchCapacityHeadroomLow", group="inferwatch-capacity", severity="warning", for_s=900,
            expr="max_over_time(inferwatch_capacity_headroom_ratio[{window:15m}]) < {headroom}",
            summary="{labels.model} {labels.model_version} runs at its knee.",
            description="The requests in flight at " + _WHERE + " have stayed within {headroom} of the live knee "
                        "for {window:15m} (headroom {value:humanizePercentage}): more load only adds queueing. "
                        "Scale out, or shed load before latency climbs further.",
            thresholds=(Threshold(name="headroom", value=0.1,
                                  doc="1 - in flight / knee below this for the whole window fires"),),
        ),
    ]

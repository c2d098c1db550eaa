"""LLM streaming: time to first token, inter-token latency and tokens per second."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.src.common import CORE, RATE, Row, core_vars, dashboard, quantiles, query_var, target, timeseries

UID = "inferwatch-llm"


def build() -> Dashboard:
    sel = f'{CORE}, stage=~"$stage"'
    stage_var = query_var("stage", "Streaming stage", "label_values(inferwatch_generated_tokens_total"
                                                      '{service=~"$service", model=~"$model"}, stage)')
    return dashboard(
        uid=UID, title="inferwatch / LLM streaming",
        description="Time to first token, inter-token latency and tokens per second.",
        variables=[*core_vars(), stage_var],
        items=[
            Row("Streaming latency"),
            timeseries(title="Time to first token P50 / P99 / P999", unit="s",
                       description="Time from the start of a streaming stage to its first token.",
                       targets=quantiles("inferwatch_time_to_first_token_seconds", sel, "stage")),
            timeseries(title="Inter-token latency P50 / P99 / P999", unit="s",
                       description="Gaps between consecutive tokens.",
                       targets=quantiles("inferwatch_inter_token_latency_seconds", sel, "stage")),
            Row("Throughput"),
            timeseries(title="Tokens per second", stack=True, minimum=0,
                       description="Tokens (items) yielded per second by streaming stages.",
                       targets=[target("sum by (model, model_version, stage) "
                                       f"(rate(inferwatch_generated_tokens_total{{{sel}}}[{RATE}]))",
                                       "{{model}} {{model_version}} {{stage}}")]),
            timeseries(title="Tokens per stream P50 / P99", minimum=0, description="Tokens yielded per streaming call.",
                       targets=quantiles("inferwatch_generation_length_tokens", sel, "stage",
                                         qs=((0.5, "P50"), (0.99, "P99")))),
            timeseries(title="Mean tokens per second per stream", w=24, minimum=0,
                       description="Tokens divided by streaming time (first-token wait plus inter-token gaps): the "
                                   "speed one user sees.",
                       targets=[target(
                           f"sum by (stage) (rate(inferwatch_generation_length_tokens_sum{{{sel}}}[{RATE}]))\n/\n"
                           f"sum by (stage) (rate(inferwatch_time_to_first_token_seconds_sum{{{sel}}}[{RATE}])\n"
                           f"  + rate(inferwatch_inter_token_latency_seconds_sum{{{sel}}}[{RATE}]))", "{{stage}}")]),
        ],
    )

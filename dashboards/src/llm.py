"""LLM streaming: time to first token, inter-token latency, tokens per second and what cancelled streams wasted."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.src.common import (
    CORE,
    RATE,
    Row,
    core_vars,
    dashboard,
    hist_rate,
    quantiles,
    query_var,
    target,
    threshold,
    timeseries,
)

UID = "inferwatch-llm"


def build() -> Dashboard:
    sel = f'{CORE}, stage=~"$stage"'
    wasted = threshold("InferwatchWastedGeneration", "wasted_ratio")
    # The cancellation counters appear with the first cancelled stream: "or ... * 0" draws a healthy service's
    # zero from the series that always exist, rather than "No data".
    by_mv = "sum by (model, model_version)"
    by_stage = "sum by (model, model_version, stage)"
    undelivered = f"rate(inferwatch_undelivered_tokens_total{{{sel}}}[{RATE}])"
    generated = f"rate(inferwatch_generated_tokens_total{{{sel}}}[{RATE}])"
    stage_var = query_var("stage", "Streaming stage", "label_values(inferwatch_generated_tokens_total"
                                                      '{service=~"$service", model=~"$model"}, stage)')
    return dashboard(
        uid=UID, title="inferwatch / LLM streaming",
        description="Time to first token, inter-token latency, tokens per second and what cancelled streams wasted.",
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
                           f"{hist_rate('inferwatch_generation_length_tokens', 'sum', sel, 'stage')}\n/\n("
                           f"{hist_rate('inferwatch_time_to_first_token_seconds', 'sum', sel, 'stage')}\n"
                           f"  + {hist_rate('inferwatch_inter_token_latency_seconds', 'sum', sel, 'stage')})",
                           "{{stage}}")]),
            Row("Cancelled streams"),
            timeseries(title="Cancelled requests and streams per second", w=8, minimum=0, unit="reqps",
                       description="Requests that ended cancelled (the client left before the response was complete, "
                                   "or the handler was cancelled), and streaming stage calls closed before they "
                                   "finished or still running when their client left.",
                       targets=[target(f'{by_mv} (rate(inferwatch_requests_total{{{CORE}, outcome="cancelled"}}'
                                       f"[{RATE}]))\nor\n{by_mv} (rate(inferwatch_requests_total{{{CORE}}}[{RATE}])) * 0",
                                       "{{model}} {{model_version}} requests"),
                                target(f"{by_stage} (rate(inferwatch_cancelled_streams_total{{{sel}}}[{RATE}]))\nor\n"
                                       f"{by_stage} ({generated}) * 0",
                                       "{{model}} {{model_version}} {{stage}} streams")]),
            timeseries(title="Undelivered tokens per second", w=8, minimum=0,
                       description="Tokens streaming stages produced after their client had disconnected: generated "
                                   "and never delivered, GPU time spent for nobody.",
                       targets=[target(f"{by_stage} ({undelivered})\nor\n{by_stage} ({generated}) * 0",
                                       "{{model}} {{model_version}} {{stage}}")]),
            timeseries(title="Wasted generation share", w=8, unit="percentunit", minimum=0, maximum=1,
                       thresholds=[(wasted, "red")],
                       description="Share of the generated tokens produced after the client had left; "
                                   f"InferwatchWastedGeneration fires above {wasted:g} for 10 minutes. Cancel "
                                   "generation when the client disconnects.",
                       targets=[target(f"({by_mv} ({undelivered})\nor\n{by_mv} ({generated}) * 0)\n/\n"
                                       f"{by_mv} ({generated})", "{{model}} {{model_version}}")]),
        ],
    )

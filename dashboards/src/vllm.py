"""vLLM: its own ``vllm:*`` metrics (engine state, latency histograms, tokens), and beside them inferwatch's.

vLLM labels the model ``model_name`` (its ``--served-model-name``); inferwatch's series from vLLM's spans carry
the same value as ``model`` (docs/vllm.md), so the ``model`` variable selects both and the last row joins them.
"""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.src.common import (
    RATE,
    Row,
    dashboard,
    datasource_var,
    quantiles,
    query_var,
    target,
    threshold,
    timeseries,
)

UID = "inferwatch-vllm"
#: vLLM's own series of the chosen models.
VLLM = 'model_name=~"$model"'
#: inferwatch's series of the same models (from vLLM's spans).
OURS = 'model=~"$model"'
BY = "model_name"
LEGEND = "{{model_name}}"
P50_P99 = ((0.5, "P50"), (0.99, "P99"))


def _rate(metric: str) -> str:
    return f"sum by ({BY}) (rate({metric}{{{VLLM}}}[{RATE}]))"


def _mean(histogram: str) -> str:
    return f"{_rate(f'{histogram}_sum')}\n/\n{_rate(f'{histogram}_count')}"


def _slow_share(histogram: str, target_seconds: float) -> str:
    le = f'le="{float(target_seconds)!r}"'  # vLLM's prometheus_client writes bounds as floats: le="1.0"
    return (f"1 - sum by ({BY}) (rate({histogram}_bucket{{{VLLM}, {le}}}[{RATE}]))\n/\n"
            f"{_rate(f'{histogram}_count')}")


def build() -> Dashboard:
    usage = threshold("InferwatchVLLMKVCacheFull", "usage_ratio")
    ttft = threshold("InferwatchVLLMTimeToFirstTokenSlow", "target_seconds")
    itl = threshold("InferwatchVLLMInterTokenLatencySlow", "target_seconds")
    slow = threshold("InferwatchVLLMTimeToFirstTokenSlow", "slow_ratio")
    return dashboard(
        uid=UID, title="inferwatch / vLLM",
        description="vLLM's own metrics (vllm:*) per served model, beside what inferwatch measures from vLLM's "
                    "spans.",
        variables=[datasource_var(),
                   query_var("model", "Model", "label_values(vllm:num_requests_running, model_name)")],
        items=[
            Row("Engine state"),
            timeseries(title="vLLM KV cache usage", unit="percentunit", minimum=0, maximum=1,
                       thresholds=[(usage, "red")],
                       description="Share of the KV-cache blocks in use; red at InferwatchVLLMKVCacheFull's "
                                   "threshold (which also needs waiting requests).",
                       targets=[target(f"max by ({BY}) (vllm:kv_cache_usage_perc{{{VLLM}}})", LEGEND)]),
            timeseries(title="vLLM running and waiting requests", minimum=0,
                       description="Sequences the scheduler runs, and requests waiting for KV-cache room.",
                       targets=[target(f"sum by ({BY}) (vllm:num_requests_running{{{VLLM}}})", f"{LEGEND} running"),
                                target(f"sum by ({BY}) (vllm:num_requests_waiting{{{VLLM}}})", f"{LEGEND} waiting")]),
            timeseries(title="vLLM preemptions per second", unit="ops", minimum=0,
                       description="Running sequences evicted from the KV cache to be recomputed later.",
                       targets=[target(_rate("vllm:num_preemptions_total"), LEGEND)]),
            timeseries(title="vLLM prefix cache hit ratio", unit="percentunit", minimum=0, maximum=1,
                       description="Prompt tokens found in the prefix cache over prompt tokens looked up.",
                       targets=[target(f"{_rate('vllm:prefix_cache_hits_total')}\n/\n"
                                       f"{_rate('vllm:prefix_cache_queries_total')}", LEGEND)]),
            Row("Latency (vLLM's histograms)"),
            timeseries(title="vLLM time to first token P50 / P99", unit="s", thresholds=[(ttft, "red")],
                       description="From arrival to the first token; red at InferwatchVLLMTimeToFirstTokenSlow's "
                                   "target.",
                       targets=quantiles("vllm:time_to_first_token_seconds", VLLM, BY, qs=P50_P99)),
            timeseries(title="vLLM inter-token latency P50 / P99", unit="s", thresholds=[(itl, "red")],
                       description="Gaps between consecutive tokens of a stream; red at "
                                   "InferwatchVLLMInterTokenLatencySlow's target.",
                       targets=quantiles("vllm:inter_token_latency_seconds", VLLM, BY, qs=P50_P99)),
            timeseries(title="vLLM share over the latency targets", unit="percentunit", minimum=0,
                       thresholds=[(slow, "red")],
                       description="Share of requests whose first token took longer than the TTFT target, and of "
                                   "token gaps longer than the inter-token target; red at the alerts' slow_ratio.",
                       targets=[target(_slow_share("vllm:time_to_first_token_seconds", ttft), f"{LEGEND} TTFT"),
                                target(_slow_share("vllm:inter_token_latency_seconds", itl),
                                       f"{LEGEND} inter-token")]),
            timeseries(title="vLLM mean queue, prefill and decode time per request", unit="s", minimum=0,
                       description="Mean of vLLM's per-request queue, prefill and decode histograms.",
                       targets=[target(_mean(f"vllm:request_{p}_time_seconds"), f"{LEGEND} {p}")
                                for p in ("queue", "prefill", "decode")]),
            Row("Tokens and outcomes"),
            timeseries(title="vLLM tokens per second", minimum=0,
                       description="Prompt tokens prefilled and tokens generated per second.",
                       targets=[target(_rate("vllm:prompt_tokens_total"), f"{LEGEND} prompt"),
                                target(_rate("vllm:generation_tokens_total"), f"{LEGEND} generation")]),
            timeseries(title="vLLM finished requests by reason", unit="reqps", minimum=0, stack=True,
                       description="Requests per second by vLLM's finished_reason (stop, length, abort, error, "
                                   "...); aborted and failed requests send no span.",
                       targets=[target(f"sum by ({BY}, finished_reason) (rate(vllm:request_success_total{{{VLLM}}}"
                                       f"[{RATE}])) > 0", f"{LEGEND} {{{{finished_reason}}}}")]),
            Row("vLLM beside inferwatch (joined on model)"),
            timeseries(title="Time to first token P99: vLLM's histogram and its spans", unit="s",
                       description="vLLM's own P99 and inferwatch's from the spans' gen_ai.latency.time_to_first_token "
                                   "(the same values, in each side's buckets).",
                       targets=[*quantiles("vllm:time_to_first_token_seconds", VLLM, BY, qs=((0.99, "vLLM P99"),)),
                                *quantiles("inferwatch_time_to_first_token_seconds", OURS, "model",
                                           qs=((0.99, "spans P99"),))]),
            timeseries(title="Traced share of vLLM's requests", unit="percentunit", minimum=0,
                       description="inferwatch's requests from vLLM's spans over vLLM's finished requests, joined "
                                   "on the model: below 100% when requests abort (no span) or spans are lost.",
                       targets=[target(
                           f"sum by (model) (rate(inferwatch_requests_total{{{OURS}}}[{RATE}]))\n/ on (model)\n"
                           f'label_replace({_rate("vllm:request_success_total")}, "model", "$1", "model_name", '
                           '"(.*)")', "{{model}}")]),
        ],
    )

"""Alerts on the engines' own metrics (vLLM, Triton). promtool: tests/alerts/engines.test.yml."""

from __future__ import annotations

from alerts.model import Alert, Threshold

# Engines' own metrics, under their native names (alerts/catalog_check.py: ENGINE_SERIES, taken from the
# recorded /metrics of a real server in tests/fixtures/). vLLM labels the model `model_name` (its
# --served-model-name, which the vllm trace preset also makes inferwatch's `model`); Triton labels it `model`
# and `version` (inferwatch's `model` and `model_version` from its spans).
_VLLM = "job, instance, model_name"
_TRITON = "job, instance, model, version"


def _engine_slow_share(histogram: str) -> str:
    """Share of a vLLM latency histogram's observations above ``target_seconds``, over 5 minutes."""
    return ("(\n  1 - sum by (" + _VLLM + f") (rate({histogram}_bucket{{{{{{target_seconds:le}}}}}}[{{window:5m}}]))\n"
            "  / sum by (" + _VLLM + f") (rate({histogram}_count[{{window:5m}}]))\n) > {{slow_ratio}}")


def _vllm_alerts() -> list[Alert]:
    """vLLM: KV cache, preemptions, time to first token, inter-token latency."""
    return [
        Alert(
            name="InferwatchVLLMKVCacheFull", group="inferwatch-engines", severity="warning", for_s=300,
            expr="max by (" + _VLLM + ") (vllm:kv_cache_usage_perc) > {usage_ratio}\nand on (" + _VLLM + ")\n"
                 "sum by (" + _VLLM + ") (vllm:num_requests_waiting) > {waiting}",
            summary="vLLM's KV cache for {labels.model_name} is full and requests wait.",
            description="The KV cache of {labels.model_name} on {labels.instance} is {value:humanizePercentage} "
                        "used (threshold {usage_ratio}) while more than {waiting} requests wait, for {window:5m}: "
                        "the scheduler cannot admit new sequences until running ones finish.",
            thresholds=(Threshold(name="usage_ratio", value=0.9, doc="vllm:kv_cache_usage_perc (0 to 1)"),
                        Threshold(name="waiting", value=0, doc="vllm:num_requests_waiting that must be exceeded")),
        ),
        Alert(
            name="InferwatchVLLMPreemptions", group="inferwatch-engines", severity="warning", for_s=0,
            expr="sum by (" + _VLLM + ") (increase(vllm:num_preemptions_total[{window:15m}])) > {preemptions}",
            summary="vLLM preempts running requests of {labels.model_name}.",
            description="vLLM on {labels.instance} preempted {value:humanize} running sequences of "
                        "{labels.model_name} in the last {window:15m} (threshold {preemptions}): their KV blocks "
                        "were freed and they are recomputed, so their latency grows.",
            thresholds=(Threshold(name="preemptions", value=10, doc="preemptions within 15 minutes"),),
        ),
        Alert(
            name="InferwatchVLLMTimeToFirstTokenSlow", group="inferwatch-engines", severity="warning", for_s=600,
            expr=_engine_slow_share("vllm:time_to_first_token_seconds"),
            summary="vLLM's time to first token for {labels.model_name} misses its objective.",
            description="{value:humanizePercentage} of the requests to {labels.model_name} on {labels.instance} "
                        "waited longer than {target_seconds}s for their first token over the last {window:5m} "
                        "(threshold {slow_ratio}), by vllm:time_to_first_token_seconds.",
            thresholds=(Threshold(name="target_seconds", value=1.0,
                                  doc="time-to-first-token target; must be a bucket bound of "
                                      "vllm:time_to_first_token_seconds"),
                        Threshold(name="slow_ratio", value=0.05, doc="share of requests allowed above the target")),
        ),
        Alert(
            name="InferwatchVLLMInterTokenLatencySlow", group="inferwatch-engines", severity="warning", for_s=600,
            expr=_engine_slow_share("vllm:inter_token_latency_seconds"),
            summary="vLLM's inter-token latency for {labels.model_name} misses its objective.",
            description="{value:humanizePercentage} of the token gaps of {labels.model_name} on {labels.instance} "
                        "were longer than {target_seconds}s over the last {window:5m} (threshold {slow_ratio}), by "
                        "vllm:inter_token_latency_seconds: streams stutter.",
            thresholds=(Threshold(name="target_seconds", value=0.1,
                                  doc="inter-token latency target; must be a bucket bound of "
                                      "vllm:inter_token_latency_seconds"),
                        Threshold(name="slow_ratio", value=0.05, doc="share of token gaps allowed above the target")),
        ),
    ]


def _triton_alerts() -> list[Alert]:
    """Triton: queue against compute, pending requests, failures."""
    triton_compute = ("sum by (" + _TRITON + ") (\n  rate(nv_inference_compute_input_duration_us[{window:5m}])\n"
                      "  + rate(nv_inference_compute_infer_duration_us[{window:5m}])\n"
                      "  + rate(nv_inference_compute_output_duration_us[{window:5m}])\n)")
    # Nothing ties Triton's scrape instance to the sidecar's service label: of the services that report
    # this model version, the highest (one value, whichever order the query returns them in).
    inferwatch_queue = ("max(service_model_version_stage:inferwatch_stage_duration_seconds:p99_5m"
                        "{{model='%s',model_version='%s',stage='queue'}})")
    return [
        Alert(
            # The description adds inferwatch's own P99 queue wait of the same model version (from Triton's
            # spans), joined on model and version, the highest over the services that report it.
            name="InferwatchTritonQueueDominatesCompute", group="inferwatch-engines", severity="warning",
            for_s=900,
            expr="sum by (" + _TRITON + ") (rate(nv_inference_queue_duration_us[{window:5m}]))\n/\n"
                 + triton_compute + "\n> {queue_to_compute_ratio}",
            summary="Requests to Triton model {labels.model} {labels.version} queue longer than they compute.",
            description="Requests to {labels.model} version {labels.version} on {labels.instance} spend "
                        '{value:printf "%.2g"}x their compute time waiting in the scheduler queue (threshold '
                        "{queue_to_compute_ratio}) for {window:15m}."
                        f'{{{{{{{{ with printf "{inferwatch_queue}" $labels.model $labels.version | query }}}}}}}}'
                        " Highest P99 queue wait in Triton's spans of that version: {{{{ . | first | value | humanizeDuration }}}}."
                        "{{{{ end }}}}",
            thresholds=(Threshold(name="queue_to_compute_ratio", value=1,
                                  doc="queue time over compute (input + infer + output) time"),),
        ),
        Alert(
            name="InferwatchTritonPendingRequests", group="inferwatch-engines", severity="warning", for_s=600,
            expr="min_over_time(nv_inference_pending_request_count[{window:5m}]) > {pending}",
            summary="Triton model {labels.model} {labels.version} has a standing backlog.",
            description="At least {value:humanize} requests to {labels.model} version {labels.version} on "
                        "{labels.instance} have waited for execution through the last {window:5m} (threshold "
                        "{pending}), for {window:10m}.",
            thresholds=(Threshold(name="pending", value=50,
                                  doc="nv_inference_pending_request_count that must be exceeded for the whole "
                                      "5-minute window"),),
        ),
        Alert(
            name="InferwatchTritonRequestFailures", group="inferwatch-engines", severity="critical", for_s=300,
            expr="sum by (" + _TRITON + ", reason) (rate(nv_inference_request_failure[{window:5m}]))\n"
                 "/ ignoring (reason) group_left ()\n(\n"
                 "  sum by (" + _TRITON + ") (rate(nv_inference_request_success[{window:5m}]))\n"
                 "  + sum by (" + _TRITON + ") (rate(nv_inference_request_failure[{window:5m}]))\n"
                 ") > {failure_ratio}",
            summary="Triton fails requests to {labels.model} {labels.version} ({labels.reason}).",
            description="{value:humanizePercentage} of the requests to {labels.model} version {labels.version} on "
                        "{labels.instance} failed with reason {labels.reason} over the last {window:5m} "
                        "(threshold {failure_ratio}).",
            thresholds=(Threshold(name="failure_ratio", value=0.01,
                                  doc="share of requests failing with one reason"),),
        ),
    ]


def _engine_alerts() -> list[Alert]:
    """Every engine alert, in file order."""
    return [*_vllm_alerts(), *_triton_alerts()]

"""Triton Inference Server: its own ``nv_inference_*`` metrics, and beside them what inferwatch makes of its spans.

Triton labels the model ``model`` and ``version``; inferwatch's series from Triton's spans carry the same values
as ``model`` and ``model_version`` (docs/triton.md), so the last row joins the two on model and version.
"""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.src.common import (
    RATE,
    Row,
    dashboard,
    datasource_var,
    hist_rate,
    query_var,
    target,
    threshold,
    timeseries,
)

UID = "inferwatch-triton"
#: Triton's own series of the chosen models and versions.
TRITON = 'model=~"$model", version=~"$version"'
#: inferwatch's series of the same models and versions (from Triton's spans).
OURS = 'model=~"$model", model_version=~"$version"'
BY = "model, version"
#: inferwatch's stage histogram, and the span stage Triton's queue time becomes.
STAGE = "inferwatch_stage_duration_seconds"
QUEUE = '"queue"'
LEGEND = "{{model}} {{version}}"
#: Triton's per-request phases, as its cumulative microsecond counters.
PHASES = (("queue", "queue"), ("compute_input", "compute input"), ("compute_infer", "compute infer"),
          ("compute_output", "compute output"))


def _rate(metric: str) -> str:
    return f"sum by ({BY}) (rate({metric}{{{TRITON}}}[{RATE}]))"


def _requests() -> str:
    """Requests per second that Triton finished, successful or not."""
    return (f"(\n  {_rate('nv_inference_request_success')}\n  + {_rate('nv_inference_request_failure')}\n)")


def _as_model_version(expr: str) -> str:
    """A Triton series with its ``version`` copied to ``model_version``, to join with inferwatch's."""
    return f'label_replace({expr}, "model_version", "$1", "version", "(.*)")'


def build() -> Dashboard:
    failure_ratio = threshold("InferwatchTritonRequestFailures", "failure_ratio")
    queue_ratio = threshold("InferwatchTritonQueueDominatesCompute", "queue_to_compute_ratio")
    pending = threshold("InferwatchTritonPendingRequests", "pending")
    compute = " + ".join(f"rate(nv_inference_{p}_duration_us{{{TRITON}}}[{RATE}])" for p, _ in PHASES[1:])
    return dashboard(
        uid=UID, title="inferwatch / Triton",
        description="Triton's own metrics (nv_inference_*) per model and version, beside what inferwatch "
                    "measures from Triton's spans.",
        variables=[
            datasource_var(),
            query_var("model", "Model", "label_values(nv_inference_request_success, model)"),
            query_var("version", "Version", 'label_values(nv_inference_request_success{model=~"$model"}, version)'),
        ],
        items=[
            Row("Requests (Triton's counters)"),
            timeseries(title="Triton requests per second", unit="reqps", minimum=0,
                       description="Successful requests, and failed requests by Triton's reason.",
                       targets=[target(_rate("nv_inference_request_success"), f"{LEGEND} success"),
                                target(f"sum by ({BY}, reason) (rate(nv_inference_request_failure{{{TRITON}}}"
                                       f"[{RATE}])) > 0", f"{LEGEND} {{{{reason}}}}")]),
            timeseries(title="Triton failure ratio by reason", unit="percentunit", minimum=0,
                       thresholds=[(failure_ratio, "red")],
                       description="Share of requests failing with each reason; red at "
                                   "InferwatchTritonRequestFailures' threshold.",
                       targets=[target(f"sum by ({BY}, reason) (rate(nv_inference_request_failure{{{TRITON}}}"
                                       f"[{RATE}]))\n/ ignoring (reason) group_left ()\n{_requests()}",
                                       f"{LEGEND} {{{{reason}}}}")]),
            Row("Where the time goes (Triton's counters)"),
            timeseries(title="Triton mean time per request by phase (stacked)", unit="s", stack=True, minimum=0,
                       description="Microseconds Triton adds up per phase, divided by the requests: queue, then "
                                   "the backend's input, inference and output.",
                       targets=[target(f"{_rate(f'nv_inference_{p}_duration_us')}\n/ {_requests()}\n/ 1e6",
                                       f"{LEGEND} {name}") for p, name in PHASES]),
            timeseries(title="Triton queue time over compute time", unit="short", minimum=0,
                       thresholds=[(queue_ratio, "red")],
                       description="Queue time divided by compute (input + infer + output) time; red at "
                                   "InferwatchTritonQueueDominatesCompute's threshold.",
                       targets=[target(f"{_rate('nv_inference_queue_duration_us')}\n/\n"
                                       f"sum by ({BY}) ({compute})", LEGEND)]),
            timeseries(title="Triton pending requests", minimum=0, thresholds=[(pending / 2, "yellow"),
                                                                              (pending, "red")],
                       description="Requests waiting for execution; red at InferwatchTritonPendingRequests' "
                                   "threshold.",
                       targets=[target(f"max by ({BY}) (nv_inference_pending_request_count{{{TRITON}}})", LEGEND)]),
            timeseries(title="Triton inferences per execution", minimum=0,
                       description="Inferences (batch items) per model execution: how full dynamic batching makes "
                                   "the batches Triton runs (1 = no batching).",
                       targets=[target(f"{_rate('nv_inference_count')}\n/\n{_rate('nv_inference_exec_count')}",
                                       LEGEND)]),
            Row("Triton beside inferwatch (joined on model and version)"),
            timeseries(title="Mean queue wait: Triton's counters and its spans", unit="s", minimum=0,
                       description="Triton's cumulative queue time per request, and inferwatch's queue stage from "
                                   "the spans (QUEUE_START to COMPUTE_START): the same quantity, so the lines agree "
                                   "when every request is traced.",
                       targets=[
                           target(f"{_rate('nv_inference_queue_duration_us')}\n/ {_requests()}\n/ 1e6",
                                  f"{LEGEND} counters"),
                           target(f"{hist_rate(STAGE, 'sum', OURS + ', stage=' + QUEUE, 'model, model_version')}"
                                  f"\n/\n{hist_rate(STAGE, 'count', OURS + ', stage=' + QUEUE, 'model, model_version')}",
                                  "{{model}} {{model_version}} spans"),
                       ]),
            timeseries(title="Traced share of Triton's requests", unit="percentunit", minimum=0,
                       description="inferwatch's requests from Triton's spans over Triton's own request count, "
                                   "joined on model and version: 100% with trace rate=1, the sampling rate "
                                   "otherwise; lower means spans are lost on the way.",
                       targets=[target(
                           f"sum by (model, model_version) (rate(inferwatch_requests_total{{{OURS}}}[{RATE}]))\n"
                           f"/ on (model, model_version)\n{_as_model_version(_requests())}",
                           "{{model}} {{model_version}}")]),
        ],
    )

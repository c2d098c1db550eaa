"""Generate inferwatch's Grafana dashboards from code that reads the metric catalog.

Usage::

    python dashboards/generate.py          # rewrite dashboards/*.json
    python dashboards/generate.py --check  # exit 1 when a JSON file is stale
    python dashboards/generate.py --list   # print every panel query

Every query is checked while generating: each series it names must be in the
metric catalog (``inferwatch_sidecar.metrics.catalog``) or be one of the recording
rules of ``alerts/source.py``, and each label it matches must belong to that
series. A renamed metric therefore fails generation instead of leaving a
panel empty. Thresholds drawn on panels come from the alert that watches the
same signal, so the picture and the page agree.

Conventions (for Grafana file provisioning): a ``datasource``-type template
variable instead of ``__inputs``; ``service``, ``model`` and ``version``
variables (``version`` holds the ``model_version`` label's values); stable
UIDs; units and thresholds on every panel.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make ``alerts`` and ``dashboards`` importable
    sys.path.insert(0, str(ROOT))

from alerts import promql, source  # noqa: E402

OUT_DIR = ROOT / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"

#: Regex of the profile column names that hold the confidence (the drift metrics carry no role label;
#: ``__confidence__`` is the column name of warm-up references).
CONFIDENCE_FEATURES = "__confidence__|.*conf.*|.*prob.*|score"

# Label selectors shared by the panels. Core and drift metrics both label the version ``model_version``; every
# model dashboard fills its ``version`` variable from that label, so a chosen version carries across dashboards.
CORE = 'service=~"$service", model=~"$model", model_version=~"$version"'
DRIFT = 'model=~"$model", model_version=~"$version"'
GPU = 'instance=~"$instance", gpu=~"$gpu"'
INST = 'instance=~"$instance"'


def _threshold(alert: str, name: str) -> float:
    a = next(a for a in source.ALERTS if a.name == alert)
    v = next(t.value for t in a.thresholds if t.name == name)
    assert isinstance(v, (int, float))
    return float(v)


# ---------------------------------------------------------------------------------------------------------------
# building blocks
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Target:
    """One query of a panel."""

    expr: str
    legend: str = ""
    exemplar: bool = False
    fmt: str = "time_series"
    instant: bool = False


@dataclass
class Panel:
    """One panel; ``w``/``h`` are grid units (24 columns)."""

    title: str
    targets: list[Target]
    kind: str = "timeseries"
    unit: str = "short"
    description: str = ""
    w: int = 12
    h: int = 8
    thresholds: list[tuple[float, str]] = field(default_factory=list)
    stack: bool = False
    minimum: float | None = None
    maximum: float | None = None
    mappings: list[dict[str, Any]] = field(default_factory=list)
    log_scale: bool = False
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Row:
    title: str


def _steps(thresholds: list[tuple[float, str]]) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    steps += [{"color": color, "value": value} for value, color in thresholds]
    return {"mode": "absolute", "steps": steps}


def _panel_json(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": p.unit, "thresholds": _steps(p.thresholds), "mappings": p.mappings}
    if p.minimum is not None:
        defaults["min"] = p.minimum
    if p.maximum is not None:
        defaults["max"] = p.maximum
    options: dict[str, Any] = {}
    if p.kind == "timeseries":
        defaults["color"] = {"mode": "palette-classic"}
        defaults["custom"] = {
            "drawStyle": "line", "lineWidth": 1, "fillOpacity": 30 if p.stack else 10, "showPoints": "never",
            "stacking": {"mode": "normal" if p.stack else "none", "group": "A"},
            "thresholdsStyle": {"mode": "dashed" if p.thresholds else "off"},
            "scaleDistribution": {"type": "log", "log": 10} if p.log_scale else {"type": "linear"},
        }
        options = {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max", "lastNotNull"]},
                   "tooltip": {"mode": "multi", "sort": "desc"}}
    elif p.kind == "stat":
        defaults["color"] = {"mode": "thresholds"}
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "colorMode": "background", "graphMode": "area", "textMode": "auto"}
    elif p.kind == "heatmap":
        options = {"calculate": False, "yAxis": {"unit": p.unit}, "color": {"scheme": "Oranges", "mode": "scheme"},
                   "cellGap": 1, "tooltip": {"show": True, "yHistogram": False},
                   "exemplars": {"color": "rgba(255,0,255,0.7)"}}
    elif p.kind == "bargauge":
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "orientation": "horizontal", "displayMode": "gradient"}
    elif p.kind == "table":
        options = {"showHeader": True}
    elif p.kind == "state-timeline":
        defaults["color"] = {"mode": "thresholds"}
        options = {"showValue": "never", "mergeValues": True, "rowHeight": 0.9}
    options.update(p.options)
    targets = []
    for i, t in enumerate(p.targets):
        tj: dict[str, Any] = {"datasource": DS, "expr": t.expr, "refId": chr(ord("A") + i),
                              "legendFormat": t.legend or "__auto", "format": t.fmt}
        if t.exemplar:
            tj["exemplar"] = True
        if t.instant:
            tj["instant"], tj["range"] = True, False
        targets.append(tj)
    return {
        "id": pid, "type": p.kind, "title": p.title, "description": p.description, "datasource": DS,
        "gridPos": {"h": p.h, "w": p.w, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []}, "options": options, "targets": targets,
    }


def _var_query(name: str, label: str, query: str, *, multi: bool = True, regex: str = "") -> dict[str, Any]:
    return {
        "name": name, "label": label, "type": "query", "datasource": DS,
        "query": {"query": query, "refId": f"{name}-var"}, "definition": query,
        "refresh": 2, "sort": 1, "multi": multi, "includeAll": True, "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "regex": regex, "hide": 0,
        "options": [],
    }


def _datasource_var() -> dict[str, Any]:
    return {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": [], "includeAll": False,
            "multi": False}


def core_vars() -> list[dict[str, Any]]:
    """service, model and version from the request counter (core metrics)."""
    return [
        _datasource_var(),
        _var_query("service", "Service", "label_values(inferwatch_requests_total, service)"),
        _var_query("model", "Model", 'label_values(inferwatch_requests_total{service=~"$service"}, model)'),
        _var_query("version", "Version",
                   'label_values(inferwatch_requests_total{service=~"$service", model=~"$model"}, model_version)'),
    ]


@dataclass
class Dashboard:
    """One dashboard: a stable UID, its variables and its panels in reading order."""

    uid: str
    title: str
    description: str
    variables: list[dict[str, Any]]
    items: list[Panel | Row]
    filename: str

    def panels(self) -> Iterator[Panel]:
        for it in self.items:
            if isinstance(it, Panel):
                yield it

    def to_json(self) -> dict[str, Any]:
        panels: list[dict[str, Any]] = []
        x = y = row_h = 0
        pid = 1
        for it in self.items:
            if isinstance(it, Row):
                if x:
                    y, x, row_h = y + row_h, 0, 0
                panels.append({"id": pid, "type": "row", "title": it.title, "collapsed": False,
                               "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
                pid, y = pid + 1, y + 1
                continue
            if x + it.w > 24:
                y, x, row_h = y + row_h, 0, 0
            panels.append(_panel_json(it, pid, x, y))
            pid, x, row_h = pid + 1, x + it.w, max(row_h, it.h)
        return {
            "uid": self.uid, "title": self.title, "description": self.description,
            "tags": ["inferwatch"], "timezone": "browser", "editable": True, "graphTooltip": 1,
            "schemaVersion": 39, "version": 1, "refresh": "30s",
            "time": {"from": "now-1h", "to": "now"}, "timepicker": {},
            "fiscalYearStartMonth": 0, "liveNow": False, "weekStart": "",
            "links": [{"title": "inferwatch", "type": "dashboards", "tags": ["inferwatch"], "asDropdown": True,
                       "includeVars": True, "keepTime": True, "icon": "external link", "targetBlank": False,
                       "tooltip": "", "url": ""}],
            "annotations": {"list": [
                {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
                 "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts",
                 "type": "dashboard"},
            ]},
            "templating": {"list": self.variables},
            "panels": panels,
        }


def _quantiles(metric: str, sel: str, by: str, *, exemplar: bool = False,
               qs: tuple[tuple[float, str], ...] = ((0.5, "P50"), (0.99, "P99"), (0.999, "P999"))) -> list[Target]:
    group = f"{by}, le" if by else "le"
    prefix = "".join(f"{{{{{b.strip()}}}}} " for b in by.split(",") if b.strip())
    return [Target(f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{sel}}}[{RATE}])))",
                   f"{prefix}{name}", exemplar=exemplar) for q, name in qs]


# ---------------------------------------------------------------------------------------------------------------
# the dashboards
# ---------------------------------------------------------------------------------------------------------------


def overview() -> Dashboard:
    err = _threshold("InferwatchHighErrorRate", "error_ratio")
    p99_target = _threshold("InferwatchStageLatencyP99BudgetBurn", "target_seconds")
    burn = _threshold("InferwatchStageLatencyP99BudgetBurn", "burn_rate")
    objective = _threshold("InferwatchStageLatencyP99BudgetBurn", "objective")
    items: list[Panel | Row] = [
        Row("Traffic and errors"),
        Panel("Requests per second", [Target(f"sum(rate(inferwatch_requests_total{{{CORE}}}[{RATE}]))", "QPS")],
              "stat", "reqps", "Finished requests per second, all outcomes.", w=6, h=4),
        Panel("Error ratio", [Target(
            f'(sum(rate(inferwatch_requests_total{{{CORE}, outcome="error"}}[{RATE}])) or vector(0))\n/\n'
            f"sum(rate(inferwatch_requests_total{{{CORE}}}[{RATE}]))", "errors")],
            "stat", "percentunit", "Share of requests ending in an error; red at InferwatchHighErrorRate's threshold.",
            w=6, h=4, thresholds=[(err / 5, "yellow"), (err, "red")]),
        Panel("End-to-end P99", [Target(
            f"histogram_quantile(0.99, sum by (le) (rate(inferwatch_request_duration_seconds_bucket{{{CORE}}}[{RATE}])))",
            "P99")], "stat", "s", "99th percentile of end-to-end latency.", w=6, h=4,
            thresholds=[(p99_target / 2, "yellow"), (p99_target, "red")]),
        Panel("Firing inferwatch alerts", [Target('count(ALERTS{alertname=~"Inferwatch.*", alertstate="firing"}) '
                                                  'or vector(0)', "alerts")],
              "stat", "short", "Alerts of the inferwatch rules that are firing now.", w=6, h=4,
              thresholds=[(1, "red")]),
        Panel("Requests by outcome", [Target(
            f"sum by (model, model_version, outcome) (rate(inferwatch_requests_total{{{CORE}}}[{RATE}]))",
            "{{model}} {{model_version}} {{outcome}}")], unit="reqps",
            description="Finished requests per second by model version and outcome (ok, error, cancelled).",
            stack=True, minimum=0),
        Panel("Errors by type", [Target(
            f"sum by (model, model_version, error_type) (rate(inferwatch_request_errors_total{{{CORE}}}[{RATE}]))",
            "{{model}} {{model_version}} {{error_type}}")], unit="reqps",
            description="Failed requests per second by bounded error type.", stack=True, minimum=0),
        Row("Latency and SLO"),
        Panel("End-to-end latency P50 / P99 / P999",
              _quantiles("inferwatch_request_duration_seconds", CORE, "model, model_version", exemplar=True),
              unit="s", description="End-to-end latency quantiles; exemplar dots link to the request and trace.",
              thresholds=[(p99_target, "red")], log_scale=True),
        Panel("P99 latency budget burn rate by stage", [Target(
            f"max by (stage) (service_model_version_stage:inferwatch_stage_slow_p99:ratio_rate1h{{{CORE}}})"
            f" / (1 - {objective:g})", "{{stage}}")], unit="short",
            description=f"How fast each stage spends its P99 budget ({objective:.0%} of calls within "
                        f"{p99_target:g}s) over 1h; 1 is sustainable, the page fires at {burn:g} "
                        "(InferwatchStageLatencyP99BudgetBurn).",
            thresholds=[(1, "yellow"), (burn, "red")], minimum=0),
        Panel("Stage P99 (recorded, 5m)", [Target(
            f"max by (stage) (service_model_version_stage:inferwatch_stage_duration_seconds:p99_5m{{{CORE}}})",
            "{{stage}}")], unit="s", description="Per-stage P99 over 5 minutes from the recording rules.",
            thresholds=[(p99_target, "red")], w=24),
    ]
    return Dashboard("inferwatch-overview", "inferwatch / Service overview and SLO",
                     "QPS, errors by type, end-to-end latency and the latency SLO of an inference service.",
                     core_vars(), items, "overview.json")


def stages() -> Dashboard:
    p99_target = _threshold("InferwatchStageLatencyP99BudgetBurn", "target_seconds")
    p999_target = _threshold("InferwatchStageLatencyP999BudgetBurn", "target_seconds")
    sel = f'{CORE}, stage=~"$stage"'
    variables = [*core_vars(), _var_query(
        "stage", "Stage",
        'label_values(inferwatch_stage_duration_seconds_count{service=~"$service", model=~"$model"}, stage)')]
    items: list[Panel | Row] = [
        Row("Per-stage latency (exemplars on: click a dot for the request and trace ID)"),
        Panel("Stage P50", _quantiles("inferwatch_stage_duration_seconds", sel, "stage", exemplar=True,
                                      qs=((0.5, "P50"),)), unit="s", w=8,
              description="Median latency of each stage."),
        Panel("Stage P99", _quantiles("inferwatch_stage_duration_seconds", sel, "stage", exemplar=True,
                                      qs=((0.99, "P99"),)), unit="s", w=8,
              description="99th percentile of each stage; red at the P99 latency target.",
              thresholds=[(p99_target, "red")]),
        Panel("Stage P999", _quantiles("inferwatch_stage_duration_seconds", sel, "stage", exemplar=True,
                                       qs=((0.999, "P999"),)), unit="s", w=8,
              description="99.9th percentile of each stage; red at the P999 latency target.",
              thresholds=[(p999_target, "red")]),
        Row("Where the time goes"),
        Panel("Mean time per request by stage (stacked)", [Target(
            f"sum by (stage) (rate(inferwatch_stage_duration_seconds_sum{{{sel}}}[{RATE}]))\n"
            f"/ ignoring (stage) group_left\nsum(rate(inferwatch_requests_total{{{CORE}}}[{RATE}]))",
            "{{stage}}")], unit="s", stack=True, minimum=0,
            description="Seconds each stage adds to the average request; the stack is the mean request time."),
        Panel("Share of stage time", [Target(
            f"sum by (stage) (rate(inferwatch_stage_duration_seconds_sum{{{sel}}}[{RATE}]))\n"
            f"/ ignoring (stage) group_left\nsum(rate(inferwatch_stage_duration_seconds_sum{{{sel}}}[{RATE}]))",
            "{{stage}}")], unit="percentunit", stack=True, minimum=0, maximum=1,
            description="Fraction of all stage time spent in each stage."),
        Panel("Stage latency distribution", [Target(
            f"sum by (le) (rate(inferwatch_stage_duration_seconds_bucket{{{sel}}}[{RATE}]))", "{{le}}",
            exemplar=True, fmt="heatmap")], "heatmap", "s", w=24,
            description="Calls per second in each latency bucket of the selected stages, over time."),
        Panel("Stage calls per second", [Target(
            f"sum by (stage) (rate(inferwatch_stage_duration_seconds_count{{{sel}}}[{RATE}]))", "{{stage}}")],
            unit="ops", w=24, description="Calls per second of each stage.", minimum=0),
    ]
    return Dashboard("inferwatch-stages", "inferwatch / Stage breakdown",
                     "Per-stage P50/P99/P999 with exemplars, and where each request's time goes.",
                     variables, items, "stages.json")


def queue() -> Dashboard:
    depth = _threshold("InferwatchQueueBacklog", "depth")
    items: list[Panel | Row] = [
        Row("Queue"),
        Panel("Queue wait P50 / P99 / P999",
              _quantiles("inferwatch_queue_wait_seconds", CORE, "model, model_version", exemplar=True), unit="s",
              description="Time requests waited in the queue stages (ingest.queue_stages)."),
        Panel("Queue depth", [Target(f"max by (model, model_version) (inferwatch_queue_depth{{{CORE}}})",
                                     "{{model}} {{model_version}}")], unit="short", minimum=0,
              description="Latest reported queue depth; red at InferwatchQueueBacklog's threshold.",
              thresholds=[(depth / 2, "yellow"), (depth, "red")]),
        Row("Dynamic batching"),
        Panel("Batch size distribution", [Target(
            f"sum by (le) (rate(inferwatch_batch_size_bucket{{{CORE}}}[{RATE}]))", "{{le}}", fmt="heatmap")],
            "heatmap", "short", description="Batches per second by batch size bucket."),
        Panel("Mean batch size and batches per second", [
            Target(f"sum(rate(inferwatch_batch_size_sum{{{CORE}}}[{RATE}]))\n/\n"
                   f"sum(rate(inferwatch_batch_size_count{{{CORE}}}[{RATE}]))", "mean batch size"),
            Target(f"sum(rate(inferwatch_batch_size_count{{{CORE}}}[{RATE}]))", "batches/s"),
        ], unit="short", minimum=0, description="Average items per batch, and batches formed per second."),
        Panel("Batch size P50 / P99",
              _quantiles("inferwatch_batch_size", CORE, "", qs=((0.5, "P50"), (0.99, "P99"))), unit="short",
              w=24, minimum=0, description="Batch size quantiles."),
    ]
    return Dashboard("inferwatch-queue", "inferwatch / Queue and batching",
                     "Queue wait, queue depth and the dynamic batch-size distribution.", core_vars(), items,
                     "queue.json")


def llm() -> Dashboard:
    sel = f'{CORE}, stage=~"$stage"'
    variables = [*core_vars(), _var_query(
        "stage", "Streaming stage",
        'label_values(inferwatch_generated_tokens_total{service=~"$service", model=~"$model"}, stage)')]
    items: list[Panel | Row] = [
        Row("Streaming latency"),
        Panel("Time to first token P50 / P99 / P999",
              _quantiles("inferwatch_time_to_first_token_seconds", sel, "stage"), unit="s",
              description="Time from the start of a streaming stage to its first token."),
        Panel("Inter-token latency P50 / P99 / P999",
              _quantiles("inferwatch_inter_token_latency_seconds", sel, "stage"), unit="s",
              description="Gaps between consecutive tokens."),
        Row("Throughput"),
        Panel("Tokens per second", [Target(
            f"sum by (model, model_version, stage) (rate(inferwatch_generated_tokens_total{{{sel}}}[{RATE}]))",
            "{{model}} {{model_version}} {{stage}}")], unit="short", stack=True, minimum=0,
            description="Tokens (items) yielded per second by streaming stages."),
        Panel("Tokens per stream P50 / P99",
              _quantiles("inferwatch_generation_length_tokens", sel, "stage", qs=((0.5, "P50"), (0.99, "P99"))),
              unit="short", minimum=0, description="Tokens yielded per streaming call."),
        Panel("Mean tokens per second per stream", [Target(
            f"sum by (stage) (rate(inferwatch_generation_length_tokens_sum{{{sel}}}[{RATE}]))\n/\n"
            f"sum by (stage) (rate(inferwatch_time_to_first_token_seconds_sum{{{sel}}}[{RATE}])\n"
            f"  + rate(inferwatch_inter_token_latency_seconds_sum{{{sel}}}[{RATE}]))", "{{stage}}")],
            unit="short", w=24, minimum=0,
            description="Tokens divided by streaming time (first-token wait plus inter-token gaps): the speed "
                        "one user sees."),
    ]
    return Dashboard("inferwatch-llm", "inferwatch / LLM streaming",
                     "Time to first token, inter-token latency and tokens per second.", variables, items, "llm.json")


def gpu() -> Dashboard:
    frag = _threshold("InferwatchGPUAllocatorFragmented", "ratio")
    free_warn = _threshold("InferwatchGPUMemoryFillingUp", "free_ratio")
    free_crit = _threshold("InferwatchGPUMemoryFillingUpSoon", "free_ratio")
    variables = [
        _datasource_var(),
        _var_query("instance", "Sidecar", "label_values(inferwatch_gpu_collector_up, instance)"),
        _var_query("gpu", "GPU", 'label_values(inferwatch_gpu_memory_total_bytes{instance=~"$instance"}, gpu)'),
    ]
    verdict = [{"type": "value", "options": {"0": {"text": "no leak", "color": "green", "index": 0},
                                             "1": {"text": "LEAK", "color": "red", "index": 1}}}]
    up_map = [{"type": "value", "options": {"0": {"text": "DOWN", "color": "red", "index": 0},
                                            "1": {"text": "up", "color": "green", "index": 1}}}]
    items: list[Panel | Row] = [
        Row("Memory"),
        Panel("Device memory used / total", [
            Target(f"inferwatch_gpu_memory_used_bytes{{{GPU}}}", "GPU {{gpu}} used"),
            Target(f"inferwatch_gpu_memory_total_bytes{{{GPU}}}", "GPU {{gpu}} total"),
        ], unit="bytes", minimum=0, description="Device memory in use and the device's total, from NVML."),
        Panel("Free memory share", [Target(
            f"inferwatch_gpu_memory_free_bytes{{{GPU}}} / inferwatch_gpu_memory_total_bytes{{{GPU}}}",
            "GPU {{gpu}}")], unit="percentunit", minimum=0, maximum=1,
            description="Free share of device memory; the filling-up alerts' level gates are drawn.",
            thresholds=[(free_crit, "red"), (free_warn, "yellow"), (free_warn + 0.0001, "green")]),
        Panel("Per-process memory", [Target(
            f"inferwatch_gpu_process_memory_used_bytes{{{GPU}}}", "GPU {{gpu}} pid {{pid}} {{container}}")],
            unit="bytes", minimum=0, stack=True, description="Device memory per process (NVML compute processes)."),
        Panel("Allocator allocated / reserved", [
            Target(f"inferwatch_gpu_allocator_allocated_bytes{{{GPU}}}", "pid {{pid}} allocated"),
            Target(f"inferwatch_gpu_allocator_reserved_bytes{{{GPU}}}", "pid {{pid}} reserved"),
        ], unit="bytes", minimum=0, description="PyTorch caching allocator: bytes in live tensors and reserved."),
        Row("Leak detection"),
        Panel("Leak verdict", [Target(f"max by (gpu, pid) (inferwatch_gpu_leak_detected{{{GPU}}})",
                                      "GPU {{gpu}} pid {{pid}}")],
              "state-timeline", "short", "The leak detector's verdict per device (empty pid) and process.",
              w=24, h=5, mappings=verdict, thresholds=[(1, "red")]),
        Panel("Leak rate (with confidence interval)", [
            Target(f"inferwatch_gpu_leak_rate_bytes_per_second{{{GPU}}}", "GPU {{gpu}} pid {{pid}} rate"),
            Target(f"inferwatch_gpu_leak_rate_lower_bytes_per_second{{{GPU}}}", "GPU {{gpu}} pid {{pid}} lower"),
            Target(f"inferwatch_gpu_leak_rate_upper_bytes_per_second{{{GPU}}}", "GPU {{gpu}} pid {{pid}} upper"),
        ], unit="Bps", description="Theil-Sen growth rate of the memory floor and its confidence interval."),
        Panel("Time to OOM", [Target(f"min by (gpu, pid) (inferwatch_gpu_leak_time_to_oom_seconds{{{GPU}}})",
                                     "GPU {{gpu}} pid {{pid}}")],
              "stat", "s", "Seconds until device memory runs out at the leak rate (only while leaking).",
              thresholds=[(0, "red"), (14400, "yellow"), (86400, "green")]),
        Row("Fragmentation"),
        Panel("Fragmentation ratio", [Target(f"inferwatch_gpu_allocator_fragmentation_ratio{{{GPU}}}",
                                             "GPU {{gpu}} pid {{pid}}")],
              unit="percentunit", minimum=0, maximum=1, w=8, thresholds=[(frag, "red")],
              description="Inactive-split bytes / reserved bytes; red at InferwatchGPUAllocatorFragmented's "
                          "threshold."),
        Panel("Alloc retries and OOMs per second", [
            Target(f"rate(inferwatch_gpu_allocator_alloc_retries_total{{{GPU}}}[{RATE}])", "pid {{pid}} retries"),
            Target(f"rate(inferwatch_gpu_allocator_ooms_total{{{GPU}}}[{RATE}])", "pid {{pid}} OOMs"),
        ], unit="ops", minimum=0, w=8, description="cudaMalloc retries after a cache flush, and allocator OOMs."),
        Panel("Non-allocator memory", [Target(f"inferwatch_gpu_process_non_allocator_memory_bytes{{{GPU}}}",
                                              "GPU {{gpu}} pid {{pid}}")],
              unit="bytes", w=8, description="NVML per-process used minus allocator reserved: CUDA context, "
                                             "cuBLAS/NCCL workspaces, native leaks."),
        Row("Utilization"),
        Panel("Utilization", [
            Target(f"inferwatch_gpu_utilization_ratio{{{GPU}}}", "GPU {{gpu}} kernels"),
            Target(f"inferwatch_gpu_memory_utilization_ratio{{{GPU}}}", "GPU {{gpu}} memory bus"),
        ], unit="percentunit", minimum=0, maximum=1, description="Share of time a kernel ran / memory was accessed."),
        Panel("Temperature and power", [
            Target(f"inferwatch_gpu_temperature_celsius{{{GPU}}}", "GPU {{gpu}} °C"),
            Target(f"inferwatch_gpu_power_watts{{{GPU}}}", "GPU {{gpu}} W"),
        ], unit="short", description="Core temperature (°C) and board power (W), where supported."),
        Row("Collector health"),
        Panel("GPU collector", [Target(f"inferwatch_gpu_collector_up{{{INST}}}", "{{instance}}")],
              "state-timeline", "short", "1 when the last sampling pass returned device data.", w=8, h=5,
              mappings=up_map, thresholds=[(1, "green")], options={}),
        Panel("Seconds since the last good sample", [Target(
            f"inferwatch_gpu_collector_last_success_age_seconds{{{INST}}}", "{{instance}}")],
            "stat", "s", "-1 before the first sample.", w=8, h=5, thresholds=[(10, "yellow"), (60, "red")]),
        Panel("Collector errors and CPU", [
            Target(f"sum by (error, op) (rate(inferwatch_gpu_collector_errors_total{{{INST}}}[{RATE}]))",
                   "{{error}} {{op}}"),
            Target(f"rate(inferwatch_gpu_collector_cpu_seconds_total{{{INST}}}[{RATE}])", "sampler CPU (s/s)"),
            Target(f"rate(inferwatch_gpu_collector_samples_total{{{INST}}}[{RATE}])", "samples/s"),
        ], unit="short", w=8, minimum=0, h=5, description="Sampling errors by NVML operation, the sampler's CPU "
                                                          "use and its sampling rate."),
    ]
    return Dashboard("inferwatch-gpu", "inferwatch / GPU memory",
                     "Device and per-process GPU memory, leak verdicts with rate and time-to-OOM, allocator "
                     "fragmentation, utilization and collector health.", variables, items, "gpu.json")


def drift() -> Dashboard:
    acc = _threshold("InferwatchEstimatedAccuracyLow", "accuracy")
    drop = _threshold("InferwatchConfidenceDrop", "drop")
    variables = [
        _datasource_var(),
        _var_query("model", "Model", "label_values(inferwatch_drift_window_events, model)"),
        _var_query("version", "Version", 'label_values(inferwatch_drift_window_events{model=~"$model"}, model_version)'),
        {**_var_query("measure", "Score", 'label_values(inferwatch_drift_feature_score{model=~"$model"}, measure)',
                      multi=False),
         "includeAll": False, "current": {"selected": True, "text": "jensen_shannon", "value": "jensen_shannon"}},
    ]
    conf = f'{DRIFT}, feature=~"{CONFIDENCE_FEATURES}"'
    items: list[Panel | Row] = [
        Row("Features"),
        Panel("Drift score by feature over time", [Target(
            f'max by (feature) (inferwatch_drift_feature_score{{{DRIFT}, measure=~"$measure"}})', "{{feature}}")],
            "heatmap", "short", "The chosen drift score (effect size) of each feature, one row per feature.",
            w=24, h=10, options={"yAxis": {"unit": "short", "axisPlacement": "left"},
                                 "rowsFrame": {"layout": "auto"}}),
        Panel("Fleet-wide PSI by feature (all replicas, 10m)", [Target(
            f"max by (feature) (model_feature:inferwatch_drift_psi:10m{{{DRIFT}}})", "{{feature}}")],
            unit="short", w=24, minimum=0, thresholds=[(0.1, "yellow"), (0.25, "red")],
            description="PSI of the whole fleet's last 10 minutes against the reference, from the recording rules "
                        "of alerts/drift.rules.yml (needs every replica on the same reference file). 0.1 / 0.25 are "
                        "the usual 'moderate' / 'major' shift marks."),
        Panel("Share of features drifted", [Target(
            f"inferwatch_drift_dataset_drifted_ratio{{{DRIFT}}}", "{{model}} {{model_version}}")],
            unit="percentunit", minimum=0, maximum=1, w=8,
            description="Share of input features whose adjusted p-value and effect size cross their limits."),
        Panel("Drifted features", [Target(f"sum by (model, model_version) (inferwatch_drift_feature_drifted{{{DRIFT}}})",
                                          "{{model}} {{model_version}}")],
              "stat", "short", "Features flagged as drifted in the current window.", w=8, thresholds=[(1, "red")]),
        Panel("Adjusted p-value by feature", [Target(
            f"min by (feature) (inferwatch_drift_feature_adjusted_p_value{{{DRIFT}}})", "{{feature}}")],
            unit="short", w=8, log_scale=True, thresholds=[(0.05, "green")],
            description="Benjamini-Hochberg adjusted p-values (log scale); low means different from reference."),
        Row("Predictions and confidence"),
        Panel("Prediction mix", [Target(
            f"inferwatch_drift_prediction_class_ratio{{{DRIFT}}}", "{{model_version}} {{class}}")],
            unit="percentunit", stack=True, minimum=0, maximum=1, w=8,
            description="Share of each predicted class in the current window."),
        Panel("Confidence distribution (current vs reference)", [
            Target(f"sum by (bin) (increase(inferwatch_drift_bin_events_total{{{conf}}}[$__range]))\n/ ignoring (bin)"
                   f" group_left\nsum(increase(inferwatch_drift_bin_events_total{{{conf}}}[$__range]))",
                   "current bin {{bin}}", instant=True),
            Target(f"avg by (bin) (inferwatch_drift_reference_bin_ratio{{{conf}}})", "reference bin {{bin}}",
                   instant=True),
        ], "bargauge", "percentunit", "Share of confidences per reference bin over the dashboard's time range, "
                                     "next to the reference's share.", w=8, minimum=0, maximum=1),
        Panel("Mean confidence", [Target(f"inferwatch_drift_confidence_mean{{{DRIFT}}}",
                                         "{{model_version}} {{window}}")],
              unit="short", w=8, minimum=0, maximum=1,
              description=f"Mean confidence of the current window and of the reference; "
                          f"InferwatchConfidenceDrop fires when it is {drop:g} below the reference."),
        Panel("Estimated vs real accuracy", [
            Target(f"inferwatch_drift_estimated_accuracy_ratio{{{DRIFT}}}", "{{model_version}} estimated (CBPE)"),
            Target(f"inferwatch_drift_accuracy_ratio{{{DRIFT}}}", "{{model_version}} real (labeled)"),
        ], unit="percentunit", minimum=0, maximum=1, thresholds=[(acc, "green")],
            description="Label-free estimate next to the accuracy over predictions whose labels arrived; the "
                        "estimate's alert floor is drawn."),
        Panel("Labels joined", [
            Target(f"inferwatch_drift_labeled_events{{{DRIFT}}}", "{{model_version}} labeled in window"),
            Target(f"sum by (model_version, result) (rate(inferwatch_drift_labels_total{{{DRIFT}}}[{RATE}]))",
                   "{{model_version}} {{result}}/s"),
        ], unit="short", minimum=0, description="How many predictions have ground truth, and how labels arrive."),
        Row("Canary vs stable"),
        Panel("Columns differing from the stable version", [Target(
            f"inferwatch_drift_canary_drifted_ratio{{{DRIFT}}}", "{{model_version}} vs {{baseline_version}}")],
            unit="percentunit", minimum=0, maximum=1, thresholds=[(0.0001, "red")],
            description="Share of columns whose window differs between a version and the busiest version."),
        Panel("Prediction mix by version", [Target(
            'inferwatch_drift_prediction_class_ratio{model=~"$model"}', "{{model_version}} {{class}}")],
            unit="percentunit", minimum=0, maximum=1,
            description="Each version's class mix side by side (not filtered by the version variable)."),
        Panel("Canary columns that differ", [Target(
            f"max by (model_version, feature) (inferwatch_drift_canary_feature_drifted{{{DRIFT}}})",
            "{{model_version}} {{feature}}")], "state-timeline", "short",
            "Per column: 1 when the canary's window differs from the stable version's.", w=24, h=6,
            thresholds=[(1, "red")]),
        Row("Windows and engine"),
        Panel("Window and reference events", [
            Target(f"inferwatch_drift_window_events{{{DRIFT}}}", "{{model_version}} window"),
            Target(f"inferwatch_drift_reference_events{{{DRIFT}}}", "{{model_version}} reference ({{source}})"),
        ], unit="short", minimum=0, w=8, description="Events in the sliding window and in the reference."),
        Panel("Drift state memory", [Target(f"inferwatch_drift_state_bytes{{{DRIFT}}}", "{{model}} {{model_version}}")],
              unit="bytes", minimum=0, w=8, description="Memory held by windows and reference summaries."),
        Panel("Evaluation time", [Target("inferwatch_drift_evaluation_duration_seconds", "{{instance}}")],
              unit="s", minimum=0, w=8, description="Wall time of the last evaluation of every window."),
    ]
    return Dashboard("inferwatch-drift", "inferwatch / Drift",
                     "Per-feature drift, prediction mix, confidence, estimated vs real accuracy, canary vs stable.",
                     variables, items, "drift.json")


def sidecar() -> Dashboard:
    variables = [_datasource_var(),
                 _var_query("instance", "Sidecar", "label_values(inferwatch_ingest_frames_total, instance)")]
    up_map = [{"type": "value", "options": {"0": {"text": "DOWN", "color": "red", "index": 0},
                                            "1": {"text": "up", "color": "green", "index": 1}}}]
    items: list[Panel | Row] = [
        Row("Health"),
        Panel("Scrape status", [Target(f'up{{{source.SIDECAR_JOB_SELECTOR}, {INST}}}', "{{instance}}")],
              "state-timeline", "short", "Whether Prometheus can scrape each sidecar.", w=12, h=5, mappings=up_map,
              thresholds=[(1, "green")]),
        Panel("Components", [Target(f"inferwatch_component_up{{{INST}}}", "{{instance}} {{component}}")],
              "state-timeline", "short", "1 when a component (gpu, drift, ...) is running.", w=12, h=5,
              mappings=up_map, thresholds=[(1, "green")]),
        Panel("Producers", [Target(f"sum by (instance) (inferwatch_producers{{{INST}}})", "{{instance}}")],
              "stat", "short", "SDK processes seen recently.", w=8, h=5),
        Panel("Ingest lag P99", [Target(
            f"histogram_quantile(0.99, sum by (instance, le) (rate(inferwatch_ingest_lag_seconds_bucket{{{INST}}}"
            f"[{RATE}])))", "{{instance}}")], "stat", "s", "Delay from a producer sending a frame to its decoding.",
            w=8, h=5, thresholds=[(0.1, "yellow"), (1, "red")]),
        Panel("Component errors", [Target(
            f"sum by (component, method) (rate(inferwatch_component_errors_total{{{INST}}}[{RATE}]))",
            "{{component}}.{{method}}")], unit="ops", w=8, h=5, minimum=0,
            description="Exceptions raised by a component; the daemon keeps running."),
        Row("Ingest"),
        Panel("Events per second", [Target(
            f"sum by (transport, type) (rate(inferwatch_ingest_events_total{{{INST}}}[{RATE}]))",
            "{{transport}} {{type}}")], unit="ops", stack=True, minimum=0,
            description="Events decoded and aggregated, by transport and type."),
        Panel("Frames and bytes per second", [
            Target(f"sum by (transport) (rate(inferwatch_ingest_frames_total{{{INST}}}[{RATE}]))",
                   "{{transport}} frames/s"),
            Target(f"sum by (transport) (rate(inferwatch_ingest_bytes_total{{{INST}}}[{RATE}]))",
                   "{{transport}} bytes/s"),
        ], unit="short", minimum=0, description="Datagrams or HTTP batches received, and their bytes."),
        Row("Losses"),
        Panel("Sidecar drops by reason", [
            Target(f"sum by (reason) (rate(inferwatch_ingest_dropped_total{{{INST}}}[{RATE}]))", "{{reason}}"),
            Target(f"sum(rate(inferwatch_ingest_socket_queue_dropped_total{{{INST}}}[{RATE}]))",
                   "kernel socket queue"),
            Target(f"sum(rate(inferwatch_ingest_lost_frames_total{{{INST}}}[{RATE}]))", "lost frames (sequence gaps)"),
            Target(f"sum by (reason) (rate(inferwatch_drift_dropped_records_total{{{INST}}}[{RATE}]))",
                   "drift: {{reason}}"),
            Target(f"sum by (reason) (rate(inferwatch_gpu_allocator_records_dropped_total{{{INST}}}[{RATE}]))",
                   "gpu allocator: {{reason}}"),
        ], unit="ops", stack=True, minimum=0, thresholds=[(0.0001, "red")],
            description="Everything the sidecar lost, by reason; any sustained rate fires InferwatchIngestDropping."),
        Panel("Decode errors by reason", [Target(
            f"sum by (scope, reason) (rate(inferwatch_ingest_decode_errors_total{{{INST}}}[{RATE}]))",
            "{{scope}} {{reason}}")], unit="ops", stack=True, minimum=0, thresholds=[(0.0001, "red")],
            description="Frames, records and JSON events that did not decode (counted and dropped)."),
        Panel("SDK drops by reason", [Target(
            f"sum by (reason) (rate(inferwatch_sdk_dropped_events_total{{{INST}}}[{RATE}]))", "{{reason}}")],
            unit="ops", stack=True, minimum=0, thresholds=[(0.0001, "red")],
            description="Events the SDK dropped before sending, as reported by the SDK."),
        Panel("Cardinality overflow by label", [Target(
            f"sum by (label) (rate(inferwatch_label_overflow_total{{{INST}}}[{RATE}]))", "{{label}}")],
            unit="ops", stack=True, minimum=0, thresholds=[(0.0001, "red")],
            description="Label values mapped to __overflow__ because the label's budget is spent."),
        Row("Process"),
        Panel("CPU", [Target(f"rate(inferwatch_sidecar_process_cpu_seconds_total{{{INST}}}[{RATE}])",
                             "{{instance}}")], unit="percentunit", w=8, minimum=0,
              description="Sidecar CPU time per second (1 = one core)."),
        Panel("Memory", [Target(f"inferwatch_sidecar_process_resident_memory_bytes{{{INST}}}", "{{instance}} RSS")],
              unit="bytes", w=8, minimum=0, description="Sidecar resident memory."),
        Panel("Open file descriptors", [
            Target(f"inferwatch_sidecar_process_open_fds{{{INST}}}", "{{instance}} open"),
            Target(f"inferwatch_sidecar_process_max_fds{{{INST}}}", "{{instance}} limit"),
        ], unit="short", w=8, minimum=0, description="Open descriptors and the limit."),
    ]
    return Dashboard("inferwatch-sidecar", "inferwatch / Sidecar health",
                     "Scrape status, ingest rates, drops by reason, SDK drops and cardinality overflow.",
                     variables, items, "sidecar.json")


def dashboards() -> list[Dashboard]:
    """Every dashboard, in menu order."""
    return [overview(), stages(), queue(), llm(), gpu(), drift(), sidecar()]


# ---------------------------------------------------------------------------------------------------------------
# queries: listing, substitution and the catalog check
# ---------------------------------------------------------------------------------------------------------------


#: What makes a panel show data beyond plain request traffic with recorded features. A healthy service
#: legitimately leaves these panels empty ("No data"); an end-to-end test should expect data from a panel
#: only when its scenario produces what the panel needs.
NEEDS: dict[str, str] = {
    "errors": "requests that end in an error",
    "queue": "queue stages (ingest.queue_stages) or queue depth reports",
    "batches": "dynamic batch size reports",
    "streaming": "streaming stages that yield tokens",
    "allocator": "PyTorch allocator records from the SDK's torch probe",
    "leak": "a leak verdict from the GPU leak detector (the rate exists once it has enough data)",
    "gpu_errors": "NVML sampling errors",
    "labels": "ground-truth labels joined to predictions (/v1/labels or inline)",
    "canary": "two versions of one model with traffic (canary vs stable)",
    "component_errors": "an exception inside a component",
    "drops": "data the sidecar dropped (oversized bodies, full allocator table, ...)",
    "decode_errors": "malformed frames or JSON events",
}

#: ``(dashboard uid, panel title) -> need`` or ``(uid, title, refId) -> need`` for one query of a panel.
PANEL_NEEDS: dict[tuple[str, ...], str] = {
    ("inferwatch-overview", "Errors by type"): "errors",
    ("inferwatch-queue", "Queue wait P50 / P99 / P999"): "queue",
    ("inferwatch-queue", "Queue depth"): "queue",
    ("inferwatch-queue", "Batch size distribution"): "batches",
    ("inferwatch-queue", "Mean batch size and batches per second"): "batches",
    ("inferwatch-queue", "Batch size P50 / P99"): "batches",
    **{("inferwatch-llm", t): "streaming" for t in (
        "Time to first token P50 / P99 / P999", "Inter-token latency P50 / P99 / P999", "Tokens per second",
        "Tokens per stream P50 / P99", "Mean tokens per second per stream")},
    ("inferwatch-gpu", "Allocator allocated / reserved"): "allocator",
    ("inferwatch-gpu", "Fragmentation ratio"): "allocator",
    ("inferwatch-gpu", "Alloc retries and OOMs per second"): "allocator",
    ("inferwatch-gpu", "Non-allocator memory"): "allocator",
    ("inferwatch-gpu", "Leak rate (with confidence interval)"): "leak",
    ("inferwatch-gpu", "Time to OOM"): "leak",
    ("inferwatch-gpu", "Collector errors and CPU", "A"): "gpu_errors",
    ("inferwatch-drift", "Estimated vs real accuracy", "B"): "labels",
    ("inferwatch-drift", "Columns differing from the stable version"): "canary",
    ("inferwatch-drift", "Canary columns that differ"): "canary",
    ("inferwatch-sidecar", "Component errors"): "component_errors",
    ("inferwatch-sidecar", "Sidecar drops by reason", "A"): "drops",
    ("inferwatch-sidecar", "Sidecar drops by reason", "E"): "drops",
    ("inferwatch-sidecar", "Decode errors by reason"): "decode_errors",
}


@dataclass(frozen=True)
class PanelQuery:
    """One query of one panel (or of a template variable)."""

    dashboard: str
    panel: str
    ref: str
    expr: str
    instant: bool = False
    #: a key of NEEDS when the query is empty without that kind of data; None when traffic alone fills it
    needs: str | None = None

    @property
    def series(self) -> frozenset[str]:
        """The series (metrics and recording rules) this query reads."""
        return frozenset(promql.series_names(self.expr))


def panel_queries() -> list[PanelQuery]:
    """Every panel query of every dashboard, as written (with Grafana variables)."""
    out: list[PanelQuery] = []
    for d in dashboards():
        for p in d.panels():
            for i, t in enumerate(p.targets):
                ref = chr(ord("A") + i)
                needs = PANEL_NEEDS.get((d.uid, p.title, ref), PANEL_NEEDS.get((d.uid, p.title)))
                out.append(PanelQuery(d.uid, p.title, ref, t.expr, t.instant, needs))
    return out


_VAR = re.compile(r"\$(\w+)|\$\{(\w+)(?::\w+)?\}")


def substitute(expr: str, rate_interval: str = "1m", range_: str = "5m", variables: dict[str, str] | None = None
               ) -> str:
    """Replace Grafana variables so that ``expr`` is plain PromQL.

    Args:
        expr: a panel query.
        rate_interval: value of ``$__rate_interval`` (and ``$__interval``).
        range_: value of ``$__range``.
        variables: values for template variables; every other ``$name`` becomes ``.*`` (Grafana's "All"),
            except ``$measure`` which becomes ``jensen_shannon`` (its default).

    Returns:
        The query as Grafana would send it.
    """
    values = {"__rate_interval": rate_interval, "__interval": rate_interval, "__range": range_,
              "measure": "jensen_shannon", **(variables or {})}

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return values.get(name, ".*")

    return _VAR.sub(sub, expr)


def known_series() -> dict[str, frozenset[str] | None]:
    """Series names a query may use, with the labels each carries.

    Recording rules of ``alerts/source.py`` carry the labels of their ``by`` clause; those of
    ``alerts/drift.rules.yml`` (owned by the drift component) map to None: their labels are not checked.
    """
    from alerts import generate as rules
    from inferwatch_sidecar.metrics.catalog import all_metrics, series_names

    out: dict[str, frozenset[str] | None] = {}
    for g in rules.drift_groups():
        for r in g.get("rules", []):
            if "record" in r:
                out[r["record"]] = None
    for m in all_metrics():
        for s in series_names(m):
            extra = {"le"} if s.endswith("_bucket") and m.type == "histogram" else set()
            out[s] = frozenset(m.labels) | extra
    for r in source.RECORDINGS:
        labels = promql.grouping_labels(r.expr) - {"le"}
        out[r.record] = frozenset(labels)
    for b in promql.BUILTIN_SERIES:
        out[b] = frozenset({"alertname", "alertstate", "severity"}) if b.startswith("ALERTS") else frozenset()
    return out


def check_query(expr: str, known: dict[str, frozenset[str] | None] | None = None) -> list[str]:
    """Problems with a query: unknown series, or labels matched that the series does not carry."""
    known = known if known is not None else known_series()
    problems = []
    for name in sorted(promql.series_names(expr)):
        if name not in known:
            problems.append(f"unknown series {name!r} (not in the metric catalog or the recording rules)")
    for name, labels in promql.selector_labels(expr):
        carried = known.get(name)
        if carried is not None:
            extra = labels - carried - promql.TARGET_LABELS
            if extra:
                problems.append(f"{name} has no label(s) {sorted(extra)}")
    return problems


def check_all() -> list[str]:
    """Problems in every panel and variable query of every dashboard."""
    known = known_series()
    problems = []
    for q in panel_queries():
        problems += [f"{q.dashboard} / {q.panel} / {q.ref}: {p}" for p in check_query(q.expr, known)]
    for d in dashboards():
        for v in d.variables:
            if v.get("type") == "query":
                inner = re.match(r"label_values\((.*),\s*\w+\)$", v["query"]["query"])
                if inner:
                    problems += [f"{d.uid} / variable {v['name']}: {p}" for p in check_query(inner.group(1), known)]
    return problems


def render() -> dict[Path, str]:
    """Every dashboard file and its content."""
    problems = check_all()
    if problems:
        raise SystemExit("dashboard queries do not match the metric catalog:\n  " + "\n  ".join(problems))
    return {OUT_DIR / d.filename: json.dumps(d.to_json(), indent=2, ensure_ascii=False) + "\n" for d in dashboards()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Generate inferwatch's Grafana dashboards from the metric catalog.")
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if a JSON file is stale")
    ap.add_argument("--list", action="store_true", help="print every panel query (variables substituted)")
    args = ap.parse_args(argv)
    if args.list:
        for q in panel_queries():
            print(f"# {q.dashboard} / {q.panel} / {q.ref}\n{substitute(q.expr)}\n")
        return 0
    files = render()
    stale = []
    for path, text in files.items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    known = {p.name for p in files}
    orphans = sorted(p.name for p in OUT_DIR.glob("*.json") if p.name not in known)
    if orphans:
        print(f"dashboards/ holds JSON no generator writes: {', '.join(orphans)}", file=sys.stderr)
        return 1
    if stale:
        print(f"stale dashboards: {', '.join(stale)}; run `python dashboards/generate.py`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Saturation: what bounds each model version now, the five ratios, GPM beside nvidia-smi's utilization,
and the engine's queue and KV cache (docs/saturation.md)."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.src.common import (
    RATE,
    Row,
    dashboard,
    datasource_var,
    query_var,
    state_timeline,
    target,
    timeseries,
)

UID = "inferwatch-saturation"
SEL = 'service=~"$service", model=~"$model", model_version=~"$version"'
BY = "service, model, model_version"
LEGEND = "{{model}} {{model_version}}"


def _verdict() -> list[Any]:
    """The verdict over time and the ratios behind it."""
    return [
        Row("Verdict"),
        state_timeline(
            title="Verdict over time", w=24, h=6,
            description="The binding resource of each model version (none: headroom), with hysteresis; "
                        "InferwatchSaturated fires after 15 minutes of one resource.",
            targets=[target(f"max by ({BY}, resource) (inferwatch_saturation_bound{{{SEL}}}) == 1",
                            LEGEND + " {{resource}}")]),
        timeseries(
            title="Saturation ratios", unit="percentunit", minimum=0, maximum=1,
            description="Each resource's closeness to the level where more load adds no throughput "
                        "(smoothed); a resource binds above 90% and is released below 75%.",
            targets=[target(f"max by ({BY}, resource) (inferwatch_saturation_ratio{{{SEL}}})",
                            LEGEND + " {{resource}}")]),
    ]


def _gpu_activity() -> list[Any]:
    """GPM beside nvidia-smi's utilization, and PCIe."""
    return [
        Row("GPU activity: GPM beside nvidia-smi"),
        timeseries(
            title="GPM beside nvidia-smi utilization", unit="percentunit", minimum=0, maximum=1,
            description="nvidia-smi's utilization is the share of time any kernel ran: decode reads ~100% "
                        "while SM occupancy stays low and DRAM bandwidth is the limit.",
            targets=[target('max by (gpu) (inferwatch_gpu_utilization_ratio{gpu=~"$gpu"})',
                            "GPU {{gpu}} nvidia-smi utilization"),
                     target('max by (gpu, fidelity) (inferwatch_gpu_sm_utilization_ratio{gpu=~"$gpu"})',
                            "GPU {{gpu}} SM utilization ({{fidelity}})"),
                     target('max by (gpu) (inferwatch_gpu_sm_occupancy_ratio{gpu=~"$gpu"})',
                            "GPU {{gpu}} SM occupancy"),
                     target('max by (gpu) (inferwatch_gpu_tensor_active_ratio{gpu=~"$gpu"})',
                            "GPU {{gpu}} tensor pipes"),
                     target('max by (gpu, fidelity) (inferwatch_gpu_dram_bandwidth_utilization_ratio'
                            '{gpu=~"$gpu"})', "GPU {{gpu}} DRAM bandwidth ({{fidelity}})")]),
        timeseries(
            title="PCIe traffic", unit="Bps", minimum=0,
            description="PCIe bytes per second to and from the GPU (GPM), interval averages.",
            targets=[target('max by (gpu) (inferwatch_gpu_pcie_rx_bytes_per_second{gpu=~"$gpu"})',
                            "GPU {{gpu}} RX"),
                     target('max by (gpu) (inferwatch_gpu_pcie_tx_bytes_per_second{gpu=~"$gpu"})',
                            "GPU {{gpu}} TX")]),
    ]


def _engine() -> list[Any]:
    """The engine's own queue, KV cache, preemptions and queue share."""
    return [
        Row("Engine queue and KV cache"),
        timeseries(
            title="Engine running and waiting requests", minimum=0,
            description="Requests the engine executes and requests queued in it (vLLM, SGLang, Triton, "
                        "TensorRT-LLM, one name for all).",
            targets=[target(f"sum by ({BY}) (inferwatch_engine_requests_running{{{SEL}}})", LEGEND + " running"),
                     target(f"sum by ({BY}) (inferwatch_engine_requests_waiting{{{SEL}}})",
                            LEGEND + " waiting")]),
        timeseries(
            title="KV cache usage and prefix-cache hits", unit="percentunit", minimum=0, maximum=1,
            description="Share of KV-cache blocks in use, and share of prompt tokens found in the prefix cache.",
            targets=[target(f"max by ({BY}) (inferwatch_engine_kv_cache_usage_ratio{{{SEL}}})",
                            LEGEND + " KV cache"),
                     target(f"max by ({BY}) (inferwatch_engine_prefix_cache_hit_ratio{{{SEL}}})",
                            LEGEND + " prefix hits")]),
        timeseries(
            title="Preemptions per second", unit="ops", minimum=0,
            description="Requests the engine preempted (or retracted) for lack of KV cache.",
            targets=[target(f"sum by ({BY}) (rate(inferwatch_engine_preemptions_total{{{SEL}}}[{RATE}]))",
                            LEGEND)]),
        timeseries(
            title="Queue share of request time", unit="percentunit", minimum=0, maximum=1,
            description="Share of end-to-end request time spent queued in the engine.",
            targets=[target(f"max by ({BY}) (inferwatch_engine_queue_time_share_ratio{{{SEL}}})", LEGEND)]),
    ]


def _gpu_health() -> list[Any]:
    """Clocks, throttle reasons, XID/ECC errors and the engine scrapes."""
    return [
        Row("GPU health"),
        timeseries(
            title="Clocks", unit="hertz", minimum=0,
            description="SM and memory clocks; a drop with a throttle reason is thermal or power throttling.",
            targets=[target('max by (gpu, clock) (inferwatch_gpu_clock_hertz{gpu=~"$gpu"})',
                            "GPU {{gpu}} {{clock}}")]),
        state_timeline(
            title="Throttle reasons",
            description="NVML's active clock event reasons (idle is normal on an idle GPU).",
            targets=[target('max by (gpu, reason) (inferwatch_gpu_throttle_active{gpu=~"$gpu"}) == 1',
                            "GPU {{gpu}} {{reason}}")]),
        timeseries(
            title="XID and ECC errors", minimum=0,
            description="XID critical errors and volatile ECC errors per 10 minutes.",
            targets=[target('sum by (gpu, xid) (increase(inferwatch_gpu_xid_errors_total{gpu=~"$gpu"}[10m]))',
                            "GPU {{gpu}} XID {{xid}}"),
                     target('sum by (gpu, type) (increase(inferwatch_gpu_ecc_errors_total{gpu=~"$gpu"}[10m]))',
                            "GPU {{gpu}} ECC {{type}}")]),
        timeseries(
            title="Engine scrapes by result", unit="ops", minimum=0,
            description="The sidecar's scrapes of each engine endpoint by result (ok, refused, timeout, ...).",
            targets=[target(f"sum by (target, result) (rate(inferwatch_engine_scrapes_total[{RATE}])) > 0",
                            "{{target}} {{result}}")]),
    ]


def build() -> Dashboard:
    return dashboard(
        uid=UID, title="inferwatch / Saturation",
        description="Which resource binds each model version (compute, memory bandwidth, KV cache, queue, host "
                    "CPU, or none), the ratios behind the verdict, GPU activity from NVML GPM beside nvidia-smi's "
                    "utilization, and the engine's own queue and KV cache.",
        variables=[
            datasource_var(),
            query_var("service", "Service", "label_values(inferwatch_saturation_bound, service)"),
            query_var("model", "Model", 'label_values(inferwatch_saturation_bound{service=~"$service"}, model)'),
            query_var("version", "Version", 'label_values(inferwatch_saturation_bound{service=~"$service", '
                                            'model=~"$model"}, model_version)'),
            query_var("gpu", "GPU", "label_values(inferwatch_gpu_sm_utilization_ratio, gpu)"),
        ],
        items=[*_verdict(), *_gpu_activity(), *_engine(), *_gpu_health()],
    )

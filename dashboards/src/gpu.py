"""GPU memory: device and per-process memory, leaks, duplicated model copies, fragmentation, collector health."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.models.dashboard import Dashboard, ValueMap, ValueMappingResult

from dashboards.src.common import (
    GPU,
    INST,
    RATE,
    UP_MAP,
    Row,
    dashboard,
    datasource_var,
    query_var,
    stat,
    state_timeline,
    target,
    threshold,
    timeseries,
)

UID = "inferwatch-gpu"
VERDICT_MAP = [ValueMap(options={"0": ValueMappingResult(text="no leak", color="green", index=0),
                                 "1": ValueMappingResult(text="LEAK", color="red", index=1)})]


def build() -> Dashboard:
    variables = [
        datasource_var(),
        query_var("instance", "Sidecar", "label_values(inferwatch_gpu_collector_up, instance)"),
        query_var("gpu", "GPU", 'label_values(inferwatch_gpu_memory_total_bytes{instance=~"$instance"}, gpu)'),
    ]
    return dashboard(
        uid=UID, title="inferwatch / GPU memory",
        description="Device and per-process GPU memory, leak verdicts with rate and time-to-OOM, duplicated model "
                    "copies, allocator fragmentation, utilization and collector health.",
        variables=variables,
        items=[*_memory(), *_leak_detection(), *_duplicates(), *_fragmentation(), *_utilization(),
               *_collector_health()],
    )


def _memory() -> list[Any]:
    """The "Memory" row."""
    free_warn = threshold("InferwatchGPUMemoryFillingUp", "free_ratio")
    free_crit = threshold("InferwatchGPUMemoryFillingUpSoon", "free_ratio")
    return [
        Row("Memory"),
        timeseries(title="Device memory used / total", unit="bytes", minimum=0,
                   description="Device memory in use and the device's total, from NVML.",
                   targets=[target(f"inferwatch_gpu_memory_used_bytes{{{GPU}}}", "GPU {{gpu}} used"),
                            target(f"inferwatch_gpu_memory_total_bytes{{{GPU}}}", "GPU {{gpu}} total")]),
        timeseries(title="Free memory share", unit="percentunit", minimum=0, maximum=1,
                   thresholds=[(free_crit, "red"), (free_warn, "yellow"), (free_warn + 0.0001, "green")],
                   description="Free share of device memory; the filling-up alerts' level gates are drawn.",
                   targets=[target(f"inferwatch_gpu_memory_free_bytes{{{GPU}}} / "
                                   f"inferwatch_gpu_memory_total_bytes{{{GPU}}}", "GPU {{gpu}}")]),
        timeseries(title="Per-process memory", unit="bytes", minimum=0, stack=True,
                   description="Device memory per process (NVML compute processes).",
                   targets=[target(f"inferwatch_gpu_process_memory_used_bytes{{{GPU}}}",
                                   "GPU {{gpu}} pid {{pid}} {{container}}")]),
        timeseries(title="Allocator allocated / reserved", unit="bytes", minimum=0,
                   description="PyTorch caching allocator: bytes in live tensors and reserved.",
                   targets=[target(f"inferwatch_gpu_allocator_allocated_bytes{{{GPU}}}", "pid {{pid}} allocated"),
                            target(f"inferwatch_gpu_allocator_reserved_bytes{{{GPU}}}", "pid {{pid}} reserved")]),
    ]


def _leak_detection() -> list[Any]:
    """The "Leak detection" row."""
    return [
        Row("Leak detection"),
        state_timeline(title="Leak verdict", w=24, h=5, mappings=VERDICT_MAP, thresholds=[(1, "red")],
                       description="The leak detector's verdict per device (empty pid) and process.",
                       targets=[target(f"max by (gpu, pid) (inferwatch_gpu_leak_detected{{{GPU}}})",
                                       "GPU {{gpu}} pid {{pid}}")]),
        timeseries(title="Leak rate (with confidence interval)", unit="Bps",
                   description="Theil-Sen growth rate of the memory floor and its confidence interval.",
                   targets=[
                       target(f"inferwatch_gpu_leak_rate_bytes_per_second{{{GPU}}}", "GPU {{gpu}} pid {{pid}} rate"),
                       target(f"inferwatch_gpu_leak_rate_lower_bytes_per_second{{{GPU}}}",
                              "GPU {{gpu}} pid {{pid}} lower"),
                       target(f"inferwatch_gpu_leak_rate_upper_bytes_per_second{{{GPU}}}",
                              "GPU {{gpu}} pid {{pid}} upper"),
                   ]),
        stat(title="Device time to OOM", unit="s", thresholds=[(0, "red"), (14400, "yellow"), (86400, "green")],
             description="Seconds until the device's memory runs out at the summed rate of everything leaking "
                         "on it (every leaking process and the unattributed memory); what "
                         "InferwatchGPUMemoryLeak quotes. Only while something leaks.",
             targets=[target(f"min by (gpu) (inferwatch_gpu_device_time_to_oom_seconds{{{GPU}}})",
                             "GPU {{gpu}}")]),
        stat(title="Time to OOM", unit="s", thresholds=[(0, "red"), (14400, "yellow"), (86400, "green")],
             description="Seconds until device memory runs out at one series' own leak rate (only while "
                         "leaking); the device's time above is shorter when several grow.",
             targets=[target(f"min by (gpu, pid) (inferwatch_gpu_leak_time_to_oom_seconds{{{GPU}}})",
                             "GPU {{gpu}} pid {{pid}}")]),
    ]


def _duplicates() -> list[Any]:
    """The "Duplicated model copies" row."""
    min_copies = threshold("InferwatchGPUDuplicateModelCopies", "min_copies")
    return [
        Row("Duplicated model copies"),
        # Both gauges exist, 0 without copies, on every device that lists its processes.
        timeseries(title="Model copies per GPU", minimum=0, h=6, thresholds=[(min_copies, "red")],
                   description="Processes on the GPU that each hold a similar, large, flat amount of memory: "
                               "one model loaded once per worker process (0 below gpu.duplicates.min_copies). "
                               f"InferwatchGPUDuplicateModelCopies fires at {min_copies:g} for 10 minutes; "
                               "/v1/status lists the PIDs and the fix.",
                   targets=[target(f"inferwatch_gpu_duplicate_model_copies{{{GPU}}}", "GPU {{gpu}}")]),
        timeseries(title="Memory held beyond one copy", unit="bytes", minimum=0, h=6,
                   description="The copies' memory minus one copy (the smallest): what serving the model from "
                               "one process per GPU would free.",
                   targets=[target(f"inferwatch_gpu_duplicate_model_extra_bytes{{{GPU}}}", "GPU {{gpu}}")]),
    ]


def _fragmentation() -> list[Any]:
    """The "Fragmentation" row."""
    frag = threshold("InferwatchGPUAllocatorFragmented", "ratio")
    return [
        Row("Fragmentation"),
        timeseries(title="Fragmentation ratio", unit="percentunit", minimum=0, maximum=1, w=8,
                   thresholds=[(frag, "red")],
                   description="Inactive-split bytes / reserved bytes; red at InferwatchGPUAllocatorFragmented's "
                               "threshold.",
                   targets=[target(f"inferwatch_gpu_allocator_fragmentation_ratio{{{GPU}}}",
                                   "GPU {{gpu}} pid {{pid}}")]),
        timeseries(title="Alloc retries and OOMs per second", unit="ops", minimum=0, w=8,
                   description="cudaMalloc retries after a cache flush, and allocator OOMs.",
                   targets=[target(f"rate(inferwatch_gpu_allocator_alloc_retries_total{{{GPU}}}[{RATE}])",
                                   "pid {{pid}} retries"),
                            target(f"rate(inferwatch_gpu_allocator_ooms_total{{{GPU}}}[{RATE}])",
                                   "pid {{pid}} OOMs")]),
        timeseries(title="Non-allocator memory", unit="bytes", w=8,
                   description="NVML per-process used minus allocator reserved: CUDA context, cuBLAS/NCCL "
                               "workspaces, native leaks.",
                   targets=[target(f"inferwatch_gpu_process_non_allocator_memory_bytes{{{GPU}}}",
                                   "GPU {{gpu}} pid {{pid}}")]),
    ]


def _utilization() -> list[Any]:
    """The "Utilization" row."""
    return [
        Row("Utilization"),
        timeseries(title="Utilization", unit="percentunit", minimum=0, maximum=1,
                   description="Share of time a kernel ran / memory was accessed.",
                   targets=[target(f"inferwatch_gpu_utilization_ratio{{{GPU}}}", "GPU {{gpu}} kernels"),
                            target(f"inferwatch_gpu_memory_utilization_ratio{{{GPU}}}", "GPU {{gpu}} memory bus")]),
        timeseries(title="Temperature and power",
                   description="Core temperature (°C) and board power (W), where supported.",
                   targets=[target(f"inferwatch_gpu_temperature_celsius{{{GPU}}}", "GPU {{gpu}} °C"),
                            target(f"inferwatch_gpu_power_watts{{{GPU}}}", "GPU {{gpu}} W")]),
    ]


def _collector_health() -> list[Any]:
    """The "Collector health" row."""
    return [
        Row("Collector health"),
        state_timeline(title="GPU collector", w=8, h=5, mappings=UP_MAP, thresholds=[(1, "green")],
                       description="1 when the last sampling pass returned device data.",
                       targets=[target(f"inferwatch_gpu_collector_up{{{INST}}}", "{{instance}}")]),
        stat(title="Seconds since the last good sample", unit="s", w=8, h=5,
             thresholds=[(10, "yellow"), (60, "red")], description="-1 before the first sample.",
             targets=[target(f"inferwatch_gpu_collector_last_success_age_seconds{{{INST}}}", "{{instance}}")]),
        timeseries(title="Collector errors and CPU", w=8, h=5, minimum=0,
                   description="Sampling errors by NVML operation, the sampler's CPU use and its sampling rate.",
                   targets=[
                       target(f"sum by (error, op) (rate(inferwatch_gpu_collector_errors_total{{{INST}}}[{RATE}]))",
                              "{{error}} {{op}}"),
                       target(f"rate(inferwatch_gpu_collector_cpu_seconds_total{{{INST}}}[{RATE}])",
                              "sampler CPU (s/s)"),
                       target(f"rate(inferwatch_gpu_collector_samples_total{{{INST}}}[{RATE}])", "samples/s"),
                   ]),
    ]

"""GPU memory, leak, allocator, duplicate-copy and collector alerts.
promtool: tests/alerts/gpu.test.yml, gpu_memory.test.yml, gpu_duplicates.test.yml.
"""

from __future__ import annotations

from alerts.model import Alert, Threshold


def _gpu_memory_alerts() -> list[Alert]:
    """Device memory running out, and leaks (tests/alerts/gpu_memory.test.yml, gpu.test.yml)."""
    return [
        Alert(
            name="InferwatchGPUMemoryFillingUp", group="inferwatch-gpu", severity="warning", for_s=3600,
            expr="(inferwatch_gpu_memory_free_bytes / inferwatch_gpu_memory_total_bytes) < {free_ratio}\n"
                 "and\npredict_linear(inferwatch_gpu_memory_free_bytes[{window:6h}], {horizon_seconds}) < 0",
            summary="GPU {labels.gpu} memory is predicted to run out within {window:1d}.",
            description="GPU {labels.gpu} has only {value:humanizePercentage} of its memory free and, at the "
                        "trend of the last {window:6h}, will be full within {window:1d}.",
            thresholds=(
                Threshold(name="free_ratio", value=0.25,
                          doc="level gate: free share of device memory below which the trend counts"),
                Threshold(name="horizon_seconds", value=86400, duration=True,
                          doc="trend gate: predict_linear horizon (24h)"),
            ),
        ),
        Alert(
            name="InferwatchGPUMemoryFillingUpSoon", group="inferwatch-gpu", severity="critical", for_s=1800,
            expr="(inferwatch_gpu_memory_free_bytes / inferwatch_gpu_memory_total_bytes) < {free_ratio}\n"
                 "and\npredict_linear(inferwatch_gpu_memory_free_bytes[{window:1h}], {horizon_seconds}) < 0",
            summary="GPU {labels.gpu} memory is predicted to run out within {window:4h}.",
            description="GPU {labels.gpu} has only {value:humanizePercentage} of its memory free and, at the "
                        "trend of the last {window:1h}, will be full within {window:4h}.",
            thresholds=(
                Threshold(name="free_ratio", value=0.10, doc="level gate: free share of device memory"),
                Threshold(name="horizon_seconds", value=14400, duration=True,
                          doc="trend gate: predict_linear horizon (4h)"),
            ),
        ),
        Alert(
            # The description's Go template queries the device's time to OOM (the summed rate of every
            # leaking process and the unattributed memory, not this process's own) and the kind (tensor,
            # cache_fragmentation, native, unknown); the kind picks the runbook's branch.
            name="InferwatchGPUMemoryLeak", group="inferwatch-gpu", severity="warning", for_s=0,
            expr="inferwatch_gpu_leak_rate_bytes_per_second\nand on (job, instance, gpu, pid)\n"
                 "(inferwatch_gpu_leak_detected == 1)",
            summary="GPU memory leak on GPU {labels.gpu}{{{{ if $labels.pid }}}} in process {labels.pid}"
                    "{{{{ end }}}}.",
            description="The memory floor on GPU {labels.gpu}{{{{ if $labels.pid }}}} of process {labels.pid}"
                        "{{{{ end }}}} grows by {value:humanize1024}B/s; "
                        '{{{{ with printf "inferwatch_gpu_device_time_to_oom_seconds{{instance=\'%s\',gpu=\'%s\'}}" '
                        "$labels.instance $labels.gpu | query }}}}at the summed rate of everything leaking on it, the "
                        "device runs out of memory in {{{{ . | first | value | humanizeDuration }}}}{{{{ else }}}}the "
                        "time to OOM is not known yet{{{{ end }}}}."
                        '{{{{ with printf "inferwatch_gpu_leak_kind{{instance=\'%s\',gpu=\'%s\',pid=\'%s\'}} == 1" '
                        '$labels.instance $labels.gpu $labels.pid | query }}}} Kind: {{{{ . | first | label "kind" }}}}.'
                        "{{{{ end }}}}",
        ),
    ]


def _gpu_allocator_alerts() -> list[Alert]:
    """The CUDA caching allocator: fragmentation, retries, out-of-memory errors."""
    return [
        Alert(
            name="InferwatchGPUAllocatorFragmented", group="inferwatch-gpu", severity="warning", for_s=1800,
            expr="inferwatch_gpu_allocator_fragmentation_ratio > {ratio}",
            summary="The CUDA caching allocator of process {labels.pid} is fragmented.",
            description="{value:humanizePercentage} of the memory reserved by the caching allocator of process "
                        "{labels.pid} on GPU {labels.gpu} sits in inactive split blocks (threshold {ratio}).",
            thresholds=(Threshold(name="ratio", value=0.3, doc="inactive-split bytes / reserved bytes"),),
        ),
        Alert(
            name="InferwatchGPUAllocRetries", group="inferwatch-gpu", severity="warning", for_s=0,
            expr="increase(inferwatch_gpu_allocator_alloc_retries_total[{window:15m}]) > {retries}",
            summary="Process {labels.pid} keeps flushing the CUDA allocator cache to allocate.",
            description="The caching allocator of process {labels.pid} on GPU {labels.gpu} retried "
                        "{value:humanize} cudaMalloc calls after flushing its cache in the last {window:15m} "
                        "(threshold {retries}); every retry stalls the stream.",
            thresholds=(Threshold(name="retries", value=10, doc="allocation retries within 15 minutes"),),
        ),
        Alert(
            name="InferwatchGPUOutOfMemory", group="inferwatch-gpu", severity="critical", for_s=0,
            expr="increase(inferwatch_gpu_allocator_ooms_total[{window:10m}]) > 0",
            summary="Process {labels.pid} ran out of GPU memory.",
            description="The allocator of process {labels.pid} on GPU {labels.gpu} raised "
                        "{value:humanize} out-of-memory errors in the last {window:10m}.",
        ),
    ]


def _gpu_device_alerts() -> list[Alert]:
    """Duplicate model copies on a GPU, and the collector itself."""
    return [
        Alert(
            # The sidecar already requires each copy to be flat for gpu.duplicates.flat_s (5 min), so the
            # rule only rides out a worker restart.
            name="InferwatchGPUDuplicateModelCopies", group="inferwatch-gpu", severity="warning", for_s=600,
            expr="inferwatch_gpu_duplicate_model_copies >= {min_copies}",
            summary="GPU {labels.gpu} holds {value} copies of what looks like one model.",
            description="{value} processes on GPU {labels.gpu} each hold a similar, large and flat amount of "
                        "memory: one model loaded once per worker process"
                        '{{{{ with printf "inferwatch_gpu_duplicate_model_extra_bytes{{instance=\'%s\',gpu=\'%s\'}}" '
                        "$labels.instance $labels.gpu | query }}}}, {{{{ . | first | value | humanize1024 }}}}B "
                        "beyond one copy{{{{ end }}}}. "
                        "Serve it from one process per GPU, or from Triton or vLLM.",
            thresholds=(Threshold(name="min_copies", value=2, doc="similar copies on one GPU"),),
        ),
        Alert(
            # last_success_age is -1 until the first good sample: a host without a GPU (backend auto, no
            # NVML) never pages; a collector that worked and stopped does, and so does a failed component.
            name="InferwatchGPUCollectorDown", group="inferwatch-gpu", severity="warning", for_s=300,
            expr="(\n  inferwatch_gpu_collector_up == 0\n  and\n  inferwatch_gpu_collector_last_success_age_seconds >= 0\n)"
                 '\nor\ninferwatch_component_up{{component="gpu"}} == 0',
            summary="The sidecar's GPU collector is not returning data.",
            description="The GPU collector of {labels.instance} has returned no device data for {window:5m}, so GPU "
                        "memory, leak and fragmentation alerts are blind. /v1/status shows the NVML error and its fix.",
        ),
    ]


def _gpu_alerts() -> list[Alert]:
    """Every GPU alert, in file order."""
    return [*_gpu_memory_alerts(), *_gpu_allocator_alerts(), *_gpu_device_alerts()]

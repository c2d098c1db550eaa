"""Catalog entries for the gpu component.

Labels: ``gpu`` is the NVML index ("0"), a MIG device ("0/mig1") or the id a
replayed log uses; ``pid`` is the process id ("" on device-level series);
``container`` a container / pod hint ("" when unknown). PID series are removed
when the process exits, and every label value is capped by the sidecar's
label limiter.
"""

from __future__ import annotations

from inferwatch_sidecar.metrics.entry import Metric

_D = ("gpu",)
_P = ("gpu", "pid")


# -- devices -------------------------------------------------------------
GPU_DEVICE = Metric(
    name="inferwatch_gpu_device", type="info", labels=("gpu", "uuid", "name", "parent"), component="gpu",
    help="Device identity: NVML index, UUID, name and MIG parent (value 1).",
)
GPU_MEMORY_TOTAL_BYTES = Metric(
    name="inferwatch_gpu_memory_total_bytes", type="gauge", unit="bytes", labels=_D, component="gpu",
    help="Total device memory.",
)
GPU_MEMORY_USED_BYTES = Metric(
    name="inferwatch_gpu_memory_used_bytes", type="gauge", unit="bytes", labels=_D, component="gpu",
    help="Device memory in use.",
)
GPU_MEMORY_FREE_BYTES = Metric(
    name="inferwatch_gpu_memory_free_bytes", type="gauge", unit="bytes", labels=_D, component="gpu",
    help="Device memory free.",
)
GPU_MEMORY_RESERVED_BYTES = Metric(
    name="inferwatch_gpu_memory_reserved_bytes", type="gauge", unit="bytes", labels=_D, component="gpu",
    help="Memory the driver reserves (from NVML's v2 memory info; absent with v1).",
)
GPU_UTILIZATION_RATIO = Metric(
    name="inferwatch_gpu_utilization_ratio", type="gauge", unit="ratio", labels=_D, component="gpu",
    help="Fraction of the last sample period a kernel was running.",
)
GPU_MEMORY_UTILIZATION_RATIO = Metric(
    name="inferwatch_gpu_memory_utilization_ratio", type="gauge", unit="ratio", labels=_D, component="gpu",
    help="Fraction of the last sample period device memory was read or written.",
)
GPU_TEMPERATURE_CELSIUS = Metric(
    name="inferwatch_gpu_temperature_celsius", type="gauge", unit="celsius", labels=_D, component="gpu",
    help="GPU core temperature, where supported.",
)
GPU_POWER_WATTS = Metric(
    name="inferwatch_gpu_power_watts", type="gauge", unit="watts", labels=_D, component="gpu",
    help="Board power draw, where supported.",
)

# -- processes -----------------------------------------------------------
GPU_PROCESS_MEMORY_USED_BYTES = Metric(
    name="inferwatch_gpu_process_memory_used_bytes", type="gauge", unit="bytes", labels=("gpu", "pid", "container"),
    component="gpu",
    help="Device memory used by a process (NVML compute processes).",
)

# -- PyTorch allocator (SDK probe) ------------------------------------------
GPU_ALLOCATOR_ALLOCATED_BYTES = Metric(
    name="inferwatch_gpu_allocator_allocated_bytes", type="gauge", unit="bytes", labels=_P, component="gpu",
    help="Bytes held by live tensors (torch allocator).",
)
GPU_ALLOCATOR_RESERVED_BYTES = Metric(
    name="inferwatch_gpu_allocator_reserved_bytes", type="gauge", unit="bytes", labels=_P, component="gpu",
    help="Bytes the caching allocator reserved from the driver.",
)
GPU_ALLOCATOR_INACTIVE_SPLIT_BYTES = Metric(
    name="inferwatch_gpu_allocator_inactive_split_bytes", type="gauge", unit="bytes", labels=_P, component="gpu",
    help="Bytes in inactive split blocks: cached but unusable for larger requests.",
)
GPU_ALLOCATOR_FRAGMENTATION_RATIO = Metric(
    name="inferwatch_gpu_allocator_fragmentation_ratio", type="gauge", unit="ratio", labels=_P, component="gpu",
    help="Inactive-split bytes divided by reserved bytes.",
)
GPU_ALLOCATOR_ALLOC_RETRIES_TOTAL = Metric(
    name="inferwatch_gpu_allocator_alloc_retries_total", type="counter", labels=_P, component="gpu",
    help="cudaMalloc retries after flushing the allocator cache.",
)
GPU_ALLOCATOR_OOMS_TOTAL = Metric(
    name="inferwatch_gpu_allocator_ooms_total", type="counter", labels=_P, component="gpu",
    help="Out-of-memory errors raised by the allocator.",
)
GPU_PROCESS_NON_ALLOCATOR_MEMORY_BYTES = Metric(
    name="inferwatch_gpu_process_non_allocator_memory_bytes", type="gauge", unit="bytes", labels=_P, component="gpu",
    help="NVML per-process used minus allocator reserved: CUDA context, cuBLAS/NCCL workspaces, native leaks.",
)
GPU_FRAGMENTATION_WARNING = Metric(
    name="inferwatch_gpu_fragmentation_warning", type="gauge", labels=_P, component="gpu",
    help="1 while alloc retries or the inactive-split ratio exceed their thresholds.",
)

# -- leak detection -------------------------------------------------------
GPU_LEAK_DETECTED = Metric(
    name="inferwatch_gpu_leak_detected", type="gauge", labels=_P, component="gpu",
    help="1 while the leak detector's verdict is leak (pid empty: the device memory no listed process "
         "accounts for, all of it where NVML lists none).",
)
GPU_LEAK_RATE_BYTES_PER_SECOND = Metric(
    name="inferwatch_gpu_leak_rate_bytes_per_second", type="gauge", unit="bytes_per_second", labels=_P, component="gpu",
    help="Theil-Sen growth rate of the memory floor.",
)
GPU_LEAK_RATE_LOWER_BYTES_PER_SECOND = Metric(
    name="inferwatch_gpu_leak_rate_lower_bytes_per_second", type="gauge", unit="bytes_per_second", labels=_P,
    component="gpu",
    help="Lower bound of the rate's confidence interval.",
)
GPU_LEAK_RATE_UPPER_BYTES_PER_SECOND = Metric(
    name="inferwatch_gpu_leak_rate_upper_bytes_per_second", type="gauge", unit="bytes_per_second", labels=_P,
    component="gpu",
    help="Upper bound of the rate's confidence interval.",
)
GPU_LEAK_TIME_TO_OOM_SECONDS = Metric(
    name="inferwatch_gpu_leak_time_to_oom_seconds", type="gauge", unit="seconds", labels=_P, component="gpu",
    help="Seconds until device memory runs out at the leak rate (only while leaking).",
)
GPU_DEVICE_TIME_TO_OOM_SECONDS = Metric(
    name="inferwatch_gpu_device_time_to_oom_seconds", type="gauge", unit="seconds", labels=_D, component="gpu",
    help="Seconds until the device's memory runs out at the summed leak rate of everything on it that is "
         "leaking (every leaking process and the memory no process accounts for); only while one leaks.",
)
GPU_LEAK_DETECTED_TIMESTAMP_SECONDS = Metric(
    name="inferwatch_gpu_leak_detected_timestamp_seconds", type="gauge", unit="seconds", labels=_P, component="gpu",
    help="Unix time of the first sample at which the current leak verdict held.",
)
GPU_LEAK_ONSET_TIMESTAMP_SECONDS = Metric(
    name="inferwatch_gpu_leak_onset_timestamp_seconds", type="gauge", unit="seconds", labels=_P, component="gpu",
    help="Estimated start of the current leak episode (hinge fit of the memory floor), Unix time.",
)
GPU_LEAK_KIND = Metric(
    name="inferwatch_gpu_leak_kind", type="gauge", labels=("gpu", "pid", "kind"), component="gpu",
    help="1 for the classified kind of growth: tensor, cache_fragmentation, native or unknown.",
)

# -- duplicated model copies ------------------------------------------------
GPU_DUPLICATE_MODEL_COPIES = Metric(
    name="inferwatch_gpu_duplicate_model_copies", type="gauge", labels=_D, component="gpu",
    help="Processes on the GPU that each hold a similar, large, flat amount of memory (copies of one model); "
         "0 when fewer than gpu.duplicates.min_copies do.",
)
GPU_DUPLICATE_MODEL_EXTRA_BYTES = Metric(
    name="inferwatch_gpu_duplicate_model_extra_bytes", type="gauge", unit="bytes", labels=_D, component="gpu",
    help="Memory those copies hold beyond one copy (their sum minus the smallest).",
)

# -- collector health -----------------------------------------------------
GPU_COLLECTOR_UP = Metric(
    name="inferwatch_gpu_collector_up", type="gauge", component="gpu",
    help="1 when the last sampling pass returned device data.",
)
GPU_COLLECTOR_ERRORS_TOTAL = Metric(
    name="inferwatch_gpu_collector_errors_total", type="counter", labels=("error", "op"), component="gpu",
    help="Sampling errors by reason and NVML operation.",
)
GPU_COLLECTOR_LAST_SUCCESS_AGE_SECONDS = Metric(
    name="inferwatch_gpu_collector_last_success_age_seconds", type="gauge", unit="seconds", component="gpu",
    help="Seconds since the last good sample (-1 before the first one).",
)
GPU_COLLECTOR_SAMPLES_TOTAL = Metric(
    name="inferwatch_gpu_collector_samples_total", type="counter", component="gpu",
    help="Sampling passes.",
)
GPU_COLLECTOR_CPU_SECONDS_TOTAL = Metric(
    name="inferwatch_gpu_collector_cpu_seconds_total", type="counter", unit="seconds", component="gpu",
    help="CPU time spent by the sampler thread (sampling and detection).",
)
GPU_ALLOCATOR_RECORDS_DROPPED_TOTAL = Metric(
    name="inferwatch_gpu_allocator_records_dropped_total", type="counter", labels=("reason",), component="gpu",
    help="Allocator records dropped, by reason.",
)

#: Every entry of this component, in catalog order.
METRICS: tuple[Metric, ...] = (
    GPU_DEVICE, GPU_MEMORY_TOTAL_BYTES, GPU_MEMORY_USED_BYTES, GPU_MEMORY_FREE_BYTES, GPU_MEMORY_RESERVED_BYTES,
    GPU_UTILIZATION_RATIO, GPU_MEMORY_UTILIZATION_RATIO, GPU_TEMPERATURE_CELSIUS, GPU_POWER_WATTS,
    GPU_PROCESS_MEMORY_USED_BYTES, GPU_ALLOCATOR_ALLOCATED_BYTES, GPU_ALLOCATOR_RESERVED_BYTES,
    GPU_ALLOCATOR_INACTIVE_SPLIT_BYTES, GPU_ALLOCATOR_FRAGMENTATION_RATIO, GPU_ALLOCATOR_ALLOC_RETRIES_TOTAL,
    GPU_ALLOCATOR_OOMS_TOTAL, GPU_PROCESS_NON_ALLOCATOR_MEMORY_BYTES, GPU_FRAGMENTATION_WARNING, GPU_LEAK_DETECTED,
    GPU_LEAK_RATE_BYTES_PER_SECOND, GPU_LEAK_RATE_LOWER_BYTES_PER_SECOND, GPU_LEAK_RATE_UPPER_BYTES_PER_SECOND,
    GPU_LEAK_TIME_TO_OOM_SECONDS, GPU_DEVICE_TIME_TO_OOM_SECONDS, GPU_LEAK_DETECTED_TIMESTAMP_SECONDS, GPU_LEAK_ONSET_TIMESTAMP_SECONDS,
    GPU_LEAK_KIND, GPU_DUPLICATE_MODEL_COPIES, GPU_DUPLICATE_MODEL_EXTRA_BYTES, GPU_COLLECTOR_UP,
    GPU_COLLECTOR_ERRORS_TOTAL, GPU_COLLECTOR_LAST_SUCCESS_AGE_SECONDS, GPU_COLLECTOR_SAMPLES_TOTAL,
    GPU_COLLECTOR_CPU_SECONDS_TOTAL, GPU_ALLOCATOR_RECORDS_DROPPED_TOTAL,
)

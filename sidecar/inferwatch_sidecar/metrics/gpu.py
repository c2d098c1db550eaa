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


def _g(name: str, unit: str, help: str, labels: tuple[str, ...] = _D, type: str = "gauge") -> Metric:
    return Metric(name, type, unit, help, labels, component="gpu")


METRICS: tuple[Metric, ...] = (
    # -- devices -------------------------------------------------------------
    _g("inferwatch_gpu_device", "", "Device identity: NVML index, UUID, name and MIG parent (value 1).",
       ("gpu", "uuid", "name", "parent"), type="info"),
    _g("inferwatch_gpu_memory_total_bytes", "bytes", "Total device memory."),
    _g("inferwatch_gpu_memory_used_bytes", "bytes", "Device memory in use."),
    _g("inferwatch_gpu_memory_free_bytes", "bytes", "Device memory free."),
    _g("inferwatch_gpu_memory_reserved_bytes", "bytes",
       "Memory the driver reserves (from NVML's v2 memory info; absent with v1)."),
    _g("inferwatch_gpu_utilization_ratio", "ratio", "Fraction of the last sample period a kernel was running."),
    _g("inferwatch_gpu_memory_utilization_ratio", "ratio",
       "Fraction of the last sample period device memory was read or written."),
    _g("inferwatch_gpu_temperature_celsius", "celsius", "GPU core temperature, where supported."),
    _g("inferwatch_gpu_power_watts", "watts", "Board power draw, where supported."),
    # -- processes -----------------------------------------------------------
    _g("inferwatch_gpu_process_memory_used_bytes", "bytes",
       "Device memory used by a process (NVML compute processes).", ("gpu", "pid", "container")),
    # -- PyTorch allocator (SDK probe) ------------------------------------------
    _g("inferwatch_gpu_allocator_allocated_bytes", "bytes", "Bytes held by live tensors (torch allocator).", _P),
    _g("inferwatch_gpu_allocator_reserved_bytes", "bytes", "Bytes the caching allocator reserved from the driver.",
       _P),
    _g("inferwatch_gpu_allocator_inactive_split_bytes", "bytes",
       "Bytes in inactive split blocks: cached but unusable for larger requests.", _P),
    _g("inferwatch_gpu_allocator_fragmentation_ratio", "ratio",
       "Inactive-split bytes divided by reserved bytes.", _P),
    _g("inferwatch_gpu_allocator_alloc_retries_total", "", "cudaMalloc retries after flushing the allocator cache.",
       _P, type="counter"),
    _g("inferwatch_gpu_allocator_ooms_total", "", "Out-of-memory errors raised by the allocator.", _P,
       type="counter"),
    _g("inferwatch_gpu_process_non_allocator_memory_bytes", "bytes",
       "NVML per-process used minus allocator reserved: CUDA context, cuBLAS/NCCL workspaces, native leaks.", _P),
    _g("inferwatch_gpu_fragmentation_warning", "",
       "1 while alloc retries or the inactive-split ratio exceed their thresholds.", _P),
    # -- leak detection -------------------------------------------------------
    _g("inferwatch_gpu_leak_detected", "", "1 while the leak detector's verdict is leak (pid empty: device level).",
       _P),
    _g("inferwatch_gpu_leak_rate_bytes_per_second", "bytes_per_second",
       "Theil-Sen growth rate of the memory floor.", _P),
    _g("inferwatch_gpu_leak_rate_lower_bytes_per_second", "bytes_per_second",
       "Lower bound of the rate's confidence interval.", _P),
    _g("inferwatch_gpu_leak_rate_upper_bytes_per_second", "bytes_per_second",
       "Upper bound of the rate's confidence interval.", _P),
    _g("inferwatch_gpu_leak_time_to_oom_seconds", "seconds",
       "Seconds until device memory runs out at the leak rate (only while leaking).", _P),
    _g("inferwatch_gpu_leak_detected_timestamp_seconds", "seconds",
       "Unix time of the first sample at which the current leak verdict held.", _P),
    _g("inferwatch_gpu_leak_kind", "",
       "1 for the classified kind of growth: tensor, cache_fragmentation, native or unknown.",
       ("gpu", "pid", "kind")),
    # -- collector health -----------------------------------------------------
    _g("inferwatch_gpu_collector_up", "", "1 when the last sampling pass returned device data.", ()),
    _g("inferwatch_gpu_collector_errors_total", "", "Sampling errors by reason and NVML operation.",
       ("error", "op"), type="counter"),
    _g("inferwatch_gpu_collector_last_success_age_seconds", "seconds",
       "Seconds since the last good sample (-1 before the first one).", ()),
    _g("inferwatch_gpu_collector_samples_total", "", "Sampling passes.", (), type="counter"),
    _g("inferwatch_gpu_collector_cpu_seconds_total", "seconds",
       "CPU time spent by the sampler thread (sampling and detection).", (), type="counter"),
    _g("inferwatch_gpu_allocator_records_dropped_total", "", "Allocator records dropped, by reason.", ("reason",),
       type="counter"),
)

"""Catalog entries for the saturation component: GPU activity (GPM), GPU health, and the verdict.

Labels: ``gpu`` is the NVML index or a MIG device ("0/mig1"); ``fidelity`` is ``gpm`` (hardware
counters, Hopper and newer) or ``coarse`` (NVML utilization and memory-controller utilization on
older GPUs); ``resource`` one of compute, memory_bandwidth, kv_cache, queue, host_cpu (and ``none`` on
the bound series); ``reason`` a fixed set of clock event reasons; ``xid`` one of a fixed set of XID
codes or ``other``. service, model and model_version are those of the engines targets.
"""

from __future__ import annotations

from inferwatch_sidecar.metrics.entry import Metric

_M = ("service", "model", "model_version")

SATURATION_RATIO = Metric(
    name="inferwatch_saturation_ratio", type="gauge", unit="ratio", labels=(*_M, "resource"),
    component="saturation",
    help="How close a resource is to the level where more load adds no throughput (smoothed; 1 = saturated; "
    "docs/saturation.md).",
)
SATURATION_BOUND = Metric(
    name="inferwatch_saturation_bound", type="gauge", labels=(*_M, "resource"), component="saturation",
    help="1 for the resource that binds now (none: headroom), 0 for the others; with hysteresis.",
)
GPU_SM_UTILIZATION_RATIO = Metric(
    name="inferwatch_gpu_sm_utilization_ratio", type="gauge", unit="ratio", labels=("gpu", "fidelity"),
    component="saturation",
    help="Share of SMs busy over the sample interval (GPM); coarse: NVML's share of time a kernel ran.",
)
GPU_SM_OCCUPANCY_RATIO = Metric(
    name="inferwatch_gpu_sm_occupancy_ratio", type="gauge", unit="ratio", labels=("gpu",), component="saturation",
    help="Resident warps over the maximum, averaged over the sample interval (GPM).",
)
GPU_TENSOR_ACTIVE_RATIO = Metric(
    name="inferwatch_gpu_tensor_active_ratio", type="gauge", unit="ratio", labels=("gpu",), component="saturation",
    help="Share of the sample interval the tensor pipes were active (GPM, any tensor op).",
)
GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO = Metric(
    name="inferwatch_gpu_dram_bandwidth_utilization_ratio", type="gauge", unit="ratio", labels=("gpu", "fidelity"),
    component="saturation",
    help="DRAM bandwidth used over the theoretical peak, over the sample interval (GPM); coarse: NVML's "
    "memory-controller busy share.",
)
GPU_PCIE_TX_BYTES_PER_SECOND = Metric(
    name="inferwatch_gpu_pcie_tx_bytes_per_second", type="gauge", unit="bytes_per_second", labels=("gpu",),
    component="saturation", help="PCIe traffic from the GPU, averaged over the sample interval (GPM).",
)
GPU_PCIE_RX_BYTES_PER_SECOND = Metric(
    name="inferwatch_gpu_pcie_rx_bytes_per_second", type="gauge", unit="bytes_per_second", labels=("gpu",),
    component="saturation", help="PCIe traffic to the GPU, averaged over the sample interval (GPM).",
)
GPU_THROTTLE_ACTIVE = Metric(
    name="inferwatch_gpu_throttle_active", type="gauge", labels=("gpu", "reason"), component="saturation",
    help="1 while NVML reports this clock event (throttle) reason: sw_power_cap, hw_slowdown, sw_thermal, "
    "hw_thermal, hw_power_brake, sync_boost, idle, applications_clocks.",
)
GPU_CLOCK_HERTZ = Metric(
    name="inferwatch_gpu_clock_hertz", type="gauge", unit="hertz", labels=("gpu", "clock"), component="saturation",
    help="Current SM (clock=sm) and memory (clock=memory) clock.",
)
GPU_ECC_ERRORS_TOTAL = Metric(
    name="inferwatch_gpu_ecc_errors_total", type="counter", labels=("gpu", "type"), component="saturation",
    help="Volatile ECC error count since the driver loaded (type corrected or uncorrected).",
)
GPU_XID_ERRORS_TOTAL = Metric(
    name="inferwatch_gpu_xid_errors_total", type="counter", labels=("gpu", "xid"), component="saturation",
    help="XID critical error events seen by the sidecar since it started.",
)
SATURATION_GPU_FAULTS_TOTAL = Metric(
    name="inferwatch_saturation_gpu_faults_total", type="counter", labels=("op", "reason"), component="saturation",
    help="NVML faults of the GPM and health sampling, by operation and reason.",
)

METRICS = (
    SATURATION_RATIO, SATURATION_BOUND, GPU_SM_UTILIZATION_RATIO, GPU_SM_OCCUPANCY_RATIO, GPU_TENSOR_ACTIVE_RATIO,
    GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO, GPU_PCIE_TX_BYTES_PER_SECOND, GPU_PCIE_RX_BYTES_PER_SECOND,
    GPU_THROTTLE_ACTIVE, GPU_CLOCK_HERTZ, GPU_ECC_ERRORS_TOTAL, GPU_XID_ERRORS_TOTAL, SATURATION_GPU_FAULTS_TOTAL,
)

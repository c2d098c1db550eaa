"""GPU memory monitor: NVML sampling, leak and fragmentation detection."""

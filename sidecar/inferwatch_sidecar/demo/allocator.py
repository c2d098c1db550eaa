"""The simulated caching allocator of a demo model-server worker, for a machine with no GPU.

It answers what ``torch.cuda.memory_stats()`` would, for the SDK's allocator
probe (``torch_stats_source``): a steady footprint, plus the leak fault's
growth in the worker that is its target. The scenario starts the first
worker's fake NVML process from this footprint (:data:`DEVICE_BASE_BYTES`) and
each next one a step above it (:func:`.inject.fake_gpu_processes`): the
allocator's counters are every worker's, the rest is non-allocator memory.
"""

from __future__ import annotations

from typing import Any

from inferwatch_sidecar.demo.faults import Faults

GiB = 2**30
MiB = 2**20
#: Bytes the model keeps allocated.
ALLOC_BASE = 3 * GiB
#: Bytes the allocator keeps reserved on top of them.
ALLOC_CACHE = 768 * MiB
#: The CUDA context, which NVML counts and the allocator does not.
CONTEXT = 1 * GiB
#: A worker's device memory before any leak.
DEVICE_BASE_BYTES = ALLOC_BASE + ALLOC_CACHE + CONTEXT


def memory_stats(faults: Faults, pid: int, now_unix: float) -> dict[int, dict[str, Any]]:
    """Device 0's allocator counters for worker ``pid`` at ``now_unix``."""
    allocated = ALLOC_BASE + (pid % 7) * 16 * MiB
    if faults.leak_pid == pid and faults.leak_start_unix is not None:
        allocated += int(faults.leak_rate_bytes_per_s * max(0.0, now_unix - faults.leak_start_unix))
    reserved = -(-(allocated + ALLOC_CACHE) // (2 * MiB)) * 2 * MiB
    return {0: {
        "allocated_bytes.all.current": allocated,
        "reserved_bytes.all.current": reserved,
        "active_bytes.all.current": allocated,
        "inactive_split_bytes.all.current": reserved // 50,
        "num_alloc_retries": 0,
        "num_ooms": 0,
    }}

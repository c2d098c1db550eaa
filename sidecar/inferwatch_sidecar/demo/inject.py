"""Fault injection: what switches each fault on, and the record of what then happened to it.

Where each fault lives:

- in the model servers (``PUT /admin/faults``, which every worker reads from
  the shared fault file): the latency spike, the canary's bad version, and
  the allocator side of the GPU leak;
- in the load generator: feature drift, the hard segment of the confidence
  fault, the long inputs and the malformed events (the canary's share of the
  traffic flows from the start: :meth:`~.scenario.Scenario.run`);
- in the sidecar's fake NVML: the device side of the GPU leak, scripted in
  its config from the start (:func:`fake_gpu_processes`) to begin at the
  injection time.
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from inferwatch_sidecar.demo import allocator
from inferwatch_sidecar.demo.config import ScenarioConfig
from inferwatch_sidecar.demo.faults import (
    RETRY_STORM_DELAY_S,
    SATURATION_CPU_MS,
    SATURATION_KV_TOKENS,
    Faults,
    write,
)
from inferwatch_sidecar.demo.loadgen import LoadGenerator

MiB = 2**20


@dataclass
class FaultState:
    """What happened to one fault: when it was injected, when it was detected, and the evidence."""

    name: str
    injected_at: float | None = None
    detected_at: float | None = None
    detail: str = ""
    alerts: dict[str, str] = field(default_factory=dict)
    #: What the signal showed at the last poll before the injection (the canary's healthy phase).
    before: str = ""
    #: Values the evidence averages over the polls after the injection, by name.
    series: dict[str, list[float]] = field(default_factory=dict)
    #: Words the evidence keeps by name (the saturation verdict's sentence per phase).
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def detected(self) -> bool:
        return self.detected_at is not None

    @property
    def latency_s(self) -> float | None:
        if self.detected_at is None or self.injected_at is None:
            return None
        return self.detected_at - self.injected_at


#: Each worker's device footprint is this much above the one before it: no two are within
#: ``gpu.duplicates.similarity`` (10%), so a run of any length reports no duplicated model copies.
WORKER_STEP = 1.15


def fake_gpu_processes(cfg: ScenarioConfig, worker_pids: dict[str, list[int]],
                       leak_pid: int | None) -> list[dict[str, Any]]:
    """The fake NVML's processes: one per model-server worker, ``leak_pid`` leaking from the injection on.

    The first worker holds :data:`.allocator.DEVICE_BASE_BYTES`, each next one :data:`WORKER_STEP` times the
    one before: the workers of one server differ in the workspaces their kernels picked and the batches
    their allocator cached for (held outside the allocator's counters, in its non-allocator memory), and
    the canary serves another model. The sidecar's duplicated-copies check stays quiet; the demo's
    leak is the only GPU fault.
    """
    procs: list[dict[str, Any]] = []
    for k, pid in enumerate([*worker_pids.get("stable", []), *worker_pids.get("canary", [])]):
        p: dict[str, Any] = {"pid": pid, "base_gib": round(allocator.DEVICE_BASE_BYTES * WORKER_STEP**k / 2**30, 3)}
        if pid == leak_pid and "gpu_leak" in cfg.faults:
            p["leak_mib_per_s"] = cfg.leak_mib_per_s
            p["leak_start_s"] = cfg.injection_time()
        procs.append(p)
    return procs


def server_faults(cfg: ScenarioConfig, leak_pid: int | None) -> Faults:
    """The fault file's content once ``cfg.faults`` are on."""
    f = Faults()
    if "latency" in cfg.faults:
        f.latency_stage, f.latency_share, f.latency_delay_s = "inference", cfg.latency_share, cfg.latency_delay_s
    if "confidence" in cfg.faults:
        f.hard_share = cfg.hard_share
    if "long_inputs" in cfg.faults:
        f.long_input_share = cfg.long_input_share
    if "retry_storm" in cfg.faults:
        f.latency_stage, f.latency_share, f.latency_delay_s = "inference", 1.0, RETRY_STORM_DELAY_S
    if "saturation" in cfg.faults:
        f.kv_cache_tokens = SATURATION_KV_TOKENS  # its first phase; :func:`saturation_cpu_phase` the second
    if "gpu_leak" in cfg.faults:
        # The sidecar's fake NVML scripts the device side from its config; the allocator side follows here.
        f.leak_pid, f.leak_rate_bytes_per_s = leak_pid, cfg.leak_mib_per_s * MiB
        f.leak_start_unix = time.time()
    f.feature_drift = "drift" in cfg.faults
    f.canary_share = cfg.canary_share if "canary" in cfg.faults else 0.0
    f.canary_fault = "canary" in cfg.faults
    f.injected_unix = {name: time.time() for name in cfg.faults}
    return f


def switch_on(cfg: ScenarioConfig, *, server_url: str | None, token: str, loadgen: LoadGenerator,
              leak_pid: int | None, fault_file: str | None = None) -> Faults:
    """Switch every fault of ``cfg`` on: the model servers', then the load generator's; returns the servers'.

    Args:
        cfg: the scenario.
        server_url: the FastAPI model server, whose ``PUT /admin/faults`` writes the fault file.
        token: its admin token.
        loadgen: the load generator.
        leak_pid: the worker that leaks.
        fault_file: write the fault file here instead (the Triton server has no admin route: it reads the
            file the scenario gave it).
    """
    f = server_faults(cfg, leak_pid)
    if fault_file is not None:
        write(fault_file, f)
    else:
        assert server_url is not None, "a server URL or a fault file"
        _put_faults(server_url, token, f)
    loadgen.drift = "drift" in cfg.faults
    loadgen.hard_share = f.hard_share
    loadgen.long_share = f.long_input_share
    loadgen.canary_share = f.canary_share
    loadgen.bad_events = "bad_events" in cfg.faults
    loadgen.retry_storm = "retry_storm" in cfg.faults
    return f


def saturation_cpu_phase(f: Faults, *, server_url: str, token: str) -> None:
    """The ``saturation`` fault's second phase on the faults ``f`` that :func:`switch_on` set: the KV cache is
    unbounded again, and preprocessing burns CPU on the event loop."""
    f.kv_cache_tokens, f.cpu_burn_ms = 0, SATURATION_CPU_MS
    _put_faults(server_url, token, f)


def _put_faults(server_url: str, token: str, f: Faults) -> None:
    req = urllib.request.Request(f"{server_url}/admin/faults", data=json.dumps(f.to_json()).encode(), method="PUT",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()

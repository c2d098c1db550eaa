"""The saturation rules (docs/saturation.md derives them): five ratios and one binding resource.

Every ratio is "how close this resource is to the level where adding load stops adding
throughput", in [0, 1]:

- ``compute``: tensor-pipe activity over its practical ceiling (0.70: a prefill-bound GPU's dense
  GEMMs keep the pipes 70-85% active), or SM utilization x SM occupancy over 0.40 (SMs busy *and*
  full of warps), whichever is
  higher. Not NVML's utilization: that is the share of time any kernel ran, and memory-bound
  decode keeps it near 100% while most SMs wait on DRAM.
- ``memory_bandwidth``: DRAM bandwidth utilization over its practical ceiling (0.85 of the
  theoretical peak is what streaming kernels reach).
- ``kv_cache``: 1 while the engine preempts (it had no free block), else KV-cache usage over
  0.95 (vLLM preempts at 100% of blocks).
- ``queue``: share of request time spent queued in the engine over 0.5 (requests wait as long as
  they run); without timings, waiting / (waiting + running) over 0.5.
- ``host_cpu``: CPU cores the serving process used over the cores it may use (1 for a Python
  event loop or tokenizer: the GIL), or the host CPU share where that is all the engine gives.

The bound resource is the highest hardware ratio (compute, memory_bandwidth, kv_cache, host_cpu)
at or above ``enter``; ``queue`` only when every hardware ratio is clearly below it (under
``enter - switch_margin``): then the engine's own admission limit, max-num-seqs or max batch size,
binds while the hardware has room. A queue that grows because the GPU is full is a symptom, named
by its cause. ``none`` otherwise. Ratios are smoothed (EWMA, ``smoothing_s``), a resource must hold above ``enter`` for
``enter_hold_s`` to become bound, the bound one is released only after ``exit_hold_s`` below
``exit``, and a different resource takes over only when higher by ``switch_margin`` for
``enter_hold_s``: this hysteresis is what keeps a steady load from flapping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

RESOURCES = ("compute", "memory_bandwidth", "kv_cache", "queue", "host_cpu")
HARDWARE = ("kv_cache", "host_cpu", "memory_bandwidth", "compute")  # precedence on ties
TENSOR_CEILING = 0.70
SM_OCC_CEILING = 0.40
DRAM_CEILING = 0.85
KV_CEILING = 0.95
QUEUE_CEILING = 0.5


@dataclass
class Inputs:
    """One interval's observations of one model version; None where unknown."""

    t: float
    fidelity: str = "none"  # "gpm", "coarse" or "none" (no GPU reading)
    sm_util: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_bw_util: float | None = None
    kernel_active: float | None = None
    kv_usage: float | None = None
    preemptions: float = 0.0
    waiting: float | None = None
    running: float | None = None
    queue_share: float | None = None
    prefill_share: float | None = None
    cpu_cores: float | None = None
    cpu_budget: float = 1.0
    host_cpu_ratio: float | None = None


def _clip(x: float) -> float:
    return 0.0 if math.isnan(x) else min(1.0, max(0.0, x))


def ratios(x: Inputs) -> dict[str, float | None]:
    """The five ratios of one interval (None: no input for that resource)."""
    out: dict[str, float | None] = dict.fromkeys(RESOURCES)
    if x.fidelity == "gpm":
        parts = []
        if x.tensor_active is not None:
            parts.append(x.tensor_active / TENSOR_CEILING)
        if x.sm_util is not None and x.sm_occupancy is not None:
            parts.append(x.sm_util * x.sm_occupancy / SM_OCC_CEILING)
        out["compute"] = _clip(max(parts)) if parts else None
        out["memory_bandwidth"] = None if x.dram_bw_util is None else _clip(x.dram_bw_util / DRAM_CEILING)
    elif x.fidelity == "coarse" and x.sm_util is not None:
        # Only "a kernel ran" and "memory was busy" shares: kernel time not spent waiting on memory
        # is read as compute. Coarse, and said so in the verdict.
        mem = x.dram_bw_util or 0.0
        out["compute"] = _clip(x.sm_util * min(1.0, (1.0 - mem) / 0.5))
        out["memory_bandwidth"] = None if x.dram_bw_util is None else _clip(x.dram_bw_util / DRAM_CEILING)
    if x.preemptions > 0:
        out["kv_cache"] = 1.0
    elif x.kv_usage is not None:
        out["kv_cache"] = _clip(x.kv_usage / KV_CEILING)
    if x.queue_share is not None:
        out["queue"] = _clip(x.queue_share / QUEUE_CEILING)
    elif x.waiting is not None and x.running is not None and x.waiting + x.running > 0:
        out["queue"] = _clip(x.waiting / (x.waiting + x.running) / QUEUE_CEILING)
    if x.cpu_cores is not None:
        out["host_cpu"] = _clip(x.cpu_cores / x.cpu_budget)
    elif x.host_cpu_ratio is not None:
        out["host_cpu"] = _clip(x.host_cpu_ratio)
    return out


@dataclass
class Thresholds:
    enter: float = 0.9
    exit: float = 0.75
    enter_hold_s: float = 10.0
    exit_hold_s: float = 20.0
    smoothing_s: float = 5.0
    switch_margin: float = 0.1


@dataclass
class Judge:
    """The verdict of one model version over time (feed it intervals in time order)."""

    th: Thresholds = field(default_factory=Thresholds)
    smooth: dict[str, float] = field(default_factory=dict)
    bound: str = "none"
    since: float | None = None
    last: Inputs | None = None
    changes: int = 0
    _t: float | None = None
    _above: dict[str, float] = field(default_factory=dict)
    _below_since: float | None = None
    _switch_since: dict[str, float] = field(default_factory=dict)
    _present: set[str] = field(default_factory=set)

    def update(self, x: Inputs) -> str:
        """Take one interval; return the bound resource (or ``none``)."""
        raw = ratios(x)
        dt = 1.0 if self._t is None else max(0.0, x.t - self._t)
        self._t = x.t
        a = 1.0 - math.exp(-dt / self.th.smoothing_s) if self.th.smoothing_s > 0 else 1.0
        for r, v in raw.items():
            if v is None:
                continue  # a missing input keeps its last smoothed value
            old = self.smooth.get(r)
            self.smooth[r] = v if old is None else old + a * (v - old)
        # An input missing twice running (engine down, GPU gone) must not hold the verdict: drop it.
        present = {r for r, v in raw.items() if v is not None}
        for r in [r for r in self.smooth if r not in present and r not in self._present]:
            del self.smooth[r]
        self._present = present
        self.last = x
        self._step(x.t)
        return self.bound

    def _candidate(self) -> str:
        s = self.smooth
        hw = [r for r in HARDWARE if s.get(r, 0.0) >= self.th.enter]
        if hw:
            top = max(s[r] for r in hw)
            return next(r for r in HARDWARE if r in hw and s[r] >= top - 1e-9)
        room = all(s.get(r, 0.0) < self.th.enter - self.th.switch_margin for r in HARDWARE)
        if room and s.get("queue", 0.0) >= self.th.enter:
            return "queue"
        return "none"

    def _step(self, t: float) -> None:
        th, s = self.th, self.smooth
        cand = self._candidate()
        for r in RESOURCES:
            if s.get(r, 0.0) >= th.enter:
                self._above.setdefault(r, t)
            else:
                self._above.pop(r, None)
        if self.bound == "none":
            if cand != "none" and t - self._above.get(cand, t) >= th.enter_hold_s:
                self._set(cand, t)
            return
        cur = s.get(self.bound, 0.0)
        if cur < th.exit:
            self._below_since = t if self._below_since is None else self._below_since
            if t - self._below_since >= th.exit_hold_s:
                new = cand if cand != "none" and t - self._above.get(cand, t) >= th.enter_hold_s else "none"
                self._set(new, t)
            return
        self._below_since = None
        if cand not in ("none", self.bound) and (
                s.get(cand, 0.0) >= cur + th.switch_margin or (self.bound == "queue" and cand in HARDWARE)):
            self._switch_since.setdefault(cand, t)
            if t - self._switch_since[cand] >= th.enter_hold_s:
                self._set(cand, t)
        else:
            self._switch_since.clear()

    def _set(self, r: str, t: float) -> None:
        if r != self.bound:
            self.changes += 1
        self.bound, self.since = r, t
        self._below_since = None
        self._switch_since.clear()

    def sentence(self) -> str:
        """The verdict in one sentence, with the numbers it rests on."""
        return sentence(self.bound, self.smooth, self.last)


def _pct(v: float | None) -> str:
    return "?" if v is None else f"{100 * v:.0f}%"


def sentence(bound: str, smooth: dict[str, float], x: Inputs | None) -> str:
    """Say what binds, with the evidence; where utilization would mislead, say so."""
    if x is None:
        return "no reading yet"
    phase = "the GPU"
    if x.prefill_share is not None:
        phase = "prefill" if x.prefill_share >= 0.5 else "decode"
    coarse = " (coarse: NVML utilization only, no GPM on this GPU)" if x.fidelity == "coarse" else ""
    busy = ""
    if x.kernel_active is not None and x.kernel_active >= 0.8 and bound != "compute":
        busy = f"; GPU utilization {_pct(x.kernel_active)} is not headroom"
    if bound == "memory_bandwidth":
        return (f"{phase} is memory-bandwidth-bound (DRAM {_pct(x.dram_bw_util)}, SM occupancy "
                f"{_pct(x.sm_occupancy)}){busy}{coarse}")
    if bound == "compute":
        return (f"{phase} is compute-bound (tensor pipes {_pct(x.tensor_active)}, SM occupancy "
                f"{_pct(x.sm_occupancy)}, DRAM {_pct(x.dram_bw_util)}){coarse}")
    if bound == "kv_cache":
        pre = f", {x.preemptions:g} preemptions in the last interval" if x.preemptions else ""
        return f"the KV cache is full ({_pct(x.kv_usage)} used{pre}): requests wait for blocks or are recomputed"
    if bound == "queue":
        return (f"requests are queue-bound ({_pct(x.queue_share)} of request time queued, "
                f"{x.waiting if x.waiting is not None else '?':g} waiting) while GPU and KV cache have room: "
                "the engine's batch limit binds" if x.waiting is not None else
                f"requests are queue-bound ({_pct(x.queue_share)} of request time queued) while GPU and KV "
                "cache have room: the engine's batch limit binds")
    if bound == "host_cpu":
        used = (f"{x.cpu_cores:.2f} of {x.cpu_budget:g} cores" if x.cpu_cores is not None
                else f"host CPU {_pct(x.host_cpu_ratio)}")
        return f"the serving process is CPU-bound ({used}) while the GPU waits (SM utilization {_pct(x.sm_util)})"
    known = {r: v for r, v in smooth.items() if v is not None}
    if not known:
        return "headroom: no resource reading yet"
    top = max(known, key=lambda r: known[r])
    return f"headroom: nothing binds; the closest is {top.replace('_', ' ')} at {_pct(known[top])}{busy}"

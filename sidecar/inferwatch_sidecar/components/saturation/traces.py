"""Random saturation traces, one family per resource, for the tests and ``bench/saturation_family.py``.

A trace is one model version's second-by-second :class:`~.rules.Inputs`. The GPU counters come
from the fake GPM's roofline model (:func:`~inferwatch_sidecar.components.gpu.fake_gpm.counters`),
so a compute-bound trace is prefill-heavy with high tensor activity and a bandwidth-bound one is
decode-heavy with DRAM near its ceiling and nvidia-smi utilization near 100% either way. Every
level is drawn at random: the baselines of the resources that do not saturate (below the
thresholds), the onset time, the ramp length, the saturated level and the noise.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from inferwatch_sidecar.components.gpu.fake_gpm import Phase, counters
from inferwatch_sidecar.components.saturation.rules import RESOURCES, Inputs


@dataclass
class Trace:
    """A trace: which resource saturates and when (``onset``: first second at its saturated level)."""

    resource: str  # one of RESOURCES or "none"
    onset: float | None
    duration: float
    seed: int


def _ramp(t: float, start: float, length: float) -> float:
    if t <= start:
        return 0.0
    if length <= 0 or t >= start + length:
        return 1.0
    return (t - start) / length


def draw(rng: random.Random, resource: str, duration: float, steady: bool = False) -> Trace:
    """Draw a trace's shape; ``steady`` saturates from the start (for the long no-flap runs)."""
    if resource == "none":
        return Trace("none", None, duration, rng.randrange(1 << 30))
    if steady:
        return Trace(resource, 0.0, duration, rng.randrange(1 << 30))
    return Trace(resource, rng.uniform(0.3, 0.6) * duration, duration, rng.randrange(1 << 30))


def inputs(tr: Trace, dt: float = 1.0) -> Iterator[Inputs]:
    """The trace's intervals. The saturated level is reached ``onset`` seconds in, after a random ramp."""
    rng = random.Random(tr.seed)
    # Baselines, all under the thresholds (what "steady load with headroom" means here).
    busy0 = rng.uniform(0.2, 0.85)
    pre0 = rng.uniform(0.25, 0.7)
    kv0 = rng.uniform(0.05, 0.7)
    qs0 = rng.uniform(0.0, 0.3)
    cpu0 = rng.uniform(0.05, 0.65)
    run0 = rng.randint(4, 64)
    ramp = rng.uniform(0.0, 20.0)
    onset = tr.onset if tr.onset is not None else math.inf
    start = onset - ramp
    # Saturated levels.
    pre_sat = rng.uniform(0.92, 1.0) if tr.resource == "compute" else rng.uniform(0.0, 0.08)
    busy_sat = rng.uniform(0.97, 1.0)
    kv_sat = rng.uniform(0.96, 1.0)
    preempt_rate = rng.uniform(0.05, 2.0)
    qs_sat = rng.uniform(0.55, 0.9)
    cpu_sat = rng.uniform(0.96, 1.0)
    noise = rng.uniform(0.01, 0.04)
    t = 0.0
    while t < tr.duration:
        k = _ramp(t, start, ramp)
        r = tr.resource
        busy, pre = busy0, pre0
        kv, qs, cpu, pre_n = kv0, qs0, cpu0, 0.0
        if r in ("compute", "memory_bandwidth"):
            busy = busy0 + k * (busy_sat - busy0)
            pre = pre0 + k * (pre_sat - pre0)
            qs = qs0 + k * 0.2  # a saturated GPU also lengthens the queue: a symptom, not the cause
        elif r == "kv_cache":
            kv = kv0 + k * (kv_sat - kv0)
            if k >= 1.0:
                pre_n = float(_poisson(rng, preempt_rate * dt))
            qs = qs0 + k * 0.3
        elif r == "queue":
            qs = qs0 + k * (qs_sat - qs0)
        elif r == "host_cpu":
            cpu = cpu0 + k * (cpu_sat - cpu0)
            busy = busy0 * (1 - 0.6 * k)  # the GPU waits for the CPU
            qs = qs0 + k * 0.25
        c = counters(Phase(_jit(rng, busy, noise), _jit(rng, pre, noise)))
        waiting = max(0.0, run0 * qs / max(1e-9, 1 - qs) + rng.gauss(0, 1))
        yield Inputs(
            t=t, fidelity="gpm",
            sm_util=_jit(rng, c["sm_util"], noise), sm_occupancy=_jit(rng, c["sm_occupancy"], noise),
            tensor_active=_jit(rng, c["tensor"], noise), dram_bw_util=_jit(rng, c["dram"], noise),
            kernel_active=_jit(rng, c["busy"], noise),
            kv_usage=_jit(rng, kv, 0.01), preemptions=pre_n, waiting=round(waiting), running=float(run0),
            queue_share=_jit(rng, qs, noise), prefill_share=_jit(rng, pre, noise),
            cpu_cores=max(0.0, cpu + rng.gauss(0, noise)), cpu_budget=1.0,
        )
        t += dt


def _jit(rng: random.Random, v: float, sd: float) -> float:
    return min(1.0, max(0.0, v + rng.gauss(0.0, sd)))


def _poisson(rng: random.Random, lam: float) -> int:
    n, p, limit = 0, 1.0, math.exp(-lam)
    while True:
        p *= rng.random()
        if p <= limit:
            return n
        n += 1


@dataclass
class Outcome:
    """How the judge did on one trace."""

    resource: str
    named: str  # what it said at the end
    delay_s: float | None  # onset -> first time the right resource was named
    flaps: int  # bound changes after the settle time, beyond the one expected
    named_wrong: bool  # a resource other than the truth (or none) was ever named


def judge_trace(tr: Trace, settle_s: float = 60.0) -> Outcome:
    """Run a fresh judge over ``tr``; for steady traces count every change after ``settle_s``."""
    from inferwatch_sidecar.components.saturation.rules import Judge

    j = Judge()
    delay = None
    wrong = False
    changes_after = 0
    prev = "none"
    for x in inputs(tr):
        b = j.update(x)
        if b != prev and x.t >= settle_s and (tr.onset is None or tr.onset == 0.0):
            changes_after += 1
        if b not in ("none", tr.resource):
            wrong = True
        if delay is None and tr.onset is not None and b == tr.resource:
            delay = max(0.0, x.t - tr.onset)
        prev = b
    return Outcome(tr.resource, j.bound, delay, changes_after, wrong)


__all__ = ["RESOURCES", "Outcome", "Trace", "draw", "inputs", "judge_trace"]

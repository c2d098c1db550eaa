"""The three modes over steps: a concurrency sweep, fixed rates, and a push until failure."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inferwatch_sidecar.components.capacity.knee import Knee, fit
from inferwatch_sidecar.loadtest.client import clock, fetch
from inferwatch_sidecar.loadtest.runner import (
    LoadTestError,
    Objectives,
    Step,
    Target,
    closed_step,
    open_step,
    step_levels,
)

#: A sweep past the knee stops after this many steps that gained less than PLATEAU_GAIN throughput.
PLATEAU_STEPS = 2
PLATEAU_GAIN = 0.05
#: --until-failure: the recommended limit is this share of the concurrency that failed (the seeds: 30% below).
LIMIT_SHARE = 0.7


@dataclass
class Plan:
    mode: str  # "concurrency", "rate", "until-failure"
    levels: list[float]
    duration: float
    max_requests: int
    max_time: float
    slo: Objectives
    full: bool = False
    burstiness: float = 1.0
    max_error_ratio: float = 0.01
    max_concurrency: int = 4096
    seed: int = 0


@dataclass
class Outcome:
    steps: list[Step] = field(default_factory=list)
    knee: Knee | None = None
    failed_at: float | None = None
    failure: str = ""
    recommended_limit: int | None = None
    stopped: str = ""


def doubling(upto: int) -> list[float]:
    out, c = [], 1
    while c <= upto:
        out.append(float(c))
        c *= 2
    return out


async def preflight(t: Target) -> None:
    """One request before the run: a clear error for an unreachable URL, an HTTP error or a non-JSON answer."""
    r = await fetch(t.host, t.port, t.payloads[0].raw, t.timeout, t.stream)
    where = f"http://{t.host}:{t.port}"
    if r.error == "connect":
        raise LoadTestError(f"cannot reach {where}: {r.detail} (is the server running, and is this its port?)")
    if r.error is not None:
        raise LoadTestError(f"{where} gave no complete answer to the first request ({r.error}: {r.detail})")
    snippet = r.body[:200].decode("utf-8", "replace").strip()
    if r.status >= 400:
        raise LoadTestError(f"{where} answered the first request with HTTP {r.status}: {snippet or '(empty body)'}")
    if t.stream:
        if b"data:" not in r.body:
            raise LoadTestError(f"{where} answered a streamed request without server-sent events: {snippet!r}")
        return
    try:
        json.loads(r.body)
    except ValueError:
        raise LoadTestError(f"{where} answered HTTP {r.status} with a body that is not JSON: "
                            f"{snippet or '(empty body)'!r}") from None


def _failed(s: Step, max_error_ratio: float) -> str:
    n = max(s.requests, 1)
    if s.errors.get("oom"):
        return f"{s.errors['oom']} answers reported out of memory"
    if s.errors.get("timeout"):
        return f"{s.errors['timeout']} requests timed out"
    if s.error_count / n > max_error_ratio:
        kinds = ", ".join(f"{k} {v}" for k, v in s.errors.most_common())
        return f"{s.error_count} of {s.requests} requests failed ({kinds})"
    return ""


def _past_knee(steps: list[Step], knee: Knee | None) -> bool:
    if knee is None or not knee.reached or len(steps) < PLATEAU_STEPS + 1:
        return False
    tail = steps[-(PLATEAU_STEPS + 1):]
    return all(b.throughput_rps < a.throughput_rps * (1 + PLATEAU_GAIN) and b.concurrency > knee.concurrency
               for a, b in zip(tail, tail[1:], strict=False))


async def run(t: Target, plan: Plan, on_step: Callable[[Step], Any] | None = None,
              progress: Callable[[Step, float], None] | None = None,
              around: Callable[[Step, bool], Any] | None = None) -> Outcome:
    """Run ``plan`` against ``t``; ``on_step`` sees each finished step, ``around(step, before)`` wraps each."""
    await preflight(t)
    out = Outcome()
    t0 = clock()
    levels = list(plan.levels)
    i = 0
    while i < len(levels):
        if clock() - t0 + plan.duration > plan.max_time:
            out.stopped = f"--max-time {plan.max_time:g} s reached"
            break
        level = levels[i]
        if around:
            await around(Step(level, None, 0.0), True)
        if plan.mode == "rate":
            step = await open_step(t, level, plan.duration, plan.max_requests, plan.slo, plan.burstiness,
                                   seed=plan.seed + i, progress=progress)
        else:
            step = await closed_step(t, int(level), plan.duration, plan.max_requests, plan.slo, seed=plan.seed + i,
                                     progress=progress)
        if around:
            await around(step, False)
        out.steps.append(step)
        if on_step:
            on_step(step)
        out.knee = fit(step_levels(out.steps), seed=plan.seed)
        if plan.mode == "until-failure":
            why = _failed(step, plan.max_error_ratio)
            if why:
                out.failed_at = step.concurrency
                out.failure = why
                out.recommended_limit = max(1, math.floor(LIMIT_SHARE * step.concurrency))
                break
            if i == len(levels) - 1 and level * 2 <= plan.max_concurrency:
                levels.append(level * 2)
        elif plan.mode == "concurrency" and not plan.full and _past_knee(out.steps, out.knee):
            out.stopped = "throughput stopped growing past the knee (--full-sweep runs every level)"
            break
        i += 1
    if plan.mode == "until-failure" and out.failed_at is None and not out.stopped:
        out.stopped = f"no failure up to concurrency {int(levels[-1])} (--max-concurrency {plan.max_concurrency})"
    return out

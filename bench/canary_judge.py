"""The canary judge's error rates: false fails on identical versions, power on real regressions, and both
over the re-judgements of a whole rollout.

**One judgement** (``--runs`` seeded runs per family): a fresh canary component receives one window of
traffic of two versions and judges once. The traffic of each run is drawn from a family, not one fixed
shape: request counts, error/cancel/shed rates, latency medians and spreads, replica counts and stage timer
noise differ per seed (``draw``). Families:

- ``llm``: streamed generations (a ~5 us tokenize stage, then TTFT and inter-token gaps), SLOs set;
- ``classic``: a two-stage classifier with predictions and confidences.

Null runs use the same parameters for both versions; a regression changes one thing in the canary:
3x TTFT, 2x error rate, +30 ms TTFT (llm) or +30 ms on every request (classic). Reported: the share of
runs judged ``fail`` (false fails on null runs, power on regressions) with its 95% Wilson interval, the
share judged ``marginal``, and which metrics failed.

**A rollout** (``--rollouts``): the component runs the way the sidecar runs it, judging every 10 s over
its sliding 600 s window while traffic streams in (stable 8 req/s, canary 2 req/s, the window's
defaults) for ``--minutes``; Argo Rollouts' AnalysisTemplate (deploy/progressive) reads the verdict every
minute and aborts on a second ``fail`` (``failureLimit: 1``: failed > 1). Reported: the share of
identical rollouts with any reported ``fail`` and the share Argo would abort, and for a 3x-TTFT canary
the seconds until the first reported ``fail``.

Usage::

    flock /tmp/bench.lock nice -n 0 python bench/canary_judge.py --runs 1000 --rollouts 200
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import REPO  # noqa: E402  (bench/ is a folder of scripts, not a package)

sys.path[:0] = [str(REPO / "sdk"), str(REPO / "sidecar"), str(REPO)]

import numpy as np  # noqa: E402

from inferwatch.wire import (  # noqa: E402
    EV_RECORD,
    EV_REQUEST,
    OUTCOME_CANCELLED,
    OUTCOME_ERROR,
    OUTCOME_OK,
    OUTCOME_SHED,
)
from inferwatch_sidecar.components.base import ComponentContext  # noqa: E402
from inferwatch_sidecar.components.canary.component import CanaryComponent  # noqa: E402
from inferwatch_sidecar.components.canary.config import CanaryConfig  # noqa: E402

REGRESSIONS = {"llm": ("ttft_3x", "errors_2x", "ttft_plus_30ms"), "classic": ("errors_2x", "latency_plus_30ms")}


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def draw(rng: np.random.Generator, family: str) -> dict[str, Any]:
    """One run's parameters, shared by both versions unless a regression changes the canary's."""
    p: dict[str, Any] = {"n_b": int(rng.integers(1000, 6001)), "n_c": int(rng.integers(500, 3001)),
                         "errors": float(rng.uniform(0.002, 0.03)), "replicas": (int(rng.integers(1, 4)), 1)}
    if family == "llm":
        p.update(cancel=float(rng.uniform(0.0, 0.05)), shed=float(rng.uniform(0.0, 0.03)),
                 ttft=float(rng.uniform(0.05, 1.0)), ttft_sigma=float(rng.uniform(0.2, 0.8)),
                 gap=float(rng.uniform(0.01, 0.08)), tokens=int(rng.integers(4, 33)),
                 tok_noise=float(rng.uniform(0.0, 0.9e-6)) if rng.random() < 0.5 else 0.0)
    else:
        p.update(median=float(rng.uniform(0.005, 0.2)), sigma=float(rng.uniform(0.3, 1.0)))
    # Requests per replica may differ up to 1.5x without a warning; draw replicas so both sides' loads are close.
    rb = max(1, round(p["n_b"] / p["n_c"]))
    p["replicas"] = (rb, 1)
    return p


def llm_events(rng: np.random.Generator, ctx: tuple[str, str, str], n: int, p: dict[str, Any], *,
               ttft_factor: float = 1.0, ttft_add: float = 0.0, errors: float | None = None,
               tok_shift: float = 0.0) -> list[tuple[Any, ...]]:
    tok = rng.lognormal(np.log(5.25e-6), 0.05, n) + tok_shift
    ttft = rng.lognormal(np.log(p["ttft"]), p["ttft_sigma"], n) * ttft_factor + ttft_add
    gaps = rng.lognormal(np.log(p["gap"]), 0.3, (n, p["tokens"] - 1))
    u = rng.random(n)
    err = p["errors"] if errors is None else errors
    c1, c2, c3 = p["cancel"], p["cancel"] + p["shed"], p["cancel"] + p["shed"] + err
    out: list[tuple[Any, ...]] = []
    for i in range(n):
        outcome = (OUTCOME_CANCELLED if u[i] < c1 else OUTCOME_SHED if u[i] < c2 else OUTCOME_ERROR if u[i] < c3
                   else OUTCOME_OK)
        g = [int(x * 1e6) for x in gaps[i]]
        gen_ns = int((ttft[i] + gaps[i].sum()) * 1e9)
        stages = (("tokenize", int(tok[i] * 1e9), None), ("generate", gen_ns, (int(ttft[i] * 1e9), p["tokens"], g)))
        out.append((EV_REQUEST, ctx, 0, gen_ns + int(tok[i] * 1e9), outcome, None, None, None, stages))
    return out


def classic_events(rng: np.random.Generator, ctx: tuple[str, str, str], n: int, p: dict[str, Any], *,
                   add_s: float = 0.0, errors: float | None = None) -> list[tuple[Any, ...]]:
    lat = rng.lognormal(np.log(p["median"]), p["sigma"], n) + add_s
    queue = rng.lognormal(np.log(0.002), 0.8, n)
    err = rng.random(n) < (p["errors"] if errors is None else errors)
    conf = rng.beta(8, 2, n)
    pred = rng.choice(["cat", "dog", "bird"], n, p=[0.5, 0.3, 0.2])
    out: list[tuple[Any, ...]] = []
    for i in range(n):
        out.append((EV_RECORD, ctx, 0, None, str(pred[i]), float(conf[i]), None, None))
        out.append((EV_REQUEST, ctx, 0, int((lat[i] + queue[i]) * 1e9), OUTCOME_ERROR if err[i] else OUTCOME_OK,
                    None, None, None, (("queue", int(queue[i] * 1e9), None), ("inference", int(lat[i] * 1e9), None))))
    return out


def version_events(rng: np.random.Generator, family: str, version: str, n: int, p: dict[str, Any],
                   change: str | None) -> list[tuple[Any, ...]]:
    ctx = ("svc", "m", version)
    if family == "llm":
        kw: dict[str, Any] = {"tok_shift": p["tok_noise"] if version == "v2" else 0.0}
        if change == "ttft_3x":
            kw["ttft_factor"] = 3.0
        elif change == "ttft_plus_30ms":
            kw["ttft_add"] = 0.030
        elif change == "errors_2x":
            kw["errors"] = 2 * p["errors"]
        return llm_events(rng, ctx, n, p, **kw)
    kw = {}
    if change == "latency_plus_30ms":
        kw["add_s"] = 0.030
    elif change == "errors_2x":
        kw["errors"] = 2 * p["errors"]
    return classic_events(rng, ctx, n, p, **kw)


def config(family: str) -> CanaryConfig:
    return CanaryConfig(min_requests=500, baselines={"m": "v1"}, slo={"ttft_s": 2.0, "itl_s": 0.2} if family == "llm" else {})


def component(cfg: CanaryConfig, clock: list[float]) -> CanaryComponent:
    return CanaryComponent(cfg, ComponentContext(clock=lambda: clock[0], monotonic=lambda: clock[0]))


def feed(c: CanaryComponent, events: list[tuple[Any, ...]], producer: int) -> None:
    for i in range(0, len(events), 64):
        c.handle(producer, producer, events[i:i + 64])


def one_judgement(family: str, seed: int, change: str | None) -> Any:
    rng = np.random.default_rng(seed)
    p = draw(rng, family)
    clock = [1000.0]
    c = component(config(family), clock)
    base = version_events(rng, family, "v1", p["n_b"], p, None)
    rb = p["replicas"][0]
    for r in range(rb):
        feed(c, base[r::rb], 1 + r)
    feed(c, version_events(rng, family, "v2", p["n_c"], p, change), 100)
    c.drain(clock[0])
    js = c.evaluate(clock[0])
    return next(j for j in js if j.canary_version == "v2")


def single(runs: int, seed0: int) -> None:
    print(f"one judgement per run, {runs} seeded runs per row (seeds {seed0}..{seed0 + runs - 1})")
    print("| family | canary | fail | 95% interval | marginal | failing metrics (runs) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for family in ("llm", "classic"):
        for change in (None, *REGRESSIONS[family]):
            verdicts: Counter[str] = Counter()
            failed: Counter[str] = Counter()
            for k in range(runs):
                j = one_judgement(family, seed0 + k, change)
                verdicts[getattr(j, "judged_verdict", j.verdict)] += 1  # the judge's own, before any hold
                for m in j.failed:
                    failed[m.label] += 1
            lo, hi = wilson(verdicts["fail"], runs)
            top = ", ".join(f"{name} {n}" for name, n in failed.most_common(4)) or "-"
            print(f"| {family} | {change or 'identical'} | {verdicts['fail']}/{runs} | {lo:.4f}-{hi:.4f} | "
                  f"{verdicts['marginal']} | {top} |", flush=True)


def rollout(seed: int, minutes: float, change: str | None) -> tuple[bool, bool, int, float | None]:
    """(any judged fail, any reported fail, Argo's failed measurements, seconds to the first reported fail)."""
    rng = np.random.default_rng(seed)
    p = draw(rng, "llm")
    cfg = config("llm")
    clock = [0.0]
    c = component(cfg, clock)
    first_fail = None
    argo_fails = 0
    any_fail = any_judged = False
    step = cfg.evaluate_interval_s
    for k in range(int(minutes * 60 / step)):
        clock[0] = (k + 1) * step
        n_b, n_c = rng.poisson(8 * step), rng.poisson(2 * step)
        base = version_events(rng, "llm", "v1", int(n_b), p, None)
        feed(c, base[0::2], 1)
        feed(c, base[1::2], 2)
        feed(c, version_events(rng, "llm", "v2", int(n_c), p, change), 3)
        c.drain(clock[0])
        js = [j for j in c.evaluate(clock[0]) if j.canary_version == "v2"]
        if not js:
            continue
        any_judged |= getattr(js[0], "judged_verdict", js[0].verdict) == "fail"
        if js[0].verdict == "fail":
            any_fail = True
            if first_fail is None:
                first_fail = clock[0]
        if round(clock[0]) % 60 == 0 and js[0].verdict == "fail" and clock[0] <= 600 + 60 * 10:
            argo_fails += 1
    return any_judged, any_fail, argo_fails, first_fail


def rollouts(n: int, minutes: float, seed0: int) -> None:
    print(f"\nrollouts: judged every 10 s over a sliding 600 s window, stable 8 req/s on 2 replicas, canary 2 req/s "
          f"on 1, {minutes:g} min each, {n} seeded rollouts per row")
    judged, anyf, aborted = 0, 0, 0
    for k in range(n):
        j, a, f, _ = rollout(seed0 + k, minutes, None)
        judged += j
        anyf += a
        aborted += f > 1
    lo, hi = wilson(anyf, n)
    print(f"identical: any judged fail in {judged}/{n} rollouts; any reported fail in {anyf}/{n} ({lo:.4f}-{hi:.4f});"
          f" Argo (1-min samples, abort on the 2nd fail) aborts {aborted}/{n}")
    times = []
    for k in range(min(n, 50)):
        _, _, _, t = rollout(seed0 + k, minutes, "ttft_3x")
        times.append(math.inf if t is None else t)
    found = [t for t in times if math.isfinite(t)]
    print(f"3x TTFT: a reported fail in {len(found)}/{len(times)} rollouts; seconds to it: median "
          f"{statistics.median(found) if found else float('nan'):.0f}, max {max(found) if found else float('nan'):.0f} "
          "(the window needs min_requests = 500 canary requests: 250 s at 2 req/s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000, help="seeded runs per family and canary (default 1000)")
    ap.add_argument("--rollouts", type=int, default=200, help="seeded identical rollouts (default 200; 0: none)")
    ap.add_argument("--minutes", type=float, default=30.0, help="minutes per rollout (default 30)")
    ap.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    single(args.runs, args.seed)
    if args.rollouts:
        rollouts(args.rollouts, args.minutes, args.seed)
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()

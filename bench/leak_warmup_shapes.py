"""False alarms of the leak detector on leak-free warm-ups of several shapes (how far its warm-up test generalizes).

Each series is one process for ``--hours`` hours: its weights (2-30 GiB) load in 20 s, then a warm-up of
0.5-6 GiB rises to its plateau with a time constant tau of 1-20 min (log-uniform), under a saw-shaped
allocator sawtooth of 0-1 GiB with a period of 20-120 s, Gaussian noise of 0-80 MiB, sampling every 1, 5
or 10 s, in 2 MiB granules. Nothing leaks, so every episode is a false alarm. The shapes, x the time
since start:

- ``exp``: 1 - exp(-x/tau), ``s_curve``: 1 - (1 + x/tau) exp(-x/tau), ``root``: sqrt(x / 4 tau) up to 1
  at 4 tau (the three that ``bench/leak_family.py`` draws);
- ``tanh``: tanh(x/tau);
- ``hyperbolic``: x / (x + tau), whose plateau is hours away (a sixth of it is still to come after 5 tau).

Usage:
    python bench/leak_warmup_shapes.py             # 30 series of 3 hours per shape (about half a minute)
    python bench/leak_warmup_shapes.py --quick     # 5 series of 1 hour per shape
    python bench/leak_warmup_shapes.py --n 100 --hours 6 --seed 3
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from inferwatch_sidecar.components.gpu.detector import LeakDetector  # noqa: E402
from leak_family import GiB, MiB, warm_rise  # noqa: E402

SHAPES = ("exp", "s_curve", "root", "tanh", "hyperbolic")


def rise(shape: str, x: np.ndarray, tau: float) -> np.ndarray:
    """Share of the warm-up reached at ``x`` seconds (0 to 1)."""
    if shape == "tanh":
        return np.tanh(np.maximum(0.0, x) / tau)
    if shape == "hyperbolic":
        x = np.maximum(0.0, x)
        return x / (x + tau)
    return warm_rise(shape, x, tau)


def background(rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
    """One process's memory without its warm-up: weights loaded in 20 s, a 0-1 GiB saw-shaped sawtooth of
    20-120 s, Gaussian noise of 0-80 MiB (bytes, not yet in granules)."""
    weights = rng.uniform(2, 30) * GiB
    saw, period = rng.uniform(0, 1) * GiB, math.exp(rng.uniform(math.log(20), math.log(120)))
    y = weights * np.clip(t / 20, 0, 1) + saw * (((t + rng.uniform(0, period)) % period) / period)
    return y + rng.normal(0, rng.uniform(0, 80) * MiB, len(t))


def granules(y: np.ndarray) -> np.ndarray:
    """Bytes as NVML reports them: non-negative, in 2 MiB granules."""
    return np.round(np.clip(y, 0, None) / (2 * MiB)) * 2 * MiB


def series(rng: np.random.Generator, shape: str, hours: float) -> tuple[np.ndarray, np.ndarray]:
    """One leak-free process series (times, bytes)."""
    dt = float(rng.choice([1.0, 5.0, 10.0]))
    t = np.arange(0.0, hours * 3600, dt)
    tau = math.exp(rng.uniform(math.log(60), math.log(1200)))
    amp = rng.uniform(0.5, 6) * GiB
    return t, granules(background(rng, t) + amp * rise(shape, t, tau))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=30, help="series per shape (default 30)")
    ap.add_argument("--hours", type=float, default=3.0, help="length of each series in hours (default 3)")
    ap.add_argument("--seed", type=int, default=11, help="random seed (default 11)")
    ap.add_argument("--quick", action="store_true", help="5 series of 1 hour per shape")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.hours = 5, 1.0
    if args.n < 1 or args.hours <= 0:
        ap.error("--n must be at least 1 and --hours positive")
    rng = np.random.default_rng(args.seed)
    print(f"# {args.n} leak-free series of {args.hours:g} h per warm-up shape (seed {args.seed}); every episode "
          "is a false alarm")
    print(f"{'shape':12} {'episodes':>8} {'series alarmed':>15}  first alarm, minutes of age")
    for shape in SHAPES:
        episodes, alarmed, firsts = 0, 0, []
        for _ in range(args.n):
            det = LeakDetector()
            for a, b in zip(*series(rng, shape, args.hours), strict=True):
                det.update(float(a), float(b))
            episodes += len(det.episodes)
            if det.episodes:
                alarmed += 1
                firsts.append(round(det.episodes[0].detected_at / 60))
        print(f"{shape:12} {episodes:8d} {alarmed:>8d} of {args.n:<4d}  {sorted(firsts) or '-'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

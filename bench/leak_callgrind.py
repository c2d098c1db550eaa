"""The leak detector's CPU per series-hour in instructions (callgrind), for each ``detector.method`` side by side.

The sidecar runs one detector per process and per device, live, so its cost per series-hour is what the
issue bounds (within 2x of the trend test's). Wall-clock timings are noisy on a shared machine; instruction
counts are not. The script runs itself under ``valgrind --tool=callgrind`` once with the setup only
(imports, the series drawn) and once per method with the setup plus the detector over the series, and
reports the difference per series-hour, so interpreter start-up cancels out.

The series: ``--hours`` hours sampled every ``--dt`` seconds from a new process: a 3 GiB warm-up (tau 10
min), a 1.5 GiB allocator sawtooth of period 90 s, 20 MiB of noise, 2 MiB granules, and a 1 GiB/h leak
from the middle on (so both the young-series and the old-series paths, quiet and leaking, are paid for).
``--loads N`` adds N model loads of 2 GiB in the first half, each with a 1 GiB warm-up of its own (tau 5
min), so the GLR's null fits a warm-up from each remembered load as well (``glr._load_warm_sse``).

Usage::

    python bench/leak_callgrind.py [--hours 3] [--dt 5] [--loads 0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "bench") not in sys.path:  # loaded by path (the tests): find _harness
    sys.path.insert(0, str(REPO / "bench"))

MiB, GiB = 2**20, 2**30


def series(hours: float, dt: float, loads: int = 0) -> tuple[list[float], list[float]]:
    import numpy as np

    rng = np.random.default_rng(24)
    t = np.arange(0.0, hours * 3600, dt)
    v = (20 * GiB + 3 * GiB * (1 - np.exp(-t / 600)) + 1.5 * GiB * ((t % 90) / 90)
         + GiB / 3600 * np.maximum(0.0, t - hours * 1800) + rng.normal(0, 20 * MiB, len(t)))
    for k in range(loads):
        at = hours * 1800 * (k + 1) / (loads + 1)
        v += (t >= at) * (2 * GiB + GiB * (1 - np.exp(-np.maximum(0.0, t - at) / 300)))
    return t.tolist(), (np.round(v / (2 * MiB)) * 2 * MiB).tolist()


def child(method: str, hours: float, dt: float, loads: int) -> None:
    from inferwatch_sidecar.components.gpu.config import DetectorConfig
    from inferwatch_sidecar.components.gpu.detector import LeakDetector

    t, v = series(hours, dt, loads)
    if method == "none":
        return
    det = LeakDetector(DetectorConfig(method=method))  # type: ignore[arg-type]
    for a, b in zip(t, v, strict=True):
        det.update(a, b)
    print(f"{method}: {len(det.episodes)} episode(s)", file=sys.stderr)


def instructions(method: str, hours: float, dt: float, loads: int = 0) -> int:
    from _harness import STABLE_HASH_ENV, callgrind_run  # here: the counted children run this file

    run = callgrind_run([sys.executable, __file__, "--child", method, "--hours", str(hours), "--dt", str(dt),
                         "--loads", str(loads)],
                        env={"PYTHONPATH": f"{REPO / 'sdk'}:{REPO / 'sidecar'}", **STABLE_HASH_ENV})
    sys.stderr.write("".join(line + "\n" for line in run.stderr.splitlines() if "episode" in line))
    return run.instructions


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=3.0)
    ap.add_argument("--dt", type=float, default=5.0)
    ap.add_argument("--loads", type=int, default=0, help="model loads with warm-ups of their own (default 0)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.loads < 0:
        ap.error(f"--loads must be 0 or more, got {args.loads}")
    if args.child:
        child(args.child, args.hours, args.dt, args.loads)
        return 0
    base = instructions("none", args.hours, args.dt, args.loads)
    per = {}
    for method in ("trend", "glr"):
        per[method] = (instructions(method, args.hours, args.dt, args.loads) - base) / args.hours
        print(f"{method:>6}: {per[method] / 1e6:8.1f} M instructions per series-hour "
              f"({args.hours:g} h sampled every {args.dt:g} s, {args.loads} load(s))")
    print(f"glr / trend: {per['glr'] / per['trend']:.2f}x (target: within 2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GPU leak detection: scenario generator and side-by-side evaluation against today's alerts.

Traces are device memory on an 80 GiB GPU sampled at 1 s: model weights loaded
at start, warm-up growth that plateaus, allocator sawtooth, idle/busy cycles,
model load/unload steps, vLLM-style 90% preallocation, Gaussian noise, all
rounded to 2 MiB allocator granules. Leak traces add a linear creep of 0.1 to
4 GiB/h from a random onset. Quiet traces (no leak) cover 7 simulated days.

Compared side by side on the same traces:

- inferwatch's LeakDetector on the device series (default config);
- ``predict_linear(used[1h], 4h) > total`` with ``for: 5m``;
- ``used / total > 0.9`` with ``for: 5m``.

The baselines are a faithful reimplementation of Prometheus' evaluation:
samples scraped every 15 s, rule evaluation every 15 s, ``predict_linear``'s
least squares with the intercept at the evaluation time (Prometheus'
``linearRegression``), and ``for: 5m`` pending before firing. ``--check-promtool``
cross-checks the reimplementation against ``promtool test rules`` on a series.

Usage:
    python bench/leak_detection.py --quick   # ~1 minute: 1 day per background kind, 2 leaks per rate
    python bench/leak_detection.py           # full: 7 days x 4 background kinds, 10 leaks per rate
    python bench/leak_detection.py --only 1:4   # one trace (the 5th 1 GiB/h one) of the full run, with
                                                # the leak tests each scale failed, minute by minute
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from inferwatch_sidecar.components.gpu.config import DetectorConfig
from inferwatch_sidecar.components.gpu.detector import LeakDetector

MiB = 2**20
GiB = 2**30
TOTAL = 80 * GiB
SCRAPE = 15  # seconds between Prometheus scrapes and rule evaluations
FOR_S = 300  # alert "for:" duration
KINDS = ("training-style", "serving", "vllm-prealloc", "multi-model")
RATES = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)


def background(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Device memory without any leak, bytes at 1 s."""
    t = np.arange(n, dtype=float)
    y = np.zeros(n)
    if kind == "vllm-prealloc":
        # vLLM: weights + KV cache preallocated to 90% within a minute, then flat.
        y += (0.9 * TOTAL + 1.5 * GiB) * np.clip(t / 60.0, 0, 1)  # + CUDA context and NCCL buffers
        y += rng.normal(0, 4 * MiB, n)
        return np.round(y / (2 * MiB)) * 2 * MiB
    weights = rng.uniform(10, 30) * GiB
    y += weights * np.clip(t / 30.0, 0, 1)
    # Warm-up: CUDA graphs, workspaces, first batch shapes; plateaus.
    tau = rng.uniform(30, 300)
    y += rng.uniform(2, 10) * GiB * (1 - np.exp(-t / tau))
    # Allocator sawtooth: the cache fills then a free / empty_cache drops it.
    period = rng.uniform(20, 90)
    amp = rng.uniform(0.5, 3) * GiB
    phase = rng.uniform(0, period)
    y += amp * (((t + phase) % period) / period)
    # Idle/busy cycles: reserved memory grows within ~30 s when traffic arrives and drops when the
    # server empties the allocator cache after going idle.
    busy = np.zeros(n)
    pos = 0
    while pos < n:
        idle = int(rng.uniform(30, 180) * 60)
        work = int(rng.uniform(60, 240) * 60)
        busy[pos + idle: pos + idle + work] = 1.0
        pos += idle + work
    k = np.ones(30) / 30
    busy = np.convolve(busy, k)[:n]
    y += rng.uniform(0.5, 3) * GiB * busy
    if kind == "multi-model":
        # Model loads and unloads: steps of 5-15 GiB about twice a day.
        steps = np.zeros(n)
        loaded: list[int] = []
        for s in np.sort(rng.uniform(0, n, size=max(1, int(n / 43200)))):
            if loaded and rng.random() < 0.5:
                steps[int(s):] -= loaded.pop()
            else:
                size = int(rng.uniform(5, 15) * GiB)
                loaded.append(size)
                steps[int(s):] += size
        y += steps
    if kind == "training-style":
        # A larger batch shape seen once: a single step up at a random time.
        y += rng.uniform(2, 8) * GiB * (t > rng.uniform(0.2, 0.8) * n)
    y += rng.normal(0, rng.uniform(4, 16) * MiB, n)
    y = np.clip(y, 0, 0.97 * TOTAL)
    return np.round(y / (2 * MiB)) * 2 * MiB


# -- baselines: a faithful reimplementation of Prometheus' rule evaluation ------------------
def predict_linear_series(used: np.ndarray, rng_s: int = 3600, ahead_s: int = 4 * 3600) -> tuple[np.ndarray, np.ndarray]:
    """``predict_linear(used[1h], 4h)`` evaluated every SCRAPE seconds on SCRAPE-second samples.

    Prometheus' linearRegression: least squares over the samples in (t-1h, t], x
    measured from the evaluation time, so the intercept is the fitted value at t.
    """
    ts = np.arange(0, len(used), SCRAPE, dtype=float)
    ys = used[::SCRAPE].astype(float)
    k = rng_s // SCRAPE + 1  # samples in [t-1h, t]: Prometheus 2.x range selectors include the left end
    cx = np.concatenate([[0], np.cumsum(ts)])
    cy = np.concatenate([[0], np.cumsum(ys)])
    cxx = np.concatenate([[0], np.cumsum(ts * ts)])
    cxy = np.concatenate([[0], np.cumsum(ts * ys)])
    idx = np.arange(len(ts))
    lo = np.maximum(0, idx - k + 1)
    n = idx - lo + 1
    sx = cx[idx + 1] - cx[lo]
    sy = cy[idx + 1] - cy[lo]
    sxx = cxx[idx + 1] - cxx[lo]
    sxy = cxy[idx + 1] - cxy[lo]
    # Shift x to be relative to the evaluation time t (as Prometheus does).
    t = ts
    sx_r = sx - n * t
    sxx_r = sxx - 2 * t * sx + n * t * t
    sxy_r = sxy - t * sy
    cov = sxy_r - sx_r * sy / n
    var = sxx_r - sx_r * sx_r / n
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = np.where(var > 0, cov / var, 0.0)
    intercept = sy / n - slope * sx_r / n
    val = intercept + slope * ahead_s
    val[n < 2] = np.nan  # needs two samples
    return ts, val


def with_for(cond: np.ndarray) -> np.ndarray:
    """Alert state after ``for: 5m``: firing once cond held for FOR_S seconds of evaluations."""
    need = FOR_S // SCRAPE
    out = np.zeros(len(cond), dtype=bool)
    run = 0
    for i, c in enumerate(cond):
        run = run + 1 if c else 0
        out[i] = run > need
    return out


def baselines(used: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    ts, pl = predict_linear_series(used)
    thr = used[::SCRAPE] > 0.9 * TOTAL
    return {
        "predict_linear": (ts, with_for(np.nan_to_num(pl, nan=0.0) > TOTAL)),
        "threshold_90": (ts, with_for(thr)),
    }


def episodes(ts: np.ndarray, firing: np.ndarray, start: float = 0.0, end: float = math.inf) -> list[float]:
    """Times of rising edges of ``firing`` within [start, end)."""
    f = firing.astype(np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], f])) == 1)
    return [float(ts[i]) for i in edges if start <= ts[i] < end]


def run_detector(used: np.ndarray, cfg: DetectorConfig) -> tuple[list[float], float, LeakDetector]:
    """Leak verdict rising edges (times) and CPU seconds for one trace."""
    det = LeakDetector(cfg)
    edges = []
    was = False
    c0 = time.process_time()
    for t, v in enumerate(used.tolist()):
        det.update(float(t), v)
        now = det.verdict == "leak"
        if now and not was:
            edges.append(det.detected_at if det.detected_at is not None else float(t))
        was = now
    return edges, time.process_time() - c0, det


def sampler_cpu(n_devices: int = 8, n_procs: int = 4, passes: int = 300) -> float:
    """Seconds of CPU per NvmlSampler pass over the fake pynvml (8 GPUs x 4 processes)."""
    from inferwatch_sidecar.components.gpu.fake_nvml import FakeDevice, FakeNvml, FakeProcess, linear_leak
    from inferwatch_sidecar.components.gpu.sampler import NvmlSampler

    clock = [0.0]
    devs = [FakeDevice(processes=[FakeProcess(100 + i * 10 + j, linear_leak(GiB, 1000.0)) for j in range(n_procs)])
            for i in range(n_devices)]
    fake = FakeNvml(devs, clock=lambda: clock[0])
    s = NvmlSampler(lambda: fake)
    s.init()
    c0 = time.process_time()
    for _ in range(passes):
        clock[0] += 1
        s.sample()
    return (time.process_time() - c0) / passes


def check_promtool(used: np.ndarray) -> str:
    """Cross-check predict_linear_series against promtool on one evaluation."""
    exe = shutil.which("promtool")
    if exe is None:
        return "promtool not found: cross-check skipped"
    ts, pl = predict_linear_series(used)
    i = 3600 // SCRAPE + 17
    vals = " ".join(str(int(v)) for v in used[::SCRAPE][: i + 1])
    test = f"""
rule_files: []
evaluation_interval: {SCRAPE}s
tests:
  - interval: {SCRAPE}s
    input_series:
      - series: 'used'
        values: '{vals}'
    promql_expr_test:
      - expr: 'predict_linear(used[1h], 14400)'
        eval_time: {int(ts[i])}s
        exp_samples:
          - labels: '{{}}'
            value: {float(pl[i])!r}
"""
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "t.yml")
        with open(p, "w") as f:
            f.write(test)
        r = subprocess.run([exe, "test", "rules", p], capture_output=True, text=True, timeout=60)
    if r.returncode == 0:
        return f"promtool agrees with the reimplementation (predict_linear at t={int(ts[i])}s = {pl[i]:.6e})"
    return "promtool DISAGREES:\n" + r.stdout + r.stderr


def leak_trace(rng: np.random.Generator, r: float, quick: bool) -> tuple[str, int, np.ndarray, np.ndarray]:
    """Draw one leak trace: (background kind, onset s, leak-free twin, trace with the leak)."""
    kind = KINDS[int(rng.integers(0, len(KINDS)))]
    onset = int(rng.uniform(3600, 3 * 3600))
    horizon = (3 if quick else 8) * 3600 if r >= 0.5 else (6 if quick else 12) * 3600
    n = onset + horizon
    twin = background(kind, n, rng)
    t = np.arange(n)
    used = np.minimum(TOTAL, twin + np.round(r * GiB / 3600 * np.maximum(0, t - onset) / (2 * MiB)) * 2 * MiB)
    return kind, onset, twin, used


def run_only(rng: np.random.Generator, cfg: DetectorConfig, quiet_days: float, leaks_per_rate: int,
             quick: bool, only: tuple[float, int]) -> int:
    """Replay the random stream of a benchmark run up to one leak trace and diagnose that trace."""
    for kind in KINDS:  # the quiet traces come first in the stream; draw them, do not evaluate them
        background(kind, int(quiet_days * 86400), rng)
    for r in RATES:
        for i in range(leaks_per_rate):
            kind, onset, _, used = leak_trace(rng, r, quick)
            if (r, i) == only:
                break
        else:
            continue
        break
    print(f"# {r} GiB/h trace {i}: background {kind}, onset {onset} s, {len(used)} samples")
    det = LeakDetector(cfg)
    was = False
    last_report = -math.inf
    for t, v in enumerate(used.tolist()):
        det.update(float(t), v)
        if t >= onset and t - last_report >= 60 and det._by_scale[0] is not None and not was:
            last_report = t
            cells = []
            for res in det._by_scale:
                if res is None:
                    cells.append("-")
                    continue
                why = failed_conditions(res, cfg)
                cells.append(f"{res.window_s:.0f}s:{'PASS' if res.passed else ','.join(why)}")
            print(f"  +{(t - onset) / 60:5.1f} min  " + "  ".join(cells))
        now = det.verdict == "leak"
        if now and not was:
            print(f"detected at +{((det.detected_at or t) - onset) / 60:.1f} min, rate "
                  f"{(det.rate or 0) * 3600 / GiB:.3f} GiB/h")
            return 0
        was = now
    print("never detected")
    return 0


def failed_conditions(res: Any, cfg: DetectorConfig) -> list[str]:
    """Names of the leak conditions a TrendResult failed (mirrors detector.trend's conjunction)."""
    rises = res.rises
    out = []
    if not res.z > cfg.z:
        out.append(f"z={res.z:.1f}")
    if not res.lower > cfg.min_rate_bytes_per_s:
        out.append("lower")
    if sum(x <= 0 for x in rises) > (len(rises) - 1) // 2:
        out.append("flat_pairs")
    elif min(x for x in rises if x > 0) < cfg.min_rise_ratio * max(rises):
        out.append("rise_ratio=" + "/".join(f"{x / MiB:.0f}" for x in rises))
    if not cfg.balance <= res.half_ratio <= 1 / cfg.balance:
        out.append(f"balance={res.half_ratio:.2f}")
    if res.step_share > cfg.max_step_share:
        out.append(f"step={res.step_share:.2f}")
    if not out:
        out.append("noise/jitter")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller run (about a minute)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--check-promtool", action="store_true", help="cross-check predict_linear with promtool")
    ap.add_argument("--only", metavar="RATE:INDEX",
                    help="run one leak trace only (e.g. 1:3 = the 4th 1 GiB/h trace of this seed and mode) "
                         "and print why the detector fired when it did; the traces are the same as in the "
                         "full or --quick run")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    cfg = DetectorConfig()
    quiet_days = 1.0 if args.quick else 7.0
    leaks_per_rate = 2 if args.quick else 10
    if args.only:
        try:
            r_s, i_s = args.only.split(":")
            only = (float(r_s), int(i_s))
        except ValueError:
            ap.error(f"--only takes RATE:INDEX (e.g. 1:3), got {args.only!r}")
        if only[0] not in RATES or not 0 <= only[1] < leaks_per_rate:
            ap.error(f"--only: rate must be one of {RATES} and index 0..{leaks_per_rate - 1}")
        return run_only(rng, cfg, quiet_days, leaks_per_rate, args.quick, only)
    names = ("inferwatch", "predict_linear", "threshold_90")

    print(f"# Quiet traces: {quiet_days:g} simulated days for each of {len(KINDS)} background kinds")
    fa: dict[str, dict[str, int]] = {n: {} for n in names}
    det_cpu, det_samples = 0.0, 0
    for kind in KINDS:
        used = background(kind, int(quiet_days * 86400), rng)
        edges, cpu, _ = run_detector(used, cfg)
        det_cpu += cpu
        det_samples += len(used)
        fa["inferwatch"][kind] = len(edges)
        for name, (ts, firing) in baselines(used).items():
            fa[name][kind] = len(episodes(ts, firing))
        if args.check_promtool and kind == "serving":
            print("  " + check_promtool(used))
    days = quiet_days * len(KINDS)
    print(f"\n{'detector':<16}" + "".join(f"{k:>16}" for k in KINDS) + f"{'alarms/day':>12}")
    for n in names:
        tot = sum(fa[n].values())
        print(f"{n:<16}" + "".join(f"{fa[n][k]:>16}" for k in KINDS) + f"{tot / days:>12.2f}")

    print(f"\n# Leak traces: {leaks_per_rate} per rate, random onset 1-3 h, background kind drawn at random")
    delays: dict[str, dict[float, list[float]]] = {n: {r: [] for r in RATES} for n in names}
    missed: dict[str, dict[float, int]] = {n: dict.fromkeys(RATES, 0) for n in names}
    pre: dict[str, int] = dict.fromkeys(names, 0)
    rate_err: dict[float, list[float]] = {r: [] for r in RATES}
    for r in RATES:
        for _ in range(leaks_per_rate):
            kind, onset, twin, used = leak_trace(rng, r, args.quick)
            n = len(used)
            edges, cpu, det = run_detector(used, cfg)
            det_cpu += cpu
            det_samples += n
            results = {"inferwatch": (edges, det)}
            quiet = baselines(twin)
            for name, (ts, firing) in baselines(used).items():
                # Credit a baseline only for firing its leak-free twin trace does not share: an alert
                # already firing on the background (a step, the 90% preallocation) detects nothing.
                results[name] = (episodes(ts, firing & ~quiet[name][1]), None)
            for name, (ed, d) in results.items():
                pre[name] += sum(1 for e in ed if e < onset)
                after = [e for e in ed if e >= onset]
                if after:
                    delays[name][r].append(after[0] - onset)
                else:
                    # An alert already firing at onset (90% on a preallocated GPU) detects nothing.
                    missed[name][r] += 1
                if name == "inferwatch" and d is not None and d.verdict == "leak" and d.rate:
                    rate_err[r].append(d.rate / (r * GiB / 3600) - 1)
    print("(baselines are credited only for firing that the same trace without the leak does not show;"
          " inferwatch for any firing after onset)")
    print(f"\n{'rate GiB/h':<12}" + "".join(f"{n + ' median delay':>36}" for n in names))
    for r in RATES:
        cells = []
        for n in names:
            d = delays[n][r]
            med = f"{statistics.median(d) / 60:.1f} min" if d else "never"
            worst = f", worst {max(d) / 60:.1f}" if d else ""
            cells.append(f"{med} ({len(d)}/{len(d) + missed[n][r]}{worst})")
        print(f"{r:<12}" + "".join(f"{c:>36}" for c in cells))
    print(f"\ninferwatch false alarms before onset on the leak traces: {pre['inferwatch']}")
    print("inferwatch rate estimate error at the end (median |rel. error|): " + ", ".join(
        f"{r}: {statistics.median([abs(e) for e in rate_err[r]]) * 100:.1f}%" for r in RATES if rate_err[r]))

    per_update = det_cpu / det_samples
    s_cpu = sampler_cpu()
    print("\n# CPU")
    print(f"detector: {per_update * 1e6:.1f} us per sample (3 scales), {det_samples:,} samples; "
          f"one series at 1 Hz = {per_update * 100:.4f}% of a core; 1000 series = {per_update * 1000 * 100:.1f}%")
    print(f"sampler over the fake pynvml (8 GPUs x 4 processes): {s_cpu * 1e3:.2f} ms per pass "
          f"= {s_cpu * 100:.2f}% of a core at 1 Hz (the real NVML calls add driver time; run "
          "bench/gpu_real_check.py on a GPU)")

    # Targets.
    d1 = delays["inferwatch"][1.0]
    ok_delay = bool(d1) and missed["inferwatch"][1.0] == 0 and max(d1) <= 15 * 60
    ours = sum(fa["inferwatch"].values())
    ok_quiet = ours == 0
    ok_fewer = all(ours < sum(fa[n].values()) for n in ("predict_linear", "threshold_90"))

    def med(name: str, r: float) -> float:
        d = delays[name][r]
        return statistics.median(d) if d else math.inf

    # Shorter median delay than predict_linear at every rate (never detected counts as infinite).
    ok_faster = all(med("inferwatch", r) < med("predict_linear", r) for r in RATES)
    print("\n# Targets")
    print(f"[{'PASS' if ok_delay else 'FAIL'}] 1 GiB/h detected within 15 min of onset "
          f"(worst {max(d1) / 60 if d1 else float('nan'):.1f} min, {missed['inferwatch'][1.0]} missed)")
    print(f"[{'PASS' if ok_quiet else 'FAIL'}] no false alarm in {days:g} simulated quiet days ({ours})"
          + ("" if days >= 7 else " (the 7-day target needs the full run)"))
    print(f"[{'PASS' if ok_fewer else 'FAIL'}] fewer false alarms than both baselines "
          f"({ours} vs predict_linear {sum(fa['predict_linear'].values())}, "
          f"threshold_90 {sum(fa['threshold_90'].values())})")
    print(f"[{'PASS' if ok_faster else 'FAIL'}] shorter median delay than predict_linear at every rate")
    return 0 if (ok_delay and ok_quiet and ok_fewer and ok_faster) else 1


if __name__ == "__main__":
    sys.exit(main())

"""GPU leak detection on an independent, randomly drawn family of traces, side by side with today's alerts.

The traces come from ``bench/leak_family.py``: every parameter (sawtooth amplitude, period and shape,
noise, sampling interval, missing and duplicated samples, warm-up, busy/idle swings, loads, 90%
preallocation, daily cycle, processes per GPU, leak onset, restarts) is drawn at random per trace; see
docs/gpu.md. As in the sidecar, the detector (default config) runs on each process's series (what NVML
reports per PID) and on the device's memory that no process accounts for; the device is leaking while
any of them is.

Compared on the same traces:

- inferwatch's LeakDetector (default config);
- ``predict_linear(used[1h], 4h) > total`` with ``for: 5m``;
- ``used / total > 0.9`` with ``for: 5m``.

The baselines are a faithful reimplementation of Prometheus' evaluation: samples scraped every 15 s
(the last sample before each scrape), rule evaluation every 15 s, ``predict_linear``'s least squares
with the intercept at the evaluation time, and ``for: 5m`` pending before firing. ``--check-promtool``
cross-checks the reimplementation against ``promtool test rules`` on one series.

Reported per leak rate: share detected (before the leak stopped or the trace ended) in the leaking
process, median and 95th percentile delay from the effective onset (the onset, or the end of the leaking process's warm-up
plateau if later), and for inferwatch the rate error at detection, 15 minutes later (the episode still open)
and at the end (the issue's targets: within 20% for 90% and 95% of them), and for leaks that a
restart stopped whether the verdict cleared within 10 minutes (a restarted process is a new PID: the
old PID's episode ends when its series does, as the sidecar's pruning ends it). False alarms: episodes on
the leak-free days, per day, and on the leak traces any episode before the onset or in a series that
does not leak.

Usage:
    python bench/leak_detection.py --quick   # 4 leak-free days, 6 leaks per rate (a few minutes)
    python bench/leak_detection.py           # 28 leak-free days, 30 leaks per rate
    python bench/leak_detection.py --set min_blocks=4   # a variant of a gpu.detector setting
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from inferwatch_sidecar.components.gpu.config import DetectorConfig  # noqa: E402
from inferwatch_sidecar.components.gpu.detector import Episode, LeakDetector  # noqa: E402
from leak_baselines import baseline_edges, check_promtool, scrape  # noqa: E402
from leak_family import GiB, MiB, Trace, make_trace  # noqa: E402
from leak_oracle import REGIME_A_P, deadline, floor_period, oracle_time, own_noise, regime  # noqa: E402

RATES = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
NAMES = ("inferwatch", "predict_linear", "threshold_90")


@dataclass
class Outcome:
    """What one detector did on one leak trace."""

    delay: float | None = None  # from the effective onset; None: not detected while the leak lasted
    pre: int = 0  # episodes before the onset (false alarms)
    rate_at_detection: float | None = None
    rate_later: float | None = None  # RATE_LATER_S after the detection, while the episode lasted
    rate_at_end: float | None = None
    rate_se_at_detection: float | None = None  # the rate's standard error then, from its interval
    cleared_after_stop: float | None = None  # seconds after the stop; None: not cleared


@dataclass
class Tally:
    """Per-rate results of one detector."""

    delays: list[float] = field(default_factory=list)
    missed: int = 0
    rate_err_det: list[float] = field(default_factory=list)
    rate_err_later: list[float] = field(default_factory=list)
    rate_err_end: list[float] = field(default_factory=list)
    # Per detection: the chance an unbiased rate with its own standard error then is within 20% (the noise's bound).
    rate_p20_det: list[float] = field(default_factory=list)
    stops: int = 0
    stops_cleared: int = 0
    #: sawtooth group (``sawtooth_group``) -> whether each leak of it was found within the target delay
    within: dict[str, list[bool]] = field(default_factory=dict)
    #: regime (``leak_oracle.regime``) -> (oracle separates it by the deadline, detected by the deadline) per leak
    oracle: dict[str, list[tuple[bool, bool]]] = field(default_factory=dict)


#: A leaking process whose allocator sawtooth is at least this large and slower than SLOW_SAW_S shows its
#: release floor fewer than 8 times in 15 minutes: the floor, which carries the leak, is sampled too rarely
#: to test its trend within the 1 GiB/h target.
SLOW_SAW_AMP = 128 * MiB
SLOW_SAW_S = 120.0


def sawtooth_group(tr: Trace) -> str:
    """``slow saw`` when the leaking process's sawtooth releases its cache less often than every 2 min, else ``fast saw``."""
    d = tr.desc
    slow = d["saw_amp_gib"] * GiB >= SLOW_SAW_AMP and d["saw_period_s"] > SLOW_SAW_S and not d["prealloc"]
    return "slow saw" if slow else "fast saw"


#: The issue's second rate target: the estimate this long after the detection (within 20% for 95%).
RATE_LATER_S = 900.0


@dataclass
class Device:
    """The detectors of one trace: one per process row, and ``residual`` for the unaccounted memory.

    ``rates[row]``: per episode (by detection time) its rate at detection, RATE_LATER_S later (None where it had
    cleared by then) and the rate's standard error at detection; an episode's own ``rate`` is its latest estimate.
    """

    procs: list[LeakDetector]
    residual: LeakDetector
    last_seen: list[float]
    end: float
    rates: list[dict[float, list[float | None]]] = field(default_factory=list)

    def episodes(self, row: int | None) -> list[Episode]:
        """Episodes of one process row (None: the residual), open ones ended when the PID's series ends."""
        if row is None:
            return list(self.residual.episodes)
        out = []
        for e in self.procs[row].episodes:
            if e.cleared_at is None and self.last_seen[row] < self.end:
                e = replace(e, cleared_at=self.last_seen[row])
            out.append(e)
        return out

    def all_episodes(self) -> list[tuple[int | None, Episode]]:
        rows: list[int | None] = [*range(len(self.procs)), None]
        return [(r, e) for r in rows for e in self.episodes(r)]


def run_detector(tr: Trace, cfg: DetectorConfig) -> Device:
    """Feed every process series and the residual (device minus the processes) to its own detector."""
    dets = [LeakDetector(cfg) for _ in range(len(tr.procs))]
    residual = LeakDetector(cfg)
    last = [-math.inf] * len(tr.procs)
    ts = tr.t.tolist()
    rates: list[dict[float, list[float | None]]] = []
    for row, det in enumerate(dets):
        ys = tr.procs[row]
        ok = ~np.isnan(ys)
        rates.append(feed_tracking_rates(det, tr.t[ok].tolist(), ys[ok].tolist()))
        if ok.any():
            last[row] = float(tr.t[ok][-1])
    for t, v in zip(ts, (tr.used - np.nansum(tr.procs, axis=0)).tolist(), strict=True):
        residual.update(t, v)
    return Device(dets, residual, last, float(tr.t[-1]), rates)


def feed_tracking_rates(det: LeakDetector, ts: list[float], ys: list[float]) -> dict[float, list[float | None]]:
    """Feed a series to ``det``; per episode (its detection time), the rate at detection and RATE_LATER_S later."""
    out: dict[float, list[float | None]] = {}
    seen: float | None = None
    for t, v in zip(ts, ys, strict=True):
        det.update(t, v)
        at = det.detected_at
        if at is not None and at != seen:
            seen = at
            ci = det.ci
            q = NormalDist().inv_cdf(0.5 + det.cfg.confidence / 2)
            out[at] = [det.rate, None, None if ci is None else (ci[1] - ci[0]) / (2 * q)]
        if seen is not None and out[seen][1] is None and t >= seen + RATE_LATER_S and at == seen:
            out[seen][1] = det.rate
    return out


def run_allocated(tr: Trace, cfg: DetectorConfig) -> list[list[Episode]]:
    """The detector on each row's allocated bytes (the torch probe's series): episodes per row."""
    out = []
    for row in range(len(tr.alloc)):
        det = LeakDetector(cfg)
        ys = tr.alloc[row]
        ok = ~np.isnan(ys)
        for t, v in zip(tr.t[ok].tolist(), ys[ok].tolist(), strict=True):
            det.update(t, v)
        out.append(list(det.episodes))
    return out


def judge_leak(tr: Trace, det: Device | None, edges: list[float] | None) -> Outcome:
    assert tr.onset is not None and tr.effective_onset is not None and tr.leaker is not None
    end = tr.stop if tr.stop is not None else math.inf
    out = Outcome()
    if det is not None:
        eps = det.episodes(tr.leaker)
        out.pre = sum(1 for e in eps if e.detected_at < tr.onset)
        out.pre += sum(1 for r, _ in det.all_episodes() if r != tr.leaker)
        hit = [e for e in eps if tr.onset <= e.detected_at < end]
        if hit:
            e = hit[0]
            out.delay = max(0.0, e.detected_at - tr.effective_onset)
            # The episode's own rate is its latest estimate; the one at detection is recorded as it ran.
            out.rate_at_detection, out.rate_later, out.rate_se_at_detection = det.rates[tr.leaker].get(
                e.detected_at, [None, None, None])
            out.rate_at_end = hit[-1].rate
            # After the stop: how long until no episode of the leaking PID is open (its exit ends one
            # that is; 0 when none was open at the stop).
            if tr.stop is not None:
                open_at = [x for x in eps if x.detected_at <= tr.stop and (x.cleared_at is None or x.cleared_at > tr.stop)]
                ends = [x.cleared_at for x in open_at]
                if None not in ends:
                    out.cleared_after_stop = max([0.0] + [float(c) - tr.stop for c in ends if c is not None])
    else:
        assert edges is not None
        out.pre = sum(1 for x in edges if x < tr.onset)
        hit = [x for x in edges if tr.onset <= x < end]
        if hit:
            out.delay = max(0.0, hit[0] - tr.effective_onset)
    return out


def pct(v: list[float], q: float) -> float:
    """The q-th percentile as the ceil(q/100 n)-th smallest value (inf for a leak never detected)."""
    if not v:
        return math.nan
    s = sorted(v)
    return float(s[max(0, math.ceil(q / 100 * len(s)) - 1)])


def _setting(kv: str) -> tuple[str, object]:
    """``KEY=JSON`` (a bare word is a string) -> (KEY, value)."""
    key, sep, raw = kv.partition("=")
    if not sep or not key:
        raise ValueError(f"{kv!r} is not KEY=VALUE")
    if key not in DetectorConfig.model_fields:
        raise ValueError(f"unknown detector setting {key!r}; one of {', '.join(sorted(DetectorConfig.model_fields))}")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def shapes_section(seed: int, cfg: DetectorConfig, per_rate: int, quiet_days: int, dump: Any) -> tuple[int, bool]:
    """The shapes the family added (``leak_family.SHAPES``, and two GPUs in one log), from a draw of their own.

    Prints, per shape, the oracle-separable leaks and how many were found by their deadline, and the alarms
    before an onset or in a series (or a GPU) that does not leak; a second model loaded and unloaded on
    leak-free days must stay quiet. Returns (samples judged, whether every count is on target).
    """
    rng = np.random.default_rng([seed, 2])
    samples = 0
    print("\nadded shapes (a draw of their own; the base family above is unchanged):")
    print(f"{'shape':<14}{'leaks':>6}{'oracle':>8}{'found in time':>15}{'of all':>8}{'false alarms':>14}")
    tot = [0, 0]
    ok = True
    for shape in ("jitter", "swap", "two_gpus"):
        n = n_or = hit_or = hit = fa = 0
        for r in RATES:
            for _ in range(per_rate):
                tr = make_trace(rng, r, shape="base" if shape == "two_gpus" else shape)
                det = run_detector(tr, cfg)
                samples += len(tr.t)
                if shape == "two_gpus":
                    # The other GPU of the log: leak-free, the same length and sampling.
                    other = make_trace(rng, 0.0, duration=float(tr.t[-1]) + 1.0)
                    fa += len(run_detector(other, cfg).all_episodes())
                    samples += len(other.t)
                o = judge_leak(tr, det, None)
                assert tr.leak_proc is not None and tr.effective_onset is not None
                period = floor_period(tr.leak_proc, float(tr.desc["dt"]))  # type: ignore[arg-type]
                due = deadline(tr, r, period)
                sep = oracle_time(tr, due)[0] <= due
                in_time = o.delay is not None and tr.effective_onset + o.delay <= due
                n += 1
                n_or += sep
                hit_or += sep and in_time
                hit += in_time
                fa += o.pre
                if dump is not None:
                    dump.write(json.dumps({"kind": "shape_leak", "shape": shape, "rate": r, "regime": regime(period),
                                           "P": period, "onset": tr.onset, "eff": tr.effective_onset, "due": due,
                                           "separable": bool(sep), "delay": o.delay, "in_time": in_time,
                                           "pre": o.pre, **tr.desc}) + "\n")
        tot[0] += hit_or
        tot[1] += n_or
        ok &= fa == 0
        print(f"{shape:<14}{n:>6}{n_or:>8}{hit_or:>15}{hit:>8}{fa:>14}")
    quiet = 0
    for _ in range(quiet_days):
        tr = make_trace(rng, 0.0, shape="second_model")
        eps = run_detector(tr, cfg).all_episodes()
        samples += len(tr.t)
        quiet += len(eps)
        if dump is not None:
            for r_, e_ in eps:
                dump.write(json.dumps({"kind": "shape_false_alarm", "shape": "second_model", "row": r_,
                                       "detected_at": e_.detected_at, **tr.desc}) + "\n")
    ok &= quiet == 0
    print(f"{'second_model':<14}{'':>6}{'':>8}{'':>15}{'':>8}{quiet:>14}   ({quiet_days} leak-free days, a second "
          "model loaded and unloaded every 1.5-3 h)")
    share = tot[0] / tot[1] if tot[1] else 1.0
    print(f"HEADLINE (added shapes): {tot[0]} of the {tot[1]} oracle-separable leaks by their deadline "
          f"({share * 100:.1f}%; target 95%)")
    return samples, ok and share >= 0.95


@dataclass
class Run:
    """What the base family's traces gave: alarms, tallies per detector and rate, the detector's CPU."""

    cfg: DetectorConfig
    dump: Any = None
    fa: dict[str, int] = field(default_factory=lambda: dict.fromkeys(NAMES, 0))
    pre: dict[str, int] = field(default_factory=lambda: dict.fromkeys(NAMES, 0))
    tallies: dict[str, dict[float, Tally]] = field(
        default_factory=lambda: {n: {r: Tally() for r in RATES} for n in NAMES})
    #: per leak: (separable at the issue's 20 MiB, separable at the trace's own floor noise, found in time)
    own: list[tuple[bool, bool, bool]] = field(default_factory=list)
    alloc_fa: int = 0
    alloc_pre: int = 0
    alloc_hits: dict[float, list[bool]] = field(default_factory=lambda: {r: [] for r in RATES})
    det_cpu: float = 0.0
    det_samples: int = 0

    def detect(self, tr: Trace) -> Device:
        c0 = time.process_time()
        det = run_detector(tr, self.cfg)
        self.det_cpu += time.process_time() - c0
        self.det_samples += len(tr.t)
        return det

    def quiet_day(self, i: int, tr: Trace) -> None:
        """One leak-free day: every alarm on it is a false one."""
        det = self.detect(tr)
        self.alloc_fa += sum(len(e) for e in run_allocated(tr, self.cfg))
        self.fa["inferwatch"] += len(det.all_episodes())
        if self.dump is not None:
            for r_, e_ in det.all_episodes():
                self.dump.write(json.dumps({"kind": "false_alarm", "day": i, "row": r_, "detected_at": e_.detected_at,
                                            "onset_estimate": e_.onset_estimate, "rate_gib_h": e_.rate * 3600 / GiB,
                                            **tr.desc}) + "\n")
        for name, ed in baseline_edges(tr).items():
            self.fa[name] += len(ed)

    def leak(self, r: float, tr: Trace) -> None:
        """One leak trace at ``r`` GiB/h, judged for every detector against the target and the oracle."""
        det = self.detect(tr)
        true = r * GiB / 3600
        results = {"inferwatch": judge_leak(tr, det, None)}
        for name, ed in baseline_edges(tr).items():
            results[name] = judge_leak(tr, None, ed)
        target_s = (15.0 * 60 if r >= 1 else 256 * MiB / true)
        assert tr.leak_proc is not None and tr.effective_onset is not None
        period = floor_period(tr.leak_proc, float(tr.desc["dt"]))  # type: ignore[arg-type]
        due = deadline(tr, r, period)
        t_or = oracle_time(tr, due)[0]
        t_own = oracle_time(tr, due, own_noise(tr, period))[0]
        self._allocated(r, tr, target_s)
        if self.dump is not None:
            o_ = results["inferwatch"]
            self.dump.write(json.dumps({
                "kind": "leak", "rate": r, "regime": regime(period), "P": period, "onset": tr.onset,
                "eff": tr.effective_onset, "stop": tr.stop, "t_or": t_or if math.isfinite(t_or) else None,
                "t_or_own": t_own if math.isfinite(t_own) else None,
                "due": due, "delay": o_.delay, "pre": o_.pre,
                "rate_det": o_.rate_at_detection, "rate_later": o_.rate_later, "rate_end": o_.rate_at_end,
                "rate_se_det": o_.rate_se_at_detection,
                "in_time": o_.delay is not None and tr.effective_onset + o_.delay <= due,
                "false": [[r_, e_.detected_at] for r_, e_ in det.all_episodes()
                          if r_ != tr.leaker or e_.detected_at < tr.onset],
                **tr.desc}) + "\n")
        for name, o in results.items():
            self._tally(name, r, tr, o, true, target_s, period, due, t_or)
        o = results["inferwatch"]
        self.own.append((t_or <= due, t_own <= due,
                         o.delay is not None and tr.effective_onset + o.delay <= due))

    def _allocated(self, r: float, tr: Trace, target_s: float) -> None:
        """Allocator first: the leaking process's allocated floor, judged against the regime-A deadline."""
        assert tr.effective_onset is not None and tr.onset is not None
        a_eps = run_allocated(tr, self.cfg)
        end = tr.stop if tr.stop is not None else math.inf
        a_hit = [e for e in a_eps[tr.leaker or 0] if tr.onset <= e.detected_at < end]
        self.alloc_hits[r].append(bool(a_hit) and a_hit[0].detected_at <= tr.effective_onset + target_s)
        self.alloc_pre += sum(1 for e in a_eps[tr.leaker or 0] if e.detected_at < tr.onset)
        self.alloc_pre += sum(len(x) for k, x in enumerate(a_eps) if k != tr.leaker)

    def _tally(self, name: str, r: float, tr: Trace, o: Outcome, true: float, target_s: float, period: float,
               due: float, t_or: float) -> None:
        assert tr.effective_onset is not None
        tl = self.tallies[name][r]
        in_time = o.delay is not None and tr.effective_onset + o.delay <= due
        tl.oracle.setdefault(regime(period), []).append((t_or <= due, in_time))
        tl.within.setdefault(sawtooth_group(tr), []).append(o.delay is not None and o.delay <= target_s)
        self.pre[name] += o.pre
        if o.delay is None:
            tl.missed += 1
        else:
            tl.delays.append(o.delay)
        if name == "inferwatch":
            if o.rate_at_detection is not None:
                tl.rate_err_det.append(o.rate_at_detection / true - 1)
                if o.rate_se_at_detection:
                    tl.rate_p20_det.append(2 * NormalDist().cdf(0.2 * true / o.rate_se_at_detection) - 1)
            if o.rate_later is not None:
                tl.rate_err_later.append(o.rate_later / true - 1)
            if o.rate_at_end is not None:
                tl.rate_err_end.append(o.rate_at_end / true - 1)
            if tr.stop is not None and o.delay is not None:
                tl.stops += 1
                tl.stops_cleared += o.cleared_after_stop is not None and o.cleared_after_stop <= 600


def parse_args() -> tuple[argparse.Namespace, DetectorConfig]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller run")
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--check-promtool", action="store_true", help="cross-check predict_linear with promtool")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="a detector setting (gpu.detector.KEY) for a variant, e.g. --set max_quarter_share=0.75 "
                         "or --set 'scales=[[900,10],[3600,30]]'; repeatable")
    ap.add_argument("--no-shapes", action="store_true", help="leave out the added shapes (jittered rows, a model "
                    "swap then a leak, two GPUs in one log, a second model loaded and unloaded)")
    ap.add_argument("--dump", metavar="FILE", help="write one JSON line per leak and per false alarm (for a study "
                    "of the misses: rate, regime, P, t_or, deadline, detection, the drawn parameters)")
    args = ap.parse_args()
    try:
        cfg = DetectorConfig(**dict(_setting(kv) for kv in args.set))
    except ValueError as e:  # pydantic's ValidationError is one
        ap.error(f"--set: {e}")
    return args, cfg


def main() -> int:
    args, cfg = parse_args()
    if args.set:
        print("# detector variant: " + ", ".join(args.set))
    quiet_days = 4 if args.quick else 28
    per_rate = 6 if args.quick else 30
    rng = np.random.default_rng(args.seed)
    wall0 = time.monotonic()
    run = Run(cfg, open(args.dump, "w") if args.dump else None)  # noqa: SIM115
    for i in range(quiet_days):
        tr = make_trace(rng, 0.0)
        run.quiet_day(i, tr)
        if args.check_promtool and i == 0:
            print("  " + check_promtool(scrape(tr)))
    for r in RATES:
        for _ in range(per_rate):
            run.leak(r, make_trace(rng, r))

    print(f"# {per_rate} leaks per rate, {quiet_days} leak-free days (seed {args.seed}); delays from the "
          "effective onset, minutes")
    ok_all = report_delays(run.tallies)
    ok_all &= report_oracle(run.tallies)
    report_own_noise(run.own)
    ok_all &= report_alarms(run, quiet_days)
    ok_all &= report_rates(run.tallies)
    if not args.no_shapes:
        c0 = time.process_time()
        n_sh, ok_sh = shapes_section(args.seed, cfg, 1 if args.quick else 5, 1 if args.quick else 7, run.dump)
        run.det_cpu += time.process_time() - c0
        run.det_samples += n_sh
        ok_all &= ok_sh
    per = run.det_cpu / max(1, run.det_samples)
    print(f"\ndetector CPU: {per * 1e6:.1f} us per sample over {run.det_samples:,} samples "
          f"(one series at 1 Hz = {per * 100:.4f}% of a core); wall {time.monotonic() - wall0:.0f} s")
    print(f"\n[{'PASS' if ok_all else 'FAIL'}] every detection target "
          "(delays, 0 false alarms, rates, clearing after a stop)")
    return 0 if ok_all else 1


def report_delays(tallies: dict[str, dict[float, Tally]]) -> bool:
    """Detected, median and p95 delay per rate and detector, and the found-in-time share by sawtooth group."""
    print(f"\n{'rate GiB/h':<11}{'target p95':>11}" + "".join(f"{n:>34}" for n in NAMES))
    print(f"{'':<22}" + "".join(f"{'detected  median  p95':>34}" for _ in NAMES))
    ok_all = True
    for r in RATES:
        target = 15.0 if r >= 1 else 256 * MiB / (r * GiB / 3600) / 60
        cells = []
        for n in NAMES:
            tl = tallies[n][r]
            tot = len(tl.delays) + tl.missed
            med = pct(tl.delays, 50) / 60
            p95 = pct(tl.delays + [math.inf] * tl.missed, 95) / 60 if tot else math.nan
            cells.append(f"{len(tl.delays):>3}/{tot:<3} {med:7.1f} {p95:7.1f}")
            if n == "inferwatch":
                ok_all &= p95 <= target and (r < 1 or med < 10)
        print(f"{r:<11}{target:>11.0f}" + "".join(f"{c:>34}" for c in cells))
    print(f"\nfound within the target, by the leaking process's sawtooth (slow: at least "
          f"{SLOW_SAW_AMP // MiB} MiB, releasing less often than every {SLOW_SAW_S / 60:g} min):")
    for r in RATES:
        cells = []
        for n in NAMES:
            w = tallies[n][r].within
            cells.append("  ".join(f"{g} {sum(w.get(g, []))}/{len(w.get(g, []))}" for g in ("fast saw", "slow saw")))
        print(f"{r:<11}{'':>11}" + "".join(f"{c:>34}" for c in cells))
    return ok_all


def report_oracle(tallies: dict[str, dict[float, Tally]]) -> bool:
    """The oracle-separable leaks each detector found by their deadline, per rate and regime; the headline."""
    print(f"\nagainst the oracle (bench/leak_oracle.py; regime A: the floor shows at least every {REGIME_A_P:g} s; "
          "deadline: the target, regime B the later of it and the effective onset + 5 P):")
    print(f"{'rate GiB/h':<11}{'regime':>7}{'leaks':>7}{'oracle':>8}" + "".join(f"{n:>30}" for n in NAMES))
    print(f"{'':<33}" + "".join(f"{'of oracle    of all':>30}" for _ in NAMES))
    sep_all = {n: [0, 0] for n in NAMES}
    for r in RATES:
        for g in ("A", "B"):
            rows = {n: tallies[n][r].oracle.get(g, []) for n in NAMES}
            if not rows["inferwatch"]:
                continue
            n_or = sum(a for a, _ in rows["inferwatch"])
            cells = []
            for n in NAMES:
                hit_or = sum(1 for a, b in rows[n] if a and b)
                hit = sum(1 for _, b in rows[n] if b)
                sep_all[n][0] += hit_or
                sep_all[n][1] += n_or
                cells.append(f"{hit_or:>3}/{n_or:<3} {hit:>3}/{len(rows[n]):<3}")
            print(f"{r:<11}{g:>7}{len(rows['inferwatch']):>7}{n_or:>8}" + "".join(f"{c:>30}" for c in cells))
    head = sep_all["inferwatch"]
    share = head[0] / head[1] if head[1] else 1.0
    print(f"HEADLINE: inferwatch detects {head[0]} of the {head[1]} oracle-separable leaks by their deadline "
          f"({share * 100:.1f}%; target 95%); " + ", ".join(f"{n} {sep_all[n][0]}" for n in NAMES[1:]))
    return share >= 0.95


def report_own_noise(own: list[tuple[bool, bool, bool]]) -> None:
    """The same oracle at each trace's own floor noise instead of the issue's 20 MiB (a finding, not a target)."""
    sep = [x for x in own if x[0]]
    both = [x for x in sep if x[1]]
    print(f"at each trace's own floor noise (leak_oracle.own_noise: the per-sample noise drawn, 0-80 MiB, as the "
          f"minimum of a floor interval's samples sees it, and the sawtooth's phase at the first sample after a "
          f"release), the oracle separates {len(both)} of those {len(sep)} "
          f"by their deadline; inferwatch finds {sum(x[2] for x in both)} of them in time "
          f"({100 * sum(x[2] for x in both) / max(1, len(both)):.1f}%), and {sum(x[2] for x in sep if not x[1])} of "
          f"the {len(sep) - len(both)} that the data at their own noise do not separate in time")


def report_alarms(run: Run, quiet_days: int) -> bool:
    """The allocator series' hits and alarms, and every detector's false alarms."""
    print("\nwith allocator series (the leaking process's allocated bytes every 10 s; regime-A deadline whatever "
          "the NVML sawtooth): " + ", ".join(f"{r} GiB/h {sum(v)}/{len(v)}" for r, v in run.alloc_hits.items()))
    print(f"  false alarms on the allocated series: {run.alloc_fa} on the leak-free days, {run.alloc_pre} before the "
          "onset or in a process that does not leak")
    days = quiet_days * 1.0
    fa, pre = run.fa, run.pre
    print(f"\nfalse alarms on {days:g} leak-free days (episodes per day): " + ", ".join(
        f"{n} {fa[n]} ({fa[n] / days:.2f}/day)" for n in NAMES))
    print("alarms before the onset or in a series that does not leak, on the leak traces: " + ", ".join(f"{n} {pre[n]}" for n in NAMES))
    return fa["inferwatch"] == 0 and pre["inferwatch"] == 0


def _share(v: list[float]) -> float:
    """The share of relative errors within 20% (nan for none)."""
    return float(np.mean(np.array(v) <= 0.2)) if v else math.nan


def _med(v: list[float]) -> float:
    return float(np.median(v)) * 100 if v else math.nan


def report_rates(tallies: dict[str, dict[float, Tally]]) -> bool:
    """inferwatch's rate estimates against the truth (the issue's targets: within 20% for 90% of detections
    when detected, and for 95% RATE_LATER_S later), and the clearing after a restart stopped a leak."""
    print("\ninferwatch rate estimate, |relative error| (median; share within 20%), at detection / "
          f"{RATE_LATER_S / 60:.0f} min later / at the end:")
    every: dict[str, list[float]] = {"det": [], "later": [], "p20": []}
    for r in RATES:
        tl = tallies["inferwatch"][r]
        det_e = [abs(x) for x in tl.rate_err_det]
        later_e = [abs(x) for x in tl.rate_err_later]
        end_e = [abs(x) for x in tl.rate_err_end]
        every["det"] += det_e
        every["later"] += later_e
        every["p20"] += tl.rate_p20_det
        if det_e:
            # A detection at more than twice the true rate was set off by something else during the leak (a
            # fill, a step, a warm-up): counted as detected above, but not the leak's own signal.
            wild = sum(1 for x in tl.rate_err_det if x > 1.0)
            print(f"  {r:>5} GiB/h: {_med(det_e):5.1f}% ({_share(det_e) * 100:3.0f}%) / {_med(later_e):5.1f}% "
                  f"({_share(later_e) * 100:3.0f}%, {len(later_e)} still open) / {_med(end_e):5.1f}% "
                  f"({_share(end_e) * 100:3.0f}%); {wild} of {len(det_e)} detected at more than twice the true rate")
    print(f"  within 20%: {_share(every['det']) * 100:.0f}% of {len(every['det'])} detections when detected (target "
          f"90%), {_share(every['later']) * 100:.0f}% of {len(every['later'])} {RATE_LATER_S / 60:.0f} minutes later "
          "(target 95%)")
    if every["p20"]:
        # The share the noise at the detection time leaves within 20% (an early detection sees few samples).
        print(f"  an unbiased rate with each detection's own standard error would be within 20% for "
              f"{100 * sum(every['p20']) / len(every['p20']):.0f}% of the {len(every['p20'])} detections")
    print("  (time to OOM = free / rate carries the same relative error)")
    stops = sum(tallies["inferwatch"][r].stops for r in RATES)
    cleared = sum(tallies["inferwatch"][r].stops_cleared for r in RATES)
    print(f"\nleaks a restart stopped, detected while they lasted: {stops}; verdict cleared within 10 min "
          f"after the stop: {cleared}/{stops}")
    return cleared == stops and _share(every["det"]) >= 0.9 and _share(every["later"]) >= 0.95


if __name__ == "__main__":
    sys.exit(main())

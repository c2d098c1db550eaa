"""Drift detection quality: false alarms, power and delay, and a real data set.

(a) False alarms on stationary data: 50 N(0,1) features, a 20k-row reference
    and many independent current windows. Per-window false-alarm rate (a
    window "alarms" when any feature is flagged) for
    - ours: the default decision (KS + Benjamini-Hochberg at 0.05 + the
      normalized-Wasserstein floor: max(0.1, 4.8 sqrt(1/n + 1/m)), and the
      joint test of (d) in the same family: an alarm is any column or the joint test),
    - raw KS at p < 0.05 per feature (scipy ks_2samp on the raw samples,
      on a subsample of windows; and our binned KS p-values on all windows),
    - Evidently 0.7 DataDriftPreset defaults, on a subsample of windows
      (any column drifted; and its dataset-drift verdict, share >= 0.5).
    Target: ours <= 1 false alert per 1000 windows.
(b) Power: one of 50 features changes (mean shift 0.05..0.5 sigma, or the
    standard deviation 1 -> 1.5). Detection rate over independent post-change
    windows, and the detection delay of a sliding window (ring of 10
    sub-windows, evaluated once per sub-window) in events after the change.
(c) A real data set that ships with scikit-learn (breast cancer, 569 x 30):
    a shift induced by selecting rows on a feature, and random splits as the
    no-drift control.
(d) Joint drift on real data: scikit-learn's breast cancer, wine and diabetes
    sets. The reference (5000 rows) and each window are drawn with replacement
    from the set's rows, so the set is the population and no-drift windows are
    exactly null. In a drifted window one column is re-attached to the wrong
    rows (another row's value) for 10% to 50% of the rows: every marginal is
    unchanged, only the relations break. The column is the one best predicted by
    the others (highest R^2, a column a join would carry) and the median one.
    Detection rate of ours (dataset drift: the joint test, or any column) and of
    Evidently's DataDriftPreset (any column drifted; dataset drift), and how
    often each flags a column (none should: the marginals did not change).

Usage: python bench/drift_quality.py [--quick] [--windows N] [--window W] [--only a,b,c,d]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
import warnings
from collections import deque
from typing import Any

import numpy as np

K = 50
EVIDENTLY_METHOD = "?"


def evidently_window_flags(ref: np.ndarray, cur: np.ndarray) -> tuple[int, bool]:
    """Columns Evidently's DataDriftPreset flags, and its dataset-drift verdict."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pandas as pd
        from evidently import Report
        from evidently.presets import DataDriftPreset

        names = [f"f{i}" for i in range(ref.shape[1])]
        snap = Report([DataDriftPreset()]).run(pd.DataFrame(cur, columns=names), pd.DataFrame(ref, columns=names))
        metrics = snap.dict()["metrics"]
        global EVIDENTLY_METHOD
        EVIDENTLY_METHOD = next((str(m.get("metric_name", "")).split("method=")[-1].split(",")[0]
                                 for m in metrics if "method=" in str(m.get("metric_name", ""))), "?")
        for m in metrics:
            v = m.get("value")
            if isinstance(v, dict) and "count" in v and "share" in v:
                return int(v["count"]), bool(v["share"] >= 0.5)
    raise RuntimeError("DriftedColumnsCount not found in the Evidently snapshot")


def part_a(args: argparse.Namespace) -> dict[str, Any]:
    from scipy import stats as sps

    from inferwatch_sidecar.components.drift import engine
    from inferwatch_sidecar.components.drift import profile as prof

    rng = np.random.default_rng(100)
    ref = rng.normal(size=(20_000, K))
    names = [f"f{i}" for i in range(K)]
    p = prof.build({n: ref[:, i] for i, n in enumerate(names)}, {})
    settings = engine.Settings()
    ours = raw_binned = joint_alarms = 0
    per_feature_binned = 0
    scipy_alarm = scipy_flags = scipy_windows = 0
    ev_any = ev_dataset = ev_windows = 0
    t0 = time.perf_counter()
    for w in range(args.windows):
        cur = rng.normal(size=(args.window, K))
        ev = engine.compare_columns(p, {n: cur[:, i] for i, n in enumerate(names)}, {}, settings)
        ours += ev.n_drifted > 0 or ev.dataset_drift
        joint_alarms += ev.multivariate is not None and ev.multivariate.drifted
        flags = sum(1 for r in ev.results if r.p_value is not None and r.p_value < 0.05)
        per_feature_binned += flags
        raw_binned += flags > 0
        if w < args.scipy_windows:
            f = sum(sps.ks_2samp(ref[:, i], cur[:, i]).pvalue < 0.05 for i in range(K))
            scipy_flags += f
            scipy_alarm += f > 0
            scipy_windows += 1
        if w < args.evidently_windows:
            n_ev, ds = evidently_window_flags(ref[: args.evidently_ref], cur)
            ev_any += n_ev > 0
            ev_dataset += ds
            ev_windows += 1
    elapsed = time.perf_counter() - t0
    W = args.windows
    print(f"(a) false alarms, stationary {K} x N(0,1), reference 20000 rows, {W} windows of {args.window} rows "
          f"({elapsed:.0f} s)")
    print(f"  {'method':<52} {'windows':>8} {'alarm rate':>11} {'per 1000':>9}")
    rows = [
        ("ours (KS + BH 0.05 + Wasserstein floor + joint test)", W, ours / W),
        ("  of which the joint test", W, joint_alarms / W),
        ("raw KS p<0.05, our binned p-values", W, raw_binned / W),
        ("raw KS p<0.05, scipy ks_2samp on raw samples", scipy_windows, scipy_alarm / max(scipy_windows, 1)),
        ("Evidently DataDriftPreset: any column drifted", ev_windows, ev_any / max(ev_windows, 1)),
        ("Evidently DataDriftPreset: dataset drift (share>=0.5)", ev_windows, ev_dataset / max(ev_windows, 1)),
    ]
    for name, n, rate in rows:
        print(f"  {name:<52} {n:>8} {rate:>11.4f} {rate * 1000:>9.1f}")
    print(f"  Evidently chose: {EVIDENTLY_METHOD} (reference of {args.evidently_ref} rows)")
    print(f"  per-feature flag rate of raw KS: binned {per_feature_binned / (W * K):.4f}, "
          f"scipy {scipy_flags / max(scipy_windows * K, 1):.4f} (nominal 0.05)")
    ok = ours / W <= 0.001 if W >= 1000 else ours == 0
    note = "" if W >= 1000 else f" (only {W} windows in this run; the full run uses 2000)"
    print(f"  target <= 1 false alert per 1000 windows: {'PASS' if ok else 'FAIL'} ({ours} in {W}){note}")
    return {"ok": ok}


def _chunks(rng: np.random.Generator, rows: int, change: tuple[str, float] | None) -> np.ndarray:
    x = rng.normal(size=(rows, K))
    if change is not None:
        kind, amount = change
        if kind == "mean":
            x[:, 0] += amount
        else:
            x[:, 0] *= amount
    return x


def part_b(args: argparse.Namespace) -> None:
    from inferwatch_sidecar.components.drift import engine
    from inferwatch_sidecar.components.drift import profile as prof

    rng = np.random.default_rng(200)
    names = [f"f{i}" for i in range(K)]
    ref = rng.normal(size=(20_000, K))
    p = prof.build({n: ref[:, i] for i, n in enumerate(names)}, {})
    settings = engine.Settings()
    changes = [("mean", s) for s in (0.05, 0.1, 0.2, 0.3, 0.5)] + [("std", 1.5)]
    print(f"(b) power: feature 0 of {K} changes; detection over {args.power_reps} independent windows; delay of a "
          f"sliding window (10 sub-windows, evaluated per sub-window) over {args.delay_reps} runs")
    print(f"  {'change':<14} {'window':>7} {'detected':>9} {'other flags':>12} {'median delay (events)':>22}")
    for kind, amount in changes:
        for W in args.power_windows:
            det = others = 0
            for _ in range(args.power_reps):
                cur = _chunks(rng, W, (kind, amount))
                ev = engine.compare_columns(p, {n: cur[:, i] for i, n in enumerate(names)}, {}, settings)
                det += ev.results[0].drifted
                others += sum(r.drifted for r in ev.results[1:])
            delays = []
            sub = W // 10
            for _ in range(args.delay_reps):
                ring: deque[dict[str, engine.Summary]] = deque(maxlen=10)
                for _ in range(10):  # a full stationary window before the change
                    x = _chunks(rng, sub, None)
                    ring.append({n: engine.summarize_numeric(p.columns[n], x[:, i]) for i, n in enumerate(names)})
                found = None
                for step in range(1, 31):
                    x = _chunks(rng, sub, (kind, amount))
                    ring.append({n: engine.summarize_numeric(p.columns[n], x[:, i]) for i, n in enumerate(names)})
                    tot = {n: engine.Summary(counts=sum(s[n].counts for s in ring),
                                             sums=sum(s[n].sums for s in ring)) for n in names}
                    ev = engine.evaluate(p, tot, settings)
                    if ev.results[0].drifted:
                        found = step * sub
                        break
                delays.append(found)
            hit = [d for d in delays if d is not None]
            delay = f"{statistics.median(hit):.0f}" if len(hit) > len(delays) / 2 else f">{30 * sub} ({len(hit)}/" \
                                                                                          f"{len(delays)})"
            label = f"mean +{amount}s" if kind == "mean" else f"std x{amount}"
            print(f"  {label:<14} {W:>7} {det / args.power_reps:>9.2f} {others:>12} {delay:>22}")


def part_c(args: argparse.Namespace) -> dict[str, Any]:
    from scipy import stats as sps
    from sklearn.datasets import load_breast_cancer

    from inferwatch_sidecar.components.drift import engine
    from inferwatch_sidecar.components.drift import profile as prof

    ds = load_breast_cancer()
    X, names = ds.data, [str(n) for n in ds.feature_names]
    n = X.shape[0]
    settings = engine.Settings()
    rng = np.random.default_rng(300)

    def run(ref_idx: np.ndarray, cur_idx: np.ndarray) -> engine.Evaluation:
        p = prof.build({nm: X[ref_idx, i] for i, nm in enumerate(names)}, {})
        return engine.compare_columns(p, {nm: X[cur_idx, i] for i, nm in enumerate(names)}, {}, settings)

    ctrl_alarm = raw_alarm = 0
    for _ in range(args.splits):
        perm = rng.permutation(n)
        a, b = perm[: n // 2], perm[n // 2:]
        ev = run(a, b)
        ctrl_alarm += ev.n_drifted > 0
        raw_alarm += any(sps.ks_2samp(X[a, i], X[b, i]).pvalue < 0.05 for i in range(X.shape[1]))
    perm = rng.permutation(n)
    a, rest = perm[: n // 2], perm[n // 2:]
    sel = names.index("mean radius")
    cur = rest[X[rest, sel] > np.median(X[:, sel])]
    ev = run(a, cur)
    drifted = [r.feature for r in ev.results if r.drifted]
    print(f"(c) scikit-learn breast cancer ({n} rows x {len(names)} features), reference = random half")
    print(f"  control, random other half ({args.splits} splits): ours alarmed in {ctrl_alarm}, raw scipy KS "
          f"p<0.05 alarmed in {raw_alarm}")
    print(f"  shift, other half with 'mean radius' > median ({cur.size} rows): ours flagged {len(drifted)} of "
          f"{len(names)} features, dataset drift {ev.dataset_drift}")
    top = sorted(ev.results, key=lambda r: -r.effect)[:6]
    print("  largest effects: " + ", ".join(f"{r.feature} {r.effect:.2f}{'*' if r.drifted else ''}" for r in top))
    ok = sel < len(names) and "mean radius" in drifted and ctrl_alarm <= max(1, args.splits // 100)
    print(f"  selection feature flagged and control quiet: {'PASS' if ok else 'FAIL'}")
    return {"ok": ok}


def _reattach(rng: np.random.Generator, x: np.ndarray, col: int, share: float) -> np.ndarray:
    """A copy of ``x`` in which ``share`` of the rows carry another row's value of column ``col``."""
    out = x.copy()
    wrong = rng.choice(len(x), int(round(share * len(x))), replace=False)
    out[wrong, col] = x[rng.integers(0, len(x), wrong.size), col]
    return out


def _r2(x: np.ndarray) -> np.ndarray:
    """How well each column is predicted linearly by the others."""
    z = (x - x.mean(0)) / np.where(x.std(0) > 0, x.std(0), 1.0)
    out = []
    for j in range(z.shape[1]):
        others = np.delete(z, j, 1)
        coef, *_ = np.linalg.lstsq(others, z[:, j], rcond=None)
        out.append(1.0 - float(np.var(z[:, j] - others @ coef)))
    return np.array(out)


def part_d(args: argparse.Namespace) -> dict[str, Any]:
    from sklearn import datasets

    from inferwatch_sidecar.components.drift import engine
    from inferwatch_sidecar.components.drift import profile as prof

    settings = engine.Settings()
    rng = np.random.default_rng(400)
    shares = [0.1, 0.2, 0.3, 0.5]
    print(f"(d) joint drift: one column re-attached to the wrong rows for a share of each window (marginals "
          f"unchanged); reference 5000 rows; {args.joint_reps} windows per cell for ours, {args.joint_ev_reps} "
          f"for Evidently")
    print(f"  {'data set':<14} {'column (R^2)':<26} {'window':>6} {'share':>5} {'ours':>6} {'col flags':>9} "
          f"{'AUC-0.5':>8} {'Evid. any':>9} {'Evid. ds':>8}")
    null_alarms = null_windows = 0
    results: dict[tuple[str, int, int, float], float] = {}
    for name, loader in (("breast_cancer", datasets.load_breast_cancer), ("wine", datasets.load_wine),
                         ("diabetes", datasets.load_diabetes)):
        ds = loader()
        data, names = np.asarray(ds.data, dtype=np.float64), [str(n) for n in ds.feature_names]
        r2 = _r2(data)
        order = np.argsort(r2)
        cols = [int(order[-1]), int(order[len(order) // 2])]
        ref = data[rng.integers(0, len(data), 5000)]
        p = prof.build({n: ref[:, i] for i, n in enumerate(names)}, {})
        for w in args.joint_windows:
            for _ in range(args.joint_reps):  # the no-drift control
                cur = data[rng.integers(0, len(data), w)]
                ev = engine.compare_columns(p, {n: cur[:, i] for i, n in enumerate(names)}, {}, settings)
                null_alarms += ev.dataset_drift or ev.n_drifted > 0
                null_windows += 1
        for col in cols:
            for w in args.joint_windows:
                for share in shares:
                    det = flags = 0
                    eff = []
                    for _ in range(args.joint_reps):
                        cur = _reattach(rng, data[rng.integers(0, len(data), w)], col, share)
                        ev = engine.compare_columns(p, {n: cur[:, i] for i, n in enumerate(names)}, {}, settings)
                        det += ev.dataset_drift
                        flags += ev.n_drifted
                        assert ev.multivariate is not None
                        eff.append(ev.multivariate.effect)
                    ev_any = ev_ds = 0
                    ev_n = args.joint_ev_reps if w == args.joint_windows[0] else 0
                    for _ in range(ev_n):
                        cur = _reattach(rng, data[rng.integers(0, len(data), w)], col, share)
                        n_ev, dsd = evidently_window_flags(ref, cur)
                        ev_any += n_ev > 0
                        ev_ds += dsd
                    rate = det / args.joint_reps
                    results[(name, col, w, share)] = rate
                    evs = f"{ev_any}/{ev_n}" if ev_n else "-"
                    evd = f"{ev_ds}/{ev_n}" if ev_n else "-"
                    label = f"{names[col][:18]} ({r2[col]:.2f})"
                    print(f"  {name:<14} {label:<26} {w:>6} {share:>5.1f} {rate:>6.2f} {flags:>9} "
                          f"{statistics.median(eff):>8.3f} {evs:>9} {evd:>8}")
    print(f"  no-drift control (same data sets, {null_windows} windows): ours alarmed in {null_alarms}")
    best = [v for (n, c, w, s), v in results.items() if s >= 0.3 and w == args.joint_windows[-1]]
    print(f"  detection at share >= 0.3, window {args.joint_windows[-1]}: median {statistics.median(best):.2f}, "
          f"min {min(best):.2f}")
    return {"ok": null_alarms == 0}


print = functools.partial(print, flush=True)  # noqa: A001 - progress is visible when piped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller run (< ~60 s on an idle 2-core machine)")
    ap.add_argument("--windows", type=int, help="stationary windows for (a) (default 2000; quick 300)")
    ap.add_argument("--window", type=int, default=1000, help="rows per window in (a)")
    ap.add_argument("--evidently-windows", type=int, help="windows also scored by Evidently (default 20; quick 2)")
    ap.add_argument("--power-reps", type=int, help="independent windows per change in (b) (default 50; quick 10)")
    ap.add_argument("--delay-reps", type=int, help="sliding-window runs per change in (b) (default 10; quick 3)")
    ap.add_argument("--joint-reps", type=int, help="windows per cell in (d) (default 20; quick 5)")
    ap.add_argument("--joint-evidently-reps", type=int, dest="joint_ev_reps",
                    help="windows per cell scored by Evidently in (d) (default 3; quick 1)")
    ap.add_argument("--only", default="a,b,c,d", help="parts to run (default a,b,c,d)")
    args = ap.parse_args(argv)
    q = args.quick
    args.windows = args.windows or (300 if q else 2000)
    args.scipy_windows = 20 if q else 200
    if args.evidently_windows is None:
        args.evidently_windows = 2 if q else 20
    args.evidently_ref = 2000 if q else 5000
    args.power_reps = args.power_reps or (10 if q else 50)
    args.delay_reps = args.delay_reps or (3 if q else 10)
    args.power_windows = [1000] if q else [500, 2000, 10_000]
    args.splits = 50 if q else 300
    args.joint_reps = args.joint_reps or (5 if q else 20)
    args.joint_ev_reps = args.joint_ev_reps if args.joint_ev_reps is not None else (1 if q else 3)
    args.joint_windows = [1000] if q else [1000, 5000]
    parts = set(args.only.split(","))
    ok = True
    if "a" in parts:
        ok &= part_a(args)["ok"]
    if "b" in parts:
        part_b(args)
    if "c" in parts:
        ok &= part_c(args)["ok"]
    if "d" in parts:
        ok &= part_d(args)["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Label-free accuracy estimation under covariate shift: ours vs NannyML CBPE vs mean confidence.

For each real labelled data set that ships in a package:

- ``employment``: US census (ACS) employment of Massachusetts adults, 68,785 rows (NannyML's
  ``employment_MA_reference``; binary);
- ``california``: California housing prices above the median, 5,832 rows (NannyML's
  ``california_housing_reference``, from the 1990 census; binary);
- ``digits``: scikit-learn's handwritten digits, 1,797 rows (10 classes);
- ``breast_cancer``: scikit-learn's Wisconsin breast cancer, 569 rows (binary);

the rows are split at random into train (40%), reference (30%: labelled, what the calibration is fitted
on) and test (30%). An overconfident model (scikit-learn's HistGradientBoostingClassifier, learning
rate 0.3, 150 iterations, no early stopping) is trained on train. The test rows are cut into shifted segments: the
quantile bands of one covariate (age, income, ink, radius), so each segment is traffic from one part of
the population. For every segment the realized accuracy is compared with

- ours: ``performance.fit`` on the reference (what ``inferwatch reference build --label`` stores), then
  the streaming ``PerformanceWindow`` over the segment (what the sidecar exports);
- NannyML CBPE (``nannyml.CBPE``, fitted on the same reference, one chunk per segment);
- mean confidence (the uncalibrated estimate).

The small data sets are repeated over several random splits; each segment's error is the mean absolute
error over the splits. Target: our worst error no larger than CBPE's, and at most 0.04.

Per-record cost (``--cost``): instructions per record counted by valgrind's callgrind, of the
estimate's update against the drift windows' update of the same records (the prediction and the
confidence columns), by subtracting a run that only builds the batches. Needs valgrind.

Usage: python bench/performance_estimation.py [--quick] [--cost] [--repeats N]
Needs the bench extra (NannyML): pip install -e ".[bench]"
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import STABLE_HASH_ENV, callgrind_instructions  # noqa: E402  (bench/ is a folder of scripts)

# NannyML sends usage statistics to a web service unless told not to; this machine has no internet anyway.
os.environ["NML_DISABLE_USAGE_LOGGING"] = "1"


@dataclass
class Data:
    name: str
    X: np.ndarray
    y: np.ndarray
    covariate: str
    shift: np.ndarray  # the covariate the segments are cut on
    segments: int
    repeats: int


def _nannyml_file(name: str) -> str:
    import nannyml.datasets.data as d

    return os.path.join(os.path.dirname(d.__file__), name)


def load(quick: bool, repeats: int) -> list[Data]:
    import pandas as pd
    from sklearn.datasets import load_breast_cancer, load_digits

    out = []
    emp = pd.read_parquet(_nannyml_file("employment_MA_reference.pq"))
    feats = ["AGEP", "SCHL", "MAR", "RELP", "DIS", "ESP", "CIT", "MIG", "MIL", "ANC", "NATIVITY", "DEAR", "DEYE",
             "DREM", "SEX", "RAC1P"]
    if quick:
        emp = emp.iloc[:20000]
    X = emp[feats].to_numpy(dtype=np.float64)
    out.append(Data("employment", X, emp["employed"].to_numpy(), "AGEP (age)", X[:, 0], 5, 1))
    cal = pd.read_csv(_nannyml_file("california_housing_reference.csv"))
    cf = ["MedInc", "HouseAge", "AveRooms", "AveBedrms", "Population", "AveOccup", "Latitude", "Longitude"]
    X = cal[cf].to_numpy(dtype=np.float64)
    out.append(Data("california", X, cal["clf_target"].to_numpy(), "MedInc (income)", X[:, 0], 4,
                    max(1, repeats // 2)))
    d = load_digits()
    out.append(Data("digits", d.data, d.target, "ink (sum of pixels)", d.data.sum(axis=1), 3, repeats))
    b = load_breast_cancer()
    out.append(Data("breast_cancer", b.data, b.target, "mean radius", b.data[:, 0], 3, repeats))
    return out


def model(seed: int) -> Any:
    from sklearn.ensemble import HistGradientBoostingClassifier

    return HistGradientBoostingClassifier(learning_rate=0.3, max_iter=150, max_leaf_nodes=63, early_stopping=False,
                                          random_state=seed)


def cbpe_estimates(classes: np.ndarray, ref_proba: np.ndarray, ref_y: np.ndarray,
                   segs: list[np.ndarray]) -> list[float]:
    """NannyML CBPE's accuracy estimate of each segment (probabilities per class), fitted on the reference."""
    import nannyml as nml
    import pandas as pd

    binary = classes.size == 2
    cols = {str(c): f"p_{c}" for c in classes}

    def frame(proba: np.ndarray, y: np.ndarray | None) -> pd.DataFrame:
        pred = classes[proba.argmax(axis=1)]
        d: dict[str, Any] = {"y_pred": pred if not binary else (pred == classes[1]).astype(int)}
        if binary:
            d["proba"] = proba[:, 1]
        else:
            for i, c in enumerate(classes):
                d[cols[str(c)]] = proba[:, i]
            d["y_pred"] = pred.astype(str)
        if y is not None:
            d["y_true"] = (y == classes[1]).astype(int) if binary else y.astype(str)
        return pd.DataFrame(d)

    est = nml.CBPE(problem_type="classification_binary" if binary else "classification_multiclass",
                   y_pred_proba="proba" if binary else cols, y_pred="y_pred", y_true="y_true", metrics=["accuracy"],
                   chunk_number=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(frame(ref_proba, ref_y))
        out = []
        for proba in segs:
            res = est.estimate(frame(proba, None)).filter(period="analysis").to_df()
            col = next(c for c in res.columns if c[0] == "accuracy" and c[1] == "value")
            out.append(float(res[col].iloc[-1]))
    return out


def run_dataset(d: Data) -> list[dict[str, Any]]:
    from inferwatch_sidecar.components.drift import performance

    rows: dict[int, dict[str, Any]] = {}
    classes = np.unique(d.y)
    for rep in range(d.repeats):
        rng = np.random.default_rng(rep)
        idx = rng.permutation(d.y.size)
        a, b = int(0.4 * idx.size), int(0.7 * idx.size)
        tr, ref, te = idx[:a], idx[a:b], idx[b:]
        m = model(rep).fit(d.X[tr], d.y[tr])
        p_ref = m.predict_proba(d.X[ref])
        perf = performance.fit(classes[p_ref.argmax(axis=1)].tolist(), p_ref.max(axis=1), d.y[ref].tolist(),
                               label="y")
        order = te[np.argsort(d.shift[te], kind="stable")]
        segs = np.array_split(order, d.segments)
        probas = [m.predict_proba(d.X[s]) for s in segs]
        cbpe = cbpe_estimates(classes, p_ref, d.y[ref], probas)
        for k, (s, proba) in enumerate(zip(segs, probas, strict=True)):
            pred = classes[proba.argmax(axis=1)]
            conf = proba.max(axis=1)
            realized = float(np.mean(pred == d.y[s]))
            win = performance.PerformanceWindow(perf, 1)
            win.update(pred.tolist(), conf)
            est = win.estimate
            assert est is not None
            r = rows.setdefault(k, {"dataset": d.name, "segment": f"{d.covariate} q{k + 1}/{d.segments}",
                                    "n": s.size, "realized": [], "ours": [], "cbpe": [], "meanconf": [],
                                    "covered": [], "method": []})
            r["realized"].append(realized)
            r["ours"].append(abs(est.accuracy - realized))
            r["cbpe"].append(abs(cbpe[k] - realized))
            r["meanconf"].append(abs(float(conf.mean()) - realized))
            r["covered"].append(est.lower <= realized <= est.upper)
            r["method"].append(perf.calibration.method)
    return list(rows.values())


def accuracy_table(quick: bool, repeats: int) -> bool:
    print("label-free accuracy estimate: mean absolute error against the realized accuracy, per shifted segment")
    print(f"{'data set':14s} {'segment':28s} {'n':>6s} {'realized':>8s} {'ours':>7s} {'CBPE':>7s} {'meanconf':>8s}"
          f" {'in 95%':>6s} {'reps':>4s}")
    all_rows = []
    t0 = time.perf_counter()
    for d in load(quick, repeats):
        for r in run_dataset(d):
            all_rows.append(r)
            print(f"{r['dataset']:14s} {r['segment']:28s} {r['n']:6d} {np.mean(r['realized']):8.3f} "
                  f"{np.mean(r['ours']):7.3f} {np.mean(r['cbpe']):7.3f} {np.mean(r['meanconf']):8.3f} "
                  f"{np.mean(r['covered']):6.0%} {len(r['ours']):4d}")
    worst = {k: max(float(np.mean(r[k])) for r in all_rows) for k in ("ours", "cbpe", "meanconf")}
    mean = {k: float(np.mean([np.mean(r[k]) for r in all_rows])) for k in ("ours", "cbpe", "meanconf")}
    methods = sorted({m for r in all_rows for m in r["method"]})
    print(f"worst segment error: ours {worst['ours']:.3f}, CBPE {worst['cbpe']:.3f}, mean confidence "
          f"{worst['meanconf']:.3f} (ratio ours/CBPE {worst['ours'] / worst['cbpe']:.2f})")
    print(f"mean segment error:  ours {mean['ours']:.3f}, CBPE {mean['cbpe']:.3f}, mean confidence "
          f"{mean['meanconf']:.3f}; calibration methods chosen: {', '.join(methods)}; "
          f"{time.perf_counter() - t0:.0f} s")
    ok = worst["ours"] <= worst["cbpe"] and worst["ours"] <= 0.04
    print(f"target (ours worst <= CBPE worst and <= 0.04): {'met' if ok else 'NOT met'}")
    return ok


# -- per-record cost under callgrind ----------------------------------------------------------------------------------

_CHILD = r"""
import sys
import numpy as np
from inferwatch_sidecar.components.drift import performance, profile as prof
from inferwatch_sidecar.components.drift.window import ColumnWindow

mode, n, binary = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
rng = np.random.default_rng(0)
k = 2 if binary else 10
classes = [str(c) for c in range(k)]
m = 20000
ref_pred = [classes[i] for i in rng.integers(0, k, m)]
ref_conf = rng.uniform(1 / k, 1, m)
ref_lab = [p if rng.random() < c else classes[(int(p) + 1) % k] for p, c in zip(ref_pred, ref_conf)]
perf = performance.fit(ref_pred, ref_conf, ref_lab, label="y")
p = prof.build({"conf": ref_conf}, {"pred": ref_pred}, prediction="pred", confidence="conf", joint=False)
batch = 1000
preds = [[classes[i] for i in rng.integers(0, k, batch)] for _ in range(n // batch)]
confs = [rng.uniform(1 / k, 1, batch) for _ in range(n // batch)]
if mode == "perf":
    w = performance.PerformanceWindow(perf, 10)
    for a, b in zip(preds, confs):
        w.update(a, b)
    assert w.rows == n
elif mode == "drift":
    wp, wc = ColumnWindow(p.columns["pred"], 10), ColumnWindow(p.columns["conf"], 10)
    for a, b in zip(preds, confs):
        wp.update(a)
        wc.update(b)
"""


def _instructions(mode: str, n: int, binary: bool) -> int:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(_CHILD)
    try:
        return callgrind_instructions([sys.executable, f.name, mode, str(n), "1" if binary else "0"],
                                      env=STABLE_HASH_ENV)
    finally:
        os.unlink(f.name)


def cost(n: int) -> None:
    print(f"\nper-record cost, callgrind instructions ({n} records in batches of 1000, minus a run that only builds "
          "them)")
    for binary in (True, False):
        base = _instructions("none", n, binary)
        ours = (_instructions("perf", n, binary) - base) / n
        drift = (_instructions("drift", n, binary) - base) / n
        kind = "binary" if binary else "10 classes"
        print(f"  {kind:10s}: estimate update {ours:7.0f} instr/record, drift windows of prediction + confidence "
              f"{drift:7.0f} instr/record (ratio {ours / drift:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rows and repeats")
    ap.add_argument("--repeats", type=int, default=10, help="random splits of the small data sets (default 10)")
    ap.add_argument("--cost", action="store_true", help="also count instructions per record under callgrind")
    ap.add_argument("--cost-records", type=int, default=100_000)
    args = ap.parse_args()
    accuracy_table(args.quick, 3 if args.quick else args.repeats)
    if args.cost:
        cost(args.cost_records)


if __name__ == "__main__":
    main()

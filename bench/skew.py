"""Training-serving skew diagnosis (``inferwatch skew``): is the kind right, is a clean feature left alone, and how fast.

Part 1, quality: real data sets that ship in packages, tabular (scikit-learn's diabetes, wine, breast cancer;
statsmodels' Fair affairs survey with its codes as text categories) and panel / time series (statsmodels'
Grunfeld investment panel, 10 firms x 20 years, and the US macro quarterly series), each with rolling-mean
features computed the way a training pipeline would (closed-closed window: the current point included). Per
run, one skew is injected with its kind, feature and size drawn at random:

- ``offset`` (+- 0.05..2 standard deviations), ``scale`` (x 0.3..3), ``affine`` (both);
- ``lag`` (panel / series only: the served value is the offline value 1 or 2 rows earlier, or 1 later, in the
  same entity; a rolling-mean feature lagged by recomputing it with the window closed on the left, i.e. the
  seed's closed-open serving window);
- ``swapped`` (two numeric features exchanged), ``mapping`` (a categorical's labels permuted or renamed);
- ``default_filled`` (5..50 % of the rows set to 0, -1, the mean or ``"unknown"``),
  ``missing_in_served`` (5..50 % of the rows null).

The served table is a random 30..100 % sample of the offline rows, shuffled. A run is right when the injected
feature gets the injected kind (and ``with`` names the partner of a swap, ``lag`` the lag); it is a false skew
when any un-skewed feature is not ``match``. Bar (issue #30): >= 95 % right, >= 99 % of runs without a false skew.

Part 2, speed: 1 million served rows (8 features, 3 of them skewed) joined with 1.2 million offline rows, from
Parquet files through ``read_table`` and ``diagnose``, on one core (Arrow's CPU and IO pools set to one
thread). Bar: under 10 s. Median of ``--repeat`` runs.

    flock /tmp/bench.lock python bench/skew.py --runs 2000
    flock /tmp/bench.lock python bench/skew.py --speed-only --rows 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from inferwatch_sidecar.components.skew.diagnose import Options, diagnose
from inferwatch_sidecar.components.skew.tables import read_table

KEY = "request_id"
NUMERIC_KINDS = ("offset", "scale", "affine", "swapped", "default_filled", "missing_in_served")
CATEGORICAL_KINDS = ("mapping", "default_filled", "missing_in_served")


@dataclass
class Dataset:
    """One offline table: its key, and the entity and order columns of a panel or series (or None)."""

    name: str
    frame: pd.DataFrame
    entity: str | None = None
    order: str | None = None
    #: rolling-mean feature -> (source column, window): lagged by recomputing with a left-closed window
    rolling: dict[str, tuple[str, int]] = field(default_factory=dict)

    @property
    def features(self) -> list[str]:
        return [c for c in self.frame.columns if c not in (KEY, self.entity, self.order)]


def _keyed(df: pd.DataFrame, name: str) -> pd.DataFrame:
    df = df.reset_index(drop=True).copy()
    df.insert(0, KEY, [f"{name}-{i:06d}" for i in range(len(df))])
    return df


def _with_rolling(df: pd.DataFrame, entity: str | None, cols: dict[str, int], closed: str = "right") -> pd.DataFrame:
    """Rolling means of ``cols`` (a column ``<col>_mean<w>`` each) per entity, in row order.

    ``closed="right"`` is the training pipeline's window: the w rows ``[t-w+1, t]``, closed at both ends, the
    current row included. ``closed="left"`` is the serving code of the seed's story: ``[t-w, t)``, closed-open,
    the same w rows one step earlier, so the served value is the offline value of the previous row (lag 1).
    """
    out = df.copy()
    for col, w in cols.items():
        g = out.groupby(entity, sort=False)[col] if entity else out[col]
        name = f"{col}_mean{w}"
        if entity:
            out[name] = g.transform(lambda x, w=w: x.rolling(w, min_periods=1, closed=closed).mean())
        else:
            out[name] = out[col].rolling(w, min_periods=1, closed=closed).mean()
    return out


def datasets() -> list[Dataset]:
    """The real data sets of part 1 (all shipped inside the installed packages: nothing is downloaded)."""
    import statsmodels.api as sm
    from sklearn.datasets import load_breast_cancer, load_diabetes, load_wine

    out = [Dataset(n, _keyed(f().frame, n)) for n, f in (
        ("diabetes", lambda: load_diabetes(as_frame=True, scaled=True)),
        ("wine", lambda: load_wine(as_frame=True)),
        ("breast_cancer", lambda: load_breast_cancer(as_frame=True)),
    )]
    for d in out:
        d.frame = d.frame.drop(columns=["target"])
    fair = sm.datasets.fair.load_pandas().data
    for c in ("occupation", "occupation_husb", "religious"):
        fair[c] = fair[c].map(lambda v, c=c: f"{c}_{int(v)}")
    out.append(Dataset("fair", _keyed(fair, "fair")))
    g = sm.datasets.grunfeld.load_pandas().data
    g["year"] = g["year"].astype(int)
    g = g.sort_values(["firm", "year"])
    g = _with_rolling(g, "firm", {"invest": 3, "value": 4})
    out.append(Dataset("grunfeld", _keyed(g, "grunfeld"), "firm", "year",
                       {"invest_mean3": ("invest", 3), "value_mean4": ("value", 4)}))
    m = sm.datasets.macrodata.load_pandas().data
    m["t"] = np.arange(len(m))
    m = m.drop(columns=["year", "quarter"])
    m = _with_rolling(m, None, {"realgdp": 4, "cpi": 3, "unemp": 8})
    out.append(Dataset("macrodata", _keyed(m, "macro"), None, "t",
                       {"realgdp_mean4": ("realgdp", 4), "cpi_mean3": ("cpi", 3), "unemp_mean8": ("unemp", 8)}))
    return out


@dataclass
class Injection:
    kind: str
    feature: str
    partner: str | None = None
    lag: int | None = None
    size: dict[str, float] = field(default_factory=dict)


def _lagged(ds: Dataset, col: str, lag: int) -> pd.Series:
    """The offline column shifted by ``lag`` rows within each entity in order (NaN where none)."""
    df = ds.frame
    assert ds.order is not None
    order = df.sort_values(([ds.entity] if ds.entity else []) + [ds.order]).index
    s = df.loc[order, col]
    shifted = s.groupby(df.loc[order, ds.entity], sort=False).shift(lag) if ds.entity else s.shift(lag)
    return shifted.reindex(df.index)


def inject(ds: Dataset, rng: np.random.Generator) -> tuple[pd.DataFrame, Injection]:
    """A served copy of ``ds.frame`` with one skew drawn at random (kind, feature, size)."""
    df = ds.frame
    served = df.copy()
    numeric = [c for c in ds.features if pd.api.types.is_numeric_dtype(df[c])]
    cats = [c for c in ds.features if not pd.api.types.is_numeric_dtype(df[c])]
    # offset, scale and affine are told apart only on a feature with 3 or more distinct values
    rich = [c for c in numeric if df[c].nunique() >= 3]
    kinds = list(NUMERIC_KINDS) + (list(CATEGORICAL_KINDS) if cats else []) + (["lag"] * 3 if ds.order else [])
    kind = kinds[rng.integers(len(kinds))]
    if kind == "mapping" or (kind in CATEGORICAL_KINDS and kind not in NUMERIC_KINDS):
        pool = cats
    elif kind in ("default_filled", "missing_in_served"):
        pool = numeric + cats
    else:
        pool = rich
    col = pool[rng.integers(len(pool))]
    x = df[col]
    inj = Injection(kind, col)
    if kind in ("offset", "scale", "affine"):
        sd = float(x.std()) or 1.0
        a = float(np.exp(rng.uniform(np.log(0.3), np.log(3.0))))
        while abs(a - 1) < 0.05:
            a = float(np.exp(rng.uniform(np.log(0.3), np.log(3.0))))
        b = float(rng.choice([-1, 1]) * rng.uniform(0.05, 2.0) * sd)
        a, b = {"offset": (1.0, b), "scale": (a, 0.0), "affine": (a, b)}[kind]
        served[col] = a * x + b
        inj.size = {"scale": a, "offset": b}
    elif kind == "lag":
        lag = int(rng.choice([1, 1, 2, -1]))
        inj.lag = lag
        if col in ds.rolling and lag == 1 and rng.random() < 0.5:
            src, w = ds.rolling[col]
            served[col] = _with_rolling(df, ds.entity, {src: w}, closed="left")[col]
        else:
            served[col] = _lagged(ds, col, lag)
    elif kind == "swapped":
        partners = [c for c in rich if c != col and not np.allclose(df[c], x)]
        other = partners[rng.integers(len(partners))]
        served[col], served[other] = df[other].to_numpy(), x.to_numpy()
        inj.partner = other
    elif kind == "mapping":
        labels = sorted(x.dropna().unique())
        if rng.random() < 0.5 and len(labels) >= 2:
            perm = list(rng.permutation(len(labels)))
            while all(i == p for i, p in enumerate(perm)):
                perm = list(rng.permutation(len(labels)))
            mapping = {v: labels[p] for v, p in zip(labels, perm, strict=True)}
        else:
            mapping = {v: f"{v}".upper() + "_v2" for v in labels}
        served[col] = x.map(mapping)
    elif kind == "default_filled":
        share = rng.uniform(0.05, 0.5)
        rows = rng.random(len(df)) < share
        if pd.api.types.is_numeric_dtype(x):
            default: Any = [0.0, -1.0, float(x.mean())][rng.integers(3)]
        else:
            default = ["unknown", "other"][rng.integers(2)]
        served[col] = x.where(~rows, default)
        inj.size = {"share": share}
    elif kind == "missing_in_served":
        share = rng.uniform(0.05, 0.5)
        rows = rng.random(len(df)) < share
        served[col] = x.where(~rows, None if not pd.api.types.is_numeric_dtype(x) else np.nan)
        inj.size = {"share": share}
    frac = rng.uniform(0.3, 1.0)
    served = served.sample(frac=frac, random_state=int(rng.integers(2**31)))
    return served, inj


def _table(df: pd.DataFrame) -> pa.Table:
    return pa.Table.from_pandas(df, preserve_index=False)


def judge(report: dict[str, Any], inj: Injection) -> tuple[bool, list[str]]:
    """(the injected feature's kind is right, the clean features reported as skewed)."""
    feats = report["features"]
    f = feats[inj.feature]
    right = f["kind"] == inj.kind
    if inj.kind == "swapped":
        right = right and f["detail"].get("with") == inj.partner
    if inj.kind == "lag":
        right = right and f["detail"].get("lag") == inj.lag
    touched = {inj.feature, inj.partner}
    false = [n for n, v in feats.items() if n not in touched and v["kind"] != "match"]
    return right, false


def sweep(runs: int, seed: int) -> dict[str, Any]:
    """Part 1: ``runs`` random injections over the data sets; counts by kind and the misses."""
    rng = np.random.default_rng(seed)
    sets = datasets()
    tables = {d.name: _table(d.frame) for d in sets}
    right: Counter[str] = Counter()
    total: Counter[str] = Counter()
    false_runs = 0
    misses: list[dict[str, Any]] = []
    lag_rolling = {"runs": 0, "right": 0}
    for _ in range(runs):
        ds = sets[rng.integers(len(sets))]
        served, inj = inject(ds, rng)
        report = diagnose(_table(served), tables[ds.name], KEY, entity=ds.entity, order=ds.order,
                          options=Options(seed=int(rng.integers(2**31))))
        ok, false = judge(report, inj)
        total[inj.kind] += 1
        right[inj.kind] += ok
        if inj.kind == "lag" and inj.feature in ds.rolling:
            lag_rolling["runs"] += 1
            lag_rolling["right"] += ok
        if false:
            false_runs += 1
        if not ok or false:
            f = report["features"][inj.feature]
            misses.append({"dataset": ds.name, "injected": inj.__dict__, "found": f["kind"],
                           "match_ratio": f["match_ratio"], "false": false})
    n_right = sum(right.values())
    return {
        "runs": runs,
        "right_ratio": n_right / runs,
        "clean_runs_ratio": 1 - false_runs / runs,
        "by_kind": {k: {"runs": total[k], "right": right[k]} for k in sorted(total)},
        "rolling_mean_lag": lag_rolling,
        "misses": misses[:20],
    }


def speed(rows: int, repeat: int, seed: int = 0) -> dict[str, Any]:
    """Part 2: seconds to read and diagnose ``rows`` served rows against 1.2x as many offline rows."""
    cpus, ios = pa.cpu_count(), pa.io_thread_count()
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    try:
        return _speed(rows, repeat, seed)
    finally:
        pa.set_cpu_count(cpus)
        pa.set_io_thread_count(ios)


def _speed(rows: int, repeat: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    n_off = int(rows * 1.2)
    ent = rng.integers(0, max(1, n_off // 50), n_off)
    order = rng.permutation(n_off)
    off: dict[str, Any] = {KEY: pa.array([f"req-{i:09d}" for i in range(n_off)]), "entity": ent, "t": order}
    for j in range(6):
        off[f"x{j}"] = rng.normal(j, 1 + j, n_off)
    off["c0"] = pa.array(np.array(["a", "b", "c", "d", "e"])[rng.integers(0, 5, n_off)])
    off["c1"] = pa.array(np.array([f"k{i}" for i in range(40)])[rng.integers(0, 40, n_off)])
    offline = pa.table(off)
    pick = np.sort(rng.choice(n_off, rows, replace=False))
    served = offline.take(pa.array(pick)).drop_columns(["entity", "t"])
    cols = {c: served.column(c) for c in served.column_names}
    x0 = cols["x0"].to_numpy()
    cols["x0"] = pa.array(x0 * 1.7 + 0.2)  # affine
    x1 = cols["x1"].to_numpy().copy()
    x1[rng.random(rows) < 0.2] = 0.0  # default_filled
    cols["x1"] = pa.array(x1)
    cols["c1"] = pa.array(np.char.add(np.asarray(cols["c1"].to_pylist(), dtype=str), "_v2"))  # mapping
    served = pa.table(cols)
    times, results = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        sp, op = os.path.join(tmp, "served.parquet"), os.path.join(tmp, "offline.parquet")
        pq.write_table(served, sp)
        pq.write_table(offline, op)
        for _ in range(repeat):
            t0 = time.process_time()
            w0 = time.perf_counter()
            rep = diagnose(read_table(sp), read_table(op), KEY, entity="entity", order="t")
            times.append((time.process_time() - t0, time.perf_counter() - w0))
            results = {n: f["kind"] for n, f in rep["features"].items()}
    return {
        "served_rows": rows, "offline_rows": n_off, "features": len(results),
        "cpu_s_median": statistics.median(t for t, _ in times), "wall_s_median": statistics.median(w for _, w in times),
        "repeat": repeat, "kinds": results,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--seed", type=int, default=30)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--speed-only", action="store_true")
    p.add_argument("--quality-only", action="store_true")
    args = p.parse_args(argv)
    out: dict[str, Any] = {}
    if not args.speed_only:
        t0 = time.perf_counter()
        out["quality"] = sweep(args.runs, args.seed)
        out["quality"]["seconds"] = time.perf_counter() - t0
    if not args.quality_only:
        out["speed"] = speed(args.rows, args.repeat)
    json.dump(out, sys.stdout, indent=1)
    print()
    q = out.get("quality")
    s = out.get("speed")
    ok = (q is None or (q["right_ratio"] >= 0.95 and q["clean_runs_ratio"] >= 0.99)) and (
        s is None or s["cpu_s_median"] < 10)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

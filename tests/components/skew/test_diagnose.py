"""The skew diagnosis on real data with skews injected at random, and its exact numbers on small cases."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from scipy.spatial.distance import jensenshannon

from inferwatch_sidecar.components.skew.diagnose import Options, diagnose, skewed
from inferwatch_sidecar.components.skew.tables import SkewInputError
from tests.components.skew.helpers import load_bench

bench = load_bench()


def _t(df: pd.DataFrame) -> pa.Table:
    return pa.Table.from_pandas(df, preserve_index=False)


def test_random_injections_on_shipped_data_name_the_right_kind_and_leave_clean_features_alone() -> None:
    # A modest seeded sweep (bench/skew.py runs thousands): every kind, feature and size drawn per run over
    # scikit-learn's and statsmodels' shipped tabular and panel / time-series data sets.
    res = bench.sweep(runs=120, seed=7)
    assert res["right_ratio"] >= 0.95, res["misses"]
    assert res["clean_runs_ratio"] >= 0.99, res["misses"]
    kinds = set(res["by_kind"])
    assert {"offset", "scale", "affine", "lag", "swapped", "mapping", "default_filled", "missing_in_served"} <= kinds


def test_a_one_point_rolling_mean_window_lag_is_named_lag_though_the_distribution_barely_moves() -> None:
    # The seed's story on the Grunfeld panel: training averages [t-2, t] per firm, serving [t-3, t).
    (ds,) = [d for d in bench.datasets() if d.name == "grunfeld"]
    served = bench._with_rolling(ds.frame[["request_id", "firm", "year", "invest"]], "firm", {"invest": 3},
                                 closed="left")
    rep = diagnose(_t(served.drop(columns=["firm", "year"])), _t(ds.frame), "request_id",
                   entity="firm", order="year")
    f = rep["features"]["invest_mean3"]
    assert f["kind"] == "lag" and f["detail"]["lag"] == 1
    firms = ds.frame["firm"].nunique()
    n = len(ds.frame)
    # every row but each firm's first (no earlier row to lag onto) is explained by the lag
    assert f["explained_ratio"] + f["match_ratio"] == pytest.approx((n - firms) / n)
    assert f["match_ratio"] < 0.1
    assert f["detail"]["distance"]["jensen_shannon_divergence"] < 0.05
    assert rep["features"]["invest"]["kind"] == "match"
    # without the order there is no lag to find: the same rows are a mismatch
    rep = diagnose(_t(served.drop(columns=["firm", "year"])), _t(ds.frame), "request_id")
    assert rep["features"]["invest_mean3"]["kind"] == "mismatch"


def test_report_shape_and_exact_ratios() -> None:
    rng = np.random.default_rng(3)
    n = 1000
    off = pd.DataFrame({"id": [f"k{i}" for i in range(n)], "x": rng.normal(5, 2, n), "y": rng.normal(0, 1, n),
                        "c": rng.choice(["red", "green", "blue"], n)})
    srv = off.copy()
    filled = np.zeros(n, bool)
    filled[rng.choice(n, 137, replace=False)] = True
    srv.loc[filled, "y"] = 0.0
    srv["x"] = (off["x"] - 5) / 2  # standardized with the training mean and std: affine
    srv["c"] = off["c"].map({"red": "RED", "green": "GREEN", "blue": "BLUE"})
    rep = diagnose(_t(srv.iloc[:800]), _t(off), "id")
    assert rep["rows_joined"] == 800
    assert set(rep["features"]) == {"x", "y", "c"}
    for f in rep["features"].values():
        assert set(f) == {"match_ratio", "kind", "explained_ratio", "detail"}
    x, y, c = (rep["features"][k] for k in "xyc")
    assert (x["kind"], x["match_ratio"], x["explained_ratio"]) == ("affine", 0.0, 1.0)
    assert x["detail"]["scale"] == pytest.approx(0.5) and x["detail"]["offset"] == pytest.approx(-2.5)
    k = int(filled[:800].sum())
    assert y["kind"] == "default_filled" and y["detail"]["default"] == 0.0
    assert y["match_ratio"] == pytest.approx(1 - k / 800) and y["explained_ratio"] == pytest.approx(k / 800)
    assert c["kind"] == "mapping" and c["detail"]["mapping"] == {"blue": "BLUE", "green": "GREEN", "red": "RED"}
    assert c["detail"]["distance"]["l_infinity"] == pytest.approx(
        max(off["c"].iloc[:800].value_counts(normalize=True)))
    assert skewed(rep, 0.99) == ["x", "y", "c"]


def test_jensen_shannon_divergence_agrees_with_scipy() -> None:
    rng = np.random.default_rng(5)
    o = rng.normal(0, 1, 5000)
    s = np.clip(o * 1.3, o.min(), o.max())  # inside the offline range: no outer bins
    rep = diagnose(pa.table({"k": np.arange(5000), "v": s}), pa.table({"k": np.arange(5000), "v": o}), "k")
    edges = np.unique(np.quantile(o, np.linspace(0, 1, 33)))
    p = np.histogram(o, edges)[0] / len(o)
    q = np.histogram(s, edges)[0] / len(s)
    want = jensenshannon(p, q, base=2) ** 2
    got = rep["features"]["v"]["detail"]["distance"]["jensen_shannon_divergence"]
    assert got == pytest.approx(want, rel=0.05)


def test_swapped_and_missing_and_a_mismatch_no_kind_explains() -> None:
    rng = np.random.default_rng(11)
    n = 500
    off = pa.table({"id": np.arange(n), "r": rng.normal(0, 1, n), "g": rng.normal(9, 1, n), "b": rng.normal(3, 3, n),
                    "z": rng.normal(0, 1, n)})
    miss = rng.random(n) < 0.3
    z = off.column("z").to_numpy().copy()
    z[miss] = np.nan
    srv = pa.table({"id": np.arange(n), "r": off.column("b"), "g": off.column("g"), "b": off.column("r"),
                    "z": pa.array(z, from_pandas=True)})
    noisy = pa.table({"id": np.arange(n), "z": off.column("z").to_numpy() + rng.normal(0, 0.1, n)})
    rep = diagnose(srv, off, "id")
    assert rep["features"]["r"]["kind"] == "swapped" and rep["features"]["r"]["detail"]["with"] == "b"
    assert rep["features"]["r"]["detail"]["symmetric"] is True
    assert rep["features"]["b"]["detail"]["with"] == "r"
    assert rep["features"]["g"]["kind"] == "match"
    assert rep["features"]["z"]["kind"] == "missing_in_served"
    assert rep["features"]["z"]["explained_ratio"] == pytest.approx(miss.mean())
    rep = diagnose(noisy, off, "id")
    z = rep["features"]["z"]
    assert z["kind"] == "mismatch" and z["explained_ratio"] == 1.0 and len(z["detail"]["examples"]) == 5


def test_bad_input_gives_clear_errors() -> None:
    off = pa.table({"id": ["a", "b", "c"], "x": [1.0, 2.0, 3.0]})
    with pytest.raises(SkewInputError, match="the served table has no key column 'rid'"):
        diagnose(pa.table({"id": ["a"], "x": [1.0]}), off, "rid")
    with pytest.raises(SkewInputError, match=r"offline table has 1 duplicate rows of key 'id' \(for example \['b'\]\)"):
        diagnose(off, pa.table({"id": ["a", "b", "b"], "x": [1.0, 2.0, 2.0]}), "id")
    with pytest.raises(SkewInputError, match="is int64 in the served table but string in the offline table"):
        diagnose(pa.table({"id": [1, 2], "x": [1.0, 2.0]}), off, "id")
    with pytest.raises(SkewInputError, match="no served row has its key 'id' in the offline table"):
        diagnose(pa.table({"id": ["q"], "x": [1.0]}), off, "id")
    with pytest.raises(SkewInputError, match="--entity needs --order"):
        diagnose(off, off, "id", entity="x")
    with pytest.raises(SkewInputError, match="no --order column 't'"):
        diagnose(off, off, "id", order="t")
    with pytest.raises(SkewInputError, match="a key must be text or an integer"):
        diagnose(pa.table({"id": [1.0]}), off, "id")
    with pytest.raises(SkewInputError, match="features not in both tables"):
        diagnose(off, off, "id", features=["nope"])
    with pytest.raises(SkewInputError, match="max_lag"):
        Options(max_lag=-1)


def test_mismatched_feature_types_are_compared_as_text_and_said_so_and_nulls_keys_counted() -> None:
    off = pa.table({"id": ["a", "b", "c", "d"], "x": [1, 2, 3, 4], "tags": [[1], [2], [3], [4]]})
    srv = pa.table({"id": ["a", "b", "c", None], "x": ["1", "2", "9", "4"], "tags": [[1], [2], [3], [4]]})
    rep = diagnose(srv, off, "id")
    x = rep["features"]["x"]
    assert x["match_ratio"] == pytest.approx(2 / 3)
    assert x["detail"]["types"] == {"served": "string", "offline": "int64"}
    assert rep["not_compared"] == {"tags": "unsupported types: served list<item: int64>, offline list<item: int64>"}
    assert rep["rows_without_key"] == {"served": 1, "offline": 0}
    assert rep["rows_joined"] == 3


def test_the_speed_benchmark_still_finds_its_three_skews_on_a_small_run() -> None:
    res = bench.speed(rows=20000, repeat=1)
    assert res["kinds"] == {"x0": "affine", "x1": "default_filled", "x2": "match", "x3": "match", "x4": "match",
                            "x5": "match", "c0": "match", "c1": "mapping"}

"""Reference profiles: binning, validation, JSON round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest

from inferwatch_sidecar.components.drift import profile as prof
from inferwatch_sidecar.stats.columns import canon


@pytest.mark.parametrize("kind", ["normal", "lognormal", "discrete", "cauchy", "tiny"])
def test_fast_bin_lookup_equals_searchsorted(kind: str) -> None:
    rng = np.random.default_rng(1)
    ref = {"normal": rng.normal(size=5000), "lognormal": rng.lognormal(0, 2, 5000),
           "discrete": rng.integers(0, 50, 5000).astype(float), "cauchy": rng.standard_cauchy(5000),
           "tiny": rng.normal(size=3)}[kind]
    col = prof.numeric_column("x", ref)
    e = col.edges
    cur = np.concatenate([rng.normal(0, 3, 5000) * np.std(ref) + np.mean(ref), ref, e, np.nextafter(e, np.inf),
                          np.nextafter(e, -np.inf), [-1e300, 1e300]])
    counts, sums, miss = col.bin(np.concatenate([cur, [np.nan, np.inf]]))
    expect = np.bincount(np.searchsorted(e, cur, side="right"), minlength=col.n_bins)
    np.testing.assert_array_equal(counts, expect)
    assert miss == 2


def test_reference_counts_are_percentiles_and_psi_bins_are_deciles() -> None:
    rng = np.random.default_rng(2)
    col = prof.numeric_column("x", rng.normal(size=10_000))
    assert col.n_bins == 102 and col.counts[0] == 0 and col.counts[-1] == 0
    np.testing.assert_allclose(col.counts[1:-1], 100, atol=1)
    psi = np.bincount(col.psi_map, weights=col.counts, minlength=col.n_psi_bins)
    np.testing.assert_allclose(psi, 1000, atol=1)
    assert np.all(np.isin(col.psi_edges, col.edges))


def test_categorical_top_k_and_other() -> None:
    vals = ["a"] * 5 + ["b"] * 3 + ["c"] * 3 + ["d"] + [None] * 2 + [1.0, 1]
    col = prof.categorical_column("c", vals, top_k=3)
    assert col.categories == ["a", "b", "c"]  # ties broken by name
    assert col.counts.tolist() == [5, 3, 3, 3]  # other: d, "1", "1"
    assert col.missing == 2 and col.count == 14
    assert canon(1.0) == canon(1) == "1" and canon(float("nan")) is None
    assert canon(True) == "true" and canon(0.5) == "0.5"


def _doc() -> dict:
    p = prof.build({"x": np.arange(100.0)}, {"c": ["a", "b"] * 50}, prediction="c")
    return json.loads(json.dumps(p.to_json()))


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(format="x"), "not an inferwatch drift profile"),
    (lambda d: d.update(version=2), "version 2 is not supported"),
    (lambda d: d.update(columns=[]), "'columns' must be a non-empty list"),
    (lambda d: d["columns"][0].pop("edges"), "column 'x': missing field 'edges'"),
    (lambda d: d["columns"][0].update(counts=[1, 2]), "'counts' has 2 entries"),
    (lambda d: d["columns"][0].update(kind="text"), "kind must be 'numeric' or 'categorical'"),
    (lambda d: d["columns"][0].update(mean="zero"), "'mean' must be a finite number"),
    (lambda d: d["columns"][0].update(psi_edges=[0.5]), "subset of 'edges'"),
    (lambda d: d["columns"][1].update(categories=["a", "a"]), "distinct strings"),
    (lambda d: d["columns"][1].update(role="label"), "role must be one of"),
    (lambda d: d["columns"].append(dict(d["columns"][0])), "appears twice"),
    (lambda d: d["columns"][0].update(counts=[0] * len(d["columns"][0]["counts"])), "sum to 'count'"),
])
def test_invalid_profiles_are_rejected_with_what_to_fix(mutate, message: str) -> None:
    d = _doc()
    mutate(d)
    with pytest.raises(prof.ProfileError, match=message):
        prof.from_json(d)


def test_profile_json_round_trip_is_exact(tmp_path) -> None:
    d = _doc()
    path = tmp_path / "p.json"
    p = prof.from_json(d)
    p.save(str(path))
    again = prof.load(str(path))
    assert json.dumps(again.to_json()["columns"]) == json.dumps(d["columns"])
    assert again.prediction.name == "c"

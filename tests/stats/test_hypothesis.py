"""The drift statistics agree with scipy and Evidently where the definitions match."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from scipy.spatial import distance

from inferwatch_sidecar.stats import hypothesis as stats
from tests.helpers.imports import quiet_import

ST = "evidently.legacy.calculations.stattests."


def test_ks_binned_equals_sample_ks_when_every_value_has_its_own_bin() -> None:
    rng = np.random.default_rng(2)
    a = rng.integers(0, 8, 900).astype(float)
    b = rng.integers(1, 8, 700).astype(float)
    edges = np.arange(0.5, 8.0, 1.0)
    ca = np.bincount(np.searchsorted(edges, a), minlength=9)
    cb = np.bincount(np.searchsorted(edges, b), minlength=9)
    d, p = stats.ks_binned(ca, cb)
    ref = sps.ks_2samp(a, b, method="asymp")
    assert d == pytest.approx(ref.statistic, abs=1e-12)
    assert p == pytest.approx(ref.pvalue, abs=0.005)


@pytest.mark.parametrize("en,bound", [(50, 0.015), (100, 0.012), (1000, 0.0041), (10000, 0.0014)])
def test_fast_ks_p_value_is_within_the_documented_distance_of_scipys(en: int, bound: float) -> None:
    ds = np.linspace(0.2, 3.0, 40) / np.sqrt(en)
    fast = stats.ks_pvalue(ds, 2 * en, 2 * en)  # en = n1 n2 / (n1 + n2)
    ref = sps.kstwo.sf(ds, en)  # ks_2samp's asymptotic p-value at n1 = n2 = 2 en
    assert np.max(np.abs(fast - ref)) <= bound
    assert stats.ks_pvalue(0.0, 10, 10) == 1.0 and stats.ks_pvalue(0.5, 0, 10) == 1.0


def test_ks_binned_is_a_lower_bound_within_one_bin_mass_of_sample_ks() -> None:
    rng = np.random.default_rng(3)
    a = rng.normal(size=5000)
    b = rng.normal(0.2, size=4000)
    edges = np.unique(np.quantile(a, np.arange(1, 100) / 100))
    ca = np.bincount(np.searchsorted(edges, a, side="right"), minlength=100)
    cb = np.bincount(np.searchsorted(edges, b, side="right"), minlength=100)
    d_bin, _ = stats.ks_binned(ca, cb)
    d_raw = sps.ks_2samp(a, b).statistic
    assert d_bin <= d_raw + 1e-12
    assert d_raw - d_bin <= max(ca.max() / ca.sum(), cb.max() / cb.sum())


def test_wasserstein_matches_scipy_on_samples_and_weights() -> None:
    rng = np.random.default_rng(4)
    u, v = rng.normal(size=300), rng.normal(0.3, 2, size=500)
    assert stats.wasserstein(u, v) == pytest.approx(sps.wasserstein_distance(u, v), abs=1e-9)
    uw, vw = rng.random(300), rng.random(500)
    assert stats.wasserstein(u, v, uw, vw) == pytest.approx(sps.wasserstein_distance(u, v, uw, vw), abs=1e-9)


def test_normalized_wasserstein_matches_evidently() -> None:
    _wasserstein_distance_norm = quiet_import(ST + "wasserstein_distance_norm")._wasserstein_distance_norm
    ColumnType = quiet_import("evidently.legacy.core").ColumnType

    rng = np.random.default_rng(5)
    a, b = rng.normal(2, 3, 2000), rng.normal(2.5, 3, 1500)
    ours = stats.wasserstein_norm(stats.wasserstein(a, b), float(np.std(a)))
    theirs, _ = _wasserstein_distance_norm(pd.Series(a), pd.Series(b), ColumnType.Numerical, 0.1)
    assert ours == pytest.approx(theirs, abs=1e-9)
    # A constant reference is normalized by 0.001, as in Evidently.
    c = np.full(100, 4.0)
    theirs_c, _ = _wasserstein_distance_norm(pd.Series(c), pd.Series(c + 0.01), ColumnType.Numerical, 0.1)
    assert stats.wasserstein_norm(stats.wasserstein(c, c + 0.01), 0.0) == pytest.approx(theirs_c, abs=1e-9)


def test_binned_wasserstein_is_close_to_sample_wasserstein_for_a_shift() -> None:
    rng = np.random.default_rng(6)
    a, b = rng.normal(size=20000), rng.normal(0.3, size=20000)
    edges = np.unique(np.quantile(a, np.arange(1, 100) / 100))
    ia, ib = np.searchsorted(edges, a, side="right"), np.searchsorted(edges, b, side="right")
    ca, cb = np.bincount(ia, minlength=100), np.bincount(ib, minlength=100)
    means = np.bincount(ia, weights=a, minlength=100) / ca
    w = stats.wasserstein_binned(ca, means, cb, np.bincount(ib, weights=b, minlength=100))
    assert w == pytest.approx(sps.wasserstein_distance(a, b), abs=0.01)


def test_jensen_shannon_matches_scipy() -> None:
    p = np.array([10, 20, 30, 0, 40.0])
    q = np.array([12, 0, 33, 5, 50.0])
    assert stats.jensen_shannon(p, q) == pytest.approx(distance.jensenshannon(p, q), abs=1e-12)
    assert stats.jensen_shannon(p, p) == 0.0


def test_psi_and_js_match_evidently_on_categories() -> None:
    _jensenshannon = quiet_import(ST + "jensenshannon")._jensenshannon
    _psi = quiet_import(ST + "psi")._psi
    ColumnType = quiet_import("evidently.legacy.core").ColumnType

    ref = pd.Series(["a"] * 500 + ["b"] * 300 + ["c"] * 200)
    cur = pd.Series(["a"] * 300 + ["b"] * 300 + ["d"] * 100)  # c vanished, d is new: zero handling on both sides
    keys = ["a", "b", "c", "d"]
    rc = np.array([float((ref == k).sum()) for k in keys])
    cc = np.array([float((cur == k).sum()) for k in keys])
    theirs, _ = _psi(ref, cur, ColumnType.Categorical, 0.1)
    assert stats.psi(stats.proportions(rc), stats.proportions(cc)) == pytest.approx(theirs, abs=1e-9)
    js, _ = _jensenshannon(ref, cur, ColumnType.Categorical, 0.1)
    assert stats.jensen_shannon(rc, cc) == pytest.approx(js, abs=1e-9)


def test_psi_direct_formula() -> None:
    r = np.array([0.5, 0.3, 0.2])
    c = np.array([0.4, 0.4, 0.2])
    expected = (0.5 - 0.4) * np.log(0.5 / 0.4) + (0.3 - 0.4) * np.log(0.3 / 0.4)
    assert stats.psi(r, c) == pytest.approx(expected, abs=1e-15)
    assert stats.psi(r, r) == 0.0


@pytest.mark.parametrize("k", [2, 3, 7])
def test_chi2_homogeneity_matches_scipy_contingency_without_correction(k: int) -> None:
    rng = np.random.default_rng(k)
    r = rng.integers(5, 200, k).astype(float)
    c = rng.integers(5, 200, k).astype(float)
    stat, p, dof = stats.chi2_homogeneity(r, c)
    ref = sps.chi2_contingency(np.vstack([r, c]), correction=False)
    assert stat == pytest.approx(ref.statistic, abs=1e-9)
    assert p == pytest.approx(ref.pvalue, abs=1e-12)
    assert dof == ref.dof


def test_chi2_homogeneity_drops_categories_empty_in_both_and_handles_one_category() -> None:
    stat, p, dof = stats.chi2_homogeneity(np.array([10.0, 0, 5]), np.array([7.0, 0, 9]))
    ref = sps.chi2_contingency(np.array([[10, 5], [7, 9]]), correction=False)
    assert (stat, dof) == (pytest.approx(ref.statistic), 1)
    assert p == pytest.approx(ref.pvalue, abs=1e-12)
    assert stats.chi2_homogeneity(np.array([10.0, 0]), np.array([7.0, 0])) == (0.0, 1.0, 0)
    assert stats.chi2_homogeneity(np.array([10.0, 3]), np.array([0.0, 0])) == (0.0, 1.0, 0)


def test_chi2_goodness_of_fit_matches_scipy_chisquare() -> None:
    c = np.array([30.0, 50, 20])
    p = np.array([0.25, 0.5, 0.25])
    assert stats.chi2_goodness_of_fit(c, p) == pytest.approx(sps.chisquare(c, p * c.sum()).statistic, abs=1e-12)


def test_two_proportion_z_p_value_equals_2x2_chi_square() -> None:
    z, p = stats.two_proportion_z(30, 1000, 55, 900)
    ref = sps.chi2_contingency(np.array([[30, 970], [55, 845]]), correction=False)
    assert z * z == pytest.approx(ref.statistic, abs=1e-9)
    assert p == pytest.approx(ref.pvalue, abs=1e-12)
    assert stats.two_proportion_z(0, 100, 0, 100) == (0.0, 1.0)
    assert stats.two_proportion_z(0, 0, 3, 10) == (0.0, 1.0)


def test_benjamini_hochberg_matches_scipy() -> None:
    rng = np.random.default_rng(7)
    p = np.concatenate([rng.random(40), rng.random(10) * 1e-4, [0.5, 0.5]])
    np.testing.assert_allclose(stats.benjamini_hochberg(p), sps.false_discovery_control(p, method="bh"), atol=1e-12)
    assert stats.benjamini_hochberg(np.empty(0)).size == 0


def test_statistics_are_deterministic() -> None:
    rng = np.random.default_rng(8)
    a, b = rng.normal(size=1000), rng.normal(size=1000)
    assert stats.wasserstein(a, b) == stats.wasserstein(a.copy(), b.copy())

"""The shared statistics (``inferwatch_sidecar.stats``) against scipy and numpy on seeded random families.

The drift engine's tests (``tests/stats/test_hypothesis.py``) cover :mod:`~inferwatch_sidecar.stats.hypothesis`;
here the quantiles and the trend estimators, and that the GPU detector's own kit agrees with them (so it can
move onto them).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from inferwatch_sidecar.components.canary.window import LATENCY_EDGES, latency_bins
from inferwatch_sidecar.components.gpu import detector
from inferwatch_sidecar.stats.quantiles import binned_quantile, norm_ppf
from inferwatch_sidecar.stats.trend import mann_kendall, theil_sen


def test_norm_ppf_is_scipys_and_the_gpu_detectors_approximation_agrees_to_its_stated_error() -> None:
    ps = np.concatenate([np.linspace(1e-6, 1 - 1e-6, 501), [0.5 + 0.95 / 2, 0.975, 0.02425, 1 - 0.02425]])
    for p in ps:
        assert norm_ppf(float(p)) == pytest.approx(float(sps.norm.ppf(p)), rel=1e-12, abs=1e-12)
        assert abs(detector._norm_ppf(float(p)) - norm_ppf(float(p))) < 1.2e-9 * max(1.0, abs(norm_ppf(float(p))))
    for bad in (0.0, 1.0, -0.1, float("nan")):
        with pytest.raises(ValueError):
            norm_ppf(bad)


def test_binned_quantile_is_within_one_bin_of_the_exact_sample_quantile() -> None:
    rng = np.random.default_rng(23)
    ratio = float(np.max(LATENCY_EDGES[1:] / LATENCY_EDGES[:-1]))
    for trial in range(20):
        x = rng.lognormal(np.log(rng.uniform(0.002, 2.0)), rng.uniform(0.2, 1.5), rng.integers(200, 5000))
        counts = np.bincount(latency_bins(x), minlength=LATENCY_EDGES.size + 1)
        for q in (0.01, 0.5, 0.9, 0.99):
            got = binned_quantile(counts, LATENCY_EDGES, q)
            exact = float(np.quantile(x, q))
            assert got is not None and exact / ratio <= got <= exact * ratio, (trial, q, got, exact)
    assert binned_quantile(np.zeros(LATENCY_EDGES.size + 1), LATENCY_EDGES, 0.5) is None


def test_theil_sen_is_the_median_pairwise_slope_and_matches_the_gpu_detector() -> None:
    rng = np.random.default_rng(7)
    for _ in range(25):
        n = int(rng.integers(8, 120))
        t = np.sort(rng.uniform(0, 3600, n)) + np.arange(n) * 1e-3
        y = rng.uniform(-5, 5) * t + rng.standard_t(3, n) * rng.uniform(1, 50)
        if rng.random() < 0.5:
            y = np.round(y / 20.0) * 20.0  # quantised: many ties
        fit = theil_sen(t, y, 0.95)
        i, j = np.triu_indices(n, k=1)
        assert fit.slope == pytest.approx(float(np.median((y[j] - y[i]) / (t[j] - t[i]))), rel=1e-12, abs=1e-12)
        assert fit.lower <= fit.slope <= fit.upper
        slope, _lo, _hi, z = detector.sen_mann_kendall(t, y, 0.95)
        assert fit.slope == pytest.approx(slope, rel=1e-12, abs=1e-12)
        assert mann_kendall(y).z == pytest.approx(z, rel=1e-12, abs=1e-12)


def test_mann_kendall_without_continuity_is_kendalls_tau_test_against_time() -> None:
    rng = np.random.default_rng(11)
    for _ in range(25):
        n = int(rng.integers(5, 200))
        t = np.arange(n, dtype=float)
        y = rng.normal(size=n) + rng.uniform(-0.05, 0.05) * t
        if rng.random() < 0.5:
            y = np.round(y)
        mk = mann_kendall(y, continuity=False)
        ref = sps.kendalltau(t, y, method="asymptotic")
        if mk.s == 0:
            assert mk.p_value == 1.0
            continue
        assert mk.p_value == pytest.approx(float(ref.pvalue), rel=1e-9)
    assert mann_kendall(np.ones(10)).z == 0.0

"""The drift engine's statistics, now :mod:`inferwatch_sidecar.stats.hypothesis` (shared by every component).

Kept so that ``from inferwatch_sidecar.components.drift import stats`` goes on working.
"""

from __future__ import annotations

from inferwatch_sidecar.stats.hypothesis import (
    PSI_EPS,
    WASSERSTEIN_MIN_STD,
    auc_noise,
    benjamini_hochberg,
    chi2_goodness_of_fit,
    chi2_homogeneity,
    jensen_shannon,
    ks_binned,
    ks_pvalue,
    mann_whitney_binned,
    proportions,
    psi,
    two_proportion_z,
    wasserstein,
    wasserstein_binned,
    wasserstein_norm,
)

__all__ = [
    "PSI_EPS", "WASSERSTEIN_MIN_STD", "auc_noise", "benjamini_hochberg", "chi2_goodness_of_fit", "chi2_homogeneity",
    "jensen_shannon", "ks_binned", "ks_pvalue", "mann_whitney_binned", "proportions", "psi", "two_proportion_z",
    "wasserstein", "wasserstein_binned", "wasserstein_norm",
]

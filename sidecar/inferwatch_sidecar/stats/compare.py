"""Two samples compared column by column: one reduced on the other's reference bins, tested, and judged.

The drift engine compares a window with a reference profile this way, and tail attribution compares the
slowest requests with the rest of the window the same way (the rest becomes the reference column):

- :func:`summarize_numeric` / :func:`summarize_categorical` reduce a sample to a :class:`Summary` on a
  reference column's bins (:mod:`.columns`);
- :func:`score` tests one column: Kolmogorov-Smirnov with the normalized Wasserstein distance as its effect
  for a numeric column, chi-square with PSI for a categorical one, and a missing-rate test for both;
- :func:`judge` applies Benjamini-Hochberg across every test of the comparison and each effect's floor: the
  larger of the configured floor and the effect's noise level at the samples' sizes (:func:`effect_floor`,
  :func:`missing_floor`).

docs/drift.md ("Deciding") explains the choices; :mod:`inferwatch_sidecar.components.drift.engine` adds the
joint test and the dataset's verdict.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferwatch_sidecar.stats import hypothesis as stats
from inferwatch_sidecar.stats.columns import CategoricalColumn, Column, NumericColumn, canon

# scipy is imported in the functions that use it, not here: it is 26-72 MiB of modules that an idle sidecar
# need not hold (bench/idle_rss.py; tests/daemon/test_idle_imports.py).

__all__ = ["Result", "Settings", "Summary", "effect_floor", "judge", "missing_floor", "score",
           "summarize_categorical", "summarize_numeric"]


@dataclass(frozen=True)
class Settings:
    """Decision settings (the sidecar builds them from ``DriftConfig``).

    Attributes:
        alpha: false-discovery rate for Benjamini-Hochberg across all tests of one window.
        numeric_effect_floor: minimum normalized Wasserstein distance for a numeric drift.
        categorical_effect_floor: minimum PSI for a categorical drift.
        missing_floor: minimum absolute change of the missing rate.
        min_samples: columns with fewer current values are reported but never flagged.
        drift_share: share of drifted features at which the dataset counts as drifted.
        correction: "bh" (Benjamini-Hochberg) or "none".
        numeric_noise_coef: the numeric floor is at least ``coef * sqrt(1/n + 1/m)``: the normalized
            Wasserstein distance between two samples of one distribution scales as that, and 4.8 is above
            its 99.99th percentile for Gaussian data (measured in bench/drift_quality.py).
        categorical_noise_p: the PSI floor is at least ``chi2.isf(p, K-1) * (1/n + 1/m)``, the
            upper-p quantile of PSI between two samples of one distribution (PSI is asymptotically
            ``(1/n + 1/m) chi2(K-1)`` under no drift).
        multivariate_effect_floor: minimum AUC shift of the joint (reconstruction error) test.
        multivariate_noise_p: the joint floor is at least the upper-p quantile of the AUC shift between
            two samples of one distribution (:func:`multivariate.effect_floor`).
    """

    alpha: float = 0.05
    numeric_effect_floor: float = 0.1
    categorical_effect_floor: float = 0.1
    missing_floor: float = 0.02
    min_samples: int = 100
    drift_share: float = 0.5
    correction: str = "bh"
    numeric_noise_coef: float = 4.8
    categorical_noise_p: float = 1e-5
    multivariate_effect_floor: float = 0.02
    multivariate_noise_p: float = 1e-5


@dataclass
class Summary:
    """A current window (or data set) reduced against one column's reference bins."""

    counts: np.ndarray
    missing: int = 0
    sums: np.ndarray | None = None
    unseen: dict[str, int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.counts.sum())


@dataclass
class Result:
    """The outcome for one column. ``p_value`` is None for columns that were not tested."""

    feature: str
    kind: str
    role: str
    test: str
    statistic: float
    p_value: float | None
    effect_name: str
    effect: float
    psi: float
    jensen_shannon: float
    n_reference: int
    n_current: int
    missing_reference: float
    missing_current: float
    missing_p_value: float | None
    mean_reference: float | None = None
    mean_current: float | None = None
    unseen: dict[str, int] = field(default_factory=dict)
    dof: int = 0
    status: str = "ok"
    effect_floor: float = 0.0
    p_adjusted: float | None = None
    missing_p_adjusted: float | None = None
    missing_drifted: bool = False
    drifted: bool = False

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["unseen"] = dict(sorted(self.unseen.items()))
        return d


def summarize_numeric(ref: NumericColumn, values: np.ndarray) -> Summary:
    """Reduce raw numeric values to a :class:`Summary` on ``ref``'s bins."""
    counts, sums, miss = ref.bin(values)
    return Summary(counts=counts.astype(np.float64), sums=sums, missing=miss)


#: The value types :func:`summarize_categorical` counts with a ``Counter``.
_STR_OR_NONE = frozenset({str, type(None)})


def summarize_categorical(ref: CategoricalColumn, values: Any, max_unseen: int = 16) -> Summary:
    """Reduce raw categorical values to a :class:`Summary` (top-K bins + other)."""
    counts = np.zeros(ref.n_bins)
    unseen: dict[str, int] = {}
    missing = 0
    index, other = ref.index, ref.other_bin
    if len(values) > 16 and set(map(type, values)) <= _STR_OR_NONE:
        # Strings (and None) only, the common case: each distinct value is counted in C (Counter keeps the
        # order values first came in), then looked up once, with the same result as the loop below (a string
        # is its own canon(); a category enters ``unseen`` at its first value while there is room).
        for c, n in Counter(values).items():
            if c is None:
                missing += n
                continue
            i = index.get(c)
            if i is None:
                counts[other] += n
                if len(unseen) < max_unseen:
                    unseen[c] = n
            else:
                counts[i] += n
        return Summary(counts=counts, missing=missing, unseen=unseen)
    for raw in values:
        c = raw if type(raw) is str else canon(raw)
        if c is None:
            missing += 1
            continue
        i = index.get(c)
        if i is None:
            counts[other] += 1
            if c in unseen:
                unseen[c] += 1
            elif len(unseen) < max_unseen:
                unseen[c] = 1
        else:
            counts[i] += 1
    return Summary(counts=counts, missing=missing, unseen=unseen)


def score(ref: Column, cur: Summary, settings: Settings) -> Result:
    """Raw (uncorrected) test results for one column. Never raises on empty data."""
    n_cur = cur.n
    ref_total = ref.count + ref.missing
    cur_total = n_cur + cur.missing
    miss_ref = ref.missing / ref_total if ref_total else 0.0
    miss_cur = cur.missing / cur_total if cur_total else 0.0
    miss_p: float | None = None
    if (ref.missing or cur.missing) and cur_total >= settings.min_samples:
        miss_p = stats.two_proportion_z(ref.missing, ref_total, cur.missing, cur_total)[1]
    status = "ok" if n_cur >= settings.min_samples else "insufficient_data"
    if isinstance(ref, NumericColumn):
        d, p = stats.ks_binned(ref.counts, cur.counts)
        sums = cur.sums if cur.sums is not None else np.zeros_like(cur.counts)
        w = stats.wasserstein_binned(ref.counts, ref.bin_means, cur.counts, sums) if n_cur else 0.0
        wn = stats.wasserstein_norm(w, ref.std)
        k = ref.n_psi_bins
        rp = stats.proportions(np.bincount(ref.psi_map, weights=ref.counts, minlength=k))
        cp = stats.proportions(np.bincount(ref.psi_map, weights=cur.counts, minlength=k))
        mean_cur = float(sums.sum() / n_cur) if n_cur else None
        res = Result(
            feature=ref.name, kind="numeric", role=ref.role, test="ks", statistic=d, p_value=p,
            effect_name="wasserstein_norm", effect=wn, psi=stats.psi(rp, cp) if n_cur else 0.0,
            jensen_shannon=stats.jensen_shannon(rp, cp), n_reference=ref.count, n_current=n_cur,
            missing_reference=miss_ref, missing_current=miss_cur, missing_p_value=miss_p,
            mean_reference=ref.mean, mean_current=mean_cur, status=status,
        )
    else:
        chi, p, dof = stats.chi2_homogeneity(ref.counts, cur.counts)
        rp, cp = stats.proportions(ref.counts), stats.proportions(cur.counts)
        ps = stats.psi(rp, cp) if n_cur else 0.0
        res = Result(
            feature=ref.name, kind="categorical", role=ref.role, test="chi2", statistic=chi, p_value=p,
            effect_name="psi", effect=ps, psi=ps, jensen_shannon=stats.jensen_shannon(rp, cp),
            n_reference=ref.count, n_current=n_cur, missing_reference=miss_ref, missing_current=miss_cur,
            missing_p_value=miss_p, unseen=dict(cur.unseen), dof=dof, status=status,
        )
    if status != "ok":
        res.p_value = None
    return res


def judge(results: list[Result], settings: Settings, first: float | None = None) -> float | None:
    """Apply multiple-testing control and effect-size floors; fill ``drifted`` (and the adjusted p-values) in place.

    Args:
        results: every column's :func:`score`.
        settings: alpha, the correction and the floors.
        first: one more p-value in the same Benjamini-Hochberg family, tested before the columns' (the drift
            engine's joint test).

    Returns:
        ``first`` adjusted (None when it is None).
    """
    pvals: list[float] = []
    slots: list[tuple[Result, str]] = []
    if first is not None:
        pvals.append(first)
    for r in results:
        if r.p_value is not None:
            pvals.append(r.p_value)
            slots.append((r, "main"))
        if r.missing_p_value is not None:
            pvals.append(r.missing_p_value)
            slots.append((r, "missing"))
    if settings.correction == "bh":
        adj = stats.benjamini_hochberg(np.array(pvals)) if pvals else np.empty(0)
    else:
        adj = np.array(pvals)
    first_adjusted = None
    if first is not None:
        first_adjusted, adj = float(adj[0]), adj[1:]
    for (r, which), a in zip(slots, adj, strict=True):
        if which == "main":
            r.p_adjusted = float(a)
        else:
            r.missing_p_adjusted = float(a)
    for r in results:
        r.effect_floor = effect_floor(r, settings)
        floor = r.effect_floor
        main = r.p_adjusted is not None and r.p_adjusted <= settings.alpha and r.effect >= floor
        r.missing_drifted = bool(
            r.missing_p_adjusted is not None and r.missing_p_adjusted <= settings.alpha
            and abs(r.missing_current - r.missing_reference) >= missing_floor(r, settings)
        )
        r.drifted = bool(main or r.missing_drifted)
    return first_adjusted


def effect_floor(r: Result, settings: Settings) -> float:
    """The effect size a column must reach to count as drifted, given its sample sizes.

    The configured floor (the smallest change worth acting on) or the noise
    level of the effect estimator at these sample sizes, whichever is larger:
    a small window cannot tell a 0.1-sigma shift from noise, and flagging it
    anyway is what makes naive detectors cry wolf.
    """
    n, m = r.n_current, r.n_reference
    base = settings.numeric_effect_floor if r.kind == "numeric" else settings.categorical_effect_floor
    if n <= 0 or m <= 0:
        return base  # nothing to test (and never flagged: too few samples)
    inv = 1.0 / n + 1.0 / m
    if r.kind == "numeric":
        return max(settings.numeric_effect_floor, settings.numeric_noise_coef * math.sqrt(inv))
    from scipy import special

    k = max(int(r.dof), 1)
    noise = float(special.chdtri(k, settings.categorical_noise_p)) * inv
    return max(settings.categorical_effect_floor, noise)


def missing_floor(r: Result, settings: Settings) -> float:
    """The change of the missing rate a column must reach: ``missing_floor`` or its noise level.

    The noise level is ``z * sqrt(q (1 - q) (1/n + 1/m))`` with ``q`` the pooled missing rate and ``z``
    the two-sided ``categorical_noise_p`` quantile: without it a 30% missing rate flagged about 1 in
    200 stationary windows of a few thousand rows, the 0.02 floor being 2 standard errors there.
    """
    n = r.n_current / (1.0 - r.missing_current) if r.missing_current < 1.0 else 0.0
    m = r.n_reference / (1.0 - r.missing_reference) if r.missing_reference < 1.0 else 0.0
    if n <= 0 or m <= 0:
        return settings.missing_floor
    from scipy import special

    q = (r.missing_current * n + r.missing_reference * m) / (n + m)
    z = float(special.ndtri(1.0 - settings.categorical_noise_p / 2.0))
    return max(settings.missing_floor, z * math.sqrt(q * (1.0 - q) * (1.0 / n + 1.0 / m)))

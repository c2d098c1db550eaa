"""The drift engine: score window summaries against a reference profile and decide.

The same code serves the sidecar's streaming windows and ``inferwatch drift
compare``: both reduce the current data to a :class:`Summary` per column
(bin counts, per-bin sums, missing count, unseen categories) and call
:func:`evaluate`.

Default selection (documented in docs/drift.md, "Deciding"):

- numeric columns: Kolmogorov-Smirnov for significance, normalized
  Wasserstein (shift in reference standard deviations) as the effect size;
- categorical columns: chi-square (2 x K homogeneity) for significance, PSI
  as the effect size;
- every column: a missing-rate test (pooled two-proportion z) whose effect is
  the absolute change of the missing rate.

A column is *drifted* only when (1) the window holds at least
``min_samples`` values, (2) the Benjamini-Hochberg-adjusted p-value across
all tests of the window is at most ``alpha`` and (3) the effect size is at
least its floor: the larger of the configured floor (0.1) and the effect's
noise level at the window's sample size (:func:`effect_floor`). (2) controls
false alarms across features; (3) stops huge n from making negligible
changes "significant" and small n from flagging noise.

When the profile has a joint model (:mod:`.multivariate`), its test of the
window's reconstruction errors is one more test of the same family, with its
own floor, and the dataset drifted when it drifts (:func:`decide`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special

from inferwatch_sidecar.components.drift import multivariate, stats
from inferwatch_sidecar.components.drift.columns import CategoricalColumn, Column, NumericColumn, canon, to_float
from inferwatch_sidecar.components.drift.profile import Profile


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


@dataclass
class Evaluation:
    """Every column's result, the joint test's (if any) and the dataset-level verdict."""

    results: list[Result]
    share_drifted: float
    dataset_drift: bool
    n_features: int
    n_drifted: int
    multivariate: multivariate.JointResult | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "features": [r.to_json() for r in self.results],
            "share_drifted": self.share_drifted,
            "dataset_drift": self.dataset_drift,
            "n_features": self.n_features,
            "n_drifted": self.n_drifted,
            "multivariate": self.multivariate.to_json() if self.multivariate is not None else None,
        }


def summarize_numeric(ref: NumericColumn, values: np.ndarray) -> Summary:
    """Reduce raw numeric values to a :class:`Summary` on ``ref``'s bins."""
    counts, sums, miss = ref.bin(values)
    return Summary(counts=counts.astype(np.float64), sums=sums, missing=miss)


def summarize_categorical(ref: CategoricalColumn, values: Any, max_unseen: int = 16) -> Summary:
    """Reduce raw categorical values to a :class:`Summary` (top-K bins + other)."""
    counts = np.zeros(ref.n_bins)
    unseen: dict[str, int] = {}
    missing = 0
    index, other = ref.index, ref.other_bin
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


def decide(results: list[Result], settings: Settings, joint: multivariate.JointResult | None = None) -> Evaluation:
    """Apply multiple-testing control and effect-size floors; fill ``drifted`` in place.

    ``joint``, the window's joint test, is one more test in the Benjamini-Hochberg family; when it
    drifts, the dataset drifted whatever the share of drifted columns.
    """
    pvals: list[float] = []
    slots: list[tuple[Result, str]] = []
    if joint is not None and joint.p_value is not None:
        pvals.append(joint.p_value)
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
    if joint is not None and joint.p_value is not None:
        joint.p_adjusted, adj = float(adj[0]), adj[1:]
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
    if joint is not None:
        joint.effect_floor = multivariate.effect_floor(joint.n_current, joint.n_reference, settings)
        joint.alpha = settings.alpha
        joint.drifted = bool(joint.p_adjusted is not None and joint.p_adjusted <= settings.alpha
                             and joint.effect >= joint.effect_floor)
    feats = [r for r in results if r.role == "feature"]
    n_drift = sum(r.drifted for r in feats)
    share = n_drift / len(feats) if feats else 0.0
    dataset = (bool(feats) and share >= settings.drift_share) or (joint is not None and joint.drifted)
    return Evaluation(results=results, share_drifted=share, dataset_drift=dataset, n_features=len(feats),
                      n_drifted=n_drift, multivariate=joint)


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
    q = (r.missing_current * n + r.missing_reference * m) / (n + m)
    z = float(special.ndtri(1.0 - settings.categorical_noise_p / 2.0))
    return max(settings.missing_floor, z * math.sqrt(q * (1.0 - q) * (1.0 / n + 1.0 / m)))


def evaluate(profile: Profile, summaries: dict[str, Summary], settings: Settings,
             joint: multivariate.JointResult | None = None) -> Evaluation:
    """Score every profile column that has a summary, then :func:`decide` (with the joint test, if given)."""
    results = [score(col, summaries[name], settings) for name, col in profile.columns.items() if name in summaries]
    return decide(results, settings, joint)


def compare_columns(profile: Profile, numeric: dict[str, np.ndarray], categorical: dict[str, list[Any]],
                    settings: Settings) -> Evaluation:
    """Score raw current columns (offline use) against a profile.

    A profile column absent from the current data is skipped; a numeric
    profile column given as categorical data (or the reverse) is converted.
    The joint test runs when the profile has a joint model and the current
    data has every column it reads (status ``missing_columns`` otherwise).
    """
    sums: dict[str, Summary] = {}
    for name, col in profile.columns.items():
        if isinstance(col, NumericColumn):
            if name in numeric:
                sums[name] = summarize_numeric(col, numeric[name])
            elif name in categorical:
                vals = np.array([to_float(v) for v in categorical[name]], dtype=np.float64)
                sums[name] = summarize_numeric(col, vals)
        else:
            if name in categorical:
                sums[name] = summarize_categorical(col, categorical[name])
            elif name in numeric:
                sums[name] = summarize_categorical(col, [canon(v) for v in numeric[name]])
    return evaluate(profile, sums, settings, joint_of_columns(profile, numeric, categorical, settings))


def joint_of_columns(profile: Profile, numeric: dict[str, np.ndarray], categorical: dict[str, list[Any]],
                     settings: Settings) -> multivariate.JointResult | None:
    """The raw joint test of current data given as columns, or None when the profile has no joint model."""
    model = profile.multivariate
    if model is None:
        return None
    cols = model.columns
    present = [c for c in cols if c in numeric or c in categorical]
    rows = len(numeric[present[0]]) if present and present[0] in numeric else \
        len(categorical[present[0]]) if present else 0
    if len(present) < len(cols):
        return multivariate.score(model, model.errors, summarize_numeric(model.errors, np.empty(0)), settings,
                                  status="missing_columns")
    errors = model.errors_of(numeric, categorical, rows)
    return multivariate.score(model, model.errors, summarize_numeric(model.errors, errors), settings)


"""The drift engine: score window summaries against a reference profile and decide.

The same code serves the sidecar's streaming windows and ``inferwatch drift
compare``: both reduce the current data to a :class:`Summary` per column
(bin counts, per-bin sums, missing count, unseen categories) and call
:func:`evaluate`. The per-column tests and decision are
:mod:`inferwatch_sidecar.stats.compare`, which tail attribution shares; this
module adds the joint test and the dataset's verdict.

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

from dataclasses import dataclass
from typing import Any

import numpy as np

from inferwatch_sidecar.components.drift import multivariate
from inferwatch_sidecar.components.drift.profile import Profile
from inferwatch_sidecar.stats.columns import NumericColumn, canon, to_float
from inferwatch_sidecar.stats.compare import (
    Result,
    Settings,
    Summary,
    effect_floor,
    judge,
    missing_floor,
    score,
    summarize_categorical,
    summarize_numeric,
)

# The per-column comparison lives in stats/compare.py (tail attribution shares it); the engine's callers
# name it through the engine, whose API it is part of.
__all__ = ["Evaluation", "Result", "Settings", "Summary", "compare_columns", "decide", "effect_floor", "evaluate",
           "joint_of_columns", "missing_floor", "score", "summarize_categorical", "summarize_numeric"]


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


def decide(results: list[Result], settings: Settings, joint: multivariate.JointResult | None = None) -> Evaluation:
    """Apply multiple-testing control and effect-size floors (:func:`~inferwatch_sidecar.stats.compare.judge`);
    fill ``drifted`` in place and give the dataset's verdict.

    ``joint``, the window's joint test, is one more test in the Benjamini-Hochberg family; when it
    drifts, the dataset drifted whatever the share of drifted columns.
    """
    first = joint.p_value if joint is not None else None
    adjusted = judge(results, settings, first)
    if joint is not None:
        if first is not None:
            joint.p_adjusted = adjusted
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


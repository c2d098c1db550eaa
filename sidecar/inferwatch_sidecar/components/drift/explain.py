"""Why a column drifted or not, in words: the decision rule of :func:`engine.decide` applied to one result.

A column is drifted when its adjusted p-value is at most ``alpha`` *and* its
effect reaches the floor that applied at its sample size (or its missing rate
changed). Showing only "drifted: no" next to an adjusted p of 0.0007 reads as
a bug; showing ``p_adj 0.0007 <= 0.05; W 0.351 < floor 0.457`` says that the
change is real but smaller than what this window size can tell from noise.
``drift compare``'s table and ``inferwatch report``'s page both use these
strings.
"""

from __future__ import annotations

from inferwatch_sidecar.components.drift.engine import Result
from inferwatch_sidecar.components.drift.multivariate import JointResult

#: Short names of the effect sizes, explained by :data:`LEGEND`.
EFFECT_SHORT = {"wasserstein_norm": "W", "psi": "PSI", "auc_shift": "AUC"}
LEGEND = ("W: normalized Wasserstein distance (shift in reference standard deviations); PSI: population "
          "stability index; floor: the larger of the configured floor and the effect's noise level at this "
          "sample size. Drifted = p_adj <= alpha and effect >= floor, or the missing rate changed.")


def fmt(x: float | None) -> str:
    """A number in 3 significant digits; ``-`` for None."""
    return "-" if x is None else f"{x:.3g}"


def verdict(r: Result | JointResult) -> str:
    """``yes``, ``no``, or why the column was not tested."""
    if r.drifted:
        return "yes"
    return {"ok": "no", "insufficient_data": "too few", "no_history": "waiting",
            "missing_columns": "not tested"}.get(r.status, r.status)


def p_part(r: Result, alpha: float) -> str:
    """The significance half of the rule: ``0.0007 <= 0.05``; empty when nothing was tested."""
    p = r.p_adjusted
    if r.status != "ok" or p is None:
        return ""
    return f"{fmt(p)} {'<=' if p <= alpha else '>'} {alpha:g}"


def effect_part(r: Result) -> str:
    """The effect half of the rule: ``W 0.351 < 0.457`` (effect, then the floor that applied)."""
    if r.status != "ok":
        return ""
    return (f"{EFFECT_SHORT.get(r.effect_name, r.effect_name)} {fmt(r.effect)} "
            f"{'>=' if r.effect >= r.effect_floor else '<'} {fmt(r.effect_floor)}")


def why(r: Result, alpha: float) -> str:
    """The decision of one column in words (see the module docstring)."""
    if r.status == "insufficient_data":
        return f"only {r.n_current} values: below min_samples, never flagged"
    if r.status == "no_history":
        return "rolling reference: no window one period earlier yet"
    out = f"p_adj {p_part(r, alpha)}; {effect_part(r).replace(' <', ' < floor').replace(' >=', ' >= floor')}"
    if r.missing_drifted:
        out += f"; missing {r.missing_reference:.1%} -> {r.missing_current:.1%}"
    return out


def why_joint(j: JointResult) -> str:
    """The joint test's decision in words."""
    if j.status == "missing_columns":
        return "not tested: the current data lacks columns the joint model reads"
    if j.status == "insufficient_data":
        return f"only {j.n_current} rows: below min_samples, never flagged"
    if j.status == "no_history":
        return "rolling reference: no window one period earlier yet"
    p = j.p_adjusted
    return (f"p_adj {fmt(p)} {'<=' if p is not None and p <= j.alpha else '>'} {j.alpha:g}; AUC {fmt(j.statistic)} "
            f"{'>=' if j.statistic >= j.threshold else '<'} threshold {fmt(j.threshold)}")


__all__ = ["LEGEND", "effect_part", "fmt", "p_part", "verdict", "why", "why_joint"]

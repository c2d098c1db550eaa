"""Why the tail is slow: stage breakdown and distinguishing features of the slowest requests of a window.

For each tail (``p99``: the slowest 1% of the window's requests, ``p999``: the
slowest 0.1%) with at least ``min_tail_requests`` requests:

- **stage breakdown**: the mean time the tail's requests spent in each stage
  against the *median requests* (those between the 40th and 60th percentile of
  the sample, a coherent breakdown whose stages add up like a request's do);
  per stage its ``growth`` (tail / median), its ``share`` of the tail's
  latency and its ``excess_share``: the part of the tail's extra latency over
  the median requests that the stage's growth explains. The stage with the
  largest excess share is the *culprit*;
- **features**: each recorded feature (joined to its request by request ID)
  of the tail against the rest of the window (the sample's requests faster
  than the tail), scored with the drift engine's own tests and decision
  (:mod:`inferwatch_sidecar.stats.compare`): the
  rest becomes the reference column (percentile bins or top-K categories),
  the tail the current summary, and ``compare.judge`` applies
  Benjamini-Hochberg across the features and the effect floors. Numeric
  features also get ``ratio``: the tail's median over the rest's.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from inferwatch_sidecar.components.tail.config import TailConfig
from inferwatch_sidecar.components.tail.window import Row, TailWindow
from inferwatch_sidecar.stats import compare
from inferwatch_sidecar.stats.columns import (
    CategoricalColumn,
    canon,
    categorical_column,
    numeric_column,
)

#: The tails analysed: name and the share of the window's requests they hold.
TAILS = (("p99", 0.01), ("p999", 0.001))
#: The median requests: this band of the sample's latency ranks.
MEDIAN_BAND = (0.4, 0.6)


def settings(cfg: TailConfig) -> compare.Settings:
    """The drift engine's decision settings for tail-vs-rest comparisons."""
    return compare.Settings(alpha=cfg.alpha, numeric_effect_floor=cfg.numeric_effect_floor,
                           categorical_effect_floor=cfg.categorical_effect_floor,
                           min_samples=cfg.min_tail_requests, correction="bh")


def _stage_means(rows: list[Row]) -> dict[str, float]:
    tot: dict[str, float] = {}
    for r in rows:
        for name, dur, _stream in r.stages:
            k = str(name)
            tot[k] = tot.get(k, 0.0) + dur * 1e-9
    n = len(rows)
    return {k: v / n for k, v in tot.items()}


def _median(v: np.ndarray) -> float | None:
    v = v[np.isfinite(v)]
    return float(np.median(v)) if v.size else None


def _columns(rows: list[Row], limit: int) -> tuple[list[str], list[str]]:
    """Numeric and categorical feature names seen in ``rows``, sorted, at most ``limit`` in all."""
    num: set[str] = set()
    cat: set[str] = set()
    for r in rows:
        if r.feats is not None:
            schema = r.feats[0]
            num.update(schema.numeric)
            cat.update(schema.categorical)
    names = sorted(num | cat)[:limit]
    return [n for n in names if n in num], [n for n in names if n in cat and n not in num]


def _values(rows: list[Row], name: str, numeric: bool) -> list[Any]:
    out: list[Any] = []
    for r in rows:
        schema, nums, cats = r.feats
        if numeric:
            try:
                out.append(nums[schema.numeric.index(name)])
            except ValueError:
                out.append(math.nan)
        else:
            try:
                out.append(cats[schema.categorical.index(name)])
            except ValueError:
                out.append(None)
    return out


def _features(tail: list[Row], rest: list[Row], cfg: TailConfig, st: compare.Settings) -> list[dict[str, Any]]:
    tail = [r for r in tail if r.feats is not None]
    rest = [r for r in rest if r.feats is not None]
    if not tail or not rest:
        return []
    numeric, categorical = _columns(tail + rest, cfg.max_features)
    results: list[compare.Result] = []
    extra: list[dict[str, Any]] = []
    for name in numeric:
        rv = np.asarray(_values(rest, name, True), dtype=np.float64)
        tv = np.asarray(_values(tail, name, True), dtype=np.float64)
        num = numeric_column(name, rv, bins=cfg.bins)
        if num.count == 0:
            continue
        results.append(compare.score(num, compare.summarize_numeric(num, tv), st))
        tm, rm = _median(tv), _median(rv)
        extra.append({"tail_median": tm, "rest_median": rm,
                      "ratio": tm / rm if tm is not None and rm not in (None, 0.0) else None})
    for name in categorical:
        rvals = _values(rest, name, False)
        tvals = _values(tail, name, False)
        ref = categorical_column(name, rvals, top_k=cfg.top_k)
        if ref.count == 0:
            continue
        results.append(compare.score(ref, compare.summarize_categorical(ref, tvals), st))
        extra.append(_top_category(ref, tvals))
    compare.judge(results, st)
    out = []
    for r, x in zip(results, extra, strict=True):
        out.append({"feature": r.feature, "kind": r.kind, "test": r.test, "statistic": r.statistic,
                    "p_value": r.p_value, "p_adjusted": r.p_adjusted, "effect_name": r.effect_name,
                    "effect": r.effect, "effect_floor": r.effect_floor, "n_tail": r.n_current,
                    "n_rest": r.n_reference, "distinguishes": r.drifted, **x})
    out.sort(key=lambda d: (not d["distinguishes"], d["p_adjusted"] if d["p_adjusted"] is not None else 2.0,
                            d["feature"]))
    return out


def _top_category(ref: CategoricalColumn, tail_values: list[Any]) -> dict[str, Any]:
    """The category most over-represented in the tail, with its share there and in the rest."""
    freq: dict[str, int] = {}
    for v in tail_values:
        c = canon(v)
        if c is not None:
            freq[c] = freq.get(c, 0) + 1
    n_tail, n_rest = sum(freq.values()), ref.count
    if not n_tail or not n_rest:
        return {"category": None, "tail_share": None, "rest_share": None}
    rest = {c: float(ref.counts[i]) for i, c in enumerate(ref.categories)}

    def lift(c: str) -> float:
        # A category the rest never showed (or lumped into "other") counts as half a request there.
        return float((freq[c] / n_tail) / (max(rest.get(c, 0.0), 0.5) / n_rest))

    best = max(sorted(freq), key=lift)
    return {"category": best, "tail_share": freq[best] / n_tail, "rest_share": rest.get(best, 0.0) / n_rest}


def _sentence(name: str, share: float, t: dict[str, Any]) -> str:
    pct = f"{share * 100:g}%"
    parts = []
    if t["culprit"] is not None:
        s = next(x for x in t["stages"] if x["stage"] == t["culprit"])
        parts.append(f"{t['culprit']} is {s['share'] * 100:.0f}% of the slowest {pct}")
    f = next((x for x in t["features"] if x["distinguishes"]), None)
    if f is not None:
        if f["kind"] == "numeric" and f["ratio"] is not None:
            parts.append(f"slow requests have {f['feature']} {f['ratio']:.1f}x the median")
        elif f["kind"] == "categorical" and f["category"] is not None:
            parts.append(f"{f['tail_share'] * 100:.0f}% of slow requests have {f['feature']}={f['category']} "
                         f"(rest {f['rest_share'] * 100:.0f}%)")
    return "; ".join(parts)


def analyse(w: TailWindow, cfg: TailConfig) -> dict[str, Any]:
    """The attribution report of one window (JSON-able; docs/tail.md describes every field)."""
    st = settings(cfg)
    slowest = w.slowest()
    sample = sorted(w.sample, key=lambda r: r.latency)
    kept = {id(r): r for r in sample + slowest}
    report: dict[str, Any] = {
        "requests": w.n,
        "joined_ratio": sum(r.feats is not None for r in kept.values()) / len(kept) if kept else 0.0,
        "median": None,
        "tails": {},
    }
    if not sample:
        return report
    lo, hi = (int(len(sample) * MEDIAN_BAND[0]), max(int(math.ceil(len(sample) * MEDIAN_BAND[1])), 1))
    band = sample[lo:hi] or sample[-1:]
    med_latency = sum(r.latency for r in band) / len(band)
    med_stages = _stage_means(band)
    report["median"] = {"requests": len(band), "latency_s": med_latency, "stages": med_stages}
    for name, share in TAILS:
        want = int(math.ceil(w.n * share))
        entry: dict[str, Any] = {"share": share, "requests": min(want, len(slowest)), "truncated": want > len(slowest),
                                 "needed_requests": int(math.ceil(cfg.min_tail_requests / share))}
        report["tails"][name] = entry
        if want < cfg.min_tail_requests:
            entry["status"] = "insufficient_data"
            continue
        group = slowest[:want]
        threshold = group[-1].latency
        t_latency = sum(r.latency for r in group) / len(group)
        t_stages = _stage_means(group)
        extra = t_latency - med_latency
        stages: list[dict[str, Any]] = []
        for stage in sorted(set(t_stages) | set(med_stages)):
            ts, ms = t_stages.get(stage, 0.0), med_stages.get(stage, 0.0)
            stages.append({"stage": stage, "seconds": ts, "median_seconds": ms,
                           "growth": ts / ms if ms > 0 else None,
                           "share": ts / t_latency if t_latency > 0 else 0.0,
                           "excess_share": (ts - ms) / extra if extra > 0 else None})
        stages.sort(key=lambda s: (-(s["excess_share"] or 0.0), s["stage"]))
        rest = [r for r in sample if r.latency < threshold]
        entry.update({
            "status": "ok", "threshold_s": threshold, "latency_s": t_latency, "stages": stages,
            "culprit": stages[0]["stage"] if stages and (stages[0]["excess_share"] or 0.0) > 0 else None,
            "features": _features(group, rest, cfg, st),
        })
        entry["summary"] = _sentence(name, share, entry)
    return report

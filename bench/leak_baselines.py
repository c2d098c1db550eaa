"""The baselines bench/leak_detection.py scores the detector against: Prometheus' ``predict_linear`` and a 90% threshold.

A faithful reimplementation of Prometheus' rule evaluation over the trace as Prometheus scrapes it (every
SCRAPE seconds, ``for: 5m``), cross-checked against ``promtool`` with ``--check-promtool``. Split out of
``leak_detection.py`` (issue 23).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import numpy as np

from leak_family import TOTAL, Trace

SCRAPE = 15  # seconds between Prometheus scrapes and rule evaluations
FOR_S = 300  # alert "for:" duration


# -- baselines: a faithful reimplementation of Prometheus' rule evaluation ------------------
def predict_linear_series(scraped: np.ndarray, rng_s: int = 3600, ahead_s: int = 4 * 3600) -> tuple[np.ndarray, np.ndarray]:
    """``predict_linear(used[1h], 4h)`` evaluated every SCRAPE seconds on samples scraped every SCRAPE seconds.

    Prometheus' linearRegression: least squares over the samples in (t-1h, t], x
    measured from the evaluation time, so the intercept is the fitted value at t.
    """
    ys = scraped.astype(float)
    ts = np.arange(len(ys), dtype=float) * SCRAPE
    k = rng_s // SCRAPE + 1  # samples in [t-1h, t]: Prometheus 2.x range selectors include the left end
    cx = np.concatenate([[0], np.cumsum(ts)])
    cy = np.concatenate([[0], np.cumsum(ys)])
    cxx = np.concatenate([[0], np.cumsum(ts * ts)])
    cxy = np.concatenate([[0], np.cumsum(ts * ys)])
    idx = np.arange(len(ts))
    lo = np.maximum(0, idx - k + 1)
    n = idx - lo + 1
    sx = cx[idx + 1] - cx[lo]
    sy = cy[idx + 1] - cy[lo]
    sxx = cxx[idx + 1] - cxx[lo]
    sxy = cxy[idx + 1] - cxy[lo]
    # Shift x to be relative to the evaluation time t (as Prometheus does).
    t = ts
    sx_r = sx - n * t
    sxx_r = sxx - 2 * t * sx + n * t * t
    sxy_r = sxy - t * sy
    cov = sxy_r - sx_r * sy / n
    var = sxx_r - sx_r * sx_r / n
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = np.where(var > 0, cov / var, 0.0)
    intercept = sy / n - slope * sx_r / n
    val = intercept + slope * ahead_s
    val[n < 2] = np.nan  # needs two samples
    return ts, val


def with_for(cond: np.ndarray) -> np.ndarray:
    """Alert state after ``for: 5m``: firing once cond held for FOR_S seconds of evaluations."""
    need = FOR_S // SCRAPE
    out = np.zeros(len(cond), dtype=bool)
    run = 0
    for i, c in enumerate(cond):
        run = run + 1 if c else 0
        out[i] = run > need
    return out


def check_promtool(scraped: np.ndarray) -> str:
    """Cross-check predict_linear_series against promtool on one evaluation."""
    exe = shutil.which("promtool")
    if exe is None:
        return "promtool not found: cross-check skipped"
    ts, pl = predict_linear_series(scraped)
    i = 3600 // SCRAPE + 17
    vals = " ".join(str(int(v)) for v in scraped[: i + 1])
    test = f"""
rule_files: []
evaluation_interval: {SCRAPE}s
tests:
  - interval: {SCRAPE}s
    input_series:
      - series: 'used'
        values: '{vals}'
    promql_expr_test:
      - expr: 'predict_linear(used[1h], 14400)'
        eval_time: {int(ts[i])}s
        exp_samples:
          - labels: '{{}}'
            value: {float(pl[i])!r}
"""
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "t.yml")
        with open(p, "w") as f:
            f.write(test)
        r = subprocess.run([exe, "test", "rules", p], capture_output=True, text=True, timeout=60)
    if r.returncode == 0:
        return f"promtool agrees with the reimplementation (predict_linear at t={int(ts[i])}s = {pl[i]:.6e})"
    return "promtool DISAGREES:\n" + r.stdout + r.stderr


def scrape(tr: Trace) -> np.ndarray:
    """The trace as Prometheus scrapes it: the last sample at or before each 15 s tick."""
    ticks = np.arange(0.0, tr.t[-1] + 1e-9, SCRAPE)
    idx = np.searchsorted(tr.t, ticks, side="right") - 1
    return tr.used[np.maximum(idx, 0)]


def baseline_edges(tr: Trace) -> dict[str, list[float]]:
    """Rising edges (times) of both baseline alerts on one trace."""
    ys = scrape(tr)
    ts, pl = predict_linear_series(ys)
    out = {}
    for name, cond in (("predict_linear", np.nan_to_num(pl, nan=0.0) > TOTAL), ("threshold_90", ys > 0.9 * TOTAL)):
        f = with_for(cond).astype(np.int8)
        out[name] = [float(ts[i]) for i in np.flatnonzero(np.diff(np.r_[0, f]) == 1)]
    return out

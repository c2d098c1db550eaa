"""The drift engine's bad-now rows for the status summary (``export/summary.py``), from its ``/v1/status`` section.

Declared in ``components/registry.py``. Since when: a time-based window's start at the evaluation that
showed the verdict (``window``: the drift, or the drop, began in that window, no earlier); a count-based
window has no start time, so the summary's first-seen time stands in. The labelled accuracy, which no
alert reads, is a verdict too once ``MIN_LABELS`` labels arrived: when it is more than the estimate's drop
below the reference accuracy and its 95% Wilson interval lies below it (the labels see a changed model's own
errors, which a label-free estimate cannot).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

from inferwatch_sidecar.export.summary import num, pct, verdict, wilson

#: InferwatchEstimatedAccuracyDrop's drop.
ACCURACY_DROP = 0.05
#: InferwatchEstimatedAccuracyLow's accuracy.
ACCURACY_FLOOR = 0.7
#: Fewest labels before the labelled accuracy is a verdict.
MIN_LABELS = 50
_OUTPUTS = ("prediction", "confidence")


def _window_start(d: Mapping[str, Any], m: Mapping[str, Any]) -> float | None:
    """When the window of model version ``m``'s last evaluation began (None: a count-based window)."""
    last, seconds = num(d.get("last_evaluation_unix")), num((m.get("window") or {}).get("seconds"))
    return last - seconds if last is not None and seconds is not None else None


def _row(subject: str, since: float | None, component: str, what: str, severity: str, detail: str,
         alert: str) -> dict[str, Any]:
    return verdict(component, subject, what, severity, detail, alert, since, "window")


def verdicts(d: Mapping[str, Any], now: float) -> Iterator[dict[str, Any]]:
    """Drifted versions (columns, joint, predictions) and accuracy drops, estimated and labelled."""
    for m in d.get("models") or []:
        row = partial(_row, f"{m.get('model')} {m.get('version')}", _window_start(d, m))
        feats = m.get("features") or []
        drifted = [f.get("feature") for f in feats if f.get("drifted") and f.get("role") not in _OUTPUTS]
        if m.get("dataset_drift"):
            share = num(m.get("share_drifted")) or 0.0
            yield row("drift", "drifted", "warn",
                      f"{share:.0%} of columns drifted: {', '.join(str(x) for x in drifted[:6]) or '-'}"
                      + (f" and {len(drifted) - 6} more" if len(drifted) > 6 else ""), "InferwatchFeatureDrift")
        elif (m.get("multivariate") or {}).get("drifted"):
            yield row("drift", "joint drift", "warn", "the inputs' joint distribution moved while no single "
                      "column did", "InferwatchJointDrift")
        if any(f.get("drifted") and f.get("role") == "prediction" for f in feats):
            yield row("drift", "prediction drift", "warn", "the mix of predicted classes moved",
                      "InferwatchPredictionDrift")
        yield from _accuracy(m, row)


def _accuracy(m: Mapping[str, Any], row: Callable[..., dict[str, Any]]) -> Iterator[dict[str, Any]]:
    p = m.get("performance") or {}
    est, ref = num(p.get("estimated_accuracy")), num(p.get("reference_accuracy"))
    iv = p.get("estimated_accuracy_interval") or [None, None]
    upper = num(iv[1]) if len(iv) > 1 else None
    dropped = bool(p.get("calibrated") and est is not None and ref is not None and ref - est > ACCURACY_DROP
                   and (upper is None or upper < ref))
    if dropped and est is not None and ref is not None:  # dropped implies both (for mypy)
        yield row("accuracy", "accuracy estimate dropped", "bad",
                  f"estimated {pct(est)}" + (f" [{pct(num(iv[0]) or 0.0)}-{pct(upper)}]" if upper is not None else "")
                  + f" against {pct(ref)} on the reference", "InferwatchEstimatedAccuracyDrop")
    # The labels see what the estimate cannot (a changed model's own errors): no alert of their own yet.
    lab = m.get("labelled") or {}
    acc, n = num(lab.get("accuracy")), num(lab.get("events")) or 0
    if acc is not None and ref is not None and n >= MIN_LABELS:
        lo, hi = wilson(acc, n)
        if ref - acc > ACCURACY_DROP and hi < ref:
            yield row("accuracy", "labelled accuracy dropped", "bad",
                      f"{pct(acc)} [{pct(lo)}-{pct(hi)}] of {n:.0f} labelled predictions correct against "
                      f"{pct(ref)} on the reference", "InferwatchEstimatedAccuracyDrop")
    if not dropped and p.get("calibrated") and est is not None and est < ACCURACY_FLOOR:
        yield row("accuracy", "accuracy estimate low", "warn", f"estimated {pct(est)}, below {pct(ACCURACY_FLOOR)}",
                  "InferwatchEstimatedAccuracyLow")

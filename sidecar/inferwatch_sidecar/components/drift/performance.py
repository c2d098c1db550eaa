"""Label-free performance estimation: a calibration fitted on a labelled reference, applied to live windows.

The idea is NannyML's CBPE (confidence-based performance estimation): a
model's confidence is rarely a calibrated probability (gradient-boosted trees
are overconfident), so its mean is a poor accuracy estimate. On a reference
that has labels, fit the probability of the event given the model's score;
then the expected accuracy of any window is the mean of that probability over
the window's records, as long as the relation score -> P(event) holds there
(covariate shift, not concept shift).

Two cases, chosen from the reference's labels:

- **multiclass** (any number of classes): the score is the confidence of the
  predicted class and the event is "the prediction is right";
- **binary** (two label classes, predictions among them): the score is the
  positive-class probability, derived from each record as ``confidence`` when
  the prediction is the positive class and ``1 - confidence`` otherwise, and
  the event is "the label is positive". The window's expected confusion matrix
  (CBPE's: ``TP = sum of p over predicted positives``, ``FP = their count -
  TP``, ``FN = sum of p over predicted negatives``, ``TN = their count - FN``)
  gives accuracy, precision, recall and F1; ROC AUC is the expected rank
  statistic with the calibrated ``p`` as the expected label, ordered by the
  uncalibrated score.

The calibration (:class:`Calibration`) is bounded: the reference's scores are
cut into at most :data:`MAX_BINS` equal-mass bins, and the profile keeps per
bin only the count, the events and the mean score. From those the fit is
``isotonic`` (pool-adjacent-violators over the bins, monotone), ``binned``
(each bin's own rate, any shape; each bin holds at least :data:`MIN_PER_BIN`
reference records) or ``identity`` (the bin's mean score: the model is
already calibrated), whichever has the lowest 5-fold
cross-validated Brier score on the reference records. The
calibrated probability of a score is the rate of its bin's block: a step
function, so the estimate on the reference itself is exactly its realized
accuracy (interpolating between block centres is not: an overconfident
model's scores are so skewed within a block that it biases the estimate).
The streaming :class:`PerformanceWindow` keeps, per sub-window, counts per
bin (and per predicted class for a binary model): constant memory, whatever
the traffic.

The interval is ``estimate +- 1.96 sd``, with the variance of the window's
realized accuracy around its expectation (``sum p (1 - p) / n^2``) plus the
calibration's own error (each block's rate is a binomial estimate from its
reference records, weighted by the window's share in the block).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from inferwatch_sidecar.components.drift.state import state_array
from inferwatch_sidecar.metrics import drift as dm
from inferwatch_sidecar.metrics.samples import Samples
from inferwatch_sidecar.stats.columns import ProfileError, canon

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is 3.11+; annotations only

#: ``identity`` keeps the model's own score (per bin, its mean): chosen when no fit beats it, as CBPE skips
#: calibration when it does not lower the cross-validated calibration error.
METHODS = ("isotonic", "binned", "identity")
#: How the score is read: the predicted class's confidence, or the positive-class probability.
SCORES = ("confidence", "positive_probability")
#: Fine bins of the reference scores at most, and reference records per fine bin at least.
MAX_BINS = 100
MIN_PER_BIN = 20
#: Labelled reference records needed for a calibration.
MIN_LABELLED = 100
CV_FOLDS = 5
#: Two-sided 95% normal quantile.
Z95 = 1.959963984540054
#: What ``/v1/status`` and ``drift compare --json`` say when the reference has no labels.
UNCALIBRATED_NOTE = ("the reference has no labels, so the estimate is the mean confidence, which is only right for "
                     "a calibrated model; build the profile with `inferwatch reference build ... --label COL`")


# -- calibration ------------------------------------------------------------------------------------------------------


def _pav(rates: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted pool-adjacent-violators: the block index of every bin of the increasing fit."""
    vals: list[float] = []
    wts: list[float] = []
    starts: list[int] = []
    for i, (r, w) in enumerate(zip(rates.tolist(), weights.tolist(), strict=True)):
        vals.append(r)
        wts.append(w)
        starts.append(i)
        while len(vals) > 1 and vals[-2] >= vals[-1]:
            w2 = wts[-2] + wts[-1]
            vals[-2] = (vals[-2] * wts[-2] + vals[-1] * wts[-1]) / w2
            wts[-2] = w2
            del vals[-1], wts[-1], starts[-1]
    block = np.zeros(rates.size, dtype=np.intp)
    for k, s in enumerate(starts):
        block[s:] = k
    return block


def _bin_stats(x: np.ndarray, y: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per bin of ``edges``: count, events, mean score; empty bins are merged into their left neighbour."""
    idx = np.searchsorted(edges, x, side="right")
    nb = edges.size + 1
    counts = np.bincount(idx, minlength=nb).astype(np.float64)
    keep = np.flatnonzero(counts > 0)
    edges = edges[keep[1:] - 1]
    idx = np.searchsorted(edges, x, side="right")
    nb = edges.size + 1
    counts = np.bincount(idx, minlength=nb).astype(np.float64)
    events = np.bincount(idx, weights=y, minlength=nb)
    means = np.bincount(idx, weights=x, minlength=nb) / counts
    return edges, counts, events, means


@dataclass
class Calibration:
    """P(event | score) from a labelled reference, in bounded size (see the module docstring).

    Attributes:
        score: ``confidence`` or ``positive_probability``.
        method: ``isotonic`` or ``binned``.
        edges: inner edges of the fine bins (a value's bin is ``searchsorted(edges, v, side="right")``).
        counts: reference records per fine bin (all > 0).
        events: of those, the events (right predictions, or positive labels).
        means: mean reference score per fine bin.
    """

    score: str
    method: str
    edges: np.ndarray
    counts: np.ndarray
    events: np.ndarray
    means: np.ndarray
    #: fine bin -> block of the fit, and the calibrated probability of each fine bin
    block: np.ndarray = field(init=False, repr=False)
    values: np.ndarray = field(init=False, repr=False)
    #: reference records per block, and the variance of each block's rate
    block_counts: np.ndarray = field(init=False, repr=False)
    block_var: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rates = self.events / self.counts
        self.block = _pav(rates, self.counts) if self.method == "isotonic" else np.arange(rates.size, dtype=np.intp)
        k = int(self.block.max()) + 1
        bc = np.bincount(self.block, weights=self.counts, minlength=k)
        be = np.bincount(self.block, weights=self.events, minlength=k)
        rate = be / bc
        self.block_counts = bc
        self.values = np.clip(self.means, 0.0, 1.0) if self.method == "identity" else rate[self.block]
        # A block whose rate is 0 or 1 still has an error: at least that of one event in its records.
        self.block_var = np.maximum(rate * (1 - rate), 1.0 / bc) / bc

    @property
    def n_bins(self) -> int:
        return int(self.counts.size)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Calibrated probabilities of scores ``x``."""
        return self.values[self.bin(x)]

    def bin(self, x: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.edges, x, side="right")

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, score: str, method: str | None = None) -> Calibration:
        """Fit on reference scores ``x`` and 0/1 events ``y``; ``method=None`` picks one by cross-validation."""
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        nb = max(2, min(MAX_BINS, x.size // MIN_PER_BIN))
        edges = np.unique(np.quantile(x, np.arange(1, nb) / nb))
        if method is None:
            method = min(METHODS, key=lambda m: _cv_brier(x, y, edges, score, m))
        return cls(score, method, *_bin_stats(x, y, edges))

    def to_json(self) -> dict[str, Any]:
        return {"score": self.score, "method": self.method, "edges": self.edges.tolist(),
                "counts": self.counts.astype(int).tolist(), "events": self.events.astype(int).tolist(),
                "means": self.means.tolist()}

    @classmethod
    def from_json(cls, d: Any, where: str) -> Calibration:
        if not isinstance(d, dict):
            raise ProfileError(f"{where}: must be an object")
        score, method = d.get("score"), d.get("method")
        if score not in SCORES:
            raise ProfileError(f"{where}: 'score' must be one of {SCORES}, got {score!r}")
        if method not in METHODS:
            raise ProfileError(f"{where}: 'method' must be one of {METHODS}, got {method!r}")
        edges = _floats(d, "edges", where)
        if edges.size > MAX_BINS - 1 or np.any(np.diff(edges) <= 0):
            raise ProfileError(f"{where}: 'edges' must be strictly increasing, at most {MAX_BINS - 1} of them")
        counts = _floats(d, "counts", where, edges.size + 1)
        events = _floats(d, "events", where, edges.size + 1)
        means = _floats(d, "means", where, edges.size + 1)
        if np.any(counts < 1) or np.any(events < 0) or np.any(events > counts):
            raise ProfileError(f"{where}: every bin needs 'counts' >= 1 and 0 <= 'events' <= 'counts'")
        return cls(score, method, edges, counts, events, means)


def _cv_brier(x: np.ndarray, y: np.ndarray, edges: np.ndarray, score: str, method: str) -> float:
    """Cross-validated Brier score of ``method`` on the reference (fixed seed: the choice is deterministic)."""
    fold = np.random.default_rng(0).permutation(x.size) % CV_FOLDS
    err = 0.0
    for k in range(CV_FOLDS):
        test = fold == k
        cal = Calibration(score, method, *_bin_stats(x[~test], y[~test], edges))
        err += float(np.sum((cal.predict(x[test]) - y[test]) ** 2))
    return err / x.size


def _floats(d: dict[str, Any], key: str, where: str, size: int | None = None) -> np.ndarray:
    raw = d.get(key)
    if not isinstance(raw, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw):
        raise ProfileError(f"{where}: {key!r} must be a list of numbers")
    a = np.array(raw, dtype=np.float64)
    if not np.all(np.isfinite(a)) or (size is not None and a.size != size):
        raise ProfileError(f"{where}: {key!r} must hold {size if size is not None else 'finite'} finite numbers")
    return a


# -- binary metrics ---------------------------------------------------------------------------------------------------


def confusion_metrics(tp: float, fp: float, fn: float, tn: float) -> dict[str, float | None]:
    """Accuracy, precision, recall and F1 of a (possibly expected) confusion matrix; None where undefined."""
    n = tp + fp + fn + tn
    return {"accuracy": (tp + tn) / n if n else None, "precision": tp / (tp + fp) if tp + fp > 0 else None,
            "recall": tp / (tp + fn) if tp + fn > 0 else None,
            "f1": tp / (tp + 0.5 * (fp + fn)) if tp + 0.5 * (fp + fn) > 0 else None}


def binned_auc(pos: np.ndarray, neg: np.ndarray) -> float | None:
    """ROC AUC of (expected) positives and negatives per score bin, bins in increasing score; ties count 1/2."""
    p_tot, n_tot = float(pos.sum()), float(neg.sum())
    if p_tot <= 0 or n_tot <= 0:
        return None
    above = np.concatenate([np.cumsum(pos[::-1])[::-1][1:], [0.0]])
    return float(np.sum(neg * (above + 0.5 * pos)) / (p_tot * n_tot))


def rank_auc(score: np.ndarray, positive: np.ndarray) -> float | None:
    """ROC AUC of raw scores (Mann-Whitney, ties count 1/2)."""
    from scipy.stats import rankdata

    n1 = int(positive.sum())
    n0 = positive.size - n1
    if not n1 or not n0:
        return None
    r = rankdata(score)
    return float((r[positive].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


# -- the profile's performance section --------------------------------------------------------------------------------


@dataclass
class Performance:
    """What a labelled reference says about the model: its realized accuracy and its calibration.

    Attributes:
        label: the reference's label column.
        rows: labelled reference records the calibration was fitted on.
        reference_accuracy: their realized accuracy.
        calibration: the fitted calibration.
        positive: the positive class of a binary model (None: multiclass).
        reference_binary: realized precision, recall, F1 and ROC AUC of the reference (binary only).
    """

    label: str
    rows: int
    reference_accuracy: float
    calibration: Calibration
    positive: str | None = None
    reference_binary: dict[str, float | None] | None = None
    digest: str = field(init=False, repr=False, default="")

    def __post_init__(self) -> None:
        blob = json.dumps(self.calibration.to_json(), sort_keys=True) + repr(self.positive)
        self.digest = hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def binary(self) -> bool:
        return self.positive is not None

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "rows": self.rows, "reference_accuracy": self.reference_accuracy,
                "positive_class": self.positive, "reference_binary": self.reference_binary,
                "calibration": self.calibration.to_json()}

    @classmethod
    def from_json(cls, d: Any) -> Performance:
        """Validate the profile's ``performance`` entry."""
        where = "performance"
        if not isinstance(d, dict):
            raise ProfileError(f"{where}: must be an object")
        label, rows, acc = d.get("label"), d.get("rows"), d.get("reference_accuracy")
        if not isinstance(label, str) or not label:
            raise ProfileError(f"{where}: 'label' must be the label column's name")
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < MIN_LABELLED:
            raise ProfileError(f"{where}: 'rows' must be an integer >= {MIN_LABELLED}")
        if not isinstance(acc, (int, float)) or isinstance(acc, bool) or not 0 <= acc <= 1:
            raise ProfileError(f"{where}: 'reference_accuracy' must be a number in [0, 1]")
        cal = Calibration.from_json(d.get("calibration"), f"{where}.calibration")
        positive = d.get("positive_class")
        if positive is not None and not isinstance(positive, str):
            raise ProfileError(f"{where}: 'positive_class' must be a string or null")
        if (positive is not None) != (cal.score == "positive_probability"):
            raise ProfileError(f"{where}: a binary calibration (score 'positive_probability') needs 'positive_class'")
        rb = d.get("reference_binary")
        if positive is not None:
            if not isinstance(rb, dict) or set(rb) != {"precision", "recall", "f1", "roc_auc"} or not all(
                    v is None or (isinstance(v, (int, float)) and 0 <= v <= 1) for v in rb.values()):
                raise ProfileError(f"{where}: 'reference_binary' must map precision, recall, f1, roc_auc to [0, 1]")
        elif rb is not None:
            raise ProfileError(f"{where}: 'reference_binary' is only for a binary model")
        return cls(label=label, rows=rows, reference_accuracy=float(acc), calibration=cal, positive=positive,
                   reference_binary=rb)


def fit(predictions: Sequence[Any], confidences: np.ndarray, labels: Sequence[Any], *, label: str,
        positive: str | None = None, method: str | None = None) -> Performance:
    """Fit the performance section of a profile from a labelled reference.

    Args:
        predictions: the model's predictions (classes).
        confidences: the confidence of each predicted class.
        labels: the ground truth (None/NaN where unknown: those records are left out).
        label: the label column's name (recorded in the profile).
        positive: the positive class of a binary model; by default ``1`` or ``true`` when the labels are
            exactly those two classes, else the last class in sorted order.
        method: ``isotonic`` or ``binned``; None chooses by cross-validation.

    Raises:
        ProfileError: too few labelled records, or a positive class the labels do not have.
    """
    preds = [canon(p) for p in predictions]
    labs = [canon(v) for v in labels]
    conf = np.asarray(confidences, dtype=np.float64)
    keep = np.array([p is not None and v is not None for p, v in zip(preds, labs, strict=True)], dtype=bool)
    keep &= np.isfinite(conf)
    n = int(keep.sum())
    if n < MIN_LABELLED:
        raise ProfileError(f"label column {label!r}: {n} reference records have a prediction, a confidence and a "
                           f"label; a calibration needs at least {MIN_LABELLED}")
    idx = np.flatnonzero(keep)
    p = np.array([preds[i] for i in idx], dtype=object)
    y = np.array([labs[i] for i in idx], dtype=object)
    x = conf[idx]
    correct = p == y
    acc = float(correct.mean())
    classes = sorted(set(y.tolist()))
    binary = len(classes) == 2 and set(p.tolist()) <= set(classes)
    if positive is not None and not binary:
        raise ProfileError(f"--positive-class {positive!r}: binary metrics need exactly two label classes with every "
                           f"prediction among them (labels: {', '.join(classes[:10])})")
    if not binary:
        return Performance(label=label, rows=n, reference_accuracy=acc,
                           calibration=Calibration.fit(x, correct, "confidence", method))
    if positive is None:
        positive = next((c for c in ("1", "true") if c in classes and len(classes) == 2), classes[-1])
    elif positive not in classes:
        raise ProfileError(f"--positive-class {positive!r} is not one of the label classes {classes}")
    if np.any((x < 0) | (x > 1)):
        raise ProfileError("binary metrics need the confidence as a probability in [0, 1]")
    is_pos = p == positive
    score = np.where(is_pos, x, 1.0 - x)
    event = y == positive
    tp = float(np.sum(is_pos & event))
    fp = float(np.sum(is_pos & ~event))
    fn = float(np.sum(~is_pos & event))
    m = confusion_metrics(tp, fp, fn, n - tp - fp - fn)
    rb = {"precision": m["precision"], "recall": m["recall"], "f1": m["f1"], "roc_auc": rank_auc(score, event)}
    return Performance(label=label, rows=n, reference_accuracy=acc, positive=positive, reference_binary=rb,
                       calibration=Calibration.fit(score, event, "positive_probability", method))


# -- the streaming window ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """The estimate of one window: accuracy with its 95% interval, and the binary metrics where they apply."""

    rows: int
    accuracy: float
    lower: float
    upper: float
    precision: float | None = None
    recall: float | None = None
    f1: float | None = None
    roc_auc: float | None = None


class PerformanceWindow:
    """The calibrated estimate over a ring of sub-windows (a detector: ``update``, then read-only results).

    It counts records per calibration bin (and per predicted class, positive or not, for a binary model) in
    each sub-window; the estimate weighs each bin's calibrated probability by its count.

    Args:
        perf: the reference profile's performance section.
        subwindows: sub-windows in the ring.
    """

    __slots__ = ("_perf", "_n", "_slot")

    RESULTS = ("rows", "estimate")

    def __init__(self, perf: Performance, subwindows: int) -> None:
        self._perf = perf
        self._n = np.zeros((subwindows, 2 if perf.binary else 1, perf.calibration.n_bins), dtype=np.int32)
        self._slot = 0

    def update(self, predictions: Sequence[Any], confidences: np.ndarray) -> None:
        """Add records' predictions and confidences (one per record; None / NaN are skipped)."""
        perf = self._perf
        x = np.asarray(confidences, dtype=np.float64)
        ok = np.isfinite(x) & np.fromiter((v is not None for v in predictions), dtype=bool, count=x.size)
        nb = perf.calibration.n_bins
        if perf.binary:
            pos = perf.positive
            # canon(): a class sent as 1.0 by the wire format is the reference's "1".
            is_pos = np.fromiter((v == pos if type(v) is str else canon(v) == pos for v in predictions),
                                 dtype=bool, count=x.size)[ok]
            x = x[ok]
            flat = is_pos * nb + perf.calibration.bin(np.where(is_pos, x, 1.0 - x))
        else:
            flat = perf.calibration.bin(x[ok])
        g = self._n.shape[1]
        self._n[self._slot] += np.bincount(flat, minlength=g * nb).reshape(g, nb).astype(np.int32)

    def rotate(self) -> None:
        """Start the next sub-window, forgetting the oldest one."""
        self._slot = s = (self._slot + 1) % self._n.shape[0]
        self._n[s] = 0

    # -- results ------------------------------------------------------------------------------------------------------

    @property
    def performance(self) -> Performance:
        return self._perf

    @property
    def rows(self) -> int:
        """Records in the window with a prediction and a confidence."""
        return int(self._n.sum())

    @property
    def estimate(self) -> Estimate | None:
        """The window's estimate, or None while it is empty."""
        n = self._n.sum(axis=0, dtype=np.int64).astype(np.float64)
        total = float(n.sum())
        if total <= 0:
            return None
        cal = self._perf.calibration
        v = cal.values
        per_bin = n.sum(axis=0)
        w = np.bincount(cal.block, weights=per_bin, minlength=cal.block_counts.size) / total
        sd = math.sqrt(float(np.dot(per_bin, v * (1 - v))) / total**2 + float(np.dot(w * w, cal.block_var)))
        if not self._perf.binary:
            acc = float(np.dot(n[0], v)) / total
            return Estimate(rows=int(total), accuracy=acc, lower=max(0.0, acc - Z95 * sd), upper=min(1.0, acc + Z95 * sd))
        tp, fn = float(np.dot(n[1], v)), float(np.dot(n[0], v))
        fp, tn = float(n[1].sum()) - tp, float(n[0].sum()) - fn
        m = confusion_metrics(tp, fp, fn, tn)
        acc = float(m["accuracy"] or 0.0)
        return Estimate(rows=int(total), accuracy=acc, lower=max(0.0, acc - Z95 * sd), upper=min(1.0, acc + Z95 * sd),
                        precision=m["precision"], recall=m["recall"], f1=m["f1"],
                        roc_auc=binned_auc(per_bin * v, per_bin * (1 - v)))

    @property
    def nbytes(self) -> int:
        """Bytes held, the calibration included."""
        c = self._perf.calibration
        ref = c.edges.nbytes + c.counts.nbytes + c.events.nbytes + c.means.nbytes + c.block.nbytes + c.values.nbytes
        return self._n.nbytes + ref + c.block_counts.nbytes + c.block_var.nbytes

    # -- state --------------------------------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """Plain-JSON state; ``from_state`` with the same calibration continues where this window was."""
        return {"calibration": self._perf.digest, "slot": self._slot, "n": self._n.tolist()}

    @classmethod
    def from_state(cls, state: dict[str, Any], perf: Performance) -> Self:
        """Rebuild a window from ``to_state()`` against ``perf``.

        Raises:
            ValueError: the state was built with another calibration, or is malformed.
        """
        if state.get("calibration") != perf.digest:
            raise ValueError("the performance window was built with another calibration")
        n = state.get("n")
        subwindows = len(n) if isinstance(n, list) else 0
        if subwindows < 1:
            raise ValueError("array n must list one sub-window at least")
        win = cls(perf, subwindows)
        win._n = state_array(state, "n", np.int32, win._n.shape)
        slot = state.get("slot")
        if not isinstance(slot, int) or not 0 <= slot < subwindows:
            raise ValueError("ring position out of range")
        win._slot = slot
        return win


# -- reporting --------------------------------------------------------------------------------------------------------


def report(win: PerformanceWindow | None, mean_confidence: float | None, rows: int) -> dict[str, Any]:
    """The ``performance`` object of ``drift compare --json`` and ``/v1/status``.

    Args:
        win: the calibrated window, or None when the reference has no labels.
        mean_confidence: the window's mean confidence (the uncalibrated fallback).
        rows: records with a confidence, for the fallback.
    """
    if win is None:
        return {"calibrated": False, "method": "mean_confidence", "estimated_accuracy": mean_confidence,
                "estimated_accuracy_interval": None, "reference_accuracy": None, "rows": rows,
                "note": UNCALIBRATED_NOTE}
    perf = win.performance
    est = win.estimate
    out: dict[str, Any] = {
        "calibrated": True, "method": perf.calibration.method, "label": perf.label,
        "estimated_accuracy": est.accuracy if est else None,
        "estimated_accuracy_interval": [est.lower, est.upper] if est else None,
        "reference_accuracy": perf.reference_accuracy, "reference_rows": perf.rows, "rows": win.rows,
    }
    if perf.binary:
        out["positive_class"] = perf.positive
        for k in ("precision", "recall", "f1", "roc_auc"):
            out[f"estimated_{k}"] = getattr(est, k) if est else None
            out[f"reference_{k}"] = (perf.reference_binary or {}).get(k)
    return out


def export(win: PerformanceWindow, out: Samples, mv: tuple[str, str]) -> None:
    """Put the window's calibrated estimate into a metrics snapshot (see :mod:`.snapshot`)."""
    perf = win.performance
    out.put(dm.DRIFT_REFERENCE_ACCURACY_RATIO, mv, perf.reference_accuracy)
    out.put(dm.DRIFT_ESTIMATED_ACCURACY_CALIBRATED, mv, 1.0)
    if perf.binary:
        for k, v in (perf.reference_binary or {}).items():
            out.put(dm.DRIFT_REFERENCE_BINARY_METRIC_RATIO, (*mv, k), v)
    est = win.estimate
    if est is None:
        return
    out.put(dm.DRIFT_ESTIMATED_ACCURACY_RATIO, mv, est.accuracy)
    out.put(dm.DRIFT_ESTIMATED_ACCURACY_BOUND_RATIO, (*mv, "lower"), est.lower)
    out.put(dm.DRIFT_ESTIMATED_ACCURACY_BOUND_RATIO, (*mv, "upper"), est.upper)
    if perf.binary:
        for k in ("precision", "recall", "f1", "roc_auc"):
            out.put(dm.DRIFT_ESTIMATED_BINARY_METRIC_RATIO, (*mv, k), getattr(est, k))

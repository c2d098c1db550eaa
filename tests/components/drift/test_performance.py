"""The calibrated label-free performance estimate: calibration, interval, window, profile, sidecar export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from inferwatch_sidecar.components.drift import performance as pf
from inferwatch_sidecar.components.drift import profile as prof
from inferwatch_sidecar.components.drift.component import build
from inferwatch_sidecar.components.drift.config import DriftConfig
from inferwatch_sidecar.components.drift.monitor import Monitor
from tests.components.drift.helpers import context, rec, samples

CLASSES = [str(c) for c in range(5)]


def multiclass(rng: np.random.Generator, conf: np.ndarray, curve) -> tuple[list[str], list[str], np.ndarray]:
    """Predictions among 5 classes, right with probability ``curve(conf)``; returns (preds, labels, P(right))."""
    p_right = curve(conf)
    preds = [CLASSES[i] for i in rng.integers(0, 5, conf.size)]
    right = rng.random(conf.size) < p_right
    labels = [p if r else CLASSES[(int(p) + 1) % 5] for p, r in zip(preds, right, strict=True)]
    return preds, labels, p_right


def random_curve(rng: np.random.Generator, monotone: bool):
    """A random miscalibration: P(right | confidence), monotone (power law) or with a random bump."""
    lo, hi, gamma = rng.uniform(0.2, 0.5), rng.uniform(0.8, 1.0), rng.uniform(0.5, 4.0)
    if monotone:
        return lambda c: lo + (hi - lo) * ((c - 0.2) / 0.8) ** gamma
    amp, freq, phase = rng.uniform(0.1, 0.2), rng.uniform(4, 10), rng.uniform(0, 2 * np.pi)
    return lambda c: np.clip(0.3 + 0.5 * (c - 0.2) / 0.8 + amp * np.sin(freq * c + phase), 0.02, 0.98)


def window_estimate(perf: pf.Performance, preds: list[str], conf: np.ndarray) -> pf.Estimate:
    win = pf.PerformanceWindow(perf, 4)
    win.update(preds, conf)
    est = win.estimate
    assert est is not None
    return est


@pytest.mark.parametrize("monotone", [True, False], ids=["monotone", "non_monotone"])
def test_calibration_recovers_random_miscalibration_curves_under_shift(monotone: bool) -> None:
    # 12 curves drawn at random; the reference's confidences lean high, each window's lean low (covariate
    # shift). Tolerance against the window's expected accuracy (the mean of the true curve over its records):
    # 0.02 monotone, 0.035 with a bump (a fit of 20k records cannot follow every wiggle).
    tol = 0.02 if monotone else 0.035
    errors, mean_conf_errors = [], []
    for seed in range(12):
        rng = np.random.default_rng(seed)
        curve = random_curve(rng, monotone)
        ref_conf = 0.2 + 0.8 * rng.beta(3, 1.5, 20_000)
        preds, labels, _ = multiclass(rng, ref_conf, curve)
        perf = pf.fit(preds, ref_conf, labels, label="y")
        assert perf.positive is None and perf.calibration.n_bins <= pf.MAX_BINS
        cur_conf = 0.2 + 0.8 * rng.beta(1.5, 2.5, 5000)
        cpred, _, p_right = multiclass(rng, cur_conf, curve)
        est = window_estimate(perf, cpred, cur_conf)
        errors.append(abs(est.accuracy - p_right.mean()))
        mean_conf_errors.append(abs(cur_conf.mean() - p_right.mean()))
    assert max(errors) <= tol, errors
    assert max(errors) < max(mean_conf_errors) / 3


def test_cross_validation_prefers_binned_for_a_strong_bump_and_isotonic_for_a_monotone_curve() -> None:
    rng = np.random.default_rng(3)
    conf = rng.uniform(0.2, 1.0, 20_000)
    p, lab, _ = multiclass(rng, conf, lambda c: 0.5 + 0.4 * np.sin(8 * c))
    assert pf.fit(p, conf, lab, label="y").calibration.method == "binned"
    p, lab, _ = multiclass(rng, conf, lambda c: 0.1 + 0.85 * (c - 0.2) / 0.8)
    assert pf.fit(p, conf, lab, label="y").calibration.method in ("isotonic", "identity")


def test_estimate_on_the_reference_itself_is_its_realized_accuracy() -> None:
    rng = np.random.default_rng(5)
    conf = rng.uniform(0.2, 1.0, 5000)
    preds, labels, _ = multiclass(rng, conf, lambda c: c**2)
    for method in ("isotonic", "binned"):
        perf = pf.fit(preds, conf, labels, label="y", method=method)
        realized = np.mean(np.array(preds) == np.array(labels))
        assert perf.reference_accuracy == pytest.approx(realized)
        assert window_estimate(perf, preds, conf).accuracy == pytest.approx(realized, abs=1e-12)


def test_binary_metrics_follow_the_expected_confusion_matrix() -> None:
    rng = np.random.default_rng(7)

    def draw(n: int, a: float, b: float):
        p_model = rng.beta(a, b, n)  # the model's positive-class probability
        p_true = np.clip(0.5 + 1.6 * (p_model - 0.5) ** 3 + 0.4 * (p_model - 0.5), 0, 1)  # overconfident
        y = (rng.random(n) < p_true).astype(int)
        pred = (p_model >= 0.5).astype(int)
        conf = np.where(pred == 1, p_model, 1 - p_model)
        return pred, conf, y, p_true

    pred, conf, y, _ = draw(30_000, 0.6, 0.6)
    perf = pf.fit(pred.tolist(), conf, y.tolist(), label="y")
    assert perf.positive == "1"
    from sklearn.metrics import f1_score, precision_score, recall_score, roc_auc_score

    rb = perf.reference_binary
    assert rb["precision"] == pytest.approx(precision_score(y, pred))
    assert rb["recall"] == pytest.approx(recall_score(y, pred))
    assert rb["f1"] == pytest.approx(f1_score(y, pred))
    assert rb["roc_auc"] == pytest.approx(roc_auc_score(y, np.where(pred == 1, conf, 1 - conf)))
    # A shifted window: the expected confusion matrix from the true probabilities is what the estimate targets.
    cpred, cconf, _, p_true = draw(8000, 1.5, 0.8)
    est = window_estimate(perf, [float(v) for v in cpred], cconf)  # wire-format floats are the class "1"
    tp, fp = p_true[cpred == 1].sum(), (1 - p_true[cpred == 1]).sum()
    fn, tn = p_true[cpred == 0].sum(), (1 - p_true[cpred == 0]).sum()
    assert est.accuracy == pytest.approx((tp + tn) / cpred.size, abs=0.015)
    assert est.precision == pytest.approx(tp / (tp + fp), abs=0.015)
    assert est.recall == pytest.approx(tp / (tp + fn), abs=0.02)
    assert est.f1 == pytest.approx(tp / (tp + 0.5 * (fp + fn)), abs=0.015)
    # Expected AUC: pairs (positive, negative) weighted by the true probabilities, ordered by the model's score.
    score = np.where(cpred == 1, cconf, 1 - cconf)
    order = np.argsort(score)
    pos, neg = p_true[order], 1 - p_true[order]
    auc = float(np.sum(neg * (np.cumsum(pos[::-1])[::-1] - 0.5 * pos)) / (pos.sum() * neg.sum()))
    assert est.roc_auc == pytest.approx(auc, abs=0.01)


def test_real_data_digits_with_an_overconfident_model() -> None:
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    d = load_digits()
    idx = np.random.default_rng(0).permutation(d.target.size)
    tr, ref, te = idx[:700], idx[700:1250], idx[1250:]
    # Nearly unregularized on raw pixels: overconfident (mean confidence above its accuracy).
    m = LogisticRegression(C=100.0, max_iter=300).fit(d.data[tr] / 16, d.target[tr])
    pr = m.predict_proba(d.data[ref])
    perf = pf.fit(pr.argmax(axis=1).tolist(), pr.max(axis=1), d.target[ref].tolist(), label="digit")
    # The hardest third of the test digits (least ink): the model is right less often there.
    ink = d.data[te].sum(axis=1)
    seg = te[ink <= np.quantile(ink, 1 / 3)]
    pt = m.predict_proba(d.data[seg])
    realized = float(np.mean(pt.argmax(axis=1) == d.target[seg]))
    est = window_estimate(perf, pt.argmax(axis=1).tolist(), pt.max(axis=1))
    # 182 records: the realized accuracy itself has a standard deviation of about 0.015.
    assert abs(est.accuracy - realized) <= 0.04
    assert est.lower <= realized <= est.upper
    assert abs(pt.max(axis=1).mean() - realized) > abs(est.accuracy - realized)


def test_interval_covers_the_realized_accuracy_about_95_percent_of_the_time() -> None:
    covered = 0
    reps = 300
    for seed in range(reps):
        rng = np.random.default_rng(1000 + seed)
        ref_conf = rng.uniform(0.2, 1.0, 3000)
        preds, labels, _ = multiclass(rng, ref_conf, lambda c: 0.2 + 0.7 * c**2)
        perf = pf.fit(preds, ref_conf, labels, label="y", method="isotonic")
        cur_conf = 0.2 + 0.8 * rng.beta(1.2, 2.0, 400)
        cpred, clab, _ = multiclass(rng, cur_conf, lambda c: 0.2 + 0.7 * c**2)
        est = window_estimate(perf, cpred, cur_conf)
        realized = np.mean(np.array(cpred) == np.array(clab))
        covered += est.lower <= realized <= est.upper
    assert 0.90 * reps <= covered <= 0.99 * reps, covered


def test_window_slides_and_round_trips_its_state() -> None:
    rng = np.random.default_rng(2)
    conf = rng.uniform(0.2, 1.0, 4000)
    preds, labels, _ = multiclass(rng, conf, lambda c: c)
    perf = pf.fit(preds, conf, labels, label="y")
    win = pf.PerformanceWindow(perf, 2)
    win.update(preds[:1000], np.full(1000, 0.99))
    win.rotate()
    win.update(preds[:500], np.full(500, 0.25))
    high, low = perf.calibration.predict(np.array([0.99, 0.25]))
    assert win.rows == 1500
    assert win.estimate.accuracy == pytest.approx((1000 * high + 500 * low) / 1500)
    state = json.loads(json.dumps(win.to_state()))
    back = pf.PerformanceWindow.from_state(state, perf)
    assert back.estimate == win.estimate
    win.rotate()  # forgets the first sub-window
    assert win.rows == 500 and win.estimate.accuracy == pytest.approx(low)
    other = pf.fit(preds, conf, [p if i % 2 else "x" for i, p in enumerate(labels)], label="y")
    with pytest.raises(ValueError, match="another calibration"):
        pf.PerformanceWindow.from_state(state, other)
    assert pf.PerformanceWindow(perf, 10).estimate is None


def test_profile_keeps_the_calibration_and_rejects_a_bad_one(tmp_path) -> None:
    rng = np.random.default_rng(4)
    conf = rng.uniform(0.5, 1.0, 2000)
    pred = (rng.random(2000) < 0.5).astype(int)
    y = np.where(rng.random(2000) < conf, pred, 1 - pred)
    p = prof.build({"conf": conf}, {"pred": pred.tolist()}, prediction="pred", confidence="conf")
    p.performance = pf.fit(pred.tolist(), conf, y.tolist(), label="y")
    path = str(tmp_path / "p.json")
    p.save(path)
    back = prof.load(path)
    assert back.performance is not None and back.performance.to_json() == p.performance.to_json()
    assert back.performance.digest == p.performance.digest
    doc = json.loads(Path(path).read_text())
    doc["performance"]["calibration"]["events"][0] = 10**6
    with pytest.raises(prof.ProfileError, match="'events' <= 'counts'"):
        prof.from_json(doc)
    doc = json.loads(Path(path).read_text())
    doc["performance"]["positive_class"] = None
    with pytest.raises(prof.ProfileError, match="needs 'positive_class'"):
        prof.from_json(doc)
    with pytest.raises(prof.ProfileError, match="at least 100"):
        pf.fit(pred[:50].tolist(), conf[:50], y[:50].tolist(), label="y")
    with pytest.raises(prof.ProfileError, match="not one of the label classes"):
        pf.fit(pred.tolist(), conf, y.tolist(), label="y", positive="yes")


def labelled_profile(tmp_path, with_labels: bool = True) -> tuple[str, pf.Performance | None]:
    rng = np.random.default_rng(8)
    conf = rng.uniform(0.2, 1.0, 5000)
    preds, labels, _ = multiclass(rng, conf, lambda c: c**2)
    p = prof.build({"conf": conf}, {"pred": preds}, prediction="pred", confidence="conf")
    if with_labels:
        p.performance = pf.fit(preds, conf, labels, label="y")
    path = str(tmp_path / "p.json")
    p.save(path)
    return path, p.performance


def test_sidecar_exports_the_calibrated_estimate_its_interval_and_the_reference(tmp_path) -> None:
    path, perf = labelled_profile(tmp_path)
    comp = build(DriftConfig(reference=path, window_events=5000), context())
    rng = np.random.default_rng(9)
    conf = rng.uniform(0.2, 0.6, 2000)  # low-confidence traffic
    preds = [CLASSES[i] for i in rng.integers(0, 5, 2000)]
    comp.handle(1, 1, [rec("m", "v1", None, pred=p, conf=float(c)) for p, c in zip(preds, conf, strict=True)])
    comp.drain()
    comp.evaluate()
    s = samples(comp.collect())
    mv = (("model", "m"), ("model_version", "v1"))
    want = window_estimate(perf, preds, conf)
    assert s[("inferwatch_drift_estimated_accuracy_ratio", mv)] == pytest.approx(want.accuracy)
    assert s[("inferwatch_drift_estimated_accuracy_calibrated", mv)] == 1.0
    assert s[("inferwatch_drift_reference_accuracy_ratio", mv)] == pytest.approx(perf.reference_accuracy)
    assert s[("inferwatch_drift_estimated_accuracy_bound_ratio", (("bound", "lower"), *mv))] == pytest.approx(want.lower)
    assert s[("inferwatch_drift_estimated_accuracy_bound_ratio", (("bound", "upper"), *mv))] == pytest.approx(want.upper)
    # Mean confidence (0.4) would be far off the calibrated estimate (about 0.4^2 = 0.16 + ...).
    assert want.accuracy < 0.25
    st = comp.status()["models"][0]["performance"]
    assert st["calibrated"] and st["method"] == perf.calibration.method and st["rows"] == 2000
    assert st["estimated_accuracy"] == pytest.approx(want.accuracy)
    # The checkpointed monitor resumes the estimate.
    mon = comp.monitors[("m", "v1")]
    again = Monitor.from_state(json.loads(json.dumps(mon.to_state())), comp.cfg, comp.profile)
    assert again.perf is not None and again.perf.estimate == mon.perf.estimate


def test_without_labels_the_estimate_is_mean_confidence_marked_uncalibrated(tmp_path) -> None:
    path, _ = labelled_profile(tmp_path, with_labels=False)
    comp = build(DriftConfig(reference=path, window_events=5000), context())
    conf = np.random.default_rng(1).uniform(0.2, 0.6, 1000)
    comp.handle(1, 1, [rec("m", "v1", None, pred="1", conf=float(c)) for c in conf])
    comp.drain()
    comp.evaluate()
    s = samples(comp.collect())
    mv = (("model", "m"), ("model_version", "v1"))
    assert s[("inferwatch_drift_estimated_accuracy_ratio", mv)] == pytest.approx(conf.mean(), rel=1e-5)
    assert s[("inferwatch_drift_estimated_accuracy_calibrated", mv)] == 0.0
    assert ("inferwatch_drift_reference_accuracy_ratio", mv) not in s
    st = comp.status()["models"][0]["performance"]
    assert st["calibrated"] is False and st["method"] == "mean_confidence"
    assert "--label" in st["note"] and st["estimated_accuracy"] == pytest.approx(conf.mean(), rel=1e-5)

"""`reference build --label` and `drift compare --label --json`: the calibrated performance object."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from inferwatch_sidecar.cli import main
from inferwatch_sidecar.components.drift import performance as pf
from inferwatch_sidecar.components.drift import profile as prof


def write(path, n: int, seed: int, low: bool, labels: bool) -> tuple[list[int], np.ndarray, np.ndarray]:
    """An overconfident binary model: confidence c of the predicted class, right with probability 0.5 + 2 (c - 0.5)^2."""
    rng = np.random.default_rng(seed)
    conf = 0.5 + 0.5 * (rng.beta(1.2, 2.0, n) if low else rng.beta(3.0, 1.0, n))
    pred = rng.integers(0, 2, n)
    y = np.where(rng.random(n) < 0.5 + 2 * (conf - 0.5) ** 2, pred, 1 - pred)
    x = rng.normal(0, 1, n)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["x", "pred", "conf", *(["y"] if labels else [])])
        for i in range(n):
            w.writerow([repr(float(x[i])), int(pred[i]), repr(float(conf[i])), *([int(y[i])] if labels else [])])
    return pred.tolist(), conf, y


def run_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_compare_with_label_adds_the_calibrated_performance_object(tmp_path, capsys) -> None:
    ref, cur = str(tmp_path / "ref.csv"), str(tmp_path / "cur.csv")
    rpred, rconf, ry = write(ref, 4000, 1, low=False, labels=True)
    cpred, cconf, cy = write(cur, 3000, 2, low=True, labels=False)
    out = run_json(capsys, "drift", "compare", "--reference", ref, "--current", cur, "--prediction", "pred",
                   "--confidence", "conf", "--label", "y", "--json")
    perf = out["performance"]
    assert set(perf) == {"calibrated", "method", "label", "estimated_accuracy", "estimated_accuracy_interval",
                         "reference_accuracy", "reference_rows", "rows", "positive_class",
                         *(f"{w}_{k}" for w in ("estimated", "reference") for k in ("precision", "recall", "f1",
                                                                                        "roc_auc"))}
    want = pf.fit(rpred, rconf, ry.tolist(), label="y")
    win = pf.PerformanceWindow(want, 1)
    win.update(cpred, cconf)
    assert perf["calibrated"] is True and perf["method"] == want.calibration.method and perf["label"] == "y"
    assert perf["estimated_accuracy"] == pytest.approx(win.estimate.accuracy)
    assert perf["estimated_accuracy_interval"] == pytest.approx([win.estimate.lower, win.estimate.upper])
    assert perf["reference_accuracy"] == pytest.approx(np.mean(np.array(rpred) == ry))
    assert perf["rows"] == 3000 and perf["reference_rows"] == 4000 and perf["positive_class"] == "1"
    # The truth of the shifted file (its labels were not written): the calibrated estimate is near it, the
    # mean confidence is not.
    truth = float(np.mean(np.array(cpred) == cy))
    assert abs(perf["estimated_accuracy"] - truth) < 0.03 < abs(cconf.mean() - truth)
    # The label is not a monitored column: live traffic has none.
    assert [f["feature"] for f in out["features"]] == ["x", "pred", "conf"]


def test_reference_build_with_label_stores_the_calibration_and_compare_uses_it(tmp_path, capsys) -> None:
    ref, cur, p = str(tmp_path / "ref.csv"), str(tmp_path / "cur.csv"), str(tmp_path / "p.json")
    write(ref, 2000, 3, low=False, labels=True)
    write(cur, 1000, 4, low=True, labels=False)
    assert main(["reference", "build", ref, "-o", p, "--prediction", "pred", "--confidence", "conf", "--label",
                 "y"]) == 0
    assert "calibration:" in capsys.readouterr().err
    profile = prof.load(p)
    assert "y" not in profile.columns and profile.performance is not None and profile.performance.label == "y"
    a = run_json(capsys, "drift", "compare", "--profile", p, "--current", cur, "--json")["performance"]
    b = run_json(capsys, "drift", "compare", "--reference", ref, "--current", cur, "--prediction", "pred",
                 "--confidence", "conf", "--label", "y", "--json")["performance"]
    assert a == b


def test_without_label_compare_says_the_estimate_is_uncalibrated(tmp_path, capsys) -> None:
    ref, cur = str(tmp_path / "ref.csv"), str(tmp_path / "cur.csv")
    write(ref, 500, 5, low=False, labels=False)
    _, cconf, _ = write(cur, 500, 6, low=True, labels=False)
    perf = run_json(capsys, "drift", "compare", "--reference", ref, "--current", cur, "--prediction", "pred",
                    "--confidence", "conf", "--json")["performance"]
    assert perf["calibrated"] is False and perf["method"] == "mean_confidence"
    assert perf["estimated_accuracy"] == pytest.approx(cconf.mean())
    assert perf["estimated_accuracy_interval"] is None and perf["reference_accuracy"] is None
    assert "--label" in perf["note"]
    assert main(["drift", "compare", "--reference", ref, "--current", cur, "--prediction", "pred", "--confidence",
                 "conf"]) == 0
    assert "uncalibrated" in capsys.readouterr().out


def test_label_errors_say_what_to_fix(tmp_path, capsys) -> None:
    ref, cur = str(tmp_path / "ref.csv"), str(tmp_path / "cur.csv")
    write(ref, 300, 7, low=False, labels=True)
    write(cur, 300, 8, low=True, labels=False)
    assert main(["reference", "build", ref, "-o", str(tmp_path / "p.json"), "--label", "y"]) == 2
    assert "--label needs --prediction and --confidence" in capsys.readouterr().err
    assert main(["drift", "compare", "--reference", ref, "--current", cur, "--prediction", "pred", "--confidence",
                 "conf", "--label", "nope"]) == 2
    assert "column 'nope' not found" in capsys.readouterr().err
    assert main(["reference", "build", ref, "-o", str(tmp_path / "p.json"), "--prediction", "pred", "--confidence",
                 "conf", "--label", "y", "--positive-class", "7"]) == 2
    assert "not one of the label classes" in capsys.readouterr().err

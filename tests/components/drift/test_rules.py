"""alerts/drift.rules.yml computes the engine's PSI and chi-square over all replicas (promtool test rules)."""

from __future__ import annotations

import math
import subprocess

import numpy as np
import pytest
import yaml

from inferwatch_sidecar.components.drift import profile as prof
from inferwatch_sidecar.stats import hypothesis as stats
from inferwatch_sidecar.stats.columns import NumericColumn
from tests.helpers.paths import REPO

TO = 1e-9
RULES = REPO / "alerts" / "drift.rules.yml"


def _per_minute_counts(p: prof.Profile, rng: np.random.Generator, shift: float) -> dict[str, np.ndarray]:
    """Exported bin increments per minute of one replica, binned exactly as the sidecar bins them."""
    x = p.columns["x"]
    vals = rng.normal(shift, 1, 300)
    num = np.bincount(x.psi_map[np.searchsorted(x.edges, vals, side="right")], minlength=x.n_psi_bins)
    c = p.columns["color"]
    cats = rng.choice(["red", "green", "blue"], 200, p=[0.2, 0.3, 0.5])  # "yellow" never appears: a zero bin
    cat = np.array([int(np.sum(cats == k)) for k in c.categories] + [0])
    return {"x": num, "color": cat}


def test_recording_rules_equal_the_engine_on_fleet_counts(tmp_path, promtool: str) -> None:
    rng = np.random.default_rng(0)
    p = prof.build({"x": rng.normal(size=5000)},
                   {"color": ["red"] * 400 + ["green"] * 350 + ["blue"] * 200 + ["yellow"] * 50}, top_k=4)
    # The reference has no "other" values: a zero reference proportion (the 1e-4 rule applies).
    replicas = {"a:9464": _per_minute_counts(p, rng, 0.3), "b:9464": _per_minute_counts(p, rng, 0.5)}
    series = []
    for inst, per in replicas.items():
        for feat, inc in per.items():
            col = p.columns[feat]
            ref = np.bincount(col.psi_map, weights=col.counts, minlength=col.n_psi_bins) \
                if isinstance(col, NumericColumn) else col.counts
            ref = ref / ref.sum()
            for b, n in enumerate(inc.tolist()):
                lab = f'model="m", model_version="v1", feature="{feat}", bin="{b}", instance="{inst}"'
                series.append({"series": f"inferwatch_drift_bin_events_total{{{lab}}}",
                               "values": f"{1000 + 7 * b}+{n}x30"})
                series.append({"series": f"inferwatch_drift_reference_bin_ratio{{{lab}}}",
                               "values": f"{float(ref[b])!r}x30"})
    expected = []
    for feat in ("x", "color"):
        counts = 10 * sum(per[feat] for per in replicas.values())  # increase over 10 minutes, all replicas
        col = p.columns[feat]
        ref = np.bincount(col.psi_map, weights=col.counts, minlength=col.n_psi_bins) \
            if isinstance(col, NumericColumn) else col.counts
        rp = ref / ref.sum()
        lab = f'model="m", model_version="v1", feature="{feat}"'
        expected.append(("model_feature:inferwatch_drift_psi:10m", feat, lab,
                         stats.psi(rp, stats.proportions(counts))))
        expected.append(("model_feature:inferwatch_drift_chi2:10m", feat, lab, stats.chi2_goodness_of_fit(counts, rp)))
    assert any(v == 0 for per in replicas.values() for v in per["color"])  # the zero-count bin is exercised
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [
                # promtool compares floats exactly; both sides are rounded the same way (as PromQL round() does,
                # Python share IEEE arithmetic), so this asserts agreement to 1e-9.
                {"expr": f'round({name}{{feature="{feat}"}}, {TO})', "eval_time": "20m",
                 "exp_samples": [{"labels": f"{{{lab}}}", "value": math.floor(float(value) * (1.0 / TO) + 0.5) / (1.0 / TO)}]}
                for name, feat, lab, value in expected
            ] + [{"expr": "model_feature_bin:inferwatch_drift_bin_events:increase10m{feature=\"color\", bin=\"0\"}",
                  "eval_time": "20m",
                  "exp_samples": [{"labels": 'model_feature_bin:inferwatch_drift_bin_events:increase10m{model="m", '
                                             'model_version="v1", feature="color", bin="0"}',
                                   "value": float(10 * sum(per["color"][0] for per in replicas.values()))}]}],
        }],
    }
    f = tmp_path / "drift_rules_test.yml"
    f.write_text(yaml.safe_dump(test))
    out = subprocess.run([promtool, "test", "rules", str(f)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    # The fleet PSI is not the mean of the replicas' PSIs: the rules really pool the counts.
    per_replica = [stats.psi(rp, stats.proportions(per["color"])) for per in replicas.values()]
    assert expected[2][3] != pytest.approx(np.mean(per_replica))


def test_rules_file_is_valid(promtool: str) -> None:
    out = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr

"""Joint (multivariate) drift: the model, its null on random families of data, its power, and where it shows."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats as sps

from inferwatch_sidecar.aggregate.labels import LabelLimiter
from inferwatch_sidecar.cli import main
from inferwatch_sidecar.components.drift import engine, multivariate
from inferwatch_sidecar.components.drift import profile as prof
from inferwatch_sidecar.components.drift.config import DriftConfig
from inferwatch_sidecar.components.drift.monitor import Monitor
from inferwatch_sidecar.components.drift.snapshot import build_snapshot
from inferwatch_sidecar.stats import hypothesis as stats
from tests.components.drift.helpers import rec, schema


def family(rng: np.random.Generator) -> tuple[int, object]:
    """A random data-generating process: 2 to 12 correlated latent columns, each turned into a numeric column of
    a random kind (Gaussian, lognormal, rounded, cubed, with values missing where the latent is large) or a
    categorical one (1 to 40 cut points of the latent, so its categories follow the others)."""
    d = int(rng.integers(2, 13))
    mix = rng.normal(size=(d, d)) * rng.uniform(0.0, 1.5, size=(d, d))
    kinds = rng.integers(0, 6, size=d)
    cuts = {j: np.sort(rng.normal(size=int(rng.integers(1, 41))) * 3) for j in range(d)}
    scale = rng.uniform(0.2, 3.0, size=d)

    def draw(n: int) -> tuple[dict[str, np.ndarray], dict[str, list[str]]]:
        z = rng.normal(size=(n, d)) @ mix + 0.3 * rng.normal(size=(n, d))
        num: dict[str, np.ndarray] = {}
        cat: dict[str, list[str]] = {}
        for j, kind in enumerate(kinds.tolist()):
            x = z[:, j] * scale[j]
            if kind == 4:
                cat[f"c{j}"] = [f"k{i}" for i in np.searchsorted(cuts[j], x).tolist()]
                continue
            num[f"x{j}"] = [x, np.exp(np.clip(x, -20, 20) / 3), np.round(x), x ** 3, x,
                            np.where(x > scale[j], np.nan, x)][kind]
        return num, cat

    return d, draw


def rows(num: dict[str, np.ndarray], cat: dict[str, list[str]]) -> int:
    return len(next(iter(num.values()))) if num else len(next(iter(cat.values())))


def test_mann_whitney_from_bins_equals_scipy() -> None:
    rng = np.random.default_rng(3)
    ref, cur = rng.integers(0, 25, 700), rng.integers(2, 27, 400)
    auc, z, p = stats.mann_whitney_binned(np.bincount(ref, minlength=27), np.bincount(cur, minlength=27))
    want = sps.mannwhitneyu(cur, ref, alternative="greater", method="asymptotic", use_continuity=True)
    assert auc == pytest.approx(want.statistic / (700 * 400), abs=1e-12)
    assert p == pytest.approx(want.pvalue, rel=1e-9)
    assert stats.mann_whitney_binned(np.zeros(3), np.ones(3)) == (0.5, 0.0, 1.0)


def test_the_joint_test_never_fires_on_random_families_of_null_data() -> None:
    # 40 data-generating processes x 30 windows of 200 to 5000 rows against references of 1000 to 20000 rows.
    rng = np.random.default_rng(2024)
    settings = engine.Settings()
    worst, windows = 0.0, 0
    ps = []
    for _ in range(40):
        _, draw = family(rng)
        num, cat = draw(int(rng.integers(1000, 20_001)))
        p = prof.build(num, cat)
        assert p.multivariate is not None
        for _ in range(30):
            cur_num, cur_cat = draw(int(rng.integers(200, 5001)))
            j = engine.joint_of_columns(p, cur_num, cur_cat, settings)
            assert j is not None and j.p_value is not None
            floor = multivariate.effect_floor(j.n_current, j.n_reference, settings)
            worst = max(worst, j.effect / floor)
            ps.append(j.p_value)
            windows += 1
    assert windows == 1200
    # No window comes near the floor (effect / floor below 1 is "not drifted"), and the p-values are those
    # of a valid test: about uniform, so about 5% of them below 0.05.
    assert worst < 0.9, worst
    share = float(np.mean(np.array(ps) < 0.05))
    assert 0.02 < share < 0.08, share


def test_stationary_windows_of_random_families_raise_no_alarm_with_the_joint_test_included() -> None:
    rng = np.random.default_rng(77)
    settings = engine.Settings()
    alarms = windows = 0
    for _ in range(12):
        _, draw = family(rng)
        p = prof.build(*draw(int(rng.integers(2000, 20_001))))
        for _ in range(25):
            ev = engine.compare_columns(p, *draw(int(rng.integers(300, 5001))), settings)
            alarms += ev.n_drifted > 0 or ev.dataset_drift
            windows += 1
    assert (alarms, windows) == (0, 300)


def _correlated(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    a = rng.normal(size=n)
    return {"a": a, "b": 0.9 * a + 0.45 * rng.normal(size=n), "c": rng.normal(size=n),
            "d": -0.8 * a + 0.6 * rng.normal(size=n)}


def test_a_column_reattached_to_the_wrong_rows_is_joint_drift_that_no_column_test_sees() -> None:
    rng = np.random.default_rng(5)
    p = prof.build(_correlated(rng, 20_000), {})
    cur = _correlated(rng, 2000)
    wrong = rng.choice(2000, 600, replace=False)  # 30% of the rows get another row's "b"
    cur["b"][wrong] = cur["b"][rng.permutation(wrong)]
    ev = engine.compare_columns(p, cur, {}, engine.Settings())
    j = ev.multivariate
    assert ev.n_drifted == 0 and j is not None and j.drifted and ev.dataset_drift
    assert j.statistic > j.threshold and j.p_adjusted is not None and j.p_adjusted < 1e-10
    quiet = engine.compare_columns(p, _correlated(rng, 2000), {}, engine.Settings())
    assert quiet.multivariate is not None and not quiet.multivariate.drifted and not quiet.dataset_drift


def test_the_fit_rows_own_errors_would_be_a_biased_null() -> None:
    # PCA minimizes the error of the rows it is fitted on: comparing windows with those would flag every
    # window. The model therefore keeps the errors of the held-out half of the reference.
    rng = np.random.default_rng(8)
    num = {f"x{i}": v for i, v in enumerate((rng.normal(size=(400, 30)) @ rng.normal(size=(30, 30))).T)}
    model = multivariate.fit(num, {}, list(num), 400)
    assert model is not None and model.fit_rows == 200
    perm = np.random.default_rng(multivariate.SPLIT_SEED).permutation(400)
    fit_rows = np.sort(perm[:200])
    fit_err = model.errors_of({k: v[fit_rows] for k, v in num.items()}, {}, 200)
    auc, _, p = stats.mann_whitney_binned(engine.summarize_numeric(model.errors, fit_err).counts,
                                          model.errors.counts)
    assert auc > 0.6 and p < 1e-6  # the held-out errors are clearly larger than the fit rows'


def test_the_model_is_bounded_round_trips_through_the_profile_and_is_validated(tmp_path) -> None:
    rng = np.random.default_rng(9)
    num = {f"x{i}": rng.normal(size=3000) for i in range(80)}
    cat = {"color": list(rng.choice(["r", "g", "b"], 3000)), "const": ["k"] * 3000}
    p = prof.build(num, cat)
    m = p.multivariate
    assert m is not None and m.dims == multivariate.MAX_DIMS and m.columns == [f"x{i}" for i in range(64)]
    assert m.components.shape == (64 - m.principal, 64)
    p.save(str(tmp_path / "p.json"))
    back = prof.load(str(tmp_path / "p.json"))
    assert back.multivariate is not None and back.multivariate.to_json() == m.to_json()
    small = prof.build({"x": rng.normal(size=3000)}, {"c": list(rng.choice(["u", "v", "w"], 3000))})
    assert small.multivariate is not None and [(e.name, e.category) for e in small.multivariate.inputs] == [
        ("x", None), ("c", "u"), ("c", "v"), ("c", "w")]
    assert prof.build({"x": rng.normal(size=150), "y": rng.normal(size=150)}, {}).multivariate is None
    doc = json.loads((tmp_path / "p.json").read_text())
    doc["multivariate"]["components"][0][0] += 0.5
    with pytest.raises(prof.ProfileError, match="orthonormal"):
        prof.from_json(doc)
    doc = json.loads((tmp_path / "p.json").read_text())
    doc["multivariate"]["inputs"][0]["name"] = "nope"
    with pytest.raises(prof.ProfileError, match="must name a feature column"):
        prof.from_json(doc)


def test_compare_json_carries_the_multivariate_object(tmp_path, capsys) -> None:
    rng = np.random.default_rng(10)
    np.savez(tmp_path / "ref.npz", **_correlated(rng, 5000))
    cur = _correlated(rng, 3000)
    wrong = rng.choice(3000, 1500, replace=False)
    cur["a"][wrong] = cur["a"][rng.permutation(wrong)]
    np.savez(tmp_path / "cur.npz", **cur)
    assert main(["drift", "compare", "--reference", str(tmp_path / "ref.npz"), "--current",
                 str(tmp_path / "cur.npz"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    mv = out["multivariate"]
    assert mv["drifted"] is True and out["dataset_drift"] is True and out["n_drifted"] == 0
    assert mv["method"] == "pca_reconstruction_error" and mv["columns"] == ["a", "b", "c", "d"]
    assert mv["threshold"] == pytest.approx(0.5 + mv["effect_floor"]) and mv["statistic"] > mv["threshold"]
    assert mv["p_value"] < 1e-10 and mv["n_current"] == 3000 and mv["n_reference"] == 2500
    # A profile used with --features that leaves out a modelled column has no joint test.
    main(["reference", "build", str(tmp_path / "ref.npz"), "-o", str(tmp_path / "p.json")])
    capsys.readouterr()
    main(["drift", "compare", "--profile", str(tmp_path / "p.json"), "--current", str(tmp_path / "cur.npz"),
          "--features", "a,b", "--json"])
    assert json.loads(capsys.readouterr().out)["multivariate"] is None


def _stream(mon: Monitor, rng: np.random.Generator, n: int, wrong: float, t0: float) -> None:
    sch = schema(("a", "b", "c", "d"))
    for k in range(n // 200):
        x = _correlated(rng, 200)
        bad = rng.random(200) < wrong
        x["b"][bad] = x["b"][rng.permutation(np.flatnonzero(bad))]
        mon.ingest([rec("m", "1", sch, tuple(float(x[c][i]) for c in "abcd")) for i in range(200)], t0 + k)


def test_the_sidecar_exports_the_joint_test_in_the_same_family_and_in_dataset_drifted() -> None:
    rng = np.random.default_rng(11)
    p = prof.build(_correlated(rng, 10_000), {})
    cfg = DriftConfig(reference="unused.json", window_events=2000)
    settings = engine.Settings()
    mon = Monitor(("m", "1"), cfg, p, "file")
    _stream(mon, rng, 2000, 0.0, 0.0)
    ev = mon.evaluate(settings)
    assert ev is not None and ev.multivariate is not None and not ev.multivariate.drifted and not ev.dataset_drift
    _stream(mon, rng, 2000, 0.4, 100.0)
    ev = mon.evaluate(settings)
    assert ev is not None and ev.multivariate is not None and ev.multivariate.drifted and ev.n_drifted == 0
    pvals = [ev.multivariate.p_value, *[r.p_value for r in ev.results]]
    np.testing.assert_allclose([ev.multivariate.p_adjusted, *[r.p_adjusted for r in ev.results]],
                               sps.false_discovery_control(pvals), atol=1e-12)
    snap = build_snapshot([mon], {}, lambda name: LabelLimiter(name, 100))
    got = {name: dict(v) for name, v in snap.by_name().items()}
    assert got["inferwatch_drift_dataset_drifted"][("m", "1")] == 1.0
    assert got["inferwatch_drift_multivariate_drifted"][("m", "1")] == 1.0
    assert got["inferwatch_drift_multivariate_statistic"][("m", "1")] == ev.multivariate.statistic
    assert got["inferwatch_drift_multivariate_threshold"][("m", "1")] == ev.multivariate.threshold
    errs = got["inferwatch_drift_multivariate_reconstruction_error"]
    assert errs[("m", "1", "current")] > errs[("m", "1", "reference")]


def test_a_warmup_reference_fits_a_joint_model_that_survives_a_checkpoint() -> None:
    rng = np.random.default_rng(12)
    cfg = DriftConfig(warmup_events=1000, window_events=1000)
    mon = Monitor(("m", "1"), cfg, None, "warming_up")
    _stream(mon, rng, 2000, 0.0, 0.0)
    assert mon.profile is not None and mon.joint is not None and mon.source == "warmup"
    state = json.loads(json.dumps(mon.to_state()))
    back = Monitor.from_state(state, cfg, None)
    assert back.joint is not None and back.joint.to_state() == mon.joint.to_state()
    settings = engine.Settings()
    a, b = mon.evaluate(settings), back.evaluate(settings)
    assert a is not None and b is not None and a.multivariate is not None
    assert a.multivariate.to_json() == b.multivariate.to_json()  # type: ignore[union-attr]
    off = Monitor(("m", "1"), DriftConfig(warmup_events=1000, window_events=1000, multivariate=False), None,
                  "warming_up")
    _stream(off, rng, 1000, 0.0, 0.0)
    assert off.profile is not None and off.profile.multivariate is None and off.joint is None

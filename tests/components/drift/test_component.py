"""The drift component, driven directly: handle() with decoded records, then drain/evaluate/collect."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from inferwatch.wire import EV_RECORD, Decoder, Encoder
from inferwatch_sidecar.aggregate.labels import OVERFLOW, LabelLimiter
from inferwatch_sidecar.components.base import Component
from inferwatch_sidecar.components.drift import engine
from inferwatch_sidecar.components.drift import profile as prof
from inferwatch_sidecar.components.drift.component import CONF, PRED, build
from inferwatch_sidecar.components.drift.config import DriftConfig
from inferwatch_sidecar.components.registry import CATALOG
from inferwatch_sidecar.metrics import drift as drift_metrics
from tests.components.drift.helpers import Clock, context, label_only, rec, records, samples, schema

SCH = schema(("a", "b"), ("color",))
COLORS = ["red", "green", "blue"]


def make_profile(tmp_path, n: int = 4000, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    p = prof.build(
        {"a": rng.normal(size=n), "b": rng.normal(5, 2, size=n), "conf": rng.uniform(0.5, 1, size=n)},
        {"color": list(rng.choice(COLORS, size=n)), "cls": [str(x) for x in rng.integers(0, 3, n)]},
        prediction="cls", confidence="conf", source="test",
    )
    path = str(tmp_path / "profile.json")
    p.save(path)
    return path


def traffic(n: int, seed: int, shift: float = 0.0, model: str = "m", version: str = "v1", start: int = 0):
    rng = np.random.default_rng(seed)
    a = rng.normal(shift, size=n)
    b = rng.normal(5, 2, size=n)
    color = list(rng.choice(COLORS, size=n))
    pred = [int(x) for x in rng.integers(0, 3, n)]
    conf = rng.uniform(0.5, 1, size=n)
    return records(model, version, SCH, a, b, color, pred, conf, start), (a, b, color, pred, conf)


def test_component_satisfies_the_contract_and_exports_only_catalog_metrics(tmp_path) -> None:
    comp = build(DriftConfig(reference=make_profile(tmp_path), window_events=2000), context())
    assert isinstance(comp, Component)
    assert comp.name == "drift" and comp.record_types == frozenset({EV_RECORD})
    recs, _ = traffic(1500, 1)
    comp.handle(1, 1, recs)
    comp.drain()
    comp.evaluate()
    names = {m.name for m in CATALOG.all_metrics()}
    fams = list(comp.collect())
    assert fams
    for fam in fams:
        for s in fam.samples:
            assert s.name in names, s.name
    json.dumps(comp.status())


def test_window_results_equal_the_offline_engine_on_the_same_values(tmp_path) -> None:
    path = make_profile(tmp_path)
    comp = build(DriftConfig(reference=path, window_events=10_000), context())
    recs, (a, b, color, pred, conf) = traffic(3000, 2, shift=0.5)
    for i in range(0, len(recs), 100):
        comp.handle(1, 1, recs[i:i + 100])
    comp.drain()
    comp.evaluate()
    mon = comp.monitors[("m", "v1")]
    offline = engine.compare_columns(prof.load(path), {"a": a, "b": b, "conf": conf},
                                     {"color": color, "cls": pred}, comp.settings)
    got = {r.feature: r for r in mon.last.results}
    for r in offline.results:
        g = got[r.feature]
        assert g.statistic == pytest.approx(r.statistic, rel=1e-12), r.feature
        assert g.p_value == pytest.approx(r.p_value, rel=1e-9, abs=1e-300)
        assert g.effect == pytest.approx(r.effect, rel=1e-5)  # window sums are float32
        assert g.drifted == r.drifted
    assert got["a"].drifted and not got["b"].drifted and not got["color"].drifted
    s = samples(comp.collect())
    lab = (("feature", "a"), ("model", "m"), ("model_version", "v1"))
    assert s[("inferwatch_drift_feature_drifted", lab)] == 1.0
    assert s[("inferwatch_drift_feature_drifted", (("feature", "b"), ("model", "m"), ("model_version", "v1")))] == 0.0
    assert s[("inferwatch_drift_window_events", (("model", "m"), ("model_version", "v1")))] == 3000
    assert s[("inferwatch_drift_feature_p_value", lab)] == pytest.approx(got["a"].p_value)
    assert s[("inferwatch_drift_dataset_drifted_ratio", (("model", "m"), ("model_version", "v1")))] == pytest.approx(1 / 3)


def test_bin_counters_count_every_value_exactly(tmp_path) -> None:
    path = make_profile(tmp_path)
    p = prof.load(path)
    comp = build(DriftConfig(reference=path, window_events=500), context())
    recs, (a, _b, color, _pred, _conf) = traffic(1234, 3)
    comp.handle(1, 1, recs)
    comp.drain()
    comp.evaluate()
    s = samples(comp.collect())
    col_a = p.columns["a"]
    expect = np.bincount(col_a.psi_map[np.searchsorted(col_a.edges, a, side="right")], minlength=col_a.n_psi_bins)
    for i, n in enumerate(expect):
        key = ("inferwatch_drift_bin_events_total", (("bin", str(i)), ("feature", "a"), ("model", "m"),
                                                     ("model_version", "v1")))
        assert s[key] == n
    col_c = p.columns["color"]
    for i, cat in enumerate(col_c.categories):
        key = ("inferwatch_drift_bin_events_total", (("bin", str(i)), ("feature", "color"), ("model", "m"),
                                                     ("model_version", "v1")))
        assert s[key] == color.count(cat)
    ref = ("inferwatch_drift_reference_bin_ratio",
           (("bin", "0"), ("feature", "a"), ("model", "m"), ("model_version", "v1")))
    assert s[ref] == pytest.approx(0.1, abs=1e-3)
    # A count-based window of 500 events keeps about the last 500 (one sub-window of slack), not 1234.
    assert 450 <= comp.monitors[("m", "v1")].window_rows <= 500


def test_time_window_slides_and_forgets_old_traffic(tmp_path) -> None:
    clock = Clock(1000.0)
    comp = build(DriftConfig(reference=make_profile(tmp_path), window_seconds=100, subwindows=10), context(clock))
    recs, _ = traffic(300, 4, shift=2.0)
    comp.handle(1, 1, recs)
    comp.drain()
    comp.evaluate()
    assert comp.monitors[("m", "v1")].last.results[0].drifted
    clock.t += 105  # the whole window has passed
    recs, _ = traffic(300, 5)
    comp.handle(1, 1, recs)
    comp.drain()
    comp.evaluate()
    mon = comp.monitors[("m", "v1")]
    assert mon.window_rows == 300
    assert not any(r.drifted for r in mon.last.results)


def test_missing_features_nan_and_unseen_categories_are_reported(tmp_path) -> None:
    comp = build(DriftConfig(reference=make_profile(tmp_path), window_events=5000), context())
    rng = np.random.default_rng(6)
    recs = []
    for i in range(1000):
        a = float("nan") if i % 4 == 0 else float(rng.normal())
        color = "purple" if i % 5 == 0 else ("mauve" if i % 7 == 0 else COLORS[i % 3])
        recs.append(rec("m", "v1", SCH, (a, float(rng.normal(5, 2))), (color,), pred=1, conf=0.8))
    only_b = schema(("b",), (), sid=2)
    recs += [rec("m", "v1", only_b, (5.0,), (), pred=1, conf=0.8) for _ in range(100)]
    comp.handle(1, 1, recs)
    comp.drain()
    comp.evaluate()
    got = {r.feature: r for r in comp.monitors[("m", "v1")].last.results}
    # 250 NaNs in the first 1000 plus 100 records whose schema lacks "a".
    assert got["a"].missing_current == pytest.approx(350 / 1100)
    assert got["a"].missing_drifted and got["a"].drifted
    assert got["color"].unseen["purple"] == 200
    assert "mauve" in got["color"].unseen
    assert got["color"].drifted  # 28% of traffic moved to "other"


def test_warm_up_reference_is_built_from_the_first_events_and_shown_in_status() -> None:
    comp = build(DriftConfig(warmup_events=1000, window_events=2000), context())
    recs, _ = traffic(600, 7)
    comp.handle(1, 1, recs)
    comp.drain()
    st = comp.status()
    assert st["reference"]["source"] == "warm-up"
    assert st["models"][0]["reference"] == {"source": "warming_up", "path": None, "events": 600,
                                             "warmup_target": 1000, "warmup_cut_by_bytes": False}
    recs, _ = traffic(1400, 8, start=600)
    comp.handle(1, 1, recs)
    comp.drain()
    comp.evaluate()
    mon = comp.monitors[("m", "v1")]
    assert mon.source == "warmup" and mon.profile.rows == 1000
    assert set(mon.profile.columns) == {"a", "b", "color", PRED, CONF}
    assert mon.profile.columns[PRED].kind == "categorical"  # integral classes
    assert mon.window_rows == 1000  # the events after the warm-up
    assert not any(r.drifted for r in mon.last.results)
    st = comp.status()["models"][0]
    assert st["reference"]["source"] == "warmup" and len(st["features"]) == 5
    s = samples(comp.collect())
    assert s[("inferwatch_drift_reference_events",
              (("model", "m"), ("model_version", "v1"), ("source", "warmup")))] == 1000
    # Drift after warm-up is caught.
    recs, _ = traffic(1500, 9, shift=1.0, start=2000)
    comp.handle(1, 1, recs)
    comp.drain()
    comp.evaluate()
    assert {r.feature for r in mon.last.results if r.drifted} == {"a"}


def test_labels_join_by_request_id_with_bounded_pending_memory(tmp_path) -> None:
    clock = Clock()
    comp = build(DriftConfig(reference=make_profile(tmp_path), window_events=5000, max_pending_labels=1000,
                             label_ttl_s=60), context(clock))
    preds = [rec("m", "v1", None, pred=i % 3, conf=0.9, rid=f"q{i}") for i in range(1200)]
    comp.handle(1, 1, preds)
    comp.drain()
    assert len(comp._labels.pending) == 1000  # the 200 oldest were evicted
    # Labels: q200..q599 arrive, 3/4 of them correct; q0 was evicted; "nope" was never predicted.
    labels = [label_only("m", "v1", f"q{i}", (i % 3) if i % 4 else (i + 1) % 3) for i in range(200, 600)]
    labels += [label_only("m", "v1", "q0", 0), label_only("m", "v1", "nope", 1)]
    # A prediction sent together with its label is scored at once.
    labels += [rec("m", "v1", None, pred="2", conf=0.9, label=2.0, rid="inline")]
    comp.handle(1, 1, labels)
    comp.drain()
    mon = comp.monitors[("m", "v1")]
    assert mon.label_counts == {"joined": 400, "inline": 1, "unmatched": 2, "expired": 200}
    comp.evaluate()
    s = samples(comp.collect())
    mv = (("model", "m"), ("model_version", "v1"))
    assert s[("inferwatch_drift_accuracy_ratio", mv)] == pytest.approx((300 + 1) / 401)
    assert s[("inferwatch_drift_labeled_events", mv)] == 401
    assert s[("inferwatch_drift_labels_total",
              (("model", "m"), ("model_version", "v1"), ("result", "joined")))] == 400
    clock.t += 61
    comp.drain()
    assert not comp._labels.pending and mon.label_counts["expired"] == 800


def test_confidence_mean_and_cbpe_estimate_follow_the_window(tmp_path) -> None:
    comp = build(DriftConfig(reference=make_profile(tmp_path), window_events=5000), context())
    rng = np.random.default_rng(10)
    conf = rng.uniform(0.4, 0.8, 2000)  # mean 0.6, reference mean 0.75
    comp.handle(1, 1, [rec("m", "v1", None, pred=1, conf=float(c)) for c in conf])
    comp.drain()
    comp.evaluate()
    s = samples(comp.collect())
    mv = (("model", "m"), ("model_version", "v1"))
    assert s[("inferwatch_drift_estimated_accuracy_ratio", mv)] == pytest.approx(conf.mean(), rel=1e-5)
    assert s[("inferwatch_drift_confidence_mean", (("model", "m"), ("model_version", "v1"), ("window", "current")))] == \
        pytest.approx(conf.mean(), rel=1e-5)
    got = {r.feature: r for r in comp.monitors[("m", "v1")].last.results}
    assert got["conf"].drifted and got["conf"].role == "confidence"
    assert s[("inferwatch_drift_prediction_class_ratio",
              (("class", "1"), ("model", "m"), ("model_version", "v1")))] == 1.0


def test_canary_version_is_compared_with_the_stable_version(tmp_path) -> None:
    comp = build(DriftConfig(reference=make_profile(tmp_path), window_events=20_000), context())
    stable, _ = traffic(5000, 11, shift=0.3, version="v1")
    canary, _ = traffic(400, 12, shift=0.3, version="v2")
    comp.handle(1, 1, stable + canary)
    comp.drain()
    comp.evaluate()
    # Both drifted from the reference in the same way, but the canary matches the stable version.
    assert comp.monitors[("m", "v2")].canary["evaluation"].n_drifted == 0
    assert comp.monitors[("m", "v1")].canary is None
    canary2, _ = traffic(400, 13, shift=1.3, version="v3")
    comp.handle(1, 1, canary2)
    comp.drain()
    comp.evaluate()
    c3 = comp.monitors[("m", "v3")].canary
    assert c3["baseline_version"] == "v1"
    assert [r.feature for r in c3["evaluation"].results if r.drifted] == ["a"]
    s = samples(comp.collect())
    key = ("inferwatch_drift_canary_feature_drifted", (("baseline_version", "v1"), ("feature", "a"), ("model", "m"),
                                                       ("model_version", "v3")))
    assert s[key] == 1.0
    ratio = ("inferwatch_drift_canary_drifted_ratio",
             (("baseline_version", "v1"), ("model", "m"), ("model_version", "v3")))
    assert s[ratio] == pytest.approx(1 / 5)  # a, b, color, cls (prediction), conf (confidence)
    assert comp.status()["models"][2]["canary"]["drifted"] == ["a"]


def test_model_version_label_shares_the_core_metrics_name_and_budget(tmp_path) -> None:
    # The drift metrics label the version model_version, like the core request metrics, and cap it with
    # the same limiter: a version the core already counted costs no second slot.
    for m in drift_metrics.METRICS:
        assert "version" not in m.labels, m.name
    core_ctx = {lbl for m in CATALOG.all_metrics() if m.component == "core" for lbl in m.labels}
    assert {"model", "model_version"} <= core_ctx
    ctx = context()
    ctx.limiters["model_version"] = LabelLimiter("model_version", 2)
    assert ctx.limiters["model_version"].get("v0") == "v0"  # seen by the core aggregator first
    comp = build(DriftConfig(reference=make_profile(tmp_path), window_events=5000), ctx)
    comp.handle(1, 1, traffic(100, 21, version="v0")[0] + traffic(100, 22, version="v1")[0]
                + traffic(100, 23, version="v2")[0])
    comp.drain()
    comp.evaluate()
    s = samples(comp.collect())
    got = {dict(lab)["model_version"]: v for (name, lab), v in s.items() if name == "inferwatch_drift_window_events"}
    # v0 reuses the core's slot; of v1 and v2 only one fits the budget of 2, the other overflows.
    assert got.pop("v0") == 100 and got.pop(OVERFLOW) == 100
    assert list(got.values()) == [100] and set(got) <= {"v1", "v2"}
    assert "version" not in ctx.limiters


def test_handle_is_bounded_and_never_raises(tmp_path) -> None:
    comp = build(DriftConfig(reference=make_profile(tmp_path), max_staged=1000, max_models=2), context())
    recs, _ = traffic(1500, 14)
    comp.handle(1, 1, recs)
    assert comp.dropped["staging_full"] == 500
    comp.drain()
    comp.handle(1, 1, [(EV_RECORD,), ("junk",), (EV_RECORD, None, 0, None, 1, None, None, None)])
    comp.handle(1, 1, [rec(f"m{i}", "v", None, pred=1, conf=0.5) for i in range(5)])
    comp.drain()
    assert len(comp.monitors) == 2
    assert comp.dropped["too_many_models"] == 4
    assert comp.dropped["error"] >= 2
    comp.evaluate()
    s = samples(comp.collect())
    assert s[("inferwatch_drift_dropped_records_total", (("reason", "staging_full"),))] == 500


def test_state_per_feature_is_bounded_whatever_the_traffic(tmp_path) -> None:
    comp = build(DriftConfig(reference=make_profile(tmp_path), window_events=1000), context())
    mon_bytes = []
    for k in range(3):
        recs, _ = traffic(5000, 20 + k)
        comp.handle(1, 1, recs)
        comp.drain()
        mon = comp.monitors[("m", "v1")]
        mon_bytes.append([cw.nbytes for cw in mon.columns.values()])
    assert mon_bytes[0] == mon_bytes[2]
    assert max(mon_bytes[0]) <= 16 * 1024


def test_build_rejects_a_bad_profile_with_a_message_that_says_what_to_fix(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "inferwatch-drift-profile", "version": 1, "columns": [{"name": "a", "kind": "numeric",'
                   ' "count": 3, "missing": 0, "edges": [2, 1], "counts": [1, 1, 1], "bin_means": [0, 1, 2],'
                   ' "psi_edges": [], "mean": 0, "std": 1, "min": 0, "max": 2}]}')
    with pytest.raises(prof.ProfileError, match=r"bad.json: column 'a': 'edges' must be strictly increasing"):
        build(DriftConfig(reference=str(bad)), context())
    with pytest.raises(prof.ProfileError, match="cannot read reference profile"):
        build(DriftConfig(reference=str(tmp_path / "absent.json")), context())
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(prof.ProfileError, match="not valid JSON"):
        build(DriftConfig(reference=str(tmp_path / "x.json")), context())


def test_config_rejects_unknown_keys_and_bad_values() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        DriftConfig(windw_seconds=3)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="multiple of 10"):
        DriftConfig(bins=55)
    assert DriftConfig().enabled


def test_records_round_tripped_through_the_wire_format_are_ingested(tmp_path) -> None:
    enc = Encoder(pid=7, producer_id=1, clock=lambda: 10**18)
    rng = np.random.default_rng(15)
    events = [(EV_RECORD, ("svc", "m", "v1"), 10**18, f"r{i}", int(rng.integers(0, 3)), float(rng.uniform(0.5, 1)),
               None, {"a": float(rng.normal()), "b": float(rng.normal(5, 2)), "color": str(rng.choice(COLORS))})
              for i in range(500)]
    dec = Decoder()
    comp = build(DriftConfig(reference=make_profile(tmp_path), window_events=5000), context())
    for frame in enc.encode(events):
        f = dec.decode(frame)
        comp.handle(f.pid, f.producer_id, f.records)
    comp.drain()
    comp.evaluate()
    mon = comp.monitors[("m", "v1")]
    assert mon.window_rows == 500
    assert {r.feature: r.n_current for r in mon.last.results} == {"a": 500, "b": 500, "conf": 500, "color": 500,
                                                                  "cls": 500}


def test_results_are_deterministic(tmp_path) -> None:
    path = make_profile(tmp_path)
    outs = []
    for _ in range(2):
        comp = build(DriftConfig(reference=path, window_events=5000), context())
        recs, _ = traffic(2000, 16, shift=0.2)
        comp.handle(1, 1, recs)
        comp.drain()
        comp.evaluate()
        outs.append(json.dumps(comp.monitors[("m", "v1")].last.to_json(), sort_keys=True))
    assert outs[0] == outs[1]


def test_threaded_start_evaluates_and_stop_checkpoints(tmp_path, caplog) -> None:
    import time

    ck = tmp_path / "ck.json"
    cfg = DriftConfig(reference=make_profile(tmp_path), window_events=5000, evaluate_interval_s=0.05,
                      checkpoint_path=str(ck))
    comp = build(cfg, context())
    with caplog.at_level(logging.INFO, logger="inferwatch.sidecar.drift"):
        comp.start()
    recs, _ = traffic(500, 17)
    comp.handle(1, 1, recs)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (("m", "v1") not in comp.monitors
                                           or comp.monitors[("m", "v1")].last is None):
        time.sleep(0.02)
    comp.stop(5)
    assert comp.monitors[("m", "v1")].last is not None
    assert ck.exists()


def test_tiny_windows_are_reported_but_never_flagged(tmp_path) -> None:
    comp = build(DriftConfig(reference=make_profile(tmp_path), window_events=5000), context())
    comp.evaluate()  # nothing yet: no crash, no samples for the model
    assert not any(k[0].startswith("inferwatch_drift_feature") for k in samples(comp.collect()))
    recs, _ = traffic(5, 40, shift=5.0)
    comp.handle(1, 1, recs)
    comp.drain()
    comp.evaluate()
    res = comp.monitors[("m", "v1")].last.results
    assert all(r.status == "insufficient_data" and r.p_value is None and not r.drifted for r in res)
    s = samples(comp.collect())
    assert s[("inferwatch_drift_feature_drifted", (("feature", "a"), ("model", "m"), ("model_version", "v1")))] == 0.0
    assert ("inferwatch_drift_feature_p_value", (("feature", "a"), ("model", "m"), ("model_version", "v1"))) not in s

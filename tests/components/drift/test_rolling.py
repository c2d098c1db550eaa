"""Rolling reference mode: a seasonal stream does not alarm, a new shift does, in bounded, checkpointed memory."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from pydantic import ValidationError

from inferwatch_sidecar.components.drift import engine
from inferwatch_sidecar.components.drift import profile as prof
from inferwatch_sidecar.components.drift.config import DriftConfig
from inferwatch_sidecar.components.drift.monitor import Monitor
from inferwatch_sidecar.components.drift.rolling import NO_HISTORY, RollingColumn
from tests.components.drift.helpers import rec, schema

PERIOD = 3600.0
RATE = 5  # events per second
STEP = 5.0  # seconds per ingested batch


def season(t: np.ndarray) -> np.ndarray:
    return 1.5 * np.sin(2 * math.pi * t / PERIOD)  # a daily cycle of 1.5 standard deviations


def cfg(mode: str) -> DriftConfig:
    return DriftConfig(reference="profile.json" if mode == "file" else None, reference_mode=mode,
                       window_seconds=300, subwindows=5, rolling_period_s=PERIOD, rolling_slots=60)


def reference(rng: np.random.Generator) -> prof.Profile:
    t = rng.uniform(0, PERIOD, 20_000)  # a whole cycle
    return prof.build({"x": season(t) + rng.normal(size=t.size), "y": rng.normal(size=t.size)}, {})


def run(mon: Monitor, rng: np.random.Generator, t0: float, t1: float, shift_from: float = math.inf,
        every: float = 300.0) -> list[tuple[float, engine.Evaluation]]:
    """Feed the seasonal stream from t0 to t1 and evaluate at the end of every window after the first period."""
    sch = schema(("x", "y"))
    out = []
    n = int(RATE * STEP)
    for t in np.arange(t0, t1, STEP):
        ts = t + np.arange(n) / RATE
        x = season(ts) + rng.normal(size=n) + (0.8 if t >= shift_from else 0.0)
        y = rng.normal(size=n)
        mon.ingest([rec("m", "1", sch, (float(x[i]), float(y[i]))) for i in range(n)], float(t))
        if (t + STEP) % every == 0 and t + STEP >= PERIOD + 300:
            ev = mon.evaluate(engine.Settings())
            assert ev is not None
            out.append((t + STEP, ev))
    return out


def alarms(evs: list[tuple[float, engine.Evaluation]]) -> list[float]:
    return [t for t, ev in evs if ev.n_drifted or ev.dataset_drift]


def test_a_seasonal_stream_alarms_against_a_fixed_reference_but_not_in_rolling_mode() -> None:
    rng = np.random.default_rng(1)
    p = reference(rng)
    fixed = run(Monitor(("m", "1"), cfg("file"), p, "file"), np.random.default_rng(2), 0, 2 * PERIOD)
    assert len(alarms(fixed)) >= len(fixed) // 2  # the cycle reads as drift against the whole-cycle profile
    rolling_mon = Monitor(("m", "1"), cfg("rolling"), p, "file")
    rolling = run(rolling_mon, np.random.default_rng(2), 0, 3 * PERIOD)
    assert len(rolling) == 24 and alarms(rolling) == []
    ev = rolling[-1][1]
    assert all(r.status == "ok" and r.n_reference >= 1400 for r in ev.results)
    assert ev.multivariate is not None and ev.multivariate.status == "ok"


def test_in_rolling_mode_a_new_shift_alarms_until_it_is_a_period_old() -> None:
    rng = np.random.default_rng(3)
    mon = Monitor(("m", "1"), cfg("rolling"), reference(rng), "file")
    shift = 1.5 * PERIOD
    evs = run(mon, np.random.default_rng(4), 0, 3 * PERIOD, shift_from=shift)
    hit = alarms(evs)
    assert hit and hit[0] <= shift + 300  # within one window
    x_flags = [t for t, ev in evs if ev.results[0].drifted]
    assert all(shift < t <= shift + PERIOD + 300 for t in x_flags)  # then the shifted stream is the reference
    assert not [t for t, ev in evs if t > shift + PERIOD + 300 and ev.results[0].drifted]


def test_before_a_period_has_passed_nothing_is_tested_and_the_history_is_bounded() -> None:
    rng = np.random.default_rng(5)
    mon = Monitor(("m", "1"), cfg("rolling"), reference(rng), "file")
    run(mon, rng, 0, 1800)
    ev = mon.evaluate(engine.Settings())
    assert ev is not None and all(r.status == NO_HISTORY and r.p_value is None and not r.drifted for r in ev.results)
    assert ev.multivariate is not None and ev.multivariate.status == NO_HISTORY
    before = mon.nbytes
    run(mon, rng, 1800, 3 * PERIOD)
    assert mon.history is not None and mon.nbytes == before
    # One period of 60 slots, plus the 5 a window spans and the one being filled.
    assert mon.history.columns["x"].counts.shape == (66, 10)
    # Each slot: 10 deciles (int32 counts, float32 sums), its missing count and its id: 96 bytes.
    assert mon.history.columns["x"].nbytes == 66 * 96


def test_the_rolling_history_survives_a_checkpoint() -> None:
    rng = np.random.default_rng(6)
    c = cfg("rolling")
    mon = Monitor(("m", "1"), c, reference(rng), "file")
    run(mon, rng, 0, PERIOD + 900)
    state = json.loads(json.dumps(mon.to_state()))
    back = Monitor.from_state(state, c, mon.profile)
    a, b = mon.evaluate(engine.Settings()), back.evaluate(engine.Settings())
    assert a is not None and b is not None and a.to_json() == b.to_json()
    assert all(r.status == "ok" for r in a.results)
    other = DriftConfig(reference="profile.json", reference_mode="rolling", window_seconds=300, subwindows=5,
                        rolling_period_s=2 * PERIOD, rolling_slots=60)
    fresh = Monitor.from_state(state, other, mon.profile)  # another period: the history starts over
    assert fresh.history is not None and int(fresh.history.columns["x"].slot_ids.max()) == -1


def test_rolling_column_sums_the_slots_that_cover_the_window_one_period_earlier() -> None:
    ref = prof.numeric_column("x", np.arange(1000.0))
    h = RollingColumn(ref, 4, 60.0)
    counts = np.zeros(ref.n_bins)
    counts[1:11] = 7  # 70 values in the lowest decile
    h.update(120.0, counts, counts * 3.0, 2)
    h.update(150.0, counts, counts * 3.0, 1)  # same slot (120..180)
    assert h.reference(0.0, 180.0) is None  # slots 0 and 1 were never filled
    past = h.reference(120.0, 180.0)
    assert past is not None and past.count == 140 and past.missing == 3 and past.counts.tolist()[0] == 140
    assert past.bin_means[0] == pytest.approx(3.0)
    h.update(360.0, counts, None, 0)  # slot 6 overwrites ring position 2
    assert h.reference(120.0, 180.0) is None


def test_rolling_config_is_checked() -> None:
    with pytest.raises(ValidationError, match="unset drift.window_events"):
        DriftConfig(reference_mode="rolling", window_events=1000)
    with pytest.raises(ValidationError, match="at least twice"):
        DriftConfig(reference_mode="rolling", window_seconds=600, rolling_period_s=900)
    with pytest.raises(ValidationError, match="needs drift.reference"):
        DriftConfig(reference_mode="file")
    assert DriftConfig().reference_mode == "warmup" and DriftConfig(reference="p.json").reference_mode == "file"


def test_a_long_unseen_category_is_kept_cut_to_64_characters_and_its_counts_add_up() -> None:
    """An unseen value over 64 characters is kept by its first 64; its later counts add to that entry (they used to
    replace it, and the window showed only the last batch's count)."""
    import numpy as np

    from inferwatch_sidecar.components.drift.window import ColumnWindow
    from inferwatch_sidecar.stats.columns import CategoricalColumn

    ref = CategoricalColumn(name="c", role="feature", count=10, missing=0, categories=["a"], counts=np.array([10, 0]))
    w = ColumnWindow(ref, 4)
    long = "x" * 255
    w.update([long, long, "a"])
    w.update([long, "y" * 70])
    assert dict(w.unseen) == {"x" * 64: 3, "y" * 64: 1}

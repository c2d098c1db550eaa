"""Window state survives a restart through an atomic checkpoint; a corrupt one means a fresh start."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from inferwatch_sidecar.components.drift.component import build
from inferwatch_sidecar.components.drift.config import DriftConfig
from tests.components.drift.helpers import Clock, context
from tests.components.drift.test_component import make_profile, traffic


def _filled(cfg: DriftConfig, clock: Clock | None = None):
    comp = build(cfg, context(clock))
    recs, _ = traffic(1500, 30, shift=0.4)
    comp.handle(1, 1, recs)
    comp.drain()
    comp.evaluate()
    return comp


@pytest.mark.parametrize("warmup", [False, True])
def test_checkpoint_round_trip_resumes_the_same_windows(tmp_path, warmup: bool) -> None:
    ck = str(tmp_path / "drift.ckpt")
    ref = None if warmup else make_profile(tmp_path)
    cfg = DriftConfig(reference=ref, warmup_events=500, window_events=4000, checkpoint_path=ck)
    a = _filled(cfg)
    a.checkpoint()
    b = build(cfg, context())
    b.start()
    b.stop(5)
    assert b.restored_from == ck
    ma, mb = a.monitors[("m", "v1")], b.monitors[("m", "v1")]
    assert mb.source == ("warmup" if warmup else "file")
    assert mb.window_rows == ma.window_rows
    for name, cw in ma.columns.items():
        np.testing.assert_array_equal(cw.counts, mb.columns[name].counts)
        np.testing.assert_array_equal(cw.cum, mb.columns[name].cum)
    b.evaluate()
    assert json.dumps(ma.last.to_json(), sort_keys=True) == json.dumps(mb.last.to_json(), sort_keys=True)
    assert b.status()["restored_from_checkpoint"] == ck


def test_time_window_resumes_within_one_checkpoint_interval(tmp_path) -> None:
    ck = str(tmp_path / "drift.ckpt")
    clock = Clock(5000.0)
    cfg = DriftConfig(reference=make_profile(tmp_path), window_seconds=100, subwindows=10, checkpoint_path=ck)
    a = _filled(cfg, clock)
    a.checkpoint()
    clock.t += 45  # restart 45 s later: the 1500 events are still inside the 100 s window
    b = build(cfg, context(clock))
    b.start()
    b._worker.stop(5)  # drain by hand from here on
    b.handle(1, 1, traffic(10, 31)[0])
    b.drain()
    assert b.monitors[("m", "v1")].window_rows == 1510
    clock.t += 100
    b.handle(1, 1, traffic(10, 32)[0])
    b.drain()
    assert b.monitors[("m", "v1")].window_rows == 10
    b.stop(5)


@pytest.mark.parametrize("content", [b"", b"garbage", b"PK\x03\x04broken zip"])
def test_corrupt_checkpoint_logs_a_clear_line_and_starts_fresh(tmp_path, caplog, content: bytes) -> None:
    ck = tmp_path / "drift.ckpt"
    ck.write_bytes(content)
    cfg = DriftConfig(reference=make_profile(tmp_path), checkpoint_path=str(ck))
    comp = build(cfg, context())
    with caplog.at_level(logging.ERROR, logger="inferwatch.sidecar.drift"):
        comp.start()
        comp.stop(5)
    assert "ignoring corrupt or incompatible checkpoint" in caplog.text
    assert comp.monitors == {} and comp.restored_from is None


def test_checkpoint_with_tampered_arrays_or_other_settings_is_refused(tmp_path, caplog) -> None:
    ck = str(tmp_path / "drift.ckpt")
    cfg = DriftConfig(reference=make_profile(tmp_path), window_events=4000, checkpoint_path=ck)
    _filled(cfg).checkpoint()
    with open(ck, encoding="utf-8") as f:
        data = json.load(f)
    col = data["monitors"][0]["columns"][0]
    col["counts"] = [row[:5] for row in col["counts"]]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data), encoding="utf-8")
    comp = build(cfg.model_copy(update={"checkpoint_path": str(bad)}), context())
    with caplog.at_level(logging.ERROR, logger="inferwatch.sidecar.drift"):
        comp.start()
        comp.stop(5)
    assert "has shape" in caplog.text and comp.restored_from is None
    other = build(cfg.model_copy(update={"subwindows": 12}), context())
    other.start()
    other.stop(5)
    assert other.restored_from is None and "window settings changed" in caplog.text

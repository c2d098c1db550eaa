"""Checkpoint failures are counted in a catalog metric, and a corrupt checkpoint is kept aside, not overwritten."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

import pytest

from inferwatch_sidecar.components.drift import checkpoint
from inferwatch_sidecar.components.drift.component import DriftComponent, build
from inferwatch_sidecar.components.drift.config import DriftConfig
from tests.components.drift.helpers import Clock, context, samples
from tests.components.drift.test_component import make_profile, traffic

METRIC = "inferwatch_drift_checkpoint_failures_total"


def failures(comp: DriftComponent) -> dict[tuple[str, str], float]:
    """The exported checkpoint failure counters, by (op, reason)."""
    return {(dict(lab)["op"], dict(lab)["reason"]): v for (name, lab), v in samples(comp.collect()).items()
            if name == METRIC}


def nonzero(comp: DriftComponent) -> dict[tuple[str, str], float]:
    return {k: v for k, v in failures(comp).items() if v}


def restart(cfg: DriftConfig, clock: Clock | None = None) -> DriftComponent:
    """Build and start a component, then stop it: the stop writes a fresh checkpoint."""
    comp = build(cfg, context(clock))
    comp.start()
    comp.stop(5)
    return comp


def set_aside_files(ck: Path, kind: str) -> list[Path]:
    return sorted(ck.parent.glob(f"{ck.name}.{kind}-*"))


@pytest.fixture
def cfg(tmp_path) -> DriftConfig:
    return DriftConfig(reference=make_profile(tmp_path), window_events=4000,
                       checkpoint_path=str(tmp_path / "drift.ckpt"))


def test_every_failure_counter_is_exported_at_zero_before_any_evaluation(cfg) -> None:
    comp = build(cfg, context())
    assert failures(comp) == {(op, r): 0 for op, rs in checkpoint.FAILURE_REASONS.items() for r in rs}
    assert failures(build(cfg.model_copy(update={"checkpoint_path": None}), context())) == {}


def test_corrupt_checkpoint_is_moved_aside_counted_and_not_overwritten(cfg, caplog) -> None:
    ck = Path(cfg.checkpoint_path)
    ck.write_bytes(b"\x00garbage")
    clock = Clock(1_790_000_000.0)
    with caplog.at_level(logging.ERROR, logger="inferwatch.sidecar.drift"):
        comp = restart(cfg, clock)
    [kept] = set_aside_files(ck, "corrupt")
    assert kept.name == "drift.ckpt.corrupt-20260921T141320Z"
    assert kept.read_bytes() == b"\x00garbage"
    assert f"Moved it to {kept} for inspection" in caplog.text
    assert nonzero(comp) == {("read", "corrupt"): 1}
    assert comp.status()["checkpoint_failures"] == {"read/corrupt": 1}
    # the checkpoint written at stop is a new, valid one next to the kept copy
    assert json.loads(ck.read_text())["format"] == checkpoint.FORMAT
    assert restart(cfg).restored_from == str(ck)


def test_checkpoint_of_other_window_settings_is_moved_aside_as_incompatible(cfg) -> None:
    comp = build(cfg, context())
    comp.handle(1, 1, traffic(500, 3)[0])
    comp.drain()
    comp.checkpoint()
    saved = Path(cfg.checkpoint_path).read_bytes()
    other = restart(cfg.model_copy(update={"subwindows": 12}))
    assert other.restored_from is None
    assert nonzero(other) == {("read", "incompatible"): 1}
    [kept] = set_aside_files(Path(cfg.checkpoint_path), "incompatible")
    assert kept.read_bytes() == saved


def test_checkpoint_of_another_format_version_is_incompatible(cfg) -> None:
    Path(cfg.checkpoint_path).write_text(json.dumps({"format": checkpoint.FORMAT, "version": 1}))
    assert nonzero(restart(cfg)) == {("read", "incompatible"): 1}


@pytest.mark.parametrize("step_s", [0.0, 1.0], ids=["same second", "one second apart"])
def test_only_the_newest_set_aside_checkpoints_are_kept(cfg, step_s: float) -> None:
    ck = Path(cfg.checkpoint_path)
    clock = Clock(1_790_000_000.0)
    for i in range(checkpoint.KEEP_SET_ASIDE + 3):
        ck.write_text(f"garbage {i}")
        restart(cfg, clock)
        clock.t += step_s
    kept = [p.read_text() for p in set_aside_files(ck, "corrupt")]
    assert sorted(kept) == [f"garbage {i}" for i in range(3, checkpoint.KEEP_SET_ASIDE + 3)]


def test_checkpoint_that_cannot_be_opened_is_counted_and_left_in_place(cfg, caplog) -> None:
    os.mkdir(cfg.checkpoint_path)  # open() fails with EISDIR, and so does the rename at stop
    with caplog.at_level(logging.ERROR, logger="inferwatch.sidecar.drift"):
        comp = restart(cfg)
    assert os.path.isdir(cfg.checkpoint_path) and set_aside_files(Path(cfg.checkpoint_path), "corrupt") == []
    assert nonzero(comp) == {("read", "io"): 1, ("write", "io"): 1}
    assert "cannot read checkpoint" in caplog.text and "cannot write checkpoint" in caplog.text


@pytest.mark.parametrize(("exc", "reason"), [
    (OSError(errno.ENOSPC, "No space left on device"), "no_space"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "no_space"),
    (PermissionError(errno.EACCES, "Permission denied"), "permission"),
    (OSError(errno.EROFS, "Read-only file system"), "permission"),
    (OSError(errno.EIO, "Input/output error"), "io"),
    (TypeError("Object of type Thing is not JSON serializable"), "error"),
])
def test_write_failure_is_counted_by_reason_and_exported_at_once(cfg, monkeypatch, caplog, exc, reason) -> None:
    def fail(doc, path):
        raise exc

    monkeypatch.setattr(checkpoint, "write", fail)
    comp = build(cfg, context())
    with caplog.at_level(logging.ERROR, logger="inferwatch.sidecar.drift"):
        comp.checkpoint()
        comp.checkpoint()
    assert nonzero(comp) == {("write", reason): 2}  # no evaluation ran: collect exports the counter itself
    assert "cannot write checkpoint" in caplog.text and comp.last_checkpoint_unix is None


def test_write_into_a_missing_folder_is_counted_as_io(cfg) -> None:
    comp = build(cfg.model_copy(update={"checkpoint_path": cfg.checkpoint_path + ".d/missing/drift.ckpt"}),
                 context())
    comp.checkpoint()
    assert nonzero(comp) == {("write", "io"): 1}


def test_corrupt_checkpoint_that_cannot_be_moved_aside_is_counted_and_said(cfg, monkeypatch, caplog) -> None:
    def fail(path, kind, now):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(checkpoint, "set_aside", fail)
    Path(cfg.checkpoint_path).write_text("garbage")
    comp = build(cfg, context())
    with caplog.at_level(logging.ERROR, logger="inferwatch.sidecar.drift"):
        comp.start()
        comp._worker.stop(5)
    assert nonzero(comp) == {("read", "corrupt"): 1, ("set_aside", "io"): 1}
    assert "cannot be moved aside (Permission denied) and is overwritten at the next checkpoint" in caplog.text


def test_older_set_aside_copies_that_cannot_be_deleted_are_counted(cfg, monkeypatch, caplog) -> None:
    def fail(path, kind):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(checkpoint, "prune", fail)
    Path(cfg.checkpoint_path).write_text("garbage")
    with caplog.at_level(logging.ERROR, logger="inferwatch.sidecar.drift"):
        comp = restart(cfg)
    assert len(set_aside_files(Path(cfg.checkpoint_path), "corrupt")) == 1
    assert nonzero(comp) == {("read", "corrupt"): 1, ("set_aside", "io"): 1}
    assert "cannot delete older corrupt checkpoints" in caplog.text

"""The torch allocator probe says, in one line, when it is on and torch is not installed."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

import pytest

import inferwatch
from inferwatch import _torch


def _notices(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "inferwatch" and "allocator probe" in r.getMessage()]


@pytest.fixture
def no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process without torch, whether or not the machine has it."""
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    real_find_spec = _torch.importlib.util.find_spec
    monkeypatch.setattr(
        _torch.importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real_find_spec(name, *a)
    )


def test_probe_on_without_torch_logs_one_line_at_configure(
    no_torch: None, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.WARNING, logger="inferwatch")
    assert inferwatch.configure(sidecar=str(tmp_path / "none.sock"), torch_probe=True, flush_interval_ms=10_000)
    (rec,) = _notices(caplog)
    assert rec.levelno == logging.WARNING
    assert rec.getMessage() == _torch.NO_TORCH_NOTICE
    assert "\n" not in rec.getMessage() and "install torch or turn the probe off" in rec.getMessage()
    # Sampling afterwards adds nothing: the notice is said once, and the probe sends no events.
    assert inferwatch.flush()
    assert inferwatch.flush()
    assert len(_notices(caplog)) == 1


def test_probe_on_via_the_environment_gives_the_same_notice(
    no_torch: None, caplog: pytest.LogCaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING, logger="inferwatch")
    monkeypatch.setenv("INFERWATCH_TORCH_PROBE", "true")
    assert inferwatch.configure(sidecar=str(tmp_path / "none.sock"), flush_interval_ms=10_000)
    assert [r.getMessage() for r in _notices(caplog)] == [_torch.NO_TORCH_NOTICE]


def test_no_notice_with_the_probe_off_or_an_injected_source(
    no_torch: None, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.WARNING, logger="inferwatch")
    assert inferwatch.configure(sidecar=str(tmp_path / "none.sock"), flush_interval_ms=10_000)
    inferwatch.shutdown(timeout=1.0)
    assert inferwatch.configure(sidecar=str(tmp_path / "none.sock"), torch_probe=True, torch_stats_source=dict,
                                flush_interval_ms=10_000)
    assert _notices(caplog) == []


def test_torch_found_on_the_path_is_not_imported_and_gives_no_notice(
    caplog: pytest.LogCaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in torch package that would fail loudly if anything imported it.
    pkg = tmp_path / "site" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('the probe must not import torch')\n")
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    caplog.set_level(logging.WARNING, logger="inferwatch")
    assert _torch.torch_installed()
    assert inferwatch.configure(sidecar=str(tmp_path / "none.sock"), torch_probe=True, flush_interval_ms=10_000)
    assert inferwatch.flush()
    assert _notices(caplog) == []
    assert "torch" not in sys.modules


def test_torch_already_loaded_gives_no_notice(
    caplog: pytest.LogCaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    caplog.set_level(logging.WARNING, logger="inferwatch")
    _torch.AllocatorProbe(10.0)
    assert _notices(caplog) == []

"""``inferwatch sidecar --check-config`` fails wherever start-up would, and binds nothing."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from inferwatch_sidecar.cli import main
from tests.helpers.net import held_port


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("INFERWATCH_", "OTEL_")):
            monkeypatch.delenv(k)


def _config(tmp_path: Path, sock_dir: Path, body: str) -> Path:
    f = tmp_path / "sidecar.yaml"
    f.write_text(f"ingest:\n  socket: {sock_dir / 'iw' / 'ingest.sock'}\nhttp:\n  port: 0\n{body}")
    return f


def test_a_missing_drift_reference_fails_check_config_as_it_fails_start_up(
    tmp_path: Path, sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = _config(tmp_path, sock_dir, f"drift:\n  reference: {tmp_path / 'missing.json'}\n")
    assert main(["sidecar", "--check-config", str(f), "--no-gpu"]) == 1
    checked = capsys.readouterr()
    assert "configuration is valid" not in checked.out
    assert "start-up would fail: drift: cannot read reference profile" in checked.err
    switch = sys.getswitchinterval()
    try:
        assert main(["sidecar", "--config", str(f), "--no-gpu"]) == 1
    finally:
        sys.setswitchinterval(switch)  # start-up sets the daemon's before it fails
    started = capsys.readouterr()
    assert "cannot start: drift: cannot read reference profile" in started.err


def test_a_missing_gpu_replay_file_fails_check_config(
    tmp_path: Path, sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = _config(tmp_path, sock_dir, f"gpu:\n  backend: replay\n  replay:\n    files: [{tmp_path / 'nvidia-smi.log'}]\n")
    assert main(["sidecar", "--check-config", str(f), "--no-drift"]) == 1
    assert "start-up would fail: gpu: gpu.replay.files:" in capsys.readouterr().err


def test_an_unsafe_socket_directory_fails_check_config(
    tmp_path: Path, sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (sock_dir / "iw").mkdir(mode=0o755)
    os.chmod(sock_dir / "iw", 0o777)
    f = _config(tmp_path, sock_dir, "")
    assert main(["sidecar", "--check-config", str(f), "--no-gpu", "--no-drift"]) == 1
    assert "unsafe socket directory" in capsys.readouterr().err
    assert main(["sidecar", "--check-config", str(f), "--no-gpu", "--no-drift", "--set",
                 "ingest.socket_dir_shared=true"]) == 0


def test_bad_otlp_settings_fail_check_config(
    tmp_path: Path, sock_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    f = _config(tmp_path, sock_dir, "")
    assert main(["sidecar", "--check-config", str(f), "--no-gpu", "--no-drift"]) == 1
    assert "start-up would fail: OTLP exporter:" in capsys.readouterr().err


def test_check_config_binds_and_creates_nothing(
    tmp_path: Path, sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with held_port(socket.SOCK_DGRAM) as (_, port):  # a UDP port start-up could not bind: not a config error
        f = _config(tmp_path, sock_dir, "")
        assert main(["sidecar", "--check-config", str(f), "--no-gpu", "--no-drift", "--udp-port", str(port)]) == 0
    assert "configuration is valid" in capsys.readouterr().out
    assert list(sock_dir.iterdir()) == [], "the socket directory is not created by a check"

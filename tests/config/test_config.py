"""Configuration: precedence, and every kind of config error stops start-up with a message that says what to fix."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inferwatch_sidecar.config import ConfigError, SidecarConfig, load_config, parse_set
from tests.helpers.net import free_port, held_port
from tests.helpers.sidecar import REPO


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "sidecar.yaml"
    p.write_text(text)
    return p


def test_defaults_are_local_and_valid() -> None:
    cfg = load_config(environ={})
    assert cfg.http.host == "127.0.0.1"
    assert cfg.ingest.udp_host == "127.0.0.1" and cfg.ingest.udp_port is None
    assert cfg.ingest.socket == "/tmp/inferwatch/ingest.sock"
    assert cfg.http.admin_token is None


def test_precedence_yaml_then_env_then_flags(tmp_path: Path) -> None:
    f = write(tmp_path, "http:\n  port: 9001\n  host: 0.0.0.0\ningest:\n  max_producers: 7\n")
    cfg = load_config(f, environ={})
    assert (cfg.http.port, cfg.http.host, cfg.ingest.max_producers) == (9001, "0.0.0.0", 7)
    env = {"INFERWATCH_HTTP__PORT": "9002", "INFERWATCH_SERVICE": "sdk-var-ignored"}
    cfg = load_config(f, environ=env)
    assert (cfg.http.port, cfg.http.host) == (9002, "0.0.0.0")
    tree, src = parse_set(["http.port=9003", "labels.max_values.model=5"])
    cfg = load_config(f, environ=env, overrides=tree, override_sources=src)
    assert cfg.http.port == 9003 and cfg.labels.max_values["model"] == 5
    # Nested maps merge rather than replace: other budgets keep their defaults.
    assert cfg.labels.max_values["stage"] == 50


def test_env_admin_token_and_lists() -> None:
    cfg = load_config(environ={"INFERWATCH_ADMIN_TOKEN": "0123456789abcdef-secret",
                               "INFERWATCH_INGEST__QUEUE_STAGES": "[queue, wait]"})
    assert cfg.http.admin_token is not None and cfg.http.admin_token.get_secret_value() == "0123456789abcdef-secret"
    assert cfg.ingest.queue_stages == ["queue", "wait"]
    assert "0123456789abcdef" not in repr(cfg)


@pytest.mark.parametrize(
    ("yaml_text", "env", "expected"),
    [
        ("http:\n  port: 70000\n", {}, "http.port: Input should be less than or equal to 65535"),
        ("http:\n  port: abc\n", {}, "http.port: Input should be a valid integer"),
        ("http:\n  prot: 1\n", {}, "http.prot: unknown field"),
        ("bogus_section: {}\n", {}, "bogus_section: unknown field"),
        ("ingest:\n  rcvbuf_bytes: 10\n", {}, "ingest.rcvbuf_bytes: Input should be greater than or equal to 65536"),
        ("labels:\n  max_values:\n    model: 0\n", {}, "labels.max_values: Value error, budget for label 'model' must be >= 1"),
        ("http:\n  admin_token: short\n", {}, "http.admin_token: Value error, must be at least 16 characters"),
        ("shutdown_timeout_s: -1\n", {}, "shutdown_timeout_s: Input should be greater than 0"),
        ("gpu:\n  enabledd: true\n", {}, "gpu.enabledd: unknown field"),
        ("drift: 3\n", {}, "drift: Input should be a valid dictionary"),
        ("", {"INFERWATCH_HTTP__PORT": "-5"}, "[from environment variable INFERWATCH_HTTP__PORT]"),
        ("", {"INFERWATCH_INGEST__MAX_PRODUCERS": "many"}, "ingest.max_producers: Input should be a valid integer"),
        ("", {"INFERWATCH_NOPE__X": "1"}, "nope: unknown field"),
    ],
)
def test_config_errors_name_field_problem_and_source(tmp_path: Path, yaml_text: str, env: dict[str, str], expected: str) -> None:
    f = write(tmp_path, yaml_text)
    with pytest.raises(ConfigError) as e:
        load_config(f, environ=env)
    msg = str(e.value)
    assert expected in msg, msg
    assert msg.startswith("invalid configuration")
    if not env:
        assert f"[from config file {f}]" in msg


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http: [1, 2\n", "not valid YAML at line 2"),
        ("- a\n- b\n", "the top level must be a mapping of sections, got list"),
        ("!!python/object:os.system {}\n", "not valid YAML"),  # safe_load refuses arbitrary tags
    ],
)
def test_unreadable_yaml_is_a_clear_error(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_config(write(tmp_path, text), environ={})


def test_missing_file_and_bad_set_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        load_config(tmp_path / "absent.yaml", environ={})
    with pytest.raises(ConfigError, match="expected SECTION.FIELD=VALUE"):
        parse_set(["http.port"])
    with pytest.raises(ConfigError, match="empty name part"):
        load_config(environ={"INFERWATCH_HTTP____PORT": "1"})


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "OTEL_"))}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "inferwatch_sidecar.cli", "sidecar", *args],
                          capture_output=True, text=True, env=e, cwd=REPO, timeout=timeout)


def test_check_config_cli_valid_and_invalid(tmp_path: Path) -> None:
    good = write(tmp_path, "http:\n  port: 9464\n")
    r = cli("--check-config", str(good))
    assert r.returncode == 0 and "configuration is valid" in r.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("ingest:\n  max_producers: 0\n")
    r = cli("--check-config", str(bad))
    assert r.returncode == 2
    assert "ingest.max_producers: Input should be greater than or equal to 1" in r.stderr
    # Flags are validated too, and say which flag was wrong.
    r = cli("--check-config", str(good), "--http-port", "99999")
    assert r.returncode == 2 and "[from --http-port]" in r.stderr
    r = cli("--print-config", "--set", "http.port=1234")
    assert r.returncode == 0 and "port: 1234" in r.stdout


def test_startup_errors_exit_nonzero_with_a_message(tmp_path: Path) -> None:
    # The socket path is a regular file: refuse rather than delete it.
    f = tmp_path / "not-a-socket"
    f.write_text("data")
    r = cli("--socket", str(f), "--http-port", str(free_port()), "--no-gpu", "--no-drift")
    assert r.returncode == 1 and "exists and is not a socket" in r.stderr
    assert f.read_text() == "data"
    # The HTTP port is taken.
    with held_port(listen=True) as (_, port):
        r = cli("--socket", str(tmp_path / "s.sock"), "--http-port", str(port), "--no-gpu", "--no-drift")
    assert r.returncode == 1 and f"http.port: cannot listen on 127.0.0.1:{port}" in r.stderr
    assert not (tmp_path / "s.sock").exists()  # the ingest socket was cleaned up


def test_stale_socket_is_replaced_but_a_live_one_is_not(tmp_path: Path, sidecar_factory: Any) -> None:
    path = tmp_path / "iw" / "ingest.sock"
    path.parent.mkdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stale.bind(str(path))
    stale.close()  # the file stays behind, as after a crash
    sc = sidecar_factory(sock=str(path))
    assert oct(path.stat().st_mode & 0o777) == oct(0o666)
    r = cli("--socket", str(path), "--http-port", str(free_port()), "--no-gpu", "--no-drift")
    assert r.returncode == 1 and "another process is already receiving" in r.stderr
    assert sc.get("/healthz")[0] == 200


def test_config_object_is_strict_about_extra_keys() -> None:
    with pytest.raises(Exception, match="extra"):
        SidecarConfig.model_validate({"http": {"port": 1, "x": 2}})

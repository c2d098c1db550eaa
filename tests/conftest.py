"""Fixtures shared by every test package.

Component-specific fixtures live in each subfolder's own conftest.py; the helpers these fixtures are built
on are plain modules in tests/helpers/.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.net import free_port
from tests.helpers.sidecar import SidecarProc

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

__all__ = ["IN_CI", "free_port", "require_binary"]  # free_port: tests/helpers/net.py, imported here by older tests


def require_binary(name: str) -> str:
    """Path of a required external binary.

    Locally a missing binary skips the test; in CI (CI=true) it fails it,
    because CI must install everything the suite needs.
    """
    path = shutil.which(name)
    if path is None:
        msg = f"{name} is not on PATH (install Debian's 'prometheus' package)"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@pytest.fixture
def promtool() -> str:
    return require_binary("promtool")


@pytest.fixture
def prometheus_bin() -> str:
    return require_binary("prometheus")


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A new, short directory in /tmp, removed after the test: Unix socket paths stop at 107 bytes, and pytest's
    ``tmp_path`` can be longer."""
    d = Path(tempfile.mkdtemp(prefix="iw", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def sock_path(sock_dir: Path) -> str:
    """``ingest.sock`` in :func:`sock_dir` (not created)."""
    return str(sock_dir / "ingest.sock")


@pytest.fixture
def sidecar_factory(tmp_path: Path) -> Iterator[Any]:
    """``make(*args, env=None, start=True, **kw)``: a real sidecar (:class:`~tests.helpers.sidecar.SidecarProc`),
    killed after the test if it is still running."""
    procs: list[SidecarProc] = []

    def make(*args: str, env: dict[str, str] | None = None, start: bool = True, **kw: Any) -> SidecarProc:
        p = SidecarProc(tmp_path, list(args), env, **kw)
        procs.append(p)
        return p.start() if start else p

    yield make
    for p in procs:
        if p.proc is not None and p.proc.poll() is None:
            p.stop(signal.SIGKILL)

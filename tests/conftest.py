"""Fixtures shared by every test package.

Component-specific fixtures live in each subfolder's own conftest.py.
"""

from __future__ import annotations

import os
import shutil
import socket

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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

"""A model server instrumented with the real SDK, under uvicorn in a subprocess, sending to a test's sidecar."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from tests.helpers.net import free_port
from tests.helpers.paths import REPO
from tests.helpers.sidecar import wait_until

__all__ = ["SdkApp", "stop_process"]


def stop_process(proc: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited after ``timeout`` seconds; returns once it has exited."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class SdkApp:
    """``uvicorn APP`` on a free loopback port, its SDK configured by ``INFERWATCH_*`` to send to ``sidecar_sock``.

    :meth:`up` asks ``probe`` and counts the probes answered 200 in :attr:`probes`: they are real requests, which
    the sidecar counts too.

    Args:
        app: the ``module:attribute`` uvicorn serves (from the checkout's root).
        sidecar_sock: the sidecar's ingest socket.
        labels: ``service``, ``model`` and ``model_version`` of the SDK.
        probe: the path :meth:`up` asks.
        workers: uvicorn worker processes.
    """

    def __init__(self, app: str, sidecar_sock: str, labels: Mapping[str, str], probe: str, workers: int = 1) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.probe = probe
        self.probes = 0
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
        self.env.update({"INFERWATCH_SIDECAR": "unix://" + sidecar_sock, "INFERWATCH_SERVICE": labels["service"],
                         "INFERWATCH_MODEL": labels["model"], "INFERWATCH_MODEL_VERSION": labels["model_version"]})
        self.args = [sys.executable, "-m", "uvicorn", app, *(["--workers", str(workers)] if workers > 1 else []),
                     "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 40.0) -> SdkApp:
        """Start it and wait until :meth:`up`."""
        self.proc = subprocess.Popen(self.args, cwd=REPO, env=self.env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        wait_until(self.up, timeout=timeout, what="uvicorn app up")
        return self

    def up(self) -> bool:
        import httpx

        try:
            ok = httpx.get(self.base + self.probe, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False
        self.probes += ok
        return ok

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout)

"""The demo's child processes: the model servers and the sidecar, started, awaited and stopped.

Every child runs in its own session with its output in a log file, so a
Ctrl-C in the terminal reaches only the runner, which stops the children in
order, and a child's failure comes with the end of its log
(:class:`ProcessError`). Children get this process's environment without any
``INFERWATCH_*`` variable: they see exactly the settings the scenario gives.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from inferwatch_sidecar.demo import model as mdl

#: The service name the model servers report.
SERVICE = "demo-credit"
#: The order :func:`stop_all` stops children in: the servers before the sidecar, so their last events arrive.
STOP_ORDER = ("stable", "canary", "sidecar")


class ProcessError(RuntimeError):
    """A child process exited or did not become ready; the message names it and shows its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Process:
    """A child process in its own session, with its output in a log file.

    Args:
        name: what messages call it.
        argv: the command.
        env: its environment (None: this process's).
        log_path: where its stdout and stderr go.
    """

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.p = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def check(self) -> None:
        """Raise :class:`ProcessError` if the process has exited."""
        if self.p.poll() is not None:
            raise ProcessError(f"{self.name} exited with status {self.p.returncode}:\n{self.log_tail()}")

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``timeout``; returns the exit status."""
        if self.p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
        else:
            # The leader exited; make sure no worker it left behind survives.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.p.pid, signal.SIGKILL)
        self._log.close()
        return self.p.returncode


def check_all(procs: Iterable[Process]) -> None:
    """Raise :class:`ProcessError` for the first of ``procs`` that has exited."""
    for p in procs:
        p.check()


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def wait_ready(proc: Process, url: str, deadline: float, watch: Iterable[Process] = ()) -> None:
    """Poll ``url`` until it answers 200.

    Raises:
        ProcessError: ``proc`` or a process in ``watch`` exited, or ``deadline`` (monotonic) passed.
    """
    while True:
        check_all((proc, *watch))
        try:
            if _http_status(url) == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ProcessError(f"{proc.name} did not become ready at {url}:\n{proc.log_tail()}")
        time.sleep(0.1)


def child_env() -> dict[str, str]:
    """This process's environment without ``INFERWATCH_*`` variables, with unbuffered Python output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_model_server(role: str, version: str, port: int, workers: int, *, socket_path: str, state_dir: Path,
                       seed: int, token: str, log_dir: Path) -> Process:
    """uvicorn serving :mod:`inferwatch_sidecar.demo.server` on 127.0.0.1:``port``.

    Args:
        role: ``stable`` or ``canary``: the process's name, and the model the server serves.
        version: the model version its SDK reports.
        port: where it listens.
        workers: uvicorn worker processes.
        socket_path: the sidecar's ingest socket.
        state_dir: the fault file and the worker PID files.
        seed: dataset and model seed.
        token: the bearer token of ``/admin/faults``.
        log_dir: where ``<role>.log`` goes.
    """
    env = child_env()
    env.update({
        "INFERWATCH_SIDECAR": f"unix://{socket_path}",
        "INFERWATCH_SERVICE": SERVICE,
        "INFERWATCH_MODEL": mdl.NAME,
        "INFERWATCH_MODEL_VERSION": version,
        "INFERWATCH_DEMO_STATE_DIR": str(state_dir),
        "INFERWATCH_DEMO_ROLE": role,
        "INFERWATCH_DEMO_SEED": str(seed),
        "INFERWATCH_DEMO_ADMIN_TOKEN": token,
    })
    argv = [sys.executable, "-m", "uvicorn", "inferwatch_sidecar.demo.server:app", "--host", "127.0.0.1",
            "--port", str(port), "--workers", str(workers), "--log-level", "warning", "--no-access-log"]
    return Process(role, argv, env, log_dir / f"{role}.log")


def start_sidecar(config_path: Path, log_dir: Path) -> Process:
    """``inferwatch sidecar --config config_path``, logging to ``sidecar.log``."""
    argv = [sys.executable, "-m", "inferwatch_sidecar.cli", "sidecar", "--config", str(config_path)]
    return Process("sidecar", argv, child_env(), log_dir / "sidecar.log")


def sidecar_config(*, socket_path: str, port: int, token: str, reference: str,
                   gpu_processes: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    """The sidecar's config: loopback HTTP with an admin token, short drift windows, the fake NVML backend.

    Args:
        socket_path: the ingest socket.
        port: the HTTP port.
        token: the admin token.
        reference: the drift reference profile.
        gpu_processes: the fake NVML's processes (``gpu.fake.processes``).
        seed: the fake NVML's noise seed.
    """
    return {
        "ingest": {"socket": socket_path, "queue_stages": ["queue"]},
        "http": {"host": "127.0.0.1", "port": port, "admin_token": token},
        "shutdown_timeout_s": 10,
        "gpu": {
            "enabled": True, "backend": "fake", "interval_s": 0.25, "pid_ttl_s": 30,
            # Second-scale detector windows: a 64 MiB/s leak is confirmed about 10 s after it starts.
            "detector": {"scales": [[8.0, 0.5]], "warmup_s": 0, "confirm_s": 1, "clear_s": 5},
            "fake": {"devices": 1, "total_gib": 80, "processes": gpu_processes, "seed": seed},
        },
        "drift": {
            "enabled": True, "reference": reference, "window_seconds": 10, "subwindows": 5,
            "evaluate_interval_s": 1, "min_samples": 100,
        },
    }


def wait_worker_pids(pid_dir: Path, want: dict[str, int], procs: dict[str, Process],
                     deadline: float) -> dict[str, list[int]]:
    """The worker PIDs each server's workers wrote to ``pid_dir`` (files ``<role>-<pid>``).

    Args:
        pid_dir: the servers' PID directory.
        want: role -> how many workers to wait for.
        procs: the running children (a server that exits fails the wait at once).
        deadline: monotonic time to give up at.

    Raises:
        ProcessError: a child exited, or the workers did not all start by ``deadline``.
    """
    while True:
        check_all(procs.values())
        got: dict[str, list[int]] = {r: [] for r in want}
        if pid_dir.is_dir():
            for f in sorted(pid_dir.iterdir()):
                role, _, pid = f.name.partition("-")
                if role in got and pid.isdigit():
                    got[role].append(int(pid))
        if all(len(got[r]) >= n for r, n in want.items()):
            return got
        if time.monotonic() > deadline:
            raise ProcessError(f"model server workers did not start in time (have {got}):\n"
                               + "\n".join(procs[r].log_tail() for r in want))
        time.sleep(0.1)


def stop_all(procs: dict[str, Process]) -> dict[str, int | None]:
    """Stop and remove every process in ``procs`` (:data:`STOP_ORDER` first); returns their exit statuses."""
    order = [n for n in STOP_ORDER if n in procs] + [n for n in procs if n not in STOP_ORDER]
    return {name: procs.pop(name).stop() for name in order}

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

#: The service name the model servers report.
SERVICE = "demo-credit"
#: The order :func:`stop_all` stops children in: the servers before the sidecar, so their last events arrive.
STOP_ORDER = ("stable", "canary", "sidecar")
#: What the Triton demo server's Python needs (PyTriton pins numpy<2: a virtualenv of its own).
TRITON_REQUIREMENTS = ('"nvidia-pytriton>=0.7,<0.8" opentelemetry-sdk opentelemetry-exporter-otlp-proto-http')


class ProcessError(RuntimeError):
    """A child process exited or did not become ready; the message names it and shows its log."""


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port on 127.0.0.1 that was free a moment ago (TCP, or UDP with ``socket.SOCK_DGRAM``).

    Nothing listens on it once this returns, so it also serves as a port that refuses connections. The
    checkout's one free-port finder: the demo's children, the tests (``tests/helpers/net.py``), the
    benchmarks (``bench/_harness.py``) and the fuzzers (``scripts/``) all take their ports from here.
    """
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Process:
    """A child process in its own session, with its output in a log file.

    Args:
        name: what messages call it.
        argv: the command.
        env: its environment (None: this process's).
        log_path: where its stdout and stderr go.
        signal_group: :meth:`stop` sends SIGTERM to the whole process group; False sends it to the process
            alone, which stops its own children (PyTriton must stop tritonserver itself), and what is left of
            the group is killed once it exits.
        stop_timeout: how long :meth:`stop` waits before SIGKILL.
    """

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None, log_path: Path,
                 signal_group: bool = True, stop_timeout: float = 10.0) -> None:
        self.name = name
        self.log_path = log_path
        self.signal_group = signal_group
        self.stop_timeout = stop_timeout
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

    def terminate(self) -> None:
        """Send SIGTERM to the process group (or to the process alone); :meth:`stop` waits for the exit."""
        if self.p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if self.signal_group:
                    os.killpg(self.p.pid, signal.SIGTERM)
                else:
                    self.p.send_signal(signal.SIGTERM)

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM (see :meth:`terminate`), SIGKILL the group after ``timeout``; returns the exit status.

        Args:
            timeout: seconds to wait for the exit (None: ``stop_timeout``).
        """
        self.terminate()
        if self.p.poll() is None:
            try:
                self.p.wait(self.stop_timeout if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
        # The leader has exited: nothing it left behind in its group may survive.
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
    from inferwatch_sidecar.demo import model as mdl  # numpy: only where a model server is started

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


def default_triton_python() -> str:
    """``.venv-triton/bin/python`` of the source checkout when it exists (scripts/test builds it), else this Python."""
    venv = Path(__file__).resolve().parents[3] / ".venv-triton" / "bin" / "python"
    return str(venv) if venv.is_file() else sys.executable


def triton_python_problem(python: str) -> str | None:
    """Why ``python`` cannot run the Triton demo server (None: it can): what to install there."""
    try:
        r = subprocess.run([python, "-c", "import pytriton.triton, opentelemetry.sdk, numpy"], capture_output=True,
                           text=True, timeout=60, env=child_env())
    except OSError as e:
        return f"{python} cannot be run ({e.strerror}): pass --triton-python with a Python that has PyTriton"
    if r.returncode == 0:
        return None
    missing = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit status {r.returncode}"
    return (f"{python} cannot import PyTriton ({missing}); install it there with\n"
            f"  {python} -m pip install {TRITON_REQUIREMENTS}\n"
            "(PyTriton pins numpy<2, so use a virtualenv of its own and pass --triton-python; in a checkout, "
            "scripts/test builds .venv-triton)")


def _package_dirs() -> list[str]:
    """The directories that hold ``inferwatch`` and ``inferwatch_sidecar``, for another interpreter's path."""
    import inferwatch
    import inferwatch_sidecar

    dirs = [str(Path(m.__file__ or "").resolve().parents[1]) for m in (inferwatch, inferwatch_sidecar)]
    return list(dict.fromkeys(dirs))


def start_triton_server(python: str, role: str, *, http_port: int, grpc_port: int, metrics_port: int, sidecar_url: str,
                        socket_path: str, state_dir: Path, seed: int, log_dir: Path) -> Process:
    """PyTriton serving :mod:`inferwatch_sidecar.demo.triton_server` on 127.0.0.1, with ``python``.

    ``python`` imports the SDK and the demo's model from this installation's directories (on its
    ``PYTHONPATH``), and PyTriton from its own site-packages.

    Args:
        python: an interpreter with PyTriton (:func:`triton_python_problem` says whether it has).
        role: ``stable`` or ``canary``: the process's name, and the model it serves.
        http_port / grpc_port / metrics_port: Triton's ports.
        sidecar_url: where Triton sends its traces (``/v1/traces``).
        socket_path: the sidecar's ingest socket (the callable's records).
        state_dir: the fault file and the PID file.
        seed: dataset and model seed.
        log_dir: where ``triton-<role>.log`` goes.
    """
    env = {k: v for k, v in child_env().items() if not k.startswith("OTEL_")}
    env.update({
        "INFERWATCH_SIDECAR": f"unix://{socket_path}",
        "INFERWATCH_DEMO_STATE_DIR": str(state_dir),
        "INFERWATCH_DEMO_SEED": str(seed),
        "PYTHONPATH": os.pathsep.join(_package_dirs()),
    })
    argv = [python, "-m", "inferwatch_sidecar.demo.triton_server", "--role", role, "--sidecar-url", sidecar_url,
            "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)]
    # SIGTERM to the leader only: triton.stop() stops tritonserver and its python-backend stubs in order.
    return Process(role, argv, env, log_dir / f"triton-{role}.log", signal_group=False, stop_timeout=30.0)


def start_sidecar(config_path: Path, log_dir: Path) -> Process:
    """``inferwatch sidecar --config config_path``, logging to ``sidecar.log``."""
    argv = [sys.executable, "-m", "inferwatch_sidecar.cli", "sidecar", "--config", str(config_path)]
    return Process("sidecar", argv, child_env(), log_dir / "sidecar.log")


def sidecar_config(*, socket_path: str, port: int, token: str, reference: str,
                   gpu_processes: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    """The sidecar's config: loopback HTTP with an admin token, the fake NVML backend, short windows.

    Args:
        socket_path: the ingest socket.
        port: the HTTP port.
        token: the admin token.
        reference: the drift reference profile.
        gpu_processes: the fake NVML's processes (``gpu.fake.processes``).
        seed: the fake NVML's noise seed.
    """
    from inferwatch_sidecar.demo import model as mdl

    return {
        "ingest": {"socket": socket_path, "queue_stages": ["queue"]},
        "http": {"host": "127.0.0.1", "port": port, "admin_token": token},
        "shutdown_timeout_s": 10,
        "gpu": {
            "enabled": True, "backend": "fake", "interval_s": 0.25, "pid_ttl_s": 30,
            # Second-scale detector windows: a 64 MiB/s leak is confirmed about 10 s after it starts. The
            # warm-up prior shrinks with them (20 min in production, 2 s here).
            "detector": {"scales": [[8.0, 0.5]], "warmup_s": 0, "confirm_s": 1, "clear_s": 5, "tau_max_s": 2.0},
            "fake": {"devices": 1, "total_gib": 80, "processes": gpu_processes, "seed": seed},
        },
        "drift": {
            "enabled": True, "reference": reference, "window_seconds": 10, "subwindows": 5,
            "evaluate_interval_s": 1, "min_samples": 100,
        },
        # The canary judged every second over the last 10 s, from 50 requests a version: the healthy canary
        # has a verdict a few seconds after the load starts, before the faults. The stable version is the
        # busiest (60% of the predictions); Triton's spans name the versions 1 and 2, not v1 and v2.
        # The inference stage's latency is critical as well as the end-to-end one: with Triton, a 3 s latency spike
        # holds a model instance and queues both versions' requests behind it, which can hide the canary's 30 ms
        # in their end-to-end latency; its inference stage (Triton's compute time) still shows it. Not every
        # stage: on a loaded machine the healthy canary's preprocess stage can be measurably slower.
        "canary": {"window_seconds": 10, "subwindows": 5, "evaluate_interval_s": 1, "min_requests": 50,
                   "critical": ["error_rate", "latency", "latency_p99", "stage_latency[inference]"]},
        # 15 s windows hold about 500 requests of v1: enough for a slowest 1% of 5.
        "tail": {"window_seconds": 15, "min_tail_requests": 5},
        # Goodput against an end-to-end objective the demo's model meets even under its 3 s latency spikes
        # (the queue dashboard's goodput panel has data; no burn-rate alert joins the demo's expected ones).
        # One-second windows, a level from two of them: the load rises once in the baseline (half the rate,
        # then all of it: ScenarioConfig.load_scale) and the latency spike piles requests up behind it, so a
        # run of a minute shows the rising line and the levels beyond the knee (docs/capacity.md).
        "capacity": {"slo": [{"model": mdl.NAME, "e2e_seconds": 5.0, "objective": 0.99}],
                     "window_seconds": 1.0, "min_windows": 2, "evaluate_interval_s": 1.0},
    }


def saturation_config(url: str, model: str, version: str) -> dict[str, Any]:
    """The ``engines:`` and ``saturation:`` sections of the ``saturation`` fault: the demo server's engine facts
    (:mod:`.engine_sim`) scraped every half second, judged with second-scale holds and no GPU reading (the fake
    GPU would add a compute or bandwidth verdict of its own). ``cpu_cores`` 0.5: the two workers may use half a
    core, as under a container CPU limit of 500m (the demo runs on shared laptops and CI machines, where a
    worker seldom gets a whole core)."""
    return {
        "engines": {"interval_s": 0.5, "targets": [{"url": url, "name": "demo-server", "kind": "vllm",
                                                    "service": SERVICE, "model": model, "model_version": version,
                                                    "cpu_cores": 0.5}]},
        "saturation": {"gpm": {"backend": "off", "interval_s": 0.5}, "enter_hold_s": 2.0, "exit_hold_s": 3.0,
                       "smoothing_s": 1.0},
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
    """Stop and remove every process in ``procs``; returns their exit statuses.

    The model servers get SIGTERM together (a Triton takes seconds to unload its model) and are awaited
    before the sidecar is stopped, so their last events arrive; then the sidecar, then anything else.
    """
    servers = [n for n in STOP_ORDER if n in procs and n != "sidecar"]
    for name in servers:
        procs[name].terminate()
    order = servers + [n for n in STOP_ORDER if n in procs and n == "sidecar"] + [n for n in procs if n not in STOP_ORDER]
    return {name: procs.pop(name).stop() for name in order}

"""A real ``inferwatch sidecar`` in a subprocess, on loopback and a temp socket, and reading what it exports.

Every test package uses these (the ``sidecar_factory`` fixture of tests/conftest.py builds
:class:`SidecarProc` and kills what a test left running); so do the benchmarks (``bench/``) and the fuzzers
(``scripts/fuzz_*.py``), which put the checkout on ``sys.path`` to import it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.helpers.net import free_port
from tests.helpers.paths import REPO

__all__ = ["QUIET", "REPO", "SIDECAR_CLI", "SidecarProc", "parse_metrics", "sample", "total", "wait_until"]


def wait_until(pred: Any, timeout: float = 10.0, interval: float = 0.02, what: str = "condition") -> Any:
    """Poll ``pred`` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last value {last!r})")


#: How :class:`SidecarProc` runs ``inferwatch sidecar`` (after the interpreter), by default.
SIDECAR_CLI = ("-m", "inferwatch_sidecar.cli", "sidecar")
#: Runs ``inferwatch sidecar`` as ``python -m inferwatch_sidecar.cli`` does; on SIGUSR2 it writes the names of the
#: imported modules to the file ``$IW_MODULES`` names (importing nothing to do so). For ``SidecarProc(launcher=...)``:
#: the idle-imports test and ``bench/idle_rss.py``.
MODULES_LAUNCHER = (
    "-c",
    "import os, signal, sys\n"
    "def _dump(*_):\n"
    "    p = os.environ['IW_MODULES']\n"
    "    with open(p + '.tmp', 'w') as f:\n"
    "        f.write('\\n'.join(sorted(sys.modules)) + '\\n')\n"
    "    os.replace(p + '.tmp', p)\n"
    "signal.signal(signal.SIGUSR2, _dump)\n"
    "from inferwatch_sidecar.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n",
    "sidecar",
)
#: The components a test sidecar runs without unless it asks: no GPU, no drift reference.
QUIET = ("--no-gpu", "--no-drift")


class SidecarProc:
    """A running ``inferwatch sidecar`` subprocess: the one way the tests, benchmarks and fuzzers start one.

    Args:
        tmp: where its ingest socket (``iw/ingest.sock`` unless ``sock``) and its log go.
        extra_args: flags after the defaults (``--set``, ``--config``, ``--udp-port``...).
        env: added to this process's environment, from which every ``INFERWATCH_*`` and ``OTEL_*`` is removed.
        port: its HTTP port (default: a free one).
        sock: its ingest socket.
        defaults: flags before ``extra_args``: :data:`QUIET`, or ``("--no-gpu",)`` for every default component.
        launcher: what runs after the interpreter, up to the sidecar's flags (:data:`SIDECAR_CLI`; e.g. with
            ``--log-level WARNING`` before ``sidecar``, or a probe script that runs the CLI).
        repo: run the sidecar from this source tree (cwd and ``PYTHONPATH``); None: this checkout as installed.
        ready_timeout: seconds :meth:`start` waits for ``/readyz``.
    """

    def __init__(self, tmp: Path, extra_args: list[str] | None = None, env: dict[str, str] | None = None,
                 port: int | None = None, sock: str | None = None, *, defaults: Sequence[str] = QUIET,
                 launcher: Sequence[str] = SIDECAR_CLI, repo: Path | None = None,
                 ready_timeout: float = 15.0) -> None:
        self.port = port or free_port()
        self.sock = sock or str(tmp / "iw" / "ingest.sock")
        self.log_path = tmp / f"sidecar-{self.port}-{time.monotonic_ns()}.log"
        self.args = [sys.executable, *launcher, "--socket", self.sock, "--http-port", str(self.port), *defaults,
                     *(extra_args or [])]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "OTEL_"))}
        if repo is not None:
            self.env["PYTHONPATH"] = os.pathsep.join([str(repo / "sdk"), str(repo / "sidecar")])
        self.env.update(env or {})
        self.cwd = repo or REPO
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> SidecarProc:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd)
        if wait:
            wait_until(self.ready, timeout=self.ready_timeout, what=f"sidecar ready (log: {self.log})")
            self.ready_after = time.monotonic() - self.started_at
        return self

    def ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"sidecar exited with {self.proc.returncode}:\n{self.log}")
        try:
            with urllib.request.urlopen(self.url + "/readyz", timeout=1) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, ConnectionError, OSError):
            return False

    @property
    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(self.url + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                data = r.read()
                code = r.status
        except urllib.error.HTTPError as e:
            data = e.read()
            code = e.code
        try:
            return code, json.loads(data)
        except ValueError:
            return code, data

    def status(self) -> dict[str, Any]:
        code, _, body = self.get("/v1/status")
        assert code == 200
        return json.loads(body)  # type: ignore[no-any-return]

    def metrics(self) -> str:
        code, _, body = self.get("/metrics")
        assert code == 200, body
        return body.decode()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15, *, check: bool = True) -> int:
        """Send ``sig`` and wait for the exit; after ``timeout`` seconds it is killed, which fails unless not
        ``check``. Returns the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                if check:
                    raise AssertionError(f"sidecar did not stop within {timeout}s:\n{self.log}") from None
        self._log.close()
        return int(self.proc.returncode)


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Samples of a Prometheus text exposition keyed by (name, sorted labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def sample(samples: dict[Any, float], name: str, **labels: str) -> float:
    """The value of one sample, 0 when absent."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: dict[Any, float], name: str, **match: str) -> float:
    """Sum of every sample of ``name`` whose labels include ``match``."""
    return sum(v for (n, labs), v in samples.items() if n == name and all((k, v2) in labs for k, v2 in match.items()))

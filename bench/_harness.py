"""What the benchmarks share: loopback ports, callgrind's instruction counts, and the checkout on ``sys.path``.

Benchmarks run as scripts (``python bench/NAME.py``), so this module is found next to them on
``sys.path``; each one imports it after putting the checkout's ``sdk/`` and ``sidecar/`` first.

Instruction counts are the noise-free figure on a shared machine: :func:`callgrind_instructions`
runs a command under ``valgrind --tool=callgrind`` and returns the program's total. A cost per unit
is the difference of two runs that differ only in the work measured (start-up and imports cancel),
divided by the units of that difference (a child that callgrind counts should not import this module: what it
imports would move into the counted runs). Every benchmark counts through :func:`callgrind_run` (or, for a
server measured while it runs, :data:`CALLGRIND_PREFIX` and :func:`collected`).

A real sidecar is ``tests.helpers.sidecar.SidecarProc``, as in the tests: importing this module puts the
checkout on ``sys.path`` (last) so that benchmarks can import it.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

#: The checkout's root.
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # tests.helpers: the one sidecar starter
    sys.path.append(str(REPO))
#: The same string hashing in every run, so that two runs differ only in the work measured.
STABLE_HASH_ENV = {"PYTHONHASHSEED": "0"}


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port on 127.0.0.1 that was free a moment ago (TCP, or UDP with ``socket.SOCK_DGRAM``).

    The checkout's one finder, :func:`inferwatch_sidecar.demo.supervise.free_port`, imported when called: the
    children a benchmark counts under callgrind import this module too, and need nothing of the sidecar's.
    """
    from inferwatch_sidecar.demo.supervise import free_port as find

    return find(kind)


def require_valgrind(alternative: str = "") -> None:
    """Stop with what to install when valgrind is not on PATH (``alternative``: the flag that skips it)."""
    if shutil.which("valgrind") is None:
        hint = f", or run with {alternative}" if alternative else ""
        raise SystemExit(f"valgrind is not installed (Debian: apt-get install -y valgrind){hint}")


#: A program under callgrind that writes no output file: its total is the ``Collected :`` line it prints on
#: stderr at exit (:func:`collected`). For a server measured while it runs; a command that runs to its end
#: uses :func:`callgrind_run`.
CALLGRIND_PREFIX = ("valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null")


class CallgrindFailed(SystemExit):
    """A callgrind run failed or printed no total; uncaught, it stops the benchmark with the message."""


def collected(stderr: str) -> int | None:
    """The instructions callgrind reports on ``stderr`` when its program exits (the last ``Collected :`` line)."""
    found = re.findall(r"Collected\s*:\s*(\d+)", stderr)
    return int(found[-1]) if found else None


class CallgrindRun(NamedTuple):
    """One program run to its end under callgrind: its instruction total and its output."""

    instructions: int
    stdout: str
    stderr: str


def callgrind_run(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  base_env: Mapping[str, str] | None = None, cwd: Path = REPO, timeout: float = 1800.0) -> CallgrindRun:
    """Run ``argv`` under ``valgrind --tool=callgrind``: the instructions it executed (the output file's
    ``summary:`` or ``totals:`` line) and what it printed.

    Args:
        env: added to the environment.
        base_env: the environment to start from (default: this process's).
        cwd: where it runs.
        timeout: seconds before it is killed.

    Raises:
        CallgrindFailed: the run exited non-zero (the message ends with its stderr) or left no total.
    """
    require_valgrind()
    with tempfile.TemporaryDirectory(prefix="iw-cg-") as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout, check=False,
                           env={**(os.environ if base_env is None else base_env), **(env or {})})
        if r.returncode != 0:
            raise CallgrindFailed(f"callgrind run failed ({r.returncode}): {' '.join(argv)}\n{r.stderr[-2000:]}")
        m = re.search(r"^(?:summary|totals):\s+(\d+)", out.read_text(), re.M)
        if m is None:
            raise CallgrindFailed(f"no instruction total in callgrind's output for {' '.join(argv)}")
        return CallgrindRun(int(m.group(1)), r.stdout, r.stderr)


def callgrind_instructions(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path = REPO,
                           timeout: float = 1800.0) -> int:
    """Instructions ``argv`` executes under callgrind (:func:`callgrind_run`); ``env`` is added to this
    process's environment. A failed run stops the benchmark with the end of valgrind's output."""
    return callgrind_run(argv, env=env, cwd=cwd, timeout=timeout).instructions

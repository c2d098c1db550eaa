"""Running ``inferwatch demo`` from the tests, as a user runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

CMD = [sys.executable, "-c", "import sys; from inferwatch._cli import main; sys.exit(main())"]


def run_demo(*args: str, timeout: float = 150, env: dict[str, str] | None = None) -> tuple[str, str]:
    """Run ``inferwatch demo ARGS`` to the end; returns stdout and stderr (exit status 0 asserted).

    A run past ``timeout`` is killed with its whole process group and fails the test with its output.
    """
    p = subprocess.Popen([*CMD, "demo", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"demo did not finish in time:\n{out}\n{err}")
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    assert "did not stop cleanly" not in err, err
    return out, err

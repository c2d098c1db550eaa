"""The ``inferwatch`` command as a shell user meets it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def test_output_piped_into_a_reader_that_closes_early_exits_quietly() -> None:
    # ``inferwatch sidecar --print-config | head -0``: the reader has closed the
    # pipe before the command writes; it must not print a BrokenPipeError traceback.
    r_fd, w_fd = os.pipe()
    os.close(r_fd)
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferwatch_sidecar.cli", "sidecar", "--print-config"],
        stdout=w_fd, stderr=subprocess.PIPE,
    )
    os.close(w_fd)
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()
    assert proc.returncode in (0, 128 + signal.SIGPIPE)

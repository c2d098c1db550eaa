"""What the benchmarks share: loopback ports and callgrind's instruction counts.

Benchmarks run as scripts (``python bench/NAME.py``), so this module is found next to them on
``sys.path``; each one imports it after putting the checkout's ``sdk/`` and ``sidecar/`` first.

Instruction counts are the noise-free figure on a shared machine: :func:`callgrind_instructions`
runs a command under ``valgrind --tool=callgrind`` and returns the program's total. A cost per unit
is the difference of two runs that differ only in the work measured (start-up and imports cancel),
divided by the units of that difference.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

#: The checkout's root.
REPO = Path(__file__).resolve().parents[1]
#: The same string hashing in every run, so that two runs differ only in the work measured.
STABLE_HASH_ENV = {"PYTHONHASHSEED": "0"}


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port on 127.0.0.1 that was free a moment ago (TCP, or UDP with ``socket.SOCK_DGRAM``)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_valgrind(alternative: str = "") -> None:
    """Stop with what to install when valgrind is not on PATH (``alternative``: the flag that skips it)."""
    if shutil.which("valgrind") is None:
        hint = f", or run with {alternative}" if alternative else ""
        raise SystemExit(f"valgrind is not installed (Debian: apt-get install -y valgrind){hint}")


def callgrind_instructions(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path = REPO,
                           timeout: float = 1800.0) -> int:
    """Instructions ``argv`` executes under callgrind (its ``summary:`` or ``totals:`` line).

    ``env`` is added to this process's environment. A failed run stops the benchmark with the end
    of valgrind's output.
    """
    require_valgrind()
    with tempfile.TemporaryDirectory(prefix="iw-cg-") as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env={**os.environ, **(env or {})},
                           timeout=timeout, check=False)
        if r.returncode != 0:
            raise SystemExit(f"callgrind run failed ({r.returncode}): {' '.join(argv)}\n{r.stderr[-2000:]}")
        m = re.search(r"^(?:summary|totals):\s+(\d+)", out.read_text(), re.M)
        if m is None:
            raise SystemExit(f"no instruction total in callgrind's output for {' '.join(argv)}")
        return int(m.group(1))

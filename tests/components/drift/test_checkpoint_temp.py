"""Issue 28: temporary checkpoint files of killed writers are removed at start (50 kill -9 cycles left 40)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from inferwatch_sidecar.components.drift import checkpoint

WRITER = """
import os, sys, time
from inferwatch_sidecar.components.drift import checkpoint
doc = {"pad": "x" * (4 << 20)}
real_fsync = os.fsync
def stall(fd):
    print("writing", flush=True)
    time.sleep(60)  # killed here: the temporary file is complete but never renamed
os.fsync = stall
checkpoint.write(doc, sys.argv[1])
"""


def test_temp_files_of_killed_writers_are_removed_at_start(tmp_path) -> None:
    path = str(tmp_path / "ck.json")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for _ in range(3):
        p = subprocess.Popen([sys.executable, "-c", WRITER, path], stdout=subprocess.PIPE, env=env)
        assert p.stdout is not None and p.stdout.readline() == b"writing\n"
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
    leftovers = [n for n in os.listdir(tmp_path) if ".tmp." in n]
    assert len(leftovers) == 3
    # One being written right now by a live process is left alone, and so is an unrelated file.
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        live = tmp_path / f".ck.json.tmp.{alive.pid}"
        live.write_text("in progress")
        (tmp_path / ".other.json.tmp.1").write_text("not ours")
        (tmp_path / f".ck.json.tmp.{os.getpid()}").write_text("ours, from before a restart with the same PID")
        assert checkpoint.restore(path, None, None, checkpoint.Failures(), 0.0) is None  # type: ignore[arg-type]
        assert sorted(os.listdir(tmp_path)) == sorted([live.name, ".other.json.tmp.1"])
    finally:
        alive.kill()
        alive.wait()

"""Idle sidecar memory: what ``inferwatch sidecar --no-gpu`` holds before any traffic (issue 28).

Starts the real sidecar (the soak's flags: ``--no-gpu`` and a UDP port, every other component at its
default) ``--runs`` times, one after another; each time it waits for ``/readyz``, then ``--idle`` seconds,
then reads ``/proc/PID/status`` (VmRSS) and ``/proc/PID/smaps_rollup`` (Pss, anonymous and file-backed
RSS), and asks the process (SIGUSR2 to a small launcher around the CLI) for ``sorted(sys.modules)``.
It prints each run and the medians; ``--modules`` also prints the top-level packages imported, with how
many modules each; ``--repo TREE`` measures another source tree (e.g. a snapshot of an older commit) as
well, so one command prints the before and the after side by side.

Every MiB off the idle baseline comes off the soak's peak (bench/soak.py), whose target is 256 MiB.

Usage::

    flock /tmp/bench.lock python bench/idle_rss.py --runs 5
    flock /tmp/bench.lock python bench/idle_rss.py --runs 5 --repo /tmp/snap-before --modules
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO)]  # _harness, and tests.helpers (the one sidecar starter)
from tests.helpers.sidecar import MODULES_LAUNCHER, SidecarProc, wait_until  # noqa: E402

from _harness import free_port  # noqa: E402  (bench/ is a folder of scripts, not a package)


def _kib(path: str, *fields: str) -> dict[str, int]:
    out: dict[str, int] = {}
    with open(path) as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in fields:
                out[key] = int(rest.split()[0])
    return out


def measure(repo: Path, idle: float) -> dict[str, Any]:
    """One sidecar from ``repo``: its memory ``idle`` seconds after it is ready, and its modules."""
    tmp = Path(tempfile.mkdtemp(prefix="iw-idle-"))
    mods_path = tmp / "modules.txt"
    sc = SidecarProc(tmp, ["--udp-port", str(free_port(socket.SOCK_DGRAM))], sock=str(tmp / "s.sock"),
                     env={"IW_MODULES": str(mods_path)}, defaults=("--no-gpu",), launcher=MODULES_LAUNCHER,
                     repo=repo, ready_timeout=60)
    try:
        sc.start()
        time.sleep(idle)
        status = _kib(f"/proc/{sc.pid}/status", "VmRSS", "VmHWM", "RssAnon", "RssFile", "Threads")
        with open(f"/proc/{sc.pid}/status") as f:
            threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
        rollup = _kib(f"/proc/{sc.pid}/smaps_rollup", "Pss", "Anonymous")
        os.kill(sc.pid, signal.SIGUSR2)
        wait_until(mods_path.exists, timeout=10, what="the module list")
        modules = mods_path.read_text().split()
    finally:
        sc.stop(timeout=10, check=False)
    return {
        "rss_mib": status["VmRSS"] / 1024, "hwm_mib": status["VmHWM"] / 1024, "anon_mib": status["RssAnon"] / 1024,
        "file_mib": status["RssFile"] / 1024, "pss_mib": rollup["Pss"] / 1024, "threads": threads,
        "modules": len(modules), "ready_s": sc.ready_after, "names": modules,
    }


def _median(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("rss_mib", "hwm_mib", "pss_mib", "anon_mib", "file_mib", "threads", "modules", "ready_s")
    return {k: statistics.median(r[k] for r in runs) for k in keys}


def _line(label: str, m: dict[str, float]) -> str:
    return (f"{label:>8} {m['rss_mib']:7.1f} {m['hwm_mib']:7.1f} {m['pss_mib']:7.1f} {m['anon_mib']:7.1f} "
            f"{m['file_mib']:7.1f} {m['threads']:7.0f} {m['modules']:7.0f} {m['ready_s']:7.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="sidecars started per tree (default 5)")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds idle after /readyz (default 10)")
    ap.add_argument("--repo", metavar="DIR", help="also measure this source tree (printed first, as 'before')")
    ap.add_argument("--modules", action="store_true", help="print the top-level packages imported, per tree")
    ap.add_argument("--json", metavar="FILE", help="also write the medians (and module lists) as JSON")
    args = ap.parse_args(argv)

    trees = ([("before", Path(args.repo).resolve())] if args.repo else []) + [("this", REPO)]
    result: dict[str, Any] = {}
    print("    tree  rss_mib hwm_mib pss_mib anon    file    threads modules ready_s", flush=True)
    for label, repo in trees:
        runs: list[dict[str, Any]] = []
        for i in range(args.runs):
            runs.append(measure(repo, args.idle))
            print(_line(f"{label}#{i}", runs[-1]), flush=True)
        med = _median(runs)
        print(_line(label, med) + "   (median)", flush=True)
        result[label] = {"repo": str(repo), "median": med, "modules": runs[-1]["names"]}
    if args.modules:
        for label, doc in result.items():
            tops = Counter(n.split(".")[0] for n in doc["modules"])
            print(f"{label}: " + ", ".join(f"{k} {v}" for k, v in sorted(tops.items(), key=lambda kv: -kv[1])))
        if "before" in result:
            gone = sorted(set(result["before"]["modules"]) - set(result["this"]["modules"]))
            tops_gone = Counter(n.split(".")[0] for n in gone)
            print("no longer imported: " + ", ".join(f"{k} {v}" for k, v in sorted(tops_gone.items())))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

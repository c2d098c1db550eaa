"""Atomic checkpoints of the drift windows, so a restart resumes where it stopped.

Format: one UTF-8 JSON document: format name and version, the window settings
(sub-window count, window length) and the ``to_state()`` of every model
version whose reference is built (:meth:`Monitor.to_state
<inferwatch_sidecar.components.drift.monitor.Monitor.to_state>`: ring position,
row and label counters, and each column window's state with its reference).
Nothing in it is executable or unpickled, and every array is checked for its
shape and values when it is read back. It is written to a temporary file in
the same folder, fsynced, then renamed over the old one, so a crash leaves the
old or the new checkpoint, never half of one. A process killed while writing
leaves its temporary file (``.<name>.tmp.<pid>``); at start every such file
whose process is gone (or is this one: a container restarts with the same
PID) is removed, so kill -9 cycles do not fill the disk.

A checkpoint that cannot be used is logged with the reason, counted in
``inferwatch_drift_checkpoint_failures_total{op="read"}`` and ignored: the
component starts with empty windows instead of crashing. A corrupt or
incompatible one (other format version or window settings) is first moved
aside to ``<name>.corrupt-<UTC time>`` or ``<name>.incompatible-<UTC time>``,
so the next checkpoint does not overwrite it; the newest
:data:`KEEP_SET_ASIDE` of each kind are kept. One that cannot be opened
(permissions, I/O error) stays where it is. Windows built against another
reference profile than the configured one are dropped with a warning.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from collections.abc import Iterable
from typing import Any

from inferwatch_sidecar.components.drift.config import DriftConfig
from inferwatch_sidecar.components.drift.monitor import Monitor, ReferenceChanged
from inferwatch_sidecar.components.drift.profile import Profile

FORMAT = "inferwatch-drift-checkpoint"
VERSION = 2
log = logging.getLogger("inferwatch.sidecar.drift")


#: Corrupt (or incompatible) checkpoints kept for inspection, per kind; older ones are deleted.
KEEP_SET_ASIDE = 3
#: The ``reason`` values of ``inferwatch_drift_checkpoint_failures_total`` per ``op``: a closed set,
#: every pair exported from the start (at 0) so that the first failure is an increase.
FAILURE_REASONS: dict[str, tuple[str, ...]] = {
    "read": ("permission", "io", "corrupt", "incompatible"),
    "write": ("no_space", "permission", "io", "error"),
    "set_aside": ("io",),
}


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; ``reason`` is ``corrupt`` or ``incompatible``, the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Failures:
    """Checkpoint failures counted by ``(op, reason)`` of :data:`FAILURE_REASONS`."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {(op, r): 0 for op, rs in FAILURE_REASONS.items() for r in rs}

    def add(self, op: str, reason: str) -> None:
        self.counts[(op, reason)] += 1


def os_reason(e: OSError) -> str:
    """The failure reason of an ``OSError``: no_space, permission or io."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "no_space"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "permission"
    return "io"


def _settings(cfg: DriftConfig) -> dict[str, Any]:
    return {"subwindows": cfg.subwindows, "window_events": cfg.window_events, "window_seconds": cfg.window_seconds}


def document(monitors: Iterable[Monitor], cfg: DriftConfig) -> dict[str, Any]:
    """The checkpoint of ``monitors`` as JSON-able data. Call with the state lock held.

    It holds copies, so it can be written after the lock is released. A model
    version still warming up is left out: it restarts its warm-up.
    """
    return {"format": FORMAT, "version": VERSION, **_settings(cfg),
            "monitors": [m.to_state() for m in monitors if m.profile is not None]}


def write(doc: dict[str, Any], path: str) -> None:
    """Write a checkpoint ``document`` to ``path`` atomically."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp.{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def clean_temp(path: str) -> int:
    """Remove the temporary files of ``path`` left by writers that no longer run; returns how many."""
    folder = os.path.dirname(os.path.abspath(path))
    prefix = f".{os.path.basename(path)}.tmp."
    removed = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(prefix):
            continue
        tail = name[len(prefix):]
        if not tail.isdigit():
            continue
        pid = int(tail)
        if pid != os.getpid() and _pid_alive(pid):
            continue  # another process is writing it now
        try:
            os.unlink(os.path.join(folder, name))
            removed += 1
        except OSError:
            pass
    if removed:
        log.info("drift: removed %d temporary checkpoint file(s) left by killed processes next to %s", removed, path)
    return removed


def restore(path: str, cfg: DriftConfig, reference: Profile | None, failures: Failures,
            now: float) -> dict[tuple[str, str], Monitor] | None:
    """The model versions saved in ``path``, or None (logged and counted) when there is no usable checkpoint.

    Args:
        path: the checkpoint file.
        cfg: the current drift config.
        reference: the configured reference profile, if any.
        failures: where a failure is counted.
        now: Unix time, for the name of a checkpoint moved aside.
    """
    clean_temp(path)
    if not os.path.exists(path):
        log.info("drift: no checkpoint at %s yet; starting with empty windows", path)
        return None
    try:
        monitors = _read(path, cfg, reference)
    except OSError as e:
        reason = "permission" if os_reason(e) == "permission" else "io"
        failures.add("read", reason)
        log.error("drift: cannot read checkpoint %s (%s); starting with empty windows. It is left where it is.",
                  path, e.strerror or e)
        return None
    except CheckpointError as e:
        _refuse(path, e.reason, str(e), failures, now)
        return None
    except Exception as e:  # any other corruption (a field of the wrong type, say): clear log line, fresh start
        _refuse(path, "corrupt", f"{type(e).__name__}: {e}", failures, now)
        return None
    log.info("drift: resumed %d model version(s) from checkpoint %s", len(monitors), path)
    return monitors


def _refuse(path: str, reason: str, why: str, failures: Failures, now: float) -> None:
    failures.add("read", reason)
    try:
        kept = set_aside(path, reason, now)
    except OSError as e:
        failures.add("set_aside", "io")
        log.error("drift: ignoring corrupt or incompatible checkpoint %s (%s); starting with empty windows. It "
                  "cannot be moved aside (%s) and is overwritten at the next checkpoint.", path, why,
                  e.strerror or e)
        return
    log.error("drift: ignoring corrupt or incompatible checkpoint %s (%s); starting with empty windows. Moved it "
              "to %s for inspection (the newest %d are kept).", path, why, kept, KEEP_SET_ASIDE)
    try:
        prune(path, reason)
    except OSError as e:
        failures.add("set_aside", "io")
        log.error("drift: cannot delete older %s checkpoints next to %s: %s", reason, path, e.strerror or e)


def set_aside(path: str, kind: str, now: float) -> str:
    """Rename ``path`` to ``<path>.<kind>-<UTC time>`` and return the new name.

    Raises:
        OSError: the rename failed.
    """
    folder, name = os.path.split(os.path.abspath(path))
    prefix = f"{name}.{kind}-"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    # A second one within the same second gets the next number, never a freed lower one: names keep their age order.
    ages = [_age_order(f[len(prefix):]) for f in os.listdir(folder) if f.startswith(prefix)]
    same = [n for s, n in ages if s == stamp]
    dest = os.path.join(folder, prefix + stamp + (f"-{max(same) + 1}" if same else ""))
    os.rename(path, dest)
    return dest


def prune(path: str, kind: str) -> None:
    """Delete all but the newest ``KEEP_SET_ASIDE`` checkpoints of ``kind`` set aside from ``path``.

    Raises:
        OSError: a deletion failed.
    """
    folder, name = os.path.split(os.path.abspath(path))
    prefix = f"{name}.{kind}-"
    kept = sorted((f for f in os.listdir(folder) if f.startswith(prefix)), key=lambda f: _age_order(f[len(prefix):]))
    for f in kept[:-KEEP_SET_ASIDE]:
        os.unlink(os.path.join(folder, f))


def _age_order(suffix: str) -> tuple[str, int]:
    """Sort key of ``<stamp>`` or ``<stamp>-<n>`` (a second one in the same second): oldest first."""
    stamp, _, n = suffix.partition("-")
    return stamp, int(n) if n.isdigit() else 0


def _read(path: str, cfg: DriftConfig, reference: Profile | None) -> dict[tuple[str, str], Monitor]:
    with open(path, "rb") as f:
        try:
            doc = json.loads(f.read().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise CheckpointError("corrupt", "not a JSON document") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError("corrupt", "not a drift checkpoint")
    if doc.get("version") != VERSION:
        raise CheckpointError("incompatible", f"format version {doc.get('version')!r}, not {VERSION}")
    if {k: doc.get(k) for k in _settings(cfg)} != _settings(cfg):
        raise CheckpointError("incompatible", "window settings changed since it was written")
    restored: dict[tuple[str, str], Monitor] = {}
    for state in doc["monitors"]:
        try:
            mon = Monitor.from_state(state, cfg, reference)
        except ReferenceChanged as e:
            log.warning("drift: %s; dropped", e)
            continue
        restored[mon.key] = mon
    return restored

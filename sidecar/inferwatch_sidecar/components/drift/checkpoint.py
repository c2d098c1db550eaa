"""Atomic checkpoints of the drift windows, so a restart resumes where it stopped.

Format: one UTF-8 JSON document: format name and version, the window settings
(sub-window count, window length) and the ``to_state()`` of every model
version whose reference is built (:meth:`Monitor.to_state
<inferwatch_sidecar.components.drift.monitor.Monitor.to_state>`: ring position,
row and label counters, and each column window's state with its reference).
Nothing in it is executable or unpickled, and every array is checked for its
shape and values when it is read back. It is written to a temporary file in
the same folder, fsynced, then renamed over the old one, so a crash leaves the
old or the new checkpoint, never half of one.

A checkpoint that cannot be read or does not match the current config is
logged with the reason and ignored: the component starts with empty windows
instead of crashing. Windows built against another reference profile than the
configured one are dropped with a warning.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from typing import Any

from inferwatch_sidecar.components.drift.config import DriftConfig
from inferwatch_sidecar.components.drift.monitor import Monitor, ReferenceChanged
from inferwatch_sidecar.components.drift.profile import Profile

FORMAT = "inferwatch-drift-checkpoint"
VERSION = 2
log = logging.getLogger("inferwatch.sidecar.drift")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message says why."""


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


def restore(path: str, cfg: DriftConfig, reference: Profile | None) -> dict[tuple[str, str], Monitor] | None:
    """The model versions saved in ``path``, or None (logged) when there is no usable checkpoint.

    Args:
        path: the checkpoint file.
        cfg: the current drift config.
        reference: the configured reference profile, if any.
    """
    if not os.path.exists(path):
        log.info("drift: no checkpoint at %s yet; starting with empty windows", path)
        return None
    try:
        monitors = _read(path, cfg, reference)
    except Exception as e:  # any corruption: clear log line, fresh start
        log.error("drift: ignoring corrupt or incompatible checkpoint %s (%s); starting with empty windows. "
                  "It is overwritten at the next checkpoint.", path, e)
        return None
    log.info("drift: resumed %d model version(s) from checkpoint %s", len(monitors), path)
    return monitors


def _read(path: str, cfg: DriftConfig, reference: Profile | None) -> dict[tuple[str, str], Monitor]:
    with open(path, "rb") as f:
        try:
            doc = json.loads(f.read().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise CheckpointError("not a JSON document") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise CheckpointError(f"not a version {VERSION} drift checkpoint")
    if {k: doc.get(k) for k in _settings(cfg)} != _settings(cfg):
        raise CheckpointError("window settings changed since it was written")
    restored: dict[tuple[str, str], Monitor] = {}
    for state in doc["monitors"]:
        try:
            mon = Monitor.from_state(state, cfg, reference)
        except ReferenceChanged as e:
            log.warning("drift: %s; dropped", e)
            continue
        restored[mon.key] = mon
    return restored

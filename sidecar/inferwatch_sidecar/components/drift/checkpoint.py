"""Atomic checkpoints of the drift windows, so a restart resumes where it stopped.

Format: a NumPy ``.npz`` archive (loaded with ``allow_pickle=False``; nothing
is ever unpickled) holding the window arrays, plus one ``meta`` array with
UTF-8 JSON: format name and version, sub-window count, and per model version
its key, reference source, ring position, label counters, unseen categories,
and either its warm-up profile (JSON) or the fingerprint of the file profile
it was built against. It is written to a temporary file in the same folder,
fsynced, then renamed over the old one, so a crash leaves the old or the new
checkpoint, never half of one.

A checkpoint that cannot be read or does not match the current config or
reference is logged with the reason and ignored: the component starts with
empty windows instead of crashing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from inferwatch_sidecar.components.drift import profile as prof

if TYPE_CHECKING:
    from inferwatch_sidecar.components.drift.component import DriftComponent

FORMAT = "inferwatch-drift-checkpoint"
VERSION = 1
log = logging.getLogger("inferwatch.sidecar.drift")


def fingerprint(p: prof.Profile) -> str:
    """A stable hash of a profile's columns (not of where or when it was built)."""
    doc = [c.to_json() for c in p.columns.values()]
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def save(comp: DriftComponent, path: str) -> None:
    """Write every built window of ``comp`` to ``path`` atomically. Call with the state lock held."""
    arrays: dict[str, np.ndarray] = {}
    mons: list[dict[str, Any]] = []
    for i, mon in enumerate(comp.monitors.values()):
        if mon.profile is None:
            continue  # still warming up: it restarts its warm-up
        arrays[f"m{i}_rows"] = mon.rows
        arrays[f"m{i}_labeled"] = mon.labeled
        arrays[f"m{i}_correct"] = mon.correct
        cols = []
        for j, (name, cw) in enumerate(mon.columns.items()):
            arrays[f"m{i}_c{j}_counts"] = cw.counts
            arrays[f"m{i}_c{j}_missing"] = cw.missing
            arrays[f"m{i}_c{j}_cum"] = cw.cum
            if cw.sums is not None:
                arrays[f"m{i}_c{j}_sums"] = cw.sums
            cols.append({"name": name, "unseen": cw.unseen})
        mons.append({
            "index": i, "model": mon.key[0], "version": mon.key[1], "source": mon.source, "slot": mon.slot,
            "slot_id": mon.slot_id, "labels": mon.label_counts, "columns": cols,
            "profile": mon.profile.to_json() if mon.source == "warmup" else None,
            "fingerprint": fingerprint(mon.profile),
        })
    meta = {"format": FORMAT, "version": VERSION, "subwindows": comp.cfg.subwindows,
            "window_events": comp.cfg.window_events, "window_seconds": comp.cfg.window_seconds, "monitors": mons}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class CheckpointError(ValueError):
    pass


def restore(comp: DriftComponent, path: str) -> bool:
    """Load ``path`` into ``comp``. Returns True on success; logs and returns False otherwise."""
    if not os.path.exists(path):
        log.info("drift: no checkpoint at %s yet; starting with empty windows", path)
        return False
    try:
        _restore(comp, path)
    except Exception as e:  # any corruption: clear log line, fresh start
        comp.monitors.clear()
        log.error("drift: ignoring corrupt or incompatible checkpoint %s (%s); starting with empty windows. "
                  "It is overwritten at the next checkpoint.", path, e)
        return False
    comp.restored_from = path
    log.info("drift: resumed %d model version(s) from checkpoint %s", len(comp.monitors), path)
    return True


def _restore(comp: DriftComponent, path: str) -> None:
    from inferwatch_sidecar.components.drift.component import Monitor

    # Open the file ourselves: np.load leaks its handle when the content is not an archive.
    with open(path, "rb") as f:
        z = np.load(f, allow_pickle=False)
        if not hasattr(z, "files"):
            raise CheckpointError("not an .npz archive")
        with z:
            data = {k: z[k] for k in z.files}
    if "meta" not in data:
        raise CheckpointError("no metadata")
    meta = json.loads(data["meta"].tobytes().decode())
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise CheckpointError(f"not a version {VERSION} drift checkpoint")
    cfg = comp.cfg
    if (meta.get("subwindows"), meta.get("window_events"), meta.get("window_seconds")) != (
            cfg.subwindows, cfg.window_events, cfg.window_seconds):
        raise CheckpointError("window settings changed since it was written")
    restored: dict[tuple[str, str], Monitor] = {}
    for m in meta["monitors"]:
        key = (str(m["model"]), str(m["version"]))
        i = int(m["index"])
        if m["source"] == "file":
            if comp.profile is None or fingerprint(comp.profile) != m["fingerprint"]:
                log.warning("drift: checkpointed windows of %s/%s were built against another reference; "
                            "dropped", *key)
                continue
            mon = Monitor(key, cfg, comp.profile, "file")
        else:
            p = prof.from_json(m["profile"], source=f"warm-up of {key[0]}/{key[1]} (checkpoint)")
            mon = Monitor(key, cfg, p, "warmup")
        mon.rows[:] = _arr(data, f"m{i}_rows", mon.rows.shape)
        mon.labeled[:] = _arr(data, f"m{i}_labeled", mon.labeled.shape)
        mon.correct[:] = _arr(data, f"m{i}_correct", mon.correct.shape)
        mon.slot, mon.slot_id = int(m["slot"]), int(m["slot_id"])
        if not 0 <= mon.slot < mon.S:
            raise CheckpointError("ring position out of range")
        mon.label_counts.update({k: int(v) for k, v in m["labels"].items() if k in mon.label_counts})
        names = [c["name"] for c in m["columns"]]
        if names != list(mon.columns):
            raise CheckpointError(f"columns of {key} do not match its reference")
        for j, c in enumerate(m["columns"]):
            cw = mon.columns[c["name"]]
            cw.counts[:] = _arr(data, f"m{i}_c{j}_counts", cw.counts.shape)
            cw.missing[:] = _arr(data, f"m{i}_c{j}_missing", cw.missing.shape)
            cw.cum[:] = _arr(data, f"m{i}_c{j}_cum", cw.cum.shape)
            if cw.sums is not None:
                cw.sums[:] = _arr(data, f"m{i}_c{j}_sums", cw.sums.shape)
            cw.unseen = {str(k): int(v) for k, v in dict(c.get("unseen", {})).items()}
        restored[key] = mon
    comp.monitors.clear()
    comp.monitors.update(restored)


def _arr(data: dict[str, np.ndarray], key: str, shape: tuple[int, ...]) -> np.ndarray:
    a = data.get(key)
    if a is None:
        raise CheckpointError(f"array {key} is missing")
    if a.shape != shape:
        raise CheckpointError(f"array {key} has shape {a.shape}, expected {shape}")
    if not np.all(np.isfinite(a)) or (a.dtype.kind in "iu" and np.any(a < 0)):
        raise CheckpointError(f"array {key} holds invalid values")
    return a

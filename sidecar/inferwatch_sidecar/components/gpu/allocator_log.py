"""Allocator series for ``gpu analyze``: the torch probe's samples as JSON lines, and the cause of a leak.

File format (one JSON object per line, UTF-8; blank lines and lines starting with ``#`` are skipped)::

    {"t": 1706702400.0, "pid": 4242, "device": 0, "allocated_bytes": 21474836480,
     "reserved_bytes": 23622320128, "inactive_split_bytes": 104857600, "num_alloc_retries": 0}

``t`` is seconds since the epoch (UTC); ``pid`` the process; ``device`` the CUDA device index as the
process sees it; the byte fields are torch's ``memory_stats()`` ``allocated_bytes.all.current``,
``reserved_bytes.all.current``, ``inactive_split_bytes.all.current`` and the cumulative
``num_alloc_retries`` (the last two optional, 0 when absent). It is what the SDK's probe sends as
``EV_ALLOC`` records; ``/v1/status`` shows the latest per process. The probe's second stage adds lines of
allocation sites (what it sends as ``EV_ALLOC_SITE`` records; ``sites.py``), one line per capture::

    {"t": 1706706000.0, "pid": 4242, "device": 0, "sites": [{"file": "/srv/app/cache.py", "line": 42,
     "function": "remember", "bytes": 943718400, "count": 30}]}

``gpu analyze`` shows on each episode of the process the newest capture taken during it. A line that is not
such an object is counted by reason and skipped; a file without any valid line is an error.

Causes (``name_cause``), from the rises of the floors over an episode, against the rise of what NVML
reports for the process (``N``):

- ``tensor``: the allocated floor (live tensors) rises by at least half of ``N``;
- ``fragmentation``: reserved rises by half of ``N`` while allocated does not, and inactive split
  blocks grow or the allocator retried allocations (``num_alloc_retries`` went up);
- ``allocator_cache``: reserved rises by half of ``N`` while allocated does not, without those signs;
- ``outside_allocator``: NVML's memory minus torch's reserved rises by half of ``N`` (NCCL, a custom
  op's own cudaMalloc, a native library);
- ``unknown``: none of these (or too few allocator samples in the episode).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from inferwatch.wire import EV_ALLOC_SITE
from inferwatch_sidecar.components.gpu.replay import LogError
from inferwatch_sidecar.components.gpu.sites import SiteCaptures, site_of

#: Captures kept per (pid, device) from a file (the live sidecar keeps 4; a file is bounded by its size).
FILE_CAPTURES_PER_KEY = 100_000

CAUSES = ("tensor", "allocator_cache", "fragmentation", "outside_allocator", "unknown")
#: A cause needs its floor to rise by at least this share of the NVML rise.
SHARE = 0.5
#: Inactive split blocks count as growing when they rise by this share of the reserved rise.
SPLIT_SHARE = 0.25
#: Fewer allocator samples than this in an episode: the cause is unknown.
MIN_SAMPLES = 8


@dataclass(frozen=True)
class AllocRow:
    """One allocator sample."""

    t: float
    pid: int
    device: int
    allocated: float
    reserved: float
    split: float
    retries: float


@dataclass
class AllocLog:
    """A parsed allocator file."""

    path: str
    rows: list[AllocRow] = field(default_factory=list)
    bad_rows: Counter[str] = field(default_factory=Counter)
    kind: str = "allocator"
    #: The second stage's allocation sites, by (pid, device).
    sites: SiteCaptures = field(default_factory=lambda: SiteCaptures(1 << 30, FILE_CAPTURES_PER_KEY))
    captures: int = 0


def is_allocator_log(path: str) -> bool:
    """Whether the file's first meaningful line is a JSON object (else it is read as nvidia-smi CSV)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                s = line.strip()
                if s and not s.startswith("#"):
                    return s.startswith("{")
    except OSError:
        return False
    return False


def _num(d: dict[str, object], key: str, required: bool) -> float:
    v = d.get(key)
    if v is None and not required:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise KeyError(key)
    return float(v)


def parse_allocator_log(path: str) -> AllocLog:
    """Read an allocator file (module docstring).

    Raises:
        LogError: the file cannot be read or holds no valid sample.
    """
    out = AllocLog(path)
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                s = line.strip()
                if not s or s.startswith("#"):
                    continue
                try:
                    d = json.loads(s)
                except json.JSONDecodeError:
                    out.bad_rows["not_json"] += 1
                    continue
                if not isinstance(d, dict):
                    out.bad_rows["not_an_object"] += 1
                    continue
                try:
                    pid, dev = d.get("pid"), d.get("device", 0)
                    if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(dev, int) or isinstance(dev, bool):
                        raise KeyError("pid" if not isinstance(pid, int) else "device")
                    if "sites" in d:
                        _add_capture(out, pid, dev, _num(d, "t", True), d["sites"])
                        continue
                    out.rows.append(AllocRow(_num(d, "t", True), pid, dev, _num(d, "allocated_bytes", True),
                                             _num(d, "reserved_bytes", True), _num(d, "inactive_split_bytes", False),
                                             _num(d, "num_alloc_retries", False)))
                except KeyError as e:
                    out.bad_rows[f"bad_{e.args[0]}"] += 1
    except (OSError, UnicodeDecodeError) as e:
        raise LogError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from e
    if not out.rows and not out.captures:
        raise LogError(f"{path}: no allocator sample (JSON lines with t, pid, allocated_bytes, reserved_bytes); "
                       f"skipped: {dict(out.bad_rows) or 'nothing'}")
    return out


def _add_capture(out: AllocLog, pid: int, dev: int, t: float, sites: object) -> None:
    """One capture line's sites into ``out.sites`` (KeyError ``sites`` for a list that is not sites)."""
    if not isinstance(sites, list) or not all(isinstance(s, dict) for s in sites):
        raise KeyError("sites")
    parsed = []
    for s in sites:
        try:
            parsed.append(site_of((EV_ALLOC_SITE, int(t * 1e9), dev, s.get("file"), s.get("line", 0),
                                   s.get("function"), s.get("bytes"), s.get("count", 1)))[2])
        except ValueError:
            raise KeyError("sites") from None
    for site in parsed:
        out.sites.add(pid, int(t * 1e9), dev, site)
    out.captures += 1


def _rise(t: np.ndarray, v: np.ndarray, a: float, b: float) -> float | None:
    """Floor rise over [a, b]: the minimum over its last quarter minus the minimum over its first."""
    m = (t >= a) & (t <= b)
    if int(m.sum()) < MIN_SAMPLES:
        return None
    q = (b - a) / 4
    first, last = v[m & (t <= a + q)], v[m & (t >= b - q)]
    if not len(first) or not len(last):
        return None
    return float(last.min() - first.min())


def name_cause(nvml_t: np.ndarray, nvml_v: np.ndarray, rows: list[AllocRow], start: float, end: float) -> str:
    """The cause of a process's growth over [start, end] (module docstring); ``nvml_*``: what NVML reported
    for the process (empty when NVML did not list it: then only the allocator's own causes can be named)."""
    if not rows or end <= start:
        return "unknown"
    at = np.array([r.t for r in rows])
    order = np.argsort(at, kind="stable")
    at = at[order]
    alloc = np.array([rows[i].allocated for i in order])
    res = np.array([rows[i].reserved for i in order])
    split = np.array([rows[i].split for i in order])
    retries = np.array([rows[i].retries for i in order])
    da, dr = _rise(at, alloc, start, end), _rise(at, res, start, end)
    if da is None or dr is None:
        return "unknown"
    dn = _rise(nvml_t, nvml_v, start, end) if len(nvml_t) else None
    total = dn if dn is not None and dn > 0 else max(da, dr)
    if total <= 0:
        return "unknown"
    if da >= SHARE * total:
        return "tensor"
    if dr >= SHARE * total:
        m = (at >= start) & (at <= end)
        ds = float(split[m][-1] - split[m][0])
        retried = float(retries[m][-1] - retries[m][0]) > 0
        return "fragmentation" if retried or ds >= SPLIT_SHARE * dr else "allocator_cache"
    if dn is not None:
        # What NVML sees beyond torch's reserved pool: the reserved value at or before each NVML sample.
        idx = np.searchsorted(at, nvml_t, side="right") - 1
        ok = idx >= 0
        outside = nvml_v[ok] - res[idx[ok]]
        do = _rise(nvml_t[ok], outside, start, end)
        if do is not None and do >= SHARE * total:
            return "outside_allocator"
    return "unknown"

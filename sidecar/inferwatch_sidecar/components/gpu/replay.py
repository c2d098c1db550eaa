"""Parse and replay nvidia-smi CSV logs.

Two query formats are accepted, with or without ``nounits`` and ``noheader``:

- ``nvidia-smi --query-gpu=timestamp,index,name,uuid,memory.total,memory.used,memory.free --format=csv -l 1``::

    timestamp, index, name, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB]
    2024/01/31 12:00:00.123, 0, NVIDIA H100 80GB HBM3, GPU-5d1c..., 81559 MiB, 1024 MiB, 80535 MiB

- ``nvidia-smi --query-compute-apps=timestamp,gpu_uuid,pid,used_memory --format=csv -l 1``::

    timestamp, gpu_uuid, pid, used_gpu_memory [MiB]
    2024/01/31 12:00:00.123, GPU-5d1c..., 4242, 20480 MiB

With a header, the columns may come in any order, and ``name`` (``gpu_name`` in compute-apps logs),
``pci.bus_id`` / ``gpu_bus_id`` and ``process_name`` may be added or left out; without one, the
documented orders above are inferred from the width (the GPU query with or without ``name``).
Values may carry units (``MiB``, also KiB/GiB/B) or not; ``[N/A]`` and
``[Not Supported]`` become missing. Header lines repeated mid-file (a restarted
``nvidia-smi -l``) are skipped; rows that cannot be parsed are counted by reason.
"""

from __future__ import annotations

import csv
import io
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone

from inferwatch_sidecar.components.gpu.sampler import DeviceSample, ProcessSample, Snapshot

_UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}
_MISSING = {"[n/a]", "n/a", "[not supported]", "[unknown error]", "[insufficient permissions]", ""}

#: Column aliases -> canonical names.
_ALIASES = {
    "timestamp": "timestamp",
    "index": "index",
    "uuid": "uuid",
    "gpu_uuid": "uuid",
    "memory.total": "total",
    "memory.used": "used",
    "memory.free": "free",
    "memory.reserved": "reserved",
    "pid": "pid",
    "used_memory": "pid_used",
    "used_gpu_memory": "pid_used",
    "name": "name",
    "gpu_name": "name",
    "pci.bus_id": "bus_id",
    "gpu_bus_id": "bus_id",
    "process_name": "process",
}
_GPU_COLS = ("timestamp", "index", "uuid", "total", "used", "free")
_GPU_NAMED_COLS = ("timestamp", "index", "name", "uuid", "total", "used", "free")
_APPS_COLS = ("timestamp", "uuid", "pid", "pid_used")


class LogError(ValueError):
    """A file that is not a readable nvidia-smi CSV log."""


@dataclass
class Row:
    """One parsed row: a device memory row (``pid`` None) or a process row."""

    t: float
    stamp: str
    device: str
    pid: int | None
    used: int | None
    total: int | None = None
    free: int | None = None
    uuid: str = ""
    #: The device's product name when the log has it (``name`` / ``gpu_name``).
    name: str = ""


@dataclass
class ParsedLog:
    """The rows of one file plus what could not be parsed."""

    path: str
    kind: str  # "gpu" or "apps"
    rows: list[Row] = field(default_factory=list)
    bad_rows: Counter[str] = field(default_factory=Counter)


def parse_timestamp(s: str) -> float:
    """nvidia-smi's ``2024/01/31 12:00:00.123`` (host local time, read as UTC) to epoch seconds."""
    s = s.strip()
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S.%f",
                "%a %b %d %H:%M:%S %Y"):
        try:
            return datetime.strptime(s, fmt).replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            continue
    raise ValueError(f"bad timestamp {s!r}")


def parse_bytes(s: str, default_unit: str = "mib") -> int | None:
    """``81559 MiB`` / ``81559`` (in the header's unit) / ``[N/A]`` to bytes or None."""
    v = s.strip()
    if v.lower() in _MISSING:
        return None
    parts = v.split()
    unit = default_unit
    if len(parts) == 2:
        unit = parts[1].lower()
    elif len(parts) != 1:
        raise ValueError(f"bad memory value {s!r}")
    if unit not in _UNITS:
        raise ValueError(f"unknown unit in {s!r}")
    return int(round(float(parts[0]) * _UNITS[unit]))


def _header(cells: list[str]) -> tuple[list[str], list[str]] | None:
    """Canonical column names and units if ``cells`` is a header line, else None."""
    names, units = [], []
    for c in cells:
        c = c.strip()
        unit = "mib"
        if "[" in c and c.endswith("]"):
            c, u = c[: c.index("[")].strip(), c[c.index("[") + 1 : -1].strip().lower()
            unit = u if u in _UNITS else unit
        key = _ALIASES.get(c.lower())
        if key is None:
            return None
        names.append(key)
        units.append(unit)
    return names, units


def parse_log(path: str, progress: Callable[[int], None] | None = None) -> ParsedLog:
    """Read one nvidia-smi CSV log.

    Args:
        path: the file.
        progress: called with bytes consumed so far, now and then.

    Raises:
        LogError: the file cannot be read or holds no recognisable nvidia-smi rows.
    """
    try:
        f = open(path, encoding="utf-8", errors="replace", newline="")  # noqa: SIM115 - closed below
    except OSError as e:
        raise LogError(f"{path}: cannot read: {e.strerror or e}") from e
    out = ParsedLog(path, "")
    names: list[str] | None = None
    units: list[str] = []
    done = 0
    with f:
        for lineno, line in enumerate(f, 1):
            done += len(line)
            if progress is not None and lineno % 5000 == 0:
                progress(done)
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            cells = next(csv.reader(io.StringIO(line), skipinitialspace=True))
            hdr = _header(cells)
            if hdr is not None:
                kind = "apps" if "pid" in hdr[0] else "gpu"
                if out.kind and out.kind != kind:
                    raise LogError(f"{path}:{lineno}: mixes --query-gpu and --query-compute-apps rows; "
                                   "write them to separate files")
                names, units = hdr
                out.kind = kind
                continue
            if names is None:
                # noheader output: infer the documented column order from the width.
                if len(cells) == len(_GPU_COLS):
                    names, units, out.kind = list(_GPU_COLS), ["mib"] * 6, "gpu"
                elif len(cells) == len(_GPU_NAMED_COLS):
                    names, units, out.kind = list(_GPU_NAMED_COLS), ["mib"] * 7, "gpu"
                elif len(cells) == len(_APPS_COLS):
                    names, units, out.kind = list(_APPS_COLS), ["mib"] * 4, "apps"
                else:
                    out.bad_rows["no_header"] += 1
                    continue
            if len(cells) != len(names):
                out.bad_rows["wrong_column_count"] += 1
                continue
            rec = dict(zip(names, cells, strict=False))
            unit = dict(zip(names, units, strict=False))
            try:
                t = parse_timestamp(rec["timestamp"]) if "timestamp" in rec else float(lineno)
                stamp = rec.get("timestamp", str(lineno)).strip()
                if out.kind == "gpu":
                    dev = rec.get("index", "").strip() or rec.get("uuid", "").strip()
                    out.rows.append(Row(
                        t, stamp, dev, None, parse_bytes(rec.get("used", ""), unit.get("used", "mib")),
                        parse_bytes(rec.get("total", ""), unit.get("total", "mib")),
                        parse_bytes(rec.get("free", ""), unit.get("free", "mib")), rec.get("uuid", "").strip(),
                        rec.get("name", "").strip(),
                    ))
                else:
                    dev = rec.get("uuid", "").strip()
                    out.rows.append(Row(t, stamp, dev, int(rec["pid"]),
                                        parse_bytes(rec.get("pid_used", ""), unit.get("pid_used", "mib")),
                                        uuid=dev, name=rec.get("name", "").strip()))
            except (ValueError, KeyError) as e:
                reason = "bad_timestamp" if "timestamp" in str(e) else "bad_value"
                out.bad_rows[reason] += 1
                continue
    if progress is not None:
        progress(done)
    if not out.rows:
        why = ", ".join(f"{k}={v}" for k, v in sorted(out.bad_rows.items())) or "the file is empty"
        raise LogError(
            f"{path}: no nvidia-smi rows found ({why}); expected the CSV output of "
            "--query-gpu=timestamp,index,uuid,memory.total,memory.used,memory.free or "
            "--query-compute-apps=timestamp,gpu_uuid,pid,used_memory"
        )
    return out


class ReplaySampler:
    """Replays parsed logs one timestamp per ``sample()`` call.

    Device rows and process rows with the same timestamp form one snapshot;
    process rows join their device through the UUID when the GPU log has it.
    """

    def __init__(self, logs: list[ParsedLog], loop: bool = False) -> None:
        self.logs = logs
        self.loop = loop
        self.memory_info_version = "nvidia-smi"
        self.driver_version: str | None = None
        self.nvml_version: str | None = None
        self.init_fault = None
        self.initialised = True
        self._snaps = list(self._build())
        self._pos = 0
        self._cycle = 0
        self.finished = False

    def _build(self) -> Iterator[Snapshot]:
        by_t: dict[float, list[Row]] = {}
        for log in self.logs:
            for r in log.rows:
                by_t.setdefault(r.t, []).append(r)
        uuid_to_dev = {r.uuid: r.device for log in self.logs if log.kind == "gpu" for r in log.rows if r.uuid}
        for t in sorted(by_t):
            devs: dict[str, DeviceSample] = {}
            for r in by_t[t]:
                if r.pid is None:
                    d = devs.setdefault(r.device, DeviceSample(r.device))
                    d.uuid, d.name, d.total, d.used, d.free = r.uuid, r.name, r.total, r.used, r.free
            for r in by_t[t]:
                if r.pid is not None:
                    name = uuid_to_dev.get(r.uuid, r.device)
                    d = devs.setdefault(name, DeviceSample(name, uuid=r.uuid, name=r.name))
                    if d.processes is None:
                        d.processes = []
                    d.processes.append(ProcessSample(r.pid, r.used))
            yield Snapshot(t, list(devs.values()))

    def sample(self) -> Snapshot:
        if self._pos >= len(self._snaps):
            if not self.loop or not self._snaps:
                self.finished = True
                return Snapshot(self._snaps[-1].t if self._snaps else 0.0, ok=False)
            self._pos = 0
            self._cycle += 1
        s = self._snaps[self._pos]
        self._pos += 1
        if self._cycle:
            # Shift looped replays forward in time so the series stays monotonic.
            span = self._snaps[-1].t - self._snaps[0].t + 1.0
            return Snapshot(s.t + self._cycle * span, s.devices, s.faults, s.ok)
        return s

    def shutdown(self) -> None:
        pass


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0

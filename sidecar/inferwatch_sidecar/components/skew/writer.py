"""The sample of served rows, kept as rotating Parquet files under a size cap.

Rows go to ``served-<UTC start>-<seq>.parquet.tmp`` through one ``ParquetWriter`` (one row group per
batch); the file is closed and renamed to ``.parquet`` when it passes ``file_max_bytes``, when it is
``rotate_seconds`` old, when the feature columns change, and at stop, so a reader (``inferwatch skew
--served DIR``) only ever sees complete files. When the folder's files pass ``max_bytes`` the oldest are
deleted, and their rows counted as dropped (``size_cap``).

Columns: ``request_id`` (text), ``time`` (UTC timestamp, ns), ``service``, ``model``, ``model_version``,
then one column per feature: float64 for the SDK's numeric features, text for categorical ones.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger("inferwatch.sidecar.skew")

#: Columns every served row has, before its features.
FIXED = ("request_id", "time", "service", "model", "model_version")
_PREFIX = "served-"


class ServedWriter:
    """Append served rows to rotating Parquet files in ``folder`` (see the module docstring).

    Args:
        folder: where the files go (created when missing).
        file_max_bytes: close a file past this size.
        rotate_seconds: close a file this old.
        max_bytes: delete the oldest files to keep the folder's files under this.
        clock: wall-clock seconds (file names, rotation age).
    """

    def __init__(self, folder: str, file_max_bytes: int, rotate_seconds: float, max_bytes: int,
                 clock: Callable[[], float] = time.time) -> None:
        self.folder = folder
        self.file_max_bytes = file_max_bytes
        self.rotate_seconds = rotate_seconds
        self.max_bytes = max_bytes
        self.clock = clock
        os.makedirs(folder, exist_ok=True)
        self.written = 0
        self.dropped_size_cap = 0
        self.write_errors = 0
        self._writer: pq.ParquetWriter | None = None
        self._path: str | None = None
        self._schema: pa.Schema | None = None
        self._opened = 0.0
        self._rows_in_file = 0
        self._seq = 0
        #: closed files, oldest first: (path, bytes, rows)
        self._files: list[tuple[str, int, int]] = []
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if name.startswith(_PREFIX) and name.endswith(".parquet"):
                try:
                    rows = pq.read_metadata(path).num_rows
                except Exception:  # a foreign or broken file still counts toward the cap
                    rows = 0
                self._files.append((path, os.path.getsize(path), rows))
            elif name.startswith(_PREFIX) and name.endswith(".parquet.tmp"):
                os.unlink(path)  # a file a crash left unfinished has no footer: unreadable
        self._enforce_cap(0)

    @property
    def bytes(self) -> int:
        """Bytes of the closed files and of the one being written."""
        return sum(f[1] for f in self._files) + self._current_size()

    def _current_size(self) -> int:
        if self._path is None:
            return 0
        try:
            return os.path.getsize(self._path)
        except OSError:
            return 0

    def write(self, rows: list[tuple[str, int, tuple[str, str, str], dict[str, Any]]]) -> int:
        """Write ``(request_id, unix_ns, (service, model, version), features)`` rows; return how many were written.

        Rows are grouped by their feature columns (one schema per file). Never raises: a failed write counts its
        rows in ``write_errors`` and closes the file.
        """
        groups: dict[tuple[tuple[str, bool], ...], list[Any]] = {}
        for r in rows:
            sig = tuple(sorted((k, isinstance(v, str)) for k, v in r[3].items()))
            groups.setdefault(sig, []).append(r)
        done = 0
        for sig, group in groups.items():
            try:
                table = self._table(sig, group)
                self._append(table)
                done += len(group)
            except Exception as e:  # a full disk must not take the component down
                log.warning("skew: writing %d served rows failed: %s", len(group), e)
                self.write_errors += len(group)
                self._close()
        self.written += done
        return done

    def _table(self, sig: tuple[tuple[str, bool], ...], rows: list[Any]) -> pa.Table:
        cols: dict[str, pa.Array] = {
            "request_id": pa.array([r[0] for r in rows], pa.string()),
            "time": pa.array([r[1] for r in rows], pa.timestamp("ns", tz="UTC")),
            "service": pa.array([r[2][0] for r in rows], pa.string()),
            "model": pa.array([r[2][1] for r in rows], pa.string()),
            "model_version": pa.array([r[2][2] for r in rows], pa.string()),
        }
        for name, is_text in sig:
            if name in cols:
                continue
            vals = [r[3].get(name) for r in rows]
            cols[name] = pa.array(vals, pa.string() if is_text else pa.float64())
        return pa.table(cols)

    def _append(self, table: pa.Table) -> None:
        now = self.clock()
        if self._writer is not None and (self._schema != table.schema or now - self._opened >= self.rotate_seconds):
            self._close()
        if self._writer is None:
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
            while True:  # a name no file has (a restarted sidecar may reuse the second and the pid)
                self._seq += 1
                path = os.path.join(self.folder, f"{_PREFIX}{stamp}-{os.getpid()}-{self._seq:06d}.parquet")
                if not os.path.exists(path) and not os.path.exists(path + ".tmp"):
                    break
            self._path = path + ".tmp"
            self._writer = pq.ParquetWriter(self._path, table.schema)
            self._schema = table.schema
            self._opened = now
            self._rows_in_file = 0
        self._writer.write_table(table)
        self._rows_in_file += table.num_rows
        size = self._current_size()
        if size >= self.file_max_bytes:
            self._close()
        else:
            self._enforce_cap(size)

    def rotate_if_due(self) -> None:
        """Close the file being written once it is ``rotate_seconds`` old (so readers see its rows)."""
        if self._writer is not None and self.clock() - self._opened >= self.rotate_seconds:
            self._close()

    def _close(self) -> None:
        w, path = self._writer, self._path
        self._writer = self._path = self._schema = None
        if w is None or path is None:
            return
        try:
            w.close()
            final = path.removesuffix(".tmp")
            os.replace(path, final)
            self._files.append((final, os.path.getsize(final), self._rows_in_file))
        except OSError as e:
            log.warning("skew: closing %s failed: %s", path, e)
            self.write_errors += self._rows_in_file
        self._rows_in_file = 0
        self._enforce_cap(0)

    def _enforce_cap(self, current: int) -> None:
        total = sum(f[1] for f in self._files) + current
        while self._files and total > self.max_bytes:
            path, size, rows = self._files.pop(0)
            try:
                os.unlink(path)
            except OSError:
                pass
            total -= size
            self.dropped_size_cap += rows

    def close(self) -> None:
        """Close the file being written (at stop)."""
        self._close()

    def status(self) -> dict[str, Any]:
        return {"folder": self.folder, "files": len(self._files) + (self._writer is not None), "bytes": self.bytes,
                "written": self.written, "dropped_size_cap": self.dropped_size_cap,
                "write_errors": self.write_errors}

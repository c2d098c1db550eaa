"""Read tabular data files (CSV, Parquet, .npz) into typed columns for the drift engine.

Type inference, the way a user would expect:

- text columns are categorical; so are booleans;
- numeric columns are numeric, except integer-valued columns with at most
  ``max_discrete`` (10) distinct values, which are categorical (a class label
  or a small code: bins of a percentile profile would mostly merge anyway, and
  a chi-square on the values is the better test);
- empty cells, ``NA``/``NaN``/``null``/``None`` and non-finite numbers are
  missing and count toward the missing rate;
- ``--categorical`` and ``--numeric`` override the inference per column.

``.npz`` files are read with ``allow_pickle=False``: object arrays are refused
(never unpickled). Each 1-D array is a column; a 2-D array ``X`` becomes
columns ``X_0 .. X_k``.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferwatch_sidecar.components.drift.profile import canon

MISSING_TOKENS = frozenset({"", "na", "nan", "n/a", "null", "none"})
BOOL_TOKENS = frozenset({"true", "false"})
#: Files above this size get a progress bar on stderr.
PROGRESS_BYTES = 8 * 1024 * 1024


class DataError(ValueError):
    """A data file that cannot be read; the message names the file and the problem."""


@dataclass
class Table:
    """Typed columns of one file, in file order."""

    numeric: dict[str, np.ndarray] = field(default_factory=dict)
    categorical: dict[str, list[Any]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    rows: int = 0


def _parse_float(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def _progress() -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("reading {task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                    console=Console(stderr=True), transient=True)


def _read_csv(path: str, show_progress: bool) -> tuple[list[str], list[list[str]]]:
    size = os.path.getsize(path)
    with open(path, newline="", encoding="utf-8-sig") as raw:
        bar = _progress() if show_progress and size >= PROGRESS_BYTES else None
        try:
            reader = csv.reader(raw)
            try:
                header = next(reader)
            except StopIteration:
                raise DataError(f"{path}: the file is empty (a header row is required)") from None
            if not header or any(not h.strip() for h in header):
                raise DataError(f"{path}: the header row has an empty column name")
            if len(set(header)) != len(header):
                raise DataError(f"{path}: duplicate column names in the header")
            cols: list[list[str]] = [[] for _ in header]
            task = None
            if bar is not None:
                bar.start()
                task = bar.add_task(os.path.basename(path), total=size)
            for lineno, row in enumerate(reader, start=2):
                if len(row) != len(header):
                    if not row:
                        continue
                    raise DataError(f"{path}:{lineno}: {len(row)} fields, expected {len(header)}")
                for c, v in zip(cols, row, strict=True):
                    c.append(v)
                if task is not None and lineno % 20000 == 0:
                    bar.update(task, completed=raw.tell())
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: not UTF-8 text ({e.reason}); is it really a CSV file?") from None
        except csv.Error as e:
            raise DataError(f"{path}: malformed CSV ({e})") from None
        finally:
            if bar is not None:
                bar.stop()
    return header, cols


def _classify_strings(values: list[str], max_discrete: int) -> tuple[str, Any]:
    """Infer a CSV column's kind and convert it."""
    nums = np.empty(len(values))
    numeric = True
    seen_value = False
    for i, v in enumerate(values):
        s = v.strip()
        if s.lower() in MISSING_TOKENS:
            nums[i] = math.nan
            continue
        seen_value = True
        f = _parse_float(s)
        if f is None:
            numeric = False
            break
        nums[i] = f
    if numeric and seen_value:
        return _numeric_or_discrete(nums, max_discrete)
    cats = [None if v.strip().lower() in MISSING_TOKENS else v for v in values]
    if all(c is None or c.strip().lower() in BOOL_TOKENS for c in cats):
        cats = [None if c is None else c.strip().lower() for c in cats]
    return "categorical", cats


def _numeric_or_discrete(v: np.ndarray, max_discrete: int) -> tuple[str, Any]:
    fin = v[np.isfinite(v)]
    if fin.size and np.all(fin == np.round(fin)):
        distinct = np.unique(fin)
        if distinct.size <= max_discrete:
            return "categorical", [canon(x) for x in v]
    return "numeric", v


def _apply_overrides(t: Table, categorical: list[str], numeric: list[str], path: str) -> None:
    for name in categorical:
        if name not in t.order:
            raise DataError(f"{path}: --categorical column {name!r} not found (columns: {', '.join(t.order)})")
        if name in t.numeric:
            t.categorical[name] = [canon(x) for x in t.numeric.pop(name)]
    for name in numeric:
        if name not in t.order:
            raise DataError(f"{path}: --numeric column {name!r} not found (columns: {', '.join(t.order)})")
        if name in t.categorical:
            vals = t.categorical.pop(name)
            out = np.empty(len(vals))
            bad = 0
            for i, v in enumerate(vals):
                f = math.nan if v is None else _parse_float(str(v))
                if f is None:
                    bad += 1
                    f = math.nan
                out[i] = f
            if bad == len(vals) and vals:
                raise DataError(f"{path}: --numeric column {name!r} has no numeric values")
            t.numeric[name] = out


def read_table(path: str, *, categorical: list[str] | None = None, numeric: list[str] | None = None,
               columns: list[str] | None = None, max_discrete: int = 10, progress: bool = True) -> Table:
    """Read a CSV, Parquet or .npz file into typed columns.

    Args:
        path: the file; its extension picks the reader (.csv/.tsv, .parquet/.pq, .npz).
        categorical: columns forced to categorical.
        numeric: columns forced to numeric (unparseable cells become missing).
        columns: keep only these columns (plus none other), in this order.
        max_discrete: integer-valued numeric columns with at most this many distinct values are categorical.
        progress: show a progress bar on stderr for large CSV files.

    Raises:
        DataError: unreadable file, unknown format, or a bad override.
    """
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file")
    ext = os.path.splitext(path)[1].lower()
    t = Table()
    try:
        if ext in (".csv", ".tsv", ".txt"):
            header, cols = _read_csv(path, progress)
            for name, vals in zip(header, cols, strict=True):
                kind, conv = _classify_strings(vals, max_discrete)
                (t.numeric if kind == "numeric" else t.categorical)[name] = conv
            t.order = list(header)
            t.rows = len(cols[0]) if cols else 0
        elif ext in (".parquet", ".pq"):
            _read_parquet(path, t, max_discrete)
        elif ext == ".npz":
            _read_npz(path, t, max_discrete)
        else:
            raise DataError(f"{path}: unknown file type {ext!r}; use .csv, .parquet or .npz")
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    _apply_overrides(t, categorical or [], numeric or [], path)
    if columns:
        missing = [c for c in columns if c not in t.order]
        if missing:
            raise DataError(f"{path}: column(s) {', '.join(missing)} not found (columns: {', '.join(t.order)})")
        t.order = list(columns)
        t.numeric = {k: v for k, v in t.numeric.items() if k in columns}
        t.categorical = {k: v for k, v in t.categorical.items() if k in columns}
    return t


def _read_parquet(path: str, t: Table, max_discrete: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, pa.ArrowIOError) as e:
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    t.rows = table.num_rows
    for name in table.column_names:
        col = table.column(name)
        typ = col.type
        if pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ):
            v = np.asarray(col.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
            kind, conv = _numeric_or_discrete(v, max_discrete)
        elif pa.types.is_boolean(typ):
            kind, conv = "categorical", [None if x is None else ("true" if x else "false") for x in col.to_pylist()]
        elif pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_dictionary(typ):
            kind, conv = "categorical", [None if x is None else str(x) for x in col.to_pylist()]
        else:
            raise DataError(f"{path}: column {name!r} has type {typ}, which the drift engine cannot use")
        (t.numeric if kind == "numeric" else t.categorical)[name] = conv
        t.order.append(name)


def _read_npz(path: str, t: Table, max_discrete: int) -> None:
    with open(path, "rb") as f:
        try:
            z = np.load(f, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise DataError(f"{path}: not a readable .npz file ({e})") from None
        if not hasattr(z, "files"):
            raise DataError(f"{path}: a single .npy array, not an .npz archive of named columns")
        _npz_columns(path, z, t, max_discrete)


def _npz_columns(path: str, z: Any, t: Table, max_discrete: int) -> None:
    with z:
        for key in z.files:
            try:
                a = z[key]
            except ValueError as e:
                raise DataError(f"{path}: array {key!r} needs pickle to load (object dtype), which is refused "
                                f"for safety; save it as numbers or fixed-width strings ({e})") from None
            if a.ndim == 1:
                cols = [(key, a)]
            elif a.ndim == 2:
                cols = [(f"{key}_{j}", a[:, j]) for j in range(a.shape[1])]
            else:
                raise DataError(f"{path}: array {key!r} has {a.ndim} dimensions; use 1-D columns or a 2-D matrix")
            for name, c in cols:
                if t.rows and c.shape[0] != t.rows:
                    raise DataError(f"{path}: array {name!r} has {c.shape[0]} rows, others have {t.rows}")
                t.rows = c.shape[0]
                if c.dtype.kind in "iuf":
                    kind, conv = _numeric_or_discrete(c.astype(np.float64), max_discrete)
                elif c.dtype.kind == "b":
                    kind, conv = "categorical", ["true" if x else "false" for x in c]
                elif c.dtype.kind in "US":
                    vals = [x.decode() if isinstance(x, bytes) else str(x) for x in c.tolist()]
                    kind, conv = "categorical", [None if v.strip().lower() in MISSING_TOKENS else v for v in vals]
                else:
                    raise DataError(f"{path}: array {name!r} has dtype {c.dtype}, which the drift engine cannot use")
                (t.numeric if kind == "numeric" else t.categorical)[name] = conv
                t.order.append(name)


__all__ = ["DataError", "Table", "read_table"]

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

``.npz`` files are read member by member with ``numpy.lib.format`` and
``allow_pickle=False``: object arrays are refused (never unpickled), and a file
that is not a zip archive of ``.npy`` arrays is refused before numpy sees it
(numpy would try to read it as a pickle, and its message suggests
``allow_pickle=True``, which must never be the fix). Each 1-D array is a
column; a 2-D array ``X`` becomes columns ``X_0 .. X_k``.

A file without a column or without a data row is refused: a profile of 0 rows
would make every later comparison meaningless.
"""

from __future__ import annotations

import csv
import math
import os
import zipfile
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferwatch_sidecar.stats.columns import canon

MISSING_TOKENS = frozenset({"", "na", "nan", "n/a", "null", "none"})
BOOL_TOKENS = frozenset({"true", "false"})
_NPY_MAGIC = b"\x93NUMPY"
#: A zip archive starts with a local file header, or with the end record when it is empty.
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
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
                raise DataError(f"{path}: no header row (a CSV file starts with the column names)") from None
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
                if bar is not None and task is not None and lineno % 20000 == 0:
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
        if os.path.isfile(path) and os.path.getsize(path) == 0:
            raise DataError(f"{path}: the file is empty")
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
    if not t.order:
        raise DataError(f"{path}: no columns")
    if t.rows == 0:
        raise DataError(f"{path}: no data rows, only the columns {', '.join(t.order)}")
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
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise DataError(f"{path}: duplicate column names {', '.join(dups)}")
        table = pf.read()
        t.rows = table.num_rows
        for name, col in zip(table.column_names, table.columns, strict=True):
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
    except pa.ArrowException as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"{path}: not a readable Parquet file ({first_line})") from None


def _read_npz(path: str, t: Table, max_discrete: int) -> None:
    with open(path, "rb") as f:
        head = f.read(len(_NPY_MAGIC))
        if head.startswith(_NPY_MAGIC):
            raise DataError(f"{path}: a single .npy array, not an .npz archive of named columns")
        if not head.startswith(_ZIP_MAGICS):
            raise DataError(f"{path}: not a readable .npz file (it is not a zip archive of .npy arrays, "
                            "as numpy.savez writes)")
        f.seek(0)
        try:
            with zipfile.ZipFile(f) as z:
                members = z.namelist()
                if not members:
                    raise DataError(f"{path}: the .npz archive holds no arrays")
                for member in members:
                    if not member.endswith(".npy"):
                        raise DataError(f"{path}: member {member!r} of the archive is not a .npy array")
                    _npz_column(path, member.removesuffix(".npy"), _npy_member(path, z, member), t, max_discrete)
        except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as e:
            # RuntimeError: an encrypted member; NotImplementedError: a compression method zipfile lacks.
            raise DataError(f"{path}: damaged or unsupported .npz archive ({e})") from None


def _npy_member(path: str, z: zipfile.ZipFile, member: str) -> np.ndarray:
    """Read one ``.npy`` member, refusing object arrays from their header, before any data is read."""
    fmt = np.lib.format
    key = member.removesuffix(".npy")
    with z.open(member) as fp:
        try:
            version = fmt.read_magic(fp)
        except ValueError:
            raise DataError(f"{path}: member {member!r} of the archive is not a .npy array") from None
        try:
            header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _fortran, dtype = header(fp)
        except ValueError as e:
            raise DataError(f"{path}: array {key!r} has a damaged header ({e})") from None
    if dtype.hasobject:
        raise DataError(f"{path}: array {key!r} holds Python objects (dtype {dtype}) and needs pickle to load, "
                        "which is refused for safety; save it as numbers or fixed-width strings")
    # The header's shape sizes the allocation: check it against the member's size before trusting it.
    need, have = math.prod(shape) * dtype.itemsize, z.getinfo(member).file_size
    if need > have:
        raise DataError(f"{path}: array {key!r} is damaged (its header announces {need} bytes, "
                        f"the archive holds {have})")
    with z.open(member) as fp:
        try:
            return fmt.read_array(fp, allow_pickle=False)
        except ValueError as e:
            raise DataError(f"{path}: array {key!r} is damaged ({e})") from None


def _npz_column(path: str, key: str, a: np.ndarray, t: Table, max_discrete: int) -> None:
    if a.ndim == 1:
        cols = [(key, a)]
    elif a.ndim == 2:
        cols = [(f"{key}_{j}", a[:, j]) for j in range(a.shape[1])]
    else:
        raise DataError(f"{path}: array {key!r} has {a.ndim} dimensions; use 1-D columns or a 2-D matrix")
    for name, c in cols:
        if name in t.order:
            raise DataError(f"{path}: duplicate column name {name!r}")
        if t.order and c.shape[0] != t.rows:
            raise DataError(f"{path}: array {name!r} has {c.shape[0]} rows, others have {t.rows}")
        t.rows = c.shape[0]
        if c.dtype.kind in "iuf":
            kind, conv = _numeric_or_discrete(c.astype(np.float64), max_discrete)
        elif c.dtype.kind == "b":
            kind, conv = "categorical", ["true" if x else "false" for x in c]
        elif c.dtype.kind in "US":
            try:
                vals = [x.decode() if isinstance(x, bytes) else str(x) for x in c.tolist()]
            except UnicodeDecodeError as e:
                raise DataError(f"{path}: array {name!r} holds bytes that are not UTF-8 text ({e.reason})") from None
            kind, conv = "categorical", [None if v.strip().lower() in MISSING_TOKENS else v for v in vals]
        else:
            raise DataError(f"{path}: array {name!r} has dtype {c.dtype}, which the drift engine cannot use")
        (t.numeric if kind == "numeric" else t.categorical)[name] = conv
        t.order.append(name)


__all__ = ["DataError", "Table", "read_table"]

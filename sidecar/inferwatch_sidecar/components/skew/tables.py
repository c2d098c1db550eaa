"""Read the served and offline tables of ``inferwatch skew``: CSV or Parquet, one file or a folder of them.

A folder is read whole: every ``*.parquet``, ``*.csv`` (and ``*.csv.gz``) file under it, in name order,
so the rotating files the sidecar writes (docs/skew.md) are read as one table. Files still being written
end in ``.tmp`` and are skipped. CSV columns named as keys are read as text, so an ID such as ``007``
keeps its leading zero.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

_PARQUET = (".parquet", ".pq")
_CSV = (".csv", ".csv.gz", ".tsv")


class SkewInputError(ValueError):
    """Input ``inferwatch skew`` cannot use; the message names the file or column and what to fix."""


def _files(path: str) -> list[str]:
    if os.path.isdir(path):
        found = []
        for root, _dirs, names in os.walk(path):
            for n in names:
                if n.lower().endswith(_PARQUET + _CSV) and not n.startswith("."):
                    found.append(os.path.join(root, n))
        if not found:
            raise SkewInputError(f"{path}: no .parquet or .csv files in this folder")
        return sorted(found)
    if not os.path.exists(path):
        raise SkewInputError(f"{path}: no such file or folder")
    return [path]


def _read_one(path: str, text_columns: Iterable[str]) -> pa.Table:
    low = path.lower()
    try:
        if low.endswith(_PARQUET):
            return pq.read_table(path)
        if low.endswith(_CSV):
            parse = pacsv.ParseOptions(delimiter="\t" if low.endswith(".tsv") else ",")
            convert = pacsv.ConvertOptions(column_types={c: pa.string() for c in text_columns},
                                           strings_can_be_null=True)
            return pacsv.read_csv(path, parse_options=parse, convert_options=convert)
    except (pa.ArrowInvalid, OSError) as e:
        raise SkewInputError(f"{path}: cannot read it: {e}") from e
    raise SkewInputError(f"{path}: unknown file type (expected .parquet or .csv)")


def read_table(path: str, text_columns: Iterable[str] = ()) -> pa.Table:
    """Read one file or every data file under a folder into one table.

    Args:
        path: a ``.parquet`` or ``.csv`` file, or a folder of them.
        text_columns: columns to read as text from CSV (the key).

    Raises:
        SkewInputError: a file that cannot be read, or folder files whose columns disagree in type.
    """
    text = list(text_columns)
    tables = [_read_one(f, text) for f in _files(path)]
    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise SkewInputError(f"{path}: its files do not share column types: {e}") from e

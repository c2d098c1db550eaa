"""`inferwatch reference build` stops with a clear message (exit 2) on every kind of bad input file.

No traceback, no profile written, and never a hint to load with ``allow_pickle``.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from inferwatch_sidecar.cli import main


def refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], data: Path, *extra: str) -> str:
    """Run ``reference build`` on ``data``; check it failed cleanly and return its stderr."""
    out = tmp_path / "profile.json"
    assert main(["reference", "build", str(data), "-o", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inferwatch: error: ") and err.count("\n") == 1, err
    assert "allow_pickle" not in err, err
    assert not out.exists()
    return err


def npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a)
    return buf.getvalue()


def zip_of(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, raw in members.items():
            z.writestr(name, raw)
    return path


@pytest.mark.parametrize("content", [b"not npz at all", b"a,b\n1,2\n", b"\x80\x04K\x01."])
def test_npz_that_is_not_a_zip_is_refused_without_suggesting_allow_pickle(tmp_path, capsys, content) -> None:
    p = tmp_path / "data.npz"
    p.write_bytes(content)
    assert "not a readable .npz file (it is not a zip archive of .npy arrays" in refused(tmp_path, capsys, p)


def test_npz_with_a_zip_signature_but_a_broken_archive_is_refused(tmp_path, capsys) -> None:
    p = tmp_path / "data.npz"
    p.write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    assert "damaged or unsupported .npz archive" in refused(tmp_path, capsys, p)


def test_single_npy_array_named_npz_is_refused(tmp_path, capsys) -> None:
    p = tmp_path / "data.npz"
    p.write_bytes(npy_bytes(np.arange(5.0)))
    assert "a single .npy array, not an .npz archive" in refused(tmp_path, capsys, p)


def test_csv_with_only_a_header_is_refused_instead_of_building_a_profile_of_zero_rows(tmp_path, capsys) -> None:
    p = tmp_path / "data.csv"
    p.write_text("age,city\n\n")
    assert "data.csv: no data rows, only the columns age, city" in refused(tmp_path, capsys, p)


def test_npz_without_arrays_is_refused(tmp_path, capsys) -> None:
    p = tmp_path / "data.npz"
    np.savez(p)
    assert "the .npz archive holds no arrays" in refused(tmp_path, capsys, p)


def test_npz_of_empty_arrays_is_refused(tmp_path, capsys) -> None:
    p = tmp_path / "data.npz"
    np.savez(p, x=np.array([], dtype=np.float64), X=np.empty((0, 3)))
    assert "no data rows, only the columns x, X_0, X_1, X_2" in refused(tmp_path, capsys, p)


def test_npz_object_array_is_refused_from_its_header_and_never_unpickled(tmp_path, capsys) -> None:
    class Boom:
        def __reduce__(self):  # unpickling this would raise: the test fails if anything unpickles it
            return (pytest.fail, ("the object array was unpickled",))

    p = tmp_path / "data.npz"
    np.savez(p, x=np.arange(3.0), o=np.array([Boom(), None, 1], dtype=object))
    err = refused(tmp_path, capsys, p)
    assert "array 'o' holds Python objects (dtype object) and needs pickle to load, which is refused" in err


@pytest.mark.parametrize(("members", "message"), [
    ({"notes.txt": b"hello"}, "member 'notes.txt' of the archive is not a .npy array"),
    ({"x.npy": b"plain bytes, no npy magic"}, "member 'x.npy' of the archive is not a .npy array"),
    ({"x.npy": npy_bytes(np.arange(3.0))[:-8]}, "array 'x' is damaged (EOF"),
    ({"x.npy": npy_bytes(np.arange(3.0)).replace(b"'shape': (3,)", b"'shape': (9999999999,)")},
     "array 'x' is damaged (its header announces 79999999992 bytes"),
    ({"x.npy": npy_bytes(np.arange(3.0)).replace(b"'descr': '<f8'", b"'descr': 'zz'")},
     "array 'x' has a damaged header"),
])
def test_npz_member_that_is_not_a_sound_npy_array_is_refused(tmp_path, capsys, members, message) -> None:
    assert message in refused(tmp_path, capsys, zip_of(tmp_path / "data.npz", members))


def test_npz_bytes_array_that_is_not_utf8_is_refused(tmp_path, capsys) -> None:
    p = tmp_path / "data.npz"
    np.savez(p, city=np.array([b"\xff\xfe", b"paris"]))
    assert "array 'city' holds bytes that are not UTF-8 text" in refused(tmp_path, capsys, p)


def test_npz_columns_with_the_same_name_are_refused(tmp_path, capsys) -> None:
    p = tmp_path / "data.npz"
    np.savez(p, X=np.ones((4, 2)), X_1=np.zeros(4))
    assert "duplicate column name 'X_1'" in refused(tmp_path, capsys, p)


@pytest.mark.parametrize("name", ["data.csv", "data.npz", "data.parquet"])
def test_empty_file_is_refused_whatever_its_type(tmp_path, capsys, name) -> None:
    p = tmp_path / name
    p.write_bytes(b"")
    assert f"{name}: the file is empty" in refused(tmp_path, capsys, p)


def test_csv_that_is_not_utf8_is_refused(tmp_path, capsys) -> None:
    p = tmp_path / "data.csv"
    p.write_bytes("ville,n\nS\u00e8te,1\n".encode("latin-1"))
    assert "not UTF-8 text" in refused(tmp_path, capsys, p)


@pytest.mark.parametrize("flags", [
    ("--prediction", "label"),
    ("--confidence", "score"),
    ("--features", "x", "--prediction", "label"),
    ("--features", "x", "--confidence", "score"),
])
def test_prediction_or_confidence_column_that_does_not_exist_is_named(tmp_path, capsys, flags) -> None:
    p = tmp_path / "data.npz"
    np.savez(p, x=np.linspace(0, 1, 50), y=np.linspace(1, 2, 50))
    err = refused(tmp_path, capsys, p, *flags)
    assert repr(flags[-1]) in err or f" {flags[-1]} not found" in err, err
    assert "(columns: x, y)" in err


def test_parquet_without_rows_is_refused(tmp_path, capsys) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "data.parquet"
    pq.write_table(pa.table({"x": pa.array([], pa.float64()), "c": pa.array([], pa.string())}), p)
    assert "no data rows, only the columns x, c" in refused(tmp_path, capsys, p)


def test_parquet_with_duplicate_column_names_is_refused(tmp_path, capsys) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array([1.0, 2.0]), pa.array([3.0, 4.0])], names=["x", "x"]), p)
    assert "duplicate column names" in refused(tmp_path, capsys, p)

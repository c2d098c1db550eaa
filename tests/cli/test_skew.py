"""``inferwatch skew``: files and folders in, the report's JSON and exit status out."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from inferwatch_sidecar.cli import main


def _frames(n: int = 400) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(1)
    off = pd.DataFrame({"request_id": [f"{i:05d}" for i in range(n)], "age": rng.integers(18, 90, n).astype(float),
                        "income": rng.lognormal(10, 1, n), "city": rng.choice(["paris", "lyon", "nice"], n)})
    srv = off.copy()
    srv["income"] = off["income"] / 1000.0  # units: thousands in serving
    return srv, off


def test_csv_files_json_report_and_fail_on_skew(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    srv, off = _frames()
    srv.to_csv(tmp_path / "served.csv", index=False)
    off.to_csv(tmp_path / "offline.csv", index=False)
    args = ["skew", "--served", str(tmp_path / "served.csv"), "--offline", str(tmp_path / "offline.csv"),
            "--key", "request_id", "--json"]
    assert main(args) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["rows_joined"] == 400
    assert {n: f["kind"] for n, f in rep["features"].items()} == {"age": "match", "income": "scale", "city": "match"}
    assert rep["features"]["income"]["detail"]["scale"] == pytest.approx(0.001)
    # the key keeps its leading zeros: read as text from CSV
    assert rep["features"]["income"]["detail"]["examples"][0]["key"] == "00000"
    assert main([*args, "--fail-on-skew"]) == 1
    err = capsys.readouterr().err
    assert "match ratio below 0.99 for: income" in err
    assert main([*args, "--fail-on-skew", "0.99", "--features", "age,city"]) == 0


def test_folders_of_parquet_files_and_the_table_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    srv, off = _frames()
    (tmp_path / "served").mkdir()
    shuffled = srv.sample(frac=1, random_state=2)
    for i in range(3):
        part = shuffled.iloc[i * 150:(i + 1) * 150]
        pq.write_table(pa.Table.from_pandas(part, preserve_index=False), tmp_path / "served" / f"p{i}.parquet")
    (tmp_path / "served" / "p9.parquet.tmp").write_bytes(b"half a file")  # still being written: skipped
    pq.write_table(pa.Table.from_pandas(off, preserve_index=False), tmp_path / "offline.parquet")
    out = tmp_path / "rep.json"
    assert main(["skew", "--served", str(tmp_path / "served"), "--offline", str(tmp_path / "offline.parquet"),
                 "--key", "request_id", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("rows joined: 400 (served 400, offline 400)")
    assert "income" in text and "scale" in text and "served = 0.001 x offline" in text
    assert json.loads(out.read_text())["features"]["income"]["kind"] == "scale"


@pytest.mark.parametrize(("served", "offline", "message"), [
    ({"id": ["a"], "x": [1.0]}, {"rid": ["a"], "x": [1.0]}, "the offline table has no key column 'id'"),
    ({"id": ["a", "a"], "x": [1.0, 2.0]}, {"id": ["a"], "x": [1.0]}, "the served table has 1 duplicate rows of key"),
    ({"id": [1], "x": [1.0]}, {"id": ["1"], "x": [1.0]}, "is int64 in the served table but string in the offline"),
])
def test_bad_input_exits_2_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str], served: dict,
                                           offline: dict, message: str) -> None:
    pq.write_table(pa.table(served), tmp_path / "s.parquet")
    pq.write_table(pa.table(offline), tmp_path / "o.parquet")
    assert main(["skew", "--served", str(tmp_path / "s.parquet"), "--offline", str(tmp_path / "o.parquet"),
                 "--key", "id"]) == 2
    assert message in capsys.readouterr().err


def test_unreadable_and_missing_paths_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    (tmp_path / "empty").mkdir()
    for path, message in ((tmp_path / "bad.parquet", "cannot read it"), (tmp_path / "empty", "no .parquet or .csv"),
                          (tmp_path / "nope.csv", "no such file or folder")):
        assert main(["skew", "--served", str(path), "--offline", str(path), "--key", "id"]) == 2
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["skew", "--served", "a", "--offline", "b", "--key", "id", "--fail-on-skew", "1.5"])

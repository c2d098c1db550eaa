"""`inferwatch reference build`, `inferwatch drift compare` and the data readers."""

from __future__ import annotations

import csv
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats as sps

from inferwatch_sidecar.cli import main
from inferwatch_sidecar.components.drift import profile as prof
from inferwatch_sidecar.offline.drift import dataio


def write_csv(path, header, rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def data(n: int, seed: int, shift: float = 0.0, new_color: bool = False):
    rng = np.random.default_rng(seed)
    colors = ["red", "green", "blue"] + (["pink"] if new_color else [])
    return {
        "x": rng.normal(shift, 1, n),
        "y": rng.exponential(2, n),
        "color": list(rng.choice(colors, n)),
        "grade": [int(v) for v in rng.integers(1, 4, n)],
    }


def to_csv(path, d, blank_every: int = 0) -> None:
    n = len(d["x"])
    rows = []
    for i in range(n):
        y = "" if blank_every and i % blank_every == 0 else repr(float(d["y"][i]))
        rows.append([repr(float(d["x"][i])), y, d["color"][i], d["grade"][i]])
    write_csv(path, ["x", "y", "color", "grade"], rows)


def run_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_compare_json_contract_and_numbers_match_scipy(tmp_path, capsys) -> None:
    ref, cur = data(3000, 1), data(2000, 2, shift=0.4, new_color=True)
    to_csv(tmp_path / "ref.csv", ref)
    to_csv(tmp_path / "cur.csv", cur)
    out = run_json(capsys, "drift", "compare", "--reference", str(tmp_path / "ref.csv"), "--current",
                   str(tmp_path / "cur.csv"), "--json")
    assert set(out) >= {"features", "dataset_drift"}
    assert isinstance(out["dataset_drift"], bool)
    by = {f["feature"]: f for f in out["features"]}
    assert set(by) == {"x", "y", "color", "grade"}
    for f in out["features"]:
        assert {"feature", "test", "statistic", "p_value", "drifted"} <= set(f)
        assert isinstance(f["drifted"], bool)
    assert by["x"]["test"] == "ks" and by["color"]["test"] == "chi2"
    assert by["grade"]["test"] == "chi2"  # an integer column with 3 values is categorical
    assert by["x"]["drifted"] and not by["y"]["drifted"] and by["color"]["drifted"]
    assert by["color"]["unseen"] == {"pink": cur["color"].count("pink")}
    # Categorical chi-square is scipy's contingency test on the same counts.
    cats = ["1", "2", "3"]
    table = [[ref["grade"].count(int(c)) for c in cats], [cur["grade"].count(int(c)) for c in cats]]
    ct = sps.chi2_contingency(table, correction=False)
    assert by["grade"]["statistic"] == pytest.approx(ct.statistic, abs=1e-9)
    assert by["grade"]["p_value"] == pytest.approx(ct.pvalue, abs=1e-12)
    # Binned KS: within one percentile bin of scipy's sample KS.
    assert by["x"]["statistic"] == pytest.approx(sps.ks_2samp(ref["x"], cur["x"]).statistic, abs=0.011)


def test_reference_build_writes_a_readable_versioned_profile_and_compare_uses_it(tmp_path, capsys) -> None:
    d = data(2000, 3)
    d["pred"] = [str(v) for v in np.random.default_rng(4).integers(0, 2, 2000)]
    d["conf"] = np.random.default_rng(5).uniform(0.5, 1, 2000)
    path = tmp_path / "ref.parquet"
    pq.write_table(pa.table({"x": d["x"], "y": d["y"], "color": d["color"], "grade": d["grade"], "pred": d["pred"],
                             "conf": d["conf"]}), path)
    out = tmp_path / "profile.json"
    assert main(["reference", "build", str(path), "-o", str(out), "--prediction", "pred", "--confidence", "conf",
                 "--features", "x,color"]) == 0
    doc = json.loads(out.read_text())
    assert doc["format"] == "inferwatch-drift-profile" and doc["version"] == 1
    cols = {c["name"]: c for c in doc["columns"]}
    assert set(cols) == {"x", "color", "pred", "conf"}
    assert cols["pred"]["role"] == "prediction" and cols["conf"]["role"] == "confidence"
    assert len(cols["x"]["edges"]) == 101 and sum(cols["x"]["counts"]) == 2000
    assert cols["color"]["categories"] == sorted(set(d["color"]), key=lambda c: (-d["color"].count(c), c))
    p = prof.load(str(out))
    assert p.prediction.name == "pred" and p.confidence.name == "conf"
    # Compare a .npz file against the profile.
    cur = data(1000, 6, shift=1.0)
    npz = tmp_path / "cur.npz"
    np.savez(npz, x=cur["x"], color=np.array(cur["color"]))
    res = run_json(capsys, "drift", "compare", "--profile", str(out), "--current", str(npz), "--json")
    by = {f["feature"]: f for f in res["features"]}
    assert by["x"]["drifted"] and not by["color"]["drifted"]
    assert res["missing_columns"] == ["pred", "conf"]


def test_empty_cells_count_toward_the_missing_rate(tmp_path, capsys) -> None:
    to_csv(tmp_path / "ref.csv", data(2000, 7))
    to_csv(tmp_path / "cur.csv", data(2000, 8), blank_every=5)
    out = run_json(capsys, "drift", "compare", "--reference", str(tmp_path / "ref.csv"), "--current",
                   str(tmp_path / "cur.csv"), "--json")
    y = next(f for f in out["features"] if f["feature"] == "y")
    assert y["missing_current"] == pytest.approx(0.2)
    assert y["missing_reference"] == 0.0
    assert y["missing_drifted"] and y["drifted"]


def test_overrides_change_inferred_types(tmp_path) -> None:
    to_csv(tmp_path / "d.csv", data(300, 9))
    t = dataio.read_table(str(tmp_path / "d.csv"))
    assert set(t.numeric) == {"x", "y"} and set(t.categorical) == {"color", "grade"}
    assert t.categorical["grade"][0] in {"1", "2", "3"}
    t = dataio.read_table(str(tmp_path / "d.csv"), categorical=["x"], numeric=["grade"])
    assert "x" in t.categorical and "grade" in t.numeric
    assert t.numeric["grade"].dtype == np.float64
    with pytest.raises(dataio.DataError, match="--categorical column 'nope' not found"):
        dataio.read_table(str(tmp_path / "d.csv"), categorical=["nope"])


def test_bool_and_missing_tokens_in_csv(tmp_path) -> None:
    write_csv(tmp_path / "b.csv", ["flag", "v"], [["True", "1.5"], ["false", "NA"], ["", "nan"], ["TRUE", "2"]])
    t = dataio.read_table(str(tmp_path / "b.csv"))
    assert t.categorical["flag"] == ["true", "false", None, "true"]
    assert np.isnan(t.numeric["v"][1]) and np.isnan(t.numeric["v"][2])


@pytest.mark.parametrize("name,content,message", [
    ("a.csv", "", "the file is empty"),
    ("a.csv", "x,y\n1,2\n3\n", r"a.csv:3: 1 fields, expected 2"),
    ("a.csv", "x,x\n1,2\n", "duplicate column names"),
    ("a.xlsx", "x", "unknown file type"),
    ("a.parquet", "not parquet", "not a readable Parquet file"),
    ("a.npz", "not npz", "not a readable .npz file"),
])
def test_unreadable_files_give_clear_errors(tmp_path, capsys, name: str, content: str, message: str) -> None:
    p = tmp_path / name
    p.write_text(content)
    assert main(["reference", "build", str(p), "-o", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert "inferwatch: error:" in err and __import__("re").search(message, err), err


def test_npz_object_arrays_are_refused_not_unpickled(tmp_path) -> None:
    p = tmp_path / "o.npz"
    np.savez(p, x=np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(dataio.DataError, match="needs pickle"):
        dataio.read_table(str(p))


def test_compare_with_a_bad_profile_says_what_to_fix(tmp_path, capsys) -> None:
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"format": "inferwatch-drift-profile", "version": 9, "columns": []}))
    to_csv(tmp_path / "c.csv", data(100, 10))
    assert main(["drift", "compare", "--profile", str(bad), "--current", str(tmp_path / "c.csv")]) == 2
    assert "version 9 is not supported" in capsys.readouterr().err
    assert main(["drift", "compare", "--current", str(tmp_path / "c.csv")]) == 2
    assert "give --reference FILE or --profile PROFILE" in capsys.readouterr().err


def test_compare_table_output_and_fail_on_drift(tmp_path, capsys) -> None:
    to_csv(tmp_path / "ref.csv", data(1000, 11))
    to_csv(tmp_path / "cur.csv", data(1000, 12, shift=2.0, new_color=True))
    rc = main(["drift", "compare", "--reference", str(tmp_path / "ref.csv"), "--current", str(tmp_path / "cur.csv"),
               "--fail-on-drift"])
    out = capsys.readouterr().out
    assert "dataset drift: yes" in out and rc == 1


def test_profile_of_a_constant_and_an_empty_column() -> None:
    p = prof.build({"c": np.full(500, 3.0), "e": np.full(10, np.nan)}, {})
    c, e = p.columns["c"], p.columns["e"]
    assert c.edges.tolist() == [3.0, np.nextafter(3.0, 4)] and c.counts.tolist() == [0, 500, 0] and c.std == 0.0
    assert e.count == 0 and e.missing == 10
    again = prof.from_json(json.loads(json.dumps(p.to_json())))
    assert again.columns["c"].counts.tolist() == [0, 500, 0]
    from inferwatch_sidecar.components.drift import engine

    ev = engine.compare_columns(p, {"c": np.full(300, 3.0)}, {}, engine.Settings())
    assert not ev.results[0].drifted and ev.results[0].statistic == 0.0
    ev = engine.compare_columns(p, {"c": np.full(300, 3.5)}, {}, engine.Settings())
    assert ev.results[0].drifted  # a constant that changed
    ev = engine.compare_columns(p, {"c": np.full(20, 3.5)}, {}, engine.Settings())
    assert ev.results[0].status == "insufficient_data" and ev.results[0].p_value is None and not ev.results[0].drifted


def test_bh_control_and_effect_floor_in_the_decision() -> None:
    from inferwatch_sidecar.components.drift import engine

    rng = np.random.default_rng(13)
    n = 200_000
    p = prof.build({f"f{i}": rng.normal(size=n) for i in range(5)}, {})
    cur = {f"f{i}": rng.normal(size=n) for i in range(5)}
    cur["f0"] = rng.normal(0.03, size=n)  # significant at this n, but below the 0.1 sigma floor
    cur["f1"] = rng.normal(0.3, size=n)
    ev = engine.compare_columns(p, cur, {}, engine.Settings())
    by = {r.feature: r for r in ev.results}
    assert by["f0"].p_adjusted < 1e-6 and by["f0"].effect < 0.1 and not by["f0"].drifted
    assert by["f1"].drifted
    # The joint (multivariate) test is one more test of the same family.
    assert ev.multivariate is not None and ev.multivariate.p_value is not None
    ps = np.array([ev.multivariate.p_value, *[r.p_value for r in ev.results]])
    np.testing.assert_allclose([ev.multivariate.p_adjusted, *[r.p_adjusted for r in ev.results]],
                               sps.false_discovery_control(ps), atol=1e-12)
    none = engine.compare_columns(p, cur, {}, engine.Settings(correction="none"))
    assert [r.p_adjusted for r in none.results] == [r.p_value for r in none.results]


def test_help_lists_the_commands(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["drift", "compare", "--help"])
    assert "--profile" in capsys.readouterr().out


def test_compare_with_an_empty_current_column_is_valid_json(tmp_path, capsys) -> None:
    to_csv(tmp_path / "ref.csv", data(500, 14))
    cur = data(200, 15)
    write_csv(tmp_path / "cur.csv", ["x", "y", "color", "grade"],
              [[repr(float(cur["x"][i])), "", cur["color"][i], cur["grade"][i]] for i in range(200)])
    out = run_json(capsys, "drift", "compare", "--reference", str(tmp_path / "ref.csv"), "--current",
                   str(tmp_path / "cur.csv"), "--json")
    y = next(f for f in out["features"] if f["feature"] == "y")
    assert y["n_current"] == 0 and y["p_value"] is None and y["status"] == "insufficient_data"
    assert y["missing_current"] == 1.0 and y["missing_drifted"] and y["drifted"]

"""Readable results: the ``drift compare`` table says why per column and fits 80 columns; the report says how its
verdicts relate to ours."""

from __future__ import annotations

import numpy as np
import pytest

from inferwatch_sidecar.cli import main
from tests.helpers.imports import quiet_import


def _files(tmp_path, n: int = 4000) -> tuple[str, str]:
    rng = np.random.default_rng(21)
    a = rng.normal(size=n)
    ref = {"mean_fractal_dimension_of_the_worst_cells": a, "b": a + 0.3 * rng.normal(size=n),
           "small_shift": rng.normal(size=n), "big_shift": rng.normal(size=n),
           "color": np.array(rng.choice(["red", "green", "blue"], n))}
    a = rng.normal(size=1000)
    cur = {"mean_fractal_dimension_of_the_worst_cells": a, "b": a + 0.3 * rng.normal(size=1000),
           # significant at this size but below the floor: the row that used to look like a bug
           "small_shift": rng.normal(0.12, size=1000), "big_shift": rng.normal(0.6, size=1000),
           "color": np.array(rng.choice(["red", "green", "blue"], 1000))}
    cur["big_shift"][:50] = np.nan
    np.savez(tmp_path / "ref.npz", **ref)
    np.savez(tmp_path / "cur.npz", **cur)
    return str(tmp_path / "ref.npz"), str(tmp_path / "cur.npz")


@pytest.mark.parametrize("width", [80, 60, 50])
def test_the_table_fits_the_terminal_and_says_why(tmp_path, capsys, monkeypatch, width: int) -> None:
    ref, cur = _files(tmp_path)
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(["drift", "compare", "--reference", ref, "--current", cur]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= width, [line for line in lines if len(line) > width]
    text = " ".join(" ".join(lines).split())
    assert "p_adj vs" in text and "effect vs" in text and "floor: the larger of the configured floor" in text
    assert "* big_shift: missing rate 0.0% -> 5.0%" in text
    assert "joint drift (PCA reconstruction error of 5 features" in text
    assert "dataset drift: no (1 of 5 features drifted" in text
    assert any(line.split()[-1:] == ["n"] for line in lines[:5]) == (width >= 60)
    if width == 80:
        rows = {line.split()[0]: " ".join(line.split()[1:]) for line in lines[4:10] if line.strip()}
        # Significant, but the effect is below the floor that applied at n = 1000: not drifted, and it says so.
        assert rows["small_shift"] == "no 0.00137 <= 0.05 W 0.153 < 0.17 1000"
        assert rows["big_shift"] == "yes * 4.42e-44 <= 0.05 W 0.601 >= 0.173 950"
        assert rows["color"].startswith("no 0.964 > 0.05 PSI")


def test_the_report_page_puts_our_verdicts_next_to_evidentlys(tmp_path, capsys) -> None:
    quiet_import("evidently")
    ref, cur = _files(tmp_path)
    out = tmp_path / "r.html"
    assert main(["report", "--reference", ref, "--current", cur, "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    start = page.index('<section id="inferwatch-verdicts"')
    sec = page[start:page.index("</section>", start)]
    assert "inferwatch's verdicts next to Evidently's" in sec and "Benjamini-Hochberg" in sec
    assert "inferwatch: 1 of 5 features drifted, dataset drift no" in sec
    assert "<td>big_shift</td><td><b>yes</b>: p_adj" in sec
    assert "Wasserstein distance (normed)" in sec and "drifted: Wasserstein distance (normed)" in sec
    assert "Joint drift (ours only" in sec
    assert page.index("<body") < start

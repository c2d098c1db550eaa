"""docs/gpu.md's figure of the GLR test is made by ``bench/leak_glr_figure.py``: the trace it draws is judged
as the figure says (no alarm through the warm-up and the model load, the leak found within 15 minutes)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.imports import load_file
from tests.helpers.paths import BENCH


def test_the_figure_s_trace_is_judged_as_the_docs_say(tmp_path: Path) -> None:
    fig = load_file(BENCH / "leak_glr_figure.py", "leak_glr_figure")
    res = fig.run(3)
    (ep,) = res["episodes"]
    assert fig.ONSET < res["detected"] <= fig.ONSET + 15 * 60
    assert abs(ep.onset_estimate - fig.ONSET) < 10 * 60
    assert ep.rate is not None and abs(ep.rate / fig.RATE - 1) < 0.2
    # Below the threshold in every window until the onset: the warm-up and the load are in the null.
    assert all(r <= 1.0 for pts in res["ratios"].values() for t, r in pts if t < fig.ONSET)
    out = tmp_path / "glr.png"
    fig.draw(res, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000

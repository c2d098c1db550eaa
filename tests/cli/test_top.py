"""``inferwatch top``: one frame of a recorded demo poll, and of a live sidecar, in a pipe; nothing cut.

The recorded poll (tests/fixtures/demo_poll) is what the demo's sidecar answered 59 s in, every fault
injected: drawn at 80 and at 200 columns, every number the status holds appears whole (no cell ends in
an ellipsis), the verdicts come first, and the canary's reasons name their stages.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from inferwatch_sidecar.demo import promtext
from inferwatch_sidecar.export.live_view import SidecarView, apply, render_top
from tests.demo.helpers import CMD

POLL = Path(__file__).resolve().parents[1] / "fixtures" / "demo_poll"


def recorded_view() -> tuple[SidecarView, dict[str, Any]]:
    """The view of the recorded poll (its scrape and the one 5 s before), and its status document."""
    status = json.loads(gzip.decompress((POLL / "status.json.gz").read_bytes()))
    old = promtext.Scrape(gzip.decompress((POLL / "metrics-9.txt.gz").read_bytes()).decode(), 54.0)
    new = promtext.Scrape(gzip.decompress((POLL / "metrics-10.txt.gz").read_bytes()).decode(), 59.0)
    view = SidecarView(59.0, url="http://127.0.0.1:35591")
    apply(view, new, old, status)
    return view, status


def column_text(text: str, title: str) -> list[str]:
    """The cells of the table under ``title``, column by column, each column's pieces joined with no space
    (so a folded URL or a wrapped phrase reads whole, spaces aside)."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith(title))
    cols: list[str] = []
    for ln in lines[start + 1:]:
        if ln.startswith("└"):
            break
        if not ln.startswith("│"):
            continue
        cells = ln.strip("│").split("│")
        cols += [""] * (len(cells) - len(cols))
        for i, c in enumerate(cells):
            cols[i] += c.replace(" ", "")
    return cols


def draw(renderable: Any, width: int) -> str:
    con = Console(width=width, file=io.StringIO(), highlight=False, color_system=None)
    con.print(renderable)
    return con.file.getvalue()  # type: ignore[attr-defined]


@pytest.mark.parametrize("width", [80, 200])
def test_one_frame_of_the_recorded_poll_cuts_nothing(width: int) -> None:
    view, status = recorded_view()
    now = status["summary"]["evaluated_unix"]
    text = draw(render_top([view], now=now), width)
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= width
    assert "…" not in text, [ln for ln in lines if "…" in ln]
    flat = re.sub(r"\s+", " ", text.replace("│", " "))
    # What is wrong now comes first: each verdict of the status, with its runbook anchor.
    verdicts = status["summary"]["verdicts"]
    assert len(verdicts) >= 4
    first_table = text.index("what is wrong now")
    assert first_table < text.index("requests, last") < text.index("stage latency")
    cols = column_text(text, "what is wrong now")
    for v in verdicts:
        assert v["verdict"].replace(" ", "") in cols[2], v
        assert v["detail"].replace(" ", "") in cols[3], v
        base, anchor = v["runbook_url"].split("#")
        assert f"#{anchor}" in cols[5], v
        assert f"runbook sections: {base}#..." in text.replace("\n", "")
    # Numbers whole: each version's P99 and request count, the leak's rate, each stage's P99.
    for m in status["latency"]["models"]:
        req = m["request"]
        n = sum(m["outcomes"].values())
        row = re.search(rf"{re.escape(m['model'])} {re.escape(m['model_version'])}\s*│\s*(\d+)\s*│\s*(\S+)\s*│\s*(\S+)",
                        text)
        assert row, (m["model"], m["model_version"])
        assert int(row.group(1)) == n
        p99 = req["p99_s"]
        assert row.group(3) == (f"{p99 * 1000:.1f}ms" if p99 < 1 else f"{p99:.2f}s")
    (leak,) = status["components"]["gpu"]["leaks"]
    assert f"{leak['rate_bytes_per_s'] / 2**20:.1f} MiB/s" in text
    for stage in view.stages:
        assert re.search(rf"│ {stage}\s+│", text), stage
    # The canary's reasons, stage by stage (a plain "[inference]" would be eaten as markup).
    (j,) = [j for j in status["components"]["canary"]["judgements"] if j["canary_version"] == "v2"]
    stages = [m["stage"] for m in j["metrics"] if m["result"] == "fail" and m["stage"]]
    assert stages
    why = column_text(text, "canary judge")[-1]
    for reason in j["reasons"]:
        assert reason.replace(" ", "") in why, reason
    for st in stages:
        assert f"stage_latency[{st}]" in why
    for w in j.get("warnings") or []:  # why the verdict may mislead, below the reasons
        assert f"warning:{w}".replace(" ", "") in why, w
    # Both versions' estimates with their interval, and why v2's estimate and its labels differ.
    drift = column_text(text, "drift of credit-risk")
    for i, v in enumerate(("v1", "v2")):
        d = view.drift[("credit-risk", v)]
        iv = d["estimated_interval"]
        assert f"{d['estimated_accuracy']:.1%}[{iv['lower']:.1%}-{iv['upper']:.1%}]" in drift[1 + i]
    assert "why the estimate and the labels differ" in flat
    assert "cannot see that model's own errors" in flat


def test_top_once_in_a_pipe_against_a_live_sidecar(sidecar_factory: Any) -> None:
    sc = sidecar_factory("--no-gpu")
    events = [{"type": "request", "duration_s": 0.03, "outcome": "ok", "stages": {"inference": 0.02}}] * 30 + \
             [{"type": "request", "duration_s": 0.5, "outcome": "error", "error_type": "Timeout",
               "stages": {"inference": 0.4}}] * 10
    code, answer = sc.post("/v1/events", json.dumps({"service": "svc", "model": "ranker", "model_version": "v3",
                                                     "events": events}).encode())
    assert code == 200 and answer["accepted"] == 40, answer
    env = {**os.environ, "COLUMNS": "80"}
    p = subprocess.run([*CMD, "top", "--sidecar", sc.url.removeprefix("http://"), "--once"], capture_output=True,
                       text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "\x1b[" not in out  # plain text in a pipe
    assert max(len(ln) for ln in out.splitlines()) <= 80 and "…" not in out
    # 10 of 40 failed: the error-rate verdict, and the share in the requests table.
    cols = column_text(out, "what is wrong now")
    assert "higherrorrate" in cols[2] and "25.0%of40requestsfailed" in cols[3], out
    # (At 80 columns the 4xx and shed columns make the label cell wrap: "svc" / "ranker v3".)
    assert re.search(r"svc\s*│\s*40\s*│", out) and re.search(r"│ ranker v3\s*│", out), out
    assert "25.00%" in out
    assert "stage latency since the sidecar started" in out
    # Refreshing, in a pipe: a frame every interval, the second with stage rates; Ctrl-C ends it with status 0.
    # SIGINT's default disposition in the child: a shell's background job (nohup, CI wrappers) starts with SIGINT
    # ignored, which Python then keeps, and Ctrl-C would never reach `top`.
    p2 = subprocess.Popen([*CMD, "top", "--sidecar", sc.url, "--interval", "0.3"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    with p2:
        try:
            assert p2.stdout is not None
            frames = 0
            for line in p2.stdout:
                frames += line.startswith("inferwatch top")
                if frames == 3:
                    break
            p2.send_signal(signal.SIGINT)
            rest, err = p2.communicate(timeout=30)
        finally:
            if p2.poll() is None:
                p2.kill()
                p2.communicate()
    assert p2.returncode == 0, err
    assert frames == 3


def test_top_once_draws_every_sidecar_given_each_with_its_own_verdicts(sidecar_factory: Any) -> None:  # noqa: F811
    """``--sidecar`` twice: one frame per sidecar, in the order given, each with its own numbers and verdicts; a
    third that is down costs its frame an error line and the exit status 1, not the other two frames."""
    import shutil
    import tempfile

    from tests.conftest import free_port

    dirs = [tempfile.mkdtemp(prefix="iwtop", dir="/tmp") for _ in range(2)]  # Unix socket paths stop at ~108 bytes
    try:
        failing = sidecar_factory("--no-gpu", sock=os.path.join(dirs[0], "s.sock"))
        healthy = sidecar_factory("--no-gpu", sock=os.path.join(dirs[1], "s.sock"))
        ok = {"type": "request", "duration_s": 0.03, "outcome": "ok", "stages": {"inference": 0.02}}
        bad = {"type": "request", "duration_s": 0.5, "outcome": "error", "error_type": "Timeout",
               "stages": {"inference": 0.4}}
        for sc, model, events in ((failing, "ranker", [ok] * 30 + [bad] * 10), (healthy, "scorer", [ok] * 25)):
            code, answer = sc.post("/v1/events", json.dumps({"service": "svc", "model": model, "model_version": "v1",
                                                             "events": events}).encode())
            assert code == 200 and answer["accepted"] == len(events), answer
        down = f"127.0.0.1:{free_port()}"
        env = {**os.environ, "COLUMNS": "100"}
        urls = [failing.url, healthy.url.removeprefix("http://")]
        p = subprocess.run([*CMD, "top", *[a for u in urls for a in ("--sidecar", u)], "--once"], capture_output=True,
                           text=True, timeout=60, env=env)
        assert p.returncode == 0, p.stdout + p.stderr
        out = p.stdout
        assert "\x1b[" not in out and max(len(ln) for ln in out.splitlines()) <= 100 and "…" not in out
        heads = [i for i, ln in enumerate(out.splitlines()) if ln.startswith("inferwatch top")]
        assert len(heads) == 2, out
        lines = out.splitlines()
        first, second = "\n".join(lines[heads[0]:heads[1]]), "\n".join(lines[heads[1]:])
        assert failing.url in lines[heads[0]] and healthy.url in lines[heads[1]]
        # Each frame has its own sidecar's traffic and verdicts, not the other's.
        assert "higherrorrate" in column_text(first, "what is wrong now")[2]
        assert "25.0%of40requestsfailed" in column_text(first, "what is wrong now")[3]
        assert re.search(r"│ svc ranker v1\s*│\s*40\s*│", first) and "scorer" not in first, first
        assert "nothing is bad now" in second and re.search(r"│ svc scorer v1\s*│\s*25\s*│", second), second
        assert "ranker" not in second
        # A sidecar that is down: its frame says so, the others are drawn, and --once exits 1.
        p = subprocess.run([*CMD, "top", "--sidecar", failing.url, "--sidecar", down, "--sidecar", healthy.url,
                            "--once"], capture_output=True, text=True, timeout=60, env=env)
        assert p.returncode == 1, p.stdout + p.stderr
        lines = p.stdout.splitlines()
        heads = [ln for ln in lines if ln.startswith("inferwatch top")]
        assert [failing.url in heads[0], down in heads[1], healthy.url in heads[2]] == [True] * 3, heads
        assert "Connection refused" in p.stdout.replace("\n", "")
        assert re.search(r"│ svc ranker v1\s*│\s*40\s*│", p.stdout) and re.search(r"│ svc scorer v1\s*│\s*25\s*│", p.stdout)
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def test_top_says_what_is_wrong_with_its_arguments_and_fails_on_a_sidecar_that_is_down() -> None:
    from tests.helpers.net import free_port

    p = subprocess.run([*CMD, "top", "--sidecar", "ftp://x", "--once"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "expected http://host:port" in p.stderr
    p = subprocess.run([*CMD, "top", "--sidecar", "127.0.0.1:1", "--interval", "0", "--once"], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 2 and "--interval" in p.stderr
    p = subprocess.run([*CMD, "top", "--sidecar", f"127.0.0.1:{free_port()}", "--once"], capture_output=True,
                       text=True, timeout=30, env={**os.environ, "COLUMNS": "100"})
    assert p.returncode == 1 and "Connection refused" in p.stdout.replace("\n", ""), p.stdout


def test_readme_lists_every_command() -> None:
    import argparse

    from inferwatch_sidecar.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    listed = set(re.findall(r"^\| `inferwatch (\w+)", readme, re.M))
    assert listed == set(sub.choices), (sorted(listed), sorted(sub.choices))


def test_a_status_without_a_summary_gets_its_verdicts_computed() -> None:
    # A sidecar from before the summary section: top computes the verdicts from the rest of its status, with
    # every component's reader from the registry.
    from inferwatch_sidecar.components.registry import verdict_readers
    from inferwatch_sidecar.export.summary import verdicts

    view, status = recorded_view()
    old = {k: v for k, v in status.items() if k != "summary"}
    new = promtext.Scrape(gzip.decompress((POLL / "metrics-10.txt.gz").read_bytes()).decode(), 59.0)
    bare = SidecarView(59.0)
    apply(bare, new, None, old, verdict_readers())
    assert bare.verdicts == verdicts(old, verdict_readers()) and len(bare.verdicts) >= 4
    assert {v["component"] for v in bare.verdicts} >= {"gpu", "canary"}
    # Everything the recorded sidecar summarized itself is found again (this tree's readers find a little more).
    assert {(v["component"], v["subject"], v["verdict"]) for v in status["summary"]["verdicts"]} <= \
        {(v["component"], v["subject"], v["verdict"]) for v in bare.verdicts}
    assert bare.stage_window_s is None and view.stage_window_s == 5.0
